"""The transcript's fenced blocks hold whatever a session wrote, and are read as CommonMark reads them.

The contract: "The probe_transcript kind requires a Run identity section and an Events section.
Under each heading the recorder writes one fenced yaml block." A session's Bash call that writes a
Markdown file with a heredoc puts a line of three backticks into a YAML scalar over several lines;
with a fence of three backticks that line closed the block early and intake refused the whole
transcript, every session of the arm with it. The writer now opens each block with a backtick
fence longer than any run of backticks the block holds, and the reader (transcript._blocks) takes
fences and headings by CommonMark's rules, held here against markdown-it-py, the CommonMark
reference parser for Python.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from markdown_it import MarkdownIt

from runner.transform import intake, transcript
from runner.transform.transcript import TranscriptError, parse

LOCK = "sha256:" + "b" * 64
D = "sha256:" + "c" * 64
HEREDOC = "cat > notes/report.md <<'EOF'\n# Report\n```\nls\n```\nEOF"
MD = MarkdownIt("commonmark")
PROFILE = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def identity(**over) -> dict:
    d = {"model": "claude-x", "served_version": "claude-x-2026", "tree": D, "lock": LOCK, "selection": D,
         "read_set": D, "seed": 7, "harness": "claude-code 2.1.197", "tier": "regression", "arm": "present",
         "at": "2026-12-02T11:00:00Z", "cost_cents": 12}
    d.update(over)
    return d


def bash_event(*arguments: str, answer: str | None = None) -> dict:
    return {"probe": "p1", "session": "present-001", "calls": [{"tool": "Bash", "argument": a, "result": D} for a in arguments],
            "produced": [], "answer": answer}


def render(ident: dict, events: list, prose: list[str] | None = None, front: dict | None = None) -> transcript.Rendered:
    return transcript.rendered({"campaign": "c1"} if front is None else front, "Transcript",
                               ["Some prose."] if prose is None else prose, ident, events)


def verdicts(r: transcript.Rendered) -> tuple[intake.IntakeResult, intake.IntakeResult]:
    return intake.confirm_rendered(r, LOCK, {"p1"}), intake.confirm(r.text, LOCK, {"p1"})


# --- the reproduction -------------------------------------------------------------------------

@pytest.mark.parametrize("argument", [HEREDOC, "cat > a.md <<'EOF'\n```\nEOF", "cat <<'EOF'\n````\n```\n~~~\nEOF"])
def test_a_heredoc_writing_markdown_is_recorded_not_refused(argument):
    """Failed before the fix: "format: a fenced block is not closed" (one line of backticks) or
    "... must hold exactly one fenced yaml block, not 2" (two), for the whole transcript."""
    events = [bash_event(argument)]
    r = render(identity(), events)
    for verdict in verdicts(r):
        assert verdict.refusal is None
        assert verdict.events == events
    assert parse(r.text).events == events


def test_a_fence_line_in_the_identity_block_is_its_value():
    """In the identity block a value's continuation lines are indented two spaces only: a line
    of three backticks there closes a three-backtick fence under CommonMark as well."""
    ident = identity(harness="claude-code\n```\n2.1.197", served_version="x\n    ~~~~\n````")
    r = render(ident, [bash_event("ls")])
    for verdict in verdicts(r):
        assert verdict.refusal is None
    assert parse(r.text).identity == ident


def test_the_fence_is_longer_than_any_run_of_backticks_in_its_block():
    r = render(identity(), [bash_event("a" + "`" * 7 + "b", "```")])
    assert "\n````````yaml\n" in r.text and r.text.endswith("\n````````\n")  # eight: one more than the longest run
    assert "\n```yaml\n" in render(identity(), [bash_event("``")]).text
    assert [len(transcript._fence(b)) for b in ("", "`", "``", "```", "x````y", "`" * 40)] == [3, 3, 3, 4, 5, 41]


@pytest.mark.parametrize("breaking", ["\u2028", "\u2029", "\x85", "\x0b", "\x0c", "\x1c", "\x1d", "\x1e", "\r", "\r\n"])
def test_a_value_holding_a_character_splitlines_breaks_at_reads_back_unchanged(breaking):
    """Lines end at a line feed (or CR LF, or CR, as CommonMark says), never at VT, FF, NEL, the
    file separators or U+2028/U+2029, which PyYAML may write raw inside a quoted scalar."""
    value = f"a{breaking}b\n```\nc{breaking}"
    events = [bash_event(value, answer=value)]
    ident = identity(harness=value)
    r = render(ident, events, front={"campaign": "c1", "title": f"t{breaking}u"})
    t = parse(r.text)
    assert (t.identity, t.events, t.front["title"]) == (ident, events, f"t{breaking}u")
    for verdict in verdicts(r):
        assert verdict.refusal is None


def test_crlf_line_endings_read_as_line_feeds():
    r = render(identity(harness="a\n```\nb"), [bash_event(HEREDOC)])
    for text in (r.text.replace("\n", "\r\n"), r.text.replace("\n", "\r")):
        t = parse(text)
        assert t.identity == identity(harness="a\n```\nb") and t.events == [bash_event(HEREDOC)]


# --- the reader's CommonMark ------------------------------------------------------------------

FRONT = "---\nkind: probe_transcript\n---\n\n# T\n\n"
IDENT_BLOCK = "```yaml\nmodel: m\n```\n"


def _events_doc(events_part: str, ident_part: str = "## Run identity\n\n" + IDENT_BLOCK) -> str:
    return FRONT + ident_part + "\n" + events_part


@pytest.mark.parametrize("doc, events", [
    ("## Events\n~~~yaml\n- a\n- |-\n ```\n~~~\n", ["a", "```"]),  # backticks do not close a tilde fence
    ("## Events\n````yaml\n- |-\n ```\n`````  \t\n", ["```"]),  # a longer closing fence closes
    ("## Events\n```yaml\n- |-\n ``` x\n```\n", ["``` x"]),  # text after a fence does not close
    ("## Events\n```yaml\n- |-\n    ```\n```\n", ["```"]),  # nor does one indented four spaces
    ("## Events\n   ```yaml\n   - a\n  - b\n- c\n   ```\n", ["a", "b", "c"]),  # an indented fence dedents
    ("  ##   Events   ##  \n```  yaml  \n- a\n```\n", ["a"]),  # indented heading, closing sequence, info padding
    ("Events\n------\n```yaml\n- a\n```\n", ["a"]),  # a setext heading is a heading
])
def test_commonmark_cases_the_reader_follows(doc, events):
    assert parse(_events_doc(doc)).events == events
    body = _without_front_matter(_events_doc(doc))
    assert _ours(body) == _oracle(body)


@pytest.mark.parametrize("doc, reason", [
    ("## Events\n```yaml\n- a\n", "a fenced block is not closed"),
    ("## Events\n```yaml\n- a\n````\n```\n", "a fenced block is not closed"),  # a fence of four does not close on three
    # indented code, not a heading: the block is a second one under Run identity
    ("    ## Events\n```yaml\n- a\n```\n", "the section '## Run identity' must hold exactly one fenced yaml block, not 2"),
    ("##Events\n```yaml\n- a\n```\n", "the section '## Run identity' must hold exactly one fenced yaml block, not 2"),
    ("    ## Events\n", "the section '## Events' is missing"),
    ("## Events\n    ```yaml\n    - a\n    ```\n", "exactly one fenced yaml block, not 0"),
    ("## Events\n\t```yaml\n- a\n```\n", "not closed"),  # a tab indents four columns: the last line opens a fence
    ("## Events\n```yaml\n- a\n```\n## Events\n```yaml\n- b\n```\n", "the heading '## Events' appears twice"),
    ("## Events\n```yaml\n- a\n```\n```yaml\n- b\n```\n", "exactly one fenced yaml block, not 2"),
    ("## Events\n```json\n[]\n```\n", "exactly one fenced yaml block"),
])
def test_refusals_keep_their_reasons(doc, reason):
    with pytest.raises(TranscriptError, match=re.escape(reason)):
        parse(_events_doc(doc))


def test_a_rendered_transcript_gets_the_verdict_of_its_text_with_longer_fences():
    """confirm_rendered takes the blocks as dumped (their text is unchanged, only the fence is
    longer), and still reads the structure: prose that opens a fence shows as it would."""
    for prose in (["Some prose."], ["```"], ["````yaml\n- probe: p9\n  session: x\n````"], ["## Events"], ["    ```"]):
        for events in ([bash_event(HEREDOC)], [bash_event("``````")], []):
            r = render(identity(), events, prose=prose)
            a, b = verdicts(r)
            assert repr(a) == repr(b)


# --- the oracle ------------------------------------------------------------------------------

def _without_front_matter(text: str) -> str:
    """The text after the front matter, which markdown-it does not know: from the first line,
    ``---``, to the next line that is ``---``."""
    lines = text.split("\n")
    assert lines[0] == "---"
    end = next(i for i in range(1, len(lines)) if lines[i].strip() == "---")
    return "\n".join(lines[end + 1:])


def _oracle(markdown: str) -> list[tuple]:
    """markdown-it's headings (level, text) and fences (info, content), in order."""
    tokens = MD.parse(markdown)
    out = []
    for i, tok in enumerate(tokens):
        if tok.type == "heading_open":
            out.append(("heading", int(tok.tag[1]), tokens[i + 1].content))
        elif tok.type == "fence":
            out.append(("fence", tok.info.strip(" \t"), tok.content))
    return out


