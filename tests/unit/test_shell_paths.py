"""The paths a session's Bash calls name, as the shell resolves them (issue 27, items 2 and 3).

"A path inside the workspace is written relative to it", and the transcript "counts the paths
outside the workspace that the session named". tests/integration/test_contract_fidelity_3.py
holds both through the real CLI; here every form is tried against bash itself.
"""

from __future__ import annotations

import posixpath
import re
import subprocess

import bashlex
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runner.transform.events import _Paths
from runner.transform.shell import Session, _blank_heredoc_quotes, without_heredoc_bodies

WS = "/workspace"


def inside(p: str) -> bool:
    return p == WS or p.startswith(WS + "/")


def outside_named(*commands: str, subagent: tuple[int, ...] = ()) -> list[list[str]]:
    """Per command, the paths it names outside the workspace, in one session's shell."""
    shell = Session(WS, inside, keeps_cwd=True)
    out = []
    for i, c in enumerate(commands):
        out.append([n.text for n in shell.named(c, subagent=i in subagent) if n.resolved.startswith("~") or not inside(n.resolved)])
    return out


@pytest.mark.parametrize("command, outside", [
    ("echo '~/notes' \"~/x\" ~/real", ["~/real"]),  # a quoted ~ is a directory named ~, not the home
    ("cat ~root/.profile", ["~root/.profile"]),
    ("X=~/y make", ["~/y"]),  # an assignment expands the ~ after its =
    ("cd docs && cat ../CLAUDE.md", []),  # ../CLAUDE.md from docs/ is the workspace's
    ("cd docs && cat ../../etc/x", ["../../etc/x"]),
    ("(cd docs) && cat ../x", ["../x"]),  # a subshell's cd stays in it
    ("cd docs | cat ../x", ["../x"]),  # so does a pipeline part's
    ("cd docs; cd ..; cat ./a.md ../up", ["../up"]),
    ("cd /tmp && cat x/y", ["/tmp", "x/y"]),  # x/y is /tmp/x/y
    ("cd && cat .bashrc/x", [".bashrc/x"]),  # cd alone goes home
    ("ln -s ../a.md docs/link", []),  # the target is read from the link's directory: docs/../a.md
    ("ln -s ../../etc/passwd docs/link", ["../../etc/passwd"]),
    ("ln -sf ../x.md ../y.md docs/", []),  # into a directory: each target from docs/
    ("ln -s ../x link", ["../x"]),  # from the workspace itself: its parent's x
    ("echo $(cd /etc && cat passwd/x)", ["/etc", "passwd/x"]),  # (bashlex refuses this one: shlex's words, in order)
    ("cat `cd /etc; echo x/y` x/z", ["/etc", "x/y"]),  # a substitution has its own shell: x/z is the workspace's
    ("cat $HOME/x ${D}/y", []),  # a variable makes the path: the grader expands nothing
    ("echo $((1 << 2)) > /tmp/o", ["/tmp/o"]),  # arithmetic: bashlex cannot read it; shlex's words
    ("python3 - <<'PY'\nopen('/etc/passwd')\nPY\ncat /etc/hosts", ["/etc/hosts"]),  # a quoted here-document's body
    ("cat <<EOF > /tmp/f\n/etc/x\nEOF", ["/tmp/f"]),
])
def test_a_path_is_what_the_shell_reads(command, outside):
    assert outside_named(command) == [outside]


def test_the_working_directory_carries_over_between_calls_while_it_stays_in_the_workspace():
    """2.1.197 keeps the shell's directory across Bash calls; one that leaves the workspace is
    put back at the workspace after its call ("Shell cwd was reset to …", seen through the real CLI)."""
    assert outside_named("cd docs", "cat ../CLAUDE.md ../../etc/x") == [[], ["../../etc/x"]]
    assert outside_named("cd /etc", "cat passwd/x ../up") == [["/etc"], ["../up"]]
    # a subagent's call moves nothing for the next call
    assert outside_named("cd docs", "cd sub", "cat ../../x") == [[], [], []]
    assert outside_named("cd docs", "cd sub", "cat ../../x", subagent=(1,)) == [[], [], ["../../x"]]


def test_a_path_input_is_read_against_the_shell_s_directory():
    shell = Session(WS, inside, keeps_cwd=True)
    shell.named("cd docs")
    assert shell.path("../x").resolved == "/workspace/x"
    assert shell.path("/etc/x").resolved == "/etc/x"


# --- item 2: "A path inside the workspace is written relative to it" ---------------------------

def _bash_words(command: str) -> list[str]:
    """The words bash itself makes of a command's arguments (printf gets them one by one)."""
    out = subprocess.run(["bash", "--noprofile", "--norc", "-c", "printf '%s\\0' " + command], capture_output=True, timeout=10)
    assert out.returncode == 0, (command, out.stderr)
    return out.stdout.decode().split("\0")[:-1]


