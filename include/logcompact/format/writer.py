"""Writes segment files: a header, one section per topic-partition in (topic, partition) order, a footer."""

from __future__ import annotations

import io
import json
import zlib
from typing import BinaryIO, Iterable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyroaring import BitMap

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
)

# Rows per Arrow record batch: bounds a batch's binary buffers far below Arrow's 2 GiB offset limit.
BATCH_ROWS = 65536

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
        ],
        schema=SECTION_SCHEMA,
    )


class SegmentWriter:
    """Streams a segment file into `sink`. Sections must come in (topic, partition) order, one each.

    `compression` is applied per Arrow buffer by the IPC writer (LZ4 frame or Zstandard), so readers
    decompress with Arrow's vectorized codecs.
    """

    def __init__(self, sink: BinaryIO, compression: str = "lz4") -> None:
        if compression not in COMPRESSIONS:
            raise ValueError(f"compression {compression!r} is not one of {', '.join(COMPRESSIONS)}")
        self._sink = sink
        self._compression = compression
        self._ipc_options = pa.ipc.IpcWriteOptions(compression=None if compression == "none" else compression)
        self._position = 0
        self._sections: list[SectionInfo] = []
        self._finished = False
        self._write(FILE_HEADER.pack(MAGIC, FORMAT_VERSION, 0, 0))

    def _write(self, data: bytes) -> None:
        self._sink.write(data)
        self._position += len(data)

    def write_section(self, topic: str, partition: int, table: pa.Table) -> SectionInfo:
        if self._finished:
            raise RuntimeError("write_section after finish")
        if self._sections and (topic, partition) <= (self._sections[-1].topic, self._sections[-1].partition):
            last = self._sections[-1]
            raise ValueError(
                f"section {topic}/{partition} written after {last.topic}/{last.partition}: "
                "sections must be in (topic, partition) order, one per topic-partition"
            )
        if table.num_rows == 0:
            raise ValueError(f"section {topic}/{partition} has no records; leave empty sections out")
        table = table.cast(SECTION_SCHEMA) if table.schema != SECTION_SCHEMA else table

        deltas = table.column("offset_delta").to_numpy()
        if deltas[0] != 0 or (len(deltas) > 1 and not np.all(deltas[1:] > deltas[:-1])):
            raise ValueError(f"section {topic}/{partition}: offset deltas must start at 0 and increase strictly")
        last_delta = int(deltas[-1])
        if last_delta > MAX_OFFSET_SPAN:
            raise ValueError(f"section {topic}/{partition} spans more than 2**32 offsets; split it")

        bitmap = BitMap(range(last_delta + 1)) if last_delta + 1 == len(deltas) else BitMap(deltas)
        bitmap_bytes = bitmap.serialize()
        body = io.BytesIO()
        with pa.ipc.new_stream(body, SECTION_SCHEMA, options=self._ipc_options) as stream:
            for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                stream.write_batch(batch)
        body_bytes = body.getvalue()

        timestamps = table.column("timestamp")
        min_max = pc.min_max(timestamps).as_py()
        info_without_position = dict(
            topic=topic,
            partition=partition,
            record_count=table.num_rows,
            last_delta=last_delta,
            min_timestamp=min_max["min"],
            max_timestamp=min_max["max"],
            tombstones=table.column("value").null_count,
            uncompressed_bytes=table.nbytes,
            compression=self._compression,
        )
        meta_bytes = json.dumps(info_without_position, separators=(",", ":")).encode()
        crc = zlib.crc32(body_bytes, zlib.crc32(bitmap_bytes, zlib.crc32(meta_bytes)))
        prefix = SECTION_PREFIX.pack(SECTION_MARKER, len(meta_bytes), len(bitmap_bytes), len(body_bytes), crc)
        start = self._position
        for part in (prefix, meta_bytes, bitmap_bytes, body_bytes):
            self._write(part)
        info = SectionInfo(**info_without_position, crc32=crc, byte_offset=start, byte_length=self._position - start)
        self._sections.append(info)
        return info

    def finish(self) -> list[SectionInfo]:
        """Write the footer index and trailer; returns the sections written."""
        footer = json.dumps({"sections": [s.to_dict() for s in self._sections]}, separators=(",", ":")).encode()
        footer_position = self._position
        self._write(FOOTER_PREFIX.pack(FOOTER_MARKER, len(footer), zlib.crc32(footer)))
        self._write(footer)
        self._write(TRAILER.pack(footer_position, FOOTER_PREFIX.size + len(footer), FORMAT_VERSION, 0, MAGIC))
        self._finished = True
        return list(self._sections)


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
