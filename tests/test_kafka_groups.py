"""Consumer groups through `logcompact agent` (issue 20, item 6): real clients in groups, and raw requests for
every version and Kafka's errors.

confluent-kafka (librdkafka 2.16) forms a group of 3 over 6 partitions, one member (a subprocess) is killed with
SIGKILL and the group rebalances after its session timeout; kafka-python, aiokafka and Debian's kcat (librdkafka
2.0.2, older protocol versions) consume and commit; committed offsets and generations survive an agent restart.
"""

from __future__ import annotations

import io
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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState, Consumer, Producer
from confluent_kafka.admin import AdminClient
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from logcompact.catalog import Catalog
from logcompact.catalog.groups import GroupCatalog
from logcompact.kafka.apis import APIS
from logcompact.kafka.codec import build
from logcompact.store import open_store
from tests.helpers import create_topic
from tests.test_kafka_produce import RunningAgent

pytestmark = pytest.mark.timeout(90)

TOPIC, PARTITIONS = "events", 6
FAST_CLIENT = {"socket.timeout.ms": 5000, "socket.connection.setup.timeout.ms": 5000}
# Kafka's error codes
NONE, UNKNOWN_TOPIC_OR_PARTITION, NOT_COORDINATOR, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL = 0, 3, 16, 22, 23
INVALID_GROUP_ID, UNKNOWN_MEMBER_ID, INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS = 24, 25, 26, 27
INVALID_REQUEST, MEMBER_ID_REQUIRED, FENCED_INSTANCE_ID = 42, 79, 82
JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST, COMMIT, FETCH, FIND = 11, 12, 13, 14, 15, 16, 8, 9, 10


@pytest.fixture
def catalog(tmp_path: Path) -> Catalog:
    catalog = Catalog(open_store(f"file://{tmp_path / 'store'}"))
    create_topic(catalog, TOPIC, PARTITIONS)
    return catalog


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    running = RunningAgent(catalog, flush_interval_ms=20)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def quick_agent(catalog: Catalog) -> Iterator[RunningAgent]:
    """No initial rebalance delay: a lone raw member's JoinGroup is answered at once."""
    running = RunningAgent(catalog, flush_interval_ms=20, group_initial_rebalance_delay_ms=0)
    try:
        yield running
    finally:
        running.stop()


def produce(agent: RunningAgent, per_partition: int, start: int = 0) -> set[tuple[int, int]]:
    """`per_partition` records into each partition, acked; their (partition, offset)s."""
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    acked: set[tuple[int, int]] = set()

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.add((message.partition(), message.offset()))

    for partition in range(PARTITIONS):
        for n in range(start, start + per_partition):
            producer.produce(TOPIC, key=f"k{n}", value=f"v{n}", partition=partition, on_delivery=delivered)
    assert producer.flush(15) == 0
    assert len(acked) == PARTITIONS * per_partition
    return acked


def group_member(agent: RunningAgent, group: str, **config: Any) -> Consumer:
    return Consumer({"bootstrap.servers": agent.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "heartbeat.interval.ms": 300, "session.timeout.ms": 3000, **FAST_CLIENT, **config})


# A member in a process of its own, killed with SIGKILL: it prints "ready", subscribes on "go", and prints each
# record it consumed once its offset is committed (synchronously), so what it printed is committed.
MEMBER_PROCESS = """
import json, sys
from confluent_kafka import Consumer
consumer = Consumer(json.loads(sys.argv[1]))
print("ready", flush=True)
sys.stdin.readline()
consumer.subscribe([sys.argv[2]])
while True:
    message = consumer.poll(0.2)
    if message is not None and message.error() is None:
        consumer.commit(message, asynchronous=False)
        print(json.dumps([message.partition(), message.offset()]), flush=True)
"""


