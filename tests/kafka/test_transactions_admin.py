"""Kafka's transaction tooling through `logcompact agent`: ListTransactions, DescribeTransactions, DescribeProducers and
WriteTxnMarkers' admin abort, driven by the real tools, Apache Kafka's `kafka-transactions.sh`
(org.apache.kafka.tools.TransactionsCommand, from the reference broker's jars) and kafka-python's
`python -m kafka.admin transactions`, against two agents on one PostgreSQL catalog and against Apache Kafka's broker
(lab.servers.kafka): the same calls give the same listings, offsets and last stable offsets. The one difference is by
design: an admin's abort here aborts the producer's whole transaction and fences its producer, where Kafka aborts the
one partition and lets the producer commit the rest. Bad requests get Kafka's error codes and the agent stays up.
"""

from __future__ import annotations

import json
import logging
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from lab.servers.kafka import KafkaServer, tool_argv
from logcompact.catalog import Catalog
from logcompact.kafka.cluster import Address
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, consume
from tests.kafka.test_transactions import add, answers, end, fetch_watermarks, init, transactional_batch
from tests.kafka.wire import Wire, connect, receive_frame, request_frame

pytestmark = pytest.mark.timeout(300)

TOPIC = "state"
BAD_TOPIC = "bad-requests"  # its own, so the markers of the bad requests take no offset of TOPIC on Kafka
TRANSACTIONS_COMMAND = "org.apache.kafka.tools.TransactionsCommand"
# Kafka's error codes
NONE, UNKNOWN_TOPIC_OR_PARTITION, UNSUPPORTED_VERSION, INVALID_REQUEST, INVALID_PRODUCER_EPOCH = 0, 3, 35, 42, 47
COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR, TRANSACTIONAL_ID_NOT_FOUND = 14, 15, 16, 105
PRODUCER_FENCED = 90
FIND_COORDINATOR, API_VERSIONS, WRITE_TXN_MARKERS, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 10, 18, 27, 61, 65, 66


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, TOPIC, 2, cleanup_policy="compact")
    return catalog


@pytest.fixture
def two_agents(catalog: Catalog) -> Iterator[tuple[RunningAgent, RunningAgent]]:
    one, two = RunningAgent(catalog, flush_interval_ms=FLUSH_MS), RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        for running in (one, two):
            running.server.broker.agents.refresh()  # each sees the other now, not at its next heartbeat
        yield one, two
    finally:
        one.stop()
        two.stop()


# -- the tools ------------------------------------------------------------------------------------------------------


def kafka_transactions(bootstrap: str, *args: str) -> list[dict[str, str]]:
    """`kafka-transactions.sh --bootstrap-server bootstrap args`: its table's rows, by column header."""
    run = subprocess.run(tool_argv(TRANSACTIONS_COMMAND, "--bootstrap-server", bootstrap, *args), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    lines = [line.split("\t") for line in run.stdout.splitlines() if line.strip()]
    if not lines:
        return []
    headers = [cell.strip() for cell in lines[0]]
    return [dict(zip(headers, (cell.strip() for cell in line), strict=False)) for line in lines[1:]]


def kafka_python_admin(bootstrap: str, *args: str) -> Any:
    """`python -m kafka.admin --format json transactions args` (kafka-python 3.0's `kafka-python admin`): its JSON."""
    run = subprocess.run([sys.executable, "-m", "kafka.admin", "-b", bootstrap, "--format", "json", "transactions", *args],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    return json.loads(run.stdout)


def transactional(bootstrap: str, transactional_id: str) -> Producer:
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id, "linger.ms": 5, **FAST_CLIENT})
    producer.init_transactions(30)
    return producer


def open_transaction(bootstrap: str, transactional_id: str, value: bytes) -> Producer:
    """A producer whose transaction has `value` in partition 0, left open."""
    producer = transactional(bootstrap, transactional_id)
    producer.begin_transaction()
    producer.produce(TOPIC, key=b"k-" + value, value=value, partition=0)
    assert producer.flush(20) == 0
    return producer


