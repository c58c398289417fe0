"""``probe-runner``: run probe campaigns and read what they recorded.

Every user mistake ends as one clear line on stderr and an exit status (2 for bad input, 12
where a session cannot be confined or the recorder refused what it saw), never a traceback.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from decimal import Decimal
from pathlib import Path

from runner import __version__, layout, logs
from runner.errors import EXIT_CONFINEMENT, EXIT_USAGE, UserError
from runner.settings import Settings, load_settings
from runner.store import StoreError

EPILOG = """settings come from the environment (prefix RUNNER_, '__' between nested names), e.g.
  RUNNER_STORE=file:///srv/runs  RUNNER_PROVIDER__BASE_URL=https://api.anthropic.com
  RUNNER_PROVIDER__API_KEY=...   RUNNER_HARNESS__COMMAND=/usr/bin/claude
flags override them. Exit status: 0 all recorded; 1 sessions left interrupted or not started; 2 bad input;
12 a session could not be confined or something was refused (see the refused section)."""




def _store_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--store", help="store URI: file:///abs/dir or s3://bucket/prefix (default: $RUNNER_STORE or ./runs)")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="probe-runner", description=__doc__.split("\n\n")[0].replace("``", ""),
                                     epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"probe-runner {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="log more to stderr: -v info (each session's outcome), -vv debug "
                             "(default: $RUNNER_LOG__LEVEL or warning; format: $RUNNER_LOG__FORMAT, human or json)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    run = sub.add_parser("run", help="run a campaign to the end (continues one already started)",
                         description="Run every session of PLAN that has not run, then the transform. Safe to run again: "
                                     "sessions that ran are not repeated; interrupted ones are reported for `ledger recover`.")
    run.add_argument("plan", type=Path, help="the plan file (JSON, or YAML by .yaml/.yml)")
    run.add_argument("--corpus", type=Path, required=True, help="the corpus directory the plan was made over")
    run.add_argument("--executor", choices=["local", "kubernetes"], default="local",
                     help="where sessions run: local (under bwrap, the default) or kubernetes (one pod per session, "
                          "through $RUNNER_KUBE__KUBECONFIG or the current kubeconfig context)")
    run.add_argument("--concurrency", type=int, help="sessions at once (default: $RUNNER_CONCURRENCY or 2)")
    run.add_argument("--produced", action="append", default=[], metavar="PATH",
                     help="a workspace path a session may write without naming it (e.g. a Bash redirect); repeatable")
    _store_arg(run)

    demo = sub.add_parser("demo", help="run the bundled example campaign against a scripted local provider",
                          description="Run a small bundled campaign (2 probes x 2 arms x 2 repetitions) with the real Claude "
                                      "Code CLI against a scripted local Messages API, and print where the transcripts are.")
    _store_arg(demo)

    for name, text in (("status", "counts of sessions by state, cost so far, refusals"),
                       ("transform", "(re)build the transcripts and refusals.json from the stored streams")):
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("campaign")
        _store_arg(p)
        if name == "status":
            p.add_argument("--json", action="store_true", help="print machine-readable JSON")
            p.add_argument("--watch", action="store_true",
                           help="follow the campaign until every session is final: a live progress bar on a terminal, "
                                "a plain line per change otherwise")
            p.add_argument("--interval", type=float, default=10.0, metavar="SECONDS",
                           help="seconds between two reads of the ledger with --watch (default: 10)")
        if name == "transform":
            p.add_argument("--job", action="store_true",
                           help="run it in the cluster instead: create the campaign's transform Job in "
                                "$RUNNER_KUBE__NAMESPACE (the install's settings and bucket credentials)")

    submit = sub.add_parser("submit", help="upload a plan and its corpus to the bucket and start the campaign in the cluster",
                            description="Store PLAN and the corpus under the campaign in the install's bucket (create-only: a campaign "
                                        "name is bound to one plan and corpus for good), then create the campaign's controller "
                                        "Job in $RUNNER_KUBE__NAMESPACE, which runs every session as a pod and then the "
                                        "transform. Submitting the same campaign again changes nothing. Needs the Helm chart "
                                        "installed as $RUNNER_KUBE__INSTANCE: its settings (bucket, images, resources) are "
                                        "what the Job runs with and where the plan goes.")
    submit.add_argument("plan", type=Path, help="the plan file (JSON, or YAML by .yaml/.yml)")
    submit.add_argument("--corpus", type=Path, required=True, help="the corpus directory the plan was made over")
    _store_arg(submit)

    logs = sub.add_parser("logs", help="print one session's raw harness stream from the store",
                          description="Write the stream.jsonl of PROBE SESSION (the harness's standard output, byte for "
                                      "byte) to stdout, checked against the sha256 the ledger recorded. A stream that "
                                      "could not be proven complete is printed with a warning on stderr.")
    logs.add_argument("campaign")
    logs.add_argument("probe", help="probe id, e.g. HW-PRB-0007")
    logs.add_argument("session", help="session name, e.g. present-001")
    logs.add_argument("--attempt", type=int, help="attempt number (default: the latest)")
    _store_arg(logs)

    ctl = sub.add_parser("controller", help="in-cluster entry point: run a submitted campaign's sessions as pods",
                         description="Run every session of CAMPAIGN (plan and corpus as `submit` stored them) as Kubernetes "
                                     "pods, then the transform. Safe to restart: live pods are adopted, nothing repeats.")
    ctl.add_argument("--campaign", required=True)
    ctl.add_argument("--concurrency", type=int, help="sessions at once (default: $RUNNER_CONCURRENCY or 2)")
    _store_arg(ctl)

    pull = sub.add_parser("pull", help="download a campaign's transcripts and refusals, verifying their digests",
                          description="Copy transcripts/ of CAMPAIGN (the transcripts and refusals.json) into DEST "
                                      f"after checking every file against the {layout.SUMS_NAME} the transform wrote beside them. "
                                      "Nothing is written unless every file verifies.")
    pull.add_argument("campaign")
    pull.add_argument("--dest", type=Path, required=True)
    _store_arg(pull)

    ledger = sub.add_parser("ledger", help="inspect and resolve the campaign ledger",
                            description="export: canonical JSON Lines and their SHA-256; verify: check the hash chain; "
                                        "recover: mark started sessions with no outcome as interrupted (nothing runs); "
                                        "cancel: close an interrupted session; resume: run a new attempt of one.")
    lsub = ledger.add_subparsers(dest="ledger_command", required=True, metavar="ACTION")
    for name in ("export", "verify", "recover", "cancel", "resume"):
        p = lsub.add_parser(name)
        p.add_argument("campaign")
        if name in ("cancel", "resume"):
            p.add_argument("session", help="PROBE/SESSION, e.g. HW-PRB-0007/present-001")
        if name == "resume":
            p.add_argument("--corpus", type=Path, required=True, help="the corpus directory (must be unchanged)")
        if name == "export":
            p.add_argument("--output", "-o", type=Path, help="write the JSON Lines here instead of stdout")
        _store_arg(p)
    return parser


def _settings(args: argparse.Namespace) -> Settings:
    return load_settings(store=getattr(args, "store", None), concurrency=getattr(args, "concurrency", None))


def _print_report(store, plan, report, out=sys.stdout) -> int:
    from runner.ledger import Ledger

    for arm in report.arms:
        if arm.key:
            print(f"transcript {plan.tier.value}-{arm.arm}: {store.uri}/{arm.key} ({arm.events} events)", file=out)
    print(f"refusals: {store.uri}/{layout.refusals_key(plan.campaign)}", file=out)
    print(f"realized cost: {_dollars(report.cost_usd)}", file=out)
    if report.refusals:
        print("\nrefused:", file=out)
        for r in report.refusals:
            where = f"{r.get('probe')} {r.get('session')}" if r["scope"] != "transcript" else r["transcript"]
            print(f"  {r['scope']} {where} ({r.get('arm')}): {r['reason']}", file=out)
    states = Ledger(store, plan.campaign).sessions()
    waiting = [spec.key for spec in plan.sessions() if spec.key not in states or states[spec.key].status == "intended"]
    if waiting:
        print(f"not started: {len(waiting)} session(s), e.g. {waiting[0]}: nothing was spent; "
              "`probe-runner run` again starts them", file=sys.stderr)
    if waiting or any(s.status == "started" for s in states.values()):
        return 1
    return EXIT_CONFINEMENT if report.refusals else 0


def cmd_run(args, settings: Settings, plan=None, corpus=None, resume=None) -> int:
    from runner.plan import load_plan
    from runner.service import run_campaign

    plan = plan or load_plan(args.plan)
    done = run_campaign(settings, plan, corpus or args.corpus, getattr(args, "executor", "local"),
                        getattr(args, "produced", []), resume)
    report, store, job = done.sessions, done.store, done.job
    for key in report.interrupted:
        print(f"interrupted: {key} started and has no outcome; it may or may not have executed. "
              f"Inspect it, then `probe-runner ledger recover {plan.campaign}` and cancel or resume it.", file=sys.stderr)
    code = _print_report(store, plan, job)
    if report.unconfined:  # the cluster no longer confines sessions as promised: an operator's matter
        print(f"halted: {report.unconfined}; no further session was started. Fix the cluster's network policy, "
              "then run again", file=sys.stderr)
        return EXIT_CONFINEMENT
    if report.halted:  # a setting to fix, not a run to retry: a Job fails at once on 2
        print(f"halted: {report.halted}; fix the provider's key, then run again", file=sys.stderr)
        return EXIT_USAGE
    return code


def cmd_controller(args, settings: Settings) -> int:
    from runner.campaign import fetch_corpus, load_stored_plan
    from runner.store import open_store

    store = open_store(settings.store, settings)
    plan = load_stored_plan(store, args.campaign)
    corpus = fetch_corpus(store, plan.campaign, settings.local.workdir / plan.campaign / "corpus")
    args.executor = "kubernetes"
    return cmd_run(args, settings, plan=plan, corpus=corpus)


def cmd_demo(args, settings: Settings) -> int:
    from runner.demo import run_demo

    return run_demo(settings, cmd_run)


def cmd_transform(args, settings: Settings) -> int:
    from runner.campaign import load_stored_plan
    from runner.intake_job import run_job
    from runner.store import open_store

    store = open_store(settings.store, settings)
    plan = load_stored_plan(store, args.campaign)
    if args.job:
        from runner.k8s import jobs
        from runner.k8s.api import Kube

        kube = Kube(settings.kube)
        job = jobs.transform_job(_install_settings(kube, settings), plan.campaign)
        where = f"{settings.kube.namespace}/{job['metadata']['name']}"
        if not kube.create_job(job):
            raise UserError(f"transform job {where} exists already; `kubectl -n {settings.kube.namespace} delete job "
                            f"{job['metadata']['name']}` to run it again")
        print(f"transform job: {where} (created)")
        return 0
    return _print_report(store, plan, run_job(store, plan))


def _dollars(amount: object) -> str:
    """A cost for people to read, to the hundredth of a cent; the exact sum stays in the records
    (status --json, the transcript's cost_cents) where the CLI's float artefacts are kept."""
    return f"${Decimal(str(amount)):.4f}"


def _status_line(st: dict, width: int = 24) -> str:
    done = width * st["final"] // st["total"] if st["total"] else width
    running = st["sessions"].get("started", 0)
    return (f"[{'#' * done}{'.' * (width - done)}] {st['final']}/{st['total']} final, {running} running, "
            f"cost {_dollars(st['cost_usd'])}, refusals {len(st['refusals'])}")


def cmd_status(args, settings: Settings) -> int:
    from runner.campaign import load_stored_plan
    from runner.status import campaign_status
    from runner.store import open_store

    store = open_store(settings.store, settings)
    plan = load_stored_plan(store, args.campaign)
    costs: dict = {}
    st = campaign_status(store, plan, costs)
    if args.watch:
        tty, last = sys.stdout.isatty(), None
        while True:
            line = _status_line(st)
            if tty:
                print(f"\r{line}\033[K", end="", flush=True)
            elif line != last:
                print(line, flush=True)
            last = line
            if st["final"] == st["total"]:
                break
            time.sleep(args.interval)
            st = campaign_status(store, plan, costs)
        if tty:
            print()
    if args.json:
        print(json.dumps(st, indent=2))
        return 0
    print(f"campaign {plan.campaign}: {st['total']} sessions")
    for k in sorted(st["sessions"]):
        print(f"  {k}: {st['sessions'][k]}")
    print(f"cost so far: {_dollars(st['cost_usd'])} (as the captured streams state it)")
    print(f"refusals: {len(st['refusals'])}")
    return 0


def _install_settings(kube, settings: Settings) -> Settings:
    """The installed chart's settings (its ConfigMap), which the campaign's Jobs run with."""
    from runner.k8s import jobs

    name = jobs.settings_config_map(settings.kube.instance)
    return jobs.install_settings(kube.config_map_data(name), settings, f"ConfigMap {settings.kube.namespace}/{name}")


def cmd_submit(args, settings: Settings) -> int:
    from runner.campaign import store_corpus, store_plan
    from runner.k8s import jobs
    from runner.k8s.api import Kube
    from runner.plan import load_plan
    from runner.store import open_store

    plan = load_plan(args.plan)
    corpus = args.corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    kube = Kube(settings.kube)
    install = _install_settings(kube, settings)
    if args.store and args.store != install.store:
        raise UserError(f"--store {args.store}: the install {settings.kube.namespace}/{settings.kube.instance} reads "
                        f"campaigns from {install.store}; submit uploads there")
    if not install.store.startswith("s3://"):
        raise UserError(f"store {install.store}: the controller Job runs in the cluster and reads the campaign from the "
                        "bucket; the install needs an s3:// store (the chart's bucket.store)")
    store = open_store(install.store, install)
    store_plan(store, plan)
    corpus_digest = store_corpus(store, plan.campaign, corpus)
    job = jobs.controller_job(install, plan.campaign)
    created = kube.create_job(job)
    where = f"{settings.kube.namespace}/{job['metadata']['name']}"
    print(f"plan: {store.uri}/{layout.plan_key(plan.campaign)}")
    print(f"corpus: {store.uri}/{layout.corpus_key(plan.campaign)} ({corpus_digest})")
    print(f"controller job: {where} ({'created' if created else 'exists already: submitted before'})")
    print(f"watch it: probe-runner status {plan.campaign} --watch")
    return 0


def cmd_logs(args, settings: Settings) -> int:
    from runner.campaign import load_stored_plan
    from runner.ledger import Ledger
    from runner.store import open_store

    store = open_store(settings.store, settings)
    plan = load_stored_plan(store, args.campaign)
    st = Ledger(store, plan.campaign).state(f"{args.probe}/{args.session}")
    if st.attempt == 0 and not args.attempt:
        raise UserError(f"{args.probe}/{args.session}: no such session has run in campaign {plan.campaign!r}")
    keys = layout.SessionKeys(plan.campaign, args.probe, args.session, args.attempt or st.attempt)
    recorded = (st.detail.get("stream") or {}) if st.attempt == keys.attempt else {}
    if store.exists(keys.stream):
        key, want = keys.stream, recorded.get("sha256") if recorded.get("key") == keys.stream else None
    elif store.exists(keys.partial_stream):
        key, want = keys.partial_stream, None
        print(f"probe-runner: {key}: the stream could not be proven complete; this is what was kept", file=sys.stderr)
    else:
        raise UserError(f"{args.probe}/{args.session} attempt {keys.attempt}: no stream in {store.uri} (status {st.status})")
    sha, out = hashlib.sha256(), sys.stdout.buffer
    with store.open(key) as f:
        while chunk := f.read(1 << 20):
            sha.update(chunk)
            out.write(chunk)
    out.flush()
    if want and "sha256:" + sha.hexdigest() != want:
        raise StoreError(f"{key}: read sha256:{sha.hexdigest()}, the ledger recorded {want}")
    return 0


def cmd_pull(args, settings: Settings) -> int:
    from runner.pull import verified_transcripts
    from runner.store import open_store

    for target in write_files(args.dest, verified_transcripts(open_store(settings.store, settings), args.campaign)):
        print(target)
    return 0


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


def cmd_ledger(args, settings: Settings) -> int:
    from runner.campaign import load_stored_plan
    from runner.ledger import Ledger
    from runner.store import open_store

    store = open_store(settings.store, settings)
    plan = load_stored_plan(store, args.campaign)
    ledger = Ledger(store, plan.campaign)
    action = args.ledger_command
    if action == "verify":
        problems = ledger.verify()
        for p in problems:
            print(f"ledger {plan.campaign}: {p}", file=sys.stderr)
        if not problems:
            print(f"ledger {plan.campaign}: {len(ledger.entries)} entries, chain verifies")
        return 1 if problems else 0
    if action == "export":
        data, sha = ledger.export()
        if args.output:
            args.output.write_bytes(data)
        else:
            sys.stdout.buffer.write(data)
            sys.stdout.flush()
        print(f"sha256 {sha} ({len(ledger.entries)} entries)", file=sys.stderr)
        return 0
    if action == "recover":
        from runner.service import campaign_lock

        with campaign_lock(settings, plan.campaign):
            ledger.reload()  # as it stands now that no runner of this host holds the campaign
            marked = ledger.recover()
            for key, attempt, detail in marked:
                print(f"interrupted: {key} (attempt {attempt}): {detail['reason'].split('; ', 2)[-1]}")
            print(f"{len(marked)} session(s) marked interrupted; nothing was run or stopped, captured stream bytes were kept")
        return 0
    st = ledger.state(args.session)
    if st.attempt == 0:
        raise UserError(f"{args.session}: no such session in campaign {plan.campaign!r}")
    if action == "cancel":
        ledger.close(args.session, st.attempt)
        print(f"cancelled: {args.session} (attempt {st.attempt})")
        return 0
    if st.status not in ("interrupted", "failed"):
        raise UserError(f"{args.session} is {st.status}; only an interrupted or failed session can be resumed")
    return cmd_run(args, settings, plan=plan, corpus=args.corpus, resume={args.session})


COMMANDS = {"run": cmd_run, "controller": cmd_controller, "demo": cmd_demo, "status": cmd_status, "transform": cmd_transform,
            "pull": cmd_pull, "ledger": cmd_ledger, "submit": cmd_submit, "logs": cmd_logs}


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = _settings(args)
        level = {0: settings.log.level, 1: "info"}.get(args.verbose, "debug")
        logs.configure(level, settings.log.format)
        return COMMANDS[args.command](args, settings)
    except UserError as e:
        print(f"probe-runner: {e}", file=sys.stderr)
        return e.exit_code
    except StoreError as e:
        print(f"probe-runner: store: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("probe-runner: interrupted; run the same command again to continue", file=sys.stderr)
        return 130
