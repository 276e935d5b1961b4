"""Consumer offsets inside transactions through `logcompact agent`: AddOffsetsToTxn, TxnOffsetCommit and OffsetFetch's
require_stable, the exactly-once consume-transform-produce loop of Kafka's clients.

A confluent-kafka consumer in a group reads an input topic and a transactional producer writes what it read to a
compacted topic, sending the consumer's positions in the transaction: the group's committed offsets move only when
the transaction commits, and a consumer started again resumes after the last committed one. While a transaction
holds pending offsets, OffsetFetch with require_stable answers UNSTABLE_OFFSET_COMMIT (librdkafka's read_committed
consumer asks again until the transaction ends) and without it the offsets committed before. Kafka's errors of both
APIs on raw requests, KIP-447's generation check of TxnOffsetCommit v3 included, the same as Apache Kafka 4.4's
broker answers (lab.servers.kafka), and kafka-python's producer.
"""

from __future__ import annotations

import logging
import socket
import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, Message, Producer, TopicPartition
from kafka import KafkaProducer
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KafkaTopicPartition
from sqlalchemy import update

from lab.servers.kafka import KafkaServer
from logcompact.catalog import Catalog, schema
from logcompact.kafka.cluster import Address
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, RunningAgent
from tests.kafka.groups import FETCH, SYNC, join
from tests.kafka.wire import Wire

pytestmark = pytest.mark.timeout(120)

SOURCE, SINK = "orders", "totals"
# Kafka's error codes
NONE, UNKNOWN_TOPIC_OR_PARTITION, OFFSET_METADATA_TOO_LARGE, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR = 0, 3, 12, 15, 16
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID = 22, 25
INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING, UNSTABLE_OFFSET_COMMIT, PRODUCER_FENCED = 47, 48, 49, 88, 90
FIND_COORDINATOR, INIT_PRODUCER_ID, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 10, 22, 25, 26, 28


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, SOURCE, 1)
    create_topic(catalog, SINK, 1, cleanup_policy="compact")
    return catalog


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    """No initial rebalance delay: a lone member is assigned its partitions at once."""
    running = RunningAgent(catalog, flush_interval_ms=20, group_initial_rebalance_delay_ms=0)
    try:
        yield running
    finally:
        running.stop()


def fill_source(agent: RunningAgent, count: int) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    for n in range(count):
        producer.produce(SOURCE, key=f"k{n % 3}", value=f"{n}", partition=0)
    assert producer.flush(15) == 0


def member(agent: RunningAgent, group: str, **config: Any) -> Consumer:
    return Consumer({"bootstrap.servers": agent.bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
                     "isolation.level": "read_committed", "heartbeat.interval.ms": 300, "session.timeout.ms": 6000, **FAST_CLIENT, **config})


def transactional(agent: RunningAgent, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **FAST_CLIENT})
    producer.init_transactions(20)
    return producer


def take(consumer: Consumer, count: int, timeout: float = 20) -> list[Message]:
    messages: list[Message] = []
    deadline = threading.Event()
    timer = threading.Timer(timeout, deadline.set)
    timer.start()
    try:
        while len(messages) < count and not deadline.is_set():
            message = consumer.poll(0.2)
            if message is not None:
                assert message.error() is None, message.error()
                messages.append(message)
    finally:
        timer.cancel()
    assert len(messages) == count, f"{len(messages)} of {count} messages within {timeout} s"
    return messages


def transform(consumer: Consumer, producer: Producer, count: int, commit: bool) -> list[int]:
    """One turn of the exactly-once loop: `count` records read, their sum per key written to the compacted topic
    and the consumer's positions sent, in one transaction committed or aborted; the offsets read."""
    messages = take(consumer, count)
    producer.begin_transaction()
    for message in messages:
        producer.produce(SINK, key=message.key(), value=message.value(), partition=0)
    producer.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(), 20)
    if commit:
        producer.commit_transaction(20)
    else:
        producer.abort_transaction(20)
    return [message.offset() for message in messages]


def committed(catalog: Catalog, group: str) -> dict[tuple[str, int], int]:
    return {tp: found.offset for tp, found in catalog.committed_offsets(group).items()}


