"""Any S3-compatible object store: `s3://bucket/prefix`.

Where the client comes from, first match wins:
1. an Airflow AWS connection, when `aws_conn_id` is given (or `LOGCOMPACT_AWS_CONN_ID` is set): endpoint,
   region and credentials are the connection's (the Amazon provider builds the client);
2. otherwise boto3's own chain: `AWS_ENDPOINT_URL_S3` / `AWS_ENDPOINT_URL`, `AWS_REGION`, and the usual
   credential sources.
Credentials are handed to boto3 only; this module never formats them into a message or a log line.

Create-only writes use `If-None-Match: *` on a single PutObject: the one atomic primitive every
S3-compatible store offers alike (multipart uploads ignore it on some of them, so none is used).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Sequence
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from logcompact.exceptions import ObjectNotFoundError, StoreError
from logcompact.store.base import BufferLike, CountingReader, ObjectInfo, ObjectStore

# Path-style addressing works with every S3-compatible server on any host name; checksums only where
# the API requires them, because not every server accepts the trailing checksums newer SDKs send.
CLIENT_CONFIG = Config(
    s3={"addressing_style": "path"},
    request_checksum_calculation="when_required",
    response_checksum_validation="when_required",
    retries={"max_attempts": 5, "mode": "standard"},
)

_NOT_FOUND_CODES = {"NoSuchKey", "404", "NotFound"}
_CREATE_ONLY_LOST = {"PreconditionFailed", "412"}
# S3 answers 409 when a conflicting conditional write is still in flight: ask again, the race is undecided.
_CREATE_ONLY_RETRY = {"ConditionalRequestConflict", "409"}
_CREATE_ONLY_ATTEMPTS = 10


def client_from_airflow_connection(aws_conn_id: str) -> Any:
    """A boto3 S3 client built by the Amazon provider from an Airflow AWS connection."""
    try:
        from airflow.providers.amazon.aws.hooks.base_aws import AwsBaseHook
    except ImportError as exc:
        raise StoreError(
            f"aws_conn_id {aws_conn_id!r} needs apache-airflow-providers-amazon: pip install -r requirements.txt"
        ) from exc
    return AwsBaseHook(aws_conn_id=aws_conn_id, client_type="s3").get_client_type(config=CLIENT_CONFIG)


def default_client() -> Any:
    return boto3.session.Session().client("s3", config=CLIENT_CONFIG)


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


class S3Store(ObjectStore):
    def __init__(self, bucket: str, prefix: str = "", client: Any = None, aws_conn_id: str | None = None) -> None:
        super().__init__()
        self.bucket = bucket
        self.prefix = prefix.strip("/")
        self.uri = f"s3://{bucket}/{self.prefix}" if self.prefix else f"s3://{bucket}"
        aws_conn_id = aws_conn_id or os.environ.get("LOGCOMPACT_AWS_CONN_ID")
        if client is not None:
            self.client = client
        elif aws_conn_id:
            self.client = client_from_airflow_connection(aws_conn_id)
        else:
            self.client = default_client()

    def _key(self, key: str) -> str:
        return f"{self.prefix}/{key}" if self.prefix else key

    def _fail(self, operation: str, key: str, exc: Exception) -> StoreError:
        if isinstance(exc, ClientError):
            detail = f"{_error_code(exc)}: {exc.response.get('Error', {}).get('Message', '')}"
        else:
            detail = type(exc).__name__
        return StoreError(f"{operation} {self.uri}/{key} failed ({detail}); check the endpoint, bucket and credentials")

    def put(self, key: str, data: bytes) -> None:
        self.counters.add(put=1, bytes_written=len(data))
        try:
            self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("PUT", key, exc) from exc

    def put_parts(self, key: str, parts: Sequence[BufferLike]) -> None:
        # boto3 takes a body as bytes or a file: joined here (one copy, small beside the upload), where a local store
        # writes the parts as they are.
        self.put(key, b"".join(parts))

    def put_file(self, key: str, path: str) -> None:
        size = os.path.getsize(path)
        self.counters.add(put=1, bytes_written=size)
        try:
            with open(path, "rb") as body:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=body, ContentLength=size)
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("PUT", key, exc) from exc

    def put_if_absent(self, key: str, data: bytes) -> bool:
        for attempt in range(_CREATE_ONLY_ATTEMPTS):
            self.counters.add(put=1, bytes_written=len(data))
            try:
                self.client.put_object(Bucket=self.bucket, Key=self._key(key), Body=data, IfNoneMatch="*")
                return True
            except ClientError as exc:
                code = _error_code(exc)
                if code in _CREATE_ONLY_LOST:
                    return False
                if code not in _CREATE_ONLY_RETRY:
                    raise self._fail("create-only PUT", key, exc) from exc
                time.sleep(0.01 * (attempt + 1))
            except BotoCoreError as exc:
                raise self._fail("create-only PUT", key, exc) from exc
        raise StoreError(
            f"create-only PUT {self.uri}/{key} stayed undecided after {_CREATE_ONLY_ATTEMPTS} conflicts; retry the command"
        )

    def _get_object(self, key: str, **extra: Any) -> Any:
        """The GetObject response (its Body streams the object)."""
        self.counters.add(get=1)
        try:
            return self.client.get_object(Bucket=self.bucket, Key=self._key(key), **extra)
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                raise ObjectNotFoundError(f"no object {key!r} in {self.uri}") from None
            raise self._fail("GET", key, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("GET", key, exc) from exc

    def get(self, key: str) -> bytes:
        with self.open_stream(key) as stream:
            return stream.read()

    def open_stream(self, key: str, start: int = 0) -> CountingReader:
        if not start:
            response = self._get_object(key)
            return CountingReader(response["Body"], self.counters, response["ContentLength"])
        response = self._get_object(key, Range=f"bytes={start}-")
        # "bytes START-END/TOTAL": the whole object's size is after the slash.
        return CountingReader(response["Body"], self.counters, int(response["ContentRange"].rsplit("/", 1)[1]))

    def get_range(self, key: str, start: int, length: int) -> bytes:
        if length <= 0:
            return b""
        body = self._get_object(key, Range=f"bytes={start}-{start + length - 1}")["Body"]
        with body:
            data = body.read()
        self.counters.add(bytes_read=len(data))
        return data

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        root = f"{self.prefix}/" if self.prefix else ""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": root + prefix}
        if start_after is not None:
            kwargs["StartAfter"] = root + start_after
        while True:
            self.counters.add(list=1)
            try:
                page = self.client.list_objects_v2(**kwargs)
            except (ClientError, BotoCoreError) as exc:
                raise self._fail("LIST", prefix, exc) from exc
            for item in page.get("Contents", []):
                yield ObjectInfo(item["Key"][len(root):], item["Size"], int(item["LastModified"].timestamp() * 1000))
            if not page.get("IsTruncated"):
                return
            kwargs["ContinuationToken"] = page["NextContinuationToken"]

    def delete(self, key: str) -> None:
        self.counters.add(delete=1)
        try:
            self.client.delete_object(Bucket=self.bucket, Key=self._key(key))
        except (ClientError, BotoCoreError) as exc:
            raise self._fail("DELETE", key, exc) from exc

    def stat(self, key: str) -> ObjectInfo | None:
        self.counters.add(head=1)
        try:
            head = self.client.head_object(Bucket=self.bucket, Key=self._key(key))
        except ClientError as exc:
            if _error_code(exc) in _NOT_FOUND_CODES:
                return None
            raise self._fail("HEAD", key, exc) from exc
        except BotoCoreError as exc:
            raise self._fail("HEAD", key, exc) from exc
        return ObjectInfo(key, head["ContentLength"], int(head["LastModified"].timestamp() * 1000))
