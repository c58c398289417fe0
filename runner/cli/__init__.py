"""``probe-runner``: run probe campaigns and read what they recorded.

Every user mistake ends as one clear line on stderr and an exit status (the one table of
runner.service.outcome: 2 for bad input, 12 where a session cannot be confined or the recorder
refused what it saw), never a traceback. The commands are a thin layer: one module per group
of them (``run``: run, controller, gateway, demo; ``campaigns``: submit, logs, pull, transform;
``status``; ``ledger``; ``doctor``; ``report``) parses its options, calls the service layer
(runner.service) and renders the typed results and events it returns; ``group`` holds the
group and the options more than one command takes.
"""

from __future__ import annotations

import click

from runner.cli import campaigns, doctor, harness, ledger, report, run, status  # noqa: F401 - each registers its commands
from runner.cli.group import cli
from runner.errors import UserError
from runner.service.outcome import Outcome, error_outcome, exit_status
from runner.store import StoreError

__all__ = ["cli", "main"]

INTERRUPTED = "probe-runner: interrupted; run the same command again to continue"


def main(argv: list[str] | None = None) -> int:
    """The console script: parse, run, and turn every user mistake into a line and a status."""
    try:
        return int(cli.main(args=argv, prog_name="probe-runner", standalone_mode=False) or 0)
    except click.ClickException as e:  # bad flags or arguments: click's usage line and message
        e.show()
        return e.exit_code
    except click.Abort:  # click's form of KeyboardInterrupt
        click.echo(INTERRUPTED, err=True)
        return exit_status(Outcome.INTERRUPTED)
    except UserError as e:
        click.echo(f"probe-runner: {e}", err=True)
        return exit_status(error_outcome(e))
    except StoreError as e:
        click.echo(f"probe-runner: store: {e}", err=True)
        return exit_status(Outcome.STORE_FAILED)
    except KeyboardInterrupt:
        click.echo(INTERRUPTED, err=True)
        return exit_status(Outcome.INTERRUPTED)
