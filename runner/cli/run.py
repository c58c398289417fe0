"""The commands that run sessions (``run``, ``controller``, ``demo``; ``ledger resume`` on this
host), all through runner.service.run.run_campaign, and the in-cluster ``gateway``; what a run
came to, rendered."""

from __future__ import annotations

import sys
from decimal import Decimal
from pathlib import Path
from typing import IO, TYPE_CHECKING

import click

from runner.budget import dollars
from runner.cli.group import cli, corpus_option, plan_argument, share_options, with_settings
from runner.executors import registry
from runner.progress import RunEnded, RunEvent, RunNote, RunPlanned, SessionEnded, SessionStarted
from runner.settings import Settings
from runner.share import WHOLE, Share

if TYPE_CHECKING:
    from runner.live import LiveProgress
    from runner.plan import Plan
    from runner.service.run import CampaignRun, ShareEnded, Written


@cli.command(short_help="run a campaign to the end (continues one already started)")
@plan_argument
@corpus_option()
@click.option("--executor", type=click.Choice(registry.NAMES), default=registry.NAMES[0],
              help="where sessions run: local (under bwrap, the default) or kubernetes (one pod per session, "
                   "through $RUNNER_KUBE__KUBECONFIG or the current kubeconfig context)")
@click.option("--produced", multiple=True, metavar="PATH",
              help="a workspace path a session may write without naming it (e.g. a Bash redirect); repeatable")
@share_options
@with_settings(concurrency=True, budget=True)
def run(settings: Settings, plan: Path, corpus: Path, executor: str, produced: tuple[str, ...], share: Share) -> int:
    """Run every session of PLAN that has not run, then the transform. Safe to run again:
    sessions that ran are not repeated; interrupted ones are reported for `ledger recover`.
    With --shares, run one share of it beside the processes that run the others (on other
    hosts, against the same --store)."""
    from runner.plan import load_plan

    return run_and_report(settings, load_plan(plan), corpus, executor, list(produced), share)


@cli.command(short_help="in-cluster entry point: run a submitted campaign's sessions as pods")
@click.option("--campaign", required=True)
@click.option("--resume", "resume", multiple=True, metavar="SESSION",
              help="also run a new attempt of SESSION (interrupted or failed; `ledger resume --job`); repeatable")
@share_options
@with_settings(concurrency=True, budget=True)
def controller(settings: Settings, campaign: str, resume: tuple[str, ...], share: Share) -> int:
    """Run every session of CAMPAIGN (plan and corpus as `submit` stored them) as Kubernetes
    pods, then the transform. Safe to restart: live pods are adopted, nothing repeats. With
    --shares (kube.controllers: the pods of an Indexed Job), one share of them."""
    from runner.service.run import run_submitted

    return render_run(run_submitted(settings, campaign, resume, progress=RunProgress(sys.stderr), share=share))


@cli.command(short_help="in-cluster entry point: the provider gateway, the one holder of the provider key")
@with_settings()
def gateway(settings: Settings) -> int:
    """Serve the provider gateway of this install (the chart's gateway Deployment runs it): check
    each session's token against its running pod, forward the Messages API calls to
    provider.base_url with provider.api_key, meter them into each attempt's Lease. Runs until
    SIGTERM, then lets open calls finish for gateway.drain_seconds."""
    from runner.gateway.cluster import serve

    serve(settings)
    return 0


@cli.command(short_help="run the bundled example campaign against a scripted local provider")
@with_settings()
def demo(settings: Settings) -> int:
    """Run a small bundled campaign (2 probes x 2 arms x 2 repetitions) with the real Claude
    Code CLI against a scripted local Messages API, and print where the transcripts are."""
    from runner.demo import run_demo

    return run_demo(settings, run_and_report)


def run_and_report(settings: Settings, plan: Plan, corpus: Path, executor: str = "local",
                   produced: list[str] | None = None, share: Share = WHOLE) -> int:
    """Run the campaign (``share`` of it) through the service's one path, show what came of it,
    and return the exit status it makes."""
    from runner.service.run import run_campaign

    return render_run(run_campaign(settings, plan, corpus, executor, produced or [], progress=RunProgress(sys.stderr),
                                   share=share))


