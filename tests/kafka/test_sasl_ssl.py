"""SASL_SSL on `logcompact agent`: TLS, then PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512. librdkafka, kafka-python,
aiokafka and kcat authenticate, produce and consume as on PLAINTEXT; a wrong password is refused with Kafka's error
while others are served; the bad frames of the agent's own tests, a plaintext client and pipelined requests sent on
the TLS listener before authentication are closed unanswered; and no planted secret shows in anything the agent and
the CLI print (the agent's log at debug level, errors, `--help`, JSON)."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonPartition

from logcompact.catalog import Catalog
from logcompact.catalog.credentials import new_credential
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.tls import TlsSettings
from logcompact.store.local import LocalStore
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment
from tests.kafka.wire import closed_by_peer, request_frame

NOW = 1_700_000_000_000
ALICE, ALICE_PASSWORD = "alice", "alice-Pl4nted-ssl-s3cret"
KEY_PASSWORD = "planted-agent-key-s3cret"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
SASL_SSL_LOCAL = Listener(SecurityProtocol.SASL_SSL, Address("127.0.0.1", 0))
OVER_SASL_RECEIVE_SIZE = 1024 * 1024  # a frame size past Kafka's sasl.server.max.receive.size (512 KiB) before authentication


class Certificates:
    """A CA and the agent's certificate for 127.0.0.1, as PEM files."""

    def __init__(self, directory: Path) -> None:
        authority = trustme.CA()
        served = authority.issue_cert("127.0.0.1", "localhost")
        self.ca, self.cert, self.key = directory / "ca.pem", directory / "agent.pem", directory / "agent.key"
        authority.cert_pem.write_to_path(str(self.ca))
        served.cert_chain_pems[0].write_to_path(str(self.cert))
        served.private_key_pem.write_to_path(str(self.key))


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    return Certificates(tmp_path_factory.mktemp("sasl-ssl"))


@pytest.fixture
def agent(tmp_path: Path, certificates: Certificates) -> Iterator[RunningAgent]:
    catalog = Catalog(LocalStore(tmp_path / "store"))
    catalog.ensure_created(NOW)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        catalog.put_scram_credential(ALICE, new_credential(mechanism, ALICE_PASSWORD, 4096))
    running = RunningAgent(catalog, (SASL_SSL_LOCAL,), flush_interval_ms=FLUSH_MS, sasl_mechanisms=MECHANISMS,
                           tls=TlsSettings(certificates.cert, certificates.key))
    try:
        yield running
    finally:
        running.stop()


def librdkafka_settings(agent: RunningAgent, certificates: Certificates, mechanism: str, password: str = ALICE_PASSWORD) -> dict[str, Any]:
    return {"bootstrap.servers": agent.bootstrap, "security.protocol": "SASL_SSL", "sasl.mechanism": mechanism, "sasl.username": ALICE,
            "sasl.password": password, "ssl.ca.location": str(certificates.ca), **FAST_CLIENT}


