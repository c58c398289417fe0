"""The exit-status policy (issue 30, item 2: "the exit-status policy (split three ways)"): one
table from what a command came to (runner.service.outcome.Outcome) to its exit status, which
the run's report, a user error, a stop and a watch all go through."""

from __future__ import annotations

import pytest

from runner.campaign import RunReport
from runner.errors import ConfinementError, KeyRefused, SealError, UserError
from runner.executors.base import Remedies
from runner.ledger import LedgerError
from runner.service.outcome import (
    EXIT_STATUS,
    STOPS,
    Outcome,
    error_outcome,
    exit_status,
    watched_exit,
    written_outcome,
)
from runner.service.run import run_stop
from runner.settings import KubeSettings
from runner.status import Stopped


def test_every_outcome_has_its_exit_status():
    assert EXIT_STATUS == {
        Outcome.DONE: 0,
        Outcome.REFUSED: 12,
        Outcome.UNFINISHED: 1,
        Outcome.BAD_INPUT: 2,
        Outcome.KEY_REFUSED: 2,
        Outcome.POLICY_REFUSED: 2,
        Outcome.OVER_BUDGET: 3,
        Outcome.UNCONFINED: 12,
        Outcome.STORE_FAILED: 1,
        Outcome.CHECKS_FAILED: 1,
        Outcome.CHAIN_BROKEN: 1,
        Outcome.INTERRUPTED: 130,
    }
    assert {o: exit_status(o) for o in Outcome} == EXIT_STATUS


@pytest.mark.parametrize(("error", "outcome"), [
    (UserError, Outcome.BAD_INPUT), (SealError, Outcome.BAD_INPUT), (LedgerError, Outcome.BAD_INPUT),
    (KeyRefused, Outcome.KEY_REFUSED), (ConfinementError, Outcome.UNCONFINED),
])
def test_a_user_error_exits_as_its_class_says(error, outcome):
    assert error_outcome(error("x")) is outcome
    assert exit_status(outcome) == error.exit_code


def _report(**fields: object) -> RunReport:
    report = RunReport(Remedies("c", "`probe-runner run` it again", "--corpus DIR", "fix the provider's key"))
    for k, v in fields.items():
        setattr(report, k, v)
    return report


@pytest.mark.parametrize(("fields", "outcome"), [
    ({}, None),
    ({"over_budget": ["P/a-1"], "budget_why": "no room"}, Outcome.OVER_BUDGET),
    ({"halted": "key refused", "over_budget": ["P/a-1"]}, Outcome.KEY_REFUSED),
    ({"policy": "the beta 'x' is not qualified", "refused": ["P/a-1"], "over_budget": ["P/a-2"]}, Outcome.POLICY_REFUSED),
    ({"halted": "key refused", "policy": "the beta 'x' is not qualified"}, Outcome.KEY_REFUSED),
    ({"unconfined": "a route opened", "halted": "key refused", "over_budget": ["P/a-1"]}, Outcome.UNCONFINED),
])
def test_a_stop_exits_as_the_run_words_it(fields, outcome):
    report = _report(**fields)
    stop, stopped = run_stop(report), report.stopped()
    assert (None if stop is None else stop.outcome) is outcome
    assert (stopped is None) == (outcome is None)
    if stop is not None and stopped is not None:
        assert stop.why == stopped[0] and STOPS[stopped[1]] is outcome


@pytest.mark.parametrize(("not_started", "unfinished", "refused", "outcome"), [
    (False, False, False, Outcome.DONE),
    (False, False, True, Outcome.REFUSED),
    (True, False, False, Outcome.UNFINISHED),
    (True, False, True, Outcome.UNFINISHED),
    (False, True, False, Outcome.UNFINISHED),
    (False, True, True, Outcome.UNFINISHED),
    (True, True, False, Outcome.UNFINISHED),
    (True, True, True, Outcome.UNFINISHED),
])
def test_what_the_transform_leaves(not_started, unfinished, refused, outcome):
    assert written_outcome(not_started, unfinished, refused) is outcome


def test_a_watch_exits_as_the_stopped_run_did():
    assert watched_exit(None) == 0
    for code in (2, 3, 12):
        assert watched_exit(Stopped("halted", code, "2026-12-05T10:00:00Z")) == code


def test_a_refusal_before_any_session_ran_names_how_to_run_again_where_a_job_ran_it():
    """Where the service tested the executor's name, the Remedies say it (a Job's refusal is read
    by a watch, where the one who submitted must be told how to run it again)."""
    from runner.executors.kubernetes import kubernetes_remedies
    from runner.executors.local import local_remedies

    assert local_remedies("c").refusal("bwrap cannot confine") == "bwrap cannot confine"
    job = kubernetes_remedies("c", KubeSettings())
    assert job.refusal("the check failed") == f"the check failed, then {job.again}"
