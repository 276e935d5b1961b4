"""The catalog's tables (SQLAlchemy Core), one schema for SQLite and PostgreSQL; `docs/catalog.md` explains it.

A manifest version is not stored as a document: version N is every file with added_version <= N and
no removed_version <= N. `catalog_info` holds the newest version; every commit increments it, and that row lock
(on PostgreSQL; SQLite's write lock serializes writers whole) orders versions as commits: appends take it last,
other writers first (docs/catalog.md, "Commits").

`sections.crc32` is stored bound to its row's locating fields (`section_crc_binding`).
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numba
import numpy as np
from isal.isal_zlib import crc32  # zlib's CRC-32, computed faster
from sqlalchemy import (
    DDL,
    BigInteger,
    BindParameter,
    Column,
    ColumnElement,
    CompoundSelect,
    Connection,
    Dialect,
    Float,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    Select,
    SmallInteger,
    String,
    Table,
    Text,
    event,
    literal_column,
    or_,
    select,
    text,
    union_all,
)
from sqlalchemy.schema import SchemaItem
from sqlalchemy.sql.compiler import DDLCompiler
from sqlalchemy.sql.ddl import BaseDDLElement

# Bump on any change to the tables below or to what their columns hold; a database of another version is refused
# (CatalogSchemaError), but for UPGRADABLE_FROM, which `Catalog.upgrade_catalog` brings to this one.
SCHEMA_VERSION = 15
# What `Catalog.upgrade_catalog` brings to SCHEMA_VERSION, step by step. Schema 3 stored `sections.crc32` raw (the
# format's CRC, unbound); schema 4 had no log start offsets, no deleted topics and none of the Kafka agents' tables;
# schema 5 had no sections.level nor partitions.assigned_end, and every section in `sections_by_partition`; schema 6
# had no partition_summaries; schema 7's had no l1_bytes; schema 8's sections rows were laid out wider on PostgreSQL
# (in `SECTION_ROW` order, record_count and tombstones 64-bit) and `sections_by_partition` had no first offset; schema
# 9's partition_summaries did not count their partitions' entries in it (`indexed`); schema 10's partitions did not
# name the newest file an append gave offsets of them (`newest_file`), and its consumer_groups had no leader and its
# members no timeouts, protocols nor assignments; schema 11 had none of the transactions' tables nor its files a
# filtered_version, and it did not record the offsets no record holds (`offset_holes`); schema 12 had none of the
# security tables (`SECURITY_TABLES`); schema 13's sections did not record the codec their records were produced with
# (`sections.produced_compression`); schema 14's files did not carry their sections' planning columns
# (`files.sections_packed`) nor were retired sections indexed (`sections_retired`).
UPGRADABLE_FROM = (3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14)

# SQLite gives auto-numbered keys only to INTEGER PRIMARY KEY (the rowid); PostgreSQL wants BIGINT.
Identity64 = BigInteger().with_variant(Integer(), "sqlite")

metadata = MetaData()

catalog_info = Table(
    "catalog_info",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),  # always 1: one cluster per database
    Column("schema_version", Integer, nullable=False),
    Column("cluster_id", String(36), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),  # the newest committed manifest version
)

# The commit log: one row per manifest version, trimmed by gc to the kept history.
versions = Table(
    "versions",
    metadata,
    Column("version", BigInteger, primary_key=True, autoincrement=False),
    Column("commit_id", String(36), nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("operation", Text, nullable=False),
)

topics = Table(
    "topics",
    metadata,
    Column("topic_id", Integer, primary_key=True),
    Column("name", String(249), nullable=False),
    Column("partitions", Integer, nullable=False),
    Column("config", Text, nullable=False),  # Kafka names to values, JSON
    Column("created_ms", BigInteger, nullable=False),
    Column("created_version", BigInteger, nullable=False),
    # Set by DeleteTopics. The row stays, so its topic_id is never handed out again (SQLite reuses the highest
    # rowid) while retired sections and older versions still name it; its name is free for a new topic.
    Column("deleted_version", BigInteger),
)
Index(
    "topics_live_name",
    topics.c.name,
    unique=True,
    sqlite_where=topics.c.deleted_version.is_(None),
    postgresql_where=topics.c.deleted_version.is_(None),
)

partitions = Table(
    "partitions",
    metadata,
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("next_offset", BigInteger, nullable=False),
    # Kafka's log start offset: raised by retention (records expired by retention.ms) and DeleteRecords, never by
    # compaction, so a consumer positioned in a compacted-away head reads on from the next record instead of being reset.
    Column("log_start_offset", BigInteger, nullable=False, server_default="0"),
    # Where the last append's offsets ended, written with next_offset by the same statement: an append refuses a row
    # whose next_offset is lower (lowered alone, by hand or by a restore of that column, it would hand offsets out
    # twice). A whole row restored from an older copy lowers both: readers refuse the sections past next_offset.
    Column("assigned_end", BigInteger, nullable=False, server_default="0"),
    # The newest file an append gave offsets of the partition in (0: none yet). A section of the partition in a live
    # L0 file newer than it, or above L0, that ends at or past next_offset was never handed those offsets (a row
    # relabelled from another partition, or shifted): the append refuses rather than hand them out again. Only the
    # L0 files newer than it are looked at, so an append pays for the files appended since the partition's last one.
    Column("newest_file", BigInteger, nullable=False, server_default="0"),
    sqlite_with_rowid=False,
    # Every append rewrites the rows of its partitions, an agent's up to all of them: PostgreSQL keeps each page half
    # empty for their new versions, written beside the old (a heap-only update, which adds no entry to the key's index
    # and is pruned by the next append). Packed full, most updates moved rows to new pages: 10 times the table and
    # twice its index after 50 appends of 1,000 partitions, each lookup of the next append passing the dead entries.
    postgresql_with={"fillfactor": 50},
)

files = Table(
    "files",
    metadata,
    Column("file_id", Identity64, primary_key=True),
    Column("key", Text, nullable=False, unique=True),
    Column("level", SmallInteger, nullable=False),
    Column("size", BigInteger, nullable=False),
    Column("created_ms", BigInteger, nullable=False),
    Column("record_count", BigInteger, nullable=False),
    Column("content", SmallInteger, nullable=False),  # index into model.CONTENTS
    Column("added_version", BigInteger, nullable=False),
    Column("removed_version", BigInteger),
    Column("removed_ms", BigInteger),
    # The plan manifest version a compaction output's records were filtered of aborted transactions' at (NULL: an
    # append's file, or an output of a plan that filtered none): an aborted range recorded later may still be in it.
    Column("filtered_version", BigInteger),
    # What a planning pass weighs of the file's sections, packed when the file is added (`columns.pack_sections`): per
    # section in the order the file's sections were given, five little-endian int64: topic_id * 2**32 + partition, first and last
    # offset, uncompressed bytes, newest timestamp. A pass over 300,000 files reads their 1.2 million sections as
    # 300,000 values, while a hash of the sections rows vouches for them (`Snapshot.section_columns`). A one-step
    # append on PostgreSQL (its offsets handed out inside the database) has it stored by the next. NULL until then and
    # in rows from before schema 15: their sections rows are read. A section retired alone stays in the pack:
    # `sections_retired` finds it.
    Column("sections_packed", LargeBinary),
)
# The live files of a level (planners, thresholds); and removed files by version (gc).
Index(
    "files_live_by_level",
    files.c.level,
    files.c.file_id,
    sqlite_where=files.c.removed_version.is_(None),
    postgresql_where=files.c.removed_version.is_(None),
)
Index("files_removed", files.c.removed_version)


def _lz4_toast(
    ddl: BaseDDLElement, target: SchemaItem | str, bind: Connection | None, tables: list[Table] | None = None, state: object = None, *,
    dialect: Dialect | None = None, compiler: DDLCompiler | None = None, checkfirst: bool = False,
) -> bool:
    """Whether the PostgreSQL server compresses stored values with LZ4 (14 and on, built with it)."""
    return bind is not None and bool(bind.exec_driver_sql(
        "SELECT coalesce(bool_or('lz4' = ANY(enumvals)), false) FROM pg_settings WHERE name = 'default_toast_compression'"
    ).scalar())


# PostgreSQL compresses a value of 2 KB and more before storing it, with pglz unless told otherwise: a file's packed
# sections (40 KB for 1,000 sections, stored for each agent's file) cost it 1.45 ms of CPU a file so, 0.25 ms with LZ4
# (bench/README.md). Catalogs created before keep pglz: `ALTER TABLE files ALTER COLUMN sections_packed SET COMPRESSION
# lz4` moves them (the values stored since).
event.listen(files, "after_create", DDL("ALTER TABLE files ALTER COLUMN sections_packed SET COMPRESSION lz4").execute_if(
    dialect="postgresql", callable_=_lz4_toast,
))

UNKNOWN_CODEC = -1  # `sections.produced_compression` of records whose Kafka codec is not known

# One row per section (a file holds one per topic-partition): the footer's summary of it plus the offsets the
# catalog assigned. Small sections share a block, so several may have one byte range. The columns are laid out by
# width, 64-bit ones first, then 32-bit, 16-bit and the sketch: PostgreSQL aligns each column to its width, and the
# order a row is written and read in (`SECTION_ROW`) padded 10 bytes of it; with record counts and tombstones 32-bit
# (a file's rows are counted in 32 bits: `first_row`), a row takes 144 bytes of the heap where it took 168.
sections = Table(
    "sections",
    metadata,
    Column("file_id", BigInteger, primary_key=True, autoincrement=False),
    Column("byte_offset", BigInteger, nullable=False),
    Column("byte_length", BigInteger, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("min_timestamp", BigInteger, nullable=False),
    Column("max_timestamp", BigInteger, nullable=False),
    Column("uncompressed_bytes", BigInteger, nullable=False),
    Column("crc32", BigInteger, nullable=False),
    Column("clean_below_delta", BigInteger, nullable=False),
    # Set when a compaction replaced the rest of its file but not this section (its partition was set aside as
    # uncleanable): the file stays live with the sections whose removed_version is null.
    Column("removed_version", BigInteger),
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("first_row", Integer, nullable=False),
    Column("record_count", Integer, nullable=False),
    Column("tombstones", Integer, nullable=False),
    Column("compression", SmallInteger, nullable=False),  # the store's codec of the file's blocks: format.layout.COMPRESSIONS
    Column("level", SmallInteger, nullable=False, server_default="0"),  # its file's: kept here for the partial index
    Column("key_sketch", LargeBinary),  # sketch.encode's packed registers; NULL for a section without keys
    # Kafka's codec id (0 none, 1 gzip, 2 snappy, 3 lz4, 4 zstd) most of the section's records were produced with, or
    # UNKNOWN_CODEC (records written through the library, rows from before schema 14): what Fetch sends consumers of
    # a topic whose compression.type is `producer`. Last, where an upgrade's ADD COLUMN puts it.
    Column("produced_compression", SmallInteger, nullable=False, server_default=text(str(UNKNOWN_CODEC))),
    sqlite_with_rowid=False,
)


# The order a sections row is built, inserted and read by position in (`files.insert_sections`, `Snapshot`), apart
# from how the table lays its columns out.
SECTION_ROW = (
    "file_id", "topic_id", "partition", "byte_offset", "byte_length", "first_row", "first_offset", "last_offset",
    "record_count", "min_timestamp", "max_timestamp", "tombstones", "uncompressed_bytes", "compression", "crc32",
    "clean_below_delta", "key_sketch", "removed_version", "level", "produced_compression",
)
SECTION_ROW_COLUMNS = tuple(sections.c[name] for name in SECTION_ROW)
# The sections above L0 of one partition from an offset (consume), and of a set of partitions (planners). L0
# sections stay out: an agent's file holds one for each of 1,000 partitions or more, and indexing them dirtied a
# leaf page per partition in every append (3.4 MB of SQLite's WAL each). A partition's L0 sections are found by
# primary key through the live L0 files instead (`by_partition`), a few hundred files at most.
# `ABOVE_L0` is the index's condition as queries must state it, a literal: a bound 0 would not prove it. The first
# offset rides along so that asking whether any section ending past an offset starts at or before it (a reader
# whose page has holes: `Snapshot.may_span`) reads the index alone, not each row it passes. SQLite reads a row for
# any column its index lacks, the condition's `level` too (14 ms against 2.0 over 40,000 sections), so its index
# holds the level; PostgreSQL's does not need it and would take 8 bytes more an entry.
ABOVE_L0 = sections.c.level > literal_column("0")
_BY_PARTITION = (sections.c.topic_id, sections.c.partition, sections.c.last_offset, sections.c.first_offset)
_PARTITION_INDEXES = {
    "postgresql": Index("sections_by_partition", *_BY_PARTITION, postgresql_where=ABOVE_L0).ddl_if(dialect="postgresql"),
    "sqlite": Index("sections_by_partition", *_BY_PARTITION, sections.c.level, sqlite_where=ABOVE_L0).ddl_if(dialect="sqlite"),
}


def partition_index(dialect: str) -> Index:
    """`sections_by_partition` as the database of `dialect` builds it."""
    return _PARTITION_INDEXES[dialect]


# The sections retired while their file stays live (`removed_version` set on the row alone), by version: a planning
# pass reading its files' packed sections (`files.sections_packed`) leaves these out.
RETIRED_SECTIONS = Index(
    "sections_retired",
    sections.c.removed_version,
    sqlite_where=sections.c.removed_version.is_not(None),
    postgresql_where=sections.c.removed_version.is_not(None),
)

# Per partition, its live sections above L0 summed up (`summaries`: count, bytes, records, the base section's facts,
# timestamps, key sketches merged; all NULL but the counts when it has none), and the version of the commit that
# last set it: every commit adding or removing sections above L0 keeps it in its own transaction. Planners and
# `logcompact status` read it in place of the sections; a snapshot older than a row's version reads the sections.
# Rows are never deleted, so a partition without one never held a section above L0.
partition_summaries = Table(
    "partition_summaries",
    metadata,
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("version", BigInteger, nullable=False),
    Column("sections", BigInteger, nullable=False),
    Column("bytes", BigInteger, nullable=False),  # uncompressed
    Column("l1_bytes", BigInteger, nullable=False),  # of those, at L1 (below dedup_from_level by default: the dirty ratio's bound)
    Column("records", BigInteger, nullable=False),
    Column("floor", BigInteger),  # the base's first offset: the lowest above L0
    Column("base_level", SmallInteger),
    Column("base_clean", SmallInteger),  # 1: free of duplicates (its clean_below_delta covers it)
    Column("base_bytes", BigInteger),
    Column("base_min_timestamp", BigInteger),
    Column("others_min_timestamp", BigInteger),  # NULL: the base is the only section
    Column("newest_file_ms", BigInteger),
    Column("key_sketch", LargeBinary),
    # The partition's entries in `sections_by_partition`: its sections above L0, live or not, until gc forgets their
    # files. A read of the partition through the index passes each (`summaries.read_through_files` weighs them).
    Column("indexed", BigInteger, nullable=False, server_default="0"),
    sqlite_with_rowid=False,
)


# The offsets between sections that no record holds rightly, per partition, in ranges (the live ones disjoint,
# adjacent ones coalesced): those compactions dropped and those transactions' markers took. What tells a partition's
# holes from a damaged row's (a section moved to another partition or topic leaves a gap no row here holds, which
# readers and compactions refuse). A compaction records the offsets its inputs' sections spanned that its outputs' do
# not, EndTxn its markers, and a compaction retires the rows its outputs now span (`holes.record`): a
# row retired at version V still explains gaps to snapshots older than V, until gc trims the commit log past it. A
# topic's deletion drops its rows.
offset_holes = Table(
    "offset_holes",
    metadata,
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("first_offset", BigInteger, primary_key=True, autoincrement=False),
    Column("added_version", BigInteger, primary_key=True, autoincrement=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("removed_version", BigInteger),
    sqlite_with_rowid=False,
)
Index(  # the retired rows, by version (gc)
    "offset_holes_removed",
    offset_holes.c.removed_version,
    sqlite_where=offset_holes.c.removed_version.is_not(None),
    postgresql_where=offset_holes.c.removed_version.is_not(None),
)

def live_l0_files(version: int | BindParameter[int] | None = None) -> Select | CompoundSelect:
    """The ids of the L0 files live at `version` (now, without one), through the index of live files by level and,
    for a past version, the index of removed files by version: L0 files removed later than it."""
    return _live_files(files.c.level == 0, version)


def live_files_above_l0(version: int | BindParameter[int] | None = None) -> Select | CompoundSelect:
    """The ids of the files above L0 live at `version` (now, without one), as `live_l0_files` finds L0's."""
    return _live_files(files.c.level > 0, version)


