"""Reads segment files: one section by one ranged GET, or every section front to back from one streaming GET."""

from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from typing import Iterator, Sequence

import pyarrow as pa
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
    found = zlib.crc32(payload)
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
    if zlib.crc32(body) != crc:
        raise ChecksumMismatchError(f"{key}: footer failed its CRC-32 check; the file is corrupt, restore it from a copy")
    return [SectionInfo.from_dict(s) for s in json.loads(body)["sections"]]


class SectionStream:
    """Every section of one file, front to back, from a single streaming GET and without seeking.

    Iterating yields `Section`s; the footer ends the stream. Two of these on one file are the two
    independent pointers of the two-pass compaction.
    """

    def __init__(self, store: ObjectStore, key: str) -> None:
        self.key = key
        self._stream: CountingReader = store.open_stream(key)
        self._position = 0
        self._index = 0
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

    def __iter__(self) -> Iterator[Section]:
        try:
            while True:
                position = self._position
                marker = self._read_exact(4)
                if marker == FOOTER_MARKER:
                    return
                prefix = marker + self._read_exact(SECTION_PREFIX.size - 4)
                meta_len, bitmap_len, body_len = _unpack_section_prefix(self.key, self._index, position, prefix)
                payload_len = meta_len + bitmap_len + body_len
                payload = self._read_exact(payload_len)
                if len(payload) != payload_len:
                    raise SegmentFormatError(
                        f"{self.key}: truncated in section {self._index} (byte {position}); the file is incomplete"
                    )
                yield _decode_section(self.key, self._index, position, prefix, payload)
                self._index += 1
        finally:
            self.close()

    def close(self) -> None:
        self._stream.close()
