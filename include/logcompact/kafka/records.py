"""Kafka's record batches (magic 2): read into Arrow columns for Produce and built from Arrow columns for Fetch, both
by compiled loops (numba), so neither costs Python per record.

A batch is read in two steps, as a broker validates it: `read_batch` checks its framing, magic and CRC-32C and
gives the header fields (size, producer id, compression) without decompressing, so a batch refused for its size
or producer costs no decompression; `Batch.columns` then decompresses (gzip, snappy, lz4, zstd) and decodes
every record into columns (timestamp, key, value, headers). The compressed size is what `max.message.bytes`
limits, as in Kafka; the decompressed size is bounded here, so a small batch that inflates to gigabytes is refused
after at most `limit` bytes instead of taking the agent's memory.

Records are decoded as Kafka's broker reads them (DefaultRecord.readFrom): varints of at most 5 bytes (int32)
and varlongs of at most 10, zigzag-encoded; a record's fields must fill exactly the length it declares, and the
records exactly the bytes of the batch, as many as its header counts; a key, value or header value of length -1
is null, any other negative length is corrupt, as is a negative header count or a header key that is null or not
UTF-8. One pass checks and locates every field, a second copies keys, values and headers into Arrow's buffers (memcpy).

Fetch's batches are built by `BatchBuffer.encode` from the columns consume reads (`RecordColumns`), a batch at a
time up to a byte limit, one after another in one buffer: sized and written by numba loops over the columns (keys and
values copied by memcpy), far faster than kafka-python's per-record builder, so a consumer is not held back by the
agent's Python. A batch is then compressed in place with the codec asked for (`compress`: gzip, snappy in Kafka's
xerial framing, lz4 frames of independent 64 KiB blocks as Kafka's Java client writes them, zstd), each codec at a fast
level, as every fetch compresses again what it sends; a batch that would not shrink is sent uncompressed.
"""

from __future__ import annotations

import io
import struct
import threading
import zlib
from dataclasses import dataclass
from typing import NamedTuple

import crc32c
import lz4.frame
import numba
import numpy as np
import pyarrow as pa
import snappy
import zstandard
from kafka.errors import CorruptRecordError, UnsupportedCodecError
from kafka.record.default_records import DefaultRecordBatch

from logcompact.consume import RECORD_SCHEMA
from logcompact.format.layout import HEADERS_TYPE
from logcompact.format.memcopy import copy_bytes
from logcompact.ingest import PRODUCE_SCHEMA

_HEADER = DefaultRecordBatch.HEADER_STRUCT
_LOG_OVERHEAD = struct.calcsize(">qi")  # base offset and length: the length counts the bytes after them
_MAGIC_OFFSET = struct.calcsize(">qii")
_ATTRIBUTES_OFFSET = DefaultRecordBatch.ATTRIBUTES_OFFSET
CODEC_NAMES = {0: "none", 1: "gzip", 2: "snappy", 3: "lz4", 4: "zstd"}
NONE, GZIP, SNAPPY, LZ4, ZSTD = range(5)
_CODEC_BITS = 0x07
_LOG_APPEND_TIME_BIT = 0x08  # the batch's timestamp type: every record then takes the batch's max timestamp
_TRANSACTIONAL_BIT = 0x10
_CONTROL_BIT = 0x20
_XERIAL_MAGIC = b"\x82SNAPPY\x00"  # the block framing Kafka's Java client writes snappy in
_XERIAL_HEADER_BYTES = 16
_GZIP_WBITS = 16 + zlib.MAX_WBITS
_MAX_OFFSET_DELTA = 2**31 - 1  # a batch's last_offset_delta is an int32
NO_PRODUCER = -1
# Kafka's RecordBatch.NO_PARTITION_LEADER_EPOCH, in batches and in Metadata, ListOffsets and OffsetFetch answers:
# partitions have no leader epoch here, so clients never validate offsets by one.
NO_LEADER_EPOCH = -1
NO_TIMESTAMP = -1  # a record's timestamp when its producer gave none
_CRC_OFFSET = DefaultRecordBatch.CRC_OFFSET
_LAST_OFFSET_DELTA_OFFSET = struct.calcsize(">qiibIh")
EMPTY_BATCH_BYTES = _HEADER.size
_COMMIT_KEY = struct.pack(">hh", 0, 1)  # Kafka's control record key: version 0, type COMMIT
_COMMIT_VALUE = struct.pack(">hi", 0, 0)  # its end-transaction marker: version 0, coordinator epoch 0
# A control batch of one COMMIT marker, at the largest offset delta (a varint of 5 bytes) and before it
MARKER_BATCH_BYTES = EMPTY_BATCH_BYTES + 1 + 1 + 1 + 5 + 1 + len(_COMMIT_KEY) + 1 + len(_COMMIT_VALUE) + 1
# The fewest bytes a record takes: its length, attributes, timestamp and offset deltas, key and value lengths (-1)
# and header count, one byte each. A batch counting more records than its bytes can hold is refused before any
# array is sized by the count.
_MIN_RECORD_BYTES = 7
_FIRST_STEP_BYTES = 64 * 1024  # the first output a compressed batch is decompressed into