def _live_files(at_level: ColumnElement[bool], version: int | BindParameter[int] | None) -> Select | CompoundSelect:
    file = files.c
    # Never correlated: a query reading its sections through them joins the files too.
    now = select(file.file_id).where(at_level, file.removed_version.is_(None)).correlate(None)
    if version is None:
        return now
    return union_all(
        now.where(file.added_version <= version),
        select(file.file_id).where(file.removed_version > version, at_level, file.added_version <= version).correlate(None),
    )


def by_partition(query: Select, version: int | BindParameter[int] | None = None) -> tuple[Select, Select]:
    """A query of sections picked by partition, split in two parts whose rows are its own: the sections above L0,
    read through `sections_by_partition`, and the L0 sections, by primary key through the files `live_l0_files`."""
    return query.where(ABOVE_L0), query.where(sections.c.file_id.in_(live_l0_files(version)))


def through_live_files(query: Select, version: int | BindParameter[int] | None = None) -> Select:
    """A query of sections above L0 read through the live files above L0 and their sections' primary key, every such
    section of every partition: `sections_by_partition` also holds the sections of removed files until gc forgets
    them, and a read through it pays for each. The query must not pick partitions (the database would take the index
    again): the caller picks them from the rows."""
    return query.where(ABOVE_L0, sections.c.file_id.in_(live_files_above_l0(version)))

