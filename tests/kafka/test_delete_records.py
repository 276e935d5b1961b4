"""DeleteRecords (key 21) against an agent: confluent-kafka's and kafka-python's AdminClients raise a partition's log
start, consumers of each client then start there, ListOffsets(earliest) answers it and a Fetch below it is
OFFSET_OUT_OF_RANGE; refusals are Kafka's (POLICY_VIOLATION for a compacted-only topic, OFFSET_OUT_OF_RANGE beyond
the high watermark, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED without DELETE); `logcompact topic
delete-records` does the same from the catalog, and a compaction after it keeps the log start."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaConsumer
from aiokafka import TopicPartition as AioTopicPartition
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.admin import KafkaAdminClient

from lab.servers.kafka import KafkaServer, kafka_missing_reason, tool_argv
from logcompact.catalog import Catalog
from logcompact.catalog.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from logcompact.kafka.authorizer import AuthorizerSettings
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment, confluent_consumer, consume
from tests.kafka.wire import kio_exchange

pytestmark = pytest.mark.timeout(120)

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, TOPIC_AUTHORIZATION_FAILED, POLICY_VIOLATION = 0, 1, 3, 29, 44
RECORDS = 100
TOOL_TIMEOUT_S = 180  # a JVM's start on a loaded two-core machine


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "events", 2)
    create_topic(catalog, "profiles", 1, cleanup_policy="compact")
    create_topic(catalog, "sessions", 1, cleanup_policy="compact,delete")
    return catalog


def fill(agent: RunningAgent, topic: str, partitions: int) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    for partition in range(partitions):
        for n in range(RECORDS):
            producer.produce(topic, key=f"k{n}".encode(), value=f"v{n}".encode(), partition=partition)
    assert producer.flush(30) == 0


def admin_client(agent: RunningAgent) -> AdminClient:
    return AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})


def delete_records(agent: RunningAgent, topic: str, before: dict[int, int], version: int = 2):
    answer = kio_exchange(agent.server, 21, version, {
        "topics": [{"name": topic, "partitions": [{"partition_index": p, "offset": o} for p, o in before.items()]}], "timeout": 1000})
    return {p.partition_index: (p.error_code, p.low_watermark) for p in answer.topics[0].partitions}


def list_offset(agent: RunningAgent, topic: str, partition: int, timestamp: int = -2) -> int:
    """ListOffsets v7: earliest (-2), or the first offset at or after a timestamp."""
    answer = kio_exchange(agent.server, 2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [
        {"name": topic, "partitions": [{"partition_index": partition, "current_leader_epoch": -1, "timestamp": timestamp}]}]})
    return answer.topics[0].partitions[0].offset


def test_confluent_delete_records_then_consumers_of_each_client_start_at_the_new_log_start(agent: RunningAgent, catalog: Catalog) -> None:
    fill(agent, "events", 2)
    admin = admin_client(agent)  # kept: the futures of a client collected never finish
    futures = admin.delete_records([TopicPartition("events", 0, 40), TopicPartition("events", 1, -1)])
    low = {tp.partition: future.result(timeout=20).low_watermark for tp, future in futures.items()}
    assert low == {0: 40, 1: RECORDS}
    assert [o.log_start for o in catalog.log_offsets("events")] == [40, RECORDS]
    assert list_offset(agent, "events", 0) == 40
    assert list_offset(agent, "events", 0, timestamp=0) == 40  # a timestamp is looked up from the log start

    # confluent-kafka from the beginning: offset 40 first
    consumer = confluent_consumer(agent, **{"auto.offset.reset": "earliest"})
    consumer.assign([TopicPartition("events", 0, OFFSET_BEGINNING)])
    assert [m.offset() for m in consume(consumer, RECORDS - 40)] == list(range(40, RECORDS))
    # below the log start: OFFSET_OUT_OF_RANGE, and auto.offset.reset=earliest takes the consumer to it
    consumer.assign([TopicPartition("events", 0, 10)])
    assert consume(consumer, RECORDS - 40)[0].offset() == 40
    consumer.close()

    # kafka-python: seek_to_beginning is the log start; a partition emptied whole has nothing to read
    reader = KafkaConsumer(bootstrap_servers=agent.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    reader.assign([KafkaPythonTopicPartition("events", 0), KafkaPythonTopicPartition("events", 1)])
    reader.seek_to_beginning()
    read = [(r.partition, r.offset) for r in reader]
    reader.close()
    assert read == [(0, n) for n in range(40, RECORDS)]

    # aiokafka: seek_to_beginning is the log start
    async def aiokafka_offsets() -> list[int]:
        consumer = AIOKafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([AioTopicPartition("events", 0)])
            await consumer.seek_to_beginning()
            batches = await consumer.getmany(timeout_ms=5000, max_records=RECORDS)
            return [record.offset for records in batches.values() for record in records]
        finally:
            await consumer.stop()

    assert asyncio.run(aiokafka_offsets())[0] == 40

    # kcat from the beginning
    if shutil.which("kcat") is not None:
        read = subprocess.run(["kcat", "-b", agent.bootstrap, "-C", "-t", "events", "-p", "0", "-o", "beginning", "-e", "-f", "%o\n"],
                              capture_output=True, text=True, timeout=60)
        assert read.stdout.split() == [str(n) for n in range(40, RECORDS)], read.stderr

    # the same request again changes nothing; an offset below the log start answers the log start
    assert delete_records(agent, "events", {0: 40, 1: 5}) == {0: (NONE, 40), 1: (NONE, RECORDS)}


def test_kafka_python_delete_records_and_the_refusals_are_kafkas(agent: RunningAgent, catalog: Catalog) -> None:
    fill(agent, "events", 1)
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap)
    try:
        found = admin.delete_records({KafkaPythonTopicPartition("events", 0): 25})
        assert found[KafkaPythonTopicPartition("events", 0)]["low_watermark"] == 25
    finally:
        admin.close()
    assert delete_records(agent, "events", {0: RECORDS + 1}) == {0: (OFFSET_OUT_OF_RANGE, -1)}
    assert delete_records(agent, "events", {0: -2}) == {0: (OFFSET_OUT_OF_RANGE, -1)}
    assert delete_records(agent, "events", {7: 0}) == {7: (UNKNOWN_TOPIC_OR_PARTITION, -1)}
    assert delete_records(agent, "nowhere", {0: 0}, version=0) == {0: (UNKNOWN_TOPIC_OR_PARTITION, -1)}
    # a compacted-only topic refuses it, as Kafka's Partition.deleteRecordsOnLeader; compact,delete takes it
    fill(agent, "profiles", 1)
    fill(agent, "sessions", 1)
    assert delete_records(agent, "profiles", {0: 10}, version=1) == {0: (POLICY_VIOLATION, -1)}
    assert delete_records(agent, "sessions", {0: 10}) == {0: (NONE, 10)}
    assert [o.log_start for o in catalog.log_offsets("profiles")] == [0]
    assert [o.log_start for o in catalog.log_offsets("events")] == [25, 0]


def test_confluent_reports_policy_violation_for_a_compacted_topic(agent: RunningAgent) -> None:
    fill(agent, "profiles", 1)
    admin = admin_client(agent)
    [future] = admin.delete_records([TopicPartition("profiles", 0, 10)]).values()
    with pytest.raises(KafkaException) as refused:
        future.result(timeout=20)
    assert refused.value.args[0].code() == POLICY_VIOLATION


def test_delete_needs_delete_on_the_topic(catalog: Catalog) -> None:
    catalog.ensure_created(0)
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, authorization=AuthorizerSettings("acl", (), True, 200))
    try:
        catalog.create_acls([AclBinding(ResourceType.TOPIC, "events", PatternType.LITERAL, "User:ANONYMOUS", "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW)])
        running.server.broker.authorizer.refresh()
        assert delete_records(running, "events", {0: 0}) == {0: (TOPIC_AUTHORIZATION_FAILED, -1)}
        catalog.create_acls([AclBinding(ResourceType.TOPIC, "events", PatternType.LITERAL, "User:ANONYMOUS", "*", AclOperation.DELETE, AclPermissionType.ALLOW)])
        running.server.broker.authorizer.refresh()
        assert delete_records(running, "events", {0: 0}) == {0: (NONE, 0)}
    finally:
        running.stop()


def logcompact(catalog: Catalog, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logcompact", *args], capture_output=True, text=True, env=agent_environment(catalog), timeout=120)


def test_cli_delete_records(agent: RunningAgent, catalog: Catalog) -> None:
    fill(agent, "events", 2)
    done = logcompact(catalog, "topic", "delete-records", "events", "--partition", "0", "--partition", "1", "--before", "30")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["partition: events-0\tlow_watermark: 30", "partition: events-1\tlow_watermark: 30"]
    done = logcompact(catalog, "topic", "delete-records", "events", "--partition", "1", "--before", "-1", "--json")
    assert json.loads(done.stdout) == {"topic": "events", "partition": 1, "low_watermark": RECORDS, "error": None, "message": None}
    described = json.loads(logcompact(catalog, "topic", "describe", "events").stdout)
    assert described["log_start_offsets"] == [30, RECORDS] and described["next_offsets"] == [RECORDS, RECORDS]
    refused = logcompact(catalog, "topic", "delete-records", "profiles", "--partition", "0", "--before", "0")
    assert refused.returncode == 1
    assert "cleanup.policy is 'compact'; add delete to it" in refused.stdout


def test_kafkas_delete_records_tool_agrees_with_topic_describe(agent: RunningAgent, catalog: Catalog, tmp_path: Path) -> None:
    """Kafka's own kafka-delete-records (DeleteRecordsCommand) against the agent, and `logcompact topic describe` after it."""
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    fill(agent, "events", 2)
    offsets = tmp_path / "offsets.json"
    offsets.write_text(json.dumps({"version": 1, "partitions": [{"topic": "events", "partition": 0, "offset": 60},
                                                                {"topic": "events", "partition": 1, "offset": -1}]}))
    done = subprocess.run(tool_argv("org.apache.kafka.tools.DeleteRecordsCommand", "--bootstrap-server", agent.bootstrap,
                                    "--offset-json-file", str(offsets)), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "partition: events-0\tlow_watermark: 60" in done.stdout and f"partition: events-1\tlow_watermark: {RECORDS}" in done.stdout
    described = json.loads(logcompact(catalog, "topic", "describe", "events").stdout)
    assert described["log_start_offsets"] == [60, RECORDS]

    offsets.write_text(json.dumps({"version": 1, "partitions": [{"topic": "profiles", "partition": 0, "offset": 0}]}))
    refused = subprocess.run(tool_argv("org.apache.kafka.tools.DeleteRecordsCommand", "--bootstrap-server", agent.bootstrap,
                                       "--offset-json-file", str(offsets)), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert "partition: profiles-0\terror: org.apache.kafka.common.errors.PolicyViolationException" in refused.stdout, refused.stdout + refused.stderr


def test_the_agent_answers_as_kafkas_broker(agent: RunningAgent, kafka_broker: KafkaServer) -> None:
    """The same DeleteRecords requests through confluent-kafka's AdminClient to Kafka's broker and to the agent: the
    same low watermarks and errors, and consumers of both start at the same offsets after them."""
    suffix = str(time.monotonic_ns())
    answers = []
    for bootstrap in (kafka_broker.bootstrap_servers, agent.bootstrap):
        admin = AdminClient({"bootstrap.servers": bootstrap, **FAST_CLIENT})
        names = {"events": f"events-{suffix}", "profiles": f"profiles-{suffix}"}
        made = admin.create_topics([NewTopic(names["events"], 2, replication_factor=1),
                                    NewTopic(names["profiles"], 1, replication_factor=1, config={"cleanup.policy": "compact"})])
        for future in made.values():
            future.result(timeout=30)
        producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, **FAST_CLIENT})
        for topic, partitions in ((names["events"], 2), (names["profiles"], 1)):
            for partition in range(partitions):
                for n in range(RECORDS):
                    producer.produce(topic, key=f"k{n}".encode(), value=b"v", partition=partition)
        assert producer.flush(30) == 0
        asked = [TopicPartition(names["events"], 0, 30), TopicPartition(names["events"], 1, -1), TopicPartition(names["profiles"], 0, 10)]
        found = {}
        for tp, future in admin.delete_records(asked).items():
            try:
                found[(tp.topic.split("-")[0], tp.partition)] = future.result(timeout=30).low_watermark
            except KafkaException as refused:
                found[(tp.topic.split("-")[0], tp.partition)] = refused.args[0].name()
        [future] = admin.delete_records([TopicPartition(names["events"], 0, RECORDS + 1)]).values()
        with pytest.raises(KafkaException) as beyond:
            future.result(timeout=30)
        found["beyond"] = beyond.value.args[0].name()
        consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{suffix}", "auto.offset.reset": "earliest", **FAST_CLIENT})
        consumer.assign([TopicPartition(names["events"], 0, OFFSET_BEGINNING)])
        message = consumer.poll(20)
        found["first read"] = None if message is None else message.offset()
        consumer.close()
        answers.append(found)
    kafka, ours = answers
    assert ours == kafka == {("events", 0): 30, ("events", 1): RECORDS, ("profiles", 0): "POLICY_VIOLATION",
                             "beyond": "OFFSET_OUT_OF_RANGE", "first read": 30}
