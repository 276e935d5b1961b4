"""Reads of transactional data through `logcompact agent` and `logcompact consume`, by isolation level.

A read_committed consumer (confluent-kafka, kafka-python, aiokafka) sees exactly the records of committed
transactions, never an aborted one's, and stops at an open transaction's first offset (the last stable offset)
until it ends, while a read_uncommitted one reads every record to the high watermark; ListOffsets' latest under
read_committed is the last stable offset, and a timestamp is looked up below it; aborted records at the end are a
hole Fetch covers, so consumers move past them; `logcompact consume --isolation` and `consume.read_records` read
the same way from the catalog. The same sequence against Apache Kafka's broker (lab.servers.kafka) gives the same
watermarks and records at each isolation level.
"""

from __future__ import annotations

import asyncio
import json
import socket
import time
import uuid
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AIOTopicPartition
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition

from lab.servers.kafka import KafkaServer
from logcompact.catalog import Catalog
from logcompact.consume import READ_COMMITTED, READ_UNCOMMITTED, read_records, read_sections
from logcompact.ingest import Record
from logcompact.kafka.cluster import Address
from tests.helpers import NOW, create_topic, produce_records, rewrite_without
from tests.kafka.agents import FAST_CLIENT, RunningAgent, confluent_consumer, consume
from tests.kafka.test_transactions import TOPIC, commit_abort_commit, send, transactional
from tests.kafka.wire import Wire
from tests.support.cli_cases import run_in_process

pytestmark = pytest.mark.timeout(120)

LIST_OFFSETS, LATEST = 2, -1
COMMITTED = [(0, b"a"), (1, b"b"), (2, b"c"), (8, b"d"), (9, b"e"), (10, b"f")]
EVERY = [(0, b"a"), (1, b"b"), (2, b"c"), (4, b"x"), (5, b"y"), (6, b"z"), (8, b"d"), (9, b"e"), (10, b"f")]


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, TOPIC, 2, cleanup_policy="compact")
    return catalog


def confluent_read(agent: RunningAgent | str, isolation: str, count: int, topic: str = TOPIC) -> list[tuple[int, bytes]]:
    """`count` records of partition 0 from offset 0 and the partition's end, as a confluent-kafka consumer of
    `isolation` reads them from an agent (or a broker's bootstrap servers); then nothing more for half a second."""
    bootstrap = agent if isinstance(agent, str) else agent.bootstrap
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reads", "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation, **FAST_CLIENT})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        read = [(message.offset(), message.value()) for message in consume(consumer, count)]
        deadline = time.monotonic() + 0.5
        while time.monotonic() < deadline:
            message = consumer.poll(0.1)
            assert message is None or message.error(), (message.offset(), message.value())
        return read
    finally:
        consumer.close()


def confluent_position_at_end(bootstrap: str, isolation: str, count: int, topic: str) -> int:
    """A confluent-kafka consumer's position (`rd_kafka_position`: after the last record or control record it
    consumed) once it read partition 0's `count` records and end: quixstreams' changelog recovery waits for it to
    reach the high watermark."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "reads", "enable.auto.commit": False, "enable.partition.eof": True,
                         "isolation.level": isolation, **FAST_CLIENT})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        consume(consumer, count)
        return consumer.position([TopicPartition(topic, 0)])[0].offset
    finally:
        consumer.close()


def latest(agent: RunningAgent | Address, isolation: int, topic: str = TOPIC) -> int:
    """ListOffsets v5's latest offset of partition 0 at `isolation`."""
    return list_offset(agent, isolation, LATEST, topic)[0]


def list_offset(agent: RunningAgent | Address, isolation: int, target: int, topic: str = TOPIC) -> tuple[int, int]:
    """ListOffsets v5's (offset, timestamp) for `target` (a timestamp, or latest) in partition 0 at `isolation`, of
    an agent or a broker."""
    address = agent if isinstance(agent, Address) else agent.server.address
    with socket.create_connection((address.host, address.port), timeout=20) as connection:
        answered = Wire.over(connection).call(LIST_OFFSETS, 5, {
            "replica_id": -1, "isolation_level": isolation,
            "topics": [{"name": topic, "partitions": [{"partition_index": 0, "current_leader_epoch": -1, "timestamp": target}]}],
        })
    found = answered.topics[0].partitions[0]
    assert int(found.error_code) == 0
    return int(found.offset), int(found.timestamp)