def removal_recorded(removed_version: ColumnElement[int]) -> ColumnElement[bool]:
    """Whether a row's `removed_version` (a files row's, or a sections row's retired alone) is a commit that removes
    files or retires sections: a committed plan's (DeleteRecords' among them: `topics.retire_below_log_starts`), a
    topic's deletion, or a replacement of files the commit log still holds. Any other is a damaged row's, which hides
    the records it names."""
    return or_(
        removed_version.in_(select(committed_plans.c.version)),
        removed_version.in_(select(topics.c.deleted_version).where(topics.c.deleted_version.is_not(None))),
        removed_version.in_(select(versions.c.version).where(versions.c.operation == "replace files")),
    )


# The fields of a sections row that say which records it names and where they are, as `section_crc_binding` packs them.
SECTION_PLACE = struct.Struct("<8q")
# Where the first and the last offset are packed in it.
SECTION_PLACE_OFFSETS = (5 * 8, 6 * 8)


def section_crc_binding(
    topic_id: int, partition: int, byte_offset: int, byte_length: int, first_row: int, first_offset: int, last_offset: int,
    record_count: int,
) -> int:
    """What `sections.crc32` is XORed with: the CRC-32 of the row's locating fields. The column holds the section's
    CRC (`SectionInfo.crc32`, the index CRC of its first block, as in the file's footer and in plans) XOR this, so
    the one writer of section rows (`files.insert_sections`) and their readers (`Snapshot`) apply it alike, and what
    a reader gets back is the file's CRC only while none of these fields changed since the row was written.

    Why: readers check a section's first block against its row's CRC, which catches a replaced or damaged file but
    not a damaged row whose blocks are still the file's. Two rows of one file swapped by partition (the same
    offsets, so every check of offsets passes) would show one partition's records under the other, and a row
    shifted onto offsets of a section outside a compaction's plan would be copied there as if true. Bound, each
    is a CRC mismatch where its blocks are read (the format's one read path of a section, by ranged GETs for
    `consume` and Fetch, from one forward stream for the engine): one CorruptDataError, and a compaction sets the
    partition aside. Timestamps, counts of bytes and tombstones, the sketch are not bound: a change there misplaces
    no record.

    One pack and one CRC per row (zlib's CRC-32 of the eight fields as little-endian 64-bit integers): a planner
    loads hundreds of thousands of rows per pass. A value that is no 64-bit integer (a damaged SQLite row) raises
    struct.error."""
    return crc32(SECTION_PLACE.pack(topic_id, partition, byte_offset, byte_length, first_row, first_offset, last_offset, record_count))


