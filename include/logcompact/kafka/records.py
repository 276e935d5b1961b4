"""Kafka's record batches (magic 2): read through kafka-python's record module (the only module of the package that
imports it, so handlers never see the library), built for Fetch from Arrow columns by compiled loops.

A batch is read in two steps, as a broker validates it: `read_batch` checks its framing, magic and CRC-32C and
gives the header fields (size, producer id, compression) without decompressing, so a batch refused for its size
or producer costs no decompression; `Batch.records` then decompresses (gzip, snappy, lz4, zstd) and decodes
every record. The compressed size is what `max.message.bytes` limits, as in Kafka; the decompressed size is
bounded here (kafka-python's own decompression is not), so a small batch that inflates to gigabytes is refused
after at most `limit` bytes instead of taking the agent's memory.

Fetch's batches are built by `BatchBuffer.encode` from the columns consume reads (`RecordColumns`), uncompressed,
a batch at a time up to a byte limit, one after another in one buffer: sized and written by numba loops over the
columns (keys and values copied by memcpy), far faster than kafka-python's per-record builder, so a consumer is not
held back by the agent's Python.
"""

from __future__ import annotations

import io
import struct
import zlib
from dataclasses import dataclass
from typing import Any, NamedTuple

import crc32c
import lz4.frame
import numba
import numpy as np
import pyarrow as pa
import snappy
import zstandard
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch
from numba.core import cgutils, types
from numba.extending import intrinsic

from logcompact.consume import RECORD_SCHEMA

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
_CRC_OFFSET = DefaultRecordBatch.CRC_OFFSET
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


# -- Fetch: record batches built from Arrow columns -------------------------------------------------------------
#
# Records are encoded by compiled loops over the columns (numba), not one by one in Python: a batch's records are
# sized in one pass (varints included) until the batch is full, then written into one buffer of exactly that size.
# Layout: Kafka's DefaultRecordBatch (61-byte header, then each record as a zigzag-varint length, attributes 0,
# timestamp delta, offset delta, key, value and headers, lengths as zigzag varints, -1 for null).


class RecordColumns(NamedTuple):
    """The columns of records in offset order (offset, timestamp, key, value, headers: consume.RECORD_SCHEMA) as the
    arrays the encoding loops read. Binary columns are (offsets, bytes, valid); header keys and values index the
    flattened headers, whose per-record ranges are `header_offsets`."""

    offsets: np.ndarray
    timestamps: np.ndarray
    key_offsets: np.ndarray
    key_bytes: np.ndarray
    key_valid: np.ndarray
    value_offsets: np.ndarray
    value_bytes: np.ndarray
    value_valid: np.ndarray
    header_offsets: np.ndarray
    header_valid: np.ndarray
    header_key_offsets: np.ndarray
    header_key_bytes: np.ndarray
    header_value_offsets: np.ndarray
    header_value_bytes: np.ndarray
    header_value_valid: np.ndarray

    @staticmethod
    def of(batch: pa.RecordBatch) -> RecordColumns:
        headers = batch.column("headers")
        entries = headers.values
        return RecordColumns(
            _readonly(batch.column("offset").to_numpy(), np.int64), _readonly(batch.column("timestamp").to_numpy(), np.int64),
            *_binary(batch.column("key")), *_binary(batch.column("value")),
            _readonly(headers.offsets.to_numpy(), np.int32), _readonly(headers.is_valid().to_numpy(zero_copy_only=False), np.bool_),
            *_binary(entries.field("key"))[:2], *_binary(entries.field("value")),
        )

    def __len__(self) -> int:
        return len(self.offsets)


def _readonly(array: np.ndarray, dtype: type) -> np.ndarray:
    """`array` as a read-only contiguous array of `dtype`, copied only when it is not one: every column reaches the
    compiled loops with one type, so they are compiled once (numba compiles again for each new combination)."""
    array = np.ascontiguousarray(array, dtype)
    array.flags.writeable = False
    return array


