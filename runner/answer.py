"""The answer rule of the recorder contract: the final line of the final message, compared as
a set of words against the answers the probe declares.

The last non-empty line is trimmed, loses one trailing period and is case-folded, then split
at runs of white space; each declared answer is split the same way. The line carries an
answer only where its words are exactly the words of one declared answer, in any order: an
extra word (a repeated one included) or a missing word gives no value, and Markdown emphasis
stays part of the word, so ``**current**`` is no answer. The declared form is what is
written. The recorder never looks inside a sentence: that would read the session, not
observe it.
"""

from __future__ import annotations


def _words(line: str) -> list[str]:
    line = line.strip()
    if line.endswith("."):
        line = line[:-1]
    return sorted(line.casefold().split())


def final_line(message: str) -> str | None:
    for line in reversed(message.splitlines()):
        if line.strip():
            return line
    return None


def answer_of(message: str | None, declared: list[str]) -> str | None:
    """The declared answer the final line states, or None."""
    if message is None:
        return None
    line = final_line(message)
    if line is None:
        return None
    words = _words(line)
    for answer in declared:
        if _words(answer) == words:
            return answer
    return None