class CorruptBatchError(Exception):
    """Bytes that are not the record batch they declare (CRC mismatch, truncated, bad record structure): Kafka's
    CORRUPT_MESSAGE."""


class BatchTooLargeError(Exception):
    """A batch whose records decompress to more than the agent takes."""


class InvalidBatchError(Exception):
    """A well-formed batch Produce v3+ does not take (old magic, more than one batch, none): Kafka's INVALID_RECORD."""


class TimestampOutOfRangeError(Exception):
    """A record whose timestamp (the batch's first plus its delta) is past int64: Kafka's INVALID_TIMESTAMP."""


@dataclass(frozen=True)
class Batch:
    size_bytes: int
    codec: int
    record_count: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional: bool
    control: bool
    _log_append_time: bool  # the producer's timestamp type: its records take max_timestamp
    _first_timestamp: int
    _max_timestamp: int
    _payload: memoryview  # the records, compressed when the codec is not none

    @property
    def codec_name(self) -> str:
        return CODEC_NAMES.get(self.codec, f"codec {self.codec}")

    def columns(self, limit: int) -> pa.RecordBatch:
        """Every record as a row of PRODUCE_SCHEMA (a timestamp of -1, none given, is null), decompressed into at most
        `limit` bytes (BatchTooLargeError past it). CorruptBatchError when they do not decompress or decode, or do not
        fill the batch; TimestampOutOfRangeError for a timestamp past int64."""
        try:
            data = self._payload if self.codec == NONE else _decompress(self.codec, self._payload, limit)
        except (CorruptRecordError, UnsupportedCodecError, zlib.error, zstandard.ZstdError, snappy.UncompressError, ValueError, RuntimeError) as exc:
            # lz4 raises RuntimeError; UnsupportedCodecError: codec ids 5-7
            raise CorruptBatchError(f"{self.codec_name} batch of {self.record_count} records does not decompress: {type(exc).__name__}: {exc}") from None
        return decode_records(np.frombuffer(data, dtype=np.uint8), self.record_count, self._first_timestamp, self._log_append_time, self._max_timestamp)


def _decompress(codec: int, payload: memoryview, limit: int) -> bytes:
    too_large = BatchTooLargeError(f"{CODEC_NAMES[codec]} batch decompresses to more than {limit} bytes, the most the agent takes")
    if codec == GZIP:
        inflater = zlib.decompressobj(_GZIP_WBITS)
        inflated = inflater.decompress(payload, limit + 1)
        if len(inflated) > limit:
            raise too_large
        if not inflater.eof or inflater.unused_data:
            raise CorruptRecordError("gzip data is truncated or followed by other bytes")
        return inflated
    # lz4 and zstd allocate what they are allowed to return: asked for limit + 1 bytes at once, every batch would cost a
    # 64 MiB allocation. They are read in steps from 8 times the compressed size, doubling, until the end or the limit.
    step = max(_FIRST_STEP_BYTES, 8 * len(payload))
    chunks: list[bytes] = []
    inflated_bytes = 0
    if codec == LZ4:
        decompressor = lz4.frame.LZ4FrameDecompressor()
        data: memoryview | bytes = payload
        while not decompressor.eof:
            if chunks and decompressor.needs_input:
                raise CorruptRecordError("lz4 frame is truncated")
            chunks.append(decompressor.decompress(data, max_length=min(step, limit + 1 - inflated_bytes)))
            data, inflated_bytes, step = b"", inflated_bytes + len(chunks[-1]), step * 2
            if inflated_bytes > limit:
                raise too_large
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)
    if codec == ZSTD:
        with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(payload), read_across_frames=True) as reader:
            while chunk := reader.read(min(step, limit + 1 - inflated_bytes)):
                chunks.append(chunk)
                inflated_bytes, step = inflated_bytes + len(chunk), step * 2
                if inflated_bytes > limit:
                    raise too_large
        return b"".join(chunks)
    if codec == SNAPPY:
        blocks = _snappy_blocks(payload)
        # Each snappy block starts with its uncompressed length: checked before anything is decompressed.
        if sum(_snappy_length(block) for block in blocks) > limit:
            raise too_large
        return b"".join(snappy.decompress(block) for block in blocks)
    raise UnsupportedCodecError(f"compression codec id {codec} is not one of Kafka's")


