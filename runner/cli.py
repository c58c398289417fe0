"""``probe-runner``: run probe campaigns and read what they recorded.

Every user mistake ends as one clear line on stderr and an exit status (2 for bad input, 12
where a session cannot be confined or the recorder refused what it saw), never a traceback.
Each command is a small function over the domain (``runner.service``, ``runner.status``,
``runner.pull``, the ledger); click parses, this module prints.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from decimal import Decimal
from pathlib import Path
from typing import Any

import click

from runner import __version__, layout, logs
from runner.budget import dollars
from runner.errors import EXIT_CONFINEMENT, UserError
from runner.executors import registry
from runner.settings import Settings, load_settings
from runner.store import StoreError

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


# Options more than one command takes, declared once.
store_option = click.option("--store", metavar="URI",
                            help="store URI: file:///abs/dir or s3://bucket/prefix (default: $RUNNER_STORE or ./runs)")
concurrency_option = click.option("--concurrency", type=int, metavar="N", help="sessions at once (default: $RUNNER_CONCURRENCY or 2)")
plan_argument = click.argument("plan", type=click.Path(path_type=Path, dir_okay=False))
campaign_argument = click.argument("campaign")


def corpus_option(help: str = CORPUS_HELP) -> Callable:
    return click.option("--corpus", type=click.Path(path_type=Path, file_okay=False), required=True, help=help)


budget_options = [
    click.option("--budget-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
                 help="the campaign's spend limit over all its runs; no session starts whose reservation would pass it "
                      "(default: $RUNNER_BUDGET__CAMPAIGN_USD, or none)"),
    click.option("--session-budget-usd", type=click.FloatRange(min=0, min_open=True), metavar="USD",
                 help="each session's limit, the CLI's --max-budget-usd (default: $RUNNER_BUDGET__SESSION_USD, or none)"),
]


def with_settings(concurrency: bool = False, budget: bool = False) -> Callable:
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

        wrapper = store_option(wrapper)
        if concurrency:
            wrapper = concurrency_option(wrapper)
        if budget:
            for option in budget_options:
                wrapper = option(wrapper)
        return wrapper
    return decorate


def budget_settings(settings: Settings, flags: dict[str, Decimal]) -> Any:
    """The environment's budget with the flags laid over it, validated as a whole."""
    from pydantic import ValidationError

    from runner.errors import format_validation_error
    from runner.settings import BudgetSettings

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


# ---- commands that run sessions: all go through runner.service.run_campaign -------------------

@cli.command(short_help="run a campaign to the end (continues one already started)")
@plan_argument
@corpus_option()
@click.option("--executor", type=click.Choice(registry.NAMES), default=registry.NAMES[0],
              help="where sessions run: local (under bwrap, the default) or kubernetes (one pod per session, "
                   "through $RUNNER_KUBE__KUBECONFIG or the current kubeconfig context)")
@click.option("--produced", multiple=True, metavar="PATH",
              help="a workspace path a session may write without naming it (e.g. a Bash redirect); repeatable")
@with_settings(concurrency=True, budget=True)
def run(settings: Settings, plan: Path, corpus: Path, executor: str, produced: tuple[str, ...]) -> int:
    """Run every session of PLAN that has not run, then the transform. Safe to run again:
    sessions that ran are not repeated; interrupted ones are reported for `ledger recover`."""
    from runner.plan import load_plan

    return run_sessions(settings, load_plan(plan), corpus, executor, list(produced))


@cli.command(short_help="in-cluster entry point: run a submitted campaign's sessions as pods")
@click.option("--campaign", required=True)
@click.option("--resume", "resume", multiple=True, metavar="SESSION",
              help="also run a new attempt of SESSION (interrupted or failed; `ledger resume --job`); repeatable")
