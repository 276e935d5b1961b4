"""The lab's Apache Kafka broker (lab.servers.kafka), the reference the agent is compared with, and Kafka's Java client
(tests/java), which the tests drive against both: what the broker promises of itself, on one node of this module's
own, and the same Java client calls giving the same records and offsets on the agent as on the broker.

The tests are skipped, with the reason, only where Java 17 or the broker's jars cannot be had (`make kafka` fetches
them); anything else that keeps the broker from starting fails them.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, OffsetSpec

from lab.servers import kafka as reference
from lab.servers.kafka import JavaProgram, KafkaServer, KafkaStartError, build_java_program, kafka_missing_reason, start_kafka
from logcompact.catalog import Catalog
from logcompact.store import open_store
from tests.kafka.agents import start_agent_process

pytestmark = pytest.mark.timeout(300)

JAVA_PROJECT = Path(__file__).with_name("java")
PRODUCE_CONSUME = "logcompact.clients.ProduceConsume"


@pytest.fixture(scope="module")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    server, stop = start_kafka(tmp_path_factory.mktemp("kafka"))
    try:
        yield server
    finally:
        stop()


@pytest.fixture(scope="module")
def java_clients() -> JavaProgram:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    return build_java_program(JAVA_PROJECT)


def create_topics(admin: AdminClient, *topics: NewTopic) -> None:
    for future in admin.create_topics(list(topics), request_timeout=30).values():
        future.result(timeout=60)


def produce_consume(program: JavaProgram, bootstrap_servers: str, topic: str, records: int, keys: int) -> tuple[list[tuple], list[tuple]]:
    """The Java program's records (partition, offset, key, value), as its producer had them acknowledged and as its
    consumer read them back."""
    run = subprocess.run(
        program.argv(PRODUCE_CONSUME, "--bootstrap-server", bootstrap_servers, "--topic", topic,
                     "--num-records", str(records), "--num-keys", str(keys)),
        capture_output=True, text=True, timeout=120,
    )
    assert run.returncode == 0, run.stderr
    events: dict[str, list[tuple]] = {"produced": [], "consumed": []}
    for line in run.stdout.splitlines():
        event = json.loads(line)
        events[event["event"]].append((event["partition"], event["offset"], event["key"], event["value"]))
    return events["produced"], events["consumed"]


def consume_all(bootstrap_servers: str, topic: str, partitions: int, count: int) -> list[tuple]:
    """`count` records of `topic` read from the beginning with confluent-kafka: (partition, offset, key, value)."""
    consumer = Consumer({"bootstrap.servers": bootstrap_servers, "group.id": "lab-kafka-check", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        seen: list[tuple] = []
        for _ in range(300):
            if len(seen) >= count:
                break
            for message in consumer.consume(num_messages=count, timeout=0.2):
                assert message.error() is None, message.error()
                seen.append((message.partition(), message.offset(), message.key().decode(), message.value().decode()))
        return seen
    finally:
        consumer.close()


def by_partition(records: list[tuple]) -> dict[int, list[tuple]]:
    out: dict[int, list[tuple]] = {}
    for record in sorted(records):
        out.setdefault(record[0], []).append(record)
    return out


def in_offset_order(records: list[tuple]) -> bool:
    """Whether each partition's records come in the order of their offsets."""
    return all([r[1] for r in records if r[0] == p] == sorted(r[1] for r in records if r[0] == p) for p in {r[0] for r in records})


def test_the_broker_is_one_kraft_node_with_kafka_s_defaults_on_127_0_0_1(kafka: KafkaServer) -> None:
    admin = kafka.admin()
    metadata = admin.list_topics(timeout=30)
    assert metadata.cluster_id == kafka.cluster_id
    assert metadata.controller_id == kafka.node_id  # broker and controller in one process
    assert [(b.id, b.host, b.port) for b in metadata.brokers.values()] == [(kafka.node_id, "127.0.0.1", kafka.port)]

    resource = ConfigResource("broker", str(kafka.node_id))
    configs = admin.describe_configs([resource])[resource].result(timeout=30)
    # one replica for the internal topics, as one node needs ...
    for name in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor", "transaction.state.log.min.isr"):
        assert configs[name].value == "1", name
    # ... and Kafka's defaults otherwise: the flush left to the page cache, a rebalance's initial delay of 3 s
    assert configs["log.flush.interval.messages"].value == str(2**63 - 1)
    assert configs["log.flush.interval.messages"].is_default
    assert configs["group.initial.rebalance.delay.ms"].value == "3000"
    assert configs["process.roles"].value == "broker,controller"

    command = Path(f"/proc/{kafka.pid}/cmdline").read_bytes().split(b"\0")
    assert b"kafka.Kafka" in command and b"-Xmx512m" in command
    with socket.socket() as probe:  # the controller listens on loopback too, at a port of its own
        probe.settimeout(5)
        probe.connect(("127.0.0.1", kafka.controller_port))
    assert (kafka.workdir / "data" / "meta.properties").read_text().count(f"cluster.id={kafka.cluster_id}") == 1
    assert "Kafka Server started" in kafka.logfile.read_text()


