"""Fetch through `logcompact agent`: confluent-kafka, kcat and kafka-python consumers, and raw requests
of every version (4-12) decoded by kio, over produced and compacted partitions."""

from __future__ import annotations

import io
import random
import shutil
import struct
import subprocess
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer, TopicPartition
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition
from kafka.record import MemoryRecords
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from logcompact.catalog import Catalog
from logcompact.consume import ConsumedRecord, read_records
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.kafka.codec import build
from tests.helpers import NOW, create_topic, full_sweep
from tests.kafka.agents import FLUSH_MS, RunningAgent, confluent_consumer, consume
from tests.kafka.wire import TIMESTAMP, connect, receive_frame

pytestmark = pytest.mark.timeout(60)

NONE, OFFSET_OUT_OF_RANGE, UNKNOWN_TOPIC_OR_PARTITION, NOT_LEADER_OR_FOLLOWER, FETCH_SESSION_ID_NOT_FOUND = 0, 1, 3, 6, 70
# "state", partition 0: keys written in this order at offsets 0-9, then compacted: each key's latest survives.
HISTORY = [b"a", b"b", b"c", b"b", b"d", b"c", b"c", b"e", b"b", b"f"]
SURVIVORS = [0, 4, 6, 7, 8, 9]  # a (0), d (4), c (6), e (7), b (8), f (9)


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy="compact")
    create_topic(catalog, "state", 1, cleanup_policy="compact")
    return catalog


def produce(catalog: Catalog, topic: str, records: list[Record]) -> list[int]:
    with Agent(catalog, background=False) as ingest:
        future = ingest.produce(topic, records)
    return future.result()


def compacted_state(catalog: Catalog, first_key: bytes = b"a") -> list[ConsumedRecord]:
    """HISTORY produced to "state" (`first_key` at offset 0) in two files, compacted by a full sweep."""
    keys = [first_key, *HISTORY[1:]]
    produce(catalog, "state", [Record(0, key, b"%s@%d" % (key, offset), NOW - 60_000 + offset, [("n", b"%d" % offset)]) for offset, key in enumerate(keys[:5])])
    produce(catalog, "state", [Record(0, key, b"%s@%d" % (key, offset), NOW - 60_000 + offset, [("n", b"%d" % offset)]) for offset, key in enumerate(keys[5:], 5)])
    plan = full_sweep(catalog.planning_snapshot(NOW), NOW)
    assert plan is not None
    run_and_commit(catalog, plan, NOW)
    return list(read_records(catalog.store, catalog.snapshot(), "state", 0))


def as_consumed(message: Message) -> ConsumedRecord:
    return ConsumedRecord(message.offset(), message.timestamp()[1], message.key(), message.value(), message.headers() or [])


# -- raw requests -----------------------------------------------------------------------------------------