def _snappy_blocks(payload: memoryview) -> list[memoryview]:
    """The raw snappy blocks of a batch's payload: xerial-framed ([length][block]...) or one raw block."""
    if bytes(payload[: len(_XERIAL_MAGIC)]) != _XERIAL_MAGIC:
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


def _snappy_length(block: memoryview) -> int:
    """A raw snappy block's uncompressed length: its leading little-endian base-128 varint (at most 32 bits)."""
    length = 0
    for position, byte in enumerate(block[:5]):
        length |= (byte & 0x7F) << (7 * position)
        if not byte & 0x80:
            return length
    raise CorruptRecordError("snappy block has no uncompressed length")


# Fetch's codecs, each at a level fast enough that a fetch costs the agent little more than encoding the batch: on
# JSON values gzip 1 compresses ~4x faster than gzip 6 for 25% more bytes, zstd 1 ~3x faster than zstd 3 for as many.
_FETCH_GZIP_LEVEL = 1
_FETCH_ZSTD_LEVEL = 1
# A batch is compressed only when its first PROBE_BYTES shrink by at least 1/MIN_SAVING_SHARE: random or already
# compressed values (lz4 takes 1 MiB of hex digits to 0.93 of it) would cost the agent a compression and every
# consumer a decompression for a few percent fewer bytes.
PROBE_BYTES = 64 * 1024
MIN_SAVING_SHARE = 8
_XERIAL_BLOCK_BYTES = 32 * 1024  # the block size Kafka's Java client writes snappy in
_compressors = threading.local()  # a ZstdCompressor is not to be used by two threads at once


def compress(codec: int, data: memoryview) -> bytes:
    """`data` (a batch's records) compressed with Kafka codec `codec` as Kafka's clients read it."""
    if codec == GZIP:
        deflater = zlib.compressobj(_FETCH_GZIP_LEVEL, zlib.DEFLATED, _GZIP_WBITS)
        return deflater.compress(data) + deflater.flush()
    if codec == LZ4:
        return lz4.frame.compress(data, block_size=lz4.frame.BLOCKSIZE_MAX64KB, block_linked=False, content_checksum=False, store_size=False)
    if codec == ZSTD:
        compressor = getattr(_compressors, "zstd", None)
        if compressor is None:
            compressor = _compressors.zstd = zstandard.ZstdCompressor(level=_FETCH_ZSTD_LEVEL)
        return compressor.compress(data)
    if codec == SNAPPY:
        out = [_XERIAL_MAGIC, struct.pack(">ii", 1, 1)]  # version 1, compatible with 1
        for first in range(0, len(data), _XERIAL_BLOCK_BYTES):
            block = snappy.compress(data[first : first + _XERIAL_BLOCK_BYTES])
            out += [struct.pack(">i", len(block)), block]
        return b"".join(out)
    raise UnsupportedCodecError(f"compression codec id {codec} is not one Fetch compresses with")


def worth_compressing(codec: int, data: memoryview) -> bool:
    """Whether `data` shrinks enough to be sent compressed with `codec`, judged by its first PROBE_BYTES (lz4 and
    snappy compress in independent blocks of about that size, so the first is a fair sample)."""
    if len(data) < 2 * PROBE_BYTES:
        return True  # the probe would cost half the compression it spares
    probe = compress(codec, data[:PROBE_BYTES])
    return len(probe) <= PROBE_BYTES - PROBE_BYTES // MIN_SAVING_SHARE


