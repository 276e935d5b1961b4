"""ListOffsets (key 2), v0-7: a partition's earliest, latest, by-timestamp and max-timestamp offsets, from the
catalog (the newest snapshot, and the log offsets kept per catalog version: served_version.py) and, for timestamps, the records of the sections that may hold the answer.

Under `isolation_level` read_committed (v2+) the log ends at the partition's last stable offset, as in Kafka: latest
is the last stable offset, and a timestamp is looked up below it only (the offset of an aborted record may be the
answer, as Kafka's time index gives it: a read from there leaves it out).
"""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog import CatalogSection, Snapshot
from logcompact.catalog.acls import AclOperation
from logcompact.consume import READ_COMMITTED, read_batches
from logcompact.kafka import codec, records
from logcompact.kafka.broker import Broker
from logcompact.kafka.served_version import served_version
from logcompact.store.base import ObjectStore

API_KEY = 2
LATEST = -1
EARLIEST = -2
MAX_TIMESTAMP = -3  # v7 (KIP-734)
NOT_FOUND = -1


async def handle(broker: Broker, request: codec.Request) -> Any:
    # As Kafka, a topic without DESCRIBE has each of its partitions TOPIC_AUTHORIZATION_FAILED, whether it exists or not.
    denied = broker.authorizer.denied_topics(request.session, AclOperation.DESCRIBE, (topic.name for topic in request.body.topics))
    topics = await asyncio.to_thread(_list, broker, request.body, denied)
    version = request.api_version
    return codec.build(codec.response_class(API_KEY, version), {
        "throttle_time": 0,
        "topics": [
            {"name": name, "partitions": [_answer(version, index, found) for index, found in partitions]}
            for name, partitions in topics
        ],
    })


Found = tuple[int, int] | codec.ErrorCode  # (offset, timestamp), or the partition's error


def _list(broker: Broker, body: Any, denied: set[str]) -> list[tuple[str, list[tuple[int, Found]]]]:
    snapshot, offsets = served_version(broker.catalog).read([topic.name for topic in body.topics if topic.name not in denied])
    committed = getattr(body, "isolation_level", 0) == READ_COMMITTED  # from v2
    answered: list[tuple[str, list[tuple[int, Found]]]] = []
    for topic in body.topics:
        if topic.name in denied:
            answered.append((topic.name, [(int(entry.partition_index), codec.ErrorCode.topic_authorization_failed) for entry in topic.partitions]))
            continue
        known = snapshot.topics.get(topic.name)
        log_offsets = offsets[topic.name] if known else None
        indexes = [int(entry.partition_index) for entry in topic.partitions]
        partitions: list[tuple[int, Found]] = []
        for entry, index in zip(topic.partitions, indexes):
            if indexes.count(index) > 1:  # as Kafka: a partition asked twice is answered with an error, twice
                partitions.append((index, codec.ErrorCode.invalid_request))
            elif known is None or log_offsets is None or not 0 <= index < min(known.partitions, len(log_offsets)):
                partitions.append((index, codec.ErrorCode.unknown_topic_or_partition))
            else:
                log_start, high_watermark, last_stable = log_offsets[index]
                end = last_stable if committed else high_watermark
                partitions.append((index, _find(broker.catalog.store, snapshot, topic.name, index, log_start, end, int(entry.timestamp))))
        answered.append((topic.name, partitions))
    return answered


def _find(store: ObjectStore, snapshot: Snapshot, topic: str, partition: int, log_start: int, end: int, target: int) -> tuple[int, int]:
    """The answer for `target` in the partition's log from `log_start` to `end` (its high watermark, or its last
    stable offset under read_committed)."""
    if target == LATEST:
        return end, NOT_FOUND
    if target == EARLIEST:  # the log start: raised by retention and DeleteRecords, never by compaction
        return log_start, NOT_FOUND
    sections = [section for _, section in snapshot.sections_of(topic, partition) if section.last_offset >= log_start]
    if target == MAX_TIMESTAMP:
        if not sections:
            return NOT_FOUND, NOT_FOUND
        target = max(section.info.max_timestamp for section in sections)
    return _first_at_or_after(store, snapshot, topic, partition, sections, target, log_start, end)


def _first_at_or_after(
    store: ObjectStore, snapshot: Snapshot, topic: str, partition: int, sections: list[CatalogSection], timestamp: int, log_start: int, end: int,
) -> tuple[int, int]:
    """The first record from `log_start` to below `end` in offset order whose timestamp is >= `timestamp`, as Kafka's
    time index finds it (the files may still hold records DeleteRecords put before the log start).

    Sections are in first-offset order; every record before the first section whose max_timestamp reaches the
    target lies in an earlier section, all of whose records are older, so the records are read from there on."""
    start = next((section for section in sections if section.info.max_timestamp >= timestamp), None)
    if start is None or start.first_offset >= end:
        return NOT_FOUND, NOT_FOUND
    for table in read_batches(store, snapshot, topic, partition, max(start.first_offset, log_start), end):
        timestamps = table.column("timestamp").to_numpy()
        hits = ((timestamps >= timestamp) & (table.column("offset").to_numpy() >= log_start)).nonzero()[0]
        if len(hits):
            return int(table.column("offset")[int(hits[0])].as_py()), int(timestamps[hits[0]])
    return NOT_FOUND, NOT_FOUND


def _answer(version: int, index: int, found: Found) -> dict[str, Any]:
    if isinstance(found, codec.ErrorCode):
        return {"partition_index": index, "error_code": found, "old_style_offsets": [], "offset": NOT_FOUND, "timestamp": NOT_FOUND, "leader_epoch": records.NO_LEADER_EPOCH}
    offset, timestamp = found
    answer: dict[str, Any] = {"partition_index": index, "error_code": codec.ErrorCode.none, "leader_epoch": records.NO_LEADER_EPOCH}
    if version == 0:  # a list of offsets (Kafka's segment starts); here the one offset found, or none
        answer["old_style_offsets"] = [] if offset == NOT_FOUND else [offset]
    else:
        answer.update(offset=offset, timestamp=timestamp)
    return answer