def test_offsets_sent_in_a_transaction_are_committed_with_it_and_a_new_consumer_resumes_after_them(agent: RunningAgent, catalog: Catalog) -> None:
    fill_source(agent, 9)
    producer = transactional(agent, "eos-1")
    consumer = member(agent, "g")
    consumer.subscribe([SOURCE])
    try:
        assert transform(consumer, producer, 3, commit=True) == [0, 1, 2]
        assert committed(catalog, "g") == {(SOURCE, 0): 3}
        assert transform(consumer, producer, 3, commit=False) == [3, 4, 5]
        assert committed(catalog, "g") == {(SOURCE, 0): 3}  # the aborted transaction's offsets were dropped
    finally:
        consumer.close()
    resumed = member(agent, "g")
    resumed.subscribe([SOURCE])
    try:
        assert transform(resumed, producer, 6, commit=True) == [3, 4, 5, 6, 7, 8]
    finally:
        resumed.close()
        producer.flush(5)
    assert committed(catalog, "g") == {(SOURCE, 0): 9}


def offset_fetch(wire: Wire, version: int, groups: list[str], require_stable: bool, topic: str = SOURCE) -> dict[str, tuple[int, int]]:
    """(committed offset, error) of the topic's partition 0 per group, by an OffsetFetch of `version` (7 asks one group);
    (-1, the group's error) for a group answered no partitions."""
    topics = [{"name": topic, "partition_indexes": [0]}]
    if version >= 8:
        answer = wire.call(FETCH, version, {"groups": [{"group_id": group, "topics": topics} for group in groups], "require_stable": require_stable})
        return {g.group_id: (int(g.topics[0].partitions[0].committed_offset), int(g.topics[0].partitions[0].error_code)) if g.topics else (-1, int(g.error_code))
                for g in answer.groups}
    answer = wire.call(FETCH, version, {"group_id": groups[0], "topics": topics, "require_stable": require_stable})
    return {groups[0]: (int(answer.topics[0].partitions[0].committed_offset), int(answer.topics[0].partitions[0].error_code))}


def test_offsets_pending_in_an_open_transaction_are_unstable_and_a_read_committed_consumer_waits_for_its_end(agent: RunningAgent) -> None:
    fill_source(agent, 8)
    standalone = member(agent, "g")  # assigns itself: its group has no generation
    standalone.commit(offsets=[TopicPartition(SOURCE, 0, 2)], asynchronous=False)
    producer = transactional(agent, "eos-2")
    producer.begin_transaction()
    producer.produce(SINK, key=b"k", value=b"v", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(SOURCE, 0, 5)], standalone.consumer_group_metadata(), 20)
    standalone.close()
    wire = Wire(agent)
    try:
        assert offset_fetch(wire, 7, ["g"], require_stable=False) == {"g": (2, NONE)}  # pending offsets are never shown
        assert offset_fetch(wire, 7, ["g"], require_stable=True) == {"g": (-1, UNSTABLE_OFFSET_COMMIT)}
        assert offset_fetch(wire, 8, ["g", "other"], require_stable=True) == {"g": (-1, UNSTABLE_OFFSET_COMMIT), "other": (-1, NONE)}

        # librdkafka asks with require_stable under read_committed, and asks again until the transaction ends
        resumed = member(agent, "g")
        resumed.assign([TopicPartition(SOURCE, 0)])  # from the committed offset
        first: list[Message] = []
        reading = threading.Thread(target=lambda: first.extend(take(resumed, 1)))
        reading.start()
        reading.join(1.5)
        assert reading.is_alive()  # still waiting for a stable offset
        producer.commit_transaction(20)
        reading.join(20)
        resumed.close()
        assert [message.offset() for message in first] == [5]
        assert offset_fetch(wire, 8, ["g"], require_stable=True) == {"g": (5, NONE)}
    finally:
        wire.close()
        producer.flush(5)


def init(wire: Wire, transactional_id: str) -> tuple[int, int]:
    answer = wire.call(INIT_PRODUCER_ID, 4, {"transactional_id": transactional_id, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1})
    assert int(answer.error_code) == NONE
    return int(answer.producer_id), int(answer.producer_epoch)


