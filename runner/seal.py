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
   A shelf, an answer key or the probe declared through a link (``docs/notes -> ../notes-src``)
   is resolved through the corpus's links: its declared path and its real corpus path both go,
   with every link leading to either, and a line naming either names it.
4. Every file that names the probe goes: its id or its title, case-folded, with any run of white
   space between the words (a line break included, and a Markdown or comment line prefix such as
   ``>``, ``#``, ``-``, ``//`` after it: only after a line feed, so ``status | of`` or ``status -
   of`` on one line is not the title), not inside a longer word; or a reference to its path.
   Outside ``docs/`` a file stays when ``folds:`` declares it. ``.headwater/probe.yml`` itself
   names the probe's answer keys, so it goes with them unless folded.
5. Links are copied as links, relative, to the same corpus path, so each leads into the sealed
   workspace and never back to the corpus; a link to a directory too. A link goes, with the
   reason in ``removed``, when its own path would go (a shelf, an answer key, the arm), or when
   it leads to the probe, an answer key, a probe shelf, ``.git`` or a file sealing removed.
6. The arm removes what it measures (see ARM_COMPONENTS), decided on each file's path as the
   session sees it and on its real path. Through a link to a directory a file keeps its name, so
   ``CLAUDE.md`` goes wherever it is reached from, and ``.mcp.json`` is only ever the top-level
   path (a link there goes as its own path). The directories ``.claude/skills`` and
   ``.claude/hooks`` are different: a linked ``.claude`` would show the session, under them,
   files whose real path is elsewhere. So under an arm that removes skills or hooks, a link to a
   directory that is an ancestor of them (``.claude -> config/claude``) is not copied as a link
   but materialised: what it leads to is copied under the link's path as a directory of its
   own, each file through every rule here (the arm on the path the session sees), its links as
   links. Materialised rather than refused, so a corpus keeping its ``.claude`` elsewhere can be
   measured under every arm, the arm removing exactly what it removes from a real ``.claude``;
   the target stays at its real path, where the session does not load it as skills or hooks.
   Under an arm that removes nothing there the link stays a link.
7. The result is checked: a file other than a fold that still names the probe or an answer key,
   a fold that states an answer (see ``_stated_answer``) or names an answer key, a file whose
   path or real path is an answer key, lies on a probe shelf or is one the arm removes (and any
   ``.claude/skills``, ``.claude/hooks``, ``.mcp.json`` the arm removes, reached through links
   or not), or a link leading out of the corpus refuses the workspace. The session then does
   not run.