def is_transactional(data: bytes | memoryview | None) -> bool:
    """Whether a Produce partition's records start with a batch whose attributes say transactional (read as Kafka's
    ProduceRequest.hasTransactionalRecords reads them, before any other check)."""
    if data is None or len(data) < _ATTRIBUTES_OFFSET + 2:
        return False
    return bool(struct.unpack_from(">h", data, _ATTRIBUTES_OFFSET)[0] & _TRANSACTIONAL_BIT)


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
    view = memoryview(data)
    (_, _, _, _, crc, attributes, _, first_timestamp, max_timestamp, producer_id, producer_epoch, base_sequence,
     record_count) = _HEADER.unpack_from(view)
    if crc32c.crc32c(view[_ATTRIBUTES_OFFSET:]) != crc:
        raise CorruptBatchError("record batch CRC-32C does not match its bytes")
    return Batch(
        size_bytes=declared,
        codec=attributes & _CODEC_BITS,
        record_count=record_count,
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        transactional=bool(attributes & _TRANSACTIONAL_BIT),
        control=bool(attributes & _CONTROL_BIT),
        _log_append_time=bool(attributes & _LOG_APPEND_TIME_BIT),
        _first_timestamp=first_timestamp,
        _max_timestamp=max_timestamp,
        _payload=view[_HEADER.size :],
    )


# -- Produce: a batch's records decoded into Arrow columns -------------------------------------------------------

# What `_locate_records` found wrong, by its code (0: nothing).
_PROBLEMS = {
    1: "a varint is truncated",
    2: "a varint is longer than Kafka's (5 bytes, or 10 for a varlong)",
    3: "a record's length is negative",
    4: "a record runs past the end of the batch",
    5: "a length is negative other than -1 (null)",
    6: "a field runs past the end of its record",
    7: "a header count is negative",
    8: "a header key is null",
    9: "the fields do not fill the record's declared length",
    10: "bytes are left after the records the batch counts",
    11: "the batch counts more records than its bytes can hold",
}
_TIMESTAMP_OUT_OF_RANGE = 12
_INT64_MAX, _INT64_MIN = np.int64(2**63 - 1), np.int64(-(2**63))


def decode_records(data: np.ndarray, count: int, first_timestamp: int, log_append_time: bool, max_timestamp: int) -> pa.RecordBatch:
    """The `count` records of a batch's (decompressed) records bytes as a RecordBatch of PRODUCE_SCHEMA: timestamps
    (the first timestamp plus each delta, or `max_timestamp` for a LogAppendTime batch; -1 is null), keys and values
    (null for length -1), headers (null for a record with none). CorruptBatchError for bytes that are not exactly
    `count` well-formed records; TimestampOutOfRangeError for a timestamp past int64."""
    count = max(count, 0)  # a negative count reads no records: its bytes are then left over, or the batch is empty
    problem, record, located = _locate_records(data, count, first_timestamp, log_append_time, max_timestamp)
    if problem == _TIMESTAMP_OUT_OF_RANGE:
        raise TimestampOutOfRangeError(f"record {record} of the batch: its timestamp delta takes it past int64 milliseconds")
    if problem:
        raise CorruptBatchError(f"record {record} of {count}: {_PROBLEMS[problem]}")
    (timestamps, key_offsets, key_bytes, key_valid, value_offsets, value_bytes, value_valid, header_offsets, header_key_offsets,
     header_key_bytes, header_value_offsets, header_value_bytes, header_value_valid, nulls) = _gather_records(data, *located)
    timestamp_nulls, key_nulls, value_nulls, header_value_nulls, headerless = nulls.tolist()
    header_count = len(header_key_offsets) - 1
    if header_count:
        header_keys = pa.Array.from_buffers(pa.string(), header_count, [None, pa.py_buffer(header_key_offsets), pa.py_buffer(header_key_bytes)])
        try:
            header_keys.validate(full=True)  # UTF-8, as Kafka's header keys are strings
        except pa.ArrowInvalid:
            raise CorruptBatchError("a header key is not UTF-8") from None
        header_values = _binary_array(header_value_offsets, header_value_bytes, header_value_valid, header_value_nulls)
        entries = pa.StructArray.from_arrays([header_keys, header_values], fields=list(HEADERS_TYPE.value_type))
        has_headers = header_offsets[1:] != header_offsets[:-1]
        headers = pa.Array.from_buffers(HEADERS_TYPE, count, [_validity(has_headers, headerless), pa.py_buffer(header_offsets)],
                                        null_count=headerless, children=[entries])
    else:
        headers = pa.nulls(count, HEADERS_TYPE)
    timestamp_valid = timestamps != NO_TIMESTAMP if timestamp_nulls else None
    columns = [
        pa.Array.from_buffers(pa.int64(), count, [_validity(timestamp_valid, timestamp_nulls), pa.py_buffer(timestamps)], null_count=timestamp_nulls),
        _binary_array(key_offsets, key_bytes, key_valid, key_nulls),
        _binary_array(value_offsets, value_bytes, value_valid, value_nulls),
        headers,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=PRODUCE_SCHEMA)


