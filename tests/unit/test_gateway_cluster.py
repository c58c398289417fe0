"""The install's gateway, its pure parts (runner/gateway/cluster.py): the Lease it keeps an
attempt's meter in, the sum the controller makes of it, which attempts it serves; and the
canary's routes through it (runner/k8s/canary.py), against complete values."""

from __future__ import annotations

import json
from decimal import Decimal

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runner.gateway import tokens
from runner.gateway.cluster import SessionPods, claim, meter_lease, meters_of, settled, total
from runner.k8s import canary, names

CLAIMS = tokens.Claims("c1", "HW-PRB-0007", "present-001", 1, 2_000_000_000, "0.5", "0.25")
POD = {"metadata": {"name": "probe-runner-c1-hw-prb-0007-present-001-1-0123456789", "uid": "pod-uid",
                    "annotations": {names.CAMPAIGN: "c1", names.PROBE: "HW-PRB-0007", names.SESSION: "present-001",
                                    names.ATTEMPT: "1"}},
       "status": {"containerStatuses": [{"name": "harness", "state": {"running": {}}}]}}
USAGE = {"input_tokens": 100, "output_tokens": 10, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 5}


def state(cost: str, calls: int, held: str, refused: int = 0, unpriced: tuple[str, ...] = ()) -> dict:
    return {"calls": calls, "usage": dict(USAGE), "cost_usd": cost, "unpriced_models": list(unpriced),
            "refused": refused, "held_usd": held}


def test_the_lease_of_an_attempt_carries_one_gateway_pods_meter_and_is_owned_by_the_session_pod():
    lease = meter_lease("probe-runner", "ns", POD, "gateway-7f9c-abcde", CLAIMS, state("0.315", 1, "1.315"))
    assert lease == {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {
            "name": POD["metadata"]["name"],
            "namespace": "ns",
            "labels": {"app.kubernetes.io/name": "probe-runner", "app.kubernetes.io/instance": "probe-runner",
                       "app.kubernetes.io/component": "gateway", "app.kubernetes.io/part-of": "probe-runner",
                       "app.kubernetes.io/managed-by": "probe-runner", "probe-runner.io/campaign": "c1"},
            "annotations": {"meter.probe-runner.io/gateway-7f9c-abcde": json.dumps(
                state("0.315", 1, "1.315"), sort_keys=True, separators=(",", ":"))},
            # deleted with the pod, when the controller deletes it after journaling the outcome
            "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": POD["metadata"]["name"], "uid": "pod-uid"}],
        },
        "spec": {},
    }
    assert meters_of(lease["metadata"]["annotations"]) == [state("0.315", 1, "1.315")]


def test_a_hold_is_written_into_the_lease_as_read_at_its_resource_version_keeping_the_other_gateways_meters():
    """Optimistic concurrency: the write carries the Lease's resourceVersion, so a Lease that
    another gateway changed since it was read is refused (409) and read again."""
    other = json.dumps(state("0.1", 1, "0.5"), sort_keys=True, separators=(",", ":"))
    read = meter_lease("probe-runner", "ns", POD, "gateway-b", CLAIMS, state("0.1", 1, "0.5"))
    read["metadata"].update(resourceVersion="4711", annotations={"meter.probe-runner.io/gateway-b": other})
    lease = meter_lease("probe-runner", "ns", POD, "gateway-a", CLAIMS, state("0", 0, "1.25"), read)
    assert lease == {**read, "metadata": {**read["metadata"], "resourceVersion": "4711", "annotations": {
        "meter.probe-runner.io/gateway-b": other,
        "meter.probe-runner.io/gateway-a": json.dumps(state("0", 0, "1.25"), sort_keys=True, separators=(",", ":"))}}}
    assert meters_of(lease["metadata"]["annotations"], but="gateway-a") == [state("0.1", 1, "0.5")]


