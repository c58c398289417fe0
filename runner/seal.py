"""Sealing: a fresh copy of the corpus for one (probe, arm) that names neither the probe nor
its answers, so the session measures what the workspace gives it and not the probe itself.

The rule (the recorder contract, "The prompt is the task section"):

1. ``.git`` is never copied (nor a top-level ``.git`` file): the history holds the probe and
   every earlier answer.
2. The probe shelves go: the directory of every probe document of the plan, and
   ``docs/probe-runs/`` (earlier recordings).
3. Each answer key ``.headwater/probe.yml`` declares for the probe goes, and so does every line
   elsewhere that names it. A line names a document when it holds a *reference* to it (below);
   an answer key is named besides by its file name or its stem standing alone as a token
   (``see status-answer.md``; a stem that is one plain word, like ``answer``, is prose, not a
   name), and by an identifier of ``plan.identifier_pattern`` its file name carries
   (``HW-NOTE-0003`` for ``docs/notes/HW-NOTE-0003.md``), in any case, not inside a longer
   word. An identifier the probe itself uses (its title, task, answers, examined documents)
   names the probe's subject, not the key, and does not count.
4. Every file that names the probe goes: its id or its title, case-folded, with any run of white
   space between the words (a line break included, and a Markdown or comment line prefix such as
   ``>``, ``#``, ``-``, ``//`` after it), not inside a longer word; or a reference to its path.
   Outside ``docs/`` a file stays when ``folds:`` declares it. ``.headwater/probe.yml`` itself
   names the probe's answer keys, so it goes with them unless folded.
5. Links are copied as links, relative, to the same corpus path, so each leads into the sealed
   workspace and never back to the corpus; a link to a directory too. A link goes, with the
   reason in ``removed``, when its own path would go (a shelf, an answer key, the arm), or when
   it leads to the probe, an answer key, a probe shelf, ``.git`` or a file sealing removed.
6. The arm removes what it measures (see ARM_COMPONENTS).
7. The result is checked: a file other than a fold that still names the probe or an answer key,
   a fold that states an answer (see ``_stated_answer``) or names an answer key, or a link
   leading out of the corpus refuses the workspace. The session then does not run.

A *reference* to a document is a path token or a Markdown link target (inline ``[t](target
"title")``, ``<angle brackets>``, a reference definition ``[id]: target``, an HTML attribute)
that, with its ``#fragment`` and ``?query`` cut, percent-decoded and with ``.``/``..``
normalised, resolves to the document (or to its path without the suffix) from the file's own
directory or from the corpus root, or that ends in ``/`` and the document's corpus path (a URL,
an absolute path). A token is bounded by the start or end of the line, white space, quotes,
``()[]{}<>,;:|`*!=@``, and at its end also ``#``, ``?`` or a sentence's period; ``_`` and ``~``
bound it only as emphasis (``_name_``), since they occur inside file names; ``/`` before a name
makes the whole path the token, which must then resolve. So ``notstatus-answer.md``,
``my_status-answer.md``, ``status-answer.md.bak`` and ``other/status-answer.md`` do not name
``docs/notes/status-answer.md``. Paths and file names are compared case-sensitively, as the
workspace's file system and the session's tools do.

Text is read as UTF-8 with undecodable bytes kept as they are, and split into lines at line
feeds only (a CRLF's carriage return stays with its line): a lone CR, VT, FF or U+2028 does not
end a line for a reader, so it does not end the line that goes.
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner import digest
from runner.answer import answer_of
from runner.errors import SealError, UserError
from runner.plan import Plan, Probe, format_validation_error, parse_document

PROBE_CONFIG = ".headwater/probe.yml"
RECORDINGS_SHELF = "docs/probe-runs"

HOOKS, SKILLS, CLAUDE_MD, MCP = "hooks", "skills", "claude-md", "mcp"
# What each arm removes from the sealed workspace.
ARM_COMPONENTS: dict[str, frozenset[str]] = {
    "present": frozenset(),
    "absent": frozenset({HOOKS, SKILLS, CLAUDE_MD, MCP}),
    "no-hook": frozenset({HOOKS}),
    "no-skills": frozenset({SKILLS}),
    "no-claude-md": frozenset({CLAUDE_MD}),
    "mcp": frozenset({HOOKS, SKILLS, CLAUDE_MD}),
}
_SETTINGS_FILES = (".claude/settings.json", ".claude/settings.local.json")
_CLAUDE_MD_NAMES = {"CLAUDE.md", "CLAUDE.local.md"}


class ProbeConfig(BaseModel):
    """``.headwater/probe.yml``: folds and answer keys (optional file; absent means neither)."""

    model_config = ConfigDict(extra="forbid")
    folds: list[str] = Field(default_factory=list)
    answer_keys: dict[str, list[str]] = Field(default_factory=dict)


def load_probe_config(corpus: Path) -> ProbeConfig:
    path = corpus / PROBE_CONFIG
    if not path.exists():
        return ProbeConfig()
    data = parse_document(path)
    if data is None:
        return ProbeConfig()
    if not isinstance(data, dict):
        raise UserError(f"{path}: must be a mapping with 'folds' and 'answer_keys'")
    try:
        return ProbeConfig.model_validate(data)
    except ValidationError as e:
        raise UserError(format_validation_error(str(path), e)) from None


@dataclass
class SealedWorkspace:
    """What sealing produced: the workspace and the facts the transform needs about it."""

    path: Path
    arm: str
    manifest: dict[str, str]  # relative path -> digest of the bytes the session starts with
    removed: dict[str, str] = field(default_factory=dict)  # relative path -> why
    folds_kept: list[str] = field(default_factory=list)
    mcp_servers: list[str] = field(default_factory=list)  # servers the workspace's .mcp.json declares

    def record(self) -> dict:
        return {
            "arm": self.arm,
            "manifest": self.manifest,
            "removed": self.removed,
            "folds_kept": self.folds_kept,
            "mcp_servers": self.mcp_servers,
        }


def _corpus_entries(corpus: Path) -> tuple[list[str], list[str]]:
    """The corpus's regular files and its links (to files and to directories), ``.git`` left out.

    ``os.walk`` lists a link to a directory among the directories and does not descend into it;
    it is returned as a link here, so it is copied or removed with a reason, never lost.
    """
    files, links = [], []
    for dirpath, dirnames, filenames in os.walk(corpus):
        rel_dir = Path(dirpath).relative_to(corpus)
        if rel_dir == Path("."):
            dirnames[:] = [d for d in dirnames if d != ".git"]
            filenames = [f for f in filenames if f != ".git"]  # a worktree's gitdir pointer
        for name in list(dirnames):
            full = Path(dirpath) / name
            if full.is_symlink():
                _check_link(corpus, full)
                links.append((rel_dir / name).as_posix())
        for name in filenames:
            full = Path(dirpath) / name
            rel = (rel_dir / name).as_posix()
            if full.is_symlink():
                _check_link(corpus, full)
                links.append(rel)
            elif not full.is_file():
                raise SealError(f"corpus file {rel} is not a regular file")
            else:
                files.append(rel)
    return sorted(files), sorted(links)


def _check_link(corpus: Path, link: Path) -> Path:
    """The corpus path a link finally leads to; SealError where that is outside the corpus."""
    try:
        target = link.resolve()
    except (RuntimeError, OSError) as e:  # a loop of links
        raise SealError(f"corpus link {link.relative_to(corpus)} cannot be followed: {e}") from None
    if not target.is_relative_to(corpus.resolve()):
        raise SealError(f"corpus link {link.relative_to(corpus)} leads out of the corpus (to {target})")
    return target


def _under(rel: str, directory: str) -> bool:
    return rel == directory or rel.startswith(directory.rstrip("/") + "/")


# --- naming ------------------------------------------------------------------------------

# Characters that end a path or name token on either side (module docstring). '_' and '~' are
# not among them: they occur inside file names, and bound a token only as emphasis.
_BOUNDARY = frozenset("\"'()[]{}<>,;:|`*!=@")
_EMPHASIS = "_~"
# Line prefixes that may follow a line break inside a wrapped title: quote, heading, list,
# comment markers. Each run of them must be followed by white space, except the last (">x").
_LINE_PREFIX = r"[>#*+\-|;%/]"
_GAP = rf"\s+(?:{_LINE_PREFIX}+\s+)*{_LINE_PREFIX}*"
_NOT_AFTER_ALNUM = r"(?<![^\W_])"
_NOT_BEFORE_ALNUM = r"(?![^\W_])"
_ANGLE_TARGET = re.compile(r"<([^<>\n]+)>")
_PERCENT_ESCAPE = re.compile(r"%[0-9A-Fa-f]{2}")


def _is_boundary(c: str) -> bool:
    return c.isspace() or c in _BOUNDARY


def _is_name_char(c: str) -> bool:
    return c.isalnum() or c in "-_"


def _phrase(text: str) -> re.Pattern[str]:
    """A pattern for ``text`` in case-folded text: its words with any gap between them (a run of
    white space, a line prefix after a line break) and not inside a longer word.

    The pattern opens with the first word itself, its bound checked behind it: a pattern that
    opens with a look-behind loses the regular-expression engine's literal search, a hundred
    times slower over a large file.
    """
    words = text.casefold().split()
    if not words:  # a title of white space names nothing
        return re.compile(r"(?!)")
    first = re.escape(words[0])
    body = first
    if words[0][0].isalnum():
        body += f"(?<![^\\W_]{first})"
    for w in words[1:]:
        body += _GAP + re.escape(w)
    if words[-1][-1].isalnum():
        body += _NOT_BEFORE_ALNUM
    return re.compile(body)


def _closes_token(line: str, j: int) -> bool:
    """Whether a token may end just before ``line[j]``: the end, a boundary, a fragment or query,
    or a sentence's period (a period followed by a name character is a longer name: ``.bak``)."""
    if j == len(line):
        return True
    c = line[j]
    if _is_boundary(c) or c in "#?":
        return True
    return c == "." and (j + 1 == len(line) or not _is_name_char(line[j + 1]))


