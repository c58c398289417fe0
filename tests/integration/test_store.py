"""The store contract, one set of test bodies run against both backends: the file backend and
S3 through moto's server mode over real HTTP (the real boto3 code path)."""

from __future__ import annotations

import threading

import boto3
import pytest
from botocore.exceptions import ClientError
from support.memstore import MemoryStore  # tests/ is on the path (tests/conftest.py)

from runner.ledger import Ledger, LedgerError
from runner.settings import S3Settings
from runner.store import AlreadyExists, NotFound, StoreError
from runner.store.file import FileStore
from runner.store.s3 import S3Store, is_transient

MIB = 1024 * 1024


@pytest.fixture(params=["file", "s3", "memory"])
def store(request, tmp_path, moto_endpoint, monkeypatch):
    """Every Store the suite holds to one contract: the two product backends, and a third, in
    memory (tests/support/memstore.py), which shows the contract is the Store class."""
    if request.param == "file":
        return FileStore(tmp_path / "store")
    if request.param == "memory":
        return MemoryStore()
    return _s3_store(tmp_path, moto_endpoint, monkeypatch)


def _s3_store(tmp_path, moto_endpoint, monkeypatch) -> S3Store:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    bucket = f"b-{abs(hash(str(tmp_path))) % 10**8}"
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return S3Store(bucket, "runs", S3Settings(endpoint_url=moto_endpoint, region="us-east-1", part_size=5 * MIB, backoff_seconds=0),
                   spool_dir=tmp_path / "spool")


def test_put_get_list_delete(store):
    store.put("campaigns/c/a.json", b"1")
    store.put("campaigns/c/sub/b.json", b"2")
    assert store.get("campaigns/c/a.json") == b"1"
    assert store.list("campaigns/c/") == ["campaigns/c/a.json", "campaigns/c/sub/b.json"]
    assert store.exists("campaigns/c/a.json") and not store.exists("campaigns/c/zzz")
    store.delete("campaigns/c/a.json")
    with pytest.raises(NotFound):
        store.get("campaigns/c/a.json")


def test_a_listing_past_one_page_holds_every_key(store):
    """S3 answers a listing 1,000 keys at a time: the store goes on from each page's token (a
    campaign of 1,000 sessions holds more keys than that under one prefix)."""
    keys = [f"campaigns/c/k/{i:05d}" for i in range(1005)]
    for key in keys:
        store.put(key, b"x")
    assert store.list("campaigns/c/k/") == keys


def test_create_only_has_one_winner(store):
    store.put("k", b"first", create_only=True)
    with pytest.raises(AlreadyExists):
        store.put("k", b"second", create_only=True)
    assert store.get("k") == b"first"


def test_a_stream_spanning_parts_is_stored_whole_with_its_digest(store):
    import hashlib

    chunk = bytes(range(256)) * 4096  # 1 MiB
    w = store.writer("s/stream.jsonl")
    for _ in range(12):
        w.write(chunk)
    w.write(b"tail\nlast line without newline")
    w.commit()
    data = store.get("s/stream.jsonl")
    assert len(data) == w.size == 12 * MIB + 30
    assert w.sha256 == "sha256:" + hashlib.sha256(data).hexdigest()
    lines = list(store.iter_lines("s/stream.jsonl"))
    assert b"".join(lines) == data and lines[-1] == b"last line without newline"


def test_a_multipart_stream_names_crc32_and_completes_with_each_parts_checksum(tmp_path, moto_endpoint, monkeypatch):
    """As boto3's own uploader does: S3 checks each part against the CRC32 botocore sends and
    builds the object's checksum from the parts', and an upload created so completes only with
    each part's CRC32. Naming no algorithm, the server computes a CRC64NVME of the whole object
    at completion, which moto does in Python: the commit of 1 GiB took 5.8 s that way, 2.8 s
    this way (bench/README.md, store_s3.py)."""
    store = _s3_store(tmp_path, moto_endpoint, monkeypatch)
    completions: list[bytes] = []
    store.client.meta.events.register("before-send.s3.CompleteMultipartUpload",
                                      lambda request, **_: completions.append(request.body))
    w = store.writer("s/stream.jsonl")
    for _ in range(11):
        w.write(b"x" * MIB)
    w.commit()
    head = store.client.head_object(Bucket=store.bucket, Key=store._key("s/stream.jsonl"), ChecksumMode="ENABLED")
    assert head["ContentLength"] == 11 * MIB and head.get("ChecksumCRC32") and "ChecksumCRC64NVME" not in head
    (body,) = completions
    assert body.count(b"<ChecksumCRC32>") == 3  # parts of 5, 5 and 1 MiB


