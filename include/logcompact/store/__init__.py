"""Object stores: `open_store(uri)` gives the backend a URI names.

`file:///path` is the embedded default (a local directory); `s3://bucket/prefix` is any S3-compatible store.
"""

from __future__ import annotations

from urllib.parse import urlparse

from logcompact.exceptions import InvalidStoreUriError
from logcompact.store.base import ObjectInfo, ObjectStore, RequestCounts
from logcompact.store.local import LocalStore

__all__ = ["ObjectInfo", "ObjectStore", "RequestCounts", "LocalStore", "open_store"]


def open_store(uri: str, *, aws_conn_id: str | None = None) -> ObjectStore:
    parsed = urlparse(uri)
    if parsed.scheme == "file":
        if parsed.netloc not in ("", "localhost") or not parsed.path.startswith("/"):
            raise InvalidStoreUriError(f"store URI {uri!r} needs an absolute path: file:///absolute/path")
        return LocalStore(parsed.path)
    if parsed.scheme == "s3":
        if not parsed.netloc:
            raise InvalidStoreUriError(f"store URI {uri!r} names no bucket: use s3://bucket/prefix")
        from logcompact.store.s3 import S3Store  # boto3 is imported only by those who use S3

        return S3Store(parsed.netloc, parsed.path, aws_conn_id=aws_conn_id)
    raise InvalidStoreUriError(f"store URI {uri!r} is not supported: use file:///path or s3://bucket/prefix")