def _validity(valid: np.ndarray | None, nulls: int) -> pa.Buffer | None:
    """Arrow's validity bitmap of a boolean mask with `nulls` false; None (all valid) when nothing is null."""
    return None if not nulls or valid is None else pa.py_buffer(np.packbits(valid, bitorder="little"))


def _binary_array(offsets: np.ndarray, data: np.ndarray, valid: np.ndarray, nulls: int) -> pa.Array:
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [_validity(valid, nulls), pa.py_buffer(offsets), pa.py_buffer(data)], null_count=nulls)


@numba.njit(cache=True, nogil=True, inline="always")
def _read_varint(data, at, end, max_bytes):
    """Kafka's zigzag varint at `at` (before `end`) of at most `max_bytes` bytes: (value, position after it), the
    position -1 when truncated, -2 when longer. A 5-byte varint is an int32: bits past 32 are dropped, as Java does."""
    raw = np.uint64(0)
    shift = np.uint64(0)
    for _ in range(max_bytes):
        if at >= end:
            return np.int64(0), -1
        byte = np.uint64(data[at])
        at += 1
        raw |= (byte & np.uint64(0x7F)) << shift
        if byte < np.uint64(0x80):
            if max_bytes == 5:
                raw &= np.uint64(0xFFFFFFFF)
            return np.int64(raw >> np.uint64(1)) ^ -np.int64(raw & np.uint64(1)), at
        shift += np.uint64(7)
    return np.int64(0), -2


@numba.njit(cache=True, nogil=True)
def _locate_records(data, count, first_timestamp, log_append_time, max_timestamp):
    """One pass over the records: each one's checks, timestamp and where its key, value and headers lie. Returns
    (problem, record index, the arrays and totals `_gather_records` takes); problem 0 when all is well. A varint's
    position -1 or -2 is its problem 1 or 2, returned as -at."""
    size = len(data)
    timestamps = np.empty(count, dtype=np.int64)
    key_at = np.empty(count, dtype=np.int64)
    key_length = np.empty(count, dtype=np.int64)
    value_at = np.empty(count, dtype=np.int64)
    value_length = np.empty(count, dtype=np.int64)
    headers_at = np.empty(count, dtype=np.int64)
    header_count = np.empty(count, dtype=np.int64)
    totals = np.zeros(5, dtype=np.int64)  # key bytes, value bytes, headers, header key bytes, header value bytes
    located = (timestamps, key_at, key_length, value_at, value_length, headers_at, header_count, totals)
    if count > size // _MIN_RECORD_BYTES:
        return 11, 0, located
    at = 0
    for record in range(count):
        length, at = _read_varint(data, at, size, 5)
        if at < 0:
            return -at, record, located
        if length < 0:
            return 3, record, located
        end = at + length
        if end > size:
            return 4, record, located
        if at >= end:
            return 1, record, located
        at += 1  # attributes: unused in v2 records
        delta, at = _read_varint(data, at, end, 10)
        if at < 0:
            return -at, record, located
        if log_append_time:
            timestamps[record] = max_timestamp
        elif (delta > 0 and first_timestamp > _INT64_MAX - delta) or (delta < 0 and first_timestamp < _INT64_MIN - delta):
            return _TIMESTAMP_OUT_OF_RANGE, record, located
        else:
            timestamps[record] = first_timestamp + delta
        _, at = _read_varint(data, at, end, 5)  # offset delta: offsets are the agent's to assign
        if at < 0:
            return -at, record, located
        for field in range(2):
            field_length, at = _read_varint(data, at, end, 5)
            if at < 0:
                return -at, record, located
            if field_length < -1:
                return 5, record, located
            if at + field_length > end:
                return 6, record, located
            if field == 0:
                key_at[record], key_length[record] = at, field_length
            else:
                value_at[record], value_length[record] = at, field_length
            if field_length > 0:
                totals[field] += field_length
                at += field_length
        headers, at = _read_varint(data, at, end, 5)
        if at < 0:
            return -at, record, located
        if headers < 0:
            return 7, record, located
        if headers > (end - at) // 2:  # a header takes at least its key's and value's lengths
            return 6, record, located
        headers_at[record], header_count[record] = at, headers
        totals[2] += headers
        for _ in range(headers):
            for field in range(2):
                field_length, at = _read_varint(data, at, end, 5)
                if at < 0:
                    return -at, record, located
                if field == 0 and field_length < 0:
                    return 8 if field_length == -1 else 5, record, located
                if field_length < -1:
                    return 5, record, located
                if at + field_length > end:
                    return 6, record, located
                if field_length > 0:
                    totals[3 + field] += field_length
                    at += field_length
        if at != end:
            return 9, record, located
    if at != size:
        return 10, count, located
    return 0, count, located


