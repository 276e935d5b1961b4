"""Reading the catalog as of one manifest version: each query asks only for what its caller needs.

A file belongs to version V when it was added at or before V and not removed at or before V, so a
snapshot sees exactly the manifest of its version however many commits land meanwhile (gc never deletes
the rows of a version it keeps). Topics, leases and next offsets are read as they are now.

A database that goes away while a snapshot reads is a CatalogUnavailableError (`database.catalog_errors`), and
the sections of a partition handed to a consumer are checked against each other on the way
(`check_partition_sections`), so a damaged row is a CorruptDataError rather than records shown twice. A row's
CRC is read unbound from its locating fields (`schema.section_crc_binding`): a row changed in any of them (swapped
with another partition's, shifted) no longer matches its file's blocks where they are read.
"""

from __future__ import annotations

import bisect
import logging
import struct
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from functools import cache
from typing import NamedTuple

import numpy as np
from sqlalchemy import BigInteger, BindParameter, ColumnElement, CompoundSelect, Connection, Engine, Row, Select, and_, bindparam, cast, func, literal_column, or_, select, union_all
from sqlalchemy.types import LargeBinary, Text

from logcompact.catalog import holes, summaries, topics, transactions
from logcompact.catalog import schema as s
from logcompact.catalog.columns import PACKED_WIDTH, TOPIC_CODE, SectionColumns, ordered_then_by_key, unpack_sections
from logcompact.catalog.database import SHORT_LIST, catalog_errors, driver_rows, one_of
from logcompact.catalog.holes import Range
from logcompact.catalog.input_sections import READ_COLUMNS, InputSections
from logcompact.catalog.model import (
    CONTENTS,
    CatalogSection,
    DataFile,
    FileSummary,
    Lease,
    LevelSection,
    PartitionSection,
    PartitionSummary,
    SectionFigures,
    TopicPartition,
)
from logcompact.catalog.topics import LogOffsets
from logcompact.exceptions import CorruptDataError, TopicNotFoundError
from logcompact.format.layout import COMPRESSIONS, SectionInfo
from logcompact.topics import Topic

log = logging.getLogger(__name__)

# How many partitions' spans one read of aborted ranges asks for.
_RANGES_PER_QUERY = 200


