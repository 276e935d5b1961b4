"""Transactions through `logcompact agent`: the coordinator (InitProducerId with a transactional id,
FindCoordinator for it, AddPartitionsToTxn, EndTxn) and transactional produce.

Real clients (confluent-kafka, kafka-python, aiokafka) commit and abort; a read_uncommitted consumer sees every
record at the offsets Kafka gives (a marker takes an offset in each partition of the transaction: librdkafka's mock
cluster gives the same offsets for the same calls), and Fetch's last stable offset stops at an open transaction's
first offset. Fencing by a second producer of the same transactional.id as each client reports it, the abort of a
transaction left open past its timeout and the expiry of idle ids (the agent's sweeps and options), Kafka's errors
of each API (a catalog out of reach included), the coordinator among two agents, the ingest thread's views of
transactions, and a batch whose transaction ended before its append. The same raw requests to Apache Kafka's broker
(lab.servers.kafka) get the same answers, offsets and watermarks as from the agent.
"""

from __future__ import annotations

import asyncio
import json
import logging
import logging.handlers
import queue
import re
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from typing import Any

import aiokafka.errors
import kafka.errors
import pytest
from aiokafka import AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from kafka import KafkaProducer
from kafka.record.default_records import DefaultRecordBatchBuilder

from lab.servers.kafka import KafkaServer
from logcompact.catalog import Catalog
from logcompact.exceptions import CatalogUnavailableError
from logcompact.kafka.cluster import Address
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment, confluent_consumer, consume, eventually
from tests.kafka.wire import TIMESTAMP, Wire, produce_request, produce_response, receive_frame, record_batch

pytestmark = pytest.mark.timeout(120)

TOPIC = "state"
# Kafka's error codes
NONE, UNKNOWN_TOPIC_OR_PARTITION, COORDINATOR_NOT_AVAILABLE, COORDINATOR_LOAD_IN_PROGRESS, NOT_COORDINATOR, INVALID_REQUEST = 0, 3, 15, 14, 16, 42
INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE, INVALID_PRODUCER_ID_MAPPING, INVALID_TRANSACTION_TIMEOUT, CONCURRENT_TRANSACTIONS = 47, 48, 49, 50, 51
TRANSACTIONAL_ID_AUTHORIZATION_FAILED, OPERATION_NOT_ATTEMPTED, PRODUCER_FENCED = 53, 55, 90
INIT_PRODUCER_ID, FIND_COORDINATOR, ADD_PARTITIONS_TO_TXN, END_TXN, FETCH = 22, 10, 24, 26, 1


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, TOPIC, 2, cleanup_policy="compact")
    return catalog


def transactional(agent: RunningAgent, transactional_id: str, **config: Any) -> Producer:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **FAST_CLIENT, **config})
    producer.init_transactions(20)
    return producer


def send(producer: Producer, values: list[bytes], partition: int = 0) -> None:
    for value in values:
        producer.produce(TOPIC, key=b"k-" + value, value=value, partition=partition)


def read_uncommitted(agent: RunningAgent, count: int, partition: int = 0) -> list[tuple[int, bytes]]:
    consumer = confluent_consumer(agent, **{"isolation.level": "read_uncommitted"})
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0)])
        return [(message.offset(), message.value()) for message in consume(consumer, count)]
    finally:
        consumer.close()


def read_committed(agent: RunningAgent, partition: int) -> list[tuple[int, bytes]]:
    """What a read_committed consumer reads of a partition up to its end."""
    consumer = confluent_consumer(agent, **{"isolation.level": "read_committed"})
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0)])
        return [(message.offset(), message.value()) for message in consume(consumer, 0)]
    finally:
        consumer.close()


def watermarks(agent: RunningAgent, partition: int = 0) -> tuple[int, int]:
    """(high watermark, last stable offset) of a partition, as a Fetch v12 answers them."""
    return fetch_watermarks(agent.server.address, TOPIC, partition)


def fetch_watermarks(address: Address, topic: str, partition: int) -> tuple[int, int]:
    """(high watermark, last stable offset) of a partition, as a Fetch v12 to `address` (an agent or a broker)
    answers them."""
    body = {
        "cluster_id": None, "replica_id": -1, "replica_state": None, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0,
        "session_id": 0, "session_epoch": -1, "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{"partition": partition, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                                                    "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [],
    }
    with socket.create_connection((address.host, address.port), timeout=20) as connection:
        found = Wire.over(connection).call(FETCH, 12, body).responses[0].partitions[0]
    return int(found.high_watermark), int(found.last_stable_offset)


def fatal(error: KafkaException) -> tuple[bool, int]:
    found = error.args[0]
    return found.fatal(), found.code()


# -- real clients ------------------------------------------------------------------------------------------


