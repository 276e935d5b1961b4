"""The Kafka protocol on raw sockets, for what real clients do not send: size-prefixed frames, requests of any
version encoded by kio and their responses decoded by kio, and record batches v2 built as kafka-python's
producer builds them."""

from __future__ import annotations

import io
import socket
import struct
from typing import Any

from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from logcompact.kafka.codec import build
from logcompact.kafka.server import AgentServer
from tests.kafka.agents import RunningAgent

TIMESTAMP = 1_700_000_000_000
CODECS = {"none": 0, "gzip": 1, "snappy": 2, "lz4": 3, "zstd": 4}
ATTRIBUTES_AT = struct.calcsize(">qiibI")  # a record batch's attributes: the codec in their low 3 bits
PADDING = b"." * 200


# -- frames ---------------------------------------------------------------------------------------------


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    """A non-flexible request (header v1, null client id)."""
    message = struct.pack(">hhih", api_key, version, correlation_id, -1) + body
    return struct.pack(">i", len(message)) + message


def receive_frame(connection: socket.socket) -> bytes:
    size = struct.unpack(">i", receive_exactly(connection, 4))[0]
    return receive_exactly(connection, size)


def receive_exactly(connection: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = connection.recv(size - len(data))
        assert chunk, f"connection closed after {len(data)} of {size} bytes"
        data += chunk
    return data


def connect(agent: AgentServer) -> socket.socket:
    return socket.create_connection((agent.address.host, agent.address.port), timeout=5)


def closed_by_peer(connection: socket.socket) -> bool:
    try:
        return connection.recv(1) == b""
    except ConnectionResetError:
        return True


# -- requests of any version, encoded and decoded by kio --------------------------------------------------


def kio_frame(api_key: int, version: int, body: dict, correlation_id: int) -> bytes:
    """A size-prefixed request of any version, encoded by kio."""
    request_class = load_request_schema(api_key, version)
    header_class = RequestHeaderV2 if request_class.__flexible__ else RequestHeaderV1
    message = io.BytesIO()
    entity_writer(header_class)(message, header_class(request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id="test"))
    entity_writer(request_class)(message, build(request_class, body))
    return struct.pack(">i", len(message.getvalue())) + message.getvalue()


def kio_exchange(agent: AgentServer, api_key: int, version: int, body: dict) -> Any:
    """One request of any version encoded by kio, and its response decoded by kio: checks, for the versions real
    clients do not send here, the agent's framing, header versions and the fields each version has."""
    with connect(agent) as connection:
        connection.sendall(kio_frame(api_key, version, body, correlation_id=version))
        frame = receive_frame(connection)
    response_class = load_response_schema(api_key, version)
    header, size = entity_reader(response_class.__header_schema__)(frame, 0)
    assert header.correlation_id == version
    response, body_size = entity_reader(response_class)(frame, size)
    assert size + body_size == len(frame)
    return response


class Wire:
    """One connection sending kio-encoded requests, pipelined if need be, and reading their answers in order."""

    def __init__(self, agent: RunningAgent, client_id: str = "raw") -> None:
        address = agent.server.address
        self.socket = socket.create_connection((address.host, address.port), timeout=10)
        self.sent: list[tuple[int, int, int]] = []
        self.client_id = client_id

    @classmethod
    def over(cls, connection: socket.socket, client_id: str = "raw") -> Wire:
        """Over a connection of the caller's (to an agent process)."""
        wire = cls.__new__(cls)
        wire.socket, wire.sent, wire.client_id = connection, [], client_id
        return wire

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> None:
        request_class = load_request_schema(api_key, version)
        header_class = RequestHeaderV2 if request_class.__flexible__ else RequestHeaderV1
        correlation_id = len(self.sent) + 1
        message = io.BytesIO()
        entity_writer(header_class)(message, header_class(request_api_key=api_key, request_api_version=version, correlation_id=correlation_id, client_id=self.client_id))
        entity_writer(request_class)(message, build(request_class, body))
        self.socket.sendall(struct.pack(">i", len(message.getvalue())) + message.getvalue())
        self.sent.append((api_key, version, correlation_id))

    def receive(self) -> Any:
        api_key, version, correlation_id = self.sent.pop(0)
        frame = receive_frame(self.socket)
        response_class = load_response_schema(api_key, version)
        header, size = entity_reader(response_class.__header_schema__)(frame, 0)
        assert header.correlation_id == correlation_id
        return entity_reader(response_class)(frame, size)[0]

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        assert not self.sent
        self.send(api_key, version, body)
        return self.receive()

    def close(self) -> None:
        self.socket.close()


# -- record batches and Produce requests, built as clients build them ---------------------------------------


def record_batch(records: list[tuple[bytes | None, bytes | None, list[tuple[str, bytes | None]]]], codec: str = "none", producer_id: int = -1) -> bytes:
    """One record batch v2 as kafka-python's producer builds it: timestamps TIMESTAMP + index."""
    idempotent = producer_id >= 0
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=CODECS[codec], is_transactional=False, producer_id=producer_id,
                                        producer_epoch=0 if idempotent else -1, base_sequence=0 if idempotent else -1, batch_size=1 << 24)
    for index, (key, value, headers) in enumerate(records):
        builder.append(index, timestamp=TIMESTAMP + index, key=key, value=value, headers=headers)
    batch = bytes(builder.build())
    # kafka-python sends a batch uncompressed when compressing does not make it smaller
    assert struct.unpack_from(">h", batch, ATTRIBUTES_AT)[0] & 7 == CODECS[codec], f"{codec} did not shrink the batch: give it more records"
    return batch


def keyed_batch(count: int, codec: str = "none", prefix: str = "v") -> bytes:
    return record_batch([(f"k{i}".encode(), value(prefix, i), [("n", str(i).encode())]) for i in range(count)], codec)


def value(prefix: str, index: int) -> bytes:
    """Compressible: every codec shrinks a batch of these."""
    return f"{prefix}{index}".encode() + PADDING


def produce_request(version: int, correlation_id: int, partitions: dict[tuple[str, int], bytes | None], acks: int = -1,
                    transactional_id: str | None = None) -> bytes:
    topics: dict[str, list[dict]] = {}
    for (topic, index), records in partitions.items():
        topics.setdefault(topic, []).append({"index": index, "records": records})
    body = {"transactional_id": transactional_id, "acks": acks, "timeout": 5000, "topic_data": [{"name": name, "partition_data": data} for name, data in topics.items()]}
    return kio_frame(0, version, body, correlation_id)


def produce_response(frame: bytes, version: int) -> tuple[int, dict[tuple[str, int], Any]]:
    response_class = load_response_schema(0, version)
    header, size = entity_reader(response_class.__header_schema__)(frame, 0)
    response, body_size = entity_reader(response_class)(frame, size)
    assert size + body_size == len(frame)
    partitions = {(topic.name, int(p.index)): p for topic in response.responses for p in topic.partition_responses}
    return int(header.correlation_id), partitions


def produce(agent: RunningAgent, partitions: dict[tuple[str, int], bytes | None], version: int = 9, acks: int = -1,
            transactional_id: str | None = None) -> dict[tuple[str, int], Any]:
    """One Produce request of `version` with a batch (or None) per (topic, partition): its answers by partition."""
    with connect(agent.server) as connection:
        connection.sendall(produce_request(version, 5, partitions, acks, transactional_id))
        correlation_id, answered = produce_response(receive_frame(connection), version)
    assert correlation_id == 5
    return answered
