"""Transactions through agents that die: two `logcompact agent` processes on one PostgreSQL catalog and store, real
clients, SIGKILL.

* Exactly-once copy: a confluent-kafka copier (tests/kafka/txn_copier.py: read_committed group consumer, transactional
  producer, send_offsets_to_transaction per batch) copies one topic to another while it is killed with SIGKILL at
  random points five times and the agent coordinating its transactions is killed and started again once. The output
  read read_committed is the input exactly once, in order, and the group's committed offsets are the input's end.
* A Jepsen-style check (Jepsen's Kafka queue analysis, lab/queue_analysis.py): transactional producers writing unique
  values to the partitions of a topic, committing, aborting or dying with a transaction open at random, beside an
  idempotent producer, read_committed consumers polling, for a
  duration (60 s here) while each agent is killed and started again; the history of sends and polls has no aborted
  read, lost or unseen write, duplicate, inconsistent offset, poll skip or nonmonotonic poll. G0 cycles, which
  Kafka's model allows, are reported.
* A topic deleted while a transaction has records in it and in another topic: the transaction commits, its records
  in the other topic are read read_committed, and no surviving partition's last stable offset stays held.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient

from lab.queue_analysis import Op, Poll, Send, analyse
from logcompact.catalog import Catalog
from logcompact.store import LocalStore
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, AgentProcesses, RunningAgent
from tests.kafka.test_transactions import fetch_watermarks
from tests.kafka.wire import Wire

FIND_COORDINATOR, TRANSACTION_KEY = 10, 1
RECONNECT = {"reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50}
# How long a client waits for an answer before it tries again: longer than an agent's restart on a loaded machine.
CLIENT = {"socket.timeout.ms": 10000, **RECONNECT}


@pytest.fixture
def postgres_catalog(tmp_path: Path, make_catalog_url: Callable[[str], str | None]) -> Catalog:
    """A cluster whose catalog is on PostgreSQL, as agents on several machines share one."""
    return Catalog(LocalStore(tmp_path / "store"), make_catalog_url("postgresql"))


@pytest.fixture
def agents(postgres_catalog: Catalog, tmp_path: Path) -> Iterator[AgentProcesses]:
    postgres_catalog.ensure_created(int(time.time() * 1000))
    running = AgentProcesses(postgres_catalog, 2, tmp_path)
    try:
        yield running
    finally:
        running.stop()


def transaction_coordinator(agents: AgentProcesses, transactional_id: str) -> int:
    """The index in `agents` of the agent coordinating `transactional_id`, as FindCoordinator answers."""
    deadline = time.monotonic() + 60
    while True:
        with socket.create_connection(("127.0.0.1", agents.ports[0]), timeout=30) as connection:
            found = Wire.over(connection).call(FIND_COORDINATOR, 3, {"key": transactional_id, "key_type": TRANSACTION_KEY})
        if found.error_code == 0 and int(found.port) in agents.ports:
            return agents.ports.index(int(found.port))
        assert time.monotonic() < deadline, f"no coordinator for {transactional_id!r}: error {found.error_code}"
        time.sleep(0.5)


def read_committed(bootstrap: str, topic: str, partitions: int, timeout: float = 120) -> dict[int, list[tuple[int, bytes]]]:
    """Every record of the topic a read_committed consumer reads, up to each partition's end: (offset, value)s."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "faults-reader", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True, **CLIENT})
    try:
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
        read: dict[int, list[tuple[int, bytes]]] = {p: [] for p in range(partitions)}
        at_end: set[int] = set()
        deadline = time.monotonic() + timeout
        while len(at_end) < partitions:
            assert time.monotonic() < deadline, f"partitions {sorted(set(read) - at_end)} of {topic} not read to their end within {timeout} s"
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error() is not None:
                if message.error().code() == KafkaError._PARTITION_EOF:
                    at_end.add(message.partition())
                continue
            at_end.discard(message.partition())
            read[message.partition()].append((message.offset(), message.value()))
        return read
    finally:
        consumer.close()


# -- exactly-once copy --------------------------------------------------------------------------------------------

SOURCE, COPY, PARTITIONS, RECORDS_PER_PARTITION, COPIER_KILLS = "orders", "orders-copy", 2, 1500, 5


