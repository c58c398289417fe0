"""The S3 backend (``s3://bucket/prefix``), through boto3.

Retries are policy, not botocore's defaults: botocore's own retries are switched off and every
call goes through one tenacity policy that retries transient failures (5xx, throttling,
connection errors) and fails fast on client errors, naming the bucket and key. Create-only
writes are conditional puts (``If-None-Match: *``), so of two writers exactly one wins.
Streams are multipart uploads with up to ``parts_in_flight`` parts uploading at once while the
next one fills (so memory holds at most that many parts plus one), spooled to local disk until
each part is uploaded, so a killed process loses nothing it accepted: its uploaded parts stay
in S3 and the rest is in the spool, on the disk of the host it ran on (lose that host and at
most ``parts_in_flight + 1`` parts' worth of bytes is gone). ``salvage`` keeps both under
another key.
"""

from __future__ import annotations

import builtins
import hashlib
import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterator
from concurrent.futures import ALL_COMPLETED, FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from datetime import datetime
from pathlib import Path
from typing import IO, TYPE_CHECKING, ParamSpec, TypedDict, TypeVar, cast
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from runner.errors import UserError
from runner.retry import RetryPolicy
from runner.store.base import AlreadyExists, NotFound, Salvaged, Store, StoreError, StreamWriter

if TYPE_CHECKING:
    # boto3-stubs[s3] (the test extras): the client's calls and answers as TypedDicts
    from botocore.response import StreamingBody
    from mypy_boto3_s3 import S3Client
    from mypy_boto3_s3.type_defs import CompletedPartTypeDef, PartTypeDef, UploadPartOutputTypeDef

    from runner.settings import S3Settings, Settings

log = logging.getLogger(__name__)
P = ParamSpec("P")
R = TypeVar("R")


class _IfAbsent(TypedDict, total=False):
    """A create-only write's condition (``If-None-Match: *``), or none."""

    IfNoneMatch: str


class _NextKeys(TypedDict, total=False):
    """Where a listing of keys goes on from (none on its first page)."""

    ContinuationToken: str


class _NextUploads(TypedDict, total=False):
    """Where a listing of multipart uploads goes on from (none on its first page)."""

    KeyMarker: str
    UploadIdMarker: str


class _SalvageBegun(TypedDict):
    """``salvage.json`` in a key's spool: how many uploaded parts the salvage's first step kept."""

    parts: int

_THROTTLING = {"Throttling", "ThrottlingException", "SlowDown", "RequestLimitExceeded", "TooManyRequests",
               "RequestTimeout", "InternalError", "ServiceUnavailable"}


def is_transient(exc: BaseException) -> bool:
    """5xx, throttling and connection errors are worth another attempt; 4xx are not."""
    if isinstance(exc, ClientError):
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return status >= 500 or exc.response.get("Error", {}).get("Code") in _THROTTLING
    return isinstance(exc, (BotoConnectionError, BotoCoreError)) and not isinstance(exc, ClientError)


