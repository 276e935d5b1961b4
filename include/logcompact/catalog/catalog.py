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

`Catalog` holds the transactions: each public method opens one (`_reading`, `_writing`), calls the functions of
the roles it involves, each a module of functions over that connection (`topics`, `files`, `appends`, `producers`,
`transactions`, `compactions`, `cleaning`, `garbage`, `agents`, `groups`, `quotas`, `migrations`, `cluster`; the version row in
`versions`), in the lock order every writer keeps, and commits.
"""

from __future__ import annotations

import functools
import logging
import random
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import NamedTuple, ParamSpec, TypeVar

from sqlalchemy import Connection, func, inspect, select
from sqlalchemy.exc import DatabaseError, IntegrityError

from logcompact.catalog import (
    acls,
    agents,
    appends,
    cleaning,
    cluster,
    compactions,
    credentials,
    files,
    garbage,
    groups,
    holes,
    lags,
    migrations,
    producers,
    quotas,
    summaries,
    topics,
    transactions,
    versions,
)
from logcompact.catalog import schema as s
from logcompact.catalog.acls import AclBinding, AclFilter
from logcompact.catalog.database import WRITE, bound_wal, catalog_errors, catalog_url_for, engine_for, first_line, redact_url, sqlite_path, unavailable_error
from logcompact.catalog.groups import CommittedOffset, Deletion, GroupListed, GroupRow
from logcompact.catalog.identity import CHECK_THEN_ACCEPT, MARKER_KEY, RECORD_APPEND_EVERY_MS, ClusterMarker, create_marker, read_marker, record_version
from logcompact.catalog.lags import PartitionLag
from logcompact.catalog.model import (
    AgentEndpoint,
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
from logcompact.catalog.quotas import QuotaEntity, QuotaFilter
from logcompact.catalog.snapshot import Snapshot
from logcompact.catalog.topics import LogOffsets
from logcompact.catalog.transactions import ActiveProducer, Described, Ended, TransactionRow, TransactionView, TxnError, TxnRefusal
from logcompact.exceptions import (
    CatalogConfigError,
    ClusterMismatchError,
    ClusterNotFoundError,
    CommitConflictError,
    CorruptDataError,
    InvalidRecordError,
    LogcompactError,
    ManifestVersionNotFoundError,
    StaleCatalogError,
    TopicNotFoundError,
    TransactionRolledBackError,
)
from logcompact.store.base import ObjectStore
from logcompact.store.local import LocalStore
from logcompact.topics import Topic
from logcompact.units import wall_clock_ms

# Manifest versions a reader may pin: gc keeps files removed since the oldest of them.
DEFAULT_KEEP_VERSIONS = 100
# How often appends drop idle producers' state (`producers.expire`: one scan of producer_batches).
PRODUCER_EXPIRY_EVERY_MS = 60_000
# Commits as frequent as produce requests, which record their version in the store's marker at most every
# RECORD_APPEND_EVERY_MS (a PUT each would double an agent's PUTs).
FREQUENT_OPERATIONS = frozenset({"append", transactions.END_TRANSACTION})

# A write transaction the database rolled back for a concurrent one (a deadlock victim) is run again, after a random
# pause, up to this many runs in all: PostgreSQL's remedy (`_run_again_if_rolled_back`). Writers take their locks in one
# order, so none should ever be: each run again is logged as a warning, for a broken order to show.
ROLLED_BACK_RUNS = 3
ROLLED_BACK_PAUSE_S = 0.05

log = logging.getLogger(__name__)

_P = ParamSpec("_P")
_R = TypeVar("_R")


def _run_again_if_rolled_back(method: Callable[_P, _R]) -> Callable[_P, _R]:
    """A Catalog write whose transaction the database rolled back (TransactionRolledBackError: nothing was written)
    run again, up to ROLLED_BACK_RUNS runs, rather than failed: an agent's append would refuse a produce request's
    batches, a compactor's commit a plan's work."""

    @functools.wraps(method)
    def run(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        runs = 1
        while True:
            try:
                return method(*args, **kwargs)
            except TransactionRolledBackError as exc:
                if runs == ROLLED_BACK_RUNS:
                    raise
                log.warning("%s: %s; running it again (run %d of %d)", method.__name__, exc, runs + 1, ROLLED_BACK_RUNS)
                time.sleep(random.uniform(0, ROLLED_BACK_PAUSE_S * runs))
                runs += 1

    return run


class Appended(NamedTuple):
    """An append committed: its version, each file's sections' first offsets, and the transactional batches it
    refused (their transactions had ended), each one's error by (file index, batch index in the file's `sequenced`)."""

    version: int
    assigned: list[list[int]]
    refused: dict[tuple[int, int], TxnError]


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
        # altered (cleanup.policy too), so each transaction reads those it names (`topics.rows`).
        self._producers_expired_ms = 0  # when an append of this Catalog last expired idle producers' state
        # (file id, packed sections) of files this Catalog appended in one step, stored by its next one-step append.
        self._packs_due: list[tuple[int, bytes]] = []
        self._packs_lock = threading.Lock()

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
    def _reading_one_state(self) -> Iterator[Connection]:
        """A read of several statements that all see one committed state: PostgreSQL's default (READ COMMITTED) gives
        each statement its own, so this transaction is REPEATABLE READ there; SQLite's read transaction is one already."""
        with self._reading() as connection:
            if connection.dialect.name == "postgresql":
                connection.execution_options(isolation_level="REPEATABLE READ")
            with connection.begin():
                yield connection

    @contextmanager
    def _writing(self) -> Iterator[Connection]:
        """A write transaction; once it committed a version, the store's marker records it (`_record_version`)."""
        self._check_exists()
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            connection.info.pop(versions.COMMITTED, None)
            connection.info.pop(topics.COMPACTED, None)
            connection.execution_options(**{WRITE: True})
            with connection.begin():
                yield connection
            committed = connection.info.pop(versions.COMMITTED, None)
            bound_wal(connection)
        if committed is not None:
            self._record_version(*committed)

    def _record_version(self, version: int, operation: str) -> None:
        """Record a committed version in the store's marker: after every commit but appends and EndTxn's
        (`FREQUENT_OPERATIONS`), which record at most every RECORD_APPEND_EVERY_MS (a PUT per append would double an agent's PUTs). The commit stands whatever
        happens here, so a failure is logged, not raised: the marker only lags."""
        now = wall_clock_ms()
        if operation in FREQUENT_OPERATIONS and now - self._recorded_ms < RECORD_APPEND_EVERY_MS:
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
            raise migrations.schema_error(self._shown_url, row.schema_version)
        if row[3] is not None and row[3] > row.version:  # before the marker may be written at a lowered version
            raise versions.version_behind_log(row.version, row[3])
        self._marker = self._checked_marker(marker, row.cluster_id, row.version)
        self._cluster_id = row.cluster_id

    def upgrade_catalog(self, batch: int = 10_000) -> CatalogUpgrade | None:
        """Bring a catalog of a schema in UPGRADABLE_FROM to SCHEMA_VERSION, in one transaction, step by step:
        from 3, every sections row's crc32, stored raw until then, is bound to its row (`schema.section_crc_binding`),
        `batch` rows at a time in primary-key order; from 4, the Kafka agents' tables are created, partitions get
        their log start offset (0: retention had no record of raising it) and topics their deleted_version; from 5,
        partitions get their assigned_end (where their sections end) and sections their file's level; then
        `sections_by_partition` is built again (schema 9's, over the sections above L0), and on PostgreSQL the sections
        table is made again in schema 9's layout; then `partition_summaries` is filled (from 7, where it lacks l1_bytes,
        made again and filled); then each row counts its partition's entries in `sections_by_partition` (a column
        schema 8 and 9 lack); then each partition names the newest L0 file holding a section of it (`newest_file`,
        which schema 10 lacks), and from 5 on consumer_groups gets its leader and its rows lose the members schema 10
        could not restore; then, from every schema below 12, `offset_holes` records each gap between the live sections
        of a compacted partition (`holes.record_every_gap`), and below 13 the security tables are made, empty; below
        14 sections get `produced_compression`, unknown (-1) in every row; last, from every schema, files get
        `sections_packed`, NULL (their sections rows are read), and the retired sections an index. No manifest version is made,
        the store is not touched. Returns what was done; None
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
                rewritten = migrations.upgrade(connection, found, batch, self._shown_url)
        log.info("catalog %s upgraded from schema %d to %d: %d section rows rewritten", self._shown_url, found,
                 s.SCHEMA_VERSION, rewritten)
        self._cluster_id = None
        return CatalogUpgrade(found, rewritten)

    def _checked_marker(self, marker: ClusterMarker | None, cluster_id: str, version: int) -> ClusterMarker:
        """The store's marker, once it agrees with the catalog; for a store without one, the marker written when the
        catalog agrees with the store's data (`cluster.adopt_store`)."""
        if marker is not None:
            return cluster.checked_marker(self.store, self._shown_url, marker, cluster_id, version)
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            newest = cluster.newest_live_files(connection)
        return cluster.adopt_store(self.store, self._shown_url, cluster_id, version, newest)

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
            cluster.refuse_marked_store(self.store, self._shown_url)  # before a write: SQLite would give an empty file its first page
        with catalog_errors(self.engine.url), self.engine.connect() as connection:
            connection.execution_options(**{WRITE: True})
            with connection.begin():
                cluster_id, version = cluster.create(connection, now_ms)
        create_marker(self.store, cluster_id, version, now_ms)  # a creator that dies first leaves it to `cluster.adopt_store`
        self._cluster_id = None
        return self.cluster_id

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
            return versions.newest_version(connection)

    def snapshot(self, version: int | None = None, set_aside: frozenset[TopicPartition] = frozenset()) -> Snapshot:
        """A reader pinned to a manifest version (default: the newest); planners leave out the sections of
        `set_aside` partitions (`planning_snapshot`)."""
        with self._reading() as connection:
            latest = versions.newest_version(connection)
            if version is not None and version != latest:
                oldest = connection.execute(select(func.min(s.versions.c.version))).scalar_one()
                if not oldest <= version <= latest:
                    raise ManifestVersionNotFoundError(
                        f"manifest version {version} is not in the catalog of {self.store.uri} (kept versions are "
                        f"{oldest} to {latest}); read the latest version instead"
                    )
            pinned = latest if version is None else version
            named, ids = topics.at_version(connection, pinned)
            return Snapshot(self.engine, self.cluster_id, pinned, named, ids, set_aside)

    def planning_snapshot(self, now_ms: int) -> Snapshot:
        """The newest version as planners see it: without the partitions held back as uncleanable."""
        return self.snapshot(set_aside=self.held_uncleanable(now_ms))

    def oldest_kept_version(self) -> int:
        return max(1, self.latest_version() - self.keep_versions + 1)

    def commit_log(self, limit: int = 100) -> list[CommitRecord]:
        """The newest commits, newest first."""
        with self._reading() as connection:
            return versions.commit_log(connection, limit)

    # -- topics --------------------------------------------------------------------------------------

    def create_topic(self, topic: Topic, now_ms: int) -> int:
        """Create a topic with its partitions at offset 0; returns the version created."""
        with self._writing() as connection:
            version = versions.next_version(connection, f"create topic {topic.name}", now_ms)
            topics.create(connection, topic, version)
        return version

    def alter_topic(self, name: str, change: Mapping[str, str | int] | Callable[[Topic], Topic], now_ms: int) -> Topic:
        """Change a topic's configs: Kafka-named `settings`, or a function of the topic as it is now (in the same
        transaction, so concurrent changes are not lost); returns the topic altered."""
        with self._writing() as connection:
            topics.rows(connection, {name}, lock=topics.EXCLUSIVE)  # before the version row: `append_files`' order
            versions.next_version(connection, f"alter topic {name}", now_ms)
            current = topics.live_topic(connection, name)
            altered = change(current) if callable(change) else current.altered(change)
            topics.set_config(connection, name, altered)
        return altered

    def log_offsets(self, topic: str) -> list[LogOffsets]:
        """Each partition's log start offset, next offset (its high watermark) and last stable offset, as of now: one
        row each."""
        with self._reading() as connection:
            return topics.offsets(connection, topic)

    def delete_records(self, name: str, before: Mapping[int, int], now_ms: int) -> dict[int, topics.RecordsDeleted]:
        """Kafka's DeleteRecords: each partition's log start raised to the offset given (-1: its high watermark), the
        records before it gone for readers at once (Fetch, ListOffsets and consumers start there), its sections wholly
        before it retired and the files left without a live section removed, which gc collects. One version when a
        partition was answered (`topics.delete_records` says what is refused). An unknown topic is TopicNotFoundError."""
        with self._writing() as connection:
            topic_id = topics.rows(connection, {name}, lock=topics.SHARED)[name][0]  # before the partitions': `append_files`' order
            found = topics.delete_records(connection, topic_id, topics.live_topic(connection, name), dict(before))
            starts = {partition: deleted.low_watermark for partition, deleted in found.items() if deleted.refusal is None}
            if starts:
                version = versions.next_version(connection, topics.DELETE_RECORDS, now_ms)
                topics.retire_below_log_starts(connection, topic_id, starts, version, now_ms)
        return found

    def add_partitions(self, name: str, count: int, now_ms: int) -> Topic:
        """Grow a topic to `count` partitions, the new ones at offset 0 (Kafka's CreatePartitions); returns it."""
        with self._writing() as connection:
            topic_id = topics.rows(connection, {name}, lock=topics.EXCLUSIVE)[name][0]  # before the version row: `append_files`' order
            versions.next_version(connection, f"add partitions to topic {name}", now_ms)
            current = topics.live_topic(connection, name)
            grown = current.with_partitions(count)
            topics.grow(connection, topic_id, current, count)
        return grown

    def delete_topic(self, name: str, now_ms: int, topic_id: int | None = None) -> int:
        """Delete a topic in one version: its row marked deleted (its name free for a new topic, its topic id never
        given again), its sections retired and the files left with no live section removed (gc collects them), its
        producers' batches, uncleanable marks and consumer groups' committed offsets dropped, and its partitions taken
        out of open transactions (which stay committable) with its aborted ranges and pending transactional offsets.
        Returns the version.

        A compaction planned before that names the topic's files is refused at its commit: its inputs are gone,
        or, for a file shared with other topics, hold a section of a deleted topic (`compactions.refuse_deleted_topics`).
        With `topic_id`, only the topic of that id: one made again under the name since is TopicNotFoundError."""
        with self._writing() as connection:
            found = topics.rows(connection, {name}, lock=topics.EXCLUSIVE)[name][0]
            version = versions.next_version(connection, f"delete topic {name}", now_ms)
            if topic_id is not None and found != topic_id:
                raise TopicNotFoundError(f"topic {name!r} of topic id {topic_id} was deleted already; the topic of that name now is another")
            topics.delete_topic(connection, found, name, version, now_ms)
            transactions.drop_topic(connection, found)
        return version

    def next_offsets(self, topic: str) -> list[int]:
        """Each partition's next offset, as of now."""
        with self._reading() as connection:
            return [offsets.high_watermark for offsets in topics.offsets(connection, topic)]

    # -- Kafka agents ----------------------------------------------------------------------------------

    def register_agent(
        self, host: str, port: int, rack: str | None, node_id: int | None, now_ms: int, alive_ms: int, endpoints: Sequence[AgentEndpoint],
    ) -> int:
        """Register an agent serving clients at host:port (its first listener's address) and each listener at its
        endpoint; returns its node id (`agents.register`: a restart keeps its address's id, two live agents never
        share one)."""
        with self._writing() as connection:
            return agents.register(connection, host, port, rack, node_id, now_ms, alive_ms, endpoints)

    def agent_heartbeat(self, node_id: int, host: str, port: int, now_ms: int, alive_ms: int) -> list[AgentRecord]:
        """Record that agent `node_id` at host:port is alive; returns the agents heard from within `alive_ms`, by
        node id. An agent whose row is gone (deregistered, or its id taken by another after it fell silent) is
        CommitConflictError."""
        with self._writing() as connection:
            agents.heartbeat(connection, node_id, host, port, now_ms)
            return agents.live(connection, now_ms, alive_ms)

    def live_agents(self, now_ms: int, alive_ms: int) -> list[AgentRecord]:
        """The agents heard from within `alive_ms` with their endpoints, by node id."""
        with self._reading() as connection:
            return agents.live(connection, now_ms, alive_ms)

    def deregister_agent(self, node_id: int) -> None:
        """An agent stopping: clients are no longer sent to it."""
        with self._writing() as connection:
            agents.deregister(connection, node_id)

    # -- users' SCRAM credentials: rows outside the manifest, each write a small transaction that creates no version -

    def put_scram_credential(self, user_name: str, credential: credentials.ScramCredential) -> None:
        """Store the user's credential for its mechanism, replacing the one it had."""
        with self._writing() as connection:
            credentials.put(connection, user_name, credential)

    def alter_scram_credentials(
        self, upsertions: Sequence[tuple[str, credentials.ScramCredential]], deletions: Sequence[tuple[str, str]],
    ) -> list[tuple[str, str]]:
        """AlterUserScramCredentials in one transaction: store each (user, credential), remove each (user,
        mechanism); returns the deletions that found no credential (nothing else changes for them)."""
        with self._writing() as connection:
            for user_name, credential in upsertions:
                credentials.put(connection, user_name, credential)
            return [(user_name, mechanism) for user_name, mechanism in deletions if not credentials.remove(connection, user_name, mechanism)]

    def remove_scram_credentials(self, user_name: str, mechanism: str | None = None) -> list[str]:
        """Remove the user's credential for `mechanism` (every one for None); the mechanisms removed."""
        with self._writing() as connection:
            return credentials.remove(connection, user_name, mechanism)

    def scram_credential(self, user_name: str, mechanism: str) -> credentials.ScramCredential | None:
        with self._reading() as connection:
            return credentials.get(connection, user_name, mechanism)

    def password_credential(self, user_name: str) -> credentials.ScramCredential | None:
        """The credential SASL/PLAIN checks a password against: the user's SCRAM-SHA-512 one, else its SCRAM-SHA-256."""
        with self._reading() as connection:
            return credentials.get(connection, user_name, "SCRAM-SHA-512") or credentials.get(connection, user_name, "SCRAM-SHA-256")

    def scram_users(self, user_names: list[str] | None = None) -> list[credentials.UserMechanism]:
        """The credentials of `user_names` (every user's for None), names, mechanisms and iterations only."""
        with self._reading() as connection:
            return credentials.listed(connection, user_names)

    # -- ACLs: rows outside the manifest, each write a small transaction that creates no version ------------------

    def create_acls(self, bindings: Sequence[AclBinding]) -> None:
        """Add the bindings (checked by the caller: `AclBinding.check`); those that exist already stay (idempotent)."""
        with self._writing() as connection:
            acls.create(connection, bindings)

    def delete_acls(self, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
        """Delete the bindings each filter matches, in one transaction; what each filter deleted."""
        with self._writing() as connection:
            return acls.delete_matching(connection, filters)

    def acls(self) -> list[AclBinding]:
        """Every ACL binding."""
        with self._reading() as connection:
            return acls.listed(connection)

    # -- client quotas: rows outside the manifest, each alteration a small transaction that creates no version ------

    def alter_client_quotas(self, alterations: Sequence[tuple[QuotaEntity, Mapping[str, float | None]]]) -> None:
        """Set (a value) or remove (None) quota keys of each entity, all in one transaction. The entities and keys are
        checked by the caller (`quotas.entity_from`, `quotas.check_ops`), as AlterClientQuotas answers each alone."""
        if not alterations:
            return
        with self._writing() as connection:
            for entity, ops in alterations:
                quotas.alter(connection, entity, ops)

    def client_quotas(self, matching: QuotaFilter | None = None) -> dict[QuotaEntity, dict[str, float]]:
        """The quotas of every entity, or of those `matching` (DescribeClientQuotas' filter), by entity."""
        with self._reading() as connection:
            found = quotas.all_quotas(connection)
        return found if matching is None else {entity: values for entity, values in found.items() if matching.matches(entity)}

    # -- consumer groups: rows outside the manifest, each write a small transaction that creates no version ----------

    def commit_offsets(self, group_id: str, offsets: Mapping[tuple[str, int], CommittedOffset]) -> None:
        """Store a group's offsets for these partitions, all or none, replacing what each had."""
        if not offsets:
            return
        with self._writing() as connection:
            groups.commit_offsets(connection, group_id, offsets)

    def committed_offsets(self, group_id: str, topics: Sequence[str] | None = None) -> dict[tuple[str, int], CommittedOffset]:
        """A group's committed offsets, of every topic or of those named."""
        with self._reading() as connection:
            return groups.committed_offsets(connection, group_id, topics)

    def fetch_offsets(
        self, group_id: str, topics: Sequence[str] | None, partitions: Iterable[TopicPartition] | None,
    ) -> tuple[dict[TopicPartition, CommittedOffset], set[TopicPartition]]:
        """OffsetFetch with require_stable: a group's committed offsets (of every topic or of those named) and which of
        `partitions` (None: those committed) have offsets pending in an open transaction, read in one state of the
        catalog: read apart, a transaction committed between the two reads would show the offset it replaced as stable."""
        with self._reading_one_state() as connection:
            committed = groups.committed_offsets(connection, group_id, topics)
            return committed, transactions.unstable_offsets(connection, group_id, committed if partitions is None else partitions)

    def consumer_lags(self, limit: int) -> list[PartitionLag]:
        """At most `limit` committed offsets with their partitions' high watermarks, by group, topic and partition."""
        with self._reading() as connection:
            return lags.consumer_lags(connection, limit)

    def save_group(self, group: GroupRow, loaded: GroupRow | None = None) -> bool:
        """Write the group's row unless another coordinator wrote it since this one took the group (`groups.save_group`:
        `loaded` is the row a coordinator taking the group over loaded it from); returns whether it was written."""
        with self._writing() as connection:
            return groups.save_group(connection, group, loaded)

    def group(self, group_id: str) -> GroupRow | None:
        """A group's row as its coordinator last wrote it; None for a group never written."""
        with self._reading() as connection:
            return groups.group(connection, group_id)

    def groups(self) -> list[GroupListed]:
        """Every group, without its members (which hold their metadata and assignments)."""
        with self._reading() as connection:
            return groups.listed(connection)

    def group_ids(self) -> list[str]:
        """Every group with a row or committed offsets, in order."""
        with self._reading() as connection:
            return groups.group_ids(connection)

    def delete_group(self, group_id: str) -> Deletion:
        """Delete an Empty group's offsets and row (Kafka's DeleteGroups, `groups.delete_group`)."""
        with self._writing() as connection:
            return groups.delete_group(connection, group_id)

    def delete_offsets(self, group_id: str, partitions: Collection[tuple[str, int]]) -> bool:
        """Delete a group's offsets of these partitions (Kafka's OffsetDelete); False for a group that does not exist."""
        with self._writing() as connection:
            return groups.delete_offsets(connection, group_id, partitions)

    def reset_offsets(self, group_id: str, offsets: Mapping[tuple[str, int], CommittedOffset], now_ms: int) -> str | None:
        """Store the offsets of a group without members (`groups.reset_offsets`); else the state that refused them."""
        with self._writing() as connection:
            return groups.reset_offsets(connection, group_id, offsets, now_ms)

    def expire_offsets(self, group_id: str, cutoff_ms: int, subscribed: Callable[[GroupRow], Collection[str] | None]) -> int:
        """Delete the group's offsets past offsets.retention.minutes, and the group once none is left (`groups.expire_offsets`)."""
        with self._writing() as connection:
            return groups.expire_offsets(connection, group_id, cutoff_ms, subscribed)

    # -- appends ---------------------------------------------------------------------------------------

    @_run_again_if_rolled_back
    def append_files(self, new_files: Sequence[NewFile], now_ms: int, sequenced: Sequence[Sequence[PlacedBatch]] = ()) -> Appended:
        """Add freshly ingested files, giving each section the next offsets of its partition.

        `sequenced`, one list per file: its idempotent producers' batches, recorded with their first offsets in this
        transaction (`producers.record`); one that does not follow the state its agent assumed refuses the whole
        append with CommitConflictError. Transactional batches are recorded in their transactions
        (`transactions.record_batches`); one whose transaction ended before this append is refused alone: its
        offsets are recorded as an aborted range, and the append goes on. Returns the version created, the first
        offset assigned to each section of each file, and the refused batches' errors by (file, batch) index.

        On PostgreSQL, L0 files without sequenced batches are appended in one step (`appends.append_in_one_step`),
        their partitions' rows locked only while the database works. The database hands their offsets out, so their
        packed sections (`files.sections_packed`) are stored by this Catalog's next one-step append, in its round trip;
        until then, and for the last files a Catalog appends, planners read their sections rows.
        """
        if (
            self.engine.dialect.name == "postgresql" and new_files and all(new.level == 0 and new.sections for new in new_files)
            and not any(sequenced)
            and now_ms - self._producers_expired_ms < PRODUCER_EXPIRY_EVERY_MS  # expiring idle producers goes the long way
        ):
            sections = appends.section_columns(new_files)  # before the transaction: none of it needs the offsets
            with self._packs_lock:
                due, self._packs_due = self._packs_due, []
            try:
                with self._writing() as connection:
                    topic_rows = topics.rows(connection, set(sections.topics), lock=topics.SHARED)
                    file_ids = files.take_file_ids(connection, len(new_files))
                    placement = appends.place(sections, file_ids, topic_rows)
                    version, firsts = appends.append_in_one_step(connection, new_files, file_ids, sections, placement, now_ms, due)
            except appends.Unplaced:
                self._defer_packs(due)  # rolled back with the append; the long way names the row that refused it
            except BaseException:
                self._defer_packs(due)
                raise
            else:
                self._defer_packs(zip(file_ids, appends.packs(sections, placement, firsts)))
                return Appended(version, appends.first_offsets(placement, firsts, sections.per_file), {})
        return self._append_files_stepwise(new_files, now_ms, sequenced)

    def _defer_packs(self, packs: Iterable[tuple[int, bytes]]) -> None:
        """Leave (file id, packed sections) pairs to this Catalog's next one-step append to store."""
        with self._packs_lock:
            self._packs_due.extend(packs)

    def _append_files_stepwise(self, new_files: Sequence[NewFile], now_ms: int, sequenced: Sequence[Sequence[PlacedBatch]]) -> Appended:
        """`append_files` a statement at a time, reading back the offsets handed out to place the sections, record
        the producers' batches and say which row refused an append."""
        with self._writing() as connection:
            # Locks in one order for every writer: topic rows, partition rows, then the version row, taken last so
            # appends to other partitions, and compactions, run beside this one until its final statements.
            topic_rows = topics.rows(connection, {info.topic for new in new_files for info in new.sections}, lock=topics.SHARED)
            file_ids = files.take_file_ids(connection, len(new_files))  # before the partitions', which name their newest file
            counts: dict[tuple[int, int], int] = {}  # offsets to hand out, by (topic id, partition)
            newest: dict[tuple[int, int], int] = {}  # the newest of these files holding each partition
            slots: list[list[tuple[int, int]]] = []  # each file's sections' (topic id, partition), looked up once
            for new, file_id in zip(new_files, file_ids, strict=True):
                placing = []
                for info in new.sections:
                    topic_id, partitions = topic_rows[info.topic]
                    if not 0 <= info.partition < partitions:
                        raise InvalidRecordError(f"topic {info.topic!r} has partitions 0 to {partitions - 1}, not {info.partition}")
                    slot = (topic_id, info.partition)
                    counts[slot] = counts.get(slot, 0) + info.last_delta + 1
                    newest[slot] = file_id
                    placing.append(slot)
                slots.append(placing)
            next_offsets = appends.advance_partitions(connection, counts, newest)
            if len(next_offsets) < len(counts):
                raise appends.unadvanced_partition(connection, min(set(counts) - set(next_offsets)), topic_rows)
            assigned, placed_files = [], []
            for new, placing in zip(new_files, slots, strict=True):
                first_offsets = []
                for info, slot in zip(new.sections, placing, strict=True):
                    first = next_offsets[slot]
                    next_offsets[slot] = first + info.last_delta + 1
                    first_offsets.append(first)
                placed_files.append(DataFile(new.key, new.level, new.size, new.created_ms, tuple(map(CatalogSection, new.sections, first_offsets)), new.produced_codecs))
                assigned.append(first_offsets)
            refused: dict[tuple[int, int], TxnError] = {}
            aborted: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
            if any(sequenced):
                firsts = [{(sec.topic, sec.partition): sec.first_offset for sec in data_file.sections} for data_file in placed_files]
                batches = [
                    (topic_rows[b.topic][0], b.partition, firsts[index][(b.topic, b.partition)] + b.offset_delta, b.batch)
                    for index, batches in enumerate(sequenced) for b in batches
                ]
                refusals: dict[int, str] = {}
                if any(batch.transactional for _, _, _, batch in batches):  # plain files' appends pay nothing here
                    refused, aborted, refusals = self._record_transactional(connection, sequenced, batches)
                producers.record(connection, batches, now_ms, refusals)
            if now_ms - self._producers_expired_ms >= PRODUCER_EXPIRY_EVERY_MS:
                producers.expire(connection, now_ms - producers.EXPIRATION_MS)
                self._producers_expired_ms = now_ms
            # The sections first, under file ids taken ahead; the file rows, which make them visible, once the version
            # is known: inserted with it, never updated to it (an update leaves PostgreSQL a dead row version a file).
            adding = files.insert_sections(connection, placed_files, topic_rows, file_ids)
            version = versions.next_version(connection, "append", now_ms)
            files.insert_file_rows(connection, placed_files, file_ids, topic_rows, version)
            summaries.settle(connection, set(), adding, version)  # files above L0: the simulator's
            transactions.insert_aborted(connection, aborted, version)
        return Appended(version, assigned, refused)

    @staticmethod
    def _record_transactional(
        connection: Connection, sequenced: Sequence[Sequence[PlacedBatch]], batches: Sequence[tuple[int, int, int, producers.SequencedBatch]]
    ) -> tuple[dict[tuple[int, int], TxnError], dict[tuple[int, int], list[tuple[int, int, int]]], dict[int, str]]:
        """`append_files`' transactional batches recorded in their transactions, after the partition rows and before
        the version row (the writers' lock order): the refused ones' errors by (file, batch) index, their aborted
        ranges, and their refusals by index in `batches`, for `producers.record`."""
        where = [(index, number) for index, placed in enumerate(sequenced) for number in range(len(placed))]
        chosen = [n for n, (_, _, _, batch) in enumerate(batches) if batch.transactional]
        result = transactions.record_batches(connection, [
            ((batches[n][0], batches[n][1]), batches[n][2], batches[n][2] + batches[n][3].record_count - 1, batches[n][3]) for n in chosen
        ])
        errors = {chosen[n]: error for n, error in result.errors.items()}
        return {where[n]: error for n, error in errors.items()}, result.aborted, {n: error.name for n, error in errors.items()}

    # -- idempotent producers ------------------------------------------------------------------------------

    def allocate_producer_id(self, now_ms: int) -> int:
        """A producer id never handed out before (InitProducerId), at epoch 0."""
        with self._writing() as connection:
            return producers.allocate(connection, now_ms)

    def producer_state(self, producer_id: int, topic: str, partition: int) -> PartitionState | None:
        """A producer's state on a partition as committed: None when it has none there; UnknownProducerError for a
        producer id never handed out, or forgotten after EXPIRATION_MS idle."""
        with self._reading() as connection:
            return producers.load(connection, producer_id, topics.topic_id(connection, topic), partition)

    # -- transactions: a transactional id's rows; EndTxn's is a versioned commit, the others create no version ------

    def init_producer(
        self, transactional_id: str, timeout_ms: int, max_timeout_ms: int, expected: tuple[int, int] | None, now_ms: int
    ) -> tuple[int, int]:
        """InitProducerId with a transactional id: the (producer id, epoch) its producer goes on with, its open
        transaction aborted first (`transactions.init_producer`); a refusal is TxnRefusal."""
        with self._writing() as connection:
            return transactions.init_producer(connection, transactional_id, timeout_ms, max_timeout_ms, expected, now_ms)

    def add_to_transaction(self, transactional_id: str, producer_id: int, epoch: int, partitions: Collection[TopicPartition], now_ms: int) -> None:
        """AddPartitionsToTxn: the partitions join the producer's transaction, which begins unless open already. An
        unknown topic is TopicNotFoundError, a partition it does not have InvalidRecordError."""
        with self._writing() as connection:
            topic_rows = topics.rows(connection, {topic for topic, _ in partitions}, lock=topics.SHARED)  # not deleted meanwhile
            for topic, partition in sorted(partitions):
                if not 0 <= partition < topic_rows[topic][1]:
                    raise InvalidRecordError(f"topic {topic!r} has partitions 0 to {topic_rows[topic][1] - 1}, not {partition}")
            slots = {(topic_rows[topic][0], partition) for topic, partition in partitions}
            transactions.add_partitions(connection, transactional_id, producer_id, epoch, slots, now_ms)

    def add_group_to_transaction(self, transactional_id: str, producer_id: int, epoch: int, group_id: str, now_ms: int) -> None:
        """AddOffsetsToTxn: the group's offsets may be committed in the producer's transaction, which begins."""
        with self._writing() as connection:
            transactions.add_group(connection, transactional_id, producer_id, epoch, group_id, now_ms)

    def commit_offsets_in_transaction(
        self, transactional_id: str, producer_id: int, epoch: int, group_id: str, offsets: Mapping[tuple[str, int], CommittedOffset]
    ) -> None:
        """TxnOffsetCommit: the offsets pending in the open transaction, committed with it."""
        with self._writing() as connection:
            transactions.store_offsets(connection, transactional_id, producer_id, epoch, group_id, offsets)

    def end_transaction(self, transactional_id: str, producer_id: int, epoch: int, commit: bool, now_ms: int, *, from_client: bool = True) -> Ended:
        """EndTxn: the transaction committed or aborted in one catalog transaction (`transactions.end`), run again up to
        END_ATTEMPTS times while AddPartitionsToTxn on another agent changes its partitions under it."""
        for attempt in range(transactions.END_ATTEMPTS):
            try:
                with self._writing() as connection:
                    return transactions.end(connection, transactional_id, producer_id, epoch, commit, now_ms, from_client=from_client)
            except TxnRefusal as refused:
                if refused.error != TxnError.CONCURRENT_TRANSACTIONS or attempt == transactions.END_ATTEMPTS - 1:
                    raise
        raise AssertionError("unreachable: the last attempt returns or raises")

    def abort_transaction(self, row: TransactionRow, now_ms: int, bump_epoch: bool) -> Ended | None:
        """Abort the open transaction `row` read if it is still that one (compare-and-set: two agents never both do):
        a timeout, or an admin's abort. None when it changed, nothing done."""
        try:
            with self._writing() as connection:
                return transactions.abort_open(connection, row, now_ms, bump_epoch)
        except TxnRefusal as refused:
            if refused.error != TxnError.CONCURRENT_TRANSACTIONS:
                raise
            return None

    def timed_out_transactions(self, now_ms: int, limit: int = 100) -> list[TransactionRow]:
        """The open transactions past their timeout, oldest first."""
        with self._reading() as connection:
            return transactions.timed_out(connection, now_ms, limit)

    def expire_transactional_ids(self, before_ms: int) -> int:
        """Forget transactional ids with no open transaction unused since `before_ms`; how many."""
        with self._writing() as connection:
            return transactions.expire(connection, before_ms)

    def transaction_view(self, producer_id: int) -> TransactionView | None:
        """A transactional producer's transaction, as the ingest checks its batches against; None for a producer id no
        transactional id holds."""
        with self._reading() as connection:
            return transactions.view_of_producer(connection, producer_id)

    def aborted_ranges(self, spans: Mapping[TopicPartition, tuple[int, int]], version: int | None = None) -> dict[TopicPartition, list[tuple[int, int]]]:
        """The aborted ranges overlapping each partition's offsets [a, b), recorded at or before `version` (None: any);
        a topic deleted or never made is TopicNotFoundError."""
        with self._reading() as connection:
            ids = topics.rows(connection, {topic for topic, _ in spans}) if spans else {}
            by_slot = {(ids[topic][0], partition): (topic, partition) for topic, partition in spans}
            found = transactions.aborted_overlapping(connection, {slot: spans[tp] for slot, tp in by_slot.items()}, version)
        return {by_slot[slot]: ranges for slot, ranges in found.items()}

    def transactions(self, states: Collection[str] = (), producer_ids: Collection[int] = (), min_duration_ms: int = -1, now_ms: int = 0) -> list[TransactionRow]:
        """ListTransactions: rows by transactional id, filtered by state, producer id and, from `min_duration_ms` 0 on,
        open at least that long at `now_ms`."""
        with self._reading() as connection:
            return transactions.listed(connection, states, producer_ids, min_duration_ms, now_ms)

    def describe_transactions(self, transactional_ids: Collection[str]) -> dict[str, tuple[TransactionRow, tuple[TopicPartition, ...]]]:
        """DescribeTransactions: each known id's row and its open transaction's partitions, by topic name."""
        with self._reading() as connection:
            found: dict[str, Described] = transactions.described(connection, transactional_ids)
            names = topics.names(connection, {topic_id for d in found.values() for topic_id, _ in d.partitions})
        return {tid: (d.row, tuple((names[topic_id], partition) for topic_id, partition in d.partitions)) for tid, d in found.items()}

    def active_producers(self, partitions: Collection[TopicPartition]) -> dict[TopicPartition, list[ActiveProducer]]:
        """DescribeProducers: the producers with state on each partition of a live topic (TopicNotFoundError else)."""
        with self._reading() as connection:
            ids = topics.rows(connection, {topic for topic, _ in partitions})
            by_slot = {(ids[topic][0], partition): (topic, partition) for topic, partition in partitions}
            found = transactions.producers_on(connection, set(by_slot))
        return {by_slot[slot]: listed for slot, listed in found.items()}

    def forget_aborted_ranges(self, limit: int = 10_000) -> int:
        """Drop aborted ranges no file the catalog still has a row of may hold an unfiltered record of; how many."""
        with self._writing() as connection:
            return transactions.forget_aborted(connection, limit)

    # -- compactions -----------------------------------------------------------------------------------

    @_run_again_if_rolled_back
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
                removed = list(removed)
                # What does not depend on the version is read, and the outputs' sections are written, before the
                # version row is taken: every append waits for it, and a commit of an L0 to L1 copy held it for 80 ms
                # (p50; at a load of 5 on 2 cores), 50 of them reading and writing what comes first now. The inputs'
                # sections change only by being retired alone (DeleteRecords, a topic's deletion, partitions set
                # aside), or with their file, whose removal the liveness check below finds; a commit that retired any
                # since was given a version past `read_at`, and what was read of them is read again under the row.
                # (The codecs they were produced with are read of every section, retired or not.) The partitions'
                # summary rows are checked the same way (`summaries.settle`).
                read_at = versions.newest_version(connection)
                kept_slots = {(topics.topic_id(connection, topic), partition) for topic, partition in kept}
                read_live = list(files.live_file_ids(connection, removed).values())
                spanned = holes.input_spans(connection, read_live, kept_slots)
                produced = files.produced_codecs(connection, read_live)
                topic_rows = topics.rows(connection, {sec.topic for f in added for sec in f.sections})
                file_ids = files.take_file_ids(connection, len(added))
                adding = files.insert_sections(connection, added, topic_rows, file_ids, produced)
                removing = summaries.touched_by_removal(connection, read_live, kept_slots)
                summed: summaries.Added | None = summaries.added_up(connection, removing, adding, read_at)
                expiring = compactions.lock_expiring_partitions(connection, removed)
                version = versions.next_version(connection, operation, now_ms)
                if plan_id is not None:
                    done = compactions.committed_version(connection, plan_id)
                    if done is not None:
                        raise _AlreadyCommitted(done)
                live = files.live_file_ids(connection, removed)
                missing = [key for key in removed if key not in live]
                if missing:
                    as_of = f"as in manifest version {expected_version}" if expected_version else "live"
                    raise CommitConflictError(
                        f"expected {len(removed)} input files {as_of}, found {len(missing)} of them gone in version "
                        f"{version - 1} (first: {missing[0]}); re-plan and retry"
                    )
                compactions.refuse_deleted_topics(connection, list(live.values()), added, expected_version, operation)
                compactions.refuse_records_deleted(connection, list(live.values()), added, expected_version, operation)
                if leased:
                    lost = cleaning.lost_leases(connection, plan_id, live, removed, now_ms)
                    if lost:
                        raise CommitConflictError(
                            f"plan {plan_id}: its lease on {lost[0]} (and {len(lost) - 1} more) expired or was released "
                            "before the commit; its outputs may be collected, plan again"
                        )
                if compactions.sections_retired_since(connection, list(live.values()), read_at):
                    spanned = holes.input_spans(connection, list(live.values()), kept_slots)
                    removing = summaries.touched_by_removal(connection, list(live.values()), kept_slots)
                    summed = None
                keeping = compactions.retire_sections(connection, live.values(), kept_slots, version) if kept else set()
                compactions.remove_files(connection, [i for i in live.values() if i not in keeping], version, now_ms)
                cleaning.release_files(connection, live.values())
                cleaning.update_marks(connection, live.values(), kept, marks, self._file_stamps(marks), plan_id or operation, now_ms)
                if plan_id is not None:
                    cleaning.release(connection, plan_id)
                    compactions.record_committed(connection, plan_id, version, now_ms)
                # A plan's outputs are filtered of the ranges aborted by its manifest version (`forget_aborted`).
                files.insert_file_rows(connection, added, file_ids, topic_rows, version, expected_version if plan_id is not None else None)
                holes.record(connection, spanned, _spans(added, topic_rows), version)
                summaries.settle(connection, removing, adding, version, summed)
                summaries.settle_emptied(connection, list(live.values()), sum(f.record_count for f in added), kept_slots, version)
                compactions.raise_log_starts(connection, expiring)
        except _AlreadyCommitted as done:
            return CommitResult(done.version, False)
        except IntegrityError as exc:
            raise CommitConflictError(f"{operation}: an output file is already in the catalog ({first_line(exc)}); plan again") from None
        return CommitResult(version, True)

    def is_committed(self, plan_id: str) -> bool:
        with self._reading() as connection:
            return compactions.is_committed(connection, plan_id)

    # -- uncleanable partitions ---------------------------------------------------------------------------

    def uncleanable(self) -> list[Uncleanable]:
        """Every partition marked uncleanable, in (topic, partition) order, with its live sections' bytes."""
        with self._reading() as connection:
            return cleaning.uncleanable(connection)

    def held_uncleanable(self, now_ms: int) -> frozenset[TopicPartition]:
        """Uncleanable partitions planners leave out now: before their retry time, unless the damaged file is no
        longer live or its object changed since the mark (restored from a copy: another size or modification time)."""
        held = set()
        live = {}
        marks = self.uncleanable()
        if marks:
            with self._reading() as connection:
                live = files.live_file_ids(connection, sorted({m.file_key for m in marks}))
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
            stamps = self._file_stamps(marks)
            with self._writing() as connection:
                cleaning.mark_uncleanable(connection, marks, stamps, plan_id, now_ms)

    def _file_stamp(self, key: str) -> str:
        found = self.store.stat(key)
        return "gone" if found is None else f"{found.size}@{found.modified_ms}"

    def _file_stamps(self, marks: Sequence[SetAside]) -> dict[str, str]:
        """The stamps of the files `marks` name, which a mark keeps: a file changed since is cleaned again."""
        return {key: self._file_stamp(key) for key in {mark.file_key for mark in marks} if key}

    def clear_uncleanable(self, partitions: Iterable[TopicPartition] | None = None) -> list[TopicPartition]:
        """Remove the uncleanable marks of `partitions` (None: all); returns those that were marked."""
        marked = [(m.topic, m.partition) for m in self.uncleanable()]
        chosen = marked if partitions is None else [tp for tp in marked if tp in set(partitions)]
        if chosen:
            with self._writing() as connection:
                cleaning.clear_marks(connection, chosen)
        return chosen

    # -- leases ----------------------------------------------------------------------------------------

    def lease(self, plan_id: str, keys: Iterable[str], expires_ms: int, now_ms: int, seal: str | None = None) -> None:
        """Lease live files to a plan, all or none; a file gone, or leased to another live plan, is a conflict.
        `seal`: the SHA-256 of the plan's stored documents, which its commit checks (`plan_seal`)."""
        keys = list(keys)
        with self._writing() as connection:
            versions.lock(connection)
            live = files.live_file_ids(connection, keys)
            gone = [key for key in keys if key not in live]
            if gone:
                raise CommitConflictError(f"plan {plan_id}: file {gone[0]} is no longer live; re-plan")
            cleaning.lease(connection, plan_id, live, keys, expires_ms, now_ms, seal)

    def plan_seal(self, plan_id: str) -> str | None:
        """The SHA-256 its stored documents had when the plan was leased; None for a plan never sealed, or whose
        lease is over."""
        with self._reading() as connection:
            return cleaning.plan_seal(connection, plan_id)

    def release(self, plan_id: str) -> None:
        with self._writing() as connection:
            cleaning.release(connection, plan_id)

    def release_expired_leases(self, now_ms: int) -> list[str]:
        """Drop expired leases; the plans they named."""
        with self._writing() as connection:
            return cleaning.release_expired(connection, now_ms)

    def leased_plans(self, now_ms: int) -> set[str]:
        """Plans holding a lease that has not expired."""
        with self._reading() as connection:
            return cleaning.leased_plans(connection, now_ms)

    # -- garbage -------------------------------------------------------------------------------------

    def collectable_files(self, before_version: int, removed_before_ms: int) -> list[str]:
        """Files removed before `before_version` and before `removed_before_ms` by a commit that records removing
        them (`schema.removal_recorded`): no kept version holds them."""
        with self._reading() as connection:
            return garbage.collectable_files(connection, before_version, removed_before_ms)

    def unrecorded_removals(self, before_version: int, removed_before_ms: int) -> list[str]:
        """The files rows `collectable_files` would take but for their removal (`garbage.unrecorded_removals`), one
        line each."""
        with self._reading() as connection:
            return garbage.unrecorded_removals(connection, before_version, removed_before_ms)

    def dangling_sections(self, limit: int = 3) -> list[str]:
        """Sections rows whose file has no files row (`garbage.dangling_sections`), one line per file id, at most `limit`."""
        with self._reading() as connection:
            return garbage.dangling_sections(connection, limit)

    def forget_files(self, keys: Sequence[str], forget_ranges: int = 10_000) -> int:
        """Delete removed files' rows (their objects are gone); a live file is never forgotten. In the same
        transaction, up to `forget_ranges` aborted ranges that no file the catalog still has may hold an unfiltered
        record of go (`transactions.forget_aborted`); how many."""
        with self._writing() as connection:
            garbage.forget_files(connection, keys)
            return transactions.forget_aborted(connection, forget_ranges)

    def known_files(self, keys: Sequence[str]) -> set[str]:
        """Which of `keys` the catalog has a row for, live or removed."""
        with self._reading() as connection:
            return garbage.known_files(connection, keys)

    def trim_versions(self, before_version: int) -> int:
        """Drop commit-log rows older than `before_version` (readers can no longer pin them), and the compaction holes
        retired before it; how many of the former."""
        with self._writing() as connection:
            holes.trim(connection, before_version)
            return versions.trim(connection, before_version)


def _spans(added: Sequence[DataFile], topic_rows: Mapping[str, tuple[int, int]]) -> dict[tuple[int, int], list[tuple[int, int]]]:
    """Per partition (topic id, partition), the offsets each section of `added` spans."""
    spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for data_file in added:
        for section in data_file.sections:
            spans.setdefault((topic_rows[section.topic][0], section.partition), []).append((section.first_offset, section.last_offset))
    return spans


class _AlreadyCommitted(Exception):
    def __init__(self, version: int) -> None:
        self.version = version
