"""The paths a session's Bash calls name, resolved as the shell resolves them.

"The transcript also counts the paths outside the workspace that the session named." A word of
a command is a path only as the shell reads it, so the command is parsed by a shell parser
(bashlex, a port of bash's own grammar) rather than split by patterns:

- a ``~`` is the home directory only where the shell expands it (unquoted, at a word's start or
  after an assignment's ``=``); ``'~/x'`` is a relative path to a directory named ``~``;
- a relative path is read against the shell's working directory, which ``cd`` and ``pushd``
  move within the command (``cd docs && cat ../CLAUDE.md`` names a file inside). A subshell, a
  pipeline's parts, a command or process substitution, and a function's body have their own;
- a harness that keeps one shell's working directory across the session's Bash calls
  (``Tools.shell_keeps_cwd``) keeps it while it stays in the workspace and puts it back there
  after a call that leaves it; a subagent's calls start where the session's shell is and move
  nothing for the next call;
- the target of ``ln -s TARGET LINK`` is read against the link's directory, as the kernel reads
  a relative link;
- a here-document's body is text, not a command ("The body of a heredoc is text and not a
  command, so a path in it does not count"), and a word that a variable or a command
  substitution makes is not read ("The grader expands nothing").

Where bashlex cannot read a command (arithmetic, ``case``, ``[[ ]]``: parts of bash it does not
implement), its words as the standard library's shlex splits them are read against the
working directory the command started in.
"""

from __future__ import annotations

import posixpath
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import bashlex
import bashlex.errors

HOME = "~"  # the home directory: where it is, the stream does not say, and it is outside the workspace

# A quoted here-document delimiter (<<'EOF', <<"EOF", <<\EOF), which bashlex 0.18 fails to match
# against its closing line: the quotes are blanked (the body is never read, so whether it would
# have been expanded does not matter), keeping every position of the command.
_QUOTED_HEREDOC = re.compile(r"<<(-?)([ \t]*)(?:'([^'\n]*)'|\"([^\"\n]*)\"|\\([^\s;&|<>()]+))")
# An option's or an assignment's ``name=`` before the path it holds.
_NAME_EQUALS = re.compile(r"-{0,2}[A-Za-z_][\w.-]*=")
_EXPANDS = frozenset({"parameter", "commandsubstitution", "processsubstitution"})
_SYMBOLIC = re.compile(r"--symbolic|-[a-zA-Z]*s[a-zA-Z]*")


def _blank_heredoc_quotes(command: str) -> str:
    def blank(m: re.Match[str]) -> str:
        word = m.group(3) if m.group(3) is not None else m.group(4) if m.group(4) is not None else m.group(5)
        quoted = m.group(0)[2 + len(m.group(1)) + len(m.group(2)):]
        pad = " " * (len(quoted) - len(word))
        return f"<<{m.group(1)}{m.group(2)}{word}{pad}" if m.group(5) is None else f"<<{m.group(1)}{m.group(2)} {word}"
    return _QUOTED_HEREDOC.sub(blank, command)


def _under_home(rest: str) -> str:
    normal = posixpath.normpath("/" + rest)
    return HOME if normal == "/" else HOME + normal


@dataclass
class _Shell:
    cwd: str  # absolute and normal, or under HOME
    old: str  # cd -'s directory

    def sub(self) -> _Shell:
        return _Shell(self.cwd, self.old)

    def resolve(self, path: str) -> str:
        """An absolute, lexically normal path, or one under HOME."""
        if path == HOME or path.startswith(HOME + "/"):
            return _under_home(path[len(HOME):])
        if not path.startswith("/") and self.cwd.startswith(HOME):
            return _under_home(self.cwd[len(HOME):] + "/" + path)
        normal = posixpath.normpath(path if path.startswith("/") else self.cwd + "/" + path)
        return "/" + normal.lstrip("/")  # POSIX keeps a leading "//", which Linux reads as "/"

    def cd(self, target: str | None) -> None:
        if target == "-":
            self.cwd, self.old = self.old, self.cwd
            return
        new = HOME if target is None else self.resolve(target)
        self.cwd, self.old = new, self.cwd


@dataclass
class Named:
    """A path a command names: as the session wrote it, and where the shell would find it."""

    text: str
    resolved: str  # absolute and lexically normal, or starting with HOME


