"""AddPartitionsToTxn (key 24) v0-3, AddOffsetsToTxn (key 25) v0-3 and EndTxn (key 26) v0-3: a transactional
producer's transaction, through its coordinator (`TransactionCoordinator`; NOT_COORDINATOR on another agent, as
Kafka); and TxnOffsetCommit (key 28) v0-3, a consumer group's offsets committed in it, through the group's.

As Kafka's KafkaApis: AddPartitionsToTxn naming a topic or partition the catalog does not have answers it
UNKNOWN_TOPIC_OR_PARTITION and every other partition OPERATION_NOT_ATTEMPTED, adding none; otherwise its
partitions are all added, or all answered the coordinator's one error (INVALID_PRODUCER_ID_MAPPING for a producer id
the transactional id does not hold, PRODUCER_FENCED for another epoch, from v2 on: INVALID_PRODUCER_EPOCH before).
EndTxn commits or aborts the open transaction in one catalog transaction: a marker offset in each partition added
to it, its data's offsets recorded as aborted on abort. A retry of the outcome that ended it is answered NONE, the
other outcome INVALID_TXN_STATE; another epoch PRODUCER_FENCED (v2+; INVALID_PRODUCER_EPOCH before).
AddOffsetsToTxn adds a consumer group to the transaction, and begins it, as Kafka adds the group's offsets
partition; its errors are AddPartitionsToTxn's. TxnOffsetCommit, to the group's coordinator, writes its offsets as
pending in the transaction, committed with it and dropped if it aborts: the transaction must be open with the group
added (INVALID_TXN_STATE else), held by the producer id (INVALID_PRODUCER_ID_MAPPING) at its epoch
(INVALID_PRODUCER_EPOCH: in Kafka the offsets append's producer check answers it, at every version); v3 names the
consumer's generation, member id and instance id, checked as Kafka does (`GroupCoordinator.txn_commit_error`:
ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID, FENCED_INSTANCE_ID). Its partitions are checked and its write bounded as
OffsetCommit's (`offsets.checked_offsets`, `offsets.write_bounded`).
AddPartitionsToTxn v4+ (broker-to-broker batches), EndTxn v4+ and TxnOffsetCommit v4+ (KIP-890) are not served.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any

from logcompact.catalog.acls import AclOperation
from logcompact.catalog.transactions import TxnRefusal
from logcompact.exceptions import CatalogUnavailableError, InvalidRecordError, TopicNotFoundError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.kafka.handlers import offsets
from logcompact.kafka.transaction_coordinator import error_code, fenced

ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT = 24, 25, 26, 28
# The versions that added PRODUCER_FENCED (INVALID_PRODUCER_EPOCH before), as their message schemas say.
ADD_PARTITIONS_FENCED_SINCE = ADD_OFFSETS_FENCED_SINCE = END_TXN_FENCED_SINCE = 2
# TxnOffsetCommit's served versions never answer it: Kafka's offsets append refuses a fenced producer with
# INVALID_PRODUCER_EPOCH (and its schema lists no PRODUCER_FENCED).
TXN_OFFSET_COMMIT_FENCED_SINCE = 4

log = logging.getLogger(__name__)


async def add_partitions_to_txn(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    transactional_id = body.v3_and_below_transactional_id
    wanted = [(topic.name, int(partition)) for topic in body.v3_and_below_topics for partition in topic.partitions]
    authorizer, session = broker.authorizer, request.session
    # As Kafka: WRITE on the transactional id, else every partition TRANSACTIONAL_ID_AUTHORIZATION_FAILED; WRITE on
    # each topic, else its partitions TOPIC_AUTHORIZATION_FAILED and none added (OPERATION_NOT_ATTEMPTED).
    denied = authorizer.denied_topics(session, AclOperation.WRITE, (name for name, _ in wanted))
    if not authorizer.authorize_transactional_id(session, AclOperation.WRITE, transactional_id):
        errors = dict.fromkeys(wanted, codec.ErrorCode.transactional_id_authorization_failed)
    elif denied:
        errors = await _unknown_partitions(broker, wanted, denied)
    else:
        errors = dict.fromkeys(wanted, await _add_error(broker, body, transactional_id, wanted, version))
        if errors and next(iter(errors.values())) == codec.ErrorCode.unknown_topic_or_partition:
            errors = await _unknown_partitions(broker, wanted, denied)
    return codec.build(codec.response_class(ADD_PARTITIONS_TO_TXN, version), {
        "throttle_time": 0,
        "results_by_topic_v3_and_below": [
            {"name": topic.name, "results_by_partition": [
                {"partition_index": int(partition), "partition_error_code": errors[(topic.name, int(partition))]} for partition in topic.partitions
            ]}
            for topic in body.v3_and_below_topics
        ],
    })


async def _add_error(broker: Broker, body: Any, transactional_id: str, wanted: list[tuple[str, int]], version: int) -> codec.ErrorCode:
    """The one error of every partition of the request (NONE when they were added), or UNKNOWN_TOPIC_OR_PARTITION
    when one of them is not the catalog's (then told apart by `_unknown_partitions`)."""
    try:
        return await _coordinated(
            broker, "AddPartitionsToTxn", transactional_id, version, ADD_PARTITIONS_FENCED_SINCE,
            lambda: broker.transactions.add_partitions(transactional_id, int(body.v3_and_below_producer_id), int(body.v3_and_below_producer_epoch), wanted),
        )
    except (TopicNotFoundError, InvalidRecordError):
        return codec.ErrorCode.unknown_topic_or_partition