# -- real clients --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_produces_and_consumes_over_sasl_ssl(agent: RunningAgent, certificates: Certificates, mechanism: str) -> None:
    settings = librdkafka_settings(agent, certificates, mechanism)
    topic = f"rdkafka-{mechanism}"
    producer = Producer({**settings, "message.timeout.ms": 15000})
    delivered: list[Any] = []
    for n in range(10):
        producer.produce(topic, b"value-%d" % n, b"key-%d" % n, on_delivery=lambda error, _message: delivered.append(error))
    assert producer.flush(20) == 0 and delivered == [None] * 10, delivered
    consumer = Consumer({**settings, "group.id": f"group-{mechanism}", "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])  # a group: FindCoordinator, JoinGroup, SyncGroup and commits over SASL_SSL
    values: list[bytes] = []
    deadline = time.monotonic() + 30
    try:
        while len(values) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                assert message.error() is None, message.error()
                values.append(message.value() or b"")
        consumer.commit(asynchronous=False)
        assert consumer.committed([TopicPartition(topic, 0)], timeout=10)[0].offset == 10
    finally:
        consumer.close()
    assert values == [b"value-%d" % n for n in range(10)]


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_kafka_python_produces_and_consumes_over_sasl_ssl(agent: RunningAgent, certificates: Certificates, mechanism: str) -> None:
    config = {"bootstrap_servers": agent.bootstrap, "security_protocol": "SASL_SSL", "ssl_cafile": str(certificates.ca),
              "sasl_mechanism": mechanism, "sasl_plain_username": ALICE, "sasl_plain_password": ALICE_PASSWORD}
    topic = f"kafka-python-{mechanism}"
    producer = KafkaProducer(**config)
    producer.send(topic, b"kafka-python").get(timeout=20)
    producer.close()
    consumer = KafkaConsumer(**config, consumer_timeout_ms=10_000)
    consumer.assign([KafkaPythonPartition(topic, 0)])
    consumer.seek(KafkaPythonPartition(topic, 0), 0)
    assert [record.value for record in consumer][:1] == [b"kafka-python"]
    consumer.close()


def test_aiokafka_produces_and_consumes_over_sasl_ssl(agent: RunningAgent, certificates: Certificates) -> None:
    config = {"bootstrap_servers": agent.bootstrap, "security_protocol": "SASL_SSL", "ssl_context": create_ssl_context(cafile=str(certificates.ca)),
              "sasl_mechanism": "SCRAM-SHA-256", "sasl_plain_username": ALICE, "sasl_plain_password": ALICE_PASSWORD}

    async def round_trip() -> bytes:
        producer = AIOKafkaProducer(**config)
        await producer.start()
        try:
            await producer.send_and_wait("aiokafka", b"aiokafka")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**config, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([KafkaPythonPartition("aiokafka", 0)])
            consumer.seek(KafkaPythonPartition("aiokafka", 0), 0)
            return bytes((await asyncio.wait_for(consumer.getone(), 20)).value)
        finally:
            await consumer.stop()

    assert asyncio.run(round_trip()) == b"aiokafka"


def test_kcat_produces_and_consumes_over_sasl_ssl(agent: RunningAgent, certificates: Certificates, tmp_path: Path) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    config = tmp_path / "kcat.conf"  # the password in a file, not on the command line
    config.write_text(f"security.protocol=SASL_SSL\nsasl.mechanisms=SCRAM-SHA-512\nsasl.username={ALICE}\nsasl.password={ALICE_PASSWORD}\n"
                      f"ssl.ca.location={certificates.ca}\n")
    base = ["kcat", "-F", str(config), "-b", agent.bootstrap, "-t", "kcat"]
    produced = subprocess.run([*base, "-P", "-K:", "-X", "message.timeout.ms=15000"], input="k1:v1\nk2:v2\n", text=True, capture_output=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*base, "-C", "-o", "beginning", "-c", "2", "-e", "-K:"], text=True, capture_output=True, timeout=60)
    assert consumed.returncode == 0 and consumed.stdout.split() == ["k1:v1", "k2:v2"], consumed.stderr


def test_a_wrong_password_over_sasl_ssl_is_refused_while_others_are_served(agent: RunningAgent, certificates: Certificates) -> None:
    errors: list[KafkaError] = []
    refused = Producer({**librdkafka_settings(agent, certificates, "SCRAM-SHA-512", "not-the-password"), "error_cb": errors.append})
    deadline = time.monotonic() + 15
    while not any(error.code() == KafkaError._AUTHENTICATION for error in errors) and time.monotonic() < deadline:
        refused.poll(0.2)
    assert any(error.code() == KafkaError._AUTHENTICATION and "invalid credentials" in error.str() for error in errors), errors
    served = Producer(librdkafka_settings(agent, certificates, "SCRAM-SHA-512"))
    assert served.list_topics(timeout=10).brokers


# -- bad input on the TLS listener, before authentication ---------------------------------------------------------


def tls_connection(agent: RunningAgent, certificates: Certificates) -> ssl.SSLSocket:
    address = agent.server.address
    context = ssl.create_default_context(cafile=str(certificates.ca))
    return context.wrap_socket(socket.create_connection((address.host, address.port), timeout=10), server_hostname="127.0.0.1")


def correlation_ids_until_closed(connection: ssl.SSLSocket) -> list[int]:
    """The correlation ids of the answers the agent sent before it closed the connection."""
    received = b""
    while True:
        try:
            chunk = connection.recv(65536)
        except (ConnectionError, ssl.SSLError):
            break
        if not chunk:
            break
        received += chunk
    ids = []
    while len(received) >= 8:
        size = struct.unpack_from(">i", received)[0]
        ids.append(struct.unpack_from(">i", received, 4)[0])
        received = received[4 + size:]
    return ids


@pytest.mark.parametrize(
    "sent",
    [
        b"GET / HTTP/1.1\r\nHost: agent\r\n\r\n",
        struct.pack(">i", OVER_SASL_RECEIVE_SIZE),
        struct.pack(">i", -4),
        struct.pack(">i", 6) + b"\x00\x03\x00\x01\xff\xff",
        request_frame(3, 1, 5, struct.pack(">i", 2) + b"\x00\x09ab"),
        struct.pack(">ihhih", 19, 3, 12, 6, -1) + b"\x00" + bytes.fromhex("ffffffff0f") + b"\x00\x00\x00",
        request_frame(18, 0, 1) + request_frame(3, 1, 2, struct.pack(">i", -1)) + request_frame(0, 3, 3, struct.pack(">hhii", -1, -1, 1000, 0)),
    ],
    ids=["http", "oversized", "negative size", "short header", "truncated body", "huge array", "pipelined metadata and produce"],
)
def test_bad_frames_on_the_tls_listener_before_authentication_are_closed_unanswered(
    agent: RunningAgent, certificates: Certificates, sent: bytes
) -> None:
    with tls_connection(agent, certificates) as connection:
        connection.sendall(sent)
        answered = correlation_ids_until_closed(connection)
    assert answered in ([], [1]), answered  # ApiVersions only, never what came behind it
    assert Producer(librdkafka_settings(agent, certificates, "SCRAM-SHA-512")).list_topics(timeout=10).brokers


def test_a_plaintext_client_on_the_sasl_ssl_listener_is_closed_and_others_are_served(agent: RunningAgent, certificates: Certificates) -> None:
    address = agent.server.address
    with socket.create_connection((address.host, address.port), timeout=10) as connection:
        connection.sendall(request_frame(18, 0, 1))
        assert closed_by_peer(connection)
    assert Producer(librdkafka_settings(agent, certificates, "SCRAM-SHA-256")).list_topics(timeout=10).brokers


# -- secrets ------------------------------------------------------------------------------------------------------


def run(catalog: Catalog, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logcompact", *args], input=stdin, capture_output=True, text=True, timeout=120,
                          env={**agent_environment(catalog), **(env or {})})


def test_no_planted_secret_shows_in_what_the_agent_and_the_cli_print(catalog: Catalog, certificates: Certificates, tmp_path: Path) -> None:
    """An agent process at debug level with an encrypted key, users added by option, stdin and the environment,
    clients authenticating with good and bad passwords, then every output grepped."""
    from cryptography.hazmat.primitives import serialization

    catalog.ensure_created(NOW)
    key = serialization.load_pem_private_key(certificates.key.read_bytes(), None)
    encrypted = tmp_path / "agent-encrypted.key"
    encrypted.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                            serialization.BestAvailableEncryption(KEY_PASSWORD.encode())))
    planted = {"by-option": "opt-Pl4nted-pw-1", "by-stdin": "stdin-Pl4nted-pw-2", "by-env": "env-Pl4nted-pw-3", "wrong": "wrong-Pl4nted-pw-4"}
    outputs = [
        run(catalog, "user", "add", "carol", "--mechanism", "SCRAM-SHA-512", "--password", planted["by-option"]),
        run(catalog, "user", "add", "dave", "--mechanism", "SCRAM-SHA-256", "--password-stdin", stdin=planted["by-stdin"]),
        run(catalog, "user", "add", "erin", "--mechanism", "SCRAM-SHA-512", env={"LOGCOMPACT_USER_PASSWORD": planted["by-env"]}),
        run(catalog, "user", "list"), run(catalog, "user", "list", "--json"),
        run(catalog, "user", "add", "frank", "--mechanism", "SCRAM-SHA-1", "--password", planted["by-option"]),  # refused
        run(catalog, "user", "add", "--help"), run(catalog, "agent", "--help"),
    ]
    assert [output.returncode for output in outputs] == [0, 0, 0, 0, 0, 2, 0, 0], [output.stderr for output in outputs]
    command = [sys.executable, "-m", "logcompact", "-vv", "agent", "--listen", "SASL_SSL://127.0.0.1:0", "--ssl-certfile", str(certificates.cert),
               "--ssl-keyfile", str(encrypted), "--sasl-mechanisms", "PLAIN,SCRAM-SHA-256,SCRAM-SHA-512"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**agent_environment(catalog), "LOGCOMPACT_SSL_KEY_PASSWORD": KEY_PASSWORD})
    try:
        assert process.stdout is not None
        started = process.stdout.readline()
        bootstrap = json.loads(started)["listening"]
        base = {"bootstrap.servers": bootstrap, "security.protocol": "SASL_SSL", "ssl.ca.location": str(certificates.ca), **FAST_CLIENT}
        for user, mechanism, password in (("carol", "SCRAM-SHA-512", planted["by-option"]), ("dave", "SCRAM-SHA-256", planted["by-stdin"]),
                                          ("erin", "PLAIN", planted["by-env"])):
            producer = Producer({**base, "sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": password})
            assert producer.list_topics(timeout=15).brokers
        for mechanism in MECHANISMS:
            errors: list[KafkaError] = []
            refused = Producer({**base, "sasl.mechanism": mechanism, "sasl.username": "carol", "sasl.password": planted["wrong"], "error_cb": errors.append})
            deadline = time.monotonic() + 15
            while not errors and time.monotonic() < deadline:
                refused.poll(0.2)
            assert errors
        process.terminate()
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.stderr is not None
    log = process.stderr.read()
    assert "DEBUG" in log and "authenticated" in log  # the debug level was on
    printed = [started, log, *(part for output in outputs for part in (output.stdout, output.stderr))]
    assert "SCRAM-SHA-1" in outputs[5].stderr
    for secret in (*planted.values(), KEY_PASSWORD):
        assert not any(secret in text for text in printed), secret
