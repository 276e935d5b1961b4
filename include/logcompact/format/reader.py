"""Reads segment files: the one read path of a section from an offset, its blocks fetched by ranged GETs
(`read_section_from`) or from one forward streaming GET over the file (`SectionStream`), and the footer's index.
Every block's CRC-32 is checked before any of its bytes are decoded."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import pyarrow as pa
from isal.isal_zlib import crc32  # zlib's CRC-32, computed about 4x faster
from pyroaring import BitMap

from logcompact.exceptions import CorruptDataError
from logcompact.format.layout import (
    BLOCK_PREFIX,
    COMPRESSIONS,
    FILE_HEADER,
    FOOTER_MARKER,
    FOOTER_PREFIX,
    FORMAT_VERSION,
    INDEX_SCHEMA,
    MAGIC,
    MAX_BLOCK_BYTES,
    PAYLOAD_SCHEMA,
    SECTION_SCHEMA,
    TRAILER,
    SectionInfo,
)
from logcompact.store.base import CountingReader, ObjectStore
from logcompact.store.cache import CachedStore

# Asked, with a block's decoded index columns, whether its payload is wanted: a block's records are read whole only
# when it answers True.
PayloadWanted = Callable[[pa.RecordBatch], bool]

_SCHEMA_MESSAGE = SECTION_SCHEMA.serialize().to_pybytes()
# The tail read first for the footer: the trailer and, in most files, the whole footer.
_TAIL_BYTES = 64 * 1024
# Why a section's catalog row and its file disagree, and what to do: one line, both causes.
_REPLACED_OR_CHANGED = (
    "the file was replaced or is corrupt, or the catalog's row of the section was changed; restore the file from a copy "
    "or the catalog database from a backup"
)


def _check_header(name: str, header: bytes) -> int:
    """The length of the schema message after a valid header."""
    if len(header) != FILE_HEADER.size:
        raise CorruptDataError(f"{name}: too short to be a logcompact segment file")
    magic, version, _compression, schema_length = FILE_HEADER.unpack(header)
    _check_version(name, magic, version)
    return schema_length


def _check_version(name: str, magic: bytes, version: int) -> None:
    if magic != MAGIC:
        raise CorruptDataError(f"{name}: not a logcompact segment file (magic {magic!r}, expected {MAGIC!r})")
    if version != FORMAT_VERSION:
        raise CorruptDataError(
            f"{name}: segment format version {version} is not supported by this logcompact "
            f"(reads version {FORMAT_VERSION}); upgrade logcompact"
        )


def _check_schema(name: str, message: bytes) -> None:
    if message != _SCHEMA_MESSAGE:
        raise CorruptDataError(f"{name}: its record schema is not the one of format version {FORMAT_VERSION}; the file is corrupt")


def _check_crc(name: str, position: int, part: str, message: memoryview | bytes | pa.Buffer, expected: int) -> None:
    found = crc32(message)
    if found != expected:
        raise CorruptDataError(
            f"{name}: block at byte {position} failed its CRC-32 check ({part}: expected {expected:#010x}, "
            f"found {found:#010x}); the file is corrupt, restore it from a copy"
        )


def _decode(
    name: str, position: int, message: memoryview | bytes | pa.Buffer, schema: pa.Schema, memory_pool: pa.MemoryPool | None = None
) -> pa.RecordBatch:
    try:
        if memory_pool is None:
            return pa.ipc.read_record_batch(pa.ipc.read_message(message if isinstance(message, pa.Buffer) else pa.py_buffer(message)), schema)
        # Only a stream reader takes a pool: the message after its part's schema message (a copy of its bytes).
        return pa.ipc.open_stream(b"".join((_PART_SCHEMA_MESSAGES[schema.names[0]], message)), memory_pool=memory_pool).read_next_batch()
    except (pa.ArrowInvalid, OSError, StopIteration) as exc:
        raise CorruptDataError(f"{name}: block at byte {position} passed its checksums but is not a record batch ({exc})") from None


# Each part's schema message, by its first column.
_PART_SCHEMA_MESSAGES = {schema.names[0]: schema.serialize().to_pybytes() for schema in (INDEX_SCHEMA, PAYLOAD_SCHEMA)}


def decode_block(
    name: str, position: int, index: memoryview | bytes | pa.Buffer, index_crc: int, payload: memoryview | bytes | pa.Buffer | None,
    payload_crc: int, memory_pool: pa.MemoryPool | None = None,
) -> pa.RecordBatch:
    """A block's records once its messages have passed their CRC-32 checks: every column (SECTION_SCHEMA), or
    only the index columns (INDEX_SCHEMA) when `payload` is None; decompressed into `memory_pool` when given (else
    Arrow's default pool)."""
    index_batch = _decode_index(name, position, index, index_crc, memory_pool)
    return index_batch if payload is None else _with_payload(name, position, index_batch, payload, payload_crc, memory_pool)


def _decode_index(name: str, position: int, index: memoryview | bytes | pa.Buffer, index_crc: int, memory_pool: pa.MemoryPool | None) -> pa.RecordBatch:
    _check_crc(name, position, "index", index, index_crc)
    return _decode(name, position, index, INDEX_SCHEMA, memory_pool)


def _with_payload(
    name: str, position: int, index_batch: pa.RecordBatch, payload: memoryview | bytes | pa.Buffer, payload_crc: int,
    memory_pool: pa.MemoryPool | None,
) -> pa.RecordBatch:
    """The block's every column: its decoded index columns joined with its payload's, checked and decoded."""
    _check_crc(name, position, "payload", payload, payload_crc)
    payload_batch = _decode(name, position, payload, PAYLOAD_SCHEMA, memory_pool)
    if payload_batch.num_rows != index_batch.num_rows:
        raise CorruptDataError(f"{name}: block at byte {position} holds {index_batch.num_rows} index rows but {payload_batch.num_rows} payload rows; the file is corrupt")
    columns = index_batch.columns + payload_batch.columns
    return pa.RecordBatch.from_arrays([columns[i] for i in _SECTION_ORDER], schema=SECTION_SCHEMA)


# Where each of SECTION_SCHEMA's columns is among a block's index columns followed by its payload columns.
_SECTION_ORDER = [(*INDEX_SCHEMA.names, *PAYLOAD_SCHEMA.names).index(name) for name in SECTION_SCHEMA.names]


def iter_blocks(
    name: str, data: memoryview | bytes, position: int, index_only: bool = False, memory_pool: pa.MemoryPool | None = None
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(byte position, batch) of every block in `data`, the bytes of whole blocks from file byte `position`;
    with `index_only`, the index columns only (payloads neither checked nor decoded); decoded into `memory_pool`."""
    view = memoryview(data)
    at = 0
    while at < len(view):
        if len(view) - at < BLOCK_PREFIX.size:
            raise CorruptDataError(f"{name}: truncated block at byte {position + at}; the file is incomplete")
        index_length, index_crc, payload_length, payload_crc = BLOCK_PREFIX.unpack_from(view, at)
        index_start = at + BLOCK_PREFIX.size
        end = index_start + index_length + payload_length
        if end > len(view):
            raise CorruptDataError(f"{name}: block at byte {position + at} runs past the bytes read; the file is incomplete or the catalog is wrong")
        payload_start = index_start + index_length
        yield position + at, decode_block(
            name, position + at, view[index_start:payload_start], index_crc, None if index_only else view[payload_start:end], payload_crc,
            memory_pool,
        )
        at = end


def section_rows(
    name: str,
    info: SectionInfo,
    batches: Iterator[pa.RecordBatch],
    *,
    from_delta: int = 0,
    check_order: bool = True,
    check_deltas: bool = True,
    resume: tuple[int, int, int] | None = None,
) -> Iterator[pa.RecordBatch]:
    """The section's rows whose offset delta is `from_delta` or more, from consecutive blocks' batches starting at
    its first block, checked against the catalog's record as they pass: `record_count` rows from row `first_row`,
    offset deltas from 0, increasing (unless the caller checks the order of many sections at once, `check_order`
    False), ending at `last_delta` (unless the caller reads every row again with these checks before using any,
    `check_deltas` False). No batch is asked for beyond the one holding the last row (a streaming reader would read
    past the section). The one implementation of a section's rows from a delta, checked, whichever way its blocks
    are fetched: ranged GETs (`read_section_from`) or one forward stream (`SectionStream`).

    `resume` (rows to skip in the first batch, rows left, the delta before them) starts at a later block of the
    section, one found through the footer. Rows before `from_delta` are found by their checked deltas, so a read
    from a delta keeps every check."""
    if not 1 <= info.record_count <= info.last_delta + 1:
        raise CorruptDataError(
            f"{name}: section {info.topic}/{info.partition} at byte {info.byte_offset}: the catalog records "
            f"{info.record_count} record(s) in offset deltas 0 to {info.last_delta}, which cannot be; the catalog is corrupt"
        )
    if from_delta and not (check_order and check_deltas):
        raise ValueError("a section's rows from a delta are found by its checked offset deltas: keep check_order and check_deltas")
    skip, left, previous = (info.first_row, info.record_count, -1) if resume is None else resume
    for batch in batches:
        if skip >= batch.num_rows:
            skip -= batch.num_rows
            continue
        piece = batch if skip == 0 and left >= batch.num_rows else batch.slice(skip, left)  # most blocks: all theirs
        skip = 0
        left -= piece.num_rows
        if check_deltas:
            previous = check_section_piece(name, info, piece, previous, left == 0, check_order)
        if not from_delta:
            yield piece
        elif previous >= from_delta:  # the piece's last delta: some of its rows are wanted
            deltas = piece.column(0).to_numpy()  # offset_delta, increasing (checked)
            yield piece.slice(int(np.searchsorted(deltas, from_delta)))
        if left == 0:
            return
    raise CorruptDataError(
        f"{name}: section {info.topic}/{info.partition}: its blocks hold {info.record_count - left} of the "
        f"{info.record_count} records the catalog records; the file or the catalog is corrupt"
    )


def check_section_piece(name: str, info: SectionInfo, piece: pa.RecordBatch, previous: int, complete: bool, check_order: bool = True) -> int:
    """Check the next piece of a section read in order (`previous`: the last delta before it, -1 at the start):
    its offset deltas start at 0 when it starts the section, end at `last_delta` when it completes it, and
    increase within the catalog's range. Returns its last delta. A file swapped for another, or a catalog row
    pointing at other rows, fails here before any record is used."""
    if not piece.num_rows:
        return previous
    deltas = piece.column(0).to_numpy()  # offset_delta: the first column of every block's schema
    first, last = int(deltas[0]), int(deltas[-1])
    if (
        (previous < 0 and first != 0)
        or first <= previous
        or last > info.last_delta
        or (complete and last != info.last_delta)
        or (check_order and len(deltas) > 1 and not (deltas[1:] > deltas[:-1]).all())
    ):
        raise CorruptDataError(
            f"{name}: section {info.topic}/{info.partition} at byte {info.byte_offset}: expected offset deltas increasing "
            f"from 0 to {info.last_delta} as the catalog records, found {first} to {last} after {previous}; the file or "
            "the catalog is corrupt"
        )
    return last


@dataclass
class Section:
    """A section read whole by one ranged GET: its summary and its records."""

    info: SectionInfo
    batches: list[pa.RecordBatch]

    def table(self, columns: Sequence[str] | None = None) -> pa.Table:
        """The records as one table: every column, or the index columns of a section read `index_only`."""
        table = pa.Table.from_batches(self.batches, self.batches[0].schema if self.batches else SECTION_SCHEMA)
        return table.select(list(columns)) if columns is not None else table

    @cached_property
    def offset_deltas(self) -> BitMap:
        deltas = self.table(["offset_delta"]).column(0).to_numpy()
        return BitMap(deltas.astype(np.uint32).tolist())


def read_section(store: ObjectStore, key: str, info: SectionInfo, index_only: bool = False) -> Section:
    """One section by one ranged GET of its blocks, every block checked before it is decoded; with
    `index_only`, only the index columns."""
    return Section(info, list(section_rows(key, info, _ranged_blocks(store, key, info, index_only))))


def section_bytes(store: ObjectStore, key: str, info: SectionInfo) -> bytes:
    """The section's bytes by one ranged GET, whole, its first block the catalog's (its blocks not yet checked)."""
    data = store.get_range(key, info.byte_offset, info.byte_length)
    if len(data) != info.byte_length:
        raise CorruptDataError(f"{key}: section {info.topic}/{info.partition} at byte {info.byte_offset} is cut short; the file is incomplete")
    _check_first_block(key, info, BLOCK_PREFIX.unpack_from(data, 0)[1] if len(data) >= BLOCK_PREFIX.size else -1)
    return data


def _ranged_blocks(
    store: ObjectStore, key: str, info: SectionInfo, index_only: bool, memory_pool: pa.MemoryPool | None = None
) -> Iterator[pa.RecordBatch]:
    """The batches of the section's blocks by one ranged GET, its first block the catalog's."""
    return (batch for _, batch in iter_blocks(key, section_bytes(store, key, info), info.byte_offset, index_only, memory_pool))


def _check_first_block(name: str, info: SectionInfo, index_crc: int) -> None:
    """The section's first block must be the one the catalog records: its index CRC-32."""
    if index_crc != info.crc32:
        raise CorruptDataError(
            f"{name}: section {info.topic}/{info.partition} at byte {info.byte_offset}: the catalog records a block of "
            f"index CRC-32 {info.crc32:#010x}, the file holds {index_crc:#010x}: {_REPLACED_OR_CHANGED}"
        )


# -- a section from an offset ----------------------------------------------------------------------------

# A section longer than this is read block by block through its file's footer (its index of blocks by offset),
# so a read from an offset inside it starts at the block holding that offset and memory stays bounded; shorter
# ones take one ranged GET.
SEEK_BYTES = 4 * 1024 * 1024
# Blocks fetched per ranged GET when reading a long section.
CHUNK_BYTES = 8 * 1024 * 1024


def read_section_from(
    store: ObjectStore, key: str, info: SectionInfo, from_delta: int = 0, index_only: bool = False, *, memory_pool: pa.MemoryPool | None = None
) -> Iterator[pa.RecordBatch]:
    """The section's rows whose offset delta is `from_delta` or more, in order (SECTION_SCHEMA, or the index columns
    with `index_only`), checked against the catalog's record as they pass (`section_rows`): the one read path of a
    section from an offset, by ranged GETs, for consumers (`logcompact consume`, Fetch). The engine reads the same
    path from one forward stream per file pointer (`SectionStream`).

    A section up to SEEK_BYTES is one ranged GET, checked whole before a row is yielded. A longer one is read through
    its file's footer (parsed once while a CachedStore holds it) from the block holding `from_delta`, in chunks of
    about CHUNK_BYTES of blocks, one ranged GET each, so memory stays bounded whatever the section's size. Blocks are
    decoded into `memory_pool` when given."""
    if info.byte_length <= SEEK_BYTES:
        yield from list(section_rows(key, info, _ranged_blocks(store, key, info, index_only, memory_pool), from_delta=from_delta))
    else:
        yield from _long_section_from(store, key, info, from_delta, index_only, memory_pool)


def _long_section_from(
    store: ObjectStore, key: str, info: SectionInfo, from_delta: int, index_only: bool, memory_pool: pa.MemoryPool | None
) -> Iterator[pa.RecordBatch]:
    footer = read_footer(store, key)
    _check_footer_section(key, footer, info)
    blocks = footer.blocks_of(info)
    # The section's rows before each of its blocks, and each block's first delta: where `from_delta` starts.
    rows_before = np.concatenate(([0], np.cumsum(footer.block_rows[blocks.start : blocks.stop]) - info.first_row))
    first = blocks.start
    if from_delta > 0:
        later = footer.block_first_deltas[blocks.start + 1 : blocks.stop]
        first = blocks.start + int(np.searchsorted(later, from_delta, side="right"))
    # A read starting past the section's first block checks deltas from there: after the delta before that block.
    resume = None
    if first > blocks.start:
        resume = (0, info.record_count - int(rows_before[first - blocks.start]), int(footer.block_first_deltas[first]) - 1)
    batches = _chunked_blocks(store, key, info, footer, blocks, first, index_only, memory_pool)
    return section_rows(key, info, batches, from_delta=from_delta, resume=resume)


def _chunked_blocks(
    store: ObjectStore, key: str, info: SectionInfo, footer: Footer, blocks: range, first: int, index_only: bool,
    memory_pool: pa.MemoryPool | None = None,
) -> Iterator[pa.RecordBatch]:
    """The batches of the section's blocks (`blocks`, by the footer) from block `first` on, as they are asked for.

    Blocks are fetched in the section's chunks: those starting in the same CHUNK_BYTES of it, one ranged GET each,
    the whole chunk whichever of its blocks the read starts at, so that reads from any offset of it ask for the
    same range and a cache in front of the store (Fetch's) serves every read after the first."""
    starts = footer.block_offsets[blocks.start : blocks.stop]
    chunk_of = (starts - info.byte_offset) // CHUNK_BYTES
    block = first
    while block < blocks.stop:
        chunk = chunk_of[block - blocks.start]
        chunk_first = blocks.start + int(np.searchsorted(chunk_of, chunk, side="left"))
        end = blocks.start + int(np.searchsorted(chunk_of, chunk, side="right"))
        start = int(footer.block_offsets[chunk_first])
        length = int(footer.block_offsets[end - 1] + footer.block_lengths[end - 1]) - start
        data = memoryview(store.get_range(key, start, length))
        at = int(footer.block_offsets[block])
        for _, batch in iter_blocks(key, data[at - start :], at, index_only, memory_pool):
            yield batch
        block = end


def read_section_blocks(
    store: ObjectStore, key: str, info: SectionInfo, footer: Footer, wanted: Sequence[int] | None = None, index_only: bool = False,
    memory_pool: pa.MemoryPool | None = None,
) -> Iterator[tuple[int, pa.RecordBatch]]:
    """(number, rows) of each of the section's blocks `wanted` (numbered from the section's first block, increasing;
    None: every block), through its file's `footer` (read once by a caller reading the section twice), with
    `read_section_from`'s checks (`section_rows`, from the delta before each block the footer records). Consecutive
    wanted blocks are fetched together, about CHUNK_BYTES per ranged GET; a block not wanted is neither fetched nor
    decoded, which is what lets pass 2 of a view skip the blocks whose records all have later values. Blocks are
    decoded into `memory_pool` when given."""
    _check_footer_section(key, footer, info)
    blocks = footer.blocks_of(info)
    numbers = list(range(len(blocks))) if wanted is None else [int(number) for number in wanted]
    if numbers and (numbers[0] < 0 or numbers[-1] >= len(blocks) or any(b <= a for a, b in zip(numbers, numbers[1:]))):
        raise ValueError(f"blocks {numbers} of a section of {len(blocks)} blocks: give increasing numbers from 0 to {len(blocks) - 1}")
    rows_before = np.concatenate(([0], np.cumsum(footer.block_rows[blocks.start : blocks.stop]) - info.first_row))
    at = 0
    while at < len(numbers):
        group = [numbers[at]]
        start = int(footer.block_offsets[blocks.start + group[0]])
        end = start + int(footer.block_lengths[blocks.start + group[0]])
        for number in numbers[at + 1 :]:
            length = int(footer.block_lengths[blocks.start + number])
            if number != group[-1] + 1 or end + length - start > CHUNK_BYTES:
                break
            group.append(number)
            end += length
        at += len(group)
        data = store.get_range(key, start, end - start)
        if len(data) != end - start:
            raise CorruptDataError(f"{key}: section {info.topic}/{info.partition}: its blocks from byte {start} are cut short; the file is incomplete")
        first = group[0]
        resume = None if first == 0 else (0, info.record_count - int(rows_before[first]), int(footer.block_first_deltas[blocks.start + first]) - 1)
        pieces = section_rows(key, info, (batch for _, batch in iter_blocks(key, data, start, index_only, memory_pool)), resume=resume)
        for number in group:  # a piece per block, none asked for past the group's last
            piece = next(pieces, None)
            if piece is None:
                raise CorruptDataError(
                    f"{key}: section {info.topic}/{info.partition}: its rows end before block {number} of the {len(blocks)} its "
                    f"byte range holds: {_REPLACED_OR_CHANGED}"
                )
            yield number, piece


_CHECKED_FIELDS = ("record_count", "last_delta", "byte_offset", "byte_length", "first_row", "crc32")


def _check_footer_section(key: str, footer: Footer, info: SectionInfo) -> None:
    """A long section is read through its file's footer: the footer must record it as the catalog does."""
    found = footer.section_of.get((info.topic, info.partition))
    if found is None:
        raise CorruptDataError(f"{key}: section {info.topic}/{info.partition}: the file's footer has no such section: {_REPLACED_OR_CHANGED}")
    differ = [f"{name} {getattr(info, name)} (found {getattr(found, name)})" for name in _CHECKED_FIELDS if getattr(found, name) != getattr(info, name)]
    if differ:
        raise CorruptDataError(
            f"{key}: section {info.topic}/{info.partition}: the catalog records {', '.join(differ)} in the file's "
            f"footer: {_REPLACED_OR_CHANGED}"
        )


# -- the footer ------------------------------------------------------------------------------------------


@dataclass
class Footer:
    """A file's index: its sections (as the catalog records them, without offsets) and its blocks."""

    sections: list[SectionInfo]
    offset_bitmaps: list[bytes]  # per section; b"" when its deltas are 0 to last_delta without holes
    block_offsets: np.ndarray
    block_lengths: np.ndarray
    block_rows: np.ndarray
    block_index_crcs: np.ndarray
    block_payload_crcs: np.ndarray
    block_first_deltas: np.ndarray

    @cached_property
    def section_of(self) -> dict[tuple[str, int], SectionInfo]:
        """Each section by (topic, partition), the first where a damaged footer repeats one."""
        found: dict[tuple[str, int], SectionInfo] = {}
        for info in self.sections:
            found.setdefault((info.topic, info.partition), info)
        return found

    def blocks_of(self, info: SectionInfo) -> range:
        first = int(np.searchsorted(self.block_offsets, info.byte_offset))
        last = int(np.searchsorted(self.block_offsets, info.byte_offset + info.byte_length))
        return range(first, last)


# What a parsed footer is counted as in a CachedStore beyond its key sketches and offset bitmaps: per section (a
# SectionInfo and its objects) and per block (six numbers).
_PARSED_SECTION_BYTES = 600
_PARSED_BLOCK_BYTES = 48


def read_footer(store: ObjectStore, key: str, size: int | None = None) -> Footer:
    """The footer by ranged GETs of the file's end: one when the footer fits the last 64 KiB, else two. A
    CachedStore keeps it parsed (without `size`: a caller checking the catalog's size reads the file again)."""
    if size is None and isinstance(store, CachedStore):
        return store.memo(key, "footer", lambda: _sized(_read_footer(store, key, None)))
    return _read_footer(store, key, size)


def _sized(footer: Footer) -> tuple[Footer, int]:
    held = sum(len(info.key_sketch) for info in footer.sections) + sum(len(bitmap) for bitmap in footer.offset_bitmaps)
    return footer, held + _PARSED_SECTION_BYTES * len(footer.sections) + _PARSED_BLOCK_BYTES * len(footer.block_offsets)


def _read_footer(store: ObjectStore, key: str, size: int | None) -> Footer:
    if size is None:
        stat = store.stat(key)
        if stat is None:
            raise CorruptDataError(f"{key}: no such file in {store.uri}")
        size = stat.size
    if size < FILE_HEADER.size + TRAILER.size:
        raise CorruptDataError(f"{key}: too short to be a logcompact segment file")
    tail_start = max(0, size - _TAIL_BYTES)
    tail = store.get_range(key, tail_start, size - tail_start)
    footer_position, footer_length, version, compression, magic = TRAILER.unpack(tail[-TRAILER.size :])
    _check_version(key, magic, version)
    if compression >= len(COMPRESSIONS):
        raise CorruptDataError(f"{key}: its trailer names compression {compression}, which format {FORMAT_VERSION} does not define; the file is corrupt")
    if footer_position + footer_length + TRAILER.size != size or footer_length < FOOTER_PREFIX.size:
        raise CorruptDataError(f"{key}: its trailer places the footer outside the file; the file is corrupt")
    if footer_position >= tail_start:
        footer = tail[footer_position - tail_start : footer_position - tail_start + footer_length]
    else:
        footer = store.get_range(key, footer_position, footer_length)
    return parse_footer(key, footer, COMPRESSIONS[compression])


def parse_footer(name: str, footer: bytes, compression: str) -> Footer:
    marker, length, crc = FOOTER_PREFIX.unpack_from(footer, 0)
    body = memoryview(footer)[FOOTER_PREFIX.size : FOOTER_PREFIX.size + length]
    if marker != FOOTER_MARKER or len(body) != length:
        raise CorruptDataError(f"{name}: no footer where its trailer says; the file is corrupt")
    if crc32(body) != crc:
        raise CorruptDataError(f"{name}: its footer failed its CRC-32 check; the file is corrupt, restore it from a copy")
    sections_length = int.from_bytes(body[:4], "little")
    sections = pa.ipc.open_stream(pa.py_buffer(body[4 : 4 + sections_length])).read_all()
    blocks = pa.ipc.open_stream(pa.py_buffer(body[4 + sections_length :])).read_all()
    block = {name: blocks.column(name).to_numpy() for name in blocks.column_names}
    columns = sections.to_pydict()
    infos = []
    for i in range(sections.num_rows):
        first = columns["first_block"][i]
        last = _last_block(block["rows"], first, columns["first_row"][i], columns["record_count"][i])
        start = int(block["byte_offset"][first])
        infos.append(
            SectionInfo(
                columns["topic"][i], columns["partition"][i], columns["record_count"][i], columns["last_delta"][i],
                columns["min_timestamp"][i], columns["max_timestamp"][i], columns["tombstones"][i],
                columns["uncompressed_bytes"][i], compression, int(block["index_crc32"][first]), start,
                int(block["byte_offset"][last] + block["byte_length"][last]) - start, columns["clean_below_delta"][i],
                columns["key_sketch"][i], columns["first_row"][i],
            )
        )
    return Footer(
        infos, columns["offset_bitmap"], block["byte_offset"], block["byte_length"], block["rows"], block["index_crc32"],
        block["payload_crc32"], block["first_delta"],
    )


def _last_block(rows: np.ndarray, first: int, first_row: int, count: int) -> int:
    block, need = first, first_row + count
    while need > int(rows[block]):
        need -= int(rows[block])
        block += 1
    return block


# -- streaming -------------------------------------------------------------------------------------------


class BlockStream:
    """A file's blocks front to back from a single streaming GET (a local file seeks only forward, past bytes it skips):
    what a `SectionStream` reads.

    `advance_to(position)` skips (without decoding or checking) the blocks before `position`; `next_batch()`
    checks the next block's CRC and decodes it. With `size` (the catalog's record), a store answering another size
    is refused before a byte is read; `start` resumes at a block past damage (the header was checked by the first
    stream).
    """

    def __init__(self, store: ObjectStore, key: str, size: int | None = None, start: int = 0) -> None:
        self.key = key
        self._stream: CountingReader = store.open_stream(key, start)
        self.position = start
        self.index_crc = -1  # the index CRC-32 of the block `next_batch` returned last
        if size is not None and self._stream.object_size != size:
            self._stream.close()
            raise CorruptDataError(
                f"{key}: the store holds {self._stream.object_size} bytes, the catalog records {size}; the file was "
                "replaced or truncated, restore it from a copy"
            )
        if not start:
            schema_length = _check_header(key, self._read_exact(FILE_HEADER.size))
            _check_schema(key, self._read_exact(schema_length))

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
        self.position += len(data)
        return data

    def _prefix(self) -> tuple[int, int, int, int]:
        prefix = self._read_exact(BLOCK_PREFIX.size)
        if prefix[:4] == FOOTER_MARKER or len(prefix) != BLOCK_PREFIX.size:
            raise CorruptDataError(f"{self.key}: no block at byte {self.position - len(prefix)} although the catalog lists one; the file is corrupt or not the one the catalog records")
        index_length, index_crc, payload_length, payload_crc = BLOCK_PREFIX.unpack(prefix)
        if index_length + payload_length > MAX_BLOCK_BYTES:
            raise CorruptDataError(f"{self.key}: block at byte {self.position - BLOCK_PREFIX.size} claims {index_length + payload_length} bytes; the file is corrupt")
        return index_length, index_crc, payload_length, payload_crc

    def _read_part(self, length: int, at: int) -> bytes:
        data = self._read_exact(length)
        if len(data) != length:
            raise CorruptDataError(f"{self.key}: truncated in the block at byte {at}; the file is incomplete")
        return data

    def _skip_part(self, length: int, at: int) -> None:
        skipped = self._stream.skip(length)
        self.position += skipped
        if skipped != length:
            raise CorruptDataError(f"{self.key}: truncated in the block at byte {at}; the file is incomplete")

    def advance_to(self, position: int) -> None:
        """Skip whole blocks up to byte `position`, the start of a block."""
        while self.position < position:
            at = self.position
            index_length, _, payload_length, _ = self._prefix()
            self._skip_part(index_length + payload_length, at)
        if self.position != position:
            raise CorruptDataError(f"{self.key}: no block starts at byte {position}; the catalog does not match the file")

    def next_batch(
        self, index_only: bool = False, memory_pool: pa.MemoryPool | None = None, payload_wanted: PayloadWanted | None = None
    ) -> pa.RecordBatch:
        """The next block's records; with `index_only`, only its index columns, and its payload's bytes are
        skipped without being checked or decoded (pass 1 of a compaction needs nothing else): a file seeks past
        them, a network body reads them and drops them. With `payload_wanted`, the index columns are decoded first and
        shown to it: when it answers False (pass 2 of a compaction, for a block none of whose records survive), the
        payload is skipped as `index_only` skips it and the index columns alone are returned. Decoded into
        `memory_pool` when given."""
        at = self.position
        index_length, index_crc, payload_length, payload_crc = self._prefix()
        if index_only:
            index = self._read_part(index_length, at)
            self._skip_part(payload_length, at)
            batch = decode_block(self.key, at, index, index_crc, None, payload_crc, memory_pool)
        elif payload_wanted is not None:
            batch = _decode_index(self.key, at, self._read_part(index_length, at), index_crc, memory_pool)
            if payload_wanted(batch):
                batch = _with_payload(self.key, at, batch, self._read_buffer(payload_length, at), payload_crc, memory_pool)
            else:
                self._skip_part(payload_length, at)
        else:
            # Both parts by one read into an Arrow buffer, decoded where they lie.
            both = self._read_buffer(index_length + payload_length, at)
            batch = decode_block(self.key, at, both.slice(0, index_length), index_crc, both.slice(index_length), payload_crc, memory_pool)
        self.index_crc = index_crc
        return batch

    def _read_buffer(self, length: int, at: int) -> pa.Buffer:
        """`length` bytes into a buffer from Arrow's pool, which keeps its memory: no page faulted in for each block."""
        data = pa.allocate_buffer(length)
        read = self._stream.readinto(data)
        self.position += read
        if read != length:
            raise CorruptDataError(f"{self.key}: truncated in the block at byte {at}; the file is incomplete")
        return data

    def close(self) -> None:
        self._stream.close()


def _alone(payload_wanted: PayloadWanted | None, to_end: int) -> PayloadWanted | None:
    """`payload_wanted` for a block whose rows are all the section's when it holds at most `to_end` rows; another
    section's rows in it are always wanted."""
    if payload_wanted is None:
        return None
    return lambda index: index.num_rows > to_end or payload_wanted(index)


class SectionStream:
    """The read path of a section from an offset over one forward streaming GET of its file, opened on first use:
    sections asked for in file order, each yielded as `read_section_from` yields it, with the same checks
    (`section_rows`). The compactor's pointer: two of these on one file are the two independent pointers of the
    two-pass compaction, one GET each, however many sections they read.

    Small sections share a block: the block decoded last is kept, so the next section in it costs no read. Blocks
    holding no section asked for are skipped without being decoded. Each section's first block must be the one
    the catalog records (its index CRC-32), and, with `size`, the store's object the catalog's size. With
    `index_only`, only the index columns are decoded (payloads skipped unchecked). After damage the stream's place
    is unknown: the next section is read by a new GET from its own block. With `from_section`, the GET starts at the
    first section's block, as a ranged read does (the file's header is not read: the section's first block is
    checked against the catalog), so a reader of one section streams none of the sections before it. Blocks are
    decoded into `memory_pool` when given."""

    def __init__(
        self, store: ObjectStore, key: str, size: int | None = None, index_only: bool = False, *, from_section: bool = False,
        memory_pool: pa.MemoryPool | None = None,
    ) -> None:
        self.key = key
        self._store = store
        self._size = size
        self._index_only = index_only
        self._memory_pool = memory_pool
        self._stream: BlockStream | None = None
        # Open at the next section's block, not the file's start: after damage (the header was checked before), or
        # `from_section`.
        self._resume = from_section
        self._batch: pa.RecordBatch | None = None
        self._batch_position = -1
        self._batch_crc = -1

    def rows(
        self, info: SectionInfo, from_delta: int = 0, *, check_order: bool = True, check_deltas: bool = True,
        payload_wanted: PayloadWanted | None = None,
    ) -> Iterator[pa.RecordBatch]:
        """The section's rows whose offset delta is `from_delta` or more, in order, checked as they pass
        (`section_rows`, whose `check_order` and `check_deltas` these are); sections must be asked for in file
        order. With `payload_wanted` (of a stream reading every column), a block holding the section's rows alone is
        shown to it by its index columns first; when it answers False, the block's payload is neither read, checked
        nor decoded, and its rows, checked as every row is, are not yielded. Damage is a CorruptDataError whose `key`
        names this file."""
        try:
            pieces = section_rows(
                self.key, info, self._blocks_from(info, payload_wanted), from_delta=from_delta, check_order=check_order,
                check_deltas=check_deltas,
            )
            if payload_wanted is None:
                yield from pieces
            else:
                yield from (piece for piece in pieces if piece.num_columns == len(SECTION_SCHEMA))
        except CorruptDataError as damage:
            self._batch_position = -1
            if self._stream is not None:
                self._stream.close()
                self._stream = None
            self._resume = True
            damage.key = self.key
            raise

    def _blocks_from(self, info: SectionInfo, payload_wanted: PayloadWanted | None) -> Iterator[pa.RecordBatch]:
        # Rows from the start of the block being read to the section's end: a block the section's alone has no more.
        to_end = info.first_row + info.record_count
        if info.byte_offset != self._batch_position:
            self._read_block(info.byte_offset, _alone(payload_wanted, to_end) if info.first_row == 0 else None)
        _check_first_block(self.key, info, self._batch_crc)
        batch: pa.RecordBatch = self._batch  # the section's first block, read now or kept from the section before
        while True:
            yield batch
            to_end -= batch.num_rows
            batch = self._read_block(None, _alone(payload_wanted, to_end))

    def _read_block(self, position: int | None, payload_wanted: PayloadWanted | None = None) -> pa.RecordBatch:
        """Decode the block at `position` (None: the next one), skipping the blocks before it; kept as the one decoded last."""
        if self._stream is None:
            start = position if self._resume and position is not None else 0
            self._stream = BlockStream(self._store, self.key, self._size, start)
        if position is not None:
            self._stream.advance_to(position)
        self._batch_position = self._stream.position
        self._batch = self._stream.next_batch(self._index_only, self._memory_pool, payload_wanted)
        self._batch_crc = self._stream.index_crc
        if not self._index_only and self._batch.num_columns != len(SECTION_SCHEMA):
            # Read without its payload: never another section's first block (a catalog giving it one is damage: the
            # stream cannot seek back to it).
            self._batch_position = -1
        return self._batch

    def close(self) -> None:
        """End the GET. Blocks past the last one used are not read: nothing of them is needed."""
        if self._stream is not None:
            self._stream.close()