async def _coordinated(
    broker: Broker, api: str, transactional_id: str, version: int, fenced_since: int, call: Callable[[], Awaitable[object]]
) -> codec.ErrorCode:
    """The error of a request the transactional id's coordinator serves by `call`: NONE when it was taken, a
    refusal's code (PRODUCER_FENCED as `version` may answer it), or COORDINATOR_NOT_AVAILABLE while the catalog
    cannot be reached (retriable: the client sends it again)."""
    if not transactional_id:
        return codec.ErrorCode.invalid_request
    if not broker.transactions.coordinates(transactional_id):
        return codec.ErrorCode.not_coordinator
    try:
        await call()
    except TxnRefusal as refused:
        log.debug("%s of transactional id %r refused: %s", api, transactional_id, refused)
        return fenced(error_code(refused.error), version, fenced_since)
    except CatalogUnavailableError as exc:
        log.warning("%s of transactional id %r answered COORDINATOR_NOT_AVAILABLE: %s", api, transactional_id, exc)
        return codec.ErrorCode.coordinator_not_available
    return codec.ErrorCode.none


async def _unknown_partitions(broker: Broker, wanted: list[tuple[str, int]], denied: set[str]) -> dict[tuple[str, int], codec.ErrorCode]:
    """Kafka's answer to partitions some of which may not be written or do not exist: those of `denied` topics
    TOPIC_AUTHORIZATION_FAILED, those not in the catalog UNKNOWN_TOPIC_OR_PARTITION, the others OPERATION_NOT_ATTEMPTED
    (none was added)."""
    topics = (await asyncio.to_thread(broker.catalog.snapshot)).topics
    return {
        (name, partition): codec.ErrorCode.topic_authorization_failed if name in denied
        else codec.ErrorCode.operation_not_attempted if name in topics and 0 <= partition < topics[name].partitions
        else codec.ErrorCode.unknown_topic_or_partition
        for name, partition in wanted
    }


