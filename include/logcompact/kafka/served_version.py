"""The catalog as Fetch and ListOffsets read it: the newest snapshot, and each topic's log offsets (log start, high
watermark, last stable offset) kept per catalog version, so consumers polling at a version read them from the catalog
once, not once a request (a query over every partition of the topic: fifty consumers of a topic of fifty partitions
read 2,500 rows a round of polls).

Every write that moves a partition's offsets commits a new catalog version (an append, DeleteRecords, a transaction's
end, retention, a topic's partitions grown or deleted), so offsets read while the version stands are the version's.
They are kept only when the version read before them is still the newest after them; otherwise they may be newer than
the version, and are used for the request they were read for under a snapshot taken after them, as a read without
the cache does: a snapshot never older than the offsets given with it, so an offset below a high watermark that the
snapshot does not hold is one compaction removed, never one not yet visible.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable

from logcompact.catalog import Catalog, Snapshot
from logcompact.catalog.topics import LogOffsets
from logcompact.exceptions import TopicNotFoundError

TopicOffsets = list[LogOffsets] | None  # by partition; None: no such topic


class ServedVersion:
    """The newest snapshot of one catalog and its topics' log offsets, each read once per catalog version; used from
    the readers' threads."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self.offsets_reads = 0  # topics' log offsets read from the catalog (Fetch and ListOffsets)
        self._lock = threading.Lock()
        self._reading = threading.Lock()  # held while offsets are read from the catalog
        self._snapshot: Snapshot | None = None
        self._version = -1  # of the offsets held
        self._offsets: dict[str, TopicOffsets] = {}

    def snapshot(self, newest: int | None = None) -> Snapshot:
        """The newest snapshot: the one held while the catalog's version has not moved. `newest`, a version read from
        the catalog since the request came, stands for the catalog's: answering at it answers as of a moment within
        the request (the commit watch read it after the request's first read found nothing new)."""
        held = self._snapshot
        if held is not None and held.version == (self.catalog.latest_version() if newest is None else newest):
            return held
        self._snapshot = snapshot = self.catalog.snapshot()
        return snapshot

    def read(self, topics: Iterable[str], newest: int | None = None) -> tuple[Snapshot, dict[str, TopicOffsets]]:
        """The newest snapshot (`newest`: as `snapshot`) and the log offsets of `topics` as of its version or older
        (offsets read after the snapshot's version moved on come with a newer snapshot)."""
        topics = list(topics)
        snapshot = self.snapshot(newest)
        found = self._held(snapshot.version, topics)
        if len(found) == len(topics):
            return snapshot, found
        # One reader at a time: requests at one version missing the same topic (a client's ListOffsets for the earliest
        # and the latest offsets come together) read it once.
        with self._reading:
            found = self._held(snapshot.version, topics)
            read = {topic: self._read_offsets(topic) for topic in topics if topic not in found}
            if self.catalog.latest_version() == snapshot.version:  # nothing committed meanwhile: these are the version's
                with self._lock:
                    if self._version != snapshot.version:
                        self._version, self._offsets = snapshot.version, {}
                    self._offsets.update(read)
                return snapshot, {**found, **read}
        return self.snapshot(), {**found, **read}

    def _held(self, version: int, topics: list[str]) -> dict[str, TopicOffsets]:
        with self._lock:
            held = self._offsets if self._version == version else {}
            return {topic: held[topic] for topic in topics if topic in held}

    def _read_offsets(self, topic: str) -> TopicOffsets:
        with self._lock:
            self.offsets_reads += 1
        try:
            return self.catalog.log_offsets(topic)
        except TopicNotFoundError:
            return None


_served: weakref.WeakKeyDictionary[Catalog, ServedVersion] = weakref.WeakKeyDictionary()
_served_lock = threading.Lock()


def served_version(catalog: Catalog) -> ServedVersion:
    """The one ServedVersion of `catalog` in this process (the agent's, whoever reads through it)."""
    with _served_lock:
        found = _served.get(catalog)
        if found is None:
            found = _served[catalog] = ServedVersion(catalog)
        return found
