"""Faults, provoked for real: the runner SIGKILLed at each stage of a session and restarted,
and S3 answering 500, 503 SlowDown and dropped connections in the middle of an upload.

The runner runs as `python -m runner run` with the local executor, the real Claude Code CLI
under bwrap and the scripted provider, on the file backend and on S3 (moto's server over HTTP)
with the same test bodies. tests/faults.py runs it SIGKILLed at a named stage of runner/hooks.py
(a no-op in the product). What the harness emitted is known independently of the runner: the
harness command is a wrapper that appends every chunk of the real CLI's stdout to a record
in the session's log directory *before* passing it on, so the record always holds at least
what the runner received.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import boto3
import pytest
from support.cli import probe_runner  # tests/ is on the path (tests/conftest.py)

from runner import layout
from runner.demo import CORPUS, PLAN, SCENARIOS
from runner.hooks import STAGES
from runner.ledger import Ledger
from runner.settings import S3Settings
from runner.store import NotFound, StoreError
from runner.store.file import FileStore
from runner.store.s3 import S3Store
from tests.support.waiting import until

MIB = 1 << 20
SESSION = "HW-PRB-0007/present-001"
TURNS = 3  # main-loop requests of one whole session of the status-of-0052 scenario


def cli(*args, env, timeout=180, kill_at=None):
    """probe-runner ARGS; with ``kill_at``, SIGKILLed at that stage (tests/faults.py)."""
    return probe_runner(*args, env=env, timeout=timeout, kill_at=kill_at)


@pytest.fixture
def aws_env(monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")


@pytest.fixture(params=["file", "s3"])
def backend(request, tmp_path, moto_endpoint, aws_env):
    """(environment of the runner, the same store opened here to inspect it)."""
    work = tmp_path / "work"
    if request.param == "file":
        return {"RUNNER_STORE": (tmp_path / "store").as_uri(), "RUNNER_LOCAL__WORKDIR": str(work)}, FileStore(tmp_path / "store")
    bucket = f"faults-{abs(hash(str(tmp_path))) % 10**8}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    env = {"RUNNER_STORE": f"s3://{bucket}/runs", "RUNNER_S3__ENDPOINT_URL": moto_endpoint, "RUNNER_S3__REGION": "us-east-1",
           "RUNNER_LOCAL__WORKDIR": str(work)}
    return env, S3Store(bucket, "runs", S3Settings(endpoint_url=moto_endpoint, region="us-east-1"), spool_dir=work / ".s3-spool")


@pytest.fixture
def four_session_plan(tmp_path) -> Path:
    """The demo plan cut to one probe, one arm, four repetitions: present-001 ... present-004."""
    plan = json.loads(PLAN.read_text())
    plan.update(probes=plan["probes"][:1], arms=["present"], repetitions=4)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    return path


RECORDER_C = r"""
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>
int main(int argc, char **argv) {
    int p[2];
    if (pipe(p)) return 126;
    pid_t pid = fork();
    if (pid == 0) { dup2(p[1], 1); close(p[0]); close(p[1]); argv[0] = REAL; execv(REAL, argv); _exit(127); }
    close(p[1]);
    char path[4096];
    const char *dir = getenv("PROBE_LOG_DIR");
    snprintf(path, sizeof path, "%s/emitted.jsonl", dir ? dir : "/tmp");
    int record = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
    static char buf[65536];
    ssize_t n;
    while ((n = read(p[0], buf, sizeof buf)) > 0) {
        if (record >= 0 && write(record, buf, n) != n) return 125;  /* the record first */
        for (ssize_t off = 0; off < n;) { ssize_t w = write(1, buf + off, n - off); if (w <= 0) return 124; off += w; }
    }
    int st;
    waitpid(pid, &st, 0);
    return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}
