"""Each partition's floor above L0, the lowest first offset of its live sections above L0, kept in
`partition_floors` by every commit that adds or removes such sections, in its own transaction.

A plan's outside floors (per partition, the lowest offset a live file outside the plan holds) were minimums over
every live section of the plan's partitions: an L0 pass over 1,000 partitions read the whole index of sections,
half its time at 100,000 files (bench/planner.py). They are now this row, for a partition whose lowest section
above L0 is not among the plan's inputs, with the live L0 files the plan does not take (`plan.lowest_outside`).

A commit keeps each row exact at little cost: outputs can only lower it, and sections removed move it only when
they held it; then the partition's live sections above L0 are read again, through `sections_by_partition`. Each
row says the version that set it, and a snapshot older than that reads the sections instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Connection, bindparam, func, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import execute_many, one_of, upsert

# A partition, as (topic id, partition).
Slot = tuple[int, int]


def lowest_of_files(connection: Connection, file_ids: Sequence[int], kept: Iterable[Slot] = ()) -> dict[Slot, int]:
    """Per partition, the lowest first offset of the live sections above L0 of `file_ids`, but those of `kept`
    partitions: what a commit is about to remove, read before it does."""
    sec = s.sections.c
    query = (
        select(sec.topic_id, sec.partition, func.min(sec.first_offset))
        .where(one_of(sec.file_id, file_ids, connection.dialect.name), sec.removed_version.is_(None), s.ABOVE_L0)
        .group_by(sec.topic_id, sec.partition)
    )
    kept = set(kept)
    return {(topic_id, partition): first for topic_id, partition, first in connection.execute(query) if (topic_id, partition) not in kept}


def lowest_of_rows(rows: Iterable[tuple]) -> dict[Slot, int]:
    """Per partition, the lowest first offset of sections rows (as `appends.insert_sections` takes them) above L0."""
    found: dict[Slot, int] = {}
    first_offset, level = _COLUMN.index("first_offset"), _COLUMN.index("level")
    for row in rows:
        if row[level] > 0:
            slot = (row[1], row[2])
            found[slot] = min(row[first_offset], found.get(slot, row[first_offset]))
    return found


def settle(connection: Connection, removed: Mapping[Slot, int], added: Mapping[Slot, int], version: int) -> None:
    """After a commit of `version` removed sections above L0 (`removed`: per partition, their lowest first offset)
    and added others (`added`, alike), set each partition's floor as its live sections now hold it. The caller
    holds the version row, as every writer of these rows does."""
    touched = sorted(set(removed) | set(added))
    if not touched:
        return
    floors = s.partition_floors.c
    held = {
        (topic_id, partition): floor
        for topic_id, partition, floor in connection.execute(
            select(floors.topic_id, floors.partition, floors.floor)
            .where(floors.topic_id.in_(sorted({t for t, _ in touched})), floors.partition.in_(sorted({p for _, p in touched})))
        )
    }
    moved = [slot for slot, lowest in removed.items() if held.get(slot) is None or lowest <= held[slot]]
    held.update(dict.fromkeys(moved))
    held.update(_live_floors(connection, moved))
    rows = []
    for slot in touched:
        floor = min((f for f in (held.get(slot), added.get(slot)) if f is not None), default=None)
        rows.append((slot[0], slot[1], floor, version))
    statement = upsert(connection, s.partition_floors).values(
        topic_id=bindparam("t"), partition=bindparam("p"), floor=bindparam("f"), version=bindparam("v")
    )
    statement = statement.on_conflict_do_update(
        index_elements=[floors.topic_id, floors.partition], set_={"floor": statement.excluded.floor, "version": statement.excluded.version}
    )
    execute_many(connection, statement, ("t", "p", "f", "v"), rows)


def clear_topic(connection: Connection, topic_id: int, version: int) -> None:
    """A deleted topic holds no live section: its partitions' floors go, set by `version`."""
    floors = s.partition_floors.c
    connection.execute(s.partition_floors.update().where(floors.topic_id == topic_id).values(floor=None, version=version))


def _live_floors(connection: Connection, slots: Sequence[Slot]) -> dict[Slot, int]:
    """The lowest first offset of the live sections above L0 of each of `slots` (those with none left out), read
    through `sections_by_partition`, a query per topic."""
    sec, files = s.sections.c, s.files.c
    by_topic: dict[int, set[int]] = {}
    for topic_id, partition in slots:
        by_topic.setdefault(topic_id, set()).add(partition)
    found = {}
    for topic_id, partitions in sorted(by_topic.items()):
        query = (
            select(sec.partition, func.min(sec.first_offset))
            .join(s.files, files.file_id == sec.file_id)
            .where(sec.topic_id == topic_id, sec.partition.in_(sorted(partitions)), s.ABOVE_L0, sec.removed_version.is_(None),
                   files.removed_version.is_(None))
            .group_by(sec.partition)
        )
        found.update({(topic_id, partition): first for partition, first in connection.execute(query)})
    return found


_COLUMN = tuple(column.name for column in s.sections.columns)
