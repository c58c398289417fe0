"""Throughput and peak memory of a harness stream written through the S3 backend, printed
beside the same figures for a single-shot upload of the same bytes, measured in the same run.

A moto server on loopback stands in for S3 (it keeps objects in memory: a 1 GiB run holds a
few GiB in this process, not in the measured ones). Each side runs as a child process so its
peak RSS (``VmHWM`` of /proc/self/status) is its own:

- baseline: interpreter, boto3 and the runner's store imported, the line generator built and
  one small object put (the fixed cost of any upload);
- stream: the bytes go through ``S3Store.writer`` in 64 KiB chunks, as the local executor
  hands them over (multipart, the tail spooled to local disk), twice: one part at a time
  (``parts_in_flight`` 1) and with ``--parts-in-flight`` parts uploading at once (default 4);
- single-shot: the bytes are read whole into memory, then sent with one ``put_object`` (what
  ``aws s3 cp -`` does with a small file);
- boto3's managed upload: the same bytes read as a file by ``upload_fileobj`` (s3transfer's
  multipart upload, what ``aws s3 cp -`` does with a large stream), with the same part size and
  ``--parts-in-flight`` threads: the reference multipart uploader, so its ratio to the
  single-shot is what the server allows any multipart upload, ours included.

The stream is synthetic stream-json: an init line, then assistant text and tool calls, tool
results of varied sizes, retry and rate-limit notices, and a result line, generated on the fly
from a small pool of line templates (never held whole in memory). Generation time is measured
apart and left out of the throughput. The run asserts that the stream's peak RSS stays within
the baseline plus (parts in flight + 1) part sizes plus a fixed allowance, and that every stored object reads back
with the expected size and sha256.

    python bench/store_s3.py [--size 1GiB] [--part-size 8MiB] [--parts-in-flight 4]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MIB = 1 << 20
CHUNK = 64 * 1024  # what the local executor reads from the harness at a time
ALLOWANCE = 32 * MIB  # fixed allowance above baseline + (parts in flight + 1) parts (see bench/README.md for what was measured)


def parse_size(text: str) -> int:
    units = {"": 1, "B": 1, "KIB": 1 << 10, "MIB": 1 << 20, "GIB": 1 << 30}
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num):]
    if not num or unit not in units:
        raise SystemExit(f"store_s3.py: size {text!r}: use e.g. 64MiB or 1GiB")
    return int(float(num) * units[unit])


def vm_hwm() -> int:
    """Peak resident set of this process, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise RuntimeError("no VmHWM in /proc/self/status")


# -- the synthetic stream ------------------------------------------------------------------

