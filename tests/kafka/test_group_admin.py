"""Consumer groups' hygiene against a real agent: DeleteGroups and OffsetDelete through confluent-kafka's and
kafka-python's admin clients and raw requests, with Kafka's errors (NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND,
GROUP_SUBSCRIBED_TO_TOPIC); listing and altering offsets; offsets expired after offsets.retention.minutes and dropped
with their topic; and Kafka's own kafka-consumer-groups.sh (--list, --describe with lag, --reset-offsets --execute,
--delete, --delete-offsets) against the agent, each compared with `logcompact groups` on the same group."""

from __future__ import annotations

import json
import subprocess
import time
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient
from kafka import TopicPartition as KafkaTopicPartition
from kafka.admin import KafkaAdminClient

from lab.servers.kafka import kafka_missing_reason, tool_argv
from logcompact.catalog import Catalog
from logcompact.catalog.groups import CommittedOffset
from logcompact.cli import cli
from logcompact.kafka.handlers import APIS
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent
from tests.kafka.groups import group_member, produce
from tests.kafka.wire import Wire

pytestmark = pytest.mark.timeout(240)

TOPIC, OTHER, DOOMED, PARTITIONS = "events", "audit", "doomed", 6
DELETE_GROUPS, OFFSET_DELETE = 42, 47
NONE, UNKNOWN_TOPIC_OR_PARTITION, UNKNOWN_MEMBER_ID, INVALID_GROUP_ID = 0, 3, 25, 24
NON_EMPTY_GROUP, GROUP_ID_NOT_FOUND, GROUP_SUBSCRIBED_TO_TOPIC = 68, 69, 86
CONSUMER_GROUP_COMMAND = "org.apache.kafka.tools.consumer.group.ConsumerGroupCommand"


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, TOPIC, PARTITIONS)
    create_topic(catalog, OTHER, 2)
    create_topic(catalog, DOOMED, 1)
    return catalog


def admin_client(agent: RunningAgent) -> AdminClient:
    return AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})


def error_code(future: Any) -> int:
    try:
        future.result(timeout=15)
    except KafkaException as exc:
        return int(exc.args[0].code())
    return NONE


def commit(agent: RunningAgent, group: str, offsets: dict[tuple[str, int], int]) -> None:
    """Offsets committed by an admin (no member), as a consumer that assigns its own partitions commits them."""
    request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, partition, offset) for (topic, partition), offset in offsets.items()])
    admin = admin_client(agent)  # kept till the answer: a client destroyed fails its futures
    [done] = admin.alter_consumer_group_offsets([request]).values()
    assert all(tp.error is None for tp in done.result(timeout=15).topic_partitions)


def stable_member(agent: RunningAgent, group: str, topics: list[str]) -> Consumer:
    """A confluent-kafka consumer of `topics` in `group`, once it has its partitions and committed where it is."""
    consumer = group_member(agent, group, **{"enable.auto.commit": False})
    consumer.subscribe(topics)
    deadline = time.monotonic() + 60
    while not consumer.assignment():
        assert time.monotonic() < deadline, "no assignment"
        consumer.poll(0.2)
    for _ in range(20):
        consumer.poll(0.1)
    consumer.commit(offsets=[TopicPartition(tp.topic, tp.partition, 1) for tp in consumer.assignment()], asynchronous=False)
    return consumer


def call(agent: RunningAgent, api_key: int, version: int, body: dict[str, Any]) -> Any:
    wire = Wire(agent)
    try:
        return wire.call(api_key, version, body)
    finally:
        wire.close()


def offset_delete(agent: RunningAgent, group: str, partitions: dict[str, list[int]]) -> tuple[int, dict[tuple[str, int], int]]:
    answer = call(agent, OFFSET_DELETE, 0, {"group_id": group, "topics": [
        {"name": name, "partitions": [{"partition_index": index} for index in indexes]} for name, indexes in partitions.items()]})
    return int(answer.error_code), {(t.name, int(p.partition_index)): int(p.error_code) for t in answer.topics for p in t.partitions}


def test_the_agent_advertises_delete_groups_0_to_2_and_offset_delete_0() -> None:
    assert (APIS[DELETE_GROUPS].min_version, APIS[DELETE_GROUPS].max_version) == (0, 2)
    assert (APIS[OFFSET_DELETE].min_version, APIS[OFFSET_DELETE].max_version) == (0, 0)


