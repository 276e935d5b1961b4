"""A catalog bound to its store: the cluster made (schema, version 1, the store's marker), and the store's marker
checked against the catalog (same cluster, a version the catalog has reached) or written for a store that has none
when the catalog agrees with its data. `identity` reads and writes the marker, without the database layer (a Spark
task checks a store with it alone); these are the catalog's side, called by `Catalog`.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, insert, select

from logcompact.catalog import schema as s
from logcompact.catalog.identity import CHECK_THEN_ACCEPT, ClusterMarker, create_marker, read_marker
from logcompact.exceptions import CatalogConfigError, ClusterMismatchError, StaleCatalogError
from logcompact.keys import DATA_PREFIX
from logcompact.store.base import ObjectStore
from logcompact.units import wall_clock_ms


def create(connection: Connection, now_ms: int) -> tuple[str, int]:
    """The schema and version 1 of an empty cluster, unless another creator made them first; the cluster id and version."""
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
    return cluster_id, version


def checked_marker(store: ObjectStore, shown_url: str, marker: ClusterMarker, cluster_id: str, version: int) -> ClusterMarker:
    """The store's marker, once it agrees with the catalog: same cluster, a version the catalog has reached."""
    if marker.cluster_id != cluster_id:
        raise ClusterMismatchError(
            f"store {store.uri} belongs to cluster {marker.cluster_id} but catalog {shown_url} holds "
            f"cluster {cluster_id}: point --catalog (LOGCOMPACT_CATALOG, the Airflow connection) at the store's own "
            "catalog; nothing was written or deleted"
        )
    if version < marker.seen_version:
        raise StaleCatalogError(
            f"catalog {shown_url} of cluster {cluster_id} is at version {version} but its store {store.uri} "
            f"has seen version {marker.seen_version}: the catalog was restored from an older copy. Restore the newest "
            f"copy; or, to go on from this one (files written after it become orphans), {CHECK_THEN_ACCEPT}"
        )
    return marker


def newest_live_files(connection: Connection) -> list[tuple[str, int]]:
    """(key, size) of the three newest live files: what `adopt_store` looks for in the store."""
    live = s.files.c.removed_version.is_(None)
    rows = connection.execute(select(s.files.c.key, s.files.c.size).where(live).order_by(s.files.c.file_id.desc()).limit(3)).all()
    return [(row.key, row.size) for row in rows]


def adopt_store(store: ObjectStore, shown_url: str, cluster_id: str, version: int, newest: list[tuple[str, int]]) -> ClusterMarker:
    """Mark a store that has no marker (a cluster made before markers, or its creator died before writing one),
    only when the catalog agrees: its `newest` live files are in the store, or it has none and the store no data."""
    how_to_fix = f"point --catalog at the store's own catalog; or, if this catalog is the store's, {CHECK_THEN_ACCEPT}"
    for key, size in newest:
        found = store.stat(key)
        if found is None or found.size != size:
            raise ClusterMismatchError(
                f"store {store.uri} has no cluster marker and does not hold file {key} ({size} bytes) of catalog "
                f"{shown_url} (cluster {cluster_id}): {how_to_fix}"
            )
    if not newest:
        stray = next(iter(store.list(DATA_PREFIX)), None)
        if stray is not None:
            raise ClusterMismatchError(
                f"store {store.uri} has no cluster marker and holds data files ({stray.key}, ...) that catalog "
                f"{shown_url} (cluster {cluster_id}) has none of: {how_to_fix}"
            )
    return create_marker(store, cluster_id, version, wall_clock_ms())


def refuse_marked_store(store: ObjectStore, shown_url: str) -> None:
    """A new cluster is never made over a store that already belongs to one or holds data files: their catalog
    was lost, emptied or is elsewhere, and a new one would hand out their offsets again."""
    marker = read_marker(store)
    if marker is not None:
        raise ClusterMismatchError(
            f"catalog {shown_url} holds no cluster but store {store.uri} belongs to cluster "
            f"{marker.cluster_id}: point --catalog (LOGCOMPACT_CATALOG) at that cluster's catalog, restore the catalog "
            "database from a backup, or use an empty store"
        )
    found = next(iter(store.list(DATA_PREFIX)), None)
    if found is not None:
        raise CatalogConfigError(
            f"catalog {shown_url} holds no cluster but {store.uri} holds data files "
            f"({found.key}, ...): restore the catalog database from a backup, or use an empty store"
        )