def test_the_controllers_sum_counts_each_gateway_at_its_hold_until_it_gave_back_what_it_did_not_spend():
    """A gateway pod killed mid-session left its hold in its annotation: what it forwarded
    within that hold was never read whole, so it counts at the hold, and the record says how
    much of the cost that is; a gateway that settled counts at what it metered."""
    a = state("0.315", 1, "1.315", refused=1)  # killed: its hold stands
    b = state("0.200", 2, "0.200", unpriced=("claude-x",))  # settled
    assert (claim(a), claim(b)) == (Decimal("1.315"), Decimal("0.200"))
    assert not settled([a, b]) and settled([b]) and settled([])
    assert total([a, b]) == {
        "calls": 3, "usage": {k: 2 * v for k, v in USAGE.items()}, "cost_usd": "1.515",
        "unpriced_models": ["claude-x"], "refused": 1, "held_usd": "1.000"}
    # the provider's usage past the hold (never so for a real bound) counts as metered
    assert claim(state("0.9", 1, "0.5")) == Decimal("0.9") and settled([state("0.9", 1, "0.5")])
    assert total([]) == {"calls": 0, "usage": dict.fromkeys(USAGE, 0), "cost_usd": "0", "unpriced_models": [], "refused": 0}


def test_a_gateway_pod_of_any_name_has_an_annotation_key_the_api_accepts():
    import re

    from runner.gateway.cluster import meter_key

    for pod in ("gateway-7f9c-abcde", "a-release-name-of-fifty-three-characters-xxxxxxxxxxxx-gateway-7f9c8d6b5-abcde"):
        prefix, _, name = meter_key(pod).partition("/")
        assert prefix == "meter.probe-runner.io" and len(name) <= 63
        assert re.fullmatch(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?", name), name
    assert meter_key("gateway-7f9c-abcde") == "meter.probe-runner.io/gateway-7f9c-abcde"


@pytest.mark.parametrize("value", ["not json", json.dumps({"calls": 1}), json.dumps(state("x", 1, "0")),
                                   json.dumps(state("0", 1, "lots"))])
def test_an_annotation_that_is_not_a_meter_is_skipped(value):
    assert meters_of({"meter.probe-runner.io/g": value, "other.io/x": "1"}) == []


class _Cache:
    def __init__(self, pod: dict | None) -> None:
        self.pod = pod

    def get(self, name: str) -> dict | None:
        return self.pod if self.pod is not None and self.pod["metadata"]["name"] == name else None


def _pods(pod: dict | None) -> SessionPods:
    return SessionPods(_Cache(pod), "probe-runner")  # type: ignore[arg-type]  (the cache's get alone)


def _named(pod: dict) -> dict:
    """POD under the name the controller gives an attempt's pod."""
    from runner.k8s import manifests

    name = manifests.pod_name("probe-runner", CLAIMS.campaign, CLAIMS.probe, CLAIMS.session, CLAIMS.attempt)
    return {**pod, "metadata": {**pod["metadata"], "name": name}}


def test_an_attempt_is_served_while_its_pod_runs_and_its_harness_has_not_ended():
    assert _pods(_named(POD)).ended(CLAIMS) is None
    assert _pods(None).ended(CLAIMS) == "the attempt has no session pod (it ended)"
    deleting = _named({**POD, "metadata": {**POD["metadata"], "deletionTimestamp": "2026-12-04T10:00:00Z"}})
    assert _pods(deleting).ended(CLAIMS) == "the attempt's session pod is being deleted"
    ended = _named({**POD, "status": {"containerStatuses": [{"name": "harness", "state": {"terminated": {"exitCode": 0}}}]}})
    assert _pods(ended).ended(CLAIMS) == "the attempt's harness has ended"
    # A pod of that name whose annotations name another attempt (never ours) serves nothing.
    other = _named({**POD, "metadata": {**POD["metadata"], "annotations": {**POD["metadata"]["annotations"], names.ATTEMPT: "2"}}})
    assert _pods(other).ended(CLAIMS) == "the attempt has no session pod (it ended)"


def test_a_canary_token_is_served_only_for_its_own_checks_pod():
    """A confinement check's canary asks the gateway with a token of its own (issue 28: "the
    canary tries the provider-side routes too"): served while that check's canary pod exists,
    under the names the controller gives it, and never taken for another pod."""
    from runner.k8s import manifests

    canary_pod = {"metadata": {"name": manifests.canary_pod_name("probe-runner", "c1", 3), "uid": "u",
                               "annotations": {names.CAMPAIGN: "c1", names.CANARY: "3"}},
                  "status": {"containerStatuses": [{"name": "canary", "state": {"running": {}}}]}}
    claims = lambda session: tokens.Claims("c1", manifests.CANARY_PROBE, session, 1, 2_000_000_000, "0", "0")  # noqa: E731
    assert _pods(canary_pod).ended(claims("check-3")) is None
    for other in ("check-4", "check-03", "check-x", "3"):
        assert _pods(canary_pod).ended(claims(other)) == "the attempt has no session pod (it ended)", other
    other_campaign = {**canary_pod, "metadata": {**canary_pod["metadata"], "annotations": {names.CAMPAIGN: "c2", names.CANARY: "3"}}}
    assert _pods(other_campaign).ended(claims("check-3")) == "the attempt has no session pod (it ended)"


def test_the_canarys_routes_through_the_gateway():
    """With the gateway, the one route that must answer is the gateway itself; the proxy's
    routes are not tried (there is no proxy)."""
    got = canary.routes("https://api.anthropic.com", ["160.79.104.10", "2607:6bc0::10"], "10.244.0.9:8081", ["example.com"],
                        ["10.0.0.5:5432"], gateway=True)
    assert got == [
        canary.Route("cluster DNS", "dns", "{dns}"),
        canary.Route("the API server by its ClusterIP", "tcp", "{api}"),
        canary.Route("the API server on the node's address", "tcp", "{node}:6443"),
        canary.Route("the kubelet on the node's address", "tcp", "{node}:10250"),
        canary.Route("the metadata service", "tcp", "169.254.169.254:80"),
        canary.Route("the metadata service over IPv6", "tcp", "[fd00:ec2::254]:80"),
        canary.Route("an outside address over IPv6", "tcp", "[2001:4860:4860::8888]:443"),
        canary.Route("another pod", "tcp", "10.244.0.9:8081"),
        canary.Route("the provider directly", "tcp", "160.79.104.10:443"),
        canary.Route("the provider directly", "tcp", "[2607:6bc0::10]:443"),
        canary.Route("10.0.0.5:5432 directly", "tcp", "10.0.0.5:5432"),
        canary.Route("the provider gateway", "http", "{gateway}", must_open=True),
        canary.Route("the provider gateway's key check (a token count)", "http-key", "{gateway}", must_open=True),
    ]


def test_a_long_lived_gateway_forgets_the_meters_of_attempts_whose_pods_are_gone():
    """Before, every attempt's meter stayed in the gateway's memory for as long as it ran (an
    install's gateway runs for months); now a prune drops those whose pods are gone, unless a
    call of theirs is still in flight, and the Lease writer forgets their versions too."""
    from runner.gateway.server import Gateway, Meter
    from runner.settings import DEFAULT_PRICES

    g = Gateway("https://api.example.com", "key", b"secret", DEFAULT_PRICES)
    running, gone, gone_in_flight = (("c", "P", f"s{i}", 1) for i in range(3))
    g.meters = {running: Meter(calls=1), gone: Meter(calls=2), gone_in_flight: Meter(calls=1, in_flight=1)}
    assert g.forget(lambda a: a != running) == [gone]
    assert set(g.meters) == {running, gone_in_flight}


def test_a_hold_takes_headroom_beyond_the_call_up_to_what_the_other_gateways_leave():
    from runner.gateway.server import hold_for

    d = Decimal
    # no limit: the call's commitment and the headroom
    assert hold_for(None, d("2"), d("5"), d("0.4"), d("0.4"), d("1")) == d("1.4")
    # room: the headroom, but never past limit + call_usd less what the others hold
    assert hold_for(d("1"), d("0.5"), d("0"), d("0.4"), d("0.4"), d("1")) == d("1.4")
    assert hold_for(d("1"), d("0.5"), d("0.6"), d("0.4"), d("0.4"), d("1")) == d("0.9")
    # the last call of a session with any room left goes, as at one gateway
    assert hold_for(d("1"), d("0.5"), d("0.6"), d("0.7"), d("0.4"), d("0")) == d("0.7")
    # no room before this call: refused
    assert hold_for(d("1"), d("0.5"), d("0.6"), d("0.8"), d("0.4"), d("1")) is None


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(1, 50), st.integers(0, 100), st.booleans()), max_size=60),
       st.integers(0, 200))