def committed_values(bootstrap: str, partition: int, count: int) -> list[tuple[int, bytes]]:
    """(offset, value) of `count` records a read_committed consumer reads from the partition's start to its end."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"admin-{uuid.uuid4().hex}", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed", **FAST_CLIENT})
    try:
        consumer.assign([TopicPartition(TOPIC, partition, 0)])
        return [(message.offset(), message.value()) for message in consume(consumer, count)]
    finally:
        consumer.close()


def watermarks(address: Address, partition: int = 0) -> tuple[int, int]:
    return fetch_watermarks(address, TOPIC, partition)


def wait_for(check: Callable[[], bool], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.1)


# -- the scenario, against two agents and against Kafka -------------------------------------------------------------


def hung_transactions(bootstrap: str, address: Address, ids: list[str]) -> dict[str, Any]:
    """Three transactions left open on partition 0 (offsets 0, 1, 2) and one committed after them (3, its marker 4),
    found and aborted by the tools: what each tool and Fetch showed at each step. The producers are kept open
    (`producers`) for the caller to try after the aborts."""
    hung = {tid: open_transaction(bootstrap, tid, tid.encode()) for tid in ids[:3]}
    done = transactional(bootstrap, ids[3])
    done.begin_transaction()
    done.produce(TOPIC, key=b"k-done", value=b"done", partition=0)
    done.commit_transaction(20)
    done.flush(5)
    wait_for(lambda: watermarks(address)[0] == 5)  # Kafka's coordinator writes its markers after EndTxn's answer
    seen: dict[str, Any] = {"producers": hung, "held": watermarks(address)}

    listed_java = kafka_transactions(bootstrap, "list")
    seen["java list"] = sorted((row["TransactionalId"], row["TransactionState"]) for row in listed_java if row["TransactionalId"] in ids)
    seen["java coordinators"] = {row["TransactionalId"]: row["Coordinator"] for row in listed_java}
    seen["python list"] = sorted((row["transactional_id"], row["state"]) for rows in kafka_python_admin(bootstrap, "list").values() for row in rows)
    ongoing = kafka_python_admin(bootstrap, "list", "--state", "Ongoing")
    seen["python ongoing"] = sorted(row["transactional_id"] for rows in ongoing.values() for row in rows)
    # ListTransactions v1's duration filter: transactions that began longer ago than it, whatever their state
    seen["python longer than 0 ms"] = sorted(
        row["transactional_id"] for rows in kafka_python_admin(bootstrap, "list", "--duration-filter-ms", "0").values() for row in rows
    )
    seen["python longer than an hour"] = kafka_python_admin(bootstrap, "list", "--duration-filter-ms", "3600000")
    # kafka-python's find-hanging asks the coordinators for transactions open past a timeout plus Kafka's 5 minutes
    hanging = kafka_python_admin(bootstrap, "find-hanging", f"--max-transaction-timeout-ms={-5 * 60_000}")
    seen["python open past 0 ms"] = sorted((row["transactional_id"], [(tp["topic"], tp["partition"]) for tp in row["topic_partitions"]]) for row in hanging)

    described = kafka_transactions(bootstrap, "describe", "--transactional-id", ids[0])
    seen["java describe"] = [(row["TransactionalId"], row["TransactionState"], row["TopicPartitions"]) for row in described]
    seen["python describe"] = kafka_python_admin(bootstrap, "describe", "--transactional-id", ids[0])

    producers_java = kafka_transactions(bootstrap, "describe-producers", "--topic", TOPIC, "--partition", "0")
    seen["java producers"] = sorted(int(row["CurrentTransactionStartOffset"]) for row in producers_java if row["CurrentTransactionStartOffset"] != "None")
    by_python = kafka_python_admin(bootstrap, "describe-producers", "-t", TOPIC, "-p", "0")[f"{TOPIC}:0"]["active_producers"]
    seen["python producers"] = sorted(row["current_transaction_start_offset"] for row in by_python)
    seen["java hanging"] = kafka_transactions(bootstrap, "find-hanging", "--topic", TOPIC, "--max-transaction-timeout", "0")

    # kafka-transactions.sh abort --start-offset: DescribeProducers names the producer and epoch, WriteTxnMarkers aborts
    kafka_transactions(bootstrap, "abort", "--topic", TOPIC, "--partition", "0", "--start-offset", "0")
    wait_for(lambda: watermarks(address)[1] == 1)
    seen["after java abort"] = watermarks(address)
    # kafka-python's abort names the producer id and epoch DescribeProducers shows
    second = next(row for row in producers_java if row["CurrentTransactionStartOffset"] == "1")
    kafka_python_admin(bootstrap, "abort", "-t", TOPIC, "-p", "0", "--producer-id", second["ProducerId"], "--producer-epoch", second["ProducerEpoch"])
    wait_for(lambda: watermarks(address)[1] == 2)
    seen["after python abort"] = watermarks(address)
    hung[ids[2]].commit_transaction(20)
    wait_for(lambda: watermarks(address)[1] == 8)
    seen["committed"] = committed_values(bootstrap, 0, 2)
    seen["end"] = watermarks(address)
    return seen


def transactional_ids_of(one: RunningAgent, two: RunningAgent) -> list[str]:
    """Four transactional ids, the first three coordinated by both agents between them."""
    node = one.server.broker.agents.coordinator_for
    first = [f"tools-{n}" for n in range(100) if node(f"tools-{n}").node_id == one.server.broker.node_id][:2]
    second = [f"tools-{n}" for n in range(100) if node(f"tools-{n}").node_id == two.server.broker.node_id][:2]
    return [first[0], second[0], first[1], second[1]]


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)  # two agents share a catalog on PostgreSQL
def test_the_tools_find_and_abort_hung_transactions_as_on_kafka(
    two_agents: tuple[RunningAgent, RunningAgent], kafka_broker: KafkaServer, caplog: pytest.LogCaptureFixture
) -> None:
    one, two = two_agents
    ids = transactional_ids_of(one, two)
    with caplog.at_level(logging.INFO, logger="logcompact.kafka.transaction_coordinator"):
        agents = hung_transactions(one.bootstrap, one.server.address, ids)

    # Each open transaction listed once across both agents, by the agent that coordinates it.
    assert agents["java list"] == sorted([(tid, "Ongoing") for tid in ids[:3]] + [(ids[3], "CompleteCommit")])
    assert agents["python list"] == agents["java list"]
    assert agents["python ongoing"] == sorted(ids[:3])
    assert agents["python open past 0 ms"] == sorted((tid, [(TOPIC, 0)]) for tid in ids[:3])
    assert agents["python longer than 0 ms"] == sorted(ids)
    assert all(not rows for rows in agents["python longer than an hour"].values())
    assert agents["python producers"] == [-1, 0, 1, 2]  # the committed producer has no open transaction there
    nodes = {tid: str(one.server.broker.agents.coordinator_for(tid).node_id) for tid in ids}
    assert {tid: agents["java coordinators"][tid] for tid in ids} == nodes
    assert agents["held"] == (5, 0)
    assert agents["java describe"] == [(ids[0], "Ongoing", f"{TOPIC}-0")]
    assert agents["java producers"] == [0, 1, 2]
    assert agents["java hanging"] == []  # each open data's partition is in its coordinator's transaction
    assert agents["after java abort"] == (6, 1)
    assert agents["after python abort"] == (7, 2)
    assert agents["committed"] == [(2, ids[2].encode()), (3, b"done")]  # read_committed reads past the aborted ones
    assert agents["end"] == (8, 8)
    aborted = [message for message in caplog.messages if "aborted by an admin" in message]
    assert len(aborted) == 2 and f"{ids[0]!r}" in aborted[0] and f"{ids[1]!r}" in aborted[1], caplog.messages
    # The aborted producers are fenced: their transaction is gone whole, so they cannot commit it.
    for tid in ids[:2]:
        with pytest.raises(KafkaException) as failed:
            agents["producers"][tid].commit_transaction(20)
        assert failed.value.args[0].fatal(), failed.value

    # The same calls to Apache Kafka: the same listings, offsets and last stable offsets.
    create_kafka_topic(kafka_broker, TOPIC)
    host, port = kafka_broker.bootstrap_servers.rsplit(":", 1)
    kafka = hung_transactions(kafka_broker.bootstrap_servers, Address(host, int(port)), ids)
    for seen in ("java list", "python list", "python ongoing", "python open past 0 ms", "python producers", "python longer than 0 ms", "held", "java describe", "java producers", "java hanging",
                 "after java abort", "after python abort", "committed", "end"):
        assert agents[seen] == kafka[seen], seen
    assert _shape(agents["python describe"]) == _shape(kafka["python describe"])
    agents["producers"].clear()  # destroyed while the agents still serve: they do not reconnect through the teardown
    kafka["producers"].clear()


def create_kafka_topic(kafka_broker: KafkaServer, name: str) -> None:
    """A topic of 2 partitions on the broker (kept for the module's other tests: made by the first that asks)."""
    try:
        kafka_broker.create_topic(name, 2, {"cleanup.policy": "compact"})
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise


def _shape(found: Any) -> Any:
    """A tool's JSON with what differs between two clusters by nature (ids, epochs, times, coordinators) left out."""
    varying = {"producer_id", "producer_epoch", "coordinator_id", "coordinator_epoch", "transaction_start_time_ms", "last_timestamp", "throttle_time_ms"}
    if isinstance(found, dict):
        return {key: _shape(value) for key, value in found.items() if key not in varying}
    if isinstance(found, list):
        return [_shape(item) for item in found]
    return found


# -- bad requests ---------------------------------------------------------------------------------------------------


def bad_requests(wire: Wire, transactional_id: str) -> dict[str, Any]:
    """Kafka's answers to the tooling's requests about what does not exist, a COMMIT marker and unserved versions."""
    seen: dict[str, Any] = {}
    seen["unknown id"] = describe_error(wire, transactional_id)
    producers = wire.call(DESCRIBE_PRODUCERS, 0, {"topics": [{"name": "no-such-topic", "partition_indexes": [0]}, {"name": BAD_TOPIC, "partition_indexes": [7]}]})
    seen["unknown partitions"] = [int(p.error_code) for topic in producers.topics for p in topic.partitions]
    listed = wire.call(LIST_TRANSACTIONS, 1, {"state_filters": ["Hanging"], "producer_id_filters": [], "duration_filter": -1})
    seen["unknown state"] = (int(listed.error_code), list(listed.unknown_state_filters), len(listed.transaction_states))
    markers = {"markers": [{"producer_id": 123456, "producer_epoch": 0, "transaction_result": True, "coordinator_epoch": 0,
                            "topics": [{"name": BAD_TOPIC, "partition_indexes": [0]}]}]}
    seen["commit marker"] = [int(p.error_code) for topic in wire.call(WRITE_TXN_MARKERS, 1, markers).markers[0].topics for p in topic.partitions]
    markers["markers"][0]["transaction_result"] = False
    seen["unknown producer"] = [int(p.error_code) for topic in wire.call(WRITE_TXN_MARKERS, 1, markers).markers[0].topics for p in topic.partitions]
    markers["markers"][0]["topics"] = [{"name": "no-such-topic", "partition_indexes": [0]}]
    seen["abort of an unknown topic"] = [int(p.error_code) for topic in wire.call(WRITE_TXN_MARKERS, 1, markers).markers[0].topics for p in topic.partitions]
    return seen


def describe_error(wire: Wire, transactional_id: str) -> int:
    """The error code of DescribeTransactions v0 for one id, read from the frame: an unknown id's start time is -1,
    which kio's reader refuses as a datetime."""
    wire.send(DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [transactional_id]})
    wire.sent.pop(0)
    frame = receive_frame(wire.socket)
    # response header v1 (correlation id, no tagged fields), throttle time, a compact array of one, its error code
    assert frame[4] == 0 and frame[9] == 2, frame
    return int.from_bytes(frame[10:12], "big", signed=True)


