"""The bulk writes of an append, each one statement however many partitions a file holds: advancing the
partitions' next offsets, and inserting the sections rows (a compaction's outputs' too); on PostgreSQL, an L0 append
whole in one round trip (`append_in_one_step`, below); and why a partition was not advanced, when the append is
refused. An agent's file holds a section for each of 1,000 topic-partitions or more, and a statement per row cost
more than the database's own work (115 ms an append on PostgreSQL, where these take a few).

PostgreSQL gets arrays (`unnest`) for the partitions and COPY in binary for the sections; SQLite, whose writer
holds the database's one write lock whatever it does, an `UPDATE ... FROM json_each` and an `executemany`. On
PostgreSQL both run on psycopg's connection, past SQLAlchemy (`database.driver_errors`): COPY has no other way, and the update
goes in one round trip with its plan's settings (a pipeline), its 1,000 rows read back without SQLAlchemy's rows, as
SQLite's update reads them back on its driver's connection too.
"""

from __future__ import annotations

import json
import struct
import uuid
from collections.abc import Mapping, Sequence
from typing import NamedTuple
from zlib import crc32

import numpy as np
from sqlalchemy import BigInteger, Connection, Integer, LargeBinary, SmallInteger, select

from logcompact.catalog import schema as s
from logcompact.catalog import versions
from logcompact.catalog.columns import packs_of_columns
from logcompact.catalog.database import driver_connection, driver_errors, integer_array
from logcompact.catalog.model import CONTENTS, NewFile
from logcompact.catalog.topics import COMPACTED
from logcompact.exceptions import CorruptDataError, InvalidRecordError
from logcompact.format.layout import COMPRESSIONS, SectionInfo

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

# Appends take turns on PostgreSQL before locking any partition row (`TURN`). Every agent's file holds a section of
# the same partitions, so appends queue on those rows anyway; queued on the first row, each waited inside its
# statement, holding that statement's snapshot, and once given the row re-checked it and every row after it against
# the versions the append before it wrote (EvalPlanQual), while the waiting snapshots kept those versions from being
# pruned: an append read 2.8 times the buffers it reads alone, and four processes appended fewer files a second
# than one. `LOCK` takes no snapshot of the data (only its first lookup of the table's name on a connection reads the
# system catalogs), and its mode is one no other writer's statement takes: it conflicts with itself, VACUUM and DDL,
# not with reads or row writes. So waiting appends hold nothing back, and each reads and writes the rows as if alone.
# On SQLite the one write lock is the turn.
TURN = "LOCK TABLE partitions IN SHARE UPDATE EXCLUSIVE MODE"

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
    back with it. On PostgreSQL the append takes its turn first (`TURN`)."""
    if not counts:
        return {}
    slots = sorted(counts)
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql(TURN)
        driver = driver_connection(connection)
        arrays = {
            "topics": integer_array(t for t, _ in slots), "partitions": integer_array(p for _, p in slots),
            "counts": integer_array(counts[slot] for slot in slots), "files": integer_array(files[slot] for slot in slots),
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


# -- An append in one step (PostgreSQL) ----------------------------------------------------------------------------
#
# Every agent's file holds a section of each of the same partitions, so appends to them take turns on those
# partitions' rows: each holds them from the statement that advances them to its COMMIT, and the appends a second
# the partitions take is one over that hold. Here the hold is the database's own work alone: everything that does not
# depend on the offsets handed out is prepared before the first row is locked (`place`, `SectionColumns`), and the
# advance, the sections placed at the offsets it hands out, the version, the file rows and the COMMIT go to the server
# in one round trip (a pipeline), so no client work, and no wait for the client to be scheduled on a busy machine,
# falls between the first partition row locked and the commit. The statement reads the sections' arrays first
# (`staged`: the update's one-time filter counts them, so they are unnested before it locks a row; 2 to 4 ms of its
# 30 at a load of 8 on 2 cores). The sections' offsets are computed by the statement
# that hands them out (each section's offset relative to its partition's first in this append is the client's), and
# with them each row's CRC binding (`schema.section_crc_binding`): a CRC-32 of fixed-length fields is affine in its
# input bits, so the binding of a row is the CRC of the row with both offsets 0 (the client's) XOR one table entry per
# byte of each offset (`_OFFSET_CRC`: 16 bytes, 256 values each).
#
# A refusal cannot wait for the client to read the statement's rows: the partitions not all advanced (a missing,
# lowered or claimed row, `advance_partitions`), or the version not logged (`versions.next_version`), divides by zero,
# which aborts the transaction and so the COMMIT behind it; the caller runs the append again the long way, which says
# which row refused it and why.


def _offset_crc_table() -> list[int]:
    """Per byte of the first then the last offset (8 each, little-endian), per value of that byte: what it XORs into
    the CRC-32 of a sections row's locating fields (`schema.section_crc_binding`) where it was 0."""
    size = s.SECTION_PLACE.size
    zero = crc32(bytes(size))
    positions = [s.SECTION_PLACE_OFFSETS[0] + k for k in range(8)] + [s.SECTION_PLACE_OFFSETS[1] + k for k in range(8)]
    return [crc32(bytes(at) + bytes([value]) + bytes(size - at - 1)) ^ zero for at in positions for value in range(256)]


