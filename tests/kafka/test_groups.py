"""Consumer groups through `logcompact agent`: real clients in groups, and raw requests for
every version and Kafka's errors.

confluent-kafka (librdkafka 2.16) forms a group of 3 over 6 partitions, one member (a subprocess) is killed with
SIGKILL and the group rebalances after its session timeout; kafka-python, aiokafka and Debian's kcat (librdkafka
2.0.2, older protocol versions) consume and commit; committed offsets and generations survive an agent restart.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from sqlalchemy import update

from logcompact.catalog import Catalog, schema
from logcompact.kafka.handlers import APIS
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, RunningAgent
from tests.kafka.groups import COMMIT, DESCRIBE, FETCH, FIND, HEARTBEAT, JOIN, LEAVE, LIST, NONE, PARTITIONS, SYNC, TOPIC, group_member, join, join_body, produce
from tests.kafka.wire import Wire

pytestmark = pytest.mark.timeout(90)

# Kafka's error codes
UNKNOWN_TOPIC_OR_PARTITION, NOT_COORDINATOR, ILLEGAL_GENERATION, INCONSISTENT_GROUP_PROTOCOL = 3, 16, 22, 23
INVALID_GROUP_ID, UNKNOWN_MEMBER_ID, INVALID_SESSION_TIMEOUT, REBALANCE_IN_PROGRESS = 24, 25, 26, 27
INVALID_REQUEST, FENCED_INSTANCE_ID, COORDINATOR_NOT_AVAILABLE = 42, 82, 15


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
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
        committed = catalog.committed_offsets("trio")
        assert {partition: committed[(TOPIC, partition)].offset for partition in killed_partitions} == dict.fromkeys(killed_partitions, 50)

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


def test_offsets_and_generations_resume_after_an_agent_restart_with_kafka_python_then_aiokafka(catalog: Catalog) -> None:
    from aiokafka import AIOKafkaConsumer
    from kafka import KafkaConsumer

    first_agent = RunningAgent(catalog, flush_interval_ms=20)
    try:
        first_batch = produce(first_agent, 5)
        consumer = KafkaConsumer(TOPIC, bootstrap_servers=first_agent.bootstrap, group_id="resume", auto_offset_reset="earliest",
                                 enable_auto_commit=False, heartbeat_interval_ms=300, request_timeout_ms=10000)
        consumed: list[tuple[int, int]] = []
        deadline = time.monotonic() + 20
        while len(consumed) < len(first_batch) and time.monotonic() < deadline:
            for records in consumer.poll(timeout_ms=200).values():
                consumed.extend((record.partition, record.offset) for record in records)
        consumer.commit()
        consumer.close()
        assert sorted(consumed) == sorted(first_batch)
    finally:
        first_agent.stop()
    before = catalog.group("resume")
    assert before is not None and before.generation >= 1

    second_agent = RunningAgent(catalog, flush_interval_ms=20)  # a new agent on the same catalog
    try:
        second_batch = produce(second_agent, 5, start=5)

        async def consume_with_aiokafka() -> list[tuple[int, int]]:
            consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=second_agent.bootstrap, group_id="resume", auto_offset_reset="earliest",
                                        enable_auto_commit=False, heartbeat_interval_ms=300)
            await consumer.start()
            try:
                got: list[tuple[int, int]] = []
                settled = None
                deadline = time.monotonic() + 20
                while (settled is None or time.monotonic() < settled) and time.monotonic() < deadline:
                    for records in (await consumer.getmany(timeout_ms=200)).values():
                        got.extend((record.partition, record.offset) for record in records)
                    if settled is None and len(got) >= len(second_batch):
                        settled = time.monotonic() + 0.5
                await consumer.commit()
                return got
            finally:
                await consumer.stop()

        assert sorted(asyncio.run(consume_with_aiokafka())) == sorted(second_batch)  # from the committed offsets on
    finally:
        second_agent.stop()
    after = catalog.group("resume")
    assert after is not None and after.generation > before.generation  # generations continue from the row
    committed = catalog.committed_offsets("resume")
    assert {partition: committed[(TOPIC, partition)].offset for partition in range(PARTITIONS)} == dict.fromkeys(range(PARTITIONS), 10)


def test_kcat_consumes_in_a_group_and_commits(agent: RunningAgent, catalog: Catalog) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    produced = produce(agent, 3)
    done = subprocess.run(
        ["kcat", "-b", agent.bootstrap, "-G", "kcat-group", TOPIC, "-X", "auto.offset.reset=earliest", "-e", "-q", "-f", "%p %o\\n"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stderr
    consumed = sorted(tuple(int(n) for n in line.split()) for line in done.stdout.splitlines())
    assert consumed == sorted(produced)
    committed = catalog.committed_offsets("kcat-group")  # librdkafka commits as it closes
    assert {partition: committed[(TOPIC, partition)].offset for partition in range(PARTITIONS)} == dict.fromkeys(range(PARTITIONS), 3)


# -- raw requests -------------------------------------------------------------------------------------


@pytest.fixture
def wire(quick_agent: RunningAgent) -> Iterator[Wire]:
    connection = Wire(quick_agent)
    yield connection
    connection.close()


def commit_body(group: str, generation: int, member_id: str, offsets: dict[tuple[str, int], int]) -> dict[str, Any]:
    topics: dict[str, list[dict[str, Any]]] = {}
    for (topic, partition), offset in offsets.items():
        topics.setdefault(topic, []).append({"partition_index": partition, "committed_offset": offset, "committed_leader_epoch": 3, "committed_metadata": "meta",
                                             "commit_timestamp": -1})
    return {"group_id": group, "generation_id_or_member_epoch": generation, "member_id": member_id, "group_instance_id": None, "retention_time": -1,
            "topics": [{"name": name, "partitions": partitions} for name, partitions in topics.items()]}


def commit_errors(answer: Any) -> dict[tuple[str, int], int]:
    return {(topic.name, int(p.partition_index)): int(p.error_code) for topic in answer.topics for p in topic.partitions}



@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)  # a row held alone: SQLite would hold every write
def test_an_offset_commit_not_written_within_the_commit_timeout_is_answered_coordinator_not_available(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    """While another transaction holds a group's committed-offset row, a commit of it is answered
    COORDINATOR_NOT_AVAILABLE once it has not been written for offsets.commit.timeout.ms (Kafka's answer to an offsets
    append that timed out), with one warning line; once the row is free the client's retry is written and read back."""
    timeout_ms = 500
    agent = RunningAgent(catalog, flush_interval_ms=20, offsets_commit_timeout_ms=timeout_ms)
    wire = Wire(agent)
    try:
        assert set(commit_errors(wire.call(COMMIT, 8, commit_body("g", -1, "", {(TOPIC, 0): 1}))).values()) == {NONE}
        holder = catalog.engine.connect()
        holder.begin()
        rows = schema.group_offsets
        holder.execute(update(rows).where(rows.c.group_id == "g").values(commit_ms=rows.c.commit_ms))
        try:
            started = time.monotonic()
            with caplog.at_level(logging.WARNING, logger="logcompact.kafka"):
                answer = wire.call(COMMIT, 8, commit_body("g", -1, "", {(TOPIC, 0): 2}))
            waited = time.monotonic() - started
            assert set(commit_errors(answer).values()) == {COORDINATOR_NOT_AVAILABLE}
            assert timeout_ms / 1000 <= waited < timeout_ms / 1000 + 3  # the bound, with room for a loaded machine
        finally:
            holder.close()  # rolls back: the row is free
        assert [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")] == [
            f"offset commit of group 'g' not written within offsets.commit.timeout.ms ({timeout_ms} ms): answered "
            "COORDINATOR_NOT_AVAILABLE, the client commits again"]
        assert set(commit_errors(wire.call(COMMIT, 8, commit_body("g", -1, "", {(TOPIC, 0): 3}))).values()) == {NONE}
        fetched = wire.call(FETCH, 8, {"groups": [{"group_id": "g", "topics": [{"name": TOPIC, "partition_indexes": [0]}]}], "require_stable": False})
        assert [int(p.committed_offset) for g in fetched.groups for t in g.topics for p in t.partitions] == [3]
    finally:
        wire.close()
        agent.stop()

