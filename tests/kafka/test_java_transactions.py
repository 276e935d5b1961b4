"""Kafka's Java client (kafka-clients 4.4 and 3.9) and Kafka Streams in transactions through `logcompact agent`.

The programs are tests/java's (`logcompact.clients.Transactions`, `logcompact.clients.CountPerKey`), built once per
content and Kafka version into the cache of lab.servers.kafka. The transactional producer commits, aborts and
commits on a compacted topic, copies records with sendOffsetsToTransaction and is fenced by a second producer of
its transactional.id: its Java consumers read what Apache Kafka's broker (lab.servers.kafka, with Kafka's first
transaction protocol, the one the agent serves) gives for the same run, offsets, end offsets and errors alike.
`logcompact compact --full` then removes the aborted records, and `logcompact consume --isolation read_committed`
reads what the Java consumer reads. A Kafka Streams application with exactly_once_v2 counts per key in a RocksDB
store, killed with SIGKILL and restarted three times with its changelog compacted in between: it restores to the
changelog's end and its output, read read_committed, holds each key's exact count.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from lab.servers.kafka import JavaProgram, KafkaServer, build_java_program, kafka_missing_reason
from logcompact.catalog import Catalog
from logcompact.kafka.cluster import Address
from tests.kafka.agents import FAST_CLIENT, RunningAgent, agent_environment, stored
from tests.kafka.test_transactions import fetch_watermarks

pytestmark = pytest.mark.timeout(900)

JAVA_PROJECT = Path(__file__).parents[1] / "java"
TRANSACTIONS = "logcompact.clients.Transactions"
COUNT_PER_KEY = "logcompact.clients.CountPerKey"
# the pom's version, and the last of Kafka 3's line
KAFKA_CLIENTS = ["4.4.0", "3.9.2"]
JAVA_TIMEOUT_S = 300  # a JVM's start and a group's rebalance on a loaded two-core machine


@pytest.fixture(scope="module", params=KAFKA_CLIENTS, ids=[f"kafka-clients-{v}" for v in KAFKA_CLIENTS])
def java(request: pytest.FixtureRequest) -> JavaProgram:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    return build_java_program(JAVA_PROJECT, request.param)


@pytest.fixture(scope="module")
def reference(kafka_broker: KafkaServer) -> KafkaServer:
    """The module's Apache Kafka broker with Kafka's first transaction protocol (`transaction.version` 1), the one
    the agent serves: a 4.x client and a 4.x cluster otherwise speak KIP-890's (transaction.version 2), where a
    fenced producer's send and commit fail with the abortable InvalidProducerEpochException before its abort is
    fenced, and the comparison would be of two protocols."""
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    java = build_java_program(JAVA_PROJECT, KAFKA_CLIENTS[0])
    (set_to,) = run_java(java, "transaction-version", "--bootstrap-server", kafka_broker.bootstrap_servers, "--level", "1")
    assert set_to["level"] == 1
    return kafka_broker


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    catalog.ensure_created(int(time.time() * 1000))
    return catalog


def create_topics(bootstrap: str, partitions: int, *names: str, **config: str) -> None:
    """Topics created through CreateTopics (the agent's or the broker's), one replica each."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(name, partitions, 1, config=config) for name in names], request_timeout=60).values():
        future.result(timeout=120)


def compacted(bootstrap: str, partitions: int, *names: str) -> None:
    create_topics(bootstrap, partitions, *names, **{"cleanup.policy": "compact"})


def run_java(java: JavaProgram, *args: str) -> list[dict[str, Any]]:
    """The JSON lines of one run of the Transactions program, which must succeed."""
    run = subprocess.run(java.argv(TRANSACTIONS, *args, "--timeout-ms", "120000"), capture_output=True, text=True, timeout=JAVA_TIMEOUT_S)
    assert run.returncode == 0, f"{args}: exit {run.returncode}\n{run.stderr[-4000:]}"
    return [json.loads(line) for line in run.stdout.splitlines()]


