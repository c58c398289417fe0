"""Transform throughput against a floor: what the transform derives must cost no more than the
parsing it cannot avoid.

Generates a realistic stream-json corpus on disk (many sessions, long tool results, the
structured ``tool_use_result`` copies the CLI adds, Write and Edit results as the CLI's short
confirmations, Bash heredocs over several lines, TodoWrite lists, subagent lines, hooks and
rate-limit lines), then measures over the same bytes, one process and so one core each:

* floor: a bare loop that splits lines and parses each with the fastest JSON parser here
  (orjson);
* json: the same loop with the standard library's ``json``;
* jq: ``jq -c .type`` over the same files;
* transform: what the transform does per session (``stream.parse``,
  ``transform``), then one transcript rendered and confirmed over all events.

Rates are MB/s per core: bytes over the CPU time the work used (user + system), so the other
work on a shared machine does not count against it. Every measurement runs in a child process
of its own, so the transform's peak RSS is its own: printed for the whole corpus, for one
session and for one session as long as a quarter of the corpus, once after the events are
derived and once after the transcript is rendered and confirmed. Memory bounded by the largest
line means the first figure stays flat however long the stream; the transcript holds every
event of its arm, so the second grows with the number of calls.

The floor and the transform are measured paired, in one process, session file by session file
(each file parsed by the floor's loop just before or just after its transform, in turn), so both
meet the same disturbances of a shared machine; that runs in rounds (``--repeat``, default 5), and
each ratio is the median of the rounds' ratios. json and jq run in processes of their own.

Usage: ``nice -n 19 python3 bench/transform.py [--size 1GiB] [--result-kb 20] [--dir DIR] [--repeat N]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]  # tests/fuzz_targets.py: the fuzz targets

WORKSPACE = "/workspace"
CONFIG = "/session/config"
SESSION_BYTES = 4 << 20  # a long session: about 200 tool calls of 20 KB
_WORDS = ("the decision HW-DR-0052 supersedes HW-DR-0041 and names a status field; fn parse(x: &str) -> "
          "Result<Vec<u8>> { let v = x.trim(); } # \"quoted\" \t tabbed \\ back-slash é ü → ✓ ").split(" ")


def _size(text: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)\s*([KMG]i?B?)?", text.strip(), re.I)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    unit = (m.group(2) or "").upper().rstrip("B").rstrip("I")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}[unit])


def _pool(rng: random.Random, size: int = 4 << 20) -> str:
    """File-like text: numbered lines of words, with escapes and non-ASCII as real files have."""
    out, n, total = [], 1, 0
    while total < size:
        line = f"{n:>6}\t" + " ".join(rng.choice(_WORDS) for _ in range(12)) + "\n"
        out.append(line)
        total += len(line)
        n += 1
    return "".join(out)


def _text(rng: random.Random, pool: str, size: int) -> str:
    """A document of ``size`` characters: a slice of the pool, so documents differ."""
    start = rng.randrange(len(pool) - size)
    return pool[start:start + size]


def _dump(obj: dict) -> bytes:
    return (json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n").encode()


def _call(tid: str, name: str, inputs: dict, parent: str | None, sid: str, usage: dict) -> bytes:
    return _dump({"type": "assistant", "message": {
        "id": f"msg_{tid}", "type": "message", "role": "assistant", "model": "claude-sonnet-4-5-20250929",
        "content": [{"type": "text", "text": "Reading the next document."}, {"type": "tool_use", "id": tid, "name": name, "input": inputs}],
        "stop_reason": "tool_use", "usage": usage}, "parent_tool_use_id": parent, "session_id": sid})


def _result(tid: str, content: object, structured: dict | None, parent: str | None, sid: str) -> bytes:
    user = {"type": "user", "message": {"role": "user", "content": [
        {"tool_use_id": tid, "type": "tool_result", "content": content, "is_error": False}]},
        "parent_tool_use_id": parent, "session_id": sid, "timestamp": "2026-12-02T11:33:34.993Z"}
    if structured:
        user["tool_use_result"] = structured
    return _dump(user)


def _session(rng: random.Random, pool: str, target: int, result_bytes: int, sid: str) -> bytes:
    common = {"session_id": sid}
    lines = [
        _dump({"type": "system", "subtype": "hook_started", "hook_id": str(uuid.UUID(int=rng.getrandbits(128))),
               "hook_name": "SessionStart:startup", "hook_event": "SessionStart", **common}),
        _dump({"type": "system", "subtype": "init", "cwd": WORKSPACE, "tools": ["Bash", "Read", "Write", "Edit", "Grep", "Glob", "Task"],
               "mcp_servers": [], "model": "claude-sonnet-4-5", "permissionMode": "dontAsk", "skills": ["debug"],
               "plugins": [], "memory_paths": {"auto": CONFIG + "/projects/-workspace/memory/"},
               "claude_code_version": "2.1.197", **common}),
    ]
    size, i = sum(map(len, lines)), 0
    counted = len(lines)
    usage = {"input_tokens": 3, "cache_creation_input_tokens": 2170, "cache_read_input_tokens": 14910, "output_tokens": 229}
    while size < target:
        tid = f"toolu_{sid[:8]}_{i:04d}"
        kind = rng.choice(("Read", "Read", "Read", "Bash", "Bash", "Grep", "Write", "Edit", "Task", "TodoWrite"))
        doc = f"{WORKSPACE}/docs/decisions/HW-DR-{rng.randrange(10000):04d}.md"
        body = _text(rng, pool, result_bytes)
        note = f"{WORKSPACE}/notes/n{i}.md"
        command = (f"grep -rn HW-DR {WORKSPACE}/docs | head -200" if i % 2 else  # every other one a heredoc
                   f"cat > {note} <<'EOF'\n{body[:300]}\nEOF\ngit add {note} && git commit -q -m \"note {i}\"")
        read = {"type": "text", "file": {"filePath": doc, "content": body, "numLines": body.count("\n"), "startLine": 1}}
        if kind == "Task":  # the Task call, its subagent's Read (parent_tool_use_id: the Task), then the Task's answer
            lines.append(_call(f"{tid}_task", "Task", {"subagent_type": "Explore", "description": "look", "prompt": body[:500]}, None, sid, usage))
            lines.append(_call(tid, "Read", {"file_path": doc}, f"{tid}_task", sid, usage))
            lines.append(_result(tid, body, read, f"{tid}_task", sid))
            lines.append(_result(f"{tid}_task", [{"type": "text", "text": body[:800]}], None, None, sid))
        else:
            inputs = {
                "Read": {"file_path": doc},
                "Bash": {"command": command, "description": "search"},
                "Grep": {"pattern": "HW-DR-[0-9]{4}", "path": f"{WORKSPACE}/docs", "output_mode": "content"},
                "Write": {"file_path": note, "content": body[: result_bytes // 4]},
                "Edit": {"file_path": note, "old_string": body[:200], "new_string": body[200:400]},
                "TodoWrite": {"todos": [{"content": f"check HW-DR-{k:04d}", "status": "pending", "activeForm": "checking"}
                                        for k in range(i % 7 + 1)]},
            }[kind]
            # What the CLI returns: a Write or Edit a line of confirmation (Edit with a snippet), with
            # the file in the structured copy; a TodoWrite a line; the rest the text they produced.
            content: object = {
                "Grep": [{"type": "text", "text": body}],
                "Write": f"File created successfully at: {note}",
                "Edit": f"The file {note} has been updated. Here's the result of running `cat -n` on a snippet of the edited file:\n"
                        + body[:600],
                "TodoWrite": "Todos have been modified successfully. Ensure that you continue to use the todo list.",
            }.get(kind, body)
            structured = {
                "Read": read,
                "Write": {"type": "create", "filePath": note, "content": inputs.get("content"), "structuredPatch": [],
                          "originalFile": None},
                "Edit": {"filePath": note, "oldString": body[:200], "newString": body[200:400], "originalFile": body,
                         "structuredPatch": [{"oldStart": 1, "oldLines": 3, "newStart": 1, "newLines": 3,
                                              "lines": body[:400].split("\n")}], "userModified": False, "replaceAll": False},
            }.get(kind)
            lines.append(_call(tid, kind, inputs, None, sid, usage))
            lines.append(_result(tid, content, structured, None, sid))
        if i % 25 == 0:
            lines.append(_dump({"type": "rate_limit_event", "rate_limit_info": {"status": "allowed", "resetsAt": 1785352800}, **common}))
        size += sum(map(len, lines[counted:]))
        counted = len(lines)
        i += 1
    final = "The status is below.\nHW-DR-0052 current."
    lines.append(_dump({"type": "assistant", "message": {"model": "claude-sonnet-4-5-20250929", "content": [
        {"type": "text", "text": final}], "usage": usage}, "parent_tool_use_id": None, **common}))
    lines.append(b'{"type":"result","subtype":"success","is_error":false,"num_turns":%d,"result":%s,'
                 b'"total_cost_usd":0.30000000000000004,"session_id":"%s"}\n' % (i, json.dumps(final).encode(), sid.encode()))
    return b"".join(lines)


def generate(directory: Path, total: int, result_bytes: int, seed: int = 7) -> list[Path]:
    rng = random.Random(seed)
    pool = _pool(rng)
    files, written = [], 0
    while written < total:
        sid = str(uuid.UUID(int=rng.getrandbits(128)))
        data = _session(rng, pool, min(SESSION_BYTES, max(total - written, 1)), result_bytes, sid)
        path = directory / f"{len(files):05d}.jsonl"
        path.write_bytes(data)
        files.append(path)
        written += len(data)
    return files


def _peak_rss_kb() -> int:
    """This process's peak RSS (VmHWM). Not ru_maxrss: Linux carries that across fork and exec,
    so a child would report the parent's peak at the time it was started."""
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _parse_every_line(files: list[Path], loads) -> int:
    n = 0
    for path in files:
        with open(path, "rb") as f:
            for line in f:
                loads(line)
                n += 1
    return n


