"""The catalog's schema upgrades (`logcompact cluster upgrade-catalog`): each step brings the tables of an older
schema to the next, in the upgrade's one transaction. Functions of a Connection, called by
`Catalog.upgrade_catalog`, which checks the schema found and takes the transaction.
"""

from __future__ import annotations

import struct

from sqlalchemy import Connection, bindparam, func, inspect, select, tuple_, update
from sqlalchemy.engine import Row
from sqlalchemy.schema import CreateTable

from logcompact.catalog import holes, summaries
from logcompact.catalog import schema as s
from logcompact.catalog.database import execute_many
from logcompact.exceptions import CatalogSchemaError, CorruptDataError


def schema_error(shown_url: str, found: int) -> CatalogSchemaError:
    """The one line refusing a catalog of schema `found`: the command that upgrades it, when there is one."""
    if found in s.UPGRADABLE_FROM:
        return CatalogSchemaError(
            f"catalog {shown_url} has schema version {found}, this logcompact uses {s.SCHEMA_VERSION}: stop its "
            "agents and compactions, back the database up, and run `logcompact cluster upgrade-catalog` (one "
            "transaction)"
        )
    return CatalogSchemaError(
        f"catalog {shown_url} has schema version {found}, this logcompact uses {s.SCHEMA_VERSION}; run the "
        "logcompact release that created it, or start a new catalog"
    )


def upgrade(connection: Connection, found: int, batch: int, shown_url: str) -> int:
    """Bring the tables of schema `found` (one of UPGRADABLE_FROM) to SCHEMA_VERSION, step by step (`Catalog.upgrade_catalog`
    says what each does); returns the sections rows rewritten."""
    if found not in s.UPGRADABLE_FROM:
        raise CatalogSchemaError(
            f"catalog {shown_url} has schema version {found}: `logcompact cluster upgrade-catalog` "
            f"upgrades schemas {', '.join(map(str, s.UPGRADABLE_FROM))} to {s.SCHEMA_VERSION} only; run the "
            "logcompact release that created it, or start a new catalog"
        )
    rewritten = _bind_section_crcs(connection, batch, shown_url) if found == 3 else 0
    if found < 5:
        _add_kafka_tables(connection)
    if found < 6:
        _index_sections_above_l0(connection)
    if found == 7:  # schema 7's summaries lack l1_bytes; derived from the sections, they are summed up again
        s.partition_summaries.drop(connection)
    if found in (8, 9):
        connection.exec_driver_sql("ALTER TABLE partition_summaries ADD COLUMN indexed BIGINT DEFAULT 0 NOT NULL")
    if found < 9:
        _lay_sections_out(connection)
        _summarize_partitions(connection)
    if found < 11:  # steps to schema 11, which a schema-11 catalog must not run again
        summaries.count_indexed(connection)
        _name_newest_files(connection)
        if found >= 5:  # before 5, _add_kafka_tables made consumer_groups as this schema has it
            _keep_group_members(connection)
    if connection.dialect.name == "postgresql":  # pages of the partitions' rows half empty, as `schema.partitions` says
        connection.exec_driver_sql("ALTER TABLE partitions SET (fillfactor = 50)")
    if found < 12:
        _add_transactions(connection)  # to schema 12
        _record_holes(connection)
    if found < 13:
        _add_security_tables(connection)  # to schema 13
    if found < 14:
        _record_produced_compression(connection)  # to schema 14
    _pack_files_sections(connection)  # to schema 15
    connection.execute(update(s.catalog_info).values(schema_version=s.SCHEMA_VERSION))
    return rewritten


def _bind_section_crcs(connection: Connection, batch: int, shown_url: str) -> int:
    """Schema 3 to 4: bind every sections row's crc32 to its row; returns the rows rewritten."""
    sec = s.sections.c
    key = (sec.file_id, sec.topic_id, sec.partition)
    # The key, then the bound fields from topic_id on (section_crc_binding's order), then crc32.
    columns = (*key, sec.byte_offset, sec.byte_length, sec.first_row, sec.first_offset, sec.last_offset, sec.record_count, sec.crc32)
    rewrite = (
        update(s.sections)
        .where(sec.file_id == bindparam("b_file"), sec.topic_id == bindparam("b_topic"), sec.partition == bindparam("b_partition"))
        .values(crc32=bindparam("b_crc"))
    )
    rewritten, after = 0, None
    while True:
        query = select(*columns).order_by(*key).limit(batch)
        if after is not None:
            query = query.where(tuple_(*key) > tuple_(*after))
        rows = connection.execute(query).all()
        if not rows:
            return rewritten
        execute_many(connection, rewrite, ("b_crc", "b_file", "b_topic", "b_partition"), [
            (row[9] ^ _upgraded_binding(row, shown_url), row[0], row[1], row[2]) for row in rows
        ])
        rewritten += len(rows)
        after = tuple(rows[-1][:3])