def served_versions(wire: Wire) -> dict[int, tuple[int, int]]:
    answered = wire.call(API_VERSIONS, 3, {"client_software_name": "tests", "client_software_version": "1"})
    return {int(api.api_key): (int(api.min_version), int(api.max_version)) for api in answered.api_keys}


def test_bad_requests_get_kafkas_errors_and_the_agent_stays_up(agent: RunningAgent, catalog: Catalog) -> None:
    create_topic(catalog, BAD_TOPIC, 2)
    wire = Wire(agent)
    try:
        tid = "never-initialised"
        assert agent.server.broker.transactions.coordinates(tid)  # one agent coordinates every id
        assert bad_requests(wire, tid) == {
            "unknown id": TRANSACTIONAL_ID_NOT_FOUND,
            "unknown partitions": [UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_TOPIC_OR_PARTITION],
            "unknown state": (NONE, ["Hanging"], 0),
            "commit marker": [INVALID_REQUEST],
            "unknown producer": [NONE],
            "abort of an unknown topic": [UNKNOWN_TOPIC_OR_PARTITION],
        }
        versions = served_versions(wire)
        assert {key: versions[key] for key in (WRITE_TXN_MARKERS, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS)} == {
            WRITE_TXN_MARKERS: (1, 1), DESCRIBE_PRODUCERS: (0, 0), DESCRIBE_TRANSACTIONS: (0, 0), LIST_TRANSACTIONS: (0, 1),
        }
        for api_key, version in ((WRITE_TXN_MARKERS, 0), (DESCRIBE_TRANSACTIONS, 1), (LIST_TRANSACTIONS, 2), (DESCRIBE_PRODUCERS, 1)):
            assert unsupported(agent, api_key, version), (api_key, version)
        assert bad_requests(wire, tid)["unknown id"] == TRANSACTIONAL_ID_NOT_FOUND  # the connection and the agent still serve
    finally:
        wire.close()


