"""The commands over a campaign in the store or the cluster: ``submit`` (and its --watch),
``logs``, ``pull``, ``transform``."""

from __future__ import annotations

from pathlib import Path

import click

from runner import layout
from runner.cli.group import campaign_argument, cli, corpus_option, interval_option, plan_argument, with_settings
from runner.settings import Settings


@cli.command(short_help="upload a plan and its corpus to the bucket and start the campaign in the cluster")
@plan_argument
@corpus_option()
@click.option("--watch", is_flag=True,
              help="then follow the campaign as status --watch does: until every session is final and its transcripts "
                   "are ready, or its run stopped")
@interval_option()
@with_settings(budget=True)
def submit(settings: Settings, plan: Path, corpus: Path, watch: bool, interval: float) -> int:
    """Store PLAN and the corpus under the campaign in the install's bucket (create-only: a
    campaign name is bound to one plan and corpus for good), then create the campaign's
    controller Job in $RUNNER_KUBE__NAMESPACE, which runs every session as a pod and then the
    transform. Submitting the same campaign again changes nothing. Needs the Helm chart
    installed as $RUNNER_KUBE__INSTANCE: its settings (bucket, images, resources) are what the
    Job runs with and where the plan goes."""
    from runner.cli.status import stopped_line, watch_rendering
    from runner.service.cluster import submit as submit_campaign
    from runner.service.watch import watch_campaign

    done = submit_campaign(settings, plan, corpus, click.get_current_context().params.get("store"))
    click.echo(f"plan: {done.plan_uri}")
    click.echo(f"corpus: {done.corpus_uri} ({done.corpus_digest})")
    click.echo(f"controller job: {done.job} ({'created' if done.created else 'exists already: submitted before'})")
    if not watch:
        click.echo(f"watch it: probe-runner status {done.plan.campaign} --watch")
        return 0
    with watch_rendering() as on_event:
        watched = watch_campaign(done.store, done.plan, settings, interval, on_event)
    if watched.status.stopped is not None:
        click.echo(stopped_line(watched.status.stopped), err=True)
    return watched.exit


@cli.command("logs", short_help="print one session's raw harness stream from the store")
@campaign_argument
@click.argument("probe")
@click.argument("session")
@click.option("--attempt", type=int, help="attempt number (default: the latest)")
@with_settings()
def stream(settings: Settings, campaign: str, probe: str, session: str, attempt: int | None) -> int:
    """Write the stream.jsonl of PROBE SESSION (e.g. HW-PRB-0007 present-001: the harness's
    standard output, byte for byte) to stdout, checked against the sha256 the ledger recorded.
    A stream that could not be proven complete is printed with a warning on stderr."""
    from runner.service.events import Event, PartialStream
    from runner.service.fetch import copy_stream

    def warn(event: Event) -> None:
        if isinstance(event, PartialStream):
            click.echo(f"probe-runner: {event.key}: the stream could not be proven complete; this is what was kept",
                       err=True)

    copy_stream(settings, campaign, probe, session, attempt, click.get_binary_stream("stdout"), warn)
    return 0


@cli.command(short_help="download a campaign's transcripts and refusals, verifying their digests",
             help=f"Copy transcripts/ of CAMPAIGN (the transcripts and refusals.json) into DEST after checking every file "
                  f"against the {layout.SUMS_NAME} the transform wrote beside them. Nothing is written unless every file verifies.")
@campaign_argument
@click.option("--dest", type=click.Path(path_type=Path, dir_okay=True, file_okay=False), required=True,
              help="the directory to write them into")
@with_settings()
def pull(settings: Settings, campaign: str, dest: Path) -> int:
    from runner.service.events import Event, FileWritten
    from runner.service.fetch import pull as pull_transcripts

    def written(event: Event) -> None:
        if isinstance(event, FileWritten):
            click.echo(str(event.path))

    pull_transcripts(settings, campaign, dest, written)
    return 0


@cli.command(short_help="(re)build the transcripts and refusals.json from the stored streams")
@campaign_argument
@click.option("--job", is_flag=True, help="run it in the cluster instead: create the campaign's transform Job in "
                                          "$RUNNER_KUBE__NAMESPACE (the install's settings and bucket credentials)")
@with_settings()
def transform(settings: Settings, campaign: str, job: bool) -> int:
    """(Re)build the transcripts and refusals.json from the stored streams."""
    if not job:
        from runner.cli.run import render_written
        from runner.service.outcome import exit_status
        from runner.service.run import transform_stored

        written = transform_stored(settings, campaign)
        render_written(written)
        return exit_status(written.outcome)
    from runner.service.cluster import transform_job

    click.echo(f"transform job: {transform_job(settings, campaign).job} (created)")
    return 0
