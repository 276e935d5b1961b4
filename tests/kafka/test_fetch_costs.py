"""What a Fetch costs the agent with many consumers: responses written from the buffers their batches were encoded in
(byte for byte kio's frame, to a client reading fast or slowly), the partitions' log offsets read from the catalog
once per catalog version (and following every commit), and each block of a file decoded once for all its consumers,
as the agent's Prometheus metrics count them."""

from __future__ import annotations

import io
import os
import random
import socket
import struct
import threading
import time
import urllib.request
from collections.abc import Iterator

import pytest
from confluent_kafka import Consumer, TopicPartition
from kio.index import load_response_schema
from kio.serial import entity_writer
from prometheus_client.parser import text_string_to_metric_families

from logcompact.catalog import Catalog
from logcompact.format import read_footer
from logcompact.ingest import Agent, Record
from logcompact.kafka import codec
from logcompact.kafka.cluster import Address
from logcompact.kafka.served_version import ServedVersion
from tests.helpers import NOW, create_topic
from tests.kafka.agents import FLUSH_MS, RunningAgent, confluent_consumer, consume
from tests.kafka.wire import TIMESTAMP, connect, kio_frame, receive_frame

pytestmark = pytest.mark.timeout(120)

FETCH = 1


def metric(agent: RunningAgent, name: str) -> float:
    """One unlabelled sample of the agent's /metrics."""
    address = agent.server.metrics_address
    assert address is not None
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as answer:
        text = answer.read().decode()
    return next(sample.value for family in text_string_to_metric_families(text) for sample in family.samples if sample.name == name)


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    catalog.ensure_created(NOW)
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, metrics_listen=Address("127.0.0.1", 0))
    try:
        yield running
    finally:
        running.stop()


def produce(catalog: Catalog, topic: str, records: list[Record]) -> None:
    """One L0 file of `records`, committed by a writer of its own (not the agent under test)."""
    with Agent(catalog, background=False) as ingest:
        future = ingest.produce(topic, records)
    future.result()  # committed as the ingest agent closes


# -- the frame writer -------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(4, 13))
def test_a_fetch_response_is_kios_frame_and_keeps_its_batches_uncopied(version: int) -> None:
    rng = random.Random(version)
    buffers = [bytearray(rng.randbytes(rng.choice([0, 100, codec.OWN_PART_BYTES - 1, codec.OWN_PART_BYTES, 300_000]))) for _ in range(6)]
    response_class = load_response_schema(FETCH, version)
    response = codec.build(response_class, {
        "throttle_time": 5, "error_code": 0, "session_id": 0,
        "responses": [{"topic": f"t{n}", "partitions": [
            {"partition_index": p, "error_code": 0, "high_watermark": 10 + p, "last_stable_offset": 10, "log_start_offset": 0,
             "aborted_transactions": None, "preferred_read_replica": -1, "records": memoryview(buffers[3 * n + p])}
            for p in range(3)]} for n in range(2)],
    })
    expected = io.BytesIO()
    entity_writer(response_class.__header_schema__)(expected, response_class.__header_schema__(correlation_id=42))
    entity_writer(response_class)(expected, response)
    parts = codec.encode_response_parts(42, response)
    assert b"".join(parts) == struct.pack(">i", len(expected.getvalue())) + expected.getvalue()
    assert codec.frame_size(parts) == 4 + len(expected.getvalue())
    # every batch of OWN_PART_BYTES or more is a view of its own buffer, never copied; smaller ones go with the fields
    own = [part.obj for part in parts if isinstance(part, memoryview)]
    assert own == [buffer for buffer in buffers if len(buffer) >= codec.OWN_PART_BYTES]


