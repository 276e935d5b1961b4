"""Writes segment files: a header with the file's one Arrow schema, CRC-framed record-batch blocks holding the
sections in (topic, partition) order, and a footer indexing sections and blocks (docs/format.md)."""

from __future__ import annotations

import array
import io
import operator
from collections.abc import Iterable, Sequence
from itertools import islice, repeat
from typing import IO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from isal.isal_zlib import crc32  # zlib's CRC-32, computed about 4x faster
from pyroaring import BitMap

from logcompact import sketch
from logcompact.format.layout import (
    BLOCK_PREFIX,
    COMPRESSIONS,
    FILE_HEADER,
    FOOTER_BLOCKS_SCHEMA,
    FOOTER_MARKER,
    FOOTER_PREFIX,
    FOOTER_SECTIONS_SCHEMA,
    FORMAT_VERSION,
    HEADERS_TYPE,
    INDEX_SCHEMA,
    MAGIC,
    MAX_OFFSET_SPAN,
    PAYLOAD_SCHEMA,
    SECTION_SCHEMA,
    TRAILER,
    SectionInfo,
    key_hash_words,
    record_bytes,
    row_sizes,
)

# A block is cut at a section boundary once it holds PACK_BYTES (so many small sections share one block and
# one set of Arrow buffers), and inside a section at BLOCK_BYTES or BLOCK_ROWS (so a reader decodes a big
# section, or seeks into it, one bounded block at a time). Sizes are uncompressed Arrow bytes.
PACK_BYTES = 64 * 1024
# A block part is stored compressed only when that makes it this much smaller. Every read of a block
# decompresses its index part, whose random key hashes leave little to gain (about 15%), so it must save a
# fifth; the payload a tenth.
INDEX_COMPRESSED_RATIO = 0.8
PAYLOAD_COMPRESSED_RATIO = 0.9
# Arrow bytes per row of a block's index part (offset delta, timestamp, key hash).
INDEX_ROW_BYTES = 4 + 8 + 16
RETRY_COMPRESSION_EVERY = 16
BLOCK_BYTES = 1024 * 1024
BLOCK_ROWS = 65536

Header = tuple[str, bytes]


def key_hashes(keys: Sequence[bytes | None]) -> pa.Array:
    """128-bit XXH3 of each key (null for a null key), kept in the file so compaction never rehashes."""
    digest = xxhash.xxh3_128_digest
    return pa.array([None if k is None else digest(k) for k in keys], type=pa.binary(16))


def section_table(
    offset_deltas: np.ndarray | Sequence[int],
    timestamps: Sequence[int] | np.ndarray,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[Sequence[Header] | None] | None = None,
    delete_horizons: Sequence[int | None] | None = None,
) -> pa.Table:
    """Records as an Arrow table of SECTION_SCHEMA, from Python or numpy columns."""
    if headers is None or not any(headers):
        header_column = pa.nulls(len(keys), HEADERS_TYPE)
    else:
        header_column = pa.array(
            [None if not hs else [{"key": k, "value": v} for k, v in hs] for hs in headers], type=HEADERS_TYPE
        )
    return pa.Table.from_arrays(
        [
            pa.array(offset_deltas, type=pa.uint32()),
            pa.array(timestamps, type=pa.int64()),
            pa.array(keys, type=pa.binary()),
            key_hashes(keys),
            pa.array(values, type=pa.binary()),
            header_column,
            pa.nulls(len(keys), pa.int64()) if delete_horizons is None else pa.array(delete_horizons, pa.int64()),
        ],
        schema=SECTION_SCHEMA,
    )


def _offset_bitmap(deltas: np.ndarray) -> bytes:
    """The portable roaring bitmap of a section's deltas; b"" when they are exactly 0 to last (no holes)."""
    if len(deltas) == 0 or int(deltas[-1]) + 1 == len(deltas):
        return b""
    return BitMap(array.array("I", deltas.astype(np.uint32, copy=False).tobytes())).serialize()