"""


@pytest.fixture(scope="module")
def recording_harness(tmp_path_factory, claude_command) -> Path:
    """The real CLI behind a recorder that copies its stdout to ``$PROBE_LOG_DIR/emitted.jsonl``,
    each chunk to the record before the pipe. A compiled ELF, because the local executor
    confines only an ELF harness (it makes it non-dumpable through its loader)."""
    real = os.path.realpath(claude_command[0])
    d = tmp_path_factory.mktemp("harness")
    (d / "recorder.c").write_text(RECORDER_C)
    subprocess.run(["cc", "-O2", f"-DREAL={json.dumps(real)}", "-o", str(d / "claude-recorded"), str(d / "recorder.c")],
                   check=True, capture_output=True)
    return d / "claude-recorded"


def _emitted(work: Path, store, keys: layout.SessionKeys) -> bytes:
    """What the harness emitted: the record in the scratch directory a killed runner left,
    else the copy a finished session stored with its logs."""
    left = work / keys.campaign / keys.probe / f"{keys.session}.{keys.attempt}" / "log" / "emitted.jsonl"
    return left.read_bytes() if left.exists() else store.get(f"{keys.prefix}/log/emitted.jsonl")


def test_a_runner_killed_at_every_stage_keeps_every_byte_and_runs_no_session_twice(
        backend, four_session_plan, recording_harness, scripted_provider, tmp_path):
    """One campaign, one session at a time, the runner SIGKILLed at each stage in turn and
    restarted every time: present-001 is killed before its intent, after it, and once its
    stream is stored; present-002 before its outcome; present-003 in mid-stream; present-004
    then runs in peace. `ledger recover` settles the three that had started."""
    env, store = backend
    work = tmp_path / "work"
    provider = scripted_provider(json.loads(SCENARIOS.read_text()))
    env = {**env, "RUNNER_HARNESS__COMMAND": str(recording_harness), "RUNNER_PROVIDER__API_KEY": "k",
           "RUNNER_PROVIDER__BASE_URL": provider.base_url, "RUNNER_CONCURRENCY": "1"}
    run = ("run", str(four_session_plan), "--corpus", str(CORPUS))
    keys = {n: layout.SessionKeys("demo", "HW-PRB-0007", f"present-00{n}") for n in (1, 2, 3, 4)}

    def requests(n: int) -> int:
        """Main-loop requests of one session, told apart by the CLI session its harness emitted
        (every session sees the same workspace path, so the working directory cannot tell them)."""
        try:
            emitted = _emitted(work, store, keys[n])
        except NotFound:
            return 0  # its harness never ran
        sid = json.loads(emitted.split(b"\n", 1)[0])["session_id"]
        return sum(1 for r in provider.main_loop_requests() if r["headers"].get("x-claude-code-session-id") == sid)

    said = {}
    chain = (("before-intent", 1, 0), ("after-intent", 1, 0), ("stream-stored", 1, TURNS), ("before-outcome", 2, TURNS),
             ("mid-stream", 3, None))  # (stage, the session it kills, its main-loop requests by then)
    assert sorted(stage for stage, _, _ in chain) == sorted(STAGES)  # every kill point, none left out
    for stage, victim, requests_by_then in chain:
        killed = cli(*run, env=env, kill_at=stage)
        assert killed.returncode == -signal.SIGKILL, f"{stage}: {killed.stderr}"
        said[stage] = next(ln for ln in killed.stderr.splitlines() if ln.startswith(f"fault-injection: SIGKILL at {stage}"))
        assert f"HW-PRB-0007 present-00{victim}" not in killed.stderr  # it never finished, so never reported
        if requests_by_then is not None:
            assert requests(victim) == requests_by_then, stage
    ledger = Ledger(store, "demo")
    assert [e["session"] for e in ledger.entries if e["type"] == "intent"] == [f"HW-PRB-0007/present-00{n}" for n in (1, 2, 3)]

    restarted = cli(*run, env=env)
    assert restarted.returncode == 1, restarted.stderr
    for n in (1, 2, 3):
        assert f"interrupted: HW-PRB-0007/present-00{n} started and has no outcome" in restarted.stderr
    assert Ledger(store, "demo").state("HW-PRB-0007/present-004").status == "succeeded"
    assert store.get(keys[4].stream) == _emitted(work, store, keys[4])

    recovered = cli("ledger", "recover", "demo", env=env)
    assert recovered.returncode == 0, recovered.stderr
    ledger = Ledger(store, "demo")
    for n in (1, 2):  # committed before the kill: whole, and said so
        st, emitted = ledger.state(f"HW-PRB-0007/present-00{n}"), _emitted(work, store, keys[n])
        assert st.status == "interrupted" and "stored whole" in st.detail["reason"]
        assert store.get(keys[n].stream) == emitted and st.detail["stream"]["bytes"] == len(emitted)
        assert not store.exists(keys[n].partial_stream)
    st = ledger.state("HW-PRB-0007/present-003")
    accepted = int(said["mid-stream"].split("accepted=")[1])
    kept = store.get(keys[3].partial_stream)
    assert st.status == "interrupted" and 0 < accepted == len(kept)
    assert kept == _emitted(work, store, keys[3])[:accepted]  # every byte the runner had, and only those
    assert st.detail["stream_incomplete"]["sha256"] == "sha256:" + hashlib.sha256(kept).hexdigest()
    assert f"the {accepted} bytes its runner had captured" in recovered.stdout
    assert not store.exists(keys[3].stream)  # never presented as the stream
    assert not [k for k in store.list("campaigns/demo/") if k.endswith(".partial")]
    assert not any((work / ".s3-spool").glob("*/*"))  # the S3 spool was emptied into the store

    assert [requests(n) for n in (1, 2, 4)] == [TURNS] * 3 and requests(3) <= TURNS  # no session ran twice
    starts = [e["session"] for e in ledger.entries if e["type"] == "start"]
    assert sorted(starts) == [f"HW-PRB-0007/present-00{n}" for n in (1, 2, 3, 4)]
    assert ledger.verify() == []
    verify = cli("ledger", "verify", "demo", env=env)
    assert verify.returncode == 0 and "chain verifies" in verify.stdout


# -- a writer killed mid-stream, at the store level: parts in S3, the rest in the spool ------

KILLED_WRITER = r"""
import hashlib, json, os, signal, sys
from pathlib import Path
spec = json.loads(sys.argv[1])
if spec["kind"] == "file":
    from runner.store.file import FileStore
    store = FileStore(Path(spec["root"]))
