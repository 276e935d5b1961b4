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
import threading
import time

import pytest
from confluent_kafka import Producer, TopicPartition

from logcompact.catalog import Catalog
from logcompact.kafka.server import AgentSettings, ByteBudget, Connection, sweep_seconds
from tests.helpers import create_topic
from tests.kafka.agents import RunningAgent, agent_environment, confluent_consumer, consume, eventually
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


def test_a_frame_not_all_in_within_the_read_timeout_of_its_first_byte_is_closed_however_it_trickles(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    """A frame trickling a byte every 100 ms never goes 500 ms without one, and is closed 500 ms after its first
    byte all the same, as is one that stopped; a connection pausing longer than that between whole frames is not
    (that is the idle bound's), and a confluent-kafka producer and consumer are served meanwhile."""
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    agent = RunningAgent(catalog, flush_interval_ms=20, request_read_timeout_ms=500)
    try:
        with open_socket(agent) as trickling, open_socket(agent) as stopped, open_socket(agent) as pausing:
            answered_in(stopped)
            answered_in(trickling)
            answered_in(pausing)
            stopped.sendall(stalled_frame(1000))
            stopped_at = time.monotonic()
            trickled: list[float] = []
            trickle = threading.Thread(target=lambda: trickled.append(seconds_trickling_until_closed(trickling)))
            trickle.start()
            produce_and_consume(agent, "orders")
            time.sleep(0.7)
            assert answered_in(pausing) < 1  # 700 ms between whole frames: no frame was begun
            trickle.join(timeout=30)
            assert trickled and 0.4 < trickled[0] < 10, trickled
            assert 0.4 < time.monotonic() - stopped_at and seconds_until_closed(stopped) < 10
        assert eventually(lambda: agent.server._queued.held == 0)
    finally:
        agent.stop()
    lines = closed_lines(caplog, "the request read timeout")
    assert len(lines) == 2 and all("its frame was not all in within 500 ms of its first byte" in line for line in lines), lines


def seconds_trickling_until_closed(connection: socket.socket, every: float = 0.1, limit: float = 20) -> float:
    """Seconds from a frame's first byte (its size prefix, of a 1,000-byte frame) until the agent closes the
    connection, sending one byte of it every `every` seconds meanwhile; `limit` if it never does."""
    connection.sendall(struct.pack(">i", 1000)[:1])
    began = time.monotonic()
    connection.sendall(struct.pack(">i", 1000)[1:])
    while time.monotonic() - began < limit:
        time.sleep(every)
        try:
            connection.sendall(b"\0")
            if closed_or_answered(connection):
                break
        except (BrokenPipeError, ConnectionResetError):
            break
    return time.monotonic() - began


def produce_and_consume(agent: RunningAgent, topic: str, count: int = 20) -> None:
    """A confluent-kafka producer's `count` records acknowledged and read back by a consumer, within 10 s each."""
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5})
    for n in range(count):
        producer.produce(topic, key=b"k%d" % n, value=b"v%d" % n, partition=0)
    assert producer.flush(10) == 0
    consumer = confluent_consumer(agent)
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        assert [message.value() for message in consume(consumer, count)] == [b"v%d" % n for n in range(count)]
    finally:
        consumer.close()


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


def test_frames_one_address_stalls_hold_at_most_its_share_of_the_budget(catalog: Catalog) -> None:
    """Four connections from 127.0.0.2 send 2.5 MiB of 3 MiB frames and stop: 10 MiB, past the agent's whole
    budget (8 MiB here). They hold at most their address's share (4 MiB here, half) and one frame past it, so a
    client from 127.0.0.1 is answered within 100 ms and a confluent-kafka producer and consumer go on."""
    agent = RunningAgent(catalog, flush_interval_ms=20, max_queued_bytes=8 * MiB, max_queued_bytes_per_ip=4 * MiB)
    stalled = [open_socket(agent, source="127.0.0.2") for _ in range(4)]
    try:
        for connection in stalled:
            connection.sendall(struct.pack(">i", 3 * MiB) + bytes(5 * MiB // 2))
        assert eventually(lambda: agent.server._queued.held >= 4 * MiB)
        time.sleep(0.2)  # what the agent reads of the rest meanwhile
        assert 4 * MiB <= agent.server._per_ip_queued["127.0.0.2"].held <= 4 * MiB + 5 * MiB // 2
        with open_socket(agent) as connection:
            assert answered_in(connection) < 0.1
        produce_and_consume(agent, "orders")
        assert not any(map(closed_or_answered, stalled))
    finally:
        for connection in stalled:
            connection.close()
        agent.stop()


# -- clients that do not read their answers ------------------------------------------------------------------


def fetch_frame(topic: str, correlation_id: int) -> bytes:
    """A Fetch v12 of partition 0 from offset 0, up to 1 MiB, answered at once."""
    return kio_frame(1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": MiB, "isolation_level": 0, "session_id": 0,
        "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
        "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": MiB}]}],
    }, correlation_id=correlation_id)