@pytest.mark.parametrize("version", range(APIS[JOIN].min_version, APIS[JOIN].max_version + 1))
def test_a_member_joins_syncs_heartbeats_commits_and_leaves_with_every_version(wire: Wire, version: int) -> None:
    group = f"raw-{version}"
    sync_v, heartbeat_v, leave_v, commit_v, fetch_v = min(version, 5), min(version, 4), min(version, 5), min(version, 8), min(version, 8)
    joined = join(wire, version, group)
    assert int(joined.error_code) == NONE and joined.leader == joined.member_id and joined.generation_id == 1
    assert [m.member_id for m in joined.members] == [joined.member_id] and joined.members[0].metadata == b"m"
    member, generation = joined.member_id, joined.generation_id

    synced = wire.call(SYNC, sync_v, {"group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": None,
                                      "protocol_type": "consumer", "protocol_name": "range", "assignments": [{"member_id": member, "assignment": b"all"}]})
    assert (int(synced.error_code), synced.assignment) == (NONE, b"all")
    beat = {"group_id": group, "generation_id": generation, "member_id": member, "group_instance_id": None}
    assert int(wire.call(HEARTBEAT, heartbeat_v, beat).error_code) == NONE
    assert int(wire.call(HEARTBEAT, heartbeat_v, {**beat, "generation_id": generation + 1}).error_code) == ILLEGAL_GENERATION

    offsets = {(TOPIC, 0): 7, (TOPIC, 5): 9, ("no-such-topic", 0): 1}
    committed = wire.call(COMMIT, commit_v, commit_body(group, generation if commit_v >= 1 else -1, member if commit_v >= 1 else "", offsets))
    if commit_v >= 1:
        assert commit_errors(committed) == {(TOPIC, 0): NONE, (TOPIC, 5): NONE, ("no-such-topic", 0): UNKNOWN_TOPIC_OR_PARTITION}
    else:  # v0 names no generation: refused while the group has members
        assert set(commit_errors(committed).values()) == {UNKNOWN_MEMBER_ID}
    asked = [{"name": TOPIC, "partition_indexes": [0, 1, 5]}]
    if fetch_v >= 8:
        fetched = wire.call(FETCH, fetch_v, {"groups": [{"group_id": group, "topics": asked}, {"group_id": "never-committed", "topics": asked}], "require_stable": False})
        assert [int(g.error_code) for g in fetched.groups] == [NONE, NONE]
        partitions = {int(p.partition_index): (int(p.committed_offset), p.metadata) for p in fetched.groups[0].topics[0].partitions}
        assert {int(p.committed_offset) for p in fetched.groups[1].topics[0].partitions} == {-1}
    else:
        fetched = wire.call(FETCH, fetch_v, {"group_id": group, "topics": asked, "require_stable": False})
        partitions = {int(p.partition_index): (int(p.committed_offset), p.metadata) for p in fetched.topics[0].partitions}
    expected = {0: (7, "meta"), 1: (-1, ""), 5: (9, "meta")} if commit_v >= 1 else {0: (-1, ""), 1: (-1, ""), 5: (-1, "")}
    assert partitions == expected

    left = wire.call(LEAVE, leave_v, {"group_id": group, "member_id": member, "members": [{"member_id": member, "group_instance_id": None}]})
    assert int(left.error_code) == NONE
    assert int(wire.call(HEARTBEAT, heartbeat_v, beat).error_code) == UNKNOWN_MEMBER_ID
    listed = wire.call(LIST, 4, {"states_filter": ["empty"]})
    assert (group, "consumer", "Empty") in [(g.group_id, g.protocol_type, g.group_state) for g in listed.groups]