else:
    from runner.settings import S3Settings
    from runner.store.s3 import S3Store
    store = S3Store(spec["bucket"], "p", S3Settings(endpoint_url=spec["endpoint"], region="us-east-1", part_size=5 << 20,
                                                    parts_in_flight=spec.get("parts_in_flight", 1)),
                    spool_dir=Path(spec["spool"]))
w = store.writer("s/stream.jsonl")
sha, n, i = hashlib.sha256(), 0, 0
while n < spec["bytes"]:
    line = json.dumps({"type": "assistant", "n": i, "text": "x" * (i % 900)}).encode() + b"\n"
    w.write(line)
    sha.update(line)
    n, i = n + len(line), i + 1
print(n, "sha256:" + sha.hexdigest(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(params=["file", "s3"])
def bare_store(request, tmp_path, moto_endpoint, aws_env):
    """(a store, the spec a child process opens the same store from)."""
    if request.param == "file":
        return FileStore(tmp_path / "store"), {"kind": "file", "root": str(tmp_path / "store")}
    bucket = f"kw-{abs(hash(str(tmp_path))) % 10**8}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    store = S3Store(bucket, "p", S3Settings(endpoint_url=moto_endpoint, region="us-east-1", part_size=5 * MIB),
                    spool_dir=tmp_path / "spool")
    return store, {"kind": "s3", "bucket": bucket, "endpoint": moto_endpoint, "spool": str(tmp_path / "spool")}


def test_a_writer_killed_after_two_parts_leaves_every_accepted_byte_to_salvage(bare_store):
    store, spec = bare_store
    child = subprocess.run([sys.executable, "-c", KILLED_WRITER, json.dumps({**spec, "bytes": 12 * MIB + 4321})],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    size, sha = child.stdout.split()
    assert not store.exists("s/stream.jsonl")
    kept = store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl")
    assert (kept["bytes"], kept["sha256"]) == (int(size), sha)
    assert store.describe("s/stream.incomplete.jsonl") == {k: kept[k] for k in ("key", "bytes", "sha256")}
    assert not store.exists("s/stream.jsonl")  # the salvage never shows it as the stream
    if spec["kind"] == "s3":
        assert kept["kept_from"].startswith("2 uploaded part(s) + ")  # 12 MiB = two 5 MiB parts + the spool
        assert store._uploads("p/s/stream.jsonl") == [] and not any(Path(spec["spool"]).iterdir())
    assert store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl") == kept  # again: the same, nothing new


# -- S3 faults in the middle of an upload, from a relay in front of moto ----------------------

class FaultyRelay:
    """A loopback HTTP relay in front of moto that answers chosen requests with a fault.

    ``inject(match, *faults)`` queues faults for the requests ``match(method, path)`` selects,
    one per request, in order: "500" (InternalError), "503" (SlowDown), "403" (AccessDenied),
    "drop" (read half of the request body, then close the connection), or "hold" (read the
    request, then relay it only once ``release()`` is called). Every request is logged as
    (method, path, what happened), so tests count attempts as S3 saw them.
    """

    ERRORS = {"500": (500, "InternalError"), "503": (503, "SlowDown"), "403": (403, "AccessDenied")}

    def __init__(self, upstream: str):
        self.upstream = urlsplit(upstream).netloc
        self.faults: list[list] = []
        self.log: list[tuple[str, str, str]] = []
        self.lock = threading.Lock()
        self.released = threading.Event()
        relay = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _any(self):
                length = int(self.headers.get("Content-Length") or 0)
                fault = relay._take(self.command, self.path)
                relay.log.append((self.command, self.path, fault or "relayed"))
                if fault == "drop":
                    self.rfile.read(length // 2)
                    self.close_connection = True
                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                body = self.rfile.read(length)
                if fault == "hold":
                    relay.released.wait(60)
                elif fault:
                    status, code = relay.ERRORS[fault]
                    xml = f"<Error><Code>{code}</Code><Message>injected</Message></Error>".encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/xml")
                    self.send_header("Content-Length", str(len(xml)))
                    self.end_headers()
                    self.wfile.write(xml)
                    return
                up = http.client.HTTPConnection(relay.upstream, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("expect", "connection")}
                up.request(self.command, self.path, body=body, headers=headers)
                resp = up.getresponse()
                data = resp.read()
                self.send_response(resp.status)
                for k, v in resp.getheaders():
                    if k.lower() not in ("transfer-encoding", "connection", "content-length", "server", "date"):
                        self.send_header(k, v)
                self.send_header("Content-Length", resp.getheader("Content-Length", "0") if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)
                up.close()

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _any

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def release(self) -> None:
        self.released.set()

    def inject(self, match, *faults: str) -> None:
        with self.lock:
            self.faults.append([match, list(faults)])

    def _take(self, method: str, path: str) -> str | None:
        with self.lock:
            for match, queued in self.faults:
                if queued and match(method, path):
                    return queued.pop(0)
        return None

    def attempts(self, match) -> list[str]:
        return [what for method, path, what in self.log if match(method, path)]


def upload_part(n: int):
    return lambda method, path: method == "PUT" and f"partNumber={n}&" in path + "&" and "uploadId=" in path


def completion(method: str, path: str) -> bool:
    return method == "POST" and "uploadId=" in path


@pytest.fixture
def relay(moto_endpoint, aws_env, tmp_path):
    r = FaultyRelay(moto_endpoint)
    r.bucket = f"relayed-{abs(hash(str(tmp_path))) % 10**8}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=r.bucket)
    yield r
    r.server.shutdown()
    r.server.server_close()


def _relayed_store(relay, tmp_path, attempts=5) -> S3Store:
    return S3Store(relay.bucket, "p", S3Settings(endpoint_url=relay.url, region="us-east-1", part_size=5 * MIB,
                                                 attempts=attempts, backoff_seconds=0), spool_dir=tmp_path / "spool")


def test_a_multipart_stream_survives_server_errors_throttling_and_a_dropped_part(relay, tmp_path):
    store = _relayed_store(relay, tmp_path)
    relay.inject(upload_part(2), "500", "503", "drop")
    relay.inject(upload_part(3), "503")
    relay.inject(completion, "500")
    data = b"".join(json.dumps({"type": "user", "n": i, "pad": "y" * (i % 700)}).encode() + b"\n" for i in range(33000))
    w = store.writer("s/stream.jsonl")
    for i in range(0, len(data), 65536):
        w.write(data[i:i + 65536])
    w.commit()
    assert len(data) > 10 * MIB and w.size == len(data)
    assert w.sha256 == "sha256:" + hashlib.sha256(data).hexdigest()
    assert store.get("s/stream.jsonl") == data
    assert relay.attempts(upload_part(1)) == ["relayed"]
    assert relay.attempts(upload_part(2)) == ["500", "503", "drop", "relayed"]
    assert relay.attempts(upload_part(3)) == ["503", "relayed"]
    assert relay.attempts(completion) == ["500", "relayed"]


def test_a_part_failing_on_every_attempt_stops_after_the_policys_attempts(relay, tmp_path):
    store = _relayed_store(relay, tmp_path, attempts=3)
    relay.inject(upload_part(1), "503", "drop", "500", "500")
    w = store.writer("s/stream.jsonl")
    w.write(b"z" * (5 * MIB))  # accepted (in the spool); the part goes up while the next fills
    with pytest.raises(StoreError, match=f"upload_part s3://{relay.bucket}/p/s/stream.jsonl: InternalError"):
        w.commit()  # the part's failure raises in the writer's thread, from commit or the next write
    assert relay.attempts(upload_part(1)) == ["503", "drop", "500"]  # three attempts, the fourth fault unused


def test_client_errors_fail_at_once_naming_bucket_and_key(relay, tmp_path):
    store = _relayed_store(relay, tmp_path)
    b = relay.bucket
    relay.inject(lambda m, p: m == "PUT" and p.startswith(f"/{b}/p/denied"), "403", "403")
    with pytest.raises(StoreError, match=f"put_object s3://{b}/p/denied.json: AccessDenied"):
        store.put("denied.json", b"{}")
    assert relay.attempts(lambda m, p: p.startswith(f"/{b}/p/denied")) == ["403"]
    with pytest.raises(NotFound, match=f"s3://{b}/p/missing.json does not exist"):
        store.get("missing.json")
    assert relay.attempts(lambda m, p: p.startswith(f"/{b}/p/missing")) == ["relayed"]
    elsewhere = S3Store("no-such-bucket", "p", store.settings, spool_dir=tmp_path / "spool")
    with pytest.raises(StoreError, match=r"s3://no-such-bucket/p/k.json: NoSuchBucket"):
        elsewhere.put("k.json", b"{}")
    assert relay.attempts(lambda m, p: p.startswith("/no-such-bucket/")) == ["relayed"]


def test_a_salvage_cut_short_is_finished_by_the_next_call(relay, tmp_path):
    store = _relayed_store(relay, tmp_path)
    data = os.urandom(11 * MIB)
    w = store.writer("s/stream.jsonl")
    w.write(data)  # two parts up, 1 MiB in the spool; then the writer's process "dies"
    w.abort()
    relay.inject(lambda m, p: m == "PUT" and "/p/s/stream.incomplete.jsonl?uploadId=" in p, "403")  # a part copy
    with pytest.raises(StoreError, match="AccessDenied"):
        store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl")
    assert store.exists("s/stream.jsonl")  # the parts, completed to be copied: mid-salvage, not a stream
    kept = store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl")
    assert store.get("s/stream.incomplete.jsonl") == data and kept["bytes"] == len(data)
    assert not store.exists("s/stream.jsonl")


def test_without_the_spool_the_uploaded_parts_are_kept_and_the_loss_is_stated(relay, tmp_path):
    """Recovering on another host (no spool): what S3 holds is kept; the note says the rest,
    at most the parts in flight and the one filling, is gone."""
    store = _relayed_store(relay, tmp_path)
    data = os.urandom(12 * MIB)
    w = store.writer("s/stream.jsonl")
    w.write(data)  # two 5 MiB parts uploaded, 2 MiB only in the spool
    w.abort()
    shutil.rmtree(tmp_path / "spool")
    kept = store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl")
    assert store.get("s/stream.incomplete.jsonl") == data[:10 * MIB] and kept["bytes"] == 10 * MIB
    assert kept["kept_from"] == "2 uploaded part(s) + no spool on this host: bytes after the uploaded parts (at most 5 parts) are lost"


KILLED_WITH_A_PART_IN_FLIGHT = r"""
import hashlib, json, os, signal, sys, time
from pathlib import Path
from runner.settings import S3Settings
from runner.store.s3 import S3Store
spec = json.loads(sys.argv[1])
store = S3Store(spec["bucket"], "p", S3Settings(endpoint_url=spec["endpoint"], region="us-east-1", part_size=5 << 20,
                                                parts_in_flight=4), spool_dir=Path(spec["spool"]))
w = store.writer("s/stream.jsonl")
data = os.urandom(17 * (1 << 20) + 99)  # three whole parts, then 2 MiB filling the fourth
w.write(data)
deadline = time.monotonic() + 60
while {n for f, n in w.inflight.items() if f.done()} != {2, 3}:  # part 1 is held at the relay
    assert time.monotonic() < deadline, "parts 2 and 3 did not finish"
    time.sleep(0.02)
print(len(data), "sha256:" + hashlib.sha256(data).hexdigest(), flush=True)
os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.mark.parametrize("released", ["after", "before"])
def test_a_writer_killed_with_an_earlier_part_in_flight_loses_no_byte(relay, tmp_path, released):
    """Parts in flight finish out of order: part 1 is held at the relay while 2 and 3 are
    uploaded, and the writer is SIGKILLed. Its spool still holds every part from the first one
    not uploaded, so the salvage keeps every accepted byte whether part 1 lands before it
    (a prefix of three parts, then the spool's tail) or after it (the spool alone)."""
    relay.inject(upload_part(1), "hold")
    spec = {"bucket": relay.bucket, "endpoint": relay.url, "spool": str(tmp_path / "spool")}
    child = subprocess.run([sys.executable, "-c", KILLED_WITH_A_PART_IN_FLIGHT, json.dumps(spec)],
                           capture_output=True, text=True, timeout=120)
    assert child.returncode == -signal.SIGKILL, child.stderr
    size, sha = child.stdout.split()
    assert relay.attempts(upload_part(2)) == ["relayed"] and relay.attempts(upload_part(3)) == ["relayed"]
    store = _relayed_store(relay, tmp_path)
    if released == "before":
        relay.release()
        _wait_for(lambda: any(p["PartNumber"] == 1 for p in store._parts("p/s/stream.jsonl", store._uploads("p/s/stream.jsonl")[-1])))
    kept = store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl")
    relay.release()
    assert (kept["bytes"], kept["sha256"]) == (int(size), sha)
    assert kept["kept_from"].startswith("3 uploaded part(s) + " if released == "before" else "0 uploaded part(s) + ")
    assert not store.exists("s/stream.jsonl")


def _wait_for(condition, seconds: float = 30) -> None:
    until(condition, seconds, "the condition")
