"""`logcompact agent --processes N`: N agent processes, each a broker of its own on the listeners' ports + i, serving
confluent-kafka producers, consumers and a consumer group across them; one JSON line, one log tagged by process and
node; SIGTERM stops all with nothing acked lost; a process killed stops the others and the command exits 1."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from logcompact.catalog import Catalog
from logcompact.cli.agent_processes import DIVIDED_BUDGETS, available_cores
from logcompact.kafka.server import AgentSettings
from tests.kafka.agents import FAST_CLIENT, agent_environment, free_port, stored

SQLITE_ONLY = pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)  # a process's fault, not the catalog's, is tested


def free_ports(count: int) -> int:
    """The first of `count` consecutive free ports of 127.0.0.1."""
    while True:
        first = free_port()
        if first + count - 1 <= 65535 and all(_free(first + n) for n in range(1, count)):
            return first


def _free(port: int) -> bool:
    with socket.socket() as probe:
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


@contextmanager
def agent_processes(catalog: Catalog, port: int, log: Path, *arguments: str) -> Iterator[tuple[subprocess.Popen, dict[str, Any]]]:
    """`logcompact -v agent --processes 2` on 127.0.0.1:`port` and the next port, its stderr appended to `log`, once its
    JSON line says every process listens; stopped with SIGTERM after (if still running)."""
    command = [sys.executable, "-m", "logcompact", "-v", "agent", "--processes", "2", "--listen", f"127.0.0.1:{port}", "--flush-ms", "50", *arguments]
    with open(log, "a") as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, log.read_text()[-4000:]
        yield process, json.loads(line)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def produce(bootstrap: str, topic: str, count: int, prefix: str, client_id: str = "rdkafka") -> list[tuple[bytes, bytes]]:
    """`count` keyed records produced with acks=all by a producer of `client_id`; those acknowledged."""
    producer = Producer({"bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 5, **FAST_CLIENT})
    acked: list[tuple[bytes, bytes]] = []

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.append((message.key(), message.value()))

    for n in range(count):
        producer.produce(topic, key=f"{prefix}{n}".encode(), value=f"value-{prefix}{n}".encode(), on_delivery=delivered)
        producer.poll(0)
    assert producer.flush(60) == 0
    return acked


def consume_all(consumers: list[Consumer], count: int) -> list[tuple[Any, Any]]:
    """Poll `consumers` in turn until `count` records have come, then commit each one's offsets."""
    records: list[tuple[Any, Any]] = []
    polls = 0
    while len(records) < count:
        polls += 1
        assert polls < 2000, f"{len(records)} of {count} records consumed"
        for consumer in consumers:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                records.append((message.key(), message.value()))
    for consumer in consumers:
        consumer.commit(asynchronous=False)
    return records