def _ends_token(line: str, j: int) -> bool:
    if j < len(line) and line[j] in _EMPHASIS:  # closing emphasis: ``_status-answer_``
        while j < len(line) and line[j] in _EMPHASIS:
            j += 1
    return _closes_token(line, j)


def _token_start(line: str, i: int) -> int | None:
    """Where the token holding a name that starts at ``i`` starts: ``i`` when the name stands
    alone, the start of its path when ``/`` precedes it, None when it is inside a longer word."""
    if i == 0 or _is_boundary(line[i - 1]):
        return i
    c = line[i - 1]
    if c == "/":
        p = i - 1
        while p > 0 and not _is_boundary(line[p - 1]):
            p -= 1
        return p
    if c in _EMPHASIS:  # opening emphasis, when nothing but a boundary precedes it
        p = i - 1
        while p > 0 and line[p - 1] in _EMPHASIS:
            p -= 1
        if p == 0 or _is_boundary(line[p - 1]):
            return i
    return None


@dataclass(frozen=True)
class _Document:
    """A document (the probe, an answer key) and the ways a line can name it."""

    path: str
    targets: frozenset[str]  # its corpus path, and that path without its suffix
    anchors: tuple[str, ...]  # every reference holds one of these: its file name or its stem
    alone: frozenset[str]  # anchors that name it standing alone (an answer key's name, stem)
    resolvable_alone: frozenset[str]  # anchors that, alone, are a path relative to the file
    needles: frozenset[str]  # a line naming it holds one of these (case aside): the cheap test
    identifier_list: tuple[str, ...]  # identifiers naming it, matched in any case
    identifiers: re.Pattern[str] | None  # the same, as one pattern for a line

    @classmethod
    def of(cls, path: str, named_alone: bool, identifiers: list[str]) -> "_Document":
        pure = PurePosixPath(path)
        name, stem = pure.name, pure.stem if pure.suffix else pure.name
        alone = set()
        if named_alone:
            # A stem (or a name without suffix) that is one plain word is prose ("answer",
            # "README"): a line using that word does not name the document.
            alone = {name} if pure.suffix or not name.isalpha() else set()
            if not stem.isalpha():
                alone.add(stem)
        ids = None
        if identifiers:
            alts = "|".join(re.escape(x) for x in sorted(set(identifiers), key=len, reverse=True))
            ids = re.compile(f"{_NOT_AFTER_ALNUM}(?:{alts}){_NOT_BEFORE_ALNUM}", re.IGNORECASE)
        # An anchor that does not name it alone is only ever part of a path: "/" precedes it.
        needles = {a if a in alone or a == name else "/" + a for a in {name, stem}}
        return cls(
            path=path,
            targets=frozenset({path, pure.with_suffix("").as_posix()}),
            anchors=tuple(sorted({name, stem}, key=len, reverse=True)),
            alone=frozenset(alone),
            resolvable_alone=frozenset({name}),
            needles=frozenset(needles),
            identifier_list=tuple(sorted(set(identifiers))),
            identifiers=ids,
        )

    def resolves(self, token: str, rel_dir: str, from_root: bool = True) -> bool:
        """Whether a path token leads to this document (module docstring, "reference")."""
        token = token.split("#", 1)[0].split("?", 1)[0]
        for form in {token, token.lstrip(_EMPHASIS)}:
            for cand in {form, unquote(form)}:
                if not cand:
                    continue
                if not cand.startswith("/") and posixpath.normpath(posixpath.join(rel_dir, cand)) in self.targets:
                    return True
                if from_root:
                    norm = posixpath.normpath(cand)
                    if norm in self.targets or any(norm.endswith("/" + t) for t in self.targets):
                        return True
        return False

    def named_in(self, line: str, rel_dir: str) -> bool:
        """Whether one line (of a file in ``rel_dir``) names this document."""
        if self.identifiers is not None and self.identifiers.search(line):
            return True
        forms = (line, unquote(line)) if "%" in line else (line,)
        for text in forms:
            if "<" in text:  # an angle-bracketed link target may hold white space
                for m in _ANGLE_TARGET.finditer(text):
                    target = m.group(1).strip()
                    if any(a in target for a in self.anchors) and self.resolves(target, rel_dir):
                        return True
            for anchor in self.anchors:
                i = text.find(anchor)
                while i >= 0:
                    j = i + len(anchor)
                    start = _token_start(text, i) if _ends_token(text, j) else None
                    if start == i:
                        if anchor in self.alone:
                            return True
                        if anchor in self.resolvable_alone and self.resolves(anchor, rel_dir, from_root=False):
                            return True
                    elif start is not None and self.resolves(text[start:j], rel_dir):
                        return True
                    i = text.find(anchor, i + 1)
        return False


