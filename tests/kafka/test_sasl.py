"""SASL on `logcompact agent` (PLAIN, SCRAM-SHA-256, SCRAM-SHA-512) on a SASL_PLAINTEXT listener on 127.0.0.1:
librdkafka (confluent-kafka), kafka-python, aiokafka and kcat authenticate, produce and consume; wrong passwords,
unknown users and mechanisms not enabled are refused with Kafka's errors after Kafka's delay while the agent serves
others; before authentication nothing else is answered; users made by `logcompact user` and by kafka-python's
KIP-554 admin command authenticate until removed; the SCRAM exchange against RFC 7677's test vector and scramp's
independent client; no password in the agent's debug log."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Protocol

import pytest
import scramp
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from kafka import KafkaConsumer, KafkaProducer
from kafka import TopicPartition as KafkaPythonPartition

from logcompact.catalog import Catalog
from logcompact.catalog.credentials import ScramCredential, from_salted_password, new_credential
from logcompact.kafka import authenticator
from logcompact.kafka.authenticator import AuthenticationFailed, ScramExchange, parse_mechanisms
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.server import AgentServer, AgentSettings
from logcompact.store.local import LocalStore
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment
from tests.kafka.wire import Wire, closed_by_peer, receive_frame

NOW = 1_700_000_000_000
ALICE, ALICE_PASSWORD = "alice", "alice-Pl4nted-s3cret"  # SCRAM-SHA-256 and SCRAM-SHA-512 credentials
BOB, BOB_PASSWORD = "bob", "bob-Pl4nted-s3cret"  # SCRAM-SHA-256 only
PLANTED = (ALICE_PASSWORD, BOB_PASSWORD)
MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
API_VERSIONS, METADATA, SASL_HANDSHAKE, SASL_AUTHENTICATE = 18, 3, 17, 36
DESCRIBE_SCRAM, ALTER_SCRAM = 50, 51
FAILED = "Authentication failed during authentication due to invalid credentials with SASL mechanism"


class SaslAgent(RunningAgent):
    """An agent with a SASL_PLAINTEXT listener (its bootstrap) and a PLAINTEXT one, on its own event loop thread."""

    def __init__(self, catalog: Catalog, **settings: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agent", daemon=True)
        self.thread.start()
        listeners = (Listener(SecurityProtocol.SASL_PLAINTEXT, Address("127.0.0.1", 0)), Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0)))
        self.server = AgentServer(catalog, AgentSettings(listeners, flush_interval_ms=FLUSH_MS, **settings))
        self.call(self.server.start(), timeout=300)

    @property
    def plaintext(self) -> str:
        return str(self.server.addresses["PLAINTEXT"])

    def socket(self) -> socket.socket:
        address = self.server.address
        return socket.create_connection((address.host, address.port), timeout=10)


class Bootstrapped(Protocol):
    """An agent in this process or a `logcompact agent` process: where its SASL listener is."""

    @property
    def bootstrap(self) -> str: ...


def with_users(catalog: Catalog) -> Catalog:
    catalog.ensure_created(NOW)
    for mechanism in ("SCRAM-SHA-256", "SCRAM-SHA-512"):
        catalog.put_scram_credential(ALICE, new_credential(mechanism, ALICE_PASSWORD, 4096))
    catalog.put_scram_credential(BOB, new_credential("SCRAM-SHA-256", BOB_PASSWORD, 8192))
    return catalog


@pytest.fixture
def sasl_agent(tmp_path: Path) -> Iterator[SaslAgent]:
    """Every mechanism enabled, on a SQLite catalog (the test of both catalogs is `test_..._on_each_catalog`)."""
    running = SaslAgent(with_users(Catalog(LocalStore(tmp_path / "store"))), sasl_mechanisms=MECHANISMS)
    try:
        yield running
    finally:
        running.stop()


def confluent_config(agent: Bootstrapped, mechanism: str, user: str, password: str) -> dict[str, Any]:
    return {"bootstrap.servers": agent.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": user, "sasl.password": password, **FAST_CLIENT}


def confluent_round_trip(agent: Bootstrapped, mechanism: str, user: str, password: str, topic: str) -> bytes:
    """A record produced and consumed back with librdkafka as `user`."""
    producer = Producer({**confluent_config(agent, mechanism, user, password), "message.timeout.ms": 15000})
    delivered: list[Any] = []
    producer.produce(topic, b"by-" + mechanism.encode(), on_delivery=lambda error, _message: delivered.append(error))
    assert producer.flush(20) == 0 and delivered == [None], delivered
    consumer = Consumer({**confluent_config(agent, mechanism, user, password), "group.id": f"g-{topic}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic, 0, 0)])
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None:
                value = message.value()
                assert message.error() is None and value is not None, message.error()
                return value
        raise AssertionError(f"no record consumed from {topic} as {user} with {mechanism}")
    finally:
        consumer.close()


def refused_by_librdkafka(agent: Bootstrapped, mechanism: str, user: str, password: str) -> str:
    """The authentication error librdkafka reports for `user` (its AdminClient's first request fails with it)."""
    errors: list[KafkaError] = []
    producer = Producer({**confluent_config(agent, mechanism, user, password), "error_cb": errors.append})
    deadline = time.monotonic() + 15
    while not any(error.code() == KafkaError._AUTHENTICATION for error in errors) and time.monotonic() < deadline:
        producer.poll(0.2)
    authentication = [error for error in errors if error.code() == KafkaError._AUTHENTICATION]
    assert authentication, errors
    return str(authentication[0].str())


# -- real clients --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_librdkafka_authenticates_produces_and_consumes(sasl_agent: SaslAgent, mechanism: str) -> None:
    assert confluent_round_trip(sasl_agent, mechanism, ALICE, ALICE_PASSWORD, f"rdkafka-{mechanism}") == b"by-" + mechanism.encode()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kafka_python_authenticates_produces_and_consumes(sasl_agent: SaslAgent, mechanism: str) -> None:
    config = {"bootstrap_servers": sasl_agent.bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
              "sasl_plain_username": ALICE, "sasl_plain_password": ALICE_PASSWORD}
    topic = f"kafka-python-{mechanism}"
    producer = KafkaProducer(**config)
    producer.send(topic, b"kafka-python").get(timeout=20)
    producer.close()
    consumer = KafkaConsumer(**config, consumer_timeout_ms=10_000)
    consumer.assign([KafkaPythonPartition(topic, 0)])
    consumer.seek(KafkaPythonPartition(topic, 0), 0)
    assert [record.value for record in consumer][:1] == [b"kafka-python"]
    consumer.close()


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_aiokafka_authenticates_produces_and_consumes(sasl_agent: SaslAgent, mechanism: str) -> None:
    config = {"bootstrap_servers": sasl_agent.bootstrap, "security_protocol": "SASL_PLAINTEXT", "sasl_mechanism": mechanism,
              "sasl_plain_username": ALICE, "sasl_plain_password": ALICE_PASSWORD}
    topic = f"aiokafka-{mechanism}"

    async def round_trip() -> bytes:
        producer = AIOKafkaProducer(**config)
        await producer.start()
        try:
            await producer.send_and_wait(topic, b"aiokafka")
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(**config, enable_auto_commit=False)
        await consumer.start()
        try:
            consumer.assign([KafkaPythonPartition(topic, 0)])
            consumer.seek(KafkaPythonPartition(topic, 0), 0)
            record = await asyncio.wait_for(consumer.getone(), 20)
            return bytes(record.value)
        finally:
            await consumer.stop()

    assert asyncio.run(round_trip()) == b"aiokafka"


@pytest.mark.parametrize("mechanism", MECHANISMS)
def test_kcat_authenticates_produces_and_consumes(sasl_agent: SaslAgent, mechanism: str, tmp_path: Path) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    config = tmp_path / "kcat.conf"  # the password in a file, not on the command line
    config.write_text(f"security.protocol=SASL_PLAINTEXT\nsasl.mechanisms={mechanism}\nsasl.username={ALICE}\nsasl.password={ALICE_PASSWORD}\n")
    topic = f"kcat-{mechanism}"
    base = ["kcat", "-F", str(config), "-b", sasl_agent.bootstrap, "-t", topic]
    produced = subprocess.run([*base, "-P", "-X", "message.timeout.ms=15000"], input="by-kcat\n", text=True, capture_output=True, timeout=60)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run([*base, "-C", "-o", "beginning", "-c", "1", "-e"], text=True, capture_output=True, timeout=60)
    assert consumed.returncode == 0 and consumed.stdout.strip() == "by-kcat", consumed.stderr


# -- refusals --------------------------------------------------------------------------------------------------


def test_wrong_password_unknown_user_and_mechanism_not_enabled_are_refused_while_others_are_served(tmp_path: Path) -> None:
    agent = SaslAgent(with_users(Catalog(LocalStore(tmp_path / "store"))), sasl_mechanisms=("SCRAM-SHA-512", "PLAIN"))
    try:
        assert f"{FAILED} SCRAM-SHA-512" in refused_by_librdkafka(agent, "SCRAM-SHA-512", ALICE, "not-the-password")
        assert f"{FAILED} SCRAM-SHA-512" in refused_by_librdkafka(agent, "SCRAM-SHA-512", "mallory", ALICE_PASSWORD)
        # bob has only a SCRAM-SHA-256 credential: SCRAM-SHA-512 knows him not, PLAIN checks his SCRAM-SHA-256 one
        assert f"{FAILED} SCRAM-SHA-512" in refused_by_librdkafka(agent, "SCRAM-SHA-512", BOB, BOB_PASSWORD)
        assert "Authentication failed: Invalid username or password" in refused_by_librdkafka(agent, "PLAIN", BOB, "wrong")
        assert "Authentication failed: Invalid username or password" in refused_by_librdkafka(agent, "PLAIN", "mallory", "x")
        not_enabled = refused_by_librdkafka(agent, "SCRAM-SHA-256", ALICE, ALICE_PASSWORD)
        assert "SCRAM-SHA-256" in not_enabled and "SCRAM-SHA-512,PLAIN" in not_enabled, not_enabled
        assert confluent_round_trip(agent, "SCRAM-SHA-512", ALICE, ALICE_PASSWORD, "served-meanwhile") == b"by-SCRAM-SHA-512"
        assert confluent_round_trip(agent, "PLAIN", BOB, BOB_PASSWORD, "bob-by-plain") == b"by-PLAIN"
    finally:
        agent.stop()


def scram_client_first(wire: Wire, mechanism: str, user: str, password: str) -> scramp.ScramClient:
    """ApiVersions, SaslHandshake v1 and the client-first message, their answers read; the client for the rest."""
    assert wire.call(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}).error_code == 0
    handshake = wire.call(SASL_HANDSHAKE, 1, {"mechanism": mechanism})
    assert handshake.error_code == 0 and mechanism in handshake.mechanisms
    client = scramp.ScramClient([mechanism], user, password)
    first = wire.call(SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_first().encode()})
    assert first.error_code == 0
    client.set_server_first(first.auth_bytes.decode())
    return client


