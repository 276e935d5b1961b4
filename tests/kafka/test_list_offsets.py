"""ListOffsets through `logcompact agent`: earliest, latest, by timestamp and max timestamp, asked by
confluent-kafka, kafka-python and raw requests of every version, over a partition whose first offsets were
compacted away and whose timestamps are out of order."""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from kafka import KafkaConsumer
from kafka import TopicPartition as KafkaPythonTopicPartition
from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v1.header import RequestHeader as RequestHeaderV1
from kio.schema.request_header.v2.header import RequestHeader as RequestHeaderV2
from kio.serial import entity_reader, entity_writer

from logcompact.catalog import Catalog, CatalogSection, DataFile
from logcompact.consume import read_records, read_sections
from logcompact.format import section_table, write_segment
from logcompact.ingest import Agent, Record
from logcompact.kafka.codec import build
from tests.helpers import NOW, create_topic
from tests.kafka.agents import FAST_CLIENT, RunningAgent
from tests.kafka.wire import connect, receive_frame

pytestmark = pytest.mark.timeout(60)

EARLIEST, LATEST, MAX_TIMESTAMP = -2, -1, -3
NONE, UNKNOWN_TOPIC_OR_PARTITION, INVALID_REQUEST = 0, 3, 42
# Partition 0 of "orders": offsets 0-4 in one L0 file, then compacted to leave 2-4; offsets 5-7 in another.
FIRST_FILE_TIMESTAMPS = [1000, 1010, 1020, 1030, 1040]
SECOND_FILE_TIMESTAMPS = [5000, 4999, 1500]
# (target timestamp, (offset, timestamp) expected): the first record in offset order at or after the target
BY_TIMESTAMP = [(0, (2, 1020)), (1005, (2, 1020)), (1035, (4, 1040)), (1041, (5, 5000)), (4999, (5, 5000)), (5001, (-1, -1))]


def produce(catalog: Catalog, partition: int, timestamps: list[int]) -> list[int]:
    with Agent(catalog, background=False) as agent:
        future = agent.produce("orders", [Record(partition, b"k%d" % t, b"v", t) for t in timestamps])
    return future.result()


def drop_first_offsets(catalog: Catalog, key: str, dropped: set[int]) -> None:
    """A stand-in compaction of one file: its section keeps its offsets but loses `dropped`."""
    snapshot = catalog.snapshot()
    (section,) = snapshot.get_files([key])[key].sections
    table = pa.concat_tables(read_sections(catalog.store, [(key, section)]))
    kept = table.filter(pc.invert(pc.is_in(table.column("offset"), pa.array(sorted(dropped), pa.int64()))))
    first = kept.column("offset")[0].as_py()
    deltas = pc.subtract(kept.column("offset"), first).cast(pa.uint32())
    blob, (info,) = write_segment([("orders", 0, section_table(deltas, kept.column("timestamp"), kept.column("key").to_pylist(), kept.column("value").to_pylist()))])
    catalog.store.put("data/l1/compacted.seg", blob)
    assert catalog.replace_files([key], [DataFile("data/l1/compacted.seg", 1, len(blob), NOW, (CatalogSection(info, first),))], NOW).committed


@pytest.fixture(params=["compact", "delete"])
def policy(request: pytest.FixtureRequest) -> str:
    return request.param


@pytest.fixture
def log_start(policy: str) -> int:
    """Retention moves a log's start, compaction never does (Kafka's rule): the stand-in compaction's removal of
    offsets 0-1 raises a delete topic's log start to 2, and leaves a compacted topic's at 0."""
    return {"compact": 0, "delete": 2}[policy]


@pytest.fixture
def catalog(catalog: Catalog, policy: str) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy=policy)
    assert produce(catalog, 0, FIRST_FILE_TIMESTAMPS) == [0, 1, 2, 3, 4]
    (first_file,) = [f.key for f in catalog.snapshot().file_summaries(0)]
    assert produce(catalog, 0, SECOND_FILE_TIMESTAMPS) == [5, 6, 7]
    drop_first_offsets(catalog, first_file, {0, 1})
    assert [r.offset for r in read_records(catalog.store, catalog.snapshot(), "orders", 0)] == [2, 3, 4, 5, 6, 7]
    return catalog


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    running = RunningAgent(catalog)
    try:
        yield running
    finally:
        running.stop()


def test_confluent_consumer_watermarks_and_offsets_for_times(agent: RunningAgent, log_start: int) -> None:
    consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": "list-offsets", **FAST_CLIENT})
    try:
        assert consumer.get_watermark_offsets(TopicPartition("orders", 0), timeout=10, cached=False) == (log_start, 8)
        assert consumer.get_watermark_offsets(TopicPartition("orders", 1), timeout=10, cached=False) == (0, 0)
        for target, (offset, _timestamp) in BY_TIMESTAMP:
            (found,) = consumer.offsets_for_times([TopicPartition("orders", 0, target)], timeout=10)
            assert (target, found.offset, found.error) == (target, offset, None)
    finally:
        consumer.close()