def _binary(array: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A binary or string array's value offsets (len + 1), bytes and validity, without copying the bytes."""
    _, offsets, data = array.buffers()
    if not len(array) or offsets is None:
        value_offsets, valid = np.zeros(1, dtype=np.int32), np.zeros(len(array), dtype=np.bool_)
    else:
        value_offsets = np.frombuffer(offsets, dtype=np.int32)[array.offset : array.offset + len(array) + 1]
        valid = array.is_valid().to_numpy(zero_copy_only=False)
    data_bytes = np.zeros(0, dtype=np.uint8) if data is None else np.frombuffer(data, dtype=np.uint8)
    return _readonly(value_offsets, np.int32), _readonly(data_bytes, np.uint8), _readonly(valid, np.bool_)


def compile_encoder() -> None:
    """Compile (or load from numba's cache) the encoding loops now, so that no Fetch waits for it: an agent calls this
    before it serves."""
    sample = pa.RecordBatch.from_pylist([{"offset": 0, "timestamp": 0, "key": b"k", "value": None, "headers": [{"key": "h", "value": b"v"}]}], RECORD_SCHEMA)
    BatchBuffer(1024).encode(RecordColumns.of(sample), 0, 1024)


class BatchBuffer:
    """Record batches written one after another into one buffer (grown when full): a partition's answer to a Fetch,
    handed to the response as it is (`records`) instead of joined from batches of their own."""

    def __init__(self, capacity: int) -> None:
        self._data = np.empty(max(capacity, EMPTY_BATCH_BYTES), dtype=np.uint8)
        self.size = 0  # the bytes of the batches kept
        self._last = -1  # where the last batch kept starts

    @property
    def records(self) -> memoryview:
        return self._data.data[: self.size]

    def encode(self, columns: RecordColumns, start: int, max_bytes: int) -> tuple[int, int]:
        """Write after the batches kept one uncompressed record batch v2 of the records from row `start` on, at most
        `max_bytes` long, and return its length and the row after its last record; `keep` keeps it, else the next
        write replaces it. The first record is always taken, however large: a fetch must return at least one whole
        record. Each record keeps its offset (base offset + offset delta), so offsets a compaction removed are gaps
        in the deltas, as in Kafka's compacted batches. Leader epoch -1, no producer id, CRC-32C set."""
        while True:
            length, end, max_timestamp = _encode_records(
                self._data, self.size, start, max_bytes, _MAX_OFFSET_DELTA, columns.offsets, columns.timestamps,
                columns.key_offsets, columns.key_bytes, columns.key_valid, columns.value_offsets, columns.value_bytes, columns.value_valid,
                columns.header_offsets, columns.header_valid, columns.header_key_offsets, columns.header_key_bytes,
                columns.header_value_offsets, columns.header_value_bytes, columns.header_value_valid,
            )
            if self.size + length <= len(self._data):
                break
            self._grow(self.size + length)  # sized, not written: written again once it fits
        base_offset = int(columns.offsets[start])
        _finish(
            self._data[self.size : self.size + length], base_offset, int(columns.offsets[end - 1]) - base_offset,
            int(columns.timestamps[start]), int(max_timestamp), end - start,
        )
        return length, end

    def keep(self, length: int) -> None:
        self._last, self.size = self.size, self.size + length

    def keep_empty(self, base_offset: int, last_offset: int) -> None:
        """Keep a batch of no records covering offsets `base_offset` to `last_offset`: how Kafka's cleaner keeps an
        offset range whose records are all gone, so a consumer's next fetch starts after it."""
        self._grow(self.size + EMPTY_BATCH_BYTES)
        batch = self._data[self.size : self.size + EMPTY_BATCH_BYTES]
        batch[:] = 0
        _finish(batch, base_offset, min(last_offset - base_offset, _MAX_OFFSET_DELTA), 0, 0, 0)
        self.keep(EMPTY_BATCH_BYTES)

    def cover_to(self, last_offset: int) -> None:
        """Make the last batch kept cover the offsets up to `last_offset`, past its last record's: offsets that
        compaction removed, as Kafka's compacted batches keep their last offset."""
        data = self._data[self._last : self.size].data
        base_offset = struct.unpack_from(">q", data, 0)[0]
        struct.pack_into(">i", data, _LAST_OFFSET_DELTA_OFFSET, min(last_offset - base_offset, _MAX_OFFSET_DELTA))
        struct.pack_into(">I", data, _CRC_OFFSET, crc32c.crc32c(data[_ATTRIBUTES_OFFSET:]))

    def offset_after(self, otherwise: int) -> int:
        """The offset after the last one the batches kept cover (`otherwise` when none is)."""
        if not self.size:
            return otherwise
        data = self._data[self._last : self.size].data
        return int(struct.unpack_from(">q", data, 0)[0] + struct.unpack_from(">i", data, _LAST_OFFSET_DELTA_OFFSET)[0] + 1)

    def _grow(self, needed: int) -> None:
        if needed > len(self._data):
            grown = np.empty(max(needed, 2 * len(self._data)), dtype=np.uint8)
            grown[: self.size] = self._data[: self.size]
            self._data = grown


def _finish(batch: np.ndarray, base_offset: int, last_offset_delta: int, first_timestamp: int, max_timestamp: int, count: int) -> None:
    """Write the header of a batch whose records are in place, its CRC-32C last."""
    data = batch.data
    _HEADER.pack_into(
        data, 0, base_offset, len(batch) - _LOG_OVERHEAD, NO_LEADER_EPOCH, 2, 0, NONE, last_offset_delta, first_timestamp,
        max_timestamp, NO_PRODUCER, -1, -1, count,
    )
    struct.pack_into(">I", data, _CRC_OFFSET, crc32c.crc32c(data[_ATTRIBUTES_OFFSET:]))


@numba.njit(cache=True, nogil=True, inline="always")
def _zigzag(value):
    return np.uint64((value << np.int64(1)) ^ (value >> np.int64(63)))


@numba.njit(cache=True, nogil=True, inline="always")
def _varint_size(value):
    rest = _zigzag(np.int64(value))
    size = 1
    while rest >= np.uint64(0x80):
        rest >>= np.uint64(7)
        size += 1
    return size


@numba.njit(cache=True, nogil=True, inline="always")
def _put_varint(out, at, value):
    rest = _zigzag(np.int64(value))
    while rest >= np.uint64(0x80):
        out[at] = np.uint8((rest & np.uint64(0x7F)) | np.uint64(0x80))
        rest >>= np.uint64(7)
        at += 1
    out[at] = np.uint8(rest)
    return at + 1


@numba.njit(cache=True, nogil=True, inline="always")
def _field_size(offsets, valid, row):
    if not valid[row]:
        return 1  # length -1
    length = offsets[row + 1] - offsets[row]
    return _varint_size(length) + length


@intrinsic
def _copy_bytes(typingctx, out, at, data, first, length):
    """out[at:at + length] = data[first:first + length] as one memcpy: numba's slice assignment is a byte loop
    (broadcasting, overlap checks), which made copying keys and values most of the encoder's time."""
    signature = types.void(out, types.intp, data, types.intp, types.intp)

    def codegen(context, builder, sig, args):
        out_value, at_value, data_value, first_value, length_value = args
        target = context.make_array(sig.args[0])(context, builder, out_value)
        source = context.make_array(sig.args[2])(context, builder, data_value)
        cgutils.raw_memcpy(builder, builder.gep(target.data, [at_value]), builder.gep(source.data, [first_value]), length_value, 1)

    return signature, codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _put_bytes(out, at, offsets, data, row):
    first, end = offsets[row], offsets[row + 1]
    at = _put_varint(out, at, end - first)
    _copy_bytes(out, at, data, first, end - first)
    return at + end - first


@numba.njit(cache=True, nogil=True, inline="always")
def _put_field(out, at, offsets, data, valid, row):
    if not valid[row]:
        out[at] = np.uint8(1)  # zigzag(-1): null
        return at + 1
    return _put_bytes(out, at, offsets, data, row)


@numba.njit(cache=True, nogil=True)
def _body_size(row, base_offset, first_timestamp, offsets, timestamps, key_offsets, key_valid, value_offsets, value_valid,
               header_offsets, header_valid, header_key_offsets, header_value_offsets, header_value_valid):
    size = 1 + _varint_size(timestamps[row] - first_timestamp) + _varint_size(offsets[row] - base_offset)
    size += _field_size(key_offsets, key_valid, row) + _field_size(value_offsets, value_valid, row)
    count = header_offsets[row + 1] - header_offsets[row] if header_valid[row] else 0
    size += _varint_size(count)
    for header in range(header_offsets[row], header_offsets[row] + count):
        key_length = header_key_offsets[header + 1] - header_key_offsets[header]
        size += _varint_size(key_length) + key_length + _field_size(header_value_offsets, header_value_valid, header)
    return size


@numba.njit(cache=True, nogil=True)
def _encode_records(out, batch_at, start, max_bytes, max_delta, offsets, timestamps, key_offsets, key_bytes, key_valid, value_offsets,
                    value_bytes, value_valid, header_offsets, header_valid, header_key_offsets, header_key_bytes, header_value_offsets,
                    header_value_bytes, header_value_valid):
    """(the batch's length; the row after its last record; its largest timestamp), its records written into `out` from
    `batch_at` (its header left to write) when it fits there, else only sized."""
    base_offset, first_timestamp = offsets[start], timestamps[start]
    total = EMPTY_BATCH_BYTES
    end = start
    bodies = np.empty(len(offsets) - start, dtype=np.int64)  # each record's size, written in the second pass
    while end < len(offsets):
        if end > start and offsets[end] - base_offset > max_delta:
            break
        body = _body_size(end, base_offset, first_timestamp, offsets, timestamps, key_offsets, key_valid, value_offsets, value_valid,
                          header_offsets, header_valid, header_key_offsets, header_value_offsets, header_value_valid)
        size = _varint_size(body) + body
        if end > start and total + size > max_bytes:
            break
        bodies[end - start] = body
        total += size
        end += 1
    max_timestamp = timestamps[start]
    if batch_at + total > len(out):
        return total, end, max_timestamp
    at = batch_at + EMPTY_BATCH_BYTES
    for row in range(start, end):
        max_timestamp = max(max_timestamp, timestamps[row])
        at = _put_varint(out, at, bodies[row - start])
        out[at] = np.uint8(0)  # attributes
        at = _put_varint(out, at + 1, timestamps[row] - first_timestamp)
        at = _put_varint(out, at, offsets[row] - base_offset)
        at = _put_field(out, at, key_offsets, key_bytes, key_valid, row)
        at = _put_field(out, at, value_offsets, value_bytes, value_valid, row)
        count = header_offsets[row + 1] - header_offsets[row] if header_valid[row] else 0
        at = _put_varint(out, at, count)
        for header in range(header_offsets[row], header_offsets[row] + count):
            at = _put_bytes(out, at, header_key_offsets, header_key_bytes, header)
            at = _put_field(out, at, header_value_offsets, header_value_bytes, header_value_valid, header)
    return total, end, max_timestamp