def test_bad_group_requests_get_kafkas_errors(wire: Wire, quick_agent: RunningAgent) -> None:
    assert int(wire.call(JOIN, 5, join_body("")).error_code) == INVALID_GROUP_ID
    assert int(wire.call(JOIN, 5, join_body("g", session_ms=10)).error_code) == INVALID_SESSION_TIMEOUT
    assert int(wire.call(JOIN, 5, join_body("g", protocols=[])).error_code) == INCONSISTENT_GROUP_PROTOCOL
    assert int(wire.call(JOIN, 5, join_body("g", member_id="made-up")).error_code) == UNKNOWN_MEMBER_ID  # an unknown group
    first = join(wire, 5, "g")
    assert int(first.error_code) == NONE
    # another protocol type, or no protocol in common with the members, while the group has members
    assert int(wire.call(JOIN, 5, join_body("g", protocol_type="connect")).error_code) == INCONSISTENT_GROUP_PROTOCOL
    assert int(wire.call(JOIN, 5, join_body("g", protocols=[("roundrobin", b"")])).error_code) == INCONSISTENT_GROUP_PROTOCOL
    sync = {"group_id": "g", "generation_id": first.generation_id, "member_id": "nobody", "group_instance_id": None, "assignments": []}
    assert int(wire.call(SYNC, 3, sync).error_code) == UNKNOWN_MEMBER_ID
    assert int(wire.call(SYNC, 5, {**sync, "member_id": first.member_id, "protocol_type": "consumer", "protocol_name": "sticky"}).error_code) == INCONSISTENT_GROUP_PROTOCOL
    # a new generation is being formed (the member rejoins with other protocols): its SyncGroup and heartbeats say so
    wire.send(JOIN, 5, join_body("g", member_id=first.member_id, protocols=[("range", b"changed")]))
    second = wire.receive()
    assert second.generation_id == first.generation_id + 1
    assert int(wire.call(SYNC, 3, {**sync, "member_id": first.member_id}).error_code) == ILLEGAL_GENERATION

    offsets = {(TOPIC, 0): 1}
    assert set(commit_errors(wire.call(COMMIT, 8, commit_body("g", second.generation_id, "nobody", offsets))).values()) == {UNKNOWN_MEMBER_ID}
    assert set(commit_errors(wire.call(COMMIT, 8, commit_body("g", first.generation_id, second.member_id, offsets))).values()) == {ILLEGAL_GENERATION}
    # commits outside group management (generation -1): refused while the group has members, taken by a group without
    assert set(commit_errors(wire.call(COMMIT, 8, commit_body("g", -1, "", offsets))).values()) == {UNKNOWN_MEMBER_ID}
    assert set(commit_errors(wire.call(COMMIT, 8, commit_body("unknown-group", 4, "m", offsets))).values()) == {ILLEGAL_GENERATION}
    assert set(commit_errors(wire.call(COMMIT, 8, commit_body("assigns-itself", -1, "", offsets))).values()) == {NONE}
    described = wire.call(DESCRIBE, 5, {"groups": ["g", "assigns-itself", "never-seen"], "include_authorized_operations": False})
    assert [(d.group_id, d.group_state, len(d.members)) for d in described.groups] == [("g", "CompletingRebalance", 1), ("assigns-itself", "Empty", 0), ("never-seen", "Dead", 0)]

    found = wire.call(FIND, 4, {"key_type": 0, "coordinator_keys": ["g", "h"]})
    port = quick_agent.server.address.port
    assert [(c.key, int(c.error_code), c.port) for c in found.coordinators] == [("g", NONE, port), ("h", NONE, port)]
    assert (int(wire.call(FIND, 3, {"key": "txn", "key_type": 1}).error_code), wire.call(FIND, 3, {"key": "txn", "key_type": 1}).port) == (NONE, port)
    assert int(wire.call(FIND, 3, {"key": "txn", "key_type": 2}).error_code) == INVALID_REQUEST
    assert (int(wire.call(FIND, 0, {"key": "g"}).error_code), wire.call(FIND, 0, {"key": "g"}).port) == (NONE, port)


