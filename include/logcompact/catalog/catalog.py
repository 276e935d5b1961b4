"""The catalog: which files are live, the topics and their next offsets, kept in a SQL database.

Every change is one transaction that creates manifest version N+1 and costs what it changes, never what
the catalog holds:

* an L0 append inserts its file and sections and assigns their offsets from the partitions' next
  offsets, in the same transaction, so appends never conflict with compactions and no offset is given
  twice;
* a compaction replaces its inputs by its outputs only if every input is still live (and, for a leased
  plan, still leased to it); otherwise CommitConflictError says what it expected and what it found, and
  nothing changes. Committing a plan again is a no-op;
* leases are rows, taken all or none and released in transactions.

Every write transaction first increments the newest version in `catalog_info`, which serializes writers
(the row lock on PostgreSQL, BEGIN IMMEDIATE on SQLite): each waits a few milliseconds at most, instead of
re-applying its change after a lost race. Readers never wait: `snapshot()` pins a version and reads what
it holds (`logcompact.catalog.snapshot`). `docs/catalog.md` describes the schema and the protocol.
"""

from __future__ import annotations

import json
import logging
import struct
import uuid
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import repeat

import numpy as np
from sqlalchemy import ColumnElement, Connection, bindparam, delete, func, insert, inspect, or_, select, tuple_, union_all, update
from sqlalchemy.exc import DatabaseError, IntegrityError
from sqlalchemy.schema import CreateTable

from logcompact.catalog import appends, producers, summaries
from logcompact.catalog import schema as s
from logcompact.catalog.database import WRITE, bound_wal, catalog_errors, catalog_url_for, engine_for, execute_many, one_of, redact_url, sqlite_path, unavailable_error
from logcompact.catalog.identity import (
    CHECK_THEN_ACCEPT,
    MARKER_KEY,
    RECORD_APPEND_EVERY_MS,
    ClusterMarker,
    create_marker,
    read_marker,
    record_version,
)
from logcompact.catalog.model import (
    CONTENTS,
    AgentRecord,
    CatalogSection,
    CatalogUpgrade,
    CommitRecord,
    CommitResult,
    DataFile,
    NewFile,
    SetAside,
    TopicPartition,
    Uncleanable,
)
from logcompact.catalog.producers import PartitionState, PlacedBatch
from logcompact.catalog.snapshot import Snapshot
from logcompact.exceptions import (
    CatalogConfigError,
    CatalogSchemaError,
    ClusterMismatchError,
    ClusterNotFoundError,
    CommitConflictError,
    CorruptDataError,
    InvalidRecordError,
    LogcompactError,
    ManifestVersionNotFoundError,
    StaleCatalogError,
    TopicExistsError,
    TopicNotFoundError,
)
from logcompact.format.layout import COMPRESSIONS, SectionInfo
from logcompact.keys import DATA_PREFIX
from logcompact.store.base import ObjectStore
from logcompact.store.local import LocalStore
from logcompact.topics import Topic
from logcompact.units import wall_clock_ms

# Manifest versions a reader may pin: gc keeps files removed since the oldest of them.
DEFAULT_KEEP_VERSIONS = 100
# An uncleanable partition is left out of plans this long after its first failure, twice as long after each
# further one, at most a day (or until its damaged file changes, or the mark is cleared).
UNCLEANABLE_BACKOFF_MS = 15 * 60_000
UNCLEANABLE_MAX_BACKOFF_MS = 24 * 3_600_000
# How often appends drop idle producers' state (`producers.expire`: one scan of producer_batches).
PRODUCER_EXPIRY_EVERY_MS = 60_000
# Where a write transaction leaves the version it committed, for `_writing` to record in the store's marker.
_COMMITTED = "logcompact_committed_version"
# Where `_topic_rows` leaves whether each topic it read is compacted, for `_insert_file_rows` in the same transaction.
_COMPACTED = "logcompact_compacted_topics"
# Row locks `_topic_rows` takes.
_SHARED, _EXCLUSIVE = "shared", "exclusive"

log = logging.getLogger(__name__)

