"""Consumer groups in the catalog: their committed offsets (`group_offsets`) and their coordinator's last
account of them (`consumer_groups`): generation, protocol, leader and members, each with its ids, timeouts,
protocols' metadata and assignment, which the next coordinator loads (Kafka keeps the same in __consumer_offsets).

These rows are not part of the manifest: each write is its own small transaction that creates no version, so
committing offsets never contends with appends and compactions for the version row. Every agent reads them, so
committed offsets and the list of groups outlive the agent that wrote them. Functions of a Connection, called by
`Catalog` (`commit_offsets`, `save_group`, ...), whose transactions they run in.

A group is gone (Kafka's Dead) once it has neither row nor offsets: DeleteGroups and `logcompact groups delete`
delete both of an Empty group (`delete_group`), OffsetDelete some of its offsets (`delete_offsets`), and the
group's coordinator expires the offsets of a group left Empty past offsets.retention.minutes, then its row
(`expire_offsets`), as Kafka's coordinator does.
"""

from __future__ import annotations

import base64
import enum
import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, delete, exists, or_, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import upsert

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


@dataclass(frozen=True)
class StoredMember:
    """A member as its coordinator keeps it: what a coordinator that loads the group needs to go on with it."""

    member_id: str
    instance_id: str | None
    client_id: str
    session_ms: int
    rebalance_ms: int
    protocols: tuple[tuple[str, bytes], ...]  # (name, metadata), in the member's order of preference
    assignment: bytes
    client_host: str = ""  # its connection's address as Kafka shows it ("/127.0.0.1"); "" in rows written before it was kept


@dataclass(frozen=True)
class GroupRow:
    """A group as its coordinator last wrote it."""

    group_id: str
    coordinator: int
    generation: int
    protocol_type: str
    protocol: str
    state: str
    leader: str
    members: tuple[StoredMember, ...]
    updated_ms: int


@dataclass(frozen=True)
class GroupListed:
    """A group as ListGroups shows it: its row without the members."""

    group_id: str
    protocol_type: str
    state: str


def commit_offsets(connection: Connection, group_id: str, offsets: Mapping[tuple[str, int], CommittedOffset]) -> None:
    """Store a group's offsets for these partitions, all or none, replacing what each had. The rows are written in
    (topic, partition) order, whatever order the request named them in: two commits of the same partitions in
    opposite orders would otherwise each hold a row the other waits for (PostgreSQL aborts one as a deadlock)."""
    rows = [
        {"group_id": group_id, "topic": topic, "partition": partition, "committed_offset": committed.offset,
         "leader_epoch": committed.leader_epoch, "metadata": committed.metadata, "commit_ms": committed.commit_ms}
        for (topic, partition), committed in sorted(offsets.items(), key=lambda item: item[0])
    ]
    table = s.group_offsets
    statement = upsert(connection, table)
    kept = statement.excluded
    connection.execute(statement.on_conflict_do_update(
        index_elements=[table.c.group_id, table.c.topic, table.c.partition],
        set_={name: kept[name] for name in ("committed_offset", "leader_epoch", "metadata", "commit_ms")},
    ), rows)


def committed_offsets(connection: Connection, group_id: str, topics: Sequence[str] | None = None) -> dict[tuple[str, int], CommittedOffset]:
    """A group's committed offsets, of every topic or of those named."""
    table = s.group_offsets
    query = select(table.c.topic, table.c.partition, table.c.committed_offset, table.c.leader_epoch, table.c.metadata, table.c.commit_ms)
    query = query.where(table.c.group_id == group_id)
    if topics is not None:
        query = query.where(table.c.topic.in_(sorted(set(topics))))
    return {(row.topic, row.partition): CommittedOffset(row.committed_offset, row.leader_epoch, row.metadata, row.commit_ms)
            for row in connection.execute(query)}


