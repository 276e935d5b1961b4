"""Listeners and TLS: real clients (librdkafka, kafka-python, aiokafka, kcat) over SSL with a server certificate and
with client certificates (mTLS), the principal a certificate gives, connections refused while the agent serves
others, two listeners on agents sharing a catalog, and the settings refused at start. Certificates are made here
(trustme)."""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import shutil
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import trustme
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.helpers import create_ssl_context
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, ConfigResource
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.x509.name import _ASN1Type
from cryptography.x509.oid import NameOID
from kafka import KafkaConsumer, KafkaProducer

from logcompact.catalog import Catalog
from logcompact.exceptions import LogcompactError
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol, check_insecure, is_loopback
from logcompact.kafka.server import AgentSettings
from logcompact.kafka.session import ANONYMOUS, KafkaPrincipal
from logcompact.kafka.tls import ClientAuth, NoMatchingRule, PrincipalMapper, TlsSettings, principal_of, rfc2253, server_context
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment
from tests.kafka.wire import Wire, closed_by_peer, kio_frame

TOPIC = "payments"
PARTITIONS = 6
RECORDS = 20
ALICE_DN = "CN=alice,OU=Payments,O=Example"
# Kafka's ssl.principal.mapping.rules: the CN of the Payments unit's certificates, in lower case; others as they are
RULES = "RULE:^CN=([^,]+),OU=Payments,.*$/$1/L,DEFAULT"
KEY_PASSWORD = "planted-key-secret-4711"  # planted, to check it never shows

SSL_LOCAL = Listener(SecurityProtocol.SSL, Address("127.0.0.1", 0))
PLAINTEXT_LOCAL = Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0))


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    """The suite's cluster with the topic the clients use, of 6 partitions (leaders spread over several agents)."""
    create_topic(catalog, TOPIC, PARTITIONS)
    return catalog


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA of the agent's certificate and of the clients'
    server_cert: Path
    server_key: Path
    alice_cert: Path  # a client certificate of ALICE_DN
    alice_key: Path
    untrusted_cert: Path  # of another CA
    untrusted_key: Path
    expired_cert: Path  # of the CA, expired yesterday
    expired_key: Path
    encrypted_key: Path  # the server's key encrypted with KEY_PASSWORD


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("tls")
    ca, other_ca = trustme.CA(), trustme.CA()
    server = ca.issue_cert("127.0.0.1", "localhost")
    alice = ca.issue_cert("alice.example", common_name="alice", organization_unit_name="Payments", organization_name="Example")
    untrusted = other_ca.issue_cert("mallory.example", common_name="mallory", organization_unit_name="Payments", organization_name="Example")
    now = datetime.datetime.now(datetime.UTC)
    expired = ca.issue_cert("old.example", common_name="old", organization_unit_name="Payments", organization_name="Example",
                            not_before=now - datetime.timedelta(days=30), not_after=now - datetime.timedelta(days=1))

    def write(name: str, data: bytes) -> Path:
        path = directory / name
        path.write_bytes(data)
        return path

    key = serialization.load_pem_private_key(server.private_key_pem.bytes(), None)
    encrypted = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.BestAvailableEncryption(KEY_PASSWORD.encode()))
    return Certificates(
        write("ca.pem", ca.cert_pem.bytes()),
        write("server.pem", b"".join(blob.bytes() for blob in server.cert_chain_pems)), write("server.key", server.private_key_pem.bytes()),
        write("alice.pem", alice.cert_chain_pems[0].bytes()), write("alice.key", alice.private_key_pem.bytes()),
        write("untrusted.pem", untrusted.cert_chain_pems[0].bytes()), write("untrusted.key", untrusted.private_key_pem.bytes()),
        write("expired.pem", expired.cert_chain_pems[0].bytes()), write("expired.key", expired.private_key_pem.bytes()),
        write("server-encrypted.key", encrypted),
    )


def tls_settings(certificates: Certificates, client_auth: ClientAuth, **settings: Any) -> TlsSettings:
    return TlsSettings(certificates.server_cert, certificates.server_key, None, certificates.ca, client_auth, **settings)


def ssl_agent(catalog: Catalog, certificates: Certificates, client_auth: ClientAuth, listeners: tuple[Listener, ...] = (SSL_LOCAL,),
              **tls: Any) -> RunningAgent:
    return RunningAgent(catalog, listeners, flush_interval_ms=FLUSH_MS, tls=tls_settings(certificates, client_auth, **tls))


def ssl_bootstrap(agent: RunningAgent) -> str:
    return str(agent.server.addresses["SSL"])


def client_context(certificates: Certificates, cert: Path | None = None, key: Path | None = None) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=certificates.ca)
    if cert is not None:
        context.load_cert_chain(cert, key)
    return context


# -- real clients over SSL -------------------------------------------------------------------------------------


