"""The manifest: one immutable version of the catalog, and the pure changes a commit applies to it.

A manifest says which files are live (with their level, size and section summaries), which topics exist,
and each partition's next offset. Changes are pure functions from a manifest to a new one, so an optimistic
commit that lost a race re-applies the same change to whatever version won.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from functools import cached_property
from types import MappingProxyType
from typing import Iterable, Mapping

from logcompact.exceptions import (
    CommitConflictError,
    InvalidRecordError,
    ManifestFormatError,
    TopicExistsError,
    TopicNotFoundError,
)
from logcompact.format.layout import SectionInfo
from logcompact.topics import Topic

MANIFEST_FORMAT = 1
RECENT_PLANS = 1000


@dataclass(frozen=True)
class CatalogSection:
    """A section of a live file, placed in its partition's offsets: `first_offset` is assigned by the catalog."""

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

    def to_dict(self) -> dict:
        return {**self.info.to_dict(), "first_offset": self.first_offset}

    @classmethod
    def from_dict(cls, data: dict) -> CatalogSection:
        fields = dict(data)
        first_offset = fields.pop("first_offset")
        return cls(SectionInfo(**fields), first_offset)


@dataclass(frozen=True)
class DataFile:
    key: str
    level: int
    size: int
    created_ms: int
    sections: tuple[CatalogSection, ...]

    @property
    def record_count(self) -> int:
        return sum(s.info.record_count for s in self.sections)

    @cached_property
    def topics(self) -> frozenset[str]:
        return frozenset(s.info.topic for s in self.sections)

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "level": self.level,
            "size": self.size,
            "created_ms": self.created_ms,
            "sections": [s.to_dict() for s in self.sections],
        }

    @classmethod
    def from_dict(cls, data: dict) -> DataFile:
        sections = tuple(CatalogSection.from_dict(s) for s in data["sections"])
        return cls(data["key"], data["level"], data["size"], data["created_ms"], sections)


@dataclass(frozen=True)
class NewFile:
    """A file written but not yet committed: its sections' offsets are still deltas."""

    key: str
    level: int
    size: int
    created_ms: int
    sections: tuple[SectionInfo, ...]


def _frozen(mapping: dict) -> Mapping:
    return MappingProxyType(mapping)