def save_group(connection: Connection, group: GroupRow, loaded: GroupRow | None = None) -> bool:
    """Write the group's row unless another coordinator wrote it since this one took the group; returns whether
    it was written. Without `loaded` the stored row must be this coordinator's (`group.coordinator`), or none;
    with `loaded`, the row the coordinator loaded the group from (taking it over), it must still be that row, or
    be this coordinator's: a takeover written already whose answer was lost with the connection, written again.
    So a coordinator that lost the group, and does not know it yet, never overwrites its successor's row."""
    table = s.consumer_groups
    row = {
        "group_id": group.group_id, "coordinator": group.coordinator, "generation": group.generation,
        "protocol_type": group.protocol_type, "protocol": group.protocol, "state": group.state, "leader": group.leader,
        "members": json.dumps([_member_json(member) for member in group.members]), "updated_ms": group.updated_ms,
    }
    c = table.c
    if loaded is None:
        unchanged = c.coordinator == group.coordinator
    else:
        unchanged = or_(c.coordinator == group.coordinator,
                        and_(c.coordinator == loaded.coordinator, c.generation == loaded.generation, c.state == loaded.state,
                             c.updated_ms == loaded.updated_ms))
    statement = upsert(connection, table)
    written = connection.execute(statement.on_conflict_do_update(
        index_elements=[c.group_id],
        set_={name: statement.excluded[name] for name in row if name != "group_id"},
        where=unchanged,
    ).returning(c.group_id), row).first()  # an update the WHERE skips returns no row (psycopg's rowcount counted it)
    return written is not None


def group(connection: Connection, group_id: str) -> GroupRow | None:
    row = connection.execute(select(s.consumer_groups).where(s.consumer_groups.c.group_id == group_id)).first()
    return None if row is None else _group_of_row(row)


def listed(connection: Connection) -> list[GroupListed]:
    """Every group, without its members (which hold their metadata and assignments)."""
    c = s.consumer_groups.c
    rows = connection.execute(select(c.group_id, c.protocol_type, c.state).order_by(c.group_id)).all()
    return [GroupListed(row.group_id, row.protocol_type, row.state) for row in rows]


EMPTY, STABLE = "Empty", "Stable"  # Kafka's states of a group: without members, and with its members' assignments
NO_COORDINATOR = -1  # the coordinator of a row written outside any agent (`reset_offsets`): the next to load it takes it over


class Deletion(enum.Enum):
    """What `delete_group` did."""

    DELETED = "deleted"
    NOT_FOUND = "not found"  # neither a row nor offsets: Kafka's GROUP_ID_NOT_FOUND
    NOT_EMPTY = "not empty"  # its row says it has members: Kafka's NON_EMPTY_GROUP


def group_ids(connection: Connection) -> list[str]:
    """Every group with a row or committed offsets, in order."""
    rows = select(s.consumer_groups.c.group_id).union(select(s.group_offsets.c.group_id).distinct())
    return sorted(connection.execute(rows).scalars())


def _locked_row(connection: Connection, group_id: str) -> GroupRow | None:
    """The group's row, locked till the transaction ends (PostgreSQL; SQLite's writers hold the database already)."""
    table = s.consumer_groups
    row = connection.execute(select(table).where(table.c.group_id == group_id).with_for_update()).first()
    return None if row is None else _group_of_row(row)


def _has_offsets(connection: Connection, group_id: str) -> bool:
    return bool(connection.execute(select(exists().where(s.group_offsets.c.group_id == group_id))).scalar())


def delete_group(connection: Connection, group_id: str) -> Deletion:
    """Kafka's DeleteGroups of one group: an Empty group (or one with offsets and no row) loses its committed offsets
    and its row. Offsets pending in an open transaction stay, as in Kafka: the transaction's commit writes them."""
    row = _locked_row(connection, group_id)
    if row is not None and row.state != EMPTY:
        return Deletion.NOT_EMPTY
    removed = connection.execute(delete(s.group_offsets).where(s.group_offsets.c.group_id == group_id)).rowcount
    if row is None and not removed:
        return Deletion.NOT_FOUND
    connection.execute(delete(s.consumer_groups).where(s.consumer_groups.c.group_id == group_id))
    return Deletion.DELETED


def delete_offsets(connection: Connection, group_id: str, partitions: Collection[tuple[str, int]]) -> bool:
    """Kafka's OffsetDelete once its coordinator allowed it: the group's offsets of these partitions deleted (those it
    has). Returns whether the group exists (a row or offsets); nothing is deleted of one that does not."""
    if _locked_row(connection, group_id) is None and not _has_offsets(connection, group_id):
        return False
    c = s.group_offsets.c
    by_topic: dict[str, list[int]] = {}
    for topic, partition in partitions:
        by_topic.setdefault(topic, []).append(partition)
    for topic, indexes in sorted(by_topic.items()):
        connection.execute(delete(s.group_offsets).where(c.group_id == group_id, c.topic == topic, c.partition.in_(sorted(set(indexes)))))
    return True


