"""The object store interface every backend implements, and its request counters."""

from __future__ import annotations

import builtins
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from typing import Any, BinaryIO

# Any object of the buffer protocol: bytes, a memoryview, an Arrow buffer (typing has no name for it before 3.12).
BufferLike = Any


@dataclass(frozen=True)
class ObjectInfo:
    key: str
    size: int
    modified_ms: int = 0


@dataclass
class RequestCounts:
    """Requests sent to the store and bytes moved; what an S3 bill counts."""

    get: int = 0
    put: int = 0
    list: int = 0
    delete: int = 0
    head: int = 0
    bytes_read: int = 0
    bytes_written: int = 0

    def __sub__(self, other: RequestCounts) -> RequestCounts:
        return RequestCounts(**{f.name: getattr(self, f.name) - getattr(other, f.name) for f in fields(self)})

    def as_dict(self) -> dict[str, int]:
        return {f.name: getattr(self, f.name) for f in fields(self)}


class RequestCounters:
    """Thread-safe request counters; `snapshot()` copies them, and two snapshots subtract."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts = RequestCounts()

    def add(self, **increments: int) -> None:
        with self._lock:
            for name, amount in increments.items():
                setattr(self._counts, name, getattr(self._counts, name) + amount)

    def add_read(self, size: int) -> None:
        """`add(bytes_read=size)` without its keywords' loop: a stream counts each read of a block's parts."""
        with self._lock:
            self._counts.bytes_read += size

    def snapshot(self) -> RequestCounts:
        with self._lock:
            return RequestCounts(**self._counts.as_dict())


# What a skip over a body that cannot seek reads at a time.
_SKIP_CHUNK = 1 << 20


class CountingReader:
    """A streaming GET body that counts the bytes it hands out; `object_size` is the whole object's size as the
    store answered it (checked against the catalog's record before a byte is decoded)."""

    def __init__(self, raw: BinaryIO, counters: RequestCounters, object_size: int) -> None:
        self._raw = raw
        self._counters = counters
        self.object_size = object_size

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size) if size is not None and size >= 0 else self._raw.read()
        self._counters.add_read(len(data))
        return data

    def readinto(self, buffer: Any) -> int:
        """Fill `buffer` (writable: a block's Arrow buffer, so that its bytes are decoded where they were read) with the
        next bytes; returns how many, fewer only at the end."""
        view = memoryview(buffer).cast("B")
        filled = 0
        readinto = getattr(self._raw, "readinto", None)
        while filled < len(view):
            if readinto is not None:
                got = readinto(view[filled:]) or 0
            else:  # a body without readinto
                chunk = self._raw.read(len(view) - filled)
                got = len(chunk)
                view[filled : filled + got] = chunk
            if not got:
                break
            filled += got
        self._counters.add_read(filled)
        return filled

    def skip(self, size: int) -> int:
        """Go `size` bytes further without handing them out (a file seeks past them, a network body reads them a
        chunk at a time and drops them); returns how many bytes there were, fewer only at the end."""
        if self._raw.seekable():
            at = self._raw.tell()
            return self._raw.seek(min(at + size, self.object_size)) - at
        skipped = 0
        while skipped < size:
            chunk = self._raw.read(min(size - skipped, _SKIP_CHUNK))
            if not chunk:
                break
            skipped += len(chunk)
        self._counters.add_read(skipped)
        return skipped

    def close(self) -> None:
        self._raw.close()

    def __enter__(self) -> CountingReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


class ObjectStore(ABC):
    """Keys are '/'-separated relative paths below the store's root (its directory or bucket prefix).

    Every method counts the requests it sends in `counters`, so tests and benchmarks can assert I/O costs.
    """

    uri: str

    def __init__(self) -> None:
        self.counters = RequestCounters()

    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write an object whole, replacing any object of that key."""

    @abstractmethod
    def put_parts(self, key: str, parts: Sequence[BufferLike]) -> None:
        """Write an object whole from `parts`, its bytes in order, replacing any object of that key: what
        `put(key, b"".join(parts))` writes, without joining them where the backend can. The parts must not change
        until this returns."""

    @abstractmethod
    def put_file(self, key: str, path: str) -> None:
        """Write an object from a local file, streamed (one PUT), replacing any object of that key."""

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create-only write: True if this call created the object, False if the key already existed.

        Atomic: of several racing writers of one key exactly one gets True, and readers never see a
        partial object.
        """

    @abstractmethod
    def get(self, key: str) -> bytes:
        """The whole object (one GET). Raises ObjectNotFoundError."""

    @abstractmethod
    def open_stream(self, key: str, start: int = 0) -> CountingReader:
        """One streaming GET from byte `start`: a file-like object read front to back without buffering the whole
        object."""

    @abstractmethod
    def get_range(self, key: str, start: int, length: int) -> bytes:
        """`length` bytes from byte `start` (one ranged GET)."""

    @abstractmethod
    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        """Objects whose key starts with `prefix`, in key order, after `start_after` when given."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove an object; removing a missing object is not an error (as in S3)."""

    def delete_abandoned_writes(self, prefix: str, before_ms: int) -> builtins.list[str]:  # `list` is a method here
        """Remove what writers killed mid-write left under `prefix`, untouched since `before_ms`; the paths removed.
        An object store keeps nothing of a PUT that did not complete (abandoned multipart uploads are a bucket
        lifecycle rule's job), so by default there is nothing to do."""
        return []

    @abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """The object's size, or None if there is no such object (one HEAD)."""
