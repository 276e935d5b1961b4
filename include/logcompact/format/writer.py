"""Writes segment files: a header, one section per topic-partition in (topic, partition) order, a footer."""

from __future__ import annotations

import io
import json
import tempfile
from typing import BinaryIO, Iterable, Sequence

import numpy as np
import pyarrow as pa
from isal.isal_zlib import crc32  # zlib's CRC-32, computed about 4x faster
import pyarrow.compute as pc
import xxhash
from pyroaring import BitMap

from logcompact import sketch
from logcompact.format.layout import (
    COMPRESSIONS,
    FILE_HEADER,
    FOOTER_MARKER,
    FOOTER_PREFIX,
    FORMAT_VERSION,
    HEADERS_TYPE,
    MAGIC,
    MAX_OFFSET_SPAN,
    SECTION_MARKER,
    SECTION_PREFIX,
    SECTION_SCHEMA,
    TRAILER,
    SectionInfo,
    key_hash_words,
)

# An Arrow record batch holds at most BATCH_ROWS rows and about BATCH_BYTES bytes, so readers decode a
# file in pieces of bounded memory.
BATCH_ROWS = 65536
BATCH_BYTES = 4 * 1024 * 1024
# A section body is spooled in memory up to this size, then in a temporary file.
SPOOL_BYTES = 16 * 1024 * 1024
COPY_CHUNK = 1024 * 1024

Header = tuple[str, bytes]


def key_hashes(keys: Sequence[bytes | None]) -> pa.Array:
    """128-bit XXH3 of each key (null for a null key), kept in the file so compaction never rehashes."""
    return pa.array([None if k is None else xxhash.xxh3_128_digest(k) for k in keys], type=pa.binary(16))


def section_table(
    offset_deltas: np.ndarray | Sequence[int],
    timestamps: Sequence[int] | np.ndarray,
    keys: Sequence[bytes | None],
    values: Sequence[bytes | None],
    headers: Sequence[Sequence[Header] | None] | None = None,
    delete_horizons: Sequence[int | None] | None = None,
) -> pa.Table:
    """A section's records as an Arrow table of SECTION_SCHEMA, from Python or numpy columns."""
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


