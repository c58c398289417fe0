"""runner/retry.py: the one retry policy every remote call uses (Kubernetes API, exec, S3)."""

from __future__ import annotations

import pytest

from runner.retry import RetryPolicy


class Transient(Exception):
    pass


class Permanent(Exception):
    pass


def _calls(policy: RetryPolicy, errors: list[Exception]) -> tuple[int, object]:
    seen = []

    def op():
        seen.append(1)
        if errors:
            raise errors.pop(0)
        return "ok"

    try:
        result = policy.retrying()(op)
    except Exception as e:  # the last error, raised as itself
        result = e
    return len(seen), result


POLICY = RetryPolicy(lambda e: isinstance(e, Transient), attempts=4, backoff_seconds=0)


def test_transient_errors_are_retried_until_an_attempt_succeeds():
    assert _calls(POLICY, [Transient(), Transient()]) == (3, "ok")


def test_attempts_count_the_first_try_and_the_last_error_is_raised_as_itself():
    last = Transient("fourth")
    n, result = _calls(POLICY, [Transient(), Transient(), Transient(), last, Transient()])
    assert n == 4 and result is last


def test_a_permanent_error_fails_at_once():
    first = Permanent("403")
    assert _calls(POLICY, [first, Transient()]) == (1, first)


@pytest.mark.parametrize("backoff, attempt, expected", [(0.5, 1, 0.5), (0.5, 3, 2.0), (0.5, 10, 10)])
def test_waits_grow_exponentially_up_to_ten_seconds(backoff, attempt, expected):
    class State:
        attempt_number = attempt
    assert RetryPolicy(bool, 3, backoff).retrying().wait(State()) == expected


def test_the_kubernetes_tally_counts_every_attempt_and_the_retries_among_them():
    """What the executor logs when it closes: requests and exec transfers sent, retries among them."""
    from kubernetes import client
    from prometheus_client import CollectorRegistry

    from runner.executors.kubernetes import KubernetesExecutor
    from runner.k8s.api import ExecError, ExecResult, Kube
    from runner.metrics import ApiMetrics
    from runner.settings import KubeSettings, Settings

    settings = Settings(kube=KubeSettings(namespace="ns", api_attempts=3, api_backoff_seconds=0))
    registry = CollectorRegistry()
    kube = Kube(settings.kube, api_client=client.ApiClient(), metrics=ApiMetrics(registry))
    failures = [ExecError("the transfer broke off"), ExecError("again")]

    def exec_(pod, container, argv, stdin=None, timeout=60.0):
        if failures:
            raise failures.pop(0)
        return ExecResult(b"", b"", 0)

    kube.exec = exec_  # type: ignore[method-assign]
    executor = KubernetesExecutor(settings, kube)
    executor._exec("pod", ["true"])
    executor._exec("pod", ["true"])
    errors = [Transient(), Transient(), Transient()]

    def flaky():
        if errors:
            raise errors.pop(0)
        return "ok"

    kube.retry = RetryPolicy(lambda e: isinstance(e, Transient), 3, 0)
    with pytest.raises(Transient):
        kube.call(flaky)
    assert kube.call(lambda: "ok") == "ok"
    assert kube.tally.sent == {"exec transfers": 4, "API requests": 4}
    assert kube.tally.retried == {"exec transfers": 2, "API requests": 2}
    assert kube.tally.summary() == "API requests 4 (2 retried); exec transfers 4 (2 retried)"
    # and the same in the metrics (runner/metrics.py), by verb: an exec is a request too
    value = registry.get_sample_value
    assert [value("probe_runner_api_requests_total", {"verb": v}) for v in ("exec", "other")] == [4, 4]  # flaky, <lambda>
    assert [value("probe_runner_api_retries_total", {"verb": v}) for v in ("exec", "other")] == [2, 2]
    assert value("probe_runner_exec_transfers_total") == 4
