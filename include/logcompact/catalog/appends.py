"""The two bulk writes of an append, each one statement however many partitions a file holds: advancing the
partitions' next offsets, and inserting the sections rows (a compaction's outputs' too); and why a partition was
not advanced, when the append is refused. An agent's file holds a
section for each of 1,000 topic-partitions or more, and a statement per row cost more than the database's own work
(115 ms an append on PostgreSQL, where these take a few).

PostgreSQL gets arrays (`unnest`) for the partitions and COPY in binary for the sections; SQLite, whose writer
holds the database's one write lock whatever it does, an `UPDATE ... FROM json_each` and an `executemany`. On
PostgreSQL both run on psycopg's connection, past SQLAlchemy (`database.driver_errors`): COPY has no other way, and the update
goes in one round trip with its plan's settings (a pipeline), its 1,000 rows read back without SQLAlchemy's rows, as
SQLite's update reads them back on its driver's connection too.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import BigInteger, Connection, Integer, LargeBinary, SmallInteger, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import driver_connection, driver_errors
from logcompact.exceptions import CorruptDataError

# A partition, as (topic id, partition).
Slot = tuple[int, int]

# The rows are locked in (topic id, partition) order by every append, so two agents appending to the same partitions
# never deadlock. The update locks each row as it writes it, in the order its join yields them; with hash and merge
# joins, sequential and bitmap scans off for that one statement (`_KEYED_PLAN`, reset after it: `_ANY_PLAN`), every
# plan left reads the partitions through their primary key's index, in order: as the probe of each of the sorted
# arrays' entries, or as a scan of the index itself, each matched to the arrays. A sorted `FOR UPDATE` sub-select
# locked every row before the update wrote it again: twice the work (15 ms of an append's 47, against 8). JIT is off
# too: a plan made for the arrays' 1,000 entries is priced past `jit_above_cost` by its per-partition subqueries, and
# compiling its expressions took 17 ms more than running them (23 ms against 6). The settings, the update and the
# resets go in one round trip (a pipeline), each in force for the statements the database reads after it:
# `set_config(..., true)` is SET LOCAL, in one statement; RESET takes one a setting (reading the values to go back to
# from `pg_settings` cost 0.5 ms).
_PLAN_SETTINGS = ("enable_hashjoin", "enable_mergejoin", "enable_seqscan", "enable_bitmapscan", "jit")
_KEYED_PLAN = "SELECT " + ", ".join(f"set_config('{setting}', 'off', true)" for setting in _PLAN_SETTINGS)
_ANY_PLAN = tuple(f"RESET {setting}" for setting in _PLAN_SETTINGS)
# A partition is advanced only where no section row claims offsets from its next offset on (`_UNCLAIMED`): above L0
# through `sections_by_partition`, and in the live L0 files newer than the newest file an append gave offsets of it in
# (`partitions.newest_file`), each by primary key. Every section ever written of a partition ends below the offsets an
# append hands out next; one that does not is a damaged row (relabelled from another partition, shifted) and handing
# them out would put two records at one offset. A partition whose newest file is the newest live L0 file (an agent's
# files hold most of its partitions) skips the second subquery, its gate asked once a statement. On PostgreSQL each
# subquery is fenced (`OFFSET 0`) so that it runs
# per partition through those indexes: made a join, it was planned as every live L0 section matched to every
# partition (8.8 s for 30 files of 1,000 sections).
_UNCLAIMED = """
NOT EXISTS (SELECT 1 FROM sections AS s WHERE s.topic_id = {p}.topic_id AND s.partition = {p}.partition AND s.level > 0
            AND s.last_offset >= {p}.next_offset{fence})
AND ({p}.newest_file >= (SELECT coalesce(max(file_id), 0) FROM files WHERE level = 0 AND removed_version IS NULL)
     OR NOT EXISTS (SELECT 1 FROM files AS f JOIN sections AS s ON s.file_id = f.file_id
                WHERE f.level = 0 AND f.removed_version IS NULL AND f.file_id > {p}.newest_file
                AND s.topic_id = {p}.topic_id AND s.partition = {p}.partition AND s.last_offset >= {p}.next_offset{fence}))