# `SECTION_PLACE` as a numpy row: the same eight little-endian 64-bit integers.
_SECTION_PLACE_ROW = np.dtype([(f"f{n}", "<i8") for n in range(8)])


def section_crc_bindings(*columns: Sequence[int] | np.ndarray) -> np.ndarray:
    """`section_crc_binding` of many rows at once, given its eight arguments as columns (int64): one pack for them
    all, then one compiled pass computing each row's CRC. A commit binds an agent's 1,000 sections or more inside the
    transaction, and a compaction's preparation unbinds its inputs' 300,000 (a CRC call a row from Python took 0.17 s
    of them, the pass 0.03 s)."""
    rows = np.empty(len(columns[0]), _SECTION_PLACE_ROW)
    for n, column in enumerate(columns):
        rows[f"f{n}"] = column
    return _crc32_of_rows(rows.view(np.uint8).reshape(len(rows), SECTION_PLACE.size), _CRC32_TABLE)


def _crc32_table() -> np.ndarray:
    """zlib's CRC-32 (reflected, polynomial 0xEDB88320) of each byte value, for a byte-at-a-time CRC."""
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> np.uint32(1)) ^ np.uint32(0xEDB88320), table >> np.uint32(1)).astype(np.uint32)
    return table


_CRC32_TABLE = _crc32_table()


