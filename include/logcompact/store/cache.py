"""A bounded cache of file ranges in front of a store, for readers that read the same bytes again (consumers at a
partition's tail fetch the newest section on every poll).

Data files are immutable under unique names, so a cached range never goes stale: entries leave only by eviction
(least recently used first) once the ranges held would pass `max_bytes`, or when the object is written or deleted
through this store. A range inside one already held is served from it. What a reader makes of an object's bytes
(a file's parsed footer) can be kept beside its ranges (`memo`), in the same bound and order of eviction. The
objects' sizes (HEAD) are kept too, at most MAX_SIZES of them. Requests that reach the store are counted in its
counters, which this store shares, so the GETs a test or benchmark sees are the ones sent.
"""

from __future__ import annotations

import builtins
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TypeVar

from logcompact.store.base import BufferLike, CountingReader, ObjectInfo, ObjectStore

DEFAULT_MAX_BYTES = 256 * 1024 * 1024
MAX_SIZES = 4096  # objects whose size is kept: the files being read, a few hundred bytes each

T = TypeVar("T")
# An entry: a range (key, start, length) or a memo (key, name, 0), with what it holds and the bytes it counts.
_Entry = tuple[str, int | str, int]


class CachedStore(ObjectStore):
    """`store` with its ranged GETs and HEADs cached, at most `max_bytes` of ranges and memos (0: none)."""

    def __init__(self, store: ObjectStore, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        super().__init__()
        self.store = store
        self.uri = store.uri
        self.counters = store.counters
        self.max_bytes = max_bytes
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()
        self._entries: OrderedDict[_Entry, tuple[Any, int]] = OrderedDict()  # least recently used first
        self._entries_of: dict[str, set[tuple[int | str, int]]] = {}  # key: its entries' (start or name, length)
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
                self._insert((key, start, length), data, length)
        return data

    def _lookup(self, key: str, start: int, length: int) -> bytes | None:
        for held_start, held_length in self._entries_of.get(key, ()):
            if isinstance(held_start, int) and held_start <= start and start + length <= held_start + held_length:
                entry = (key, held_start, held_length)
                self._entries.move_to_end(entry)
                data = self._entries[entry][0]
                if (held_start, held_length) == (start, length):
                    return data
                return data[start - held_start : start - held_start + length]
        return None

    def memo(self, key: str, name: str, build: Callable[[], tuple[T, int]]) -> T:
        """What `build` makes of object `key` (its parsed footer, say), built once while held: `build` returns it and
        the bytes it is counted as in `max_bytes`."""
        entry = (key, name, 0)
        with self._lock:
            found = self._entries.get(entry)
            if found is not None:
                self._entries.move_to_end(entry)
                return found[0]
        value, size = build()
        with self._lock:
            self._insert(entry, value, size)
        return value

    def _insert(self, entry: _Entry, value: Any, size: int) -> None:
        if size > self.max_bytes or entry in self._entries:
            return
        while self._held + size > self.max_bytes:
            (old_key, old_start, old_length), (_, old_size) = self._entries.popitem(last=False)
            self._held -= old_size
            self._forget(old_key, old_start, old_length)
        self._entries[entry] = (value, size)
        self._entries_of.setdefault(entry[0], set()).add(entry[1:])
        self._held += size

    def _forget(self, key: str, start: int | str, length: int) -> None:
        held = self._entries_of[key]
        held.discard((start, length))
        if not held:
            del self._entries_of[key]

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
            for start, length in self._entries_of.pop(key, set()):
                self._held -= self._entries.pop((key, start, length))[1]
            self._sizes.pop(key, None)

    # Everything else goes to the store as it is.

    def put(self, key: str, data: bytes) -> None:
        self._drop(key)
        self.store.put(key, data)

    def put_parts(self, key: str, parts: Sequence[BufferLike]) -> None:
        self._drop(key)
        self.store.put_parts(key, parts)

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
