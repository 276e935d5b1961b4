"""Each partition's sections above L0 summed up in one row of `partition_summaries`, kept by every commit that adds
or removes such sections, in its own transaction: what planners and `logcompact status` ask of a partition without
reading its sections (docs/catalog.md, "Partition summaries").

A row holds the count, bytes (and those at L1) and records of the partition's live sections above L0; its base, the lowest of them
(its first offset is the partition's floor above L0; its level, bytes, oldest timestamp, and whether it is free of
duplicates); the oldest timestamp of the others; the newest creation time of their files; and their key sketches
merged. L0 sections are not summed: an append would rewrite a row for each of its 1,000 partitions, and readers
take the few hundred live L0 files as they are.

A commit that only adds sections (an L0 to L1 copy, the most frequent) adds them to the rows. One that removes
some (a merge above L1, a sweep, retention) reads the touched partitions' rows again from their live sections: in
one grouped query per topic through `sections_by_partition`, and their key sketches; or, when their entries in the
index number a good share of all live sections above L0, every such section through the live files (the index also
holds the sections of removed files until gc forgets them: 1.7 s against 0.02 s for the WarpStream-like simulator's
1,000 partitions after 0.1 h). Each row counts its partition's entries in the index (`indexed`): commits add the
sections above L0 they insert, gc takes off those it forgets. A compaction that dropped every record of a partition
never compacted gives it an empty row, so that a partition without a row was never compacted. A deleted topic's rows
are emptied. Each row says the version that set it: a snapshot older than that reads the sections instead.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import replace
from typing import NamedTuple

import numpy as np
from sqlalchemy import ColumnElement, Connection, Select, bindparam, case, func, literal_column, select

from logcompact import sketch
from logcompact.catalog import schema as s
from logcompact.catalog.database import execute_many, integer_array, one_of, upsert
from logcompact.catalog.model import PartitionSummary

# A partition, as (topic id, partition).
Slot = tuple[int, int]
_NO_TIMESTAMP = np.iinfo(np.int64).max
# `summed_up` reads every live section above L0 through the live files, rather than the partitions' sections through
# `sections_by_partition`, when the index entries of the partitions asked for number at least this share of them: an
# entry costs a read about four times a section read through its file, and the index also holds the sections of
# removed files until gc forgets them (counted in each row's `indexed`).
THROUGH_FILES_SHARE = 0.25


def _add(summary: PartitionSummary, section: PartitionSummary) -> PartitionSummary:
    """`summary` with `section`'s (the summary of sections starting above `summary`'s base, or of one section)
    added: a new base when it starts lower. Built field by field: a commit adds a thousand."""
    lower, higher = (section, summary) if section.floor < summary.floor else (summary, section)
    others = [t for t in (lower.others_min_timestamp, higher.others_min_timestamp, higher.base_min_timestamp) if t is not None]
    return PartitionSummary(
        summary.sections + section.sections, summary.uncompressed_bytes + section.uncompressed_bytes,
        summary.l1_bytes + section.l1_bytes, summary.records + section.records, lower.floor, lower.base_level, lower.base_clean, lower.base_bytes,
        lower.base_min_timestamp, min(others), max(summary.newest_file_ms, section.newest_file_ms),
        _merged(summary.key_sketch, section.key_sketch),
    )


_COLUMNS = ("sections", "bytes", "l1_bytes", "records", "floor", "base_level", "base_clean", "base_bytes", "base_min_timestamp",
            "others_min_timestamp", "newest_file_ms", "key_sketch")
_SECTION_COLUMN = {name: n for n, name in enumerate(s.SECTION_ROW)}


def of_rows(rows: Sequence[tuple], created_ms: Mapping[int, int]) -> dict[Slot, PartitionSummary]:
    """Per partition, the summary of sections rows (as `appends.insert_sections` takes them) above L0, their files
    created at `created_ms` (by file id)."""
    c = _SECTION_COLUMN
    upper = [row for row in rows if row[c["level"]] != 0]
    if not upper:
        return {}
    columns = list(zip(*upper))
    created = np.fromiter((created_ms[file_id] for file_id in columns[c["file_id"]]), dtype=np.int64, count=len(upper))
    return _summed_columns(columns, [c[name] for name in _SUMMED_COLUMNS], created, columns[c["key_sketch"]])


# The sections' columns a summary is made of, in `_LIVE_SECTIONS` order (then the file's creation time and the sketch).
_SUMMED_COLUMNS = ("topic_id", "partition", "first_offset", "last_offset", "level", "uncompressed_bytes", "record_count", "min_timestamp",
                   "clean_below_delta")


def _summed_columns(columns: Sequence[Sequence], at: Sequence[int], created_ms: np.ndarray, sketches: Sequence[bytes | None]) -> dict[Slot, PartitionSummary]:
    """`of_columns` of rows given column-wise, `at[i]` the position of `_SUMMED_COLUMNS[i]` among `columns`."""
    topic_ids, partitions, first, last, level, size, records, min_timestamp, clean_below = (np.asarray(columns[n], dtype=np.int64) for n in at)
    return of_columns(topic_ids, partitions, first, level, size, records, min_timestamp, clean_below > last - first, created_ms, sketches)


def of_columns(
    topic_ids: np.ndarray, partitions: np.ndarray, first: np.ndarray, level: np.ndarray, size: np.ndarray, records: np.ndarray,
    min_timestamp: np.ndarray, clean: np.ndarray, created_ms: np.ndarray, sketches: Sequence[bytes | None],
) -> dict[Slot, PartitionSummary]:
    """Per partition, the summary of its sections given column-wise (one entry a section above L0): grouped by a sort,
    each partition's lowest first offset its base, its sketches merged in one vectorized step for all partitions.
    The simulator's catalog in memory sums its sections here too."""
    order = np.lexsort((first, partitions, topic_ids))
    topic_ids, partitions = topic_ids[order], partitions[order]
    starts = np.flatnonzero(np.concatenate(([True], (topic_ids[1:] != topic_ids[:-1]) | (partitions[1:] != partitions[:-1]))))
    counts = np.diff(np.append(starts, len(order)))
    size, min_timestamp = size[order], min_timestamp[order]
    others = min_timestamp.copy()
    others[starts] = _NO_TIMESTAMP
    others_min = np.minimum.reduceat(others, starts)
    group = np.repeat(np.arange(len(starts)), counts)
    merged = sketch.merge_by_group(group, [sketches[i] or b"" for i in order.tolist()], len(starts))
    columns = zip(
        topic_ids[starts].tolist(), partitions[starts].tolist(), counts.tolist(), np.add.reduceat(size, starts).tolist(),
        np.add.reduceat(np.where(level[order] == 1, size, 0), starts).tolist(), np.add.reduceat(records[order], starts).tolist(),
        first[order][starts].tolist(), level[order][starts].tolist(), clean[order][starts].tolist(), size[starts].tolist(),
        min_timestamp[starts].tolist(), others_min.tolist(), np.maximum.reduceat(created_ms[order], starts).tolist(), merged,
    )
    return {
        (topic_id, partition): PartitionSummary(
            count, total, l1, held, floor, base_level, base_clean, base_bytes, base_min, others if count > 1 else None, newest, packed
        )
        for topic_id, partition, count, total, l1, held, floor, base_level, base_clean, base_bytes, base_min, others, newest, packed in columns
    }


