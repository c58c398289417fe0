"""The contract's answer rule."""

from runner.answer import answer_of

DECL = ["current HW-DR-0052", "superseded HW-DR-0052"]


def test_order_does_not_matter():
    assert answer_of("HW-DR-0052 current", DECL) == "current HW-DR-0052"


def test_trailing_period_stripped():
    assert answer_of("HW-DR-0052 current.", DECL) == "current HW-DR-0052"


def test_case_folded_and_declared_form_returned():
    assert answer_of("hw-dr-0052 CURRENT", DECL) == "current HW-DR-0052"
    assert answer_of("SUPERSEDED hw-dr-0052", DECL) == "superseded HW-DR-0052"


def test_reasoning_then_word_on_own_line():
    msg = "I read a.md and the record says it is still in force.\nHW-DR-0052 current"
    assert answer_of(msg, DECL) == "current HW-DR-0052"


def test_last_line_a_sentence_is_none():
    msg = "current HW-DR-0052\nSo the record HW-DR-0052 is current."
    assert answer_of(msg, DECL) is None


def test_markdown_emphasis_is_none():
    assert answer_of("**current** HW-DR-0052", DECL) is None


def test_extra_word_is_none():
    assert answer_of("0052 current HW-DR-0052", DECL) is None


def test_a_repeated_word_adds_nothing_to_the_set():
    """The contract: "The answer is the final line of the final message, compared as a set of
    words." {current, current, hw-dr-0052} is the set {current, hw-dr-0052}."""
    assert answer_of("current current HW-DR-0052", DECL) == "current HW-DR-0052"
    assert answer_of("HW-DR-0052 current HW-DR-0052.", DECL) == "current HW-DR-0052"


def test_lines_break_at_line_feeds_only():
    """A reader of the message sees one line where U+2028, NEL, VT or FF stand inside it: the final
    line is that whole line, not the text after the separator."""
    for sep in ("\u2028", "\x85", "\x0b", "\x0c", "\u2029"):
        assert answer_of(f"it is{sep}HW-DR-0052 current", DECL) is None  # splitlines() gave the answer
        assert answer_of(f"it is{sep}\nHW-DR-0052 current", DECL) == "current HW-DR-0052"
    assert answer_of("reasoning\r\nHW-DR-0052 current\r\n", DECL) == "current HW-DR-0052"


def test_missing_word_is_none():
    assert answer_of("current", DECL) is None


def test_trailing_blank_lines_ignored():
    assert answer_of("reasoning\nHW-DR-0052 current\n\n   \n", DECL) == "current HW-DR-0052"


def test_none_and_empty():
    assert answer_of(None, DECL) is None
    assert answer_of("", DECL) is None
    assert answer_of("HW-DR-0052 current", []) is None


def test_whitespace_runs():
    assert answer_of("  HW-DR-0052 \t  current  ", DECL) == "current HW-DR-0052"