def test_confluent_deletes_an_empty_group_and_is_told_non_empty_and_not_found(agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 3)
    commit(agent, "idle", {(TOPIC, 0): 2, (TOPIC, 1): 3})
    busy = stable_member(agent, "busy", [TOPIC])
    try:
        admin = admin_client(agent)
        results = admin.delete_consumer_groups(["idle", "busy", "ghost"])
        assert {group: error_code(future) for group, future in results.items()} == {"idle": NONE, "busy": NON_EMPTY_GROUP, "ghost": GROUP_ID_NOT_FOUND}
        assert catalog.group("idle") is None and catalog.committed_offsets("idle") == {}
        assert catalog.committed_offsets("busy")  # kept, with its group
        [described] = admin.describe_consumer_groups(["idle"]).values()
        assert described.result(timeout=15).state.name == "DEAD"  # as Kafka describes a group it does not know
        listed = admin.list_consumer_groups().result(timeout=15)
        assert {group.group_id for group in listed.valid} == {"busy"}
    finally:
        busy.close()
    # the member left: the group is Empty and goes too
    admin = admin_client(agent)
    [deleted] = admin.delete_consumer_groups(["busy"]).values()
    assert error_code(deleted) == NONE
    assert catalog.group("busy") is None and catalog.committed_offsets("busy") == {}


def test_a_deleted_group_leaves_the_coordinators_memory_and_starts_anew(agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 2)
    member = stable_member(agent, "again", [TOPIC])
    member.close()
    groups, admin = agent.server.broker.groups, admin_client(agent)
    [deleted] = admin.delete_consumer_groups(["again"]).values()
    assert error_code(deleted) == NONE
    assert groups.known("again") is None and catalog.group("again") is None
    # a consumer of the same id later finds a new group: generation 1, no offsets, reading from the start
    rejoined = stable_member(agent, "again", [TOPIC])
    try:
        row = catalog.group("again")
        assert row is not None and row.generation == 1
    finally:
        rejoined.close()


def test_confluent_lists_and_alters_offsets_and_an_active_group_refuses_them(agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 5)
    commit(agent, "tools", {(TOPIC, 0): 4, (OTHER, 1): 0})
    admin = admin_client(agent)
    [listed] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("tools")]).values()
    assert {(tp.topic, tp.partition): tp.offset for tp in listed.result(timeout=15).topic_partitions} == {(TOPIC, 0): 4, (OTHER, 1): 0}
    commit(agent, "tools", {(TOPIC, 0): 1})
    assert catalog.committed_offsets("tools")[(TOPIC, 0)].offset == 1
    busy = stable_member(agent, "active", [TOPIC])
    try:
        request = ConsumerGroupTopicPartitions("active", [TopicPartition(TOPIC, 0, 0)])
        [refused] = admin.alter_consumer_group_offsets([request]).values()
        # as Kafka: a commit without a member to a group with members is UNKNOWN_MEMBER_ID
        with pytest.raises(KafkaException) as failure:
            errors = [tp.error for tp in refused.result(timeout=15).topic_partitions]
            raise KafkaException(errors[0])
        assert failure.value.args[0].code() == UNKNOWN_MEMBER_ID
    finally:
        busy.close()


def test_kafka_python_deletes_groups_with_kafkas_errors(agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 2)
    commit(agent, "kp-idle", {(TOPIC, 2): 1})
    busy = stable_member(agent, "kp-busy", [TOPIC])
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap, request_timeout_ms=15000)
    try:
        assert admin.delete_groups(["kp-idle", "kp-busy", "kp-ghost"]) == {
            "kp-idle": "OK", "kp-busy": "NonEmptyGroupError", "kp-ghost": "GroupIdNotFoundError"}
        assert catalog.committed_offsets("kp-idle") == {}
        commit(agent, "kp-idle", {(TOPIC, 2): 1, (OTHER, 0): 1})
        deleted = admin.delete_group_offsets("kp-idle", [KafkaTopicPartition(OTHER, 0), KafkaTopicPartition("nowhere", 0)])  # OffsetDelete
        assert {(tp.topic, tp.partition): error.__name__ for tp, error in deleted.items()} == {
            (OTHER, 0): "NoError", ("nowhere", 0): "UnknownTopicOrPartitionError"}
        assert set(catalog.committed_offsets("kp-idle")) == {(TOPIC, 2)}
    finally:
        admin.close()
        busy.close()