def commit_abort_commit(producer: Producer, bootstrap: Callable[[], str]) -> tuple[list[tuple[int, bytes]], int]:
    """Three transactions of 3 records each into partition 0, committed, aborted, committed: each record's offset
    as delivered, and the partition's high watermark then (read from `bootstrap()`)."""
    delivered: list[tuple[int, bytes]] = []
    for outcome, values in (("commit", [b"a", b"b", b"c"]), ("abort", [b"x", b"y", b"z"]), ("commit", [b"d", b"e", b"f"])):
        producer.begin_transaction()
        for value in values:
            producer.produce(TOPIC, key=b"k-" + value, value=value, partition=0,
                             on_delivery=lambda error, message: delivered.append((message.offset(), message.value())) if error is None else None)
        assert producer.flush(20) == 0
        if outcome == "commit":
            producer.commit_transaction(20)
        else:
            producer.abort_transaction(20)
    consumer = Consumer({"bootstrap.servers": bootstrap(), "group.id": "watermarks", **FAST_CLIENT})
    try:
        _, high = consumer.get_watermark_offsets(TopicPartition(TOPIC, 0), timeout=10)
    finally:
        consumer.close()
    return delivered, high


def test_confluent_kafka_commits_aborts_and_commits_at_the_offsets_of_librdkafkas_mock_cluster(agent: RunningAgent) -> None:
    # the reference: librdkafka's mock cluster given the same calls (it serves transactions as Kafka's brokers do,
    # a marker taking an offset in each partition of the transaction)
    mock_log: queue.Queue[logging.LogRecord] = queue.Queue()
    logger = logging.getLogger("tests.mock_cluster")  # librdkafka's log, which names the mock cluster's address
    logger.setLevel(logging.INFO)
    logger.propagate = False
    logger.handlers = [logging.handlers.QueueHandler(mock_log)]
    mock = Producer({"test.mock.num.brokers": 1, "transactional.id": "copier-1", "linger.ms": 5, "logger": logger})
    mock.init_transactions(20)

    def mock_bootstrap() -> str:
        while True:
            found = re.search(r"Mock cluster enabled: .* replaced with (\S+)", mock_log.get(timeout=10).getMessage())
            if found:
                return found.group(1)

    expected = commit_abort_commit(mock, mock_bootstrap)
    assert expected == ([(0, b"a"), (1, b"b"), (2, b"c"), (4, b"x"), (5, b"y"), (6, b"z"), (8, b"d"), (9, b"e"), (10, b"f")], 12)
    assert commit_abort_commit(transactional(agent, "copier-1"), lambda: agent.bootstrap) == expected
    # records at 0-2, 4-6 and 8-10, a marker at 3, 7 and 11; a read_uncommitted consumer sees every record
    assert read_uncommitted(agent, 9) == expected[0]
    assert watermarks(agent) == (12, 12)
    assert watermarks(agent, 1) == (0, 0)  # never in a transaction: no marker