def test_a_failed_authentication_is_answered_after_the_delay_with_kafkas_error_then_closed(sasl_agent: SaslAgent) -> None:
    wire = Wire.over(sasl_agent.socket())
    client = scram_client_first(wire, "SCRAM-SHA-256", BOB, "not-bobs-password")
    started = time.monotonic()
    answer = wire.call(SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_final().encode()})
    assert time.monotonic() - started >= 0.1  # Kafka's connection.failed.authentication.delay.ms
    assert answer.error_code == 58 and answer.error_message == f"{FAILED} SCRAM-SHA-256"
    assert "not-bobs-password" not in answer.error_message
    assert closed_by_peer(wire.socket)
    wire.close()
    wire = Wire.over(sasl_agent.socket())
    client = scram_client_first(wire, "SCRAM-SHA-256", BOB, BOB_PASSWORD)
    final = wire.call(SASL_AUTHENTICATE, 2, {"auth_bytes": client.get_client_final().encode()})
    assert final.error_code == 0 and final.session_lifetime.total_seconds() == 0
    client.set_server_final(final.auth_bytes.decode())  # the server's signature checks out
    assert wire.call(METADATA, 1, {"topics": []}).brokers
    # SASL requests after authentication: Kafka's KafkaApis answers them ILLEGAL_SASL_STATE
    assert wire.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 34
    assert wire.call(SASL_AUTHENTICATE, 2, {"auth_bytes": b""}).error_code == 34
    wire.close()