def touched_by_removal(connection: Connection, file_ids: Sequence[int], kept: Iterable[Slot] = ()) -> set[Slot]:
    """The partitions with live sections above L0 in `file_ids`, but `kept` partitions: those whose rows a commit
    removing them reads again, found before it does."""
    files, sec = s.files.c, s.sections.c
    upper = connection.execute(select(files.file_id).where(one_of(files.file_id, file_ids, connection.dialect.name), files.level > 0))
    upper_ids = upper.scalars().all()  # an L0 to L1 copy removes none: its inputs' 32,000 sections are not read
    if not upper_ids:
        return set()
    query = (
        select(sec.topic_id, sec.partition).distinct()
        .where(one_of(sec.file_id, upper_ids, connection.dialect.name), sec.removed_version.is_(None))
    )
    kept = set(kept)
    return {(topic_id, partition) for topic_id, partition in connection.execute(query) if (topic_id, partition) not in kept}


class Added(NamedTuple):
    """The rows of the partitions a commit only adds sections above L0 to, as they will stand (`added_up`): read and
    summed before the commit takes the version row, which it then holds for the writes alone."""

    rows: dict[Slot, PartitionSummary]
    read_at: int  # the newest version when they were read: a row set after it was read again (`settle`)


def added_up(connection: Connection, removed: Collection[Slot], added: Mapping[Slot, PartitionSummary], read_at: int) -> Added:
    """The rows of the partitions of `added` not in `removed`, with `added`'s sections added, as of `read_at`."""
    only_added = [slot for slot in added if slot not in removed]
    held = read(connection, only_added)
    return Added({slot: _add(held[slot], added[slot]) if slot in held else added[slot] for slot in only_added}, read_at)