class Catalog:
    """A cluster: its object store (data, plans) and its catalog database (everything that says what is live).

    `url` names the database (`sqlite:////path/catalog.db`, `postgresql+psycopg://...`); without one, a local
    store keeps its catalog in `catalog.db` beside its data.
    """

    def __init__(self, store: ObjectStore, url: str | None = None, keep_versions: int = DEFAULT_KEEP_VERSIONS) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be at least 1")
        self.store = store
        self.url = catalog_url_for(store, url)
        self.keep_versions = keep_versions
        self.engine = engine_for(self.url)
        self._cluster_id: str | None = None
        self._marker: ClusterMarker | None = None  # the store's, checked against the catalog with the cluster id
        self._recorded_ms = 0  # when this Catalog last recorded a version in the marker
        # No topic facts are cached: topics are deleted, re-created under their name, given partitions and
        # altered (cleanup.policy too), so each transaction reads those it names (`_topic_rows`).
        self._producers_expired_ms = 0  # when an append of this Catalog last expired idle producers' state

    def __repr__(self) -> str:
        return f"Catalog({self.store.uri}, {self._shown_url})"

    @property
    def _shown_url(self) -> str:
        """The database URL as messages print it: without its password."""
        return redact_url(self.engine.url)

    # -- connections ---------------------------------------------------------------------------------

    @contextmanager
    def _reading(self) -> Iterator[Connection]:
        self._check_exists()
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            yield connection

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A write transaction; once it committed a version, the store's marker records it (`_record_version`)."""
        self._check_exists()
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            connection.info.pop(_COMMITTED, None)
            connection.info.pop(_COMPACTED, None)
            connection.execution_options(**{WRITE: True})
            with connection.begin():
                yield connection
            committed = connection.info.pop(_COMMITTED, None)
            bound_wal(connection)
        if committed is not None:
            self._record_version(*committed)

    def _record_version(self, version: int, operation: str) -> None:
        """Record a committed version in the store's marker: after every commit but appends, which record at most
        every RECORD_APPEND_EVERY_MS (a PUT per append would double an agent's PUTs). The commit stands whatever
        happens here, so a failure is logged, not raised: the marker only lags."""
        now = wall_clock_ms()
        if operation == "append" and now - self._recorded_ms < RECORD_APPEND_EVERY_MS:
            return
        assert self._marker is not None  # set with the cluster id
        try:
            self._marker = record_version(self.store, self._marker, version, now)
            self._recorded_ms = now
        except LogcompactError as exc:
            log.warning("version %d committed, but the store's cluster marker could not record it: %s", version, exc)

    def _check_exists(self) -> None:
        """A cluster's schema and its store's marker are checked once per Catalog; a missing cluster is
        ClusterNotFoundError, a store of another cluster ClusterMismatchError, a catalog older than its store has
        seen StaleCatalogError."""
        if self._cluster_id is not None:
            return
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            raise self._not_found()
        marker = read_marker(self.store)  # before the catalog's version: the marker never runs ahead of it
        try:
            with self.engine.connect() as connection:
                exists = inspect(connection).has_table(s.catalog_info.name)
                logged = select(func.max(s.versions.c.version)).scalar_subquery()
                row = connection.execute(
                    select(s.catalog_info.c.schema_version, s.catalog_info.c.cluster_id, s.catalog_info.c.version, logged)
                ).first() if exists else None
        except DatabaseError as exc:  # unreachable, refused, or not a database at all (a damaged SQLite file)
            raise unavailable_error(self.engine.url, exc) from None
        if row is None:
            raise self._not_found()
        if row.schema_version != s.SCHEMA_VERSION:
            raise self._schema_error(row.schema_version)
        if row[3] is not None and row[3] > row.version:  # before the marker may be written at a lowered version
            raise _version_behind_log(row.version, row[3])
        self._marker = self._checked_marker(marker, row.cluster_id, row.version)
        self._cluster_id = row.cluster_id

    def _schema_error(self, found: int) -> CatalogSchemaError:
        """The one line refusing a catalog of schema `found`: the command that upgrades it, when there is one."""
        if found in s.UPGRADABLE_FROM:
            return CatalogSchemaError(
                f"catalog {self._shown_url} has schema version {found}, this logcompact uses {s.SCHEMA_VERSION}: stop its "
                "agents and compactions, back the database up, and run `logcompact cluster upgrade-catalog` (one "
                "transaction)"
            )
        return CatalogSchemaError(
            f"catalog {self._shown_url} has schema version {found}, this logcompact uses {s.SCHEMA_VERSION}; run the "
            "logcompact release that created it, or start a new catalog"
        )

    def upgrade_catalog(self, batch: int = 10_000) -> CatalogUpgrade | None:
        """Bring a catalog of a schema in UPGRADABLE_FROM to SCHEMA_VERSION, in one transaction, step by step:
        from 3, every sections row's crc32, stored raw until then, is bound to its row (`schema.section_crc_binding`),
        `batch` rows at a time in primary-key order; from 4, the Kafka agents' tables are created, partitions get
        their log start offset (0: retention had no record of raising it) and topics their deleted_version; from 5,
        partitions get their assigned_end (where their sections end) and sections their file's level; then
        `sections_by_partition` is built again (schema 9's, over the sections above L0), and on PostgreSQL the sections
        table is made again in schema 9's layout; then `partition_summaries` is filled (from 7, where it lacks l1_bytes,
        made again and filled); then each row counts its partition's entries in `sections_by_partition` (a column
        schema 8 and 9 lack); last, each partition names the newest L0 file holding a section of it (`newest_file`,
        which schema 10 lacks), and from 5 on consumer_groups gets its leader and its rows lose the members schema 10
        could not restore. No manifest version is made, the store is not touched. Returns what was done; None
        when the catalog is at SCHEMA_VERSION already. Another version is a CatalogSchemaError, and no cluster
        ClusterNotFoundError.
        Writers of the older release must be stopped first: they would go on writing what readers then refuse."""
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            raise self._not_found()
        with catalog_errors(self.engine.url):
            with self.engine.connect() as connection:
                if not inspect(connection).has_table(s.catalog_info.name):
                    raise self._not_found()
            with self.engine.connect() as connection, connection.execution_options(**{WRITE: True}).begin():
                found = connection.execute(select(s.catalog_info.c.schema_version).with_for_update()).scalar_one_or_none()
                if found is None:
                    raise self._not_found()
                if found == s.SCHEMA_VERSION:
                    return None
                if found not in s.UPGRADABLE_FROM:
                    raise CatalogSchemaError(
                        f"catalog {self._shown_url} has schema version {found}: `logcompact cluster upgrade-catalog` "
                        f"upgrades schemas {', '.join(map(str, s.UPGRADABLE_FROM))} to {s.SCHEMA_VERSION} only; run the "
                        "logcompact release that created it, or start a new catalog"
                    )
                rewritten = self._bind_section_crcs(connection, batch) if found == 3 else 0
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
                summaries.count_indexed(connection)
                _name_newest_files(connection)  # to schema 11
                if found >= 5:  # before 5, _add_kafka_tables made consumer_groups as this schema has it
                    _keep_group_members(connection)
                connection.execute(update(s.catalog_info).values(schema_version=s.SCHEMA_VERSION))
        log.info("catalog %s upgraded from schema %d to %d: %d section rows rewritten", self._shown_url, found,
                 s.SCHEMA_VERSION, rewritten)
        self._cluster_id = None
        return CatalogUpgrade(found, rewritten)

    def _bind_section_crcs(self, connection: Connection, batch: int) -> int:
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
                (row[9] ^ self._upgraded_binding(row), row[0], row[1], row[2]) for row in rows
            ])
            rewritten += len(rows)
            after = tuple(rows[-1][:3])

    def _upgraded_binding(self, row) -> int:
        """`upgrade_catalog`'s binding of a row (file_id, topic_id, partition, ..., record_count, crc32)."""
        try:
            return s.section_crc_binding(*row[1:9])
        except struct.error:
            raise CorruptDataError(
                f"catalog {self._shown_url}: the sections row of file_id {row[0]!r}, topic_id {row[1]!r}, partition {row[2]!r} "
                f"holds locating fields {tuple(row[1:9])!r:.200} that are not all 64-bit integers; restore the catalog "
                "database from a backup and upgrade again; nothing was changed"
            ) from None

    def _checked_marker(self, marker: ClusterMarker | None, cluster_id: str, version: int) -> ClusterMarker:
        """The store's marker, once it agrees with the catalog: same cluster, a version the catalog has reached."""
        if marker is None:
            return self._adopt_store(cluster_id, version)
        if marker.cluster_id != cluster_id:
            raise ClusterMismatchError(
                f"store {self.store.uri} belongs to cluster {marker.cluster_id} but catalog {self._shown_url} holds "
                f"cluster {cluster_id}: point --catalog (LOGCOMPACT_CATALOG, the Airflow connection) at the store's own "
                "catalog; nothing was written or deleted"
            )
        if version < marker.seen_version:
            raise StaleCatalogError(
                f"catalog {self._shown_url} of cluster {cluster_id} is at version {version} but its store {self.store.uri} "
                f"has seen version {marker.seen_version}: the catalog was restored from an older copy. Restore the newest "
                f"copy; or, to go on from this one (files written after it become orphans), {CHECK_THEN_ACCEPT}"
            )
        return marker

    def _adopt_store(self, cluster_id: str, version: int) -> ClusterMarker:
        """Mark a store that has no marker (a cluster made before markers, or its creator died before writing one),
        only when the catalog agrees: its newest live files are in the store, or it has none and the store no data."""
        live = s.files.c.removed_version.is_(None)
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            newest = connection.execute(
                select(s.files.c.key, s.files.c.size).where(live).order_by(s.files.c.file_id.desc()).limit(3)
            ).all()
        how_to_fix = f"point --catalog at the store's own catalog; or, if this catalog is the store's, {CHECK_THEN_ACCEPT}"
        for key, size in newest:
            found = self.store.stat(key)
            if found is None or found.size != size:
                raise ClusterMismatchError(
                    f"store {self.store.uri} has no cluster marker and does not hold file {key} ({size} bytes) of catalog "
                    f"{self._shown_url} (cluster {cluster_id}): {how_to_fix}"
                )
        if not newest:
            stray = next(iter(self.store.list(DATA_PREFIX)), None)
            if stray is not None:
                raise ClusterMismatchError(
                    f"store {self.store.uri} has no cluster marker and holds data files ({stray.key}, ...) that catalog "
                    f"{self._shown_url} (cluster {cluster_id}) has none of: {how_to_fix}"
                )
        return create_marker(self.store, cluster_id, version, wall_clock_ms())

    def _not_found(self) -> ClusterNotFoundError:
        return ClusterNotFoundError(
            f"no logcompact cluster in {self.store.uri} (catalog {self._shown_url}): "
            "create it with `logcompact cluster create` (`logcompact topic create` and `logcompact agent` create it too)"
        )

    # -- the cluster ---------------------------------------------------------------------------------

    @property
    def cluster_id(self) -> str:
        self._check_exists()
        assert self._cluster_id is not None
        return self._cluster_id

    @property
    def marker(self) -> ClusterMarker:
        """The store's cluster marker, as checked against the catalog when this Catalog was first used."""
        self._check_exists()
        assert self._marker is not None
        return self._marker

    def ensure_created(self, now_ms: int) -> str:
        """The cluster id, creating the schema and version 1 of an empty cluster first if there is none."""
        if isinstance(self.store, LocalStore):
            self.store.root.mkdir(parents=True, exist_ok=True)
        path = sqlite_path(self.url)
        if path is not None and not path.parent.is_dir():
            raise CatalogConfigError(f"catalog {self._shown_url}: directory {path.parent} does not exist; create it or fix the path")
        try:
            return self.cluster_id
        except ClusterNotFoundError:
            self._refuse_marked_store()  # before a write: SQLite would give an empty file its first page
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            connection.execution_options(**{WRITE: True})
            with connection.begin():
                if connection.dialect.name == "postgresql":
                    # Creators racing on a new database wait here rather than fail on the system catalogs.
                    connection.exec_driver_sql("SELECT pg_advisory_xact_lock(7236089)")
                s.metadata.create_all(connection, checkfirst=True)
                if connection.execute(select(s.catalog_info.c.id)).first() is None:
                    connection.execute(
                        insert(s.catalog_info).values(
                            id=1, schema_version=s.SCHEMA_VERSION, cluster_id=str(uuid.uuid4()), created_ms=now_ms, version=1
                        )
                    )
                    connection.execute(insert(s.versions).values(version=1, commit_id=str(uuid.uuid4()), created_ms=now_ms, operation="create"))
                cluster_id, version = connection.execute(select(s.catalog_info.c.cluster_id, s.catalog_info.c.version)).one()
        create_marker(self.store, cluster_id, version, now_ms)  # a creator that dies first leaves it to `_adopt_store`
        self._cluster_id = None
        return self.cluster_id

    def _refuse_marked_store(self) -> None:
        """A new cluster is never made over a store that already belongs to one or holds data files: their catalog
        was lost, emptied or is elsewhere, and a new one would hand out their offsets again."""
        marker = read_marker(self.store)
        if marker is not None:
            raise ClusterMismatchError(
                f"catalog {self._shown_url} holds no cluster but store {self.store.uri} belongs to cluster "
                f"{marker.cluster_id}: point --catalog (LOGCOMPACT_CATALOG) at that cluster's catalog, restore the catalog "
                "database from a backup, or use an empty store"
            )
        found = next(iter(self.store.list(DATA_PREFIX)), None)
        if found is not None:
            raise CatalogConfigError(
                f"catalog {self._shown_url} holds no cluster but {self.store.uri} holds data files "
                f"({found.key}, ...): restore the catalog database from a backup, or use an empty store"
            )

    def check_store(self, now_ms: int) -> ClusterMarker:
        """Check the store's marker against the catalog again, now, and record the catalog's version in it: what a
        command that deletes (gc) does first, however long this Catalog has been open."""
        self._check_exists()
        marker = read_marker(self.store)
        version = self.latest_version()
        if marker is None:
            raise ClusterMismatchError(
                f"store {self.store.uri} lost its cluster marker {MARKER_KEY} since it was checked: restore it; or, if "
                f"catalog {self._shown_url} is the store's, {CHECK_THEN_ACCEPT}"
            )
        self._marker = record_version(self.store, self._checked_marker(marker, self.cluster_id, version), version, now_ms)
        return self._marker

    def accept_catalog(self, cluster_id: str, now_ms: int) -> ClusterMarker:
        """The operator's word that this catalog, of cluster `cluster_id`, is the store's: mark a store without a
        marker (or with a damaged one) as the catalog's cluster, or go on from a catalog restored from an older copy by
        lowering the marker's version to the catalog's. A catalog holding another cluster than `cluster_id` is
        refused, and so is a store of another cluster than the catalog's."""
        held, version = self.held_cluster()
        if held != cluster_id:
            raise ClusterMismatchError(
                f"catalog {self._shown_url} holds cluster {held}, not {cluster_id} (--cluster-id): it is not the catalog of "
                "the cluster you named; point --catalog at that cluster's catalog, or name the cluster it holds once you "
                "have checked it is the store's; nothing was written"
            )
        try:
            return self.marker
        except (StaleCatalogError, ClusterMismatchError, CorruptDataError) as refused:
            try:
                found = read_marker(self.store)
            except CorruptDataError:
                found = None
            if found is not None and found.cluster_id != held:
                raise refused
            accepted = ClusterMarker(held, found.created_ms if found else now_ms, version, now_ms)
            self.store.put(MARKER_KEY, accepted.encode())
            log.warning("store %s accepts catalog %s of cluster %s at version %d", self.store.uri, self._shown_url, held, version)
            self._cluster_id = None
            self._check_exists()
            return accepted

    def held_cluster(self) -> tuple[str, int]:
        """The cluster id and version the catalog holds, read without checking them against the store's marker: what
        `cluster describe` shows of a catalog the store refuses."""
        path = sqlite_path(self.url)
        if path is not None and not path.exists():
            raise self._not_found()
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            if not inspect(connection).has_table(s.catalog_info.name):
                raise self._not_found()
            held = connection.execute(select(s.catalog_info.c.cluster_id, s.catalog_info.c.version)).first()
        if held is None:
            raise self._not_found()
        return held.cluster_id, held.version

    def latest_version(self) -> int:
        with self._reading() as connection:
            return _newest_version(connection)

    def snapshot(self, version: int | None = None, set_aside: frozenset[TopicPartition] = frozenset()) -> Snapshot:
        """A reader pinned to a manifest version (default: the newest); planners leave out the sections of
        `set_aside` partitions (`planning_snapshot`)."""
        with self._reading() as connection:
            latest = _newest_version(connection)
            if version is not None and version != latest:
                oldest = connection.execute(select(func.min(s.versions.c.version))).scalar_one()
                if not oldest <= version <= latest:
                    raise ManifestVersionNotFoundError(
                        f"manifest version {version} is not in the catalog of {self.store.uri} (kept versions are "
                        f"{oldest} to {latest}); read the latest version instead"
                    )
            pinned = latest if version is None else version
            topics, ids = self._topics(connection, pinned)
            return Snapshot(self.engine, self.cluster_id, pinned, topics, ids, set_aside)

    def planning_snapshot(self, now_ms: int) -> Snapshot:
        """The newest version as planners see it: without the partitions held back as uncleanable."""
        return self.snapshot(set_aside=self.held_uncleanable(now_ms))

    def oldest_kept_version(self) -> int:
        return max(1, self.latest_version() - self.keep_versions + 1)

    def commit_log(self, limit: int = 100) -> list[CommitRecord]:
        """The newest commits, newest first."""
        with self._reading() as connection:
            rows = connection.execute(select(s.versions).order_by(s.versions.c.version.desc()).limit(limit))
            return [CommitRecord(r.version, r.commit_id, r.created_ms, r.operation) for r in rows]

    # -- topics --------------------------------------------------------------------------------------

    def create_topic(self, topic: Topic, now_ms: int) -> int:
        """Create a topic with its partitions at offset 0; returns the version created."""
        with self._writing() as connection:
            version = self._next_version(connection, f"create topic {topic.name}", now_ms)
            live = s.topics.c.deleted_version.is_(None)
            if connection.execute(select(s.topics.c.topic_id).where(s.topics.c.name == topic.name, live)).first():
                raise TopicExistsError(f"topic {topic.name!r} already exists; describe it with `logcompact topic describe`")
            topic_id = connection.execute(
                insert(s.topics)
                .values(
                    name=topic.name, partitions=topic.partitions, config=json.dumps(topic.config.to_kafka()),
                    created_ms=topic.created_ms, created_version=version,
                )
                .returning(s.topics.c.topic_id)
            ).scalar_one()
            connection.execute(
                insert(s.partitions), [{"topic_id": topic_id, "partition": p, "next_offset": 0, "assigned_end": 0} for p in range(topic.partitions)]
            )
        return version

    def alter_topic(self, name: str, change: Mapping[str, str | int] | Callable[[Topic], Topic], now_ms: int) -> Topic:
        """Change a topic's configs: Kafka-named `settings`, or a function of the topic as it is now (in the same
        transaction, so concurrent changes are not lost); returns the topic altered."""
        with self._writing() as connection:
            self._topic_rows(connection, {name}, lock=_EXCLUSIVE)  # before the version row: `append_files`' order
            self._next_version(connection, f"alter topic {name}", now_ms)
            current = self._live_topic(connection, name)
            altered = change(current) if callable(change) else current.altered(change)
            connection.execute(
                update(s.topics).where(s.topics.c.name == name, s.topics.c.deleted_version.is_(None)).values(config=json.dumps(altered.config.to_kafka()))
            )
        return altered

    def log_offsets(self, topic: str) -> list[tuple[int, int]]:
        """Each partition's log start offset and next offset (its high watermark), as of now: one row each."""
        part = s.partitions.c
        with self._reading() as connection:
            topic_id = self._topic_id(connection, topic)
            rows = connection.execute(
                select(part.log_start_offset, part.next_offset).where(part.topic_id == topic_id).order_by(part.partition)
            )
            return [(r.log_start_offset, r.next_offset) for r in rows]

    def add_partitions(self, name: str, count: int, now_ms: int) -> Topic:
        """Grow a topic to `count` partitions, the new ones at offset 0 (Kafka's CreatePartitions); returns it."""
        with self._writing() as connection:
            topic_id = self._topic_rows(connection, {name}, lock=_EXCLUSIVE)[name][0]  # before the version row: `append_files`' order
            self._next_version(connection, f"add partitions to topic {name}", now_ms)
            current = self._live_topic(connection, name)
            grown = current.with_partitions(count)
            connection.execute(update(s.topics).where(s.topics.c.topic_id == topic_id).values(partitions=count))
            connection.execute(
                insert(s.partitions), [{"topic_id": topic_id, "partition": p, "next_offset": 0, "assigned_end": 0} for p in range(current.partitions, count)]
            )
        return grown

    def delete_topic(self, name: str, now_ms: int, topic_id: int | None = None) -> int:
        """Delete a topic in one version: its row marked deleted (its name free for a new topic, its topic id never
        given again), its sections retired and the files left with no live section removed (gc collects them), its
        producers' batches, uncleanable marks and consumer groups' committed offsets dropped. Returns the version.

        A compaction planned before that names the topic's files is refused at its commit: its inputs are gone,
        or, for a file shared with other topics, hold a section of a deleted topic (`_refuse_deleted_topics`).
        With `topic_id`, only the topic of that id: one made again under the name since is TopicNotFoundError."""
        with self._writing() as connection:
            found = self._topic_rows(connection, {name}, lock=_EXCLUSIVE)[name][0]
            version = self._next_version(connection, f"delete topic {name}", now_ms)
            if topic_id is not None and found != topic_id:
                raise TopicNotFoundError(f"topic {name!r} of topic id {topic_id} was deleted already; the topic of that name now is another")
            topic_id = found
            sec, files = s.sections.c, s.files.c
            connection.execute(update(s.topics).where(s.topics.c.topic_id == topic_id).values(deleted_version=version))
            live_sections = select(sec.file_id).where(sec.topic_id == topic_id, sec.removed_version.is_(None))
            holding = sorted(set(connection.execute(union_all(*s.by_partition(live_sections))).scalars()))
            connection.execute(
                update(s.sections).where(self._one_of(sec.file_id, holding), sec.topic_id == topic_id, sec.removed_version.is_(None))
                .values(removed_version=version)
            )
            still_live = select(sec.file_id).where(sec.file_id == files.file_id, sec.removed_version.is_(None)).exists()
            connection.execute(
                update(s.files).where(self._one_of(files.file_id, holding), files.removed_version.is_(None), ~still_live)
                .values(removed_version=version, removed_ms=now_ms)
            )
            summaries.clear_topic(connection, topic_id, version)
            connection.execute(delete(s.producer_batches).where(s.producer_batches.c.topic_id == topic_id))
            connection.execute(delete(s.uncleanable).where(s.uncleanable.c.topic_id == topic_id))
            connection.execute(delete(s.group_offsets).where(s.group_offsets.c.topic == name))
        return version

    def next_offsets(self, topic: str) -> list[int]:
        """Each partition's next offset, as of now."""
        with self._reading() as connection:
            topic_id = self._topic_id(connection, topic)
            rows = connection.execute(
                select(s.partitions.c.next_offset).where(s.partitions.c.topic_id == topic_id).order_by(s.partitions.c.partition)
            )
            return [r.next_offset for r in rows]

    # -- Kafka agents ----------------------------------------------------------------------------------

    def register_agent(self, host: str, port: int, rack: str | None, node_id: int | None, now_ms: int, alive_ms: int) -> int:
        """Register an agent serving clients at host:port; returns its node id. Without `node_id`, the agent keeps
        the id registered for its address before (a restart), or takes the lowest id no agent holds. An id held by
        an agent of another address heard from within `alive_ms` is refused: two live agents never share one."""
        ag = s.agents.c
        with self._writing() as connection:
            rows = connection.execute(select(s.agents).with_for_update()).all()
            if node_id is None:
                same = [row.node_id for row in rows if (row.host, row.port) == (host, port)]
                taken = {row.node_id for row in rows}
                node_id = same[0] if same else next(n for n in range(len(taken) + 1) if n not in taken)
            holder = next((row for row in rows if row.node_id == node_id), None)
            if holder is not None and (holder.host, holder.port) != (host, port) and now_ms - holder.heartbeat_ms < alive_ms:
                raise LogcompactError(
                    f"node id {node_id} is held by the live agent at {holder.host}:{holder.port} (heard from "
                    f"{now_ms - holder.heartbeat_ms} ms ago); pass another --node-id, or none to take a free one"
                )
            connection.execute(delete(s.agents).where(ag.node_id == node_id))
            connection.execute(insert(s.agents).values(
                node_id=node_id, host=host, port=port, rack=rack, started_ms=now_ms, heartbeat_ms=now_ms
            ))
        return node_id

    def agent_heartbeat(self, node_id: int, host: str, port: int, now_ms: int, alive_ms: int) -> list[AgentRecord]:
        """Record that agent `node_id` at host:port is alive; returns the agents heard from within `alive_ms`, by
        node id. An agent whose row is gone (deregistered, or its id taken by another after it fell silent) is
        CommitConflictError."""
        ag = s.agents.c
        with self._writing() as connection:
            mine = (ag.node_id == node_id, ag.host == host, ag.port == port)
            if not connection.execute(update(s.agents).where(*mine).values(heartbeat_ms=now_ms)).rowcount:
                raise CommitConflictError(
                    f"agent node id {node_id} at {host}:{port} is no longer registered in the catalog (expected its row, "
                    "found none: another agent took the id after this one fell silent); restart this agent"
                )
            return _live_agents(connection, now_ms, alive_ms)

    def live_agents(self, now_ms: int, alive_ms: int) -> list[AgentRecord]:
        """The agents heard from within `alive_ms`, by node id."""
        with self._reading() as connection:
            return _live_agents(connection, now_ms, alive_ms)

    def deregister_agent(self, node_id: int) -> None:
        """An agent stopping: clients are no longer sent to it."""
        with self._writing() as connection:
            connection.execute(delete(s.agents).where(s.agents.c.node_id == node_id))

    # -- appends ---------------------------------------------------------------------------------------

    def append_files(
        self, new_files: Sequence[NewFile], now_ms: int, sequenced: Sequence[Sequence[PlacedBatch]] = ()
    ) -> tuple[int, list[list[int]]]:
        """Add freshly ingested files, giving each section the next offsets of its partition.

        `sequenced`, one list per file: its idempotent producers' batches, recorded with their first offsets in this
        transaction (`producers.record`); one that does not follow the state its agent assumed refuses the whole
        append with CommitConflictError. Returns the version created and the first offset assigned to each section
        of each file.
        """
        with self._writing() as connection:
            # Locks in one order for every writer: topic rows, partition rows, then the version row, taken last so
            # appends to other partitions, and compactions, run beside this one until its final statements.
            topic_rows = self._topic_rows(connection, {info.topic for new in new_files for info in new.sections}, lock=_SHARED)
            file_ids = _take_file_ids(connection, len(new_files))  # before the partitions', which name their newest file
            counts: Counter[tuple[int, int]] = Counter()  # offsets to hand out, by (topic id, partition)
            newest: dict[tuple[int, int], int] = {}  # the newest of these files holding each partition
            for new, file_id in zip(new_files, file_ids, strict=True):
                for info in new.sections:
                    topic_id, partitions = topic_rows[info.topic]
                    if not 0 <= info.partition < partitions:
                        raise InvalidRecordError(f"topic {info.topic!r} has partitions 0 to {partitions - 1}, not {info.partition}")
                    counts[(topic_id, info.partition)] += info.last_delta + 1
                    newest[(topic_id, info.partition)] = file_id
            next_offsets = appends.advance_partitions(connection, counts, newest)
            if len(next_offsets) < len(counts):
                raise _unadvanced_partition(connection, min(set(counts) - set(next_offsets)), topic_rows)
            assigned, placed_files = [], []
            for new in new_files:
                placed = []
                for info in new.sections:
                    slot = (topic_rows[info.topic][0], info.partition)
                    first = next_offsets[slot]
                    next_offsets[slot] = first + info.last_delta + 1
                    placed.append(CatalogSection(info, first))
                placed_files.append(DataFile(new.key, new.level, new.size, new.created_ms, tuple(placed)))
                assigned.append([section.first_offset for section in placed])
            if any(sequenced):
                firsts = [{(sec.topic, sec.partition): sec.first_offset for sec in data_file.sections} for data_file in placed_files]
                producers.record(connection, [
                    (topic_rows[b.topic][0], b.partition, firsts[index][(b.topic, b.partition)] + b.offset_delta, b.batch)
                    for index, batches in enumerate(sequenced) for b in batches
                ], now_ms)
            if now_ms - self._producers_expired_ms >= PRODUCER_EXPIRY_EVERY_MS:
                producers.expire(connection, now_ms - producers.EXPIRATION_MS)
                self._producers_expired_ms = now_ms
            # The sections first, under file ids taken ahead; the file rows, which make them visible, once the version
            # is known: inserted with it, never updated to it (an update leaves PostgreSQL a dead row version a file).
            adding = self._insert_sections(connection, placed_files, topic_rows, file_ids)
            version = self._next_version(connection, "append", now_ms)
            self._insert_file_rows(connection, placed_files, file_ids, version)
            summaries.settle(connection, set(), adding, version)  # files above L0: the simulator's
        return version, assigned

    # -- idempotent producers ------------------------------------------------------------------------------

    def allocate_producer_id(self, now_ms: int) -> int:
        """A producer id never handed out before (InitProducerId), at epoch 0."""
        with self._writing() as connection:
            return producers.allocate(connection, now_ms)

    def producer_state(self, producer_id: int, topic: str, partition: int) -> PartitionState | None:
        """A producer's state on a partition as committed: None when it has none there; UnknownProducerError for a
        producer id never handed out, or forgotten after EXPIRATION_MS idle."""
        with self._reading() as connection:
            return producers.load(connection, producer_id, self._topic_id(connection, topic), partition)

    # -- compactions -----------------------------------------------------------------------------------

    def replace_files(
        self,
        removed: Sequence[str],
        added: Sequence[DataFile],
        now_ms: int,
        *,
        plan_id: str | None = None,
        expected_version: int | None = None,
        leased: bool = False,
        kept: Collection[TopicPartition] = (),
        marks: Sequence[SetAside] = (),
    ) -> CommitResult:
        """Swap live files for others holding offsets already assigned (a compaction's outputs).

        With a `plan_id`, a plan committed before is a no-op (`committed` False), and with `leased` each input
        must still be leased to the plan. An input no longer live is a CommitConflictError; nothing changes.
        The sections of `kept` partitions (set aside: not compacted) stay live in their files, which stay live
        with them; `marks` are the partitions this commit marks uncleanable, and the other partitions of the
        inputs lose any mark they had.
        """
        operation = f"compact {plan_id}" if plan_id else "replace files"
        try:
            with self._writing() as connection:
                expiring = self._lock_expiring_partitions(connection, removed)
                version = self._next_version(connection, operation, now_ms)
                if plan_id is not None:
                    done = connection.execute(
                        select(s.committed_plans.c.version).where(s.committed_plans.c.plan_id == plan_id)
                    ).scalar_one_or_none()
                    if done is not None:
                        raise _AlreadyCommitted(done)
                removed = list(removed)
                live = self._live_file_ids(connection, removed)
                missing = [key for key in removed if key not in live]
                if missing:
                    as_of = f"as in manifest version {expected_version}" if expected_version else "live"
                    raise CommitConflictError(
                        f"expected {len(removed)} input files {as_of}, found {len(missing)} of them gone in version "
                        f"{version - 1} (first: {missing[0]}); re-plan and retry"
                    )
                self._refuse_deleted_topics(connection, list(live.values()), added, expected_version, operation)
                if leased:
                    held = set(connection.execute(
                        select(s.leases.c.file_id).where(
                            self._one_of(s.leases.c.file_id, live.values()), s.leases.c.plan_id == plan_id, s.leases.c.expires_ms > now_ms
                        )
                    ).scalars())
                    lost = [key for key in removed if live[key] not in held]
                    if lost:
                        raise CommitConflictError(
                            f"plan {plan_id}: its lease on {lost[0]} (and {len(lost) - 1} more) expired or was released "
                            "before the commit; its outputs may be collected, plan again"
                        )
                kept_slots = {(self._topic_id(connection, topic), partition) for topic, partition in kept}
                removing = summaries.touched_by_removal(connection, list(live.values()), kept_slots)
                keeping = self._retire_sections(connection, live.values(), kept_slots, version) if kept else set()
                connection.execute(
                    update(s.files)
                    .where(self._one_of(s.files.c.file_id, [i for i in live.values() if i not in keeping]))
                    .values(removed_version=version, removed_ms=now_ms)
                )
                connection.execute(delete(s.leases).where(self._one_of(s.leases.c.file_id, live.values())))
                self._update_marks(connection, live.values(), kept, marks, plan_id or operation, now_ms)
                if plan_id is not None:
                    connection.execute(delete(s.leases).where(s.leases.c.plan_id == plan_id))
                    connection.execute(delete(s.plan_seals).where(s.plan_seals.c.plan_id == plan_id))
                    connection.execute(insert(s.committed_plans).values(plan_id=plan_id, version=version, committed_ms=now_ms))
                topic_rows = self._topic_rows(connection, {sec.topic for f in added for sec in f.sections})
                file_ids = _take_file_ids(connection, len(added))
                adding = self._insert_sections(connection, added, topic_rows, file_ids)
                self._insert_file_rows(connection, added, file_ids, version)
                summaries.settle(connection, removing, adding, version)
                summaries.settle_emptied(connection, list(live.values()), sum(f.record_count for f in added), kept_slots, version)
                self._raise_log_starts(connection, expiring)
        except _AlreadyCommitted as done:
            return CommitResult(done.version, False)
        except IntegrityError as exc:
            raise CommitConflictError(f"{operation}: an output file is already in the catalog ({_first_line(exc)}); plan again") from None
        return CommitResult(version, True)

    def _lock_expiring_partitions(self, connection: Connection, removed: Sequence[str]) -> list[tuple[int, int]]:
        """The partitions whose log start removing the files `removed` may raise (`_raise_log_starts`): those of
        topics with time retention holding a section in them. Their rows are locked here, in order and before the
        version row, as appends lock them (`append_files`): the other order could deadlock with an append."""
        if not removed:
            return []
        topics = s.topics.c
        rows = connection.execute(select(topics.topic_id, topics.name, topics.partitions, topics.config, topics.created_ms)
                                  .where(topics.deleted_version.is_(None))).all()
        # Read in this transaction: retention.ms may have been altered since any cache of it.
        expiring = [row.topic_id for row in rows if _topic_of_row(row).config.time_retention]
        if not expiring:
            return []
        sec, fil, part = s.sections.c, s.files.c, s.partitions.c
        touched = (
            select(sec.topic_id, sec.partition).distinct()
            .join(s.files, fil.file_id == sec.file_id)
            .where(self._one_of(fil.key, removed), self._one_of(sec.topic_id, expiring))
        )
        return [
            (row.topic_id, row.partition) for row in connection.execute(
                select(part.topic_id, part.partition).where(tuple_(part.topic_id, part.partition).in_(touched))
                .order_by(part.topic_id, part.partition).with_for_update()
            )
        ]

    def _raise_log_starts(self, connection: Connection, expiring: Sequence[tuple[int, int]]) -> None:
        """Retention moves a log's start, compaction never does (Kafka's rule): for the partitions of topics with
        time retention whose sections this commit removed (`expiring`, locked by `_lock_expiring_partitions`), the
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

    def _retire_sections(self, connection: Connection, file_ids: Iterable[int], kept_ids: Collection[tuple[int, int]], version: int) -> set[int]:
        """Retire the live sections of `file_ids` except those of `kept_ids` partitions (topic id, partition); returns
        the files that keep a section (they stay live)."""
        sec = s.sections.c
        rows = connection.execute(
            select(sec.file_id, sec.topic_id, sec.partition).where(
                self._one_of(sec.file_id, file_ids), sec.removed_version.is_(None),
                sec.topic_id.in_(sorted({t for t, _ in kept_ids})), sec.partition.in_(sorted({p for _, p in kept_ids})),
            )
        ).all()
        keeping = {file_id for file_id, topic_id, partition in rows if (topic_id, partition) in kept_ids}
        if keeping:
            retired = [
                (version, file_id, topic_id, partition)
                for file_id, topic_id, partition in connection.execute(
                    select(sec.file_id, sec.topic_id, sec.partition).where(self._one_of(sec.file_id, keeping), sec.removed_version.is_(None))
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

    def _update_marks(
        self, connection: Connection, file_ids: Iterable[int], kept: Collection[TopicPartition], marks: Sequence[SetAside],
        plan_id: str, now_ms: int,
    ) -> None:
        """Mark the partitions set aside by this commit; partitions it compacted lose their old marks."""
        marked = connection.execute(select(s.uncleanable.c.topic_id, s.uncleanable.c.partition)).all()
        if marked:
            # The marked partitions with a section among the inputs, not kept: this commit compacted them.
            sec = s.sections.c
            names = self._topic_names(connection)
            compacted = connection.execute(
                select(sec.topic_id, sec.partition).distinct().where(
                    self._one_of(sec.file_id, file_ids),
                    sec.topic_id.in_(sorted({t for t, _ in marked})), sec.partition.in_(sorted({p for _, p in marked})),
                )
            ).all()
            done = {(names[t], p) for t, p in compacted if (t, p) in set(marked)} - set(kept)
            self._clear_marks(connection, sorted(done))
        self._mark_uncleanable(connection, marks, plan_id, now_ms)

    def is_committed(self, plan_id: str) -> bool:
        with self._reading() as connection:
            found = connection.execute(select(s.committed_plans.c.plan_id).where(s.committed_plans.c.plan_id == plan_id))
            return found.first() is not None

    # -- uncleanable partitions ---------------------------------------------------------------------------

    def uncleanable(self) -> list[Uncleanable]:
        """Every partition marked uncleanable, in (topic, partition) order, with its live sections' bytes."""
        unc, sec, files = s.uncleanable.c, s.sections.c, s.files.c
        with self._reading() as connection:
            names = self._topic_names(connection)
            rows = connection.execute(
                select(unc.topic_id, unc.partition, unc.reason, unc.file_key, unc.file_stamp, unc.marked_ms, unc.retry_ms, unc.failures,
                       unc.plan_id)
            ).all()
            live_bytes: Counter[tuple[int, int]] = Counter()
            if rows:
                sizes = (
                    select(sec.topic_id, sec.partition, func.sum(sec.uncompressed_bytes))
                    .join(s.files, files.file_id == sec.file_id)
                    .where(sec.topic_id.in_(sorted({r.topic_id for r in rows})), sec.partition.in_(sorted({r.partition for r in rows})),
                           files.removed_version.is_(None), sec.removed_version.is_(None))
                    .group_by(sec.topic_id, sec.partition)
                )
                for query in s.by_partition(sizes):
                    for topic_id, partition, size in connection.execute(query).all():
                        live_bytes[(topic_id, partition)] += int(size)  # PostgreSQL sums a BIGINT column as NUMERIC
        return sorted(Uncleanable._make((names[r[0]], *r[1:], live_bytes[(r.topic_id, r.partition)])) for r in rows)

    def held_uncleanable(self, now_ms: int) -> frozenset[TopicPartition]:
        """Uncleanable partitions planners leave out now: before their retry time, unless the damaged file is no
        longer live or its object changed since the mark (restored from a copy: another size or modification time)."""
        held = set()
        live = {}
        marks = self.uncleanable()
        if marks:
            with self._reading() as connection:
                live = self._live_file_ids(connection, sorted({m.file_key for m in marks}))
        for mark in marks:
            if mark.retry_ms <= now_ms:
                continue
            if not mark.file_key or (mark.file_key in live and self._file_stamp(mark.file_key) == mark.file_stamp):
                held.add((mark.topic, mark.partition))  # (damage no file was named for waits out its backoff)
        return frozenset(held)

    def set_aside(self, marks: Sequence[SetAside], plan_id: str, now_ms: int) -> None:
        """Mark partitions uncleanable outside a commit: those a plan `plan_id` would have damaged, found before it
        leased anything (rows hiding records), which planners then leave out (`planning_snapshot`)."""
        if marks:
            with self._writing() as connection:
                self._mark_uncleanable(connection, marks, plan_id, now_ms)

    def _file_stamp(self, key: str) -> str:
        found = self.store.stat(key)
        return "gone" if found is None else f"{found.size}@{found.modified_ms}"

    def clear_uncleanable(self, partitions: Iterable[TopicPartition] | None = None) -> list[TopicPartition]:
        """Remove the uncleanable marks of `partitions` (None: all); returns those that were marked."""
        marked = [(m.topic, m.partition) for m in self.uncleanable()]
        chosen = marked if partitions is None else [tp for tp in marked if tp in set(partitions)]
        if chosen:
            with self._writing() as connection:
                self._clear_marks(connection, chosen)
        return chosen

    def _mark_uncleanable(self, connection: Connection, marks: Sequence[SetAside], plan_id: str, now_ms: int) -> None:
        """Mark partitions uncleanable, or mark them again: the backoff doubles with each failure in a row."""
        unc = s.uncleanable.c
        stamps = {key: self._file_stamp(key) for key in {mark.file_key for mark in marks} if key}
        for mark in marks:
            topic_id = self._topic_id(connection, mark.topic)
            where = (unc.topic_id == topic_id, unc.partition == mark.partition)
            failures = (connection.execute(select(unc.failures).where(*where)).scalar_one_or_none() or 0) + 1
            backoff = min(UNCLEANABLE_MAX_BACKOFF_MS, UNCLEANABLE_BACKOFF_MS << min(failures - 1, 20))
            connection.execute(delete(s.uncleanable).where(*where))
            connection.execute(insert(s.uncleanable).values(
                topic_id=topic_id, partition=mark.partition, reason=mark.reason, file_key=mark.file_key,
                file_stamp=stamps.get(mark.file_key, ""), marked_ms=now_ms,
                retry_ms=now_ms + backoff, failures=failures, plan_id=plan_id,
            ))

    def _clear_marks(self, connection: Connection, partitions: Iterable[TopicPartition]) -> None:
        """Partitions a commit compacted are cleanable again."""
        for topic, partition in partitions:
            connection.execute(delete(s.uncleanable).where(
                s.uncleanable.c.topic_id == self._topic_id(connection, topic), s.uncleanable.c.partition == partition
            ))

    # -- leases ----------------------------------------------------------------------------------------

    def lease(self, plan_id: str, keys: Iterable[str], expires_ms: int, now_ms: int, seal: str | None = None) -> None:
        """Lease live files to a plan, all or none; a file gone, or leased to another live plan, is a conflict.
        `seal`: the SHA-256 of the plan's stored documents, which its commit checks (`plan_seal`)."""
        keys = list(keys)
        with self._writing() as connection:
            self._lock(connection)
            live = self._live_file_ids(connection, keys)
            gone = [key for key in keys if key not in live]
            if gone:
                raise CommitConflictError(f"plan {plan_id}: file {gone[0]} is no longer live; re-plan")
            ids = [live[key] for key in keys]
            leased = self._one_of(s.leases.c.file_id, ids)
            holder = connection.execute(
                select(s.leases.c.file_id, s.leases.c.plan_id, s.leases.c.expires_ms).where(
                    leased, s.leases.c.plan_id != plan_id, s.leases.c.expires_ms > now_ms
                )
            ).first()
            if holder is not None:
                key = next(k for k, i in live.items() if i == holder.file_id)
                raise CommitConflictError(
                    f"plan {plan_id}: file {key} is leased to plan {holder.plan_id} until {holder.expires_ms}; "
                    "re-plan after it commits or expires"
                )
            connection.execute(delete(s.leases).where(leased))  # expired leases, or this plan's own
            connection.execute(
                insert(s.leases), [{"file_id": i, "plan_id": plan_id, "expires_ms": expires_ms} for i in ids]
            )
            if seal is not None:
                connection.execute(delete(s.plan_seals).where(s.plan_seals.c.plan_id == plan_id))
                connection.execute(insert(s.plan_seals).values(plan_id=plan_id, sha256=seal))
            _drop_unleased_seals(connection)  # of the expired plans this one took files from

    def plan_seal(self, plan_id: str) -> str | None:
        """The SHA-256 its stored documents had when the plan was leased; None for a plan never sealed, or whose
        lease is over."""
        with self._reading() as connection:
            return connection.execute(select(s.plan_seals.c.sha256).where(s.plan_seals.c.plan_id == plan_id)).scalar_one_or_none()

    def release(self, plan_id: str) -> None:
        with self._writing() as connection:
            connection.execute(delete(s.leases).where(s.leases.c.plan_id == plan_id))
            connection.execute(delete(s.plan_seals).where(s.plan_seals.c.plan_id == plan_id))

    def release_expired_leases(self, now_ms: int) -> list[str]:
        """Drop expired leases; the plans they named."""
        with self._writing() as connection:
            expired = connection.execute(
                select(s.leases.c.plan_id).where(s.leases.c.expires_ms <= now_ms).distinct()
            ).scalars().all()
            if expired:
                connection.execute(delete(s.leases).where(s.leases.c.expires_ms <= now_ms))
            _drop_unleased_seals(connection)
        return sorted(expired)

    def leased_plans(self, now_ms: int) -> set[str]:
        """Plans holding a lease that has not expired."""
        with self._reading() as connection:
            return set(connection.execute(select(s.leases.c.plan_id).where(s.leases.c.expires_ms > now_ms).distinct()).scalars())

    # -- garbage -------------------------------------------------------------------------------------

    def collectable_files(self, before_version: int, removed_before_ms: int) -> list[str]:
        """Files removed before `before_version` and before `removed_before_ms` by a commit that records removing
        them (`schema.removal_recorded`): no kept version holds them."""
        files = s.files.c
        with self._reading() as connection:
            return list(connection.execute(
                select(files.key).where(
                    files.removed_version < before_version, files.removed_ms < removed_before_ms, s.removal_recorded(files.removed_version)
                ).order_by(files.file_id)
            ).scalars())

    def unrecorded_removals(self, before_version: int, removed_before_ms: int) -> list[str]:
        """The files rows `collectable_files` would take but for their removal: marked removed at a version no
        compaction nor topic deletion committed (a damaged row, whose records no other file holds), one line each."""
        files = s.files.c
        with self._reading() as connection:
            rows = connection.execute(
                select(files.key, files.file_id, files.removed_version).where(
                    files.removed_version < before_version, files.removed_ms < removed_before_ms, ~s.removal_recorded(files.removed_version)
                ).order_by(files.file_id)
            ).all()
        return [
            f"files row {key!r} (file_id {file_id}) is marked removed in version {version}, which no compaction or topic "
            "deletion committed" for key, file_id, version in rows
        ]

    def dangling_sections(self, limit: int = 3) -> list[str]:
        """Sections rows whose file has no files row (a damaged catalog: its file's key is lost, and gc would take
        the file's object for an orphan), one line per file id, at most `limit`: one read of every sections row."""
        sec, files = s.sections.c, s.files.c
        with self._reading() as connection:
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

    def forget_files(self, keys: Sequence[str]) -> None:
        """Delete removed files' rows (their objects are gone); a live file is never forgotten. Their entries in the
        partition index are taken off their partitions' counts last, holding the version row as every writer of
        `partition_summaries` does (and in their order): the deletes, which no commit waits on, go first."""
        with self._writing() as connection:
            ids = connection.execute(
                select(s.files.c.file_id).where(self._one_of(s.files.c.key, keys), s.files.c.removed_version.is_not(None))
            ).scalars().all()
            forgotten = summaries.index_entries(connection, ids)
            connection.execute(delete(s.sections).where(self._one_of(s.sections.c.file_id, ids)))
            connection.execute(delete(s.leases).where(self._one_of(s.leases.c.file_id, ids)))
            connection.execute(delete(s.files).where(self._one_of(s.files.c.file_id, ids)))
            if forgotten:
                self._lock(connection)
                summaries.forget(connection, forgotten)

    def known_files(self, keys: Sequence[str]) -> set[str]:
        """Which of `keys` the catalog has a row for, live or removed."""
        with self._reading() as connection:
            return set(connection.execute(select(s.files.c.key).where(self._one_of(s.files.c.key, keys))).scalars())

    def trim_versions(self, before_version: int) -> int:
        """Drop commit-log rows older than `before_version` (readers can no longer pin them); how many."""
        with self._writing() as connection:
            return connection.execute(delete(s.versions).where(s.versions.c.version < before_version)).rowcount

    # -- inside transactions -------------------------------------------------------------------------

    def _lock(self, connection: Connection) -> int:
        """Serialize with every other writer (SQLite's BEGIN IMMEDIATE already has); the newest version."""
        return connection.execute(select(s.catalog_info.c.version).with_for_update()).scalar_one()

    def _next_version(self, connection: Connection, operation: str, now_ms: int) -> int:
        version = connection.execute(
            update(s.catalog_info).values(version=s.catalog_info.c.version + 1).returning(s.catalog_info.c.version)
        ).scalar_one()
        logged = connection.execute(select(func.max(s.versions.c.version))).scalar_one()
        if logged is not None and logged >= version:
            raise _version_behind_log(version - 1, logged)
        connection.info[_COMMITTED] = (version, operation)
        connection.execute(insert(s.versions).values(version=version, commit_id=str(uuid.uuid4()), created_ms=now_ms, operation=operation))
        return version

    def _topics(self, connection: Connection, version: int) -> tuple[dict[str, Topic], dict[str, int]]:
        """The topics of manifest version `version` (created at or before it, not deleted at or before it), as they
        are now (configs and partitions), and their topic ids, by name."""
        topics = s.topics.c
        rows = connection.execute(
            select(s.topics).where(topics.created_version <= version, or_(topics.deleted_version.is_(None), topics.deleted_version > version))
        ).all()
        return {row.name: _topic_of_row(row) for row in rows}, {row.name: row.topic_id for row in rows}

    def _live_topic(self, connection: Connection, name: str) -> Topic:
        row = connection.execute(select(s.topics).where(s.topics.c.name == name, s.topics.c.deleted_version.is_(None))).first()
        if row is None:
            raise _topic_not_found(name)
        return _topic_of_row(row)

    def _topic_names(self, connection: Connection) -> dict[int, str]:
        """Every topic's name by topic id, deleted topics' too (rows that name them may outlive them for a while)."""
        return {row.topic_id: row.name for row in connection.execute(select(s.topics.c.topic_id, s.topics.c.name))}

    def _topic_id(self, connection: Connection, name: str) -> int:
        return self._topic_rows(connection, {name})[name][0]

    def _topic_rows(self, connection: Connection, names: set[str], lock: str | None = None) -> dict[str, tuple[int, int]]:
        """(topic id, partitions) of each named live topic, read in the caller's transaction; an unknown one is
        TopicNotFoundError. Whether each is compacted is left in the connection's info for `_insert_file_rows` of the
        same transaction. With `lock` (_SHARED or _EXCLUSIVE), the rows are locked until commit, in topic id order:
        an append holds its topics shared so that no topic it writes is deleted, altered or grown under it."""
        if not names:
            return {}
        topics = s.topics.c
        query = (
            select(topics.name, topics.topic_id, topics.partitions, topics.config, topics.created_ms)
            .where(self._one_of(topics.name, sorted(names)), topics.deleted_version.is_(None))
        )
        if lock is not None:
            query = query.order_by(topics.topic_id).with_for_update(read=lock == _SHARED)
        rows = connection.execute(query).all()
        found = {row.name: (row.topic_id, row.partitions) for row in rows}
        for name in sorted(names - found.keys()):
            raise _topic_not_found(name)
        compacted = connection.info.setdefault(_COMPACTED, {})
        compacted.update({row.name: _topic_of_row(row).config.compacted for row in rows})
        return found

    def _refuse_deleted_topics(
        self, connection: Connection, file_ids: Collection[int], added: Sequence[DataFile], expected_version: int | None, operation: str
    ) -> None:
        """A commit is refused when its inputs hold a section of a topic deleted since its plan read them (after
        `expected_version`, when given) and its outputs name that topic: they would bring the deleted records back,
        under a topic made since with the same name, or a deleted topic id. A plan made after the deletion never
        names it (the retired sections are not live), and one whose outputs lost every record of it changes nothing."""
        named = {section.topic for data_file in added for section in data_file.sections}
        if not named or not file_ids:
            return
        sec, topics = s.sections.c, s.topics.c
        # The deleted topics of those names first (a few rows, mostly none), then the inputs' sections of them only.
        candidates = select(topics.topic_id).where(topics.deleted_version.is_not(None), self._one_of(topics.name, sorted(named)))
        if expected_version is not None:
            candidates = candidates.where(topics.deleted_version > expected_version)
        ids = connection.execute(candidates).scalars().all()
        if not ids:
            return
        deleted = connection.execute(
            select(topics.name, topics.deleted_version).join(s.sections, sec.topic_id == topics.topic_id)
            .where(self._one_of(topics.topic_id, ids), self._one_of(sec.file_id, file_ids)).limit(1)
        ).first()
        if deleted is not None:
            raise CommitConflictError(
                f"{operation}: topic {deleted.name!r} was deleted in version {deleted.deleted_version}, after the plan "
                "read its files; plan again"
            )

    def _live_file_ids(self, connection: Connection, keys: Sequence[str]) -> dict[str, int]:
        rows = connection.execute(
            select(s.files.c.key, s.files.c.file_id).where(self._one_of(s.files.c.key, keys), s.files.c.removed_version.is_(None))
        )
        return {r.key: r.file_id for r in rows}

    def _one_of(self, column, values: Iterable) -> ColumnElement[bool]:
        return one_of(column, values, self.engine.dialect.name)

    def _insert_sections(
        self, connection: Connection, data_files: Sequence[DataFile], topic_rows: dict[str, tuple[int, int]], ids: Sequence[int]
    ) -> dict[tuple[int, int], summaries.PartitionSummary]:
        """Insert the sections of `data_files`, under the file ids taken for them (`_take_file_ids`), invisible to
        readers until `_insert_file_rows` inserts the files; per partition, the summary of the sections above L0
        (`summaries.settle` takes it)."""
        if not data_files:
            return {}
        rows = _section_rows(ids, data_files, topic_rows)
        appends.insert_sections(connection, rows)
        if not any(data_file.level > 0 for data_file in data_files):
            return {}
        return summaries.of_rows(rows, {i: f.created_ms for i, f in zip(ids, data_files, strict=True)})

    def _insert_file_rows(self, connection: Connection, data_files: Sequence[DataFile], ids: Sequence[int], version: int) -> None:
        """The rows of `data_files`, under the ids their sections were inserted with, added in `version`."""
        if not data_files:
            return
        compacted = connection.info[_COMPACTED]  # set by `_topic_rows` for these topics in this transaction
        file_rows = []
        for file_id, data_file in zip(ids, data_files, strict=True):
            kinds = {compacted[sec.topic] for sec in data_file.sections}
            content = CONTENTS.index("mixed") if len(kinds) > 1 else int(kinds == {True})
            file_rows.append({
                "file_id": file_id, "key": data_file.key, "level": data_file.level, "size": data_file.size,
                "created_ms": data_file.created_ms, "record_count": data_file.record_count, "content": content,
                "added_version": version,
            })
        connection.execute(insert(s.files), file_rows)