def test_batches_after_an_add_partitions_on_their_agent_read_nothing_of_their_transaction(
    agent: RunningAgent, catalog: Catalog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The coordinator tells the ingest thread's views of the partitions it added: the common case, a producer's
    coordinator and partition leader one agent, checks every batch without a catalog read."""
    reads: list[int] = []
    read = catalog.transaction_view
    monkeypatch.setattr(catalog, "transaction_view", lambda producer_id: reads.append(producer_id) or read(producer_id))
    producer = transactional(agent, "local-1")
    for round_ in range(3):
        producer.begin_transaction()
        send(producer, [b"a%d" % round_, b"b%d" % round_], partition=round_ % 2)
        producer.commit_transaction(20)
    assert reads == []
    assert watermarks(agent, 0) == (6, 6) and watermarks(agent, 1) == (3, 3)


def test_the_last_stable_offset_stops_at_an_open_transactions_first_offset(agent: RunningAgent) -> None:
    plain = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    plain.produce(TOPIC, key=b"k", value=b"before", partition=0)
    assert plain.flush(20) == 0
    producer = transactional(agent, "open-1")
    producer.begin_transaction()
    send(producer, [b"a", b"b"])
    assert producer.flush(20) == 0
    plain.produce(TOPIC, key=b"k", value=b"after", partition=0)
    assert plain.flush(20) == 0
    assert watermarks(agent) == (4, 1)
    producer.commit_transaction(20)
    assert watermarks(agent) == (5, 5)


def test_a_second_producer_of_the_transactional_id_fences_the_first(agent: RunningAgent, caplog: pytest.LogCaptureFixture) -> None:
    first = transactional(agent, "fenced-1")
    first.begin_transaction()
    send(first, [b"zombie"])
    assert first.flush(20) == 0
    assert watermarks(agent) == (1, 0)
    with caplog.at_level(logging.INFO, logger="logcompact.kafka.transaction_coordinator"):
        second = transactional(agent, "fenced-1")
    assert any("transaction 'fenced-1' aborted" in message and "fenced" in message for message in caplog.messages)
    assert watermarks(agent) == (2, 2)  # the first's transaction aborted: its marker at 1
    send(first, [b"late"])  # its Produce is refused INVALID_PRODUCER_EPOCH, which librdkafka reports as fenced, fatal
    with pytest.raises(KafkaException) as refused:
        first.flush(10)
        first.commit_transaction(10)
    assert fatal(refused.value) == (True, KafkaError._FENCED)
    second.begin_transaction()
    send(second, [b"next"])
    second.commit_transaction(20)
    # fenced between transactions: its next one's AddPartitionsToTxn (v0: INVALID_PRODUCER_EPOCH) fails it, fatal
    third = transactional(agent, "fenced-1")
    second.begin_transaction()
    send(second, [b"never"])
    with pytest.raises(KafkaException) as refused:
        second.flush(10)
        second.commit_transaction(10)
    assert fatal(refused.value) == (True, KafkaError._FENCED)
    third.begin_transaction()
    send(third, [b"last"])
    third.commit_transaction(20)
    assert [value for _, value in read_uncommitted(agent, 3)] == [b"zombie", b"next", b"last"]
    assert watermarks(agent) == (6, 6)  # zombie, its abort's marker, next, its commit's marker, last, its commit's marker


def test_kafka_python_and_aiokafka_producers_fenced_by_a_newer_one_fail(agent: RunningAgent) -> None:
    """kafka-python sends InitProducerId v4 and the others v3 (PRODUCER_FENCED), aiokafka v0 of each
    (INVALID_PRODUCER_EPOCH): each reports its fenced producer's next transaction as fenced."""
    old = KafkaProducer(bootstrap_servers=agent.bootstrap, transactional_id="kp-fenced", linger_ms=5)
    try:
        old.init_transactions()
        transactional(agent, "kp-fenced")
        old.begin_transaction()
        old.send(TOPIC, key=b"k", value=b"zombie", partition=0)
        with pytest.raises(kafka.errors.ProducerFencedError):
            old.commit_transaction()
    finally:
        old.close(5)

    async def run() -> None:
        zombie = AIOKafkaProducer(bootstrap_servers=agent.bootstrap, transactional_id="aio-fenced", linger_ms=5)
        await zombie.start()
        try:
            transactional(agent, "aio-fenced")
            with pytest.raises(aiokafka.errors.ProducerFenced):
                async with zombie.transaction():
                    await zombie.send_and_wait(TOPIC, b"zombie", key=b"k", partition=0)
        finally:
            await zombie.stop()

    asyncio.run(run())
    assert watermarks(agent) == (0, 0)  # nothing of either written


def test_a_transaction_failing_a_batch_is_aborted_by_its_producer_which_goes_on(agent: RunningAgent) -> None:
    producer = transactional(agent, "abortable-1")
    producer.begin_transaction()
    failed: list[KafkaError | None] = []
    producer.produce(TOPIC, key=b"k", value=b"a", partition=0, on_delivery=lambda error, _: failed.append(error))
    producer.produce(TOPIC, key=None, value=b"keyless", partition=1, on_delivery=lambda error, _: failed.append(error))  # a compacted topic
    producer.flush(20)
    assert sorted(str(None if error is None else error.code()) for error in failed) == sorted(["None", str(KafkaError.INVALID_RECORD)])
    with pytest.raises(KafkaException) as refused:
        producer.commit_transaction(20)
    assert refused.value.args[0].txn_requires_abort() and not refused.value.args[0].fatal()
    producer.abort_transaction(20)
    producer.begin_transaction()
    send(producer, [b"b"])
    producer.commit_transaction(20)
    assert read_uncommitted(agent, 2) == [(0, b"a"), (2, b"b")]  # the abort's marker at 1, the commit's at 3
    assert watermarks(agent) == (4, 4)
    assert watermarks(agent, 1) == (1, 1)  # added to the aborted transaction, nothing written: its marker at 0


def test_a_transaction_open_past_its_timeout_is_aborted_by_the_agent(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    agent = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, transaction_abort_timed_out_transaction_cleanup_interval_ms=200)
    try:
        producer = transactional(agent, "slow-1", **{"transaction.timeout.ms": 1000, "socket.timeout.ms": 1000})
        producer.begin_transaction()
        send(producer, [b"a", b"b"])
        assert producer.flush(20) == 0
        assert watermarks(agent) == (2, 0)
        with caplog.at_level(logging.INFO, logger="logcompact.kafka.transaction_coordinator"):
            # The sweep logs after its abort returns: wait for the log, or it is missed by a moment.
            assert eventually(lambda: any("transaction 'slow-1' aborted" in message and "past its timeout 1000 ms" in message
                                          for message in caplog.messages), 15)
        assert watermarks(agent) == (3, 3)  # aborted: its marker at 2, nothing held
        with pytest.raises(KafkaException) as refused:
            producer.commit_transaction(10)
        assert refused.value.args[0].code() in (KafkaError._FENCED, KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.PRODUCER_FENCED)
    finally:
        agent.stop()


def test_transactional_ids_unused_past_their_expiration_are_forgotten(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    agent = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, transactional_id_expiration_ms=500,
                         transaction_remove_expired_transaction_cleanup_interval_ms=200)
    try:
        wire = Wire(agent)
        try:
            _, producer_id, epoch = init(wire, "idle-1")
            assert add(wire, "idle-1", producer_id, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}
            time.sleep(1)
            assert set(catalog.describe_transactions(["idle-1"])) == {"idle-1"}  # open: kept, however long
            assert end(wire, "idle-1", producer_id, epoch, True) == NONE
            with caplog.at_level(logging.INFO, logger="logcompact.kafka.transaction_coordinator"):
                # The sweep logs after its commit returns: wait for the log, or it is missed by a moment.
                assert eventually(lambda: any("transactional ids forgotten" in message for message in caplog.messages), 15)
            assert catalog.describe_transactions(["idle-1"]) == {}
            assert end(wire, "idle-1", producer_id, epoch, True) == INVALID_PRODUCER_ID_MAPPING
            assert init(wire, "idle-1")[2] == 0  # a new producer of the id starts afresh
        finally:
            wire.close()
    finally:
        agent.stop()


def test_the_agent_command_takes_the_transaction_settings(catalog: Catalog) -> None:
    command = [sys.executable, "-m", "logcompact", "--verbose", "agent", "--listen", "127.0.0.1:0", "--transaction-max-timeout-ms", "5000",
               "--transaction-abort-timed-out-transaction-cleanup-interval-ms", "200", "--transactional-id-expiration-ms", "1000",
               "--transaction-remove-expired-transaction-cleanup-interval-ms", "200"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None and process.stderr is not None
        host, port = json.loads(process.stdout.readline())["listening"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as connection:
            wire = Wire.over(connection)
            assert init(wire, "cli-1", timeout_ms=5001)[0] == INVALID_TRANSACTION_TIMEOUT
            _, producer_id, epoch = init(wire, "cli-1", timeout_ms=500)
            assert add(wire, "cli-1", producer_id, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}
            deadline = time.monotonic() + 15  # aborted past its timeout, then forgotten past the expiration
            while catalog.describe_transactions(["cli-1"]) and time.monotonic() < deadline:
                time.sleep(0.1)
            assert catalog.describe_transactions(["cli-1"]) == {}
        process.terminate()
        assert process.wait(timeout=15) == 0
        errors = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "transaction 'cli-1' aborted" in errors and "past its timeout 500 ms" in errors and "1 transactional ids forgotten" in errors, errors


def test_kafka_python_commits_and_aborts(agent: RunningAgent) -> None:
    producer = KafkaProducer(bootstrap_servers=agent.bootstrap, transactional_id="kafka-python-1", linger_ms=5)
    try:
        producer.init_transactions()
        for outcome, values in (("commit", [b"a", b"b"]), ("abort", [b"x"])):
            producer.begin_transaction()
            for value in values:
                producer.send(TOPIC, key=b"k-" + value, value=value, partition=0)
            producer.flush()  # an abort drops what was not sent
            if outcome == "commit":
                producer.commit_transaction()
            else:
                producer.abort_transaction()
    finally:
        producer.close(5)
    assert read_uncommitted(agent, 3) == [(0, b"a"), (1, b"b"), (3, b"x")]
    assert watermarks(agent) == (5, 5)


def test_aiokafka_commits_and_aborts(agent: RunningAgent) -> None:
    async def run() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=agent.bootstrap, transactional_id="aiokafka-1", linger_ms=5)
        await producer.start()
        try:
            async with producer.transaction():
                await producer.send_and_wait(TOPIC, b"a", key=b"k-a", partition=0)
            await producer.begin_transaction()
            await producer.send_and_wait(TOPIC, b"x", key=b"k-x", partition=0)
            await producer.abort_transaction()
        finally:
            await producer.stop()

    asyncio.run(run())
    assert read_uncommitted(agent, 2) == [(0, b"a"), (2, b"x")]
    assert watermarks(agent) == (4, 4)


# -- each API's errors, as Kafka's --------------------------------------------------------------------------


def init(wire: Wire, transactional_id: str, version: int = 4, producer_id: int = -1, epoch: int = -1, timeout_ms: int = 60_000) -> tuple[int, int, int]:
    answered = wire.call(INIT_PRODUCER_ID, version, {
        "transactional_id": transactional_id, "transaction_timeout": timeout_ms, "producer_id": producer_id, "producer_epoch": epoch,
    })
    return int(answered.error_code), int(answered.producer_id), int(answered.producer_epoch)


def add(wire: Wire, transactional_id: str, producer_id: int, epoch: int, partitions: dict[str, list[int]], version: int = 3) -> dict[tuple[str, int], int]:
    answered = wire.call(ADD_PARTITIONS_TO_TXN, version, {
        "v3_and_below_transactional_id": transactional_id, "v3_and_below_producer_id": producer_id, "v3_and_below_producer_epoch": epoch,
        "v3_and_below_topics": [{"name": name, "partitions": indexes} for name, indexes in partitions.items()],
    })
    return {(topic.name, int(p.partition_index)): int(p.partition_error_code) for topic in answered.results_by_topic_v3_and_below for p in topic.results_by_partition}


def end(wire: Wire, transactional_id: str, producer_id: int, epoch: int, commit: bool, version: int = 3) -> int:
    answered = wire.call(END_TXN, version, {"transactional_id": transactional_id, "producer_id": producer_id, "producer_epoch": epoch, "committed": commit})
    return int(answered.error_code)


def transactional_batch(producer_id: int, epoch: int, first_sequence: int, values: list[bytes]) -> bytes:
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=True, producer_id=producer_id,
                                        producer_epoch=epoch, base_sequence=first_sequence, batch_size=1 << 20)
    for index, value in enumerate(values):
        builder.append(index, timestamp=TIMESTAMP + index, key=b"k-" + value, value=value, headers=[])
    return bytes(builder.build())


def answers(agent: RunningAgent, transactional_id: str | None, batches: dict[tuple[str, int], bytes]) -> dict[tuple[str, int], tuple[int, int]]:
    """(error code, base offset) of each partition of one Produce v9 of a transactional producer."""
    return produce_at(agent.server.address, transactional_id, batches)


def produce_at(address: Address, transactional_id: str | None, batches: dict[tuple[str, int], bytes]) -> dict[tuple[str, int], tuple[int, int]]:
    with socket.create_connection((address.host, address.port), timeout=20) as connection:
        connection.sendall(produce_request(9, 5, dict(batches), transactional_id=transactional_id))
        _, answered = produce_response(receive_frame(connection), 9)
    return {tp: (int(found.error_code), int(found.base_offset)) for tp, found in answered.items()}


def test_the_coordinators_apis_answer_kafkas_errors(agent: RunningAgent) -> None:
    wire = Wire(agent)
    try:
        assert init(wire, "t", timeout_ms=900_001)[0] == INVALID_TRANSACTION_TIMEOUT  # above transaction.max.timeout.ms
        assert init(wire, "t", producer_id=-1, epoch=3)[0] == INVALID_REQUEST  # a producer id and epoch, or neither
        error, producer_id, epoch = init(wire, "t")
        assert (error, epoch) == (NONE, 0) and producer_id >= 0
        # KIP-360: the producer's own id and epoch bump it; an older epoch is fenced (INVALID_PRODUCER_EPOCH before v4)
        assert init(wire, "t", 4, producer_id, 0) == (NONE, producer_id, 1)
        assert init(wire, "t", 4, producer_id, 0)[0] == NONE  # a retry of that bump: answered the same
        assert init(wire, "t", 4, producer_id, 7)[0] == PRODUCER_FENCED
        assert init(wire, "t", 3, producer_id, 7)[0] == INVALID_PRODUCER_EPOCH
        epoch = 1

        # an unknown topic or partition: those UNKNOWN_TOPIC_OR_PARTITION, the others not attempted, nothing added
        assert add(wire, "t", producer_id, epoch, {TOPIC: [0, 7], "nope": [0]}) == {
            (TOPIC, 0): OPERATION_NOT_ATTEMPTED, (TOPIC, 7): UNKNOWN_TOPIC_OR_PARTITION, ("nope", 0): UNKNOWN_TOPIC_OR_PARTITION,
        }
        assert add(wire, "t", producer_id, epoch + 1, {TOPIC: [0]}, version=2) == {(TOPIC, 0): PRODUCER_FENCED}
        assert add(wire, "t", producer_id, epoch + 1, {TOPIC: [0]}, version=1) == {(TOPIC, 0): INVALID_PRODUCER_EPOCH}
        assert add(wire, "t", producer_id + 100, epoch, {TOPIC: [0]}) == {(TOPIC, 0): INVALID_PRODUCER_ID_MAPPING}
        assert add(wire, "", producer_id, epoch, {TOPIC: [0]}) == {(TOPIC, 0): INVALID_REQUEST}
        assert watermarks(agent) == (0, 0)
        assert end(wire, "t", producer_id, epoch, True) == INVALID_TXN_STATE  # nothing open

        # a transactional batch: only into a partition added, at the producer's epoch
        assert add(wire, "t", producer_id, epoch, {TOPIC: [0]}, version=0) == {(TOPIC, 0): NONE}
        # and in a Produce naming its transactional id: without one the whole request is refused, as Kafka's
        without_id = answers(agent, None, {(TOPIC, 0): transactional_batch(producer_id, epoch, 0, [b"a"]), (TOPIC, 1): record_batch([(b"k", b"v", [])])})
        assert without_id == {(TOPIC, 0): (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1), (TOPIC, 1): (TRANSACTIONAL_ID_AUTHORIZATION_FAILED, -1)}
        assert answers(agent, "t", {(TOPIC, 1): transactional_batch(producer_id, epoch, 0, [b"p1"])}) == {(TOPIC, 1): (INVALID_TXN_STATE, -1)}
        assert answers(agent, "t", {(TOPIC, 0): transactional_batch(producer_id, epoch - 1, 0, [b"old"])}) == {(TOPIC, 0): (INVALID_PRODUCER_EPOCH, -1)}
        assert answers(agent, "t", {(TOPIC, 0): transactional_batch(producer_id, epoch, 0, [b"a", b"b"])}) == {(TOPIC, 0): (NONE, 0)}
        assert answers(agent, "t", {(TOPIC, 0): transactional_batch(producer_id, epoch, 0, [b"a", b"b"])}) == {(TOPIC, 0): (NONE, 0)}  # its retry
        assert watermarks(agent) == (2, 0)
        # an older producer of the id cannot abort the open transaction: it is fenced and the transaction stays open
        assert init(wire, "t", 4, producer_id, epoch - 1)[0] == PRODUCER_FENCED
        assert watermarks(agent) == (2, 0)

        assert end(wire, "t", producer_id, epoch + 1, True, version=2) == PRODUCER_FENCED
        assert end(wire, "t", producer_id, epoch + 1, True, version=1) == INVALID_PRODUCER_EPOCH
        assert end(wire, "t", producer_id + 100, epoch, True) == INVALID_PRODUCER_ID_MAPPING
        assert end(wire, "t", producer_id, epoch, True, version=0) == NONE
        assert watermarks(agent) == (3, 3)
        assert end(wire, "t", producer_id, epoch, True) == NONE  # a retry of the commit
        assert end(wire, "t", producer_id, epoch, False) == INVALID_TXN_STATE
        assert watermarks(agent) == (3, 3)
        # the transaction ended: a batch of it is refused
        assert answers(agent, "t", {(TOPIC, 0): transactional_batch(producer_id, epoch, 2, [b"c"])}) == {(TOPIC, 0): (INVALID_TXN_STATE, -1)}
        # the producer's own InitProducerId with a transaction open aborts it (a marker in partition 1) and bumps the
        # epoch once: Kafka answers CONCURRENT_TRANSACTIONS first, then the same epoch to the client's retry
        assert add(wire, "t", producer_id, epoch, {TOPIC: [1]}) == {(TOPIC, 1): NONE}
        assert init(wire, "t", 4, producer_id, epoch) == (NONE, producer_id, epoch + 1)
        assert watermarks(agent, 1) == (1, 1) and watermarks(agent) == (3, 3)
    finally:
        wire.close()


def test_a_catalog_out_of_reach_is_answered_retriable_and_the_sweeps_go_on(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
) -> None:
    agent = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, transaction_abort_timed_out_transaction_cleanup_interval_ms=100)
    try:
        wire = Wire(agent)
        try:
            _, producer_id, epoch = init(wire, "t")
            assert add(wire, "t", producer_id, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}

            def unreachable(*_: object, **__: object) -> None:
                raise CatalogUnavailableError("catalog database unreachable: connection refused")

            with caplog.at_level(logging.WARNING, logger="logcompact.kafka"):
                for method in ("init_producer", "add_to_transaction", "end_transaction", "timed_out_transactions"):
                    monkeypatch.setattr(catalog, method, unreachable)
                assert init(wire, "t", 4, producer_id, epoch)[0] == COORDINATOR_NOT_AVAILABLE
                assert add(wire, "t", producer_id, epoch, {TOPIC: [1]}) == {(TOPIC, 1): COORDINATOR_NOT_AVAILABLE}
                assert end(wire, "t", producer_id, epoch, True) == COORDINATOR_NOT_AVAILABLE
                time.sleep(0.5)
                monkeypatch.undo()
            assert any("transaction sweep failed: catalog database unreachable" in message for message in caplog.messages)
            assert end(wire, "t", producer_id, epoch, True) == NONE  # the client's retry, once the catalog is back
            assert watermarks(agent) == (1, 1)
        finally:
            wire.close()
    finally:
        agent.stop()