def test_offset_delete_keeps_the_topics_a_stable_group_consumes(agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 2)
    member = stable_member(agent, "subscriber", [TOPIC])
    try:
        catalog.commit_offsets("subscriber", {(OTHER, 0): CommittedOffset(7, -1, "", 0), (OTHER, 1): CommittedOffset(8, -1, "", 0)})
        error, partitions = offset_delete(agent, "subscriber", {TOPIC: [0, 1], OTHER: [0], "nowhere": [0]})
        assert error == NONE
        assert partitions == {(TOPIC, 0): GROUP_SUBSCRIBED_TO_TOPIC, (TOPIC, 1): GROUP_SUBSCRIBED_TO_TOPIC, (OTHER, 0): NONE,
                              ("nowhere", 0): UNKNOWN_TOPIC_OR_PARTITION}
        kept = catalog.committed_offsets("subscriber")
        assert (OTHER, 0) not in kept and (OTHER, 1) in kept and (TOPIC, 0) in kept
    finally:
        member.close()
    # Empty now: every partition's offsets may go
    assert offset_delete(agent, "subscriber", {TOPIC: [0]}) == (NONE, {(TOPIC, 0): NONE})
    assert (TOPIC, 0) not in catalog.committed_offsets("subscriber")
    assert offset_delete(agent, "nobody", {TOPIC: [0]}) == (GROUP_ID_NOT_FOUND, {})
    assert offset_delete(agent, "", {TOPIC: [0]}) == (INVALID_GROUP_ID, {})


def test_an_empty_groups_offsets_expire_after_the_retention_and_the_group_with_them(catalog: Catalog) -> None:
    agent = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, offsets_retention_ms=1, offsets_retention_check_interval_ms=3_600_000)
    try:
        produce(agent, 2)
        commit(agent, "standalone", {(TOPIC, 0): 1})
        member = stable_member(agent, "consumers", [TOPIC])
        catalog.commit_offsets("consumers", {(OTHER, 0): CommittedOffset(3, -1, "", 0)})
        time.sleep(0.01)  # past the 1 ms retention
        groups, broker = agent.server.broker.groups, agent.server.broker
        expired = agent.call(groups.expire_offsets(broker.coordinates))
        # the standalone group's offset and the stable group's offset of a topic it does not consume
        assert expired == 2
        assert catalog.committed_offsets("standalone") == {} and catalog.group("standalone") is None
        assert set(catalog.committed_offsets("consumers")) == {(TOPIC, p) for p in range(PARTITIONS)}
        member.close()
        time.sleep(0.01)
        assert agent.call(groups.expire_offsets(broker.coordinates)) == PARTITIONS
        assert catalog.committed_offsets("consumers") == {} and catalog.group("consumers") is None
    finally:
        agent.stop()


def test_the_retention_task_expires_offsets_on_its_own_and_keeps_those_within_it(catalog: Catalog) -> None:
    short = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, offsets_retention_ms=200, offsets_retention_check_interval_ms=50)
    try:
        produce(short, 1)
        commit(short, "fleeting", {(TOPIC, 0): 1})
        deadline = time.monotonic() + 30
        while catalog.committed_offsets("fleeting"):
            assert time.monotonic() < deadline, "the offsets did not expire"
            time.sleep(0.05)
        assert catalog.group("fleeting") is None
    finally:
        short.stop()
    default = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, offsets_retention_check_interval_ms=50)  # 7 days
    try:
        commit(default, "lasting", {(TOPIC, 0): 1})
        assert default.call(default.server.broker.groups.expire_offsets(default.server.broker.coordinates)) == 0
        assert catalog.committed_offsets("lasting")
    finally:
        default.stop()


def test_a_deleted_topics_offsets_disappear(agent: RunningAgent, catalog: Catalog) -> None:
    commit(agent, "mixed", {(DOOMED, 0): 0, (TOPIC, 0): 0})
    admin = admin_client(agent)
    [deleted] = admin.delete_topics([DOOMED]).values()
    deleted.result(timeout=15)
    assert set(catalog.committed_offsets("mixed")) == {(TOPIC, 0)}
    [listed] = admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions("mixed")]).values()
    assert [(tp.topic, tp.partition) for tp in listed.result(timeout=15).topic_partitions] == [(TOPIC, 0)]


# -- Kafka's kafka-consumer-groups.sh against the agent, beside `logcompact groups` ----------------------------------


