"""Idempotent producers through `logcompact agent`: InitProducerId and Produce's sequence checks.

Real clients with idempotence on (confluent-kafka with every codec, kafka-python 3 by its default, aiokafka), raw
requests for the checks themselves (a retried batch, a gap, a stale epoch, an unknown producer id, a producer that
moved agents), and the state in the catalog surviving an agent's stop and a `kill -9` during acks=all produce.
"""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import time
from collections.abc import Sequence
from typing import Any

import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Producer
from kafka import KafkaProducer
from kafka.record.default_records import DefaultRecordBatchBuilder
from sqlalchemy import select

from logcompact.catalog import Catalog
from logcompact.catalog import schema as s
from logcompact.catalog.catalog import PRODUCER_EXPIRY_EVERY_MS
from logcompact.catalog.producers import EXPIRATION_MS, SequencedBatch
from logcompact.ingest import Agent, Record
from tests.helpers import create_topic
from tests.kafka.agents import FLUSH_MS, RunningAgent, start_agent_process, stored
from tests.kafka.wire import CODECS, TIMESTAMP, kio_exchange, produce, produce_request, produce_response, receive_frame, value

pytestmark = pytest.mark.timeout(90)

# Kafka's error codes
NONE, INVALID_REQUEST, KAFKA_STORAGE_ERROR = 0, 42, 56
OUT_OF_ORDER_SEQUENCE_NUMBER, INVALID_PRODUCER_EPOCH, INVALID_PRODUCER_ID_MAPPING, TRANSACTIONAL_ID_AUTHORIZATION_FAILED, UNKNOWN_PRODUCER_ID = 45, 47, 49, 53, 59
IDEMPOTENT_LIBRDKAFKA = {"enable.idempotence": True, "acks": "all", "linger.ms": 5}


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy="compact")
    return catalog


def init_producer_id(agent: RunningAgent, version: int = 4, transactional_id: str | None = None, producer_id: int = -1, epoch: int = -1) -> Any:
    return kio_exchange(agent.server, 22, version, {
        "transactional_id": transactional_id, "transaction_timeout": 60_000, "producer_id": producer_id, "producer_epoch": epoch,
    })