async def add_offsets_to_txn(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    authorizer, session = broker.authorizer, request.session
    if not authorizer.authorize_transactional_id(session, AclOperation.WRITE, body.transactional_id):
        error = codec.ErrorCode.transactional_id_authorization_failed
    elif not authorizer.authorize_group(session, AclOperation.READ, body.group_id):
        error = codec.ErrorCode.group_authorization_failed
    else:
        error = await _coordinated(
            broker, "AddOffsetsToTxn", body.transactional_id, version, ADD_OFFSETS_FENCED_SINCE,
            lambda: broker.transactions.add_offsets(body.transactional_id, int(body.producer_id), int(body.producer_epoch), body.group_id),
        )
    return codec.build(codec.response_class(ADD_OFFSETS_TO_TXN, version), {"throttle_time": 0, "error_code": error})


async def txn_offset_commit(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    requested = [(topic.name, list(topic.partitions)) for topic in body.topics]
    # As Kafka: WRITE on the transactional id and READ on the group, else every partition's error is theirs; READ on
    # each topic, else its partitions TOPIC_AUTHORIZATION_FAILED while the others are committed.
    authorizer, session = broker.authorizer, request.session
    denied: set[str] = set()
    answered: offsets.Partitions | codec.ErrorCode
    if not authorizer.authorize_transactional_id(session, AclOperation.WRITE, body.transactional_id):
        answered = codec.ErrorCode.transactional_id_authorization_failed
    elif not authorizer.authorize_group(session, AclOperation.READ, body.group_id):
        answered = codec.ErrorCode.group_authorization_failed
    else:
        denied = authorizer.denied_topics(session, AclOperation.READ, (name for name, _ in requested))
        answered = await _txn_commit(broker, body, version, requested, denied)
    return codec.build(codec.response_class(TXN_OFFSET_COMMIT, version), {"throttle_time": 0, "topics": offsets.answer_topics(requested, answered, denied)})


async def _txn_commit(
    broker: Broker, body: Any, version: int, requested: list[tuple[str, list[Any]]], denied: set[str],
) -> offsets.Partitions | codec.ErrorCode:
    """Each partition's answer, or the one error of all of them."""
    if not body.transactional_id:
        return codec.ErrorCode.invalid_request
    if not body.group_id:
        return codec.ErrorCode.invalid_group_id
    if not broker.coordinates(body.group_id):
        return codec.ErrorCode.not_coordinator
    generation = int(getattr(body, "generation_id", -1))  # v3 on (KIP-447)
    member_id, instance_id = getattr(body, "member_id", ""), getattr(body, "group_instance_id", None)
    group = await broker.groups.group(body.group_id, create=False)
    error = broker.groups.txn_commit_error(group, generation, member_id, instance_id)
    if error is not None:
        return error
    try:
        answered = await offsets.write_bounded(broker, "transactional offset commit", body.group_id, lambda: _commit_pending(broker, body, requested, denied))
    except TxnRefusal as refused:
        log.debug("TxnOffsetCommit of transactional id %r for group %r refused: %s", body.transactional_id, body.group_id, refused)
        return fenced(error_code(refused.error), version, TXN_OFFSET_COMMIT_FENCED_SINCE)
    if group is None and not isinstance(answered, codec.ErrorCode):  # as Kafka, a commit taken makes an Empty group
        await broker.groups.group(body.group_id, create=True)
    return answered


def _commit_pending(broker: Broker, body: Any, requested: list[tuple[str, list[Any]]], denied: set[str]) -> offsets.Partitions:
    pending, answered = offsets.checked_offsets(broker, requested, denied)
    broker.groups.catalog.commit_offsets_in_transaction(body.transactional_id, int(body.producer_id), int(body.producer_epoch), body.group_id, pending)
    return answered


async def end_txn(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    if not broker.authorizer.authorize_transactional_id(request.session, AclOperation.WRITE, body.transactional_id):
        error = codec.ErrorCode.transactional_id_authorization_failed
    else:
        error = await _coordinated(
            broker, "EndTxn", body.transactional_id, version, END_TXN_FENCED_SINCE,
            lambda: broker.transactions.end(body.transactional_id, int(body.producer_id), int(body.producer_epoch), bool(body.committed)),
        )
    return codec.build(codec.response_class(END_TXN, version), {"throttle_time": 0, "error_code": error})