def fetch(agent: RunningAgent, version: int, partitions: dict[tuple[str, int], int], **fields: Any) -> tuple[Any, dict[tuple[str, int], Any]]:
    """One Fetch of `version` from each (topic, partition)'s offset: the response and its partitions."""
    topics: dict[str, list[dict]] = {}
    for (topic, index), offset in partitions.items():
        topics.setdefault(topic, []).append({"partition": index, "fetch_offset": offset, "partition_max_bytes": fields.pop(f"max_{topic}_{index}", 1 << 20)})
    request_class = load_request_schema(1, version)
    header_class = RequestHeaderV2 if request_class.__flexible__ else RequestHeaderV1
    message = io.BytesIO()
    entity_writer(header_class)(message, header_class(request_api_key=1, request_api_version=version, correlation_id=7, client_id="test"))
    body = {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 24, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": name, "partitions": entries} for name, entries in topics.items()], "forgotten_topics_data": [], "rack_id": "", **fields}
    entity_writer(request_class)(message, build(request_class, body))
    with connect(agent.server) as connection:
        connection.settimeout(30)
        connection.sendall(struct.pack(">i", len(message.getvalue())) + message.getvalue())
        frame = receive_frame(connection)
    response_class = load_response_schema(1, version)
    header, size = entity_reader(response_class.__header_schema__)(frame, 0)
    response, body_size = entity_reader(response_class)(frame, size)
    assert int(header.correlation_id) == 7 and size + body_size == len(frame)
    return response, {(topic.topic, int(p.partition_index)): p for topic in response.responses for p in topic.partitions}


def batches(records: bytes | None) -> list[list[ConsumedRecord]]:
    """The record batches of a Fetch response, each as its records."""
    found, memory = [], MemoryRecords(records or b"")
    while (batch := memory.next_batch()) is not None:
        found.append([ConsumedRecord(r.offset, r.timestamp, r.key, r.value, list(r.headers)) for r in batch])
    return found


def offsets(records: bytes | None) -> list[int]:
    return [record.offset for batch in batches(records) for record in batch]


# -- real clients -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("acks", ["1", "all"])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_confluent_kafka_consumer_reads_what_its_producer_wrote(agent: RunningAgent, catalog: Catalog, codec: str, acks: str) -> None:
    producer = Producer({"bootstrap.servers": agent.bootstrap, "enable.idempotence": False, "compression.type": codec, "acks": acks, "linger.ms": 5})
    sent = [ConsumedRecord(i, TIMESTAMP + 1000 * i, b"k%d" % i, None if i == 3 else b"value-%d" % i * 20, [("trace", b"t%d" % i), ("empty", b"")]) for i in range(5)]
    for record in sent:
        producer.produce("orders", key=record.key, value=record.value, partition=1, headers=record.headers, timestamp=record.timestamp)
    assert producer.flush(10) == 0
    assert list(read_records(catalog.store, catalog.snapshot(), "orders", 1)) == sent
    consumer = confluent_consumer(agent)
    try:
        consumer.assign([TopicPartition("orders", 1, 0)])
        assert [as_consumed(message) for message in consume(consumer, 5)] == sent
    finally:
        consumer.close()


def test_kcat_consumes_what_kcat_produced(agent: RunningAgent) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    lines = "a:1\nb:2\na:3\n"
    produced = subprocess.run(["kcat", "-b", agent.bootstrap, "-P", "-t", "orders", "-p", "0", "-K:"], input=lines, capture_output=True, text=True, timeout=30)
    assert produced.returncode == 0, produced.stderr
    consumed = subprocess.run(["kcat", "-b", agent.bootstrap, "-C", "-t", "orders", "-p", "0", "-o", "beginning", "-e", "-K:", "-f", "%k:%s:%o\n"],
                              capture_output=True, text=True, timeout=30)
    assert consumed.returncode == 0, consumed.stderr
    assert consumed.stdout == "a:1:0\nb:2:1\na:3:2\n"


def test_kafka_python_consumer_assign_and_seek(agent: RunningAgent, catalog: Catalog) -> None:
    produce(catalog, "orders", [Record(0, b"k%d" % i, b"v%d" % i, TIMESTAMP + i, [("h", b"%d" % i)]) for i in range(6)])
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        partition = KafkaPythonTopicPartition("orders", 0)
        consumer.assign([partition])
        consumer.seek(partition, 2)
        read = [(message.offset, message.key, message.value, message.timestamp, list(message.headers)) for message in consumer]
    finally:
        consumer.close()
    assert read == [(i, b"k%d" % i, b"v%d" % i, TIMESTAMP + i, [("h", b"%d" % i)]) for i in range(2, 6)]


def test_a_compacted_partition_is_consumed_with_its_gaps_to_the_end(agent: RunningAgent, catalog: Catalog) -> None:
    survivors = compacted_state(catalog)
    assert [record.offset for record in survivors] == SURVIVORS
    consumer = confluent_consumer(agent)
    try:
        consumer.assign([TopicPartition("state", 0, 0)])
        assert [as_consumed(message) for message in consume(consumer, len(survivors))] == survivors
        consumer.assign([TopicPartition("state", 0, 1)])  # in a hole: the next record that exists
        assert [message.offset() for message in consume(consumer, 4)] == SURVIVORS[1:]
    finally:
        consumer.close()
    python_consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        python_consumer.assign([KafkaPythonTopicPartition("state", 0)])
        python_consumer.seek(KafkaPythonTopicPartition("state", 0), 2)
        assert [message.offset for message in python_consumer] == SURVIVORS[1:]
    finally:
        python_consumer.close()


@pytest.mark.parametrize("reset", ["earliest", "latest"])
def test_a_compacted_away_head_is_read_on_from_the_next_record_whatever_auto_offset_reset(agent: RunningAgent, catalog: Catalog, reset: str) -> None:
    """Compaction never moves the log start (Kafka's rule): offset 0, overwritten by a later "b", is gone, and a
    consumer there reads on from 4 instead of being reset (to the end, with `latest`, it would skip them all)."""
    assert [record.offset for record in compacted_state(catalog, first_key=b"b")] == [4, 6, 7, 8, 9]
    consumer = confluent_consumer(agent, **{"auto.offset.reset": reset})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("state", 0), timeout=10, cached=False) == (0, 10)
        consumer.assign([TopicPartition("state", 0, 0)])
        assert [message.offset() for message in consume(consumer, 5)] == [4, 6, 7, 8, 9]
    finally:
        consumer.close()


