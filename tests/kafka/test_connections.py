"""Connections that hold the agent without using it: frames that never complete, sockets that never speak or
fall silent, and many sockets from one address. Each is closed or bounded while other clients are served."""

from __future__ import annotations

import asyncio
import json
import logging
import resource
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Callable

import pytest
from confluent_kafka import Producer, TopicPartition

from logcompact.catalog import Catalog
from logcompact.kafka.server import ByteBudget
from tests.helpers import create_topic
from tests.kafka.agents import RunningAgent, agent_environment, confluent_consumer, consume
from tests.kafka.wire import closed_by_peer, kio_frame, receive_frame, request_frame

pytestmark = pytest.mark.timeout(120)

MiB = 1 << 20
API_VERSIONS = request_frame(18, 0, 7)


@pytest.fixture
def catalog_url() -> str | None:
    """SQLite only: these tests hold sockets and frames, which the agent keeps in memory whatever its catalog; a
    second run on PostgreSQL would double their waits on timeouts and check nothing more."""
    return None


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy="compact")
    create_topic(catalog, "clicks", 1)
    return catalog


def stalled_frame(declared: int) -> bytes:
    """The size prefix of a frame of `declared` bytes and the first 8 of them, of which no more will come."""
    return struct.pack(">i", declared) + b"\0" * 8


def open_socket(agent: RunningAgent, source: str = "127.0.0.1") -> socket.socket:
    address = agent.server.address
    return socket.create_connection((address.host, address.port), timeout=10, source_address=(source, 0))


def answered_in(connection: socket.socket, frame: bytes = API_VERSIONS) -> float:
    """Seconds from sending an ApiVersions v0 to its answer (error NONE)."""
    began = time.monotonic()
    connection.sendall(frame)
    response = receive_frame(connection)
    elapsed = time.monotonic() - began
    assert struct.unpack_from(">ih", response) == (7, 0)
    return elapsed


def seconds_until_closed(connection: socket.socket, limit: float = 10) -> float:
    began = time.monotonic()
    connection.settimeout(limit)
    assert closed_by_peer(connection), "the agent sent bytes instead of closing"
    return time.monotonic() - began


def eventually(condition: Callable[[], bool], seconds: float = 20) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def closed_lines(caplog: pytest.LogCaptureFixture, words: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "logcompact.kafka.server" and words in r.getMessage()]


# -- frames that never complete ------------------------------------------------------------------------


def test_frames_that_never_complete_hold_only_their_bytes_and_other_clients_are_served_at_once(agent: RunningAgent) -> None:
    """Ten frames declaring 100 MiB and one 24 MiB, 8 bytes of each sent: together they declare the agent's whole
    request budget (1 GiB). They hold only the 88 bytes that came, and a new client is answered within 100 ms
    while a confluent-kafka producer and consumer go on."""
    stalled = [open_socket(agent) for _ in range(11)]
    try:
        for index, connection in enumerate(stalled):
            connection.sendall(stalled_frame((24 if index == 10 else 100) * MiB))
        eventually(lambda: agent.server._queued.held >= 88)
        with open_socket(agent) as connection:
            assert answered_in(connection) < 0.1
        assert eventually(lambda: agent.server._queued.held == 88)  # ApiVersions given back: the stalled frames' bytes
        producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5})
        for n in range(20):
            producer.produce("orders", key=b"k%d" % n, value=b"v%d" % n, partition=0)
        assert producer.flush(10) == 0
        consumer = confluent_consumer(agent)
        try:
            consumer.assign([TopicPartition("orders", 0, 0)])
            assert [message.value() for message in consume(consumer, 20)] == [b"v%d" % n for n in range(20)]
        finally:
            consumer.close()
        assert not any(map(closed_or_answered, stalled)), "a stalled frame's connection was closed before the read timeout"
    finally:
        for connection in stalled:
            connection.close()


