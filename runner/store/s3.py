"""The S3 backend (``s3://bucket/prefix``), through boto3.

Retries are policy, not botocore's defaults: botocore's own retries are switched off and every
call goes through one tenacity policy that retries transient failures (5xx, throttling,
connection errors) and fails fast on client errors, naming the bucket and key. Create-only
writes are conditional puts (``If-None-Match: *``), so of two writers exactly one wins.
Streams are multipart uploads holding at most one part in memory, spooled to local disk until
each part is uploaded, so a killed process loses nothing it accepted: its uploaded parts stay
in S3 and the rest is in the spool, on the disk of the host it ran on (lose that host and at
most one part's worth of bytes is gone). ``salvage`` keeps both under another key.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from runner.errors import UserError
from runner.retry import RetryPolicy
from runner.store.base import AlreadyExists, NotFound, Store, StoreError, StreamWriter

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


def _client(s3_settings):
    return boto3.client(
        "s3", endpoint_url=s3_settings.endpoint_url, region_name=s3_settings.region,
        # total_max_attempts counts the first try; botocore's max_attempts would still allow one retry;
        # s3v4 for presigned links too, which botocore would otherwise sign with SigV2 on some endpoints
        config=Config(retries={"total_max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60,
                      signature_version="s3v4"),
    )


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str, s3_settings, client=None, spool_dir: Path | None = None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = s3_settings
        self.retry = RetryPolicy(is_transient, s3_settings.attempts, s3_settings.backoff_seconds)
        self.spool_dir = spool_dir or Path(tempfile.gettempdir()) / "probe-runner" / ".s3-spool"
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client or _client(s3_settings)

    def __getstate__(self) -> dict:
        """What a spawned process (the transform's pool) rebuilds this store from: no client,
        which does not pickle; it makes its own from the settings (a client given to the
        constructor stays in this process)."""
        return {k: v for k, v in self.__dict__.items() if k != "client"}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self.client = _client(self.settings)

    @classmethod
    def from_uri(cls, uri: str, settings=None) -> S3Store:
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

    def call(self, op: str, key: str | None = None, **kwargs):
        """One S3 call under the retry policy; client errors raise StoreError naming bucket and key."""
        try:
            return self.retry.retrying()(getattr(self.client, op), **kwargs)
        except ClientError as e:
            where = f"s3://{self.bucket}/{kwargs.get('Key', key or '')}"
            if _code(e) in ("NoSuchKey", "404", "NotFound"):
                raise NotFound(f"{where} does not exist") from None
            if _code(e) in ("PreconditionFailed", "412"):
                raise AlreadyExists(f"{where} exists") from None
            raise StoreError(f"{op} {where}: {_code(e)}: {e.response.get('Error', {}).get('Message', e)}") from None
        except BotoCoreError as e:
            raise StoreError(f"{op} s3://{self.bucket}/{kwargs.get('Key', '')}: {e}") from None

    def put(self, key: str, data: bytes, *, create_only: bool = False) -> None:
        extra = {"IfNoneMatch": "*"} if create_only else {}
        self.call("put_object", Bucket=self.bucket, Key=self._key(key), Body=data, **extra)

    def get(self, key: str) -> bytes:
        return self.call("get_object", Bucket=self.bucket, Key=self._key(key))["Body"].read()

    def open(self, key: str) -> IO[bytes]:
        return self.call("get_object", Bucket=self.bucket, Key=self._key(key))["Body"]

    def iter_lines(self, key: str) -> Iterator[bytes]:
        """Lines with their newlines, memory bounded by the longest line plus one chunk."""
        body = self.open(key)
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
            self.call("head_object", Bucket=self.bucket, Key=self._key(key))
            return True
        except NotFound:
            return False

    def list(self, prefix: str) -> list[str]:
        keys, token = [], None
        full = self._key(prefix)
        cut = len(self.prefix) + 1 if self.prefix else 0
        while True:
            kwargs = {"Bucket": self.bucket, "Prefix": full, **({"ContinuationToken": token} if token else {})}
            page = self.call("list_objects_v2", **kwargs)
            keys += [o["Key"][cut:] for o in page.get("Contents", [])]
            if not page.get("IsTruncated"):
                return sorted(keys)
            token = page["NextContinuationToken"]

    def writer(self, key: str, *, create_only: bool = True) -> StreamWriter:
        return _S3StreamWriter(self, key, create_only)

    def delete(self, key: str) -> None:
        self.call("delete_object", Bucket=self.bucket, Key=self._key(key))

    def link(self, key: str, seconds: int) -> str:
        """A presigned GET: signed here with the caller's credentials, no request made. Whoever
        holds it reads that one object until it expires (SigV4 allows at most 7 days)."""
        return str(self.client.generate_presigned_url("get_object", Params={"Bucket": self.bucket, "Key": self._key(key)},
                                                      ExpiresIn=seconds))

    def _uploads(self, full_key: str) -> list[str]:
        """Ids of the incomplete multipart uploads of exactly ``full_key``, oldest first."""
        found, marks = [], {}
        while True:
            page = self.call("list_multipart_uploads", Bucket=self.bucket, Prefix=full_key, **marks)
            found += [(u["Initiated"], u["UploadId"]) for u in page.get("Uploads", []) if u["Key"] == full_key]
            if not page.get("IsTruncated"):
                return [u for _, u in sorted(found)]
            marks = {"KeyMarker": page["NextKeyMarker"], "UploadIdMarker": page["NextUploadIdMarker"]}

    def _parts(self, full_key: str, upload_id: str) -> list[dict]:
        """The uploaded parts 1..k of an upload (a gap ends the run: what follows it is not contiguous)."""
        parts, marker = [], 0
        while True:
            page = self.call("list_parts", Bucket=self.bucket, Key=full_key, UploadId=upload_id, PartNumberMarker=marker)
            parts += page.get("Parts", [])
            if not page.get("IsTruncated"):
                break
            marker = page["NextPartNumberMarker"]
        run = []
        for p in sorted(parts, key=lambda p: p["PartNumber"]):
            if p["PartNumber"] != len(run) + 1:
                break
            run.append({"PartNumber": p["PartNumber"], "ETag": p["ETag"]})
        return run

    def salvage(self, key: str, dest: str) -> dict | None:
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
                    self.call("abort_multipart_upload", Bucket=self.bucket, Key=full, UploadId=u)
                shutil.rmtree(spool, ignore_errors=True)
                return None
            orphans = self._uploads(full)
            parts = self._parts(full, orphans[-1]) if orphans else []
            tail = _read_if_there(spool / _spool_part(len(parts) + 1))
            if not parts and not tail:  # it died before accepting a byte
                self._forget(key, full, spool)
                return None
            note = f"{len(parts)} uploaded part(s) + " + (
                f"{len(tail)} spooled bytes" if tail is not None
                else "no spool on this host: bytes after the uploaded parts (at most one part) are lost")
            if not parts:
                self.call("put_object", Bucket=self.bucket, Key=dfull, Body=tail, IfNoneMatch="*", Metadata={"salvage": note})
                self._forget(key, full, spool)
                return self._described(dest)
            spool.mkdir(parents=True, exist_ok=True)
            state.write_text(json.dumps({"parts": len(parts)}))
            begun = [self.call("create_multipart_upload", Bucket=self.bucket, Key=dfull, Metadata={"salvage": note})["UploadId"]]
        if not self.exists(key):
            orphan = self._uploads(full)[-1]
            parts = self._parts(full, orphan)
            self.call("complete_multipart_upload", Bucket=self.bucket, Key=full, UploadId=orphan, IfNoneMatch="*",
                      MultipartUpload={"Parts": parts})
        tail = _read_if_there(spool / _spool_part(json.loads(state.read_text())["parts"] + 1)) if state.exists() else None
        upload = begun[-1]
        size = self.call("head_object", Bucket=self.bucket, Key=full)["ContentLength"]
        step, ranges, start = max(self.settings.part_size, 5 << 20), [], 0
        while start < size:  # every copied part but the last is at least one part size; S3 wants >= 5 MiB
            end = size if size - start < 2 * step else start + step
            ranges.append((start, end))
            start = end
        done = []
        for n, (a, b) in enumerate(ranges, 1):
            r = self.call("upload_part_copy", Bucket=self.bucket, Key=dfull, UploadId=upload, PartNumber=n,
                          CopySource={"Bucket": self.bucket, "Key": full}, CopySourceRange=f"bytes={a}-{b - 1}")
            done.append({"PartNumber": n, "ETag": r["CopyPartResult"]["ETag"]})
        if tail:
            n = len(done) + 1
            done.append({"PartNumber": n, "ETag": self.call("upload_part", Bucket=self.bucket, Key=dfull, UploadId=upload,
                                                            PartNumber=n, Body=tail)["ETag"]})
        self.call("complete_multipart_upload", Bucket=self.bucket, Key=dfull, UploadId=upload,
                  MultipartUpload={"Parts": done}, IfNoneMatch="*")
        self._forget(key, full, spool)
        return self._described(dest)

    def _forget(self, key: str, full: str, spool: Path) -> None:
        """After a salvage: the intermediate object, stale uploads and the spool go."""
        if self.exists(key):
            self.delete(key)
        for u in self._uploads(full):
            self.call("abort_multipart_upload", Bucket=self.bucket, Key=full, UploadId=u)
        shutil.rmtree(spool, ignore_errors=True)

    def _described(self, key: str) -> dict:
        meta = self.call("head_object", Bucket=self.bucket, Key=self._key(key)).get("Metadata", {})
        return {**self.describe(key), "kept_from": meta.get("salvage", "")}


class _S3StreamWriter(StreamWriter):
    """A multipart upload: parts go up as they fill, so memory holds at most one part.

    Every byte is also appended to a spool file on local disk before ``write`` returns, one
    file per part, deleted once its part is uploaded: a killed process thus leaves its
    uploaded parts in S3 and the rest of the stream in the spool, and :meth:`S3Store.salvage`
    joins the two. The spool never holds more than one part (plus the next, for a moment).
    """

    def __init__(self, store: S3Store, key: str, create_only: bool):
        super().__init__()
        self.store, self.key, self.create_only = store, key, create_only
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
        self.parts: list[dict] = []
        self.upload_id: str | None = None
        self._tail = open(self.spool / _spool_part(1), "wb")

    def _upload_part(self) -> None:
        s = self.store
        if self.upload_id is None:
            self.upload_id = s.call("create_multipart_upload", Bucket=s.bucket, Key=self.full)["UploadId"]
        n = len(self.parts) + 1
        etag = s.call("upload_part", Bucket=s.bucket, Key=self.full, UploadId=self.upload_id, PartNumber=n,
                      Body=self.buffer)["ETag"]
        self.parts.append({"PartNumber": n, "ETag": etag})
        self.buffer.clear()

    def _write(self, data: bytes) -> None:
        size = self.store.settings.part_size
        view = memoryview(data)
        while view:
            head, view = view[:size - len(self.buffer)], view[size - len(self.buffer):]
            self._tail.write(head)
            self._tail.flush()  # with the OS before the bytes count as accepted
            self.buffer += head
            if len(self.buffer) == size:
                self._upload_part()
                n = len(self.parts)
                self._tail.close()
                self._tail = open(self.spool / _spool_part(n + 1), "wb")
                (self.spool / _spool_part(n)).unlink()

    def commit(self) -> None:
        s = self.store
        self._tail.close()
        if self.upload_id is None:
            s.put(self.key, bytes(self.buffer), create_only=self.create_only)
        else:
            if self.buffer:
                self._upload_part()
            extra = {"IfNoneMatch": "*"} if self.create_only else {}
            s.call("complete_multipart_upload", Bucket=s.bucket, Key=self.full, UploadId=self.upload_id,
                   MultipartUpload={"Parts": self.parts}, **extra)
        size = s.call("head_object", Bucket=s.bucket, Key=self.full)["ContentLength"]
        if size != self.size:
            raise StoreError(f"s3://{s.bucket}/{self.full}: {size} bytes stored, {self.size} written")
        shutil.rmtree(self.spool)

    def abort(self) -> None:
        # The uploaded parts stay in the incomplete upload and the rest in the spool: salvage keeps them.
        self._tail.close()


def _spool_part(n: int) -> str:
    return f"part-{n:05d}"


def _read_if_there(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