def line_pool(seed: int = 7) -> list[bytes]:
    """A few hundred stream-json lines in the shapes the real CLI prints, with a slot
    (@@N@@) for a per-line counter so no two emitted lines are the same."""
    rnd = random.Random(seed)
    words = "the decision status superseded current probe corpus file read grep note HW-DR-0052 answer".split()

    def text(n: int) -> str:
        return " ".join(rnd.choice(words) for _ in range(n))

    sid = "5f0c2d0e-8a51-4c1e-9a34-0d8c1b7e2f11"
    pool = []
    for i in range(320):
        kind = i % 8
        if kind in (0, 4):
            obj = {"type": "assistant", "message": {"id": "msg_@@N@@", "type": "message", "role": "assistant",
                   "model": "claude-sonnet-4-5-20250929", "content": [{"type": "text", "text": text(rnd.randint(5, 120))}],
                   "stop_reason": None, "usage": {"input_tokens": rnd.randint(10, 4000), "output_tokens": rnd.randint(1, 600)}},
                   "parent_tool_use_id": None, "session_id": sid, "uuid": "u-@@N@@"}
        elif kind in (1, 5):
            obj = {"type": "assistant", "message": {"id": "msg_@@N@@", "type": "message", "role": "assistant",
                   "model": "claude-sonnet-4-5-20250929",
                   "content": [{"type": "tool_use", "id": "toolu_@@N@@", "name": rnd.choice(["Read", "Grep", "Glob", "Bash"]),
                                "input": {"file_path": f"/workspace/docs/decisions/HW-DR-{rnd.randint(1, 99):04d}.md"}}]},
                   "parent_tool_use_id": None, "session_id": sid, "uuid": "u-@@N@@"}
        elif kind in (2, 3, 6):
            body = "\n".join(f"{n:>6}\t{text(rnd.randint(3, 14))}" for n in range(rnd.choice([4, 20, 80, 300])))
            obj = {"type": "user", "message": {"role": "user", "content": [{"tool_use_id": "toolu_@@N@@", "type": "tool_result",
                   "content": body}]}, "parent_tool_use_id": None, "session_id": sid, "uuid": "u-@@N@@"}
        elif i % 16 == 7:
            obj = {"type": "system", "subtype": "api_retry", "attempt": 1, "max_retries": 10, "retry_delay_ms": 512,
                   "error_status": 529, "error": "overloaded", "session_id": sid, "uuid": "u-@@N@@"}
        else:
            obj = {"type": "rate_limit_event", "rate_limit_info": {"status": "allowed", "resetsAt": 1764748800},
                   "session_id": sid, "uuid": "u-@@N@@"}
        pool.append(json.dumps(obj, ensure_ascii=False).encode() + b"\n")
    return pool


def stream_chunks(size: int, pool: list[bytes]):
    """Exactly ``size`` bytes of stream-json in CHUNK-sized pieces, built as they are asked for."""
    init = (b'{"type":"system","subtype":"init","cwd":"/workspace","session_id":"5f0c2d0e-8a51-4c1e-9a34-0d8c1b7e2f11",'
            b'"tools":["Read","Grep","Glob","Edit","Write","Bash"],"model":"claude-sonnet-4-5-20250929",'
            b'"permissionMode":"dontAsk","claude_code_version":"2.1.197"}\n')
    result = (b'{"type":"result","subtype":"success","is_error":false,"num_turns":@@N@@,"result":"HW-DR-0052 current.",'
              b'"total_cost_usd":1.2345,"session_id":"5f0c2d0e-8a51-4c1e-9a34-0d8c1b7e2f11"}\n')
    buf, sent, n = bytearray(init), 0, 0
    while sent < size:
        while len(buf) < CHUNK:
            buf += pool[n % len(pool)].replace(b"@@N@@", str(n).encode())
            n += 1
        room = size - sent
        if room <= 4 * CHUNK:  # the last piece: whole lines (longer than any line), a filler line to size, the result line
            while len(buf) < room:
                buf += pool[n % len(pool)].replace(b"@@N@@", str(n).encode())
                n += 1
            end = result.replace(b"@@N@@", str(n).encode())
            cut = buf.rfind(b"\n", 0, max(0, room - len(end) - 64)) + 1
            filler = b'{"type":"system","subtype":"status","status":"' + b"." * (room - cut - len(end) - 49) + b'"}\n'
            piece = bytes(buf[:cut]) + filler + end
            yield piece if len(piece) == room else (init + piece)[-room:]  # only a tiny --size lands in the else
            return
        yield bytes(buf[:CHUNK])
        del buf[:CHUNK]
        sent += CHUNK


# -- children --------------------------------------------------------------------------------