@dataclass
class Session:
    """The shell of one session's Bash calls: ``named(command)`` gives the paths a call names and
    moves the working directory as the CLI keeps it between calls."""

    workspace: str
    inside: Callable[[str], bool]  # whether a resolved path lies in the workspace
    keeps_cwd: bool  # the harness keeps the working directory from one call to the next (else each starts at the workspace)
    cwd: str = ""
    _found: list[Named] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.cwd = self.cwd or posixpath.normpath(self.workspace)

    def named(self, command: str, subagent: bool = False, parse: bool = False) -> list[Named]:
        """``parse``: bashlex reads the command even where its words are plain (see _PLAIN)."""
        shell = _Shell(self.cwd, self.cwd)
        self._found = []
        words = _plain(command) if not parse else None
        if words is not None:
            self._read(words, shell, tilde=False)
        else:
            if "<<" in command:
                command = _blank_heredoc_quotes(without_heredoc_bodies(command, closed=True))
            try:
                for tree in bashlex.parse(command):
                    self._walk(tree, command, shell)
            except (bashlex.errors.ParsingError, NotImplementedError, AttributeError, IndexError, TypeError, ValueError,
                    RecursionError, AssertionError, KeyError):
                self._found, shell = [], _Shell(self.cwd, self.cwd)  # what a walk cut short found or moved, undone
                self._read(_tokens(command), shell, tilde=True)
        if not subagent and self.keeps_cwd:
            # it puts a shell that left the workspace back at the workspace after the call
            self.cwd = shell.cwd if self.inside(shell.cwd) else posixpath.normpath(self.workspace)
        return self._found

    def path(self, text: str) -> Named:
        """A path a tool's input names, read against the shell's working directory."""
        return Named(text, _Shell(self.cwd, self.cwd).resolve(text))

    # --- bashlex's tree ---

    def _walk(self, node: Any, source: str, shell: _Shell) -> None:
        kind = node.kind
        if kind == "list":
            for i, part in enumerate(node.parts):  # a part put in the background runs in a subshell
                background = i + 1 < len(node.parts) and getattr(node.parts[i + 1], "op", None) == "&"
                self._walk(part, source, shell.sub() if background else shell)
        elif kind == "pipeline":
            parts = [p for p in node.parts if p.kind != "pipe"]
            for part in parts:  # each part of a pipeline runs in a subshell of its own
                self._walk(part, source, shell.sub() if len(parts) > 1 else shell)
        elif kind == "compound":
            opening = node.list[0] if node.list else None
            inner = shell.sub() if opening is not None and getattr(opening, "word", "") == "(" else shell
            for part in node.list:
                self._walk(part, source, inner)
            for r in getattr(node, "redirects", []) or []:
                self._walk(r, source, shell)
        elif kind in ("if", "for", "while", "until"):
            for part in node.parts:
                if part.kind == "word":
                    self._word(part, source, shell)
                else:
                    self._walk(part, source, shell)
        elif kind == "function":
            self._walk(node.body, source, shell.sub())
        elif kind == "command":
            self._command(node, source, shell)
        elif kind in ("commandsubstitution", "processsubstitution"):
            self._walk(node.command, source, shell.sub())
        elif kind == "redirect":
            # a here-document's delimiter is no path; a here-string is a word like any other (the
            # grader reads every word "whatever command the word goes to"); a target is a path
            if node.type not in ("<<", "<<-") and not isinstance(node.output, int) and node.output.kind == "word":
                self._word(node.output, source, shell, always=node.type != "<<<")
        elif kind == "word":
            self._word(node, source, shell)
        elif kind == "assignment":
            self._substitutions(node, source, shell)
            self._candidate(node.word, source[node.pos[0]:node.pos[1]], shell, node)

    def _substitutions(self, node: Any, source: str, shell: _Shell) -> None:
        for part in getattr(node, "parts", []) or []:
            if part.kind in ("commandsubstitution", "processsubstitution"):
                self._walk(part.command, source, shell.sub())

    def _command(self, node: Any, source: str, shell: _Shell) -> None:
        words = [p for p in node.parts if p.kind == "word"]
        while words and _ASSIGNMENT.match(words[0].word):  # bashlex reads X=1 after a redirection as a word: bash does not
            words = words[1:]
        name, args = (words[0].word, words[1:]) if words else ("", [])
        linked = self._link_targets(args, source, shell) if name == "ln" and any(_SYMBOLIC.fullmatch(a.word) for a in args) else {}
        for part in node.parts:
            if id(part) in linked:
                self._found.append(linked[id(part)])
            else:
                self._walk(part, source, shell)
        if name in ("cd", "pushd"):
            operands = [a for a in args if a.word == "-" or not a.word.startswith("-")]
            if not operands:
                shell.cd(None)
            elif not self._expands(operands[0]):
                shell.cd(self._tilde(operands[0]))

    def _link_targets(self, words: list[Any], source: str, shell: _Shell) -> dict[int, Named]:
        """``ln -s TARGET... LINK|DIR``: a relative target is read against the link's directory
        (the kernel's rule), so it names the path it leads to from there, not from the shell's."""
        operands = [w for w in words if not w.word.startswith("-") and not self._expands(w)]
        if len(operands) < 2:
            return {}
        *targets, last = operands
        link = shell.resolve(self._tilde(last))
        where = link if len(targets) > 1 or last.word.endswith("/") else posixpath.dirname(link)
        found = {}
        for t in targets:
            text = self._tilde(t)
            if not text.startswith(("/", HOME)):
                found[id(t)] = Named(t.word, _Shell(where, where).resolve(text))
        return found

    @staticmethod
    def _expands(word: Any) -> bool:
        return any(p.kind in _EXPANDS for p in getattr(word, "parts", []) or [])

    @staticmethod
    def _tilde(word: Any) -> str:
        """The word's text, with a leading ``~`` that the shell expands as HOME (``~user`` is
        another home: HOME too); a quoted one is a directory's name."""
        text: str = word.word
        if any(p.kind == "tilde" and p.pos[0] == word.pos[0] for p in getattr(word, "parts", []) or []):
            _, sep, rest = text.partition("/")
            return HOME + sep + rest
        return "./" + text if text.startswith("~") else text

    def _word(self, word: Any, source: str, shell: _Shell, always: bool = False) -> None:
        self._substitutions(word, source, shell)
        if self._expands(word):
            return
        self._candidate(word.word, source[word.pos[0]:word.pos[1]], shell, word, always)

    def _candidate(self, text: str, raw: str, shell: _Shell, node: Any, always: bool = False) -> None:
        if _NAME_EQUALS.match(text) and (rm := _NAME_EQUALS.match(raw)):
            tilde = raw[rm.end():].startswith("~")  # unquoted after the = (assignments expand it)
        else:
            tilde = any(p.kind == "tilde" and p.pos[0] == node.pos[0] for p in getattr(node, "parts", []) or [])
        self._consider(text, tilde, shell, always)

    def _consider(self, text: str, tilde: bool, shell: _Shell, always: bool = False) -> None:
        """A word that is a path: absolute, under ``~``, ``..``, or relative with a ``/`` (a
        redirection's target is a path whatever it holds); an option's or assignment's value.
        ``tilde``: a leading ``~`` of the path is the shell's (unquoted)."""
        m = _NAME_EQUALS.match(text)
        value = text[m.end():] if m else text
        if not value or not (always or "/" in value or value == ".." or value.startswith("~")):
            return
        if value.startswith("~"):
            _, sep, rest = value.partition("/")
            value = HOME + sep + rest if tilde else "./" + value
        self._found.append(Named(text[m.end():] if m else text, shell.resolve(value)))

    # --- words and operators: a plain command, or one bashlex cannot read ---

    def _read(self, tokens: list[str], shell: _Shell, tilde: bool) -> None:
        """Words and operators in order: a redirection's target is a path; a command's ``cd`` or
        ``pushd`` moves the directory for the commands after it, unless a pipeline or ``&`` puts
        it in a subshell; what opens a subshell (``(``) is not followed. ``tilde``: a word's
        leading ``~`` is the home directory (the words' quoting is not known)."""
        start, target, piped = True, False, False
        name, operand = "", None

        def end(operator: str) -> None:
            nonlocal start, piped, name, operand
            if name in ("cd", "pushd") and not piped and operator not in ("|", "|&", "&"):
                shell.cd(operand)
            start, piped, name, operand = True, operator in ("|", "|&"), "", None

        for token in tokens:
            if _DUPLICATE.fullmatch(token):  # 2>&1: no target
                continue
            if token and all(c in _OPERATORS for c in token.lstrip("0123456789")) and not token.isdigit():  # \n too
                if token.lstrip("0123456789").startswith((">", "<")) or token.startswith("&>"):
                    target = token != "<<<"
                else:
                    end(token)
                continue
            home = tilde and token.startswith("~")
            if target:
                self._consider(token, home, shell, always=True)
                target = False
                continue
            if start and _ASSIGNMENT.match(token):
                self._consider(token, False, shell)
                continue
            if start:
                start, name = False, token
            elif name in ("cd", "pushd") and operand is None and (token == "-" or not token.startswith("-")):
                operand = HOME + token[1:] if home else "./" + token if token.startswith("~") else token
            self._consider(token, home, shell)
        end("")