@numba.njit(cache=True, nogil=True, inline="always")
def _copy_field(data, at, length, offsets, out, row):
    """Field `row` into a binary column's buffers (`length` -1: null, nothing copied); whether it is valid."""
    start = offsets[row]
    if length > 0:
        copy_bytes(out, start, data, at, length)
        offsets[row + 1] = start + length
    else:
        offsets[row + 1] = start
    return length >= 0


@numba.njit(cache=True, nogil=True)
def _gather_records(data, timestamps, key_at, key_length, value_at, value_length, headers_at, header_count, totals):
    """The located records' columns as Arrow buffers: int32 offsets, bytes and validity of keys, values, header keys
    and header values, and the headers' list offsets; then the null counts of timestamps (-1), keys, values and header
    values, and the records without headers."""
    count = len(timestamps)
    key_offsets = np.zeros(count + 1, dtype=np.int32)
    key_bytes = np.empty(totals[0], dtype=np.uint8)
    key_valid = np.empty(count, dtype=np.bool_)
    value_offsets = np.zeros(count + 1, dtype=np.int32)
    value_bytes = np.empty(totals[1], dtype=np.uint8)
    value_valid = np.empty(count, dtype=np.bool_)
    header_offsets = np.zeros(count + 1, dtype=np.int32)
    header_key_offsets = np.zeros(totals[2] + 1, dtype=np.int32)
    header_key_bytes = np.empty(totals[3], dtype=np.uint8)
    header_value_offsets = np.zeros(totals[2] + 1, dtype=np.int32)
    header_value_bytes = np.empty(totals[4], dtype=np.uint8)
    header_value_valid = np.empty(totals[2], dtype=np.bool_)
    nulls = np.zeros(5, dtype=np.int64)
    header = 0
    for row in range(count):
        nulls[0] += timestamps[row] == NO_TIMESTAMP
        key_valid[row] = _copy_field(data, key_at[row], key_length[row], key_offsets, key_bytes, row)
        value_valid[row] = _copy_field(data, value_at[row], value_length[row], value_offsets, value_bytes, row)
        at = headers_at[row]
        for _ in range(header_count[row]):
            length, at = _read_varint(data, at, len(data), 5)
            _copy_field(data, at, length, header_key_offsets, header_key_bytes, header)
            at += length
            length, at = _read_varint(data, at, len(data), 5)
            header_value_valid[header] = _copy_field(data, at, length, header_value_offsets, header_value_bytes, header)
            at += max(length, 0)
            nulls[3] += not header_value_valid[header]
            header += 1
        nulls[1] += not key_valid[row]
        nulls[2] += not value_valid[row]
        nulls[4] += header_count[row] == 0
        header_offsets[row + 1] = header
    return (timestamps, key_offsets, key_bytes, key_valid, value_offsets, value_bytes, value_valid, header_offsets, header_key_offsets,
            header_key_bytes, header_value_offsets, header_value_bytes, header_value_valid, nulls)


