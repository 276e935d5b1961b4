"""Reads segment files: one section by one ranged GET, or every section front to back from one streaming GET."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from typing import Iterator, Sequence

import pyarrow as pa
from isal.isal_zlib import crc32  # zlib's CRC-32, computed about 4x faster
from pyroaring import BitMap

from logcompact.exceptions import ChecksumMismatchError, SegmentFormatError
from logcompact.format.layout import (
    FILE_HEADER,
    FOOTER_MARKER,
    FOOTER_PREFIX,
    FORMAT_VERSION,
    MAGIC,
    SECTION_MARKER,
    SECTION_PREFIX,
    SECTION_SCHEMA,
    TRAILER,
    SectionInfo,
)
from logcompact.store.base import CountingReader, ObjectStore


@dataclass
class Section:
    """A section read from a file: its summary, the bitmap of offset deltas present, and its records."""

    info: SectionInfo
    offset_deltas: BitMap
    body: pa.Buffer

    def table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The records as Arrow (SECTION_SCHEMA), decompressed by Arrow; `columns` selects some."""
        table = pa.ipc.open_stream(self.body).read_all()
        return table.select(list(columns)) if columns is not None else table


def _check_version(name: str, magic: bytes, version: int) -> None:
    if magic != MAGIC:
        raise SegmentFormatError(f"{name}: not a logcompact segment file (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise SegmentFormatError(
            f"{name}: segment format version {version} is not supported by this logcompact "
            f"(reads version {FORMAT_VERSION}); upgrade logcompact"
        )


def _decode_section(name: str, index: int, position: int, prefix: bytes, payload: memoryview | bytes) -> Section:
    marker, meta_len, bitmap_len, body_len, crc = SECTION_PREFIX.unpack(prefix)
    found = crc32(payload)
    if found != crc:
        raise ChecksumMismatchError(
            f"{name}: section {index} at byte {position} failed its CRC-32 check "
            f"(expected {crc:#010x}, found {found:#010x}); the file is corrupt, restore it from a copy"
        )
    payload = memoryview(payload)
    meta = json.loads(bytes(payload[:meta_len]))
    bitmap = BitMap.deserialize(bytes(payload[meta_len : meta_len + bitmap_len]))
    body = pa.py_buffer(payload[meta_len + bitmap_len :])
    info = SectionInfo(
        **meta, crc32=crc, byte_offset=position, byte_length=SECTION_PREFIX.size + meta_len + bitmap_len + body_len
    )
    return Section(info, bitmap, body)


def _unpack_section_prefix(name: str, index: int, position: int, prefix: bytes) -> tuple[int, int, int]:
    if len(prefix) != SECTION_PREFIX.size:
        raise SegmentFormatError(f"{name}: truncated at section {index} (byte {position}); the file is incomplete")
    marker, meta_len, bitmap_len, body_len, _crc = SECTION_PREFIX.unpack(prefix)
    if marker != SECTION_MARKER:
        raise SegmentFormatError(f"{name}: no section marker at byte {position} (found {marker!r}); the file is corrupt")
    return meta_len, bitmap_len, body_len


def read_section(store: ObjectStore, key: str, byte_offset: int, byte_length: int, index: int = 0) -> Section:
    """One section by one ranged GET, located by the catalog's or the footer's summary."""
    data = store.get_range(key, byte_offset, byte_length)
    prefix = data[: SECTION_PREFIX.size]
    meta_len, bitmap_len, body_len = _unpack_section_prefix(key, index, byte_offset, prefix)
    if SECTION_PREFIX.size + meta_len + bitmap_len + body_len != len(data):
        raise SegmentFormatError(f"{key}: section {index} at byte {byte_offset} is not {byte_length} bytes long")
    return _decode_section(key, index, byte_offset, prefix, memoryview(data)[SECTION_PREFIX.size :])


def read_footer(store: ObjectStore, key: str) -> list[SectionInfo]:
    """The footer index of a file, by two ranged GETs (the trailer, then the footer)."""
    info = store.stat(key)
    if info is None or info.size < FILE_HEADER.size + TRAILER.size:
        raise SegmentFormatError(f"{key}: too short to be a logcompact segment file")
    trailer = store.get_range(key, info.size - TRAILER.size, TRAILER.size)
    footer_position, footer_length, version, _reserved, magic = TRAILER.unpack(trailer)
    _check_version(key, magic, version)
    footer = store.get_range(key, footer_position, footer_length)
    marker, body_length, crc = FOOTER_PREFIX.unpack(footer[: FOOTER_PREFIX.size])
    body = footer[FOOTER_PREFIX.size :]
    if marker != FOOTER_MARKER or len(body) != body_length:
        raise SegmentFormatError(f"{key}: footer at byte {footer_position} is damaged")
    if crc32(body) != crc:
        raise ChecksumMismatchError(f"{key}: footer failed its CRC-32 check; the file is corrupt, restore it from a copy")
    return [SectionInfo.from_dict(s) for s in json.loads(body)["sections"]]


