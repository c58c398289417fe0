"""``ledger``: export, verify, recover, cancel, resume (runner.service.ledger)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from runner.cli.group import campaign_argument, cli, session_argument, with_settings
from runner.settings import Settings


@cli.group(short_help="inspect and resolve the campaign ledger")
def ledger() -> None:
    """export: canonical JSON Lines and their SHA-256; verify: check the hash chain; recover:
    mark started sessions with no outcome as interrupted (nothing runs); cancel: close an
    interrupted session; resume: run a new attempt of one."""


@ledger.command(short_help="check the hash chain")
@campaign_argument
@with_settings()
def verify(settings: Settings, campaign: str) -> int:
    """Check the ledger's hash chain; exit 1 with each problem on stderr when it breaks."""
    from runner.service import ledger as service
    from runner.service.outcome import exit_status

    done = service.verify(settings, campaign)
    for p in done.problems:
        click.echo(f"ledger {done.campaign}: {p}", err=True)
    if not done.problems:
        click.echo(f"ledger {done.campaign}: {done.entries} entries, chain verifies")
    return exit_status(done.outcome)


@ledger.command(short_help="canonical JSON Lines and their SHA-256")
@campaign_argument
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="write the JSON Lines here instead of stdout")
@with_settings()
def export(settings: Settings, campaign: str, output: Path | None) -> int:
    """Write the ledger as canonical JSON Lines (stdout or --output) and its SHA-256 on stderr."""
    from runner.service import ledger as service

    done = service.export(settings, campaign)
    if output:
        output.write_bytes(done.data)
    else:
        out = click.get_binary_stream("stdout")
        out.write(done.data)
        out.flush()
    click.echo(f"sha256 {done.sha256} ({done.entries} entries)", err=True)
    return 0


@ledger.command(short_help="mark started sessions with no outcome as interrupted")
@campaign_argument
@with_settings()
def recover(settings: Settings, campaign: str) -> int:
    """Mark every started session with no outcome as interrupted. Nothing is run or stopped;
    captured stream bytes are kept."""
    from runner.service import ledger as service

    marked = service.recover(settings, campaign)
    for m in marked:
        click.echo(f"interrupted: {m.key} (attempt {m.attempt}): {m.why}")
    click.echo(f"{len(marked)} session(s) marked interrupted; nothing was run or stopped, captured stream bytes were kept")
    return 0


@ledger.command(short_help="close an interrupted session")
@campaign_argument
@session_argument
@with_settings()
def cancel(settings: Settings, campaign: str, session: str) -> int:
    """Close SESSION's latest attempt: it stays unrecorded and is not run again."""
    from runner.service import ledger as service

    done = service.cancel(settings, campaign, session)
    click.echo(f"cancelled: {done.key} (attempt {done.attempt})")
    return 0


@ledger.command(short_help="run a new attempt of interrupted or failed sessions")
@campaign_argument
@click.argument("sessions", metavar="PROBE/SESSION...", nargs=-1, required=True)
@click.option("--corpus", type=click.Path(path_type=Path, file_okay=False),
              help="the corpus directory (must be unchanged); for a run on this host")
@click.option("--job", is_flag=True, help="run them in the cluster instead, for a submitted campaign: create the "
                                          "campaign's resume Job in $RUNNER_KUBE__NAMESPACE (the install's settings, "
                                          "the corpus as submitted), which also runs what has not run, then the transform")
@with_settings(budget=True)
def resume(settings: Settings, campaign: str, sessions: tuple[str, ...], corpus: Path | None, job: bool) -> int:
    """Run a new attempt of each SESSION (interrupted or failed), then the transform: on this
    host (--corpus), or in the cluster (--job, one Job for them all) for a submitted campaign."""
    from runner.cli.run import RunProgress, render_run
    from runner.service import ledger as service
    from runner.service.run import CampaignRun

    done = service.resume(settings, campaign, sessions, corpus, job, progress=RunProgress(sys.stderr))
    if isinstance(done, CampaignRun):
        return render_run(done)
    click.echo(f"resume job: {done.job} (created): a new attempt of {', '.join(done.sessions)}, then the transform; "
               f"watch it: probe-runner status {done.campaign} --watch")
    return 0