def unsupported(agent: RunningAgent, api_key: int, version: int) -> bool:
    """Whether a request at `version` is answered UNSUPPORTED_VERSION (as an ApiVersions v0 body, Kafka's way)."""
    with connect(agent.server) as connection:
        connection.sendall(request_frame(api_key, version, 9))
        frame = receive_frame(connection)
    return int.from_bytes(frame[4:6], "big", signed=True) == UNSUPPORTED_VERSION


def test_the_same_bad_requests_to_kafka_get_the_same_answers(agent: RunningAgent, catalog: Catalog, kafka_broker: KafkaServer) -> None:
    create_topic(catalog, BAD_TOPIC, 2)
    create_kafka_topic(kafka_broker, BAD_TOPIC)
    wire = Wire(agent)
    try:
        at_agent = bad_requests(wire, "never-initialised")
    finally:
        wire.close()
    host, port = kafka_broker.bootstrap_servers.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=20) as connection:
        kafka = Wire.over(connection)
        # Kafka's coordinator answers for an id once its transaction log is made, which FindCoordinator asks for
        wait_for(lambda: int(kafka.call(FIND_COORDINATOR, 4, {"key_type": 1, "coordinator_keys": ["never-initialised"]}).coordinators[0].error_code) == NONE, 60)
        wait_for(lambda: describe_error(kafka, "never-initialised") not in (COORDINATOR_LOAD_IN_PROGRESS, COORDINATOR_NOT_AVAILABLE, NOT_COORDINATOR), 60)
        at_kafka = bad_requests(kafka, "never-initialised")
    del at_agent["commit marker"], at_kafka["commit marker"]  # Kafka's brokers write a COMMIT marker: by design, not here
    assert at_agent == at_kafka


