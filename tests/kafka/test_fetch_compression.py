"""Compressed fetches: each client (confluent-kafka, kafka-python, aiokafka, kcat, Kafka's Java consumer) reads back topics produced with
gzip, lz4 and zstd (Java: snappy too); the batches on the wire carry the codec the records were produced with (kept through compaction),
or the one a topic's compression.type names, or the agent's --fetch-compression where the produced one is not known;
JSON values take fewer bytes on the wire; Fetch's byte limits hold on what is sent."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import struct
import subprocess
from typing import Any

import pyarrow as pa
import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.record import MemoryRecords
from kio.index import load_response_schema
from kio.serial import entity_reader
from sqlalchemy import select

from lab.servers.kafka import kafka_missing_reason, tool_argv
from logcompact.catalog import Catalog
from logcompact.catalog import schema as s
from logcompact.exceptions import InvalidTopicError
from logcompact.ingest import PRODUCE_SCHEMA, Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.kafka import records
from logcompact.topics import Topic
from tests.helpers import NOW, create_topic, full_sweep
from tests.kafka.agents import FLUSH_MS, MAX_MESSAGE_BYTES, RunningAgent, confluent_consumer, consume
from tests.kafka.wire import TIMESTAMP, kio_frame, receive_frame

pytestmark = pytest.mark.timeout(120)

CODEC_IDS = {"none": records.NONE, "gzip": records.GZIP, "snappy": records.SNAPPY, "lz4": records.LZ4, "zstd": records.ZSTD}
COUNT = 300


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "events", 1)
    return catalog


def json_value(n: int) -> bytes:
    """A JSON event as applications produce them: repetitive field names, a few varying values."""
    return json.dumps({
        "id": n, "user": f"user-{n % 97}", "event": ("click", "view", "purchase")[n % 3], "ts": TIMESTAMP + n,
        "page": f"/catalog/item/{n % 500}", "referrer": "https://shop.example.com/search?q=shoes", "amount": round(n * 1.37 % 100, 2),
    }).encode()


def produce(agent: RunningAgent, topic: str, codec: str, count: int = COUNT, first: int = 0, **config: Any) -> list[tuple[int, bytes, bytes]]:
    """`count` JSON records through confluent-kafka's producer compressing with `codec`: (offset, key, value) each."""
    producer = Producer({"bootstrap.servers": agent.bootstrap, "compression.type": codec, "linger.ms": 50, "acks": "all", **config})
    sent = [(b"key-%d" % (n % 50), json_value(n)) for n in range(first, first + count)]
    for key, value in sent:
        producer.produce(topic, key=key, value=value, partition=0, timestamp=TIMESTAMP)
    assert producer.flush(30) == 0
    return [(first + index, key, value) for index, (key, value) in enumerate(sent)]


def raw_fetch(agent: RunningAgent, topic: str, offset: int = 0, partition_max_bytes: int = 1 << 24, max_bytes: int = 1 << 24,
              isolation_level: int = 0) -> tuple[int, Any]:
    """One Fetch v12 of partition 0 from `offset`: the bytes of the response frame on the wire, and its partition."""
    body = {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": max_bytes, "isolation_level": isolation_level, "session_id": 0,
        "session_epoch": -1, "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": offset, "partition_max_bytes": partition_max_bytes}]}],
        "forgotten_topics_data": [], "rack_id": "",
    }
    address = agent.server.address
    with socket.create_connection((address.host, address.port), timeout=30) as connection:
        connection.sendall(kio_frame(1, 12, body, correlation_id=12))
        frame = receive_frame(connection)
    response_class = load_response_schema(1, 12)
    _, size = entity_reader(response_class.__header_schema__)(frame, 0)
    response = entity_reader(response_class)(frame, size)[0]
    partition = response.responses[0].partitions[0]
    assert partition.error_code == 0, partition.error_code
    return struct.calcsize(">i") + len(frame), partition


def batches_of(partition: Any) -> list[tuple[int, bool, list[tuple[int, bytes | None, bytes | None]]]]:
    """Each batch of a partition's answer as (its codec id, whether a control batch, its records), decoded by
    kafka-python's record module."""
    found, memory = [], MemoryRecords(bytes(partition.records or b""))
    while (batch := memory.next_batch()) is not None:
        found.append((batch.compression_type, batch.is_control_batch, [(r.offset, r.key, r.value) for r in batch]))
    return found


def data_records(partition: Any) -> list[tuple[int, bytes | None, bytes | None]]:
    return [record for _, control, batch in batches_of(partition) if not control for record in batch]


# -- each client reads back what was produced compressed ---------------------------------------------------