@with_settings(concurrency=True, budget=True)
def controller(settings: Settings, campaign: str, resume: tuple[str, ...]) -> int:
    """Run every session of CAMPAIGN (plan and corpus as `submit` stored them) as Kubernetes
    pods, then the transform. Safe to restart: live pods are adopted, nothing repeats."""
    from runner.corpus import fetch_corpus

    store, plan = stored_campaign(settings, campaign)
    if resume:
        book = campaign_ledger(settings, campaign)[1]
        for session in resume:
            resumable(book, plan, session)
    corpus = fetch_corpus(store, plan.campaign, settings.local.workdir / plan.campaign / "corpus")
    return run_sessions(settings, plan, corpus, "kubernetes", resume=set(resume) or None)


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

    return run_demo(settings, run_sessions)


def run_sessions(settings: Settings, plan: Any, corpus: Path, executor: str = "local", produced: list[str] | None = None,
                 resume: set[str] | None = None) -> int:
    """Run the campaign through the domain's one path and say what came of it."""
    from runner.service import run_campaign

    done = run_campaign(settings, plan, corpus, executor, produced or [], resume)
    report = done.sessions
    for key in report.interrupted:
        click.echo(f"interrupted: {key} started and has no outcome; it may or may not have executed. "
                   f"Inspect it, then `probe-runner ledger recover {plan.campaign}` and cancel it, or resume it: "
                   f"{report.remedies.resume(key)}.", err=True)
    code = print_report(done.store, plan, done.transcripts, report.remedies.again)
    if (stop := report.stopped()) is not None:
        why, code = stop
        click.echo(why, err=True)
    return code


def print_report(store: Any, plan: Any, report: Any, again: str = "`probe-runner run` it again") -> int:
    """Where the transcripts are, what was refused, what did not start (``again``: how the
    campaign runs again, on its executor); the exit status they make."""
    from runner.ledger import Ledger

    for arm in report.arms:
        if arm.key:
            click.echo(f"transcript {plan.tier.value}-{arm.arm}: {store.uri}/{arm.key} ({arm.events} events)")
    click.echo(f"refusals: {store.uri}/{layout.refusals_key(plan.campaign)}")
    click.echo(f"realized cost: {dollars(report.cost_usd)}")
    if report.refusals:
        click.echo("\nrefused:")
        for r in report.refusals:
            where = f"{r.get('probe')} {r.get('session')}" if r["scope"] != "transcript" else r["transcript"]
            click.echo(f"  {r['scope']} {where} ({r.get('arm')}): {r['reason']}")
    states = Ledger(store, plan.campaign).sessions()
    waiting = [spec.key for spec in plan.sessions() if spec.key not in states or states[spec.key].status == "intended"]
    if waiting:
        click.echo(f"not started: {len(waiting)} session(s), e.g. {waiting[0]}: nothing was spent; "
                   f"{again} to start them", err=True)
    if waiting or any(s.status == "started" for s in states.values()):
        return 1
    return EXIT_CONFINEMENT if report.refusals else 0


# ---- commands that read a campaign from the store -------------------------------------------

def stored_campaign(settings: Settings, campaign: str) -> tuple[Any, Any]:
    """The store and the campaign's plan as it was stored; a clear error when there is none."""
    from runner.corpus import load_stored_plan
    from runner.store import open_store

    store = open_store(settings.store, settings)
    return store, load_stored_plan(store, campaign)


def status_line(st: dict, width: int = 24) -> str:
    done = width * st["final"] // st["total"] if st["total"] else width
    running = st["sessions"].get("started", 0)
    waiting = f", {waiting_note(st['waiting'])}" if st.get("waiting") else ""
    left = st["budget"]["left_usd"]
    budget = f", budget left {dollars(left)}" if left is not None else ""
    return (f"[{'#' * done}{'.' * (width - done)}] {st['final']}/{st['total']} final, {running} running{waiting}, "
            f"cost {dollars(st['cost_usd'])}{budget}, refusals {len(st['refusals'])}{ending_note(st, ', ')}")


def ending_note(st: dict, lead: str = "") -> str:
    """What the end of the campaign waits on, once there is only that: that the last run
    stopped, or, every session final, whether the transcripts are ready to pull yet."""
    if st["stopped"] is not None:
        return lead + "the last run stopped (see below)"
    if st["final"] != st["total"]:
        return ""
    return lead + ("transcripts ready" if st["transcripts"]["ready"] else "waiting for the transform to write the transcripts")