def settle(address: Address, topic: str, partitions: int) -> None:
    """Until no transaction is open on the partitions (last stable offset = high watermark): a broker writes a
    transaction's markers after it answers EndTxn."""
    deadline = time.monotonic() + JAVA_TIMEOUT_S
    while any((w := fetch_watermarks(address, topic, p))[0] != w[1] for p in range(partitions)):
        assert time.monotonic() < deadline, f"{topic}: a transaction still open after {JAVA_TIMEOUT_S} s"
        time.sleep(0.1)


def read(java: JavaProgram, bootstrap: str, topic: str, isolation: str) -> tuple[dict[int, int], list[tuple[int, int, str, str]]]:
    """A Java consumer's end offset per partition at `isolation`, and the records it read up to them: (partition,
    offset, key, value), by partition and offset."""
    events = run_java(java, "read", "--bootstrap-server", bootstrap, "--topic", topic, "--isolation", isolation)
    ends = {e["partition"]: e["offset"] for e in events if e["event"] == "end_offset"}
    return ends, sorted((e["partition"], e["offset"], e["key"], e["value"]) for e in events if e["event"] == "consumed")


def reads(java: JavaProgram, bootstrap: str, address: Address, topic: str, partitions: int) -> dict[str, Any]:
    settle(address, topic, partitions)
    return {isolation: read(java, bootstrap, topic, isolation) for isolation in ("read_committed", "read_uncommitted")}


def compact_full(catalog: Catalog, topic: str) -> list[dict[str, Any]]:
    """`logcompact compact --full` of `topic`, as its own process beside the running agent: each plan's stats."""
    run = subprocess.run([sys.executable, "-m", "logcompact", "compact", "--full", "--topics", topic],
                         capture_output=True, text=True, env=agent_environment(catalog), timeout=600)
    assert run.returncode == 0, run.stderr
    return [json.loads(line) for line in run.stdout.splitlines()]


def cli_read_committed(catalog: Catalog, topic: str) -> list[tuple[int, int, str, str]]:
    """`logcompact consume --isolation read_committed` of partition 0: (partition, offset, key, value)."""
    run = subprocess.run([sys.executable, "-m", "logcompact", "consume", topic, "--partition", "0", "--isolation", "read_committed"],
                         capture_output=True, text=True, env=agent_environment(catalog), timeout=300)
    assert run.returncode == 0, run.stderr
    return [(0, d["offset"], d["key"], d["value"]) for d in map(json.loads, run.stdout.splitlines())]


# -- the transactional producer ----------------------------------------------------------------------------


def commit_abort_commit(java: JavaProgram, bootstrap: str, address: Address) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    topic = f"java-state-{uuid.uuid4().hex[:8]}"
    compacted(bootstrap, 1, topic)
    events = run_java(java, "commit-abort-commit", "--bootstrap-server", bootstrap, "--topic", topic, "--transactional-id", f"tx-{topic}")
    produced = [e for e in events if e["event"] == "produced"]
    return produced, {"topic": topic, **reads(java, bootstrap, address, topic, 1)}


def on_agent_and_kafka(scenario: Callable[[JavaProgram, str, Address], Any], java: JavaProgram, agent: RunningAgent, reference: KafkaServer) -> tuple[Any, Any]:
    """What `scenario` gives against the agent, then against Apache Kafka's broker."""
    return scenario(java, agent.bootstrap, agent.server.address), scenario(java, reference.bootstrap_servers, Address(reference.host, reference.port))


