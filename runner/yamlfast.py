"""The transcript's YAML without PyYAML's pure-Python emitter and loader, byte for byte the same.

PyYAML spends about 1.45 ms per tool call writing and reading back a transcript; the blocks hold
only mappings, lists, strings, ints, bools and null, whose block-style layout is fixed. ``dump``
lays that structure out itself and asks PyYAML (once per distinct string, cached) how to write
each string it cannot prove plain; whatever it cannot vouch for (another type, a shared object
PyYAML would anchor, a string PyYAML writes over several lines or long enough to fold) makes it
return None, and the caller dumps with PyYAML. ``load`` reads with libyaml and keeps the result
only if ``dump`` of it gives back the very text: such a text is PyYAML's own output for that
value, which PyYAML's loader reads back as that value (tests/unit/test_transcript_render.py), so
the verdict is the pure loader's. Any other text goes to the pure loader, whose verdict on
foreign files libyaml does not share.
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Callable

import yaml

_MAX_LEN = 50_000  # far below the 10**6 width, so PyYAML never folds; escapes at most 10x
_MAX_KEY = 100  # below the 128 characters past which PyYAML writes a complex key
_MAX_DEPTH = 64
_SAFE = re.compile(r"[A-Za-z0-9_/][A-Za-z0-9_./ -]*\Z")
_BREAKS = re.compile("[\n\r\x85\u2028\u2029]")
_CLoader = getattr(yaml, "CSafeLoader", None) if yaml.__with_libyaml__ else None


class _Unsafe(Exception):
    """A value PyYAML may write differently from this layout."""


def _plain_by_class(s: str, resolvers: dict) -> bool:
    """Printable ASCII without indicators, no edge spaces, read back as a string: PyYAML writes it plain."""
    if not _SAFE.match(s) or s[-1] == " ":
        return False
    return not any(r.match(s) for _, r in resolvers.get(s[0], []) + resolvers.get(None, []))


def scalar_renderer(dump_one: Callable[[str], str], resolvers: dict) -> Callable[[str], str | None]:
    """How PyYAML writes string ``s`` as a mapping value or list item, or None when not on one line."""
    @lru_cache(maxsize=1 << 16)
    def render(s: str) -> str | None:
        if _plain_by_class(s, resolvers):
            return s
        out = dump_one(s)
        out = out[:-4] if out.endswith("\n...\n") else out
        out = out[:-1]
        return None if _BREAKS.search(out) else out
    return render


def dumper(dump_one: Callable[[str], str], resolvers: dict) -> Callable[[object], str | None]:
    """``dump(value)``: PyYAML's block-style text of ``value`` with ``dump_one``'s settings, or None."""
    string = scalar_renderer(dump_one, resolvers)

    def scalar(v: object) -> str:
        t = type(v)
        if t is str:
            if len(v) > _MAX_LEN:
                raise _Unsafe
            r = string(v)
            if r is None:
                raise _Unsafe
            return r
        if v is None:
            return "null"
        if t is bool:
            return "true" if v else "false"
        if t is int:
            return str(v)
        raise _Unsafe

    def key(k: object) -> str:
        if type(k) is not str or not k or len(k) > _MAX_KEY or _BREAKS.search(k):
            raise _Unsafe
        return scalar(k)

    def mapping(d: dict, indent: int, first: str | None, out: list, seen: set) -> None:
        pad = " " * indent
        for i, (k, v) in enumerate(d.items()):
            out.append(first if i == 0 and first is not None else pad)
            out.append(key(k) + ":")
            after_key(v, indent, out, seen)

    def after_key(v: object, indent: int, out: list, seen: set) -> None:
        t = type(v)
        if t is dict or t is list:
            nested(v, seen, indent)
            if not v:
                out.append(" {}\n" if t is dict else " []\n")
            elif t is dict:
                out.append("\n")
                mapping(v, indent + 2, None, out, seen)
            else:
                out.append("\n")
                sequence(v, indent, None, out, seen)  # PyYAML's sequences under a key are indentless
        else:
            out.append(" " + scalar(v) + "\n")

    def sequence(items: list, indent: int, first: str | None, out: list, seen: set) -> None:
        pad = " " * indent
        for i, v in enumerate(items):
            p = (first if i == 0 and first is not None else pad) + "- "
            t = type(v)
            if t is dict or t is list:
                nested(v, seen, indent)
                if not v:
                    out.append(p + ("{}\n" if t is dict else "[]\n"))
                elif t is dict:
                    mapping(v, indent + 2, p, out, seen)
                else:
                    sequence(v, indent + 2, p, out, seen)
            else:
                out.append(p + scalar(v) + "\n")

    def nested(v: object, seen: set, indent: int) -> None:
        """PyYAML anchors an object met twice; this layout does not, so it refuses."""
        if id(v) in seen or indent > 2 * _MAX_DEPTH:
            raise _Unsafe
        seen.add(id(v))

    def dump(value: object) -> str | None:
        out: list[str] = []
        seen: set[int] = set()
        try:
            if type(value) is dict and value:
                seen.add(id(value))
                mapping(value, 0, None, out, seen)
            elif type(value) is list and value:
                seen.add(id(value))
                sequence(value, 0, None, out, seen)
            elif type(value) in (dict, list):
                return "{}\n" if type(value) is dict else "[]\n"
            else:
                return None
        except _Unsafe:
            return None
        return "".join(out)
    return dump


def loader(dump: Callable[[object], str | None]) -> Callable[[str], object]:
    """``load(text)``: what ``yaml.safe_load(text)`` gives, via libyaml when ``dump`` vouches for the text."""
    def load(text: str) -> object:
        if _CLoader is not None:
            try:
                value = yaml.load(text, Loader=_CLoader)
            except yaml.YAMLError:
                value = None
            else:
                if dump(value) == text + "\n":  # parse hands each block over without its last line break
                    return value
        return yaml.safe_load(text)
    return load
