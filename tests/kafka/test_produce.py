"""Produce through `logcompact agent`: real clients and raw requests, read back with the library.

kafka-python 3 and librdkafka (confluent-kafka, kcat) produce record batches v2 with every codec; librdkafka
sends them only to a broker advertising Produce v3+ and Fetch v4+ (its MsgVer2 feature). Raw requests are encoded
by kio and carry batches built by kafka-python's record builder, so every served version and each error is
exercised exactly.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from confluent_kafka import KafkaError, Producer
from crc32c import crc32c
from kafka import KafkaProducer
from kafka.errors import InvalidRecordError as KafkaInvalidRecordError
from kafka.errors import KafkaError as KafkaPythonError
from kafka.record.legacy_records import LegacyRecordBatchBuilder

from logcompact.catalog import Catalog
from logcompact.consume import ConsumedRecord
from logcompact.kafka.handlers import produce as produce_module
from tests.helpers import create_topic
from tests.kafka.agents import FLUSH_MS, MAX_MESSAGE_BYTES, RunningAgent, agent_environment, stored
from tests.kafka.wire import (
    ATTRIBUTES_AT,
    CODECS,
    PADDING,
    TIMESTAMP,
    closed_by_peer,
    connect,
    keyed_batch,
    produce,
    produce_request,
    produce_response,
    receive_frame,
    record_batch,
    request_frame,
    value,
)

pytestmark = pytest.mark.timeout(60)

CRC_AT = struct.calcsize(">qiib")  # its CRC-32C, of every byte from the attributes on
HEADER_BYTES = 61
# Kafka's error codes
NONE, CORRUPT_MESSAGE, UNKNOWN_TOPIC_OR_PARTITION, MESSAGE_TOO_LARGE = 0, 2, 3, 10
INVALID_REQUIRED_ACKS, UNKNOWN_PRODUCER_ID, UNSUPPORTED_COMPRESSION_TYPE, INVALID_RECORD = 21, 59, 76, 87


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy="compact")
    create_topic(catalog, "clicks", 1)
    return catalog


# -- real clients ------------------------------------------------------------------------------------


@pytest.mark.parametrize("acks", ["1", "all"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_kafka_python_produces_with_every_codec_and_reads_back_exactly(agent: RunningAgent, catalog: Catalog, codec: str, acks: str) -> None:
    # kafka-python 3 enables idempotence by default, which needs InitProducerId, not served yet.
    producer = KafkaProducer(bootstrap_servers=agent.bootstrap, compression_type=None if codec == "none" else codec, acks=acks if acks == "all" else 1,
                             enable_idempotence=False, linger_ms=5)
    try:
        sent = [
            producer.send("orders", key=b"k%d" % i, value=None if i == 3 else value("value-", i), partition=1,
                          headers=[("trace", b"t%d" % i), ("empty", b"")], timestamp_ms=TIMESTAMP + 1000 * i)
            for i in range(5)
        ]
        offsets = [future.get(timeout=10).offset for future in sent]
    finally:
        producer.close(timeout=5)
    assert offsets == [0, 1, 2, 3, 4]
    # acknowledged means committed: a fresh snapshot has every record
    assert stored(catalog, "orders", 1) == [
        ConsumedRecord(i, TIMESTAMP + 1000 * i, b"k%d" % i, None if i == 3 else value("value-", i), [("trace", b"t%d" % i), ("empty", b"")]) for i in range(5)
    ]
    assert stored(catalog, "orders", 0) == []


def test_kafka_python_keyless_record_on_a_compacted_topic_is_refused(agent: RunningAgent, catalog: Catalog) -> None:
    producer = KafkaProducer(bootstrap_servers=agent.bootstrap, enable_idempotence=False, linger_ms=50, retries=0)
    try:
        keyed = producer.send("orders", key=b"a", value=b"1", partition=0)
        keyless = producer.send("orders", key=None, value=b"2", partition=0)
        with pytest.raises(KafkaInvalidRecordError):
            keyless.get(timeout=10)
        # the same batch, refused whole: kafka-python names the keyed record's failure as Java's client does
        with pytest.raises(KafkaPythonError, match="part of a batch which had one more more invalid records"):
            keyed.get(timeout=10)
    finally:
        producer.close(timeout=5)
    assert stored(catalog, "orders", 0) == []


@pytest.mark.parametrize("acks", ["1", "all"])
@pytest.mark.parametrize("codec", list(CODECS))
def test_confluent_kafka_produces_with_every_codec_and_reads_back_exactly(agent: RunningAgent, catalog: Catalog, codec: str, acks: str) -> None:
    """librdkafka sends record batches v2 once Produce v3+ and Fetch v4+ are advertised (its MsgVer2 feature)."""
    reports: list[tuple[KafkaError | None, int]] = []
    producer = Producer({"bootstrap.servers": agent.bootstrap, "enable.idempotence": False, "compression.type": codec, "acks": acks,
                         "message.timeout.ms": 10000, "linger.ms": 5})
    for i in range(5):
        producer.produce("orders", key=b"k%d" % i, value=None if i == 3 else value("value-", i), partition=1,
                         headers=[("trace", b"t%d" % i), ("empty", b"")], timestamp=TIMESTAMP + 1000 * i,
                         on_delivery=lambda error, message: reports.append((error, message.offset())))
    assert producer.flush(10) == 0
    assert reports == [(None, i) for i in range(5)]
    assert stored(catalog, "orders", 1) == [
        ConsumedRecord(i, TIMESTAMP + 1000 * i, b"k%d" % i, None if i == 3 else value("value-", i), [("trace", b"t%d" % i), ("empty", b"")]) for i in range(5)
    ]


def test_kcat_produces_keyed_lines(agent: RunningAgent, catalog: Catalog) -> None:
    """Debian's kcat (librdkafka 2.0.2) produces record batches v2 too."""
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    command = ["kcat", "-b", agent.bootstrap, "-P", "-t", "orders", "-p", "0", "-K:", "-X", "message.timeout.ms=10000"]
    result = subprocess.run(command, input="a:1\nb:2\n", capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert [(record.offset, record.key, record.value) for record in stored(catalog, "orders", 0)] == [(0, b"a", b"1"), (1, b"b", b"2")]


# -- every version and each error, on raw requests ------------------------------------------------------


@pytest.mark.parametrize("version", range(3, 10))
def test_every_produce_version_stores_the_batch_and_answers_its_first_offset(agent: RunningAgent, catalog: Catalog, version: int) -> None:
    codec = "zstd" if version >= 7 else "lz4"
    first = produce(agent, {("clicks", 0): keyed_batch(3, codec)}, version)[("clicks", 0)]
    second = produce(agent, {("clicks", 0): keyed_batch(2, codec, prefix="w")}, version)[("clicks", 0)]
    assert (int(first.error_code), first.base_offset, second.base_offset) == (NONE, 0, 3)
    if version >= 2:
        assert first.log_append_time is None  # -1 on the wire: CreateTime
    if version >= 5:
        assert first.log_start_offset == -1
    assert [(r.offset, r.timestamp, r.key, r.value, r.headers) for r in stored(catalog, "clicks", 0)] == [
        (0, TIMESTAMP, b"k0", value("v", 0), [("n", b"0")]), (1, TIMESTAMP + 1, b"k1", value("v", 1), [("n", b"1")]),
        (2, TIMESTAMP + 2, b"k2", value("v", 2), [("n", b"2")]), (3, TIMESTAMP, b"k0", value("w", 0), [("n", b"0")]),
        (4, TIMESTAMP + 1, b"k1", value("w", 1), [("n", b"1")]),
    ]


def test_null_values_and_null_header_values_are_kept(agent: RunningAgent, catalog: Catalog) -> None:
    records = [(None, None, [("h", None)]), (b"k", None, []), (None, PADDING, [("a", b"1"), ("a", b"2")])]
    assert int(produce(agent, {("clicks", 0): record_batch(records, "gzip")})[("clicks", 0)].error_code) == NONE
    assert [(r.key, r.value, r.headers) for r in stored(catalog, "clicks", 0)] == records


def test_a_keyless_record_on_a_compacted_topic_refuses_its_batch_with_the_record_indexes(agent: RunningAgent, catalog: Catalog) -> None:
    keyless = record_batch([(b"a", b"1", []), (None, b"2", []), (b"c", b"3", []), (None, b"4", [])])
    answered = produce(agent, {("orders", 0): keyless, ("orders", 1): keyed_batch(2)})
    refused = answered[("orders", 0)]
    assert (int(refused.error_code), refused.base_offset) == (INVALID_RECORD, -1)
    assert [int(error.batch_index) for error in refused.record_errors] == [1, 3]
    assert refused.error_message == "Compacted topic cannot accept message without key in topic partition orders-0."
    assert int(answered[("orders", 1)].error_code) == NONE  # the other partition of the request goes on
    assert stored(catalog, "orders", 0) == []
    assert len(stored(catalog, "orders", 1)) == 2


def test_a_corrupt_crc_is_refused_and_the_connection_serves_on(agent: RunningAgent, catalog: Catalog) -> None:
    batch = bytearray(keyed_batch(3))
    batch[-1] ^= 0xFF  # a byte of the last record's value
    with connect(agent.server) as connection:
        connection.sendall(produce_request(9, 1, {("clicks", 0): bytes(batch)}))
        refused = produce_response(receive_frame(connection), 9)[1][("clicks", 0)]
        assert int(refused.error_code) == CORRUPT_MESSAGE and "CRC-32C" in refused.error_message
        connection.sendall(produce_request(9, 2, {("clicks", 0): keyed_batch(1)}))
        correlation_id, answered = produce_response(receive_frame(connection), 9)
    assert (correlation_id, int(answered[("clicks", 0)].error_code), answered[("clicks", 0)].base_offset) == (2, NONE, 0)
    assert [r.value for r in stored(catalog, "clicks", 0)] == [value("v", 0)]


@pytest.mark.parametrize(
    ("case", "partitions", "version", "error"),
    [
        ("unknown topic", {("no-such-topic", 0): "batch"}, 9, UNKNOWN_TOPIC_OR_PARTITION),
        ("partition out of range", {("orders", 2): "batch"}, 9, UNKNOWN_TOPIC_OR_PARTITION),
        ("over max.message.bytes", {("clicks", 0): "large"}, 9, MESSAGE_TOO_LARGE),
        ("magic 1 message set", {("clicks", 0): "magic 1"}, 9, INVALID_RECORD),
        ("two batches", {("clicks", 0): "two"}, 9, INVALID_RECORD),
        ("no records", {("clicks", 0): None}, 9, INVALID_RECORD),
        ("zstd before v7", {("clicks", 0): "zstd"}, 6, UNSUPPORTED_COMPRESSION_TYPE),
        ("idempotent producer", {("clicks", 0): "idempotent"}, 9, UNKNOWN_PRODUCER_ID),
        ("truncated batch", {("clicks", 0): "truncated"}, 9, CORRUPT_MESSAGE),
    ],
)
def test_refused_batches_get_kafkas_error_and_write_nothing(agent: RunningAgent, catalog: Catalog, case: str, partitions: dict, version: int, error: int) -> None:
    legacy = LegacyRecordBatchBuilder(magic=1, compression_type=0, batch_size=1 << 20)
    legacy.append(0, timestamp=TIMESTAMP, key=b"k", value=b"v")
    batches: dict[str | None, bytes | None] = {
        "batch": keyed_batch(1),
        "large": record_batch([(b"k", os.urandom(MAX_MESSAGE_BYTES), [])]),
        "magic 1": bytes(legacy.build()),
        "two": keyed_batch(1) + keyed_batch(1),
        None: None,
        "zstd": keyed_batch(1, "zstd"),
        "idempotent": record_batch([(b"k", b"v", [])], producer_id=7),
        "truncated": keyed_batch(3)[:-5],
    }
    answered = produce(agent, {where: batches[name] for where, name in partitions.items()}, version)
    assert [int(p.error_code) for p in answered.values()] == [error]
    assert all(p.base_offset == -1 for p in answered.values())
    assert stored(catalog, "clicks", 0) == []


def with_payload(batch: bytes, payload: bytes) -> bytes:
    """The batch with other record bytes, its length and CRC-32C made right for them: only decoding can tell."""
    framed = bytearray(batch[:HEADER_BYTES] + payload)
    struct.pack_into(">i", framed, 8, len(framed) - 12)
    struct.pack_into(">I", framed, CRC_AT, crc32c(bytes(framed[ATTRIBUTES_AT:])))
    return bytes(framed)


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_compressed_payload_that_does_not_decompress_is_corrupt(agent: RunningAgent, catalog: Catalog, codec: str) -> None:
    batch = keyed_batch(3, codec)
    damaged = with_payload(batch, batch[HEADER_BYTES:-8])  # its end cut off, framing and CRC fixed
    answered = produce(agent, {("clicks", 0): damaged})[("clicks", 0)]
    assert int(answered.error_code) == CORRUPT_MESSAGE
    assert stored(catalog, "clicks", 0) == []


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_a_batch_that_decompresses_past_the_limit_is_refused_without_inflating_it(
    agent: RunningAgent, catalog: Catalog, codec: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(produce_module, "MAX_DECOMPRESSED_BATCH_BYTES", 64 * 1024)
    bomb = record_batch([(b"k", bytes(256 * 1024), [])], codec)  # a few hundred bytes compressed
    assert len(bomb) < 16 * 1024
    answered = produce(agent, {("clicks", 0): bomb})[("clicks", 0)]
    assert int(answered.error_code) == MESSAGE_TOO_LARGE and "decompresses to more than 65536 bytes" in answered.error_message
    assert stored(catalog, "clicks", 0) == []


def test_acks_other_than_0_1_all_are_refused(agent: RunningAgent) -> None:
    assert int(produce(agent, {("clicks", 0): keyed_batch(1)}, acks=2)[("clicks", 0)].error_code) == INVALID_REQUIRED_ACKS


def test_acks_0_gets_no_response_and_is_stored(agent: RunningAgent, catalog: Catalog) -> None:
    with connect(agent.server) as connection:
        connection.sendall(produce_request(9, 1, {("clicks", 0): keyed_batch(2)}, acks=0) + request_frame(18, 0, 2))
        assert struct.unpack_from(">ih", receive_frame(connection)) == (2, 0)  # the ApiVersions after it, first
    deadline = time.monotonic() + 5
    while not stored(catalog, "clicks", 0) and time.monotonic() < deadline:
        time.sleep(FLUSH_MS / 1000)
    assert [r.value for r in stored(catalog, "clicks", 0)] == [value("v", 0), value("v", 1)]


def test_acks_0_with_a_refused_batch_closes_the_connection(agent: RunningAgent, caplog: pytest.LogCaptureFixture) -> None:
    with connect(agent.server) as connection:
        connection.sendall(produce_request(9, 1, {("orders", 0): record_batch([(None, b"v", [])])}, acks=0))
        assert closed_by_peer(connection)
    assert "acks=0 produce refused, connection closed as Kafka does: orders[0]: invalid_record" in caplog.text
    with connect(agent.server) as connection:  # the agent serves on
        connection.sendall(request_frame(18, 0, 3))
        assert struct.unpack_from(">ih", receive_frame(connection)) == (3, 0)


def test_pipelined_produces_past_16_share_a_flush_and_a_frame_past_the_in_flight_bytes_is_read_alone(catalog: Catalog) -> None:
    """acks=all Produce requests wait for the flush: a connection reads many ahead (40 here, where 16 would take three
    flushes), so they share one L0 file; a frame larger than the in-flight byte budget is read once the requests before
    it are answered, alone, and answered in its turn."""
    running = RunningAgent(catalog, flush_interval_ms=300, max_in_flight_bytes=64 * 1024)
    try:
        with connect(running.server) as connection:
            connection.sendall(b"".join(produce_request(9, n, {("clicks", 0): keyed_batch(1, prefix=f"r{n}-")}) for n in range(40)))
            connection.sendall(produce_request(9, 40, {("clicks", 0): keyed_batch(400, prefix="big")}))
            answers = [produce_response(receive_frame(connection), 9) for _ in range(41)]
    finally:
        running.stop()
    assert [(n, int(a[("clicks", 0)].error_code), a[("clicks", 0)].base_offset) for n, a in answers] == [(n, NONE, n) for n in range(41)]
    assert len(catalog.snapshot().files(0)) == 2  # the 40 small batches in one file, then the big one


def test_stopping_commits_what_the_agent_holds_and_answers_it(catalog: Catalog) -> None:
    running = RunningAgent(catalog, flush_interval_ms=60_000)  # nothing would be committed for a minute
    with connect(running.server) as connection:
        connection.sendall(produce_request(9, 1, {("clicks", 0): keyed_batch(2)}, acks=0) + produce_request(9, 2, {("clicks", 0): keyed_batch(1, prefix="w")}))
        time.sleep(0.2)  # both read
        started = time.monotonic()
        stopping = threading.Thread(target=running.stop)
        stopping.start()
        correlation_id, answered = produce_response(receive_frame(connection), 9)
        stopping.join(timeout=30)
    assert time.monotonic() - started < 10
    assert (correlation_id, int(answered[("clicks", 0)].error_code), answered[("clicks", 0)].base_offset) == (2, NONE, 2)
    assert [r.value for r in stored(catalog, "clicks", 0)] == [value("v", 0), value("v", 1), value("w", 0)]


def test_the_agent_command_commits_acked_batches_on_sigterm(catalog: Catalog) -> None:
    command = [sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--flush-ms", "60000", "--flush-bytes", "100000000"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None
        host, port = json.loads(process.stdout.readline())["listening"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            connection.sendall(produce_request(9, 4, {("clicks", 0): keyed_batch(3)}))
            time.sleep(0.2)
            process.send_signal(signal.SIGTERM)
            correlation_id, answered = produce_response(receive_frame(connection), 9)
        assert (correlation_id, int(answered[("clicks", 0)].error_code), answered[("clicks", 0)].base_offset) == (4, NONE, 0)
        assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert [r.value for r in stored(catalog, "clicks", 0)] == [value("v", i) for i in range(3)]
