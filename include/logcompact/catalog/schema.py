"""The catalog's tables (SQLAlchemy Core), one schema for SQLite and PostgreSQL; `docs/catalog.md` explains it.

A manifest version is not stored as a document: version N is every file with added_version <= N and
no removed_version <= N. `catalog_info` holds the newest version; every commit increments it first, which
also serializes commits (a row lock on PostgreSQL, the write lock on SQLite).
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    SmallInteger,
    String,
    Table,
    Text,
)

# Bump on any change to the tables below; a database of another version is refused (CatalogSchemaError).
SCHEMA_VERSION = 3

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
    Column("name", String(249), nullable=False, unique=True),
    Column("partitions", Integer, nullable=False),
    Column("config", Text, nullable=False),  # Kafka names to values, JSON
    Column("created_ms", BigInteger, nullable=False),
    Column("created_version", BigInteger, nullable=False),
)

partitions = Table(
    "partitions",
    metadata,
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("next_offset", BigInteger, nullable=False),
    sqlite_with_rowid=False,
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

# One row per section (a file holds one per topic-partition): the footer's summary of it plus the offsets the
# catalog assigned. Small sections share a block, so several may have one byte range.
sections = Table(
    "sections",
    metadata,
    Column("file_id", BigInteger, primary_key=True, autoincrement=False),
    Column("topic_id", Integer, primary_key=True, autoincrement=False),
    Column("partition", Integer, primary_key=True, autoincrement=False),
    Column("byte_offset", BigInteger, nullable=False),
    Column("byte_length", BigInteger, nullable=False),
    Column("first_row", Integer, nullable=False),
    Column("first_offset", BigInteger, nullable=False),
    Column("last_offset", BigInteger, nullable=False),
    Column("record_count", BigInteger, nullable=False),
    Column("min_timestamp", BigInteger, nullable=False),
    Column("max_timestamp", BigInteger, nullable=False),
    Column("tombstones", BigInteger, nullable=False),
    Column("uncompressed_bytes", BigInteger, nullable=False),
    Column("compression", SmallInteger, nullable=False),  # index into format.layout.COMPRESSIONS
    Column("crc32", BigInteger, nullable=False),
    Column("clean_below_delta", BigInteger, nullable=False),
    Column("key_sketch", LargeBinary),  # sketch.encode's packed registers; NULL for a section without keys
    # Set when a compaction replaced the rest of its file but not this section (its partition was set aside as
    # uncleanable): the file stays live with the sections whose removed_version is null.
    Column("removed_version", BigInteger),
    sqlite_with_rowid=False,
)
# The sections of one partition from an offset (consume), and of a set of partitions (planners).
Index("sections_by_partition", sections.c.topic_id, sections.c.partition, sections.c.last_offset)

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