def librdkafka_round_trip(bootstrap: str, client: dict[str, str]) -> list[tuple[bytes, bytes]]:
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", **client, **FAST_CLIENT})
    for n in range(RECORDS):
        producer.produce(TOPIC, key=b"k%d" % n, value=b"v%d" % n)
    assert producer.flush(30) == 0
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "librdkafka", "auto.offset.reset": "earliest", **client, **FAST_CLIENT})
    consumer.subscribe([TOPIC])
    read: list[tuple[bytes, bytes]] = []
    deadline = time.monotonic() + 60
    while len(read) < RECORDS and time.monotonic() < deadline:
        message = consumer.poll(1)
        if message is not None:
            assert message.error() is None, message.error()
            read.append((message.key(), message.value()))
    consumer.close()
    return read


def kafka_python_round_trip(bootstrap: str, certificates: Certificates, mutual: bool) -> list[tuple[bytes, bytes]]:
    ssl_files: dict[str, Any] = {"security_protocol": "SSL", "ssl_cafile": str(certificates.ca)}
    if mutual:
        ssl_files |= {"ssl_certfile": str(certificates.alice_cert), "ssl_keyfile": str(certificates.alice_key)}
    producer = KafkaProducer(bootstrap_servers=bootstrap, acks="all", **ssl_files)
    for n in range(RECORDS):
        producer.send(TOPIC, key=b"k%d" % n, value=b"v%d" % n).get(timeout=30)
    producer.close()
    consumer = KafkaConsumer(TOPIC, bootstrap_servers=bootstrap, group_id="kafka-python", auto_offset_reset="earliest",
                             consumer_timeout_ms=20_000, **ssl_files)
    read = []
    for message in consumer:
        read.append((message.key, message.value))
        if len(read) == RECORDS:
            break
    consumer.close()
    return read


async def aiokafka_round_trip(bootstrap: str, certificates: Certificates, mutual: bool) -> list[tuple[bytes, bytes]]:
    context = create_ssl_context(cafile=str(certificates.ca), certfile=str(certificates.alice_cert) if mutual else None,
                                 keyfile=str(certificates.alice_key) if mutual else None)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, security_protocol="SSL", ssl_context=context, acks="all")
    await producer.start()
    try:
        for n in range(RECORDS):
            await producer.send_and_wait(TOPIC, key=b"k%d" % n, value=b"v%d" % n)
    finally:
        await producer.stop()
    consumer = AIOKafkaConsumer(TOPIC, bootstrap_servers=bootstrap, security_protocol="SSL", ssl_context=context,
                                group_id="aiokafka", auto_offset_reset="earliest")
    await consumer.start()
    read: list[tuple[bytes, bytes]] = []
    try:
        async with asyncio.timeout(60):
            while len(read) < RECORDS:
                for messages in (await consumer.getmany(timeout_ms=1000)).values():
                    read.extend((message.key, message.value) for message in messages)
    finally:
        await consumer.stop()
    return read