def read_confluent(agent: RunningAgent) -> list[tuple[int, bytes, bytes]]:
    consumer = confluent_consumer(agent)
    try:
        consumer.assign([TopicPartition("events", 0, 0)])
        return [(m.offset(), m.key(), m.value()) for m in consume(consumer, COUNT, timeout=30)]
    finally:
        consumer.close()


def read_kafka_python(agent: RunningAgent) -> list[tuple[int, bytes, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False, consumer_timeout_ms=30_000)
    try:
        partition = KafkaPythonTopicPartition("events", 0)
        consumer.assign([partition])
        consumer.seek_to_beginning(partition)
        got: list[tuple[int, bytes, bytes]] = []
        while len(got) < COUNT:
            polled = consumer.poll(timeout_ms=2000)
            assert polled, f"kafka-python stalled after {len(got)} records"
            got += [(m.offset, m.key, m.value) for messages in polled.values() for m in messages]
        return got
    finally:
        consumer.close()


async def _read_aiokafka(bootstrap: str) -> list[tuple[int, bytes, bytes]]:
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partition = AioTopicPartition("events", 0)
        consumer.assign([partition])
        await consumer.seek_to_beginning(partition)
        got: list[tuple[int, bytes, bytes]] = []
        while len(got) < COUNT:
            polled = await consumer.getmany(timeout_ms=2000)
            assert polled, f"aiokafka stalled after {len(got)} records"
            got += [(m.offset, m.key, m.value) for messages in polled.values() for m in messages]
        return got
    finally:
        await consumer.stop()


def read_aiokafka(agent: RunningAgent) -> list[tuple[int, bytes, bytes]]:
    return asyncio.run(_read_aiokafka(agent.bootstrap))


def read_kcat(agent: RunningAgent) -> list[tuple[int, bytes, bytes]]:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    consumed = subprocess.run(["kcat", "-b", agent.bootstrap, "-C", "-t", "events", "-p", "0", "-o", "beginning", "-e", "-f", "%o\t%k\t%s\n"],
                              capture_output=True, timeout=60)
    assert consumed.returncode == 0, consumed.stderr
    lines = [line.split(b"\t") for line in consumed.stdout.splitlines()]
    return [(int(offset), key, value) for offset, key, value in lines]


READERS = {"confluent-kafka": read_confluent, "kafka-python": read_kafka_python, "aiokafka": read_aiokafka, "kcat": read_kcat}


@pytest.mark.parametrize("client", READERS)
@pytest.mark.parametrize("codec", ["gzip", "lz4", "zstd"])
def test_each_client_reads_back_a_topic_produced_compressed(agent: RunningAgent, codec: str, client: str) -> None:
    sent = produce(agent, "events", codec)
    _, partition = raw_fetch(agent, "events")
    assert {batch_codec for batch_codec, _, _ in batches_of(partition)} == {CODEC_IDS[codec]}
    assert READERS[client](agent) == sent


@pytest.mark.parametrize("codec", ["gzip", "snappy", "lz4", "zstd"])
def test_kafkas_java_consumer_reads_back_a_topic_produced_compressed(agent: RunningAgent, codec: str) -> None:
    """Kafka's own consumer (its console consumer, from the broker's jars): lz4 frames and snappy's xerial framing as
    its Java codecs read them."""
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    sent = produce(agent, "events", codec)
    run = subprocess.run(
        tool_argv("org.apache.kafka.tools.consumer.ConsoleConsumer", "--bootstrap-server", agent.bootstrap, "--topic", "events",
                  "--partition", "0", "--offset", "earliest", "--max-messages", str(COUNT), "--timeout-ms", "60000",
                  "--formatter-property", "print.key=true", "--formatter-property", "print.offset=true"),
        capture_output=True, timeout=180,
    )
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    lines = [line.split(b"\t") for line in run.stdout.splitlines()]
    assert [(int(offset.removeprefix(b"Offset:")), key, value) for offset, key, value in lines] == sent


# -- the codec on the wire --------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_batches_carry_the_codec_the_records_were_produced_with(agent: RunningAgent, catalog: Catalog, codec: str) -> None:
    sent = produce(agent, "events", codec)
    _, partition = raw_fetch(agent, "events")
    found = batches_of(partition)
    assert [batch_codec for batch_codec, _, _ in found] == [CODEC_IDS[codec]] * len(found)
    assert data_records(partition) == sent
    # The catalog's rows keep the store's codec and the producer's apart
    with catalog.engine.connect() as connection:
        stored = set(connection.execute(select(s.sections.c.compression, s.sections.c.produced_compression)).all())
    assert stored == {(1, CODEC_IDS[codec])}  # lz4, the agent's L0 files'


def produced_columns(first: int, count: int) -> pa.RecordBatch:
    rows = [{"timestamp": TIMESTAMP, "key": b"key-%d" % n, "value": json_value(n), "headers": None} for n in range(first, first + count)]
    return pa.RecordBatch.from_pylist(rows, PRODUCE_SCHEMA)


def test_a_section_of_several_codecs_is_sent_in_the_codec_of_most_of_its_records(agent: RunningAgent, catalog: Catalog) -> None:
    with Agent(catalog, background=False) as ingest:  # one L0 file, one section of "events" for the three batches
        ingest.produce_columns("events", 0, produced_columns(0, 40), produced_codec=records.GZIP)
        ingest.produce_columns("events", 0, produced_columns(40, 100), produced_codec=records.ZSTD)
        ingest.produce_columns("events", 0, produced_columns(140, 50), produced_codec=records.GZIP)  # 90 gzip, 100 zstd
    _, partition = raw_fetch(agent, "events")
    assert {batch_codec for batch_codec, _, _ in batches_of(partition)} == {records.ZSTD}
    assert [value for _, _, value in data_records(partition)] == [json_value(n) for n in range(190)]


@pytest.mark.parametrize(("setting", "sent_codec"), [("zstd", records.ZSTD), ("lz4", records.LZ4), ("uncompressed", records.NONE)])
def test_a_topic_compression_type_names_the_codec_sent(agent: RunningAgent, catalog: Catalog, setting: str, sent_codec: int) -> None:
    create_topic(catalog, "set", 1, compression_type=setting)
    sent = produce(agent, "set", "gzip")
    _, partition = raw_fetch(agent, "set")
    assert {batch_codec for batch_codec, _, _ in batches_of(partition)} == {sent_codec}
    assert data_records(partition) == sent


def test_compression_type_is_kafkas_config() -> None:
    assert Topic.create("t", 1, {}, NOW).config.compression_type is None  # producer, kept out of the stored configs
    assert "compression.type" not in Topic.create("t", 1, {"compression.type": "producer"}, NOW).config.to_kafka()
    assert Topic.create("t", 1, {"compression.type": "zstd"}, NOW).config.to_kafka()["compression.type"] == "zstd"
    with pytest.raises(InvalidTopicError, match=r"compression.type='brotli' is invalid: use one of producer, uncompressed, gzip, snappy, lz4, zstd"):
        Topic.create("t", 1, {"compression.type": "brotli"}, NOW)


def test_admin_clients_create_and_describe_compression_type(agent: RunningAgent) -> None:
    admin = AdminClient({"bootstrap.servers": agent.bootstrap})
    admin.create_topics([NewTopic("zstd-topic", 1, config={"compression.type": "zstd"})])["zstd-topic"].result(30)
    refused = admin.create_topics([NewTopic("brotli-topic", 1, config={"compression.type": "brotli"})])["brotli-topic"]
    with pytest.raises(KafkaException, match="compression.type='brotli' is invalid"):
        refused.result(30)
    described = {}
    for name in ("zstd-topic", "events"):
        resource = ConfigResource(ConfigResource.Type.TOPIC, name)
        entry = admin.describe_configs([resource])[resource].result(30)["compression.type"]
        described[name] = (entry.value, entry.source)
    assert described == {"zstd-topic": ("zstd", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), "events": ("producer", ConfigSource.DEFAULT_CONFIG.value)}


def library_records(count: int) -> list[Record]:
    return [Record(0, b"key-%d" % n, json_value(n), TIMESTAMP) for n in range(count)]


@pytest.mark.parametrize(("option", "sent_codec"), [(None, records.NONE), (records.LZ4, records.LZ4), (records.ZSTD, records.ZSTD)])
def test_records_of_unknown_codec_are_sent_in_the_fetch_compression_option(catalog: Catalog, option: int | None, sent_codec: int) -> None:
    with Agent(catalog, background=False) as ingest:
        ingest.produce("events", library_records(COUNT))
    settings = {} if option is None else {"fetch_compression": option}
    agent = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, max_message_bytes=MAX_MESSAGE_BYTES, **settings)
    try:
        _, partition = raw_fetch(agent, "events")
        assert {batch_codec for batch_codec, _, _ in batches_of(partition)} == {sent_codec}
        assert [value for _, _, value in data_records(partition)] == [json_value(n) for n in range(COUNT)]
    finally:
        agent.stop()