"""
_ADVANCE_POSTGRESQL = f"""
UPDATE partitions AS p SET next_offset = p.next_offset + u.n, assigned_end = p.next_offset + u.n,
                           newest_file = GREATEST(p.newest_file, u.file_id)
FROM unnest(%(topics)s::int[], %(partitions)s::int[], %(counts)s::bigint[], %(files)s::bigint[]) AS u(topic_id, partition, n, file_id)
WHERE p.topic_id = u.topic_id AND p.partition = u.partition AND p.next_offset >= p.assigned_end
AND {_UNCLAIMED.format(p="p", fence=" OFFSET 0")}
RETURNING p.topic_id, p.partition, p.next_offset - u.n
"""
_ADVANCE_SQLITE = f"""
UPDATE partitions SET next_offset = next_offset + w.n, assigned_end = next_offset + w.n, newest_file = max(newest_file, w.file_id)
FROM (SELECT json_extract(value, '$[0]') AS topic_id, json_extract(value, '$[1]') AS partition,
             json_extract(value, '$[2]') AS n, json_extract(value, '$[3]') AS file_id FROM json_each(?)) AS w
WHERE partitions.topic_id = w.topic_id AND partitions.partition = w.partition AND partitions.next_offset >= partitions.assigned_end
AND {_UNCLAIMED.format(p="partitions", fence="")}
RETURNING partitions.topic_id, partitions.partition, partitions.next_offset
"""

_SECTION_COLUMNS = s.SECTION_ROW
_COPY_SECTIONS = f"COPY sections ({', '.join(_SECTION_COLUMNS)}) FROM STDIN (FORMAT BINARY)"
_INSERT_SECTIONS = f"INSERT INTO sections ({', '.join(_SECTION_COLUMNS)}) VALUES ({', '.join('?' for _ in _SECTION_COLUMNS)})"
_BINARY_TYPES = {BigInteger: "int8", Integer: "int4", SmallInteger: "int2", LargeBinary: "bytea"}
_SECTION_TYPES = [_BINARY_TYPES[type(column.type)] for column in s.SECTION_ROW_COLUMNS]


def advance_partitions(connection: Connection, counts: Mapping[Slot, int], files: Mapping[Slot, int]) -> dict[Slot, int]:
    """Hand out `counts[slot]` offsets of each partition, in the file of id `files[slot]` (the newest of the append
    holding it): its next_offset advances by that many. Returns the first offset handed out of each partition
    advanced; a partition is not when its row is missing, when its next_offset is below where the last append's
    offsets ended (the row was lowered), or when a section row claims offsets from its next offset on (`_UNCLAIMED`):
    advancing it would hand offsets out twice. The caller refuses the append then: the rows advanced are rolled
    back with it."""
    if not counts:
        return {}
    slots = sorted(counts)
    if connection.dialect.name == "postgresql":
        driver = driver_connection(connection)
        arrays = {
            "topics": _array(t for t, _ in slots), "partitions": _array(p for _, p in slots), "counts": _array(counts[slot] for slot in slots),
            "files": _array(files[slot] for slot in slots),
        }
        with driver_errors(connection, _ADVANCE_POSTGRESQL), driver.cursor() as settings, driver.cursor() as advance:
            with driver.pipeline():
                settings.execute(_KEYED_PLAN)
                advance.execute(_ADVANCE_POSTGRESQL, arrays)
                for reset in _ANY_PLAN:
                    settings.execute(reset)
            return {(topic_id, partition): first for topic_id, partition, first in advance.fetchall()}
    with driver_errors(connection, _ADVANCE_SQLITE):
        rows = driver_connection(connection).execute(_ADVANCE_SQLITE, (json.dumps([[t, p, counts[(t, p)], files[(t, p)]] for t, p in slots]),)).fetchall()
    # SQLite's RETURNING names only the updated table: the first offset is the new next_offset less the count.
    return {(t, p): next_offset - counts[(t, p)] for t, p, next_offset in rows}


def _array(numbers: Iterable[int]) -> str:
    """A PostgreSQL array literal of integers, cast in the statement: psycopg's list dumper costs more (10 ms for
    an append's five arrays of 1,000) than the statement it feeds."""
    return "{" + ",".join(map(str, numbers)) + "}"


