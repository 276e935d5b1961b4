"""Which cluster a store belongs to: a small marker object beside the data, as Kafka's `meta.properties`.

The marker (`cluster.json` at the store's root) is written create-only when the cluster is created and holds the
cluster id the catalog holds too, so a store and a catalog of different clusters are never used together: gc
would take every object of the store for an orphan. It also records the newest catalog version a writer has
seen (`seen_version`), so a catalog restored from an older copy is refused before it hands out offsets again or
its gc deletes the newer files it does not know. Writers record it after each write that is not an append, and
appends at most every `RECORD_APPEND_EVERY_MS`: it never runs ahead of the catalog, only a little behind.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from logcompact.exceptions import ClusterMismatchError, CorruptDataError, ObjectNotFoundError
from logcompact.keys import MARKER_KEY
from logcompact.store.base import ObjectStore

RECORD_APPEND_EVERY_MS = 10_000
# How every refusal that sends an operator to `cluster accept-catalog` ends: check first, then name the cluster, so a
# catalog of another cluster is never taken for the store's by a slip (gc would then delete the store's files).
CHECK_THEN_ACCEPT = (
    "check that the cluster id `logcompact cluster describe` prints for the catalog is your cluster's, then run "
    "`logcompact cluster accept-catalog --cluster-id ID`"
)


@dataclass(frozen=True)
class ClusterMarker:
    cluster_id: str
    created_ms: int
    seen_version: int  # the newest catalog version recorded here: a catalog below it was restored from a copy
    seen_ms: int

    def encode(self) -> bytes:
        return json.dumps(asdict(self), sort_keys=True).encode()


def read_marker(store: ObjectStore) -> ClusterMarker | None:
    """The store's marker, None for a store that has none (new, or made by a logcompact before markers)."""
    try:
        data = store.get(MARKER_KEY)
    except ObjectNotFoundError:
        return None
    try:
        document = json.loads(data)
        marker = ClusterMarker(
            str(document["cluster_id"]), int(document["created_ms"]), int(document["seen_version"]), int(document["seen_ms"])
        )
    except (ValueError, KeyError, TypeError, RecursionError):
        raise CorruptDataError(
            f"cluster marker {MARKER_KEY} in {store.uri} is damaged ({data[:60]!r}): restore it from a copy, or write it "
            f"again from the catalog: {CHECK_THEN_ACCEPT}"
        ) from None
    return marker


def create_marker(store: ObjectStore, cluster_id: str, version: int, now_ms: int) -> ClusterMarker:
    """Mark the store as the cluster's, create-only; the marker that holds, whoever wrote it."""
    marker = ClusterMarker(cluster_id, now_ms, version, now_ms)
    if store.put_if_absent(MARKER_KEY, marker.encode()):
        return marker
    found = read_marker(store)
    assert found is not None  # created by a racing writer, never deleted
    return found


def record_version(store: ObjectStore, marker: ClusterMarker, version: int, now_ms: int) -> ClusterMarker:
    """Record that the catalog reached `version`; the marker as it then is. Read again first, so a writer whose
    copy is old lowers what another recorded only by the versions committed between their two reads."""
    current = read_marker(store) or marker
    if version <= current.seen_version:
        return current
    updated = ClusterMarker(marker.cluster_id, marker.created_ms, version, now_ms)
    store.put(MARKER_KEY, updated.encode())
    return updated


def check_store_cluster(store: ObjectStore, cluster_id: str, what: str) -> None:
    """Refuse to write `what` (of cluster `cluster_id`) into a store of another cluster: the check of a writer that
    never opens the catalog (a Spark job of a plan)."""
    marker = read_marker(store)
    if marker is None or marker.cluster_id != cluster_id:
        found = f"belongs to cluster {marker.cluster_id}" if marker else f"has no cluster marker {MARKER_KEY}"
        raise ClusterMismatchError(
            f"{what} is of cluster {cluster_id} but store {store.uri} {found}: run it against its own cluster's store; "
            "nothing was written"
        )