def _ours(markdown: str) -> list[tuple]:
    """Our reader's headings and fences, as ``_oracle`` gives markdown-it's."""
    return [b[:3] for b in transcript._blocks(markdown)]


def _run_line(indent: int, marker: str, length: int, tail: str) -> str:
    return " " * indent + marker * length + tail


runs = st.builds(_run_line, st.integers(0, 6), st.sampled_from("`~"), st.integers(1, 12),
                 st.sampled_from(["", "yaml", " ", "\t", " x", "`", "~", "a`b", "```"]))
ordinary = st.sampled_from(["ls", "# Report", "## Events", "EOF", "echo `date`", "a: b", "- item", "", "  x",
                            "'quoted'", "---", "key: 'v'", "\tcode", "é✓"]) | st.text(alphabet="ab `~#-:' \t", max_size=12)
texts = st.lists(runs | ordinary, min_size=1, max_size=8).map("\n".join)


@PROFILE
@given(st.lists(texts, min_size=1, max_size=4), texts, texts, st.lists(st.integers(0, 6), max_size=3))
def test_any_runs_of_backticks_and_tildes_read_back_and_read_as_commonmark_reads_them(arguments, ident_value, answer, prose_indents):
    """"The probe_transcript kind requires a Run identity section and an Events section. Under
    each heading the recorder writes one fenced yaml block." -- whatever the blocks hold.

    Texts with runs of backticks and tildes of every length and indentation, in call arguments,
    an answer, identity values, the front matter and (where prose may hold them: mid-line, or
    indented as code) the prose: (a) ``parse`` reads back exactly the values written; (b)
    markdown-it sees two h2 headings, "Run identity" then "Events", each followed by exactly one
    fence, with info "yaml", whose content is the block our reader returns and the dump."""
    events = [bash_event(*arguments, answer=answer), {**bash_event(ident_value), "session": "present-002"}]
    ident = identity(harness=ident_value or "h", served_version=arguments[0] or "v")
    prose = ["Some prose with ``` and ~~~~ inside it.", *(" " * (4 + i) + "`" * (3 + i) + "\n" for i in prose_indents)]
    # not a line of "---" in the front matter: that would end it, for any reader of front matter
    front = {"campaign": "c1", "title": "\n".join(line for line in answer.split("\n") if line.strip() != "---")}
    r = render(ident, events, prose=prose, front=front)

    t = parse(r.text)  # (a)
    assert (t.front, t.identity, t.events) == ({"kind": "probe_transcript", **front}, ident, events)
    for verdict in verdicts(r):
        assert verdict.refusal is None and verdict.events == events

    body = _without_front_matter(r.text)  # (b)
    seen = [b for b in _oracle(body) if b[0] == "fence" or b[1] == 2]
    assert seen == [("heading", 2, "Run identity"), ("fence", "yaml", r.blocks[1][0]),
                    ("heading", 2, "Events"), ("fence", "yaml", r.blocks[2][0])]
    sections = transcript._sections(body)
    assert [(s, [(info, block + "\n") for info, block in found]) for s, found in sections.items()] == [
        ("Run identity", [("yaml", r.blocks[1][0])]), ("Events", [("yaml", r.blocks[2][0])])]
    assert _ours(body) == _oracle(body)