def _take_file_ids(connection: Connection, count: int) -> list[int]:
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


def _live_agents(connection: Connection, now_ms: int, alive_ms: int) -> list[AgentRecord]:
    ag = s.agents.c
    rows = connection.execute(select(s.agents).where(ag.heartbeat_ms > now_ms - alive_ms).order_by(ag.node_id))
    return [AgentRecord(r.node_id, r.host, r.port, r.rack, r.started_ms, r.heartbeat_ms) for r in rows]


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
    connection.execute(CreateTable(s.sections))
    columns = ", ".join(s.SECTION_ROW)
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


def _unadvanced_partition(connection: Connection, slot: tuple[int, int], topic_rows: dict[str, tuple[int, int]]) -> CorruptDataError:
    """Why `appends.advance_partitions` left a partition's row alone: missing, or lowered."""
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
    offset, which `appends.advance_partitions` found: read from every section of the partition (an append refused)."""
    sec, files = s.sections.c, s.files.c
    key, file_id, first, last, records = connection.execute(
        select(files.key, sec.file_id, sec.first_offset, sec.last_offset, sec.record_count)
        .select_from(s.sections.outerjoin(s.files, files.file_id == sec.file_id))
        .where(sec.topic_id == slot[0], sec.partition == slot[1], sec.last_offset >= next_offset)
        .order_by(sec.last_offset.desc()).limit(1)
    ).one()
    return key or f"file_id {file_id} (no files row)", first, last, records


def _section_rows(file_ids: Sequence[int], data_files: Sequence[DataFile], topic_rows: dict[str, tuple[int, int]]) -> list[tuple]:
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
    bindings = s.section_crc_bindings(
        topic_ids, info["partition"], info["byte_offset"], info["byte_length"], info["first_row"], firsts, lasts,
        info["record_count"],
    )
    return list(zip(
        owners, topic_ids, info["partition"], info["byte_offset"], info["byte_length"], info["first_row"], firsts.tolist(),
        lasts.tolist(), info["record_count"], info["min_timestamp"], info["max_timestamp"], info["tombstones"],
        info["uncompressed_bytes"], [COMPRESSIONS.index(name) for name in info["compression"]],
        [crc ^ bound for crc, bound in zip(info["crc32"], bindings, strict=True)], info["clean_below_delta"],
        [sketch or None for sketch in info["key_sketch"]], repeat(None), levels, strict=False,  # live (removed_version null), level
    ))


def _topic_not_found(name: str) -> TopicNotFoundError:
    return TopicNotFoundError(f"topic {name!r} does not exist: create it with `logcompact topic create`")


def _drop_unleased_seals(connection: Connection) -> None:
    """A plan's seal goes with its last lease, however that lease ended (released, expired, taken over by another
    plan): a plan is sealed in the transaction that leases its files, so a seal without a lease is a leftover."""
    seals = s.plan_seals.c
    connection.execute(delete(s.plan_seals).where(seals.plan_id.not_in(select(s.leases.c.plan_id))))


def _topic_of_row(row) -> Topic:
    """A topics row as a Topic; a damaged one (config not JSON, or not configs Kafka allows) is CorruptDataError."""
    try:
        config = json.loads(row.config)
        if not isinstance(config, dict):
            raise ValueError(f"a JSON {type(config).__name__}, not an object")
        return Topic.from_dict({"name": row.name, "partitions": row.partitions, "config": config, "created_ms": row.created_ms})
    except (ValueError, TypeError, RecursionError, LogcompactError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptDataError(
            f"catalog row topics {row.name!r} (topic_id {row.topic_id}) is damaged: its config {str(row.config)[:80]!r} "
            f"is not a topic config ({_first_line(exc)}); restore the row from a backup, or write the topic's configs "
            "back as a JSON object of Kafka names"
        ) from None


def _newest_version(connection: Connection) -> int:
    """The newest version, checked against the commit log: a lowered `catalog_info.version` would hide newer files."""
    version, logged = connection.execute(
        select(s.catalog_info.c.version, select(func.max(s.versions.c.version)).scalar_subquery())
    ).one()
    if logged is not None and logged > version:
        raise _version_behind_log(version, logged)
    return version


def _version_behind_log(version: int, logged: int) -> CorruptDataError:
    return CorruptDataError(
        f"catalog row catalog_info.version is {version} but the commit log (versions) holds version {logged}: the row was "
        "lowered, and reading or writing at it would hide newer files and hand out versions again; restore the catalog "
        "from a backup, or set catalog_info.version to the newest logged version; nothing was written"
    )


def _first_line(exc: Exception) -> str:
    return str(exc).splitlines()[0]


class _AlreadyCommitted(Exception):
    def __init__(self, version: int) -> None:
        self.version = version