def settled(st: dict) -> bool:
    """Nothing left to watch: every session is final and the transcripts of them are ready, or
    the last run stopped with sessions that nothing starts until someone acts (``stopped``)."""
    return bool(st["final"] == st["total"] and st["transcripts"]["ready"]) or st["stopped"] is not None


def watch_campaign(read: Callable[[], dict], interval: float) -> dict:
    """Follow a campaign (``read``: its status now) until it is ``settled``, so a pull right
    after finds its transcripts, or a stopped run leaves nothing to wait for: the live board on a
    terminal, one plain line per change otherwise. Returns the last status."""
    st = read()
    if sys.stdout.isatty():
        return watch_live(st, read, interval)
    last = None
    while True:
        line = status_line(st)
        if line != last:
            click.echo(line)
        last = line
        if settled(st):
            return st
        time.sleep(interval)
        st = read()


def watch_live(st: dict, read: Callable[[], dict], interval: float) -> dict:
    """status --watch on a terminal: the live board (runner/live.py) until the campaign is
    ``settled``; the pace is measured from when the watch began."""
    from rich.console import Console
    from rich.live import Live

    from runner.clock import timestamp
    from runner.live import Board, board_view

    def board(st: dict) -> Board:
        running = {k: timestamp(at) if at else began
                   for k, at in st["running"].items()}
        notes = [f"budget left {dollars(st['budget']['left_usd'])}"] if st["budget"]["left_usd"] is not None else []
        notes += [waiting_note(st["waiting"])] if st.get("waiting") else []
        notes += [f"{len(st['refusals'])} refused so far"] if st["refusals"] else []
        if st["stopped"] is not None:
            notes.append(f"the last run stopped: {st['stopped']['why']}")
        elif ending := ending_note(st):
            notes.append(ending)
        cost = Decimal(st["cost_usd"])
        return Board(st["campaign"], st["total"], st["arms"], running, cost, began, st["final"] - final_at_start, notes,
                     cost_since=cost - cost_at_start)

    began, final_at_start, cost_at_start = time.time(), st["final"], Decimal(st["cost_usd"])
    current = [board(st)]  # redrawn twice a second, so elapsed times move between reads
    with Live(get_renderable=lambda: board_view(current[0], time.time()), console=Console(), refresh_per_second=2):
        while not settled(st):
            time.sleep(interval)
            st = read()
            current[0] = board(st)
    return st


def waiting_note(waiting: dict[str, dict[str, str]]) -> str:
    """How many sessions wait for their pod, and why the most of them wait (the scheduler's or
    the kubelet's words: ``unschedulable: 0/1 nodes are available: 1 Insufficient cpu``)."""
    reasons = Counter(w["reason"] for w in waiting.values())
    reason, n = reasons.most_common(1)[0]
    return f"{len(waiting)} waiting for a pod ({'' if n == len(waiting) else f'{n}: '}{reason})"


def waiting_lines(waiting: dict[str, dict[str, str]]) -> list[str]:
    """Sessions that wait for their pod, one line per reason, most sessions first."""
    by_reason: dict[str, list[str]] = {}
    for session, w in waiting.items():
        by_reason.setdefault(w["reason"], []).append(session)
    return [f"  {len(s)} waiting: {reason} (e.g. {s[0]}, since {waiting[s[0]]['since']})"
            for reason, s in sorted(by_reason.items(), key=lambda kv: -len(kv[1]))]


@cli.command(short_help="counts of sessions by state, cost so far, refusals")
@campaign_argument
@click.option("--json", "as_json", is_flag=True, help="print machine-readable JSON")
@click.option("--watch", is_flag=True, help="follow the campaign until every session is final and its transcripts are ready "
                                            "to pull, or its run stopped (a refused key, a failed confinement check, the "
                                            "budget; the exit status is then the run's): a live progress bar on a terminal, "
                                            "a plain line per change otherwise")
@click.option("--interval", type=float, default=10.0, metavar="SECONDS",
              help="seconds between two reads of the ledger with --watch (default: 10)")