@pytest.fixture(scope="module")
def java() -> None:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)


def kafka_groups(agent: RunningAgent, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(tool_argv(CONSUMER_GROUP_COMMAND, "--bootstrap-server", agent.bootstrap, *args), capture_output=True, text=True, timeout=120)


def logcompact_groups(catalog: Catalog, *args: str) -> Any:
    done = CliRunner().invoke(cli, ["--store", catalog.store.uri, "--catalog", catalog.url, "groups", *args, "--json"])
    assert done.exit_code == 0, done.output
    return [json.loads(line) for line in done.output.splitlines()]


def table(output: str) -> list[list[str]]:
    """The rows under the header of kafka-consumer-groups.sh's table, split on blanks."""
    lines = [line.split() for line in output.splitlines() if line.strip()]
    start = next(n for n, line in enumerate(lines) if line[0] == "GROUP")
    return [line for line in lines[start + 1:] if line and line[0] != "GROUP"]


def test_kafka_consumer_groups_lists_and_describes_with_lag_as_logcompact_groups(java: None, agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 4)
    commit(agent, "offline", {(OTHER, 0): 0})
    member = stable_member(agent, "reader", [TOPIC])
    try:
        listed = kafka_groups(agent, "--list")
        assert listed.returncode == 0, listed.stderr
        assert set(listed.stdout.split()) == {"offline", "reader"} == {line["group"] for line in logcompact_groups(catalog, "list")}
        described = kafka_groups(agent, "--describe", "--group", "reader")
        assert described.returncode == 0, described.stderr
        rows = {(row[1], int(row[2])): row for row in table(described.stdout)}
        [ours] = logcompact_groups(catalog, "describe", "reader")
        assert ours["state"] == "Stable" and ours["protocol_type"] == "consumer" and ours["protocol"]
        assert set(rows) == {(p["topic"], p["partition"]) for p in ours["partitions"]} == {(TOPIC, p) for p in range(PARTITIONS)}
        for shown in ours["partitions"]:
            theirs = rows[(shown["topic"], shown["partition"])]
            # CURRENT-OFFSET LOG-END-OFFSET LAG CONSUMER-ID HOST CLIENT-ID
            assert theirs[3:9] == [str(shown["committed_offset"]), str(shown["log_end_offset"]), str(shown["lag"]), shown["member_id"],
                                   shown["host"], shown["client_id"]]
            assert shown["committed_offset"] == 1 and shown["lag"] == 3
        assert shown["host"] == "/127.0.0.1"
        state = kafka_groups(agent, "--describe", "--group", "reader", "--state")
        [[_, _coordinator, _node, strategy, kafka_state, members]] = table(state.stdout)
        assert (strategy, kafka_state, int(members)) == (ours["protocol"], ours["state"], len(ours["members"]))
        # a group with members is refused a reset and a delete, by both
        refused = kafka_groups(agent, "--reset-offsets", "--group", "reader", "--topic", TOPIC, "--to-earliest", "--execute")
        assert "inactive" in refused.stdout + refused.stderr
        ours_refused = CliRunner().invoke(cli, ["--store", catalog.store.uri, "--catalog", catalog.url, "groups", "reset-offsets", "reader",
                                                "--topic", TOPIC, "--to-earliest", "--execute"])
        assert ours_refused.exit_code == 1 and "it is Stable" in ours_refused.output and len(ours_refused.output.splitlines()) == 1
    finally:
        member.close()


def test_kafka_consumer_groups_resets_deletes_offsets_and_deletes_as_logcompact_groups(java: None, agent: RunningAgent, catalog: Catalog) -> None:
    produce(agent, 4)
    commit(agent, "resettable", {(TOPIC, p): 3 for p in range(PARTITIONS)} | {(OTHER, 0): 0, (OTHER, 1): 0})
    plan = kafka_groups(agent, "--reset-offsets", "--group", "resettable", "--topic", f"{TOPIC}:0,1", "--to-earliest", "--dry-run")
    ours = logcompact_groups(catalog, "reset-offsets", "resettable", "--topic", f"{TOPIC}:0,1", "--to-earliest")
    assert {(row[1], int(row[2]), int(row[3])) for row in table(plan.stdout)} == {(r["topic"], r["partition"], r["new_offset"]) for r in ours} \
        == {(TOPIC, 0, 0), (TOPIC, 1, 0)}
    assert catalog.committed_offsets("resettable")[(TOPIC, 0)].offset == 3  # a dry run, both
    done = kafka_groups(agent, "--reset-offsets", "--group", "resettable", "--topic", TOPIC, "--to-earliest", "--execute")
    assert done.returncode == 0, done.stderr
    assert {key[1]: committed.offset for key, committed in catalog.committed_offsets("resettable").items() if key[0] == TOPIC} == dict.fromkeys(range(PARTITIONS), 0)
    ours = logcompact_groups(catalog, "reset-offsets", "resettable", "--topic", TOPIC, "--shift-by", "2", "--execute")
    assert {r["new_offset"] for r in ours} == {2} and all(r["executed"] for r in ours)
    described = kafka_groups(agent, "--describe", "--group", "resettable")
    assert {(row[1], int(row[2]), row[3], row[5]) for row in table(described.stdout)} == \
        {(p["topic"], p["partition"], str(p["committed_offset"]), str(p["lag"])) for p in logcompact_groups(catalog, "describe", "resettable")[0]["partitions"]}
    removed = kafka_groups(agent, "--delete-offsets", "--group", "resettable", "--topic", OTHER)
    assert removed.returncode == 0, removed.stderr
    assert not {key for key in catalog.committed_offsets("resettable") if key[0] == OTHER}
    deleted = kafka_groups(agent, "--delete", "--group", "resettable")
    assert deleted.returncode == 0 and "successful" in deleted.stdout, deleted.stdout + deleted.stderr
    assert "resettable" not in {line["group"] for line in logcompact_groups(catalog, "list")}
    commit(agent, "ours-to-delete", {(TOPIC, 0): 1})
    # `logcompact groups delete` works on the catalog behind the agents: once the coordinator has written the new
    # group's row and let the Empty group leave its memory (docs/agent.md)
    deadline = time.monotonic() + 30
    while catalog.group("ours-to-delete") is None or agent.server.broker.groups.known("ours-to-delete") is not None:
        assert time.monotonic() < deadline, "the coordinator kept the Empty group"
        time.sleep(0.02)
    assert logcompact_groups(catalog, "delete", "ours-to-delete") == [{"deleted": "ours-to-delete"}]
    assert "ours-to-delete" not in kafka_groups(agent, "--list").stdout.split()
    gone = kafka_groups(agent, "--delete", "--group", "ours-to-delete")
    assert "does not exist" in gone.stdout + gone.stderr



def test_with_two_agents_only_the_groups_coordinator_deletes_it_and_expires_its_offsets(catalog: Catalog) -> None:
    first = RunningAgent(Catalog(catalog.store, catalog.url), flush_interval_ms=FLUSH_MS, offsets_retention_ms=1,
                         offsets_retention_check_interval_ms=3_600_000)
    second = RunningAgent(Catalog(catalog.store, catalog.url), flush_interval_ms=FLUSH_MS, offsets_retention_ms=1,
                          offsets_retention_check_interval_ms=3_600_000)
    try:
        first.server.broker.agents.refresh()  # as its next heartbeat would: the second agent started after it
        theirs = next(g for g in (f"group-{n}" for n in range(100)) if first.server.broker.agents.coordinator_for(g).node_id == second.server.broker.node_id)
        catalog.commit_offsets(theirs, {(TOPIC, 0): CommittedOffset(1, -1, "", 0)})
        deleted = call(first, DELETE_GROUPS, 2, {"groups_names": [theirs]})
        assert [int(result.error_code) for result in deleted.results] == [16]  # NOT_COORDINATOR: the client asks FindCoordinator
        assert call(first, OFFSET_DELETE, 0, {"group_id": theirs, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}]}).error_code == 16
        assert first.call(first.server.broker.groups.expire_offsets(first.server.broker.coordinates)) == 0  # not its group
        assert catalog.committed_offsets(theirs)
        admin = AdminClient({"bootstrap.servers": first.bootstrap, **FAST_CLIENT})  # finds the coordinator, the second agent
        [result] = admin.delete_consumer_groups([theirs]).values()
        assert error_code(result) == NONE and catalog.committed_offsets(theirs) == {}
        catalog.commit_offsets(theirs, {(TOPIC, 0): CommittedOffset(1, -1, "", 0)})
        assert second.call(second.server.broker.groups.expire_offsets(second.server.broker.coordinates)) == 1
    finally:
        second.stop()
        first.stop()