# -- the admin abort on raw requests ----------------------------------------------------------------------------------


def abort_marker(wire: Wire, producer_id: int, epoch: int, partitions: list[int]) -> dict[tuple[str, int], int]:
    answered = wire.call(WRITE_TXN_MARKERS, 1, {"markers": [{
        "producer_id": producer_id, "producer_epoch": epoch, "transaction_result": False, "coordinator_epoch": -1,
        "topics": [{"name": TOPIC, "partition_indexes": partitions}],
    }]})
    return {(topic.name, int(p.partition_index)): int(p.error_code) for topic in answered.markers[0].topics for p in topic.partitions}


def test_an_admin_abort_ends_the_whole_transaction_at_the_producers_epoch_only(agent: RunningAgent, catalog: Catalog) -> None:
    """A marker at an older epoch than the producer's is refused and aborts nothing; at its epoch, a marker naming one
    partition aborts the transaction in both, and the producer is fenced."""
    wire = Wire(agent)
    try:
        tid = "admin-abort"
        _, producer_id, epoch = init(wire, tid)
        assert add(wire, tid, producer_id, epoch, {TOPIC: [0, 1]}) == {(TOPIC, 0): NONE, (TOPIC, 1): NONE}
        assert answers(agent, tid, {(TOPIC, p): transactional_batch(producer_id, epoch, 0, [b"a", b"b"]) for p in (0, 1)}) == {
            (TOPIC, 0): (NONE, 0), (TOPIC, 1): (NONE, 0)}
        assert end(wire, tid, producer_id, epoch, True) == NONE  # offsets 0-1, the marker at 2
        _, producer_id, epoch = init(wire, tid, producer_id=producer_id, epoch=epoch)  # KIP-360: the epoch bumped
        assert add(wire, tid, producer_id, epoch, {TOPIC: [0, 1]}) == {(TOPIC, 0): NONE, (TOPIC, 1): NONE}
        assert answers(agent, tid, {(TOPIC, p): transactional_batch(producer_id, epoch, 0, [b"c"]) for p in (0, 1)}) == {
            (TOPIC, 0): (NONE, 3), (TOPIC, 1): (NONE, 3)}
        assert watermarks(agent.server.address, 0) == watermarks(agent.server.address, 1) == (4, 3)

        assert abort_marker(wire, producer_id, epoch - 1, [0]) == {(TOPIC, 0): INVALID_PRODUCER_EPOCH}
        assert watermarks(agent.server.address, 0) == (4, 3)  # nothing aborted
        assert abort_marker(wire, producer_id, epoch, [0]) == {(TOPIC, 0): NONE}
        assert watermarks(agent.server.address, 0) == watermarks(agent.server.address, 1) == (5, 5)  # never torn: both ended
        assert catalog.aborted_ranges({(TOPIC, 0): (0, 5), (TOPIC, 1): (0, 5)}) == {(TOPIC, 0): [(3, 3)], (TOPIC, 1): [(3, 3)]}
        assert abort_marker(wire, producer_id, epoch, [0]) == {(TOPIC, 0): NONE}  # a retry: nothing open there, nothing done
        assert watermarks(agent.server.address, 0) == (5, 5)
        assert end(wire, tid, producer_id, epoch, True) == PRODUCER_FENCED
        assert committed_values(agent.bootstrap, 1, 2) == [(0, b"a"), (1, b"b")]
    finally:
        wire.close()
