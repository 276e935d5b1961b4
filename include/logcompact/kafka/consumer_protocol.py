"""Kafka's consumer protocol, what the members of a group of protocol type `consumer` put in their JoinGroup metadata
(ConsumerProtocolSubscription) and what the leader gives each in SyncGroup (ConsumerProtocolAssignment), read as
Kafka's coordinator and kafka-consumer-groups read them. Both are the same in every version as far as read here
(a version, then the topics), and not flexible."""

from __future__ import annotations

import struct
from collections.abc import Iterable

CONSUMER_PROTOCOL_TYPE = "consumer"


class MalformedError(ValueError):
    """Bytes that are not the consumer protocol's."""


def subscribed_topics(protocol_type: str | None, protocol: str | None, metadata: Iterable[bytes]) -> frozenset[str] | None:
    """The topics a consumer group's members subscribe to, read from each one's metadata for the group's protocol;
    None for a group of another protocol type, without a protocol, or with metadata that does not parse, as Kafka's
    coordinator (which then counts no topic as subscribed)."""
    if protocol_type != CONSUMER_PROTOCOL_TYPE or not protocol:
        return None
    topics: set[str] = set()
    try:
        for data in metadata:
            _version, count = _unpack(">hi", data, 0)
            at = 6
            for _ in range(_count(count)):
                topic, at = _string(data, at)
                topics.add(topic)
    except MalformedError:
        return None
    return frozenset(topics)


def assigned_partitions(assignment: bytes) -> list[tuple[str, int]]:
    """The partitions a member's assignment gives it, in its order: [] for an empty assignment (a member before its
    first SyncGroup); MalformedError for bytes that are not an assignment."""
    if not assignment:
        return []
    _version, count = _unpack(">hi", assignment, 0)
    at = 6
    partitions: list[tuple[str, int]] = []
    for _ in range(_count(count)):
        topic, at = _string(assignment, at)
        (indexes,) = _unpack(">i", assignment, at)
        at += 4
        for _ in range(_count(indexes)):
            (index,) = _unpack(">i", assignment, at)
            partitions.append((topic, index))
            at += 4
    return partitions


def _unpack(layout: str, data: bytes, at: int) -> tuple[int, ...]:
    try:
        return struct.unpack_from(layout, data, at)
    except struct.error as exc:
        raise MalformedError(f"consumer protocol bytes end early at byte {at}") from exc


def _count(count: int) -> int:
    if count < 0:
        raise MalformedError(f"array of {count} entries")
    return count


def _string(data: bytes, at: int) -> tuple[str, int]:
    (length,) = _unpack(">h", data, at)
    end = at + 2 + length
    if length < 0 or end > len(data):
        raise MalformedError(f"string of {length} bytes at byte {at}")
    try:
        return data[at + 2:end].decode(), end
    except UnicodeDecodeError as exc:
        raise MalformedError(f"string at byte {at} is not UTF-8") from exc
