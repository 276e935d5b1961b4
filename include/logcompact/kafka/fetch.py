"""Fetch (key 1), v4-12: a partition's records from an offset, as uncompressed record batches v2, read from the
catalog's sections at one snapshot through consume's read path, behind the agent's bounded cache of file ranges
(`Broker.file_cache`), and encoded from their Arrow columns a batch at a time (`records.encode_batch`).

Each record keeps its offset; holes left by compaction are gaps in a batch's offset deltas, a fetch offset in a
hole gets the next record that exists, and a hole at the end is covered by the last batch's last offset (or a
batch of no records), so no client stalls. The log start offset is the catalog's, raised by retention only
(compaction never moves it, as in Kafka), the high watermark the partition's next offset, and, without transactions,
the last stable offset is the high watermark whatever the `isolation_level`.

`max_bytes` and each `partition_max_bytes` hold, except that the first batch of the first partition with records
is returned whole (it then holds one record), as in Kafka, so a record larger than the limits never stalls a
consumer. Long polling: while fewer than `min_bytes` of records are found, the request waits up to `max_wait_ms`,
reading again whenever a newer catalog version is committed (`Broker.commits` polls it for every waiting fetch
at once), then answers with what there is. Fetch sessions (KIP-227) are not kept: every response has session
id 0, which clients take as "no session", so each request is a full fetch.
"""

from __future__ import annotations

import asyncio
import time
import weakref
from dataclasses import dataclass
from typing import Any

import numpy as np

from logcompact.catalog import Catalog, Snapshot
from logcompact.consume import SectionRef, read_sections
from logcompact.exceptions import TopicNotFoundError
from logcompact.kafka import codec, records
from logcompact.kafka.broker import Broker
from logcompact.store.base import ObjectStore

API_KEY = 1
BATCH_BYTES = 1024 * 1024  # the largest batch built (one larger record makes a batch of its own)
NO_SESSION = 0
FULL_FETCH_EPOCHS = (-1, 0)
READ_COMMITTED = 1
NO_PREFERRED_REPLICA = -1


@dataclass
class _Budget:
    """The bytes of records a response may still take (`max_bytes`); the first batch is taken whole."""

    left: int
    first_taken: bool = False


@dataclass(frozen=True)
class Answer:
    """A partition's answer: its error, watermarks and record batches."""

    index: int
    error: codec.ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    records: bytes = b""