_OFFSET_CRC = "{" + ",".join(map(str, _offset_crc_table())) + "}"
_OFFSET_CRC_LOOKUPS = " # ".join(
    f"c.t[{256 * k + 1} + ((x.{offset} >> {8 * (k % 8)}) & 255)]" for k, offset in enumerate(["f"] * 8 + ["l"] * 8)
)
# Per section, beside the partition's index in the sorted partitions (`at`, from 1) and its offset relative to the
# partition's first handed out (`relative`): the columns of its row as the client has them.
_SECTION_ARRAYS = (
    ("file_id", "bigint"), ("at", "int"), ("relative", "bigint"), ("last_delta", "bigint"), ("byte_offset", "bigint"),
    ("byte_length", "bigint"), ("first_row", "int"), ("record_count", "int"), ("min_timestamp", "bigint"),
    ("max_timestamp", "bigint"), ("tombstones", "int"), ("uncompressed_bytes", "bigint"), ("compression", "smallint"),
    ("crc", "bigint"), ("clean_below_delta", "bigint"), ("key_sketch", "bytea"), ("produced_compression", "smallint"),
)
_APPEND_POSTGRESQL = f"""
WITH staged AS MATERIALIZED (
  SELECT * FROM unnest({", ".join(f"%({name})b::{kind}[]" for name, kind in _SECTION_ARRAYS)}) AS a({", ".join(name for name, _ in _SECTION_ARRAYS)})
), advanced AS (
  UPDATE partitions AS p SET next_offset = p.next_offset + u.n, assigned_end = p.next_offset + u.n,
                             newest_file = GREATEST(p.newest_file, u.file_id)
  FROM unnest(%(topics)b::int[], %(partitions)b::int[], %(counts)b::bigint[], %(files)b::bigint[]) AS u(topic_id, partition, n, file_id)
  WHERE (SELECT count(*) FROM staged) = %(sections)s
  AND p.topic_id = u.topic_id AND p.partition = u.partition AND p.next_offset >= p.assigned_end
  AND {_UNCLAIMED.format(p="p", fence=" OFFSET 0")}
  RETURNING p.topic_id, p.partition, p.next_offset - u.n AS first
), handed AS (
  SELECT count(*) AS advanced, array_agg(first ORDER BY topic_id, partition) AS firsts FROM advanced
), placed AS (
  INSERT INTO sections ({", ".join(_SECTION_COLUMNS[:-3])}, level, produced_compression)
  SELECT x.file_id, x.topic_id, x.partition, x.byte_offset, x.byte_length, x.first_row, x.f, x.l, x.record_count,
         x.min_timestamp, x.max_timestamp, x.tombstones, x.uncompressed_bytes, x.compression,
         x.crc # {_OFFSET_CRC_LOOKUPS}, x.clean_below_delta, x.key_sketch, 0, x.produced_compression
  FROM (SELECT a.*, (%(topics)b::int[])[a.at] AS topic_id, (%(partitions)b::int[])[a.at] AS partition,
               h.firsts[a.at] + a.relative AS f, h.firsts[a.at] + a.relative + a.last_delta AS l
        FROM handed AS h, staged AS a WHERE h.advanced = %(slots)s) AS x,
       (SELECT '{_OFFSET_CRC}'::bigint[] AS t) AS c
)
SELECT h.firsts, 1 / (h.advanced = %(slots)s)::int FROM handed AS h
"""
# As errors show it: the statement without its table of 4,096 numbers.
_APPEND_SHOWN = _APPEND_POSTGRESQL.replace(_OFFSET_CRC, "{...}")
# The version logged, looked up by its key whatever the table's statistics say: as a join, under the append's plan
# settings and statistics taken while the table was small, it scanned every versions row kept (7,000 after three
# minutes of the regime: 840 buffers an append, inside its turn); by its key it reads 4.
_LOGGED = "SELECT 1 / count(*) FROM versions WHERE version = (SELECT version FROM catalog_info) AND commit_id = %(commit_id)s"
_FILE_ARRAYS = (("file_id", "bigint"), ("key", "text"), ("size", "bigint"), ("created_ms", "bigint"), ("record_count", "bigint"), ("content", "smallint"))
_FILES_POSTGRESQL = f"""
INSERT INTO files (file_id, key, level, size, created_ms, record_count, content, added_version)
SELECT f.file_id, f.key, 0, f.size, f.created_ms, f.record_count, f.content, i.version
FROM unnest({", ".join(f"%(file_{name})s::{kind}[]" for name, kind in _FILE_ARRAYS)}) AS f({", ".join(name for name, _ in _FILE_ARRAYS)}),
     catalog_info AS i
"""
# Earlier one-step appends' packed sections (`packs`), stored last before the COMMIT: their files rows are locked
# after the partitions' and the version row, the order of every writer (a compaction removing those files takes the
# version row, then their rows; a pack stored first deadlocked with it). About 0.2 ms of the database's a file.
_STORE_PACKS = """
UPDATE files AS f SET sections_packed = u.pack FROM unnest(%(pack_file_ids)b::bigint[], %(packs)b::bytea[]) AS u(file_id, pack)
WHERE f.file_id = u.file_id
"""
_COMPRESSION_IDS = {name: number for number, name in enumerate(COMPRESSIONS)}
_FIELD = {name: number for number, name in enumerate(SectionInfo._fields)}


