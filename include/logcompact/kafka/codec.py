"""Kafka's wire format, through kio (typed messages generated from Kafka's JSON schemas): the only module of
the package that imports kio, so a change of codec library stays here.

A request frame is a request header (v1, or v2 when the API version is flexible) and a body; a response frame
is a response header (chosen by kio per API and version: ApiVersions always takes v0) and a body. Handlers
build responses with `build`, from plain values and dicts, so one handler serves every version: fields a
version lacks are dropped, fields it has but were not given take the schema's default.

kio is pinned below 0.6: 0.6's native (Rust) decoder allocates an array's declared length up front, so a
25-byte flexible request declaring 2^32 topics aborts the whole process ("memory allocation of 34359738352
bytes failed"), which no except clause can catch; 0.5 decodes in Python, item by item, and fails such a frame
with BufferUnderflow. 0.5 also has Kafka 3's schemas, with the old versions Kafka 4.0 removed (ListOffsets v0,
OffsetCommit v0-1, ...) that older clients still send. One gap: a tagged field 0.5 does not know is a KeyError
rather than skipped, so such a request is refused as malformed.
"""

from __future__ import annotations

import dataclasses
import datetime
import struct
import typing
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from typing import Any

from kio.index import UnknownAPIKey, UnknownEntity, load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.index import api_key_map, schema_name_map
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer
from kio.serial.errors import SerialError
from kio.static.constants import EntityType

from logcompact.kafka.session import LOCAL, Session

__all__ = [
    "ErrorCode",
    "MalformedRequestError",
    "Request",
    "build",
    "decode_request",
    "FrameParts",
    "encode_response",
    "encode_response_parts",
    "frame_size",
    "kio_versions",
    "response_class",
]

# Fields a frame body may carry whose kio type is not an int, str, bool, bytes or entity: given as ints (ms).
_TIMEDELTA_KAFKA_TYPES = {"timedelta_i32", "timedelta_i64"}


class MalformedRequestError(Exception):
    """A frame that is not a request of the API and version its header names."""


@dataclass(frozen=True)
class Request:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    body: Any  # the kio request entity, None when the API or version is not one kio knows
    session: Session = LOCAL  # the connection's: its listener, client address and principal
    size: int = 0  # the frame's bytes (header and body): what a producer's byte-rate quota counts (Kafka's sizeInBytes)


def kio_versions(api_key: int) -> range:
    """The versions kio has schemas for, as one range (Kafka's are contiguous); empty for an unknown API key."""
    name = api_key_map.get(api_key)
    if name is None:
        return range(0)
    versions = sorted(schema_name_map[name])
    return range(versions[0], versions[-1] + 1)


def api_name(api_key: int) -> str:
    return api_key_map.get(api_key, f"api key {api_key}")


@cache
def _request_class(api_key: int, version: int) -> Any:
    try:
        return load_request_schema(api_key, version)
    except (UnknownAPIKey, UnknownEntity):
        return None


@cache
def response_class(api_key: int, version: int) -> Any:
    return load_response_schema(api_key, version)


def decode_request(frame: bytes | memoryview, served: typing.Callable[[int, int], bool], session: Session = LOCAL) -> Request:
    """The header and, when `served(api_key, version)`, the body of one frame (its size prefix removed).

    A request that is not served keeps body None: its header alone is enough to answer UNSUPPORTED_VERSION.
    Raises MalformedRequestError when the bytes do not parse. Bytes left after the body are ignored, as Kafka's
    brokers do: librdkafka 2.16 sends Metadata v10+ asking for all topics with three bytes over.
    """
    if frame[:2] == _PRODUCE_KEY and len(frame) >= 4:
        version = int.from_bytes(frame[2:4], "big", signed=True)
        if served(PRODUCE, version):
            return _decode_produce(frame, version, session)
    try:
        # Header v1 is a prefix of v2 (v2 only adds tagged fields), so v1 tells which API and version this is.
        header, size = entity_reader(RequestHeaderV1)(frame, 0)
        api_key, version = int(header.request_api_key), int(header.request_api_version)
        schema = _request_class(api_key, version) if served(api_key, version) else None
        if schema is None:
            return Request(api_key, version, int(header.correlation_id), header.client_id, None, session, len(frame))
        if schema.__flexible__:
            size = entity_reader(RequestHeaderV2)(frame, 0)[1]
        body = entity_reader(schema)(frame, size)[0]
    except (SerialError, ValueError, KeyError, UnicodeError, OverflowError) as exc:  # KeyError: a tagged field kio does not know
        raise MalformedRequestError(f"{type(exc).__name__}: {exc}") from None
    return Request(api_key, version, int(header.correlation_id), header.client_id, body, session, len(frame))


