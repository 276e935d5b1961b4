"""What gc reads and deletes in the catalog: removed files no kept version holds, the rows that would mislead it
(removals no commit recorded, sections without their file), and the rows of files whose objects are gone.
Functions of a Connection, called by `Catalog` inside its transactions.
"""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import Connection, delete, func, select

from logcompact.catalog import schema as s
from logcompact.catalog import summaries, versions
from logcompact.catalog.database import one_of


def collectable_files(connection: Connection, before_version: int, removed_before_ms: int) -> list[str]:
    """Files removed before `before_version` and before `removed_before_ms` by a commit that records removing
    them (`schema.removal_recorded`): no kept version holds them."""
    files = s.files.c
    return list(connection.execute(
        select(files.key).where(
            files.removed_version < before_version, files.removed_ms < removed_before_ms, s.removal_recorded(files.removed_version)
        ).order_by(files.file_id)
    ).scalars())


def unrecorded_removals(connection: Connection, before_version: int, removed_before_ms: int) -> list[str]:
    """The files rows `collectable_files` would take but for their removal: marked removed at a version no
    compaction nor topic deletion committed (a damaged row, whose records no other file holds), one line each."""
    files = s.files.c
    rows = connection.execute(
        select(files.key, files.file_id, files.removed_version).where(
            files.removed_version < before_version, files.removed_ms < removed_before_ms, ~s.removal_recorded(files.removed_version)
        ).order_by(files.file_id)
    ).all()
    return [
        f"files row {key!r} (file_id {file_id}) is marked removed in version {version}, which no compaction or topic "
        "deletion committed" for key, file_id, version in rows
    ]


def dangling_sections(connection: Connection, limit: int) -> list[str]:
    """Sections rows whose file has no files row (a damaged catalog: its file's key is lost, and gc would take
    the file's object for an orphan), one line per file id, at most `limit`: one read of every sections row."""
    sec, files = s.sections.c, s.files.c
    by_file = select(sec.file_id, func.count().label("rows"), func.min(sec.topic_id).label("topic_id"),
                     func.min(sec.partition).label("partition")).group_by(sec.file_id).subquery()
    rows = connection.execute(
        select(by_file).where(~select(files.file_id).where(files.file_id == by_file.c.file_id).exists())
        .order_by(by_file.c.file_id).limit(limit)
    ).all()
    return [
        f"{count} sections rows of file_id {file_id} (topic_id {topic_id}, partition {partition}, ...) have no files row"
        for file_id, count, topic_id, partition in rows
    ]


def forget_files(connection: Connection, keys: Sequence[str]) -> None:
    """Delete removed files' rows (their objects are gone); a live file is never forgotten. Their entries in the
    partition index are taken off their partitions' counts last, holding the version row as every writer of
    `partition_summaries` does (and in their order): the deletes, which no commit waits on, go first."""
    dialect = connection.dialect.name
    ids = connection.execute(
        select(s.files.c.file_id).where(one_of(s.files.c.key, keys, dialect), s.files.c.removed_version.is_not(None))
    ).scalars().all()
    forgotten = summaries.index_entries(connection, ids)
    connection.execute(delete(s.sections).where(one_of(s.sections.c.file_id, ids, dialect)))
    connection.execute(delete(s.leases).where(one_of(s.leases.c.file_id, ids, dialect)))
    connection.execute(delete(s.files).where(one_of(s.files.c.file_id, ids, dialect)))
    if forgotten:
        versions.lock(connection)
        summaries.forget(connection, forgotten)


def known_files(connection: Connection, keys: Sequence[str]) -> set[str]:
    """Which of `keys` the catalog has a row for, live or removed."""
    return set(connection.execute(select(s.files.c.key).where(one_of(s.files.c.key, keys, connection.dialect.name))).scalars())