def child(args) -> None:
    from runner.settings import S3Settings
    from runner.store.s3 import S3Store

    store = S3Store(args.bucket, "bench", S3Settings(endpoint_url=args.endpoint, region="us-east-1", part_size=args.part_size,
                                                     parts_in_flight=args.parts_in_flight),
                    spool_dir=Path(args.spool))
    pool = line_pool()
    store.put(f"warm-{args.child}", b"{}\n")  # loads the service model and opens the connection pool
    out: dict = {"side": args.child}
    if args.child == "baseline":
        out["hwm"] = vm_hwm()
    elif args.child == "stream":
        sha, gen, t0 = hashlib.sha256(), 0.0, time.perf_counter()
        w = store.writer("stream.jsonl")
        chunks = stream_chunks(args.size, pool)
        while True:
            g = time.perf_counter()
            chunk = next(chunks, None)
            gen += time.perf_counter() - g
            if chunk is None:
                break
            sha.update(chunk)
            w.write(chunk)
        accepted = time.perf_counter()
        w.commit()
        out.update(seconds=time.perf_counter() - t0 - gen, generation=gen, bytes=w.size, sha256=w.sha256,
                   commit=time.perf_counter() - accepted,
                   expected="sha256:" + sha.hexdigest(), hwm=vm_hwm())
    elif args.child == "managed":
        from boto3.s3.transfer import TransferConfig

        reader = _Generated(stream_chunks(args.size, pool))
        config = TransferConfig(multipart_threshold=args.part_size, multipart_chunksize=args.part_size,
                                max_concurrency=args.parts_in_flight)
        t0 = time.perf_counter()
        store.client.upload_fileobj(reader, args.bucket, "bench/managed.jsonl", Config=config)
        out.update(seconds=time.perf_counter() - t0 - reader.generation, generation=reader.generation, bytes=reader.size,
                   expected="sha256:" + reader.sha.hexdigest(), hwm=vm_hwm())
    else:
        g = time.perf_counter()
        data = bytearray(args.size)
        view, at = memoryview(data), 0
        for chunk in stream_chunks(args.size, pool):
            view[at:at + len(chunk)] = chunk
            at += len(chunk)
        gen, t0 = time.perf_counter() - g, time.perf_counter()
        store.put("single.jsonl", data)
        out.update(seconds=time.perf_counter() - t0, generation=gen, bytes=len(data),
                   expected="sha256:" + hashlib.sha256(data).hexdigest(), hwm=vm_hwm())
    print(json.dumps(out), flush=True)


class _Generated:
    """The generated stream as a file boto3 reads (``read`` only, so not seekable, as a pipe)."""

    def __init__(self, chunks):
        self.chunks, self.buf, self.generation, self.size, self.sha = chunks, bytearray(), 0.0, 0, hashlib.sha256()

    def read(self, n: int = -1) -> bytes:
        g = time.perf_counter()
        while (n < 0 or len(self.buf) < n) and (chunk := next(self.chunks, None)) is not None:
            self.buf += chunk
        self.generation += time.perf_counter() - g
        data = bytes(self.buf if n < 0 else self.buf[:n])
        del self.buf[:len(data)]
        self.size += len(data)
        self.sha.update(data)
        return data


