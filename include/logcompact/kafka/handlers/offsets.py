"""OffsetCommit (key 8) v0-8 and OffsetFetch (key 9) v0-8: consumer groups' committed offsets, rows of the
catalog's `group_offsets`; OffsetFetch v7+ `require_stable` answers a partition with offsets pending in an open
transaction (TxnOffsetCommit) UNSTABLE_OFFSET_COMMIT.

A commit is checked by the group's coordinator as Kafka checks it (`GroupCoordinator.commit_error`), then
written in one small transaction of its own, all of its partitions or none; it is answered once written, or
COORDINATOR_NOT_AVAILABLE when not written within offsets.commit.timeout.ms (the client commits again). Reads
come from the catalog, so a coordinator that takes a group over, or restarts, serves what was committed before.
Kafka's rule is kept that only the coordinator answers both APIs (NOT_COORDINATOR elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Collection, Sequence
from typing import Any

from logcompact.catalog.acls import AclOperation
from logcompact.catalog.groups import CommittedOffset
from logcompact.exceptions import CatalogUnavailableError
from logcompact.kafka import codec, records
from logcompact.kafka.broker import Broker
from logcompact.units import wall_clock_ms

OFFSET_COMMIT, OFFSET_FETCH = 8, 9
MAX_METADATA_BYTES = 4096  # Kafka's offset.metadata.max.bytes
NO_OFFSET = -1

log = logging.getLogger(__name__)

Partitions = list[tuple[str, list[tuple[int, Any]]]]  # per topic, per partition: what is answered


async def offset_commit(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    requested = [(topic.name, list(topic.partitions)) for topic in body.topics]
    # As Kafka: READ on the group, else every partition GROUP_AUTHORIZATION_FAILED; READ on each topic, else its
    # partitions TOPIC_AUTHORIZATION_FAILED while the others are committed.
    if not broker.authorizer.authorize_group(request.session, AclOperation.READ, body.group_id):
        answered: Partitions | codec.ErrorCode = codec.ErrorCode.group_authorization_failed
        denied: set[str] = set()
    else:
        denied = broker.authorizer.denied_topics(request.session, AclOperation.READ, (name for name, _ in requested))
        error = await _commit_error(broker, body)
        answered = error if error is not None else await write_bounded(
            broker, "offset commit", body.group_id, lambda: _commit(broker, body.group_id, requested, denied),
        )
    return codec.build(codec.response_class(OFFSET_COMMIT, version), {"throttle_time": 0, "topics": answer_topics(requested, answered, denied)})


async def write_bounded(broker: Broker, what: str, group_id: str, write: Callable[[], Partitions]) -> Partitions | codec.ErrorCode:
    """`write` run off the event loop, bounded as Kafka bounds an offsets append (offsets.commit.timeout.ms), whose
    timeout it answers as COORDINATOR_NOT_AVAILABLE: the client finds the coordinator and commits again. The write a
    timeout leaves running may still land, which a retry of the same offsets makes harmless. Its answers, or the
    error of every partition."""
    writing = asyncio.ensure_future(asyncio.to_thread(write))
    try:
        return await asyncio.wait_for(asyncio.shield(writing), broker.groups.commit_timeout_ms / 1000)
    except CatalogUnavailableError:  # retriable: the client commits again
        return codec.ErrorCode.coordinator_not_available
    except TimeoutError:
        writing.add_done_callback(_report_late_failure)
        log.warning("%s of group %r not written within offsets.commit.timeout.ms (%d ms): answered "
                    "COORDINATOR_NOT_AVAILABLE, the client commits again", what, group_id, broker.groups.commit_timeout_ms)
        return codec.ErrorCode.coordinator_not_available


def answer_topics(
    requested: Sequence[tuple[str, Sequence[Any]]], answered: Partitions | codec.ErrorCode, denied: Collection[str] = (),
) -> list[dict[str, Any]]:
    """The topics of an OffsetCommit or TxnOffsetCommit answer: each partition's, or one error on all but those of the
    `denied` topics (TOPIC_AUTHORIZATION_FAILED whatever the group's answer, as Kafka)."""
    if isinstance(answered, codec.ErrorCode):
        error = answered
        answered = [
            (name, [(int(p.partition_index), codec.ErrorCode.topic_authorization_failed if name in denied else error) for p in partitions])
            for name, partitions in requested
        ]
    return [{"name": name, "partitions": [{"partition_index": index, "error_code": answer} for index, answer in partitions]} for name, partitions in answered]


async def _commit_error(broker: Broker, body: Any) -> codec.ErrorCode | None:
    if not broker.coordinates(body.group_id):
        return codec.ErrorCode.not_coordinator
    generation = int(getattr(body, "generation_id_or_member_epoch", -1))  # v0 has none: a commit outside group management
    member_id, instance_id = getattr(body, "member_id", ""), getattr(body, "group_instance_id", None)
    group = await broker.groups.group(body.group_id, create=False)
    error = broker.groups.commit_error(group, generation, member_id, instance_id)
    if error is None and group is None:  # the first commit of a consumer that assigns itself: an Empty group, as Kafka
        await broker.groups.group(body.group_id, create=True)
    return error


def _report_late_failure(writing: asyncio.Future) -> None:
    """A commit answered as timed out that then failed: said once, as the error it was."""
    if not writing.cancelled() and writing.exception() is not None:
        log.warning("offset commit answered as timed out then failed: %s", writing.exception())


def _commit(broker: Broker, group_id: str, requested: Sequence[tuple[str, Sequence[Any]]], denied: set[str]) -> Partitions:
    offsets, answered = checked_offsets(broker, requested, denied)
    broker.groups.catalog.commit_offsets(group_id, offsets)
    return answered


def checked_offsets(
    broker: Broker, requested: Sequence[tuple[str, Sequence[Any]]], denied: set[str],
) -> tuple[dict[tuple[str, int], CommittedOffset], Partitions]:
    """The offsets of a commit that may be written, and each partition's answer: a partition of a `denied` topic
    (no READ on it) is TOPIC_AUTHORIZATION_FAILED, one the catalog does not have UNKNOWN_TOPIC_OR_PARTITION, metadata
    over offset.metadata.max.bytes OFFSET_METADATA_TOO_LARGE, as Kafka (the others are written)."""
    topics = broker.catalog.snapshot().topics
    now_ms = wall_clock_ms()
    offsets: dict[tuple[str, int], CommittedOffset] = {}
    answered: Partitions = []
    for name, partitions in requested:
        topic = topics.get(name)
        answers = []
        for entry in partitions:
            index = int(entry.partition_index)
            metadata = entry.committed_metadata or ""
            if name in denied:
                answers.append((index, codec.ErrorCode.topic_authorization_failed))
            elif topic is None or not 0 <= index < topic.partitions:
                answers.append((index, codec.ErrorCode.unknown_topic_or_partition))
            elif len(metadata.encode()) > MAX_METADATA_BYTES:
                answers.append((index, codec.ErrorCode.offset_metadata_too_large))
            else:
                epoch = int(getattr(entry, "committed_leader_epoch", records.NO_LEADER_EPOCH))
                offsets[(name, index)] = CommittedOffset(int(entry.committed_offset), epoch, metadata, now_ms)
                answers.append((index, codec.ErrorCode.none))
        answered.append((name, answers))
    return offsets, answered


async def offset_fetch(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    response_class = codec.response_class(OFFSET_FETCH, version)
    require_stable = bool(getattr(body, "require_stable", False))  # v7+
    if version >= 8:
        groups = [await _fetch(broker, request, group.group_id, group.topics, require_stable) for group in body.groups]
        return codec.build(response_class, {"throttle_time": 0, "groups": [
            {"group_id": group.group_id, "error_code": error, "topics": topics if error == codec.ErrorCode.none else []}
            for group, (error, topics) in zip(body.groups, groups)
        ]})
    error, topics = await _fetch(broker, request, body.group_id, body.topics, require_stable)
    if version < 2 and error != codec.ErrorCode.none:  # no request-level error before v2: on every partition
        for topic in topics:
            for partition in topic["partitions"]:
                partition["error_code"] = error
    elif error != codec.ErrorCode.none:  # from v2 the request's error, and no partitions, as Kafka
        topics = []
    return codec.build(response_class, {"throttle_time": 0, "error_code": error, "topics": topics})


async def _fetch(
    broker: Broker, request: codec.Request, group_id: str, wanted: Sequence[Any] | None, require_stable: bool,
) -> tuple[codec.ErrorCode, list[dict[str, Any]]]:
    """The group's committed offsets: of the partitions asked (-1 for those never committed), or all (topics null).
    Offsets pending in an open transaction are never shown; with `require_stable` (v7+), a partition that has some
    is UNSTABLE_OFFSET_COMMIT, offset -1, as Kafka answers it: the consumer asks again once the transaction ended.
    As Kafka: GROUP_AUTHORIZATION_FAILED without DESCRIBE on the group; a topic asked for without DESCRIBE has its
    partitions TOPIC_AUTHORIZATION_FAILED, and is left out of an answer of every committed one."""
    authorizer, session = broker.authorizer, request.session
    names = None if wanted is None else [topic.name for topic in wanted]
    error = codec.ErrorCode.none
    committed: dict[tuple[str, int], CommittedOffset] = {}
    unstable: set[tuple[str, int]] = set()
    if not authorizer.authorize_group(session, AclOperation.DESCRIBE, group_id):
        error = codec.ErrorCode.group_authorization_failed
    elif not broker.coordinates(group_id):
        error = codec.ErrorCode.not_coordinator
    else:
        try:
            if require_stable:
                partitions = None if wanted is None else _asked(wanted, committed)  # None: every committed one
                committed, unstable = await asyncio.to_thread(broker.groups.catalog.fetch_offsets, group_id, names, partitions)
            else:
                committed = await asyncio.to_thread(broker.groups.catalog.committed_offsets, group_id, names)
        except CatalogUnavailableError:
            error = codec.ErrorCode.coordinator_not_available
    denied = authorizer.denied_topics(session, AclOperation.DESCRIBE, {name for name, _ in committed} if wanted is None else names or ())
    if wanted is None:
        committed = {key: offset for key, offset in committed.items() if key[0] not in denied}
    asked: dict[str, list[int]] = {}
    for name, index in _asked(wanted, committed):
        asked.setdefault(name, []).append(index)
    topics = [
        {"name": name, "partitions": [
            _unauthorized_partition(index) if name in denied else _partition(index, committed.get((name, index)), (name, index) in unstable) for index in indexes
        ]}
        for name, indexes in asked.items()
    ]
    return error, topics


def _asked(wanted: Sequence[Any] | None, committed: dict[tuple[str, int], CommittedOffset]) -> list[tuple[str, int]]:
    """The partitions an OffsetFetch answers, in its order: those asked, or every committed one (topics null)."""
    if wanted is None:
        return sorted(committed)
    return [(topic.name, int(index)) for topic in wanted for index in topic.partition_indexes]


def _unauthorized_partition(index: int) -> dict[str, Any]:
    """Kafka's OffsetFetchResponse.UNAUTHORIZED_PARTITION."""
    return {"partition_index": index, "committed_offset": NO_OFFSET, "committed_leader_epoch": records.NO_LEADER_EPOCH, "metadata": "",
            "error_code": codec.ErrorCode.topic_authorization_failed}


def _partition(index: int, committed: CommittedOffset | None, unstable: bool) -> dict[str, Any]:
    if unstable:
        return {"partition_index": index, "committed_offset": NO_OFFSET, "committed_leader_epoch": records.NO_LEADER_EPOCH, "metadata": "",
                "error_code": codec.ErrorCode.unstable_offset_commit}
    if committed is None:
        return {"partition_index": index, "committed_offset": NO_OFFSET, "committed_leader_epoch": records.NO_LEADER_EPOCH, "metadata": "", "error_code": codec.ErrorCode.none}
    return {"partition_index": index, "committed_offset": committed.offset, "committed_leader_epoch": committed.leader_epoch,
            "metadata": committed.metadata, "error_code": codec.ErrorCode.none}