class _Section:
    """The section a builder is writing; once finished, its fields join the writer's columns."""

    __slots__ = ("topic", "partition", "first_block", "first_row", "last_block", "record_count", "last_delta",
                 "min_timestamp", "max_timestamp", "tombstones", "uncompressed_bytes", "clean_below_delta",
                 "key_sketch", "offset_bitmap")

    def __init__(self, topic: str, partition: int, first_block: int, first_row: int) -> None:
        self.topic = topic
        self.partition = partition
        self.first_block = first_block
        self.first_row = first_row
        self.last_block = first_block
        self.record_count = 0
        self.last_delta = -1
        self.min_timestamp = 0
        self.max_timestamp = 0
        self.tombstones = 0
        self.uncompressed_bytes = 0
        self.clean_below_delta = 0
        self.key_sketch = b""
        self.offset_bitmap = b""


class _MessageEncoder:
    """Record batches of one schema as Arrow IPC record batch messages, with one compression."""

    def __init__(self, schema: pa.Schema, compression: str) -> None:
        self._schema = schema
        # Compressed in this thread: Arrow's default hands each buffer to its thread pool, and the hand-offs cost 0.1 ms
        # a message whatever its size, where LZ4 takes 0.01 ms to compress a block's index.
        self._options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression, use_threads=False)
        self._skip = len(schema.serialize())  # a stream starts with the schema message

    def encode(self, batch: pa.RecordBatch) -> pa.Buffer:
        # A stream of its own into an Arrow buffer: the message is a slice of it, never copied (through a Python file
        # object every buffer was copied twice, some 0.5 ms a MiB).
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, self._schema, options=self._options) as writer:
            writer.write_batch(batch)
        stream = sink.getvalue()
        return stream.slice(self._skip, stream.size - self._skip - _END_OF_STREAM)


# The end-of-stream marker closing an IPC stream: a continuation token and a zero length.
_END_OF_STREAM = 8


class _PartEncoder:
    """One part of every block (index or payload), compressed only where that pays: incompressible records
    (random or already compressed values) are stored plain, which costs a little space and saves every
    reader a decompression pass. After a block that did not compress, the next ones are tried only now
    and then, so such a file is not compressed twice over."""

    def __init__(self, schema: pa.Schema, compression: str, min_ratio: float) -> None:
        self._schema = schema
        self._min_ratio = min_ratio
        self._compressed = _MessageEncoder(schema, compression) if compression != "none" else None
        self._plain = _MessageEncoder(schema, "none")
        self._compressible = True
        self._tries = 0

    def encode(self, batch: pa.RecordBatch, size: int) -> pa.Buffer:
        # A slice's all-null column would carry the whole of its parent's buffers into the message.
        part = pa.RecordBatch.from_arrays(
            [pa.nulls(len(column), column.type) if column.null_count == len(column) else column
             for column in batch.select(self._schema.names).columns],
            schema=self._schema,
        )
        if self._compressed is not None and (self._compressible or self._tries % RETRY_COMPRESSION_EVERY == 0):
            message = self._compressed.encode(part)
            self._compressible = len(message) <= self._min_ratio * size
            if self._compressible:
                return message
        self._tries += 1
        return self._plain.encode(part)


