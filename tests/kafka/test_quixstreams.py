"""quixstreams, exactly-once, through the agent: an application counting records per key in a RocksDB store whose
changelog is a compacted topic (tests/support/quix_counter.py, run by quixstreams' own virtualenv,
`make quixstreams`), killed with SIGKILL and restarted while records stream in, writes every count once; after a
compaction removed the changelog's last records, an instance without local state recovers its store from the
changelog and counts on from there.

quixstreams' recovery reads a changelog partition until the consumer's position reaches the high watermark it read
at assignment: the offsets past the last stored record (tombstones removed by compaction, transaction markers) must
be covered by what Fetch answers, or the recovery never ends.
"""

from __future__ import annotations

import random
import shutil
import signal
import struct
import subprocess
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition

from logcompact.catalog import Catalog
from logcompact.units import wall_clock_ms
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, RunningAgent, stored
from tests.support.cli_cases import run_in_process

pytestmark = pytest.mark.timeout(1200)

REPO = Path(__file__).resolve().parents[2]
QUIX_PYTHON = REPO / ".venv-quixstreams" / "bin" / "python"
APP = REPO / "tests" / "support" / "quix_counter.py"
INPUT, OUTPUT = "words", "counts"
CHANGELOG = "changelog__quix-counter--words--default"  # quixstreams' name: consumer group, topic, store
PARTITIONS = 2
KEYS = [f"k{n}" for n in range(12)]
RESET = KEYS[:6]  # three keys of each partition
KILLS = 4
DELETE_RETENTION_MS = 86_400_000  # the changelog's, Kafka's default: quixstreams sets none
WAIT_S = 300  # a loaded machine's worst case for the application to catch up; never a measure of speed


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, INPUT, PARTITIONS)
    create_topic(catalog, OUTPUT, PARTITIONS)
    return catalog


def partition_of(key: str) -> int:
    return int(key[1:]) % PARTITIONS


class Counter:
    """The application as a process: its log in a file, its RocksDB state under `state_dir`."""

    def __init__(self, agent: RunningAgent, state_dir: Path, log: Path) -> None:
        if not QUIX_PYTHON.exists():
            pytest.fail(f"quixstreams' virtualenv is missing ({QUIX_PYTHON}): run `make quixstreams`", pytrace=False)
        self.agent, self.state_dir, self.log = agent, state_dir, log
        self.process: subprocess.Popen | None = None

    def start(self) -> None:
        with self.log.open("a") as log:
            log.write(f"--- started at {time.strftime('%H:%M:%S')}\n")
            self.process = subprocess.Popen([str(QUIX_PYTHON), str(APP), self.agent.bootstrap, str(self.state_dir), INPUT, OUTPUT],
                                            stdout=log, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.process is not None and self.process.poll() is None, self.tail()
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(30)

    def stop(self) -> None:
        """SIGTERM: quixstreams commits its last checkpoint and leaves the group."""
        assert self.process is not None and self.process.poll() is None, self.tail()
        self.process.send_signal(signal.SIGTERM)
        assert self.process.wait(120) == 0, self.tail()

    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tail(self) -> str:
        return "the application's log ends:\n" + "\n".join(self.log.read_text().splitlines()[-30:])


def committed_counts(agent: RunningAgent) -> dict[str, list[int]]:
    """Each key's counts in the output as a read_committed consumer reads them, in order."""
    consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": "count-check", "enable.auto.commit": False,
                         "enable.partition.eof": True, "isolation.level": "read_committed", **FAST_CLIENT})
    counts: dict[str, list[int]] = defaultdict(list)
    try:
        consumer.assign([TopicPartition(OUTPUT, p, 0) for p in range(PARTITIONS)])
        ended: set[int] = set()
        while len(ended) < PARTITIONS:
            message = consumer.poll(10)
            assert message is not None, f"{OUTPUT}: no end of partition within 10 s"
            if message.error():
                assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
                ended.add(message.partition())
                continue
            counts[message.key().decode()].append(struct.unpack(">i", message.value())[0])
    finally:
        consumer.close()
    return dict(counts)


def wait_for_counts(agent: RunningAgent, counter: Counter, expected: dict[str, list[int]]) -> None:
    """Until the output read_committed is `expected` exactly; a count missing, twice or wrong never becomes it."""
    deadline = time.monotonic() + WAIT_S
    while (found := committed_counts(agent)) != expected:
        assert counter.running(), counter.tail()
        if time.monotonic() > deadline:
            differing = {key: (found.get(key), expected.get(key)) for key in set(found) | set(expected) if found.get(key) != expected.get(key)}
            raise AssertionError(f"counts (found, expected) that differ after {WAIT_S} s: {differing}\n{counter.tail()}")
        time.sleep(1)