def fetch_frame(agent: RunningAgent, topic: str, partitions: int, receive_buffer: int | None = None, pause: float = 0.0) -> bytes:
    """The raw response frame of one Fetch v12 of every partition from offset 0; with `receive_buffer`, read through a
    socket of that receive buffer, starting `pause` seconds after the request."""
    request = kio_frame(FETCH, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 50 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": topic, "partitions": [{"partition": p, "fetch_offset": 0, "partition_max_bytes": 8 << 20} for p in range(partitions)]}],
        "forgotten_topics_data": [], "rack_id": "",
    }, correlation_id=3)
    with connect(agent.server) as connection:
        connection.settimeout(30)
        if receive_buffer is None:
            connection.sendall(request)
            return receive_frame(connection)
        connection.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer)
        connection.sendall(request)
        time.sleep(pause)  # the agent's writev takes what the socket holds; the transport queues the rest
        size = struct.unpack(">i", connection.recv(4, socket.MSG_WAITALL))[0]
        frame = bytearray()
        while len(frame) < size:
            chunk = connection.recv(size - len(frame))
            assert chunk, "the agent closed the connection mid-frame"
            frame += chunk
        return bytes(frame)


def test_a_large_response_reaches_a_slow_reader_whole_and_identical(agent: RunningAgent, catalog: Catalog) -> None:
    create_topic(catalog, "big", 3)
    rng = random.Random(1)
    produce(catalog, "big", [Record(n % 3, b"k%d" % n, rng.randbytes(2000), TIMESTAMP + n) for n in range(3000)])
    fast = fetch_frame(agent, "big", 3)
    assert len(fast) > 6_000_000  # three partitions' batches, each sent as a part of its own
    slow = fetch_frame(agent, "big", 3, receive_buffer=65536, pause=0.5)
    assert slow == fast
    consumer = confluent_consumer(agent)
    consumer.assign([TopicPartition("big", p, 0) for p in range(3)])
    assert len(consume(consumer, 3000, timeout=60)) == 3000
    consumer.close()


# -- log offsets per catalog version ---------------------------------------------------------------------


def watermarks(consumer: Consumer, partition: int) -> tuple[int, int]:
    """ListOffsets earliest and latest, as confluent-kafka asks them."""
    low, high = consumer.get_watermark_offsets(TopicPartition("orders", partition), timeout=10, cached=False)
    return low, high


def test_log_offsets_are_read_once_per_catalog_version_and_follow_each_commit(agent: RunningAgent, catalog: Catalog) -> None:
    create_topic(catalog, "orders", 2, cleanup_policy="delete")
    produce(catalog, "orders", [Record(0, b"k%d" % n, b"v%d" % n, TIMESTAMP + n) for n in range(5)])
    consumer = confluent_consumer(agent)
    reads = metric(agent, "logcompact_agent_log_offsets_reads_total")
    for _ in range(3):  # ListOffsets and Fetch, at one version: the topic's offsets read once
        assert watermarks(consumer, 0) == (0, 5)
    consumer.assign([TopicPartition("orders", 0, 0)])
    assert [m.offset() for m in consume(consumer, 5)] == list(range(5))
    assert metric(agent, "logcompact_agent_log_offsets_reads_total") == reads + 1
    # A commit by another writer: the next request reads the new version's offsets, and the consumer gets the records.
    produce(catalog, "orders", [Record(0, b"k%d" % n, b"v%d" % n, TIMESTAMP + n) for n in range(5, 8)])
    assert [m.offset() for m in consume(consumer, 3)] == [5, 6, 7]
    assert watermarks(consumer, 0) == (0, 8)
    assert metric(agent, "logcompact_agent_log_offsets_reads_total") == reads + 2
    # DeleteRecords raises the log start in a version of its own: ListOffsets and Fetch follow it.
    catalog.delete_records("orders", {0: 6}, NOW)
    assert watermarks(consumer, 0) == (6, 8)
    consumer.assign([TopicPartition("orders", 0, 6)])
    assert [m.offset() for m in consume(consumer, 2)] == [6, 7]
    assert metric(agent, "logcompact_agent_log_offsets_reads_total") == reads + 3
    consumer.close()