class Unplaced(Exception):
    """A one-step append refused by the database (`append_in_one_step`): nothing was written."""


class SectionColumns(NamedTuple):
    """The sections of an append's files as columns, in file order, built before its transaction."""

    topics: tuple[str, ...]
    partitions: np.ndarray
    last_deltas: np.ndarray
    columns: tuple[tuple, ...]  # SectionInfo's fields, by field
    per_file: np.ndarray  # sections a file
    codecs: list[int]  # `sections.produced_compression`, per section


def section_columns(new_files: Sequence[NewFile]) -> SectionColumns:
    infos = [info for new in new_files for info in new.sections]
    columns = tuple(zip(*infos, strict=True)) if infos else tuple(() for _ in SectionInfo._fields)
    codecs = [codec for new in new_files for codec in (new.produced_codecs or [s.UNKNOWN_CODEC] * len(new.sections))]
    return SectionColumns(
        columns[_FIELD["topic"]], np.asarray(columns[_FIELD["partition"]], np.int64), np.asarray(columns[_FIELD["last_delta"]], np.int64),
        columns, np.array([len(new.sections) for new in new_files], np.int64), codecs,
    )


class Placement(NamedTuple):
    """Where an append's sections go, known before any partition row is locked: its partitions in lock order ((topic id,
    partition) sorted), each with the offsets to hand out and the newest of the files holding it; per section its
    topic id, its partition's index among those, and its first offset relative to the first the append gets there."""

    slot_topics: np.ndarray
    slot_partitions: np.ndarray
    counts: np.ndarray
    newest: np.ndarray
    topic_ids: np.ndarray
    at: np.ndarray
    relative: np.ndarray


def place(sections: SectionColumns, file_ids: Sequence[int], topic_rows: dict[str, tuple[int, int]]) -> Placement:
    """`sections` placed in their partitions, in the order `Catalog.append_files` gives them offsets: by file, then
    by section. A partition the topic does not have is InvalidRecordError."""
    topic_ids = np.fromiter((topic_rows[name][0] for name in sections.topics), np.int64, len(sections.topics))
    limits = np.fromiter((topic_rows[name][1] for name in sections.topics), np.int64, len(sections.topics))
    partitions = sections.partitions
    outside = np.flatnonzero((partitions < 0) | (partitions >= limits))
    if outside.size:
        n = int(outside[0])
        name = sections.topics[n]
        raise InvalidRecordError(f"topic {name!r} has partitions 0 to {topic_rows[name][1] - 1}, not {int(partitions[n])}")
    slots, at = np.unique(topic_ids << 32 | partitions, return_inverse=True)
    at = at.reshape(-1)
    widths = sections.last_deltas + 1
    order = np.argsort(at, kind="stable")  # each partition's sections in file, then section, order
    ordered = widths[order]
    before = np.cumsum(ordered) - ordered
    starts = np.searchsorted(at[order], np.arange(len(slots)))
    relative = np.empty_like(before)
    relative[order] = before - before[starts][at[order]]
    owners = np.repeat(np.asarray(file_ids, np.int64), sections.per_file)
    return Placement(
        slots >> 32, slots & 0xFFFFFFFF, np.add.reduceat(ordered, starts) if len(slots) else ordered,
        np.maximum.reduceat(owners[order], starts) if len(slots) else owners, topic_ids, at, relative,
    )


