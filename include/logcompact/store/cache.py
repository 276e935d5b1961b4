"""A bounded cache of file ranges in front of a store, for readers that read the same bytes again (consumers at a
partition's tail fetch the newest section on every poll).

Data files are immutable under unique names, so a cached range never goes stale: entries leave only by eviction
(least recently used first) once the ranges held would pass `max_bytes`, or when the object is written or deleted
through this store. A range inside one already held is served from it. The objects' sizes (HEAD) are kept too,
at most MAX_SIZES of them. Requests that reach the store are counted in its counters, which this store shares, so
the GETs a test or benchmark sees are the ones sent.
"""

from __future__ import annotations

import builtins
import threading
from collections import OrderedDict
from collections.abc import Iterator

from logcompact.store.base import CountingReader, ObjectInfo, ObjectStore

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_SIZES = 4096  # objects whose size is kept: the files being read, a few hundred bytes each


class CachedStore(ObjectStore):
    """`store` with its ranged GETs and HEADs cached, at most `max_bytes` of ranges (0: none)."""

    def __init__(self, store: ObjectStore, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        self.store = store
        self.uri = store.uri
        self.counters = store.counters
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._ranges: OrderedDict[tuple[str, int, int], bytes] = OrderedDict()  # (key, start, length), LRU first
        self._ranges_of: dict[str, set[tuple[int, int]]] = {}  # key: its cached (start, length)
        self._held = 0
        self._sizes: OrderedDict[str, ObjectInfo | None] = OrderedDict()

    @property
    def cached_bytes(self) -> int:
        return self._held

    def get_range(self, key: str, start: int, length: int) -> bytes:
        with self._lock:
            found = self._lookup(key, start, length)
            if found is not None:
                self.hits += 1
                return found
            self.misses += 1
        data = self.store.get_range(key, start, length)
        if len(data) == length:  # a short answer (a truncated file) is the reader's error to raise, never cached
            with self._lock:
                self._insert(key, start, data)
        return data

    def _lookup(self, key: str, start: int, length: int) -> bytes | None:
        for held_start, held_length in self._ranges_of.get(key, ()):
            if held_start <= start and start + length <= held_start + held_length:
                entry = (key, held_start, held_length)
                self._ranges.move_to_end(entry)
                data = self._ranges[entry]
                if (held_start, held_length) == (start, length):
                    return data
                return data[start - held_start : start - held_start + length]
        return None

    def _insert(self, key: str, start: int, data: bytes) -> None:
        entry = (key, start, len(data))
        if len(data) > self.max_bytes or entry in self._ranges:
            return
        while self._held + len(data) > self.max_bytes:
            (old_key, old_start, old_length), old = self._ranges.popitem(last=False)
            self._held -= len(old)
            self._forget(old_key, old_start, old_length)
        self._ranges[entry] = data
        self._ranges_of.setdefault(key, set()).add((start, len(data)))
        self._held += len(data)

    def _forget(self, key: str, start: int, length: int) -> None:
        held = self._ranges_of[key]
        held.discard((start, length))
        if not held:
            del self._ranges_of[key]

    def stat(self, key: str) -> ObjectInfo | None:
        with self._lock:
            if key in self._sizes:
                self._sizes.move_to_end(key)
                return self._sizes[key]
        info = self.store.stat(key)
        if info is not None:  # a missing object may be written later: asked again
            with self._lock:
                self._sizes[key] = info
                if len(self._sizes) > MAX_SIZES:
                    self._sizes.popitem(last=False)
        return info

    def _drop(self, key: str) -> None:
        """Forget what is held of an object written or deleted through this store."""
        with self._lock:
            for start, length in self._ranges_of.pop(key, set()):
                self._held -= len(self._ranges.pop((key, start, length)))
            self._sizes.pop(key, None)

    # Everything else goes to the store as it is.

    def put(self, key: str, data: bytes) -> None:
        self._drop(key)
        self.store.put(key, data)

    def put_file(self, key: str, path: str) -> None:
        self._drop(key)
        self.store.put_file(key, path)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.store.put_if_absent(key, data)

    def get(self, key: str) -> bytes:
        return self.store.get(key)

    def open_stream(self, key: str, start: int = 0) -> CountingReader:
        return self.store.open_stream(key, start)

    def list(self, prefix: str, start_after: str | None = None) -> Iterator[ObjectInfo]:
        return self.store.list(prefix, start_after)

    def delete(self, key: str) -> None:
        self._drop(key)
        self.store.delete(key)

    def delete_abandoned_writes(self, prefix: str, before_ms: int) -> builtins.list[str]:
        return self.store.delete_abandoned_writes(prefix, before_ms)