# A command the shell reads as words and operators alone: no escape, expansion, unquoted ``~``,
# grouping or comment, no double quotes around a ``$``, backtick, backslash or ``!`` (bashlex gives
# the same for it, held by tests/unit/test_shell_paths.py); it is read without bashlex, whose
# parser costs a millisecond a command in Python, twice what the rest of a session's transform
# costs per call.
_QUOTED = "'[^']*'|\"[^\"$`\\\\!]*\""
_PLAIN = re.compile(r"(?:[\w./:,+@%=*?^ \t\n|;&<>\[\]-]|" + _QUOTED + ")*")
_PLAIN_TOKEN = re.compile(r"\d*[<>]&(?:\d+|-)|\d*(?:>>|<>|>\||[<>])|&>>?|&&|\|\||\|&|[|;&\n]|(?:[^\s|;&<>'\"]+|" + _QUOTED + ")+")
_QUOTES = re.compile(_QUOTED)


def _plain(command: str) -> list[str] | None:
    """The words (unquoted) and operators of a plain command (here-documents aside: a body is
    text and a delimiter no path), or None where bashlex must read it (see _PLAIN; ``ln``, whose
    link targets it reads)."""
    if "<<" in command:
        if "<<<" in command:
            return None
        command = _HEREDOC.sub(" ", without_heredoc_bodies(command))
    if not _PLAIN.fullmatch(command):
        return None
    words = [_QUOTES.sub(lambda q: q.group(0)[1:-1], w) if "'" in w or '"' in w else w for w in _PLAIN_TOKEN.findall(command)]
    return None if "ln" in words else words