def first_offsets(placement: Placement, firsts: np.ndarray, per_file: np.ndarray) -> list[list[int]]:
    """Each file's sections' first offsets, given the first offset handed out of each partition (in lock order)."""
    offsets = (firsts[placement.at] + placement.relative).tolist()
    bounds = np.cumsum(per_file).tolist()
    return [offsets[start:end] for start, end in zip([0, *bounds[:-1]], bounds, strict=True)]


def packs(sections: SectionColumns, placement: Placement, firsts: np.ndarray) -> list[bytes]:
    """Each file's `files.sections_packed`, once the one-step append has handed out the first offset of each partition
    (in lock order): the database hands them out, so the next one-step append stores them (`Catalog.append_files`)."""
    columns = sections.columns
    return packs_of_columns(
        placement.topic_ids, sections.partitions, firsts[placement.at] + placement.relative, sections.last_deltas,
        columns[_FIELD["uncompressed_bytes"]], columns[_FIELD["max_timestamp"]], sections.per_file.tolist(),
    )


def append_in_one_step(
    connection: Connection, new_files: Sequence[NewFile], file_ids: Sequence[int], sections: SectionColumns, placement: Placement,
    now_ms: int, packs_due: Sequence[tuple[int, bytes]] = (),
) -> tuple[int, np.ndarray]:
    """Append L0 files and COMMIT, in one round trip: the partitions advanced, the sections inserted at the offsets
    handed out, the version taken and logged, the file rows inserted under it (see above), and the packed sections
    of earlier appends' files stored (`packs_due`, (file id, pack) pairs). Returns the version and the first offset
    handed out of each partition, in lock order; a refusal is Unplaced, the transaction rolled back."""
    columns = sections.columns
    fields = {name: columns[number] for name, number in _FIELD.items()}
    zeros = np.zeros(len(placement.at), np.int64)
    unbound = s.section_crc_bindings(
        placement.topic_ids, sections.partitions, fields["byte_offset"], fields["byte_length"], fields["first_row"], zeros, zeros,
        fields["record_count"],
    )
    arrays: dict[str, Sequence[int] | np.ndarray] = {
        "file_id": np.repeat(np.asarray(file_ids, np.int64), sections.per_file), "at": placement.at + 1,
        "relative": placement.relative, "last_delta": sections.last_deltas,
        "compression": [_COMPRESSION_IDS[name] for name in fields["compression"]],
        "crc": (np.asarray(fields["crc32"], np.int64) ^ unbound).tolist(),
        "produced_compression": sections.codecs,
    }
    params: dict[str, object] = {
        name: _binary_array(arrays[name] if name in arrays else fields[name], kind) for name, kind in _SECTION_ARRAYS if kind != "bytea"
    }
    params["key_sketch"] = _bytea_array(fields["key_sketch"])
    params.update(
        topics=_binary_array(placement.slot_topics, "int"), partitions=_binary_array(placement.slot_partitions, "int"),
        counts=_binary_array(placement.counts, "bigint"), files=_binary_array(placement.newest, "bigint"), slots=len(placement.slot_topics),
        sections=len(placement.at),
    )
    compacted = connection.info[COMPACTED]
    file_rows = {
        "file_file_id": list(file_ids), "file_key": [new.key for new in new_files], "file_size": [new.size for new in new_files],
        "file_created_ms": [new.created_ms for new in new_files],
        "file_record_count": [sum(info.record_count for info in new.sections) for new in new_files],
        "file_content": [_content({compacted[info.topic] for info in new.sections}) for new in new_files],
    }
    log = {"commit_id": str(uuid.uuid4()), "created_ms": now_ms, "operation": "append"}
    driver = driver_connection(connection)
    from psycopg.errors import DivisionByZero  # PostgreSQL's driver, loaded with its catalogs only

    with driver_errors(connection, _APPEND_SHOWN), driver.cursor() as append, driver.cursor() as bump, driver.cursor() as packing:
        for kind, (cls, oid, _element, _dtype) in _BINARY_ARRAYS.items():
            append.adapters.register_dumper(cls, _binary_dumper(kind, oid))
            packing.adapters.register_dumper(cls, _binary_dumper(kind, oid))
        try:
            with driver.pipeline():
                driver.execute(TURN)
                driver.execute(_KEYED_PLAN)  # SET LOCAL: in force until the COMMIT below
                append.execute(_APPEND_POSTGRESQL, params)
                bump.execute(versions.BUMP)
                driver.execute(versions.LOG_POSTGRESQL, log)
                driver.execute(_LOGGED, log)
                driver.execute(_FILES_POSTGRESQL, file_rows)
                if packs_due:
                    due_ids, due_packs = zip(*packs_due, strict=True)
                    packing.execute(_STORE_PACKS, {"pack_file_ids": _binary_array(due_ids, "bigint"), "packs": _bytea_array(due_packs)})
                driver.commit()
        except DivisionByZero:
            raise Unplaced() from None
        [(firsts, _)] = append.fetchall()
        [(version,)] = bump.fetchall()
    connection.info[versions.COMMITTED] = (version, "append")
    return version, np.asarray(firsts, np.int64)


