"""Constants, schema and summaries of the segment file format; `docs/format.md` is the specification."""

from __future__ import annotations

import struct
from typing import NamedTuple

import numpy as np
import pyarrow as pa

MAGIC = b"LCSEGMNT"
FORMAT_VERSION = 1

# magic, version, flags (none defined), reserved
FILE_HEADER = struct.Struct("<8sHHI")
# marker, meta length, bitmap length, body length, CRC-32 of meta + bitmap + body
SECTION_PREFIX = struct.Struct("<4sIIQI")
SECTION_MARKER = b"SECT"
# marker, footer length, CRC-32 of the footer
FOOTER_PREFIX = struct.Struct("<4sII")
FOOTER_MARKER = b"FOOT"
# footer position, footer length, version, reserved, magic
TRAILER = struct.Struct("<QIHH8s")

COMPRESSIONS = ("none", "lz4", "zstd")

HEADERS_TYPE = pa.list_(pa.struct([pa.field("key", pa.string(), nullable=False), pa.field("value", pa.binary())]))

# What a section's Arrow IPC stream holds, one row per record, in offset order.
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

def key_hash_words(key_hash: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A key_hash column as an (n, 2) uint64 array (rows of null keys hold zeros), without copying."""
    if isinstance(key_hash, pa.ChunkedArray):
        key_hash = key_hash.combine_chunks()
    if len(key_hash) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    words = np.frombuffer(key_hash.buffers()[1], dtype=np.uint64)
    return words[key_hash.offset * 2 : (key_hash.offset + len(key_hash)) * 2].reshape(-1, 2)


# A section spans fewer than 2**32 offsets, so its offsets fit a 32-bit roaring bitmap as deltas.
MAX_OFFSET_SPAN = 2**32 - 1


class SectionInfo(NamedTuple):
    """One section as its file describes it: offsets are deltas from the section's first offset.

    A named tuple, not a dataclass: catalogs and plans hold hundreds of thousands, and a tuple is built
    several times faster.

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
    # HyperLogLog registers of the section's key hashes (logcompact.sketch), base64; "" for no keys.
    key_sketch: str = ""

    def to_dict(self) -> dict:
        return self._asdict()

    @classmethod
    def from_dict(cls, data: dict) -> SectionInfo:
        return cls(**data)
