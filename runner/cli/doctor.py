"""``doctor``: whether this host (or the install) can run a campaign, one line per check."""

from __future__ import annotations

from pathlib import Path

import click

from runner.cli.group import cli, with_settings
from runner.settings import Settings


@cli.command(short_help="check that this host (or with --cluster, the install) can run a campaign")
@click.option("--cluster", is_flag=True, help="check the install in $RUNNER_KUBE__NAMESPACE instead of this host: the chart's "
                                              "settings, its bucket from here, a ready provider gateway (or egress proxy), which "
                                              "session nodes lack the session images (a warning), one confinement check by a "
                                              "canary pod, which asks whether the provider accepts the install's key")
@click.option("--plan", "plan_file", type=click.Path(path_type=Path, dir_okay=False), metavar="PLAN",
              help="also check the plan's model: qualified with the harness version (this host's, or the harness "
                   "image's pinned one), priced at the gateway where a budget is set, and one call of it within "
                   "budget.call_usd; what run and submit check before anything is spent")
@with_settings(budget=True)
def doctor(settings: Settings, cluster: bool, plan_file: Path | None) -> int:
    """Check, one line each, what a campaign needs: bubblewrap confines the harness, the
    harness is the CLI version the recorder was verified against, the store is writable, the
    provider accepts the key (a token count: nothing is spent). With --cluster, the install
    instead, not this host: its chart, its bucket from here, its route's pods, the session nodes
    that lack the session images (WARN: their first pods wait for the pull), and a canary's
    confinement check, which also asks the gateway whether the provider accepts the install's
    key. With --plan, also the plan's model (what run and submit refuse before anything is
    spent). Exit 0 only when every check holds (a WARN holds)."""
    from runner.doctor import cluster_checks, local_checks
    from runner.plan import load_plan
    from runner.service.outcome import Outcome, exit_status

    plan = load_plan(plan_file) if plan_file is not None else None
    checks = cluster_checks(settings, plan) if cluster else local_checks(settings, plan)
    for c in checks:
        click.echo(f"{'FAIL' if not c.ok else 'WARN' if c.warn else 'ok  '} {c.name}: {c.says}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        click.echo(f"{len(failed)} of {len(checks)} checks failed: {', '.join(failed)}", err=True)
    return exit_status(Outcome.CHECKS_FAILED if failed else Outcome.DONE)