def test_compaction_keeps_the_codec_the_records_were_produced_with(agent: RunningAgent, catalog: Catalog) -> None:
    create_topic(catalog, "state", 1, cleanup_policy="compact")
    produce(agent, "state", "lz4", count=100)
    produce(agent, "state", "lz4", count=100, first=100)  # every key again: the first 100 records are compacted away
    plan = full_sweep(catalog.planning_snapshot(NOW + 3_600_000), NOW + 3_600_000)
    assert plan is not None
    run_and_commit(catalog, plan, NOW + 3_600_000)
    assert catalog.snapshot().files(level=0, topics=["state"]) == []
    _, partition = raw_fetch(agent, "state")
    assert {batch_codec for batch_codec, control, _ in batches_of(partition) if not control} == {records.LZ4}
    assert data_records(partition) == [(n, b"key-%d" % (n % 50), json_value(n)) for n in range(150, 200)]


def test_transactional_batches_are_compressed_and_the_end_marker_is_not(agent: RunningAgent) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "transactional.id": "tx", "compression.type": "zstd", "linger.ms": 5})
    producer.init_transactions(30)
    producer.begin_transaction()
    for n in range(50):
        producer.produce("events", key=b"k%d" % n, value=json_value(n), partition=0, timestamp=TIMESTAMP)
    producer.commit_transaction(30)
    _, partition = raw_fetch(agent, "events", isolation_level=1)
    found = batches_of(partition)
    assert [(batch_codec, control) for batch_codec, control, _ in found] == [(records.ZSTD, False)] * (len(found) - 1) + [(records.NONE, True)]
    assert [value for _, _, value in data_records(partition)] == [json_value(n) for n in range(50)]
    assert int(partition.last_stable_offset) == int(partition.high_watermark) == 51  # the records and the commit marker