def test_whatever_order_replicas_admit_calls_in_their_holds_never_pass_the_limit_and_one_call(ops, headroom):
    """Three gateways, each admitting calls against its own (stale) view of the others, raising
    its hold with hold_for against the others' holds at that moment (the Lease's
    resourceVersion makes that write atomic): the holds together stay within limit + call_usd,
    and each gateway's spend within its own hold."""
    from runner.gateway.server import hold_for

    limit, call, cents = Decimal(1), Decimal("0.5"), Decimal("0.01")
    held, committed, seen = [Decimal(0)] * 3, [Decimal(0)] * 3, [Decimal(0)] * 3
    for r, bound_c, spent_pct, settle in ops:
        bound = bound_c * cents
        if seen[r] + committed[r] >= limit:  # the room check, on what it last read of the others
            continue
        committed[r] += bound
        if committed[r] > held[r]:
            others = sum(held[o] for o in range(3) if o != r)
            seen[r] = others
            h = hold_for(limit, call, others, committed[r], bound, headroom * cents)
            if h is None:
                committed[r] -= bound
                continue
            held[r] = h
        if settle:  # the answer's usage, at most its bound
            committed[r] -= bound - bound * spent_pct / 100
        assert sum(held) <= limit + call and all(c <= h for c, h in zip(committed, held, strict=True))