class _Names:
    """Finds the lines of a file that name any of some documents: a cheap ``in`` test on the
    whole text first, then a pattern for the candidate lines, then the exact rule per line."""

    def __init__(self, documents: list[_Document]):
        self.documents = documents
        needles = {n for d in documents for n in d.needles}
        # a needle holding another is found through the shorter one
        self.needles = [n for n in needles if not any(m != n and m in n for m in needles)]
        ids = sorted({x for d in documents for x in d.identifier_list}, key=len, reverse=True)
        self.identifiers = [_phrase(x) for x in ids]  # the whole-file test, on case-folded text
        alts = [re.escape(a) for a in sorted(self.needles, key=len, reverse=True)] + [re.escape(x) for x in ids]
        self.finder = re.compile("|".join(alts), re.IGNORECASE) if alts else None

    def lines(self, f: "_File") -> list[tuple[int, int]]:
        """The spans (start, end, the line feed included) of the lines of ``f`` that name one."""
        if self.finder is None:
            return []
        text = f.text
        starts = []
        if any(n in text for n in self.needles) or any(p.search(f.folded) for p in self.identifiers):
            starts = [m.start() for m in self.finder.finditer(text)]
        if "%" in text:
            starts += self._encoded(text)
        spans, pos = [], -1
        for start in sorted(starts):
            if start < pos:
                continue
            s = text.rfind("\n", 0, start) + 1
            e = text.find("\n", start)
            pos = e = len(text) if e < 0 else e + 1
            if any(d.named_in(text[s:e], f.dir) for d in self.documents):
                spans.append((s, e))
        return spans

    def _encoded(self, text: str) -> list[int]:
        """Where a token holding a percent escape decodes to hold a name: only those tokens are
        decoded, each once (a whole file decoded would cost more than the rest of sealing)."""
        starts, end = [], 0
        for m in _PERCENT_ESCAPE.finditer(text):
            if m.start() < end:
                continue
            s, end = m.start(), m.end()
            while s > 0 and not _is_boundary(text[s - 1]):
                s -= 1
            while end < len(text) and not _is_boundary(text[end]):
                end += 1
            if any(n in unquote(text[s:end]) for n in self.needles):
                starts.append(s)
        return starts