@pytest.mark.parametrize(("reset", "expected"), [("earliest", [3, 4]), ("latest", [])])
def test_an_offset_below_a_log_start_raised_by_retention_is_out_of_range_and_auto_offset_reset_applies(
    agent: RunningAgent, catalog: Catalog, reset: str, expected: list[int],
) -> None:
    """A delete topic's records past retention.ms are removed by a compaction, which raises its log start."""
    create_topic(catalog, "expiring", 1, cleanup_policy="delete", retention_ms="60000")
    produce(catalog, "expiring", [Record(0, b"k", b"%d" % n, NOW - 120_000 + n) for n in range(3)])
    produce(catalog, "expiring", [Record(0, b"k", b"%d" % n, NOW - 1_000 + n) for n in range(3, 5)])
    plan = full_sweep(catalog.planning_snapshot(NOW), NOW)
    assert plan is not None
    run_and_commit(catalog, plan, NOW)
    assert catalog.log_offsets("expiring") == [(3, 5, 5)]
    consumer = confluent_consumer(agent, **{"auto.offset.reset": reset})
    try:
        consumer.assign([TopicPartition("expiring", 0, 1)])
        assert [message.offset() for message in consume(consumer, len(expected))] == expected
    finally:
        consumer.close()


def test_a_consumer_waiting_at_the_end_gets_a_new_record_at_once(agent: RunningAgent) -> None:
    """Long polling: librdkafka's fetch waits (fetch.wait.max.ms) wake on the commit of the new record."""
    consumer = confluent_consumer(agent, **{"fetch.wait.max.ms": 5000})
    producer = Producer({"bootstrap.servers": agent.bootstrap, "enable.idempotence": False, "linger.ms": 0})
    try:
        consumer.assign([TopicPartition("orders", 0, 0)])  # its first fetch, of an empty partition, waits up to 5 s
        produced_at: list[float] = []

        def produce_later() -> None:
            time.sleep(1)
            produced_at.append(time.monotonic())
            producer.produce("orders", key=b"late", value=b"1", partition=0)
            producer.flush(10)

        producing = threading.Thread(target=produce_later)
        producing.start()
        message = None
        while message is None or message.error():
            message = consumer.poll(5)
        received_at = time.monotonic()
        producing.join()
        assert message.key() == b"late"
        assert received_at - produced_at[0] < 1.5
    finally:
        consumer.close()