@dataclass(frozen=True)
class Manifest:
    cluster_id: str
    version: int
    commit_id: str
    created_ms: int
    operation: str
    topics: Mapping[str, Topic] = field(default_factory=lambda: _frozen({}))
    next_offsets: Mapping[str, tuple[int, ...]] = field(default_factory=lambda: _frozen({}))
    files: Mapping[str, DataFile] = field(default_factory=lambda: _frozen({}))
    # Ids of the last RECENT_PLANS compaction plans committed: committing one again is a no-op.
    recent_plans: tuple[str, ...] = ()
    # File key -> (plan id, expiry ms): files an in-flight plan holds; planners leave them alone.
    leases: Mapping[str, tuple[str, int]] = field(default_factory=lambda: _frozen({}))

    # -- reading ---------------------------------------------------------------------------------

    def topic(self, name: str) -> Topic:
        try:
            return self.topics[name]
        except KeyError:
            raise TopicNotFoundError(
                f"topic {name!r} does not exist in manifest version {self.version}: create it with `logcompact topic create`"
            ) from None

    def sections_of(self, topic: str, partition: int) -> list[tuple[DataFile, CatalogSection]]:
        """Every live section of one partition with its file, in first-offset order."""
        return self._sections_by_partition.get((topic, partition), [])

    @cached_property
    def _sections_by_partition(self) -> dict[tuple[str, int], list[tuple[DataFile, CatalogSection]]]:
        index: dict[tuple[str, int], list[tuple[DataFile, CatalogSection]]] = {}
        for data_file in self.files.values():
            for section in data_file.sections:
                index.setdefault((section.topic, section.partition), []).append((data_file, section))
        for sections in index.values():
            sections.sort(key=lambda pair: pair[1].first_offset)
        return index

    def partition_starts(self, topic: str, partition: int) -> list[tuple[int, str]]:
        """(first offset, file key) of each live section of a partition, in offset order: a light index
        for planners, which look at where data starts, not at the data."""
        return self._planning_index[0].get((topic, partition), [])

    def file_partitions(self, key: str) -> tuple[tuple[str, int], ...]:
        """The (topic, partition) pairs a live file holds."""
        return self._planning_index[1][key]

    @cached_property
    def _planning_index(self) -> tuple[dict[tuple[str, int], list[tuple[int, str]]], dict[str, tuple[tuple[str, int], ...]]]:
        starts: dict[tuple[str, int], list[tuple[int, str]]] = {}
        file_partitions: dict[str, tuple[tuple[str, int], ...]] = {}
        for key, data_file in self.files.items():
            held = []
            for section in data_file.sections:
                info = section.info
                tp = (info.topic, info.partition)
                held.append(tp)
                offsets = starts.get(tp)
                if offsets is None:
                    offsets = starts[tp] = []
                offsets.append((section.first_offset, key))
            file_partitions[key] = tuple(held)
        for offsets in starts.values():
            offsets.sort()
        return starts, file_partitions

    def files_at(self, level: int | None = None) -> list[DataFile]:
        files = [f for f in self.files.values() if level is None or f.level == level]
        return sorted(files, key=lambda f: (f.level, f.created_ms, f.key))

    # -- changes (pure: each returns a new manifest) -----------------------------------------------

    def with_topic(self, topic: Topic) -> Manifest:
        if topic.name in self.topics:
            raise TopicExistsError(f"topic {topic.name!r} already exists; describe it with `logcompact topic describe`")
        topics = {**self.topics, topic.name: topic}
        offsets = {**self.next_offsets, topic.name: (0,) * topic.partitions}
        return replace(self, topics=_frozen(topics), next_offsets=_frozen(offsets))

    def with_altered_topic(self, name: str, settings: dict[str, str | int]) -> Manifest:
        altered = self.topic(name).altered(settings)
        return replace(self, topics=_frozen({**self.topics, name: altered}))

    def with_appended_files(self, new_files: Iterable[NewFile]) -> tuple[Manifest, list[list[int]]]:
        """Add freshly ingested files, giving each section the next offsets of its partition.

        Returns the first offset assigned to each section of each file. Never conflicts with a commit that
        replaced other files: it only reads topics and next offsets, which it re-reads on every retry.
        """
        offsets = {name: list(values) for name, values in self.next_offsets.items()}
        files = dict(self.files)
        assigned: list[list[int]] = []
        for new in new_files:
            if new.key in files:
                raise CommitConflictError(f"file {new.key} is already in manifest version {self.version}; it was committed before")
            placed = []
            for info in new.sections:
                partitions = offsets.get(info.topic)
                if partitions is None:
                    self.topic(info.topic)  # raises TopicNotFoundError
                if not 0 <= info.partition < len(partitions):
                    raise InvalidRecordError(
                        f"topic {info.topic!r} has partitions 0 to {len(partitions) - 1}, not {info.partition}"
                    )
                first = partitions[info.partition]
                partitions[info.partition] = first + info.last_delta + 1
                placed.append(CatalogSection(info, first))
            files[new.key] = DataFile(new.key, new.level, new.size, new.created_ms, tuple(placed))
            assigned.append([section.first_offset for section in placed])
        frozen_offsets = {name: tuple(values) for name, values in offsets.items()}
        return replace(self, files=_frozen(files), next_offsets=_frozen(frozen_offsets)), assigned

    def with_replaced_files(
        self, removed: Iterable[str], added: Iterable[DataFile], expected_version: int, plan_id: str | None = None
    ) -> Manifest:
        """Swap files for others holding offsets already assigned (a compaction's outputs)."""
        removed = list(removed)
        missing = [key for key in removed if key not in self.files]
        if missing:
            raise CommitConflictError(
                f"expected {len(removed)} input files live as in manifest version {expected_version}, "
                f"found {len(missing)} of them gone in version {self.version} (first: {missing[0]}); re-plan and retry"
            )
        gone = set(removed)
        files = {key: f for key, f in self.files.items() if key not in gone}
        for data_file in added:
            if data_file.key in files:
                raise CommitConflictError(f"output file {data_file.key} is already live in manifest version {self.version}")
            files[data_file.key] = data_file
        plans = self.recent_plans if plan_id is None else (self.recent_plans + (plan_id,))[-RECENT_PLANS:]
        leases = {key: lease for key, lease in self.leases.items() if key in files and lease[0] != plan_id}
        return replace(self, files=_frozen(files), recent_plans=plans, leases=_frozen(leases))

    def leased_files(self, now_ms: int) -> set[str]:
        return {key for key, (_plan, expires) in self.leases.items() if expires > now_ms}

    def with_lease(self, plan_id: str, keys: Iterable[str], expires_ms: int, now_ms: int) -> Manifest:
        """Lease files to a plan; a file leased to another live plan, or gone, is a conflict."""
        keys = list(keys)
        gone = [key for key in keys if key not in self.files]
        if gone:
            raise CommitConflictError(f"plan {plan_id}: file {gone[0]} is no longer live in manifest version {self.version}; re-plan")
        for key in keys:
            holder = self.leases.get(key)
            if holder and holder[0] != plan_id and holder[1] > now_ms:
                raise CommitConflictError(
                    f"plan {plan_id}: file {key} is leased to plan {holder[0]} until {holder[1]}; re-plan after it commits or expires"
                )
        leases = {k: v for k, v in self.leases.items() if v[1] > now_ms and k in self.files}
        leases.update({key: (plan_id, expires_ms) for key in keys})
        return replace(self, leases=_frozen(leases))

    def without_lease(self, plan_id: str) -> Manifest:
        return replace(self, leases=_frozen({k: v for k, v in self.leases.items() if v[0] != plan_id}))

    def without_expired_leases(self, now_ms: int) -> Manifest:
        return replace(self, leases=_frozen({k: v for k, v in self.leases.items() if v[1] > now_ms}))

    # -- encoding -----------------------------------------------------------------------------------

    def to_bytes(self) -> bytes:
        document = {
            "format": MANIFEST_FORMAT,
            "cluster_id": self.cluster_id,
            "version": self.version,
            "commit_id": self.commit_id,
            "created_ms": self.created_ms,
            "operation": self.operation,
            "topics": [t.to_dict() for t in self.topics.values()],
            "next_offsets": {name: list(values) for name, values in self.next_offsets.items()},
            "files": [f.to_dict() for f in self.files.values()],
            "recent_plans": list(self.recent_plans),
            "leases": [[key, plan, expires] for key, (plan, expires) in sorted(self.leases.items())],
        }
        return json.dumps(document, separators=(",", ":")).encode()

    @classmethod
    def from_bytes(cls, data: bytes, name: str) -> Manifest:
        document = json.loads(data)
        if document.get("format") != MANIFEST_FORMAT:
            raise ManifestFormatError(
                f"{name}: manifest format {document.get('format')} is not supported (expected {MANIFEST_FORMAT}); upgrade logcompact"
            )
        return cls(
            cluster_id=document["cluster_id"],
            version=document["version"],
            commit_id=document["commit_id"],
            created_ms=document["created_ms"],
            operation=document["operation"],
            topics=_frozen({t["name"]: Topic.from_dict(t) for t in document["topics"]}),
            next_offsets=_frozen({name: tuple(v) for name, v in document["next_offsets"].items()}),
            files=_frozen({f["key"]: DataFile.from_dict(f) for f in document["files"]}),
            recent_plans=tuple(document.get("recent_plans", ())),
            leases=_frozen({key: (plan, expires) for key, plan, expires in document.get("leases", ())}),
        )
