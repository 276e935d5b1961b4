"""`bench/agent.py --measures security`: the agent over SASL_SSL (TLS 1.2+, SCRAM-SHA-512) against the same agent's
PLAINTEXT listener, in one run, one agent process with both listeners, the client (confluent-kafka, Debian's kcat)
on the same machine. Each figure is printed with its target and whether it is met:

* produce, 100 B lz4, acks=all, records/s, and produce of 1 KiB values, MB/s: SASL_SSL against PLAINTEXT, alternating;
* fetch of a compacted topic from files by kcat, MB/s: SASL_SSL against PLAINTEXT, alternating;
* a new connection, TLS and SCRAM-SHA-512, from connecting to its first Produce answered (p50, p99; acks=1, one
  record, a client of raw frames doing what librdkafka does: ApiVersions, SaslHandshake, two SaslAuthenticate, Produce),
  beside the same over PLAINTEXT, and librdkafka's own (a producer created to its first delivery report, which adds
  the client's metadata round and timers): measured on an agent flushing every 5 ms, alone in a cluster of its own,
  since an ack waits for its L0 file's commit and the main agent's 250 ms flush would be most of it;
* 500 clients authenticating at once (asyncio, TLS and SCRAM-SHA-512 each, then one Metadata answered): seconds until
  all are in, and the agent's resident memory before and with them;
* the ACL check on the Produce path: the agent's CPU seconds per million records produced over PLAINTEXT with
  `--authorizer acl` (an ACL allowing the producer) against an agent without, both new, each alone in a cluster of its
  own (so every request reaches the agent measured), alternating after a warm-up;
* requests other than ApiVersions, SaslHandshake and SaslAuthenticate answered before authentication (pipelined
  Metadata and Produce frames sent behind an ApiVersions on a raw connection): 0.
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import psutil
import scramp
import trustme
from confluent_kafka import Producer
from kafka.record.default_records import DefaultRecordBatchBuilder

from logcompact.catalog import Catalog
from logcompact.catalog.acls import AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from logcompact.kafka.authorizer import AclAuthorizer, AuthorizerSettings
from logcompact.kafka.session import Session
from logcompact.store import open_store

USER, PASSWORD, ADMIN = "bench", "bench-secret-0", "admin"
MECHANISM = "SCRAM-SHA-512"
CONNECTIONS = 100  # new connections timed
CLIENTS = 500  # authenticating at once


class Certificates:
    """A CA and the agent's certificate for 127.0.0.1 and localhost, as PEM files in `directory`."""

    def __init__(self, directory: Path) -> None:
        authority = trustme.CA()
        served = authority.issue_cert("127.0.0.1", "localhost")
        self.ca = directory / "ca.pem"
        self.cert = directory / "agent.pem"
        self.key = directory / "agent.key"
        authority.cert_pem.write_to_path(str(self.ca))
        served.private_key_pem.write_to_path(str(self.key))
        served.cert_chain_pems[0].write_to_path(str(self.cert))


def client_settings(ca: Path) -> dict[str, str]:
    """librdkafka's (and kcat's) settings for SASL_SSL with SCRAM-SHA-512."""
    return {"security.protocol": "SASL_SSL", "sasl.mechanism": MECHANISM, "sasl.username": USER, "sasl.password": PASSWORD,
            "ssl.ca.location": str(ca)}


@contextmanager
def security_agent(directory: Path, store: str, certificates: Certificates, *options: str) -> Iterator[tuple[dict[str, str], psutil.Process]]:
    """An agent process with a PLAINTEXT and a SASL_SSL listener: (its listeners' addresses by name, its process)."""
    command = [sys.executable, "-m", "logcompact", "--store", store, "agent", "--listen", "127.0.0.1:0", "--listen", "SASL_SSL://127.0.0.1:0",
               "--ssl-certfile", str(certificates.cert), "--ssl-keyfile", str(certificates.key), "--sasl-mechanisms", MECHANISM,
               "--max-connections", "2000", "--max-connections-per-ip", "1500", *options]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"the agent did not start: {' '.join(command)} exited with {process.wait()}")
        yield json.loads(line)["listeners"], psutil.Process(process.pid)
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            print("the agent did not stop within 60 s of SIGTERM: killed", flush=True)


def add_user(store: str, name: str, password: str) -> None:
    subprocess.run([sys.executable, "-m", "logcompact", "--store", store, "user", "add", name, "--mechanism", MECHANISM, "--password-stdin"],
                   input=password, text=True, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})