def _code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _client(s3_settings: S3Settings) -> S3Client:
    return boto3.client(
        "s3", endpoint_url=s3_settings.endpoint_url, region_name=s3_settings.region,
        # total_max_attempts counts the first try; botocore's max_attempts would still allow one retry;
        # s3v4 for presigned links too, which botocore would otherwise sign with SigV2 on some endpoints
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60,
                      signature_version="s3v4"),
    )


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str, s3_settings: S3Settings, client: S3Client | None = None,
                 spool_dir: Path | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = s3_settings
        self.retry = RetryPolicy(is_transient, s3_settings.attempts, s3_settings.backoff_seconds)
        self.spool_dir = spool_dir or Path(tempfile.gettempdir()) / "probe-runner" / ".s3-spool"
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client or _client(s3_settings)

    def __getstate__(self) -> dict[str, object]:
        """What a spawned process (the transform's pool) rebuilds this store from: no client,
        which does not pickle; it makes its own from the settings (a client given to the
        constructor stays in this process)."""
        return {k: v for k, v in self.__dict__.items() if k != "client"}

    def __setstate__(self, state: dict[str, object]) -> None:
        self.__dict__.update(state)
        self.client = _client(self.settings)

    @classmethod
    def from_uri(cls, uri: str, settings: Settings | None = None) -> S3Store:
        from runner.settings import S3Settings

        parsed = urlparse(uri)
        if not parsed.netloc:
            raise UserError(f"store {uri!r}: an S3 store needs a bucket, s3://bucket/prefix")
        if settings is None:
            return cls(parsed.netloc, parsed.path, S3Settings())
        # The spool sits in the work directory, where `ledger recover` on the same host finds it.
        return cls(parsed.netloc, parsed.path, settings.s3, spool_dir=settings.local.workdir / ".s3-spool")

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def spool_path(self, full_key: str) -> Path:
        """The local spool directory of a writer of ``full_key`` (one per bucket and key)."""
        return self.spool_dir / hashlib.sha256(f"{self.bucket}/{full_key}".encode()).hexdigest()[:32]

    def call(self, op: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        """One S3 call (a method of the client, e.g. ``self.client.put_object``) under the retry
        policy; client errors raise StoreError naming the operation, bucket and key."""
        try:
            return self.retry.retrying()(op, *args, **kwargs)
        except ClientError as e:
            where = f"s3://{self.bucket}/{kwargs.get('Key', '')}"
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{where} does not exist") from None
            if _code(e) in ("PreconditionFailed", "412"):
                raise AlreadyExists(f"{where} exists") from None
            raise StoreError(f"{op.__name__} {where}: {_code(e)}: {e.response.get('Error', {}).get('Message', e)}") from None
        except BotoCoreError as e:
            raise StoreError(f"{op.__name__} s3://{self.bucket}/{kwargs.get('Key', '')}: {e}") from None

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        extra: _IfAbsent = {"IfNoneMatch": "*"} if create_only else {}
        self.call(self.client.put_object, Bucket=self.bucket, Key=self._key(key), Body=data, **extra)

    def get(self, key: str) -> bytes:
        return self._body(key).read()

    def _body(self, key: str) -> StreamingBody:
        return self.call(self.client.get_object, Bucket=self.bucket, Key=self._key(key))["Body"]

    def open(self, key: str) -> IO[bytes]:
        # botocore's StreamingBody is an IOBase: read, iteration by line, close, a context manager
        return cast("IO[bytes]", self._body(key))

    def iter_lines(self, key: str) -> Iterator[bytes]:
        """Lines with their newlines, memory bounded by the longest line plus one chunk."""
        body = self._body(key)
        buf = b""
        try:
            for chunk in body.iter_chunks(1 << 20):
                buf += chunk
                start = 0
                while (i := buf.find(b"\n", start)) != -1:
                    yield buf[start:i + 1]
                    start = i + 1
                buf = buf[start:]
            if buf:
                yield buf
        finally:
            body.close()

    def exists(self, key: str) -> bool:
        try:
            self.call(self.client.head_object, Bucket=self.bucket, Key=self._key(key))
            return True
        except NotFound:
            return False

    def list(self, prefix: str) -> list[str]:
        keys: builtins.list[str] = []
        token: str | None = None
        full = self._key(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0
        while True:
            more: _NextKeys = {"ContinuationToken": token} if token else {}
            page = self.call(self.client.list_objects_v2, Bucket=self.bucket, Prefix=full, **more)
            keys += [o["Key"][cut:] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(keys)
            token = page["NextContinuationToken"]

    def writer(self, key: str, *, create_only: bool = True, salvage: bool = True) -> StreamWriter:
        return _S3StreamWriter(self, key, create_only, salvage)

    def delete(self, key: str) -> None:
        self.call(self.client.delete_object, Bucket=self.bucket, Key=self._key(key))

    def link(self, key: str, seconds: int) -> str:
        """A presigned GET: signed here with the caller's credentials, no request made. Whoever
        holds it reads that one object until it expires (SigV4 allows at most 7 days)."""
        return str(self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self._key(key)},
                                                      ExpiresIn=seconds))

    def _uploads(self, full_key: str) -> builtins.list[str]:
        """Ids of the incomplete multipart uploads of exactly ``full_key``, oldest first."""
        found: builtins.list[tuple[datetime, str]] = []
        marks: _NextUploads = {}
        while True:
            page = self.call(self.client.list_multipart_uploads, Bucket=self.bucket, Prefix=full_key, **marks)
            found += [(u["Initiated"], u["UploadId"]) for u in page.get("Uploads", []) if u["Key"] == full_key]
            if not page.get("IsTruncated"):
                return [u for _, u in sorted(found)]
            marks = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def _parts(self, full_key: str, upload_id: str) -> builtins.list[CompletedPartTypeDef]:
        """The uploaded parts 1..k of an upload (a gap ends the run: what follows it is not contiguous)."""
        parts: builtins.list[PartTypeDef] = []
        marker = 0
        while True:
            page = self.call(self.client.list_parts, Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumberMarker=marker)
            parts += page.get("Parts", [])
            if not page.get("IsTruncated"):
                break
            marker = page["NextPartNumberMarker"]
        run: builtins.list[CompletedPartTypeDef] = []
        for p in sorted(parts, key=lambda p: p["PartNumber"]):
            if p["PartNumber"] != len(run) + 1:
                break
            run.append(_part(p["PartNumber"], p))
        return run

    def salvage(self, key: str, dest: str) -> Salvaged | None:
        """Uploaded parts plus the spooled tail, kept under ``dest``.

        An incomplete upload's parts can be neither read nor copied, so they are first
        completed under ``key`` itself, copied server-side into ``dest`` with the tail from the
        spool appended, and ``key`` is deleted again. An upload opened at ``dest`` before that
        step marks the salvage as begun: a later call that finds it knows the object at
        ``key`` is this salvage's, not a committed stream, and finishes the job. The record of
        what was kept (parts, tail bytes, or that the tail's spool was not on this host) rides
        along as the object's ``salvage`` metadata.
        """
        full, dfull = self._key(key), self._key(dest)
        spool, state = self.spool_path(full), self.spool_path(full) / "salvage.json"
        if self.exists(dest):
            self._forget(key, full, spool)
            return self._described(dest)
        begun = self._uploads(dfull)
        if not begun:
            if self.exists(key):  # committed; what a dead writer left of it is stale
                for u in self._uploads(full):
                    self.call(self.client.abort_multipart_upload, Bucket=self.bucket, Key=full, UploadId=u)
                shutil.rmtree(spool, ignore_errors=True)
                return None
            orphans = self._uploads(full)
            parts = _prefix(self._parts(full, orphans[-1])) if orphans else []
            tail = _spooled(spool, len(parts) + 1)
            if not parts and not tail:  # it died before accepting a byte
                self._forget(key, full, spool)
                return None
            note = f"{len(parts)} uploaded part(s) + " + (
                f"{len(tail)} spooled bytes" if tail is not None
                else f"no spool on this host: bytes after the uploaded parts (at most {self.settings.parts_in_flight + 1} "
                     "parts) are lost")
            if not parts and tail:  # (tail is not empty here: one of the two was, above)
                self.call(self.client.put_object, Bucket=self.bucket, Key=dfull, Body=tail, IfNoneMatch="*", Metadata={"salvage": note})
                self._forget(key, full, spool)
                return self._described(dest)
            spool.mkdir(parents=True, exist_ok=True)
            begun_state: _SalvageBegun = {"parts": len(parts)}
            state.write_text(json.dumps(begun_state))
            begun = [self.call(self.client.create_multipart_upload, Bucket=self.bucket, Key=dfull,
                               Metadata={"salvage": note})["UploadId"]]
        kept: int | None = _salvage_begun(state.read_text())["parts"] if state.exists() else None
        if not self.exists(key):
            orphan = self._uploads(full)[-1]
            # The prefix as the first step counted it: a part sent before the writer died may
            # have landed since, and its bytes are in the tail.
            parts = _prefix(self._parts(full, orphan))[:kept]
            self.call(self.client.complete_multipart_upload, Bucket=self.bucket, Key=full, UploadId=orphan, IfNoneMatch="*",
                      MultipartUpload={"Parts": parts})
        tail = _spooled(spool, kept + 1) if kept is not None else None
        upload = begun[-1]
        size = self.call(self.client.head_object, Bucket=self.bucket, Key=full)["ContentLength"]
        step, start = max(self.settings.part_size, 5 << 20), 0
        ranges: builtins.list[tuple[int, int]] = []
        while start < size:  # every copied part but the last is at least one part size; S3 wants >= 5 MiB
            end = size if size - start < 2 * step else start + step
            ranges.append((start, end))
            start = end
        done: builtins.list[CompletedPartTypeDef] = []
        for n, (a, b) in enumerate(ranges, 1):
            r = self.call(self.client.upload_part_copy, Bucket=self.bucket, Key=dfull, UploadId=upload, PartNumber=n,
                          CopySource={"Bucket": self.bucket, "Key": full}, CopySourceRange=f"bytes={a}-{b - 1}")
            done.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
        if tail:
            n = len(done) + 1
            done.append({"PartNumber": n, "ETag": self.call(self.client.upload_part, Bucket=self.bucket, Key=dfull, UploadId=upload,
                                                            PartNumber=n, Body=tail)["ETag"]})
        self.call(self.client.complete_multipart_upload, Bucket=self.bucket, Key=dfull, UploadId=upload,
                  MultipartUpload={"Parts": done}, IfNoneMatch="*")
        self._forget(key, full, spool)
        return self._described(dest)

    def _forget(self, key: str, full: str, spool: Path) -> None:
        """After a salvage: the intermediate object, stale uploads and the spool go."""
        if self.exists(key):
            self.delete(key)
        for u in self._uploads(full):
            self.call(self.client.abort_multipart_upload, Bucket=self.bucket, Key=full, UploadId=u)
        shutil.rmtree(spool, ignore_errors=True)

    def _described(self, key: str) -> Salvaged:
        meta = self.call(self.client.head_object, Bucket=self.bucket, Key=self._key(key)).get("Metadata", {})
        return {**self.describe(key), "kept_from": meta.get("salvage", "")}


class _S3StreamWriter(StreamWriter):
    """A multipart upload: a part goes up as it fills, up to ``parts_in_flight`` at once from a
    thread pool while the next one fills, so memory holds at most that many parts plus one.

    Every byte is also appended to a spool file on local disk before ``write`` returns, one
    file per part. A part's file is deleted only once it and every part before it are
    uploaded, so a killed process leaves a prefix of uploaded parts in S3 and every byte after
    that prefix in the spool (parts that finished out of order are in both), and
    :meth:`S3Store.salvage` joins the two. A part that fails for good (after the retry policy)
    raises from the next ``write`` or from ``commit``.
    """

    def __init__(self, store: S3Store, key: str, create_only: bool, salvage: bool = True):
        super().__init__()
        self.store, self.key, self.create_only, self.salvage = store, key, create_only, salvage
        self.full = store._key(key)
        if create_only and store.exists(key):
            raise AlreadyExists(f"s3://{store.bucket}/{self.full} exists")
        self.spool = store.spool_path(self.full)
        # A dead writer's spool of this key is superseded: the runner never writes a started
        # session's stream twice (a new attempt has keys of its own), so whoever writes the key
        # again has all its bytes (e.g. the Kubernetes executor re-uploading its fetched copy).
        shutil.rmtree(self.spool, ignore_errors=True)
        self.spool.mkdir(parents=True)
        (self.spool / "target").write_text(f"s3://{store.bucket}/{self.full}\n")
        self.buffer = bytearray()
        self.parts: list[CompletedPartTypeDef] = []  # uploaded, in the order they finished
        self.sent = 0  # parts handed to the upload so far
        self.confirmed = 0  # parts 1..confirmed are uploaded and their spool files gone
        self.inflight: dict[Future[CompletedPartTypeDef], int] = {}
        self.pool = ThreadPoolExecutor(store.settings.parts_in_flight, thread_name_prefix="s3-part") \
            if store.settings.parts_in_flight > 1 else None
        self.upload_id: str | None = None
        self._tail = open(self.spool / _spool_part(1), "wb")

    def _send(self, n: int, upload_id: str, body: bytes | bytearray) -> CompletedPartTypeDef:
        s = self.store
        # a bytearray goes as bytes do (botocore reads it as a buffer); the stubs name only bytes
        return _part(n, s.call(s.client.upload_part, Bucket=s.bucket, Key=self.full, UploadId=upload_id, PartNumber=n,
                               Body=cast("bytes", body)))

    def _upload_part(self) -> None:
        s = self.store
        if self.upload_id is None:
            # CRC32, as boto3's own uploader names it: the server checks each part against the
            # CRC32 botocore sends with it and builds the object's checksum from the parts'.
            # Naming none leaves a CRC64NVME of the whole object to compute at completion,
            # which moto (and any server that emulates it) does in Python.
            self.upload_id = s.call(s.client.create_multipart_upload, Bucket=s.bucket, Key=self.full,
                                    ChecksumAlgorithm="CRC32")["UploadId"]
        self.sent += 1
        if self.pool is None:  # one part after another: the buffer goes as it is, never copied
            self._uploaded(self._send(self.sent, self.upload_id, self.buffer))
        else:
            while len(self.inflight) >= s.settings.parts_in_flight:
                self._reap(FIRST_COMPLETED)
            self.inflight[self.pool.submit(self._send, self.sent, self.upload_id, bytes(self.buffer))] = self.sent
            self._reap(None)
        self.buffer.clear()

    def _reap(self, until: str | None) -> None:
        """Take the finished parts (waiting ``until`` FIRST_COMPLETED or ALL_COMPLETED; None:
        not at all); a failed one raises here, in the writer's thread."""
        if until is not None and self.inflight:
            wait(self.inflight, return_when=until)
        for future in [f for f in self.inflight if f.done()]:
            del self.inflight[future]
            self._uploaded(future.result())

    def _uploaded(self, part: CompletedPartTypeDef) -> None:
        self.parts.append(part)
        done = {p["PartNumber"] for p in self.parts}
        while self.confirmed + 1 in done:
            self.confirmed += 1
            (self.spool / _spool_part(self.confirmed)).unlink()

    def _write(self, data: bytes) -> None:
        size = self.store.settings.part_size
        view = memoryview(data)
        while view:
            head, view = view[:size - len(self.buffer)], view[size - len(self.buffer):]
            self._tail.write(head)
            self._tail.flush()  # with the OS before the bytes count as accepted
            self.buffer += head
            if len(self.buffer) == size:
                self._tail.close()  # the part is whole in its file before it is sent
                self._upload_part()
                self._tail = open(self.spool / _spool_part(self.sent + 1), "wb")

    def commit(self) -> None:
        s = self.store
        self._tail.close()
        try:
            if self.upload_id is None:
                s.put(self.key, bytes(self.buffer), create_only=self.create_only)
            else:
                if self.buffer:
                    self._upload_part()
                self._reap(ALL_COMPLETED)
                extra: _IfAbsent = {"IfNoneMatch": "*"} if self.create_only else {}
                s.call(s.client.complete_multipart_upload, Bucket=s.bucket, Key=self.full, UploadId=self.upload_id,
                       MultipartUpload={"Parts": sorted(self.parts, key=lambda p: p["PartNumber"])}, **extra)
        finally:
            self._close_pool()
        size = s.call(s.client.head_object, Bucket=s.bucket, Key=self.full)["ContentLength"]
        if size != self.size:
            raise StoreError(f"s3://{s.bucket}/{self.full}: {size} bytes stored, {self.size} written")
        shutil.rmtree(self.spool)

    def abort(self) -> None:
        # The uploaded parts stay in the incomplete upload and the rest in the spool: salvage keeps
        # them. A write that is not to be salvaged leaves neither: an incomplete upload is billed
        # for its parts until it is aborted, and no lifecycle rule is assumed.
        self._tail.close()
        self._close_pool()
        if not self.salvage:
            if self.upload_id is not None:
                self.store.call(self.store.client.abort_multipart_upload, Bucket=self.store.bucket, Key=self.full, UploadId=self.upload_id)
            shutil.rmtree(self.spool, ignore_errors=True)

    def _close_pool(self) -> None:
        """Let the parts in flight finish (a failed one is in the spool still, for salvage)."""
        if self.pool is None:
            return
        for future in list(self.inflight):
            try:
                self._uploaded(future.result())
            except StoreError as e:
                log.warning("s3://%s/%s: a part of an abandoned upload failed (its bytes stay in the spool): %s",
                            self.store.bucket, self.full, e)
            del self.inflight[future]
        self.pool.shutdown()
        self.pool = None


def _part(number: int, p: PartTypeDef | UploadPartOutputTypeDef) -> CompletedPartTypeDef:
    """Part ``number`` as CompleteMultipartUpload takes it (from UploadPart's answer or ListParts'):
    an upload created with a checksum algorithm completes only with each part's checksum."""
    part: CompletedPartTypeDef = {"PartNumber": number}
    if "ETag" in p:
        part["ETag"] = p["ETag"]
    if "ChecksumCRC32" in p:
        part["ChecksumCRC32"] = p["ChecksumCRC32"]
    return part


def _salvage_begun(text: str) -> _SalvageBegun:
    begun: _SalvageBegun = json.loads(text)
    return begun


def _spool_part(n: int) -> str:
    return f"part-{n:05d}"


def _prefix(parts: list[CompletedPartTypeDef]) -> list[CompletedPartTypeDef]:
    """The uploaded parts numbered 1..k without a gap: a writer with parts in flight can die
    with later parts uploaded and an earlier one not; what follows the gap is in its spool."""
    ordered = sorted(parts, key=lambda p: p["PartNumber"])
    k = 0
    while k < len(ordered) and ordered[k]["PartNumber"] == k + 1:
        k += 1
    return ordered[:k]


def _spooled(spool: Path, first: int) -> bytes | None:
    """The spool's part files from ``first`` on, joined; None where there is not even that one."""
    chunks: list[bytes] = []
    n = first
    while (chunk := _read_if_there(spool / _spool_part(n))) is not None:
        chunks.append(chunk)
        n += 1
    return b"".join(chunks) if chunks else None


def _read_if_there(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