async def handle(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    # Sessions came in v7. An epoch of 0 (open) or -1 (close) asks for a full fetch, served sessionless as Kafka
    # does without a free session slot; a later epoch is an incremental fetch of a session this agent never opened.
    if getattr(body, "session_epoch", FULL_FETCH_EPOCHS[0]) not in FULL_FETCH_EPOCHS:
        return _response(request.api_version, body, [], codec.ErrorCode.fetch_session_id_not_found)
    deadline = time.monotonic() + body.max_wait.total_seconds()
    while True:
        version, topics = await asyncio.to_thread(read, broker.catalog, broker.file_cache, body)
        found = sum(len(partition.records) for _, partitions in topics for partition in partitions)
        failed = any(partition.error != codec.ErrorCode.none for _, partitions in topics for partition in partitions)
        if found >= body.min_bytes or failed or not await broker.commits.wait_past(version, deadline - time.monotonic()):
            return _response(request.api_version, body, topics, codec.ErrorCode.none)


def read(catalog: Catalog, store: ObjectStore, body: Any) -> tuple[int, list[tuple[str, list[Answer]]]]:
    """The catalog version read and each partition's answer to a Fetch request's `body` (its topics, partitions,
    offsets and byte limits), reading files through `store`."""
    # High watermarks read before the snapshot: every offset below one was committed before it, so an offset the
    # snapshot does not hold there is one compaction removed, which a batch may cover; records are read below it.
    if body.replica_id >= 0:  # a follower's fetch: this agent has no replicas, every partition's log is the catalog's
        refused = [(topic.topic, [Answer(int(p.partition), codec.ErrorCode.not_leader_or_follower) for p in topic.partitions]) for topic in body.topics]
        return catalog.latest_version(), refused
    log_offsets = {topic.topic: _log_offsets(catalog, topic.topic) for topic in body.topics}
    snapshot = _snapshot(catalog)
    budget = _Budget(int(body.max_bytes))
    answered = []
    for topic in body.topics:
        # A topic created between the two reads is not in the snapshot yet: unknown this time.
        offsets = log_offsets[topic.topic] if topic.topic in snapshot.topics else None
        if offsets is None:
            answered.append((topic.topic, [Answer(int(entry.partition), codec.ErrorCode.unknown_topic_or_partition) for entry in topic.partitions]))
            continue
        wanted = {}  # partition: the offsets to read, for one query of the topic's sections
        for entry in topic.partitions:
            index, fetch_offset = int(entry.partition), int(entry.fetch_offset)
            if 0 <= index < len(offsets) and offsets[index][0] <= fetch_offset < offsets[index][1]:
                wanted[index] = (fetch_offset, offsets[index][1])
        sections = snapshot.sections_of_partitions(topic.topic, wanted) if wanted else {}
        partitions = []
        for entry in topic.partitions:
            index = int(entry.partition)
            if not 0 <= index < len(offsets):
                partitions.append(Answer(index, codec.ErrorCode.unknown_topic_or_partition))
                continue
            log_start, high_watermark = offsets[index]
            fetch_offset = int(entry.fetch_offset)
            # The log start is the catalog's (raised by retention only): an offset from it on is served from the next
            # record there is, however much of the head compaction removed.
            if not log_start <= fetch_offset <= high_watermark:
                partitions.append(Answer(index, codec.ErrorCode.offset_out_of_range, high_watermark, log_start))
                continue
            limit = min(int(entry.partition_max_bytes), budget.left)
            batches = _batches(store, sections.get(index, []), fetch_offset, high_watermark, limit, budget)
            partitions.append(Answer(index, codec.ErrorCode.none, high_watermark, log_start, batches))
        answered.append((topic.topic, partitions))
    return snapshot.version, answered


# The newest snapshot read of each catalog: reused while no commit has come since (a snapshot reads the topics).
_snapshots: weakref.WeakKeyDictionary[Catalog, Snapshot] = weakref.WeakKeyDictionary()


def _snapshot(catalog: Catalog) -> Snapshot:
    held = _snapshots.get(catalog)
    if held is not None and held.version == catalog.latest_version():
        return held
    _snapshots[catalog] = snapshot = catalog.snapshot()
    return snapshot


def _log_offsets(catalog: Catalog, topic: str) -> list[tuple[int, int]] | None:
    try:
        return catalog.log_offsets(topic)
    except TopicNotFoundError:
        return None


def _batches(store: ObjectStore, sections: list[SectionRef], fetch_offset: int, high_watermark: int, limit: int, budget: _Budget) -> bytes:
    """Record batches of the records in [fetch_offset, high_watermark) within `limit` bytes, or one whole batch of
    one record when it is the response's first (Kafka's rule, so a large record never stalls a consumer).

    When every record up to the high watermark fits, the last batch covers the offsets after its last record
    (compacted away), or one batch of no records covers them all: the consumer's next fetch starts at the high
    watermark instead of asking for that trailing hole forever."""
    built: list[np.ndarray] = []
    size = 0
    for table in read_sections(store, sections, fetch_offset, high_watermark):
        for chunk in table.to_batches():
            columns = records.RecordColumns.of(chunk)
            start = 0
            while start < len(columns):
                room = limit - size
                batch, start = records.encode_batch(columns, start, max(0, min(BATCH_BYTES, room)))
                if len(batch) > room and (budget.first_taken or built):
                    budget.left -= size
                    return b"".join(batch.data for batch in built)
                budget.first_taken = True
                built.append(batch)
                size += len(batch)
    # every record to the high watermark taken
    if built:
        records.cover_to(built[-1], high_watermark - 1)
    elif fetch_offset < high_watermark and (limit >= records.EMPTY_BATCH_BYTES or not budget.first_taken):
        built.append(records.empty_batch(fetch_offset, high_watermark - 1))
        size += records.EMPTY_BATCH_BYTES
    budget.left -= size
    return b"".join(batch.data for batch in built)


def _response(version: int, body: Any, topics: list[tuple[str, list[Answer]]], error: codec.ErrorCode) -> Any:
    # Kafka sends aborted transactions (none here) only to read_committed consumers, null to the others.
    aborted: list | None = [] if body.isolation_level == READ_COMMITTED else None
    return codec.build(codec.response_class(API_KEY, version), {
        "throttle_time": 0,
        "error_code": error,
        "session_id": NO_SESSION,
        "responses": [
            {
                "topic": name,
                "partitions": [
                    {
                        "partition_index": partition.index,
                        "error_code": partition.error,
                        "high_watermark": partition.high_watermark,
                        "last_stable_offset": partition.high_watermark,
                        "log_start_offset": partition.log_start_offset,
                        "aborted_transactions": aborted,
                        "preferred_read_replica": NO_PREFERRED_REPLICA,
                        "records": partition.records,
                    }
                    for partition in partitions
                ],
            }
            for name, partitions in topics
        ],
    })
