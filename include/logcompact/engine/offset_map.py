"""Pass 1's map from key hash to latest offset: an interface and its bounded implementation.

`CompactOffsetMap` stores each key in 20 bytes: the full 128-bit key hash and a 32-bit offset delta from
the map's base offset. Slots are open-addressed with Robin Hood linear probing, which
stays fast up to a 98% load, so 128 MiB hold 6,576,668 keys (Kafka's SkimpyOffsetMap: 24 bytes a key at
0.9 load, 5.0 million; WarpStream: 41 bytes a key, 3.27 million). The probe loops are compiled by numba.

A full map never grows and never drops a key: `put` stops at the first record whose key it cannot hold
and says where, and the cleaner turns that into partial progress (Kafka's lesson: the cleaner thread
that died on a full map).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import numba
import numpy as np

from logcompact.limits import DEFAULT_BUFFER_BYTES

BYTES_PER_SLOT = 20
MAX_LOAD = 0.98
_EMPTY = np.uint32(0xFFFFFFFF)
MAX_OFFSET_DELTA = 0xFFFFFFFE


class OffsetMap(ABC):
    """Key hash -> latest offset, holding at most `capacity` keys."""

    capacity: int

    @property
    @abstractmethod
    def size(self) -> int:
        """Keys held now."""

    @abstractmethod
    def clear(self, expected_keys: int | None = None) -> None:
        """Forget every key (a new segment of partial progress, or the next partition).

        `expected_keys`, an upper bound on the keys to come, lets an implementation use less memory.
        """

    @abstractmethod
    def put(self, hashes: np.ndarray, offsets: np.ndarray) -> int:
        """Record each row's offset as its key's latest, in order; rows come in increasing offset order.

        Returns how many rows were taken: fewer than given when the map filled up, in which case row
        number `taken` is the first whose key is new and does not fit.
        """

    @abstractmethod
    def get(self, hashes: np.ndarray) -> np.ndarray:
        """Latest offset of each row's key, or -1 for a key the map does not hold."""

    @property
    def utilization(self) -> float:
        return self.size / self.capacity if self.capacity else 0.0


class CompactOffsetMap(OffsetMap):
    """The bounded map. Its buffer is allocated once; each `clear` sizes the table in use to the keys
    expected (at most the whole buffer), so small partitions touch, and clear, only a small table that
    stays in cache."""

    def __init__(self, buffer_bytes: int = DEFAULT_BUFFER_BYTES) -> None:
        slots = buffer_bytes // BYTES_PER_SLOT
        if slots < 2:
            raise ValueError(f"buffer of {buffer_bytes} bytes is too small for a key map: give at least {2 * BYTES_PER_SLOT}")
        self.buffer_bytes = buffer_bytes
        self._max_slots = slots
        # One row of five 32-bit words a slot (hash words, offset delta), so a probe touches one cache
        # line, not three arrays. np.empty: pages become resident only where a table is used.
        self._buffer = np.empty(slots * 5, dtype=np.uint32)
        self.capacity = max(1, int(slots * MAX_LOAD))
        self._table = self._buffer.reshape(slots, 5)
        self._table_capacity = self.capacity
        self._size = 0
        self._base = -1
        self._initialized = False  # np.empty: the table holds garbage until the first clear
        self._written = False  # entries were put since the last clear

    @property
    def size(self) -> int:
        return self._size

    def clear(self, expected_keys: int | None = None) -> None:
        """Forget every key; `expected_keys` (an upper bound) lets a small table serve a small partition."""
        slots = self._max_slots
        if expected_keys is not None:
            slots = min(slots, max(1024, 1 << int(2 * max(expected_keys, 1) - 1).bit_length()))
        if not self._initialized or self._written or slots != len(self._table):
            self._table = self._buffer[: slots * 5].reshape(slots, 5)
            self._table.fill(_EMPTY)
        self._table_capacity = max(1, int(slots * MAX_LOAD)) if slots < self._max_slots else self.capacity
        self._size = 0
        self._base = -1
        self._initialized = True
        self._written = False

    def put(self, hashes: np.ndarray, offsets: np.ndarray) -> int:
        if len(offsets) == 0:
            return 0
        if not self._initialized:
            self.clear()
        if self._base < 0:
            self._base = int(offsets[0])
        self._written = True
        self._size, taken = _put(self._table, self._size, self._table_capacity, self._base, hashes, offsets.astype(np.int64, copy=False))
        return int(taken)

    def get(self, hashes: np.ndarray) -> np.ndarray:
        if self._size == 0:
            return np.full(len(hashes), -1, dtype=np.int64)
        return _get(self._table, self._base, hashes)

    def offsets(self) -> np.ndarray:
        """The latest offset of every key held, in no order: what a partition's view keeps (`consume.latest_values`)."""
        if self._size == 0:
            return np.zeros(0, dtype=np.int64)
        deltas = self._table[:, _OFFSET]
        return deltas[deltas != _EMPTY].astype(np.int64) + self._base