def _upgraded_binding(row: Row, shown_url: str) -> int:
    """`_bind_section_crcs`'s binding of a row (file_id, topic_id, partition, ..., record_count, crc32)."""
    try:
        return s.section_crc_binding(*row[1:9])
    except struct.error:
        raise CorruptDataError(
            f"catalog {shown_url}: the sections row of file_id {row[0]!r}, topic_id {row[1]!r}, partition {row[2]!r} "
            f"holds locating fields {tuple(row[1:9])!r:.200} that are not all 64-bit integers; restore the catalog "
            "database from a backup and upgrade again; nothing was changed"
        ) from None


def _add_kafka_tables(connection: Connection) -> None:
    """Schema 4 to 5: the Kafka agents' tables, partitions.log_start_offset, and topics.deleted_version with the
    topics' names unique among live topics only."""
    s.metadata.create_all(connection, checkfirst=True)  # the tables schema 4 lacks, with their indexes
    connection.exec_driver_sql("ALTER TABLE partitions ADD COLUMN log_start_offset BIGINT NOT NULL DEFAULT 0")
    if connection.dialect.name == "postgresql":
        connection.exec_driver_sql("ALTER TABLE topics ADD COLUMN deleted_version BIGINT")
        connection.exec_driver_sql("ALTER TABLE topics DROP CONSTRAINT topics_name_key")
    else:  # SQLite drops no constraint: the table is built again, its topic ids (rowids) kept
        connection.exec_driver_sql("ALTER TABLE topics RENAME TO topics_schema_4")
        s.topics.create(connection)
        columns = ", ".join(c.name for c in s.topics.c if c.name != "deleted_version")
        connection.exec_driver_sql(f"INSERT INTO topics ({columns}) SELECT {columns} FROM topics_schema_4")
        connection.exec_driver_sql("DROP TABLE topics_schema_4")
        return  # create() made topics_live_name with the table
    for index in s.topics.indexes:
        index.create(connection)


def _keep_group_members(connection: Connection) -> None:
    """Schema 10 to 11: consumer_groups.leader. Schema 10 kept no member's protocols nor assignment, so no coordinator
    could go on with its members (they joined again): each row is left Empty, without members, its generation kept."""
    connection.exec_driver_sql("ALTER TABLE consumer_groups ADD COLUMN leader VARCHAR(255) DEFAULT '' NOT NULL")
    connection.execute(update(s.consumer_groups).values(state="Empty", protocol="", members="[]"))


def _index_sections_above_l0(connection: Connection) -> None:
    """Schema 5 to 6: partitions.assigned_end (the end of the offsets their sections hold), sections.level (their
    file's), and the index of every section by partition dropped (`_lay_sections_out` builds schema 9's, over the
    sections above L0 only)."""
    # Where the sections end, read through the old index before it goes: a row lowered before the upgrade is
    # refused by the next append as one lowered after.
    connection.exec_driver_sql("ALTER TABLE partitions ADD COLUMN assigned_end BIGINT NOT NULL DEFAULT 0")
    connection.exec_driver_sql(
        "UPDATE partitions SET assigned_end = COALESCE((SELECT max(sections.last_offset) + 1 FROM sections WHERE "
        "sections.topic_id = partitions.topic_id AND sections.partition = partitions.partition), 0)"
    )
    connection.exec_driver_sql("ALTER TABLE sections ADD COLUMN level SMALLINT NOT NULL DEFAULT 0")
    connection.exec_driver_sql(
        "UPDATE sections SET level = (SELECT files.level FROM files WHERE files.file_id = sections.file_id) "
        "WHERE sections.file_id IN (SELECT file_id FROM files WHERE level > 0)"
    )
    connection.exec_driver_sql("DROP INDEX sections_by_partition")  # schema 9's is built by `_lay_sections_out`


def _lay_sections_out(connection: Connection) -> None:
    """To schema 9: `sections_by_partition` built again with the first offset; on PostgreSQL, the sections table made
    again in its columns' new layout (by width; record counts and tombstones 32-bit), its rows copied in key order
    and its indexes built after them. A count past 32 bits fails the copy, and the upgrade with it. SQLite stores an
    integer by its value whatever the column's declared width and place: its table is kept."""
    connection.exec_driver_sql("DROP INDEX IF EXISTS sections_by_partition")  # dropped already on an upgrade from 5
    if connection.dialect.name != "postgresql":
        s.partition_index(connection.dialect.name).create(connection)
        return
    connection.exec_driver_sql("ALTER TABLE sections RENAME TO sections_schema_8")
    connection.exec_driver_sql("ALTER INDEX sections_pkey RENAME TO sections_schema_8_pkey")
    connection.execute(CreateTable(s.sections))  # with schema 14's produced_compression, which the rows copied default
    columns = ", ".join(name for name in s.SECTION_ROW if name != "produced_compression")
    connection.exec_driver_sql(
        f"INSERT INTO sections ({columns}) SELECT {columns} FROM sections_schema_8 ORDER BY file_id, topic_id, partition"
    )
    connection.exec_driver_sql("DROP TABLE sections_schema_8")
    s.partition_index("postgresql").create(connection)
    connection.exec_driver_sql("ANALYZE sections")  # a new table has no statistics until autovacuum's first pass


