"""Fetch (key 1), v4-12: a partition's records from an offset, as record batches v2, read from the
catalog's sections at one snapshot through consume's read path, behind the agent's bounded cache of file ranges
(`Broker.file_cache`) and its cache of decoded blocks (`Broker.decoded_blocks`: consumers of one file decode each of
its blocks once), and encoded from their Arrow columns a batch at a time (`records.BatchBuffer`). A request reads the
catalog's version and, in one query, the first page of the sections of each of its partitions (the snapshot and each
topic's watermarks are kept while no commit comes: served_version.py; a partition's later pages as its read gets to
them, none past its byte limit: `Snapshot.sections_from`), and its partitions are read on several threads at once
(`read`). The response's record batches are written to the socket from the buffers they were encoded in
(`codec.encode_response_parts`).

Batches are compressed as the topic's `compression.type` says, as Kafka's broker stores them: `producer` (the
default) with the codec the records were produced with, as their section records it (`sections.produced_compression`;
where a section holds batches of several, the codec of most of its records), and where that is not known (records
written through the library, or before agents recorded it) with the agent's `--fetch-compression` (none unless set);
`uncompressed`, `gzip`, `snappy`, `lz4` or `zstd` with that one. Compressing runs on the reading threads, off the
event loop. Control batches stay uncompressed, as Kafka writes them. A batch's records are sized before compression
to fit what is left of the limits, from the ratio the batch before reached, so a compressed answer fills its limits
as an uncompressed one does and never passes them.

Each record keeps its offset; holes left by compaction are gaps in a batch's offset deltas, a fetch offset in a
hole gets the next record that exists, and a hole at the end is covered by a control batch whose one COMMIT marker
takes the hole's last offset, so no client stalls and librdkafka's consumer position reaches the end. The log start
offset is the catalog's, raised by retention only (compaction never moves it, as in Kafka), the high watermark the
partition's next offset, and the last stable offset the catalog's (the first offset of the partition's earliest
open transaction's data, else the high watermark) whatever the `isolation_level`.

A `read_committed` fetch reads below the last stable offset only and leaves out the records of aborted transactions
(consume's read path drops them by the catalog's aborted ranges: holes in the batches' offset deltas, as
compaction's), and its trailing hole is covered up to the last stable offset - 1. Its `aborted_transactions` is
empty: the batches carry no producer id for a client to filter by, and none is needed.

`max_bytes` and each `partition_max_bytes` hold, except that the first batch of the first partition with records
is returned whole (it then holds one record), as in Kafka, so a record larger than the limits never stalls a
consumer. Long polling: while fewer than `min_bytes` of records are found, the request waits up to `max_wait_ms`,
reading again whenever a newer catalog version is committed (`Broker.commits` polls it for every waiting fetch
at once), then answers with what there is. Fetch sessions (KIP-227) are not kept: every response has session
id 0, which clients take as "no session", so each request is a full fetch.

A consumer's byte-rate quota (`Broker.quotas`, consumer_byte_rate) bounds `max_bytes` by what one window takes, and
counts the records' bytes of each answer (Kafka counts the whole response; the records are nearly all of it); over
the quota, the answer has no partitions and the throttle time, as Kafka's.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, NamedTuple

from logcompact.catalog import Catalog, Snapshot
from logcompact.catalog.acls import AclOperation
from logcompact.catalog.quotas import CONSUMER_BYTE_RATE
from logcompact.catalog.schema import UNKNOWN_CODEC
from logcompact.catalog.snapshot import PartitionSections
from logcompact.catalog.topics import LogOffsets
from logcompact.consume import READ_COMMITTED, READ_UNCOMMITTED, AbortedRange, SectionReader, SectionRef, read_sections
from logcompact.format import read_section_from
from logcompact.kafka import codec, records
from logcompact.kafka.block_cache import DecodedBlocks
from logcompact.kafka.broker import Broker
from logcompact.kafka.served_version import served_version
from logcompact.store.base import ObjectStore

API_KEY = 1
BATCH_BYTES = 1024 * 1024  # the largest batch built (one larger record makes a batch of its own)
BUFFER_BYTES = 8 * 1024 * 1024  # a partition's buffer of batches at first (grown past it)
NO_SESSION = 0
FULL_FETCH_EPOCHS = (-1, 0)
NO_PREFERRED_REPLICA = -1
# A topic's compression.type as the codec Fetch sends (Kafka's names); `producer` (None): the one the records came in.
TOPIC_CODECS = {"uncompressed": records.NONE, "gzip": records.GZIP, "snappy": records.SNAPPY, "lz4": records.LZ4, "zstd": records.ZSTD}
# --fetch-compression, as a producer's compression.type names the codecs
AGENT_CODECS = {"none": records.NONE, "gzip": records.GZIP, "snappy": records.SNAPPY, "lz4": records.LZ4, "zstd": records.ZSTD}
# A batch's records are sized before compression to this share of what the last batch's ratio says would fit: a batch
# that compresses a little worse than the one before still fits (else it is sized again by the room alone).
_RATIO_MARGIN = 0.9


class Wanted(NamedTuple):
    """A partition a Fetch asks for: from which offset, at most how many bytes."""

    partition: int
    fetch_offset: int
    max_bytes: int


@dataclass
class _Budget:
    """The bytes of records a response may still take (`max_bytes`); the first batch is taken whole."""

    left: int
    first_taken: bool = False


@dataclass(frozen=True)
class Answer:
    """A partition's answer: its error, watermarks and record batches (`next_offset`: the offset after them)."""

    index: int
    error: codec.ErrorCode
    high_watermark: int = -1
    log_start_offset: int = -1
    last_stable_offset: int = -1
    records: bytes | memoryview = b""  # the batches' buffer, not copied into bytes
    next_offset: int = -1