@with_settings()
def status(settings: Settings, campaign: str, as_json: bool, watch: bool, interval: float) -> int:
    """Counts of sessions by state, cost so far, refusals."""
    from runner.status import campaign_status

    store, plan = stored_campaign(settings, campaign)
    costs: dict = {}
    budget = settings.budget.campaign_usd
    st = watch_campaign(lambda: campaign_status(store, plan, costs, budget), interval) if watch else \
        campaign_status(store, plan, costs, budget)
    # A watch that ended on a stopped run exits as that run did (as its Job failed).
    code = st["stopped"]["exit"] if watch and st["stopped"] is not None else 0
    if as_json:
        click.echo(json.dumps(st, indent=2))
        return code
    click.echo(f"campaign {plan.campaign}: {st['total']} sessions")
    for k in sorted(st["sessions"]):
        click.echo(f"  {k}: {st['sessions'][k]}")
    for line in waiting_lines(st["waiting"]):
        click.echo(line)
    click.echo(f"cost so far: {dollars(st['cost_usd'])} (as the captured streams state it)")
    money = st["budget"]
    if money["campaign_usd"] is not None:
        click.echo(f"budget: {dollars(money['campaign_usd'])}: spent {dollars(money['spent_usd'])}, reserved "
                   f"{dollars(money['reserved_usd'])} by sessions not settled, left {dollars(money['left_usd'])}")
    click.echo(f"refusals: {len(st['refusals'])}")
    click.echo(transcripts_line(plan.campaign, st["transcripts"], st["final"]))
    if st["stopped"] is not None:
        click.echo(stopped_line(st["stopped"]))
    return code


def stopped_line(stopped: dict) -> str:
    return f"the last run stopped ({stopped['at']}): {stopped['why']}"


def transcripts_line(campaign: str, transcripts: dict, final: int) -> str:
    """What status says of the transcripts, and what to do while they are not ready (a campaign
    a transform of an earlier version wrote has no receipt: it reads as not written);
    ``final``: sessions that have ended (none: the transcripts hold no session)."""
    if transcripts["ready"] and not final:
        return (f"transcripts: written {transcripts['written_at']}, of no session: none has ended (`probe-runner pull "
                f"{campaign} --dest DIR` fetches the refusals)")
    if transcripts["ready"]:
        return f"transcripts: ready (written {transcripts['written_at']}); `probe-runner pull {campaign} --dest DIR` fetches them"
    if transcripts["written_at"] is None:
        return ("transcripts: not written yet: the run's transform writes them once every session is final; "
                f"`probe-runner transform {campaign}` writes them if no run will")
    return (f"transcripts: not ready: the last transform (ended {transcripts['written_at']}) read the ledger as it was "
            f"before, or one is writing now; `probe-runner transform {campaign}` writes them again if no run will")


@cli.command(short_help="check that this host (or with --cluster, the install) can run a campaign")
@click.option("--cluster", is_flag=True, help="check the install in $RUNNER_KUBE__NAMESPACE instead of this host: the chart's "
                                              "settings, its bucket from here, a ready provider gateway (or egress proxy), one "
                                              "confinement check by a canary pod, which asks whether the provider accepts the "
                                              "install's key")
@with_settings()
def doctor(settings: Settings, cluster: bool) -> int:
    """Check, one line each, what a campaign needs: bubblewrap confines the harness, the
    harness is the CLI version the recorder was verified against, the store is writable, the
    provider accepts the key (a token count: nothing is spent). With --cluster, the install
    instead, not this host: its chart, its bucket from here, its route's pods, and a canary's
    confinement check, which also asks the gateway whether the provider accepts the install's
    key. Exit 0 only when every check holds."""
    from runner.doctor import cluster_checks, local_checks

    checks = cluster_checks(settings) if cluster else local_checks(settings)
    for c in checks:
        click.echo(f"{'ok  ' if c.ok else 'FAIL'} {c.name}: {c.says}")
    failed = [c.name for c in checks if not c.ok]
    if failed:
        click.echo(f"{len(failed)} of {len(checks)} checks failed: {', '.join(failed)}", err=True)
    return 1 if failed else 0