def test_commit_abort_commit_reads_as_on_apache_kafka_and_compaction_removes_the_aborted(
    java: JavaProgram, agent: RunningAgent, catalog: Catalog, reference: KafkaServer,
) -> None:
    (produced, seen), (expected_produced, expected) = on_agent_and_kafka(commit_abort_commit, java, agent, reference)
    assert produced == expected_produced
    # records at 0-2, 4-6, 8-10, a marker after each transaction: as Kafka gives them
    assert [e["offset"] for e in produced] == [0, 1, 2, 4, 5, 6, 8, 9, 10]
    assert {k: v for k, v in seen.items() if k != "topic"} == {k: v for k, v in expected.items() if k != "topic"}
    committed = [(0, e["offset"], e["key"], e["value"]) for e in produced if e["outcome"] == "commit"]
    aborted = [(0, e["offset"], e["key"], e["value"]) for e in produced if e["outcome"] == "abort"]
    assert seen["read_committed"] == ({0: 12}, committed)
    assert seen["read_uncommitted"] == ({0: 12}, sorted(committed + aborted))
    assert cli_read_committed(catalog, seen["topic"]) == committed

    topic = seen["topic"]
    stats = compact_full(catalog, topic)
    assert sum(s.get("aborted_removed", 0) for s in stats) == len(aborted), stats
    latest = {key: (partition, offset, key, value) for partition, offset, key, value in committed}
    after = reads(java, agent.bootstrap, agent.server.address, topic, 1)
    # no reader sees the aborted records; each key's latest committed value stays at its offset
    assert after["read_committed"] == ({0: 12}, sorted(latest.values()))
    assert after["read_uncommitted"] == after["read_committed"]
    assert cli_read_committed(catalog, topic) == sorted(latest.values())
    assert [r.offset for r in stored(catalog, topic, 0)] == sorted(offset for _, offset, _, _ in latest.values())


def send_offsets(java: JavaProgram, bootstrap: str, address: Address) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    suffix = uuid.uuid4().hex[:8]
    source, copy = f"java-source-{suffix}", f"java-copy-{suffix}"
    compacted(bootstrap, 2, source, copy)
    events = run_java(java, "send-offsets", "--bootstrap-server", bootstrap, "--input", source, "--output", copy,
                      "--group", f"copier-{suffix}", "--transactional-id", f"tx-{suffix}", "--num-records", "20")
    return events, reads(java, bootstrap, address, copy, 2)


def test_send_offsets_to_transaction_commits_the_group_s_offsets_with_the_transaction_only(
    java: JavaProgram, agent: RunningAgent, reference: KafkaServer,
) -> None:
    (events, seen), (expected_events, expected) = on_agent_and_kafka(send_offsets, java, agent, reference)
    committed = sorted((e["after"], e["partition"], e["offset"]) for e in events if e["event"] == "committed")
    assert committed == sorted((e["after"], e["partition"], e["offset"]) for e in expected_events if e["event"] == "committed")
    # the aborted transaction committed no offset; the committed one the input's ends (20 records over 2 partitions)
    assert [offset for after, _, offset in committed if after == "abort"] == [None, None]
    assert sum(offset for after, _, offset in committed if after == "commit") == 20
    ends, records = seen["read_committed"]
    assert sorted(value for _, _, _, value in records) == sorted(f"copy-value-{i}" for i in range(20))
    assert seen == expected


def fence(java: JavaProgram, bootstrap: str, address: Address) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    topic = f"java-fenced-{uuid.uuid4().hex[:8]}"
    compacted(bootstrap, 2, topic)
    events = run_java(java, "fence", "--bootstrap-server", bootstrap, "--topic", topic, "--transactional-id", f"tx-{topic}")
    return events, reads(java, bootstrap, address, topic, 2)