async def handle(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    # Sessions came in v7. An epoch of 0 (open) or -1 (close) asks for a full fetch, served sessionless as Kafka
    # does without a free session slot; a later epoch is an incremental fetch of a session this agent never opened.
    if getattr(body, "session_epoch", FULL_FETCH_EPOCHS[0]) not in FULL_FETCH_EPOCHS:
        return _response(request.api_version, body, [], codec.ErrorCode.fetch_session_id_not_found)
    if body.replica_id >= 0:  # a follower's fetch: this agent has no replicas, every partition's log is the catalog's
        # As Kafka, a follower needs CLUSTER_ACTION on the cluster, else every partition is TOPIC_AUTHORIZATION_FAILED.
        error = codec.ErrorCode.not_leader_or_follower
        if not broker.authorizer.authorize_cluster(request.session, AclOperation.CLUSTER_ACTION):
            error = codec.ErrorCode.topic_authorization_failed
        refused = [(topic.topic, [Answer(int(p.partition), error) for p in topic.partitions]) for topic in body.topics]
        return _response(request.api_version, body, refused, codec.ErrorCode.none)
    # A consumer needs READ on each topic; the partitions of the others are TOPIC_AUTHORIZATION_FAILED and not read.
    denied = broker.authorizer.denied_topics(request.session, AclOperation.READ, (topic.topic for topic in body.topics))
    wanted = [
        (topic.topic, [Wanted(int(p.partition), int(p.fetch_offset), int(p.partition_max_bytes)) for p in topic.partitions])
        for topic in body.topics if topic.topic not in denied
    ]
    deadline = time.monotonic() + body.max_wait.total_seconds()
    max_bytes = int(body.max_bytes)
    if (in_window := broker.quotas.max_value_in_window(CONSUMER_BYTE_RATE, request.session, request.client_id)) is not None:
        max_bytes = min(max_bytes, int(in_window))  # Kafka's bound: more would be throttled whatever came before
    newest = None  # after a wait: the version the commit watch read, newer than the request's last read
    while True:
        version, topics = await asyncio.to_thread(
            read, broker.catalog, broker.file_cache, max_bytes, wanted, int(body.isolation_level), broker.fetch_compression, broker.decoded_blocks,
            newest,
        )
        found = sum(len(partition.records) for _, partitions in topics for partition in partitions)
        failed = bool(denied) or any(partition.error != codec.ErrorCode.none for _, partitions in topics for partition in partitions)
        if found >= body.min_bytes or failed or not await broker.commits.wait_past(version, deadline - time.monotonic()):
            return _within_quota(broker, request, _with_denied(body, topics, denied), found)
        newest = broker.commits.newest


def _with_denied(body: Any, answered: list[tuple[str, list[Answer]]], denied: set[str]) -> list[tuple[str, list[Answer]]]:
    """The answers read, with the denied topics' partitions put back in the request's order."""
    if not denied:
        return answered
    read_answers = iter(answered)
    return [
        (topic.topic, [Answer(int(p.partition), codec.ErrorCode.topic_authorization_failed) for p in topic.partitions])
        if topic.topic in denied else next(read_answers)
        for topic in body.topics
    ]


def _within_quota(broker: Broker, request: codec.Request, topics: list[tuple[str, list[Answer]]], found: int) -> Any:
    """The response, its records' bytes recorded against the consumer's byte-rate quota; over it, Kafka's throttled
    answer: no partitions, the throttle time, the bytes taken back (they are fetched again once it has passed)."""
    throttle_ms = broker.quotas.record_fetch(request.session, request.client_id, found)
    if throttle_ms:
        broker.quotas.unrecord(CONSUMER_BYTE_RATE, request.session, request.client_id, found)
        return _response(request.api_version, request.body, [], codec.ErrorCode.none, throttle_ms)
    return _response(request.api_version, request.body, topics, codec.ErrorCode.none)


def read(
    catalog: Catalog, store: ObjectStore, max_bytes: int, wanted: list[tuple[str, list[Wanted]]], isolation: int = READ_UNCOMMITTED,
    default_codec: int = records.NONE, blocks: DecodedBlocks | None = None, newest_version: int | None = None,
) -> tuple[int, list[tuple[str, list[Answer]]]]:
    """The catalog version read and each partition's answer to a Fetch of `wanted` partitions (topic by topic, in the
    request's order) within `max_bytes` at `isolation` (Kafka's level), reading files through `store`, its batches
    compressed as each topic's compression.type says (`default_codec` where it says `producer` and the produced
    codec is not known), sections' blocks decoded through `blocks` when given (the agent's cache of decoded blocks).
    `newest_version`, a version read from the catalog since the request came (the commit watch's, after a wait), is
    taken as the newest without asking the catalog again (`ServedVersion.read`).

    Partitions are answered in order, each within what the earlier ones left of `max_bytes`. Those whose limits fit
    `max_bytes` together are read at once on PARTITION_READERS threads (decompressing and encoding release the GIL),
    each as if it came first with all of its limit, and each such answer is taken when it is what reading in order
    gives: its limit is whole and, past the response's first records, the answer is within it; else that partition
    is read again in order (which happens only after a record larger than a limit)."""
    # High watermarks as of the snapshot's version or before: every offset below one was committed by then, so an
    # offset the snapshot does not hold there is one compaction removed, which a batch may cover; records are read below
    # it. Likewise every transaction with data below a last stable offset read then had ended: its aborted ranges are
    # known. Both kept per catalog version (served_version.py).
    snapshot, log_offsets = served_version(catalog).read([topic for topic, _ in wanted], newest_version)
    plan: list[tuple[str, list[Answer | _ToRead]]] = []
    for topic, partitions in wanted:
        # A topic created between the two reads is not in the snapshot yet: unknown this time.
        offsets = log_offsets[topic] if topic in snapshot.topics else None
        if offsets is None:
            plan.append((topic, [Answer(asked.partition, codec.ErrorCode.unknown_topic_or_partition) for asked in partitions]))
        else:
            compression = snapshot.topic(topic).config.compression_type
            sent_codec = None if compression is None else TOPIC_CODECS[compression]
            plan.append((topic, _partitions_plan(snapshot, topic, partitions, offsets, isolation, sent_codec, default_codec)))
    read_section = read_section_from if blocks is None else blocks.read_section_from
    planned, alone = 0, {}
    to_read = [entry for _, entries in plan for entry in entries if isinstance(entry, _ToRead)]
    for partition in to_read if len(to_read) > 1 else ():
        if planned + partition.asked.max_bytes > max_bytes:
            break
        planned += partition.asked.max_bytes
        alone[id(partition)] = _PARTITION_READERS.submit(_read_alone, store, read_section, partition)
    budget = _Budget(max_bytes)
    answered = []
    for topic, items in plan:
        answers = []
        for item in items:
            if isinstance(item, Answer):
                answers.append(item)
                continue
            limit = min(item.asked.max_bytes, budget.left)
            read_alone = alone.get(id(item))
            if read_alone is not None:
                answer, took_records = read_alone.result()
                if limit == item.asked.max_bytes and not (budget.first_taken and len(answer.records) > limit):
                    budget.left -= len(answer.records)
                    budget.first_taken = budget.first_taken or took_records
                    answers.append(answer)
                    continue
            answers.append(_answer(store, read_section, item, limit, budget))
        answered.append((topic, answers))
    return snapshot.version, answered


# Threads reading a request's partitions at once (shared by every request).
PARTITION_READERS = max(2, min(4, os.cpu_count() or 1))
_PARTITION_READERS = ThreadPoolExecutor(PARTITION_READERS, thread_name_prefix="logcompact-fetch")


@dataclass(frozen=True)
class _ToRead:
    """A partition whose records are to be read: from which offset, to which (`end`: the high watermark, or under
    read_committed the last stable offset), in which sections (read from the catalog a page at a time as the
    partition's read gets to them: `Snapshot.partition_sections`), without which aborted ranges."""

    asked: Wanted
    log_start: int
    high_watermark: int
    last_stable: int
    end: int
    sections: Iterable[SectionRef] = ()
    aborted: Sequence[AbortedRange] = ()
    codec: int | None = None  # what batches are compressed with; None: the produced codec where known, else default_codec
    default_codec: int = records.NONE

    def codec_at(self, offset: int) -> int:
        """The codec the batch of records from `offset` on is sent in."""
        if self.codec is not None:
            return self.codec
        produced = self.sections.produced_codec(offset) if isinstance(self.sections, PartitionSections) else UNKNOWN_CODEC
        return self.default_codec if produced == UNKNOWN_CODEC else produced


def _partitions_plan(
    snapshot: Snapshot, topic: str, partitions: list[Wanted], offsets: list[LogOffsets], isolation: int, sent_codec: int | None, default_codec: int,
) -> list[Answer | _ToRead]:
    """Each partition's error, or what to read of it (the first page of each one's sections found in one catalog query,
    under read_committed the aborted ranges in it in one more)."""
    plan: list[Answer | _ToRead] = []
    ranges: dict[int, tuple[int, int]] = {}
    for asked in partitions:
        if not 0 <= asked.partition < len(offsets):
            plan.append(Answer(asked.partition, codec.ErrorCode.unknown_topic_or_partition))
            continue
        log_start, high_watermark, last_stable = offsets[asked.partition]
        # The log start is the catalog's (raised by retention and DeleteRecords): an offset from it on is served from the next
        # record there is, however much of the head compaction removed.
        if not log_start <= asked.fetch_offset <= high_watermark:
            plan.append(Answer(asked.partition, codec.ErrorCode.offset_out_of_range, high_watermark, log_start, last_stable))
            continue
        # read_committed: from the last stable offset to the high watermark there is nothing to read yet, as in Kafka
        end = last_stable if isolation == READ_COMMITTED else high_watermark
        plan.append(_ToRead(asked, log_start, high_watermark, last_stable, end, codec=sent_codec, default_codec=default_codec))
        if asked.fetch_offset < end:
            ranges[asked.partition] = (asked.fetch_offset, end)
    if not ranges:
        return plan
    sections = snapshot.sections_of_partitions(topic, ranges)
    aborted = snapshot.aborted_ranges({(topic, partition): span for partition, span in ranges.items()}) if isolation == READ_COMMITTED else {}
    return [
        replace(item, sections=sections.get(item.asked.partition, []), aborted=aborted.get((topic, item.asked.partition), ()))
        if isinstance(item, _ToRead) else item
        for item in plan
    ]


def _read_alone(store: ObjectStore, read_section: SectionReader, item: _ToRead) -> tuple[Answer, bool]:
    """The partition's answer as the first of a response with all of its limit, and whether it took records."""
    budget = _Budget(item.asked.max_bytes)
    return _answer(store, read_section, item, item.asked.max_bytes, budget), budget.first_taken


def _answer(store: ObjectStore, read_section: SectionReader, item: _ToRead, limit: int, budget: _Budget) -> Answer:
    batches, next_offset = _batches(store, read_section, item, limit, budget)
    return Answer(item.asked.partition, codec.ErrorCode.none, item.high_watermark, item.log_start, item.last_stable, batches, next_offset)


def _batches(store: ObjectStore, read_section: SectionReader, item: _ToRead, limit: int, budget: _Budget) -> tuple[memoryview, int]:
    """Record batches of the item's records in [fetch_offset, read_end) outside its aborted ranges within `limit`
    bytes as sent (compressed), or one whole batch of one record when it is the response's first (Kafka's rule, so a
    large record never stalls a consumer), and the offset after them.

    When every record up to `read_end` (the high watermark, or the last stable offset) fits, the offsets after the last
    record (compacted away, aborted, markers) are covered by a control batch whose one COMMIT marker is at
    `read_end` - 1, as a partition ending in a transaction marker is in Kafka: the consumer's next fetch starts at
    `read_end` instead of asking for that trailing hole forever, and librdkafka's consumer position reaches
    `read_end` too (it moves past a control record, never past a batch of no records)."""
    fetch_offset, read_end = item.asked.fetch_offset, item.end
    # Room for a whole batch past the limit: a compressed batch is encoded at its size before compression first.
    out = records.BatchBuffer(min(max(limit, 0), BUFFER_BYTES) + BATCH_BYTES)
    ratio = 1.0  # bytes before compression per byte sent, of the last batch
    for table in read_sections(store, item.sections, fetch_offset, read_end, item.aborted, read_section):
        for chunk in table.to_batches():
            columns = records.RecordColumns.of(chunk)
            start = 0
            while start < len(columns):
                codec = item.codec_at(int(columns.offsets[start]))
                room = limit - out.size
                sized = room if codec == records.NONE else int(room * max(ratio * _RATIO_MARGIN, 1.0))
                length, end = out.encode(columns, start, max(0, min(BATCH_BYTES, sized)), codec)
                if length > room and sized > room:  # it compressed worse than the last: sized by the room alone
                    length, end = out.encode(columns, start, max(0, min(BATCH_BYTES, room)), codec)
                ratio = out.uncompressed_length / length
                if length > room and (budget.first_taken or out.size):
                    budget.left -= out.size
                    return out.records, out.offset_after(fetch_offset)
                budget.first_taken = True
                out.keep(length)
                start = end
    # every record to the end taken; a trailing hole that does not fit is the next fetch's answer
    hole_start = out.offset_after(fetch_offset)
    if hole_start < read_end and (limit - out.size >= records.MARKER_BATCH_BYTES or not budget.first_taken):
        out.keep_marker(hole_start, read_end - 1)
    budget.left -= out.size
    return out.records, out.offset_after(fetch_offset)


def _response(version: int, body: Any, topics: list[tuple[str, list[Answer]]], error: codec.ErrorCode, throttle_ms: int = 0) -> Any:
    # Kafka sends aborted transactions (none here) only to read_committed consumers, null to the others.
    aborted: list | None = [] if body.isolation_level == READ_COMMITTED else None
    return codec.build(codec.response_class(API_KEY, version), {
        "throttle_time": throttle_ms,
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
                        "last_stable_offset": partition.last_stable_offset,
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