def _summarize_partitions(connection: Connection) -> None:
    """To schema 8: `partition_summaries` (created unless there), a row for every partition from its sections, set by
    the newest version (older snapshots read the sections)."""
    s.partition_summaries.create(connection, checkfirst=True)  # created with the Kafka tables on an upgrade from 4
    version = connection.execute(select(s.catalog_info.c.version)).scalar_one()
    slots = [tuple(row) for row in connection.execute(select(s.partitions.c.topic_id, s.partitions.c.partition))]
    found = summaries.summed_up(connection, slots)
    summaries.write(connection, {slot: found.get(slot) for slot in slots}, version)


# -- schema 10 to 11 ----------------------------------------------------------------------------------------------


def _name_newest_files(connection: Connection) -> None:
    """To schema 11: `partitions.newest_file`, the newest L0 file holding a section of each partition (0 for none),
    from one grouped read of the L0 sections: an append then looks at the live L0 files newer than it only."""
    connection.exec_driver_sql("ALTER TABLE partitions ADD COLUMN newest_file BIGINT NOT NULL DEFAULT 0")
    sec, part = s.sections.c, s.partitions.c
    newest = connection.execute(
        select(sec.topic_id, sec.partition, func.max(sec.file_id)).where(sec.level == 0).group_by(sec.topic_id, sec.partition)
    ).all()
    statement = update(s.partitions).where(part.topic_id == bindparam("t"), part.partition == bindparam("p")).values(newest_file=bindparam("f"))
    execute_many(connection, statement, ("f", "t", "p"), [(file_id, topic_id, partition) for topic_id, partition, file_id in newest])


# -- schema 11 to 12 ----------------------------------------------------------------------------------------------


def _add_transactions(connection: Connection) -> None:
    """To schema 12: the transactions' tables (`schema.TRANSACTION_TABLES`; made already on an upgrade from 4, whose
    step makes every table missing) and `files.filtered_version` (NULL: no file was filtered of aborted data)."""
    s.metadata.create_all(connection, tables=list(s.TRANSACTION_TABLES), checkfirst=True)
    connection.exec_driver_sql("ALTER TABLE files ADD COLUMN filtered_version BIGINT")


def _record_holes(connection: Connection) -> None:
    """To schema 12: `offset_holes` (created unless there: `_add_kafka_tables` made it on an upgrade from 4),
    holding every gap between the live sections of each compacted partition, as the catalog stands
    (`holes.record_every_gap`)."""
    s.offset_holes.create(connection, checkfirst=True)
    holes.record_every_gap(connection)


# -- schema 12 to 13 ----------------------------------------------------------------------------------------------


def _add_security_tables(connection: Connection) -> None:
    """To schema 13: the listeners' endpoints, SCRAM credentials, ACLs and client quotas (`schema.SECURITY_TABLES`;
    made already on an upgrade from 4, whose step makes every table missing), all empty: no agent has registered
    its endpoints yet, no user or quota exists and, with no ACL, authorization allows what it did."""
    s.metadata.create_all(connection, tables=list(s.SECURITY_TABLES), checkfirst=True)


# -- schema 13 to 14 ----------------------------------------------------------------------------------------------


def _record_produced_compression(connection: Connection) -> None:
    """To schema 14: `sections.produced_compression`, UNKNOWN_CODEC in every row (schema 13 did not record the codec
    records were produced with), unless `_lay_sections_out` made the table with it on an upgrade from below 9. A
    constant default: neither database rewrites the table."""
    if "produced_compression" in {column["name"] for column in inspect(connection).get_columns("sections")}:
        return
    connection.exec_driver_sql(f"ALTER TABLE sections ADD COLUMN produced_compression SMALLINT NOT NULL DEFAULT {s.UNKNOWN_CODEC}")


def _pack_files_sections(connection: Connection) -> None:
    """To schema 15: `files.sections_packed`, NULL in every row (a planning pass reads those files' sections rows, as
    before), and the index of retired sections (`sections_retired`)."""
    kind = "BYTEA" if connection.dialect.name == "postgresql" else "BLOB"
    connection.exec_driver_sql(f"ALTER TABLE files ADD COLUMN sections_packed {kind}")
    s.RETIRED_SECTIONS.create(connection)