def settle(connection: Connection, removed: set[Slot], added: Mapping[Slot, PartitionSummary], version: int, summed: Added | None = None) -> None:
    """After a commit of `version` removed sections above L0 of the `removed` partitions and added `added`, set
    their rows as their live sections now stand. The caller holds the version row, as every writer of them does.
    `summed`: the rows of the partitions only added to, read before it took the row (`added_up`); read again when a
    commit set any of them since."""
    touched = sorted(removed | set(added))
    if not touched:
        return
    if summed is None or _set_since(connection, summed.rows, summed.read_at):
        summed = added_up(connection, removed, added, version)
    held: dict[Slot, PartitionSummary | None] = dict(summed.rows)
    held.update(summed_up(connection, sorted(removed)))  # the outputs, inserted before, with them
    indexed = {slot: summary.sections for slot, summary in added.items()}  # removed sections stay indexed until gc
    write(connection, {slot: held.get(slot) for slot in touched}, version, indexed)


def _set_since(connection: Connection, slots: Collection[Slot], version: int) -> bool:
    """Whether a commit after `version` set the row of any of `slots`: one read of their topics' rows by key."""
    if not slots:
        return False
    query = select(_ROWS.topic_id, _ROWS.partition).where(_ROWS.topic_id.in_(sorted({t for t, _ in slots})), _ROWS.version > version)
    return any((topic_id, partition) in slots for topic_id, partition in connection.execute(query))


def settle_emptied(connection: Connection, file_ids: Sequence[int], records_out: int, kept: Collection[Slot], version: int) -> None:
    """Give an empty row, set by `version`, to each partition of the L0 files among `file_ids` (a compaction's inputs,
    whose outputs hold `records_out` records) that has none, but `kept` ones (set aside): a compaction that dropped
    every record of a partition never compacted (keyless records of a topic made compacted, expired ones) adds no
    section above L0, yet the holes it left are a compaction's, which readers must not take for rows hiding records
    (`Snapshot.never_compacted`). After `settle`, which gave a row to each partition the outputs hold. A commit that
    dropped no record (an L0 to L1 copy) reads no section here: each partition of its inputs is in its outputs."""
    files, sec, rows = s.files.c, s.sections.c, s.partition_summaries.c
    dialect = connection.dialect.name
    inputs = connection.execute(select(files.file_id, files.level, files.record_count).where(one_of(files.file_id, file_ids, dialect))).all()
    l0_ids = [file_id for file_id, level, _ in inputs if level == 0]
    if not l0_ids or (not kept and sum(records for _, _, records in inputs) <= records_out):
        return
    summarized = select(rows.topic_id).where(rows.topic_id == sec.topic_id, rows.partition == sec.partition).exists()
    query = (
        select(sec.topic_id, sec.partition).distinct()
        .where(one_of(sec.file_id, l0_ids, dialect), sec.removed_version.is_(None), ~summarized)
    )
    kept = set(kept)
    emptied = [tuple(slot) for slot in connection.execute(query) if tuple(slot) not in kept]
    if emptied:
        write(connection, dict.fromkeys(emptied), version)


def write(connection: Connection, rows: Mapping[Slot, PartitionSummary | None], version: int, indexed: Mapping[Slot, int] | None = None) -> None:
    """Set the rows of partitions to their summaries (None: no section above L0), as of `version`, and add `indexed`'s
    count to each one's entries in `sections_by_partition` (the sections above L0 just inserted)."""
    added = indexed or {}
    values = [(*slot, version, added.get(slot, 0), *_values(summary)) for slot, summary in rows.items()]
    if not values:
        return
    if connection.dialect.name == "postgresql":
        columns = list(zip(*values, strict=True))
        arrays = {name: integer_array(column) for (name, _kind), column in zip(_WRITTEN, columns, strict=True) if name != "key_sketch"}
        connection.exec_driver_sql(_WRITE_POSTGRESQL, {**arrays, "key_sketch": list(columns[-1])})
        return
    table = s.partition_summaries
    statement = upsert(connection, table).values(**{name: bindparam(name) for name, _kind in _WRITTEN})
    statement = statement.on_conflict_do_update(
        index_elements=[table.c.topic_id, table.c.partition],
        set_={**{name: statement.excluded[name] for name in ("version", *_COLUMNS)}, "indexed": table.c.indexed + statement.excluded.indexed},
    )
    execute_many(connection, statement, [name for name, _kind in _WRITTEN], values)


