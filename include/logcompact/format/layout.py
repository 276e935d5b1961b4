"""Constants, schemas and summaries of the segment file format; `docs/format.md` is the specification."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

MAGIC = b"LCSEGMNT"
FORMAT_VERSION = 2

# magic, version, compression (index into COMPRESSIONS), length of the Arrow schema message that follows
FILE_HEADER = struct.Struct("<8sHHI")
# index message length and CRC-32, payload message length and CRC-32 (the two messages follow, in that order)
BLOCK_PREFIX = struct.Struct("<IIII")
# marker, footer length (after this prefix), CRC-32 of the footer
FOOTER_PREFIX = struct.Struct("<4sII")
FOOTER_MARKER = b"FOOT"
# footer position, footer length including its prefix, version, compression (index into COMPRESSIONS), magic
TRAILER = struct.Struct("<QIHH8s")
# A block message is at most this long, so a block prefix never reads as the footer marker.
MAX_BLOCK_BYTES = 1 << 30

COMPRESSIONS = ("none", "lz4", "zstd")

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))

# The file's one record schema: every block is a record batch of it, one row per record.
SECTION_SCHEMA = pa.schema(
    [
        pa.field("offset_delta", pa.uint32(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("key_hash", pa.binary(16)),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
        pa.field("delete_horizon", pa.int64()),
    ]
)

# A block stores the record schema's columns as two record batch messages: the index part, all that pass 1
# of a compaction reads (it skips the payload's bytes unchecked and undecoded), and the payload part.
INDEX_COLUMNS = ("offset_delta", "timestamp", "key_hash")
PAYLOAD_COLUMNS = ("key", "value", "headers", "delete_horizon")
INDEX_SCHEMA = pa.schema([SECTION_SCHEMA.field(name) for name in INDEX_COLUMNS])
PAYLOAD_SCHEMA = pa.schema([SECTION_SCHEMA.field(name) for name in PAYLOAD_COLUMNS])

# The footer's index: one row per section, in file order ((topic, partition) order).
FOOTER_SECTIONS_SCHEMA = pa.schema(
    [
        pa.field("topic", pa.string(), nullable=False),
        pa.field("partition", pa.uint32(), nullable=False),
        pa.field("first_block", pa.uint32(), nullable=False),
        pa.field("first_row", pa.uint32(), nullable=False),
        pa.field("record_count", pa.uint32(), nullable=False),
        pa.field("last_delta", pa.uint32(), nullable=False),
        pa.field("min_timestamp", pa.int64(), nullable=False),
        pa.field("max_timestamp", pa.int64(), nullable=False),
        pa.field("tombstones", pa.uint32(), nullable=False),
        pa.field("uncompressed_bytes", pa.uint64(), nullable=False),
        pa.field("clean_below_delta", pa.uint32(), nullable=False),
        pa.field("key_sketch", pa.binary(), nullable=False),
        pa.field("offset_bitmap", pa.binary(), nullable=False),
    ]
)

# The footer's block index: one row per block, in file order.
FOOTER_BLOCKS_SCHEMA = pa.schema(
    [
        pa.field("byte_offset", pa.uint64(), nullable=False),
        pa.field("byte_length", pa.uint32(), nullable=False),
        pa.field("rows", pa.uint32(), nullable=False),
        pa.field("index_crc32", pa.uint32(), nullable=False),
        pa.field("payload_crc32", pa.uint32(), nullable=False),
        pa.field("first_delta", pa.uint32(), nullable=False),
    ]
)


def key_hash_words(key_hash: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A key_hash column as an (n, 2) uint64 array (rows of null keys hold zeros), without copying."""
    if isinstance(key_hash, pa.ChunkedArray):
        key_hash = key_hash.combine_chunks()
    if len(key_hash) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    words = np.frombuffer(key_hash.buffers()[1], dtype=np.uint64)
    return words[key_hash.offset * 2 : (key_hash.offset + len(key_hash)) * 2].reshape(-1, 2)


# Arrow's fixed bytes per row (offset delta, timestamp, key hash, two binary offsets, list offset, horizon).
FIXED_ROW_BYTES = 4 + 8 + 16 + 4 + 4 + 4 + 8


