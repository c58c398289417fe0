"""The environment and an install's settings ConfigMap are read by one pydantic-settings source,
so a variable means the same in both, and a mistake in either is one line naming the variable."""

from __future__ import annotations

import pytest

from runner import cli
from runner.errors import UserError
from runner.settings import Settings, load_settings, settings_over


@pytest.mark.parametrize("name, value", [("RUNNER_KUBE__NODE_SELECTOR", "{pool: probes"), ("RUNNER_HARNESS__ENV", "nope"),
                                         ("RUNNER_HARNESS__ALLOWED_TOOLS", "[Read")])
def test_a_list_or_object_that_is_not_json_in_the_environment_is_one_line(monkeypatch, tmp_path, capsys, name, value):
    # Before the one source, pydantic-settings' SettingsError escaped as a traceback naming only "kube".
    monkeypatch.setenv("RUNNER_STORE", tmp_path.as_uri())
    monkeypatch.setenv(name, value)
    with pytest.raises(UserError, match=f"^settings: {name} is not JSON: "):
        load_settings()
    assert cli.main(["status", "x"]) == 2
    assert capsys.readouterr().err == f"probe-runner: settings: {name} is not JSON: {value}\n"


def test_a_config_map_reads_as_the_environment_does(monkeypatch):
    data = {"RUNNER_KUBE__NODE_SELECTOR": '{"pool": "probes"}', "RUNNER_HARNESS__MAX_TURNS": "7",
            "RUNNER_LOG__FORMAT": "json", "RUNNER_S3__ENDPOINT_URL": "http://minio:9000", "OTHER": "ignored"}
    for k, v in data.items():
        monkeypatch.setenv(k, v)
    from_env = Settings(store="s3://b/p")
    monkeypatch.delenv("RUNNER_KUBE__NODE_SELECTOR")
    base = Settings(store="s3://b/p", kube={"namespace": "probes"}, concurrency=5)
    over = settings_over(base, data, "ConfigMap p/x")
    assert over.kube.node_selector == from_env.kube.node_selector == {"pool": "probes"}
    assert over.harness.max_turns == from_env.harness.max_turns == 7
    assert over.log.format == from_env.log.format == "json" and over.s3.endpoint_url == "http://minio:9000"
    assert over.kube.namespace == "probes" and over.concurrency == 5  # not in the ConfigMap: the base's values


@pytest.mark.parametrize(("cpu_max", "expected"), [
    (None, "all"), ("max 100000\n", "all"), ("50000 100000\n", 1), ("150000 100000\n", 2), ("100000000 100000\n", "all"),
])
def test_transform_workers_default_to_the_cpus_a_pod_may_use(tmp_path, cpu_max, expected):
    import os

    from runner.settings import usable_cpus

    path = tmp_path / "cpu.max"
    if cpu_max is not None:
        path.write_text(cpu_max)
    cpus = len(os.sched_getaffinity(0))
    assert usable_cpus(path) == (cpus if expected == "all" else min(cpus, expected))


def test_the_transform_runs_with_the_settings_parallel_threshold(monkeypatch):
    """`probe-runner transform` hands both transform settings to the transform."""
    from runner.cli import run as cli_run
    from runner.service import run as service_run
    from runner.service.outcome import Outcome

    seen = {}
    monkeypatch.setenv("RUNNER_TRANSFORM__WORKERS", "3")
    monkeypatch.setenv("RUNNER_TRANSFORM__PARALLEL_MIN_BYTES", "0")
    monkeypatch.setattr(service_run, "stored_campaign", lambda settings, campaign: (None, None))
    monkeypatch.setattr(service_run, "written", lambda store, plan, report: type("W", (), {"outcome": Outcome.DONE}))
    monkeypatch.setattr(cli_run, "render_written", lambda written: None)
    monkeypatch.setattr(service_run, "run_transform", lambda store, plan, *a: seen.setdefault("args", a))
    assert cli.main(["transform", "c1"]) == 0
    assert seen["args"] == (3, 0)