@cli.command(short_help="(re)build the transcripts and refusals.json from the stored streams")
@campaign_argument
@click.option("--job", is_flag=True, help="run it in the cluster instead: create the campaign's transform Job in "
                                          "$RUNNER_KUBE__NAMESPACE (the install's settings and bucket credentials)")
@with_settings()
def transform(settings: Settings, campaign: str, job: bool) -> int:
    """(Re)build the transcripts and refusals.json from the stored streams."""
    from runner.transform.run import run_transform

    store, plan = stored_campaign(settings, campaign)
    if not job:
        return print_report(store, plan, run_transform(store, plan, settings.transform.workers,
                                                          settings.transform.parallel_min_bytes))
    from runner.k8s import jobs
    from runner.k8s.api import Kube

    kube = Kube(settings.kube)
    manifest = jobs.transform_job(install_settings(kube, settings), plan.campaign)
    name = manifest["metadata"]["name"]
    if not kube.create_job(manifest):
        raise UserError(f"transform job {settings.kube.namespace}/{name} exists already; "
                        f"`kubectl -n {settings.kube.namespace} delete job {name}` to run it again")
    click.echo(f"transform job: {settings.kube.namespace}/{name} (created)")
    return 0


def one_controller(kube: Any, campaign: str, other: str) -> None:
    """Refuse a second controller of a campaign while its ``other`` one (``controller``: the
    submitted Job; ``resume``: the resume Job) runs: both would start what has not run."""
    from runner.k8s import jobs

    name = jobs.job_name(campaign, other)
    if kube.job_running(name):
        raise UserError(f"the campaign's {other} Job {kube.namespace}/{name} is running; one controller runs a "
                        "campaign at a time: once it has ended, try again")


def install_settings(kube: Any, settings: Settings) -> Settings:
    """The installed chart's settings (its ConfigMap), which the campaign's Jobs run with."""
    from runner.k8s import jobs

    name = jobs.settings_config_map(settings.kube.instance)
    return jobs.install_settings(kube.config_map_data(name), settings, f"ConfigMap {settings.kube.namespace}/{name}")


@cli.command(short_help="upload a plan and its corpus to the bucket and start the campaign in the cluster")
@plan_argument
@corpus_option()
@click.option("--watch", is_flag=True,
              help="then follow the campaign as status --watch does: until every session is final and its transcripts "
                   "are ready, or its run stopped")
@click.option("--interval", type=float, default=10.0, metavar="SECONDS",
              help="seconds between two reads of the ledger with --watch (default: 10)")