# Documents of headings, fences and text, laid out to stay inside what the reader models: no
# block quotes, lists, HTML blocks or link reference definitions (read as paragraph text).
indents = st.integers(0, 6).map(" ".__mul__)
fence_lines = st.builds(lambda ind, c, n, info: ind + c * n + info, indents, st.sampled_from("`~"), st.integers(1, 12),
                        st.sampled_from(["", "yaml", " yaml ", "a`b", "~", " \t", "x y", "`"]))
heading_lines = st.builds(lambda ind, n, sep, name, close: ind + "#" * n + sep + name + close, indents, st.integers(1, 7),
                          st.sampled_from([" ", "\t", "", "   "]),
                          st.sampled_from(["Run identity", "Events", "Other", "", "#", "Events#", "a # b"]),
                          st.sampled_from(["", " ##", " #  ", "#", " \t", "\t#"]))
text_lines = st.builds(lambda ind, s: ind + s, indents,
                       st.sampled_from(["text", "a ``` b", "x ~~~", "Events", "Run identity", "a`b", "q:  "]))
other_lines = st.sampled_from(["", "  ", "\t", "---", "===", "  --", "=", "***", "- - -", "___", "----  ",
                               "\t```", "\t## Events", " \t~~~", "\tcode", "  \tx"])