class SectionBuilder:
    """One section being written batch by batch (a compaction's output), so a section of any size takes
    bounded memory: its rows go to the writer's blocks as they come."""

    def __init__(self, writer: SegmentWriter, topic: str, partition: int) -> None:
        self._writer = writer
        self._section = writer._new_section(topic, partition)
        self._start = writer._mark()
        self._registers = np.zeros(sketch.REGISTERS, dtype=np.uint8)
        self._keyed = False
        self._deltas: list[np.ndarray] = []
        self._contiguous = True

    @property
    def record_count(self) -> int:
        return self._section.record_count

    def append(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Records in offset order continuing the ones appended before (deltas from the section's first)."""
        if batch.num_rows == 0:
            return
        if batch.schema != SECTION_SCHEMA:
            batch = batch.cast(SECTION_SCHEMA)
        section = self._section
        deltas = batch.column("offset_delta").to_numpy()
        if (section.record_count == 0 and deltas[0] != 0) or deltas[0] <= section.last_delta or (
            len(deltas) > 1 and not np.all(deltas[1:] > deltas[:-1])
        ):
            raise ValueError(f"section {section.topic}/{section.partition}: offset deltas must start at 0 and increase strictly")
        self._contiguous = self._contiguous and int(deltas[-1]) - section.last_delta == len(deltas)
        self._deltas.append(deltas)
        timestamps = batch.column("timestamp").to_numpy()
        low, high = int(timestamps.min()), int(timestamps.max())
        if section.record_count == 0:
            section.min_timestamp, section.max_timestamp = low, high
        else:
            section.min_timestamp, section.max_timestamp = min(low, section.min_timestamp), max(high, section.max_timestamp)
        section.last_delta = int(deltas[-1])
        section.tombstones += batch.column("value").null_count
        key_hash = batch.column("key_hash")
        if key_hash.null_count < len(key_hash):
            words = key_hash_words(key_hash)[:, 1]
            if key_hash.null_count:
                words = words[np.asarray(pc.is_valid(key_hash))]
            np.maximum(self._registers, sketch.sketch_words(words), out=self._registers)
            self._keyed = True
        section.record_count += batch.num_rows
        for piece in batch.to_batches() if isinstance(batch, pa.Table) else [batch]:
            section.uncompressed_bytes += self._writer._add_rows(piece)

    def room(self) -> tuple[int, int]:
        """The rows and bytes the block being filled has room for: rows appended within them join it whole, neither
        cut nor copied again (a survivors' gatherer fills exactly this)."""
        writer = self._writer
        return BLOCK_ROWS - writer._pending_rows, BLOCK_BYTES - writer._pending_bytes

    @property
    def block_empty(self) -> bool:
        """Whether the block being filled holds no rows yet."""
        return self._writer._pending_rows == 0

    def end_block(self) -> None:
        """Write the block being filled (the next rows do not fit it)."""
        self._writer._flush_block()

    def abandon(self) -> None:
        """Take back every row appended, as if the section had never begun (its partition was set aside)."""
        self._writer._rewind(self._start)

    def finish(self, clean_below_delta: int = 0) -> None:
        section = self._section
        if section.record_count == 0:
            raise ValueError(f"section {section.topic}/{section.partition} has no records; leave empty sections out")
        if section.last_delta > MAX_OFFSET_SPAN:
            raise ValueError(f"section {section.topic}/{section.partition} spans more than 2**32 offsets; split it")
        section.clean_below_delta = clean_below_delta
        section.key_sketch = sketch.encode(self._registers) if self._keyed else b""
        if not self._contiguous:
            section.offset_bitmap = _offset_bitmap(np.concatenate(self._deltas))
        self._deltas = []
        self._writer._section_done(section)


class PartsSink:
    """A segment writer's sink that keeps the buffers written (header bytes, Arrow's message buffers, none changed
    afterwards) instead of copying them into one: `ObjectStore.put_parts` writes them as they are. It cannot seek, so
    it takes only files written without rewinding (never SectionBuilder.abandon)."""

    def __init__(self) -> None:
        self.parts: list[bytes | memoryview | pa.Buffer] = []

    def write(self, data: bytes | memoryview | pa.Buffer) -> int:
        self.parts.append(data)
        return len(data)


class SegmentWriter:
    """Streams a segment file into `sink`. Sections come in (topic, partition) order, one each, either one at a
    time (`begin_section`) or many at once from one table (`write_sections`, what an ingest agent does).

    `compression` is applied per Arrow buffer by the IPC writer (LZ4 frame or Zstandard), so readers
    decompress with Arrow's vectorized codecs.
    """

    def __init__(self, sink: IO[bytes] | PartsSink, compression: str = "lz4") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        self._sink = sink
        self.compression = compression
        self.position = 0
        self._finished = False
        self._open: SectionBuilder | None = None
        # The sections written, as columns (a file may hold 10,000: no object per section), each a list of chunks: a
        # list that sections finished one at a time go on, or write_sections' arrays, joined once by `finish`.
        self._written: dict[str, list[list | np.ndarray]] = {name: [] for name in _Section.__slots__}
        # Blocks: each holds its rows' index columns and payload columns as two record batch messages.
        self._index = _PartEncoder(INDEX_SCHEMA, compression, INDEX_COMPRESSED_RATIO)
        self._payload = _PartEncoder(PAYLOAD_SCHEMA, compression, PAYLOAD_COMPRESSED_RATIO)
        schema_message = SECTION_SCHEMA.serialize().to_pybytes()
        self._pending: list[pa.RecordBatch] = []
        self._pending_rows = 0
        self._pending_bytes = 0
        self._blocks: dict[str, list[int]] = {name: [] for name in FOOTER_BLOCKS_SCHEMA.names}
        self._write(FILE_HEADER.pack(MAGIC, FORMAT_VERSION, COMPRESSIONS.index(compression), len(schema_message)))
        self._write(schema_message)

    @property
    def size(self) -> int:
        """Bytes written so far plus the rows waiting for their block (uncompressed): where to cut files."""
        return self.position + self._pending_bytes

    def _write(self, data: bytes | memoryview | pa.Buffer) -> None:
        self._sink.write(data)
        self.position += len(data)

    # -- sections -------------------------------------------------------------------------------------

    def _check_order(self, slots: Sequence[tuple[str, int]]) -> None:
        if self._finished or self._open is not None:
            raise RuntimeError("a section begun while another is open or after finish")
        index = self._written
        previous = (index["topic"][-1][-1], int(index["partition"][-1][-1])) if index["topic"] else None
        if not slots or (previous is None or previous < slots[0]) and all(map(operator.lt, slots, islice(slots, 1, None))):
            return
        for slot in slots:
            if previous is not None and slot <= previous:
                raise ValueError(
                    f"section {slot[0]}/{slot[1]} written after {previous[0]}/{previous[1]}: "
                    "sections must be in (topic, partition) order, one per topic-partition"
                )
            previous = slot

    def _new_section(self, topic: str, partition: int) -> _Section:
        self._check_order([(topic, partition)])
        return _Section(topic, partition, len(self._blocks["byte_offset"]), self._pending_rows)

    def begin_section(self, topic: str, partition: int) -> SectionBuilder:
        self._open = SectionBuilder(self, topic, partition)
        return self._open

    def _section_done(self, section: _Section) -> None:
        # The section's last row is in the pending block, or ended the block just written.
        section.last_block = len(self._blocks["byte_offset"]) - (0 if self._pending_rows else 1)
        for name, chunks in self._written.items():
            last = chunks[-1] if chunks else None
            if not isinstance(last, list):
                last = []
                chunks.append(last)
            last.append(getattr(section, name))
        self._open = None
        if self._pending_bytes >= PACK_BYTES:
            self._flush_block()

    def _add_written(self, columns: dict[str, list | np.ndarray]) -> None:
        for name, chunk in columns.items():
            self._written[name].append(chunk)

    def _mark(self) -> tuple:
        """Where the file stands: its length, its blocks, and the rows waiting for the next block."""
        return self.position, len(self._blocks["byte_offset"]), list(self._pending), self._pending_rows, self._pending_bytes

    def _rewind(self, mark: tuple) -> None:
        """Back to `mark`, the open section's start: the blocks written since are cut off the sink (which must be
        seekable, as a compaction's temporary file is) and the rows pending then are pending again."""
        position, blocks, self._pending, self._pending_rows, self._pending_bytes = mark
        if self.position != position:
            if isinstance(self._sink, PartsSink):
                raise TypeError("a section written into a PartsSink cannot be abandoned: its sink cannot seek")
            self._sink.seek(position)
            self._sink.truncate()
            self.position = position
            for column in self._blocks.values():
                del column[blocks:]
        self._open = None

    def write_section(self, topic: str, partition: int, table: pa.Table) -> None:
        section = self.begin_section(topic, partition)
        section.append(table)
        section.finish()

    def write_sections(self, slots: Sequence[tuple[str, int]], table: pa.Table, counts: Sequence[int] | np.ndarray) -> None:
        """Many sections at once: `table` holds their rows one section after another, `counts[i]` rows for
        `slots[i]`, each section's deltas starting at 0 and increasing. Summaries are computed for all sections
        in a few vectorized passes, so a file of 10,000 small sections costs no per-section Arrow work."""
        if self._open is not None:
            raise RuntimeError("write_sections while a section is open: finish it first")
        counts_array = np.asarray(counts, dtype=np.int64)
        if len(counts_array) != len(slots) or (counts_array <= 0).any() or int(counts_array.sum()) != table.num_rows:
            raise ValueError("write_sections: counts must be one positive count per section, summing to the table's rows")
        if table.schema != SECTION_SCHEMA:
            table = table.cast(SECTION_SCHEMA)
        table = table.combine_chunks()
        starts = np.concatenate(([0], np.cumsum(counts_array)[:-1]))
        ends = starts + counts_array
        deltas = table.column("offset_delta").to_numpy()
        rising = np.ones(len(deltas), dtype=bool)
        rising[1:] = deltas[1:] > deltas[:-1]
        rising[starts] = deltas[starts] == 0
        if not rising.all():
            bad = int(np.searchsorted(ends, int(np.argmin(rising)), side="right"))
            raise ValueError(f"section {slots[bad][0]}/{slots[bad][1]}: offset deltas must start at 0 and increase strictly")
        timestamps = table.column("timestamp").to_numpy()
        min_ts = np.minimum.reduceat(timestamps, starts)
        max_ts = np.maximum.reduceat(timestamps, starts)
        tombstone_rows = np.asarray(pc.is_null(table.column("value")), dtype=np.int64)
        tombstones = np.add.reduceat(tombstone_rows, starts)
        row_bytes = row_sizes(table)
        section_bytes = np.add.reduceat(row_bytes, starts)
        key_hash = table.column("key_hash").chunk(0) if table.num_rows else pa.array([], pa.binary(16))
        keyed = np.asarray(pc.is_valid(key_hash)) if key_hash.null_count else None
        owner = np.repeat(np.arange(len(slots)), counts_array)
        words = key_hash_words(key_hash)[:, 1]
        sketches = sketch.encode_many(owner if keyed is None else owner[keyed], words if keyed is None else words[keyed], len(slots))

        self._check_order(slots)
        self._flush_block()  # rows of sections written before end their block: these start the next
        count = len(slots)
        first_blocks = np.empty(count, dtype=np.int64)
        first_rows = np.empty(count, dtype=np.int64)
        last_blocks = np.empty(count, dtype=np.int64)
        # Bytes of the sections before each: a run of sections that neither fills the pending block to PACK_BYTES nor
        # ends one is placed at once (a file of 1,000 small sections is a few runs, not 1,000 steps). Rows are at
        # least FIXED_ROW_BYTES each, so a block under PACK_BYTES is never past BLOCK_ROWS either.
        before = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(section_bytes, out=before[1:])
        blocks_written = self._blocks["byte_offset"]
        batch_start = 0
        pending_bytes = 0
        section = 0
        while section < count:
            # The first section from here that brings the pending block to PACK_BYTES: the ones before it are quiet.
            filling = int(np.searchsorted(before, before[section] - pending_bytes + PACK_BYTES, side="left")) - 1
            quiet = min(filling, count)
            if quiet > section:
                first_blocks[section:quiet] = last_blocks[section:quiet] = len(blocks_written)
                first_rows[section:quiet] = starts[section:quiet] - batch_start
                pending_bytes += int(before[quiet] - before[section])
                section = quiet
                if section == count:
                    break
            start, end, size = int(starts[section]), int(ends[section]), int(section_bytes[section])
            first_block, first_row = len(blocks_written), start - batch_start
            # Blocks inside a big section, then one at the section's end once the block is full enough.
            pending_bytes += size
            while pending_bytes > BLOCK_BYTES or end - batch_start > BLOCK_ROWS:
                cut = _cut_row(row_bytes, batch_start, end)
                self._emit_block(table.slice(batch_start, cut - batch_start))
                pending_bytes -= int(row_bytes[batch_start:cut].sum())
                if cut <= start:  # the block filled before this section's first row
                    first_block, first_row = len(blocks_written), start - cut
                batch_start = cut
            first_blocks[section], first_rows[section] = first_block, first_row
            last_blocks[section] = len(blocks_written) - (0 if end > batch_start else 1)
            if pending_bytes >= PACK_BYTES:
                self._emit_block(table.slice(batch_start, end - batch_start))
                batch_start, pending_bytes = end, 0
            section += 1
        last_deltas = deltas[ends - 1]
        offset_bitmaps = [b""] * count
        for holed in np.flatnonzero(last_deltas + 1 != counts_array).tolist():
            offset_bitmaps[holed] = _offset_bitmap(deltas[starts[holed] : ends[holed]])
        self._add_written({
            "topic": [topic for topic, _ in slots],
            "partition": [partition for _, partition in slots],
            "first_block": first_blocks,
            "first_row": first_rows,
            "last_block": last_blocks,
            "record_count": counts_array,
            "last_delta": last_deltas,
            "min_timestamp": min_ts,
            "max_timestamp": max_ts,
            "tombstones": tombstones,
            "uncompressed_bytes": section_bytes,
            "clean_below_delta": np.zeros(count, dtype=np.int64),
            "key_sketch": sketches,
            "offset_bitmap": offset_bitmaps,
        })
        if batch_start < table.num_rows:
            self._pending = [table.slice(batch_start).combine_chunks().to_batches()[0]]
            self._pending_rows, self._pending_bytes = table.num_rows - batch_start, pending_bytes

    # -- blocks ---------------------------------------------------------------------------------------

    def _add_rows(self, batch: pa.RecordBatch) -> int:
        """Rows of the open section into the pending block, cut into blocks when full; returns their size."""
        if batch.num_rows == 0:
            return 0
        size = total = record_bytes(batch)
        while self._pending_bytes + size > BLOCK_BYTES or self._pending_rows + batch.num_rows > BLOCK_ROWS:
            room_rows = BLOCK_ROWS - self._pending_rows
            room_bytes = BLOCK_BYTES - self._pending_bytes
            take = min(room_rows, max(1, room_bytes * batch.num_rows // max(1, size)))
            if take >= batch.num_rows:
                break
            head = batch.slice(0, take)
            self._pending.append(head)
            self._pending_rows += take
            self._pending_bytes += record_bytes(head)
            self._flush_block()
            batch = batch.slice(take)
            size = record_bytes(batch)
        self._pending.append(batch)
        self._pending_rows += batch.num_rows
        self._pending_bytes += size
        return total

    def _flush_block(self) -> None:
        if not self._pending:
            return
        batch = self._pending[0] if len(self._pending) == 1 else pa.concat_batches(self._pending)
        self._pending, self._pending_rows, self._pending_bytes = [], 0, 0
        self._emit_block(batch)

    def _emit_block(self, rows: pa.RecordBatch | pa.Table) -> None:
        batch = rows if isinstance(rows, pa.RecordBatch) else rows.combine_chunks().to_batches()[0]
        index_size = batch.num_rows * INDEX_ROW_BYTES
        index = self._index.encode(batch, index_size)
        payload = self._payload.encode(batch, record_bytes(batch) - index_size)
        index_crc, payload_crc = crc32(index), crc32(payload)
        blocks = self._blocks
        blocks["byte_offset"].append(self.position)
        blocks["byte_length"].append(BLOCK_PREFIX.size + len(index) + len(payload))
        blocks["rows"].append(batch.num_rows)
        blocks["index_crc32"].append(index_crc)
        blocks["payload_crc32"].append(payload_crc)
        blocks["first_delta"].append(int(batch.column(0)[0].as_py()))
        self._write(BLOCK_PREFIX.pack(len(index), index_crc, len(payload), payload_crc))
        self._write(index)
        self._write(payload)

    # -- the end --------------------------------------------------------------------------------------

    def finish(self) -> list[SectionInfo]:
        """Write the last block, the footer and the trailer; returns the sections written."""
        if self._open is not None:
            raise RuntimeError(f"section {self._open._section.topic}/{self._open._section.partition} is still open")
        self._flush_block()
        blocks = self._blocks
        index = {name: _joined(chunks, name in _LISTED) for name, chunks in self._written.items()}
        offsets, lengths = np.asarray(blocks["byte_offset"], dtype=np.int64), np.asarray(blocks["byte_length"], dtype=np.int64)
        first, last = index["first_block"], index["last_block"]
        starts = offsets[first] if len(offsets) else np.zeros(0, dtype=np.int64)
        spans = offsets[last] + lengths[last] - starts if len(offsets) else np.zeros(0, dtype=np.int64)
        crcs = np.asarray(blocks["index_crc32"], dtype=np.int64)[first] if len(offsets) else np.zeros(0, dtype=np.int64)
        numbers = {name: np.asarray(column).tolist() for name, column in index.items() if name not in _LISTED}
        infos = list(map(SectionInfo._make, zip(
            index["topic"], numbers["partition"], numbers["record_count"], numbers["last_delta"], numbers["min_timestamp"],
            numbers["max_timestamp"], numbers["tombstones"], numbers["uncompressed_bytes"], repeat(self.compression),
            crcs.tolist(), starts.tolist(), spans.tolist(), numbers["clean_below_delta"], index["key_sketch"],
            numbers["first_row"],
        )))
        footer = _footer(index, blocks)
        footer_position = self.position
        self._write(FOOTER_PREFIX.pack(FOOTER_MARKER, len(footer), crc32(footer)))
        self._write(footer)
        self._write(TRAILER.pack(footer_position, FOOTER_PREFIX.size + len(footer), FORMAT_VERSION, COMPRESSIONS.index(self.compression), MAGIC))
        self._finished = True
        self.sections = infos
        return infos


def _cut_row(row_bytes: np.ndarray, start: int, end: int) -> int:
    """The row where a block starting at `start` fills up (BLOCK_BYTES or BLOCK_ROWS), before `end`."""
    limit = min(end, start + BLOCK_ROWS)
    filled = np.cumsum(row_bytes[start:limit])
    return start + max(1, int(np.searchsorted(filled, BLOCK_BYTES, side="right")))


# The section columns that are not numbers, kept as lists.
_LISTED = frozenset({"topic", "key_sketch", "offset_bitmap"})


def _joined(chunks: list[list | np.ndarray], listed: bool) -> list | np.ndarray:
    """A column of the sections written, from its chunks: a list, or an int64 array for a column of numbers."""
    if listed:
        return [value for chunk in chunks for value in chunk] if len(chunks) != 1 else list(chunks[0])
    if not chunks:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate([np.asarray(chunk, dtype=np.int64) for chunk in chunks])


_FOOTER_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd", use_threads=False)
_PLAIN_FOOTER_OPTIONS = pa.ipc.IpcWriteOptions(use_threads=False)
# Footer streams of at most this many rows are stored uncompressed: a few KB, which the reader's first tail read holds
# anyway, where zstd would cost a flush 0.25 ms (Arrow makes a compression context for every buffer) against 0.07 ms.
PLAIN_FOOTER_ROWS = 32


def _footer(sections: dict[str, list | np.ndarray], blocks: dict[str, list[int]]) -> bytes:
    """The footer: the section index and the block index, each an Arrow IPC stream, its buffers compressed with zstd
    unless it is short (PLAIN_FOOTER_ROWS)."""
    parts = []
    for schema, columns in ((FOOTER_SECTIONS_SCHEMA, sections), (FOOTER_BLOCKS_SCHEMA, blocks)):
        sink = pa.BufferOutputStream()
        batch = pa.record_batch([pa.array(columns[f.name], f.type) for f in schema], schema=schema)
        options = _PLAIN_FOOTER_OPTIONS if batch.num_rows <= PLAIN_FOOTER_ROWS else _FOOTER_OPTIONS
        with pa.ipc.new_stream(sink, schema, options=options) as writer:
            writer.write_batch(batch)
        parts.append(sink.getvalue().to_pybytes())
    return len(parts[0]).to_bytes(4, "little") + parts[0] + parts[1]


def write_segment(
    sections: Iterable[tuple[str, int, pa.Table]], compression: str = "lz4"
) -> tuple[bytes, list[SectionInfo]]:
    """A whole segment file in memory, from (topic, partition, table) in (topic, partition) order."""
    sink = io.BytesIO()
    writer = SegmentWriter(sink, compression)
    for topic, partition, table in sections:
        writer.write_section(topic, partition, table)
    infos = writer.finish()
    return sink.getvalue(), infos