# -- raw requests -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("version", range(4, 13))
def test_every_fetch_version_answers_records_offsets_and_watermarks(agent: RunningAgent, catalog: Catalog, version: int) -> None:
    survivors = compacted_state(catalog)
    response, partitions = fetch(agent, version, {("state", 0): 0, ("state", 5): 0, ("missing", 0): 0})
    state = partitions[("state", 0)]
    assert (int(state.error_code), state.high_watermark) == (NONE, 10)
    assert state.last_stable_offset == 10  # no transactions: the high watermark
    assert [record for batch in batches(state.records) for record in batch] == survivors
    if version >= 5:
        assert state.log_start_offset == 0
    if version >= 7:
        assert (int(response.error_code), response.session_id) == (NONE, 0)
    if version >= 11:
        assert state.preferred_read_replica == -1
    assert state.aborted_transactions is None  # read_uncommitted
    assert int(partitions[("state", 5)].error_code) == UNKNOWN_TOPIC_OR_PARTITION
    assert int(partitions[("missing", 0)].error_code) == UNKNOWN_TOPIC_OR_PARTITION


def test_offsets_in_holes_at_the_end_and_out_of_range(agent: RunningAgent, catalog: Catalog) -> None:
    compacted_state(catalog, first_key=b"b")  # live: 4, 6, 7, 8, 9; high watermark 10
    for asked, error, found in [(0, NONE, [4, 6, 7, 8, 9]), (5, NONE, [6, 7, 8, 9]), (9, NONE, [9]), (10, NONE, []), (11, OFFSET_OUT_OF_RANGE, [])]:
        _, partitions = fetch(agent, 12, {("state", 0): asked})
        state = partitions[("state", 0)]
        assert (asked, int(state.error_code), offsets(state.records), state.high_watermark, state.log_start_offset) == (asked, error, found, 10, 0)
    _, partitions = fetch(agent, 12, {("orders", 1): 0})
    assert (int(partitions[("orders", 1)].error_code), partitions[("orders", 1)].high_watermark) == (NONE, 0)  # empty partition: at its end


def test_byte_limits_hold_but_the_first_batch_comes_whole(agent: RunningAgent, catalog: Catalog) -> None:
    big = b"x" * 1000
    for partition in (0, 1):
        produce(catalog, "orders", [Record(partition, b"k%d" % i, big, TIMESTAMP) for i in range(10)])
    # max_bytes below one record: the first partition's first record whole, nothing more
    _, partitions = fetch(agent, 12, {("orders", 0): 0, ("orders", 1): 0}, max_bytes=100)
    assert (offsets(partitions[("orders", 0)].records), offsets(partitions[("orders", 1)].records)) == ([0], [])
    # per partition limits: about 2.5 records each, within the limit
    _, partitions = fetch(agent, 12, {("orders", 0): 3, ("orders", 1): 0}, max_orders_0=2500, max_orders_1=2500)
    assert (offsets(partitions[("orders", 0)].records), offsets(partitions[("orders", 1)].records)) == ([3, 4], [0, 1])
    assert all(len(partitions[("orders", p)].records) <= 2500 for p in (0, 1))
    # the response's limit across partitions
    _, partitions = fetch(agent, 12, {("orders", 0): 0, ("orders", 1): 0}, max_bytes=5000)
    assert len(offsets(partitions[("orders", 0)].records)) + len(offsets(partitions[("orders", 1)].records)) == 4


def test_partitions_read_at_once_answer_as_partitions_read_in_order(agent: RunningAgent, catalog: Catalog) -> None:
    # Partitions whose limits fit max_bytes are read at once, each as if first: the first-batch rule still holds for
    # the response's first records only, and a partition after one that took more than its limit gets what is left.
    for partition in (0, 1):
        produce(catalog, "orders", [Record(partition, b"k%d" % i, b"y" * (3000 if i == 0 else 100), TIMESTAMP) for i in range(5)])
    _, partitions = fetch(agent, 12, {("orders", 0): 0, ("orders", 1): 0}, max_orders_0=1000, max_orders_1=1000)
    assert (offsets(partitions[("orders", 0)].records), offsets(partitions[("orders", 1)].records)) == ([0], [])
    _, partitions = fetch(agent, 12, {("orders", 0): 1, ("orders", 1): 1}, max_orders_0=1000, max_orders_1=1000)
    assert (offsets(partitions[("orders", 0)].records), offsets(partitions[("orders", 1)].records)) == ([1, 2, 3, 4], [1, 2, 3, 4])
    # The first partition's record takes 3,072 bytes (a 61-byte header, 3,011 of record) of the response's 3,517: the
    # second gets what fits in the 445 left, 3 records of 111 bytes in a batch (61 + 333), not its 1,000.
    _, partitions = fetch(agent, 12, {("orders", 0): 0, ("orders", 1): 1}, max_bytes=3517, max_orders_0=1000, max_orders_1=1000)
    first, second = partitions[("orders", 0)].records, partitions[("orders", 1)].records
    assert (len(first), offsets(first), len(second), offsets(second)) == (3072, [0], 394, [1, 2, 3])