class _File:
    """One file's bytes, read once as text (undecodable bytes kept: they encode back as they were)."""

    __slots__ = ("rel", "dir", "data", "text", "_folded")

    def __init__(self, rel: str, data: bytes):
        self.rel = rel
        self.dir = posixpath.dirname(rel)
        self.data = data
        self.text = data.decode("utf-8", "surrogateescape")
        self._folded: str | None = None

    @property
    def folded(self) -> str:
        if self._folded is None:
            self._folded = self.text.casefold()
        return self._folded

    def without(self, spans: list[tuple[int, int]]) -> bytes:
        out, pos = [], 0
        for s, e in spans:
            out.append(self.text[pos:s])
            pos = e
        out.append(self.text[pos:])
        return "".join(out).encode("utf-8", "surrogateescape")


def _loose_words(text: str) -> list[str]:
    """Case-folded words with the punctuation at their edges (emphasis, code, colons) cut off;
    words of punctuation only (``-``, ``>``) dropped."""
    words = (_EDGE_PUNCTUATION.sub("", w) for w in text.casefold().split())
    return [w for w in words if w]


_EDGE_PUNCTUATION = re.compile(r"^[\W_]+|[\W_]+$")


def _stated_answer(text: str, answers: list[str]) -> str | None:
    """The declared answer a fold states, or None.

    The contract's word rule decides what a *session's* final line answers; the seal asks the
    converse, whether a reader of the fold can take an answer from it, so it applies that rule
    to every line (``answer.answer_of`` on each line: the set of its words is the set of one
    answer's words, in any order) and also to the sentences around it: a run of consecutive
    words (across line breaks; edge punctuation such as ``**``, backticks or a colon cut off)
    whose words are one answer's words. "The answer is current HW-DR-0052" states the answer to
    anyone who reads it though it is not the answer form; "concurrent HW-DR-0052s" does not,
    which the substring test this replaces got wrong, and "HW-DR-0052 current" does, which it
    missed.
    """
    for line in text.split("\n"):
        if line.strip():
            stated = answer_of(line, answers)
            if stated is not None:
                return stated
    words = _loose_words(text)
    for answer in answers:
        want = sorted(_loose_words(answer))
        if not want:
            continue
        first, k = set(want), len(want)
        for i in range(len(words) - k + 1):
            if words[i] in first and sorted(words[i:i + k]) == want:
                return answer
    return None