def floor(files: list[Path]) -> int:
    import orjson

    return _parse_every_line(files, orjson.loads)


def stdlib(files: list[Path]) -> int:
    return _parse_every_line(files, json.loads)


def full_transform_paired(files: list[Path]) -> dict:
    return full_transform(files, paired=True)


def full_transform(files: list[Path], paired: bool = False) -> dict:
    """Per session what transform_run.session_outcome does, then one transcript over all events;
    the CPU time of the transcript (render and intake's confirmation) is returned apart.

    ``paired``: each session's file is also parsed by the floor's loop, just before or just after
    its transform (in turn), and the CPU time of each is summed apart, so the floor and the
    transform meet the same disturbances of a shared machine, 4 MB at a time."""
    import orjson
    from fuzz_targets import LOCK, identity

    from runner.harnesses.claude_code import stream
    from runner.transform import intake
    from runner.transform.events import SessionFacts, session_event
    from runner.transform.transcript import rendered

    manifest = {f"docs/decisions/HW-DR-{k:04d}.md": LOCK for k in range(10000)}
    IDENTIFIERS = frozenset(f"HW-DR-{k:04d}" for k in range(10000))  # the corpus the manifest stands for
    note = b"A note that cites HW-DR-0052 and HW-DR-0041.\n"
    ident = re.compile(r"HW-[A-Z]+-[0-9]{4}")
    events = []
    floor_cpu = events_cpu = 0.0
    for k, path in enumerate(files):
        if paired and k % 2 == 0:
            t = _cpu()
            _parse_every_line([path], orjson.loads)
            floor_cpu += _cpu() - t
        t = _cpu()
        facts = SessionFacts(probe="HW-PRB-0007", session=f"present-{k % 999 + 1:03d}", workspace=WORKSPACE,
                             config_dir=CONFIG, manifest=manifest, final_file=lambda rel: note,
                             identifiers=IDENTIFIERS)
        with open(path, "rb") as f:
            parsed = stream.parse(f)
        out = session_event(parsed, facts, ["current HW-DR-0052", "superseded HW-DR-0052"], ident)
        events_cpu += _cpu() - t
        if out.event is None:
            raise SystemExit(f"{path}: refused: {out.refusals}")
        events.append(out.event)
        if paired and k % 2 == 1:
            t = _cpu()
            _parse_every_line([path], orjson.loads)
            floor_cpu += _cpu() - t
    events_peak_kb = _peak_rss_kb()
    t = _cpu()
    written = rendered({"title": "bench"}, "bench", ["prose"], identity(), events)  # as transform_run.run_transform does
    result = intake.confirm_rendered(written, LOCK, {"HW-PRB-0007"})
    if result.refusal or len(result.events) != len(files):
        raise SystemExit(f"intake refused the bench transcript: {result.refusal}")
    transcript_cpu = _cpu() - t
    t = _cpu()  # apart, and not counted: the same confirmations of the text read back as a file is
    if repr(intake.confirm(written.text, LOCK, {"HW-PRB-0007"})) != repr(result):
        raise SystemExit("intake's verdict on the text differs from its verdict on the rendered transcript")
    return {"sessions": len(events), "calls": sum(len(e["calls"]) for e in events), "transcript_cpu": transcript_cpu,
            "file_confirm_cpu": _cpu() - t, "events_peak_rss_kb": events_peak_kb, "floor_cpu": floor_cpu,
            "events_cpu": events_cpu}