_DUPLICATE = re.compile(r"\d*[<>]&(?:\d+|-)")
_ASSIGNMENT = re.compile(r"[A-Za-z_]\w*=")
_OPERATORS = "();<>|&\n"  # what shlex is told are operators


def _tokens(command: str) -> list[str]:
    """Words and operators as the standard library's shlex reads them (a line break is an
    operator, a comment runs to the end of its line), or the words split on white space where it
    refuses the command (an open quote)."""
    lexer = shlex.shlex(command, posix=True, punctuation_chars=_OPERATORS)
    lexer.whitespace, lexer.whitespace_split = " \t\r", True
    try:
        return list(lexer)
    except ValueError:
        return command.split()


_HEREDOC = re.compile(r"<<-?[ \t]*(?:'([^'\n]*)'|\"([^\"\n]*)\"|\\?([^\s;&|<>()'\"]+))")
# What can change how the scan reads on: a line break, a quote, an escape, a comment, arithmetic
# (``$((`` or ``((`` ... ``))``, where ``<<`` is a shift) and ``<<`` itself.
_SCAN = re.compile(r"[\n'\"\\#]|\$?\(\(|\)\)|<<")


def without_heredoc_bodies(command: str, closed: bool = False) -> str:
    """The command without the bodies of its here-documents (from the line after ``<<WORD`` to
    the line that is WORD, leading tabs too for ``<<-``); a body never closed runs to the end.
    ``<<`` counts only where the shell reads it as an operator: not inside quotes, a comment or
    arithmetic, and not as ``<<<`` (a here-string, which has no body). ``closed``: each body's
    closing line is kept (an empty here-document), so that a parser still reads the command; a
    parser reads a body a character at a time, and a session's heredoc bodies are long."""
    out: list[str] = []
    pending: list[tuple[str, bool]] = []
    quote = ""
    arithmetic = 0
    i, n, kept = 0, len(command), 0
    while (m := _SCAN.search(command, i)) is not None:
        token, i = m.group(0), m.end()
        if quote == "'":
            quote = "" if token == "'" else quote
        elif quote == '"':
            if token == "\\":
                i += 1
            elif token == '"':
                quote = ""
        elif token == "\n":
            if pending:
                out.append(command[kept:i])
                for word, strip_tabs in pending:  # the bodies, in the order they were opened
                    while i < n:
                        end = command.find("\n", i)
                        line, i = (command[i:], n) if end < 0 else (command[i:end], end + 1)
                        if (line.lstrip("\t") if strip_tabs else line) == word:
                            break
                    if closed:
                        out.append(word + "\n")
                pending, kept = [], i
        elif token == "\\":
            i += 1
        elif token in ("'", '"'):
            quote = token
        elif token == "#":
            if m.start() == 0 or command[m.start() - 1] in " \t\n;&|(":
                end = command.find("\n", i)
                i = n if end < 0 else end  # the line break itself is read next
        elif token.endswith("(("):
            arithmetic += 1
        elif token == "))":
            arithmetic = max(0, arithmetic - 1)
        elif not arithmetic:  # <<
            if command.startswith("<", i):
                i += 1  # <<<: a here-string
            elif (h := _HEREDOC.match(command, m.start())) is not None:
                pending.append((h.group(1) or h.group(2) or h.group(3) or "", h.group(0).startswith("<<-")))
                i = h.end()
    out.append(command[kept:])
    return "".join(out)