def test_confluent_group_of_three_shares_six_partitions_and_a_killed_member_leaves_nothing_unread(agent: RunningAgent, catalog: Catalog) -> None:
    first_batch = produce(agent, 50)
    config = {"bootstrap.servers": agent.bootstrap, "group.id": "trio", "auto.offset.reset": "earliest",
              "heartbeat.interval.ms": 300, "session.timeout.ms": 2000, "enable.auto.commit": False, **FAST_CLIENT}
    process = subprocess.Popen([sys.executable, "-c", MEMBER_PROCESS, json.dumps(config), TOPIC], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    killed_consumed: list[tuple[int, int]] = []
    killed_first: list[float] = []
    try:
        assert process.stdout is not None and process.stdin is not None
        assert process.stdout.readline().strip() == "ready"

        def read_member() -> None:
            assert process.stdout is not None
            for line in process.stdout:
                killed_first.append(time.monotonic())
                killed_consumed.append(tuple(json.loads(line)))  # type: ignore[arg-type]

        reader = threading.Thread(target=read_member, daemon=True)
        reader.start()
        members = [group_member(agent, "trio", **{"enable.auto.commit": False}) for _ in range(2)]
        started = time.monotonic()
        process.stdin.write("go\n")
        process.stdin.flush()
        for member in members:
            member.subscribe([TOPIC])
        consumed: dict[int, list[tuple[int, int]]] = {0: [], 1: []}
        first: dict[int, float] = {}
        while len(killed_consumed) + len(consumed[0]) + len(consumed[1]) < len(first_batch) and time.monotonic() - started < 20:
            for index, member in enumerate(members):
                message = member.poll(0.05)
                if message is not None and message.error() is None:
                    first.setdefault(index, time.monotonic())
                    consumed[index].append((message.partition(), message.offset()))
                    member.commit(message, asynchronous=False)
        join_to_first_record = max(*first.values(), killed_first[0]) - started
        print(f"group of 3: join to every member's first record {join_to_first_record:.2f} s")
        assert join_to_first_record <= 5

        # Every partition assigned to exactly one member, every record consumed once.
        assignments = [{tp.partition for tp in member.assignment()} for member in members]
        killed_partitions = {partition for partition, _ in killed_consumed}
        assert sorted([*assignments[0], *assignments[1], *killed_partitions]) == list(range(PARTITIONS))
        everything = killed_consumed + consumed[0] + consumed[1]
        assert sorted(everything) == sorted(first_batch)

        admin = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
        described = admin.describe_consumer_groups(["trio"], request_timeout=10)["trio"].result(timeout=10)
        assert described.state == ConsumerGroupState.STABLE and len(described.members) == 3
        assert {m.assignment.topic_partitions[0].topic for m in described.members} == {TOPIC}

        process.kill()  # SIGKILL: no LeaveGroup; its session times out
        process.wait(timeout=10)
        reader.join(timeout=5)
        committed = GroupCatalog(catalog.engine).committed_offsets("trio")
        assert {partition: committed[(TOPIC, partition)].offset for partition in killed_partitions} == {partition: 50 for partition in killed_partitions}

        second_batch = produce(agent, 50, start=50)
        after: list[tuple[int, int]] = []
        deadline = time.monotonic() + 20
        settled = None  # polled on for half a second past the count, so a record consumed twice shows
        while (settled is None or time.monotonic() < settled) and time.monotonic() < deadline:
            for member in members:
                message = member.poll(0.05)
                if message is not None and message.error() is None:
                    after.append((message.partition(), message.offset()))
                    member.commit(message, asynchronous=False)
            if settled is None and len(after) >= len(second_batch):
                settled = time.monotonic() + 0.5
        # The survivors took the killed member's partitions from its committed offsets: every acked record of
        # the second batch consumed, none of the first again.
        assert sorted(after) == sorted(second_batch)
        assert sorted(p for member in members for p in (tp.partition for tp in member.assignment())) == list(range(PARTITIONS))
        for member in members:
            member.close()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
