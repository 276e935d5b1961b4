"""Kafka's record batches (magic 2), through kafka-python's record module: the only module of the package that
imports it, so handlers never see the library.

A batch is read in two steps, as a broker validates it: `read_batch` checks its framing, magic and CRC-32C and
gives the header fields (size, producer id, compression) without decompressing, so a batch refused for its size
or producer costs no decompression; `Batch.records` then decompresses (gzip, snappy, lz4, zstd) and decodes
every record. The compressed size is what `max.message.bytes` limits, as in Kafka.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch

_HEADER = DefaultRecordBatch.HEADER_STRUCT
_LOG_OVERHEAD = struct.calcsize(">qi")  # base offset and length: the length counts the bytes after them
_MAGIC_OFFSET = struct.calcsize(">qii")
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
ZSTD = 4


class CorruptBatchError(Exception):
    """Bytes that are not the record batch they declare (CRC mismatch, truncated, bad record structure): Kafka's
    CORRUPT_MESSAGE."""


class InvalidBatchError(Exception):
    """A well-formed batch Produce v3+ does not take (old magic, more than one batch, none): Kafka's INVALID_RECORD."""


class BatchRecord(NamedTuple):
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes | None]]


@dataclass(frozen=True)
class Batch:
    size_bytes: int
    codec: int
    record_count: int
    producer_id: int
    transactional: bool
    control: bool
    _batch: Any

    @property
    def codec_name(self) -> str:
        return CODEC_NAMES.get(self.codec, f"codec {self.codec}")

    def records(self) -> list[BatchRecord]:
        """Every record, decompressed; CorruptBatchError when they do not decode or do not fill the batch."""
        try:
            return [BatchRecord(record.timestamp, record.key, record.value, record.headers) for record in self._batch]
        except (CorruptRecordError, UnsupportedCodecError, UnicodeDecodeError, OSError, EOFError, ValueError, RuntimeError) as exc:
            # gzip raises OSError/EOFError, lz4 RuntimeError, zstd and snappy their own ValueError subclasses
            raise CorruptBatchError(f"{self.codec_name} batch of {self.record_count} records does not decode: {type(exc).__name__}: {exc}") from None


def read_batch(data: bytes) -> Batch:
    """The one batch a Produce (v3+) carries for a partition, its CRC-32C checked; records not yet decoded."""
    if len(data) <= _MAGIC_OFFSET:
        if not data:
            raise InvalidBatchError("no record batch: a Produce v3+ carries exactly one per partition")
        raise CorruptBatchError(f"{len(data)} bytes are shorter than a record batch's header")
    magic = data[_MAGIC_OFFSET]
    if magic != 2:
        raise InvalidBatchError(f"record batch of magic {magic}: Produce v3+ takes only magic 2 (record batches), as Kafka")
    if len(data) < _HEADER.size:
        raise CorruptBatchError(f"{len(data)} bytes are shorter than a record batch's {_HEADER.size}-byte header")
    declared = _LOG_OVERHEAD + struct.unpack_from(">i", data, struct.calcsize(">q"))[0]
    if declared > len(data) or declared < _HEADER.size:
        raise CorruptBatchError(f"record batch declares {declared} bytes but {len(data)} were sent")
    if declared < len(data):
        raise InvalidBatchError("more than one record batch: a Produce v3+ carries exactly one per partition")
    batch = DefaultRecordBatch(data)
    if not batch.validate_crc():
        raise CorruptBatchError("record batch CRC-32C does not match its bytes")
    return Batch(
        size_bytes=declared,
        codec=batch.compression_type,
        record_count=batch.records_count,
        producer_id=batch.producer_id,
        transactional=batch.is_transactional,
        control=batch.is_control_batch,
        _batch=batch,
    )
