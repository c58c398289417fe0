"""What a campaign runs over, as the store keeps it: its plan, its corpus (a reproducible
archive) and the identifiers the corpus carries, each written create-only under the campaign
(a campaign name is bound to one plan and one corpus for good) and read back by every run,
the controller Job and the transform."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TypedDict

from runner import digest, layout
from runner.errors import UserError
from runner.plan import Plan, parse_plan
from runner.store import AlreadyExists, Store
from runner.transform.events import corpus_identifiers


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


def store_corpus(store: Store, campaign: str, corpus: Path) -> str:
    """The corpus as a tar.gz under the campaign (create-only, like the plan); the digest of
    what the store holds. The archive is reproducible (no time in the gzip header or the
    entries, no owner), so the same corpus packs to the same bytes on every submit."""
    buf = io.BytesIO()
    with gzip.GzipFile(fileobj=buf, mode="wb", mtime=0) as gz, \
            tarfile.open(fileobj=gz, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for rel, p in _corpus_entries(corpus):
            info = tar.gettarinfo(str(p), arcname=rel.as_posix())
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            info.mtime = 0
            if info.isfile():
                with open(p, "rb") as f:
                    tar.addfile(info, f)
            elif info.isdir() or info.issym():
                tar.addfile(info)
    data = buf.getvalue()
    key = layout.corpus_key(campaign)
    try:
        store.put(key, data, create_only=True)
    except AlreadyExists:
        data = store.get(key)  # an archive of an earlier version may differ in its bytes alone
        if corpus_fingerprint_of_archive(data) != corpus_fingerprint_of_archive(buf.getvalue()):
            raise UserError(f"campaign {campaign!r} exists in {store.uri} with a different corpus; choose a new campaign name") from None
    return digest.of_bytes(data)


def corpus_fingerprint_of_archive(data: bytes) -> str:
    with tempfile.TemporaryDirectory() as d:
        _unpack(data, Path(d) / "corpus")  # _unpack makes its directory: a fresh one inside the temp dir
        return corpus_fingerprint(Path(d) / "corpus")


def corpus_fingerprint(corpus: Path) -> str:
    """A digest over every file of the corpus (paths and bytes, .git excluded)."""
    lines = []
    for rel, p in _corpus_entries(corpus):
        if p.is_symlink():
            lines.append(f"{rel.as_posix()} -> {p.readlink()}")
        elif p.is_file():
            lines.append(f"{rel.as_posix()} {digest.of_file(p)}")
    return digest.of_text("\n".join(lines))


def _corpus_entries(corpus: Path) -> Iterator[tuple[Path, Path]]:
    """(path relative to the corpus, path) of everything in the corpus but ``.git``, in order."""
    for p in sorted(corpus.rglob("*")):
        rel = p.relative_to(corpus)
        if rel.parts[0] != ".git":
            yield rel, p


def _corpus_texts(corpus: Path) -> Iterator[str]:
    """Each file's corpus path and text (.git excluded), for the identifiers the corpus carries."""
    for rel, p in _corpus_entries(corpus):
        yield rel.as_posix()
        if p.is_file() and not p.is_symlink():
            yield p.read_bytes().decode("utf-8", "replace")


class Identifiers(TypedDict):
    """``identifiers.json`` (layout.identifiers_key), create-only beside the plan."""

    identifier_pattern: str
    identifiers: list[str]  # sorted


def store_identifiers(store: Store, plan: Plan, corpus: Path) -> frozenset[str]:
    """The identifiers of the corpus the campaign runs over (every token-bounded match of the
    plan's identifier pattern in its paths and text), create-only beside the plan: the transform
    cites only these, the same set for every probe, and it reads no corpus to find them."""
    found = corpus_identifiers(_corpus_texts(corpus), plan.identifier_re)
    record: Identifiers = {"identifier_pattern": plan.identifier_pattern, "identifiers": sorted(found)}
    data = json.dumps(record, indent=0).encode()
    try:
        store.put(layout.identifiers_key(plan.campaign), data, create_only=True)
    except AlreadyExists:
        if store.get(layout.identifiers_key(plan.campaign)) != data:
            raise UserError(f"campaign {plan.campaign!r} exists in {store.uri} over a corpus with other identifiers; "
                            "a campaign is bound to one corpus: choose a new campaign name") from None
    return found


def load_identifiers(store: Store, campaign: str) -> frozenset[str]:
    key = layout.identifiers_key(campaign)
    if not store.exists(key):
        raise UserError(f"campaign {campaign!r} in {store.uri} has no {key}: `probe-runner run` writes it "
                        "from the corpus before the first session")
    record: Identifiers = json.loads(store.get(key))
    return frozenset(record["identifiers"])


def fetch_corpus(store: Store, campaign: str, dest: Path) -> Path:
    key = layout.corpus_key(campaign)
    if not store.exists(key):
        raise UserError(f"campaign {campaign!r} has no corpus in {store.uri} (submit it with `probe-runner submit`)")
    if dest.exists():
        shutil.rmtree(dest)
    _unpack(store.get(key), dest)
    return dest


def _unpack(data: bytes, dest: Path) -> None:
    """The corpus archive from the bucket (a trust boundary) into ``dest``: the standard
    library's "data" filter where the interpreter has it (3.11.4+); before that (Debian
    bookworm's 3.11.2, the harness image's python3 and a python stand-in), the same refusals
    checked member by member: nothing absolute, nothing above ``dest``, no link that leads out
    of it, regular files, directories and links only."""
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
        if hasattr(tarfile, "data_filter"):
            tar.extractall(dest, filter="data")
            return
        root = dest.resolve()
        members = tar.getmembers()
        for m in members:
            if _escapes(m, root):
                raise UserError(f"the stored corpus archive holds {m.name!r}, which would land outside the corpus; "
                                "it was not unpacked")
        tar.extractall(dest, members=members)


def _escapes(m: tarfile.TarInfo, root: Path) -> bool:
    """Whether member ``m`` would land, or lead, outside ``root`` (the "data" filter's refusals)."""
    if not (m.isfile() or m.isdir() or m.issym() or m.islnk()):
        return True
    target = (root / m.name).resolve()
    if m.name.startswith("/") or not target.is_relative_to(root):
        return True
    if not (m.issym() or m.islnk()):
        return False
    # A symlink is relative to its own directory, a hard link to the archive's root.
    link = (target.parent if m.issym() else root) / m.linkname
    return m.linkname.startswith("/") or not link.resolve().is_relative_to(root)