# The rows `write` sets, in its values' order, with their types. On PostgreSQL they go in one statement, as arrays
# (`unnest`), where a statement a row took 13 ms for an L0 to L1 copy's 1,000 partitions (p50, at a load of 5 on 2
# cores) while its commit held the version row, which every append waits for; on an idle machine 8.9 ms, 3.7 of them
# the client's CPU, against 11.4 ms, 11.2 (psycopg's executemany builds each row's parameters in Python).
_WRITTEN = (
    ("topic_id", "int"), ("partition", "int"), ("version", "bigint"), ("indexed", "bigint"), ("sections", "bigint"), ("bytes", "bigint"),
    ("l1_bytes", "bigint"), ("records", "bigint"), ("floor", "bigint"), ("base_level", "smallint"), ("base_clean", "smallint"),
    ("base_bytes", "bigint"), ("base_min_timestamp", "bigint"), ("others_min_timestamp", "bigint"), ("newest_file_ms", "bigint"),
    ("key_sketch", "bytea"),
)
_WRITE_POSTGRESQL = f"""
INSERT INTO partition_summaries ({", ".join(name for name, _kind in _WRITTEN)})
SELECT * FROM unnest({", ".join(f"%({name})s::{kind}[]" for name, kind in _WRITTEN)})
ON CONFLICT (topic_id, partition) DO UPDATE SET {", ".join(f"{name} = excluded.{name}" for name in ("version", *_COLUMNS))},
                                                indexed = partition_summaries.indexed + excluded.indexed
"""


def index_entries(connection: Connection, file_ids: Sequence[int] | None = None) -> list[tuple[int, int, int]]:
    """(topic id, partition, count) of the entries the sections of `file_ids` (of every file, without them) have in
    `sections_by_partition`, in partition order: what `forget` takes off once gc deleted them."""
    sec = s.sections.c
    query = select(sec.topic_id, sec.partition, func.count()).where(s.ABOVE_L0)
    if file_ids is not None:
        query = query.where(one_of(sec.file_id, file_ids, connection.dialect.name))
    return [tuple(row) for row in connection.execute(query.group_by(sec.topic_id, sec.partition).order_by(sec.topic_id, sec.partition))]


def forget(connection: Connection, entries: Sequence[tuple[int, int, int]]) -> None:
    """Take gc's deleted entries (`index_entries`) off their partitions' counts. The caller holds the version row."""
    rows = s.partition_summaries.c
    statement = (
        s.partition_summaries.update().where(rows.topic_id == bindparam("t"), rows.partition == bindparam("p"))
        .values(indexed=case((rows.indexed > bindparam("n"), rows.indexed - bindparam("n")), else_=literal_column("0")))
    )
    execute_many(connection, statement, ("t", "p", "n"), entries)


def count_indexed(connection: Connection) -> None:
    """Every partition's entries in `sections_by_partition` counted from its sections (a catalog upgraded to schema 10)."""
    rows = s.partition_summaries.c
    statement = s.partition_summaries.update().where(rows.topic_id == bindparam("t"), rows.partition == bindparam("p")).values(indexed=bindparam("n"))
    execute_many(connection, statement, ("t", "p", "n"), index_entries(connection))


def summed_up(connection: Connection, slots: Sequence[Slot]) -> dict[Slot, PartitionSummary]:
    """The summaries of `slots` read from their live sections above L0, every key sketch merged (partitions with
    none left out). The partitions' sections are read through `sections_by_partition` unless their entries there
    number a good share (`THROUGH_FILES_SHARE`) of all live sections above L0, as their rows count them
    (`read_through_files`): then every live section above L0 is read through the live files, whose number does not
    grow with the removed files gc has yet to forget."""
    if read_through_files(connection, slots):
        return summed_up_through_files(connection, slots)
    return summed_up_by_partition(connection, slots)


