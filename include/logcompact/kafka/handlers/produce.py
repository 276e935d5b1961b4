"""Produce (key 0), v3-9: record batches (magic 2) into the ingest agent, acknowledged once durable.

Each partition's one batch is checked as Kafka's broker checks it (framing and magic, CRC-32C, compression
allowed by the version, `max.message.bytes`, keys of a compacted topic, an idempotent producer's id, epoch and
sequence, and a transactional producer's transaction holding the partition) and then decompressed and handed to the
ingest agent whole, or refused whole with Kafka's error for that partition; the other partitions of the request go
on. A retry of one of an idempotent producer's newest 5 batches on the partition is answered with that batch's base
offset, and nothing is written again. A transactional batch whose transaction ended before its append (a fenced
producer's, a late retry) is refused alone with its transaction's error, its records aborted; a retry of it gets
that error again. acks=1 and acks=-1 (all) are answered once the L0 file holding the batch is committed to
the catalog; acks=0 gets no response, and a refused batch closes the connection (Kafka's way of telling a
client that reads no responses). A producer over its byte-rate quota (producer_byte_rate) is answered with the
throttle time, and at acks=0 gets no answer while its connection is muted all the same, as Kafka does.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import numpy as np
import pyarrow as pa

from logcompact import ingest
from logcompact.catalog.acls import AclOperation
from logcompact.catalog.transactions import TxnRefusal
from logcompact.exceptions import InvalidRecordError
from logcompact.kafka import codec, records
from logcompact.kafka.broker import Broker
from logcompact.kafka.producer_state import ProducerStateError
from logcompact.kafka.quota_manager import Muted, remaining_ms
from logcompact.kafka.transaction_coordinator import error_code

API_KEY = 0
# Kafka's broker default for message.max.bytes, the max.message.bytes of a topic that sets none.
DEFAULT_MAX_MESSAGE_BYTES = 1_048_588
FIRST_VERSION_WITH_ZSTD = 7
# The most a batch's records may decompress to: what one batch can take of the agent's memory (its records' columns
# take about as much again), far above real batches (max.message.bytes compressed ~10x at most).
MAX_DECOMPRESSED_BATCH_BYTES = 64 * 1024 * 1024
ACKS = (0, 1, -1)

# The ingest agent's future of offsets with the log append time (None: CreateTime), or a refused partition's response.
Outcome = tuple[Future, int | None] | dict[str, Any]


class AcksZeroRefusedError(Exception):
    """A batch refused at acks=0: Kafka closes the connection, the one signal a client reading no responses gets."""


async def handle(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    refusal = _unauthorized(broker, request)
    # The request's bytes recorded against the producer's byte-rate quota as it arrives, not once answered as Kafka
    # does: an answer here waits for a flush, which Kafka's does not, and the client would be paced a flush slower
    # than its quota each time. The answer carries what is left of the throttle time, and the connection is read
    # again only once all of it has passed (server.py), as KIP-219's muted channel.
    throttle_ms = broker.quotas.record_produce(request.session, request.client_id, request.size)
    recorded = time.monotonic()
    # Submitted before the first await: the ingest thread takes requests in the order they were read.
    accepted = await broker.ingest.results.wrap(broker.ingest.thread.submit(_accept, broker, request.api_version, body, refusal))
    if body.acks == 0:
        refused = [f"{name}[{index}]: {outcome['error_code'].name}" for name, partitions in accepted for index, outcome in partitions if isinstance(outcome, dict)]
        if refused:
            raise AcksZeroRefusedError(f"acks=0 produce refused, connection closed as Kafka does: {', '.join(refused)}")
        # Kafka's byte-rate throttle holds for acks=0 too: no answer, the connection muted for the throttle time.
        left_ms = remaining_ms(throttle_ms, recorded)
        return Muted(left_ms) if left_ms else None
    responses = [
        {"name": name, "partition_responses": [await _answer(broker, index, outcome) for index, outcome in partitions]}
        for name, partitions in accepted
    ]
    return codec.build(codec.response_class(API_KEY, request.api_version), {"responses": responses, "throttle_time": remaining_ms(throttle_ms, recorded)})


def _unauthorized(broker: Broker, request: codec.Request) -> dict[str, Any] | set[str]:
    """As Kafka's KafkaApis: transactional batches without WRITE on the transactional id refuse the whole request
    (its refusal); else the topics without WRITE, whose partitions are refused (and none while authorization is off)."""
    authorizer, body, session = broker.authorizer, request.body, request.session
    if not authorizer.enabled:
        return set()
    if body.transactional_id is not None and not authorizer.authorize_transactional_id(session, AclOperation.WRITE, body.transactional_id) and any(
        records.is_transactional(p.records) for topic in body.topic_data for p in topic.partition_data
    ):
        return _refused(codec.ErrorCode.transactional_id_authorization_failed,
                        f"{session.principal} may not WRITE transactional id {body.transactional_id!r}")
    return authorizer.denied_topics(session, AclOperation.WRITE, (topic.name for topic in body.topic_data))


def _accept(broker: Broker, version: int, body: Any, refusal: dict[str, Any] | set[str]) -> list[tuple[str, list[tuple[int, Outcome]]]]:
    """On the ingest thread: every partition's batch checked, and handed to the ingest agent or refused. Transactional
    batches in a request without a transactional id, or whose id the principal may not write (`refusal`, a
    response), refuse the whole request, as Kafka's KafkaApis does; topics it may not write (`refusal`, their names)
    are TOPIC_AUTHORIZATION_FAILED, whether they exist or not."""
    if isinstance(refusal, dict):
        return [(topic.name, [(partition.index, refusal) for partition in topic.partition_data]) for topic in body.topic_data]
    if body.transactional_id is None and any(records.is_transactional(p.records) for topic in body.topic_data for p in topic.partition_data):
        refusal = _refused(codec.ErrorCode.transactional_id_authorization_failed,
                           "transactional batches in a Produce request without a transactional id: send them with the producer's transactional.id")
        return [(topic.name, [(partition.index, refusal) for partition in topic.partition_data]) for topic in body.topic_data]
    return [
        (topic.name, [
            (partition.index, _DENIED if topic.name in refusal else _accept_partition(broker, version, body.acks, topic.name, partition))
            for partition in topic.partition_data
        ])
        for topic in body.topic_data
    ]


def _accept_partition(broker: Broker, version: int, acks: int, name: str, partition: Any) -> Outcome:
    if acks not in ACKS:
        return _refused(codec.ErrorCode.invalid_required_acks, f"acks={acks}: use 0, 1 or -1 (all)")
    topic = broker.ingest.topic(name)
    if topic is None or not 0 <= partition.index < topic.partitions:
        return _refused(codec.ErrorCode.unknown_topic_or_partition, f"no partition {partition.index} of topic {name!r} in the catalog")
    try:
        batch = records.read_batch(partition.records or b"")
    except records.CorruptBatchError as exc:
        return _refused(codec.ErrorCode.corrupt_message, str(exc))
    except records.InvalidBatchError as exc:
        return _refused(codec.ErrorCode.invalid_record, str(exc))
    if batch.codec == records.ZSTD and version < FIRST_VERSION_WITH_ZSTD:
        return _refused(codec.ErrorCode.unsupported_compression_type, f"zstd batches need Produce v{FIRST_VERSION_WITH_ZSTD}+, this is v{version}")
    if batch.size_bytes > (limit := broker.max_message_bytes_of(topic)):
        return _refused(codec.ErrorCode.message_too_large, f"batch of {batch.size_bytes} bytes is over max.message.bytes {limit}")
    epoch, first_sequence = batch.producer_epoch, batch.base_sequence
    if batch.producer_id >= 0 and (epoch < 0 or first_sequence < 0):
        return _refused(codec.ErrorCode.invalid_record, f"producer id {batch.producer_id} with epoch {epoch} and base sequence {first_sequence}: both must be >= 0")
    if batch.transactional and batch.producer_id < 0:
        return _refused(codec.ErrorCode.invalid_record, "transactional batch without a producer id: InitProducerId with the transactional.id first")
    if batch.control:
        return _refused(codec.ErrorCode.invalid_record, "clients may not write control batches")
    try:
        columns = batch.columns(MAX_DECOMPRESSED_BATCH_BYTES)
    except records.CorruptBatchError as exc:
        return _refused(codec.ErrorCode.corrupt_message, str(exc))
    except records.BatchTooLargeError as exc:
        return _refused(codec.ErrorCode.message_too_large, str(exc))
    except records.TimestampOutOfRangeError as exc:
        return _refused(codec.ErrorCode.invalid_timestamp, str(exc))
    if not columns.num_rows:
        return _refused(codec.ErrorCode.invalid_record, "record batch holds no records")
    keys = columns.column("key")
    if topic.config.compacted and keys.null_count:
        message = f"Compacted topic cannot accept message without key in topic partition {name}-{partition.index}."
        return _refused(codec.ErrorCode.invalid_record, message, np.flatnonzero(np.asarray(keys.is_null())).tolist())
    # A LogAppendTime topic's records all take the time the batch is taken; a record without a timestamp (-1, null in
    # the columns) takes the ingest agent's clock.
    append_time = broker.log_append_time(topic)
    if append_time is not None:
        columns = columns.set_column(0, ingest.PRODUCE_SCHEMA.field(0), pa.array(np.full(columns.num_rows, append_time, dtype=np.int64)))
    try:
        if batch.producer_id >= 0:
            future = broker.ingest.produce_sequenced(name, partition.index, columns, batch.producer_id, epoch, first_sequence, batch.transactional,
                                                     batch.codec)
            return future, append_time
        return broker.ingest.produce(name, partition.index, columns, produced_codec=batch.codec), append_time
    except ProducerStateError as exc:
        return _refused(exc.error, str(exc))
    except InvalidRecordError as exc:  # a timestamp the store cannot keep (negative, other than -1)
        return _refused(codec.ErrorCode.invalid_timestamp, str(exc))


def _refused(error: codec.ErrorCode, message: str, record_indexes: list[int] | None = None) -> dict[str, Any]:
    return {
        "error_code": error,
        "base_offset": -1,
        "log_append_time": None,
        "log_start_offset": -1,
        "record_errors": [{"batch_index": index, "batch_index_error_message": message} for index in record_indexes or []],
        "error_message": message,
    }


_DENIED = _refused(codec.ErrorCode.topic_authorization_failed, "not authorized to WRITE the topic")


async def _answer(broker: Broker, index: int, outcome: Outcome) -> dict[str, Any]:
    if isinstance(outcome, dict):
        return {"index": index, **outcome}
    accepted, append_time = outcome
    try:
        offsets = await broker.ingest.results.wrap(accepted)
    except TxnRefusal as exc:  # a transactional batch whose transaction ended before its append: its records are aborted
        return {"index": index, **_refused(error_code(exc.error), str(exc))}
    except Exception as exc:  # the L0 file was not committed: retriable, the client sends the batch again
        return {"index": index, **_refused(codec.ErrorCode.kafka_storage_error, str(exc))}
    # log_append_time -1 (None) for CreateTime; log_start_offset unknown (-1) without a catalog read per response.
    return {"index": index, "error_code": codec.ErrorCode.none, "base_offset": offsets[0], "log_append_time": append_time, "log_start_offset": -1, "record_errors": []}
