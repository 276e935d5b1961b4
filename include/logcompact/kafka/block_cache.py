"""Fetch's bounded cache of decoded blocks, so consumers of one file decode each of its blocks once.

A file's blocks are cut at a section boundary once they hold 64 KiB (format/writer.py, PACK_BYTES), so an L0 file of
an agent's flush packs many partitions' small sections into each block: fifty consumers of fifty partitions, reading
their sections of one file, each decoded (checksums, Arrow IPC, decompression) every block holding theirs, a block
as many times as it holds sections. Here a block decoded for one is kept, by file and byte position (data files are
immutable under unique names, so an entry never goes stale), for the others, within `max_bytes` (least recently
used leaves first). Sections read through it are those short enough for one ranged GET (`format` reader's
SEEK_BYTES), the tail consumers read; longer ones (compacted files, read once by a catching-up consumer) and
index-only reads go to the format's reader as they are.

`decoded` counts the blocks decoded through it and `hits` those served decoded: the agent's metrics expose both.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Iterator

import pyarrow as pa

from logcompact.exceptions import CorruptDataError
from logcompact.format import SectionInfo, read_section_from
from logcompact.format.layout import BLOCK_PREFIX
from logcompact.format.reader import SEEK_BYTES, iter_blocks, section_bytes, section_rows
from logcompact.store.base import ObjectStore

DEFAULT_MAX_BYTES = 64 * 1024 * 1024


class DecodedBlocks:
    """Decoded blocks by (file key, byte position), at most `max_bytes` of them (0: none kept); used from Fetch's
    reading threads."""

    def __init__(self, max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        self.max_bytes = max_bytes
        self.decoded = 0  # blocks decoded by reads through this cache
        self.hits = 0  # blocks served decoded
        self._lock = threading.Lock()
        self._blocks: OrderedDict[tuple[str, int], tuple[pa.RecordBatch, int]] = OrderedDict()  # least recently used first
        self._held = 0
        self._decoding: dict[tuple[str, int], threading.Event] = {}  # blocks being decoded, set once held (or failed)

    @property
    def cached_bytes(self) -> int:
        return self._held

    def read_section_from(self, store: ObjectStore, key: str, info: SectionInfo, from_delta: int = 0, index_only: bool = False) -> Iterator[pa.RecordBatch]:
        """`format.read_section_from`, a short section's blocks taken from here when held, decoded once otherwise."""
        if index_only or info.byte_length > SEEK_BYTES:
            return read_section_from(store, key, info, from_delta, index_only)
        return self._short_section_from(store, key, info, from_delta)

    def _short_section_from(self, store: ObjectStore, key: str, info: SectionInfo, from_delta: int) -> Iterator[pa.RecordBatch]:
        """The section by one ranged GET, as the format's reader reads it: its first block the catalog's, checked
        whole (`section_rows`) before a row is yielded."""
        data = section_bytes(store, key, info)
        yield from list(section_rows(key, info, self._blocks_of(key, memoryview(data), info.byte_offset), from_delta=from_delta))

    def _blocks_of(self, key: str, view: memoryview, position: int) -> Iterator[pa.RecordBatch]:
        """The decoded blocks of `view`, whole blocks from file byte `position`: each held one as it is, the others
        checked and decoded by the format's reader (`iter_blocks`) and kept."""
        at = 0
        while at < len(view):
            if len(view) - at < BLOCK_PREFIX.size:
                raise CorruptDataError(f"{key}: truncated block at byte {position + at}; the file is incomplete")
            index_length, _, payload_length, _ = BLOCK_PREFIX.unpack_from(view, at)
            end = min(len(view), at + BLOCK_PREFIX.size + index_length + payload_length)  # past the view: iter_blocks says so
            yield self._block(key, position + at, view[at:end])
            at = end

    def _block(self, key: str, position: int, data: memoryview) -> pa.RecordBatch:
        """The block at `position` of file `key` (`data`: its bytes), decoded: held, or decoded by the format's reader
        (`iter_blocks`, which checks it) and kept. Readers wanting a block another is decoding wait for it rather than
        decode it too (consumers of one file poll together, as its commit wakes them)."""
        block = (key, position)
        while True:
            with self._lock:
                found = self._blocks.get(block)
                if found is not None:
                    self._blocks.move_to_end(block)
                    self.hits += 1
                    return found[0]
                decoding = self._decoding.get(block)
                if decoding is None:
                    self._decoding[block] = threading.Event()
                    break
            decoding.wait()  # then held, unless it failed or was evicted at once: decoded here then
        try:
            # decoded from a copy of its own bytes: a batch read without decompression points into them, and a view of the
            # section's GET would keep all of it alive for as long as this one block is held
            batch = next(iter_blocks(key, bytes(data), position))[1]
            self._put(block, batch, max(batch.nbytes, len(data)))
            return batch
        finally:
            with self._lock:
                self._decoding.pop(block).set()

    def _put(self, block: tuple[str, int], batch: pa.RecordBatch, size: int) -> None:
        with self._lock:
            self.decoded += 1
            if size > self.max_bytes:
                return
            while self._held + size > self.max_bytes:
                _, (_, old_size) = self._blocks.popitem(last=False)
                self._held -= old_size
            self._blocks[block] = (batch, size)
            self._held += size