_OFFSET = 4


@numba.njit(cache=True, nogil=True, inline="always")
def _low(table, pos):
    return (np.uint64(table[pos, 1]) << np.uint64(32)) | np.uint64(table[pos, 0])


@numba.njit(cache=True, nogil=True, inline="always")
def _high(table, pos):
    return (np.uint64(table[pos, 3]) << np.uint64(32)) | np.uint64(table[pos, 2])


@numba.njit(cache=True, nogil=True, inline="always")
def _store(table, pos, low, high, value):
    table[pos, 0] = np.uint32(low & np.uint64(0xFFFFFFFF))
    table[pos, 1] = np.uint32(low >> np.uint64(32))
    table[pos, 2] = np.uint32(high & np.uint64(0xFFFFFFFF))
    table[pos, 3] = np.uint32(high >> np.uint64(32))
    table[pos, _OFFSET] = value


@numba.njit(cache=True, nogil=True, inline="always")
def _distance(low, pos, slots):
    """How far slot `pos` is from the home slot of a key whose low hash word is `low`."""
    return (pos - np.int64(low % np.uint64(slots))) % slots


@numba.njit(cache=True, nogil=True)
def _put(table, size, capacity, base, hashes, offsets):
    slots = np.int64(table.shape[0])
    for i in range(hashes.shape[0]):
        delta = offsets[i] - base
        if delta < 0 or delta > MAX_OFFSET_DELTA:
            return size, i  # beyond what 32 bits hold from this map's base: a new segment starts here
        high = hashes[i, 0]
        low = hashes[i, 1]
        value = np.uint32(delta)
        pos = np.int64(low % np.uint64(slots))
        dist = 0
        while True:
            if table[pos, _OFFSET] == _EMPTY:
                if size >= capacity:
                    return size, i
                _store(table, pos, low, high, value)
                size += 1
                break
            resident_low = _low(table, pos)
            if resident_low == low and _high(table, pos) == high:
                table[pos, _OFFSET] = value
                break
            if _distance(resident_low, pos, slots) < dist:
                # Robin Hood invariant: the key would have been met by now, so it is new. It takes this
                # slot, and the residents it displaces move along to the next poorer slot.
                if size >= capacity:
                    return size, i
                size += 1
                while True:
                    moved_low = _low(table, pos)
                    moved_high = _high(table, pos)
                    moved_value = table[pos, _OFFSET]
                    _store(table, pos, low, high, value)
                    if moved_value == _EMPTY:
                        break
                    low, high, value = moved_low, moved_high, moved_value
                    dist = _distance(low, pos, slots)
                    while True:
                        pos = (pos + 1) % slots
                        dist += 1
                        if table[pos, _OFFSET] == _EMPTY or _distance(_low(table, pos), pos, slots) < dist:
                            break
                break
            pos = (pos + 1) % slots
            dist += 1
    return size, hashes.shape[0]


@numba.njit(cache=True, nogil=True)
def _get(table, base, hashes):
    slots = np.int64(table.shape[0])
    out = np.empty(hashes.shape[0], dtype=np.int64)
    for i in range(hashes.shape[0]):
        high = hashes[i, 0]
        low = hashes[i, 1]
        pos = np.int64(low % np.uint64(slots))
        dist = 0
        out[i] = -1
        while True:
            if table[pos, _OFFSET] == _EMPTY:
                break
            resident_low = _low(table, pos)
            if resident_low == low and _high(table, pos) == high:
                out[i] = base + np.int64(table[pos, _OFFSET])
                break
            if _distance(resident_low, pos, slots) < dist:
                break
            pos = (pos + 1) % slots
            dist += 1
    return out