def changelog_watermarks(agent: RunningAgent, isolation: str) -> list[tuple[int, int]]:
    consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": "changelog-check", "isolation.level": isolation, **FAST_CLIENT})
    try:
        return [consumer.get_watermark_offsets(TopicPartition(CHANGELOG, p), timeout=10) for p in range(PARTITIONS)]
    finally:
        consumer.close()


class Stream:
    """Records produced to the input, one every few milliseconds, from a thread, until stopped; each key's
    expected counts."""

    def __init__(self, agent: RunningAgent) -> None:
        self.producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
        self.expected: dict[str, list[int]] = defaultdict(list)
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="input", daemon=True)

    def send(self, key: str, value: bytes) -> None:
        self.producer.produce(INPUT, key=key.encode(), value=value, partition=partition_of(key))
        counts = self.expected[key]
        counts.append(0 if value == b"reset" else (counts[-1] if counts else 0) + 1)

    def _run(self) -> None:
        chooser = random.Random(42)
        while not self.stopped.is_set():
            self.send(chooser.choice(KEYS), b"add")
            self.producer.poll(0)
            time.sleep(0.005)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(30)
        assert self.producer.flush(60) == 0


def compact_changelog(catalog: Catalog, now: int) -> None:
    done = run_in_process(["--store", catalog.store.uri, "--catalog", catalog.url, "--now", str(now), "compact", "--full", "--topics", CHANGELOG])
    assert done.code == 0, done


def test_killed_and_restarted_counts_exactly_and_recovers_a_changelog_whose_last_records_compaction_removed(
    agent: RunningAgent, catalog: Catalog, tmp_path: Path,
) -> None:
    counter = Counter(agent, tmp_path / "state", tmp_path / "quix_counter.log")
    stream = Stream(agent)
    stream.thread.start()
    chooser = random.Random(7)
    try:
        # SIGKILL at random points while records stream in: each kill once the instance has committed counts of its
        # own (the abort of its predecessor's transaction alone moves the output's end)
        for _ in range(KILLS):
            before = sum(map(len, committed_counts(agent).values()))
            counter.start()
            deadline = time.monotonic() + WAIT_S
            while sum(map(len, committed_counts(agent).values())) == before:
                assert counter.running() and time.monotonic() < deadline, counter.tail()
                time.sleep(0.5)
            time.sleep(chooser.uniform(0, 2))
            counter.kill()
        counter.start()
        stream.stop()
        wait_for_counts(agent, counter, dict(stream.expected))

        # The reset keys' tombstones become the last records of each changelog partition; with the application
        # stopped, two full sweeps (the second past delete.retention.ms) remove them and every value they supersede.
        for key in RESET:
            stream.send(key, b"reset")
        assert stream.producer.flush(60) == 0
        wait_for_counts(agent, counter, dict(stream.expected))
        counter.stop()
        watermarks = changelog_watermarks(agent, "read_committed")
        assert watermarks == changelog_watermarks(agent, "read_uncommitted")  # no open transaction holds it
        now = wall_clock_ms()
        compact_changelog(catalog, now)
        compact_changelog(catalog, now + DELETE_RETENTION_MS + 60_000)
        for partition, (_, high) in enumerate(watermarks):
            records = stored(catalog, CHANGELOG, partition)
            assert records and all(record.value is not None for record in records)
            # past the last stored record: the tombstones' offsets and the last commit's marker, all holes
            assert records[-1].offset < high - 2, (partition, records[-1].offset, high)
        assert changelog_watermarks(agent, "read_committed") == watermarks

        # A new instance without local state restores the store from the changelog: the kept keys count on,
        # the reset ones from 1.
        shutil.rmtree(counter.state_dir)
        for key in KEYS:
            for _ in range(3):
                stream.send(key, b"add")
        assert stream.producer.flush(60) == 0
        counter.start()
        wait_for_counts(agent, counter, dict(stream.expected))
        counter.stop()
        assert "Recovery successful" in counter.log.read_text().split("--- started at")[-1], counter.tail()
    finally:
        stream.stopped.set()
        if counter.running():
            assert counter.process is not None
            counter.process.kill()
            counter.process.wait(30)