def insert_sections(connection: Connection, rows: Sequence[tuple]) -> None:
    """Insert sections rows, tuples in `schema.SECTION_ROW` order."""
    if not rows:
        return
    if connection.dialect.name != "postgresql":
        connection.exec_driver_sql(_INSERT_SECTIONS, list(rows))
        return
    from psycopg.types.string import BytesBinaryDumper  # PostgreSQL's driver, loaded with its catalogs only

    with driver_errors(connection, _COPY_SECTIONS), driver_connection(connection).cursor() as cursor:
        # bytea through psycopg's compiled dumper of bytes, not the DB-API's `Binary`-aware one registered last for the
        # type, a Python call a row (0.6 ms of the 1.4 a COPY of 1,000 rows spends formatting them).
        cursor.adapters.register_dumper(bytes, BytesBinaryDumper)
        with cursor.copy(_COPY_SECTIONS) as copy:
            copy.set_types(_SECTION_TYPES)
            for row in rows:
                copy.write_row(row)


def unadvanced_partition(connection: Connection, slot: tuple[int, int], topic_rows: dict[str, tuple[int, int]]) -> CorruptDataError:
    """Why `advance_partitions` left a partition's row alone: missing, or lowered."""
    name = next(name for name, (topic_id, _) in topic_rows.items() if topic_id == slot[0])
    part = s.partitions.c
    row = connection.execute(select(part.next_offset, part.assigned_end).where(part.topic_id == slot[0], part.partition == slot[1])).first()
    if row is None:
        return CorruptDataError(
            f"catalog row partitions ({name!r}, partition {slot[1]}) is missing though the topic has "
            f"{topic_rows[name][1]} partitions; restore the catalog from a backup; nothing was written"
        )
    if row.next_offset < row.assigned_end:
        return CorruptDataError(
            f"catalog row partitions ({name!r}, partition {slot[1]}) has next_offset {row.next_offset} but the last append "
            f"assigned offsets up to {row.assigned_end - 1}: the row was lowered, and appending would hand offsets out "
            f"twice; restore the catalog from a backup or set next_offset to {row.assigned_end}; nothing was written"
        )
    key, first, last, records = _claiming_section(connection, slot, row.next_offset)
    return CorruptDataError(
        f"catalog row of section {name}/{slot[1]} of {key} (offsets {first} to {last}, {records} record(s)) is damaged: it "
        f"claims offsets from the partition's next offset {row.next_offset} on, which no append gave out (a row relabelled "
        "from another partition, or shifted), and appending would hand them out again; restore the catalog database "
        "from a backup, or correct that row; nothing was written"
    )


def _claiming_section(connection: Connection, slot: tuple[int, int], next_offset: int) -> tuple[str, int, int, int]:
    """(file key, first and last offset, records) of the section row of a partition that ends at or past its next
    offset, which `advance_partitions` found: read from every section of the partition (an append refused)."""
    sec, files = s.sections.c, s.files.c
    key, file_id, first, last, records = connection.execute(
        select(files.key, sec.file_id, sec.first_offset, sec.last_offset, sec.record_count)
        .select_from(s.sections.outerjoin(s.files, files.file_id == sec.file_id))
        .where(sec.topic_id == slot[0], sec.partition == slot[1], sec.last_offset >= next_offset)
        .order_by(sec.last_offset.desc()).limit(1)
    ).one()
    return key or f"file_id {file_id} (no files row)", first, last, records
