"""The Produce decoder (`records.read_batch` then `Batch.columns`) against kafka-python's record module: equal columns
for random batches of every codec, and every malformed record refused as CorruptBatchError (Kafka's
CORRUPT_MESSAGE), whether built on purpose or by mutating valid batches.

Where Kafka's broker (Java's DefaultRecord.readFrom) is stricter than kafka-python, the decoder follows the broker:
a length below -1 and a varint longer than 5 bytes are refused, which kafka-python reads as null and as a number.
A record's attributes are one byte to the broker and a varint to kafka-python: where that byte's high bit is set,
the decoder reads the record as the broker does.
"""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st
from kafka.errors import CorruptRecordError
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder
from kafka.record.util import decode_varint, encode_varint

from logcompact.kafka import records

HEADER = DefaultRecordBatch.HEADER_STRUCT
ATTRIBUTES_AT = DefaultRecordBatch.ATTRIBUTES_OFFSET
CRC_AT = DefaultRecordBatch.CRC_OFFSET
LOG_APPEND_TIME = 0x08
LIMIT = 1 << 24

keys = st.none() | st.binary(max_size=20)
values = st.none() | st.binary(max_size=300)
headers = st.lists(st.tuples(st.text(max_size=5), st.none() | st.binary(max_size=10)), max_size=3)
timestamps = st.integers(0, 2**41) | st.just(-1)
batches = st.lists(st.tuples(keys, values, headers, timestamps), min_size=1, max_size=40)