# -- Produce, decoded by hand ------------------------------------------------------------------------------
# Every batch a producer sends is a Produce request, librdkafka's of one partition each: kio's generic reader
# took 40 us of the event loop per request, a third of the agent's time under 50 producers. This reads the same
# kio entities (checked against kio's reader on random requests in the tests) in a tenth of that, and hands each
# partition's records on as a view of the frame rather than a copy.
PRODUCE = 0
_PRODUCE_KEY = PRODUCE.to_bytes(2, "big")
_HEADER_FIXED = struct.Struct(">hhih")  # api key, version, correlation id, client id's length
_INT16, _INT32 = struct.Struct(">h"), struct.Struct(">i")
_ACKS_AND_TIMEOUT = struct.Struct(">hi")


@cache
def _produce_classes(version: int) -> tuple[Any, Any, Any]:
    body = _request_class(PRODUCE, version)
    topic = _entity_in(typing.get_type_hints(body)["topic_data"])
    return body, topic, _entity_in(typing.get_type_hints(topic)["partition_data"])


def _decode_produce(frame: bytes | memoryview, version: int, session: Session) -> Request:
    body_class, topic_class, partition_class = _produce_classes(version)
    flexible = body_class.__flexible__
    view = memoryview(frame)
    try:
        _, _, correlation_id, length = _HEADER_FIXED.unpack_from(view, 0)
        client_id, at = _string(view, 10, length)
        if flexible:
            at = _skip_tags(view, at)
            transactional_id, at = _compact_string(view, at)
        else:
            transactional_id, at = _string(view, at + 2, _INT16.unpack_from(view, at)[0])
        acks, timeout_ms = _ACKS_AND_TIMEOUT.unpack_from(view, at)
        at += _ACKS_AND_TIMEOUT.size
        topics = []
        topic_count, at = _array_length(view, at, flexible)
        for _ in range(topic_count):
            if flexible:
                name, at = _compact_string(view, at)
            else:
                name, at = _string(view, at + 2, _INT16.unpack_from(view, at)[0])
            partitions = []
            partition_count, at = _array_length(view, at, flexible)
            for _ in range(partition_count):
                index = _INT32.unpack_from(view, at)[0]
                if flexible:
                    size, at = _uvarint(view, at + 4)
                    size -= 1
                else:
                    size, at = _INT32.unpack_from(view, at + 4)[0], at + 8
                records = None
                if size >= 0:
                    if at + size > len(view):
                        raise MalformedRequestError(f"Produce v{version}: records of {size} bytes run past the frame's end")
                    records, at = view[at : at + size], at + size
                elif size != -1:
                    raise MalformedRequestError(f"Produce v{version}: records of length {size}")
                if flexible:
                    at = _skip_tags(view, at)
                partitions.append(partition_class(index=index, records=records))
            if flexible:
                at = _skip_tags(view, at)
            if name is None:
                raise MalformedRequestError(f"Produce v{version}: a topic without a name")
            topics.append(topic_class(name=name, partition_data=tuple(partitions)))
        if flexible:
            _skip_tags(view, at)
    except (struct.error, UnicodeError) as exc:
        raise MalformedRequestError(f"Produce v{version}: {type(exc).__name__}: {exc}") from None
    body = body_class(transactional_id=transactional_id, acks=acks, timeout=datetime.timedelta(milliseconds=timeout_ms), topic_data=tuple(topics))
    return Request(PRODUCE, version, correlation_id, client_id, body, session, len(frame))


def _string(view: memoryview, at: int, length: int) -> tuple[str | None, int]:
    if length < 0:
        if length != -1:
            raise MalformedRequestError(f"a string of length {length}")
        return None, at
    if at + length > len(view):
        raise MalformedRequestError(f"a string of {length} bytes runs past the frame's end")
    return str(view[at : at + length], "utf-8"), at + length


def _compact_string(view: memoryview, at: int) -> tuple[str | None, int]:
    length, at = _uvarint(view, at)
    return _string(view, at, length - 1)


def _array_length(view: memoryview, at: int, flexible: bool) -> tuple[int, int]:
    """An array's length, at most the bytes left (each item takes at least one): a frame declaring billions of
    items fails here, before anything is allocated for them."""
    if flexible:
        count, at = _uvarint(view, at)
        count -= 1
    else:
        count, at = _INT32.unpack_from(view, at)[0], at + 4
    if count < 0 or count > len(view) - at:
        raise MalformedRequestError(f"an array of {count} items in {len(view) - at} bytes")
    return count, at


