"""Kafka clients on both ends of a compaction, checked against the reference model (lab/reference_model.py):
records produced through `logcompact agent` by real clients, compacted by the CLI's full sweeps (and once by the
full-sweep DAG with Spark), and consumed back through the agent must be exactly the model's survivors (the latest
record per key, what min.compaction.lag.ms keeps, tombstones until their horizon), at their offsets, gaps
included."""

from __future__ import annotations

import itertools
import json
import time
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonTopicPartition

from lab.reference_model import ModelRecord, ReferenceLog
from logcompact.catalog import Catalog
from logcompact.cli import cli
from logcompact.store import open_store
from logcompact.topics import Topic, TopicConfig
from tests.helpers import NOW
from tests.kafka.agents import RunningAgent
from tests.support.dags import load_dags, task_states, without_retries

PARTITIONS = 2
KEYS = [b"a", b"b", b"c", b"d", b"e"]
DELETE_RETENTION_MS = 1_000
Observed = list[tuple[int, bytes | None, bytes | None, int]]  # offset, key, value, timestamp

pytestmark = pytest.mark.timeout(600)

# One produce round: records of (partition, key index, tombstone, age in ms before NOW).
rounds_strategy = st.lists(
    st.lists(st.tuples(st.integers(0, PARTITIONS - 1), st.integers(0, len(KEYS) - 1), st.booleans(), st.integers(0, 120_000)),
             min_size=1, max_size=12),
    min_size=1, max_size=4,
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Catalog, RunningAgent]]:
    """One agent and its cluster for the module; each example makes topics of its own. Its catalog is SQLite
    only: a cluster shared by the module's examples outlives the suite's per-test `catalog`, and what is checked
    here is the records' way through clients, agent and compaction, which the catalog does not change (the
    compaction jobs and the DAGs run on PostgreSQL in tests/test_jobs.py and tests/test_dags.py)."""
    catalog = Catalog(open_store(f"file://{tmp_path_factory.mktemp('kafka-compaction') / 'store'}"))
    catalog.ensure_created(NOW)
    agent = RunningAgent(catalog, flush_interval_ms=20)
    try:
        yield catalog, agent
    finally:
        agent.stop()


_names = (f"state-{n}" for n in itertools.count())


def create_topic(catalog: Catalog, min_lag_ms: int) -> tuple[str, TopicConfig]:
    configs = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(min_lag_ms), "delete.retention.ms": str(DELETE_RETENTION_MS)}
    topic = Topic.create(next(_names), PARTITIONS, configs, NOW)
    catalog.create_topic(topic, NOW)
    return topic.name, topic.config