def closed_or_answered(connection: socket.socket) -> bool:
    connection.setblocking(False)
    try:
        connection.recv(1, socket.MSG_PEEK)
        return True
    except BlockingIOError:
        return False
    finally:
        connection.setblocking(True)


def test_a_frame_that_stops_arriving_is_closed_after_the_read_timeout_and_one_arriving_slowly_is_not(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    agent = RunningAgent(catalog, request_read_timeout_ms=500)
    try:
        with open_socket(agent) as slow, open_socket(agent) as stopped:
            answered_in(stopped)
            stopped.sendall(stalled_frame(1000))
            began = stalled_at = time.monotonic()
            for piece in (API_VERSIONS[:3], API_VERSIONS[3:7], API_VERSIONS[7:]):  # each piece before the timeout
                slow.sendall(piece)
                time.sleep(0.3)
            assert struct.unpack_from(">ih", receive_frame(slow)) == (7, 0)
            assert time.monotonic() - began > 0.5  # the slow frame took longer than the timeout, and was read
            closing = seconds_until_closed(stopped)
            assert 0.4 < time.monotonic() - stalled_at < 10 and closing < 10
        assert agent.server._queued.held == 0
    finally:
        agent.stop()
    lines = closed_lines(caplog, "stopped arriving")
    assert len(lines) == 1 and "no byte for 500 ms" in lines[0] and "request read timeout" in lines[0], lines


def test_frames_arriving_together_past_the_budget_finish_one_at_a_time() -> None:
    """Bytes of frames still arriving are given back by no answer: when they are all the budget holds, one frame
    goes past the limit to finish, and the others wait for its answer instead of for each other."""

    async def scenario() -> list[str]:
        budget, events, a, b = ByteBudget(100), [], object(), object()

        async def take(name: str, size: int, frame: object) -> None:
            await budget.take(size, frame)
            events.append(name)

        await budget.take(60, a)
        await budget.take(40, b)
        await take("a30", 30, a)  # all held is arriving: a goes past the limit
        b_rest = asyncio.create_task(take("b20", 20, b))
        await asyncio.sleep(0.01)
        assert events == ["a30"] and (budget.held, budget.arriving) == (130, 130)  # one frame over at a time
        budget.arrived(90, a)
        await asyncio.sleep(0.01)
        assert events == ["a30"]  # a's answer will give bytes back: b waits for it
        budget.give(90)
        await b_rest
        budget.give(20, b)  # b's connection closed before its frame was all in
        assert (budget.held, budget.arriving) == (40, 40)
        await take("c70", 70, object())  # all held is b's, arriving: the next frame may go past the limit
        return events

    assert asyncio.run(scenario()) == ["a30", "b20", "c70"]


# -- connections that never speak or fall silent ------------------------------------------------------------


def test_a_thousand_idle_sockets_from_one_address_leave_room_for_another_address(catalog: Catalog) -> None:
    """1,100 sockets from 127.0.0.1 that send nothing: the agent holds 500 of them (max_connections_per_ip) and a
    client from 127.0.0.2 is answered. The test holds 1,100 sockets and the agent 500: the soft limit on open files
    is raised to 4,096 where it is lower (up to the hard limit)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = 4096 if hard == resource.RLIM_INFINITY else min(4096, hard)
    if soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
    if wanted < 2000:
        pytest.skip(f"the hard limit on open files ({hard}) is below the 2,000 this test holds")
    agent = RunningAgent(catalog, connection_setup_timeout_ms=60_000)
    idle: list[socket.socket] = []
    try:
        idle.extend(open_socket(agent) for _ in range(1100))
        eventually(lambda: len(agent.server._connections) >= 500)
        with open_socket(agent, source="127.0.0.2") as other:
            assert answered_in(other) < 1
            assert agent.server._per_ip["127.0.0.1"] == 500 and len(agent.server._connections) == 501
    finally:
        for connection in idle:
            connection.close()
        agent.stop()
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_a_socket_that_sends_no_whole_request_is_closed_after_the_setup_timeout(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    agent = RunningAgent(catalog, connection_setup_timeout_ms=400)
    try:
        with open_socket(agent) as silent, open_socket(agent) as partial, open_socket(agent) as speaking:
            partial.sendall(API_VERSIONS[:6])
            answered_in(speaking)
            assert 0.2 < seconds_until_closed(silent) < 5
            assert seconds_until_closed(partial) < 5
            time.sleep(0.3)
            assert answered_in(speaking) < 1  # a connection that sent a request stays, past the setup timeout
    finally:
        agent.stop()
    lines = closed_lines(caplog, "the connection setup timeout")
    assert len(lines) == 2 and all("no whole request within 400 ms of connecting" in line for line in lines), lines


def test_idle_connections_are_closed_after_connections_max_idle_ms_and_one_waiting_for_an_answer_is_not(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="logcompact.kafka")
    agent = RunningAgent(catalog, connections_max_idle_ms=500)
    long_poll = kio_frame(1, 12, {
        "replica_id": -1, "max_wait": 1500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
        "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": "orders", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
    }, correlation_id=8)
    try:
        with open_socket(agent) as idle, open_socket(agent) as waiting:
            answered_in(idle)
            waiting.sendall(long_poll)
            began = time.monotonic()
            assert 0.3 < seconds_until_closed(idle) < 5
            assert struct.unpack_from(">i", receive_frame(waiting))[0] == 8  # answered at max_wait, 1.5 s: not closed as idle
            assert time.monotonic() - began > 1.2
            answered = time.monotonic()
            assert seconds_until_closed(waiting) + (time.monotonic() - answered) > 0.3  # idle from its answer on
    finally:
        agent.stop()
    lines = closed_lines(caplog, "idle for 500 ms")
    assert len(lines) == 2 and all(r.levelno == logging.INFO for r in caplog.records if "idle for" in r.getMessage()), lines


def test_a_client_that_stops_with_answers_unread_is_logged_at_info_and_the_next_is_served(
    agent: RunningAgent, caplog: pytest.LogCaptureFixture,
) -> None:
    """A client that stops with requests in flight (a Kafka client closing) resets its connection, which the
    agent finds reading or writing its answers: the ordinary course, logged at info (Kafka's brokers log a peer's
    disconnect at debug), never a warning."""
    caplog.set_level(logging.INFO, logger="logcompact.kafka")
    with open_socket(agent) as leaving:
        leaving.sendall(API_VERSIONS * 200)
        leaving.recv(1, socket.MSG_PEEK)  # answers are coming
        leaving.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # closed with a reset
    assert eventually(lambda: bool(closed_lines(caplog, " lost: ")), 10), "the agent did not see the connection go"
    with open_socket(agent) as connection:
        answered_in(connection)
    lost = [r for r in caplog.records if r.name == "logcompact.kafka.server" and " lost: " in r.getMessage()]
    assert all(r.levelno == logging.INFO for r in lost), [(r.levelname, r.getMessage()) for r in lost]
    assert not [r for r in caplog.records if r.name.startswith("logcompact.kafka") and r.levelno >= logging.WARNING]


def test_the_agent_command_takes_the_connection_settings(catalog: Catalog) -> None:
    command = [sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--max-connections", "10", "--max-connections-per-ip", "1",
               "--connections-max-idle-ms", "60000", "--connection-setup-timeout-ms", "1000", "--request-read-timeout-ms", "1000"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None and process.stderr is not None
        host, port = json.loads(process.stdout.readline())["listening"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=10) as silent:
            with socket.create_connection((host, int(port)), timeout=10) as second:
                assert seconds_until_closed(second) < 5  # one from an address
            assert seconds_until_closed(silent) < 5
        process.terminate()
        assert process.wait(timeout=15) == 0
        errors = process.stderr.read()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert "maximum of 1 connections from one address" in errors and "no whole request within 1000 ms" in errors, errors