def sequenced_batch(producer_id: int, epoch: int, first_sequence: int, values: list[bytes]) -> bytes:
    """A record batch as an idempotent producer sends it: keyed records, its producer id, epoch and base sequence."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=first_sequence, batch_size=1 << 20)
    for index, record_value in enumerate(values):
        builder.append(index, timestamp=TIMESTAMP + index, key=b"k-" + record_value, value=record_value, headers=[])
    return bytes(builder.build())


def answer(agent: RunningAgent, batch: bytes, topic: str = "orders", partition: int = 0) -> tuple[int, int]:
    """(error code, base offset) of a Produce v9 of one batch."""
    answered = produce(agent, {(topic, partition): batch})[(topic, partition)]
    return int(answered.error_code), int(answered.base_offset)


def values_of(catalog: Catalog, topic: str = "orders", partition: int = 0) -> list[bytes | None]:
    return [record.value for record in stored(catalog, topic, partition)]


def producer_rows(catalog: Catalog) -> list[tuple]:
    pb = s.producer_batches.c
    with catalog.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(select(pb.producer_id, pb.topic_id, pb.partition, pb.epoch, pb.batches))]


# -- InitProducerId ----------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(5))
def test_init_producer_id_hands_out_a_new_id_at_epoch_0_for_every_version(agent: RunningAgent, version: int) -> None:
    first, second = init_producer_id(agent, version), init_producer_id(agent, version)
    assert [(int(r.error_code), int(r.producer_epoch)) for r in (first, second)] == [(NONE, 0), (NONE, 0)]
    assert int(first.producer_id) >= 0 and int(second.producer_id) > int(first.producer_id)


def test_init_producer_id_with_the_producers_id_and_epoch_gives_a_new_id_as_kafka(agent: RunningAgent) -> None:
    # Kafka's coordinator ignores them without a transactional id (KIP-360's bump is the client's own for idempotence)
    first = init_producer_id(agent)
    bumped = init_producer_id(agent, 4, None, int(first.producer_id), int(first.producer_epoch))
    assert (int(bumped.error_code), int(bumped.producer_epoch)) == (NONE, 0)
    assert int(bumped.producer_id) > int(first.producer_id)


def test_init_producer_id_refuses_an_empty_transactional_id(agent: RunningAgent) -> None:
    refused = init_producer_id(agent, 4, "")
    assert (int(refused.error_code), int(refused.producer_id), int(refused.producer_epoch)) == (INVALID_REQUEST, -1, -1)


# -- real clients -------------------------------------------------------------------------------------


@pytest.mark.parametrize("codec", list(CODECS))
def test_confluent_kafka_idempotent_producer_writes_each_record_once(agent: RunningAgent, catalog: Catalog, codec: str) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, **IDEMPOTENT_LIBRDKAFKA, "compression.type": codec})
    delivered: list[tuple[int, int]] = []
    for i in range(200):
        producer.produce("orders", key=b"k%d" % i, value=value("v", i), partition=i % 2,
                         on_delivery=lambda error, message: delivered.append((message.partition(), message.offset())) if error is None else None)
        if i % 50 == 49:
            producer.poll(0)
    assert producer.flush(20) == 0
    assert sorted(delivered) == [(p, o) for p in (0, 1) for o in range(100)]
    for partition in (0, 1):
        assert values_of(catalog, "orders", partition) == [value("v", i) for i in range(partition, 200, 2)]
    rows = producer_rows(catalog)
    assert {(row[2], row[3]) for row in rows} == {(0, 0), (1, 0)}  # one producer, its state on both partitions, epoch 0
    assert len({row[0] for row in rows}) == 1


def test_a_failed_file_is_retried_by_the_idempotent_producer_and_written_once(agent: RunningAgent, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    put_parts, puts = catalog.store.put_parts, []

    def second_put_fails(key: str, parts: Sequence[Any]) -> None:
        puts.append(key)
        if len(puts) == 2:
            raise OSError("disk full, once")
        put_parts(key, parts)

    monkeypatch.setattr(catalog.store, "put_parts", second_put_fails)
    producer = Producer({"bootstrap.servers": agent.bootstrap, **IDEMPOTENT_LIBRDKAFKA, "retry.backoff.ms": 20})
    errors: list[Any] = []
    for i in range(600):
        producer.produce("orders", key=b"k%d" % i, value=b"v%d" % i, partition=0, on_delivery=lambda error, _: errors.append(error) if error else None)
        if i == 0:
            assert producer.flush(10) == 0  # the first file, once the producer has its id
        elif i % 20 == 0:
            producer.poll(0.02)
    assert producer.flush(20) == 0
    assert errors == [] and len(puts) > 3
    # the failed file's batches were answered with a retriable error and sent again: every record once, in order
    assert values_of(catalog) == [b"v%d" % i for i in range(600)]


def test_kafka_python_produces_with_its_default_idempotence(agent: RunningAgent, catalog: Catalog) -> None:
    producer = KafkaProducer(bootstrap_servers=agent.bootstrap, linger_ms=5)  # enable_idempotence defaults to True
    try:
        assert producer.config["enable_idempotence"] is True
        offsets = [producer.send("orders", key=b"k%d" % i, value=value("v", i), partition=1).get(timeout=15).offset for i in range(5)]
    finally:
        producer.close(timeout=5)
    assert offsets == [0, 1, 2, 3, 4]
    assert values_of(catalog, "orders", 1) == [value("v", i) for i in range(5)]
    assert [(row[2], row[3], [batch[:2] for batch in json.loads(row[4])][-1][1]) for row in producer_rows(catalog)] == [(1, 0, 4)]


def test_aiokafka_idempotent_producer(agent: RunningAgent, catalog: Catalog) -> None:
    async def send() -> list[int]:
        producer = AIOKafkaProducer(bootstrap_servers=agent.bootstrap, enable_idempotence=True, linger_ms=5)
        await producer.start()
        try:
            sent = [await producer.send("orders", key=b"k%d" % i, value=value("v", i), partition=0) for i in range(6)]
            return [(await future).offset for future in sent]
        finally:
            await producer.stop()

    assert asyncio.run(send()) == list(range(6))
    assert values_of(catalog) == [value("v", i) for i in range(6)]
    assert len(producer_rows(catalog)) == 1


# -- the sequence checks, on raw requests --------------------------------------------------------------


def test_a_retried_batch_is_stored_once_and_answered_with_its_first_offset(agent: RunningAgent, catalog: Catalog) -> None:
    producer_id = int(init_producer_id(agent).producer_id)
    assert answer(agent, sequenced_batch(producer_id, 0, 0, [b"a", b"b"])) == (NONE, 0)
    retry = sequenced_batch(producer_id, 0, 2, [b"c"])
    # sent twice on one connection before the first is committed: the second waits for the original's offsets
    with socket.create_connection((agent.server.address.host, agent.server.address.port), timeout=10) as connection:
        connection.sendall(produce_request(9, 1, {("orders", 0): retry}) + produce_request(9, 2, {("orders", 0): retry}))
        answers = [produce_response(receive_frame(connection), 9) for _ in range(2)]
    assert [(correlation, int(p[("orders", 0)].error_code), int(p[("orders", 0)].base_offset)) for correlation, p in answers] == [(1, NONE, 2), (2, NONE, 2)]
    # and again once committed, the first batch too: answered from the kept batches, nothing written
    assert answer(agent, retry) == (NONE, 2)
    assert answer(agent, sequenced_batch(producer_id, 0, 0, [b"a", b"b"])) == (NONE, 0)
    assert values_of(catalog) == [b"a", b"b", b"c"]
    assert answer(agent, sequenced_batch(producer_id, 0, 3, [b"d"])) == (NONE, 3)


def test_a_sequence_gap_is_out_of_order_and_writes_nothing(agent: RunningAgent, catalog: Catalog) -> None:
    producer_id = int(init_producer_id(agent).producer_id)
    assert answer(agent, sequenced_batch(producer_id, 0, 0, [b"a"])) == (NONE, 0)
    assert answer(agent, sequenced_batch(producer_id, 0, 2, [b"gap"])) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    # older than the 5 batches kept: not a retry Kafka can recognise, out of order too
    for sequence in range(1, 7):
        assert answer(agent, sequenced_batch(producer_id, 0, sequence, [b"n%d" % sequence])) == (NONE, sequence)
    assert answer(agent, sequenced_batch(producer_id, 0, 0, [b"a"])) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert values_of(catalog) == [b"a"] + [b"n%d" % s for s in range(1, 7)]


def test_batches_following_a_failed_file_are_not_written_and_their_retries_are(agent: RunningAgent, catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    put_parts, puts = catalog.store.put_parts, []

    def second_put_fails_slowly(key: str, parts: Sequence[Any]) -> None:
        puts.append(key)
        if len(puts) == 2:
            time.sleep(0.5)  # the next batch is accepted meanwhile, following this file's
            raise OSError("disk full, once")
        put_parts(key, parts)

    monkeypatch.setattr(catalog.store, "put_parts", second_put_fails_slowly)
    producer_id = int(init_producer_id(agent).producer_id)
    assert answer(agent, sequenced_batch(producer_id, 0, 0, [b"a"])) == (NONE, 0)
    address = (agent.server.address.host, agent.server.address.port)
    with socket.create_connection(address, timeout=10) as first, socket.create_connection(address, timeout=10) as second:
        first.sendall(produce_request(9, 1, {("orders", 0): sequenced_batch(producer_id, 0, 1, [b"b"])}))
        time.sleep(0.25)  # its file is being written
        second.sendall(produce_request(9, 2, {("orders", 0): sequenced_batch(producer_id, 0, 2, [b"c"])}))
        answers = [produce_response(receive_frame(connection), 9)[1][("orders", 0)] for connection in (first, second)]
    assert [(int(a.error_code), int(a.base_offset)) for a in answers] == [(KAFKA_STORAGE_ERROR, -1), (KAFKA_STORAGE_ERROR, -1)]
    assert len(puts) == 2 and values_of(catalog) == [b"a"]  # the second batch was not written over the gap
    assert answer(agent, sequenced_batch(producer_id, 0, 1, [b"b"])) == (NONE, 1)
    assert answer(agent, sequenced_batch(producer_id, 0, 2, [b"c"])) == (NONE, 2)
    assert values_of(catalog) == [b"a", b"b", b"c"]


def test_sequences_wrap_past_2_31_minus_1_to_0(agent: RunningAgent, catalog: Catalog) -> None:
    producer_id, top = int(init_producer_id(agent).producer_id), 2**31 - 1
    # a producer's first batch on a partition may start anywhere: this one ends at sequence 0
    assert answer(agent, sequenced_batch(producer_id, 0, top - 1, [b"a", b"b", b"c"])) == (NONE, 0)
    assert answer(agent, sequenced_batch(producer_id, 0, top - 1, [b"a", b"b", b"c"])) == (NONE, 0)  # its retry
    assert answer(agent, sequenced_batch(producer_id, 0, top, [b"x"])) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert answer(agent, sequenced_batch(producer_id, 0, 1, [b"d"])) == (NONE, 3)
    assert values_of(catalog) == [b"a", b"b", b"c", b"d"]


def test_epochs_unknown_producers_and_transactional_batches(agent: RunningAgent, catalog: Catalog) -> None:
    producer_id = int(init_producer_id(agent).producer_id)
    assert answer(agent, sequenced_batch(producer_id, 0, 0, [b"a"])) == (NONE, 0)
    # a bumped epoch (the client's own, after an error) starts at 0; later, the old epoch is refused
    assert answer(agent, sequenced_batch(producer_id, 1, 3, [b"x"])) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
    assert answer(agent, sequenced_batch(producer_id, 1, 0, [b"b"])) == (NONE, 1)
    assert answer(agent, sequenced_batch(producer_id, 0, 1, [b"stale"])) == (INVALID_PRODUCER_EPOCH, -1)
    # a producer id never handed out
    assert answer(agent, sequenced_batch(producer_id + 1000, 0, 0, [b"who"])) == (UNKNOWN_PRODUCER_ID, -1)
    # a producer's first batch on a partition may start at any sequence, as in Kafka (its state there expired)
    assert answer(agent, sequenced_batch(producer_id, 1, 40, [b"other"]), partition=1) == (NONE, 0)
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
                                        producer_epoch=1, base_sequence=1, batch_size=1 << 20)
    builder.append(0, timestamp=TIMESTAMP, key=b"k", value=b"t", headers=[])
    transactional = bytes(builder.build())
    assert answer(agent, transactional) == (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)  # a Produce without a transactional id, as Kafka
    answered = produce(agent, {("orders", 0): transactional}, transactional_id="payments")[("orders", 0)]
    assert int(answered.error_code) == INVALID_PRODUCER_ID_MAPPING  # no transactional id holds the producer id
    assert values_of(catalog) == [b"a", b"b"]
    assert values_of(catalog, "orders", 1) == [b"other"]


def test_state_survives_an_agent_restart(catalog: Catalog) -> None:
    first = RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        producer_id = int(init_producer_id(first).producer_id)
        last = sequenced_batch(producer_id, 0, 1, [b"b", b"c"])
        assert answer(first, sequenced_batch(producer_id, 0, 0, [b"a"])) == (NONE, 0)
        assert answer(first, last) == (NONE, 1)
    finally:
        first.stop()
    second = RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        assert answer(second, last) == (NONE, 1)  # deduplicated from the catalog's state
        assert answer(second, sequenced_batch(producer_id, 0, 2, [b"gap"])) == (OUT_OF_ORDER_SEQUENCE_NUMBER, -1)
        assert answer(second, sequenced_batch(producer_id, 0, 3, [b"d"])) == (NONE, 3)
    finally:
        second.stop()
    assert values_of(catalog) == [b"a", b"b", b"c", b"d"]


def test_a_producer_moving_between_agents_is_checked_against_the_catalog(catalog: Catalog) -> None:
    one, two = RunningAgent(catalog, flush_interval_ms=FLUSH_MS), RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        producer_id = int(init_producer_id(one).producer_id)
        assert answer(one, sequenced_batch(producer_id, 0, 0, [b"a"])) == (NONE, 0)
        moved = sequenced_batch(producer_id, 0, 1, [b"b"])
        assert answer(two, moved) == (NONE, 1)
        # back on the first agent: its view (last sequence 0) takes the retry of sequence 1 as new, and its append
        # finds the catalog past what it assumed: refused whole, retriable, nothing written
        assert answer(one, moved) == (KAFKA_STORAGE_ERROR, -1)
        assert values_of(catalog) == [b"a", b"b"]
        # the retry is checked against the catalog again: the batch the other agent wrote
        assert answer(one, moved) == (NONE, 1)
        # a sequence ahead of a stale view is read again from the catalog before it is refused
        assert answer(two, sequenced_batch(producer_id, 0, 2, [b"c"])) == (NONE, 2)
        assert answer(one, sequenced_batch(producer_id, 0, 3, [b"d"])) == (NONE, 3)
    finally:
        one.stop()
        two.stop()
    assert values_of(catalog) == [b"a", b"b", b"c", b"d"]


# -- kill -9 --------------------------------------------------------------------------------------------


def test_kill_9_during_idempotent_acks_all_produce_loses_and_repeats_nothing(catalog: Catalog) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = start_agent_process(catalog, port, flush_ms=50)
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{port}", **IDEMPOTENT_LIBRDKAFKA, "message.timeout.ms": 60_000,
                         "retry.backoff.ms": 50, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 200})
    acked: dict[bytes, tuple[int, int]] = {}
    failed: list[Any] = []

    def delivered(error: Any, message: Any) -> None:
        if error is None:
            acked[message.value()] = (message.partition(), message.offset())
        else:
            failed.append(error)

    count, kill_when_acked = 4000, [800, 2600]  # twice, each time with batches in flight and being committed
    sent, deadline = 0, time.monotonic() + 60
    try:
        while (sent < count or kill_when_acked) and time.monotonic() < deadline:
            if sent < count:
                producer.produce("orders", key=b"k%d" % sent, value=b"v%d" % sent, partition=sent % 2, on_delivery=delivered)
                sent += 1
            if sent % 20 == 0:
                producer.poll(0.02)  # about 1000 records a second: acks arrive while records are sent
            if kill_when_acked and len(acked) >= kill_when_acked[0]:
                kill_when_acked.pop(0)
                agent.send_signal(signal.SIGKILL)
                agent.wait()
                agent = start_agent_process(catalog, port, flush_ms=50)
        assert not kill_when_acked
        assert producer.flush(60) == 0
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=15)
    assert failed == []
    assert len(acked) == count
    records = {partition: stored(catalog, "orders", partition) for partition in (0, 1)}
    values = [record.value for partition in (0, 1) for record in records[partition]]
    assert len(values) == len(set(values)) == count  # every record once: no retry stored twice
    for partition in (0, 1):
        for record in records[partition]:
            assert acked[record.value] == (partition, record.offset)


def test_idle_producer_state_expires_after_a_day_during_appends(catalog: Catalog) -> None:
    now = TIMESTAMP
    idle, written, newest = (catalog.allocate_producer_id(now) for _ in range(3))
    for at, producer_id in ((now, written), (now + EXPIRATION_MS + PRODUCER_EXPIRY_EVERY_MS, newest)):
        agent = Agent(catalog, background=False, clock=lambda at=at: at)
        agent.produce("orders", [Record(0, b"k", b"v", at)], SequencedBatch(producer_id, 0, 0, 0, None))
        agent.close()
    # the second append dropped the state written a day before it, then the ids with none left, but the newest
    assert [(row[0], row[2]) for row in producer_rows(catalog)] == [(newest, 0)]
    with catalog.engine.connect() as connection:
        assert list(connection.execute(select(s.producers.c.producer_id)).scalars()) == [newest]
    assert idle < written < newest
