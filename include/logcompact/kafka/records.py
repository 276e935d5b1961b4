"""Kafka's record batches (magic 2), through kafka-python's record module: the only module of the package that
imports it, so handlers never see the library.

A batch is read in two steps, as a broker validates it: `read_batch` checks its framing, magic and CRC-32C and
gives the header fields (size, producer id, compression) without decompressing, so a batch refused for its size
or producer costs no decompression; `Batch.records` then decompresses (gzip, snappy, lz4, zstd) and decodes
every record. The compressed size is what `max.message.bytes` limits, as in Kafka; the decompressed size is
bounded here (kafka-python's own decompression is not), so a small batch that inflates to gigabytes is refused
after at most `limit` bytes instead of taking the agent's memory.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import lz4.frame
import snappy
import zstandard
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import calc_crc32c

_HEADER = DefaultRecordBatch.HEADER_STRUCT
_LOG_OVERHEAD = struct.calcsize(">qi")  # base offset and length: the length counts the bytes after them
_MAGIC_OFFSET = struct.calcsize(">qii")
_ATTRIBUTES_OFFSET = DefaultRecordBatch.ATTRIBUTES_OFFSET
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
_CODEC_BITS = 0x07
_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # the block framing Kafka's Java client writes snappy in
_XERIAL_HEADER_BYTES = 16
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_MAX_OFFSET_DELTA = 2**31 - 1  # a batch's last_offset_delta is an int32
NO_PRODUCER = -1
NO_LEADER_EPOCH = -1  # as Metadata says: clients then never validate offsets by leader epoch
_LEADER_EPOCH_OFFSET = _LOG_OVERHEAD
_LAST_OFFSET_DELTA_OFFSET = struct.calcsize(">qiibIh")
EMPTY_BATCH_BYTES = _HEADER.size


class CorruptBatchError(Exception):
    """Bytes that are not the record batch they declare (CRC mismatch, truncated, bad record structure): Kafka's
    CORRUPT_MESSAGE."""


class BatchTooLargeError(Exception):
    """A batch whose records decompress to more than the agent takes."""


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
    _batch: Any  # kafka-python's DefaultRecordBatch of the bytes as sent
    _header: bytes
    _payload: bytes  # the records, compressed when the codec is not none

    @property
    def codec_name(self) -> str:
        return CODEC_NAMES.get(self.codec, f"codec {self.codec}")

    def records(self, limit: int) -> list[BatchRecord]:
        """Every record, decompressed into at most `limit` bytes (BatchTooLargeError past it); CorruptBatchError
        when they do not decompress or decode, or do not fill the batch."""
        batch = self._batch
        try:
            if self.codec != NONE:
                batch = _decompressed(self._header, self.codec, self._payload, limit)
            return [BatchRecord(record.timestamp, record.key, record.value, record.headers) for record in batch]
        except (CorruptRecordError, UnsupportedCodecError, UnicodeDecodeError, zlib.error, zstandard.ZstdError, snappy.UncompressError, ValueError, RuntimeError) as exc:
            # lz4 raises RuntimeError; UnsupportedCodecError: codec ids 5-7
            raise CorruptBatchError(f"{self.codec_name} batch of {self.record_count} records does not decode: {type(exc).__name__}: {exc}") from None


def _decompressed(header: bytes, codec: int, payload: bytes, limit: int) -> DefaultRecordBatch:
    """The batch with its records decompressed (and the codec bits of its attributes cleared), for kafka-python
    to decode; its CRC was checked on the compressed bytes."""
    records = _decompress(codec, payload, limit)
    attributes = struct.unpack_from(">h", header, _ATTRIBUTES_OFFSET)[0] & ~_CODEC_BITS
    plain = bytearray(header)
    struct.pack_into(">h", plain, _ATTRIBUTES_OFFSET, attributes)
    return DefaultRecordBatch(bytes(plain) + records)


def _decompress(codec: int, payload: bytes, limit: int) -> bytes:
    too_large = BatchTooLargeError(f"{CODEC_NAMES[codec]} batch decompresses to more than {limit} bytes, the most the agent takes")
    if codec == GZIP:
        inflater = zlib.decompressobj(_GZIP_WBITS)
        inflated = inflater.decompress(payload, limit + 1)
        if len(inflated) > limit:
            raise too_large
        if not inflater.eof or inflater.unused_data:
            raise CorruptRecordError("gzip data is truncated or followed by other bytes")
        return inflated
    if codec == LZ4:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        inflated = decompressor.decompress(payload, max_length=limit + 1)
        if len(inflated) > limit:
            raise too_large
        if not decompressor.eof:
            raise CorruptRecordError("lz4 frame is truncated")
        return inflated
    if codec == ZSTD:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload), read_across_frames=True) as reader:
            inflated = reader.read(limit + 1)
        if len(inflated) > limit:
            raise too_large
        return inflated
    if codec == SNAPPY:
        blocks = _snappy_blocks(payload)
        # Each snappy block starts with its uncompressed length: checked before anything is decompressed.
        if sum(_snappy_length(block) for block in blocks) > limit:
            raise too_large
        return b"".join(snappy.decompress(block) for block in blocks)
    raise UnsupportedCodecError(f"compression codec id {codec} is not one of Kafka's")


def _snappy_blocks(payload: bytes) -> list[bytes]:
    """The raw snappy blocks of a batch's payload: xerial-framed ([length][block]...) or one raw block."""
    if not payload.startswith(_XERIAL_MAGIC):
        return [payload]
    blocks, cursor = [], _XERIAL_HEADER_BYTES
    while cursor < len(payload):
        if cursor + 4 > len(payload):
            raise CorruptRecordError("snappy block length is truncated")
        size = struct.unpack_from(">i", payload, cursor)[0]
        cursor += 4
        if size < 0 or cursor + size > len(payload):
            raise CorruptRecordError(f"snappy block of {size} bytes runs past the batch")
        blocks.append(payload[cursor : cursor + size])
        cursor += size
    return blocks