class _Sealer:
    def __init__(self, corpus: Path, plan: Plan, probe: Probe, arm: str, config: ProbeConfig):
        self.corpus = corpus
        self.probe = probe
        self.arm = arm
        self.folds = set(config.folds)
        self.answer_keys = [posixpath.normpath(k) for k in config.answer_keys.get(probe.id, [])]
        self.shelves = sorted({PurePosixPath(p.path).parent.as_posix() for p in plan.probes} | {RECORDINGS_SHELF})
        # The id is matched in any case as the title is: people and tools write it lower-cased
        # (slugs, branch names, URLs) and a session may search without case, while no identifier
        # scheme tells two documents apart by case alone, so nothing but the probe is removed for
        # it. Not inside a longer word: HW-PRB-00071 is another document.
        self.phrases = [_phrase(probe.id), _phrase(probe.title)]
        self.probe_names = _Names([_Document.of(probe.path, named_alone=False, identifiers=[])])
        identifier = plan.identifier_re
        own = {m.group(0).casefold()
               for text in (probe.title, probe.task, *probe.answers, *probe.examines)
               for m in identifier.finditer(text)}
        self.key_names = _Names([
            _Document.of(k, named_alone=True, identifiers=[
                m.group(0) for m in identifier.finditer(PurePosixPath(k).name)
                if m.group(0) and m.group(0).casefold() not in own])
            for k in self.answer_keys
        ])

    def names_probe(self, f: _File) -> bool:
        return any(p.search(f.folded) for p in self.phrases) or bool(self.probe_names.lines(f))

    def names_answer_key(self, f: _File) -> bool:
        return bool(self.key_names.lines(f))

    def why_path_removed(self, rel: str) -> str | None:
        for shelf in self.shelves:
            if shelf != "." and _under(rel, shelf):
                return f"on the probe shelf {shelf}/"
        if rel in self.answer_keys:
            return "an answer key of the probe"
        return None

    def why_content_removed(self, f: _File) -> str | None:
        if self.names_probe(f) and (_under(f.rel, "docs") or f.rel not in self.folds):
            return "names the probe"
        return None

    def why_removed(self, f: _File) -> str | None:
        return self.why_path_removed(f.rel) or self.why_content_removed(f)

    def why_link_removed(self, target: str, removed: dict[str, str], components: frozenset[str]) -> str | None:
        """Why a link that leads to the corpus path ``target`` goes, or None."""
        if target == self.probe.path:
            return "a link to the probe"
        if target in self.answer_keys:
            return "a link to an answer key of the probe"
        if _under(target, ".git"):
            return "a link into .git, which is never copied"
        for shelf in self.shelves:
            if shelf != "." and _under(target, shelf):
                return f"a link into the probe shelf {shelf}/"
        if target in removed:
            return f"a link to {target}, which is removed ({removed[target]})"
        if _arm_removes(target, components):
            return f"a link to {target}, which is removed (removed by the {self.arm} arm)"
        return None

    def strip_answer_key_lines(self, f: _File) -> bytes:
        spans = self.key_names.lines(f)
        return f.without(spans) if spans else f.data