def kafka_python_read(agent: RunningAgent, count: int) -> list[tuple[int, bytes]]:
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    try:
        partition = KafkaPythonTopicPartition(TOPIC, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        read: list[tuple[int, bytes]] = []
        deadline = time.monotonic() + 20
        while len(read) < count and time.monotonic() < deadline:
            for messages in consumer.poll(timeout_ms=200).values():
                read += [(message.offset, message.value) for message in messages]
        return read
    finally:
        consumer.close()


def kafka_python_position_after(agent: RunningAgent, count: int) -> int:
    """The position of a read_committed kafka-python consumer of partition 0 once it has read `count` records and
    fetched once more."""
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, isolation_level="read_committed", enable_auto_commit=False)
    try:
        partition = KafkaPythonTopicPartition(TOPIC, 0)
        consumer.assign([partition])
        consumer.seek(partition, 0)
        read = 0
        deadline = time.monotonic() + 20
        while read < count and time.monotonic() < deadline:
            read += sum(len(messages) for messages in consumer.poll(timeout_ms=200).values())
        assert read == count
        consumer.poll(timeout_ms=500)
        return int(consumer.position(partition))
    finally:
        consumer.close()


def aiokafka_read(agent: RunningAgent, count: int) -> list[tuple[int, bytes]]:
    async def run() -> list[tuple[int, bytes]]:
        consumer = AIOKafkaConsumer(bootstrap_servers=agent.bootstrap, isolation_level="read_committed", enable_auto_commit=False)
        await consumer.start()
        try:
            partition = AIOTopicPartition(TOPIC, 0)
            consumer.assign([partition])
            consumer.seek(partition, 0)
            read: list[tuple[int, bytes]] = []
            while len(read) < count:
                message = await asyncio.wait_for(consumer.getone(), 20)
                read.append((message.offset, message.value))
            return read
        finally:
            await consumer.stop()

    return asyncio.run(run())


def cli_read(catalog: Catalog, *isolation: str) -> list[tuple[int, bytes]]:
    outcome = run_in_process(["--store", catalog.store.uri, "--catalog", catalog.url, "consume", TOPIC, "--partition", "0", *isolation])
    assert outcome.code == 0, outcome
    return [(document["offset"], document["value"].encode()) for document in map(json.loads, outcome.stdout.splitlines())]


def test_read_committed_consumers_see_the_committed_records_only(agent: RunningAgent, catalog: Catalog) -> None:
    delivered, high = commit_abort_commit(transactional(agent, "reads-1"), lambda: agent.bootstrap)
    assert delivered == EVERY and high == 12
    assert confluent_read(agent, "read_committed", 6) == COMMITTED
    assert confluent_read(agent, "read_uncommitted", 9) == EVERY
    assert kafka_python_read(agent, 6) == COMMITTED
    assert aiokafka_read(agent, 6) == COMMITTED
    assert latest(agent, READ_COMMITTED) == latest(agent, READ_UNCOMMITTED) == 12
    assert cli_read(catalog, "--isolation", "read_committed") == COMMITTED
    assert cli_read(catalog) == cli_read(catalog, "--isolation", "read_uncommitted") == EVERY