def compile_crc_bindings() -> None:
    """Compile (or load from numba's cache) the bindings' loop now, not inside a first commit's transaction."""
    section_crc_bindings(*([0],) * 8)


@numba.njit(cache=True, nogil=True)
def _crc32_of_rows(rows: np.ndarray, table: np.ndarray) -> np.ndarray:
    """zlib's CRC-32 of each row of a 2-D uint8 array, as int64."""
    crcs = np.empty(rows.shape[0], np.int64)
    for row in range(rows.shape[0]):
        crc = np.uint32(0xFFFFFFFF)
        for at in range(rows.shape[1]):
            crc = table[(crc ^ rows[row, at]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
        crcs[row] = crc ^ np.uint32(0xFFFFFFFF)
    return crcs


leases = Table(
    "leases",
    metadata,
    Column("file_id", BigInteger, primary_key=True, autoincrement=False),
    Column("plan_id", String(64), nullable=False),
    Column("expires_ms", BigInteger, nullable=False),
)
Index("leases_by_plan", leases.c.plan_id)

# Plans committed, so committing one again is a no-op.
committed_plans = Table(
    "committed_plans",
    metadata,
    Column("plan_id", String(64), primary_key=True),
    Column("version", BigInteger, nullable=False),
    Column("committed_ms", BigInteger, nullable=False),
)

# Partitions set aside as uncleanable (Kafka's term): their compaction failed on damaged data. Their sections stay
# live where they are; planners leave them out until `retry_ms`, or until the damaged file is no longer live or
# its object was replaced, and `logcompact uncleanable clear` removes the mark.
uncleanable = Table(
    "uncleanable",
    metadata,
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("reason", Text, nullable=False),
    Column("file_key", Text, nullable=False),  # the damaged file the reason names
    Column("file_stamp", Text, nullable=False),  # its object's size and modification time then: a restore changes it
    Column("marked_ms", BigInteger, nullable=False),
    Column("retry_ms", BigInteger, nullable=False),
    Column("failures", Integer, nullable=False),  # in a row: the backoff doubles with each
    Column("plan_id", String(64), nullable=False),
)

# The SHA-256 of each leased plan's stored documents, written with its lease: the commit checks the documents it
# reads against it, so an edited stored plan never commits (its Spark jobs never open the catalog).
plan_seals = Table(
    "plan_seals",
    metadata,
    Column("plan_id", String(64), primary_key=True),
    Column("sha256", String(64), nullable=False),
)


# -- Kafka's protocol (`logcompact agent`) --------------------------------------------------------------------------

# The agents serving the cluster: each registers at start and heartbeats; Metadata lists those heard from lately
# and spreads partition leadership over them.
agents = Table(
    "agents",
    metadata,
    Column("node_id", Integer, primary_key=True, autoincrement=False),
    Column("host", String(255), nullable=False),
    Column("port", Integer, nullable=False),
    Column("rack", String(255)),
    Column("started_ms", BigInteger, nullable=False),
    Column("heartbeat_ms", BigInteger, nullable=False),
)

# Producer ids handed out by InitProducerId, with their current epoch (a transactional id keeps its producer id
# and bumps the epoch).
producers = Table(
    "producers",
    metadata,
    Column("producer_id", Identity64, primary_key=True),
    Column("epoch", Integer, nullable=False),
    Column("transactional_id", String(255), unique=True),
    Column("updated_ms", BigInteger, nullable=False),
)

# An idempotent producer's newest batches per partition (Kafka keeps 5, its max in-flight requests), written in
# the append's transaction: a retried batch is answered with its first offset and never stored twice, on any agent.
producer_batches = Table(
    "producer_batches",
    metadata,
    Column("producer_id", BigInteger, primary_key=True, autoincrement=False),
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("epoch", Integer, nullable=False),
    # JSON [[first_sequence, last_sequence, first_offset], ...], oldest first; a transactional batch refused by its
    # append (its transaction had ended) has a 4th element, the refusal, which a retry of it is answered with.
    Column("batches", Text, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    sqlite_with_rowid=False,
)

# Consumer groups as their coordinator last wrote them (ListGroups on any agent, and the group a new coordinator
# loads: its generation, protocol, leader and members).
consumer_groups = Table(
    "consumer_groups",
    metadata,
    Column("group_id", String(255), primary_key=True),
    Column("coordinator", Integer, nullable=False),  # the node id of the agent coordinating it
    Column("generation", Integer, nullable=False),
    Column("protocol_type", String(255), nullable=False),
    Column("protocol", String(255), nullable=False),
    Column("state", String(32), nullable=False),  # Kafka's: Empty, PreparingRebalance, CompletingRebalance, Stable, Dead
    # JSON: each member's ids, host, timeouts, protocols' metadata and assignment (bytes in base64)
    Column("members", Text, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    Column("leader", String(255), nullable=False, server_default=""),  # its member id; "" in a group without members
)

# Consumer groups' committed offsets (OffsetCommit), by topic name as Kafka keeps them; served by every agent.
group_offsets = Table(
    "group_offsets",
    metadata,
    Column("group_id", String(255), primary_key=True),
    Column("topic", String(249), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("committed_offset", BigInteger, nullable=False),
    Column("leader_epoch", Integer, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("commit_ms", BigInteger, nullable=False),
    sqlite_with_rowid=False,
)

# -- Kafka's transactions (`catalog.transactions`) -----------------------------------------------------------------

# One row per transactional id: its producer id and epoch (a fenced producer holds an older one), its state in
# Kafka's names (Empty, Ongoing, CompleteCommit, CompleteAbort; EndTxn is one catalog transaction, so no Prepare*
# state is ever stored), its timeout and when its open transaction began (-1 before the first), and the producer id
# and epoch it had before the last InitProducerId (-1: none to accept a retry of; KIP-360).
transactions = Table(
    "transactions",
    metadata,
    Column("transactional_id", String(255), primary_key=True),
    Column("producer_id", BigInteger, nullable=False),
    Column("epoch", Integer, nullable=False),
    Column("state", String(16), nullable=False),
    Column("timeout_ms", Integer, nullable=False),
    Column("start_ms", BigInteger, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
    Column("previous_producer_id", BigInteger, nullable=False, server_default="-1"),
    Column("previous_epoch", Integer, nullable=False, server_default="-1"),
)
# The ingest's view of a producer's transaction and DescribeProducers, by producer id; the timeout sweep, status and
# ListTransactions' duration filter, over the open transactions only.
Index("transactions_by_producer", transactions.c.producer_id, unique=True)
Index(
    "transactions_ongoing",
    transactions.c.start_ms,
    sqlite_where=transactions.c.state == "Ongoing",
    postgresql_where=transactions.c.state == "Ongoing",
)

# The partitions of each open transaction (AddPartitionsToTxn), deleted when it ends: the first offset of its data
# there (NULL until its first batch lands) and its batches' offset ranges (JSON [[first, last], ...], merged where
# contiguous), recorded as aborted if it aborts. A partition's last stable offset is the least first offset here.
transaction_partitions = Table(
    "transaction_partitions",
    metadata,
    Column("transactional_id", String(255), primary_key=True),
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("first_offset", BigInteger),
    Column("ranges", Text, nullable=False, server_default="[]"),
    sqlite_with_rowid=False,
)
Index("transaction_partitions_unstable", transaction_partitions.c.topic_id, transaction_partitions.c.partition,
      transaction_partitions.c.first_offset)

# The consumer groups an open transaction commits offsets of (AddOffsetsToTxn).
transaction_groups = Table(
    "transaction_groups",
    metadata,
    Column("transactional_id", String(255), primary_key=True),
    Column("group_id", String(255), primary_key=True),
    sqlite_with_rowid=False,
)

# Offsets an open transaction commits (TxnOffsetCommit), moved into group_offsets when it commits.
transaction_offsets = Table(
    "transaction_offsets",
    metadata,
    Column("transactional_id", String(255), primary_key=True),
    Column("group_id", String(255), primary_key=True),
    Column("topic", String(249), primary_key=True),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("committed_offset", BigInteger, nullable=False),
    Column("leader_epoch", Integer, nullable=False),
    Column("metadata", Text, nullable=False),
    Column("commit_ms", BigInteger, nullable=False),
    sqlite_with_rowid=False,
)
# OffsetFetch's require_stable: the pending offsets of a group's partitions.
Index("transaction_offsets_by_group", transaction_offsets.c.group_id, transaction_offsets.c.topic, transaction_offsets.c.partition)

# The offsets of aborted transactions' data, per partition: disjoint ranges, each with its producer and the catalog
# version that recorded it. `read_committed` readers skip them and compaction removes their records; a range goes
# once no file that may still be read holds an unfiltered record in it (`transactions.forget_aborted`).
aborted_ranges = Table(
    "aborted_ranges",
    metadata,
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("first_offset", BigInteger, primary_key=True, autoincrement=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("producer_id", BigInteger, nullable=False),
    Column("version", BigInteger, nullable=False),
    sqlite_with_rowid=False,
)
# Disjoint ranges overlap [a, b) where first_offset < b and last_offset >= a: read from this index alone.
Index("aborted_ranges_by_end", aborted_ranges.c.topic_id, aborted_ranges.c.partition, aborted_ranges.c.last_offset,
      aborted_ranges.c.first_offset)

# The tables schema 12 added, which `migrations._add_transactions` creates in a schema-11 catalog.
TRANSACTION_TABLES = (transactions, transaction_partitions, transaction_groups, transaction_offsets, aborted_ranges)


# -- Security (docs/security.md) -------------------------------------------------------------------------------------

# Each agent's endpoint per listener (named after its security protocol): Metadata, FindCoordinator and DescribeCluster
# answer with the endpoints of the listener a request arrived on, and leave out the agents without one.
agent_endpoints = Table(
    "agent_endpoints",
    metadata,
    Column("node_id", Integer, primary_key=True, autoincrement=False),
    Column("listener", String(32), primary_key=True),
    Column("host", String(255), nullable=False),
    Column("port", Integer, nullable=False),
)

# SCRAM credentials as Kafka keeps them (RFC 5802), per user and mechanism: never the password, so every agent
# authenticates every user and nobody reading the catalog learns a secret a client could send.
scram_credentials = Table(
    "scram_credentials",
    metadata,
    Column("user_name", Text, primary_key=True),
    Column("mechanism", String(16), primary_key=True),  # SCRAM-SHA-256 or SCRAM-SHA-512
    Column("salt", LargeBinary, nullable=False),
    Column("stored_key", LargeBinary, nullable=False),
    Column("server_key", LargeBinary, nullable=False),
    Column("iterations", Integer, nullable=False),
)

# Kafka's ACLs, one row per binding, every field Kafka's code or text (its AclBinding): resource type (2 Topic,
# 3 Group, 4 Cluster, 5 TransactionalId), pattern type (3 LITERAL, 4 PREFIXED), operation (AclOperation's codes),
# permission (2 DENY, 3 ALLOW). Agents cache them all and read them again every --acl-refresh-ms.
acls = Table(
    "acls",
    metadata,
    Column("resource_type", SmallInteger, primary_key=True, autoincrement=False),
    Column("resource_name", Text, primary_key=True),
    Column("pattern_type", SmallInteger, primary_key=True, autoincrement=False),
    Column("principal", Text, primary_key=True),
    Column("host", Text, primary_key=True),
    Column("operation", SmallInteger, primary_key=True, autoincrement=False),
    Column("permission_type", SmallInteger, primary_key=True, autoincrement=False),
)

# Kafka's client quotas (KIP-55): a value per quota key of an entity, whose parts (user, client id, ip) are each
# absent (0), named (1, by `*_name`) or the default of its type (2). Agents cache them as ACLs.
client_quotas = Table(
    "client_quotas",
    metadata,
    Column("user_part", SmallInteger, primary_key=True, autoincrement=False),
    Column("user_name", Text, primary_key=True),  # '' unless the user part is named
    Column("client_id_part", SmallInteger, primary_key=True, autoincrement=False),
    Column("client_id_name", Text, primary_key=True),
    Column("ip_part", SmallInteger, primary_key=True, autoincrement=False),
    Column("ip_name", Text, primary_key=True),
    Column("quota_key", String(64), primary_key=True),
    Column("value", Float, nullable=False),
)

# The tables schema 13 added, which `migrations._add_security_tables` creates in a schema-12 catalog.
SECURITY_TABLES = (agent_endpoints, scram_credentials, acls, client_quotas)
