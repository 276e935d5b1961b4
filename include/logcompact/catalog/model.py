"""What the catalog says about files: value types shared by the catalog, plans, the planner and the engine."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import NamedTuple

from logcompact.format.layout import SectionInfo


class CatalogSection(NamedTuple):
    """A section of a live file, placed in its partition's offsets: `first_offset` is assigned by the catalog.

    A named tuple, as SectionInfo: planners build one per section of every file they plan."""

    info: SectionInfo
    first_offset: int

    @property
    def topic(self) -> str:
        return self.info.topic

    @property
    def partition(self) -> int:
        return self.info.partition

    @property
    def last_offset(self) -> int:
        return self.first_offset + self.info.last_delta


@dataclass(frozen=True)
class DataFile:
    key: str
    level: int
    size: int
    created_ms: int
    sections: tuple[CatalogSection, ...]
    # Per section, the Kafka codec id its records were produced with (`sections.produced_compression`); () for none known.
    produced_codecs: tuple[int, ...] = ()

    @property
    def record_count(self) -> int:
        return sum(s.info.record_count for s in self.sections)

    @cached_property
    def topics(self) -> frozenset[str]:
        return frozenset(s.info.topic for s in self.sections)


@dataclass(frozen=True)
class NewFile:
    """A file written but not yet committed: its sections' offsets are still deltas."""

    key: str
    level: int
    size: int
    created_ms: int
    sections: tuple[SectionInfo, ...]
    produced_codecs: tuple[int, ...] = ()  # as DataFile's


# What a file holds, as planners ask it: above L0 a file holds compacted topics' records or the others', never
# both (the L0 to L1 job splits them).
CONTENTS = ("other", "compacted", "mixed")


@dataclass(frozen=True)
class FileSummary:
    """A live file without its sections: what planners and threshold checks read for every file."""

    key: str
    level: int
    size: int
    created_ms: int
    record_count: int
    content: str  # one of CONTENTS


@dataclass(frozen=True)
class PartitionSection:
    """The few facts of one live section the max-lag pass needs, for every section of the chosen topics."""

    key: str
    level: int
    topic: str
    partition: int
    first_offset: int
    last_delta: int
    clean_below_delta: int
    min_timestamp: int


class LevelSection(NamedTuple):
    """A live section above L0 as the dirty ratio weighs it (`planner.dirty_ratio`)."""

    key: str  # its file's
    topic: str
    partition: int
    first_offset: int
    last_offset: int
    uncompressed_bytes: int
    clean: bool  # free of duplicates: its clean_below_delta covers it
    max_timestamp: int


@dataclass(frozen=True)
class PartitionSummary:
    """A partition's live sections above L0, summed up: a row of `partition_summaries` (`catalog.summaries`)."""

    sections: int
    uncompressed_bytes: int
    l1_bytes: int  # of those, at L1
    records: int
    floor: int  # the base's first offset: the lowest above L0
    base_level: int
    base_clean: bool  # free of duplicates: its clean_below_delta covers it
    base_bytes: int
    base_min_timestamp: int
    others_min_timestamp: int | None  # None: the base is the only one
    newest_file_ms: int  # the newest creation time of the files holding them
    key_sketch: bytes  # their key sketches merged (b"": none has keys)


class SectionFigures(NamedTuple):
    """A live section as `logcompact status` weighs it: the max-lag pass's facts, and its size, keys and age."""

    section: PartitionSection
    record_count: int
    uncompressed_bytes: int
    key_sketch: bytes | None
    created_ms: int  # its file's: a compaction's output is made at its plan's clock


@dataclass(frozen=True)
class Lease:
    plan_id: str
    expires_ms: int


@dataclass(frozen=True)
class CommitResult:
    """A commit's outcome: the manifest version it created (or found), and whether this call made it."""

    version: int
    committed: bool


@dataclass(frozen=True)
class AgentEndpoint:
    """Where clients of one of an agent's listeners reach it (Kafka's advertised.listeners entry)."""

    listener: str
    host: str
    port: int


@dataclass(frozen=True)
class AgentRecord:
    """A Kafka agent (`logcompact agent`) as registered in the catalog: what Metadata tells clients of it. `host` and
    `port` are its first listener's advertised address (its node id is kept per it); `endpoints` are every listener's."""

    node_id: int
    host: str
    port: int
    rack: str | None
    started_ms: int
    heartbeat_ms: int
    endpoints: tuple[AgentEndpoint, ...] = ()

    def endpoint(self, listener: str) -> AgentEndpoint | None:
        """Where clients of `listener` reach this agent; None when it has no such listener."""
        return next((endpoint for endpoint in self.endpoints if endpoint.listener == listener), None)


@dataclass(frozen=True)
class CatalogUpgrade:
    """What `Catalog.upgrade_catalog` did: the schema it found, and the sections rows it rewrote on the way."""

    from_schema_version: int
    sections_rewritten: int


@dataclass(frozen=True)
class CommitRecord:
    """One line of the commit log: version N was created by this operation."""

    version: int
    commit_id: str
    created_ms: int
    operation: str


TopicPartition = tuple[str, int]


class SetAside(NamedTuple):
    """A partition a job could not compact because its data is damaged: what the commit marks uncleanable."""

    topic: str
    partition: int
    reason: str  # the CorruptDataError's message
    file_key: str  # the damaged file

    def to_dict(self) -> dict:
        return self._asdict()


class Uncleanable(NamedTuple):
    """A partition marked uncleanable in the catalog (Kafka's uncleanable partitions), with its live bytes."""

    topic: str
    partition: int
    reason: str
    file_key: str
    file_stamp: str  # the damaged object's size and modification time when marked
    marked_ms: int
    retry_ms: int
    failures: int
    plan_id: str
    bytes: int  # uncompressed bytes of its live sections: Kafka's uncleanable-bytes

    def to_dict(self) -> dict:
        return self._asdict()
