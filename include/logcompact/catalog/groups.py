"""Consumer groups in the catalog: their committed offsets (`group_offsets`) and their coordinator's last
account of them (`consumer_groups`): generation, protocol, leader and members, each with its ids, timeouts,
protocols' metadata and assignment, which the next coordinator loads (Kafka keeps the same in __consumer_offsets).

These rows are not part of the manifest: each write is its own small transaction that creates no version, so
committing offsets never contends with appends and compactions for the version row. Every agent reads them, so
committed offsets and the list of groups outlive the agent that wrote them. Functions of a Connection, called by
`Catalog` (`commit_offsets`, `save_group`, ...), whose transactions they run in.
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, or_, select

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


def _member_json(member: StoredMember) -> dict[str, Any]:
    return {
        "member_id": member.member_id, "group_instance_id": member.instance_id, "client_id": member.client_id,
        "session_timeout_ms": member.session_ms, "rebalance_timeout_ms": member.rebalance_ms,
        "protocols": [[name, _text(metadata)] for name, metadata in member.protocols], "assignment": _text(member.assignment),
    }


def _text(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _members_of(text: str) -> tuple[StoredMember, ...]:
    return tuple(
        StoredMember(str(m["member_id"]), None if m["group_instance_id"] is None else str(m["group_instance_id"]), str(m["client_id"]),
                     int(m["session_timeout_ms"]), int(m["rebalance_timeout_ms"]),
                     tuple((str(name), base64.b64decode(metadata, validate=True)) for name, metadata in m["protocols"]),
                     base64.b64decode(m["assignment"], validate=True))
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