A *reference* to a document is a path token or a Markdown link target (inline ``[t](target
"title")``, ``<angle brackets>``, a reference definition ``[id]: target``, an HTML attribute)
that, with its ``#fragment`` and ``?query`` cut, percent-decoded and with ``.``/``..``
normalised, resolves to the document (or to its path without the suffix) from the file's own
directory or from the corpus root, or that ends in ``/`` and the document's corpus path (a URL,
an absolute path). A token is bounded by the start or end of the line, white space, quotes,
``()[]{}<>,;:|`*!=@``, and at its end also ``#``, ``?`` or a sentence's period (one the end of
the line or a boundary follows); ``_`` and ``~`` bound it only as emphasis (``_name_``), since
they occur inside file names; ``/`` before a name makes the whole path the token, which must
then resolve. A name after a token's first ``#`` or ``?`` is in its fragment or query: the path
before it decides (each line is tokenised once, so sealing is linear in a line's length). So
``notstatus-answer.md``, ``my_status-answer.md``, ``status-answer.md.bak`` and
``other/status-answer.md`` do not name ``docs/notes/status-answer.md``. Paths and file names are compared case-sensitively, as the
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import TypedDict
from urllib.parse import unquote

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from runner import digest, harnesses
from runner.answer import stated
from runner.errors import SealError, UserError, format_validation_error
from runner.plan import Plan, Probe, parse_document

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


class SealRecord(TypedDict):
    """A session's ``seal.json``: what sealing left and why (the transform reads it)."""

    arm: str
    manifest: dict[str, str]
    views: dict[str, str]
    removed: dict[str, str]
    folds_kept: list[str]
    mcp_servers: list[str]


@dataclass
class SealedWorkspace:
    """What sealing produced: the workspace and the facts the transform needs about it."""

    path: Path
    arm: str
    manifest: dict[str, str]  # relative path -> digest of the bytes the session starts with
    removed: dict[str, str] = field(default_factory=dict)  # relative path -> why
    folds_kept: list[str] = field(default_factory=list)
    mcp_servers: list[str] = field(default_factory=list)  # servers the workspace's .mcp.json declares
    # relative path -> digest of the CLI's view of the document (Harness.read_view), for the few
    # whose view is not their bytes (CRLF line ends, a byte-order mark, invalid UTF-8): the
    # transform tells by it which document a whole read of one of them saw
    views: dict[str, str] = field(default_factory=dict)

    def record(self) -> SealRecord:
        return {
            "arm": self.arm,
            "manifest": self.manifest,
            "views": self.views,
            "removed": self.removed,
            "folds_kept": self.folds_kept,
            "mcp_servers": self.mcp_servers,
        }


def _corpus_entries(corpus: Path, expand: Callable[[str], bool] = lambda rel: False) -> tuple[list[tuple[str, str]], list[str]]:
    """The corpus's regular files, each as (its path, its real path), and its links (to files
    and to directories), ``.git`` left out.

    A link to a directory is not descended into: it is returned as a link, so it is copied or
    removed with a reason, never lost; except where ``expand(path)`` says so (a linked
    ``.claude`` the arm removes from, see ``_materialised``): that link is walked as the
    directory it leads to, and what it holds is returned under the link's path, with its real
    path beside it.
    """
    real_corpus = corpus.resolve()
    files, links = [], []
    stack = [(corpus, "", False)]
    while stack:
        directory, rel_dir, through_link = stack.pop()
        with os.scandir(directory) as it:
            entries = sorted(it, key=lambda e: e.name)
        for entry in entries:
            rel = f"{rel_dir}/{entry.name}" if rel_dir else entry.name
            full = Path(entry.path)
            if rel == ".git":  # the history, or a worktree's gitdir pointer
                continue
            if entry.is_symlink():
                target = _check_link(corpus, full)
                if target.is_dir() and expand(rel):
                    stack.append((full, rel, True))
                else:
                    links.append(rel)
                continue
            real = rel
            if through_link:
                real = Path(os.path.realpath(full)).relative_to(real_corpus).as_posix()
                if _under(real, ".git"):
                    continue
            if entry.is_dir():
                stack.append((full, rel, through_link))
            elif not entry.is_file():
                raise SealError(f"corpus file {rel} is not a regular file")
            else:
                files.append((rel, real))
    return sorted(files), sorted(links)


def _real_path(corpus: Path, rel: str) -> str | None:
    """The corpus path ``rel`` leads to through the corpus's links (it need not exist), or None
    outside the corpus."""
    real = Path(os.path.realpath(corpus / rel))
    if not real.is_relative_to(corpus):
        return None
    return real.relative_to(corpus).as_posix()


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
# comment markers, mixed with white space ("> - ", ">x"). Only after a line feed: on one line,
# "status | of" or "status - of" is not the title.
_LINE_PREFIX = r"[>#*+\-|;%/]"
_SPACE = r"[^\S\n]"  # white space that is not a line break (a lone CR, VT, FF: module docstring)
_GAP = rf"(?:{_SPACE}+|{_SPACE}*(?:\n(?:{_SPACE}|{_LINE_PREFIX})*)+)"
_NOT_AFTER_ALNUM = r"(?<![^\W_])"
_NOT_BEFORE_ALNUM = r"(?![^\W_])"
_ANGLE_TARGET = re.compile(r"<([^<>\n]+)>")
_BOUNDARY_RE = re.compile("[\\s" + re.escape("".join(sorted(_BOUNDARY))) + "]")
_CUT_RE = re.compile(r"[#?]")
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
    or a sentence's period, one the end or a boundary follows (``.bak`` is a longer name, and
    ``./`` goes on with the path)."""
    if j == len(line):
        return True
    c = line[j]
    if _is_boundary(c) or c in "#?":
        return True
    return c == "." and (j + 1 == len(line) or _is_boundary(line[j + 1]))


def _ends_token(line: str, j: int) -> bool:
    if j < len(line) and line[j] in _EMPHASIS:  # closing emphasis: ``_status-answer_``
        while j < len(line) and line[j] in _EMPHASIS:
            j += 1
    return _closes_token(line, j)


class _Tokens:
    """Where the token before a position starts, and where its path part ends (its first ``#``
    or ``?``), for positions asked in increasing order: one pass over a line however many names
    it holds. (A scan back from each name to the token's start was quadratic on a long token,
    ``a/x.md#a/x.md#…``: ``#`` and ``?`` end a token but do not start one.)"""

    __slots__ = ("line", "pos", "begin", "cut", "resolved")

    def __init__(self, line: str):
        self.line, self.pos, self.begin, self.cut = line, 0, 0, -1
        self.resolved: dict[int, bool] = {}  # a token's start -> whether its path part resolves

    def before(self, i: int) -> tuple[int, int]:
        """(start of the token that ``line[i - 1]`` is in, its first ``#``/``?`` before ``i`` or -1)."""
        if i > self.pos:
            last = None
            for last in _BOUNDARY_RE.finditer(self.line, self.pos, i):  # noqa: B007  (the last match is kept)
                pass
            if last is not None:
                self.begin, self.cut = last.end(), -1
            if self.cut < 0:
                m = _CUT_RE.search(self.line, max(self.begin, self.pos), i)
                if m is not None:
                    self.cut = m.start()
            self.pos = i
        return self.begin, self.cut


def _token_start(line: str, i: int, tokens: _Tokens) -> int | None:
    """Where the token holding a name that starts at ``i`` starts: ``i`` when the name stands
    alone, the start of its path when ``/`` precedes it, None when it is inside a longer word."""
    if i == 0 or _is_boundary(line[i - 1]):
        return i
    c = line[i - 1]
    if c == "/":
        return tokens.before(i)[0]
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
    def of(cls, path: str, named_alone: bool, identifiers: list[str]) -> _Document:
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
                tokens = _Tokens(text)
                i = text.find(anchor)
                while i >= 0:
                    j = i + len(anchor)
                    start = _token_start(text, i, tokens) if _ends_token(text, j) else None
                    if start == i:
                        if anchor in self.alone:
                            return True
                        if anchor in self.resolvable_alone and self.resolves(anchor, rel_dir, from_root=False):
                            return True
                    elif start is not None:
                        cut = tokens.before(i)[1]
                        if cut < 0:  # a token ends here: each is looked at once
                            if self.resolves(text[start:j], rel_dir):
                                return True
                        else:  # a name in the fragment or query: the path part decides, once
                            if start not in tokens.resolved:
                                tokens.resolved[start] = self.resolves(text[start:cut], rel_dir)
                            if tokens.resolved[start]:
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

    def lines(self, f: _File) -> list[tuple[int, int]]:
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
    to every line (``answer.stated`` on each line: the set of its words is the set of one
    answer's words, in any order) and also to the sentences around it: a run of consecutive
    words (across line breaks; edge punctuation such as ``**``, backticks or a colon cut off)
    whose words are one answer's words. "The answer is current HW-DR-0052" states the answer to
    anyone who reads it though it is not the answer form; "concurrent HW-DR-0052s" does not,
    which the substring test this replaces got wrong, and "HW-DR-0052 current" does, which it
    missed.
    """
    for line in text.split("\n"):
        if (found := stated(line, answers)) is not None:
            return found
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
        # Answer keys, shelves and the probe as declared and as their real corpus paths: a
        # declared path may run through a linked directory, while the corpus is walked (and
        # links are compared) by real paths.
        declared_keys = [posixpath.normpath(k) for k in config.answer_keys.get(probe.id, [])]
        self.answer_keys = self._with_real(declared_keys)
        self.shelves = sorted(s for s in self._with_real(
            [PurePosixPath(p.path).parent.as_posix() for p in plan.probes] + [RECORDINGS_SHELF]) if s != ".")
        self.probe_paths = self._with_real([probe.path])
        # The id is matched in any case as the title is: people and tools write it lower-cased
        # (slugs, branch names, URLs) and a session may search without case, while no identifier
        # scheme tells two documents apart by case alone, so nothing but the probe is removed for
        # it. Not inside a longer word: HW-PRB-00071 is another document.
        self.phrases = [_phrase(probe.id), _phrase(probe.title)]
        self.probe_names = _Names([_Document.of(p, named_alone=False, identifiers=[]) for p in self.probe_paths])
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

    def _with_real(self, paths: list[str]) -> list[str]:
        out = set(paths)
        for p in paths:
            real = _real_path(self.corpus, p)
            if real is not None and real != ".":
                out.add(real)
        return sorted(out)

    def names_probe(self, f: _File) -> bool:
        return self.path_names_probe(f.rel) or any(p.search(f.folded) for p in self.phrases) or bool(self.probe_names.lines(f))

    def path_names_probe(self, rel: str) -> bool:
        """"every file that names the probe": a path names it as much as a line does, by the id or
        the title in any of its components (docs/notes/HW-PRB-0399-followup.md), read by the
        line's own rule (so a slug, its words joined by punctuation, is not the title)."""
        folded = rel.casefold()
        return any(p.search(folded) for p in self.phrases)

    def names_answer_key(self, f: _File) -> bool:
        return self.path_names_answer_key(f.rel) or bool(self.key_names.lines(f))

    def why_path_removed(self, rel: str) -> str | None:
        for shelf in self.shelves:
            if _under(rel, shelf):
                return f"on the probe shelf {shelf}/"
        if rel in self.answer_keys:
            return "an answer key of the probe"
        if self.path_names_answer_key(rel):
            return "its path names an answer key"
        return None

    def path_names_answer_key(self, rel: str) -> bool:
        """A path names an answer key as a line would: a component that is the key's name or
        stem standing alone, or an identifier the key's name carries (a copy of the key kept
        under another directory, say)."""
        return bool(self.key_names.lines(_File("", "\n".join(rel.split("/")).encode())))

    def why_content_removed(self, f: _File) -> str | None:
        if self.names_probe(f) and (_under(f.rel, "docs") or f.rel not in self.folds):
            return "names the probe"
        return None

    def why_removed(self, f: _File) -> str | None:
        return self.why_path_removed(f.rel) or self.why_content_removed(f)

    def why_link_removed(self, target: str, removed: dict[str, str], components: frozenset[str]) -> str | None:
        """Why a link that leads to the corpus path ``target`` goes, or None."""
        if target in self.probe_paths:
            return "a link to the probe"
        if target in self.answer_keys:
            return "a link to an answer key of the probe"
        if _under(target, ".git"):
            return "a link into .git, which is never copied"
        for shelf in self.shelves:
            if _under(target, shelf):
                return f"a link into the probe shelf {shelf}/"
        if target in removed:
            return f"a link to {target}, which is removed ({removed[target]})"
        if _arm_removes(target, components):
            return f"a link to {target}, which is removed (removed by the {self.arm} arm)"
        return None

    def strip_answer_key_lines(self, f: _File) -> bytes:
        spans = self.key_names.lines(f)
        return f.without(spans) if spans else f.data


def _materialised(rel: str, components: frozenset[str]) -> bool:
    """Whether a link to a directory at ``rel`` is copied as a directory: where it is an ancestor
    of a directory the arm removes (a linked ``.claude`` under an arm without skills or hooks).
    As a link, the session would find the skills or hooks the arm removes through it."""
    return any(c in components and d.startswith(rel + "/") for c, d in harnesses.HARNESS.arm_files.directories.items())


def _arm_removes(rel: str, components: frozenset[str]) -> bool:
    files = harnesses.HARNESS.arm_files
    if any(c in components and _under(rel, d) for c, d in files.directories.items()):
        return True
    if CLAUDE_MD in components and (PurePosixPath(rel).name in files.memory_names):
        return True
    return MCP in components and rel == files.mcp_file


def _drop_hooks(path: Path, rel: str) -> None:
    try:
        settings = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SealError(f"{rel} is not valid JSON, so its hooks cannot be removed for this arm: {e}") from None
    if isinstance(settings, dict) and "hooks" in settings:
        del settings["hooks"]
        path.write_text(json.dumps(settings, indent=2) + "\n", encoding="utf-8")


def _declared_mcp_servers(workspace: Path) -> list[str]:
    name = harnesses.HARNESS.arm_files.mcp_file
    path = workspace / name
    if not path.exists():
        return []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as e:
        raise SealError(f"{name} is not valid JSON: {e}") from None
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

    files, links = _corpus_entries(corpus, lambda rel: _materialised(rel, components))
    for rel, real in files:
        src = corpus / rel
        target = dest / rel
        f = _File(rel, src.read_bytes())
        why = sealer.why_removed(f) or (sealer.why_path_removed(real) if real != rel else None)
        if why is None and (_arm_removes(rel, components) or _arm_removes(real, components)):
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
        if why is None:  # the link is a path of its own: the file rule (its name; a file's text too)
            why = sealer.why_content_removed(_File(rel, resolved.read_bytes() if resolved.is_file() else b""))
        if why is not None:
            result.removed[rel] = why
            continue
        if resolved.is_dir():
            (dest / target_rel).mkdir(parents=True, exist_ok=True)
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(resolved, src.parent), dest / rel)

    arm_files = harnesses.HARNESS.arm_files
    if HOOKS in components:
        for rel in arm_files.hook_settings:
            if (dest / rel).is_file():
                _drop_hooks(dest / rel, rel)

    problems = []
    real_dest = dest.resolve()
    for rel in sealer.answer_keys:
        if os.path.lexists(dest / rel):
            problems.append(f"the answer key {rel} is still there")
    for shelf in sealer.shelves:
        if os.path.islink(dest / shelf) or any(fs for _, _, fs in os.walk(dest / shelf)):
            problems.append(f"the probe shelf {shelf}/ is still there")
    for c, d in arm_files.directories.items():
        if c in components and os.path.lexists(dest / d):
            problems.append(f"{d} is still there under the {arm} arm")
    if MCP in components and os.path.lexists(dest / arm_files.mcp_file):
        problems.append(f"{arm_files.mcp_file} is still there under the {arm} arm")
    for dirpath, _, filenames in os.walk(dest):
        for name in filenames:
            full = Path(dirpath) / name
            rel = full.relative_to(dest).as_posix()
            if full.is_symlink() and not full.exists():
                continue
            real = rel  # os.walk does not follow links: only a link's real path differs
            if full.is_symlink():
                real = Path(os.path.realpath(full)).relative_to(real_dest).as_posix()
            for path in {rel, real}:
                if path in sealer.answer_keys:
                    problems.append(f"{rel} is the answer key {path}")
                elif any(_under(path, shelf) for shelf in sealer.shelves):
                    problems.append(f"{rel} lies on a probe shelf ({path})")
                elif _arm_removes(path, components):
                    problems.append(f"{rel} is still there under the {arm} arm")
            f = _File(rel, full.read_bytes())
            if not full.is_symlink():
                result.manifest[rel] = digest.of_bytes(f.data)
                if (view := harnesses.HARNESS.read_view(f.data)) != f.data:
                    result.views[rel] = digest.of_bytes(view)
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