class _SectionBody:
    """The body of the section under a stream's cursor, as a bounded file-like object that checksums as it goes."""

    closed = False  # pyarrow's file wrapper asks

    def readable(self) -> bool:
        return True

    def __init__(self, stream: SectionStream, length: int, crc: int) -> None:
        self._stream = stream
        self.remaining = length
        self.crc = crc

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0 or size > self.remaining:
            size = self.remaining
        data = self._stream._read_exact(size)
        self.remaining -= len(data)
        self.crc = crc32(data, self.crc)
        return data

    def drain(self) -> None:
        while self.remaining:
            if not self.read(min(self.remaining, 1 << 20)):
                break


class StreamedSection:
    """A section met by a `SectionStream`: its summary and bitmap at once, its records batch by batch.

    `batches()` decodes the body as it arrives, so a section of any size takes one batch of memory. The
    checksum is verified when the body has been read; the stream skips whatever is left unread.
    """

    def __init__(self, stream: SectionStream, index: int, position: int, prefix: bytes, meta_len: int, bitmap_len: int, body_len: int) -> None:
        self._stream = stream
        self.index = index
        self.position = position
        *_lengths, self._expected_crc = SECTION_PREFIX.unpack(prefix)
        head = stream._read_exact(meta_len + bitmap_len)
        if len(head) != meta_len + bitmap_len:
            raise SegmentFormatError(f"{stream.key}: truncated in section {index} (byte {position}); the file is incomplete")
        meta = json.loads(head[:meta_len])
        self.info = SectionInfo(
            **meta, crc32=self._expected_crc, byte_offset=position, byte_length=SECTION_PREFIX.size + meta_len + bitmap_len + body_len
        )
        self._head = head
        self._body = _SectionBody(stream, body_len, crc32(head))
        self._bitmap_len = bitmap_len
        self._meta_len = meta_len

    @cached_property
    def offset_deltas(self) -> BitMap:
        return BitMap.deserialize(self._head[self._meta_len :])

    def batches(self, columns: Sequence[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The records, batch by batch; `columns` decodes only those (the others' bytes are skipped)."""
        options = None
        if columns is not None:
            options = pa.ipc.IpcReadOptions(included_fields=[SECTION_SCHEMA.get_field_index(c) for c in columns])
        yield from pa.ipc.open_stream(self._body, options=options)
        self.finish()

    def table(self) -> pa.Table:
        """The whole section at once (small sections; the compactor uses `batches()`)."""
        return pa.Table.from_batches(list(self.batches()), SECTION_SCHEMA)

    def finish(self) -> None:
        """Read what is left of the body and check the section's CRC-32."""
        self._body.drain()
        if self._body.remaining:
            raise SegmentFormatError(
                f"{self._stream.key}: truncated in section {self.index} (byte {self.position}); the file is incomplete"
            )
        if self._body.crc != self._expected_crc:
            raise ChecksumMismatchError(
                f"{self._stream.key}: section {self.index} at byte {self.position} failed its CRC-32 check "
                f"(expected {self._expected_crc:#010x}, found {self._body.crc:#010x}); the file is corrupt, restore it from a copy"
            )


class SectionStream:
    """Every section of one file, front to back, from a single streaming GET and without seeking.

    Iterating yields `StreamedSection`s; the footer ends the stream. Two of these on one file are the two
    independent pointers of the two-pass compaction.
    """

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.key = key
        self._stream: CountingReader = store.open_stream(key)
        self._position = 0
        header = self._read_exact(FILE_HEADER.size)
        if len(header) != FILE_HEADER.size:
            raise SegmentFormatError(f"{key}: too short to be a logcompact segment file")
        magic, version, _flags, _reserved = FILE_HEADER.unpack(header)
        _check_version(key, magic, version)

    def _read_exact(self, size: int) -> bytes:
        chunks = []
        remaining = size
        while remaining:
            chunk = self._stream.read(remaining)
            if not chunk:
                break
            chunks.append(chunk)
            remaining -= len(chunk)
        data = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        self._position += len(data)
        return data

    def __iter__(self) -> Iterator[StreamedSection]:
        index = 0
        try:
            while True:
                position = self._position
                marker = self._read_exact(4)
                if marker == FOOTER_MARKER:
                    return
                prefix = marker + self._read_exact(SECTION_PREFIX.size - 4)
                meta_len, bitmap_len, body_len = _unpack_section_prefix(self.key, index, position, prefix)
                section = StreamedSection(self, index, position, prefix, meta_len, bitmap_len, body_len)
                yield section
                section.finish()
                index += 1
        finally:
            self.close()

    def close(self) -> None:
        self._stream.close()