def test_a_mechanism_not_enabled_is_answered_with_the_enabled_list_then_closed(tmp_path: Path) -> None:
    agent = SaslAgent(with_users(Catalog(LocalStore(tmp_path / "store"))))
    try:
        wire = Wire.over(agent.socket())
        handshake = wire.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
        assert handshake.error_code == 33 and list(handshake.mechanisms) == ["SCRAM-SHA-256", "SCRAM-SHA-512"]
        assert closed_by_peer(wire.socket)
        wire.close()
    finally:
        agent.stop()


@pytest.mark.parametrize("before", ["nothing", "ApiVersions", "SaslHandshake"])
def test_a_request_other_than_sasls_before_authentication_closes_the_connection_unanswered(sasl_agent: SaslAgent, before: str) -> None:
    wire = Wire.over(sasl_agent.socket())
    if before == "ApiVersions":
        assert wire.call(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}).error_code == 0
    if before == "SaslHandshake":
        assert wire.call(SASL_HANDSHAKE, 1, {"mechanism": "SCRAM-SHA-512"}).error_code == 0
    wire.send(METADATA, 1, {"topics": []})
    assert closed_by_peer(wire.socket)
    wire.close()


def test_a_second_apiversions_closes_the_connection(sasl_agent: SaslAgent) -> None:
    wire = Wire.over(sasl_agent.socket())
    assert wire.call(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}).error_code == 0
    wire.send(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"})
    assert closed_by_peer(wire.socket)
    wire.close()


def test_a_frame_over_kafkas_sasl_receive_size_before_authentication_closes_the_connection(sasl_agent: SaslAgent) -> None:
    connection = sasl_agent.socket()
    connection.sendall((524_289).to_bytes(4, "big"))  # its size alone: the agent takes none of its bytes
    assert closed_by_peer(connection)
    connection.close()


def send_token(connection: socket.socket, token: bytes) -> None:
    connection.sendall(len(token).to_bytes(4, "big") + token)


@pytest.mark.parametrize("password", [ALICE_PASSWORD, "wrong"])
def test_saslhandshake_v0_is_followed_by_kafkas_unframed_token_exchange(sasl_agent: SaslAgent, password: str) -> None:
    wire = Wire.over(sasl_agent.socket())
    assert wire.call(SASL_HANDSHAKE, 0, {"mechanism": "SCRAM-SHA-512"}).error_code == 0
    client = scramp.ScramClient(["SCRAM-SHA-512"], ALICE, password)
    send_token(wire.socket, client.get_client_first().encode())
    client.set_server_first(receive_frame(wire.socket).decode())
    send_token(wire.socket, client.get_client_final().encode())
    if password == "wrong":  # Kafka closes an unframed exchange without a word
        assert closed_by_peer(wire.socket)
    else:
        client.set_server_final(receive_frame(wire.socket).decode())
        assert wire.call(METADATA, 1, {"topics": []}).brokers
    wire.close()


def test_pipelined_requests_are_not_answered_ahead_of_authentication(sasl_agent: SaslAgent) -> None:
    # A wrong password with Metadata pipelined behind it: the handshake and the failure are answered, the Metadata never
    wire = Wire.over(sasl_agent.socket())
    wire.send(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    wire.send(SASL_AUTHENTICATE, 2, {"auth_bytes": f"\0{ALICE}\0wrong".encode()})
    wire.send(METADATA, 1, {"topics": []})
    assert wire.receive().error_code == 0
    failed = wire.receive()
    assert failed.error_code == 58 and failed.error_message == "Authentication failed: Invalid username or password"
    assert closed_by_peer(wire.socket)
    wire.close()
    # The right one: the Metadata behind it is read only once authentication completed, and answered
    wire = Wire.over(sasl_agent.socket())
    wire.send(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"})
    wire.send(SASL_AUTHENTICATE, 2, {"auth_bytes": f"\0{ALICE}\0{ALICE_PASSWORD}".encode()})
    wire.send(METADATA, 1, {"topics": []})
    assert [wire.receive().error_code, wire.receive().error_code] == [0, 0]
    assert wire.receive().brokers
    wire.close()


def test_sasl_requests_on_a_plaintext_listener_are_illegal_sasl_state(sasl_agent: SaslAgent) -> None:
    host, port = sasl_agent.plaintext.rsplit(":", 1)
    wire = Wire.over(socket.create_connection((host, int(port)), timeout=10))
    assert wire.call(SASL_HANDSHAKE, 1, {"mechanism": "PLAIN"}).error_code == 34
    answer = wire.call(SASL_AUTHENTICATE, 1, {"auth_bytes": b"\0a\0b"})
    assert answer.error_code == 34 and answer.error_message == "SaslAuthenticate request received after successful authentication"
    wire.close()


# -- users: `logcompact user`, KIP-554 ------------------------------------------------------------------------


def run_cli(catalog: Catalog, *args: str, stdin: str | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logcompact", *args], input=stdin, text=True, capture_output=True, timeout=60,
                          env={**agent_environment(catalog), **(env or {})})


def test_logcompact_user_add_list_remove(sasl_agent: SaslAgent) -> None:
    catalog = sasl_agent.server.catalog
    added = run_cli(catalog, "user", "add", "dave", "--mechanism", "SCRAM-SHA-512", "--iterations", "8192", "--password-stdin",
                    stdin="dave-Pl4nted-s3cret\n")
    assert added.returncode == 0, added.stderr
    by_env = run_cli(catalog, "user", "add", "erin", "--mechanism", "SCRAM-SHA-256", "--json", env={"LOGCOMPACT_USER_PASSWORD": "erin-Pl4nted"})
    assert by_env.returncode == 0 and by_env.stdout.strip() == '{"user":"erin","mechanism":"SCRAM-SHA-256","iterations":4096}'
    assert confluent_round_trip(sasl_agent, "SCRAM-SHA-512", "dave", "dave-Pl4nted-s3cret", "daves") == b"by-SCRAM-SHA-512"
    assert confluent_round_trip(sasl_agent, "PLAIN", "erin", "erin-Pl4nted", "erins") == b"by-PLAIN"
    listed = run_cli(catalog, "user", "list", "--json")
    assert listed.returncode == 0
    assert '{"user":"dave","mechanisms":[{"mechanism":"SCRAM-SHA-512","iterations":8192}]}' in listed.stdout.splitlines()
    for output in (added.stdout + added.stderr, listed.stdout, run_cli(catalog, "user", "list").stdout, run_cli(catalog, "user", "add", "--help").stdout):
        assert "Pl4nted" not in output
    no_password = run_cli(catalog, "user", "add", "frank")
    assert no_password.returncode != 0 and "--password-stdin" in no_password.stderr and len(no_password.stderr.splitlines()) == 1
    few = run_cli(catalog, "user", "add", "frank", "--iterations", "100", "--password", "x")
    assert few.returncode != 0 and "4096" in few.stderr
    removed = run_cli(catalog, "user", "remove", "dave")
    assert removed.returncode == 0 and "SCRAM-SHA-512" in removed.stdout
    assert f"{FAILED} SCRAM-SHA-512" in refused_by_librdkafka(sasl_agent, "SCRAM-SHA-512", "dave", "dave-Pl4nted-s3cret")
    again = run_cli(catalog, "user", "remove", "dave")
    assert again.returncode == 1 and "has no SCRAM credential" in again.stderr


def test_users_made_by_kafka_python_admin_authenticate_until_removed_on_each_catalog(catalog: Catalog) -> None:
    """KIP-554 through kafka-python's own command (its salt and salted password), on SQLite and PostgreSQL."""
    agent = SaslAgent(with_users(catalog), sasl_mechanisms=MECHANISMS)
    try:
        admin = [sys.executable, "-m", "kafka.admin", "-b", agent.bootstrap, "-S", "SASL_PLAINTEXT", "-M", "SCRAM-SHA-512",
                 "-U", ALICE, "-P", ALICE_PASSWORD, "users"]
        upsert = subprocess.run([*admin, "alter-scram-credentials", "--upsert", "carol:SCRAM-SHA-512:carol-Pl4nted", "--iterations", "5000"],
                                capture_output=True, text=True, timeout=60)
        assert upsert.returncode == 0, upsert.stderr
        described = subprocess.run([*admin, "describe-scram-credentials"], capture_output=True, text=True, timeout=60)
        assert described.returncode == 0 and "carol" in described.stdout and "5000" in described.stdout, described
        assert confluent_round_trip(agent, "SCRAM-SHA-512", "carol", "carol-Pl4nted", "carols") == b"by-SCRAM-SHA-512"
        assert confluent_round_trip(agent, "PLAIN", "carol", "carol-Pl4nted", "carols-plain") == b"by-PLAIN"
        delete = subprocess.run([*admin, "alter-scram-credentials", "--delete", "carol:SCRAM-SHA-512"], capture_output=True, text=True, timeout=60)
        assert delete.returncode == 0, delete.stderr
        assert f"{FAILED} SCRAM-SHA-512" in refused_by_librdkafka(agent, "SCRAM-SHA-512", "carol", "carol-Pl4nted")
        assert catalog.scram_users(["carol"]) == []
    finally:
        agent.stop()


def test_describe_and_alter_user_scram_credentials_answer_kafkas_errors(sasl_agent: SaslAgent) -> None:
    host, port = sasl_agent.plaintext.rsplit(":", 1)
    wire = Wire.over(socket.create_connection((host, int(port)), timeout=10))
    described = wire.call(DESCRIBE_SCRAM, 0, {"users": [{"name": ALICE}, {"name": "nobody"}, {"name": BOB}, {"name": BOB}]})
    by_user = {result.user: result for result in described.results}
    assert [(info.mechanism, info.iterations) for info in by_user[ALICE].credential_infos] == [(1, 4096), (2, 4096)]
    assert by_user["nobody"].error_code == 91 and by_user["nobody"].error_message == "Attempt to describe a user credential that does not exist: nobody"
    assert by_user[BOB].error_code == 92
    assert {result.user for result in wire.call(DESCRIBE_SCRAM, 0, {"users": None}).results} == {ALICE, BOB}
    salt = b"kip-554-salt"
    salted = hashlib.pbkdf2_hmac("sha256", b"gina-Pl4nted", salt, 4096)

    def upsert(name: str, mechanism: int = 1, iterations: int = 4096) -> dict[str, Any]:
        return {"name": name, "mechanism": mechanism, "iterations": iterations, "salt": salt, "salted_password": salted}

    altered = wire.call(ALTER_SCRAM, 0, {
        "deletions": [{"name": "nobody", "mechanism": 1}, {"name": BOB, "mechanism": 2}, {"name": "twice", "mechanism": 1}],
        "upsertions": [upsert("gina"), upsert("few", iterations=4095), upsert("many", iterations=16385), upsert("odd", mechanism=0),
                       upsert(""), upsert("twice")],
    })
    errors = {result.user: (result.error_code, result.error_message) for result in altered.results}
    assert errors == {
        "gina": (0, None), "nobody": (91, "Attempt to delete a user credential that does not exist"),
        BOB: (91, "Attempt to delete a user credential that does not exist"),
        "few": (93, "Too few iterations"), "many": (93, "Too many iterations"), "odd": (33, "Unknown SCRAM mechanism"),
        "": (93, "Username must not be empty"), "twice": (92, "A user credential cannot be altered twice in the same request"),
    }
    wire.close()
    stored = sasl_agent.server.catalog.scram_credential("gina", "SCRAM-SHA-256")
    assert stored == from_salted_password("SCRAM-SHA-256", salt, salted, 4096)
    assert confluent_round_trip(sasl_agent, "SCRAM-SHA-256", "gina", "gina-Pl4nted", "ginas") == b"by-SCRAM-SHA-256"


# -- the SCRAM exchange -----------------------------------------------------------------------------------------


def test_scram_sha_256_against_rfc_7677s_test_vector(monkeypatch: pytest.MonkeyPatch) -> None:
    salt = base64.b64decode("W22ZaJ0SNY7soEsUEjb6gQ==")
    credential = from_salted_password("SCRAM-SHA-256", salt, hashlib.pbkdf2_hmac("sha256", b"pencil", salt, 4096), 4096)
    monkeypatch.setattr(authenticator.secrets, "token_urlsafe", lambda _size: "%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0")
    exchange = ScramExchange("SCRAM-SHA-256")
    assert exchange.client_first(b"n,,n=user,r=rOprNGfwEbeRWgbNEkqO") == "user"
    assert exchange.server_first(credential) == b"r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096"
    final = exchange.client_final(b"c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ=")
    assert final == b"v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4="


def test_scram_sha_512_hand_computed_and_with_scramps_client() -> None:
    salt, password, iterations = b"0123456789abcdef", "sha512-Pl4nted", 4096
    salted = hashlib.pbkdf2_hmac("sha512", password.encode(), salt, iterations)
    credential = from_salted_password("SCRAM-SHA-512", salt, salted, iterations)
    client_key = hmac.digest(salted, b"Client Key", "sha512")
    assert credential.stored_key == hashlib.sha512(client_key).digest()
    assert credential.server_key == hmac.digest(salted, b"Server Key", "sha512")
    # scramp's make_auth_info (SASLprep is the identity on ASCII) stores the same keys for the same salt
    assert scramp.ScramMechanism("SCRAM-SHA-512").make_auth_info(password, iterations, salt) == (salt, credential.stored_key, credential.server_key, iterations)
    exchange = ScramExchange("SCRAM-SHA-512")
    client = scramp.ScramClient(["SCRAM-SHA-512"], "alice", password)
    client_first = client.get_client_first()
    assert exchange.client_first(client_first.encode()) == "alice"
    server_first = exchange.server_first(credential)
    client.set_server_first(server_first.decode())
    client_final = client.get_client_final()
    # the proof by hand: ClientKey XOR HMAC(StoredKey, AuthMessage)
    auth_message = f"{client_first[3:]},{server_first.decode()},{client_final.rsplit(',p=', 1)[0]}".encode()
    proof = bytes(a ^ b for a, b in zip(client_key, hmac.digest(credential.stored_key, auth_message, "sha512"), strict=True))
    assert client_final.endswith(",p=" + base64.b64encode(proof).decode())
    server_final = exchange.client_final(client_final.encode())
    assert server_final == b"v=" + base64.b64encode(hmac.digest(credential.server_key, auth_message, "sha512"))
    client.set_server_final(server_final.decode())


def scram_credential_for(password: str) -> ScramCredential:
    salt = b"salt-of-the-test"
    return from_salted_password("SCRAM-SHA-256", salt, hashlib.pbkdf2_hmac("sha256", password.encode(), salt, 4096), 4096)


@pytest.mark.parametrize(("client_first", "accepted"), [
    ("n,,n=alice,r=abc", True),
    ("n,a=alice,n=alice,r=abc", True),  # an authzid naming the user, as Kafka takes it
    ("n,,n=alice,r=abc,ext=1", True),  # an extension Kafka ignores
    ("y,,n=alice,r=abc", False),  # channel binding flags Kafka's pattern refuses
    ("p=tls-server-end-point,,n=alice,r=abc", False),
    ("n,,n=alice,r=abc,tokenauth=true", False),  # delegation tokens: none exist
    ("n,a=bob,n=alice,r=abc", False),
    ("n,,r=abc", False),
])
def test_scram_client_first_messages_as_kafka_takes_them(client_first: str, accepted: bool) -> None:
    exchange = ScramExchange("SCRAM-SHA-256")
    if accepted:
        assert exchange.client_first(client_first.encode()) == "alice"
        assert exchange.server_first(scram_credential_for("x")).startswith(b"r=abc")
    else:
        with pytest.raises(AuthenticationFailed):
            exchange.client_first(client_first.encode())


def hand_client_final(password: str, server_first: str, client_first_bare: str, gs2_header: str) -> str:
    """RFC 5802's client-final message for SCRAM-SHA-256, computed here."""
    attributes = dict(item.split("=", 1) for item in server_first.split(","))
    salted = hashlib.pbkdf2_hmac("sha256", password.encode(), base64.b64decode(attributes["s"]), int(attributes["i"]))
    client_key = hmac.digest(salted, b"Client Key", "sha256")
    without_proof = f"c={base64.b64encode(gs2_header.encode()).decode()},r={attributes['r']}"
    signature = hmac.digest(hashlib.sha256(client_key).digest(), f"{client_first_bare},{server_first},{without_proof}".encode(), "sha256")
    return f"{without_proof},p={base64.b64encode(bytes(a ^ b for a, b in zip(client_key, signature, strict=True))).decode()}"


@pytest.mark.parametrize(("bound_header", "accepted"), [("n,a=alice,", True), ("n,,", False)])
def test_the_client_final_binds_the_gs2_header_the_exchange_began_with(bound_header: str, accepted: bool) -> None:
    exchange = ScramExchange("SCRAM-SHA-256")
    exchange.client_first(b"n,a=alice,n=alice,r=abc")
    server_first = exchange.server_first(scram_credential_for("x")).decode()
    final = hand_client_final("x", server_first, "n=alice,r=abc", bound_header).encode()
    if accepted:
        assert exchange.client_final(final).startswith(b"v=")
    else:
        with pytest.raises(AuthenticationFailed):
            exchange.client_final(final)


# -- settings and secrets -----------------------------------------------------------------------------------------


def test_mechanism_settings_refuse_plain_off_loopback_and_unknown_names() -> None:
    off_loopback = (Listener(SecurityProtocol.SASL_PLAINTEXT, Address("0.0.0.0", 9093)),)
    with pytest.raises(ValueError, match="PLAIN on SASL_PLAINTEXT://0.0.0.0:9093 would send passwords in the clear"):
        AgentSettings(off_loopback, sasl_mechanisms=("PLAIN",))
    AgentSettings(off_loopback, allow_insecure_listener=True, sasl_mechanisms=("PLAIN",))
    AgentSettings(off_loopback, sasl_mechanisms=("SCRAM-SHA-512",))
    with pytest.raises(ValueError, match="'GSSAPI' is not a mechanism the agent serves"):
        parse_mechanisms("SCRAM-SHA-512,GSSAPI")
    assert parse_mechanisms("PLAIN, SCRAM-SHA-512") == ("PLAIN", "SCRAM-SHA-512")


def test_the_agent_command_refuses_bad_mechanisms_in_one_line(tmp_path: Path) -> None:
    catalog = Catalog(LocalStore(tmp_path / "store"))
    for args in (["--sasl-mechanisms", "SCRAM-SHA-1"], ["--listen", "SASL_PLAINTEXT://0.0.0.0:0", "--sasl-mechanisms", "PLAIN"]):
        refused = run_cli(catalog, "agent", *args)
        assert refused.returncode == 2 and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert "--sasl-mechanisms" in refused.stderr


def test_the_agent_command_serves_sasl_with_the_mechanisms_given(tmp_path: Path) -> None:
    catalog = with_users(Catalog(LocalStore(tmp_path / "store")))
    command = [sys.executable, "-m", "logcompact", "-v", "agent", "--listen", "SASL_PLAINTEXT://127.0.0.1:0", "--sasl-mechanisms", "PLAIN",
               "--flush-ms", str(FLUSH_MS)]
    with open(tmp_path / "agent.log", "w") as log:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=log, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, (tmp_path / "agent.log").read_text()
        agent = SimpleNamespace(bootstrap=json.loads(line)["listeners"]["SASL_PLAINTEXT"])
        assert confluent_round_trip(agent, "PLAIN", BOB, BOB_PASSWORD, "by-process") == b"by-PLAIN"
        assert "SCRAM-SHA-512" in refused_by_librdkafka(agent, "SCRAM-SHA-512", ALICE, ALICE_PASSWORD)
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    logged = (tmp_path / "agent.log").read_text()
    assert "it asked for SASL mechanism 'SCRAM-SHA-512', not one enabled (PLAIN)" in logged
    assert not any(secret in logged for secret in PLANTED)


def test_no_password_reaches_the_agents_debug_log(sasl_agent: SaslAgent, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    for mechanism in MECHANISMS:
        confluent_round_trip(sasl_agent, mechanism, ALICE, ALICE_PASSWORD, f"logged-{mechanism}")
        refused_by_librdkafka(sasl_agent, mechanism, ALICE, BOB_PASSWORD)
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert "authenticated as User:alice (SASL SCRAM-SHA-512)" in logged and "failed: a wrong password" in logged
    for secret in (*PLANTED, "n,,n=", ",r=", "c=biws"):  # the passwords, and any SCRAM message
        assert secret not in logged, secret