def run_child(side: str, args, endpoint: str, spool: str, parts_in_flight: int = 1) -> dict:
    cmd = [sys.executable, __file__, "--child", side, "--endpoint", endpoint, "--bucket", args.bucket,
           "--size", str(args.size), "--part-size", str(args.part_size), "--spool", spool,
           "--parts-in-flight", str(parts_in_flight)]
    done = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "AWS_ACCESS_KEY_ID": "bench",
                                                                      "AWS_SECRET_ACCESS_KEY": "bench"})
    if done.returncode != 0:
        raise SystemExit(f"store_s3.py: the {side} child failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def stored_digest(client, bucket: str, key: str) -> tuple[int, str]:
    body = client.get_object(Bucket=bucket, Key=key)["Body"]
    sha, n = hashlib.sha256(), 0
    for chunk in body.iter_chunks(8 * MIB):
        sha.update(chunk)
        n += len(chunk)
    return n, "sha256:" + sha.hexdigest()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size", type=parse_size, default=1 << 30, help="bytes of stream, e.g. 64MiB or 1GiB (default 1GiB)")
    ap.add_argument("--part-size", type=parse_size, default=8 * MIB, help="multipart part size (default 8MiB, the setting's default)")
    ap.add_argument("--parts-in-flight", type=int, default=4, help="parts uploaded at once by the parallel stream (default 4, "
                                                                   "the setting's default)")
    ap.add_argument("--child", choices=["baseline", "stream", "single", "managed"], help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", help=argparse.SUPPRESS)
    ap.add_argument("--bucket", default="bench", help=argparse.SUPPRESS)
    ap.add_argument("--spool", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(args)
        return 0

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "bench")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "bench")
    import logging

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    endpoint = f"http://127.0.0.1:{port}"
    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    client.create_bucket(Bucket=args.bucket)
    try:
        with tempfile.TemporaryDirectory(prefix="store-s3-spool-") as spool:
            print(f"store_s3: {args.size / MIB:.0f} MiB of stream-json, part size {args.part_size / MIB:.0f} MiB, "
                  f"moto server at {endpoint}", flush=True)
            base = run_child("baseline", args, endpoint, spool)
            print(f"baseline (interpreter + boto3 + store + generator, one small put): peak RSS {base['hwm'] / MIB:.1f} MiB", flush=True)
            rows = {}
            for name, side, key, flight in (("one part at a time", "stream", "bench/stream.jsonl", 1),
                                            (f"{args.parts_in_flight} parts in flight", "stream", "bench/stream.jsonl",
                                             args.parts_in_flight),
                                            ("single-shot", "single", "bench/single.jsonl", 1),
                                            ("boto3 managed upload", "managed", "bench/managed.jsonl", args.parts_in_flight)):
                r = run_child(side, args, endpoint, spool, flight)
                size, sha = stored_digest(client, args.bucket, key)
                assert size == args.size == r["bytes"] and sha == r["expected"], f"{side}: stored {size} bytes {sha}, expected {r}"
                client.delete_object(Bucket=args.bucket, Key=key)  # moto keeps it in this process's memory
                rows[name] = r
                commit = f", {r['commit']:.1f} s of it in commit" if "commit" in r else ""
                print(f"{name:>20}: {r['bytes'] / 1e6 / r['seconds']:7.1f} MB/s ({r['seconds']:.1f} s upload{commit}, "
                      f"{r['generation']:.1f} s generating, left out)  peak RSS {r['hwm'] / MIB:7.1f} MiB "
                      f"(+{(r['hwm'] - base['hwm']) / MIB:.1f} over baseline)  read back: size and sha256 match", flush=True)
            single = rows["single-shot"]
            ok = True
            for name, flight in (("one part at a time", 1), (f"{args.parts_in_flight} parts in flight", args.parts_in_flight)):
                r = rows[name]
                bound = base["hwm"] + (flight + 1) * args.part_size + ALLOWANCE
                ok = ok and r["hwm"] <= bound
                print(f"{name}: {single['seconds'] / r['seconds']:.2f}x the single-shot throughput; peak RSS "
                      f"{r['hwm'] / MIB:.1f} MiB <= baseline + ({flight} + 1) parts + {ALLOWANCE // MIB} MiB = "
                      f"{bound / MIB:.1f} MiB: {'yes' if r['hwm'] <= bound else 'NO'}")
            ratio = single["seconds"] / rows[f"{args.parts_in_flight} parts in flight"]["seconds"]
            managed = single["seconds"] / rows["boto3 managed upload"]["seconds"]
            print(f"boto3 managed upload ({args.parts_in_flight} threads, the same part size): {managed:.2f}x the single-shot "
                  f"throughput; the stream is {ratio / managed:.2f}x boto3's own multipart upload")
            print(f"verdict: {args.parts_in_flight} parts in flight {ratio:.2f}x the single-shot throughput; goal >= 0.9x "
                  f"{'holds' if ratio >= 0.9 else 'does not hold'} (boto3's managed upload: {managed:.2f}x); "
                  f"memory bound {'holds' if ok else 'does not hold'}")
            if not ok:
                return 1
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
