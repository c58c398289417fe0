"""Running a campaign: journal, seal, execute, capture, journal, for every session, then the
transform. Safe to run again: the ledger decides what runs, and nothing that may have spent
runs a second time by itself.
"""

from __future__ import annotations

import json
import shutil
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Callable

from runner import digest, layout, stream
from runner.errors import SealError, UserError
from runner.ledger import Ledger
from runner.plan import Plan, SessionSpec, parse_plan
from runner.seal import seal
from runner.store import AlreadyExists, Store
from runner.transform import written_paths


def store_plan(store: Store, plan: Plan) -> None:
    """The campaign's plan, create-only: a campaign name is bound to one plan for good."""
    data = plan.canonical_json()
    try:
        store.put(layout.plan_key(plan.campaign), data, create_only=True)
    except AlreadyExists:
        if store.get(layout.plan_key(plan.campaign)) != data:
            raise UserError(f"campaign {plan.campaign!r} exists in {store.uri} with a different plan; choose a new campaign name") from None


def load_stored_plan(store: Store, campaign: str) -> Plan:
    key = layout.plan_key(campaign)
    if not store.exists(key):
        raise UserError(f"no campaign {campaign!r} in {store.uri}")
    return parse_plan(json.loads(store.get(key)), f"{store.uri}/{key}")


def declaration(plan: Plan, spec: SessionSpec, corpus_digest: str) -> dict:
    """What an attempt is bound to; a resumed attempt must present the same."""
    return {"probe": spec.probe, "arm": spec.arm, "repetition": spec.repetition,
            "plan": digest.of_bytes(plan.canonical_json()), "corpus": corpus_digest}


def corpus_fingerprint(corpus: Path) -> str:
    """A digest over every file of the corpus (paths and bytes, .git excluded)."""
    lines = []
    for p in sorted(corpus.rglob("*")):
        rel = p.relative_to(corpus)
        if rel.parts and rel.parts[0] == ".git":
            continue
        if p.is_symlink():
            lines.append(f"{rel.as_posix()} -> {p.readlink()}")
        elif p.is_file():
            lines.append(f"{rel.as_posix()} {digest.of_file(p)}")
    return digest.of_text("\n".join(lines))


def named_write_paths(store: Store, stream_key: str, workspace: str) -> set[str]:
    """Workspace files the stream's write calls name: collected even if the session left them unchanged."""
    uses = stream.parse(store.iter_lines(stream_key)).tool_uses
    return {p for p in written_paths(uses, workspace) if not p.startswith("/") and p != "."}


@dataclass
class Progress:
    total: int
    out: object = sys.stderr
    done: int = 0
    cost: Decimal = Decimal(0)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def session(self, spec: SessionSpec, status: str, cost: Decimal | None) -> None:
        with self.lock:
            self.done += 1
            if cost is not None:
                self.cost += cost
            print(f"[{self.done}/{self.total}] {spec.probe} {spec.name}: {status}  (cost so far ${self.cost:.4f})",
                  file=self.out, flush=True)


@dataclass
class RunReport:
    ran: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # session -> status it already had
    interrupted: list[str] = field(default_factory=list)


def run_sessions(plan: Plan, corpus: Path, store: Store, executor, workdir: Path, concurrency: int,
                 produced: list[str], progress_out=sys.stderr, resume: set[str] | None = None) -> RunReport:
    store_plan(store, plan)
    ledger = Ledger(store, plan.campaign)
    corpus_digest = corpus_fingerprint(corpus)
    states = ledger.sessions()
    report = RunReport()
    todo: list[tuple[SessionSpec, int]] = []
    for spec in plan.sessions():
        st = states.get(spec.key)
        status = st.status if st else "pending"
        if resume and spec.key in resume:
            todo.append((spec, st.attempt + 1))
        elif status == "pending":
            todo.append((spec, 1))
        elif status == "intended":
            todo.append((spec, st.attempt))  # journaled but never started: nothing was spent
        elif status == "started":
            report.interrupted.append(spec.key)
        else:
            report.skipped[spec.key] = status
    executor.preflight()
    progress = Progress(total=len(todo), out=progress_out)

    def one(item: tuple[SessionSpec, int]) -> None:
        spec, attempt = item
        status, cost = run_one(plan, corpus, store, ledger, executor, workdir, spec, attempt, corpus_digest, produced)
        report.ran.append(spec.key)
        progress.session(spec, status, cost)

    with ThreadPoolExecutor(max_workers=concurrency) as pool:
        for f in [pool.submit(one, item) for item in todo]:
            f.result()
    return report


def run_one(plan: Plan, corpus: Path, store: Store, ledger: Ledger, executor, workdir: Path, spec: SessionSpec,
            attempt: int, corpus_digest: str, produced: list[str]) -> tuple[str, Decimal | None]:
    decl = declaration(plan, spec, corpus_digest)
    current = ledger.state(spec.key)
    if attempt > 1 and current.declaration is not None and current.declaration != decl:
        raise UserError(f"{spec.key}: the plan or corpus changed since attempt {current.attempt}; a resumed attempt needs the same inputs")
    ledger.intent(spec.key, attempt, decl)
    keys = layout.SessionKeys(plan.campaign, spec.probe, spec.name, attempt)
    scratch = workdir / plan.campaign / spec.probe / f"{spec.name}.{attempt}"
    if scratch.exists():
        shutil.rmtree(scratch)
    try:
        probe = plan.probe(spec.probe)
        try:
            sealed = seal(corpus, plan, probe, spec.arm, scratch / "workspace")
        except SealError as e:
            ledger.outcome(spec.key, attempt, "refused", {"reason": str(e)})
            return "refused (workspace could not be sealed)", None
        store.put(keys.seal, json.dumps(sealed.record(), indent=1, sort_keys=True).encode())
        ledger.start(spec.key, attempt)

        def also(k: layout.SessionKeys) -> set[str]:
            return named_write_paths(store, k.stream, str(sealed.path)) | {p for p in produced}

        try:
            record = executor.run(plan, probe, sealed, scratch, store, keys, also)
        except Exception as e:  # the harness may have spent: record what is known, never retry by itself
            ledger.outcome(spec.key, attempt, "failed", {"reason": f"{type(e).__name__}: {e}"})
            return f"failed ({type(e).__name__}: {e})", None
        record["driver_produced"] = list(produced)
        store.put(keys.capture, json.dumps(record, indent=1, sort_keys=True).encode())
        parsed = stream.parse(store.iter_lines(keys.stream))
        status = "failed" if record["timed_out"] else "succeeded"
        ledger.outcome(spec.key, attempt, status, {"stream": record["stream"], "exit_code": record["exit_code"],
                                                    "timed_out": record["timed_out"]})
        return status, parsed.cost_usd
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