@with_settings(budget=True)
def submit(settings: Settings, plan: Path, corpus: Path, watch: bool, interval: float) -> int:
    """Store PLAN and the corpus under the campaign in the install's bucket (create-only: a
    campaign name is bound to one plan and corpus for good), then create the campaign's
    controller Job in $RUNNER_KUBE__NAMESPACE, which runs every session as a pod and then the
    transform. Submitting the same campaign again changes nothing. Needs the Helm chart
    installed as $RUNNER_KUBE__INSTANCE: its settings (bucket, images, resources) are what the
    Job runs with and where the plan goes."""
    from runner.corpus import store_corpus, store_plan
    from runner.k8s import jobs
    from runner.k8s.api import Kube
    from runner.plan import load_plan
    from runner.service import mark_run
    from runner.store import open_store

    parsed = load_plan(plan)
    corpus = corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    kube = Kube(settings.kube)
    install = install_settings(kube, settings)
    flag = click.get_current_context().params.get("store")
    if flag and flag != install.store:
        raise UserError(f"--store {flag}: the install {settings.kube.namespace}/{settings.kube.instance} reads "
                        f"campaigns from {install.store}; submit uploads there")
    if not install.store.startswith("s3://"):
        raise UserError(f"store {install.store}: the controller Job runs in the cluster and reads the campaign from the "
                        "bucket; the install needs an s3:// store (the chart's bucket.store)")
    store = open_store(install.store, install)
    store_plan(store, parsed)
    corpus_digest = store_corpus(store, parsed.campaign, corpus)
    one_controller(kube, parsed.campaign, "resume")
    manifest = jobs.controller_job(install, parsed.campaign, settings.budget)
    created = kube.create_job(manifest)
    name = manifest["metadata"]["name"]
    if created:
        mark_run(store, parsed.campaign, "submit")  # an earlier run's stop is the past now
    elif (existing := kube.job_command(name)) is not None and existing != jobs.job_command(manifest):
        raise UserError(f"the controller Job {settings.kube.namespace}/{name} exists with other settings "
                        f"({' '.join(existing)}) than this submit's ({' '.join(jobs.job_command(manifest))}), and runs as "
                        f"it was submitted. To run with these: once it has ended, `kubectl -n {settings.kube.namespace} "
                        f"delete job {name}`, then submit again")
    click.echo(f"plan: {store.uri}/{layout.plan_key(parsed.campaign)}")
    click.echo(f"corpus: {store.uri}/{layout.corpus_key(parsed.campaign)} ({corpus_digest})")
    click.echo(f"controller job: {settings.kube.namespace}/{manifest['metadata']['name']} "
               f"({'created' if created else 'exists already: submitted before'})")
    if not watch:
        click.echo(f"watch it: probe-runner status {parsed.campaign} --watch")
        return 0
    from runner.status import campaign_status

    costs: dict = {}
    st = watch_campaign(lambda: campaign_status(store, parsed, costs, settings.budget.campaign_usd), interval)
    if st["stopped"] is not None:
        click.echo(stopped_line(st["stopped"]), err=True)
        return int(st["stopped"]["exit"])
    return 0


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
    from runner.ledger import Ledger

    store, plan = stored_campaign(settings, campaign)
    st = Ledger(store, plan.campaign).state(f"{probe}/{session}")
    if st.attempt == 0 and not attempt:
        raise UserError(f"{probe}/{session}: no such session has run in campaign {plan.campaign!r}")
    keys = layout.SessionKeys(plan.campaign, probe, session, attempt or st.attempt)
    recorded = (st.detail.get("stream") or {}) if st.attempt == keys.attempt else {}
    if store.exists(keys.stream):
        key, want = keys.stream, recorded.get("sha256") if recorded.get("key") == keys.stream else None
    elif store.exists(keys.partial_stream):
        key, want = keys.partial_stream, None
        click.echo(f"probe-runner: {key}: the stream could not be proven complete; this is what was kept", err=True)
    else:
        raise UserError(f"{probe}/{session} attempt {keys.attempt}: no stream in {store.uri} (status {st.status})")
    sha, out = hashlib.sha256(), click.get_binary_stream("stdout")
    with store.open(key) as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            out.write(chunk)
    out.flush()
    if want and "sha256:" + sha.hexdigest() != want:
        raise StoreError(f"{key}: read sha256:{sha.hexdigest()}, the ledger recorded {want}")
    return 0


@cli.command(short_help="download a campaign's transcripts and refusals, verifying their digests",
             help=f"Copy transcripts/ of CAMPAIGN (the transcripts and refusals.json) into DEST after checking every file "
                  f"against the {layout.SUMS_NAME} the transform wrote beside them. Nothing is written unless every file verifies.")
@campaign_argument
@click.option("--dest", type=click.Path(path_type=Path, dir_okay=True, file_okay=False), required=True,
              help="the directory to write them into")
@with_settings()
def pull(settings: Settings, campaign: str, dest: Path) -> int:
    from runner.pull import verified_transcripts
    from runner.store import open_store

    for target in write_files(dest, verified_transcripts(open_store(settings.store, settings), campaign)):
        click.echo(str(target))
    return 0


@cli.command(short_help="one self-contained HTML page showing a campaign at a glance",
             help="Write one HTML file that shows CAMPAIGN at a glance: sessions by outcome per arm, per probe and arm how "
                  "many sessions gave each declared answer (counts only: nothing is graded), cost and duration per session "
                  "and per arm, calls per session by tool, paths outside the workspace, refusals with their reasons, and a "
                  "link to each transcript and raw stream. Everything is inline: it opens in a browser with no server and "
                  "no network. The sessions are counted as the transform counts them, from the stored streams, so it can "
                  "be made while the campaign runs.")