def test_a_fetch_waits_for_min_bytes_up_to_max_wait(agent: RunningAgent, catalog: Catalog) -> None:
    started = time.monotonic()
    _, partitions = fetch(agent, 12, {("orders", 0): 0}, max_wait=400, min_bytes=1)
    assert partitions[("orders", 0)].records in (b"", None) and 0.35 < time.monotonic() - started < 3
    threading.Timer(0.5, produce, (catalog, "orders", [Record(0, b"k", b"v", TIMESTAMP)])).start()
    started = time.monotonic()
    _, partitions = fetch(agent, 12, {("orders", 0): 0}, max_wait=10_000, min_bytes=1)
    assert offsets(partitions[("orders", 0)].records) == [0] and time.monotonic() - started < 3


def test_followers_and_unknown_sessions_get_kafkas_errors(agent: RunningAgent) -> None:
    _, partitions = fetch(agent, 12, {("orders", 0): 0}, replica_id=1)
    assert int(partitions[("orders", 0)].error_code) == NOT_LEADER_OR_FOLLOWER
    response, partitions = fetch(agent, 12, {("orders", 0): 0}, session_id=12, session_epoch=1)  # incremental
    assert (int(response.error_code), partitions) == (FETCH_SESSION_ID_NOT_FOUND, {})
    for session_id, epoch in [(0, 0), (12, 0), (12, -1)]:  # full fetches, opening or closing a session: sessionless
        response, partitions = fetch(agent, 12, {("orders", 0): 0}, session_id=session_id, session_epoch=epoch)
        assert (int(response.error_code), response.session_id, int(partitions[("orders", 0)].error_code)) == (NONE, 0, NONE)


def test_a_trailing_hole_is_covered_so_consumers_reach_the_end(agent: RunningAgent, catalog: Catalog) -> None:
    """The partition's last records compacted away (a key and its tombstone, past delete.retention.ms): a control
    batch covers their offsets, its one COMMIT marker at the last, so consumers move to the high watermark, and
    librdkafka's consumer position too (it moves past a control record it skips, never past a batch of no
    records: quixstreams' changelog recovery waits for the position to reach the high watermark)."""
    create_topic(catalog, "gone", 1, cleanup_policy="compact", delete_retention_ms="0")
    produce(catalog, "gone", [Record(0, b"a", b"1", NOW - 60_000), Record(0, b"b", b"2", NOW - 60_000), Record(0, b"b", None, NOW - 60_000)])
    for now in (NOW, NOW + 1):  # the first sweep keeps the tombstone, the second removes it
        plan = full_sweep(catalog.planning_snapshot(now), now)
        assert plan is not None
        run_and_commit(catalog, plan, now)
    assert [record.offset for record in read_records(catalog.store, catalog.snapshot(), "gone", 0)] == [0]
    for fetch_offset, record_offsets in [(0, [0]), (1, [])]:
        _, partitions = fetch(agent, 12, {("gone", 0): fetch_offset})
        memory = MemoryRecords(partitions[("gone", 0)].records)
        found = []
        while (batch := memory.next_batch()) is not None:
            found.append((batch.is_control_batch, batch.base_offset, batch.last_offset, [(r.offset, getattr(r, "commit", None)) for r in batch]))
        # the records, then a control batch over the hole: one COMMIT marker at its last offset
        assert found == [(False, 0, 0, [(0, None)])][: len(record_offsets)] + [(True, 1, 2, [(2, True)])]
    for start in (0, 1):
        consumer = confluent_consumer(agent)
        try:
            consumer.assign([TopicPartition("gone", 0, start)])
            end = None
            while end is None or not end.error():
                end = consumer.poll(5)
            assert (end.error().code(), end.offset()) == (KafkaError._PARTITION_EOF, 3)  # moved past the hole, to the end
            assert consumer.position([TopicPartition("gone", 0)])[0].offset == 3
        finally:
            consumer.close()
    python_consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False, consumer_timeout_ms=2000)
    try:
        python_consumer.assign([KafkaPythonTopicPartition("gone", 0)])
        python_consumer.seek(KafkaPythonTopicPartition("gone", 0), 1)
        assert list(python_consumer) == []
        assert python_consumer.position(KafkaPythonTopicPartition("gone", 0)) == 3
    finally:
        python_consumer.close()