class Copier:
    """tests/kafka/txn_copier.py as a process: the committed positions it prints, its stderr in a file."""

    def __init__(self, config: dict[str, Any], log: Path) -> None:
        self.log = log
        with open(log, "a") as stderr:
            self.process = subprocess.Popen([sys.executable, "-m", "tests.kafka.txn_copier", json.dumps(config)], stdout=subprocess.PIPE, stderr=stderr,
                                            text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        self.lines: queue.Queue[str] = queue.Queue()
        self.positions: dict[str, int] = {}  # the last it committed, by partition
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.put(line.strip())

    @property
    def copied(self) -> int:
        """Records copied in transactions it committed (or the copiers before it)."""
        return sum(max(0, offset) for offset in self.positions.values())

    def wait_for_commit(self, copied: int = 0, timeout: float = 300) -> None:
        """Until the copier says it committed one more transaction, and `copied` records at least."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=1)
                if line.startswith("{"):
                    self.positions = json.loads(line)
                    if self.copied >= copied:
                        return
            except queue.Empty:
                pass
            assert self.process.poll() is None, f"the copier exited {self.process.returncode}: {self.log.read_text()[-3000:]}"
            assert time.monotonic() < deadline, f"the copier did not commit {copied} records within {timeout} s: {self.log.read_text()[-3000:]}"

    def kill(self) -> None:
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()


@pytest.mark.timeout(900)
def test_an_exactly_once_copy_killed_five_times_with_an_agent_restarted_copies_the_input_once(
    postgres_catalog: Catalog, agents: AgentProcesses, tmp_path: Path,
) -> None:
    catalog = postgres_catalog
    create_topic(catalog, SOURCE, PARTITIONS)
    create_topic(catalog, COPY, PARTITIONS, cleanup_policy="compact")
    producer = Producer({"bootstrap.servers": agents.bootstrap, "enable.idempotence": True, "linger.ms": 5, **CLIENT})
    source = {p: [f"{p}-{n}".encode() for n in range(RECORDS_PER_PARTITION)] for p in range(PARTITIONS)}
    for partition, values in source.items():
        for value in values:
            producer.produce(SOURCE, key=value, value=value, partition=partition)
    assert producer.flush(120) == 0
    transactional_id, group = "copier-1", "copier"
    config = {"bootstrap": agents.bootstrap, "transactional_id": transactional_id, "group": group, "input": SOURCE, "output": COPY,
              "ends": dict.fromkeys(range(PARTITIONS), RECORDS_PER_PARTITION)}
    seed = random.randrange(1_000_000)
    print(f"seed {seed}")
    rng = random.Random(seed)
    log = tmp_path / "copier.log"
    total = PARTITIONS * RECORDS_PER_PARTITION
    for kill in range(COPIER_KILLS):
        copier = Copier(config, log)
        # kills spread over the whole copy (librdkafka may hand out one partition's backlog before the other's)
        copier.wait_for_commit(copied=int(total * (kill + rng.random()) / (COPIER_KILLS + 1)))
        if kill == COPIER_KILLS // 2:  # the agent coordinating its transactions, killed and started again under it
            agents.kill_and_restart(transaction_coordinator(agents, transactional_id))
            copier.wait_for_commit()
        time.sleep(rng.uniform(0, 1.5))  # somewhere in a batch: reading, producing, sending offsets, committing
        assert copier.process.poll() is None, "the copier finished before its kill: give it more input"
        copier.kill()
        print(f"copier killed, {copier.positions} committed at least, {copier.copied} of {total} records")
    last = Copier(config, log)
    assert last.process.wait(timeout=600) == 0, log.read_text()[-3000:]

    copied = read_committed(agents.bootstrap, COPY, PARTITIONS)
    assert {p: [value for _, value in records] for p, records in copied.items()} == source  # each record once, in order
    assert {tp: found.offset for tp, found in catalog.committed_offsets(group).items()} == {(SOURCE, p): RECORDS_PER_PARTITION for p in range(PARTITIONS)}


# -- Jepsen's queue analysis ------------------------------------------------------------------------------------

QUEUE, QUEUE_PARTITIONS, TRANSACTIONAL_PRODUCERS, POLLERS, DURATION_S = "queue", 4, 4, 2, 60
ABORT_ONE_IN, CRASH_ONE_IN = 4, 12


class History:
    """Ops as they happen, from every client thread, and process numbers: a client started afresh gets a new one."""

    def __init__(self) -> None:
        self.ops: list[Op] = []
        self.lock = threading.Lock()
        self.processes = 0
        self.values = 0

    def add(self, op: Op) -> None:
        with self.lock:
            self.ops.append(op)

    def new_process(self) -> int:
        with self.lock:
            self.processes += 1
            return self.processes

    def new_value(self) -> int:
        with self.lock:
            self.values += 1
            return self.values


class QueueProducer(threading.Thread):
    """Sends of 1 to 4 unique values over random partitions until told to stop. A transactional one commits each as a
    transaction, aborts one in ABORT_ONE_IN, and one in CRASH_ONE_IN leaves it open as a client that died would (the
    next producer of its transactional id, a new process, aborts it): ok with the offsets delivered, fail when
    aborted, info when the outcome is unknown (then a new producer too). Without a transactional id: an idempotent
    producer, ok once every value is delivered."""

    def __init__(self, bootstrap: str, transactional_id: str | None, history: History, stop: threading.Event, rng: random.Random) -> None:
        super().__init__(daemon=True, name=transactional_id or "idempotent")
        self.bootstrap, self.transactional_id, self.history, self.stop, self.rng = bootstrap, transactional_id, history, stop, rng
        self.errors: list[str] = []
        self.crashed: list[Producer] = []  # kept, not destroyed: a dead client says nothing more

    def _producer(self) -> Producer:
        if self.transactional_id is None:
            return Producer({"bootstrap.servers": self.bootstrap, "enable.idempotence": True, "linger.ms": 5, **CLIENT})
        while True:
            producer = Producer({"bootstrap.servers": self.bootstrap, "transactional.id": self.transactional_id, "linger.ms": 5, **CLIENT})
            try:
                producer.init_transactions(60)
                return producer
            except KafkaException as exc:
                self.errors.append(f"init_transactions: {exc}")

    def run(self) -> None:
        process, producer = self.history.new_process(), self._producer()
        while not self.stop.is_set():
            sends = [(self.rng.randrange(QUEUE_PARTITIONS), self.history.new_value()) for _ in range(self.rng.randint(1, 4))]
            self.history.add(Op(process, "invoke", "send", tuple(Send(k, v) for k, v in sends)))
            offsets: dict[int, int] = {}
            outcome = self._transaction(producer, sends, offsets) if self.transactional_id else self._idempotent(producer, sends, offsets)
            self.history.add(Op(process, outcome, "send", tuple(Send(k, v, offsets.get(v)) for k, v in sends)))
            if outcome == "info" or producer in self.crashed:
                process, producer = self.history.new_process(), self._producer()
        if self.transactional_id is None:
            producer.flush(60)

    def _produce(self, producer: Producer, sends: list[tuple[int, int]], offsets: dict[int, int]) -> None:
        def delivered(error: KafkaError | None, message: Any) -> None:
            if error is None:
                offsets[int(message.value())] = message.offset()

        for key, value in sends:
            producer.produce(QUEUE, key=str(value).encode(), value=str(value).encode(), partition=key, on_delivery=delivered)
        producer.flush(60)

    def _idempotent(self, producer: Producer, sends: list[tuple[int, int]], offsets: dict[int, int]) -> str:
        self._produce(producer, sends, offsets)
        return "ok" if len(offsets) == len(sends) else "info"

    def _transaction(self, producer: Producer, sends: list[tuple[int, int]], offsets: dict[int, int]) -> str:
        ending = self.rng.randrange(CRASH_ONE_IN * ABORT_ONE_IN)
        try:
            producer.begin_transaction()
            self._produce(producer, sends, offsets)
            if ending == 0:
                self.crashed.append(producer)
                return "fail"  # the next producer's InitProducerId aborts it
            if ending % ABORT_ONE_IN == 0:
                producer.abort_transaction(60)
                return "fail"
            for _ in range(5):  # a retriable commit is sent again, as librdkafka documents
                try:
                    producer.commit_transaction(60)
                    return "ok"
                except KafkaException as exc:
                    if not exc.args[0].retriable() or exc.args[0].txn_requires_abort():
                        raise
            return "info"
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            self.errors.append(f"{error.name()}: {error.str()}")
            if error.txn_requires_abort() and not error.fatal():
                try:
                    producer.abort_transaction(60)
                    return "fail"
                except KafkaException as again:
                    self.errors.append(f"abort: {again}")
            return "info"


def queue_consumer(bootstrap: str, history: History) -> tuple[int, Consumer]:
    """A new read_committed consumer (a new process), assigned every partition from the start."""
    process = history.new_process()
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "queue-pollers", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "enable.partition.eof": True, **CLIENT})
    keys = tuple(range(QUEUE_PARTITIONS))
    history.add(Op(process, "invoke", "assign", keys=keys))
    consumer.assign([TopicPartition(QUEUE, p, OFFSET_BEGINNING) for p in keys])
    history.add(Op(process, "ok", "assign", keys=keys))
    return process, consumer


def poll_once(consumer: Consumer, process: int, history: History, at_end: set[int] | None = None) -> None:
    """One poll op: what one consume() call returned, per partition; partitions reported at their end join `at_end`."""
    history.add(Op(process, "invoke", "poll", (Poll(),)))
    read: dict[Hashable, list[tuple[int, Hashable]]] = {}
    for message in consumer.consume(100, 0.5):
        if message.error() is not None:
            if message.error().code() == KafkaError._PARTITION_EOF and at_end is not None:
                at_end.add(message.partition())
            continue
        if at_end is not None:
            at_end.discard(message.partition())
        read.setdefault(message.partition(), []).append((message.offset(), int(message.value())))
    history.add(Op(process, "ok", "poll", (Poll(read),)))


class Poller(threading.Thread):
    def __init__(self, bootstrap: str, history: History, stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.bootstrap, self.history, self.stop = bootstrap, history, stop

    def run(self) -> None:
        process, consumer = queue_consumer(self.bootstrap, self.history)
        while not self.stop.is_set():
            poll_once(consumer, process, self.history)
        consumer.close()


def queue_workload(agents: AgentProcesses, duration_s: float, seed: int) -> tuple[list[Op], list[str]]:
    """TRANSACTIONAL_PRODUCERS transactional producers, an idempotent one and POLLERS pollers for `duration_s`, each
    agent killed with SIGKILL and started again once along the way (at a third and two thirds of it), then a fresh
    consumer's final polls up to every partition's end: the history, and the errors the producers met."""
    rng = random.Random(seed)
    history, stop = History(), threading.Event()
    producers = [QueueProducer(agents.bootstrap, transactional_id, history, stop, random.Random(rng.random()))
                 for transactional_id in [*(f"queue-{n}" for n in range(TRANSACTIONAL_PRODUCERS)), None]]
    pollers = [Poller(agents.bootstrap, history, stop) for _ in range(POLLERS)]
    for client in [*producers, *pollers]:
        client.start()
    started = time.monotonic()
    for index in range(len(agents.ports)):
        time.sleep(max(0.0, started + duration_s * (index + 1) / (len(agents.ports) + 1) - time.monotonic()))
        agents.kill_and_restart(index)
    time.sleep(max(0.0, started + duration_s - time.monotonic()))
    stop.set()
    for client in [*producers, *pollers]:
        client.join(timeout=300)
        assert not client.is_alive(), f"{client.name} did not stop within 300 s"
    process, consumer = queue_consumer(agents.bootstrap, history)
    try:
        at_end: set[int] = set()
        deadline = time.monotonic() + 300
        while len(at_end) < QUEUE_PARTITIONS:
            assert time.monotonic() < deadline, f"the final polls did not reach the end of partitions {sorted(set(range(QUEUE_PARTITIONS)) - at_end)}"
            poll_once(consumer, process, history, at_end)
    finally:
        consumer.close()
    return history.ops, [error for client in producers for error in client.errors]


@pytest.mark.timeout(1200)
def test_transactional_traffic_through_agent_restarts_has_none_of_jepsens_queue_anomalies(
    postgres_catalog: Catalog, agents: AgentProcesses,
) -> None:
    create_topic(postgres_catalog, QUEUE, QUEUE_PARTITIONS, cleanup_policy="compact")
    seed = random.randrange(1_000_000)
    ops, errors = queue_workload(agents, DURATION_S, seed)
    found = analyse(ops)
    outcomes = {kind: sum(1 for op in ops if op.f == "send" and op.type == kind) for kind in ("ok", "fail", "info")}
    print(f"seed {seed}: {len(ops)} ops, transactions {outcomes}, producer errors {len(errors)} {errors[:5]}\n{found.summary()}")
    assert found.failing == {}, found.summary()
    assert outcomes["ok"] > 0 and outcomes["fail"] > 0  # both committed and aborted transactions were checked
    assert any(op.f == "poll" and op.type == "ok" and op.reads() for op in ops)


# -- a topic deleted under an open transaction --------------------------------------------------------------------


@pytest.mark.timeout(120)
def test_a_topic_deleted_under_an_open_transaction_leaves_its_other_topic_committable(catalog: Catalog) -> None:
    create_topic(catalog, "doomed", 1)
    create_topic(catalog, "kept", 2)
    agent = RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        producer = Producer({"bootstrap.servers": agent.bootstrap, "transactional.id": "deleting", "linger.ms": 5, **FAST_CLIENT})
        producer.init_transactions(20)
        producer.begin_transaction()
        for partition in range(2):
            producer.produce("kept", key=b"k%d" % partition, value=b"kept-%d" % partition, partition=partition)
        producer.produce("doomed", key=b"k", value=b"doomed", partition=0)
        assert producer.flush(20) == 0
        assert [fetch_watermarks(agent.server.address, "kept", p) for p in range(2)] == [(1, 0), (1, 0)]  # held by the open transaction
        admin = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
        for future in admin.delete_topics(["doomed"], operation_timeout=20).values():
            future.result(30)
        producer.commit_transaction(20)
        assert [fetch_watermarks(agent.server.address, "kept", p) for p in range(2)] == [(2, 2), (2, 2)]  # each: its record, the marker
        assert read_committed(agent.bootstrap, "kept", 2) == {0: [(0, b"kept-0")], 1: [(0, b"kept-1")]}
        # the producer goes on, on the surviving topic
        producer.begin_transaction()
        producer.produce("kept", key=b"k0", value=b"next", partition=0)
        producer.commit_transaction(20)
        assert read_committed(agent.bootstrap, "kept", 2)[0] == [(0, b"kept-0"), (2, b"next")]
    finally:
        agent.stop()