def _snappy_length(block: bytes) -> int:
    """A raw snappy block's uncompressed length: its leading little-endian base-128 varint (at most 32 bits)."""
    length = 0
    for position, byte in enumerate(block[:5]):
        length |= (byte & 0x7F) << (7 * position)
        if not byte & 0x80:
            return length
    raise CorruptRecordError("snappy block has no uncompressed length")


def producer_epoch_and_sequence(batch: Batch) -> tuple[int, int]:
    """An idempotent producer's epoch and the sequence of the batch's first record (-1 and -1 without a producer)."""
    return batch._batch.producer_epoch, batch._batch.base_sequence


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
        _header=data[: _HEADER.size],
        _payload=data[_HEADER.size :],
    )


class BatchBuilder:
    """One uncompressed record batch v2 of records in offset order, for Fetch: each record keeps its own offset
    (base offset + offset delta), so offsets a compaction removed are gaps in the deltas, as in Kafka's compacted
    batches. The first record is always taken, however large: a fetch must return at least one whole record."""

    def __init__(self, base_offset: int, max_bytes: int) -> None:
        self.base_offset = base_offset
        self._builder = DefaultRecordBatchBuilder(
            magic=2, compression_type=NONE, is_transactional=False, producer_id=NO_PRODUCER,
            producer_epoch=-1, base_sequence=-1, batch_size=max_bytes,
        )
        self.record_count = 0

    def append(self, offset: int, timestamp: int, key: bytes | None, value: bytes | None, headers: list[tuple[str, bytes | None]]) -> bool:
        """Whether the record was taken: False when it would take the batch past its max_bytes."""
        delta = offset - self.base_offset
        if delta > _MAX_OFFSET_DELTA:
            return False
        if self._builder.append(delta, timestamp=timestamp, key=key, value=value, headers=headers) is None:
            return False
        self.record_count += 1
        return True

    @property
    def size_bytes(self) -> int:
        return self._builder.size()

    def build(self, last_offset: int | None = None) -> bytes:
        """The batch's bytes, its base offset and leader epoch set (outside the CRC, as a broker sets them).

        `last_offset`, past the last record's: offsets after it that compaction removed, which the batch then
        covers (as Kafka's compacted batches keep their last offset), so a consumer's next fetch starts after
        them. A batch of no records is how Kafka's cleaner keeps an offset range whose records are all gone."""
        batch = self._builder.build()
        struct.pack_into(">q", batch, 0, self.base_offset)
        struct.pack_into(">i", batch, _LEADER_EPOCH_OFFSET, NO_LEADER_EPOCH)
        if last_offset is not None:
            struct.pack_into(">i", batch, _LAST_OFFSET_DELTA_OFFSET, min(last_offset - self.base_offset, _MAX_OFFSET_DELTA))
            struct.pack_into(">I", batch, DefaultRecordBatch.CRC_OFFSET, calc_crc32c(memoryview(batch)[_ATTRIBUTES_OFFSET:]))
        return bytes(batch)