@campaign_argument
@click.option("--out", type=click.Path(path_type=Path, dir_okay=False), metavar="FILE",
              help="where to write it (default: ./CAMPAIGN-report.html)")
@click.option("--link-hours", type=click.FloatRange(min=0, min_open=True, max=168), default=24.0, show_default=True,
              help="on an S3 store, how long the links to transcripts and streams open them (presigned with your "
                   "credentials; at most 168, SigV4's limit)")
@with_settings()
def report(settings: Settings, campaign: str, out: Path | None, link_hours: float) -> int:
    from runner.report.figures import campaign_figures
    try:
        from runner.report.page import render
    except ImportError as e:
        raise UserError(f"the report needs the package's report extra ({e.name} is missing): "
                        "pip install 'probe-runner[report]' (from a checkout: pip install -e '.[report]')") from None

    store, plan = stored_campaign(settings, campaign)
    out = out or Path(f"{plan.campaign}-report.html")
    if not out.parent.resolve().is_dir():
        raise UserError(f"--out {out}: {out.parent} is not a directory")
    with progress_bar("reading the stored streams") as advance:
        figures = campaign_figures(store, plan, int(link_hours * 3600), advance, workers=settings.transform.workers,
                                   parallel_min_bytes=settings.transform.parallel_min_bytes)
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(render(figures), encoding="utf-8")
    tmp.replace(out)
    counts = ", ".join(f"{n} {k}" for k, n in figures["outcomes"].items())
    click.echo(f"report: {out} ({figures['planned']} sessions: {counts}; {len(figures['refusals'])} refusal(s); "
               f"realized cost {dollars(figures['cost_usd'])})")
    return 0