def kcat_round_trip(bootstrap: str, client: dict[str, str]) -> list[tuple[bytes, bytes]]:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    options = [arg for key, value in client.items() for arg in ("-X", f"{key}={value}")]
    lines = "".join(f"k{n}:v{n}\n" for n in range(RECORDS))
    subprocess.run(["kcat", "-b", bootstrap, *options, "-P", "-t", TOPIC, "-K:"], input=lines, text=True, timeout=60, check=True)
    out = subprocess.run(["kcat", "-b", bootstrap, *options, "-C", "-t", TOPIC, "-o", "beginning", "-e", "-f", "%k:%s\n"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [tuple(part.encode() for part in line.split(":")) for line in out.splitlines()]  # type: ignore[misc]


@pytest.mark.parametrize("mutual", [False, True], ids=["server-certificate", "mutual-tls"])
@pytest.mark.parametrize("client", ["librdkafka", "kafka-python", "aiokafka", "kcat"])
def test_clients_produce_and_consume_over_ssl_with_the_certificates_principal(
    catalog: Catalog, certificates: Certificates, client: str, mutual: bool, caplog: pytest.LogCaptureFixture
) -> None:
    """Each client produces and consumes over SSL, verifying the agent's certificate; with --ssl-client-auth required
    it presents a client certificate, and the agent logs (at debug) the principal the mapping rules make of its DN:
    User:alice; without one, User:ANONYMOUS."""
    caplog.set_level(logging.DEBUG, logger="logcompact.kafka.server")
    agent = ssl_agent(catalog, certificates, ClientAuth.REQUIRED if mutual else ClientAuth.NONE, principal_mapping_rules=RULES)
    try:
        bootstrap = ssl_bootstrap(agent)
        librdkafka_client = {"security.protocol": "SSL", "ssl.ca.location": str(certificates.ca)}
        if mutual:
            librdkafka_client |= {"ssl.certificate.location": str(certificates.alice_cert), "ssl.key.location": str(certificates.alice_key)}
        if client == "librdkafka":
            read = librdkafka_round_trip(bootstrap, librdkafka_client)
        elif client == "kafka-python":
            read = kafka_python_round_trip(bootstrap, certificates, mutual)
        elif client == "aiokafka":
            read = asyncio.run(aiokafka_round_trip(bootstrap, certificates, mutual))
        else:
            read = kcat_round_trip(bootstrap, librdkafka_client)
    finally:
        agent.stop()
    assert sorted(read) == sorted((b"k%d" % n, b"v%d" % n) for n in range(RECORDS))
    principals = {r.getMessage().rpartition(" authenticated as ")[2] for r in caplog.records if " authenticated as " in r.getMessage()}
    assert principals == {"User:alice" if mutual else "User:ANONYMOUS"}
    assert not [r for r in caplog.records if r.name.startswith("logcompact.kafka") and r.levelno >= logging.WARNING]


# -- refused, while the agent serves others ---------------------------------------------------------------------


def api_versions_over(connection: socket.socket) -> Any:
    return Wire.over(connection).call(18, 3, {"client_software_name": "tls-test", "client_software_version": "1"})


def refused(address: Address, context: ssl.SSLContext) -> bool:
    """Whether a TLS client with `context` gets no answer to ApiVersions: the handshake or the first read fails."""
    with socket.create_connection((address.host, address.port), timeout=10) as raw:
        try:
            with context.wrap_socket(raw, server_hostname="127.0.0.1") as connection:
                connection.sendall(kio_frame(18, 3, {"client_software_name": "x", "client_software_version": "1"}, 1))
                return connection.recv(4) == b""
        except (ssl.SSLError, ConnectionError):
            return True


def test_plaintext_untrusted_expired_and_missing_client_certificates_are_refused_while_others_are_served(
    catalog: Catalog, certificates: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    """Each refused connection is closed with one log line naming the peer and the reason; a client with a good
    certificate is served before, between and after them."""
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    agent = ssl_agent(catalog, certificates, ClientAuth.REQUIRED, handshake_timeout_ms=500)
    try:
        address = agent.server.addresses["SSL"]
        good = client_context(certificates, certificates.alice_cert, certificates.alice_key)

        def served() -> None:
            with socket.create_connection((address.host, address.port), timeout=10) as raw, good.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert api_versions_over(tls).error_code == 0

        served()
        with socket.create_connection((address.host, address.port), timeout=10) as plain:  # a PLAINTEXT client on the TLS port
            plain.sendall(kio_frame(18, 3, {"client_software_name": "x", "client_software_version": "1"}, 1))
            assert closed_by_peer(plain)
        served()
        assert refused(address, client_context(certificates, certificates.untrusted_cert, certificates.untrusted_key))
        assert refused(address, client_context(certificates, certificates.expired_cert, certificates.expired_key))
        assert refused(address, client_context(certificates))  # no certificate, which the agent requires
        with socket.create_connection((address.host, address.port), timeout=10) as silent:  # never starts its handshake
            assert closed_by_peer(silent)
        served()
    finally:
        agent.stop()
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")]
    assert len(logged) == 5, logged
    assert all(line.startswith("connection from 127.0.0.1:") and "closed: TLS handshake failed: " in line for line in logged), logged
    plaintext, untrusted, expired, missing, silent = logged
    assert "WRONG_VERSION_NUMBER" in plaintext or "HTTP_REQUEST" in plaintext or "RECORD" in plaintext, plaintext
    assert "CERTIFICATE_VERIFY_FAILED" in untrusted and "unable to get local issuer certificate" in untrusted, untrusted
    assert "certificate has expired" in expired, expired
    assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in missing, missing
    assert "0.5 seconds" in silent, silent


def test_a_requested_client_certificate_is_optional_and_without_one_the_principal_is_anonymous(
    catalog: Catalog, certificates: Certificates, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG, logger="logcompact.kafka.server")
    agent = ssl_agent(catalog, certificates, ClientAuth.REQUESTED)
    try:
        address = agent.server.addresses["SSL"]
        for context in (client_context(certificates), client_context(certificates, certificates.alice_cert, certificates.alice_key)):
            with socket.create_connection((address.host, address.port), timeout=10) as raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                assert api_versions_over(tls).error_code == 0
    finally:
        agent.stop()
    principals = [r.getMessage().rpartition(" authenticated as ")[2] for r in caplog.records if " authenticated as " in r.getMessage()]
    assert principals == ["User:ANONYMOUS", f"User:{ALICE_DN}"]  # DEFAULT: the DN as it is


def test_a_certificate_no_mapping_rule_names_is_refused(catalog: Catalog, certificates: Certificates, caplog: pytest.LogCaptureFixture) -> None:
    """Kafka fails the authentication of a DN no rule maps: the connection is closed with one log line."""
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    agent = ssl_agent(catalog, certificates, ClientAuth.REQUIRED, principal_mapping_rules="RULE:^CN=([^,]+),OU=Billing,.*$/$1/")
    try:
        assert refused(agent.server.addresses["SSL"], client_context(certificates, certificates.alice_cert, certificates.alice_key))
    finally:
        agent.stop()
    logged = [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")]
    assert len(logged) == 1 and "its certificate names no principal: no rule of --ssl-principal-mapping-rules maps" in logged[0], logged


# -- two listeners on agents sharing a catalog ---------------------------------------------------------------------


def brokers_of(bootstrap: str, client: dict[str, str]) -> dict[int, str]:
    metadata = AdminClient({"bootstrap.servers": bootstrap, **client, **FAST_CLIENT}).list_topics(timeout=20)
    return {broker.id: f"{broker.host}:{broker.port}" for broker in metadata.brokers.values()}


def test_each_listener_advertises_its_own_endpoints_and_a_group_on_ssl_never_touches_a_plaintext_port(
    catalog: Catalog, certificates: Certificates
) -> None:
    """Two agents with PLAINTEXT (loopback) and SSL listeners: Metadata on each listener names every agent at that
    listener's address; a consumer group bootstrapped on SSL connects to SSL ports only (librdkafka's own list of
    the brokers it connected to). A third agent with PLAINTEXT only is left out of the SSL listener's answers
    (Metadata, DescribeCluster), a client it leads on PLAINTEXT is led on SSL by an agent there, and groups it
    coordinates answer COORDINATOR_NOT_AVAILABLE."""
    both = (PLAINTEXT_LOCAL, SSL_LOCAL)
    first = ssl_agent(Catalog(catalog.store, catalog.url), certificates, ClientAuth.NONE, both)
    second = ssl_agent(Catalog(catalog.store, catalog.url), certificates, ClientAuth.NONE, both)
    agents = (first, second)
    ssl_client = {"security.protocol": "SSL", "ssl.ca.location": str(certificates.ca)}
    try:
        ssl_ports = {agent.server.broker.node_id: str(agent.server.addresses["SSL"]) for agent in agents}
        plaintext_ports = {agent.server.broker.node_id: str(agent.server.addresses["PLAINTEXT"]) for agent in agents}
        assert brokers_of(str(first.server.addresses["PLAINTEXT"]), {}) == plaintext_ports
        assert brokers_of(ssl_bootstrap(second), ssl_client) == ssl_ports
        broker = ConfigResource(ConfigResource.Type.BROKER, str(second.server.broker.node_id))
        admin = AdminClient({"bootstrap.servers": ssl_bootstrap(second), **ssl_client, **FAST_CLIENT})
        described = admin.describe_configs([broker])[broker].result(timeout=20)
        node = second.server.broker.node_id
        assert described["advertised.listeners"].value == f"PLAINTEXT://{plaintext_ports[node]},SSL://{ssl_ports[node]}"

        connected: set[str] = set()

        def stats(text: str) -> None:
            connected.update(b["nodename"] for b in json.loads(text)["brokers"].values() if b["state"] == "UP" or b["connects"])

        client = {**ssl_client, "statistics.interval.ms": 100, "stats_cb": stats}
        assert sorted(librdkafka_round_trip(ssl_bootstrap(first), client)) == sorted((b"k%d" % n, b"v%d" % n) for n in range(RECORDS))
        assert connected and connected <= set(ssl_ports.values()), (connected, ssl_ports)

        plaintext_only = RunningAgent(Catalog(catalog.store, catalog.url), (PLAINTEXT_LOCAL,), flush_interval_ms=FLUSH_MS)
        try:
            alone = plaintext_only.server.broker.node_id
            first.server.broker.agents.refresh()
            assert brokers_of(ssl_bootstrap(first), ssl_client) == ssl_ports
            assert alone in brokers_of(str(first.server.addresses["PLAINTEXT"]), {})
            # A client the plaintext-only agent leads on PLAINTEXT is led by an agent of the SSL listener there.
            directory = first.server.broker.agents
            client = next(c for c in (f"client-{n}" for n in range(100)) if directory.leader_for(c, "127.0.0.1", "PLAINTEXT").node_id == alone)
            address = first.server.addresses["SSL"]
            for version in (5, 12):
                with socket.create_connection((address.host, address.port), timeout=10) as raw, \
                        client_context(certificates).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                    body: dict[str, Any] = {"topics": [{"name": TOPIC, **({"topic_id": None} if version >= 10 else {})}],
                                            "allow_auto_topic_creation": False}
                    if version >= 8:
                        body["include_topic_authorized_operations"] = False
                    answer = Wire.over(tls, client).call(3, version, body)
                assert alone not in {b.node_id for b in answer.brokers}
                assert [(p.error_code, p.leader_id) for p in answer.topics[0].partitions] == [(0, directory.leader_for(client, "127.0.0.1", "SSL").node_id)] * PARTITIONS
                assert answer.topics[0].partitions[0].leader_id in ssl_ports
            group = next(g for g in (f"group-{n}" for n in range(100)) if first.server.broker.agents.coordinator_for(g).node_id == alone)
            with socket.create_connection((address.host, address.port), timeout=10) as raw, \
                    client_context(certificates).wrap_socket(raw, server_hostname="127.0.0.1") as tls:
                wire = Wire.over(tls)
                found = wire.call(10, 3, {"key": group, "key_type": 0})
                assert (found.error_code, found.node_id) == (15, -1)  # COORDINATOR_NOT_AVAILABLE, as Kafka off the listener
                cluster = wire.call(60, 0, {"include_cluster_authorized_operations": False})
                assert {b.broker_id: f"{b.host}:{b.port}" for b in cluster.brokers} == ssl_ports
        finally:
            plaintext_only.stop()
    finally:
        for agent in agents:
            agent.stop()


# -- the principal: Java's RFC 2253 form and Kafka's mapping rules -------------------------------------------------


def test_subject_dns_are_written_as_javas_x500principal_rfc2253() -> None:
    """Each expected string is what Java 17's X500Principal.getName(RFC2253) gave for the same certificate's subject."""
    a, rdn = x509.NameAttribute, x509.RelativeDistinguishedName
    cases = [
        (x509.Name([a(NameOID.COUNTRY_NAME, "US"), a(NameOID.ORGANIZATION_NAME, "Sun Microsystems"),
                    a(NameOID.ORGANIZATIONAL_UNIT_NAME, "JavaSoft"), a(NameOID.COMMON_NAME, "Duke")]),
         "CN=Duke,OU=JavaSoft,O=Sun Microsystems,C=US"),
        (x509.Name([a(NameOID.DOMAIN_COMPONENT, "cz"), a(NameOID.DOMAIN_COMPONENT, "geodis"), a(NameOID.ORGANIZATIONAL_UNIT_NAME, "ITZ"),
                    a(NameOID.COMMON_NAME, "Tkac, Adam")]),
         "CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz"),
        (x509.Name([a(NameOID.COMMON_NAME, 'a=b+c<d>e#f;g"h\\i'), a(NameOID.EMAIL_ADDRESS, "duke@example.com")]),
         '1.2.840.113549.1.9.1=#161064756b65406578616d706c652e636f6d,CN=a\\=b\\+c\\<d\\>e\\#f\\;g\\"h\\\\i'),
        (x509.Name([a(NameOID.COMMON_NAME, "#lead"), a(NameOID.LOCALITY_NAME, "  spaced  "), a(NameOID.STATE_OR_PROVINCE_NAME, "Zürich é")]),
         "ST=Zürich é,L=\\ \\ spaced\\ \\ ,CN=\\#lead"),
        (x509.Name([rdn([a(NameOID.COMMON_NAME, "multi"), a(NameOID.USER_ID, "u1")]), rdn([a(NameOID.SERIAL_NUMBER, "1234")]),
                    rdn([a(NameOID.STREET_ADDRESS, "Main St")]), rdn([a(NameOID.TITLE, "boss")])]),
         "2.5.4.12=#0c04626f7373,STREET=Main St,2.5.4.5=#130431323334,CN=multi+UID=u1"),
        (x509.Name([a(NameOID.ORGANIZATION_NAME, "printable", _ASN1Type.PrintableString), a(NameOID.GIVEN_NAME, "Jo")]),
         "2.5.4.42=#0c024a6f,O=printable"),
        (x509.Name([a(NameOID.COMMON_NAME, "bmp", _ASN1Type.BMPString)]), "CN=\\00b\\00m\\00p"),  # Java reads its UTF-16 as UTF-8
        (x509.Name([a(NameOID.COMMON_NAME, "uni", _ASN1Type.UniversalString)]), "CN=#1c0c000000750000006e00000069"),
        (x509.Name([a(NameOID.COMMON_NAME, "vis", _ASN1Type.VisibleString)]), "CN=#1a03766973"),
        (x509.Name([a(NameOID.COMMON_NAME, "tab\there")]), "CN=tab\there"),
    ]
    for name, java in cases:
        assert rfc2253(name) == java


def test_principal_of_a_connection_without_a_certificate_is_anonymous() -> None:
    assert principal_of(None, PrincipalMapper("DEFAULT")) == ANONYMOUS == KafkaPrincipal("User", "ANONYMOUS")


# Kafka's SslPrincipalMapperTest, case for case
@pytest.mark.parametrize("rules", [
    "DEFAULT",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L, DEFAULT",
    "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/",
    "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L",
    "RULE:^cn=(.?),ou=(.?),dc=(.?),dc=(.?)$/$1@$2/U",
    "RULE:^CN=([^,ADEFLTU,]+)(,.*|$)/$1/",
    "RULE:^CN=([^,DEFAULT,]+)(,.*|$)/$1/",
])
def test_kafkas_valid_mapping_rules_parse(rules: str) -> None:
    PrincipalMapper(rules)


@pytest.mark.parametrize("rules", [
    "default", "DEFAUL", "DEFAULT/L", "DEFAULT/U",
    "RULE:CN=(.*?),OU=ServiceUsers.*/$1",
    "rule:^CN=(.*?),OU=ServiceUsers.*$/$1/",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/L",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/U",
    "RULE:^CN=(.*?),OU=ServiceUsers.*$/LU",
])
def test_kafkas_invalid_mapping_rules_are_refused_naming_the_rule(rules: str) -> None:
    with pytest.raises(ValueError, match=r"^--ssl-principal-mapping-rules: invalid rule "):
        PrincipalMapper(rules)


def test_kafkas_mapping_of_dns() -> None:
    mapper = PrincipalMapper(", ".join([
        "RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/L",
        "RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L",
        "RULE:^cn=(.*?),ou=(.*?),dc=(.*?),dc=(.*?)$/$1@$2/U",
        "RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/U",
        "DEFAULT",
    ]))
    assert mapper.name("CN=Duke,OU=ServiceUsers,O=Org,C=US") == "duke"
    assert mapper.name("CN=Duke,OU=SME,O=mycp,L=Fulton,ST=MD,C=US") == "duke@sme"
    assert mapper.name("cn=duke,ou=sme,dc=mycp,dc=com") == "DUKE@SME"
    assert mapper.name("cN=duke,OU=JavaSoft,O=Sun Microsystems") == "DUKE"
    assert mapper.name("OU=JavaSoft,O=Sun Microsystems,C=US") == "OU=JavaSoft,O=Sun Microsystems,C=US"
    assert PrincipalMapper("RULE:^CN=((\\\\, *|\\w)+)(,.*|$)/$1/,DEFAULT").name("CN=Tkac\\, Adam,OU=ITZ,DC=geodis,DC=cz") == "Tkac\\, Adam"
    with pytest.raises(NoMatchingRule, match=r"no rule of --ssl-principal-mapping-rules maps 'CN=x'"):
        PrincipalMapper("RULE:^CN=y$/$0/").name("CN=x")


@pytest.mark.parametrize(("expected", "rules"), [
    ("[]", ""),
    ("[DEFAULT]", "DEFAULT"),
    ("[RULE:/]", "RULE://"),
    ("[RULE:/.*]", "RULE:/.*/"),
    ("[RULE:/.*/L]", "RULE:/.*/L"),
    ("[RULE:/, DEFAULT]", "RULE://,DEFAULT"),
    ("[RULE:/, DEFAULT]", "  RULE:// ,  DEFAULT  "),
    ("[RULE:   /     , DEFAULT]", "  RULE:   /     / ,  DEFAULT  "),
    ("[RULE:  /     /U, DEFAULT]", "  RULE:  /     /U   ,DEFAULT  "),
    ("[RULE:([A-Z]*)/$1/U, RULE:([a-z]+)/$1, DEFAULT]", "  RULE:([A-Z]*)/$1/U   ,RULE:([a-z]+)/$1/,   DEFAULT  "),
    ("[]", ",   , , ,      , , ,   "),
    ("[RULE:/, DEFAULT]", ",,RULE://,,,DEFAULT,,"),
    ("[RULE: /   , DEFAULT]", ",  , RULE: /   /    ,,,   DEFAULT, ,   "),
    ("[RULE:   /  /U, DEFAULT]", "     ,  , RULE:   /  /U    ,,  ,DEFAULT, ,"),
    ("[RULE:\\/\\\\\\(\\)\\n\\t/\\/\\/]", "RULE:\\/\\\\\\(\\)\\n\\t/\\/\\//"),
    ("[RULE:\\**\\/+/*/L, RULE:\\/*\\**/**]", "RULE:\\**\\/+/*/L,RULE:\\/*\\**/**/"),
    ("[RULE:,RULE:,/,RULE:,\\//U, RULE:,/RULE:,, RULE:,RULE:,/L,RULE:,/L, RULE:, DEFAULT, /DEFAULT, DEFAULT]",
     "RULE:,RULE:,/,RULE:,\\//U,RULE:,/RULE:,/,RULE:,RULE:,/L,RULE:,/L,RULE:, DEFAULT, /DEFAULT/,DEFAULT"),
])
def test_kafkas_rules_splitting(expected: str, rules: str) -> None:
    assert str(PrincipalMapper(rules)) == expected


def test_back_references_past_the_groups_stay_literal_as_kafka_keeps_them() -> None:
    """Kafka's escapeLiteralBackReferences: with one group, `$1@$4` gives group 1 and a literal `$4`; `$12` is
    group 1 and a `2`."""
    assert PrincipalMapper("RULE:^CN=([a-z]+),.*$/$1@$4/").name("CN=duke,O=Sun") == "duke@$4"
    assert PrincipalMapper("RULE:^CN=([a-z]+),.*$/$12/").name("CN=duke,O=Sun") == "duke2"


# -- settings refused at start ---------------------------------------------------------------------------------


def test_listeners_and_tls_settings_the_agent_refuses(certificates: Certificates) -> None:
    off_loopback = Listener(SecurityProtocol.PLAINTEXT, Address("0.0.0.0", 9092))  # only checked, never bound
    with pytest.raises(ValueError, match=r"^--listen PLAINTEXT://0.0.0.0:9092: a PLAINTEXT listener off loopback .* pass --allow-insecure-listener$"):
        AgentSettings((off_loopback,))
    AgentSettings((off_loopback,), allow_insecure_listener=True)  # allowed; the agent logs a warning at start
    for host in ("127.0.0.1", "127.3.2.1", "::1", "localhost"):
        assert is_loopback(host)
        check_insecure((Listener(SecurityProtocol.PLAINTEXT, Address(host, 9092)),), False)
    for host in ("0.0.0.0", "::", "10.0.0.1", "agent.example"):
        assert not is_loopback(host)
    check_insecure((Listener(SecurityProtocol.SSL, Address("0.0.0.0", 9093)),), False)  # TLS is not in the clear
    with pytest.raises(ValueError, match=r"^the SSL listener needs --ssl-certfile: pass --ssl-certfile CERT.pem and --ssl-keyfile KEY.pem"):
        AgentSettings((SSL_LOCAL,))
    with pytest.raises(ValueError, match=r"^the SSL listener needs --ssl-keyfile"):
        AgentSettings((SSL_LOCAL,), tls=TlsSettings(certificates.server_cert))
    with pytest.raises(ValueError, match=r"^--ssl-client-auth required needs --ssl-cafile CA.pem"):
        AgentSettings((SSL_LOCAL,), tls=TlsSettings(certificates.server_cert, certificates.server_key, client_auth=ClientAuth.REQUIRED))
    with pytest.raises(ValueError, match=r"^--ssl-\* options are given but no listener uses TLS"):
        AgentSettings((PLAINTEXT_LOCAL,), tls=TlsSettings(certificates.server_cert, certificates.server_key))
    with pytest.raises(ValueError, match=r"^--ssl-principal-mapping-rules: invalid rule 'RULE:x'"):
        AgentSettings((SSL_LOCAL,), tls=TlsSettings(certificates.server_cert, certificates.server_key, principal_mapping_rules="RULE:x"))


def test_certificate_and_key_files_the_agent_refuses_name_the_file_and_the_fix(certificates: Certificates, tmp_path: Path) -> None:
    def error(**files: Any) -> str:
        settings = TlsSettings(**{"certfile": certificates.server_cert, "keyfile": certificates.server_key, **files})
        with pytest.raises(LogcompactError) as raised:
            server_context(settings)
        return str(raised.value)

    missing = tmp_path / "missing.pem"
    assert error(certfile=missing) == f"--ssl-certfile {missing}: No such file or directory; pass the PEM file of the agent's certificate"
    not_pem = tmp_path / "keystore.jks"
    not_pem.write_bytes(b"\xfe\xed\xfe\xed binary keystore")
    assert error(keyfile=not_pem).startswith(f"--ssl-keyfile {not_pem} holds no PEM PRIVATE KEY block; pass the PEM file of the agent's private key")
    assert error(keyfile=certificates.alice_key) == (
        f"--ssl-keyfile {certificates.alice_key} is not the key of --ssl-certfile {certificates.server_cert}; pass the key the certificate was made for"
    )
    assert error(keyfile=certificates.encrypted_key) == (
        f"--ssl-keyfile {certificates.encrypted_key}: the key is encrypted; set LOGCOMPACT_SSL_KEY_PASSWORD to its password"
    )
    wrong = error(keyfile=certificates.encrypted_key, keyfile_password="not-" + KEY_PASSWORD)
    assert wrong.startswith(f"--ssl-keyfile {certificates.encrypted_key} cannot be read with the password in LOGCOMPACT_SSL_KEY_PASSWORD")
    assert KEY_PASSWORD not in wrong
    assert error(cafile=certificates.server_key).startswith(f"--ssl-cafile {certificates.server_key} holds no PEM CERTIFICATE block")
    server_context(TlsSettings(certificates.server_cert, certificates.encrypted_key, KEY_PASSWORD))  # the right password
    assert KEY_PASSWORD not in repr(TlsSettings(certificates.server_cert, certificates.encrypted_key, KEY_PASSWORD))


def run_agent_command(catalog: Catalog, *arguments: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "logcompact", "agent", *arguments], capture_output=True, text=True, timeout=60,
                          env={**agent_environment(catalog), **(env or {})})


def test_the_agent_command_refuses_an_insecure_listener_and_a_tls_listener_without_its_files_in_one_line(
    catalog: Catalog, certificates: Certificates
) -> None:
    insecure = run_agent_command(catalog, "--listen", "0.0.0.0:0")
    assert insecure.returncode == 2 and insecure.stdout == ""
    assert "--listen PLAINTEXT://0.0.0.0:0: a PLAINTEXT listener off loopback sends records in the clear" in insecure.stderr
    assert len(insecure.stderr.strip().splitlines()) == 1, insecure.stderr
    no_key = run_agent_command(catalog, "--listen", "SSL://127.0.0.1:0", env={"LOGCOMPACT_SSL_CERTFILE": str(certificates.server_cert)})
    assert no_key.returncode == 2 and "the SSL listener needs --ssl-keyfile" in no_key.stderr and len(no_key.stderr.strip().splitlines()) == 1
    wrong_password = run_agent_command(catalog, "--listen", "SSL://127.0.0.1:0", "--ssl-certfile", str(certificates.server_cert),
                                       "--ssl-keyfile", str(certificates.encrypted_key), env={"LOGCOMPACT_SSL_KEY_PASSWORD": "x" + KEY_PASSWORD})
    assert wrong_password.returncode == 1 and wrong_password.stderr.startswith(f"logcompact: error: --ssl-keyfile {certificates.encrypted_key} cannot be read")
    assert len(wrong_password.stderr.strip().splitlines()) == 1 and KEY_PASSWORD not in wrong_password.stderr + wrong_password.stdout
    helped = run_agent_command(catalog, "--help", env={"LOGCOMPACT_SSL_KEY_PASSWORD": KEY_PASSWORD})
    assert "--ssl-client-auth" in helped.stdout and KEY_PASSWORD not in helped.stdout


def test_the_agent_command_serves_ssl_from_environment_variables_and_lists_its_listeners(catalog: Catalog, certificates: Certificates) -> None:
    """Every TLS option read from its environment variable, the key's password too; the JSON line names each
    listener's address; an encrypted key with its password serves clients."""
    env = {"LOGCOMPACT_SSL_CERTFILE": str(certificates.server_cert), "LOGCOMPACT_SSL_KEYFILE": str(certificates.encrypted_key),
           "LOGCOMPACT_SSL_KEY_PASSWORD": KEY_PASSWORD, "LOGCOMPACT_SSL_CAFILE": str(certificates.ca), "LOGCOMPACT_SSL_CLIENT_AUTH": "required"}
    process = subprocess.Popen([sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--listen", "SSL://127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**agent_environment(catalog), **env})
    try:
        assert process.stdout is not None
        started = json.loads(process.stdout.readline())
        assert set(started["listeners"]) == {"PLAINTEXT", "SSL"} and started["listening"] == started["listeners"]["PLAINTEXT"]
        address = Address.parse(started["listeners"]["SSL"], "SSL")
        assert refused(address, client_context(certificates))  # required: no certificate, no service
        context = client_context(certificates, certificates.alice_cert, certificates.alice_key)
        with socket.create_connection((address.host, address.port), timeout=10) as raw, context.wrap_socket(raw, server_hostname="127.0.0.1") as tls:
            assert api_versions_over(tls).error_code == 0
    finally:
        process.terminate()
        _, stderr = process.communicate(timeout=60)
    assert process.returncode == 0, stderr
    assert KEY_PASSWORD not in stderr


def test_a_plaintext_listener_on_a_host_name_is_allowed_with_the_flag_and_warned_about(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    """A host name is not loopback to the check (it may resolve to any interface): this machine's own name, when it
    resolves to a loopback address, lets the test bind on loopback still."""
    name = socket.gethostname()
    if name == "localhost" or not socket.gethostbyname(name).startswith("127."):
        pytest.skip(f"this machine's name {name!r} does not resolve to a loopback address")
    caplog.set_level(logging.WARNING, logger="logcompact.kafka")
    with pytest.raises(ValueError, match="pass --allow-insecure-listener"):
        AgentSettings((Listener(SecurityProtocol.PLAINTEXT, Address(name, 0)),))
    agent = RunningAgent(catalog, (Listener(SecurityProtocol.PLAINTEXT, Address(name, 0)),), allow_insecure_listener=True)
    agent.stop()
    assert [r.getMessage() for r in caplog.records if r.name.startswith("logcompact.kafka")] == [
        f"listener PLAINTEXT://{name}:0 sends records in the clear to anyone on the network (--allow-insecure-listener)"
    ]
