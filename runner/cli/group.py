"""The ``probe-runner`` group: its help, its -v, and the options more than one command takes,
with the settings each command is given (environment, then flags)."""

from __future__ import annotations

import functools
from collections.abc import Callable
from decimal import Decimal
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from runner import __version__, logs
from runner.errors import UserError
from runner.settings import BudgetSettings, Settings, load_settings

EPILOG = """\b
Settings come from the environment (prefix RUNNER_, '__' between nested names), e.g.
  RUNNER_STORE=file:///srv/runs  RUNNER_PROVIDER__BASE_URL=https://api.anthropic.com
  RUNNER_PROVIDER__API_KEY=...   RUNNER_HARNESS__COMMAND=/usr/bin/claude
flags override them.
\b
Exit status: 0 all recorded; 1 sessions left interrupted or not started; 2 bad input;
3 the campaign's budget stopped it (the sessions not started wait for a larger budget);
12 a session could not be confined or something was refused (see the refused section)."""

PLAN_HELP = "the plan file (JSON, or YAML by .yaml/.yml)"
CORPUS_HELP = "the corpus directory the plan was made over"

F = TypeVar("F", bound=Callable[..., Any])

# Options more than one command takes, declared once.
store_option = click.option("--store", metavar="URI",
                            help="store URI: file:///abs/dir or s3://bucket/prefix (default: $RUNNER_STORE or ./runs)")
concurrency_option = click.option("--concurrency", type=int, metavar="N", help="sessions at once (default: $RUNNER_CONCURRENCY or 2)")
plan_argument = click.argument("plan", type=click.Path(path_type=Path, dir_okay=False))
campaign_argument = click.argument("campaign")
session_argument = click.argument("session", metavar="PROBE/SESSION")


def corpus_option(help: str = CORPUS_HELP) -> Callable[[F], F]:
    return click.option("--corpus", type=click.Path(path_type=Path, file_okay=False), required=True, help=help)


def interval_option() -> Callable[[F], F]:
    return click.option("--interval", type=float, default=10.0, metavar="SECONDS",
                        help="seconds between two reads of the ledger with --watch (default: 10)")


def share_options(command: F) -> F:
    """--shares/--share-index, given to the command as ``share`` (runner/share.py)."""
    @functools.wraps(command)
    def wrapper(*args: Any, shares: int, share_index: int | None, **kwargs: Any) -> Any:
        from runner.share import Share

        if shares > 1 and share_index is None:
            raise click.UsageError(f"--shares {shares} needs --share-index (0 to {shares - 1}): which share this "
                                   "process runs; a pod of the campaign's Indexed Job has it as JOB_COMPLETION_INDEX")
        return command(*args, share=Share(share_index or 0, shares), **kwargs)

    wrapper = click.option("--share-index", type=click.IntRange(min=0), envvar="JOB_COMPLETION_INDEX", metavar="I",
                           help="which share this process runs, 0 to --shares - 1 (default: $JOB_COMPLETION_INDEX, "
                                "which the Job controller gives each pod of an Indexed Job)")(wrapper)
    return cast(F, click.option(
        "--shares", type=click.IntRange(min=1), default=1, show_default=True, metavar="N",
        help="split the campaign across N processes (controllers), each running one share: the sessions at "
             "positions I, I+N, I+2N... of the plan, with its part of --concurrency and of the budget; the last "
             "share to end runs the transform (kube.controllers for a submitted campaign)")(wrapper))


budget_options = [
    click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
                 help="the campaign's spend limit over all its runs; no session starts whose reservation would pass it "
                      "(default: $RUNNER_BUDGET__CAMPAIGN_USD, or none)"),
    click.option("--session-budget-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
                 help="each session's limit, the CLI's --max-budget-usd (default: $RUNNER_BUDGET__SESSION_USD, or none)"),
]


def with_settings(concurrency: bool = False, budget: bool = False) -> Callable[[Callable[..., int]], Callable[..., int]]:
    """Give the command its settings (environment, then its --store/--concurrency/--budget-usd/
    --session-budget-usd flags) as the first argument, with logging configured once from them
    and the group's -v, before the command runs."""
    def decorate(command: Callable[..., int]) -> Callable[..., int]:
        @functools.wraps(command)
        def wrapper(*args: Any, store: str | None, concurrency: int | None = None, budget_usd: float | None = None,
                    session_budget_usd: float | None = None, **kwargs: Any) -> int:
            settings = load_settings(store=store, concurrency=concurrency)
            flags = {k: Decimal(str(v)) for k, v in (("campaign_usd", budget_usd), ("session_usd", session_budget_usd))
                     if v is not None}
            if flags:
                settings = settings.model_copy(update={"budget": budget_settings(settings, flags)})
            verbose = click.get_current_context().find_root().params.get("verbose", 0)
            logs.configure({0: settings.log.level, 1: "info"}.get(verbose, "debug"), settings.log.format)
            return command(settings, *args, **kwargs)

        wrapped: Callable[..., int] = store_option(wrapper)
        if concurrency:
            wrapped = concurrency_option(wrapped)
        if budget:
            for option in budget_options:
                wrapped = option(wrapped)
        return wrapped
    return decorate


def budget_settings(settings: Settings, flags: dict[str, Decimal]) -> BudgetSettings:
    """The environment's budget with the flags laid over it, validated as a whole."""
    from pydantic import ValidationError

    from runner.errors import format_validation_error

    try:
        return BudgetSettings(**{**settings.budget.model_dump(), **flags})
    except ValidationError as e:
        raise UserError(format_validation_error("budget", e)) from None


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, "--version", prog_name="probe-runner", message="%(prog)s %(version)s")
@click.option("-v", "--verbose", count=True,
              help="log more to stderr: -v info (each session's outcome), -vv debug "
                   "(default: $RUNNER_LOG__LEVEL or warning; format: $RUNNER_LOG__FORMAT, human or json)")
def cli(verbose: int) -> None:
    """Run probe campaigns and read what they recorded."""