def read_through_files(connection: Connection, slots: Iterable[Slot]) -> bool:
    """Whether the live sections above L0 of `slots` are best read with all others through the live files
    (`schema.through_live_files`): when the index entries a read of `slots` would pass (live sections and those of
    removed files gc has yet to forget) number at least `THROUGH_FILES_SHARE` of all live sections above L0, as the
    rows count them."""
    wanted = set(slots)
    if not wanted:
        return False
    counted = connection.execute(select(_ROWS.topic_id, _ROWS.partition, _ROWS.sections, _ROWS.indexed)).all()
    passed = sum(max(live, indexed) for topic_id, partition, live, indexed in counted if (topic_id, partition) in wanted)
    return passed >= THROUGH_FILES_SHARE * sum(live for _, _, live, _ in counted)


def summed_up_by_partition(connection: Connection, slots: Sequence[Slot]) -> dict[Slot, PartitionSummary]:
    """`summed_up` through `sections_by_partition`: per topic, one grouped query and one of key sketches."""
    found = _from_sections(connection, slots)
    merged = sketches_of(connection, list(found))
    return {slot: replace(summary, key_sketch=merged[slot]) if slot in merged else summary for slot, summary in found.items()}


def summed_up_through_files(connection: Connection, slots: Iterable[Slot]) -> dict[Slot, PartitionSummary]:
    """`summed_up` through the live files above L0 (`files_live_by_level`): every live section above L0 read once,
    those of `slots` summed up."""
    wanted = set(slots)
    rows = [row for row in connection.execute(_LIVE_SECTIONS) if (row[0], row[1]) in wanted]
    if not rows:
        return {}
    columns = list(zip(*rows))
    return _summed_columns(columns, list(range(len(_SUMMED_COLUMNS))), np.asarray(columns[9], dtype=np.int64), columns[10])


def clear_topic(connection: Connection, topic_id: int, version: int) -> None:
    """A deleted topic holds no live section: its partitions' rows are emptied, set by `version`."""
    summaries = s.partition_summaries.c
    connection.execute(
        s.partition_summaries.update().where(summaries.topic_id == topic_id)
        .values(version=version, **dict(zip(_COLUMNS, _values(None), strict=True)))
    )


def read(connection: Connection, slots: Sequence[Slot]) -> dict[Slot, PartitionSummary]:
    """The rows of `slots` with sections above L0 (partitions with none are left out), as they stand now."""
    return {slot: summary for slot, (summary, _) in read_versioned(connection, slots).items() if summary is not None}


def read_versioned(connection: Connection, slots: Iterable[Slot]) -> dict[Slot, tuple[PartitionSummary | None, int]]:
    """(summary or None when it has no section above L0, version that set it) of each of `slots` that has a row."""
    wanted = set(slots)
    if not wanted:
        return {}
    summaries = s.partition_summaries.c
    query = select(summaries.topic_id, summaries.partition, summaries.version, *(summaries[name] for name in _COLUMNS)).where(
        summaries.topic_id.in_(sorted({topic_id for topic_id, _ in wanted}))
    )
    found = {}
    for row in connection.execute(query):
        slot = (row[0], row[1])
        if slot in wanted:
            found[slot] = (_summary(row[3:]), row[2])
    return found


def _from_sections(connection: Connection, slots: Sequence[Slot]) -> dict[Slot, PartitionSummary]:
    """The summaries of `slots` read from their live sections above L0 (partitions with none left out), key sketches
    aside: per topic, one grouped query over its partitions' sections ranked by first offset (the first is the base)."""
    found = {}
    for topic_id, partitions in _by_topic(slots):
        rows = connection.execute(_SUMMED_UP, {"topic_id": topic_id, "partitions": partitions})
        for partition, count, size, l1_size, records, floor, level, clean, base_bytes, base_min, others_min, newest in rows:
            found[(topic_id, partition)] = PartitionSummary(
                count, int(size), int(l1_size), int(records), floor, level, bool(clean), base_bytes, base_min, others_min, newest, b""
            )
    return found