@st.composite
def path_words(draw) -> str:
    """A shell word naming a path in the workspace, or another word, in the forms a session writes:
    ``//``, ``/./``, trailing slashes, an option's ``=``, quotes around all or part of it."""
    if draw(st.booleans()):
        other = draw(st.sampled_from(["a", "workspace", "/workspace2/x", "/tmp/workspace/x", "-n", "/workspace.bak", "x/workspace"]))
        return other
    joint = draw(st.sampled_from(["", "/", "//", "/./", "/.", "/./.", "///", "/.//"]))
    tail = draw(st.sampled_from(["", "docs", "docs/", "a b.md", "docs//x.md", "docs/./x", "x=y", "-x"]))
    if joint in ("", "/.", "/./.") and tail:
        joint += "/"
    prefix = draw(st.sampled_from(["", "--file=", "-o=", "out="]))
    style = draw(st.sampled_from(["plain", "single", "double", "tail-single", "tail-double", "head-double"]))
    if style == "plain" and " " in tail:
        style = "single"
    if style == "plain":
        body = "/workspace" + joint + tail
    elif style == "single":
        body = "'/workspace" + joint + tail + "'"
    elif style == "double":
        body = '"/workspace' + joint + tail + '"'
    elif style == "tail-single":
        body = "/workspace" + joint + ("'" + tail + "'" if tail else "")
    elif style == "tail-double":
        body = "/workspace" + joint + ('"' + tail + '"' if tail else "")
    else:
        body = '"/workspace' + joint + '"' + ("'" + tail + "'" if tail else "")
    return prefix + body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(path_words(), min_size=1, max_size=4))
def test_a_stripped_word_names_the_same_file_from_the_workspace(words):
    """Whatever the form, the stripped command's words (as bash reads them) are as many as the
    command's, and each that named a path in the workspace names the same path, relative to it."""
    command = " ".join(words)
    stripped = _Paths(WS).strip(command)
    before, after = _bash_words(command), _bash_words(stripped)
    assert len(after) == len(before), (command, stripped)
    for a, b in zip(before, after, strict=True):
        m = re.match(r"(--?\w+=|\w+=)?(.*)", a, re.S)
        prefix, path = m.group(1) or "", m.group(2)
        if not inside(posixpath.normpath(path)) or not path.startswith("/"):
            assert b == a, (command, stripped)
            continue
        assert b.startswith(prefix) and b[len(prefix):], (command, stripped)
        rel = b[len(prefix):]
        assert not rel.startswith("/"), (command, stripped)  # written relative to the workspace
        assert posixpath.normpath(posixpath.join(WS, rel)) == posixpath.normpath(path), (command, stripped)


@pytest.mark.parametrize("command, stripped", [
    ("cat /workspace//docs/x.md", "cat docs/x.md"),
    ("find /workspace/ -name x", "find . -name x"),
    ("ls /workspace", "ls ."),
    ("cat \"/workspace/\"'a b.md'", "cat \"\"'a b.md'"),  # the word goes on past the workspace: ""'a b.md' is 'a b.md'
    ("grep -r --include=x /workspace/./docs/ .", "grep -r --include=x docs/ ."),
    ("cat /workspace/../etc/x /workspace2/y", "cat /workspace/../etc/x /workspace2/y"),
])
def test_the_workspace_prefix_goes_and_the_word_still_names_the_file(command, stripped):
    assert _Paths(WS).strip(command) == stripped


PLAIN_WORDS = ["cd", "pushd", "ls", "cat", "docs", "..", "../x", "../../y", "/etc/x", "/workspace/docs", "a/b", "-n", "-",
               "--", "--opt=/tmp/y", "X=/v", "X=../w", "*.md", "docs/*.md", "2>&1", ">", ">>", "<", "2>", "&>", "|", ";",
               "&&", "||", "&", "\n", "<<EOF\n/etc/a\nEOF\n", "<<'EOF'\n../x b\nEOF\n", "<<-X\n\t/b\n\tX\n",
               "'a b/c'", '"/etc/q"', "'~/n'", '"x y"', "'$HOME/z'", '-m "note 4"', "X='~/v'", "a'/b c'"]


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(st.lists(st.lists(st.sampled_from(PLAIN_WORDS), min_size=1, max_size=7), min_size=1, max_size=3))
def test_a_plain_command_read_as_words_is_what_bashlex_reads(commands):
    """A command of plain words and operators is read without bashlex (a millisecond a command):
    the paths it names and where it leaves the shell are the parser's, call after call."""
    texts = [" ".join(c) for c in commands]
    fast, parsed = Session(WS, inside, keeps_cwd=True), Session(WS, inside, keeps_cwd=True)
    for text in texts:
        try:
            bashlex.parse(_blank_heredoc_quotes(without_heredoc_bodies(text, closed=True)))  # as Session reads it
        except Exception:  # not a command bash would run either (a dangling operator): nothing to compare
            return
        assert [(n.text, n.resolved) for n in fast.named(text)] == [(n.text, n.resolved) for n in parsed.named(text, parse=True)], text
        assert fast.cwd == parsed.cwd, text


def test_where_bashlex_cannot_read_a_command_its_cd_still_carries_to_the_next_call():
    """`[[ ]]` is beyond bashlex: the command's words and operators are read, and its `cd` moves
    the shell as the CLI keeps it."""
    assert outside_named("[[ -d docs ]] && cd docs", "cat ../x ../../y") == [[], ["../../y"]]
