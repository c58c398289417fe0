"""The S3 backend (``s3://bucket/prefix``), through boto3.

Retries are policy, not botocore's defaults: botocore's own retries are switched off and every
call goes through one tenacity policy that retries transient failures (5xx, throttling,
connection errors) and fails fast on client errors, naming the bucket and key. Create-only
writes are conditional puts (``If-None-Match: *``), so of two writers exactly one wins.
Streams are multipart uploads holding at most one part in memory.
"""

from __future__ import annotations

from typing import IO, Iterator
from urllib.parse import urlparse

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError, ConnectionError as BotoConnectionError
from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from runner.errors import UserError
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


class S3Store(Store):
    def __init__(self, bucket: str, prefix: str, s3_settings, client=None):
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.settings = s3_settings
        self.uri = f"s3://{bucket}/{self.prefix}".rstrip("/")
        self.client = client or boto3.client(
            "s3", endpoint_url=s3_settings.endpoint_url, region_name=s3_settings.region,
            config=Config(retries={"max_attempts": 1, "mode": "standard"}, connect_timeout=10, read_timeout=60),
        )

    @classmethod
    def from_uri(cls, uri: str, settings=None) -> "S3Store":
        from runner.settings import S3Settings

        parsed = urlparse(uri)
        if not parsed.netloc:
            raise UserError(f"store {uri!r}: an S3 store needs a bucket, s3://bucket/prefix")
        return cls(parsed.netloc, parsed.path, settings.s3 if settings is not None else S3Settings())

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def call(self, op: str, key: str | None = None, **kwargs):
        """One S3 call under the retry policy; client errors raise StoreError naming bucket and key."""
        s = self.settings
        retrying = Retrying(stop=stop_after_attempt(s.attempts), reraise=True,
                            wait=wait_exponential(multiplier=s.backoff_seconds, max=10),
                            retry=retry_if_exception(is_transient))
        try:
            return retrying(getattr(self.client, op), **kwargs)
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


class _S3StreamWriter(StreamWriter):
    """A multipart upload: parts go up as they fill, so memory holds at most one part."""

    def __init__(self, store: S3Store, key: str, create_only: bool):
        super().__init__()
        self.store, self.key, self.create_only = store, key, create_only
        self.full = store._key(key)
        if create_only and store.exists(key):
            raise AlreadyExists(f"s3://{store.bucket}/{self.full} exists")
        self.buffer = bytearray()
        self.parts: list[dict] = []
        self.upload_id: str | None = None

    def _flush_part(self) -> None:
        s = self.store
        if self.upload_id is None:
            self.upload_id = s.call("create_multipart_upload", Bucket=s.bucket, Key=self.full)["UploadId"]
        n = len(self.parts) + 1
        etag = s.call("upload_part", Bucket=s.bucket, Key=self.full, UploadId=self.upload_id, PartNumber=n,
                      Body=bytes(self.buffer))["ETag"]
        self.parts.append({"PartNumber": n, "ETag": etag})
        self.buffer.clear()

    def _write(self, data: bytes) -> None:
        self.buffer += data
        while len(self.buffer) >= self.store.settings.part_size:
            rest = self.buffer[self.store.settings.part_size:]
            del self.buffer[self.store.settings.part_size:]
            self._flush_part()
            self.buffer += rest

    def commit(self) -> None:
        s = self.store
        if self.upload_id is None:
            s.put(self.key, bytes(self.buffer), create_only=self.create_only)
        else:
            if self.buffer:
                self._flush_part()
            extra = {"IfNoneMatch": "*"} if self.create_only else {}
            s.call("complete_multipart_upload", Bucket=s.bucket, Key=self.full, UploadId=self.upload_id,
                   MultipartUpload={"Parts": self.parts}, **extra)
        size = s.call("head_object", Bucket=s.bucket, Key=self.full)["ContentLength"]
        if size != self.size:
            raise StoreError(f"s3://{s.bucket}/{self.full}: {size} bytes stored, {self.size} written")

    def abort(self) -> None:
        # The uploaded parts stay in the incomplete upload, recoverable until a lifecycle rule clears it.
        pass