def test_a_topic_created_by_the_lab_is_served_by_its_leaders_at_once(kafka: KafkaServer) -> None:
    """create_topic returns once every partition answers (a new partition is NOT_LEADER_OR_FOLLOWER for a moment)."""
    kafka.create_topic("ready", 6, {"cleanup.policy": "compact"})
    latest = {TopicPartition("ready", partition): OffsetSpec.latest() for partition in range(6)}
    admin = kafka.admin()
    assert [future.result(30).offset for future in admin.list_offsets(latest, request_timeout=30).values()] == [0] * 6
    with pytest.raises(KafkaException) as again:
        kafka.create_topic("ready", 6)
    assert again.value.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS


def test_a_compacted_topic_takes_confluent_kafka_then_the_java_client_in_order(kafka: KafkaServer, java_clients: JavaProgram) -> None:
    admin = kafka.admin()
    create_topics(admin, NewTopic("accounts", 2, 1, config={"cleanup.policy": "compact"}))
    resource = ConfigResource("topic", "accounts")
    assert admin.describe_configs([resource])[resource].result(timeout=30)["cleanup.policy"].value == "compact"

    producer = Producer({"bootstrap.servers": kafka.bootstrap_servers, "acks": "all"})
    delivered: list[tuple] = []
    for i in range(20):
        producer.produce("accounts", key=b"py-%d" % (i % 5), value=b"v%d" % i, partition=i % 2,
                         on_delivery=lambda error, m: delivered.append((error, m.partition(), m.offset(), m.key().decode(), m.value().decode())))
    assert producer.flush(60) == 0
    assert [d[0] for d in delivered] == [None] * 20
    written = [d[1:] for d in delivered]
    assert {p: [r[1] for r in rs] for p, rs in by_partition(written).items()} == {0: list(range(10)), 1: list(range(10))}
    assert by_partition(consume_all(kafka.bootstrap_servers, "accounts", 2, 20)) == by_partition(written)

    produced, consumed = produce_consume(java_clients, kafka.bootstrap_servers, "accounts", records=12, keys=4)
    assert sorted((key, value) for _, _, key, value in produced) == sorted((f"key-{i % 4}", f"value-{i}") for i in range(12))
    for partition, records in by_partition(produced).items():  # appended after confluent-kafka's ten, one offset each
        assert [r[1] for r in records] == list(range(10, 10 + len(records))), partition
    # the Java consumer reads the whole topic, confluent-kafka's records and its own, each once and in order
    assert by_partition(consumed) == by_partition(written + produced)
    assert in_offset_order(consumed)


def test_the_java_client_gives_the_same_records_and_offsets_on_the_agent_as_on_kafka(
    kafka: KafkaServer, java_clients: JavaProgram, tmp_path: Path
) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = start_agent_process(Catalog(open_store(f"file://{tmp_path / 'store'}")), port, flush_ms=50)
    try:
        agent_address = f"127.0.0.1:{port}"
        runs = {}
        for name, address in (("agent", agent_address), ("kafka", kafka.bootstrap_servers)):
            create_topics(AdminClient({"bootstrap.servers": address}), NewTopic("side-by-side", 3, 1, config={"cleanup.policy": "compact"}))
            runs[name] = produce_consume(java_clients, address, "side-by-side", records=40, keys=9)
    finally:
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=30)
    produced, consumed = runs["agent"]
    assert len(produced) == 40
    for partition, records in by_partition(produced).items():
        assert [r[1] for r in records] == list(range(len(records))), partition
    assert by_partition(consumed) == by_partition(produced) and in_offset_order(consumed)
    # the client partitions by key and each server hands out offsets in order: the same records at the same places
    assert sorted(runs["agent"][0]) == sorted(runs["kafka"][0])
    assert by_partition(runs["agent"][1]) == by_partition(runs["kafka"][1])


def test_a_broker_that_cannot_start_names_its_log_and_its_last_lines(tmp_path: Path) -> None:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    with pytest.raises(KafkaStartError) as failed:
        start_kafka(tmp_path / "bad", overrides={"message.max.bytes": "-5"})
    message = str(failed.value)
    first, _, tail = message.partition("\n")
    assert first.startswith("formatting the KRaft log dir: kafka.tools.StorageTool exited with 1; see ")
    assert first.endswith(f"{tmp_path / 'bad' / 'format.log'}:")
    assert "message.max.bytes" in tail

    (tmp_path / "used" / "data").mkdir(parents=True)
    with pytest.raises(KafkaStartError, match="data exists: start the broker in a directory of its own"):
        start_kafka(tmp_path / "used")


def test_without_java_the_reason_says_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    reference._java_major.cache_clear()
    try:
        reason = kafka_missing_reason()
    finally:
        reference._java_major.cache_clear()
    assert reason is not None and reason.startswith("Java not found")
    assert "make deps" in reason


def test_the_cache_is_where_the_environment_says(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv(reference.CACHE_ENV, str(tmp_path / "cache"))
    assert reference.cache_dir() == tmp_path / "cache"
    monkeypatch.delenv(reference.CACHE_ENV)
    assert reference.cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "logcompact" / "kafka"