def _uvarint(view: memoryview, at: int) -> tuple[int, int]:
    if at < len(view) and view[at] < 0x80:  # lengths and counts of Produce's fields: almost always one byte
        return view[at], at + 1
    value = shift = 0
    while True:
        if at >= len(view):
            raise MalformedRequestError("a varint runs past the frame's end")
        byte = view[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, at
        shift += 7
        if shift > 28:
            raise MalformedRequestError("a varint longer than 5 bytes")


def _skip_tags(view: memoryview, at: int) -> int:
    """Past a tagged-field section; Produce has no tagged fields, and Kafka skips those it does not know."""
    count, at = _uvarint(view, at)
    for _ in range(count):
        _, at = _uvarint(view, at)
        size, at = _uvarint(view, at)
        if at + size > len(view):
            raise MalformedRequestError("a tagged field runs past the frame's end")
        at += size
    return at


def encode_response(correlation_id: int, response: Any) -> bytes:
    """One response frame, its 4-byte size prefix included, as one bytes object (`encode_response_parts` joined)."""
    parts = encode_response_parts(correlation_id, response)
    return bytes(parts[0]) if len(parts) == 1 else b"".join(parts)


# A bytes-like value kio writes that is at least this long (a partition's record batches) is kept as a part of the
# frame of its own rather than copied into it: below it, a copy costs less than one more piece to write.
OWN_PART_BYTES = 32 * 1024

FrameParts = list[bytes | bytearray | memoryview]  # a frame's bytes in order, to be written one after the other


class _Parts:
    """The writable kio encodes into: its fields go into a growing bytearray, each long value (`OWN_PART_BYTES`)
    becomes a part of its own, a view of the caller's buffer, never copied."""

    def __init__(self) -> None:
        self.parts: FrameParts = []
        self.fields = bytearray(b"\0\0\0\0")  # the size prefix, set once the frame is whole

    def write(self, data: bytes | bytearray | memoryview) -> int:
        if len(data) < OWN_PART_BYTES:
            self.fields += data
            return len(data)
        view = memoryview(data).cast("B")
        self.parts.append(self.fields)
        self.parts.append(view)
        self.fields = bytearray()
        return view.nbytes

    def frame(self) -> FrameParts:
        parts = [*self.parts, self.fields] if self.fields else self.parts
        size = frame_size(parts) - 4
        parts[0][:4] = size.to_bytes(4, "big", signed=True)  # type: ignore[index]  # the first part is a bytearray of fields
        return parts


def encode_response_parts(correlation_id: int, response: Any) -> FrameParts:
    """One response frame, its 4-byte size prefix included, as parts to be written in order: kio encodes the header and
    the fields, while a Fetch's record batches stay the buffers they were encoded in (kio's own writer would copy
    every batch into its buffer, tens of MiB a response, and the frame once more as it grows)."""
    header_class = type(response).__header_schema__
    buffer = _Parts()
    # kio's writers call only write(): its type names the streams it is usually given
    entity_writer(header_class)(buffer, header_class(correlation_id=correlation_id))  # type: ignore[arg-type]
    entity_writer(type(response))(buffer, response)  # type: ignore[arg-type]
    return buffer.frame()


def frame_size(parts: FrameParts) -> int:
    return sum(memoryview(part).nbytes for part in parts)


def build(entity_class: Any, values: Mapping[str, Any]) -> Any:
    """An instance of a kio entity from plain values: nested entities as dicts, sequences of them as lists of
    dicts, error codes as ints, durations and timestamps as ints (ms). Keys the version does not have are dropped."""
    return entity_class(**{name: convert(values[name]) for name, convert in _converters(entity_class) if name in values})


@cache
def _converters(entity_class: Any) -> tuple[tuple[str, typing.Callable[[Any], Any]], ...]:
    """Each field's name and how a plain value becomes it, worked out once per class: a response of a thousand
    partitions builds a thousand nested entities per request."""
    hints = typing.get_type_hints(entity_class)
    return tuple((field.name, _converter(hints[field.name], field)) for field in dataclasses.fields(entity_class))


def _converter(hint: Any, field: dataclasses.Field) -> typing.Callable[[Any], Any]:
    kafka_type = field.metadata.get("kafka_type")
    if kafka_type in _TIMEDELTA_KAFKA_TYPES:
        return lambda value: None if value is None else datetime.timedelta(milliseconds=value)
    if kafka_type == "datetime_i64":  # kio writes it back as the same ms, -1 included
        return lambda value: None if value is None else datetime.datetime.fromtimestamp(value / 1000, datetime.UTC)
    if kafka_type == "error_code":
        return lambda value: None if value is None else ErrorCode(value)
    if kafka_type == "uuid":
        return lambda value: value if value is None or isinstance(value, uuid.UUID) else uuid.UUID(value)
    entity = _entity_in(hint)
    if entity is None:
        return lambda value: tuple(value) if isinstance(value, list) else value

    def nested(value: Any) -> Any:
        if value is None:
            return None
        if isinstance(value, Mapping):
            return build(entity, value)
        return tuple(build(entity, item) for item in value)

    return nested


def _entity_in(hint: Any) -> Any:
    """The kio entity class a field holds (alone, in a tuple or optional), or None for a primitive."""
    if dataclasses.is_dataclass(hint) and getattr(hint, "__type__", None) == EntityType.nested:
        return hint
    for argument in typing.get_args(hint):
        if argument is not Ellipsis and (found := _entity_in(argument)) is not None:
            return found
    return None