def built(rows: list[tuple], codec: int, log_append_time: bool = False) -> bytes:
    """A batch as kafka-python's producer builds it (LogAppendTime set on it afterwards, CRC made again)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False, producer_id=-1, producer_epoch=-1,
                                        base_sequence=-1, batch_size=1 << 24)
    for offset, (key, value, record_headers, timestamp) in enumerate(rows):
        builder.append(offset, timestamp=timestamp, key=key, value=value, headers=record_headers)
    data = bytearray(builder.build())
    if log_append_time:
        struct.pack_into(">h", data, ATTRIBUTES_AT, struct.unpack_from(">h", data, ATTRIBUTES_AT)[0] | LOG_APPEND_TIME)
        struct.pack_into(">I", data, CRC_AT, crc32c(data[ATTRIBUTES_AT:]))
    return bytes(data)


def decoded(data: bytes) -> list[tuple]:
    """What the agent decodes, as (timestamp, key, value, headers), -1 for a missing timestamp as kafka-python gives it."""
    columns = records.read_batch(data).columns(LIMIT)
    return [
        (-1 if row["timestamp"] is None else row["timestamp"], row["key"], row["value"], [(h["key"], h["value"]) for h in row["headers"] or []])
        for row in columns.to_pylist()
    ]


def reference(data: bytes) -> list[tuple]:
    return [(record.timestamp, record.key, record.value, record.headers) for record in DefaultRecordBatch(data)]


@settings(max_examples=150)
@given(rows=batches, codec=st.sampled_from([0, 1, 2, 3, 4]), log_append_time=st.booleans())
def test_random_batches_decode_as_kafka_python_decodes_them(rows: list[tuple], codec: int, log_append_time: bool) -> None:
    data = built(rows, codec, log_append_time)
    assert decoded(data) == reference(data)


# -- malformed records, uncompressed (the CRC made right, so only the records are wrong) ------------------------


def varint(value: int) -> bytes:
    out = bytearray()
    encode_varint(value, out.append)
    return bytes(out)


def field(data: bytes | None) -> bytes:
    return varint(-1) if data is None else varint(len(data)) + data


def record(*fields: bytes) -> bytes:
    body = b"".join(fields)
    return varint(len(body)) + body


START = b"\x00" + varint(0) + varint(0)  # attributes, timestamp delta, offset delta
GOOD = record(START, field(b"k"), field(b"v"), varint(1), field(b"h"), field(b"x"))


def batch_of(body: bytes, count: int, first_timestamp: int = 1_000) -> bytes:
    """A batch (codec none, CRC right) of records bytes `body` whose header counts `count` records."""
    header = HEADER.pack(0, HEADER.size - 12 + len(body), -1, 2, 0, 0, max(count - 1, 0), first_timestamp, first_timestamp, -1, -1, -1, count)
    data = bytearray(header + body)
    struct.pack_into(">I", data, CRC_AT, crc32c(data[ATTRIBUTES_AT:]))
    return bytes(data)


def attributes_read_as_varint(body: bytes) -> bool:
    """Whether a record of `body` (a batch's records bytes) has its attributes byte's high bit set: kafka-python reads
    that byte as a varint, so it reads the rest of that record apart from the broker, which reads one byte."""
    position = 0
    while position < len(body):
        try:
            length, position = decode_varint(body, position)
        except IndexError:
            return False
        if length < 1 or position >= len(body):
            return False
        if body[position] & 0x80:
            return True
        position += length
    return False


def kafka_python_refuses(data: bytes) -> bool:
    try:
        reference(data)
    except (CorruptRecordError, UnicodeDecodeError):
        return True
    return False


REFUSED_BY_BOTH = {
    "a truncated varint": (record(START, field(b"k"), field(b"v"), b"\x80"), 1),
    "a negative record length": (varint(-5) + GOOD[1:], 1),
    "a record past the end": (varint(100) + GOOD[1:], 1),
    "a key past its record": (record(START, varint(40), b"k", field(b"v"), varint(0)) + GOOD, 2),
    "a negative header count": (record(START, field(b"k"), field(b"v"), varint(-1)), 1),
    "a null header key": (record(START, field(b"k"), field(b"v"), varint(1), field(None), field(b"x")), 1),
    "a header key not UTF-8": (record(START, field(b"k"), field(b"v"), varint(1), field(b"\xff"), field(b"x")), 1),
    "fields short of the record's length": (record(START, field(b"k"), field(b"v"), varint(0), b"\x00"), 1),
    "a record more than counted": (GOOD + GOOD, 1),
    "a record fewer than counted": (GOOD, 2),
    "a count far past the bytes": (GOOD, 2**31 - 1),
    "bytes and no records counted": (GOOD, 0),
}


@pytest.mark.parametrize("case", list(REFUSED_BY_BOTH))
def test_malformed_records_are_refused_as_corrupt(case: str) -> None:
    body, count = REFUSED_BY_BOTH[case]
    data = batch_of(body, count)
    assert kafka_python_refuses(data)
    with pytest.raises(records.CorruptBatchError):
        records.read_batch(data).columns(LIMIT)


@pytest.mark.parametrize("body", [
    record(START, varint(-2), field(b"v"), varint(0)),  # key length -2: kafka-python reads a null key
    record(START, field(b"k"), field(b"v"), varint(1), field(b"h"), varint(-7)),  # header value length -7
    record(START, b"\x82\x80\x80\x80\x80\x00k", field(b"v"), varint(0)),  # key length 1 in 6 bytes: kafka-python reads 1
], ids=["key length -2", "header value length -7", "6-byte varint"])
def test_what_kafkas_broker_refuses_and_kafka_python_reads_is_refused(body: bytes) -> None:
    data = batch_of(body, 1)
    assert not kafka_python_refuses(data)
    with pytest.raises(records.CorruptBatchError):
        records.read_batch(data).columns(LIMIT)


def test_a_timestamp_past_int64_is_refused_for_its_timestamp() -> None:
    data = batch_of(record(b"\x00", varint(100), varint(0), field(b"k"), field(b"v"), varint(0)), 1, first_timestamp=2**63 - 10)
    with pytest.raises(records.TimestampOutOfRangeError):
        records.read_batch(data).columns(LIMIT)


@settings(max_examples=200)
@given(rows=batches, data=st.data())
def test_mutated_records_are_refused_or_read_as_kafka_python_reads_them(rows: list[tuple], data: st.DataObject) -> None:
    """Truncated, extended, recounted or byte-flipped records: refused as corrupt (never another error), or, when
    both decoders take them, read alike. Truncation and a count off by one are always refused."""
    valid = built(rows, 0)
    body, count = bytearray(valid[HEADER.size :]), len(rows)
    mutation = data.draw(st.sampled_from(["truncate", "extend", "recount", "flip"]))
    if mutation == "truncate":
        del body[data.draw(st.integers(0, len(body) - 1)) :]
    elif mutation == "extend":
        body += data.draw(st.binary(min_size=1, max_size=20))
    elif mutation == "recount":
        count += data.draw(st.sampled_from([-1, 1]))
    else:
        for _ in range(data.draw(st.integers(1, 3))):
            body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    mutated = batch_of(bytes(body), count, struct.unpack_from(">q", valid, struct.calcsize(">qiibIhi"))[0])
    try:
        mine = decoded(mutated)
    except (records.CorruptBatchError, records.TimestampOutOfRangeError):
        mine = None
    if mutation != "flip" and (mutation != "extend" or count):
        assert mine is None
    if mine is not None and not kafka_python_refuses(mutated) and not attributes_read_as_varint(bytes(body)):
        assert mine == reference(mutated)


def test_a_records_attributes_are_one_byte_as_the_broker_reads_them() -> None:
    """Attributes 0x80 (no attribute a record defines is set): the broker reads one byte, then the timestamp delta 0
    and the key; kafka-python reads a 2-byte varint there and takes the key's length for the offset delta."""
    body = record(b"\x80" + varint(0) + varint(0), field(b"k"), field(b"v"), varint(0))
    data = batch_of(body, 1)
    assert attributes_read_as_varint(body)
    assert decoded(data) == [(1_000, b"k", b"v", [])]
    assert reference(data) != decoded(data)