def test_two_processes_serve_producers_and_a_group_across_both_and_keep_what_was_acked_over_a_restart(catalog: Catalog, tmp_path: Path) -> None:
    port, log = free_ports(2), tmp_path / "agent.log"
    with agent_processes(catalog, port, log, "--node-id", "10") as (process, listening):  # process i: node 10 + i, port + i
        pids = [child["pid"] for child in listening["processes"]]
        nodes = {child["node_id"]: child["listening"] for child in listening["processes"]}
        assert nodes == {10: f"127.0.0.1:{port}", 11: f"127.0.0.1:{port + 1}"}
        # Arrow's pool named before pyarrow loaded, and inherited (kafka/allocator.py)
        assert [psutil.Process(pid).environ().get("ARROW_DEFAULT_MEMORY_POOL") for pid in pids] == ["system", "system"]
        assert listening["listening"] == f"127.0.0.1:{port}" and listening["node_id"] == listening["processes"][0]["node_id"]
        defaults = AgentSettings()
        assert listening["budgets_per_process"] == {name: getattr(defaults, name) // 2 for name in DIVIDED_BUDGETS}

        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap, **FAST_CLIENT})
        brokers = admin.list_topics(timeout=30).brokers
        assert {node_id: f"{broker.host}:{broker.port}" for node_id, broker in brokers.items()} == nodes
        admin.create_topics([NewTopic("orders", 8, 1)])["orders"].result(30)
        # One process leads every partition for a client, and clients are spread over both by their ids.
        leaders_of_client = {}
        for client in (f"client-{n}" for n in range(20)):
            topics = AdminClient({"bootstrap.servers": bootstrap, "client.id": client, **FAST_CLIENT}).list_topics("orders", timeout=30).topics
            leaders_of_client[client] = {partition.leader for partition in topics["orders"].partitions.values()}
        assert all(len(leaders) == 1 for leaders in leaders_of_client.values()), leaders_of_client
        assert set().union(*leaders_of_client.values()) == set(nodes), "clients are led by both processes"

        led_by = {node: next(client for client, leaders in leaders_of_client.items() if leaders == {node}) for node in nodes}
        acked = [record for node, client in led_by.items() for record in produce(bootstrap, "orders", 400, f"{node}-", client)]
        assert len(acked) == 800
        group = {"bootstrap.servers": bootstrap, "group.id": "billing", "auto.offset.reset": "earliest", "enable.auto.commit": False,
                 "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, **FAST_CLIENT}
        members = [Consumer(group), Consumer(group)]
        try:
            for member in members:
                member.subscribe(["orders"])
            consumed = consume_all(members, 800)
            committed = members[0].committed([TopicPartition("orders", n) for n in range(8)], timeout=30)
        finally:
            for member in members:
                member.close()
        assert sorted(consumed) == sorted(acked)
        assert sum(partition.offset for partition in committed) == 800

        with socket.create_connection(("127.0.0.1", port + 1), timeout=10) as connection:  # a frame process 1 refuses, and logs
            connection.sendall(b"\xff\xff\xff\xff")
            assert connection.recv(1) == b""
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    assert all(gone(pid) for pid in pids)
    lines = log.read_text().splitlines()
    assert any(line.startswith("[process 1, node 11] logcompact: WARNING: connection from ") and "frame size -1" in line for line in lines), lines

    with agent_processes(catalog, port, log, "--node-id", "10") as (process, restarted):
        assert {child["node_id"]: child["listening"] for child in restarted["processes"]} == nodes
        reader = Consumer({"bootstrap.servers": f"127.0.0.1:{port}", "group.id": "audit", "auto.offset.reset": "earliest", **FAST_CLIENT})
        try:
            reader.subscribe(["orders"])
            assert sorted(consume_all([reader], 800)) == sorted(acked)
        finally:
            reader.close()


@SQLITE_ONLY
def test_a_process_killed_stops_the_others_and_the_command_exits_1_with_what_was_acked_kept(catalog: Catalog, tmp_path: Path) -> None:
    port, log = free_ports(2), tmp_path / "agent.log"
    with agent_processes(catalog, port, log) as (process, listening):
        bootstrap = f"127.0.0.1:{port}"
        admin = AdminClient({"bootstrap.servers": bootstrap, **FAST_CLIENT})
        admin.create_topics([NewTopic("clicks", 4, 1)])["clicks"].result(30)
        acked = produce(bootstrap, "clicks", 200, "c")
        killed, other = listening["processes"][1], listening["processes"][0]
        os.kill(killed["pid"], signal.SIGKILL)
        assert process.wait(timeout=60) == 1
    assert gone(other["pid"])
    assert (f"logcompact: error: agent process 1 (node {killed['node_id']}), pid {killed['pid']} was killed by SIGKILL; "
            "stopping the other agent processes") in log.read_text().splitlines()
    kept = [(record.key, record.value) for partition in range(4) for record in stored(catalog, "clicks", partition)]
    assert sorted(kept) == sorted(acked)


@SQLITE_ONLY
def test_listeners_whose_port_ranges_meet_are_refused(catalog: Catalog) -> None:
    done = subprocess.run([sys.executable, "-m", "logcompact", "agent", "--processes", "3", "--listen", "127.0.0.1:9092",
                           "--listen", "SASL_PLAINTEXT://127.0.0.1:9094"], capture_output=True, text=True, env=agent_environment(catalog), timeout=60)
    assert done.returncode == 2
    assert "--listen PLAINTEXT://127.0.0.1:9092 and --listen SASL_PLAINTEXT://127.0.0.1:9094: with 3 processes each takes 3 ports" in done.stderr


def test_the_default_count_is_the_cores_this_process_may_run_on() -> None:
    assert available_cores() == len(os.sched_getaffinity(0))