def test_a_second_producer_of_the_transactional_id_fences_the_first_as_on_apache_kafka(
    java: JavaProgram, agent: RunningAgent, reference: KafkaServer,
) -> None:
    (events, seen), (expected_events, expected) = on_agent_and_kafka(fence, java, agent, reference)

    def outcomes(found: list[dict[str, Any]]) -> list[tuple]:
        return [(e["event"], e["operation"], e.get("exception"), e.get("cause")) for e in found if e["event"] in ("ok", "error")]

    assert outcomes(events) == outcomes(expected_events)
    # the zombie learns it is fenced, fatally: its send (adding a partition), its commit and its abort
    fenced = "org.apache.kafka.common.errors.ProducerFencedException"
    assert outcomes(events) == [("error", "send", fenced, None), ("error", "commit", fenced, None), ("error", "abort", fenced, None)]
    produced = [(e["producer"], e["partition"], e["offset"]) for e in events if e["event"] == "produced"]
    assert produced == [(e["producer"], e["partition"], e["offset"]) for e in expected_events if e["event"] == "produced"]
    # the first's records, then the abort marker the second's initialization writes, then the second's
    assert produced == [("first", 0, 0), ("first", 0, 1), ("first", 0, 2), ("second", 0, 4), ("second", 0, 5), ("second", 0, 6)]
    assert seen == expected
    ends, records = seen["read_committed"]
    assert [key for _, _, key, _ in records] == ["second-0", "second-1", "second-2"]


# -- Kafka Streams -----------------------------------------------------------------------------------------


class StreamsApp:
    """One run of CountPerKey: its JSON lines as they come, its stderr in a file. Its JVM's temporary directory is
    beside the state directory: RocksDB unpacks its 13 MB native library there, and a killed JVM never deletes it."""

    def __init__(self, java: JavaProgram, bootstrap: str, application_id: str, source: str, sink: str, state_dir: Path, log: Path) -> None:
        self.log = log
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        jvm_tmp = state_dir.parent / "jvm-tmp"
        jvm_tmp.mkdir(exist_ok=True)
        with log.open("ab") as stderr:
            self.process = subprocess.Popen(
                java.argv(COUNT_PER_KEY, "--bootstrap-server", bootstrap, "--application-id", application_id, "--input", source,
                          "--output", sink, "--state-dir", str(state_dir), "--commit-interval-ms", "100",
                          jvm_options=("-Xmx384m", f"-Djava.io.tmpdir={jvm_tmp}")),
                stdout=subprocess.PIPE, stderr=stderr, text=True,
            )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.events.put(json.loads(line))

    def wait_for(self, wanted: Callable[[dict[str, Any]], bool], what: str, timeout: float = JAVA_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(0.0, min(1.0, deadline - time.monotonic())))
            except queue.Empty:
                assert self.process.poll() is None, f"the application exited with {self.process.returncode} before {what}: {self.seen}\n{self.stderr()}"
                assert time.monotonic() < deadline, f"no {what} within {timeout} s: {self.seen}\n{self.stderr()}"
                continue
            self.seen.append(event)
            assert event["event"] != "error", f"{event}\n{self.stderr()}"
            if wanted(event):
                return

    def drain(self) -> list[dict[str, Any]]:
        self.reader.join(timeout=30)
        while not self.events.empty():
            self.seen.append(self.events.get())
        return self.seen

    def kill(self) -> list[dict[str, Any]]:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=60)
        return self.drain()

    def stop(self) -> list[dict[str, Any]]:
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=120)
        return self.drain()

    def stderr(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]


def committed_offsets(bootstrap: str, group: str, topic: str, partitions: int) -> dict[int, int]:
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False, **FAST_CLIENT})
    try:
        return {tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in range(partitions)], timeout=60)}
    finally:
        consumer.close()