def first_produce_answered(bootstrap: str, topic: str, settings: dict[str, str]) -> float:
    """Milliseconds from creating a producer to the delivery report of its first record (acks=all)."""
    started = time.perf_counter()
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all", "linger.ms": 0, **settings})
    delivered: list[float] = []
    producer.produce(topic, b"v", b"k", partition=0, on_delivery=lambda error, _m: delivered.append(time.perf_counter()) if error is None else None)
    producer.flush(30)
    if not delivered:
        raise SystemExit(f"no delivery report from {bootstrap} within 30 s")
    return (delivered[0] - started) * 1000


# -- raw Kafka frames, for the clients authenticating at once and the requests sent before authentication --------------


def request_frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    """A request with header v1 (every API here is non-flexible at the versions sent)."""
    client_id = b"bench"
    header = struct.pack(">hhih", api_key, version, correlation_id, len(client_id)) + client_id
    return struct.pack(">i", len(header) + len(body)) + header + body


def string(text: str) -> bytes:
    data = text.encode()
    return struct.pack(">h", len(data)) + data


def sized_bytes(data: bytes) -> bytes:
    return struct.pack(">i", len(data)) + data


API_VERSIONS = request_frame(18, 0, 1, b"")
METADATA_ALL = request_frame(3, 0, 2, struct.pack(">i", 0))  # v0: an empty list asks for every topic


async def read_frame(reader: asyncio.StreamReader) -> bytes:
    size = struct.unpack(">i", await reader.readexactly(4))[0]
    return await reader.readexactly(size)


