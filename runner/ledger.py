"""The campaign ledger: an append-only, hash-chained journal of every session's intent,
start and outcome (the experiment-records seed).

Entries are written in batches (group commit): one object ``ledger/<seq>.json`` per batch,
named by its first entry's seq and holding its entries as canonical JSON lines, written
create-only, so two writers can never both append entry n (a ledger written one entry per
object is the case of batches of one). Each entry carries the digest of the entry before it, so
a modified, reordered or truncated chain is detected by ``verify``. A chain whose last entries
are deleted still verifies as a chain, so each batch also anchors the head it wrote
(``ledger-head.json``: its last seq and hash), and ``verify`` holds the chain to it. A session's
intent and its start are journaled before its harness can run; a start with no outcome means
the session may or may not have executed, and nothing here runs it again by itself: ``recover``
marks it interrupted (keeping what its killed runner had captured of the stream, as an
incomplete stream, never as the stream), then ``cancel`` closes it or ``resume`` opens a new
attempt under the same declaration.

Exact retries of an entry are idempotent (the existing entry is returned); a changed retry or
an invalid transition is rejected.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, NotRequired, TypedDict

from runner import digest, layout
from runner.clock import now
from runner.errors import UserError
from runner.store import AlreadyExists, NotFound, Store

GENESIS = "sha256:" + "0" * 64
OUTCOMES = ("succeeded", "failed", "refused", "cancelled", "interrupted")
RECOVERED = "recovered: started with no outcome; it may or may not have executed"
# Outcomes after which `resume` may open a new attempt.
RESUMABLE = ("failed", "interrupted")


class LedgerError(UserError):
    """A rejected append, or a chain that does not verify."""


class Declaration(TypedDict):
    """What an attempt is bound to (runner.campaign.declaration): an intent's ``declaration``;
    a resumed attempt must present the same."""

    probe: str
    arm: str
    repetition: int
    plan: str    # digest of the plan's canonical JSON
    corpus: str  # the corpus fingerprint


class Money(TypedDict):
    """The budget's reservation a start entry journals (runner.budget.Gate.money), in dollars as
    decimal strings."""

    reserved_usd: str
    campaign_usd: str


class LedgerEntry(TypedDict):
    """One entry of the chain, ``ledger/<seq>.json``, as ``append`` is given it and as it is
    stored (canonical JSON: sorted keys). Which keys an entry has follows its ``type``: every one
    but a note names a session and attempt; an intent its declaration; a start the budget's
    reservation (where a budget applies); an outcome its status and detail; a close its status.
    ``at``, ``seq``, ``prev`` and ``hash`` are added by ``append``."""

    type: str  # "intent", "start", "outcome", "close" or "note"
    session: NotRequired[str]
    attempt: NotRequired[int]
    declaration: NotRequired[Declaration]
    reserved_usd: NotRequired[str]
    campaign_usd: NotRequired[str]
    status: NotRequired[str]  # an outcome's (OUTCOMES) or a close's ("cancelled")
    detail: NotRequired[dict[str, Any]]  # an outcome's: the executor's and the campaign's words (reason, stream, exit_code, cost_usd, ...)
    text: NotRequired[str]  # a note's
    at: NotRequired[str]
    seq: NotRequired[int]
    prev: NotRequired[str]
    hash: NotRequired[str]


class Head(TypedDict):
    """``ledger-head.json``: the last entry an append wrote, anchored."""

    seq: int
    hash: str


def canonical(entry: Mapping[str, object]) -> bytes:
    return json.dumps(entry, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()


@dataclass
class SessionState:
    key: str
    attempt: int = 0
    declaration: Declaration | None = None
    started: bool = False
    outcome: str | None = None
    closed: str | None = None  # "cancelled" after an interrupted attempt was closed
    detail: dict[str, Any] = field(default_factory=dict)  # the last outcome's detail

    @property
    def status(self) -> str:
        if self.closed:
            return self.closed
        if self.outcome:
            return self.outcome
        if self.started:
            return "started"
        if self.attempt:
            return "intended"
        return "pending"


def sessions_digest(states: dict[str, SessionState], keys: Iterable[str]) -> str:
    """One digest of what the ledger says of the sessions ``keys`` (status, attempt, outcome
    detail): all a transform reads of it. The transform's receipt carries it, so a reader can
    tell whether the ledger moved on after the transcripts were written."""
    said = [(k, s.status, s.attempt, s.detail) if (s := states.get(k)) else (k, "pending", 0, {}) for k in keys]
    return digest.of_bytes(canonical({"sessions": sorted(said)}))


class _Pending:
    """One caller's entry waiting in the queue, and its answer once its batch is settled."""

    def __init__(self, entry: LedgerEntry):
        self.entry = entry
        self.done = threading.Event()
        self.lead = False  # handed the committer's turn rather than an answer
        self.answer: LedgerEntry | BaseException | None = None

    def settle(self, answer: LedgerEntry | BaseException) -> None:
        self.answer = answer
        self.done.set()

    def result(self) -> LedgerEntry:
        if isinstance(self.answer, BaseException):
            raise self.answer
        assert self.answer is not None
        return self.answer