def test_kafka_streams_exactly_once_counts_survive_sigkill_and_compaction_of_the_changelog(
    java: JavaProgram, agent: RunningAgent, catalog: Catalog, tmp_path: Path,
) -> None:
    seed = int.from_bytes(os.urandom(4), "big")
    rng = random.Random(seed)
    application_id, source, sink = "counter", "counter-input", "counter-output"
    changelog = f"{application_id}-counts-changelog"
    partitions, keys, per_run = 2, 40, 1000
    create_topics(agent.bootstrap, partitions, source, sink)
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    sent: Counter[str] = Counter()
    input_ends = dict.fromkeys(range(partitions), 0)

    def produce(count: int) -> None:
        """`count` keyed records at about 1,000 a second, so the application is killed while records still come."""
        def delivered(error: Any, message: Any) -> None:
            assert error is None, error
            input_ends[message.partition()] = max(input_ends[message.partition()], message.offset() + 1)

        for n in range(count):
            key = f"key-{rng.randrange(keys)}"
            producer.produce(source, key=key.encode(), value=str(n).encode(), on_delivery=delivered)
            sent[key] += 1
            if n % 50 == 49:
                producer.flush(60)
                time.sleep(0.05)
        assert producer.flush(60) == 0

    def committed_input() -> int:
        return sum(max(0, offset) for offset in committed_offsets(agent.bootstrap, application_id, source, partitions).values())

    runs: list[list[dict[str, Any]]] = []
    changelog_sizes: list[tuple[int, int]] = []  # records before and after each compaction
    stable_before_run: list[dict[int, int]] = []  # the changelog's last stable offsets when each run starts
    for run in range(4):
        stable_before_run.append({p: fetch_watermarks(agent.server.address, changelog, p)[1] if run else 0 for p in range(partitions)})
        processed = committed_input()
        app = StreamsApp(java, agent.bootstrap, application_id, source, sink, tmp_path / "state", tmp_path / f"streams-{run}.log")
        app.wait_for(lambda e: e["event"] == "state" and e["to"] == "RUNNING", "RUNNING")
        feeder = threading.Thread(target=produce, args=(per_run,))
        feeder.start()
        if run < 3:
            # killed at a random point once this run has committed some of its input, while more still comes
            deadline = time.monotonic() + JAVA_TIMEOUT_S
            while committed_input() <= processed:
                assert app.process.poll() is None, f"the application exited (seed {seed}): {app.drain()}\n{app.stderr()}"
                assert time.monotonic() < deadline, f"run {run} committed nothing (seed {seed})\n{app.stderr()}"
                time.sleep(0.1)
            time.sleep(rng.uniform(0, 1.0))
            runs.append(app.kill())
            feeder.join()
            before = sum(len(stored(catalog, changelog, p)) for p in range(partitions))
            compact_full(catalog, changelog)
            changelog_sizes.append((before, sum(len(stored(catalog, changelog, p)) for p in range(partitions))))
            continue
        feeder.join()
        deadline = time.monotonic() + JAVA_TIMEOUT_S
        while committed_offsets(agent.bootstrap, application_id, source, partitions) != input_ends:
            assert app.process.poll() is None, f"the application exited (seed {seed}): {app.drain()}\n{app.stderr()}"
            assert time.monotonic() < deadline, f"input not all committed (seed {seed}): {input_ends}\n{app.stderr()}"
            time.sleep(0.5)
        runs.append(app.stop())

    # each run restored every changelog partition to its end (at least the last stable offset the run started at,
    # across the offsets compaction emptied) and then ran
    for run, events in enumerate(runs):
        restores = {e["partition"]: e for e in events if e["event"] == "restore_start"}
        ended = {e["partition"] for e in events if e["event"] == "restore_end"}
        assert set(restores) == ended == set(range(partitions)), (seed, run, events)
        assert all(restores[p]["ending_offset"] >= stable_before_run[run][p] for p in range(partitions)), (seed, run, stable_before_run, events)
        assert "RUNNING" in [e["to"] for e in events if e["event"] == "state"], (seed, run, events)
    assert sum(e["restored"] for e in runs[-1] if e["event"] == "restore_end") > 0, runs[-1]  # state came back from the changelog
    assert any(after < before for before, after in changelog_sizes), changelog_sizes  # compaction removed older counts

    settle(agent.server.address, sink, partitions)
    _, records = read(java, agent.bootstrap, sink, "read_committed")
    counts: dict[str, list[int]] = {}
    for _, _, key, value in records:
        counts.setdefault(key, []).append(int(value))
    # every count once, in order (none lost or made twice by a killed run), the last the key's number of records
    assert {key: values[-1] for key, values in counts.items()} == dict(sent), seed
    assert all(values == sorted(set(values)) for values in counts.values()), seed