def test_two_ledgers_on_one_store_never_overwrite_each_other(store):
    a, b = Ledger(store, "c"), Ledger(store, "c")
    errors = []

    def work(ledger, names):
        for n in names:
            try:
                ledger.intent(n, 1, {"n": n})
            except LedgerError as e:  # pragma: no cover - would be a failure below
                errors.append(e)

    threads = [threading.Thread(target=work, args=(a, [f"p/a-{i}" for i in range(8)])),
               threading.Thread(target=work, args=(b, [f"p/b-{i}" for i in range(8)]))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    fresh = Ledger(store, "c")
    assert not errors and len(fresh.entries) == 16 and fresh.verify() == []
    assert {e["session"] for e in fresh.entries} == {f"p/a-{i}" for i in range(8)} | {f"p/b-{i}" for i in range(8)}


def test_an_exact_retry_is_idempotent_and_a_changed_one_rejected(store):
    ledger = Ledger(store, "c")
    first = ledger.intent("p/s", 1, {"x": 1})
    assert ledger.intent("p/s", 1, {"x": 1}) == first and len(ledger.entries) == 1
    with pytest.raises(LedgerError):
        ledger.intent("p/s", 1, {"x": 2})
    with pytest.raises(LedgerError):
        ledger.outcome("p/s", 1, "succeeded")  # not started
    ledger.start("p/s", 1)
    ledger.outcome("p/s", 1, "succeeded")
    with pytest.raises(LedgerError):
        ledger.intent("p/s", 2, {"x": 1})  # a success is not resumable


def test_a_modified_entry_breaks_the_chain(store):
    ledger = Ledger(store, "c")
    for i in range(3):
        ledger.intent(f"p/{i}", 1, {})
    key = store.list("campaigns/c/ledger/")[1]
    store.put(key, store.get(key).replace(b'"p/1"', b'"p/X"'))
    assert any("entry 1 was modified" in p for p in Ledger(store, "c").verify())


def _client_error(status: int, code: str) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "PutObject")


def test_retry_policy_classifies_errors():
    assert is_transient(_client_error(500, "InternalError"))
    assert is_transient(_client_error(503, "SlowDown"))
    assert is_transient(_client_error(400, "RequestTimeout"))
    assert not is_transient(_client_error(403, "AccessDenied"))
    assert not is_transient(_client_error(404, "NoSuchKey"))


class _Flaky:
    """A client whose put_object fails a set number of times before the real call."""

    def __init__(self, real, failures: list[ClientError]):
        self.real, self.failures, self.calls = real, failures, 0

    def __getattr__(self, name):
        return getattr(self.real, name)

    def put_object(self, **kw):
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.real.put_object(**kw)


def test_transient_errors_retry_and_client_errors_fail_fast(moto_endpoint, monkeypatch):
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    real = boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1")
    real.create_bucket(Bucket="flaky")
    settings = S3Settings(endpoint_url=moto_endpoint, region="us-east-1", attempts=4, backoff_seconds=0)
    flaky = _Flaky(real, [_client_error(500, "InternalError"), _client_error(503, "SlowDown")])
    S3Store("flaky", "p", settings, client=flaky).put("k", b"v")
    assert flaky.calls == 3 and real.get_object(Bucket="flaky", Key="p/k")["Body"].read() == b"v"
    denied = _Flaky(real, [_client_error(403, "AccessDenied")])
    with pytest.raises(StoreError, match="s3://flaky/p/k2: AccessDenied"):
        S3Store("flaky", "p", settings, client=denied).put("k2", b"v")
    assert denied.calls == 1
    exhausted = _Flaky(real, [_client_error(500, "InternalError")] * 4)
    with pytest.raises(StoreError):
        S3Store("flaky", "p", settings, client=exhausted).put("k3", b"v")
    assert exhausted.calls == 4