@dataclass
class _Stage:
    """A batch's entries checked and chained but not yet written: the states and first entries
    they change, over the ledger's own (which change only once the batch is durable)."""

    seq: int
    prev: str
    states: dict[str, SessionState] = field(default_factory=dict)
    first: dict[tuple[str, str | None, int | None], LedgerEntry] = field(default_factory=dict)
    written: list[LedgerEntry] = field(default_factory=list)


def _fold(s: SessionState, e: LedgerEntry) -> None:
    """What entry ``e`` makes of its session's state ``s`` (in place)."""
    kind = e["type"]
    if kind == "intent":
        s.attempt, s.declaration, s.started, s.outcome, s.closed, s.detail = e["attempt"], e["declaration"], False, None, None, {}
    elif kind == "start":
        s.started = True
    elif kind == "outcome":
        s.outcome, s.detail = e["status"], e.get("detail", {})
    elif kind == "close":
        s.closed = e["status"]


class Ledger:
    """``max_batch``: the most entries one batch (one object) holds, which bounds an object's
    size (about 4 MB at 10,000 entries); 1 commits each append on its own, two store round trips
    each, as the ledger did before group commit (bench/ledger_concurrent.py's baseline)."""

    def __init__(self, store: Store, campaign: str, *, max_batch: int = 10_000):
        if max_batch < 1:
            raise ValueError(f"max_batch {max_batch}: a batch holds at least one entry")
        self.store = store
        self.campaign = campaign
        self.prefix = layout.ledger_prefix(campaign)
        self.head_key = layout.ledger_head_key(campaign)
        self.entries: list[LedgerEntry] = []
        self.max_batch = max_batch
        self._mutex = threading.Lock()  # guards the queue and the committer's turn, never a store call
        self._queue: list[_Pending] = []
        self._committing = False
        self.reload()

    def _key(self, seq: int) -> str:
        return f"{self.prefix}{seq:010d}.json"

    def reload(self) -> None:
        self.entries = []
        # Kept as entries are applied, so an append costs the same in a campaign of ten
        # sessions as in one of ten thousand (no rescan of the chain per append).
        self._states: dict[str, SessionState] = {}
        self._first: dict[tuple[str, str | None, int | None], LedgerEntry] = {}  # (type, session, attempt) -> the first such entry
        for k in self.store.list(self.prefix):
            if k.endswith(".json"):
                for e in self._batch(k):
                    self._apply(e)

    def _batch(self, key: str) -> list[Any]:
        """The entries of one stored batch, in order (ValueError where one is not JSON)."""
        return [json.loads(line) for line in self.store.get(key).splitlines()]

    def _apply(self, e: LedgerEntry) -> None:
        self.entries.append(e)
        if e["type"] != "note":
            self._first.setdefault((e["type"], e.get("session"), e.get("attempt")), e)
        if "session" in e:
            _fold(self._states.setdefault(e["session"], SessionState(e["session"])), e)

    # -- state ---------------------------------------------------------------------------
    def sessions(self) -> dict[str, SessionState]:
        """Every session's state, as copies (they do not change under the caller)."""
        return {k: replace(s) for k, s in self._states.items()}

    def state(self, session: str) -> SessionState:
        s = self._states.get(session)
        return replace(s) if s is not None else SessionState(session)

    def entry(self, kind: str, session: str, attempt: int) -> LedgerEntry | None:
        """The journaled ``kind`` entry (intent, start, outcome, close) of one attempt, or None."""
        return self._first.get((kind, session, attempt))

    # -- appends -------------------------------------------------------------------------
    def _check(self, entry: LedgerEntry, stage: _Stage) -> LedgerEntry | None:
        """The existing identical entry (an exact retry), or None; raises on a bad transition.
        Judged against the ledger with the batch's earlier entries (``stage``)."""
        body = {k: v for k, v in entry.items() if k not in ("at",)}
        key = (entry["type"], entry.get("session"), entry.get("attempt"))
        e = (stage.first.get(key) or self._first.get(key)) if entry["type"] != "note" else None
        if e is not None:
            old = {k: v for k, v in e.items() if k not in ("at", "seq", "prev", "hash")}
            if old == body:
                return e
            raise LedgerError(f"ledger: a different {entry['type']} entry for {entry.get('session')} attempt {entry.get('attempt')} exists already")
        if "session" not in entry:
            return None
        s = stage.states.get(entry["session"]) or self.state(entry["session"])
        kind, attempt = entry["type"], entry.get("attempt")
        ok = {
            "intent": (s.attempt == 0 and attempt == 1) or (attempt == s.attempt + 1 and s.outcome in RESUMABLE and not s.closed),
            "start": attempt == s.attempt and s.status == "intended",
            "outcome": attempt == s.attempt and (s.status == "started" or (
                s.status == "intended" and entry.get("status") in ("refused", "failed", "cancelled"))),
            "close": attempt == s.attempt and s.outcome == "interrupted" and not s.closed,
        }.get(kind, False)
        if not ok:
            raise LedgerError(f"ledger: {kind} for {entry['session']} attempt {attempt} is not allowed while it is {s.status} (attempt {s.attempt})")
        return None

    def _chain(self, entry: LedgerEntry, stage: _Stage) -> LedgerEntry:
        """The entry as the batch's next: stamped, numbered, chained and hashed; staged."""
        full = entry.copy()
        full["at"], full["seq"] = entry.get("at") or now(), stage.seq + len(stage.written)
        full["prev"] = stage.written[-1]["hash"] if stage.written else stage.prev
        full["hash"] = digest.of_bytes(canonical(full))
        stage.written.append(full)
        if full["type"] != "note":
            key = (full["type"], full.get("session"), full.get("attempt"))
            if key not in self._first:
                stage.first.setdefault(key, full)
        if "session" in full:
            name = full["session"]
            if name not in stage.states:
                stage.states[name] = self.state(name)
            _fold(stage.states[name], full)
        return full

    def append(self, entry: LedgerEntry) -> LedgerEntry:
        """Journal ``entry`` and return it as stored (or the identical entry journaled before).

        Group commit: the caller queues its entry and waits; one caller at a time commits. A
        caller that finds no committer becomes it (no thread of the ledger's own, so nothing
        runs in the background to outlive a caller or hide its error): it takes the queue (up to
        ``max_batch`` entries) as one batch, and when done hands the turn to the oldest caller
        still queued. The batch is committed by :meth:`_commit`; each caller returns only once
        its batch's object (so its entry) is durable, or raises what refused or failed it.
        """
        mine = _Pending(entry)
        with self._mutex:
            self._queue.append(mine)
            wait, self._committing = self._committing, True
        if wait:
            mine.done.wait()
            if not mine.lead:
                return mine.result()
        with self._mutex:
            batch, self._queue = self._queue[:self.max_batch], self._queue[self.max_batch:]
        try:
            self._commit(batch)
        except BaseException as e:  # every waiting caller of the batch hears it, not just this one
            for p in batch:
                if p.answer is None:
                    p.settle(e)
        finally:
            with self._mutex:
                if self._queue:
                    self._queue[0].lead = True
                    self._queue[0].done.set()
                else:
                    self._committing = False
        return mine.result()

    def _commit(self, batch: list[_Pending]) -> None:
        """Check, chain and write one batch; settle each of its callers.

        Each entry is checked in order against the ledger with the batch's earlier entries
        (``_check``): one not allowed is answered LedgerError, an exact retry the existing
        entry, alone; the rest are chained and written as ONE create-only object under the
        first one's seq, then the head is anchored: two store round trips for the batch. One
        object per batch is the rule that keeps the chain whole on any failure: a put either
        stores every entry of the batch or none, so no seq is ever left behind with a gap
        before it (entries written as objects of their own at once could be, by a failed put or
        a kill between them). If the object's put fails, nothing changed and every caller of the
        batch gets the error (a retry of the same entry is idempotent); if the head's put fails,
        the entries are durable and applied, and their callers get the error, as an append did
        before. If another writer took the seq first (AlreadyExists), the ledger is reloaded
        and the whole batch checked again against what that writer journaled.
        """
        while True:
            stage = _Stage(len(self.entries), self.entries[-1]["hash"] if self.entries else GENESIS)
            answers: list[tuple[_Pending, LedgerEntry | LedgerError]] = []
            for p in batch:
                try:
                    answers.append((p, self._check(p.entry, stage) or self._chain(p.entry, stage)))
                except LedgerError as e:
                    answers.append((p, e))
            if stage.written:
                try:
                    self.store.put(self._key(stage.seq), b"".join(canonical(w) + b"\n" for w in stage.written), create_only=True)
                except AlreadyExists:
                    self.reload()  # another writer appended first: check the batch again against its entries
                    continue
                for w in stage.written:
                    self._apply(w)
                # a writer behind another may anchor an older head: verify then holds fewer entries, never a false alarm
                last = stage.written[-1]
                head: Head = {"seq": last["seq"], "hash": last["hash"]}
                self.store.put(self.head_key, canonical(head) + b"\n")
            for p, answer in answers:
                p.settle(answer)
            return

    def intent(self, session: str, attempt: int, declaration: Declaration) -> LedgerEntry:
        return self.append({"type": "intent", "session": session, "attempt": attempt, "declaration": declaration})

    def start(self, session: str, attempt: int, money: Money | None = None) -> LedgerEntry:
        """``money``: the budget's reservation for the attempt (runner/budget.py), journaled with it."""
        entry: LedgerEntry = {"type": "start", "session": session, "attempt": attempt}
        if money:
            entry["reserved_usd"], entry["campaign_usd"] = money["reserved_usd"], money["campaign_usd"]
        return self.append(entry)

    def outcome(self, session: str, attempt: int, status: str, detail: dict[str, Any] | None = None) -> LedgerEntry:
        if status not in OUTCOMES:
            raise LedgerError(f"ledger: unknown outcome {status!r}")
        return self.append({"type": "outcome", "session": session, "attempt": attempt, "status": status, "detail": detail or {}})

    def close(self, session: str, attempt: int) -> LedgerEntry:
        return self.append({"type": "close", "session": session, "attempt": attempt, "status": "cancelled"})

    def recover(self) -> list[tuple[str, int, dict[str, Any]]]:
        """Mark every started session with no outcome interrupted; nothing runs or stops.

        The detail of each interrupted outcome says what its stream left: a stream committed
        before the runner died (its outcome was never journaled), bytes kept from an
        uncommitted one under the session's ``stream.incomplete.jsonl``, or nothing. The kept
        bytes are salvaged before the outcome is appended, so a recover cut short is simply
        run again: the session is still started and the salvage finishes where it stopped.
        """
        marked = []
        for session, st in sorted(self.sessions().items()):
            if st.status == "started":
                detail = self._stream_left(session, st.attempt)
                self.outcome(session, st.attempt, "interrupted", detail)
                marked.append((session, st.attempt, detail))
        return marked

    def _stream_left(self, session: str, attempt: int) -> dict[str, Any]:
        probe, name = session.split("/", 1)
        keys = layout.SessionKeys(self.campaign, probe, name, attempt)
        kept = self.store.salvage(keys.stream, keys.partial_stream)
        if kept is not None:
            return {"reason": f"{RECOVERED}; the {kept['bytes']} bytes its runner had captured of its stream are kept "
                              f"as {kept['key']}, an incomplete stream", "stream_incomplete": kept}
        if self.store.exists(keys.stream):
            whole = self.store.describe(keys.stream)
            return {"reason": f"{RECOVERED}; its stream ({whole['bytes']} bytes) was stored whole before its runner "
                              f"stopped, its outcome was never journaled", "stream": whole}
        return {"reason": f"{RECOVERED}; no byte of its stream was captured"}

    # -- export and verification -----------------------------------------------------------
    def verify(self) -> list[str]:
        """Every break of the chain, as sentences (empty: the chain verifies)."""
        problems: list[str] = []
        prev = GENESIS
        hashes: list[str] = []
        keys = [k for k in self.store.list(self.prefix) if k.endswith(".json")]
        for key in keys:
            i = len(hashes)
            if key != self._key(i):
                problems.append(f"entry {i} is missing (found {key.rsplit('/', 1)[-1]} in its place)")
                break
            try:
                batch = self._batch(key)
            except ValueError:
                problems.append(f"entry {i} is not JSON")
                break
            if not batch:
                problems.append(f"entry {i} is missing ({key.rsplit('/', 1)[-1]} holds no entry)")
                break
            for n, e in enumerate(batch, start=i):
                claimed = e.get("hash")
                body = {k: v for k, v in e.items() if k != "hash"}
                if digest.of_bytes(canonical(body)) != claimed:
                    problems.append(f"entry {n} was modified: its hash does not match its content")
                if e.get("seq") != n:
                    problems.append(f"entry {n} carries seq {e.get('seq')}: the chain was reordered")
                if e.get("prev") != prev:
                    problems.append(f"entry {n} does not follow entry {n - 1}: the chain was reordered or truncated")
                prev = claimed
                hashes.append(claimed)
        try:
            head = json.loads(self.store.get(self.head_key))
        except NotFound:
            return problems  # a ledger written before heads were anchored
        except ValueError:
            return [*problems, "the anchored head is not JSON"]
        seq = head.get("seq") if isinstance(head, dict) else None
        if not isinstance(seq, int) or seq < 0:
            problems.append("the anchored head names no entry")
        elif seq >= len(hashes):
            problems.append(f"the chain ends at entry {len(hashes) - 1}, but entry {seq} was its head: entries were removed")
        elif hashes[seq] != head.get("hash"):
            problems.append(f"entry {seq} is not the head that was anchored: the chain was rewritten")
        return problems

    def export(self) -> tuple[bytes, str]:
        """Canonical JSON Lines of the verified chain, and its SHA-256."""
        problems = self.verify()
        if problems:
            raise LedgerError("ledger: the chain does not verify: " + "; ".join(problems))
        self.reload()
        data = b"".join(canonical(e) + b"\n" for e in self.entries)
        return data, digest.of_bytes(data)
