"""Consumer groups in the catalog: their committed offsets (`group_offsets`) and their coordinator's last
description of them (`consumer_groups`).

These rows are not part of the manifest: each write is its own small transaction that creates no version, so
committing offsets never contends with appends and compactions for the version row. Every agent reads them, so
committed offsets and the list of groups outlive the agent that wrote them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import WRITE, catalog_errors, upsert


@dataclass(frozen=True)
class CommittedOffset:
    offset: int
    leader_epoch: int
    metadata: str
    commit_ms: int


@dataclass(frozen=True)
class GroupRow:
    """A group as its coordinator last described it; `members` as DescribeGroups lists them (no metadata bytes)."""

    group_id: str
    coordinator: int
    generation: int
    protocol_type: str
    protocol: str
    state: str
    members: tuple[Mapping[str, Any], ...]
    updated_ms: int


class GroupCatalog:
    """The group tables of one catalog database (its engine: `Catalog.engine`)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            yield connection

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            connection.execution_options(**{WRITE: True})
            with connection.begin():
                yield connection

    def commit_offsets(self, group_id: str, offsets: Mapping[tuple[str, int], CommittedOffset]) -> None:
        """Store a group's offsets for these partitions, all or none, replacing what each had."""
        if not offsets:
            return
        rows = [
            {"group_id": group_id, "topic": topic, "partition": partition, "committed_offset": committed.offset,
             "leader_epoch": committed.leader_epoch, "metadata": committed.metadata, "commit_ms": committed.commit_ms}
            for (topic, partition), committed in offsets.items()
        ]
        table = s.group_offsets
        with self._writing() as connection:
            statement = upsert(connection, table)
            kept = statement.excluded
            connection.execute(statement.on_conflict_do_update(
                index_elements=[table.c.group_id, table.c.topic, table.c.partition],
                set_={name: kept[name] for name in ("committed_offset", "leader_epoch", "metadata", "commit_ms")},
            ), rows)

    def committed_offsets(self, group_id: str, topics: Sequence[str] | None = None) -> dict[tuple[str, int], CommittedOffset]:
        """A group's committed offsets, of every topic or of those named."""
        table = s.group_offsets
        query = select(table.c.topic, table.c.partition, table.c.committed_offset, table.c.leader_epoch, table.c.metadata, table.c.commit_ms)
        query = query.where(table.c.group_id == group_id)
        if topics is not None:
            query = query.where(table.c.topic.in_(sorted(set(topics))))
        with self._reading() as connection:
            return {(row.topic, row.partition): CommittedOffset(row.committed_offset, row.leader_epoch, row.metadata, row.commit_ms)
                    for row in connection.execute(query)}

    def save_group(self, group: GroupRow) -> None:
        table = s.consumer_groups
        row = {
            "group_id": group.group_id, "coordinator": group.coordinator, "generation": group.generation,
            "protocol_type": group.protocol_type, "protocol": group.protocol, "state": group.state,
            "members": json.dumps([dict(member) for member in group.members]), "updated_ms": group.updated_ms,
        }
        with self._writing() as connection:
            statement = upsert(connection, table)
            connection.execute(statement.on_conflict_do_update(
                index_elements=[table.c.group_id],
                set_={name: statement.excluded[name] for name in row if name != "group_id"},
            ), row)

    def group(self, group_id: str) -> GroupRow | None:
        with self._reading() as connection:
            row = connection.execute(select(s.consumer_groups).where(s.consumer_groups.c.group_id == group_id)).first()
        return None if row is None else _group_of_row(row)

    def groups(self) -> list[GroupRow]:
        with self._reading() as connection:
            rows = connection.execute(select(s.consumer_groups).order_by(s.consumer_groups.c.group_id)).all()
        return [_group_of_row(row) for row in rows]


def _group_of_row(row: Any) -> GroupRow:
    return GroupRow(row.group_id, row.coordinator, row.generation, row.protocol_type, row.protocol, row.state,
                    tuple(json.loads(row.members)), row.updated_ms)