def test_a_transactional_id_is_served_by_the_agent_it_hashes_to(catalog: Catalog) -> None:
    one, two = RunningAgent(catalog, flush_interval_ms=FLUSH_MS), RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        for running in (one, two):
            running.server.broker.agents.refresh()  # each sees the other now, not at its next heartbeat
        at_two = next(f"t-{n}" for n in range(100) if one.server.broker.agents.coordinator_for(f"t-{n}").node_id == two.server.broker.node_id)
        wire = Wire(one)
        try:
            found = wire.call(FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": [at_two]}).coordinators[0]
            assert (int(found.error_code), int(found.node_id), int(found.port)) == (NONE, two.server.broker.node_id, two.server.address.port)
            assert init(wire, at_two)[0] == NOT_COORDINATOR
            assert add(wire, at_two, 0, 0, {TOPIC: [0]}) == {(TOPIC, 0): NOT_COORDINATOR}
            assert end(wire, at_two, 0, 0, True) == NOT_COORDINATOR
        finally:
            wire.close()
    finally:
        one.stop()
        two.stop()


def test_an_agent_aborts_the_timed_out_transactions_of_an_agent_that_stopped(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    """The catalog holds every transaction: once its coordinator stops, the agent its id hashes to then aborts it."""
    sweeping = {"flush_interval_ms": FLUSH_MS, "transaction_abort_timed_out_transaction_cleanup_interval_ms": 200}
    one, two = RunningAgent(catalog, **sweeping), RunningAgent(catalog, **sweeping)
    try:
        for running in (one, two):
            running.server.broker.agents.refresh()
        tid = next(f"t-{n}" for n in range(100) if one.server.broker.agents.coordinator_for(f"t-{n}").node_id == two.server.broker.node_id)
        wire = Wire(two)
        try:
            _, producer_id, epoch = init(wire, tid, timeout_ms=3000)
            assert add(wire, tid, producer_id, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}
        finally:
            wire.close()
        assert answers(one, tid, {(TOPIC, 0): transactional_batch(producer_id, epoch, 0, [b"a"])}) == {(TOPIC, 0): (NONE, 0)}
        two.stop()
        one.server.broker.agents.refresh()
        with caplog.at_level(logging.INFO, logger="logcompact.kafka.transaction_coordinator"):
            assert eventually(lambda: any(f"transaction {tid!r} aborted" in message and "past its timeout 3000 ms" in message
                                          for message in caplog.messages))
        assert watermarks(one) == (2, 2)
        assert catalog.aborted_ranges({(TOPIC, 0): (0, 2)}) == {(TOPIC, 0): [(0, 0)]}
    finally:
        one.stop()
        if two.thread.is_alive():
            two.stop()


def test_a_batch_whose_transaction_ended_before_its_append_is_refused_alone(catalog: Catalog) -> None:
    """A batch checked against a view of its transaction that another agent ended meanwhile: its append refuses it
    alone (the other batches of its L0 file are acknowledged), records its offsets as aborted, and a retry of it
    gets the same refusal, on this agent and on another that reads the producer's state from the catalog. Its record is
    never read read_committed."""
    one, two = RunningAgent(catalog, flush_interval_ms=FLUSH_MS), RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        for running in (one, two):
            running.server.broker.agents.refresh()
        tid = next(f"t-{n}" for n in range(100) if one.server.broker.agents.coordinator_for(f"t-{n}").node_id == one.server.broker.node_id)
        wire = Wire(one)
        try:
            _, producer_id, epoch = init(wire, tid)
            assert add(wire, tid, producer_id, epoch, {TOPIC: [0]}) == {(TOPIC, 0): NONE}
        finally:
            wire.close()
        # the first batch reaches the other agent, which reads the transaction from the catalog and keeps it
        assert answers(two, tid, {(TOPIC, 0): transactional_batch(producer_id, epoch, 0, [b"a"])}) == {(TOPIC, 0): (NONE, 0)}
        assert catalog.end_transaction(tid, producer_id, epoch, False, int(time.time() * 1000)).markers  # aborted elsewhere: marker at 1
        late = transactional_batch(producer_id, epoch, 1, [b"late"])
        # one Produce, so one L0 file: the late batch and another producer's
        assert answers(two, tid, {(TOPIC, 0): late, (TOPIC, 1): record_batch([(b"k", b"plain", [])])}) == {(TOPIC, 0): (INVALID_TXN_STATE, -1), (TOPIC, 1): (NONE, 0)}
        assert catalog.aborted_ranges({(TOPIC, 0): (0, 10)}) == {(TOPIC, 0): [(0, 0), (2, 2)]}
        assert watermarks(two) == (3, 3)
        assert answers(two, tid, {(TOPIC, 0): late}) == {(TOPIC, 0): (INVALID_TXN_STATE, -1)}  # its retry, from the agent's view
        assert answers(one, tid, {(TOPIC, 0): late}) == {(TOPIC, 0): (INVALID_TXN_STATE, -1)}  # and from the catalog's producer state
        assert watermarks(two) == (3, 3)  # written once
        # the late record is never read_committed, nor the aborted one before it; the other producer's record is
        assert read_committed(two, 0) == [] and read_committed(two, 1) == [(0, b"plain")]
        assert read_uncommitted(two, 2) == [(0, b"a"), (2, b"late")]
    finally:
        one.stop()
        two.stop()


# -- the same requests to Apache Kafka -------------------------------------------------------------------------




def scripted(address: Address, topic: str, transactional_id: str) -> list[tuple[str, object]]:
    """One sequence of raw transactional requests to `address` (an agent or a broker), over a compacted topic of 2
    partitions: every answer's error codes, epochs and offsets, and the watermarks between, on which Kafka's first
    transaction protocol and the agent agree (not where they differ: an older producer's InitProducerId with a
    transaction open, which Kafka aborts and the agent leaves open)."""
    tid, seen = transactional_id, []
    with socket.create_connection((address.host, address.port), timeout=30) as connection:
        wire = Wire.over(connection)
        deadline = time.monotonic() + 60
        while True:  # a broker's transaction coordinator loads its partition once asked for it
            wire.call(FIND_COORDINATOR, 3, {"key": tid, "key_type": 1})
            error, producer_id, epoch = init(wire, tid)
            if error not in (COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, COORDINATOR_LOAD_IN_PROGRESS) or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        seen.append(("init", (error, epoch)))

        def stable(partition: int) -> tuple[int, int]:  # once the markers are written (a broker writes them after answering)
            until = time.monotonic() + 10
            while (found := fetch_watermarks(address, topic, partition))[0] != found[1] and time.monotonic() < until:
                time.sleep(0.1)
            return found

        def batch(epoch_of: int, first_sequence: int, values: list[bytes]) -> dict[tuple[str, int], bytes]:
            return {(topic, 0): transactional_batch(producer_id, epoch_of, first_sequence, values)}

        seen += [
            ("timeout above the max", init(wire, tid + "-2", timeout_ms=900_001)[0]),
            ("producer id without epoch", init(wire, tid + "-2", producer_id=-1, epoch=3)[0]),
            ("bump", init(wire, tid, 4, producer_id, 0)[0::2]),
            ("bump again", init(wire, tid, 4, producer_id, 0)[0::2]),
            ("older epoch v4", init(wire, tid, 4, producer_id, 7)[0]),
            ("older epoch v3", init(wire, tid, 3, producer_id, 7)[0]),
        ]
        epoch = 1
        seen += [
            ("add unknown", add(wire, tid, producer_id, epoch, {topic: [0, 7], topic + "-none": [0]})),
            ("add fenced v2", add(wire, tid, producer_id, epoch + 1, {topic: [0]}, version=2)),
            ("add fenced v1", add(wire, tid, producer_id, epoch + 1, {topic: [0]}, version=1)),
            ("add other producer id", add(wire, tid, producer_id + 100, epoch, {topic: [0]})),
            ("add empty id", add(wire, "", producer_id, epoch, {topic: [0]})),
            ("end with none open", end(wire, tid, producer_id, epoch, True)),
            ("add", add(wire, tid, producer_id, epoch, {topic: [0]}, version=0)),
            ("produce not added", produce_at(address, tid, {(topic, 1): transactional_batch(producer_id, epoch, 0, [b"p1"])})),
            ("produce without id", produce_at(address, None, batch(epoch, 0, [b"a"]))),
            ("produce older epoch", produce_at(address, tid, batch(epoch - 1, 0, [b"old"]))),
            ("produce", produce_at(address, tid, batch(epoch, 0, [b"a", b"b"]))),
            ("produce again", produce_at(address, tid, batch(epoch, 0, [b"a", b"b"]))),
            ("open", fetch_watermarks(address, topic, 0)),
            ("end other producer id", end(wire, tid, producer_id + 100, epoch, True)),
            ("end commit", end(wire, tid, producer_id, epoch, True, version=0)),
            ("committed", stable(0)),
            ("end commit again", end(wire, tid, producer_id, epoch, True)),
            ("end abort", end(wire, tid, producer_id, epoch, False)),
            ("produce after the end", produce_at(address, tid, batch(epoch, 2, [b"c"]))),
            ("add again", add(wire, tid, producer_id, epoch, {topic: [1]})),
        ]
        # the producer's own InitProducerId aborts its open transaction: Kafka answers CONCURRENT_TRANSACTIONS first
        until = time.monotonic() + 10
        while (bumped := init(wire, tid, 4, producer_id, epoch))[0] == CONCURRENT_TRANSACTIONS and time.monotonic() < until:
            time.sleep(0.2)
        seen += [("init with it open", bumped[0::2]), ("aborted", stable(1)), ("end fenced v2", end(wire, tid, producer_id, epoch, True, version=2)),
                 ("end fenced v1", end(wire, tid, producer_id, epoch, True, version=1))]
    return [(step, _relative(found)) for step, found in seen]


def _relative(found: object) -> object:
    """An answer as compared: partitions by index, of the topic or of the one that does not exist (names differ)."""
    if isinstance(found, dict):
        return sorted(((topic.endswith("-none"), partition), answer) for (topic, partition), answer in found.items())
    return found


def test_the_coordinators_answers_and_offsets_are_apache_kafkas(agent: RunningAgent, kafka_broker: KafkaServer) -> None:
    topic = f"state-{uuid.uuid4().hex[:8]}"  # the broker is the module's: a topic and transactional id of this test's
    kafka_broker.create_topic(topic, 2, {"cleanup.policy": "compact"})
    expected = scripted(Address(kafka_broker.host, kafka_broker.port), topic, f"t-{topic}")
    assert scripted(agent.server.address, TOPIC, f"t-{topic}") == expected