@contextlib.contextmanager
def progress_bar(what: str) -> Iterator[Callable[[int, int], None]]:
    """A bar on stderr while long work runs on a terminal (gone when it ends); nothing off one."""
    if not sys.stderr.isatty():
        yield lambda done, total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    with Progress(TextColumn(what), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(what)
        yield lambda done, total: bar.update(task, completed=done, total=total)


def write_files(dest: Path, files: dict[str, bytes]) -> list[Path]:
    """Write ``files`` (relative name -> bytes) under ``dest``; returns the paths written."""
    dest.mkdir(parents=True, exist_ok=True)
    out = []
    for name, data in files.items():
        target = dest / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
        out.append(target)
    return out


# ---- the ledger ----------------------------------------------------------------------------

@cli.group(short_help="inspect and resolve the campaign ledger")
def ledger() -> None:
    """export: canonical JSON Lines and their SHA-256; verify: check the hash chain; recover:
    mark started sessions with no outcome as interrupted (nothing runs); cancel: close an
    interrupted session; resume: run a new attempt of one."""


def campaign_ledger(settings: Settings, campaign: str) -> tuple[Any, Any]:
    from runner.ledger import Ledger

    store, plan = stored_campaign(settings, campaign)
    return plan, Ledger(store, plan.campaign)


session_argument = click.argument("session", metavar="PROBE/SESSION")


@ledger.command(short_help="check the hash chain")
@campaign_argument
@with_settings()
def verify(settings: Settings, campaign: str) -> int:
    """Check the ledger's hash chain; exit 1 with each problem on stderr when it breaks."""
    plan, book = campaign_ledger(settings, campaign)
    problems = book.verify()
    for p in problems:
        click.echo(f"ledger {plan.campaign}: {p}", err=True)
    if not problems:
        click.echo(f"ledger {plan.campaign}: {len(book.entries)} entries, chain verifies")
    return 1 if problems else 0


@ledger.command(short_help="canonical JSON Lines and their SHA-256")
@campaign_argument
@click.option("--output", "-o", type=click.Path(path_type=Path, dir_okay=False), help="write the JSON Lines here instead of stdout")
@with_settings()
def export(settings: Settings, campaign: str, output: Path | None) -> int:
    """Write the ledger as canonical JSON Lines (stdout or --output) and its SHA-256 on stderr."""
    _, book = campaign_ledger(settings, campaign)
    data, sha = book.export()
    if output:
        output.write_bytes(data)
    else:
        out = click.get_binary_stream("stdout")
        out.write(data)
        out.flush()
    click.echo(f"sha256 {sha} ({len(book.entries)} entries)", err=True)
    return 0


@ledger.command(short_help="mark started sessions with no outcome as interrupted")
@campaign_argument
@with_settings()
def recover(settings: Settings, campaign: str) -> int:
    """Mark every started session with no outcome as interrupted. Nothing is run or stopped;
    captured stream bytes are kept."""
    from runner.service import campaign_lock

    plan, book = campaign_ledger(settings, campaign)
    with campaign_lock(settings, plan.campaign):
        book.reload()  # as it stands now that no runner of this host holds the campaign
        marked = book.recover()
        for key, attempt, detail in marked:
            click.echo(f"interrupted: {key} (attempt {attempt}): {detail['reason'].split('; ', 2)[-1]}")
        click.echo(f"{len(marked)} session(s) marked interrupted; nothing was run or stopped, captured stream bytes were kept")
    return 0


def latest_attempt(book: Any, plan: Any, session: str) -> Any:
    st = book.state(session)
    if st.attempt == 0:
        raise UserError(f"{session}: no such session in campaign {plan.campaign!r}")
    return st


@ledger.command(short_help="close an interrupted session")
@campaign_argument
@session_argument
@with_settings()
def cancel(settings: Settings, campaign: str, session: str) -> int:
    """Close SESSION's latest attempt: it stays unrecorded and is not run again."""
    plan, book = campaign_ledger(settings, campaign)
    st = latest_attempt(book, plan, session)
    book.close(session, st.attempt)
    click.echo(f"cancelled: {session} (attempt {st.attempt})")
    return 0


def resumable(book: Any, plan: Any, session: str) -> None:
    st = latest_attempt(book, plan, session)
    if st.status not in ("interrupted", "failed"):
        raise UserError(f"{session} is {st.status}; only an interrupted or failed session can be resumed")


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
    plan, book = campaign_ledger(settings, campaign)
    sessions = tuple(dict.fromkeys(sessions))  # each once, in the order given
    for session in sessions:
        resumable(book, plan, session)
    if not job:
        if corpus is None:
            raise UserError("give the campaign's corpus (--corpus DIR) to resume on this host, or --job to resume a "
                            "submitted campaign in the cluster")
        return run_sessions(settings, plan, corpus, resume=set(sessions))
    from runner.k8s import jobs
    from runner.k8s.api import Kube
    from runner.service import mark_run

    kube = Kube(settings.kube)
    one_controller(kube, plan.campaign, "controller")
    manifest = jobs.controller_job(install_settings(kube, settings), plan.campaign, settings.budget,
                                   resume=list(sessions))
    name, ns = manifest["metadata"]["name"], settings.kube.namespace
    if not kube.create_job(manifest):
        raise UserError(f"the resume Job {ns}/{name} of {campaign} exists already: once it has ended, "
                        f"`kubectl -n {ns} delete job {name}`, then resume again")
    mark_run(book.store, plan.campaign, "submit")  # the stop the sessions' failure made is the past now
    click.echo(f"resume job: {ns}/{name} (created): a new attempt of {', '.join(sessions)}, then the transform; "
               f"watch it: probe-runner status {plan.campaign} --watch")
    return 0


def main(argv: list[str] | None = None) -> int:
    """The console script: parse, run, and turn every user mistake into a line and a status."""
    try:
        return int(cli.main(args=argv, prog_name="probe-runner", standalone_mode=False) or 0)
    except click.ClickException as e:  # bad flags or arguments: click's usage line and message
        e.show()
        return e.exit_code
    except click.Abort:  # click's form of KeyboardInterrupt
        click.echo("probe-runner: interrupted; run the same command again to continue", err=True)
        return 130
    except UserError as e:
        click.echo(f"probe-runner: {e}", err=True)
        return e.exit_code
    except StoreError as e:
        click.echo(f"probe-runner: store: {e}", err=True)
        return 1
    except KeyboardInterrupt:
        click.echo("probe-runner: interrupted; run the same command again to continue", err=True)
        return 130
