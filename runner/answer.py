"""The answer rule of the recorder contract: the final line of the final message, compared as
a set of words against the answers the probe declares.

The message is split into lines at line feeds only (a CRLF's carriage return goes with it), as
a reader of the message sees them: Python's ``splitlines`` would also break at VT, FF, NEL,
U+2028 and U+2029 and could pick a final line nobody sees. The last non-empty line is trimmed,
loses one trailing period and is case-folded, then split at runs of white space; each declared
answer is split the same way. The line carries an answer only where the set of its words is the
set of words of one declared answer, in any order ("compared as a set of words": a repeated
word adds nothing to the set, so ``current current HW-DR-0052`` is ``current HW-DR-0052``); an
extra word or a missing word gives no value, and Markdown emphasis stays part of the word, so
``**current**`` is no answer. The declared form is what is written. The recorder never looks
inside a sentence: that would read the session, not observe it.
"""

from __future__ import annotations


def words(line: str) -> frozenset[str]:
    """The set of words a line states, by the contract's rule (trim, one trailing period, fold)."""
    line = line.strip()
    if line.endswith("."):
        line = line[:-1]
    return frozenset(line.casefold().split())


def lines(text: str) -> list[str]:
    """The lines of a text as a reader sees them: split at LF, a CRLF's CR dropped."""
    return [line[:-1] if line.endswith("\r") else line for line in text.split("\n")]


def final_line(message: str) -> str | None:
    for line in reversed(lines(message)):
        if line.strip():
            return line
    return None


def stated(line: str, declared: list[str]) -> str | None:
    """The declared answer whose set of words is the line's, or None."""
    found = words(line)
    for answer in declared:
        if words(answer) == found:
            return answer
    return None


def answer_of(message: str | None, declared: list[str]) -> str | None:
    """The declared answer the final line states, or None."""
    if message is None:
        return None
    line = final_line(message)
    return None if line is None else stated(line, declared)