def sketches_of(connection: Connection, slots: Sequence[Slot]) -> dict[Slot, bytes]:
    """The key sketches of the live sections above L0 of each of `slots`, merged."""
    packed: dict[Slot, list[bytes]] = {}
    for topic_id, partitions in _by_topic(slots):
        for partition, one in connection.execute(_SKETCHES, {"topic_id": topic_id, "partitions": partitions}):
            packed.setdefault((topic_id, partition), []).append(one)
    return {slot: sketch.encode(sketch.merge_packed(many)) if len(many) > 1 else many[0] for slot, many in packed.items()}


def _partitions_sections(*columns: ColumnElement) -> Select:
    """`columns` of the live sections above L0 of a topic's partitions (`topic_id`, `partitions` bound), through
    `sections_by_partition`. Built once: a commit runs it per topic, and building it cost more than running it."""
    sec, files = s.sections.c, s.files.c
    return (
        select(*columns).join(s.files, files.file_id == sec.file_id)
        .where(sec.topic_id == bindparam("topic_id"), sec.partition.in_(bindparam("partitions", expanding=True)), s.ABOVE_L0,
               sec.removed_version.is_(None), files.removed_version.is_(None))
    )


def _summed_up_query() -> Select:
    sec, files = s.sections.c, s.files.c
    ranked = _partitions_sections(
        sec.partition, sec.first_offset, sec.level, sec.uncompressed_bytes, sec.record_count, sec.min_timestamp,
        case((sec.clean_below_delta > sec.last_offset - sec.first_offset, 1), else_=0).label("clean"), files.created_ms,
        func.row_number().over(partition_by=sec.partition, order_by=sec.first_offset).label("rank"),
    ).subquery()
    r = ranked.c
    base = r.rank == 1
    return select(
        r.partition, func.count(), func.sum(r.uncompressed_bytes), func.sum(case((r.level == 1, r.uncompressed_bytes), else_=0)),
        func.sum(r.record_count), func.min(r.first_offset),
        _of_base(base, r.level), _of_base(base, r.clean), _of_base(base, r.uncompressed_bytes), _of_base(base, r.min_timestamp),
        func.min(case((r.rank > 1, r.min_timestamp))), func.max(r.created_ms),
    ).group_by(r.partition)


def _by_topic(slots: Iterable[Slot]) -> list[tuple[int, list[int]]]:
    by_topic: dict[int, set[int]] = {}
    for topic_id, partition in slots:
        by_topic.setdefault(topic_id, set()).add(partition)
    return [(topic_id, sorted(partitions)) for topic_id, partitions in sorted(by_topic.items())]


def _of_base(base: ColumnElement[bool], column: ColumnElement) -> ColumnElement:
    """`column` of the base row of a partition's ranked sections, taken by an aggregate."""
    return func.max(case((base, column)))


def _summary(values: Sequence) -> PartitionSummary | None:
    if not values[0]:
        return None
    (sections, size, l1_size, records, floor, level, clean, base_bytes, base_min, others_min, newest, packed) = values
    return PartitionSummary(sections, size, l1_size, records, floor, level, bool(clean), base_bytes, base_min, others_min, newest, packed or b"")


def _values(summary: PartitionSummary | None) -> tuple:
    if summary is None:
        return (0, 0, 0, 0, None, None, None, None, None, None, None, None)
    return (summary.sections, summary.uncompressed_bytes, summary.l1_bytes, summary.records, summary.floor, summary.base_level, int(summary.base_clean),
            summary.base_bytes, summary.base_min_timestamp, summary.others_min_timestamp, summary.newest_file_ms,
            summary.key_sketch or None)


def _merged(one: bytes, other: bytes) -> bytes:
    if not one or not other:
        return one or other
    return sketch.encode(sketch.merge_packed([one, other]))


def _live_sections_query() -> Select:
    sec, files = s.sections.c, s.files.c
    return (
        select(*(sec[name] for name in _SUMMED_COLUMNS), files.created_ms, sec.key_sketch)
        .select_from(s.files).join(s.sections, sec.file_id == files.file_id)
        .where(files.removed_version.is_(None), sec.removed_version.is_(None))
    )


_ROWS = s.partition_summaries.c
_SUMMED_UP = _summed_up_query()
_LIVE_SECTIONS = s.through_live_files(_live_sections_query())
_SKETCHES = _partitions_sections(s.sections.c.partition, s.sections.c.key_sketch).where(s.sections.c.key_sketch.is_not(None))