def test_a_version_read_since_the_request_came_is_served_without_asking_the_catalog_again(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """After a wait, the commit watch's version stands for the catalog's: the snapshot and offsets held at it serve the
    request with no read of the catalog's version; at a newer one, both are read again."""
    create_topic(catalog, "orders", 1, cleanup_policy="delete")
    produce(catalog, "orders", [Record(0, b"k0", b"v0", TIMESTAMP)])
    served = ServedVersion(catalog)
    snapshot, offsets = served.read(["orders"])
    latest_version = catalog.latest_version
    asked: list[int] = []

    def counted() -> int:
        asked.append(latest_version())
        return asked[-1]

    monkeypatch.setattr(catalog, "latest_version", counted)
    assert served.read(["orders"], snapshot.version) == (snapshot, offsets) and asked == []
    produce(catalog, "orders", [Record(0, b"k1", b"v1", TIMESTAMP + 1)])
    newer, newer_offsets = served.read(["orders"], latest_version())
    assert newer.version > snapshot.version and newer_offsets["orders"] is not None and newer_offsets["orders"][0].high_watermark == 2


# -- decoded blocks --------------------------------------------------------------------------------------

CONSUMERS = 50


def consume_partitions_at_once(agent: RunningAgent, topic: str, counts: dict[int, int]) -> dict[int, list[int]]:
    """Each partition of `counts` read to its end by a confluent-kafka consumer of its own, all at once: the offsets."""
    start = threading.Barrier(len(counts))
    read: dict[int, list[int]] = {}

    def reading(partition: int) -> None:
        consumer = confluent_consumer(agent)
        start.wait()
        consumer.assign([TopicPartition(topic, partition, 0)])
        read[partition] = [message.offset() for message in consume(consumer, counts[partition], timeout=60)]
        consumer.close()

    threads = [threading.Thread(target=reading, args=(partition,)) for partition in counts]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return read


@pytest.mark.parametrize("cached", [True, False])
def test_fifty_consumers_of_one_l0_file_decode_each_block_once(catalog: Catalog, cached: bool) -> None:
    create_topic(catalog, "wide", CONSUMERS)
    rng = random.Random(2)
    counts = {partition: 30 + partition for partition in range(CONSUMERS)}
    produce(catalog, "wide", [Record(p, b"k%d" % n, rng.randbytes(200), TIMESTAMP + n) for p, count in counts.items() for n in range(count)])
    (data_file,) = catalog.snapshot().files(topics=["wide"])
    footer = read_footer(catalog.store, data_file.key)
    blocks = len(footer.block_offsets)
    # the blocks each partition's section spans: together more than the file holds, as small sections share blocks
    spans = sum(len(footer.blocks_of(section.info)) for section in data_file.sections)
    assert spans > blocks > 1
    settings = {} if cached else {"fetch_block_cache_bytes": 0}
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, metrics_listen=Address("127.0.0.1", 0), **settings)
    try:
        read = consume_partitions_at_once(running, "wide", counts)
        assert read == {partition: list(range(count)) for partition, count in counts.items()}
        decoded = metric(running, "logcompact_agent_fetch_blocks_decoded_total")
        hits = metric(running, "logcompact_agent_fetch_block_cache_hits_total")
        assert (decoded, hits) == ((blocks, spans - blocks) if cached else (spans, 0))
        assert (metric(running, "logcompact_agent_fetch_block_cache_bytes") > 0) == cached
    finally:
        running.stop()


def test_the_block_cache_stays_within_its_budget_and_reads_stay_right(catalog: Catalog) -> None:
    create_topic(catalog, "wide", 8)
    for _ in range(4):  # four files, each of eight sections, read by a consumer of each partition
        produce(catalog, "wide", [Record(p, b"k%d" % n, os.urandom(3000), TIMESTAMP + n) for p in range(8) for n in range(20)])
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, metrics_listen=Address("127.0.0.1", 0), fetch_block_cache_bytes=200_000)
    try:
        read = consume_partitions_at_once(running, "wide", dict.fromkeys(range(8), 80))
        assert read == {partition: list(range(80)) for partition in range(8)}
        assert 0 < metric(running, "logcompact_agent_fetch_block_cache_bytes") <= 200_000
        assert running.server.broker.decoded_blocks.cached_bytes <= 200_000
    finally:
        running.stop()