def _arm_removes(rel: str, components: frozenset[str]) -> bool:
    if SKILLS in components and _under(rel, ".claude/skills"):
        return True
    if HOOKS in components and _under(rel, ".claude/hooks"):
        return True
    if CLAUDE_MD in components and (PurePosixPath(rel).name in _CLAUDE_MD_NAMES):
        return True
    if MCP in components and rel == ".mcp.json":
        return True
    return False


def _drop_hooks(path: Path, rel: str) -> None:
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SealError(f"{rel} is not valid JSON, so its hooks cannot be removed for this arm: {e}") from None
    if isinstance(settings, dict) and "hooks" in settings:
        del settings["hooks"]
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _declared_mcp_servers(workspace: Path) -> list[str]:
    path = workspace / ".mcp.json"
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SealError(f".mcp.json is not valid JSON: {e}") from None
    servers = data.get("mcpServers", {}) if isinstance(data, dict) else {}
    return sorted(servers) if isinstance(servers, dict) else []


def seal(corpus: Path, plan: Plan, probe: Probe, arm: str, dest: Path) -> SealedWorkspace:
    """Copy ``corpus`` into the empty directory ``dest`` sealed for (probe, arm).

    Raises SealError, with every offending path named, where the result would still let the
    session read the probe or one of its answers.
    """
    corpus = corpus.resolve()
    if not corpus.is_dir():
        raise UserError(f"corpus {corpus} is not a directory")
    config = load_probe_config(corpus)
    sealer = _Sealer(corpus, plan, probe, arm, config)
    components = ARM_COMPONENTS[arm]
    dest.mkdir(parents=True, exist_ok=False)
    result = SealedWorkspace(path=dest, arm=arm, manifest={})

    files, links = _corpus_entries(corpus)
    for rel in files:
        src = corpus / rel
        target = dest / rel
        f = _File(rel, src.read_bytes())
        why = sealer.why_removed(f)
        if why is None and _arm_removes(rel, components):
            why = f"removed by the {arm} arm"
        if why is not None:
            result.removed[rel] = why
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        stripped = sealer.strip_answer_key_lines(f)
        if stripped != f.data:
            result.removed[rel + "#lines"] = "lines naming an answer key"
        target.write_bytes(stripped)
        shutil.copystat(src, target)

    # Links after the files, so a link to a file sealing removed goes too. Each is written as a
    # relative link to its final target (a chain and an absolute target inside the corpus made
    # relative): it then leads into the sealed workspace, never back to the corpus.
    for rel in links:
        src = corpus / rel
        resolved = _check_link(corpus, src)
        target_rel = resolved.relative_to(corpus).as_posix()
        why = sealer.why_path_removed(rel)
        if why is None and _arm_removes(rel, components):
            why = f"removed by the {arm} arm"
        if why is None:
            why = sealer.why_link_removed(target_rel, result.removed, components)
        if why is None and resolved.is_file():  # the link is a path of its own: the file rule
            why = sealer.why_content_removed(_File(rel, resolved.read_bytes()))
        if why is not None:
            result.removed[rel] = why
            continue
        if resolved.is_dir():
            (dest / target_rel).mkdir(parents=True, exist_ok=True)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(resolved, src.parent), dest / rel)

    if HOOKS in components:
        for rel in _SETTINGS_FILES:
            if (dest / rel).is_file():
                _drop_hooks(dest / rel, rel)

    problems = []
    for dirpath, _, filenames in os.walk(dest):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(dest).as_posix()
            if full.is_symlink() and not full.exists():
                continue
            f = _File(rel, full.read_bytes())
            if not full.is_symlink():
                result.manifest[rel] = digest.of_bytes(f.data)
            if sealer.names_answer_key(f):
                problems.append(f"{rel} still names an answer key")
            if rel in sealer.folds and sealer.names_probe(f):
                result.folds_kept.append(rel)
                stated = _stated_answer(f.text, probe.answers)
                if stated is not None:
                    problems.append(f"{rel} is a fold but states the answer {stated!r}")
            elif sealer.names_probe(f):
                problems.append(f"{rel} still names the probe")
    if problems:
        raise SealError(f"cannot seal the workspace for {probe.id} ({arm}): " + "; ".join(sorted(problems)))
    result.manifest = dict(sorted(result.manifest.items()))
    result.folds_kept.sort()
    result.mcp_servers = _declared_mcp_servers(dest)
    return result