def _binary_bytes(column: pa.Array) -> int:
    if len(column) == 0:
        return 0
    offsets = np.frombuffer(column.buffers()[1], dtype=np.int32)
    return int(offsets[column.offset + len(column)]) - int(offsets[column.offset])


def record_bytes(batch: pa.RecordBatch) -> int:
    """The records' size as Arrow buffers: fixed columns, keys, values and headers, as `row_sizes` sums them (so a
    section's size is the same however its rows were batched). Arrow's own `nbytes` walks every buffer of a slice and
    costs microseconds per call; this is what the sizes are used for."""
    size = batch.num_rows * FIXED_ROW_BYTES + _binary_bytes(batch.column("key")) + _binary_bytes(batch.column("value"))
    headers = batch.column("headers")
    if headers.null_count < len(headers):
        size += int(_header_entry_bytes(headers).sum())
    return size


# Arrow's fixed bytes per header (its key's and its value's offsets).
HEADER_ENTRY_BYTES = 4 + 4


def _header_entry_bytes(headers: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each header's bytes (key, value, offsets), of every row's headers in turn."""
    entries = pc.list_flatten(headers)
    keys = pc.binary_length(pc.struct_field(entries, "key")).fill_null(0).to_numpy()
    values = pc.binary_length(pc.struct_field(entries, "value")).fill_null(0).to_numpy()
    return keys.astype(np.int64) + values + HEADER_ENTRY_BYTES


def row_sizes(table: pa.Table | pa.RecordBatch) -> np.ndarray:
    """Each row's Arrow bytes (fixed columns, key, value, headers), to cut blocks and files before building them."""
    sizes = np.full(table.num_rows, FIXED_ROW_BYTES, dtype=np.int64)
    for name in ("key", "value"):
        sizes += pc.binary_length(table.column(name)).fill_null(0).to_numpy()
    headers = table.column("headers")
    if headers.null_count < len(headers):
        sizes += header_row_bytes(headers)
    return sizes


def header_row_bytes(headers: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """Each row's header bytes (keys, values, offsets; 0 for a null list)."""
    # Each header's row, as `list_flatten` walks them: a null list's range, if any, is left out by both.
    entries = pc.list_value_length(headers).fill_null(0).to_numpy()
    owners = np.repeat(np.arange(len(headers)), entries)
    return np.bincount(owners, weights=_header_entry_bytes(headers), minlength=len(headers)).astype(np.int64)


# A section spans fewer than 2**32 offsets, so its offsets fit a 32-bit roaring bitmap as deltas.
MAX_OFFSET_SPAN = 2**32 - 1


class SectionInfo(NamedTuple):
    """One section as its file describes it: offsets are deltas from the section's first offset.

    A named tuple, not a dataclass: catalogs and plans hold hundreds of thousands, and a tuple is built
    several times faster.

    A section's records are rows `first_row` to `first_row + record_count` of the consecutive blocks that
    start at `byte_offset` and end at `byte_offset + byte_length`; small sections share a block, so several
    sections may have one byte range. `crc32` is the CRC-32 of the index message of the section's first block:
    each block carries its own checksums, checked before it is decoded, and this one ties the catalog's
    record to the file it names.

    The absolute first offset is not in the file: the catalog assigns it when the file is committed
    (see `logcompact.catalog`), which is what lets an agent write its file before offsets are assigned.
    """

    topic: str
    partition: int
    record_count: int
    last_delta: int
    min_timestamp: int
    max_timestamp: int
    tombstones: int
    uncompressed_bytes: int
    compression: str
    crc32: int
    byte_offset: int
    byte_length: int
    # Records with offset_delta below this have no key in common (written by a deduplicating compaction):
    # the next compaction starts its key map here, Kafka's "first dirty offset". 0: nothing is known clean.
    clean_below_delta: int = 0
    # HyperLogLog registers of the section's key hashes, packed (logcompact.sketch.encode); b"" for no keys.
    key_sketch: bytes = b""
    first_row: int = 0
