"""runner/logs.py: diagnostics through logging, configured once by the CLI; JSON lines naming
the session for the in-cluster Jobs, one human line on a terminal; -v for more."""

from __future__ import annotations

import io
import json
import logging
import threading

import pytest

from runner import cli, logs

log = logging.getLogger("runner.campaign")


@pytest.fixture(autouse=True)
def _restore():
    yield
    root = logging.getLogger("runner")
    for h in list(root.handlers):
        root.removeHandler(h)
    root.setLevel(logging.NOTSET)
    root.propagate = True


def test_json_lines_name_the_session_a_record_was_made_in():
    out = io.StringIO()
    logs.configure("info", "json", out)

    def session():
        with logs.session_context("c1", "HW-PRB-0007", "present-001", 2):
            log.info("outcome %s", "succeeded")
        log.warning("after the session")

    t = threading.Thread(target=session)
    t.start()
    t.join()
    log.debug("not at info")
    first, second = (json.loads(line) for line in out.getvalue().splitlines())
    assert set(first) == {"time", "level", "logger", "message", "campaign", "probe", "session", "attempt"}
    assert {k: first[k] for k in ("level", "logger", "message", "campaign", "probe", "session", "attempt")} == {
        "level": "info", "logger": "runner.campaign", "message": "outcome succeeded", "campaign": "c1",
        "probe": "HW-PRB-0007", "session": "present-001", "attempt": 2}
    assert first["time"].endswith("Z")
    assert {k: second[k] for k in ("level", "message")} == {"level": "warning", "message": "after the session"}
    assert "session" not in second


def test_a_human_line_names_the_session_and_is_one_line():
    out = io.StringIO()
    logs.configure("warning", "human", out)
    with logs.session_context("c1", "HW-PRB-0007", "present-001", 1):
        log.warning("refused: %s", "no route")
    (line,) = out.getvalue().splitlines()
    assert line.endswith(" WARNING runner.campaign: refused: no route [HW-PRB-0007 present-001]")


@pytest.mark.parametrize("argv, env, level", [([], {}, logging.WARNING), (["-v"], {}, logging.INFO),
                                               (["-vv"], {}, logging.DEBUG),
                                               ([], {"RUNNER_LOG__LEVEL": "error"}, logging.ERROR)])
def test_the_cli_configures_logging_once_from_flags_and_settings(monkeypatch, tmp_path, argv, env, level):
    monkeypatch.setenv("RUNNER_STORE", tmp_path.as_uri())
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert cli.main([*argv, "status", "no-such-campaign"]) == 2  # any command: logging is set before it runs
    assert logging.getLogger("runner").level == level


def test_a_bad_log_setting_is_a_clear_error(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("RUNNER_STORE", tmp_path.as_uri())
    monkeypatch.setenv("RUNNER_LOG__FORMAT", "xml")
    assert cli.main(["status", "x"]) == 2
    assert "settings: log.format: Input should be 'human' or 'json'" in capsys.readouterr().err