def test_static_members_are_fenced_by_the_instance_that_takes_their_id(wire: Wire) -> None:
    first = join(wire, 5, "static", instance_id="host-1")
    assert int(first.error_code) == NONE
    wire.call(SYNC, 5, {"group_id": "static", "generation_id": first.generation_id, "member_id": first.member_id, "group_instance_id": "host-1",
                        "protocol_type": "consumer", "protocol_name": "range", "assignments": [{"member_id": first.member_id, "assignment": b"p0"}]})
    restarted = join(wire, 5, "static", instance_id="host-1")  # the same instance, restarted: no rebalance
    assert (int(restarted.error_code), restarted.generation_id) == (NONE, first.generation_id)
    assert restarted.member_id != first.member_id
    old = {"group_id": "static", "generation_id": first.generation_id, "member_id": first.member_id, "group_instance_id": "host-1"}
    assert int(wire.call(HEARTBEAT, 4, old).error_code) == FENCED_INSTANCE_ID
    assert int(wire.call(HEARTBEAT, 4, {**old, "member_id": restarted.member_id}).error_code) == NONE


def test_a_waiting_join_group_holds_up_only_the_answers_behind_it(agent: RunningAgent) -> None:
    """A JoinGroup waits out the initial rebalance delay (1 s): the Heartbeat pipelined behind it on its connection
    is answered after it, in order, and other connections are served meanwhile."""
    waiting, other = Wire(agent), Wire(agent)
    try:
        started = time.monotonic()
        waiting.send(JOIN, 3, join_body("slow"))
        waiting.send(HEARTBEAT, 3, {"group_id": "slow", "generation_id": 0, "member_id": "nobody", "group_instance_id": None})
        time.sleep(0.2)
        listed = other.call(LIST, 4, {"states_filter": []})
        assert ("slow", "PreparingRebalance") in [(g.group_id, g.group_state) for g in listed.groups]
        assert time.monotonic() - started < 0.9
        joined = waiting.receive()
        assert int(joined.error_code) == NONE and time.monotonic() - started >= 0.9
        assert int(waiting.receive().error_code) == UNKNOWN_MEMBER_ID
    finally:
        waiting.close()
        other.close()