def add_offsets(wire: Wire, version: int, transactional_id: str, producer_id: int, epoch: int, group: str) -> int:
    return int(wire.call(ADD_OFFSETS_TO_TXN, version, {"transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": epoch,
                                                       "group_id": group}).error_code)


def txn_commit(wire: Wire, version: int, transactional_id: str, producer_id: int, epoch: int, group: str, offsets: dict[tuple[str, int], int],
               generation: int = -1, member_id: str = "", metadata: str = "") -> dict[tuple[str, int], int]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset, "committed_leader_epoch": -1, "committed_metadata": metadata})
    answer = wire.call(TXN_OFFSET_COMMIT, version, {
        "transactional_id": transactional_id, "group_id": group, "producer_id": producer_id, "producer_epoch": epoch, "generation_id": generation,
        "member_id": member_id, "group_instance_id": None, "topics": [{"name": name, "partitions": partitions} for name, partitions in topics.items()],
    })
    return {(topic.name, int(p.partition_index)): int(p.error_code) for topic in answer.topics for p in topic.partitions}


def test_add_offsets_and_txn_offset_commit_answer_kafkas_errors(agent: RunningAgent, catalog: Catalog) -> None:
    wire = Wire(agent)
    try:
        joined = join(wire, 5, "g")
        member_id, generation = joined.member_id, int(joined.generation_id)
        synced = wire.call(SYNC, 5, {"group_id": "g", "generation_id": generation, "member_id": member_id, "group_instance_id": None,
                                     "protocol_type": "consumer", "protocol_name": "range", "assignments": [{"member_id": member_id, "assignment": b""}]})
        assert int(synced.error_code) == NONE
        producer_id, epoch = init(wire, "raw")
        offsets = {(SOURCE, 0): 4}

        assert txn_commit(wire, 3, "raw", producer_id, epoch, "g", offsets, generation, member_id) == {(SOURCE, 0): INVALID_TXN_STATE}  # no AddOffsetsToTxn
        assert add_offsets(wire, 3, "unknown", producer_id, epoch, "g") == INVALID_PRODUCER_ID_MAPPING
        assert add_offsets(wire, 1, "raw", producer_id, epoch + 1, "g") == INVALID_PRODUCER_EPOCH
        assert add_offsets(wire, 2, "raw", producer_id, epoch + 1, "g") == PRODUCER_FENCED
        assert add_offsets(wire, 0, "raw", producer_id, epoch, "g") == NONE
        assert catalog.describe_transactions(["raw"])["raw"][0].state == "Ongoing"  # the group began the transaction

        assert txn_commit(wire, 3, "raw", producer_id, epoch, "g", offsets, generation + 1, member_id) == {(SOURCE, 0): ILLEGAL_GENERATION}
        assert txn_commit(wire, 3, "raw", producer_id, epoch, "g", offsets, generation, "someone-else") == {(SOURCE, 0): UNKNOWN_MEMBER_ID}
        assert txn_commit(wire, 3, "raw", producer_id + 1, epoch, "g", offsets, generation, member_id) == {(SOURCE, 0): INVALID_PRODUCER_ID_MAPPING}
        assert txn_commit(wire, 3, "raw", producer_id, epoch + 1, "g", offsets, generation, member_id) == {(SOURCE, 0): INVALID_PRODUCER_EPOCH}
        assert txn_commit(wire, 3, "raw", producer_id, epoch, "other", offsets) == {(SOURCE, 0): INVALID_TXN_STATE}  # a group not added
        assert txn_commit(wire, 3, "raw", producer_id, epoch, "g", {(SOURCE, 0): 4, (SOURCE, 1): 1, ("no-such-topic", 0): 1}, generation, member_id) == {
            (SOURCE, 0): NONE, (SOURCE, 1): UNKNOWN_TOPIC_OR_PARTITION, ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
        assert txn_commit(wire, 3, "raw", producer_id, epoch, "g", {(SOURCE, 0): 6}, generation, member_id, metadata="m" * 4097) == {
            (SOURCE, 0): OFFSET_METADATA_TOO_LARGE}
        assert txn_commit(wire, 0, "raw", producer_id, epoch, "g", {(SOURCE, 0): 5}) == {(SOURCE, 0): NONE}  # v0-2 name no member
        assert committed(catalog, "g") == {}

        assert int(wire.call(END_TXN, 3, {"transactional_id": "raw", "producer_id": producer_id, "producer_epoch": epoch, "committed": True}).error_code) == NONE
        assert committed(catalog, "g") == {(SOURCE, 0): 5}
    finally:
        wire.close()


def test_kafka_python_sends_offsets_in_a_transaction(agent: RunningAgent, catalog: Catalog) -> None:
    producer = KafkaProducer(bootstrap_servers=agent.bootstrap, transactional_id="kafka-python-eos", linger_ms=5)
    try:
        producer.init_transactions()
        producer.begin_transaction()
        producer.send(SINK, key=b"k", value=b"v", partition=0)
        producer.send_offsets_to_transaction({KafkaTopicPartition(SOURCE, 0): OffsetAndMetadata(7, "", -1)}, "kp")
        assert committed(catalog, "kp") == {}
        producer.commit_transaction()
    finally:
        producer.close(5)
    assert committed(catalog, "kp") == {(SOURCE, 0): 7}


# -- the same requests to Apache Kafka's broker ------------------------------------------------------------------




def scripted_offsets(address: Address, topic: str, transactional_id: str, group: str) -> list[tuple[str, object]]:
    """One sequence of raw AddOffsetsToTxn, TxnOffsetCommit, OffsetFetch and EndTxn requests to `address` (an agent or
    a broker): every answer's error codes and offsets."""
    tid, seen = transactional_id, []
    with socket.create_connection((address.host, address.port), timeout=30) as connection:
        wire = Wire.over(connection)
        deadline = time.monotonic() + 60
        while True:  # a broker's coordinators load their partitions once asked for them
            wire.call(FIND_COORDINATOR, 3, {"key": tid, "key_type": 1})
            wire.call(FIND_COORDINATOR, 3, {"key": group, "key_type": 0})
            answer = wire.call(INIT_PRODUCER_ID, 4, {"transactional_id": tid, "transaction_timeout": 60_000, "producer_id": -1, "producer_epoch": -1})
            fetched = offset_fetch(wire, 8, [group], require_stable=False, topic=topic)[group]
            if (int(answer.error_code), fetched[1]) == (NONE, NONE) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        producer_id, epoch = int(answer.producer_id), int(answer.producer_epoch)
        offsets = {(topic, 0): 4}
        seen += [
            ("commit before add", _relative(txn_commit(wire, 3, tid, producer_id, epoch, group, offsets))),
            ("add other producer id", add_offsets(wire, 3, tid, producer_id + 100, epoch, group)),
            ("add fenced v1", add_offsets(wire, 1, tid, producer_id, epoch + 1, group)),
            ("add fenced v2", add_offsets(wire, 2, tid, producer_id, epoch + 1, group)),
            ("add", add_offsets(wire, 0, tid, producer_id, epoch, group)),
            ("commit fenced v3", _relative(txn_commit(wire, 3, tid, producer_id, epoch + 1, group, offsets))),
            ("commit fenced v0", _relative(txn_commit(wire, 0, tid, producer_id, epoch + 1, group, offsets))),
            ("commit unknown member", _relative(txn_commit(wire, 3, tid, producer_id, epoch, group, offsets, 1, "nobody"))),
            ("commit", _relative(txn_commit(wire, 3, tid, producer_id, epoch, group, offsets))),
            ("commit unknown partitions", _relative(txn_commit(wire, 2, tid, producer_id, epoch, group, {(topic, 5): 1, (topic + "-none", 0): 1}))),
            ("commit large metadata", _relative(txn_commit(wire, 3, tid, producer_id, epoch, group, offsets, metadata="m" * 4097))),
            ("fetch", offset_fetch(wire, 7, [group], require_stable=False, topic=topic)[group]),
            ("fetch stable", offset_fetch(wire, 8, [group], require_stable=True, topic=topic)[group]),
            ("end commit", int(wire.call(END_TXN, 3, {"transactional_id": tid, "producer_id": producer_id, "producer_epoch": epoch, "committed": True}).error_code)),
        ]
        until = time.monotonic() + 10  # a broker moves the offsets once its marker is written, after answering
        while (stable := offset_fetch(wire, 8, [group], require_stable=True, topic=topic)[group]) != (4, NONE) and time.monotonic() < until:
            time.sleep(0.1)
        seen.append(("fetch after the commit", stable))
    return seen


def _relative(found: dict[tuple[str, int], int]) -> list[tuple[tuple[bool, int], int]]:
    """Partitions by index, of the topic or of the one that does not exist (names differ)."""
    return sorted(((topic.endswith("-none"), partition), answer) for (topic, partition), answer in found.items())


def test_the_answers_are_apache_kafkas(agent: RunningAgent, kafka_broker: KafkaServer) -> None:
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    kafka_broker.create_topic(topic, 1)
    expected = scripted_offsets(Address(kafka_broker.host, kafka_broker.port), topic, f"t-{topic}", f"g-{topic}")
    assert scripted_offsets(agent.server.address, SOURCE, f"t-{topic}", f"g-{topic}") == expected


def test_each_api_is_served_by_its_coordinator(catalog: Catalog) -> None:
    """AddOffsetsToTxn by the transactional id's coordinator, TxnOffsetCommit by the group's: NOT_COORDINATOR elsewhere."""
    one, two = RunningAgent(catalog, flush_interval_ms=20), RunningAgent(catalog, flush_interval_ms=20)
    try:
        for running in (one, two):
            running.server.broker.agents.refresh()  # each sees the other now, not at its next heartbeat
        at_two = next(f"id-{n}" for n in range(100) if one.server.broker.agents.coordinator_for(f"id-{n}").node_id == two.server.broker.node_id)
        wire = Wire(one)
        try:
            assert add_offsets(wire, 3, at_two, 0, 0, "g") == NOT_COORDINATOR
            assert txn_commit(wire, 3, "t", 0, 0, at_two, {(SOURCE, 0): 1}) == {(SOURCE, 0): NOT_COORDINATOR}
        finally:
            wire.close()
    finally:
        one.stop()
        two.stop()


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)  # a row held alone: SQLite would hold every write
def test_a_txn_offset_commit_not_written_within_the_commit_timeout_is_answered_coordinator_not_available(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    """While another catalog transaction holds the transaction's row, its TxnOffsetCommit is answered
    COORDINATOR_NOT_AVAILABLE after offsets.commit.timeout.ms, as an OffsetCommit is; the client's retry is written."""
    timeout_ms = 500
    agent = RunningAgent(catalog, flush_interval_ms=20, offsets_commit_timeout_ms=timeout_ms)
    wire = Wire(agent)
    try:
        producer_id, epoch = init(wire, "held")
        assert add_offsets(wire, 3, "held", producer_id, epoch, "g") == NONE
        holder = catalog.engine.connect()
        holder.begin()
        rows = schema.transactions
        holder.execute(update(rows).where(rows.c.transactional_id == "held").values(updated_ms=rows.c.updated_ms))
        try:
            started = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="logcompact.kafka"):
                answer = txn_commit(wire, 3, "held", producer_id, epoch, "g", {(SOURCE, 0): 3})
            waited = time.monotonic() - started
            assert answer == {(SOURCE, 0): COORDINATOR_NOT_AVAILABLE}
            assert timeout_ms / 1000 <= waited < timeout_ms / 1000 + 3  # the bound, with room for a loaded machine
        finally:
            holder.close()  # rolls back: the row is free
        assert [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")] == [
            f"transactional offset commit of group 'g' not written within offsets.commit.timeout.ms ({timeout_ms} ms): answered "
            "COORDINATOR_NOT_AVAILABLE, the client commits again"]
        # the client's retry, of the same offsets: the write left running by the timeout may land before or after it
        assert txn_commit(wire, 3, "held", producer_id, epoch, "g", {(SOURCE, 0): 3}) == {(SOURCE, 0): NONE}
        assert int(wire.call(END_TXN, 3, {"transactional_id": "held", "producer_id": producer_id, "producer_epoch": epoch, "committed": True}).error_code) == NONE
        assert committed(catalog, "g") == {(SOURCE, 0): 3}
    finally:
        wire.close()
        agent.stop()