def test_an_open_transaction_holds_read_committed_consumers_at_its_first_offset(agent: RunningAgent, catalog: Catalog) -> None:
    plain = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    plain.produce(TOPIC, key=b"k", value=b"before", partition=0)
    assert plain.flush(20) == 0
    producer = transactional(agent, "reads-open-1")
    producer.begin_transaction()
    send(producer, [b"a", b"b"])
    assert producer.flush(20) == 0
    later = int(time.time() * 1000) + 60_000  # after every other record's timestamp
    plain.produce(TOPIC, key=b"k", value=b"after", partition=0, timestamp=later)
    assert plain.flush(20) == 0
    assert confluent_read(agent, "read_committed", 1) == [(0, b"before")]
    # a timestamp is looked up below the last stable offset only, as Kafka bounds it
    assert list_offset(agent, READ_UNCOMMITTED, later) == (3, later)
    assert list_offset(agent, READ_COMMITTED, later) == (-1, -1)
    assert confluent_read(agent, "read_uncommitted", 4) == [(0, b"before"), (1, b"a"), (2, b"b"), (3, b"after")]
    assert (latest(agent, READ_COMMITTED), latest(agent, READ_UNCOMMITTED)) == (1, 4)
    assert cli_read(catalog, "--isolation", "read_committed") == [(0, b"before")]
    producer.commit_transaction(20)
    committed = [(0, b"before"), (1, b"a"), (2, b"b"), (3, b"after")]
    assert confluent_read(agent, "read_committed", 4) == committed
    assert latest(agent, READ_COMMITTED) == 5
    assert list_offset(agent, READ_COMMITTED, later) == (3, later)
    assert cli_read(catalog, "--isolation", "read_committed") == committed