def compile_decoder() -> None:
    """Compile (or load from numba's cache) the decoding loops now, so that no Produce waits for it: an agent calls this
    before it serves."""
    body = bytes([0, 0, 0, 2, ord("k"), 1, 2, 2, ord("h"), 0])  # key b"k", null value, header ("h", b"")
    decode_records(np.frombuffer(bytes([2 * len(body)]) + body, dtype=np.uint8), 1, 0, False, 0)


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
        self.uncompressed_length = 0  # of the last batch written, before its compression

    @property
    def records(self) -> memoryview:
        return self._data.data[: self.size]

    def encode(self, columns: RecordColumns, start: int, max_bytes: int, codec: int = NONE) -> tuple[int, int]:
        """Write after the batches kept one record batch v2 of the records from row `start` on, at most `max_bytes`
        long before compression, compressed with Kafka codec `codec` unless that would not shrink it (or its first
        PROBE_BYTES would shrink by less than 1/MIN_SAVING_SHARE: `worth_compressing`), and return its
        length as written and the row after its last record; `keep` keeps it, else the next write replaces it. The
        first record is always taken, however large: a fetch must return at least one whole record. Each record keeps
        its offset (base offset + offset delta), so offsets a compaction removed are gaps in the deltas, as in Kafka's
        compacted batches. Leader epoch -1, no producer id, CRC-32C set."""
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
        attributes, self.uncompressed_length = NONE, length
        body = self._data[self.size + EMPTY_BATCH_BYTES : self.size + length]
        if codec != NONE and worth_compressing(codec, body.data):
            compressed = compress(codec, body.data)
            if len(compressed) < len(body):
                body[: len(compressed)] = np.frombuffer(compressed, dtype=np.uint8)
                length, attributes = EMPTY_BATCH_BYTES + len(compressed), codec
        base_offset = int(columns.offsets[start])
        _finish(
            self._data[self.size : self.size + length], base_offset, int(columns.offsets[end - 1]) - base_offset,
            int(columns.timestamps[start]), int(max_timestamp), end - start, attributes,
        )
        return length, end

    def keep(self, length: int) -> None:
        self._last, self.size = self.size, self.size + length

    def keep_marker(self, base_offset: int, last_offset: int) -> None:
        """Keep a control batch covering offsets `base_offset` to `last_offset` with one COMMIT marker at
        `last_offset`: how a hole at a partition's end (records compacted away or aborted, transaction markers) is
        answered. Every client skips a control batch and fetches on after it; librdkafka also moves the consumer's
        position (`rd_kafka_position`, what quixstreams' changelog recovery waits on) past a control record it
        skips, where a batch of no records moves only its next fetch offset."""
        delta = min(last_offset - base_offset, _MAX_OFFSET_DELTA)
        record = _control_record(delta)
        length = EMPTY_BATCH_BYTES + len(record)
        self._grow(self.size + length)
        batch = self._data[self.size : self.size + length]
        batch[EMPTY_BATCH_BYTES:] = np.frombuffer(record, dtype=np.uint8)
        _finish(batch, base_offset, delta, NO_TIMESTAMP, NO_TIMESTAMP, 1, _TRANSACTIONAL_BIT | _CONTROL_BIT)
        self.keep(length)

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


def _finish(
    batch: np.ndarray, base_offset: int, last_offset_delta: int, first_timestamp: int, max_timestamp: int, count: int, attributes: int = NONE,
) -> None:
    """Write the header of a batch whose records are in place, its CRC-32C last."""
    data = batch.data
    _HEADER.pack_into(
        data, 0, base_offset, len(batch) - _LOG_OVERHEAD, NO_LEADER_EPOCH, 2, 0, attributes, last_offset_delta, first_timestamp,
        max_timestamp, NO_PRODUCER, -1, -1, count,
    )
    struct.pack_into(">I", data, _CRC_OFFSET, crc32c.crc32c(data[_ATTRIBUTES_OFFSET:]))


def _control_record(offset_delta: int) -> bytes:
    """A control record: a COMMIT marker (key: version 0, type 1; value: version 0, coordinator epoch 0) at
    `offset_delta`, timestamp delta 0."""
    body = b"\x00" + _varint(0) + _varint(offset_delta) + _varint(4) + _COMMIT_KEY + _varint(6) + _COMMIT_VALUE + _varint(0)
    return _varint(len(body)) + body


def _varint(value: int) -> bytes:
    rest = (value << 1) ^ (value >> 63)
    out = bytearray()
    while rest >= 0x80:
        out.append((rest & 0x7F) | 0x80)
        rest >>= 7
    out.append(rest)
    return bytes(out)


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


@numba.njit(cache=True, nogil=True, inline="always")
def _put_bytes(out, at, offsets, data, row):
    first, end = offsets[row], offsets[row + 1]
    at = _put_varint(out, at, end - first)
    copy_bytes(out, at, data, first, end - first)
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