def test_stopping_answers_waiting_fetches_at_once(catalog: Catalog) -> None:
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    answered: list[tuple[float, Any]] = []

    def wait_long() -> None:
        _, partitions = fetch(running, 12, {("orders", 0): 0}, max_wait=20_000, min_bytes=1)
        answered.append((time.monotonic(), partitions[("orders", 0)]))

    waiting = threading.Thread(target=wait_long)
    waiting.start()
    time.sleep(0.5)
    stopping = time.monotonic()
    running.stop()
    waiting.join(timeout=10)
    ((at, partition),) = answered
    assert at - stopping < 2 and (int(partition.error_code), partition.high_watermark) == (NONE, 0)


# -- batches encoded from columns, the cache of file ranges ------------------------------------------------


def varied_records(count: int) -> list[Record]:
    """Records whose fields cross the varint size boundaries (63/64, 8191/8192 bytes), with null and empty keys, null
    and empty values, null header values and timestamps going backwards (negative deltas)."""
    lengths = [0, 1, 63, 64, 127, 128, 8191, 8192, 20_000]
    found = []
    for n in range(count):
        key = None if n % 7 == 3 else b"" if n % 11 == 5 else b"k%d" % n
        value = None if n % 5 == 2 else bytes([n % 251]) * lengths[n % len(lengths)]
        headers = [] if n % 3 else [("trace", b"t%d" % n), ("none", None), ("", b"")]
        found.append(Record(0, key, value, TIMESTAMP + (n * 7919) % 5000 - 2500, headers))
    return found


def python_consumed(agent: RunningAgent, topic: str, count: int) -> list[ConsumedRecord]:
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, enable_auto_commit=False, consumer_timeout_ms=3000)
    try:
        consumer.assign([KafkaPythonTopicPartition(topic, 0)])
        consumer.seek_to_beginning(KafkaPythonTopicPartition(topic, 0))
        read = [ConsumedRecord(m.offset, m.timestamp, m.key, m.value, list(m.headers)) for m in consumer]
    finally:
        consumer.close()
    assert len(read) == count
    return read


def test_batches_from_columns_keep_every_field_as_stored(agent: RunningAgent, catalog: Catalog) -> None:
    create_topic(catalog, "varied", 1, cleanup_policy="delete")  # keyless records allowed
    produce(catalog, "varied", varied_records(600))
    produce(catalog, "varied", [Record(0, b"big", b"b" * (1_500_000), TIMESTAMP)])  # larger than a batch (1 MiB)
    produce(catalog, "varied", varied_records(50))
    stored = list(read_records(catalog.store, catalog.snapshot(), "varied", 0))
    assert len(stored) == 651
    consumer = confluent_consumer(agent)
    try:
        consumer.assign([TopicPartition("varied", 0, 0)])
        assert [as_consumed(message) for message in consume(consumer, 651)] == stored
    finally:
        consumer.close()
    assert python_consumed(agent, "varied", 651) == stored
    _, partitions = fetch(agent, 12, {("varied", 0): 0}, max_varied_0=1 << 24)
    memory, sizes = MemoryRecords(partitions[("varied", 0)].records), []
    while (batch := memory.next_batch()) is not None:
        assert batch.validate_crc()
        sizes.append(batch.size_in_bytes)
    assert max(sizes) < 1_600_000 and sorted(sizes)[-2] <= 1 << 20  # the big record alone in its batch, others within 1 MiB