def padded_api_versions(size: int, correlation_id: int) -> bytes:
    """An ApiVersions v0 of `size` bytes: the agent reads bytes after a request's body and ignores them, as Kafka's
    brokers do, so it is a large request with a small answer."""
    message = struct.pack(">hhih", 18, 0, correlation_id, -1) + bytes(size - 10)
    return struct.pack(">i", len(message)) + message


def test_a_client_that_stops_reading_its_answers_holds_no_room_others_need_and_is_aborted_after_the_idle_bound(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    """A client with a 4 KiB receive buffer sends 40 Fetches answered with 1 MiB each, then 8 requests of 1 MiB
    (8 MiB, twice the agent's budget here), and reads nothing. Its requests go back to the budget once handled and
    its answers wait against its own connection's bytes in flight, so a new client is answered within 100 ms and a
    confluent-kafka producer and consumer go on; the agent aborts it, with one log line, once its answers have not
    been taken for the idle bound."""
    caplog.set_level(logging.INFO, logger="logcompact.kafka")
    agent = RunningAgent(catalog, flush_interval_ms=20, max_queued_bytes=4 * MiB, connections_max_idle_ms=3000)
    try:
        producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5})
        for _ in range(10):
            producer.produce("answers", value=bytes(100_000), partition=0)
        assert producer.flush(10) == 0
        address = agent.server.address
        not_reading = socket.socket()
        not_reading.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        not_reading.connect((address.host, address.port))
        peer = "{}:{}".format(*not_reading.getsockname()[:2])
        requests = b"".join(fetch_frame("answers", n) for n in range(40)) + b"".join(padded_api_versions(MiB, 40 + n) for n in range(8))
        sending = threading.Thread(target=not_reading.sendall, args=(requests,), daemon=True)  # it may block, before the fix
        sending.start()
        try:
            assert eventually(lambda: any(c.requests_read == 48 and c.sending for c in agent.server._readers.values()), 20)
            assert eventually(lambda: agent.server._queued.held == 0)  # its requests handled, their answers wait in its connection
            with open_socket(agent) as connection:
                assert answered_in(connection) < 0.1
            produce_and_consume(agent, "orders")
            assert eventually(lambda: bool(closed_lines(caplog, "stopped reading its answers")), 30)
            assert eventually(lambda: all(c.peer != peer for c in agent.server._readers.values()))
            assert eventually(lambda: agent.server._queued.held == 0)
        finally:
            not_reading.close()
            sending.join(timeout=10)
    finally:
        agent.stop()
    lines = closed_lines(caplog, f"from {peer} ")  # its lines alone: one, not a "lost" line besides
    assert len(lines) == 1 and "it stopped reading its answers" in lines[0] and "bytes taken for 3000 ms (connections max idle)" in lines[0], lines


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


def test_the_sweep_of_time_bounds_looks_every_quarter_of_the_shortest_bound_within_10_ms_and_1_s(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A 4 ms read timeout would have the sweep look every millisecond, keeping the event loop busy: it looks every
    10 ms at most, counted over a second on one connection, and still closes a frame past that timeout."""
    looks = []
    expired = Connection.expired
    monkeypatch.setattr(Connection, "expired", lambda self, now, settings: looks.append(now) or expired(self, now, settings))
    agent = RunningAgent(catalog, request_read_timeout_ms=4)
    try:
        with open_socket(agent) as connection, open_socket(agent) as stopped:
            answered_in(connection)
            looks.clear()
            time.sleep(1)
            assert 10 <= len(set(looks)) <= 150, len(set(looks))  # looks at each connection: 100 at 10 ms, 1,000 at 1 ms
            stopped.sendall(API_VERSIONS[:6])
            assert seconds_until_closed(stopped) < 5
            assert answered_in(connection) < 1
    finally:
        agent.stop()
    assert sweep_seconds(AgentSettings()) == 1.0
    assert sweep_seconds(AgentSettings(connection_setup_timeout_ms=2000)) == 0.5
    assert sweep_seconds(AgentSettings(request_read_timeout_ms=4)) == 0.01


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