def test_with_a_token_the_canary_asks_the_gateway_for_what_it_must_refuse():
    got = canary.routes("https://api.anthropic.com", [], None, [], [], gateway=True, token=True)
    assert got[-4:] == [
        canary.Route("a server tool through the gateway (web_fetch)", "gateway-server-tool", "{gateway}"),
        canary.Route("an MCP server through the gateway (the metadata service's URL)", "gateway-mcp", "{gateway}"),
        canary.Route("the provider gateway", "http", "{gateway}", must_open=True),
        canary.Route("the provider gateway's key check (a token count)", "http-key", "{gateway}", must_open=True)]
    assert not [r for r in canary.routes("https://api.anthropic.com", [], None, [], [], gateway=True)
                if r.kind.startswith("gateway-")]


def test_the_canary_tries_ipv6_routes_and_finds_them_closed_in_a_pod_without_ipv6():
    """Issue 28: "the canary tries IPv4 only". An IPv6 target is split as the socket needs it, and
    a pod with no IPv6 address (EADDRNOTAVAIL, EAFNOSUPPORT) or no route (ENETUNREACH) counts
    it closed, not opened: nothing left the pod."""
    import errno

    from runner.entrypoints import canary as entry

    assert entry._split("[fd00:ec2::254]:80") == ("fd00:ec2::254", 80)
    assert entry._split("10.0.0.5:5432") == ("10.0.0.5", 5432)
    for code, why in ((errno.EADDRNOTAVAIL, "no address of that family"), (errno.EAFNOSUPPORT, "no address of that family"),
                      (errno.ENETUNREACH, "network unreachable")):
        assert entry._failed(OSError(code, "x"), "refused") == (False, why)
    assert entry._failed(OSError(errno.EIO, "x"), "refused") == (True, "error [Errno 5] x")


def test_a_pods_entry_points_import_the_standard_library_and_light_modules_alone():
    """The harness's entry point and the canary run in the session pod before the CLI, under
    the harness's uid (tests/cluster/simnode.py runs them so, on this host): importing the
    gateway's server there (aiohttp, for one path constant of the canary's key route) kept every
    simulated session's reader from recording its stream. The pod's entry points import no
    third-party package."""
    import subprocess
    import sys

    third_party = ("aiohttp", "kubernetes", "pydantic", "pydantic_settings", "boto3", "botocore", "orjson", "yaml",
                   "rich", "click", "bashlex", "tenacity")
    out = subprocess.run([sys.executable, "-c", "import sys, runner.entrypoints.pod, runner.entrypoints.canary; "
                          "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))"],
                         capture_output=True, text=True, check=True).stdout.split()
    assert not set(third_party) & set(out), sorted(set(third_party) & set(out))