def reset_offsets(connection: Connection, group_id: str, offsets: Mapping[tuple[str, int], CommittedOffset], now_ms: int) -> str | None:
    """`logcompact groups reset-offsets --execute`: store the offsets of a group that has no members, as Kafka's
    coordinator takes an admin's commit only for an Empty group (or a new one, whose row is written here, Empty, for
    ListGroups). Returns None once written, else the state of the group that refused them."""
    row = _locked_row(connection, group_id)
    if row is not None and row.state != EMPTY:
        return row.state
    if row is None:
        new = {"group_id": group_id, "coordinator": NO_COORDINATOR, "generation": 0, "protocol_type": "", "protocol": "", "state": EMPTY,
               "leader": "", "members": "[]", "updated_ms": now_ms}
        connection.execute(upsert(connection, s.consumer_groups).on_conflict_do_nothing(index_elements=[s.consumer_groups.c.group_id]), new)
    commit_offsets(connection, group_id, offsets)
    return None


def expire_offsets(connection: Connection, group_id: str, cutoff_ms: int, subscribed: Callable[[GroupRow], Collection[str] | None]) -> int:
    """Kafka's offsets.retention.minutes for one group, as its coordinator's cleanup (removeExpiredOffsets) decides,
    with `cutoff_ms` now less the retention. Offsets committed at or before the cutoff are deleted:
    - all of them, of a group left Empty at or before it;
    - each by its own commit time, of a group without a protocol type (a consumer assigning its own partitions) or
      without a row;
    - of a Stable group, those of the topics its members do not subscribe to (`subscribed` of its row, None when not
      known: then none).
    A group left Empty at or before the cutoff with no offsets left is then deleted (Kafka's Dead). Unlike Kafka, an
    offset committed after the cutoff to a group Empty since before it stays: its own commit time counts too.
    Returns how many offsets were deleted."""
    row = _locked_row(connection, group_id)
    c = s.group_offsets.c
    expired = and_(c.group_id == group_id, c.commit_ms <= cutoff_ms)
    empty_long = row is not None and row.state == EMPTY and row.updated_ms <= cutoff_ms
    removed = 0
    if row is None or not row.protocol_type or empty_long:
        removed = connection.execute(delete(s.group_offsets).where(expired)).rowcount
    elif row.state == STABLE and (topics := subscribed(row)) is not None:
        removed = connection.execute(delete(s.group_offsets).where(expired, c.topic.not_in(sorted(topics)))).rowcount
    if empty_long and not _has_offsets(connection, group_id):
        connection.execute(delete(s.consumer_groups).where(s.consumer_groups.c.group_id == group_id))
    return int(removed)


def _member_json(member: StoredMember) -> dict[str, Any]:
    return {
        "member_id": member.member_id, "group_instance_id": member.instance_id, "client_id": member.client_id,
        "session_timeout_ms": member.session_ms, "rebalance_timeout_ms": member.rebalance_ms,
        "protocols": [[name, _text(metadata)] for name, metadata in member.protocols], "assignment": _text(member.assignment),
        "client_host": member.client_host,
    }


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _members_of(text: str) -> tuple[StoredMember, ...]:
    return tuple(
        StoredMember(str(m["member_id"]), None if m["group_instance_id"] is None else str(m["group_instance_id"]), str(m["client_id"]),
                     int(m["session_timeout_ms"]), int(m["rebalance_timeout_ms"]),
                     tuple((str(name), base64.b64decode(metadata, validate=True)) for name, metadata in m["protocols"]),
                     base64.b64decode(m["assignment"], validate=True), str(m.get("client_host", "")))
        for m in json.loads(text)
    )


def _group_of_row(row: Any) -> GroupRow:
    try:
        members = _members_of(row.members)
    except (ValueError, TypeError, KeyError) as exc:  # binascii.Error and JSONDecodeError are ValueErrors
        # Only the members are lost, as a coordinator that kept none: they join again, the rest of the row stands.
        log.warning("catalog row consumer_groups %r is damaged: its members are not JSON as logcompact writes them (%s: %s); "
                    "the group is loaded without members, which join it again", row.group_id, type(exc).__name__, exc)
        members = ()
    return GroupRow(row.group_id, row.coordinator, row.generation, row.protocol_type, row.protocol, row.state, row.leader,
                    members, row.updated_ms)