class SectionBuilder:
    """One section being written, batch by batch, so a section of any size needs bounded memory.

    The body is spooled (in memory up to SPOOL_BYTES, then in a temporary file) because the section
    prefix, written first, carries the body's length and checksum.
    """

    def __init__(self, writer: SegmentWriter, topic: str, partition: int) -> None:
        self._writer = writer
        self.topic = topic
        self.partition = partition
        self._body = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)
        self._ipc = pa.ipc.new_stream(self._body, SECTION_SCHEMA, options=writer._ipc_options)
        self._bitmap = BitMap()
        self.record_count = 0
        self._last_delta = -1
        self._min_timestamp: int | None = None
        self._max_timestamp: int | None = None
        self._tombstones = 0
        self._uncompressed_bytes = 0
        self._sketch = np.zeros(sketch.REGISTERS, dtype=np.uint8)
        self._keyed = 0

    def append(self, batch: pa.RecordBatch | pa.Table) -> None:
        """Records in offset order continuing the ones appended before (deltas from the section's first)."""
        if batch.num_rows == 0:
            return
        if batch.schema != SECTION_SCHEMA:
            batch = batch.cast(SECTION_SCHEMA)
        deltas = batch.column("offset_delta").to_numpy()
        if (self.record_count == 0 and deltas[0] != 0) or deltas[0] <= self._last_delta or (
            len(deltas) > 1 and not np.all(deltas[1:] > deltas[:-1])
        ):
            raise ValueError(
                f"section {self.topic}/{self.partition}: offset deltas must start at 0 and increase strictly"
            )
        contiguous = int(deltas[-1]) - int(deltas[0]) + 1 == len(deltas)
        self._bitmap |= BitMap(range(int(deltas[0]), int(deltas[-1]) + 1)) if contiguous else BitMap(deltas)
        self._last_delta = int(deltas[-1])
        min_max = pc.min_max(batch.column("timestamp")).as_py()
        if self._min_timestamp is None or min_max["min"] < self._min_timestamp:
            self._min_timestamp = min_max["min"]
        if self._max_timestamp is None or min_max["max"] > self._max_timestamp:
            self._max_timestamp = min_max["max"]
        self._tombstones += batch.column("value").null_count
        key_hash = batch.column("key_hash")
        if key_hash.null_count < len(key_hash):
            valid = np.asarray(pc.is_valid(key_hash))
            self._sketch = np.maximum(self._sketch, sketch.sketch_words(key_hash_words(key_hash)[valid, 1]))
            self._keyed += int(valid.sum())
        self._uncompressed_bytes += batch.nbytes
        self.record_count += batch.num_rows
        rows = max(1024, min(BATCH_ROWS, BATCH_BYTES * batch.num_rows // max(1, batch.nbytes)))
        pieces = batch.to_batches(max_chunksize=rows) if isinstance(batch, pa.Table) else [batch]
        for piece in pieces:
            self._ipc.write_batch(piece)

    def finish(self, clean_below_delta: int = 0) -> SectionInfo:
        if self.record_count == 0:
            raise ValueError(f"section {self.topic}/{self.partition} has no records; leave empty sections out")
        if self._last_delta > MAX_OFFSET_SPAN:
            raise ValueError(f"section {self.topic}/{self.partition} spans more than 2**32 offsets; split it")
        self._ipc.close()
        bitmap_bytes = self._bitmap.serialize()
        meta = dict(
            topic=self.topic,
            partition=self.partition,
            record_count=self.record_count,
            last_delta=self._last_delta,
            min_timestamp=self._min_timestamp,
            max_timestamp=self._max_timestamp,
            tombstones=self._tombstones,
            uncompressed_bytes=self._uncompressed_bytes,
            compression=self._writer.compression,
            clean_below_delta=clean_below_delta,
            key_sketch=sketch.encode(self._sketch) if self._keyed else "",
        )
        meta_bytes = json.dumps(meta, separators=(",", ":")).encode()
        body_length = self._body.tell()
        self._body.seek(0)
        crc = crc32(bitmap_bytes, crc32(meta_bytes))
        while chunk := self._body.read(COPY_CHUNK):
            crc = crc32(chunk, crc)
        prefix = SECTION_PREFIX.pack(SECTION_MARKER, len(meta_bytes), len(bitmap_bytes), body_length, crc)
        writer = self._writer
        start = writer.position
        for part in (prefix, meta_bytes, bitmap_bytes):
            writer._write(part)
        self._body.seek(0)
        while chunk := self._body.read(COPY_CHUNK):
            writer._write(chunk)
        self._body.close()
        info = SectionInfo(**meta, crc32=crc, byte_offset=start, byte_length=writer.position - start)
        writer._section_done(info)
        return info


class SegmentWriter:
    """Streams a segment file into `sink`. Sections must come in (topic, partition) order, one each.

    `compression` is applied per Arrow buffer by the IPC writer (LZ4 frame or Zstandard), so readers
    decompress with Arrow's vectorized codecs.
    """

    def __init__(self, sink: BinaryIO, compression: str = "lz4") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        self._sink = sink
        self.compression = compression
        self._ipc_options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        self.position = 0
        self.sections: list[SectionInfo] = []
        self._open: SectionBuilder | None = None
        self._finished = False
        self._write(FILE_HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0))

    def _write(self, data: bytes) -> None:
        self._sink.write(data)
        self.position += len(data)

    def begin_section(self, topic: str, partition: int) -> SectionBuilder:
        if self._finished or self._open is not None:
            raise RuntimeError("begin_section while a section is open or after finish")
        if self.sections and (topic, partition) <= (self.sections[-1].topic, self.sections[-1].partition):
            last = self.sections[-1]
            raise ValueError(
                f"section {topic}/{partition} written after {last.topic}/{last.partition}: "
                "sections must be in (topic, partition) order, one per topic-partition"
            )
        self._open = SectionBuilder(self, topic, partition)
        return self._open

    def _section_done(self, info: SectionInfo) -> None:
        self.sections.append(info)
        self._open = None

    def write_section(self, topic: str, partition: int, table: pa.Table) -> SectionInfo:
        section = self.begin_section(topic, partition)
        section.append(table)
        return section.finish()

    def finish(self) -> list[SectionInfo]:
        """Write the footer index and trailer; returns the sections written."""
        if self._open is not None:
            raise RuntimeError(f"section {self._open.topic}/{self._open.partition} is still open")
        footer = json.dumps({"sections": [s.to_dict() for s in self.sections]}, separators=(",", ":")).encode()
        footer_position = self.position
        self._write(FOOTER_PREFIX.pack(FOOTER_MARKER, len(footer), crc32(footer)))
        self._write(footer)
        self._write(TRAILER.pack(footer_position, FOOTER_PREFIX.size + len(footer), FORMAT_VERSION, 0, MAGIC))
        self._finished = True
        return list(self.sections)


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