def test_confluent_admin_list_offsets_by_each_spec(agent: RunningAgent, log_start: int) -> None:
    admin = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
    specs = {
        "earliest": (OffsetSpec.earliest(), log_start),
        "latest": (OffsetSpec.latest(), 8),
        "max timestamp": (OffsetSpec.max_timestamp(), 5),
        "at 1035": (OffsetSpec.for_timestamp(1035), 4),
    }
    for name, (spec, offset) in specs.items():
        result = admin.list_offsets({TopicPartition("orders", 0): spec})[TopicPartition("orders", 0)].result(timeout=10)
        assert (name, result.offset) == (name, offset)
    result = admin.list_offsets({TopicPartition("orders", 0): OffsetSpec.max_timestamp()})[TopicPartition("orders", 0)].result(timeout=10)
    assert result.timestamp == 5000


def test_kafka_python_beginning_end_and_by_timestamp(agent: RunningAgent, log_start: int) -> None:
    consumer = KafkaConsumer(bootstrap_servers=agent.bootstrap, request_timeout_ms=10000)
    try:
        partitions = [KafkaPythonTopicPartition("orders", 0), KafkaPythonTopicPartition("orders", 1)]
        assert consumer.beginning_offsets(partitions) == {partitions[0]: log_start, partitions[1]: 0}
        assert consumer.end_offsets(partitions) == {partitions[0]: 8, partitions[1]: 0}
        found = consumer.offsets_for_times({partitions[0]: 1041})[partitions[0]]
        assert (found.offset, found.timestamp) == (5, 5000)
        assert consumer.offsets_for_times({partitions[0]: 5001})[partitions[0]] is None
    finally:
        consumer.close()


def list_offsets(agent: RunningAgent, version: int, partitions: list[tuple[str, int, int]]) -> list[Any]:
    topics: dict[str, list[dict]] = {}
    for topic, index, timestamp in partitions:
        topics.setdefault(topic, []).append({"partition_index": index, "timestamp": timestamp, "max_num_offsets": 1, "current_leader_epoch": -1})
    request_class = load_request_schema(2, version)
    header_class = RequestHeaderV2 if request_class.__flexible__ else RequestHeaderV1
    message = io.BytesIO()
    entity_writer(header_class)(message, header_class(request_api_key=2, request_api_version=version, correlation_id=9, client_id="test"))
    body = {"replica_id": -1, "isolation_level": 1, "topics": [{"name": name, "partitions": entries} for name, entries in topics.items()]}
    entity_writer(request_class)(message, build(request_class, body))
    with connect(agent.server) as connection:
        connection.sendall(struct.pack(">i", len(message.getvalue())) + message.getvalue())
        frame = receive_frame(connection)
    response_class = load_response_schema(2, version)
    header, size = entity_reader(response_class.__header_schema__)(frame, 0)
    response, body_size = entity_reader(response_class)(frame, size)
    assert (header.correlation_id, size + body_size) == (9, len(frame))
    return [partition for topic in response.topics for partition in topic.partitions]


@pytest.mark.parametrize("version", range(8))
def test_every_version_answers_each_target_and_kafkas_errors(agent: RunningAgent, version: int, log_start: int) -> None:
    expected = {EARLIEST: (log_start, -1), LATEST: (8, -1), 1035: (4, 1040), 5001: (-1, -1), MAX_TIMESTAMP: (5, 5000)}
    for target, (offset, timestamp) in expected.items():
        if target == MAX_TIMESTAMP and version < 7:
            continue
        # one partition asked twice in a request is refused (below), so one request per target
        (answered,) = list_offsets(agent, version, [("orders", 0, target)])
        assert int(answered.error_code) == NONE
        if version == 0:
            assert list(answered.old_style_offsets) == ([offset] if offset >= 0 else [])
        else:
            assert (target, answered.offset, answered.timestamp) == (target, offset, timestamp)
    errors = list_offsets(agent, version, [("orders", 2, LATEST), ("no-such-topic", 0, LATEST)])
    assert [int(p.error_code) for p in errors] == [UNKNOWN_TOPIC_OR_PARTITION] * 2


def test_a_partition_asked_twice_gets_invalid_request(agent: RunningAgent) -> None:
    answered = list_offsets(agent, 7, [("orders", 0, LATEST), ("orders", 0, EARLIEST), ("orders", 1, LATEST)])
    assert [(int(p.partition_index), int(p.error_code)) for p in answered] == [(0, INVALID_REQUEST), (0, INVALID_REQUEST), (1, NONE)]


def test_an_empty_partition_starts_and_ends_at_0_and_has_no_timestamps(agent: RunningAgent) -> None:
    answered = [list_offsets(agent, 7, [("orders", 1, target)])[0] for target in (EARLIEST, LATEST, MAX_TIMESTAMP, 0)]
    assert [(p.offset, p.timestamp) for p in answered] == [(0, -1), (0, -1), (-1, -1), (-1, -1)]
