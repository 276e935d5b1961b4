"""The transaction tooling of Kafka's Admin (KIP-664), what `kafka-transactions.sh` and kafka-python's
`kafka-python admin transactions` send: DescribeTransactions (key 65) v0, ListTransactions (key 66) v0-1,
DescribeProducers (key 61) v0, and WriteTxnMarkers (key 27) v1 for an admin's abort of a hanging transaction.

As Kafka's brokers: ListTransactions lists only the transactional ids this agent coordinates (an admin asks every
broker and concatenates, so each is listed once), filtered by state, producer id and (v1) duration, Kafka's rule: a
transaction whose start is more than the duration ago, whatever its state; a state filter Kafka does not know is
answered in `unknown_state_filters`. DescribeTransactions answers each id on its coordinator (NOT_COORDINATOR
elsewhere), TRANSACTIONAL_ID_NOT_FOUND for an id the catalog has no row of, an empty id INVALID_REQUEST.
DescribeProducers answers each partition's producers from any agent (every agent serves every partition), with the
first offset of their open transaction's data there; a topic or partition the catalog does not have is
UNKNOWN_TOPIC_OR_PARTITION. No agent keeps coordinator epochs: they are answered -1 and a marker's is not checked.

WriteTxnMarkers is a broker-to-broker request in Kafka; here it serves only Admin.abortTransaction: an ABORT marker
naming a partition where the producer has open data, at the producer's epoch or later (the admin sends the epoch
DescribeProducers showed), aborts the producer's open transaction as a whole, never torn, and fences its producer
(`TransactionCoordinator.abort_for_admin`). A marker at an older epoch than the producer's there is
INVALID_PRODUCER_EPOCH; a producer with no open data there is answered NONE with nothing done, as Kafka writes such
a marker without error. A COMMIT marker is INVALID_REQUEST: a transaction commits through its producer's EndTxn.

Authorization as Kafka's: ListTransactions lists the ids the principal may DESCRIBE; DescribeTransactions answers
an id without DESCRIBE TRANSACTIONAL_ID_AUTHORIZATION_FAILED and leaves out the topics it may not DESCRIBE;
DescribeProducers needs READ on the topic (TOPIC_AUTHORIZATION_FAILED); WriteTxnMarkers CLUSTER_ACTION on the cluster
(CLUSTER_AUTHORIZATION_FAILED on every partition).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from logcompact.catalog.acls import AclOperation
from logcompact.catalog.model import TopicPartition
from logcompact.catalog.transactions import TransactionRow, TxnRefusal
from logcompact.exceptions import CatalogUnavailableError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.units import wall_clock_ms

WRITE_TXN_MARKERS, DESCRIBE_PRODUCERS, DESCRIBE_TRANSACTIONS, LIST_TRANSACTIONS = 27, 61, 65, 66
# Kafka's TransactionState names: a filter naming another is answered in unknown_state_filters. The Prepare* states
# and Dead never persist here (EndTxn is one catalog transaction; an expired id's row is deleted), so they match none.
KAFKA_STATES = frozenset({"Empty", "Ongoing", "PrepareCommit", "PrepareAbort", "CompleteCommit", "CompleteAbort", "Dead", "PrepareEpochFence"})
NO_COORDINATOR_EPOCH = -1

log = logging.getLogger(__name__)


async def list_transactions(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    states = set(body.state_filters)
    duration_ms = int(getattr(body, "duration_filter", -1))  # v1 on
    rows = await asyncio.to_thread(broker.catalog.transactions, states & KAFKA_STATES, {int(pid) for pid in body.producer_id_filters})
    if states and not states & KAFKA_STATES:
        rows = []  # only unknown states asked for: none matches (the catalog takes no filter as "any")
    now = wall_clock_ms()
    authorizer, session = broker.authorizer, request.session
    listed = [
        row for row in rows
        if broker.transactions.coordinates(row.transactional_id) and (duration_ms < 0 or now - row.start_ms > duration_ms)
        and authorizer.authorize_transactional_id(session, AclOperation.DESCRIBE, row.transactional_id)
    ]
    return codec.build(codec.response_class(LIST_TRANSACTIONS, request.api_version), {
        "throttle_time": 0,
        "error_code": codec.ErrorCode.none,
        "unknown_state_filters": sorted(states - KAFKA_STATES),
        "transaction_states": [
            {"transactional_id": row.transactional_id, "producer_id": row.producer_id, "transaction_state": row.state} for row in listed
        ],
    })


async def describe_transactions(broker: Broker, request: codec.Request) -> Any:
    wanted = list(request.body.transactional_ids)
    authorizer, session = broker.authorizer, request.session
    allowed = {tid for tid in wanted if authorizer.authorize_transactional_id(session, AclOperation.DESCRIBE, tid)}
    mine = [tid for tid in wanted if tid and tid in allowed and broker.transactions.coordinates(tid)]
    found = await asyncio.to_thread(broker.catalog.describe_transactions, mine) if mine else {}
    return codec.build(codec.response_class(DESCRIBE_TRANSACTIONS, request.api_version), {
        "throttle_time": 0,
        "transaction_states": [_described(broker, request, tid, tid in allowed, found.get(tid)) for tid in wanted],
    })


def _described(
    broker: Broker, request: codec.Request, transactional_id: str, allowed: bool, found: tuple[TransactionRow, tuple[TopicPartition, ...]] | None,
) -> dict[str, Any]:
    unknown = {"transactional_id": transactional_id, "transaction_state": "", "transaction_timeout": 0, "transaction_start_time": -1,
               "producer_id": -1, "producer_epoch": -1, "topics": []}
    if not allowed:
        return {**unknown, "error_code": codec.ErrorCode.transactional_id_authorization_failed}
    if not transactional_id:
        return {**unknown, "error_code": codec.ErrorCode.invalid_request}
    if not broker.transactions.coordinates(transactional_id):
        return {**unknown, "error_code": codec.ErrorCode.not_coordinator}
    if found is None:
        return {**unknown, "error_code": codec.ErrorCode.transactional_id_not_found}
    row, partitions = found
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    for topic in broker.authorizer.denied_topics(request.session, AclOperation.DESCRIBE, by_topic):
        del by_topic[topic]
    return {
        "error_code": codec.ErrorCode.none, "transactional_id": transactional_id, "transaction_state": row.state,
        "transaction_timeout": row.timeout_ms, "transaction_start_time": row.start_ms, "producer_id": row.producer_id,
        "producer_epoch": row.epoch, "topics": [{"topic": topic, "partitions": parts} for topic, parts in sorted(by_topic.items())],
    }


async def describe_producers(broker: Broker, request: codec.Request) -> Any:
    wanted = [(topic.name, [int(p) for p in topic.partition_indexes]) for topic in request.body.topics]
    denied = broker.authorizer.denied_topics(request.session, AclOperation.READ, (name for name, _ in wanted))
    live, unknown = await _live_partitions(broker, [(name, p) for name, parts in wanted if name not in denied for p in parts])
    states = await asyncio.to_thread(broker.catalog.active_producers, live) if live else {}
    return codec.build(codec.response_class(DESCRIBE_PRODUCERS, request.api_version), {
        "throttle_time": 0,
        "topics": [
            {"name": name, "partitions": [
                _error(partition, codec.ErrorCode.topic_authorization_failed) if name in denied else _producers(name, partition, unknown, states)
                for partition in parts
            ]}
            for name, parts in wanted
        ],
    })


def _error(partition: int, error: codec.ErrorCode) -> dict[str, Any]:
    return {"partition_index": partition, "error_code": error, "error_message": None, "active_producers": []}


def _producers(topic: str, partition: int, unknown: set[TopicPartition], states: dict[TopicPartition, list[Any]]) -> dict[str, Any]:
    if (topic, partition) in unknown:
        return _error(partition, codec.ErrorCode.unknown_topic_or_partition)
    return {"partition_index": partition, "error_code": codec.ErrorCode.none, "error_message": None, "active_producers": [
        {"producer_id": state.producer_id, "producer_epoch": state.epoch, "last_sequence": state.last_sequence, "last_timestamp": state.last_timestamp,
         "coordinator_epoch": NO_COORDINATOR_EPOCH, "current_txn_start_offset": state.current_txn_start_offset}
        for state in states.get((topic, partition), [])
    ]}


async def _live_partitions(broker: Broker, wanted: list[TopicPartition]) -> tuple[list[TopicPartition], set[TopicPartition]]:
    """The partitions of `wanted` the catalog has (once each), and those it does not."""
    topics = (await asyncio.to_thread(broker.catalog.snapshot)).topics
    unknown = {(name, p) for name, p in wanted if name not in topics or not 0 <= p < topics[name].partitions}
    return sorted(set(wanted) - unknown), unknown


async def write_txn_markers(broker: Broker, request: codec.Request) -> Any:
    if not broker.authorizer.authorize_cluster(request.session, AclOperation.CLUSTER_ACTION):
        return codec.build(codec.response_class(WRITE_TXN_MARKERS, request.api_version), {"markers": [
            {"producer_id": int(marker.producer_id), "topics": [
                {"name": topic.name, "partitions": [
                    {"partition_index": int(p), "error_code": codec.ErrorCode.cluster_authorization_failed} for p in topic.partition_indexes
                ]} for topic in marker.topics
            ]} for marker in request.body.markers
        ]})
    return codec.build(codec.response_class(WRITE_TXN_MARKERS, request.api_version), {
        "markers": [await _marker(broker, marker) for marker in request.body.markers],
    })


async def _marker(broker: Broker, marker: Any) -> dict[str, Any]:
    producer_id, epoch = int(marker.producer_id), int(marker.producer_epoch)
    wanted = [(topic.name, int(p)) for topic in marker.topics for p in topic.partition_indexes]
    errors = await _marker_errors(broker, producer_id, epoch, bool(marker.transaction_result), wanted)
    return {"producer_id": producer_id, "topics": [
        {"name": topic.name, "partitions": [{"partition_index": int(p), "error_code": errors[(topic.name, int(p))]} for p in topic.partition_indexes]}
        for topic in marker.topics
    ]}


async def _marker_errors(broker: Broker, producer_id: int, epoch: int, commit: bool, wanted: list[TopicPartition]) -> dict[TopicPartition, codec.ErrorCode]:
    if commit:
        log.warning("WriteTxnMarkers COMMIT for producer id %d refused (INVALID_REQUEST): the agent takes only an admin's ABORT of a hanging "
                    "transaction; a transaction commits through its producer's EndTxn", producer_id)
        return dict.fromkeys(wanted, codec.ErrorCode.invalid_request)
    live, unknown = await _live_partitions(broker, wanted)
    errors = dict.fromkeys(unknown, codec.ErrorCode.unknown_topic_or_partition)
    try:
        older = await broker.transactions.abort_for_admin(producer_id, epoch, live) if live else set()
    except TxnRefusal as refused:
        log.warning("WriteTxnMarkers ABORT for producer id %d refused: %s", producer_id, refused)
        return {**errors, **dict.fromkeys(live, codec.ErrorCode.concurrent_transactions)}
    except CatalogUnavailableError as exc:  # retriable, as Produce answers it
        log.warning("WriteTxnMarkers ABORT for producer id %d answered KAFKA_STORAGE_ERROR: %s", producer_id, exc)
        return {**errors, **dict.fromkeys(live, codec.ErrorCode.kafka_storage_error)}
    return {**errors, **{tp: codec.ErrorCode.invalid_producer_epoch if tp in older else codec.ErrorCode.none for tp in live}}