# The one-step append's arrays in PostgreSQL's binary format (`array_send`): dimensions, a null flag, the element
# type, then each element's length and big-endian bytes; numpy builds an integer array's at once, where its text, a
# str a number, took 2 to 3 ms of the client's 6 an append of 1,000 sections. Each kind is a class of its own, for
# psycopg to pick its dumper by: (class, array type, element type, numpy's big-endian dtype).
class _Int8Array(bytes):
    pass


class _Int4Array(bytes):
    pass


class _Int2Array(bytes):
    pass


class _ByteaArray(bytes):
    pass


_BINARY_ARRAYS: dict[str, tuple[type[bytes], int, int, str]] = {
    "bigint": (_Int8Array, 1016, 20, ">i8"), "int": (_Int4Array, 1007, 23, ">i4"), "smallint": (_Int2Array, 1005, 21, ">i2"),
    "bytea": (_ByteaArray, 1001, 17, ""),
}
_ARRAY_HEADER = struct.Struct(">iiiii")  # dimensions (1), has nulls, element type, length, lower bound (1)
_ELEMENT_LENGTH = struct.Struct(">i")


def _binary_array(values: Sequence[int] | np.ndarray, kind: str) -> bytes | str:
    """An integer array for a `%(...)b::kind[]` parameter; a value out of the type's range goes as text, for the
    database to refuse it as it refuses any (the binary form would wrap it)."""
    cls, _oid, element, dtype = _BINARY_ARRAYS[kind]
    numbers = np.asarray(values, np.int64)
    limits = np.iinfo(np.dtype(dtype))
    if numbers.size and (numbers.min() < limits.min or numbers.max() > limits.max):
        return integer_array(numbers.tolist())
    rows = np.empty(numbers.size, [("length", ">i4"), ("value", dtype)])
    rows["length"] = rows.dtype["value"].itemsize
    rows["value"] = numbers
    return cls(_ARRAY_HEADER.pack(1, 0, element, numbers.size, 1) + rows.tobytes())


def _bytea_array(values: Sequence[bytes]) -> bytes:
    """A bytea array for a `%(...)b::bytea[]` parameter, an empty value NULL (a section without keys has no sketch)."""
    cls, _oid, element, _dtype = _BINARY_ARRAYS["bytea"]
    parts = [_ARRAY_HEADER.pack(1, int(not all(values)), element, len(values), 1)]
    parts.extend(_ELEMENT_LENGTH.pack(len(value)) + value if value else _NULL_ELEMENT for value in values)
    return cls(b"".join(parts))


_NULL_ELEMENT = _ELEMENT_LENGTH.pack(-1)


def _binary_dumper(kind: str, oid: int) -> type:
    """psycopg's dumper of one kind of `_BINARY_ARRAYS`: the bytes as they are, under the array type's oid."""
    dumper = _DUMPERS.get(kind)
    if dumper is None:
        from psycopg.adapt import Dumper  # PostgreSQL's driver, loaded with its catalogs only
        from psycopg.pq import Format

        class ArrayDumper(Dumper):
            format = Format.BINARY

            def dump(self, obj: object) -> bytes:
                assert isinstance(obj, bytes)
                return obj

        ArrayDumper.oid = oid
        dumper = _DUMPERS[kind] = ArrayDumper
    return dumper


_DUMPERS: dict[str, type] = {}


def _content(compacted: set[bool]) -> int:
    """`files.content` of a file holding topics compacted or not (`files.insert_file_rows`)."""
    return CONTENTS.index("mixed") if len(compacted) > 1 else int(compacted == {True})