def test_list_groups_reads_the_rows_again_when_a_group_leaves_memory_while_they_are_read() -> None:
    """The race the full suite once hit: an Empty group's newest row is written, and the group leaves memory, while
    ListGroups reads the rows. The rows read before that write still say PreparingRebalance; the group must not
    vanish from a listing of Empty groups."""
    from types import SimpleNamespace

    from logcompact.catalog.groups import GroupListed
    from logcompact.kafka import codec
    from logcompact.kafka.authorizer import AclAuthorizer
    from logcompact.kafka.handlers.groups import LIST_GROUPS, list_groups

    def row(state: str) -> GroupListed:
        return GroupListed("g", "consumer", state)

    held = [SimpleNamespace(group_id="g", protocol_type="consumer", state="Empty")]
    reads: list[str] = []

    def catalog_rows() -> list[GroupListed]:
        if not reads:  # the first read sees the row before the writer's; then the writer writes it and unloads the group
            reads.append("stale")
            held.clear()
            return [row("PreparingRebalance")]
        reads.append("fresh")
        return [row("Empty")]

    groups = SimpleNamespace(all_groups=lambda: list(held), catalog=SimpleNamespace(groups=catalog_rows))
    broker = SimpleNamespace(node_id=1, groups=groups, agents=SimpleNamespace(coordinator_for=lambda group_id: SimpleNamespace(node_id=1)),
                             authorizer=AclAuthorizer.disabled())
    request = codec.Request(LIST_GROUPS, 4, 1, "test", SimpleNamespace(states_filter=["empty"]))
    listed = asyncio.run(list_groups(broker, request))  # type: ignore[arg-type]
    assert [(g.group_id, g.group_state) for g in listed.groups] == [("g", "Empty")] and reads == ["stale", "fresh"]
