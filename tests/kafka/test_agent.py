"""`logcompact agent` with real Kafka clients: confluent-kafka (librdkafka), kafka-python and Debian's kcat.

The agent runs in-process on 127.0.0.1 with a free port (its own asyncio loop in a thread), over a file://
store with its catalog on SQLite and on PostgreSQL; the raw-socket tests check the server's own contract (bad
frames, unserved APIs, order of responses), and one test runs `python -m logcompact agent` to stop it with a signal.
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicCollection, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from logcompact.catalog import Catalog
from logcompact.consume import read_records
from logcompact.kafka.cluster import Address
from logcompact.kafka.codec import kio_versions
from logcompact.kafka.handlers import APIS
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.server import AgentServer, AgentSettings
from logcompact.store import open_store
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, RunningAgent, agent_environment
from tests.kafka.wire import closed_by_peer, connect, kio_exchange, kio_frame, receive_frame, request_frame

TOPICS = {"orders": 3, "clicks": 1}
MAX_FRAME_BYTES = 1024 * 1024
UNSUPPORTED_VERSION = 35

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", TOPICS["orders"], cleanup_policy="compact")
    create_topic(catalog, "clicks", TOPICS["clicks"])
    return catalog


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[AgentServer]:
    running = RunningAgent(catalog, max_frame_bytes=MAX_FRAME_BYTES)
    try:
        yield running.server
    finally:
        running.stop()


def bootstrap(agent: AgentServer) -> str:
    return str(agent.address)


def list_topics_with_librdkafka(agent: AgentServer) -> dict[str, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap(agent), **FAST_CLIENT}).list_topics(timeout=10)
    return {name: len(topic.partitions) for name, topic in metadata.topics.items()}


# -- real clients ------------------------------------------------------------------------------------


def test_confluent_admin_client_lists_topics_partitions_and_the_broker(agent: AgentServer, catalog: Catalog) -> None:
    metadata = AdminClient({"bootstrap.servers": bootstrap(agent), **FAST_CLIENT}).list_topics(timeout=10)

    assert {name: len(topic.partitions) for name, topic in metadata.topics.items()} == TOPICS
    assert metadata.cluster_id == catalog.cluster_id
    assert metadata.controller_id == 0
    assert {node: (broker.host, broker.port) for node, broker in metadata.brokers.items()} == {0: ("127.0.0.1", agent.address.port)}
    for topic in metadata.topics.values():
        assert topic.error is None
        for partition in topic.partitions.values():
            assert (partition.leader, partition.replicas, partition.isrs) == (0, [0], [0])


def test_confluent_describe_topics_gives_stable_topic_ids_and_kafkas_error_for_an_unknown_topic(agent: AgentServer, catalog: Catalog) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap(agent), **FAST_CLIENT})
    described = admin.describe_topics(TopicCollection(["orders", "no-such-topic"]), request_timeout=10)  # Metadata v10+

    orders = described["orders"].result()
    assert [(p.id, p.leader.id) for p in orders.partitions] == [(0, 0), (1, 0), (2, 0)]
    topic_id = base64.b64encode(agent.broker.topic_id("orders", catalog.snapshot().topic_ids["orders"]).bytes).rstrip(b"=").decode()
    assert str(orders.topic_id) == topic_id
    with pytest.raises(KafkaException) as unknown:
        described["no-such-topic"].result()
    assert unknown.value.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART


def test_confluent_producer_and_consumer_see_the_topics(agent: AgentServer) -> None:
    producer = Producer({"bootstrap.servers": bootstrap(agent), **FAST_CLIENT})
    assert set(producer.list_topics(timeout=10).topics) == set(TOPICS)

    consumer = Consumer({"bootstrap.servers": bootstrap(agent), "group.id": "metadata-only", **FAST_CLIENT})
    try:
        orders = consumer.list_topics("orders", timeout=10).topics["orders"]
        assert sorted(orders.partitions) == [0, 1, 2]
        # Consumers never create topics: an unknown one comes back with Kafka's error.
        missing = consumer.list_topics("no-such-topic", timeout=10).topics["no-such-topic"]
        assert missing.error is not None and missing.error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART
    finally:
        consumer.close()


def test_kafka_python_consumer_infers_a_version_and_lists_topics(agent: AgentServer, caplog: pytest.LogCaptureFixture) -> None:
    from kafka import KafkaConsumer

    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    consumer = KafkaConsumer(bootstrap_servers=bootstrap(agent), request_timeout_ms=5000)
    try:
        assert consumer.topics() == set(TOPICS)
        assert consumer.partitions_for_topic("orders") == {0, 1, 2}
        assert consumer.partitions_for_topic("clicks") == {0}
        assert consumer.config["api_version"] is not None  # inferred from our ApiVersions answer
    finally:
        consumer.close()
    assert not [r for r in caplog.records if r.name.startswith("logcompact.kafka")], "the agent logged a connection error"


def test_kcat_lists_the_topics(agent: AgentServer) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    listing = subprocess.run(
        ["kcat", "-b", bootstrap(agent), "-L", "-J", "-m", "10"], capture_output=True, text=True, timeout=30, check=True
    )
    document = json.loads(listing.stdout)
    assert {topic["topic"]: len(topic["partitions"]) for topic in document["topics"]} == TOPICS
    assert document["brokers"] == [{"id": 0, "name": bootstrap(agent)}]
    assert document["controllerid"] == 0


# -- the server's own contract, on raw sockets ---------------------------------------------------------


def advertised_ranges(response: bytes) -> dict[int, tuple[int, int]]:
    """The ranges of an ApiVersions v0 response body (after its correlation id)."""
    count = struct.unpack_from(">i", response, 2)[0]
    entries = [struct.unpack_from(">hhh", response, 6 + 6 * n) for n in range(count)]
    return {key: (low, high) for key, low, high in entries}


def test_api_versions_advertises_exactly_the_table_within_the_codec(agent: AgentServer) -> None:
    with connect(agent) as connection:
        connection.sendall(request_frame(18, 0, 7))
        response = receive_frame(connection)
    correlation_id, error = struct.unpack_from(">ih", response)
    assert (correlation_id, error) == (7, 0)
    assert advertised_ranges(response[4:]) == {api.key: (api.min_version, api.max_version) for api in APIS.values()}
    for api in APIS.values():
        assert api.min_version in kio_versions(api.key) and api.max_version in kio_versions(api.key)


@pytest.mark.parametrize("version", range(APIS[3].min_version, APIS[3].max_version + 1))
def test_every_metadata_version_decodes_with_the_topics_and_kafkas_error(agent: AgentServer, version: int) -> None:
    topics = [{"name": "orders", "topic_id": None}, {"name": "no-such-topic", "topic_id": None}]
    flags = {"allow_auto_topic_creation": False, "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}
    response = kio_exchange(agent, 3, version, {"topics": topics, **flags})
    # Before v4 a Metadata request always allows auto-create (Kafka's), which answers LEADER_NOT_AVAILABLE (5) first.
    unknown = 5 if version < 4 else 3
    assert [(t.name, int(t.error_code), len(t.partitions)) for t in response.topics] == [("orders", 0, 3), ("no-such-topic", unknown, 0)]
    assert [(b.node_id, b.host, b.port) for b in response.brokers] == [(0, "127.0.0.1", agent.address.port)]


@pytest.mark.parametrize("version", range(APIS[18].min_version, APIS[18].max_version + 1))
def test_every_api_versions_version_decodes_with_the_table(agent: AgentServer, version: int) -> None:
    response = kio_exchange(agent, 18, version, {"client_software_name": "test", "client_software_version": "1"})
    assert int(response.error_code) == 0
    assert {k.api_key: (k.min_version, k.max_version) for k in response.api_keys} == {a.key: (a.min_version, a.max_version) for a in APIS.values()}


@pytest.mark.parametrize(("api_key", "version"), [(999, 0), (18, 99), (3, 99), (0, 2)], ids=["unknown key", "ApiVersions v99", "Metadata v99", "Produce v2 (before record batches)"])
def test_an_unserved_api_or_version_is_answered_with_unsupported_version(agent: AgentServer, api_key: int, version: int) -> None:
    with connect(agent) as connection:
        connection.sendall(request_frame(api_key, version, 41))
        response = receive_frame(connection)
        correlation_id, error = struct.unpack_from(">ih", response)
        assert (correlation_id, error) == (41, UNSUPPORTED_VERSION)
        assert advertised_ranges(response[4:])[18] == (APIS[18].min_version, APIS[18].max_version)
        # The connection stays usable: the client retries with a version both know.
        connection.sendall(request_frame(18, 0, 42))
        assert struct.unpack_from(">ih", receive_frame(connection)) == (42, 0)


def test_pipelined_requests_are_answered_in_request_order(agent: AgentServer) -> None:
    all_topics_v1 = struct.pack(">i", -1)
    frames = b"".join(
        request_frame(3, 1, n, all_topics_v1) if n % 2 else request_frame(18, 0, n) for n in range(1, 21)
    )
    with connect(agent) as connection:
        connection.sendall(frames)
        assert [struct.unpack_from(">i", receive_frame(connection))[0] for _ in range(20)] == list(range(1, 21))


@pytest.mark.parametrize(
    "sent",
    [
        b"GET / HTTP/1.1\r\nHost: agent\r\n\r\n",  # a size of 1.2 GB
        struct.pack(">i", MAX_FRAME_BYTES + 1),
        struct.pack(">i", -4),
        struct.pack(">i", 6) + b"\x00\x03\x00\x01\xff\xff",  # a header cut short
        request_frame(3, 1, 5, struct.pack(">i", 2) + b"\x00\x09ab"),  # a topic name running past the frame
        # Metadata v12 (flexible: header v2) declaring 2^32 - 2 topics in 25 bytes: kio 0.6 aborted the process.
        struct.pack(">ihhih", 19, 3, 12, 6, -1) + b"\x00" + bytes.fromhex("ffffffff0f") + b"\x00\x00\x00",
    ],
    ids=["http", "oversized", "negative size", "short header", "truncated body", "huge array"],
)
def test_a_bad_frame_closes_its_connection_and_the_agent_serves_others(
    agent: AgentServer, sent: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    with connect(agent) as connection:
        connection.sendall(sent)
        assert closed_by_peer(connection)
    closing = [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")]
    assert len(closing) == 1 and "closed" in closing[0], closing
    assert list_topics_with_librdkafka(agent) == TOPICS


def test_connections_beyond_the_maximum_are_closed_and_the_others_served(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")

    async def scenario() -> None:
        server = AgentServer(catalog, AgentSettings((Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0)),), max_connections=2))
        await server.start()
        try:
            held = [await asyncio.open_connection(server.address.host, server.address.port) for _ in range(2)]
            await asyncio.sleep(0.1)  # both accepted before the third arrives
            reader, _ = await asyncio.open_connection(server.address.host, server.address.port)
            assert await reader.read(1) == b""
            for reader, writer in held:
                writer.write(request_frame(18, 0, 9))
                size = int.from_bytes(await reader.readexactly(4), "big")
                assert int.from_bytes((await reader.readexactly(size))[:4], "big") == 9
                writer.close()
        finally:
            await server.stop()

    asyncio.run(scenario())
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")]
    assert len(logged) == 1 and logged[0].endswith("refused: the agent holds its maximum of 2 connections"), logged


def test_a_frame_after_good_requests_closes_only_after_their_answers(agent: AgentServer) -> None:
    with connect(agent) as connection:
        connection.sendall(request_frame(18, 0, 1) + request_frame(18, 0, 2) + struct.pack(">i", MAX_FRAME_BYTES + 1))
        assert [struct.unpack_from(">i", receive_frame(connection))[0] for _ in range(2)] == [1, 2]
        assert closed_by_peer(connection)


# -- the command --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_the_agent_command_serves_until_a_signal_and_stops_cleanly(catalog: Catalog, stop_signal: signal.Signals) -> None:
    command = [sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--advertise", "agent.example:9092"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        assert started["advertised"] == "agent.example:9092" and started["cluster_id"] == catalog.cluster_id
        host, port = started["listening"].rsplit(":", 1)
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            connection.sendall(request_frame(18, 0, 3))
            assert struct.unpack_from(">ih", receive_frame(connection)) == (3, 0)
            process.send_signal(stop_signal)
            assert process.wait(timeout=15) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stderr is not None and process.stderr.read() == ""


def test_the_agent_command_refuses_a_bad_address(catalog: Catalog) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "logcompact", "agent", "--listen", "localhost"], capture_output=True, text=True, env=agent_environment(catalog), timeout=60
    )
    assert result.returncode == 2
    assert "--listen 'localhost' is not HOST:PORT" in result.stderr


def test_the_agent_command_creates_the_cluster_on_an_empty_store_says_so_once_and_serves_clients(tmp_path: Path) -> None:
    """As a Kafka quick start's broker starts on empty storage: `logcompact agent` on a store directory that does not
    exist yet creates the cluster (one line on stderr with its id), and confluent-kafka creates a topic, produces and
    consumes through it; started again on that store, the agent serves the same cluster and creates nothing."""
    uri = f"file://{tmp_path / 'new-store'}"
    environment = {**os.environ, "LOGCOMPACT_STORE": uri, "LOGCOMPACT_AGENT_PROCESSES": "1"}
    command = [sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--flush-ms", "50"]

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        assert process.stdout is not None and process.stderr is not None
        started = json.loads(process.stdout.readline())
        cluster_id = started["cluster_id"]
        admin = AdminClient({"bootstrap.servers": started["listening"], **FAST_CLIENT})
        admin.create_topics([NewTopic("users", 2, config={"cleanup.policy": "compact"})])["users"].result(timeout=30)
        producer = Producer({"bootstrap.servers": started["listening"], "enable.idempotence": True, **FAST_CLIENT})
        for key, value in ((b"alice", b"pro"), (b"bob", b"free"), (b"alice", b"team")):
            producer.produce("users", key=key, value=value, partition=0)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": started["listening"], "group.id": "readers", "enable.auto.commit": False, **FAST_CLIENT})
        consumer.assign([TopicPartition("users", 0, OFFSET_BEGINNING)])
        read: list[tuple[bytes | None, bytes | None]] = []
        deadline = time.monotonic() + 30
        while len(read) < 3 and time.monotonic() < deadline:
            message = consumer.poll(1)
            if message is not None:
                assert message.error() is None, message.error()
                read.append((message.key(), message.value()))
        consumer.close()
        assert read == [(b"alice", b"pro"), (b"bob", b"free"), (b"alice", b"team")]
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=15) == 0
        assert process.stderr.read().splitlines() == [
            f"logcompact: created cluster {cluster_id} in {uri}, which held none (as `logcompact cluster create` does)"
        ]
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert Catalog(open_store(uri)).cluster_id == cluster_id

    again = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
    try:
        assert again.stdout is not None and again.stderr is not None
        assert json.loads(again.stdout.readline())["cluster_id"] == cluster_id
        again.send_signal(signal.SIGTERM)
        assert again.wait(timeout=15) == 0
        assert again.stderr.read() == ""  # the cluster was there: nothing created, nothing said
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()
    catalog = Catalog(open_store(uri))
    assert catalog.cluster_id == cluster_id and catalog.snapshot().topics["users"].partitions == 2
    assert [record.value for record in read_records(catalog.store, catalog.snapshot(), "users", 0)] == [b"pro", b"free", b"team"]


def test_the_agent_command_refuses_an_empty_catalog_beside_a_store_of_another_cluster(catalog: Catalog, tmp_path: Path) -> None:
    """A store that belongs to a cluster is never given a new one: an empty --catalog beside it (mistyped, or lost)
    is refused in one line naming the store's cluster, and no catalog file is made."""
    other = tmp_path / "other.db"
    result = subprocess.run(
        [sys.executable, "-m", "logcompact", "--store", catalog.store.uri, "--catalog", f"sqlite:///{other}", "agent", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.splitlines() == [
        f"logcompact: error: catalog sqlite:///{other} holds no cluster but store {catalog.store.uri} belongs to cluster "
        f"{catalog.cluster_id}: point --catalog (LOGCOMPACT_CATALOG) at that cluster's catalog, restore the catalog "
        "database from a backup, or use an empty store"
    ]
    assert not other.exists()


# -- memory held by requests in flight ------------------------------------------------------------------


def test_a_byte_budget_holds_takers_until_bytes_are_given_back_and_always_fits_one_request() -> None:
    from logcompact.kafka.server import ByteBudget

    async def scenario() -> list[str]:
        budget, events = ByteBudget(100), []

        async def taker(name: str, size: int) -> None:
            await budget.take(size)
            events.append(name)

        await budget.take(60)
        waiting = [asyncio.create_task(taker("b40", 40)), asyncio.create_task(taker("c50", 50))]
        await asyncio.sleep(0.01)
        assert events == ["b40"] and budget.held == 100  # 50 more would pass the limit: c waits
        budget.give(60)
        await asyncio.sleep(0.01)
        assert events == ["b40", "c50"] and budget.held == 90
        budget.give(90)
        await taker("huge", 500)  # larger than the limit, but nothing is held: it fits
        await asyncio.gather(*waiting)
        return events

    assert asyncio.run(scenario()) == ["b40", "c50", "huge"]


def test_pipelined_requests_past_a_connections_byte_budget_wait_their_turn_and_leave_nothing_held(catalog: Catalog) -> None:
    """Long-polling Fetches pipelined on one connection, each larger than half its in-flight byte budget: the agent
    reads one at a time (the rest wait in the socket), answers every one in order, and once the connection is
    gone the agent holds no bytes for it."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="agent", daemon=True)
    thread.start()
    server = AgentServer(catalog, AgentSettings((Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0)),), max_in_flight_bytes=150, max_queued_bytes=10_000))
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(timeout=20)
    try:
        frames = [kio_frame(1, 12, {
            "replica_id": -1, "max_wait": 300, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0,
            "session_epoch": -1, "forgotten_topics_data": [], "rack_id": "",
            "topics": [{"topic": "orders", "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
        }, correlation_id=n) for n in range(4)]
        assert all(80 < len(frame) - 4 <= 150 for frame in frames)
        with connect(server) as connection:
            connection.settimeout(10)
            connection.sendall(b"".join(frames))
            time.sleep(0.15)
            assert 0 < server._queued.held <= 150  # one request read, the others wait unread
            answered = [struct.unpack(">i", receive_frame(connection)[:4])[0] for _ in frames]
        assert answered == [0, 1, 2, 3]
        deadline = time.monotonic() + 5
        while server._queued.held and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server._queued.held == 0
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(timeout=20)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()