class RunProgress:
    """A run's progress as it goes (runner/progress.py's events): on a terminal the live board
    (runner/live.py), otherwise one line per session that ends and per note (a pause, a stop).
    Told from one thread at a time: the run's event loop (runner/aio.py), and the caller's
    before and after it."""

    def __init__(self, out: IO[str]) -> None:
        self.out = out
        self.total = self.done = 0
        self.cost = Decimal(0)
        self.live: LiveProgress | None = None

    def __call__(self, event: RunEvent) -> None:
        if isinstance(event, RunPlanned):
            self.total = sum(event.arms.values())
            if self.total and getattr(self.out, "isatty", lambda: False)():
                from runner.live import LiveProgress

                self.live = LiveProgress(event.campaign, event.arms, self.out)
        elif isinstance(event, SessionStarted):
            if self.live is not None:
                self.live.start(event.arm, event.key)
        elif isinstance(event, SessionEnded):
            self.done += 1
            if event.cost is not None:
                self.cost += event.cost
            if self.live is not None:
                self.live.end(event.arm, event.key, event.status, event.cost)
            else:
                print(f"[{self.done}/{self.total}] {event.probe} {event.session}: {event.status}  "
                      f"(cost so far ${self.cost:.4f})", file=self.out, flush=True)
        elif isinstance(event, RunNote):
            if self.live is not None:
                self.live.note(event.text)
            else:
                print(event.text, file=self.out, flush=True)
        elif isinstance(event, RunEnded) and self.live is not None:
            self.live.close()


def render_run(done: CampaignRun) -> int:
    """The sessions left interrupted, what the transform wrote, why the run stopped; the exit
    status of what the run came to."""
    from runner.service.outcome import exit_status
    from runner.service.run import ShareEnded

    for left in done.interrupted:
        click.echo(f"interrupted: {left.key} started and has no outcome; it may or may not have executed. "
                   f"Inspect it, then `probe-runner ledger recover {done.campaign}` and cancel it, or resume it: "
                   f"{left.resume}.", err=True)
    if isinstance(done.written, ShareEnded):
        render_share_ended(done.written)
    else:
        render_written(done.written)
    if done.stop is not None:
        click.echo(done.stop.why, err=True)
    return exit_status(done.outcome)


def render_share_ended(ended: ShareEnded) -> None:
    """A share of a split campaign ended before the others: what it left; the transform is the last share's."""
    click.echo(f"share {ended.share} ended; the transform runs when the last share ends (waiting for "
               f"{', '.join(ended.waiting_for)})")
    if ended.not_started:
        click.echo(f"not started: {len(ended.not_started)} session(s) of share {ended.share}, e.g. {ended.not_started[0]}: "
                   f"nothing was spent; {ended.again} to start them", err=True)


def render_written(written: Written) -> None:
    """Where the transcripts are, what was refused, what did not start (and how the campaign
    runs again to start it, on its executor)."""
    from runner import layout

    report = written.report
    for arm in report.arms:
        if arm.key:
            click.echo(f"transcript {written.tier}-{arm.arm}: {written.store_uri}/{arm.key} ({arm.events} events)")
    click.echo(f"refusals: {written.store_uri}/{layout.refusals_key(written.campaign)}")
    click.echo(f"realized cost: {dollars(report.cost_usd)}")
    if report.refusals:
        click.echo("\nrefused:")
        for r in report.refusals:
            where = f"{r.get('probe')} {r.get('session')}" if r["scope"] != "transcript" else r["transcript"]
            click.echo(f"  {r['scope']} {where} ({r.get('arm')}): {r['reason']}")
    if written.not_started:
        click.echo(f"not started: {len(written.not_started)} session(s), e.g. {written.not_started[0]}: nothing was "
                   f"spent; {written.again} to start them", err=True)