async def authenticate(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """ApiVersions, SaslHandshake v1 and SCRAM-SHA-512 through SaslAuthenticate v1, as librdkafka does."""
    writer.write(API_VERSIONS)
    await read_frame(reader)
    writer.write(request_frame(17, 1, 2, string(MECHANISM)))
    answer = await read_frame(reader)
    if struct.unpack(">h", answer[4:6])[0] != 0:
        raise RuntimeError(f"SaslHandshake answered error {struct.unpack('>h', answer[4:6])[0]}")
    client = scramp.ScramClient([MECHANISM], USER, PASSWORD)
    message = client.get_client_first()
    for correlation_id in (3, 4):
        writer.write(request_frame(36, 1, correlation_id, sized_bytes(message.encode())))
        answer = await read_frame(reader)
        error = struct.unpack(">h", answer[4:6])[0]
        at = 6
        text_size = struct.unpack(">h", answer[at:at + 2])[0]
        at += 2 + max(text_size, 0)
        if error:
            raise RuntimeError(f"SaslAuthenticate answered error {error}: {answer[8:8 + max(text_size, 0)].decode()}")
        token_size = struct.unpack(">i", answer[at:at + 4])[0]
        token = answer[at + 4:at + 4 + token_size].decode()
        if correlation_id == 3:
            client.set_server_first(token)
            message = client.get_client_final()
        else:
            client.set_server_final(token)


def produce_frame(topic: str, correlation_id: int) -> bytes:
    """Produce v3, acks=1, one record to partition 0 (a batch as kafka-python's producer builds it)."""
    builder = DefaultRecordBatchBuilder(magic=2, compression_type=0, is_transactional=False, producer_id=-1, producer_epoch=-1,
                                        base_sequence=-1, batch_size=1 << 16)
    builder.append(0, timestamp=int(time.time() * 1000), key=b"k", value=b"v", headers=[])
    batch = bytes(builder.build())
    body = (struct.pack(">hhi", -1, 1, 30_000) + struct.pack(">i", 1) + string(topic) + struct.pack(">i", 1)
            + struct.pack(">i", 0) + sized_bytes(batch))
    return request_frame(0, 3, correlation_id, body)


async def first_produce_answered_raw(address: str, topic: str, ca: Path | None) -> float:
    """Milliseconds from opening a connection to the answer of its first Produce (acks=1): TCP, then with `ca` TLS and
    SCRAM-SHA-512 as librdkafka does them, ApiVersions, one Produce. A Produce answered with an error raises."""
    host, port = address.rsplit(":", 1)
    started = time.perf_counter()
    reader, writer = await asyncio.open_connection(host, int(port), ssl=None if ca is None else ssl.create_default_context(cafile=str(ca)))
    try:
        if ca is None:
            writer.write(API_VERSIONS)
            await read_frame(reader)
        else:
            await authenticate(reader, writer)
        writer.write(produce_frame(topic, 9))
        answer = await read_frame(reader)
        elapsed = (time.perf_counter() - started) * 1000
    finally:
        writer.close()
    # the answer: correlation id, topics (1), name, partitions (1), index, error code
    at = 4 + 4 + 2 + struct.unpack_from(">h", answer, 8)[0] + 4 + 4
    if (error := struct.unpack_from(">h", answer, at)[0]) != 0:
        raise SystemExit(f"the first Produce on a new connection to {address} answered error {error}")
    return elapsed


async def one_client(host: str, port: int, context: ssl.SSLContext, connected: list[asyncio.StreamWriter]) -> None:
    reader, writer = await asyncio.open_connection(host, port, ssl=context)
    await authenticate(reader, writer)
    writer.write(request_frame(3, 0, 5, struct.pack(">i", 0)))
    await read_frame(reader)
    connected.append(writer)


async def many_authenticating(address: str, ca: Path, clients: int, process: psutil.Process) -> tuple[float, int, int]:
    """(seconds until `clients` connections are all authenticated and answered a Metadata, the agent's resident memory
    before and with them all open)."""
    host, port = address.rsplit(":", 1)
    context = ssl.create_default_context(cafile=str(ca))
    before = process.memory_info().rss
    connected: list[asyncio.StreamWriter] = []
    started = time.perf_counter()
    await asyncio.gather(*(one_client(host, int(port), context, connected) for _ in range(clients)))
    elapsed = time.perf_counter() - started
    with_them = process.memory_info().rss
    for writer in connected:
        writer.close()
    return elapsed, before, with_them


async def answered_before_authentication(address: str, ca: Path) -> int:
    """Answers to ApiVersions, then Metadata and Produce sent in the same write before any SASL: the agent answers
    ApiVersions only, then closes. Returns how many answers other than ApiVersions' came."""
    host, port = address.rsplit(":", 1)
    reader, writer = await asyncio.open_connection(host, int(port), ssl=ssl.create_default_context(cafile=str(ca)))
    produce = request_frame(0, 3, 3, struct.pack(">hhi", -1, -1, 1000) + struct.pack(">i", 0))  # v3: no transactional id, acks=-1, no topics
    writer.write(API_VERSIONS + METADATA_ALL + produce)
    answers = 0
    try:
        while True:
            frame = await asyncio.wait_for(read_frame(reader), 10)
            if struct.unpack(">i", frame[:4])[0] != 1:
                answers += 1
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    writer.close()
    return answers


def acl_check_seconds(checks: int = 200_000) -> float:
    """Seconds of one Produce request's ACL check as the handler makes it (`denied_topics`: WRITE on its topic),
    answered from the authorizer's memo, among 1,000 other bindings, in this process."""
    authorizer = AclAuthorizer(None, AuthorizerSettings("acl", (f"User:{ADMIN}",)))
    others = [AclBinding(ResourceType.TOPIC, f"team-{n}-", PatternType.PREFIXED, f"User:team-{n}", "*", AclOperation.WRITE, AclPermissionType.ALLOW)
              for n in range(1000)]
    authorizer.load([*others, AclBinding(ResourceType.TOPIC, "acl-", PatternType.PREFIXED, "User:ANONYMOUS", "*", AclOperation.WRITE,
                                         AclPermissionType.ALLOW)])
    session = Session("PLAINTEXT", "127.0.0.1")
    started = time.perf_counter()
    for _ in range(checks):
        if authorizer.denied_topics(session, AclOperation.WRITE, ("acl-topic",)):
            raise SystemExit("the bench's ACL does not allow its topic")
    return (time.perf_counter() - started) / checks


def produce_cpu_seconds(process: psutil.Process, produce: object) -> float:
    """The agent's CPU seconds (user and system) while `produce()` runs."""
    before = process.cpu_times()
    produce()  # type: ignore[operator]
    after = process.cpu_times()
    return (after.user - before.user) + (after.system - before.system)


def cluster_store(directory: Path, name: str) -> str:
    """A new cluster's store (and catalog) in `directory`, with the bench's user: an agent alone in it is every
    partition's leader, so clients send it all their requests."""
    store = f"file://{directory / name}"
    Catalog(open_store(store)).ensure_created(int(time.time() * 1000))
    add_user(store, USER, PASSWORD)
    return store


@contextmanager
def security_cluster(directory: Path) -> Iterator[tuple[str, Certificates, ExitStack]]:
    store = cluster_store(directory, "security-store")
    certificates_dir = directory / "certificates"
    certificates_dir.mkdir(exist_ok=True)
    with ExitStack() as stack:
        yield store, Certificates(certificates_dir), stack