def child(kind: str, files: list[Path]) -> dict:
    """Run one measurement in a fresh interpreter: its CPU time and its own peak RSS."""
    code = ("import sys, json, importlib.util;"
            "spec = importlib.util.spec_from_file_location('bench_transform', %r);"
            "b = importlib.util.module_from_spec(spec); spec.loader.exec_module(b);"
            "from pathlib import Path; files = [Path(p) for p in json.load(sys.stdin)];"
            "import runner.stream, runner.harnesses, runner.transform, runner.transform.intake, runner.transform.transcript, fuzz_targets, orjson;"
            "base = b._peak_rss_kb(); t = b._cpu(); n = getattr(b, %r)(files); t = b._cpu() - t;"
            "print(json.dumps({'cpu': t, 'items': n, 'base_rss_kb': base, 'peak_rss_kb': b._peak_rss_kb()}))"
            % (str(Path(__file__).resolve()), kind))
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code], input=json.dumps([str(p) for p in files]), text=True,
                          capture_output=True, env=env, check=True)
    return json.loads(proc.stdout)


def jq(files: list[Path]) -> float | None:
    if not shutil.which("jq"):
        return None
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(["jq", "-c", ".type", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", type=_size, default=1 << 30, help="corpus size (default 1GiB)")
    ap.add_argument("--result-kb", type=int, default=20, help="tool result size in KB (default 20)")
    ap.add_argument("--dir", type=Path, default=None, help="where to write the corpus (default: a temp dir, removed)")
    ap.add_argument("--repeat", type=int, default=5, help="rounds of the paired floor and transform (default 5)")
    args = ap.parse_args()

    own = args.dir is None
    directory = Path(tempfile.mkdtemp(prefix="bench-transform-")) if own else args.dir
    directory.mkdir(parents=True, exist_ok=True)
    try:
        t = time.monotonic()
        files = generate(directory, args.size, args.result_kb * 1024)
        total = sum(p.stat().st_size for p in files)
        largest = max(len(line) for p in files for line in open(p, "rb"))
        print(f"corpus: {total / 1e6:.0f} MB in {len(files)} sessions, largest line {largest / 1e3:.0f} kB, "
              f"generated in {time.monotonic() - t:.0f} s in {directory}")
        for p in files:  # one read so every measurement starts from the page cache
            p.read_bytes()
        # The floor and the transform are measured paired, in one process, session by session
        # (full_transform_paired), in --repeat rounds; each figure is the median over the rounds, and
        # each ratio the median of the rounds' ratios. json is measured in a process of its own.
        rounds: list[dict[str, float]] = []
        for _ in range(args.repeat):
            r = child("full_transform_paired", files)
            transform_rss, work = r, r["items"]
            rounds.append({"floor": total / work["floor_cpu"] / 1e6, "events": total / work["events_cpu"] / 1e6,
                           "full_transform": total / (work["events_cpu"] + work["transcript_cpu"]) / 1e6})
        rates = {kind: statistics.median(r[kind] for r in rounds) for kind in rounds[0]}
        ratios = {kind: statistics.median(r[kind] / r["floor"] for r in rounds) for kind in rounds[0]}
        rates["stdlib"] = total / child("stdlib", files)["cpu"] / 1e6
        ratios["stdlib"] = rates["stdlib"] / rates["floor"]
        cpu = jq(files)
        if cpu:
            rates["jq"] = total / cpu / 1e6
            ratios["jq"] = rates["jq"] / rates["floor"]
        one = child("full_transform", files[:1])
        long_session = directory / "long.jsonl"  # one session as long as a quarter of the corpus
        rng = random.Random(1)
        long_session.write_bytes(_session(rng, _pool(rng), max(args.size // 4, SESSION_BYTES), args.result_kb * 1024, str(uuid.UUID(int=1))))
        long = child("full_transform", [long_session])
        names = {"floor": "floor (orjson, split + parse)", "stdlib": "json (standard library)", "jq": "jq -c .type",
                 "events": "transform: stream -> events", "full_transform": "full transform, transcript included"}
        for kind in ("floor", "stdlib", "jq", "events", "full_transform"):
            if kind in rates:
                print(f"{names[kind]:36s} {rates[kind]:7.0f} MB/s per core   {ratios[kind]:.2f}x floor")
        each = {kind: ", ".join(f"{r[kind] / r['floor']:.2f}" for r in rounds) for kind in ("events", "full_transform")}
        print(f"(floor and transform paired; medians of {args.repeat} rounds; each round's ratio: stream -> events {each['events']}; "
              f"full {each['full_transform']})")
        print(f"transcript (render + intake confirm) of {work['sessions']} events with {work['calls']} calls: "
              f"{work['transcript_cpu']:.1f} s CPU, {work['transcript_cpu'] / work['calls'] * 1e6:.0f} us per call; "
              f"confirming its text read back as a file, not counted above: "
              f"{work['file_confirm_cpu'] / work['calls'] * 1e6:.0f} us per call")
        print(f"largest line {largest / 1e6:.2f} MB; interpreter with imports {one['base_rss_kb'] / 1024:.0f} MiB")
        for name, r, size in (("the whole corpus", transform_rss, total), ("one session", one, files[0].stat().st_size),
                              ("one long session", long, long_session.stat().st_size)):
            print(f"peak RSS over {name} ({size / 1e6:.0f} MB): {r['items']['events_peak_rss_kb'] / 1024:.0f} MiB "
                  f"from stream to events, {r['peak_rss_kb'] / 1024:.0f} MiB with the transcript of its events")
    finally:
        if own:
            shutil.rmtree(directory, ignore_errors=True)


if __name__ == "__main__":
    main()