def test_a_compacted_partition_of_many_records_reads_with_its_holes_from_files(agent: RunningAgent, catalog: Catalog) -> None:
    """Thousands of records across two files, compacted (the survivors spread over holes), read by both clients from
    the beginning and from inside holes, in responses cut by partition_max_bytes."""
    chosen = random.Random(20)
    keys = [b"key-%d" % chosen.randrange(1500) for _ in range(5000)]  # each key's last write anywhere: holes everywhere
    produce(catalog, "state", [Record(0, key, b"v%d" % n * 10, TIMESTAMP + n, [("n", b"%d" % n)]) for n, key in enumerate(keys[:2500])])
    produce(catalog, "state", [Record(0, key, None if n % 13 == 0 else b"v%d" % n * 10, TIMESTAMP + n) for n, key in enumerate(keys[2500:], 2500)])
    plan = full_sweep(catalog.planning_snapshot(NOW), NOW)
    assert plan is not None
    run_and_commit(catalog, plan, NOW)
    stored = list(read_records(catalog.store, catalog.snapshot(), "state", 0))
    survivors = len(set(keys))
    assert len(stored) == survivors and stored[-1].offset == 4999 and any(r.value is None for r in stored)  # tombstones kept
    limits = {"max.partition.fetch.bytes": 4096, "fetch.max.bytes": 8192, "message.max.bytes": 8192}
    consumer = confluent_consumer(agent, **limits, **{"auto.offset.reset": "earliest"})
    try:
        consumer.assign([TopicPartition("state", 0, 0)])  # below the log start (offset 0 was overwritten): from the earliest
        assert [as_consumed(message) for message in consume(consumer, survivors, timeout=30)] == stored
    finally:
        consumer.close()
    assert python_consumed(agent, "state", survivors) == stored
    assert stored[1].offset > stored[0].offset + 1
    position, read = stored[0].offset + 1, [stored[0].offset]  # the first fetch from inside the hole after the first record
    while position < 5000:  # raw fetches of at most 3,000 bytes each, each answering at least one record
        _, partitions = fetch(agent, 12, {("state", 0): position}, max_state_0=3000)
        records = partitions[("state", 0)].records
        assert 0 < len(records) <= 3000
        memory = MemoryRecords(records)
        while (batch := memory.next_batch()) is not None:
            read.extend(record.offset for record in batch)
            position = batch.last_offset + 1
    assert read == [record.offset for record in stored]


def test_a_second_read_of_the_tail_sends_no_get_and_the_cache_stays_within_its_setting(catalog: Catalog) -> None:
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, fetch_cache_bytes=20_000)
    try:
        produce(catalog, "orders", [Record(0, b"k%d" % i, b"v" * 100, TIMESTAMP) for i in range(20)])
        store, cache = catalog.store, running.server.broker.file_cache
        before = store.counters.snapshot().get
        _, first = fetch(running, 12, {("orders", 0): 10})
        after_first = store.counters.snapshot().get
        _, second = fetch(running, 12, {("orders", 0): 10})
        assert after_first > before and store.counters.snapshot().get == after_first  # the tail again: no GET
        assert offsets(second[("orders", 0)].records) == offsets(first[("orders", 0)].records) == list(range(10, 20))
        for round_ in range(6):  # new files, each read twice: held while they fit, the oldest evicted past 20,000 bytes
            produce(catalog, "orders", [Record(round_ % 2, b"k%d" % i, b"w" * 2000, TIMESTAMP) for i in range(3)])
            for _ in range(2):
                fetch(running, 12, {("orders", 0): 0, ("orders", 1): 0})
                assert 0 < cache.cached_bytes <= 20_000
    finally:
        running.stop()
