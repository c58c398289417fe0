"""runner/transform/yamlfast.py against PyYAML's libyaml bindings (CSafeDumper, CSafeLoader), in one run.

The transcript's YAML blocks must be byte for byte what PyYAML's pure emitter writes (its
dumper with the NEL representer, runner/transform/transcript.py): the transcripts of every campaign
already recorded are that text. yamlfast keeps only if it beats libyaml clearly, and libyaml
could replace it only if its text were the same.

Values: the events the transform makes of every real CLI stream under tests/data (the recorder's
own pipeline, tests/fuzz_targets.py's facts), one block per event and one block of all of them,
and the identity block. Each side dumps (and loads back) every value ``--rounds`` times; the
CPU time of each is printed with its ratio to the pure PyYAML baseline, and how many texts
libyaml writes differently from the pure emitter.

    python bench/yamlfast.py [--rounds 20]
"""

from __future__ import annotations

import argparse
import io
import sys
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import fuzz_targets  # noqa: E402

from runner.harnesses.claude_code import stream  # noqa: E402
from runner.transform import transcript  # noqa: E402
from runner.transform.events import session_event  # noqa: E402


class _CDumper(yaml.CSafeDumper):
    """transcript's string representation over libyaml's emitter."""


_CDumper.add_representer(str, transcript.represent_str)


def _c_dump(value: object) -> str:
    return yaml.dump(value, Dumper=_CDumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=10**6)


def _vary(value: object, tag: str) -> object:
    """The value with every string value given a suffix: new strings each round, so no cache
    (yamlfast keeps one of short strings) answers from an earlier round."""
    if isinstance(value, dict):
        return {k: _vary(v, tag) for k, v in value.items()}
    if isinstance(value, list):
        return [_vary(v, tag) for v in value]
    return f"{value} {tag}" if isinstance(value, str) else value


def _events() -> list[dict]:
    events = []
    for path in sorted((ROOT / "tests" / "data").rglob("*.jsonl")):
        parsed = stream.parse(io.BytesIO(path.read_bytes()))
        outcome = session_event(parsed, fuzz_targets.facts(), fuzz_targets.ANSWERS, fuzz_targets.IDENTIFIER)
        if outcome.event is not None:
            events.append(outcome.event)
    if not events:
        raise SystemExit("no stream under tests/data gave an event")
    return events


def _values(events: list[dict], rounds: int, per_round: int, salt: str) -> list[list[object]]:
    """Per round: ``per_round`` event blocks, one block of them all, and the identity block."""
    out = []
    for r in range(rounds):
        blocks: list[object] = [[_vary(events[k % len(events)], f"{salt}r{r}k{k}")] for k in range(per_round)]
        out.append([*blocks, [b[0] for b in blocks], _vary(fuzz_targets.identity(), f"{salt}r{r}")])
    return out


def _cpu(fn, rounds: list[list[object]]) -> float:
    t = time.process_time()
    for values in rounds:
        for v in values:
            fn(v)
    return time.process_time() - t


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=20, help="times each value is dumped and loaded (default 20)")
    args = ap.parse_args()
    if not yaml.__with_libyaml__:
        raise SystemExit("this PyYAML has no libyaml bindings: nothing to compare against")
    per_round = 20
    rounds = _values(_events(), args.rounds, per_round, "check")
    values = [v for r in rounds for v in r]
    pure_texts = [transcript._pyyaml_dump(v) for v in values]
    assert [transcript._dump(v) for v in values] == pure_texts, "yamlfast wrote another text than PyYAML"
    differ = sum(_c_dump(v) != t for v, t in zip(values, pure_texts, strict=True))
    print(f"{len(values)} blocks ({args.rounds} rounds of {per_round} event blocks, all of them, identity), "
          f"{sum(len(t) for t in pure_texts)} characters; libyaml's text differs from the pure emitter's in "
          f"{differ} of {len(values)} blocks")
    # Other strings for the timed runs: the check above warmed yamlfast's cache on its own.
    timed = _values(_events(), args.rounds, per_round, "timed")
    # As transcript.parse hands each block over: without its last line break; strings no dump
    # above has seen (yamlfast's loader checks a reading by dumping it).
    timed_texts = [[transcript._pyyaml_dump(v)[:-1] for v in r]
                   for r in _values(_events(), args.rounds, per_round, "load")]
    dump = {"pure PyYAML (SafeDumper)": transcript._pyyaml_dump, "libyaml (CSafeDumper)": _c_dump,
            "yamlfast (transcript._dump)": transcript._dump}
    load = {"pure PyYAML (SafeLoader)": lambda t: yaml.load(t, Loader=yaml.SafeLoader),
            "libyaml (CSafeLoader)": lambda t: yaml.load(t, Loader=yaml.CSafeLoader),
            "yamlfast (transcript._load)": transcript._load}
    for what, sides, inputs in (("dump", dump, timed), ("load", load, timed_texts)):
        base = None
        for name, fn in sides.items():
            cpu = _cpu(fn, inputs)
            base = base or cpu
            print(f"{what:<5} {name:<30} {cpu:7.3f} s CPU   {cpu / base:5.2f}x of pure PyYAML")
    return 0


if __name__ == "__main__":
    sys.exit(main())