documents = st.lists(st.one_of(fence_lines, heading_lines, text_lines, other_lines), max_size=14).map(
    lambda lines: "\n".join(lines) + "\n")


@settings(max_examples=1500, deadline=None)
@given(documents)
def test_the_reader_and_markdown_it_agree_on_headings_and_fences(document):
    """Which lines are headings (of which level and text) and which are the content of which
    fence (with which info string), for small documents of headings, fences (backtick or tilde,
    of any length and indentation, closed or not) and text: as markdown-it reads them."""
    assert _ours(document) == _oracle(document)
    try:
        sections = transcript._sections(document)
    except TranscriptError as e:
        assert "not closed" in str(e) or "appears twice" in str(e)
        return
    h2 = [b[2] for b in _oracle(document) if b[0] == "heading" and b[1] == 2]
    assert list(sections) == list(dict.fromkeys(h2))


def test_a_note_naming_a_session_path_with_a_fence_stays_one_line_of_prose():
    """The transform's notes on single events name the session's own paths, which the prose
    carries. A review found a file named with a line break and three backticks, written and
    then deleted, opened a fence in the prose that swallowed the Run identity section: intake
    refused the whole arm. Notes are now written as one line, with such characters escaped."""
    from decimal import Decimal

    from runner.transform.events import SessionOutcome
    from runner.transform.run import notes_prose

    note = "notes/x.md\n```\n was written but no file was there when the session ended"
    outcome = SessionOutcome("p1", "present-001", bash_event("ls"), [], Decimal(0), [], [], [note])
    prose = notes_prose([outcome])
    assert prose == ["Notes on single events. p1 present-001: notes/x.md\\x0a\\x60\\x60\\x60\\x0a was written but no "
                     "file was there when the session ended."]
    fenced, plain = verdicts(render(identity(), [bash_event("ls")], prose))
    assert fenced.refusal is None and plain.refusal is None, (fenced.refusal, plain.refusal)
    raw, _ = verdicts(render(identity(), [bash_event("ls")], [f"Notes on single events. p1 present-001: {note}."]))
    assert raw.refusal is not None  # what the unescaped note did
