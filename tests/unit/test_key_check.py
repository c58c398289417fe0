"""A refused key is the key's matter wherever the canary finds it (issue 29, item 1: "the
gateway checks its own key with a call that spends nothing (a token count), in doctor --cluster
and as a helm test route"): judged as a setting to fix (exit 2, the Secret and the gateway's
restart named), not as a route that failed (exit 12), before the first session and later."""

from __future__ import annotations

import pytest

from runner.errors import ConfinementError, KeyRefused
from runner.k8s import canary
from runner.k8s.confinement import ConfinementMonitor
from runner.k8s.manifests import Route
from runner.settings import load_settings
from tests.support.waiting import until

GATEWAY = canary.Result("the provider gateway", "10.0.0.1:8080", True, True, "answered HTTP/1.1 200")
ACCEPTED = canary.Result(canary.KEY_ROUTE, "10.0.0.1:8080", True, True, "accepted (a token count, nothing spent)")
REFUSED = canary.Result(canary.KEY_ROUTE, "10.0.0.1:8080", True, False,
                        "the provider refused the key (HTTP 401 from https://p): invalid x-api-key")
UNREACHED = canary.Result(canary.KEY_ROUTE, "10.0.0.1:8080", True, False,
                          "not accepted: HTTP/1.1 502 Bad Gateway: the provider at https://p could not be reached")
DNS_OPEN = canary.Result("cluster DNS", "10.0.0.10:53", False, True, "answered")


class Scripted(ConfinementMonitor):
    """The monitor with each check's canary results given, in order (the last repeats)."""

    answers: list[list[canary.Result]]

    def _run_canary(self, number: int) -> tuple[list[canary.Result], float | None]:
        return self.answers[min(number - 1, len(self.answers) - 1)], 0.5


def _monitor(*answers: list[canary.Result], interval: float = 0) -> Scripted:
    settings = load_settings(store="file:///unused", kube={"namespace": "team-a", "instance": "pr",
                                                           "canary_interval_seconds": interval})
    m = Scripted(settings, None, "c1", Route("http://10.0.0.1:8080"), lambda: [])  # type: ignore[arg-type]
    m.answers = list(answers)
    return m


def test_the_judge_names_a_refused_key_as_such_and_an_unreached_provider_as_a_route():
    assert canary.key_refused([GATEWAY, REFUSED]) and not canary.key_refused([GATEWAY, UNREACHED])
    assert canary.judge([GATEWAY, REFUSED]) == f"{REFUSED.detail} ({canary.KEY_ROUTE})"
    assert canary.judge([GATEWAY, UNREACHED]).startswith(f"the provider path failed: {canary.KEY_ROUTE}")
    assert canary.judge([GATEWAY, ACCEPTED]) is None


def test_a_refused_key_before_the_first_session_is_exit_2_with_the_keys_remedy():
    with pytest.raises(KeyRefused) as refused:
        _monitor([GATEWAY, REFUSED]).start()
    assert refused.value.exit_code == 2
    assert str(refused.value) == (
        f"the key check before the first session: {REFUSED.detail} ({canary.KEY_ROUTE}); no session was started. "
        "Fix the key in the install's credentials Secret (its key api-key) and restart the gateway "
        "(`kubectl -n team-a rollout restart deployment/pr-gateway`)")
    with pytest.raises(ConfinementError) as unconfined:  # a route, not the key: the policy's matter
        _monitor([GATEWAY, UNREACHED]).start()
    assert unconfined.value.exit_code == 12 and not isinstance(unconfined.value, KeyRefused)
    assert str(unconfined.value).endswith("no session was started. Fix the cluster's network policy")


@pytest.mark.parametrize(("later", "key"), [([GATEWAY, REFUSED], True), ([GATEWAY, ACCEPTED, DNS_OPEN], False)])
def test_a_later_check_halts_with_whose_matter_it_is(later, key):
    m = _monitor([GATEWAY, ACCEPTED], later, interval=0.05)
    m.start()
    try:
        until(lambda: m.halted is not None, 10, "the monitor's halt", interval=0.02)
    finally:
        m.stop()
    assert m.halted is not None and m.halted.key is key and m.halted.why.startswith("confinement check 2 at "), m.halted
