"""The files and sections rows a commit adds or looks up, appends and compactions alike: file ids taken ahead, the
sections rows built by columns and inserted (invisible until their files rows are), then the files rows under the
commit's version. Functions of a Connection, called by `Catalog` inside its transactions.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from itertools import repeat

import numpy as np
from sqlalchemy import Connection, func, insert, select

from logcompact.catalog import appends, summaries
from logcompact.catalog import schema as s
from logcompact.catalog.columns import pack_sections
from logcompact.catalog.database import one_of
from logcompact.catalog.model import CONTENTS, DataFile
from logcompact.catalog.topics import COMPACTED
from logcompact.format.layout import COMPRESSIONS, SectionInfo


def live_file_ids(connection: Connection, keys: Sequence[str]) -> dict[str, int]:
    rows = connection.execute(
        select(s.files.c.key, s.files.c.file_id).where(one_of(s.files.c.key, keys, connection.dialect.name), s.files.c.removed_version.is_(None))
    )
    return {r.key: r.file_id for r in rows}


def take_file_ids(connection: Connection, count: int) -> list[int]:
    """`count` new file ids: from the column's sequence on PostgreSQL (writers take theirs side by side); on SQLite,
    whose one writer holds the database, after the highest id, the ids an insert would give."""
    if not count:
        return []
    if connection.dialect.name == "postgresql":
        taken = connection.exec_driver_sql(
            "SELECT nextval(pg_get_serial_sequence('files', 'file_id')) FROM generate_series(1, %(count)s)", {"count": count}
        )
        return sorted(taken.scalars())
    # Past the sections' ids too: the sections of a files row deleted by damage keep its id, and a new file under it
    # would take them for its own.
    highest = connection.execute(
        select(func.max(s.files.c.file_id), select(func.max(s.sections.c.file_id)).scalar_subquery())
    ).one()
    top = max((found for found in highest if found is not None), default=0)
    return list(range(top + 1, top + 1 + count))


def insert_sections(
    connection: Connection, data_files: Sequence[DataFile], topic_rows: dict[str, tuple[int, int]], ids: Sequence[int],
    produced: Mapping[tuple[int, int], int] | None = None,
) -> dict[tuple[int, int], summaries.PartitionSummary]:
    """Insert the sections of `data_files`, under the file ids taken for them (`take_file_ids`), invisible to
    readers until `insert_file_rows` inserts the files; per partition, the summary of the sections above L0
    (`summaries.settle` takes it). A file without codecs of its own (a compaction's output) takes its partitions'
    from `produced` (`produced_codecs` of its inputs)."""
    if not data_files:
        return {}
    rows = section_rows(ids, data_files, topic_rows, produced or {})
    appends.insert_sections(connection, rows)
    if not any(data_file.level > 0 for data_file in data_files):
        return {}
    return summaries.of_rows(rows, {i: f.created_ms for i, f in zip(ids, data_files, strict=True)})


def insert_file_rows(
    connection: Connection, data_files: Sequence[DataFile], ids: Sequence[int], topic_rows: dict[str, tuple[int, int]], version: int,
    filtered_version: int | None = None,
) -> None:
    """The rows of `data_files`, under the ids their sections were inserted with, added in `version`, each with its
    sections packed for planners (`columns.pack_sections`, by `topic_rows`' ids); a compaction's outputs with the
    manifest version of its plan (`filtered_version`): they hold no record of a range aborted at or before it."""
    if not data_files:
        return
    compacted = connection.info[COMPACTED]  # set by `topics.rows` for these topics in this transaction
    packs = pack_sections(data_files, {name: row[0] for name, row in topic_rows.items()})
    file_rows = []
    for file_id, data_file, pack in zip(ids, data_files, packs, strict=True):
        kinds = {compacted[topic] for topic in data_file.topics}
        content = CONTENTS.index("mixed") if len(kinds) > 1 else int(kinds == {True})
        file_rows.append({
            "file_id": file_id, "key": data_file.key, "level": data_file.level, "size": data_file.size,
            "created_ms": data_file.created_ms, "record_count": data_file.record_count, "content": content,
            "added_version": version, "filtered_version": filtered_version, "sections_packed": pack,
        })
    connection.execute(insert(s.files), file_rows)


def produced_codecs(connection: Connection, file_ids: Sequence[int]) -> dict[tuple[int, int], int]:
    """Per (topic id, partition) of the files' sections, the Kafka codec most of their records were produced with, by
    record count, where any is known: what their compaction's outputs record (`insert_sections`)."""
    sec = s.sections.c
    tallies: dict[tuple[int, int], dict[int, int]] = {}
    rows = connection.execute(
        select(sec.topic_id, sec.partition, sec.produced_compression, func.sum(sec.record_count))
        .where(one_of(sec.file_id, file_ids, connection.dialect.name), sec.produced_compression != s.UNKNOWN_CODEC)
        .group_by(sec.topic_id, sec.partition, sec.produced_compression)
    )
    for topic_id, partition, codec, records in rows:
        tally = tallies.setdefault((topic_id, partition), {})
        tally[codec] = tally.get(codec, 0) + int(records)
    return {slot: max(sorted(tally), key=tally.__getitem__) for slot, tally in tallies.items()}


def section_rows(
    file_ids: Sequence[int], data_files: Sequence[DataFile], topic_rows: dict[str, tuple[int, int]], produced: Mapping[tuple[int, int], int],
) -> list[tuple]:
    """The sections rows of files, tuples in `schema.SECTION_ROW` order, their crc32 bound to the rows
    (`schema.section_crc_bindings`). Built by columns: a file of 1,000 sections is built inside its commit."""
    sections = [section for data_file in data_files for section in data_file.sections]
    if not sections:
        return []
    info = dict(zip(SectionInfo._fields, zip(*(section.info for section in sections), strict=True), strict=True))
    owners = [file_id for file_id, data_file in zip(file_ids, data_files, strict=True) for _ in data_file.sections]
    levels = [data_file.level for data_file in data_files for _ in data_file.sections]
    topic_ids = [topic_rows[topic][0] for topic in info["topic"]]
    firsts = np.fromiter((section.first_offset for section in sections), np.int64, len(sections))
    lasts = firsts + np.asarray(info["last_delta"], np.int64)
    codecs = [
        codec
        for data_file in data_files
        for codec in (data_file.produced_codecs or [produced.get((topic_rows[sec.topic][0], sec.partition), s.UNKNOWN_CODEC) for sec in data_file.sections])
    ]
    bindings = s.section_crc_bindings(
        topic_ids, info["partition"], info["byte_offset"], info["byte_length"], info["first_row"], firsts, lasts,
        info["record_count"],
    )
    return list(zip(
        owners, topic_ids, info["partition"], info["byte_offset"], info["byte_length"], info["first_row"], firsts.tolist(),
        lasts.tolist(), info["record_count"], info["min_timestamp"], info["max_timestamp"], info["tombstones"],
        info["uncompressed_bytes"], [COMPRESSIONS.index(name) for name in info["compression"]],
        (np.asarray(info["crc32"], np.int64) ^ bindings).tolist(), info["clean_below_delta"],
        [sketch or None for sketch in info["key_sketch"]], repeat(None), levels, codecs, strict=False,  # live (removed_version null)
    ))