def test_a_whole_campaign_runs_on_the_s3_store(moto_endpoint, tmp_path, claude_command, monkeypatch):
    import json
    import os
    import subprocess
    import sys

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    boto3.client("s3", endpoint_url=moto_endpoint, region_name="us-east-1").create_bucket(Bucket="campaigns")
    env = {**os.environ, "RUNNER_STORE": "s3://campaigns/team-a", "RUNNER_S3__ENDPOINT_URL": moto_endpoint,
           "RUNNER_S3__REGION": "us-east-1", "RUNNER_LOCAL__WORKDIR": str(tmp_path / "work"),
           "RUNNER_HARNESS__COMMAND": claude_command[0]}
    out = subprocess.run([sys.executable, "-m", "runner", "demo"], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    campaign = out.stdout.split("campaign ", 1)[1].split(",", 1)[0]
    store = S3Store("campaigns", "team-a", S3Settings(endpoint_url=moto_endpoint, region="us-east-1"))
    assert store.get(f"campaigns/{campaign}/transcripts/campaign-present.md").startswith(b"---\nkind: probe_transcript\n")
    assert Ledger(store, campaign).verify() == []
    refusals = json.loads(store.get(f"campaigns/{campaign}/transcripts/refusals.json"))
    assert refusals["refusals"] == []
    # The report's links to the bucket's streams are presigned, and open with no credentials.
    import html
    import re
    import urllib.request

    out = subprocess.run([sys.executable, "-m", "runner", "report", campaign, "--out", str(tmp_path / "r.html"), "--link-hours", "2"],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    links = [html.unescape(h) for h in re.findall(r'<a href="(http://[^"]+)">stream</a>', (tmp_path / "r.html").read_text())]
    assert len(links) == 8 and all("X-Amz-Expires=7200" in link for link in links)
    with urllib.request.urlopen(links[0], timeout=10) as r:
        assert r.read() == store.get(f"campaigns/{campaign}/sessions/HW-PRB-0007/present-001/stream.jsonl")
    # The transform's pool rebuilds the S3 store in each spawned process (its client does not pickle).
    from runner.corpus import load_stored_plan
    from runner.transform import run as transform_run

    plan = load_stored_plan(store, campaign)
    two = transform_run.transform_campaign(store, plan, workers=2)
    assert two.transcripts["present"].encode() == store.get(f"campaigns/{campaign}/transcripts/campaign-present.md")


def test_writing_a_key_again_supersedes_what_a_dead_writer_left(store):
    """Whoever writes a stream key again has all its bytes (the runner never rewrites a started
    session's stream; the Kubernetes executor re-uploads its own fetched copy after a restart)."""
    dead = store.writer("s/stream.jsonl")
    dead.write(b"x" * (6 * MIB))  # on S3: one part uploaded, the rest spooled
    dead.abort()
    again = store.writer("s/stream.jsonl")
    again.write(b"whole\n")
    again.commit()
    assert store.get("s/stream.jsonl") == b"whole\n"
    assert store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl") is None
    assert not store.exists("s/stream.incomplete.jsonl")
    if isinstance(store, S3Store):
        assert store._uploads("runs/s/stream.jsonl") == []  # the dead writer's upload was aborted


def test_a_dead_writers_bytes_are_kept_beside_its_key_and_a_second_salvage_finds_the_same(store):
    """A killed runner's stream is not lost and never taken for whole (Store.salvage)."""
    w = store.writer("s/stream.jsonl")
    w.write(b"line 1\nline 2 cut")
    w.abort()  # as a killed writer leaves it
    kept = store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl")
    assert kept is not None and (kept["key"], kept["bytes"]) == ("s/stream.incomplete.jsonl", 17)
    assert store.get("s/stream.incomplete.jsonl") == b"line 1\nline 2 cut" and not store.exists("s/stream.jsonl")
    assert store.salvage("s/stream.jsonl", "s/stream.incomplete.jsonl") == kept  # a crash mid-salvage: finished again


def test_a_link_opens_the_object_with_no_credentials(store):
    """The report's links: a file URI, or on S3 a presigned GET that needs nothing else."""
    import urllib.request

    store.put("campaigns/c/sessions/p/s/stream.jsonl", b'{"type":"result"}\n')
    link = store.link("campaigns/c/sessions/p/s/stream.jsonl", 600)
    assert link.startswith({FileStore: "file:///", S3Store: "http://", MemoryStore: "data:"}[type(store)])
    with urllib.request.urlopen(link, timeout=10) as r:
        assert r.read() == b'{"type":"result"}\n'
    if isinstance(store, S3Store):
        assert "X-Amz-Expires=600" in link and "X-Amz-Signature=" in link


def test_an_artifact_write_that_fails_leaves_no_upload_and_no_spool(store, tmp_path):
    """A session's file copied into the store (its source still on disk) is not salvaged: one that
    fails leaves no incomplete multipart upload (billed until aborted) and no spool (issue 28)."""
    with pytest.raises(RuntimeError), store.writer("s/artifacts/big.bin", create_only=False, salvage=False) as w:
        w.write(b"x" * (6 * MIB))  # on S3: one part uploaded, the rest spooled
        raise RuntimeError("the copy failed")
    assert not store.exists("s/artifacts/big.bin")
    if isinstance(store, S3Store):
        assert store._uploads("runs/s/artifacts/big.bin") == []
        assert not any((tmp_path / "spool").rglob("part-*"))
    elif isinstance(store, MemoryStore):
        assert store.partial == {}
    else:
        assert not list((tmp_path / "store").rglob("*.partial"))