# -- bytes on the wire and the byte limits ------------------------------------------------------------------


def test_json_values_take_several_times_fewer_bytes_on_the_wire(agent: RunningAgent, catalog: Catalog) -> None:
    sizes = {}
    for codec in ("none", "lz4", "zstd"):
        create_topic(catalog, f"json-{codec}", 1)
        produce(agent, f"json-{codec}", codec)
        sizes[codec], partition = raw_fetch(agent, f"json-{codec}")
        assert len(data_records(partition)) == COUNT
    assert sizes["lz4"] * 3 < sizes["none"], sizes
    assert sizes["zstd"] * 5 < sizes["none"], sizes


def test_values_compression_barely_shrinks_are_sent_uncompressed_and_json_beside_them_compressed(agent: RunningAgent, catalog: Catalog) -> None:
    """Random bytes as hex digits (lz4 spares 7% of them) produced with lz4 go uncompressed, sparing the agent the
    compression and the consumer the decompression; JSON records produced with lz4 after them still go in lz4."""
    randoms = [{"timestamp": TIMESTAMP, "key": b"key-%d" % n, "value": os.urandom(512).hex().encode(), "headers": None} for n in range(400)]
    with Agent(catalog, background=False) as ingest:  # 400 KiB in one section: one batch, past the probe
        ingest.produce_columns("events", 0, pa.RecordBatch.from_pylist(randoms, PRODUCE_SCHEMA), produced_codec=records.LZ4)
    with Agent(catalog, background=False) as ingest:
        ingest.produce_columns("events", 0, produced_columns(400, 3_000), produced_codec=records.LZ4)
    _, partition = raw_fetch(agent, "events")
    found = batches_of(partition)
    assert found[0][0] == records.NONE and len(found[0][2]) > 2 * records.PROBE_BYTES // 1024
    assert found[-1][0] == records.LZ4
    assert [value for _, _, value in data_records(partition)] == [row["value"] for row in randoms] + [json_value(n) for n in range(400, 3_400)]


@pytest.mark.parametrize("limit", [2_000, 8_000, 30_000])
def test_partition_max_bytes_holds_on_the_compressed_batches_and_every_record_comes(agent: RunningAgent, limit: int) -> None:
    sent = produce(agent, "events", "gzip", count=2_000)
    offset, got, answers = 0, [], 0
    while offset < len(sent):
        _, partition = raw_fetch(agent, "events", offset, partition_max_bytes=limit)
        assert len(partition.records) <= limit
        read = data_records(partition)
        got += read
        offset = read[-1][0] + 1
        answers += 1
    assert got == sent
    # Filled with compressed bytes, not with what the records take uncompressed
    uncompressed = sum(len(value) + len(key) for _, key, value in sent)
    assert answers * limit < uncompressed / 2


def test_max_bytes_holds_across_partitions_on_the_compressed_batches(agent: RunningAgent, catalog: Catalog) -> None:
    sent = produce(agent, "events", "zstd", count=2_000)
    _, partition = raw_fetch(agent, "events", partition_max_bytes=1 << 20, max_bytes=5_000)
    assert len(partition.records) <= 5_000
    read = data_records(partition)
    assert read == sent[: len(read)] and len(read) > 5_000 // len(json_value(0))