def test_a_read_committed_consumer_moves_past_an_aborted_transaction_at_the_end(agent: RunningAgent) -> None:
    """Aborted records and the marker after them, at the end of the partition, are a trailing hole Fetch covers to
    the last stable offset - 1: the consumer reaches the partition's end (librdkafka's end of a read_committed
    partition is the last stable offset, 8: records 4-6 aborted, markers at 3 and 7), and reads on when more is
    committed."""
    producer = transactional(agent, "reads-end-1")
    for outcome, values in (("commit", [b"a", b"b", b"c"]), ("abort", [b"x", b"y", b"z"])):
        producer.begin_transaction()
        send(producer, values)
        assert producer.flush(20) == 0
        producer.commit_transaction(20) if outcome == "commit" else producer.abort_transaction(20)
    consumer = confluent_consumer(agent, **{"isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        assert [(message.offset(), message.value()) for message in consume(consumer, 3)] == [(0, b"a"), (1, b"b"), (2, b"c")]
        assert kafka_python_position_after(agent, 3) == 8  # its next fetch offset
        producer.begin_transaction()
        send(producer, [b"d"])
        producer.commit_transaction(20)
        assert [(message.offset(), message.value()) for message in consume(consumer, 1)] == [(8, b"d")]
    finally:
        consumer.close()


@pytest.mark.parametrize("from_offset, to_offset", [(0, None), (2, 11), (5, 8), (6, 7)])
def test_the_read_path_drops_the_aborted_ranges_across_sections_and_holes(catalog: Catalog, from_offset: int, to_offset: int | None) -> None:
    """`consume.read_sections` with aborted ranges: ranges spanning two files' sections, starting in a compaction's
    hole, before the read's first offset or past its end, each record left out exactly when a range holds it."""
    create_topic(catalog, "t", cleanup_policy="compact")
    for batch in range(3):
        produce_records(catalog, "t", [Record(0, b"k%d" % i, b"%d" % (batch * 4 + i), NOW + i) for i in range(4)])
    rewrite_without(catalog.store, catalog, [f.key for f in catalog.snapshot().file_summaries(0)][:1], drop_offsets={1, 2}, level=1)
    aborted = [(1, 1), (2, 5), (7, 7), (10, 40)]  # 1 and 2 compacted away; 2-5 spans the first two files
    snapshot = catalog.snapshot()
    tables = read_sections(catalog.store, snapshot.sections_of("t", 0), from_offset, to_offset, aborted)
    offsets = [offset for table in tables for offset in table.column("offset").to_pylist()]
    kept = [offset for offset in (0, 3, 4, 5, 6, 7, 8, 9, 10, 11) if not any(first <= offset <= last for first, last in aborted)]
    assert offsets == [offset for offset in kept if from_offset <= offset < (to_offset or 12)]


def test_read_records_leaves_out_aborted_ranges_and_stops_at_the_last_stable_offset(agent: RunningAgent, catalog: Catalog) -> None:
    """The library's read path (`consume.read_records`), from any offset and to any offset."""
    commit_abort_commit(transactional(agent, "reads-lib-1"), lambda: agent.bootstrap)
    open_producer = transactional(agent, "reads-lib-2")
    open_producer.begin_transaction()
    send(open_producer, [b"open"])
    assert open_producer.flush(20) == 0

    def read(isolation: int, **bounds: Any) -> list[int]:
        return [record.offset for record in read_records(catalog.store, catalog.snapshot(), TOPIC, 0, isolation=isolation, **bounds)]

    assert read(READ_UNCOMMITTED) == [offset for offset, _ in EVERY] + [12]
    assert read(READ_COMMITTED) == [offset for offset, _ in COMMITTED]
    assert read(READ_COMMITTED, from_offset=5, to_offset=10) == [8, 9]
    assert read(READ_COMMITTED, from_offset=4, to_offset=7) == []
    assert read(READ_COMMITTED, from_offset=12) == []


# -- Apache Kafka's broker, the reference ------------------------------------------------------------------------




def scripted_reads(bootstrap: str, address: Address, topic: str) -> list[tuple[str, object]]:
    """Commit, abort, commit of 3 records each, then a transaction left open with a plain record after it, then its
    commit, on partition 0 of `topic` at `bootstrap`: the watermarks (ListOffsets latest at each isolation level) and
    what read_committed and read_uncommitted consumers read at each step, and their positions once at the end."""

    def settled(open_: bool) -> tuple[int, int]:  # a broker writes its markers after answering EndTxn
        until = time.monotonic() + 10
        while True:
            found = (latest(address, READ_COMMITTED, topic), latest(address, READ_UNCOMMITTED, topic))
            if (found[0] < found[1]) == open_ or time.monotonic() > until:
                return found
            time.sleep(0.1)

    seen: list[tuple[str, object]] = []
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"t-{topic}", "linger.ms": 5, **FAST_CLIENT})
    producer.init_transactions(60)
    for outcome, values in (("commit", [b"a", b"b", b"c"]), ("abort", [b"x", b"y", b"z"]), ("commit", [b"d", b"e", b"f"])):
        producer.begin_transaction()
        for value in values:
            producer.produce(topic, key=b"k-" + value, value=value, partition=0)
        assert producer.flush(20) == 0
        producer.commit_transaction(20) if outcome == "commit" else producer.abort_transaction(20)
    seen += [("ended", settled(False)), ("committed", confluent_read(bootstrap, "read_committed", 6, topic)),
             ("every", confluent_read(bootstrap, "read_uncommitted", 9, topic)),
             ("positions at the end", (confluent_position_at_end(bootstrap, "read_committed", 6, topic),
                                       confluent_position_at_end(bootstrap, "read_uncommitted", 9, topic)))]
    producer.begin_transaction()
    producer.produce(topic, key=b"k-open", value=b"open", partition=0)
    assert producer.flush(20) == 0
    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **FAST_CLIENT})
    plain.produce(topic, key=b"k", value=b"plain", partition=0)
    assert plain.flush(20) == 0
    seen += [("open", settled(True)), ("committed while open", confluent_read(bootstrap, "read_committed", 6, topic)),
             ("every while open", confluent_read(bootstrap, "read_uncommitted", 11, topic))]
    producer.commit_transaction(20)
    seen += [("after", settled(False)), ("committed after", confluent_read(bootstrap, "read_committed", 8, topic)),
             ("positions after", (confluent_position_at_end(bootstrap, "read_committed", 8, topic),
                                  confluent_position_at_end(bootstrap, "read_uncommitted", 11, topic)))]
    return seen


def test_read_committed_reads_and_last_stable_offsets_are_apache_kafkas(agent: RunningAgent, catalog: Catalog, kafka_broker: KafkaServer) -> None:
    topic = f"state-{uuid.uuid4().hex[:8]}"  # the broker is the module's: a topic and transactional id of this test's
    kafka_broker.create_topic(topic, 2, {"cleanup.policy": "compact"})
    create_topic(catalog, topic, 2, cleanup_policy="compact")
    expected = scripted_reads(kafka_broker.bootstrap_servers, Address(kafka_broker.host, kafka_broker.port), topic)
    assert expected[0] == ("ended", (12, 12))  # the reference's offsets as the mock cluster's
    assert expected[3] == ("positions at the end", (12, 12))  # past the last commit's marker, at 11
    assert scripted_reads(agent.bootstrap, agent.server.address, topic) == expected