def produce_with_confluent(bootstrap: str, topic: str, records: list[tuple[int, bytes, bytes | None, int]]) -> list[tuple[int, int]]:
    """Each (partition, key, value, timestamp) produced and acknowledged: their (partition, offset)."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 5, "compression.type": "zstd"})
    placed: dict[int, tuple[int, int]] = {}
    for n, (partition, key, value, timestamp) in enumerate(records):
        producer.produce(topic, value, key, partition, timestamp=timestamp,
                         on_delivery=lambda err, msg, n=n: placed.__setitem__(n, (msg.partition(), msg.offset())) if err is None else None)
    assert producer.flush(30) == 0 and len(placed) == len(records)
    return [placed[n] for n in range(len(records))]


def consume_with_confluent(bootstrap: str, topic: str, partition: int) -> Observed:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "model-check", "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, partition, 0)])
    seen: Observed = []
    try:
        while True:
            message = consumer.poll(10)
            assert message is not None, f"{topic}/{partition}: no end of partition within 10 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                return seen
            seen.append((message.offset(), message.key(), message.value(), message.timestamp()[1]))
    finally:
        consumer.close()


def expected(model: ReferenceLog, topic: str, partition: int) -> Observed:
    return [(r.offset, r.key, r.value, r.timestamp) for r in model.records(topic, partition)]


def sweep_everything(catalog: Catalog, model: ReferenceLog, topic: str, config: TopicConfig, now: int) -> None:
    """`logcompact compact --full` at `now`, and the model's job of the same sweep: every live offset, deduplicated."""
    done = CliRunner().invoke(cli, ["--store", catalog.store.uri, "--now", str(now), "compact", "--full", "--topics", topic])
    assert done.exit_code == 0, done.output
    job = {(topic, p): {r.offset for r in model.records(topic, p)} for p in range(PARTITIONS)}
    model.compact_pass([({tp: offsets for tp, offsets in job.items() if offsets}, True)], {topic: config}, now)


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(rounds=rounds_strategy, min_lag_ms=st.sampled_from([0, 60_000]))
def test_produce_sweep_consume_equals_the_model(cluster: tuple[Catalog, RunningAgent], rounds: list, min_lag_ms: int) -> None:
    """Rounds produced by librdkafka (each acknowledged before the next), a full sweep at NOW, one more round, a
    sweep past the tombstones' horizon: after each sweep every partition reads back as the model has it."""
    catalog, agent = cluster
    topic, config = create_topic(catalog, min_lag_ms)
    model = ReferenceLog()

    def produce_round(drawn: list[tuple[int, int, bool, int]]) -> None:
        records = [(p, KEYS[k], None if tombstone else b"%s@%d" % (KEYS[k], age), NOW - age) for p, k, tombstone, age in drawn]
        placed = produce_with_confluent(agent.bootstrap, topic, records)
        for partition in range(PARTITIONS):
            mine = [ModelRecord(offset, key, value, timestamp)
                    for (p, key, value, timestamp), (_, offset) in zip(records, placed, strict=True) if p == partition]
            model.produce(topic, partition, mine)

    for drawn in rounds[:-1]:
        produce_round(drawn)
    sweep_everything(catalog, model, topic, config, NOW)
    produce_round(rounds[-1])
    for partition in range(PARTITIONS):
        assert consume_with_confluent(agent.bootstrap, topic, partition) == expected(model, topic, partition)
    sweep_everything(catalog, model, topic, config, NOW + 2 * DELETE_RETENTION_MS)
    for partition in range(PARTITIONS):
        assert consume_with_confluent(agent.bootstrap, topic, partition) == expected(model, topic, partition)


def test_kafka_python_through_the_full_sweep_dag_with_spark_equals_the_model(airflow_catalog: Catalog) -> None:
    """kafka-python produces (every key written several times, some deleted), the full-sweep DAG compacts through
    spark-submit, and kafka-python consumes exactly the model's survivors."""
    now = int(time.time() * 1000)
    catalog = airflow_catalog
    catalog.ensure_created(now)
    topic = Topic.create("accounts", PARTITIONS, {"cleanup.policy": "compact"}, now)
    catalog.create_topic(topic, now)
    model = ReferenceLog()
    agent = RunningAgent(catalog, flush_interval_ms=20)
    try:
        producer = KafkaProducer(bootstrap_servers=agent.bootstrap, acks="all", enable_idempotence=False, compression_type="lz4")
        for round_number in range(3):
            sent = []
            for n in range(40):
                key, partition = KEYS[n % len(KEYS)], n % PARTITIONS
                value = None if (n + round_number) % 7 == 0 else json.dumps({"round": round_number, "n": n}).encode()
                timestamp = now - 600_000 + round_number * 1_000 + n
                sent.append((partition, key, value, timestamp, producer.send("accounts", value, key, partition=partition, timestamp_ms=timestamp)))
            producer.flush(30)
            for partition in range(PARTITIONS):
                model.produce("accounts", partition, [
                    ModelRecord(future.get(10).offset, key, value, timestamp) for p, key, value, timestamp, future in sent if p == partition
                ])
        producer.close()
        run = without_retries(load_dags(), "logcompact_full_sweep_daily").test()
        assert str(run.state) == "success", task_states("logcompact_full_sweep_daily", run.run_id)
        sweep_at = max(r.timestamp for p in range(PARTITIONS) for r in model.records("accounts", p)) + 60_000  # the run's clock: later
        job = {("accounts", p): {r.offset for r in model.records("accounts", p)} for p in range(PARTITIONS)}
        model.compact_pass([(job, True)], {"accounts": topic.config}, sweep_at)
        consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
        try:
            for partition in range(PARTITIONS):
                place = KafkaPythonTopicPartition("accounts", partition)
                consumer.assign([place])
                consumer.seek(place, 0)
                got = [(m.offset, m.key, m.value, m.timestamp) for m in consumer]
                assert got == expected(model, "accounts", partition)
                assert len({key for _, key, _, _ in got}) == len(got)  # one record per key
        finally:
            consumer.close()
    finally:
        agent.stop()
