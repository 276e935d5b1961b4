"""A compaction's commit (`Catalog.replace_files`) in the catalog: the plan committed once, its inputs' topics not
deleted since it read them, the sections of partitions set aside kept live, and the log starts retention moves.
Functions of a Connection, called by `Catalog` inside its transactions.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence

from sqlalchemy import Connection, bindparam, func, insert, select, tuple_, update

from logcompact.catalog import schema as s
from logcompact.catalog import topics
from logcompact.catalog.database import execute_many, one_of
from logcompact.catalog.model import DataFile
from logcompact.exceptions import CommitConflictError


def committed_version(connection: Connection, plan_id: str) -> int | None:
    """The version that committed the plan, None for a plan not committed."""
    return connection.execute(
        select(s.committed_plans.c.version).where(s.committed_plans.c.plan_id == plan_id)
    ).scalar_one_or_none()


def record_committed(connection: Connection, plan_id: str, version: int, now_ms: int) -> None:
    connection.execute(insert(s.committed_plans).values(plan_id=plan_id, version=version, committed_ms=now_ms))


def is_committed(connection: Connection, plan_id: str) -> bool:
    found = connection.execute(select(s.committed_plans.c.plan_id).where(s.committed_plans.c.plan_id == plan_id))
    return found.first() is not None


def remove_files(connection: Connection, file_ids: Iterable[int], version: int, now_ms: int) -> None:
    connection.execute(
        update(s.files)
        .where(one_of(s.files.c.file_id, file_ids, connection.dialect.name))
        .values(removed_version=version, removed_ms=now_ms)
    )


def sections_retired_since(connection: Connection, file_ids: Sequence[int], version: int) -> bool:
    """Whether a commit after `version` retired a section of the live files `file_ids` alone (DeleteRecords, a topic's
    deletion, a compaction setting partitions aside): what was read of their sections at `version` no longer holds.
    Counted through the index of the sections retired alone, a few rows: asked for one, PostgreSQL walked the inputs'
    sections by primary key for it (27 ms for 300,000 without one, against 2 to 8)."""
    sec = s.sections.c
    found = connection.execute(
        select(func.count()).where(sec.removed_version > version, one_of(sec.file_id, file_ids, connection.dialect.name))
    )
    return found.scalar_one() > 0


def lock_expiring_partitions(connection: Connection, removed: Sequence[str]) -> list[tuple[int, int]]:
    """The partitions whose log start removing the files `removed` may raise (`raise_log_starts`): those of
    topics with time retention holding a section in them. Their rows are locked here, in order and before the
    version row, as appends lock them (`Catalog.append_files`): the other order could deadlock with an append."""
    if not removed:
        return []
    tops = s.topics.c
    rows = connection.execute(select(tops.topic_id, tops.name, tops.partitions, tops.config, tops.created_ms)
                              .where(tops.deleted_version.is_(None))).all()
    # Read in this transaction: retention.ms may have been altered since any cache of it.
    expiring = [row.topic_id for row in rows if topics.of_row(row).config.time_retention]
    if not expiring:
        return []
    sec, fil, part = s.sections.c, s.files.c, s.partitions.c
    dialect = connection.dialect.name
    touched = (
        select(sec.topic_id, sec.partition).distinct()
        .join(s.files, fil.file_id == sec.file_id)
        .where(one_of(fil.key, removed, dialect), one_of(sec.topic_id, expiring, dialect))
    )
    return [
        (row.topic_id, row.partition) for row in connection.execute(
            select(part.topic_id, part.partition).where(tuple_(part.topic_id, part.partition).in_(touched))
            .order_by(part.topic_id, part.partition).with_for_update()
        )
    ]


def raise_log_starts(connection: Connection, expiring: Sequence[tuple[int, int]]) -> None:
    """Retention moves a log's start, compaction never does (Kafka's rule): for the partitions of topics with
    time retention whose sections this commit removed (`expiring`, locked by `lock_expiring_partitions`), the
    log start rises to the first live offset, or to the next offset when none is left. A compact-only topic
    keeps its start where it was, so a consumer in a compacted-away head reads on from the next record there
    is. (`compact,delete` topics rise to the first live record whichever removed the records before it: the
    engine does not tell the two apart per record.)"""
    if not expiring:
        return
    sec, fil, part = s.sections.c, s.files.c, s.partitions.c
    first_live = (
        select(sec.topic_id, sec.partition, func.min(sec.first_offset))
        .join(s.files, fil.file_id == sec.file_id)
        .where(sec.topic_id.in_(sorted({t for t, _ in expiring})), sec.partition.in_(sorted({p for _, p in expiring})),
               sec.removed_version.is_(None), fil.removed_version.is_(None))
        .group_by(sec.topic_id, sec.partition)
    )
    firsts: dict[tuple[int, int], int] = {}
    for query in s.by_partition(first_live):
        for topic_id, partition, first in connection.execute(query).all():
            firsts[(topic_id, partition)] = min(first, firsts.get((topic_id, partition), first))
    for slot in expiring:
        start = firsts.get(slot, part.next_offset)
        connection.execute(
            update(s.partitions)
            .where(part.topic_id == slot[0], part.partition == slot[1], start > part.log_start_offset)
            .values(log_start_offset=start)
        )


def retire_sections(connection: Connection, file_ids: Iterable[int], kept_ids: Collection[tuple[int, int]], version: int) -> set[int]:
    """Retire the live sections of `file_ids` except those of `kept_ids` partitions (topic id, partition); returns
    the files that keep a section (they stay live)."""
    sec = s.sections.c
    dialect = connection.dialect.name
    rows = connection.execute(
        select(sec.file_id, sec.topic_id, sec.partition).where(
            one_of(sec.file_id, file_ids, dialect), sec.removed_version.is_(None),
            sec.topic_id.in_(sorted({t for t, _ in kept_ids})), sec.partition.in_(sorted({p for _, p in kept_ids})),
        )
    ).all()
    keeping = {file_id for file_id, topic_id, partition in rows if (topic_id, partition) in kept_ids}
    if keeping:
        retired = [
            (version, file_id, topic_id, partition)
            for file_id, topic_id, partition in connection.execute(
                select(sec.file_id, sec.topic_id, sec.partition).where(one_of(sec.file_id, keeping, dialect), sec.removed_version.is_(None))
            ).all()
            if (topic_id, partition) not in kept_ids
        ]
        statement = (
            update(s.sections)
            .where(sec.file_id == bindparam("f"), sec.topic_id == bindparam("t"), sec.partition == bindparam("p"))
            .values(removed_version=bindparam("v"))
        )
        if retired:
            execute_many(connection, statement, ("v", "f", "t", "p"), retired)
    return keeping


def refuse_deleted_topics(
    connection: Connection, file_ids: Collection[int], added: Sequence[DataFile], expected_version: int | None, operation: str
) -> None:
    """A commit is refused when its inputs hold a section of a topic deleted since its plan read them (after
    `expected_version`, when given) and its outputs name that topic: they would bring the deleted records back,
    under a topic made since with the same name, or a deleted topic id. A plan made after the deletion never
    names it (the retired sections are not live), and one whose outputs lost every record of it changes nothing."""
    named = {section.topic for data_file in added for section in data_file.sections}
    if not named or not file_ids:
        return
    sec, tops = s.sections.c, s.topics.c
    dialect = connection.dialect.name
    # The deleted topics of those names first (a few rows, mostly none), then the inputs' sections of them only.
    candidates = select(tops.topic_id).where(tops.deleted_version.is_not(None), one_of(tops.name, sorted(named), dialect))
    if expected_version is not None:
        candidates = candidates.where(tops.deleted_version > expected_version)
    ids = connection.execute(candidates).scalars().all()
    if not ids:
        return
    deleted = connection.execute(
        select(tops.name, tops.deleted_version).join(s.sections, sec.topic_id == tops.topic_id)
        .where(one_of(tops.topic_id, ids, dialect), one_of(sec.file_id, file_ids, dialect)).limit(1)
    ).first()
    if deleted is not None:
        raise CommitConflictError(
            f"{operation}: topic {deleted.name!r} was deleted in version {deleted.deleted_version}, after the plan "
            "read its files; plan again"
        )


def refuse_records_deleted(
    connection: Connection, file_ids: Collection[int], added: Sequence[DataFile], expected_version: int | None, operation: str
) -> None:
    """A plan's commit is refused when DeleteRecords retired sections of its inputs since the plan read them (after
    `expected_version`) and its outputs hold records of those partitions up to the retired sections' end: they would
    bring the deleted records back as live sections. (A deleted topic's are `refuse_deleted_topics`'.) One read of the
    inputs' sections by primary key."""
    if expected_version is None or not file_ids or not added:
        return
    sec, tops = s.sections.c, s.topics.c
    retired = connection.execute(
        select(tops.name, sec.partition, func.max(sec.last_offset)).join(s.topics, tops.topic_id == sec.topic_id)
        .where(one_of(sec.file_id, file_ids, connection.dialect.name), sec.removed_version > expected_version, tops.deleted_version.is_(None))
        .group_by(tops.name, sec.partition)
    ).all()
    deleted_to = {(name, partition): last for name, partition, last in retired}
    for data_file in added:
        for section in data_file.sections:
            last = deleted_to.get((section.topic, section.partition))
            if last is not None and section.first_offset <= last:
                raise CommitConflictError(
                    f"{operation}: records of {section.topic}/{section.partition} up to offset {last} were deleted (DeleteRecords) "
                    "after the plan read its files; plan again"
                )