class Snapshot:
    """The catalog as of manifest version `version`."""

    def __init__(
        self, engine: Engine, cluster_id: str, version: int, topics: dict[str, Topic], topic_ids: dict[str, int],
        set_aside: frozenset[TopicPartition] = frozenset(),
    ) -> None:
        self.engine = engine
        self.cluster_id = cluster_id
        self.version = version
        self.topics = topics
        self.topic_ids = topic_ids
        # Partitions held back as uncleanable: what planners read leaves their sections out (consumers see them).
        self.set_aside = set_aside
        self._held: list[int] | None = None  # `_held_files`, once read

    def __repr__(self) -> str:
        return f"Snapshot(cluster {self.cluster_id}, version {self.version})"

    @contextmanager
    def _connect(self) -> Iterator[Connection]:
        """A connection for one read; the database failing meanwhile is CatalogUnavailableError."""
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            yield connection

    def topic(self, name: str) -> Topic:
        try:
            return self.topics[name]
        except KeyError:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist in manifest version {self.version}: create it with `logcompact topic create`"
            ) from None

    # -- files ----------------------------------------------------------------------------------------

    def _live(self) -> ColumnElement[bool]:
        files = s.files.c
        return and_(files.added_version <= self.version, or_(files.removed_version.is_(None), files.removed_version > self.version))

    def _live_section(self) -> ColumnElement[bool]:
        """A section of a live file is live unless a commit retired it alone (its file kept a set-aside section)."""
        sections = s.sections.c
        return and_(self._live(), or_(sections.removed_version.is_(None), sections.removed_version > self.version))

    def _set_aside_section(self) -> ColumnElement[bool]:
        sections = s.sections.c
        return or_(*(and_(sections.topic_id == self.topic_ids[t], sections.partition == p) for t, p in sorted(self.set_aside)))

    def _planned_section(self) -> ColumnElement[bool]:
        """A live section planners may take: not of a set-aside partition."""
        if not self.set_aside:
            return self._live_section()
        return and_(self._live_section(), ~self._set_aside_section())

    def _held_files(self, connection: Connection) -> list[int]:
        """Live files holding a section of a set-aside partition, live or retired (a damaged row hiding its records),
        and no live section of another: planners leave them out whole. Read once per snapshot (a scan of the
        sections of those partitions; the version and the partitions set aside are fixed)."""
        if not self.set_aside:
            return []
        if self._held is None:
            self._held = self._read_held_files(connection)
        return self._held

    def _read_held_files(self, connection: Connection) -> list[int]:
        sections = s.sections.c
        holding = select(sections.file_id).join(s.files, s.files.c.file_id == sections.file_id).where(self._live(), self._set_aside_section())
        candidates = set(connection.execute(holding).scalars())
        if not candidates:
            return []
        planned = connection.execute(
            select(sections.file_id).distinct().join(s.files, s.files.c.file_id == sections.file_id)
            .where(self._planned_section(), one_of(sections.file_id, candidates, self.engine.dialect.name))
        ).scalars()
        return sorted(candidates - set(planned))

    def file_summaries(self, *levels: int) -> list[FileSummary]:
        """Every live file (of `levels`, of every level without any) without its sections, ordered by level, creation
        time and key; not those planners leave out whole (`_held_files`)."""
        files = s.files.c
        query = select(files.key, files.level, files.size, files.created_ms, files.record_count, files.content).where(self._live())
        if levels:
            query = query.where(files.level.in_(sorted(levels)))
        with self._connect() as connection:
            held = self._held_files(connection)
            if held:
                query = query.where(~one_of(files.file_id, held, self.engine.dialect.name))
            rows = connection.execute(query.order_by(files.level, files.created_ms, files.key)).all()
        return [FileSummary(r[0], r[1], r[2], r[3], r[4], CONTENTS[r[5]]) for r in rows]

    def file_summaries_of(self, keys: Sequence[str]) -> list[FileSummary]:
        """The live files among `keys`, without their sections."""
        files = s.files.c
        query = select(files.key, files.level, files.size, files.created_ms, files.record_count, files.content).where(
            self._live(), self._key_in(keys)
        )
        with self._connect() as connection:
            return [FileSummary(r[0], r[1], r[2], r[3], r[4], CONTENTS[r[5]]) for r in connection.execute(query).all()]

    def files(self, level: int | None = None, topics: Iterable[str] | None = None) -> list[DataFile]:
        """Every live file (of a level, holding any of `topics`) with its sections, ordered as file_summaries."""
        conditions = [self._live()]
        if level is not None:
            conditions.append(s.files.c.level == level)
        if topics is not None:
            ids = [self.topic_ids[name] for name in topics]
            holding = select(s.sections.c.file_id).where(s.sections.c.topic_id.in_(ids), s.sections.c.removed_version.is_(None))
            conditions.append(s.files.c.file_id.in_(union_all(*s.by_partition(holding, self.version))))
        with self._connect() as connection:
            held = self._held_files(connection)
            if held:
                conditions.append(~one_of(s.files.c.file_id, held, self.engine.dialect.name))
            loaded = self._load(connection, conditions)
        return sorted(loaded, key=lambda f: (f.level, f.created_ms, f.key))

    def get_files(self, keys: Sequence[str]) -> dict[str, DataFile]:
        """The live files among `keys`, with their live sections (but those of set-aside partitions), by key. When
        the keys are most of the live files (a pass planning every file), every live file is read and the others
        dropped: a list of 100,000 keys costs the database more to match (0.9 s on SQLite) than the few files left."""
        with self._connect() as connection:
            live = select(func.count()).select_from(s.files).where(self._live())
            if len(keys) > SHORT_LIST and len(keys) >= MOST_FILES * connection.execute(live).scalar_one():
                wanted = set(keys)
                return {f.key: f for f in self._load(connection, [self._live()]) if f.key in wanted}
            loaded = self._load(connection, [self._live(), self._key_in(keys)])
        return {f.key: f for f in loaded}

    def section_columns(self, keys: Sequence[str] | None = None, topics: Iterable[str] | None = None, timestamps: bool = True) -> SectionColumns:
        """The live files among `keys` (every live file without them, those holding any of `topics` with them), but
        those planners leave out whole (`_held_files`), in `file_summaries`' order, with the facts of their planned
        sections a planning pass weighs, as columns (`SectionColumns`), no section object built: a row a file, its
        sections packed in one value (`files.sections_packed`), less the sections retired alone (`sections_retired`) and
        those of partitions set aside, as long as the sections rows vouch for the packs (`_vouched_for`: 300,000 files'
        1.2 million sections in 1.6 s on SQLite, where aggregating the rows' columns into text took 2.1 s); the sections
        rows of files without a pack, or of every file when the rows do not vouch for the packs, aggregated into one text
        a column (`_decimals`) that numpy parses. The sections' newest timestamps only with
        `timestamps`. When the keys are most of the live files, every live file is read, as by `get_files`."""
        files, sec = s.files.c, s.sections.c
        conditions = [self._live()]
        if topics is not None:
            ids = [self.topic_ids[name] for name in topics]
            holding = select(sec.file_id).where(sec.topic_id.in_(ids), or_(sec.removed_version.is_(None), sec.removed_version > self.version))
            conditions.append(files.file_id.in_(union_all(*s.by_partition(holding, self.version))))
        with self._connect() as connection:
            held = self._held_files(connection)
            if held:
                conditions.append(~one_of(files.file_id, held, self.engine.dialect.name))
            if keys is not None:
                live = select(func.count()).select_from(s.files).where(self._live())
                if len(keys) <= SHORT_LIST or len(keys) < MOST_FILES * connection.execute(live).scalar_one():
                    conditions.append(self._key_in(keys))
            every = len(conditions) == 1 + bool(held)
            dialect = self.engine.dialect.name
            listed = select(files.file_id, files.key, files.level, files.size, files.created_ms, files.content, files.sections_packed).where(*conditions)
            if dialect == "postgresql":  # its collation may order keys as Python does not: the database orders them
                listed = listed.order_by(files.level, files.created_ms, files.key)
            rows = driver_rows(connection.execute(listed))
            unpacked = [row[0] for row in rows if row[6] is None]
            # The packs as read: one stored since (a one-step append's, by the next append) is not vouched for.
            packed_conditions = [*conditions, ~one_of(files.file_id, unpacked, dialect)] if unpacked else conditions
            section_values = self._trusted_packs(connection, packed_conditions, [(row[0], row[6]) for row in rows if row[6] is not None])
            if section_values is None:  # every file's sections from its rows, the catalog's record
                unpacked, section_values = [row[0] for row in rows], [np.zeros(0, np.int64) for _ in range(PACKED_WIDTH + 1)]
            if unpacked:
                wanted = [sec.file_id, cast(sec.topic_id, BigInteger) * TOPIC_CODE + sec.partition, sec.first_offset, sec.last_offset,
                          sec.uncompressed_bytes, sec.max_timestamp]
                among = [one_of(files.file_id, unpacked, dialect)] if len(unpacked) < len(rows) else []
                count, *texts = connection.execute(
                    select(func.count(), *(_decimals(column, dialect) for column in wanted))
                    .select_from(s.sections.join(s.files, files.file_id == sec.file_id))
                    .where(*among, *conditions, self._planned_section())
                ).one()
                section_values = [np.concatenate(pair) for pair in zip(section_values, _integer_columns(wanted, count, texts), strict=True)]
        by_column = list(zip(*rows, strict=True)) or [()] * 7
        file_ids, levels, sizes, created, contents = (_file_integers(by_column[n], name) for n, name in _FILE_NUMBERS)
        keys_read = list(by_column[1])
        if dialect != "postgresql":
            order = ordered_then_by_key(keys_read, levels, created)  # as file_summaries orders them
            file_ids, levels, sizes, created, contents = (column[order] for column in (file_ids, levels, sizes, created, contents))
            keys_read = [keys_read[n] for n in order.tolist()]
        if not timestamps:
            section_values = section_values[:-1]
        return SectionColumns.from_arrays(file_ids, keys_read, levels, sizes, created, contents, section_values, self.topic_ids, every)

    def _trusted_packs(self, connection: Connection, conditions: list[ColumnElement[bool]], packed: list[tuple[int, bytes]]) -> list[np.ndarray] | None:
        """The sections of the files packed (`_packed_sections`), or None, said in the log, where a pack is damaged or
        the sections rows do not vouch for the packs (`_vouched_for`): a pack only stands in for its file's rows, so a
        pass then plans from the rows, as before packs, and finds there what is damaged."""
        try:
            section_values = self._packed_sections(connection, packed)
        except CorruptDataError as damage:
            log.warning("planning from the catalog's sections rows: %s", damage)
            return None
        if packed and not self._vouched_for(connection, conditions, section_values):
            log.warning(
                "the catalog's sections rows of live files disagree with the sections packed in their files rows "
                "(files.sections_packed): one or the other was changed; planning from the rows; restore the catalog "
                "database from a backup"
            )
            return None
        return section_values

    def _vouched_for(self, connection: Connection, conditions: list[ColumnElement[bool]], section_values: list[np.ndarray]) -> bool:
        """Whether the sections rows of the packed files `conditions` select, as planners take them, are the
        sections their packs gave (`section_values`): as many, and the same sum of a hash of what places each one's
        records (`_section_hashes` of its file, topic, partition and offsets), the database hashing its rows as numpy
        hashes the packs. The rows are the catalog's record; a pack only stands in for them, so rows changed since
        (damage, an edit by hand) are planned from as they are, as before packs. A section's bytes and newest timestamp,
        which only weigh it, are not vouched for."""
        files, sec = s.files.c, s.sections.c
        hashed = _section_hashes([sec.file_id, sec.topic_id, sec.partition, sec.first_offset, sec.last_offset])
        count, total = connection.execute(
            select(func.count(), func.sum(hashed)).select_from(s.sections.join(s.files, files.file_id == sec.file_id))
            .where(*conditions, self._planned_section())
        ).one()
        owners, codes, firsts, lasts = section_values[:4]
        packed = _section_hashes([owners, codes // TOPIC_CODE, codes % TOPIC_CODE, firsts, lasts])
        return count == len(owners) and int(total or 0) == int(packed.sum())

    def _packed_sections(self, connection: Connection, packed: list[tuple[int, bytes]]) -> list[np.ndarray]:
        """The packed sections of (file id, `files.sections_packed`) pairs as `unpack_sections` gives them, less the
        sections planners do not take: those retired alone by this snapshot's version, and those of partitions set
        aside."""
        values = unpack_sections([file_id for file_id, _ in packed], [pack for _, pack in packed])
        owners, codes = values[0], values[1]
        dropped = np.zeros(len(owners), bool)
        if self.set_aside:
            aside = [self.topic_ids[topic] * TOPIC_CODE + partition for topic, partition in self.set_aside if topic in self.topic_ids]
            dropped |= np.isin(codes, aside)
        sec = s.sections.c
        retired = connection.execute(  # of live files: those of removed files (a deleted topic's) may be many
            select(sec.file_id, sec.topic_id, sec.partition).join(s.files, s.files.c.file_id == sec.file_id)
            .where(sec.removed_version.is_not(None), sec.removed_version <= self.version, self._live())
        ).all()
        if retired:
            retired_pairs = {(file_id, topic_id * TOPIC_CODE + partition) for file_id, topic_id, partition in retired}
            holding = np.flatnonzero(np.isin(owners, [file_id for file_id, _ in retired_pairs]))
            dropped[holding] |= np.fromiter(
                (pair in retired_pairs for pair in zip(owners[holding].tolist(), codes[holding].tolist())), np.bool_, len(holding)
            )
        return [column[~dropped] for column in values] if dropped.any() else values

    def input_sections(self, keys: Sequence[str]) -> InputSections:
        """The live files among `keys`, in their order, with their planned sections as columns (`InputSections`: every
        field a stored plan keeps): the files rows, then the sections' columns each aggregated into one text
        (`_decimals`) that numpy parses and their key sketches into one value, no row fetched a section. 300,000
        sections on PostgreSQL took 0.9 s as rows, 0.7 s of it this process's CPU (the driver's rows and their
        conversion), and take 0.5 s aggregated, 0.15 s of it here; on SQLite 1.15 s as rows, 0.9 s aggregated. When
        the keys are most of the live files, every live file is read, as by `get_files`."""
        files, sec = s.files.c, s.sections.c
        conditions = [self._live()]
        dialect = self.engine.dialect.name
        integers = [sec[name] for name in READ_COLUMNS[:-1]]
        sketch_bytes = func.coalesce(func.length(cast(sec.key_sketch, LargeBinary)), 0)
        with self._connect() as connection:
            live = select(func.count()).select_from(s.files).where(self._live())
            if len(keys) <= SHORT_LIST or len(keys) < MOST_FILES * connection.execute(live).scalar_one():
                conditions.append(self._key_in(keys))
            file_rows = driver_rows(connection.execute(select(files.file_id, files.key, files.level).where(*conditions)))
            # The aggregates of one row step through the same sections in the same order. On PostgreSQL a row aggregates
            # a run of file ids, so that no value nears its limit of 1 GB however many sections are read; SQLite's
            # grouping sorts the rows first (0.3 s more for 400,000 sections), and one value of its 1e9 bytes holds 3.9
            # million sections' longest sketches in hexadecimal.
            runs = [sec.file_id // literal_column(str(FILE_IDS_AGGREGATED))] if dialect == "postgresql" else []
            groups = driver_rows(connection.execute(
                select(func.count(), *(_decimals(column, dialect) for column in [*integers, sketch_bytes]), _sketches(sec.key_sketch, dialect))
                .select_from(s.sections.join(s.files, files.file_id == sec.file_id))
                .where(*conditions, self._planned_section()).group_by(*runs)
            ))
        if len(conditions) == 1:  # every live file read: those not among the keys dropped (and their sections with them)
            wanted = set(keys)
            file_rows = [row for row in file_rows if row[1] in wanted]
        count = sum(group[0] for group in groups)
        texts = [",".join(group[n] or "" for group in groups) for n in range(1, len(integers) + 2)]  # None: no sections
        *values, lengths = _integer_columns([*integers, sec.key_sketch], count, texts)
        if dialect == "postgresql":
            sketches = b"".join(group[-1] for group in groups)
        else:
            sketches = bytes.fromhex("".join(group[-1] or "" for group in groups))
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        return InputSections.from_columns(keys, file_rows, dict(zip(READ_COLUMNS, values)), lengths, sketches, names)

    def section_rows(self, keys: Sequence[str]) -> dict[str, list[tuple]]:
        """By key, the planned sections of the live files among `keys` as the catalog records them, as plain rows
        of the sections columns from topic_id to clean_below_delta in `schema.SECTION_ROW` order (no key sketch;
        crc32 unbound, as `SectionInfo.crc32` holds it), in file order: what a plan's inputs are checked against,
        400,000 sections at a time, without building a section object."""
        sec, files = s.sections.c, s.files.c
        columns = [c for c in s.SECTION_ROW_COLUMNS if c.name not in ("file_id", "key_sketch", "removed_version", "produced_compression")]
        query = (
            select(files.key, *columns).join(s.files, files.file_id == sec.file_id)
            .where(self._live(), self._key_in(keys), self._planned_section())
            .order_by(sec.file_id, sec.byte_offset, sec.first_row)
        )
        found: dict[str, list[tuple]] = {key: [] for key in keys}
        with self._connect() as connection:
            for row in connection.execute(query).all():
                found[row[0]].append(_unbound_row(row[1:]))
        return found

    def _load(self, connection: Connection, conditions: list[ColumnElement[bool]]) -> list[DataFile]:
        """The files meeting `conditions` with their sections. A planner loads hundreds of thousands of sections
        here: two queries in file order, rows fetched whole and read by position."""
        files, sec = s.files.c, s.sections.c
        file_rows = connection.execute(
            select(files.file_id, files.key, files.level, files.size, files.created_ms).where(*conditions).order_by(files.file_id)
        ).all()
        section_rows = connection.execute(
            select(*_LOADED_COLUMNS).join(s.files, files.file_id == sec.file_id).where(*conditions, self._planned_section())
            .order_by(sec.file_id, sec.byte_offset, sec.first_row)
        ).all()
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        loaded, position, count = [], 0, len(section_rows)
        for file_id, key, level, size, created_ms in file_rows:
            placed = []
            while position < count and section_rows[position][0] == file_id:
                placed.append(_section(section_rows[position], names))
                position += 1
            loaded.append(DataFile(key, level, size, created_ms, tuple(placed)))
        return loaded

    # -- partitions -------------------------------------------------------------------------------------

    def sections_of(
        self, topic: str, partition: int, from_offset: int = 0, to_offset: int | None = None
    ) -> list[tuple[str, CatalogSection]]:
        """(file key, section) of each live section of a partition holding offsets in [from_offset, to_offset),
        in first-offset order, checked: every page of `sections_from`."""
        return list(self.sections_from(topic, partition, from_offset, to_offset))

    def sections_from(
        self, topic: str, partition: int, from_offset: int = 0, to_offset: int | None = None
    ) -> PartitionSections:
        """The live sections of a partition holding offsets in [from_offset, to_offset), read a page at a time as
        they are iterated (`PartitionSections`): the first costs one indexed query of FIRST_PAGE_SECTIONS rows,
        however many sections the partition holds."""
        return self.sections_of_partitions(topic, {partition: (from_offset, to_offset)})[partition]

    def sections_of_partitions(
        self, topic: str, ranges: Mapping[int, tuple[int, int | None]]
    ) -> dict[int, PartitionSections]:
        """`sections_from` for several partitions of a topic, each with its (from_offset, to_offset): their first
        pages in one query of one indexed part per partition (up to PARTITIONS_PER_QUERY of them), so a Fetch's
        partitions cost one round trip; the pages after are read as each partition's reader gets to them."""
        topic_id = self.topic_ids[self.topic(topic).name]
        found = {
            partition: PartitionSections(self, topic, topic_id, partition, from_offset, to_offset)
            for partition, (from_offset, to_offset) in ranges.items()
        }
        asked = [reader for reader in found.values() if not reader.done]
        for first in range(0, len(asked), PARTITIONS_PER_QUERY):
            chunk = asked[first : first + PARTITIONS_PER_QUERY]
            pages: dict[int, list[Row]] = {reader.partition: [] for reader in chunk}
            for row in self._page_rows(topic_id, [reader.next_page() for reader in chunk]):
                pages[row.partition].append(row)
            for reader in chunk:
                reader.take_page(pages[reader.partition])
        return found

    def log_offsets(self, topic: str) -> list[LogOffsets]:
        """Each partition's log start offset, high watermark and last stable offset, as they are now (as next offsets)."""
        with self._connect() as connection:
            return topics.offsets(connection, self.topic(topic).name)

    def _page_rows(self, topic_id: int, pages: Sequence[_Page]) -> list[Row]:
        """The rows of `pages` (of partitions of one topic), each its partition's live sections ending in [low, high]
        and starting at or before first_at_most, at most `limit` of them by last offset, in one query."""
        parameters: dict[str, int] = {"topic_id": topic_id, "version": self.version}
        for i, page in enumerate(pages):
            parameters.update({f"{name}_{i}": value for name, value in page._asdict().items()})
        with self._connect() as connection:
            return list(connection.execute(_pages_query(len(pages)), parameters))

    def may_span(self, topic_id: int, partition: int, offset: int, first_at_most: int) -> bool:
        """Whether a section of the partition, live or retired, ends past `offset` and starts at or before
        `first_at_most`: a cheap first answer to a page with holes (`PartitionSections.take_page`), from the
        index alone above L0 (`sections_by_partition` holds the first offset) and the live L0 files' rows. No means
        no live one does; yes is asked again of the live ones."""
        sec = s.sections.c
        query: Select = (
            select(literal_column("1"))
            .where(sec.topic_id == topic_id, sec.partition == partition, sec.last_offset > offset, sec.first_offset <= first_at_most)
            .limit(1)
        )
        with self._connect() as connection:
            return any(connection.execute(part).first() is not None for part in s.by_partition(query, self.version))

    def offset_holes(self, topic_id: int, partition: int, low: int, high: int) -> list[Range]:
        """The offsets from `low` to `high` of the partition that no record holds, rightly (`offset_holes`, as of the
        snapshot's version: compactions dropped them, or transactions' markers took them), coalesced."""
        with self._connect() as connection:
            return holes.of_partition(connection, (topic_id, partition), low, high, self.version)

    def without_holes(self, unheld: Mapping[TopicPartition, Sequence[Range]]) -> dict[TopicPartition, list[Range]]:
        """Per partition of `unheld` (ranges of offsets in order), those of its offsets no hole holds (`offset_holes`,
        as of the snapshot's version), the partitions left with none left out. One query per topic."""
        slots = {(self.topic_ids[tp[0]], tp[1]): tp for tp in unheld if unheld[tp]}
        if not slots:
            return {}
        wanted = {slot: (unheld[tp][0][0], unheld[tp][-1][1]) for slot, tp in slots.items()}
        with self._connect() as connection:
            dropped = holes.of_partitions(connection, wanted, self.version)
        left = {slots[slot]: holes.without(unheld[slots[slot]], dropped.get(slot, [])) for slot in wanted}
        return {tp: rest for tp, rest in left.items() if rest}

    def unexplained_gaps(self, unheld: Mapping[TopicPartition, Sequence[Range]], input_keys: Sequence[str]) -> dict[TopicPartition, Range]:
        """Per partition of `unheld` (offsets a plan's inputs leave unheld between their sections, in order), the
        first range of them that neither compactions dropped (`offset_holes`) nor a live section outside the
        files `input_keys` holds: a damaged row's gap. One query of the holes per topic; the outside sections are read
        only for the partitions the holes leave offsets of."""
        left = self.without_holes(unheld)
        with self._connect() as connection:
            sec, files = s.sections.c, s.files.c
            for (topic, partition), rest in sorted(left.items()):
                outside = (
                    select(sec.first_offset, sec.last_offset).join(s.files, files.file_id == sec.file_id)
                    .where(sec.topic_id == self.topic_ids[topic], sec.partition == partition, sec.last_offset >= rest[0][0],
                           sec.first_offset <= rest[-1][1], self._live_section(), ~self._key_in(input_keys))
                )
                spans = [tuple(span) for part in s.by_partition(outside, self.version) for span in connection.execute(part)]
                left[(topic, partition)] = holes.without(rest, holes.coalesced(spans))
        return {tp: rest[0] for tp, rest in left.items() if rest}

    def partition_sections(self, topics: Iterable[str], in_l0: bool) -> list[PartitionSection]:
        """The max-lag pass's few facts of every live section of `topics` in L0 (`in_l0`) or above it, but the
        set-aside partitions'."""
        ids = {self.topic_ids[name]: name for name in topics}
        sec, files = s.sections.c, s.files.c
        query = (
            select(files.key, files.level, sec.topic_id, sec.partition, sec.first_offset, sec.last_offset,
                   sec.clean_below_delta, sec.min_timestamp)
            .join(s.files, files.file_id == sec.file_id)
            .where(self._planned_section())
        )
        picking = sec.topic_id.in_(list(ids))
        with self._connect() as connection:
            if in_l0:
                part = s.by_partition(query.where(picking), self.version)[1]
            else:
                part = self._above_l0(connection, query, self._slots_of_topics(ids), picking)
            return [
                PartitionSection(key, level, ids[topic_id], partition, first, last - first, clean, min_ts)
                for key, level, topic_id, partition, first, last, clean, min_ts in connection.execute(part).all() if topic_id in ids
            ]

    def files_holding(self, partitions: Iterable[TopicPartition]) -> set[str]:
        """The keys of the live files holding a section of any of `partitions` (set-aside ones left out): above L0
        through the partition index, and the live L0 files."""
        wanted = {(self.topic_ids[topic], partition) for topic, partition in partitions}
        if not wanted:
            return set()
        sec, files = s.sections.c, s.files.c
        query = select(files.key, sec.topic_id, sec.partition).join(s.files, files.file_id == sec.file_id).where(self._planned_section())
        picking = _picking(wanted)
        with self._connect() as connection:
            parts = (self._above_l0(connection, query, wanted, *picking), s.by_partition(query.where(*picking), self.version)[1])
            return {key for part in parts for key, topic_id, partition in connection.execute(part).all() if (topic_id, partition) in wanted}

    def sections_at_levels(self, partitions: Iterable[TopicPartition], from_level: int) -> list[LevelSection]:
        """The live sections of `partitions` at `from_level` (above L0) and up, set-aside partitions left out, in
        first-offset order per partition: through the partition index, one query."""
        wanted = {(self.topic_ids[topic], partition) for topic, partition in partitions}
        if not wanted:
            return []
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        sec, files = s.sections.c, s.files.c
        query = (
            select(files.key, sec.topic_id, sec.partition, sec.first_offset, sec.last_offset, sec.uncompressed_bytes,
                   sec.clean_below_delta, sec.max_timestamp)
            .join(s.files, files.file_id == sec.file_id)
            .where(sec.level >= max(from_level, 1), self._planned_section())
            .order_by(sec.topic_id, sec.partition, sec.first_offset)
        )
        with self._connect() as connection:
            upper = self._above_l0(connection, query, wanted, *_picking(wanted))
            return [
                LevelSection(key, names[topic_id], partition, first, last, size, clean > last - first, newest)
                for key, topic_id, partition, first, last, size, clean, newest in connection.execute(upper).all()
                if (topic_id, partition) in wanted
            ]

    def section_figures(self, topics: Iterable[str], in_l0: bool) -> list[SectionFigures]:
        """Every live section of `topics` in L0 (`in_l0`) or above it (set-aside partitions included), for `logcompact
        status`."""
        ids = {self.topic_ids[name]: name for name in topics}
        sec, files = s.sections.c, s.files.c
        query = (
            select(files.key, files.level, sec.topic_id, sec.partition, sec.first_offset, sec.last_offset, sec.clean_below_delta,
                   sec.min_timestamp, sec.record_count, sec.uncompressed_bytes, sec.key_sketch, files.created_ms)
            .join(s.files, files.file_id == sec.file_id)
            .where(self._live_section())
        )
        picking = sec.topic_id.in_(sorted(ids))
        with self._connect() as connection:
            if in_l0:
                part = s.by_partition(query.where(picking), self.version)[1]
            else:
                part = self._above_l0(connection, query, self._slots_of_topics(ids), picking)
            return [
                SectionFigures(PartitionSection(key, level, ids[topic_id], partition, first, last - first, clean, min_ts), records, size, keys, created)
                for key, level, topic_id, partition, first, last, clean, min_ts, records, size, keys, created
                in connection.execute(part).all() if topic_id in ids
            ]

    def level_figures(self) -> dict[int, tuple[int, int, int]]:
        """Per level: its live files, their bytes in the store and the newest one's creation time, in one grouped query."""
        files = s.files.c
        query = select(files.level, func.count(), func.sum(files.size), func.max(files.created_ms)).where(self._live()).group_by(files.level)
        with self._connect() as connection:
            return {level: (count, int(size), newest) for level, count, size, newest in connection.execute(query)}

    def outside_floors(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """For each of `partitions`, the smallest first offset of a live section in a file outside `input_keys`
        (partitions with none are left out). The database takes the minimums over those partitions' sections,
        found through their index by topic and partition number (the pairs asked for are picked out here: a
        list of pairs would be compared row by row)."""
        return self._outside_floors(input_keys, partitions, l0_only=False)

    def outside_floors_in_l0(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """`outside_floors` over the live L0 files only: with `floors_above_l0`, what a plan's floors are."""
        return self._outside_floors(input_keys, partitions, l0_only=True)

    def _outside_floors(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition], l0_only: bool) -> dict[TopicPartition, int]:
        wanted = {(self.topic_ids[topic], partition) for topic, partition in partitions}
        if not wanted:
            return {}
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        sec, files = s.sections.c, s.files.c
        query = (
            select(sec.topic_id, sec.partition, func.min(sec.first_offset))
            .join(s.files, files.file_id == sec.file_id)
            .where(self._live_section(), ~self._key_in(input_keys))
            .group_by(sec.topic_id, sec.partition)
        )
        picking = _picking(wanted)
        in_l0 = s.by_partition(query.where(*picking), self.version)[1]
        floors: dict[TopicPartition, int] = {}
        with self._connect() as connection:
            for part in (in_l0,) if l0_only else (self._above_l0(connection, query, wanted, *picking), in_l0):
                for topic_id, partition, first in connection.execute(part).all():
                    if (topic_id, partition) in wanted:
                        tp = (names[topic_id], partition)
                        floors[tp] = min(first, floors.get(tp, first))
        return floors

    def floors_above_l0(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        """Per partition of `partitions`, the lowest first offset of its live sections above L0 (None: it has none), as
        the catalog keeps it (`summaries`): one read of a row per partition. A partition whose row a commit after
        this snapshot's version set is left out: the caller reads its sections."""
        return {tp: None if summary is None else summary.floor for tp, summary in self.summaries_above_l0(partitions).items()}

    def summaries_above_l0(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, PartitionSummary | None]:
        """Per partition of `partitions`, its live sections above L0 summed up (None: it has none), as the catalog
        keeps them (`summaries`), leaving out the partitions whose row a commit after this snapshot's version set."""
        wanted = {(self.topic_ids[topic], partition): (topic, partition) for topic, partition in partitions}
        found: dict[TopicPartition, PartitionSummary | None] = dict.fromkeys(wanted.values())  # no row: it never held one
        with self._connect() as connection:
            for slot, (summary, version) in summaries.read_versioned(connection, wanted).items():
                if version > self.version:
                    del found[wanted[slot]]
                else:
                    found[wanted[slot]] = summary
        return found

    def never_compacted(self, topics: Iterable[str]) -> dict[TopicPartition, int]:
        """The log start offset of each partition of `topics` that never held a section above L0 (no
        `partition_summaries` row): never compacted, its live sections hold every offset from its log start on but
        its transactions' markers (`offset_holes`), and all are at L0. One query; none in a cluster whose every
        partition was compacted once."""
        ids = {self.topic_ids[name]: name for name in topics}
        if not ids:
            return {}
        part, kept = s.partitions.c, s.partition_summaries.c
        summarized = select(kept.topic_id).where(kept.topic_id == part.topic_id, kept.partition == part.partition).exists()
        query = select(part.topic_id, part.partition, part.log_start_offset).where(part.topic_id.in_(sorted(ids)), ~summarized)
        with self._connect() as connection:
            return {(ids[topic_id], partition): start for topic_id, partition, start in connection.execute(query)}

    def files_hiding(self, topic: str, partition: int, low: int, high: int) -> dict[str, set[TopicPartition]]:
        """Live files holding a section of the partition retired alone over offsets `low` to `high` (a damaged row
        hiding their records: a commit removing the file would lose them), each with the partitions of its live
        sections."""
        sec, files = s.sections.c, s.files.c
        retired = (
            select(sec.file_id).join(s.files, files.file_id == sec.file_id)
            .where(self._live(), sec.topic_id == self.topic_ids[topic], sec.partition == partition, sec.removed_version <= self.version,
                   sec.first_offset <= high, sec.last_offset >= low)
        )
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        with self._connect() as connection:
            found: dict[str, set[TopicPartition]] = {key: set() for key in connection.execute(select(files.key).where(files.file_id.in_(retired))).scalars()}
            if found:
                live = select(files.key, sec.topic_id, sec.partition).join(s.files, files.file_id == sec.file_id)
                for key, topic_id, held in connection.execute(live.where(self._live_section(), files.key.in_(sorted(found)))):
                    found[key].add((names[topic_id], held))
        return found

    def retired_apart(self, taken: Mapping[str, int]) -> list[tuple[str, TopicPartition, CatalogSection, str]]:
        """(file key, partition, section, why in one line) of each section of the live files `taken` (a plan's inputs,
        each with the records of the sections it takes: `InputSections.records_by_file`) that was retired alone at a
        version no commit retiring sections made (`schema.removal_recorded`): a damaged row hiding records, which
        compacting the file would drop, and gc then collect with it. Only the files whose row counts more records than
        their sections taken are read (a retired section's are not taken): one read of the files rows, none of the
        sections, in a cluster without retired sections."""
        sec, files = s.sections.c, s.files.c
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        with self._connect() as connection:
            counted = connection.execute(select(files.key, files.record_count).where(self._live(), self._key_in(list(taken))))
            short = [key for key, records in counted if records > taken[key]]
            if not short:
                return []
            rows = connection.execute(
                select(*_LOADED_COLUMNS, sec.removed_version, files.key).join(s.files, files.file_id == sec.file_id)
                .where(self._live(), self._key_in(short), sec.removed_version <= self.version, ~s.removal_recorded(sec.removed_version))
                .order_by(sec.file_id, sec.topic_id, sec.partition)
            ).all()
        found = []
        for row in rows:
            if row.topic_id in names:  # (a row moved to a topic id no topic has is named where that topic's rows are read)
                section = _section(row, names)
                tp = (section.topic, section.partition)
                found.append((row.key, tp, section, str(_retired_apart(*tp, row.key, section, row.removed_version))))
        return found

    def stable_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """The last stable offset (LSO) of each of `partitions` holding an open transaction's data, as it is now (it
        is not versioned; it never decreases): the first offset of its earliest open transaction's data, never below
        its log start. Partitions without such data (their LSO is their high watermark) are left out. One query over
        the open transactions' partitions that hold data, few however many partitions the cluster has."""
        wanted = set(partitions)
        if not wanted:
            return {}
        tp, part = s.transaction_partitions.c, s.partitions.c
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        query = (
            select(tp.topic_id, tp.partition, func.max(part.log_start_offset), func.min(tp.first_offset))
            .join(s.partitions, and_(part.topic_id == tp.topic_id, part.partition == tp.partition))
            .where(tp.first_offset.is_not(None)).group_by(tp.topic_id, tp.partition)
        )
        with self._connect() as connection:
            rows = connection.execute(query).all()
        found = {}
        for topic_id, partition, log_start, first in rows:
            name = names.get(topic_id)
            if name is not None and (name, partition) in wanted:
                found[(name, partition)] = max(log_start, first)
        return found

    def stability(self, topics: Iterable[str]) -> dict[TopicPartition, transactions.PartitionStability]:
        """Each partition of `topics`: its high watermark, last stable offset and open transactions, as they are now
        (not versioned), in one query (`transactions.stability`)."""
        ids = {self.topic_ids[name]: name for name in topics}
        with self._connect() as connection:
            found = transactions.stability(connection, ids)
        return {(ids[topic_id], partition): stable for (topic_id, partition), stable in found.items()}

    def aborted_ranges(
        self, spans: Mapping[TopicPartition, tuple[int, int]], version: int | None = None
    ) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
        """The aborted transactions' ranges (first, last offset) overlapping each partition's offsets [a, b), in offset
        order, as recorded now, not only at or before this version (or those recorded at or before `version`). A
        range is recorded with the end of its transaction and never changes, so those recorded since are as true of
        this version's records; and read after an LSO (a reader's, or the one a plan is bounded by:
        `first_uncleanable_offsets`), they hold every range below it, however old the snapshot: a transaction with
        data there had ended, its ranges recorded as it ended (gc forgets a range only with the last file that may
        hold its records)."""
        slots = sorted(((self.topic_ids[topic], partition), span) for (topic, partition), span in spans.items())
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        found: dict[TopicPartition, tuple[tuple[int, int], ...]] = {}
        a = s.aborted_ranges.c
        with self._connect() as connection:
            # Most topics have none: one look through the index says so, before statements of many partitions.
            if not slots or connection.execute(select(a.topic_id).where(a.topic_id.in_(sorted({slot[0] for slot, _ in slots}))).limit(1)).first() is None:
                return found
            # A few hundred partitions a statement: SQLite bounds an expression's depth, and each is one OR's term.
            for start in range(0, len(slots), _RANGES_PER_QUERY):
                chunk = dict(slots[start : start + _RANGES_PER_QUERY])
                for (topic_id, partition), ranges in transactions.aborted_overlapping(connection, chunk, version).items():
                    found[(names[topic_id], partition)] = tuple(ranges)
        return found

    def first_uncleanable_offsets(
        self, partitions: Iterable[TopicPartition], now_ms: int, excluding: Sequence[str] = ()
    ) -> dict[TopicPartition, int]:
        """Kafka's first uncleanable offset of each of `partitions` of a compacted topic, as the catalog can tell it:
        the lower of its LSO now (`stable_offsets`: nothing of an open transaction is cleaned; the LSO never
        decreases, so the bound a plan was made with still holds at its commit) and, where the topic sets
        min.compaction.lag.ms, the first offset of the first live section (Kafka: segment) holding a record newer
        than now minus the lag, in any file but those `excluding` (a plan's inputs, whose first such record the
        engine finds); partitions with neither are left out. One grouped query per such topic, through the index by
        topic and partition, and one for the LSOs."""
        partitions = list(partitions)
        stable = self.stable_offsets(tp for tp in partitions if self.topics[tp[0]].config.compacted)
        found = self._first_young_offsets(partitions, now_ms, excluding)
        for tp, offset in stable.items():
            found[tp] = min(offset, found.get(tp, offset))
        return found

    def _first_young_offsets(self, partitions: Iterable[TopicPartition], now_ms: int, excluding: Sequence[str]) -> dict[TopicPartition, int]:
        """The min lag's part of `first_uncleanable_offsets`."""
        by_topic: dict[str, set[int]] = {}
        for topic, partition in partitions:
            if self.topics[topic].config.min_compaction_lag_ms > 0:
                by_topic.setdefault(topic, set()).add(partition)
        if not by_topic:
            return {}
        sec, files = s.sections.c, s.files.c
        outside = [~self._key_in(excluding)] if excluding else []
        cuts = {self.topic_ids[topic]: now_ms - self.topics[topic].config.min_compaction_lag_ms for topic in by_topic}
        wanted = {(self.topic_ids[topic], partition) for topic, numbers in by_topic.items() for partition in numbers}
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        found: dict[TopicPartition, int] = {}
        with self._connect() as connection:
            through_files = summaries.read_through_files(connection, wanted)
            for topic, numbers in sorted(by_topic.items()):
                query = (
                    select(sec.topic_id, sec.partition, func.min(sec.first_offset))
                    .join(s.files, files.file_id == sec.file_id)
                    .where(sec.topic_id == self.topic_ids[topic], sec.partition.in_(sorted(numbers)),
                           sec.max_timestamp > cuts[self.topic_ids[topic]], self._live_section(), *outside)
                    .group_by(sec.topic_id, sec.partition)
                )
                above_l0, in_l0 = s.by_partition(query, self.version)
                for part in (in_l0,) if through_files else (above_l0, in_l0):
                    _take_lowest(found, names, connection.execute(part))
            if through_files:
                every = (
                    select(sec.topic_id, sec.partition, sec.first_offset, sec.max_timestamp)
                    .join(s.files, files.file_id == sec.file_id).where(self._live_section(), *outside)
                )
                young = (
                    (topic_id, partition, first) for topic_id, partition, first, newest
                    in connection.execute(s.through_live_files(every, self.version))
                    if (topic_id, partition) in wanted and newest > cuts[topic_id]
                )
                _take_lowest(found, names, young)
        return found

    def _above_l0(self, connection: Connection, query: Select, slots: Iterable[tuple[int, int]], *picking: ColumnElement[bool]) -> Select:
        """`query` over the live sections above L0 of `slots` (topic id, partition): through `sections_by_partition`,
        `picking` them; or, when their entries in the index (removed files' sections too) number a good share of all
        live sections above L0 (`summaries.read_through_files`), every one through the live files, which the index's
        sections of removed files do not slow down (the caller picks its partitions from the rows)."""
        if summaries.read_through_files(connection, slots):
            return s.through_live_files(query, self.version)
        return query.where(s.ABOVE_L0, *picking)

    def _slots_of_topics(self, topic_ids: Iterable[int]) -> list[tuple[int, int]]:
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        return [(topic_id, partition) for topic_id in topic_ids for partition in range(self.topics[names[topic_id]].partitions)]

    def lowest_offsets(self, keys: Sequence[str]) -> dict[TopicPartition, int]:
        """Per partition, the smallest first offset of a section of the live files among `keys` (the database
        takes the minimums: one row per partition comes back)."""
        names = {topic_id: name for name, topic_id in self.topic_ids.items()}
        sec, files = s.sections.c, s.files.c
        query = (
            select(sec.topic_id, sec.partition, func.min(sec.first_offset))
            .join(s.files, files.file_id == sec.file_id)
            .where(self._key_in(keys), self._live_section())
            .group_by(sec.topic_id, sec.partition)
        )
        with self._connect() as connection:
            rows = connection.execute(query).all()
        return {(names[topic_id], partition): first for topic_id, partition, first in rows}

    def _key_in(self, keys: Iterable[str]) -> ColumnElement[bool]:
        return one_of(s.files.c.key, keys, self.engine.dialect.name)

    # -- leases and counts -----------------------------------------------------------------------------------

    def leases(self, now_ms: int) -> dict[str, Lease]:
        """Live files leased to a plan whose lease has not expired, by key (as of now, not of the version)."""
        query = (
            select(s.files.c.key, s.leases.c.plan_id, s.leases.c.expires_ms)
            .join(s.files, s.files.c.file_id == s.leases.c.file_id)
            .where(s.leases.c.expires_ms > now_ms, s.files.c.removed_version.is_(None))
        )
        with self._connect() as connection:
            return {key: Lease(plan_id, expires) for key, plan_id, expires in connection.execute(query)}

    def leased_files(self, now_ms: int) -> set[str]:
        return set(self.leases(now_ms))

    def level_counts(self, excluding: Sequence[str] = ()) -> dict[int, int]:
        """Live files per level but `excluding` keys, as `file_summaries` counts them (without reading them), in one
        grouped query."""
        files = s.files.c
        query = select(files.level, func.count()).where(self._live()).group_by(files.level)
        if excluding:
            query = query.where(~self._key_in(excluding))
        with self._connect() as connection:
            held = self._held_files(connection)
            if held:
                query = query.where(~one_of(files.file_id, held, self.engine.dialect.name))
            return dict(connection.execute(query).all())


# `get_files` and `section_columns` read every live file when asked for at least this share of them (the simulator's
# catalog in memory answers as they do).
MOST_FILES = 0.9
_NO_END = 2**63 - 1  # past every offset; as a limit, none
# Partitions per query of `sections_of_partitions`: a compound query of at most this many parts (SQLite takes 500), and
# as many queries kept built.
PARTITIONS_PER_QUERY = 16
# A partition's pages of sections: the first is what the first record costs (a few blocks' reads are a page of
# sections' worth of records for most consumers), the next ones grow fourfold to the last size, so that reading
# a long partition costs few round trips.
FIRST_PAGE_SECTIONS = 16
LAST_PAGE_SECTIONS = 4096


class _Page(NamedTuple):
    """A query of one partition's sections: those ending in [low, high] and starting at or before first_at_most, the
    first `limit` of them by last offset."""

    partition: int
    low: int
    high: int = _NO_END
    first_at_most: int = _NO_END
    limit: int = _NO_END


class PartitionSections:
    """The live sections of one partition holding offsets in [from_offset, to_offset), (file key, section) in
    first-offset order, read from the catalog's index by (topic, partition, last offset) a page at a time as they
    are iterated, checked on the way (`_SectionsCheck`, carried across pages), and kept: iterating again
    reads nothing more, and a reader that stops early reads no more pages.

    A page is the sections ending from where the last one ended, the first `limit` by last offset. In first-offset
    order they come before every section ending later, unless one of those starts earlier: a compaction output
    spanning offsets that sections of the page fill (its holes), with records of its own among theirs. None can
    when the page's sections hold every offset from where the last page ended to where this one ends (each holds
    as many records as its offsets, one after another: L0 sections, copies); otherwise the sections ending later
    and starting within the page are asked for, with every section ending up to where they end: the records they
    are merged with (consume merges a run of overlapping sections by offset). A section that starts below
    `from_offset` and spans offsets the pages hold comes with a later page: its records from `from_offset` on
    all come after theirs (a record among them would be an offset held twice, which the read refuses).
    """

    def __init__(self, snapshot: Snapshot, topic: str, topic_id: int, partition: int, from_offset: int, to_offset: int | None) -> None:
        self.snapshot = snapshot
        self.topic = topic
        self.topic_id = topic_id
        self.partition = partition
        self.from_offset = from_offset
        self.to_offset = _NO_END if to_offset is None else to_offset
        self._taken: list[tuple[str, CatalogSection]] = []
        self._produced: list[int] = []  # each taken section's `produced_compression`
        self._low = from_offset  # every live section ending below this and at or after from_offset is taken
        self._limit = FIRST_PAGE_SECTIONS
        self.done = from_offset >= self.to_offset  # every section wanted is taken
        self._check = _SectionsCheck(topic, partition, from_offset)

    def __iter__(self) -> Iterator[tuple[str, CatalogSection]]:
        position = 0
        while True:
            while position < len(self._taken):
                yield self._taken[position]
                position += 1
            if self.done:
                return
            page = self.next_page()
            self.take_page(self._query(page))

    def __repr__(self) -> str:
        return f"PartitionSections({self.topic}/{self.partition} from {self.from_offset}, {len(self._taken)} taken)"

    def produced_codec(self, offset: int) -> int:
        """The Kafka codec id the records of the last section taken that starts at or before `offset` were produced
        with (`sections.produced_compression`), UNKNOWN_CODEC if none is known."""
        at = bisect.bisect_right(self._taken, offset, key=_taken_first_offset) - 1
        return self._produced[at] if at >= 0 else s.UNKNOWN_CODEC

    def next_page(self) -> _Page:
        return _Page(self.partition, self._low, limit=self._limit)

    def _query(self, page: _Page) -> list[Row]:
        return self.snapshot._page_rows(self.topic_id, [page])

    def take_page(self, rows: list[Row]) -> None:
        """Take the rows of `next_page()`, with what else is needed to put them in first-offset order."""
        if self.done:
            return
        rows.sort(key=_last_offset)
        limit = self._limit
        self._limit = min(4 * limit, LAST_PAGE_SECTIONS)
        if len(rows) < limit:
            end = _NO_END  # no section ends later
        else:
            end = rows[-1].last_offset
            kept = [row for row in rows if row.last_offset < end]
            if kept:  # those ending at `end` come with the next page, which takes every one of them
                rows, end = kept, kept[-1].last_offset
            else:  # the whole page ends at one offset (a damaged row, the check will say): take each section ending there
                rows = self._query(_Page(self.partition, end, end))
        while end < _NO_END and not _hold_every_offset(rows, self._low, end):
            first_at_most = min(end, self.to_offset - 1)
            if not self.snapshot.may_span(self.topic_id, self.partition, end, first_at_most):
                break
            spanning = self._query(_Page(self.partition, end + 1, first_at_most=first_at_most))
            if not spanning:
                break
            reach = max(row.last_offset for row in spanning)
            rows += self._query(_Page(self.partition, end + 1, reach))  # the spanning sections and what fills their holes
            end = reach
        names = {self.topic_id: self.topic}
        rows.sort(key=_first_offset)
        rows = [row for row in rows if row.first_offset < self.to_offset]
        pairs = [(row, (row.key, _section(row, names))) for row in rows]
        for row, pair in pairs:
            if row.removed_version is not None and row.removed_version <= self.snapshot.version:
                raise _retired_apart(self.topic, self.partition, *pair, row.removed_version)
            self._check.row(*pair, row.next_offset)
        dropped = self._dropped([pair for _, pair in pairs], pairs[0][0]) if pairs else []
        for row, pair in pairs:
            self._check.take(*pair, row.next_offset, row.log_start_offset, dropped, compacted=row.summarized)
            self._taken.append(pair)
            self._produced.append(row.produced_compression)
        self._low = end + 1 if end < _NO_END else _NO_END
        self.done = end >= self.to_offset - 1

    def _dropped(self, sections: Sequence[tuple[str, CatalogSection]], row: Row) -> list[Range]:
        """The holes (`offset_holes`: offsets compactions dropped, transactions' markers) holding offsets the page's
        sections leave unheld (`row` one of its rows): read only when they leave some, in one query."""
        if row.log_start_offset is None:
            return []
        unheld = self._check.gaps(sections, row.log_start_offset)
        if not unheld:
            return []
        return self.snapshot.offset_holes(self.topic_id, self.partition, unheld[0][0], unheld[-1][1])


def _taken_first_offset(pair: tuple[str, CatalogSection]) -> int:
    return pair[1].first_offset


def _last_offset(row: Row) -> int:
    return row.last_offset


def _first_offset(row: Row) -> tuple[int, int]:
    return row.first_offset, row.file_id


def _hold_every_offset(rows: list[Row], low: int, end: int) -> bool:
    """Whether sections `rows` (in last-offset order, every one ending in [low, end]) hold every offset from `low` to
    `end`: each holds a record at each of its offsets, and in first-offset order each starts where the one before
    it ended, the first at or before `low`."""
    reached = low - 1
    for row in sorted(rows, key=_first_offset):
        if row.record_count != row.last_offset - row.first_offset + 1 or row.first_offset > reached + 1:
            return False
        reached = max(reached, row.last_offset)
    return reached >= end


@cache
def _pages_query(count: int) -> CompoundSelect | Select:
    """The query of `Snapshot._page_rows` for `count` pages, built once (building it costs more than running it):
    bound parameters topic_id and version, and for each page i its fields (`_Page`) suffixed _i. Each page is the
    first `limit_i` live rows by last offset of two parts (`schema.by_partition`): the sections above L0 read from
    `low_i` in the index by topic, partition and last offset, in its order, and the partition's L0 sections by
    primary key. The partition's next offset comes along (its primary key: one row), as a bound for the sections'
    offsets."""
    sec, files, partitions = s.sections.c, s.files.c, s.partitions.c
    version: BindParameter[int] = bindparam("version")
    # A section of a live file retired alone is taken too when no commit that retires sections made its version: a
    # damaged row, hiding its records, which the reader refuses by name (`_retired_apart`). Asked of those rows alone.
    live = and_(
        files.added_version <= version, or_(files.removed_version.is_(None), files.removed_version > version),
        or_(sec.removed_version.is_(None), sec.removed_version > version, ~s.removal_recorded(sec.removed_version)),
    )
    pages = []
    for i in range(count):
        # Whether the partition ever held a section above L0 (its summary row is never deleted): one that never did was
        # never compacted, and its sections hold every offset from its log start on. Of bound parameters alone, so
        # each database answers it once a query.
        summarized = (
            select(literal_column("1")).where(s.partition_summaries.c.topic_id == bindparam("topic_id"),
                                              s.partition_summaries.c.partition == bindparam(f"partition_{i}"))
            .exists().label("summarized")
        )
        query = (
            select(*s.SECTION_ROW_COLUMNS, files.key, partitions.next_offset, partitions.log_start_offset, summarized)
            .join(s.files, files.file_id == sec.file_id)
            .join(s.partitions, and_(partitions.topic_id == sec.topic_id, partitions.partition == sec.partition), isouter=True)
            .where(
                sec.topic_id == bindparam("topic_id"), sec.partition == bindparam(f"partition_{i}"),
                sec.last_offset >= bindparam(f"low_{i}"), sec.last_offset <= bindparam(f"high_{i}"),
                sec.first_offset <= bindparam(f"first_at_most_{i}"), live,
            )
            .order_by(sec.last_offset)
            .limit(bindparam(f"limit_{i}"))
        )
        both = union_all(*(select(part.subquery()) for part in s.by_partition(query, version))).subquery()
        pages.append(select(both).order_by(both.c.last_offset).limit(bindparam(f"limit_{i}")))
    if count == 1:
        return pages[0]
    return union_all(*(select(page.subquery()) for page in pages))


def check_partition_sections(
    topic: str, partition: int, sections: Sequence[tuple[str, CatalogSection]], next_offset: int | None = None
) -> None:
    """Check the catalog rows of a partition's live sections, (file key, section) in first-offset order, against
    each other in one pass (`_SectionsCheck`); a CorruptDataError names the row."""
    check = _SectionsCheck(topic, partition)
    for key, section in sections:
        check.take(key, section, next_offset)


class _SectionsCheck:
    """The check of a partition's section rows as a reader takes them in first-offset order, page after page, as a
    damaged row (offsets shifted, partition or topic relabelled, counts changed) would otherwise show records twice or
    under another partition: each section's offsets run forwards and hold its records (1 to last - first + 1 of
    them), end below the partition's `next_offset`, and sections whose offset ranges overlap (legitimately: a
    compaction's output spans a hole another live file fills, offsets never repeat) hold together no more records
    than the offsets they span. The one section that may come after one starting later is a compaction output
    starting below the read's `from_offset` and spanning offsets the sections before it hold (`PartitionSections`).

    And as a damaged row would otherwise hide records (a files row deleted or marked removed, a section retired or
    moved to another partition or topic): the sections hold every offset from the partition's `log_start`, or the
    read's first offset, to the last one taken, but the holes among them (`dropped`: offsets compactions dropped,
    transactions' markers; none in a partition never compacted that has no marker). The offsets after the last
    section may have been handed out after the snapshot's version."""

    def __init__(self, topic: str, partition: int, from_offset: int = 0) -> None:
        self.topic = topic
        self.partition = partition
        self.from_offset = from_offset
        self.run_first = self.run_last = -1
        self.run_records = 0
        self.run: list[tuple[str, CatalogSection]] = []
        self.previous_first = -1
        self.reached: int | None = None  # every offset up to it is held, or was dropped by a compaction

    def row(self, key: str, section: CatalogSection, next_offset: int | None) -> None:
        """The checks of one row alone, which a page's rows pass before they are taken: a damaged row is named before
        the offsets it left unheld."""
        topic, partition = self.topic, self.partition
        first, last, records = section.first_offset, section.last_offset, section.info.record_count
        if first < 0 or first > last or not 1 <= records <= last - first + 1:
            raise _damaged_row(topic, partition, key, section, f"{records} record(s) cannot sit in offsets {first} to {last}")
        if next_offset is not None and last >= next_offset:
            raise _damaged_row(
                topic, partition, key, section, f"it ends past the partition's next offset {next_offset} (no offset there was given out)"
            )

    def gaps(self, sections: Iterable[tuple[str, CatalogSection]], log_start: int) -> list[Range]:
        """The offsets that `take` of `sections` (in first-offset order) would find no section holding."""
        reached = self._reached(log_start)
        unheld = []
        for _, section in sections:
            if section.first_offset > reached + 1:
                unheld.append((reached + 1, section.first_offset - 1))
            reached = max(reached, section.last_offset)
        return unheld

    def _reached(self, log_start: int) -> int:
        return max(self.from_offset, log_start) - 1 if self.reached is None else self.reached

    def take(
        self, key: str, section: CatalogSection, next_offset: int | None, log_start: int | None = None, dropped: Sequence[Range] = (),
        compacted: bool = True,
    ) -> None:
        """Check a section, after those taken before (`log_start` None: the offsets it leaves unheld are not asked
        for; `dropped`, the holes among them; `compacted`, whether the partition ever was, for the error's words)."""
        topic, partition = self.topic, self.partition
        first, last, records = section.first_offset, section.last_offset, section.info.record_count
        self.row(key, section, next_offset)
        if first < self.previous_first and first >= self.from_offset:
            raise _damaged_row(topic, partition, key, section, f"it comes after a section starting at offset {self.previous_first}")
        if log_start is not None:
            reached = self._reached(log_start)
            unheld = holes.without([(reached + 1, first - 1)], dropped) if first > reached + 1 else []
            if unheld:
                raise _hidden_offsets(topic, partition, *unheld[0], key, section, compacted)
            self.reached = max(reached, last)
        self.previous_first = max(self.previous_first, first)
        if first > self.run_last:
            self.run_first, self.run_last, self.run_records, self.run = first, last, 0, []
        self.run_first = min(self.run_first, first)
        self.run_last = max(self.run_last, last)
        self.run_records += records
        self.run.append((key, section))
        if self.run_records > self.run_last - self.run_first + 1:
            others = "; ".join(f"{k} offsets {s.first_offset} to {s.last_offset}, {s.info.record_count} record(s)" for k, s in self.run[:-1][-3:])
            raise _damaged_row(
                topic, partition, key, section,
                f"it overlaps {others}: together {self.run_records} records in offsets {self.run_first} to {self.run_last}, "
                f"which hold {self.run_last - self.run_first + 1}, so an offset would be shown twice",
            )


def _picking(slots: set[tuple[int, int]]) -> tuple[ColumnElement[bool], ColumnElement[bool]]:
    """Conditions picking the sections of `slots`' topics and partition numbers (the pairs are picked from the rows: a
    list of pairs would be compared row by row)."""
    sec = s.sections.c
    return sec.topic_id.in_(sorted({topic_id for topic_id, _ in slots})), sec.partition.in_(sorted({partition for _, partition in slots}))


def _take_lowest(found: dict[TopicPartition, int], names: Mapping[int, str], rows: Iterable) -> None:
    """Lower `found`'s offset of each partition to the first offset of each (topic id, partition, first offset) row."""
    for topic_id, partition, first in rows:
        tp = (names[topic_id], partition)
        found[tp] = min(first, found.get(tp, first))


def _hidden_offsets(topic: str, partition: int, low: int, high: int, key: str, section: CatalogSection, compacted: bool) -> CorruptDataError:
    """Offsets that no live section holds and no compaction dropped (the partition was never compacted, or its
    `offset_holes` do not hold them), before a section that holds some (not damaged: the error names no file as
    the damaged one)."""
    why = "no compaction dropped them" if compacted else "the partition was never compacted"
    return CorruptDataError(
        f"catalog rows of partition {topic}/{partition} hide offsets {low} to {high}: no live section holds them, yet "
        f"{why} (the next section is {key}'s from offset {section.first_offset}), so a row that "
        "held them is damaged (a files row deleted or marked removed, a section retired or moved to another partition or "
        "topic); restore the catalog database from a backup"
    )


def _retired_apart(topic: str, partition: int, key: str, section: CatalogSection, version: int) -> CorruptDataError:
    """A section of a live file retired at a version no compaction nor topic deletion made (`schema.removal_recorded`)."""
    return _damaged_row(
        topic, partition, key, section,
        f"it is marked retired at version {version}, which no compaction nor topic deletion made, while its file is live, "
        "so it hides those records",
    )


def _damaged_row(topic: str, partition: int, key: str, section: CatalogSection, why: str) -> CorruptDataError:
    error = CorruptDataError(
        f"catalog row of section {topic}/{partition} of {key} (offsets {section.first_offset} to {section.last_offset}, "
        f"{section.info.record_count} record(s)) is damaged: {why}; restore the catalog database from a backup"
    )
    error.key = key
    return error


# The sections columns `_section` reads, in `schema.SECTION_ROW` order: each column fetched costs a planner reading
# 400,000 rows about 0.03 s.
_LOADED_COLUMNS = s.SECTION_ROW_COLUMNS[: s.SECTION_ROW.index("key_sketch") + 1]


def _section(row, names: dict[int, str]) -> CatalogSection:
    """A sections row (positional, in `schema.SECTION_ROW` order) as a section, its CRC unbound from the row: the file's
    CRC only while the row's locating fields are as written (`schema.section_crc_binding`)."""
    (file_id, topic_id, partition, byte_offset, byte_length, first_row, first_offset, last_offset, record_count,
     min_timestamp, max_timestamp, tombstones, uncompressed_bytes, compression, crc32, clean_below_delta,
     key_sketch) = row[:17]
    try:
        crc32 ^= s.section_crc_binding(topic_id, partition, byte_offset, byte_length, first_row, first_offset, last_offset, record_count)
    except struct.error:
        raise _unreadable_row(file_id, row[1:9]) from None
    info = SectionInfo(
        names[topic_id], partition, record_count, last_offset - first_offset, min_timestamp, max_timestamp, tombstones,
        uncompressed_bytes, COMPRESSIONS[compression], crc32, byte_offset, byte_length, clean_below_delta,
        bytes(key_sketch or b""), first_row,
    )
    return CatalogSection(info, first_offset)


# `_section_hashes`' modulus (a prime below 2**31) and multiplier: each step's product stays below 2**62.
_HASH_MODULUS = 2**31 - 1
_HASH_MULTIPLIER = 1_103_515_245


def _section_hashes(columns):
    """Per section, a hash of its values in `columns`, the same for SQL columns and for numpy arrays: Horner's rule modulo a
    prime, each value taken modulo it first, the remainder's sign the dividend's as both databases and `np.fmod` take
    it, then squared modulo the prime. Horner's rule alone is linear in the values, so its sum over sections stays the
    same when two sections trade values (two files' packs swapped, two partitions' offsets exchanged); the square's
    sum does not."""
    sql = not isinstance(columns[0], np.ndarray)
    remainder = (lambda value: value % _HASH_MODULUS) if sql else (lambda value: np.fmod(value, _HASH_MODULUS))
    hashed = remainder(columns[0])
    for column in columns[1:]:
        hashed = remainder(hashed * _HASH_MULTIPLIER + remainder(column))
    return remainder(hashed * hashed)


def _decimals(column: ColumnElement[int], dialect: str) -> ColumnElement[str]:
    """An aggregate of `column` over a query's rows: their values in decimal, comma-separated, in one text. The
    aggregates of one query step through the same rows in the same order, so their texts line up value for value;
    a column read so costs the database driver one string, not an integer object and a tuple's slot a row."""
    if dialect == "postgresql":
        return func.string_agg(cast(column, Text), ",")
    return func.group_concat(column, ",")


def _sketches(column: ColumnElement[bytes], dialect: str) -> ColumnElement:
    """An aggregate of a binary column over a query's rows (NULL as empty) in the order `_decimals` takes them: their
    bytes one after the other (PostgreSQL), or that in hexadecimal (SQLite, whose aggregates are text)."""
    if dialect == "postgresql":
        return func.string_agg(func.coalesce(column, literal_column("''::bytea")), literal_column("''::bytea"))
    return func.group_concat(func.hex(column), "")


# How many consecutive file ids `input_sections` aggregates the sections of in one row on PostgreSQL: 64 files of
# 10,000 sections with the longest key sketches (128 bytes) aggregate 82 MB of them.
FILE_IDS_AGGREGATED = 64


# The integer columns of `section_columns`' file rows, by place.
_FILE_NUMBERS = ((0, "file_id"), (2, "level"), (3, "size"), (4, "created_ms"), (5, "content"))


def _file_integers(values: Sequence[object], name: str) -> np.ndarray:
    """A column of files rows as int64; a value that is no integer (SQLite keeps whatever a column is set to) is a
    CorruptDataError, never a number read from text or a float cut short."""
    array = np.array(values) if values else np.zeros(0, np.int64)
    if array.dtype.kind != "i":
        raise CorruptDataError(
            f"catalog rows of files hold a value of files.{name} that is not a 64-bit integer; restore the catalog database "
            "from a backup"
        )
    return array.astype(np.int64, copy=False)


def _integer_columns(wanted: Sequence[ColumnElement[int]], count: int, texts: Sequence[str | None]) -> list[np.ndarray]:
    """The `_decimals` texts of `count` rows as int64 arrays; a value that is no 64-bit integer (SQLite keeps whatever
    a column is set to) is a CorruptDataError."""
    arrays = []
    for column, text in zip(wanted, texts):
        try:
            values = np.fromstring(text or "", np.int64, sep=",")
        except ValueError:
            values = np.zeros(0, np.int64)
        if len(values) != count:
            raise CorruptDataError(
                f"catalog rows of sections hold a value of {column} that is not a 64-bit integer ({len(values):,} of {count:,} "
                "rows read); restore the catalog database from a backup"
            )
        arrays.append(values)
    return arrays


def _unbound_row(row: tuple) -> tuple:
    """A `section_rows` row (the sections columns from topic_id to clean_below_delta, `schema.SECTION_ROW` order) with
    its CRC unbound."""
    try:
        crc32 = row[13] ^ s.section_crc_binding(*row[:8])
    except struct.error:
        raise _unreadable_row(None, row[:8]) from None
    return (*row[:13], crc32, row[14])


def _unreadable_row(file_id: int | None, fields: Sequence) -> CorruptDataError:
    """A sections row whose locating fields are not 64-bit integers (SQLite keeps whatever a column is set to)."""
    of_file = f" of file_id {file_id}" if file_id is not None else ""
    return CorruptDataError(
        f"catalog row of section topic_id {fields[0]!r}, partition {fields[1]!r}{of_file} is damaged: its fields (topic_id, "
        f"partition, byte_offset, byte_length, first_row, first_offset, last_offset, record_count) {tuple(fields)!r:.200} are "
        "not all 64-bit integers; restore the catalog database from a backup"
    )
