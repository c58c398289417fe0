"""``doctor``: whether this host (or the install) can run a campaign, one line per check."""

from __future__ import annotations

import click

from runner.cli.group import cli, with_settings
from runner.settings import Settings


@cli.command(short_help="check that this host (or with --cluster, the install) can run a campaign")
@click.option("--cluster", is_flag=True, help="check the install in $RUNNER_KUBE__NAMESPACE instead of this host: the chart's "
                                              "settings, its bucket from here, a ready provider gateway (or egress proxy), which "
                                              "session nodes lack the session images (a warning), one confinement check by a "
                                              "canary pod, which asks whether the provider accepts the install's key")
@with_settings()
def doctor(settings: Settings, cluster: bool) -> int:
    """Check, one line each, what a campaign needs: bubblewrap confines the harness, the
    harness is the CLI version the recorder was verified against, the store is writable, the
    provider accepts the key (a token count: nothing is spent). With --cluster, the install
    instead, not this host: its chart, its bucket from here, its route's pods, the session nodes
    that lack the session images (WARN: their first pods wait for the pull), and a canary's
    confinement check, which also asks the gateway whether the provider accepts the install's
    key. Exit 0 only when every check holds (a WARN holds)."""
    from runner.doctor import cluster_checks, local_checks
    from runner.service.outcome import Outcome, exit_status

    checks = cluster_checks(settings) if cluster else local_checks(settings)
    for c in checks:
        click.echo(f"{'FAIL' if not c.ok else 'WARN' if c.warn else 'ok  '} {c.name}: {c.says}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        click.echo(f"{len(failed)} of {len(checks)} checks failed: {', '.join(failed)}", err=True)
    return exit_status(Outcome.CHECKS_FAILED if failed else Outcome.DONE)
