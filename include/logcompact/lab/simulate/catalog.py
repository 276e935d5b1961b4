"""The simulator's catalog: live files held in memory, read by the real planner as it reads the database.

A simulated hour of the WarpStream-like workload appends 4.5 million sections in L1 files alone; the real catalog
inserts a row for each and the planner loads them back as objects, which took most of a run. This one keeps the
files as the objects the simulator made (`DataFile`), places offsets as `Catalog.append_files` does, commits all
or nothing, and answers what planners read of a snapshot (`PlanningSnapshot`) from them as the database answers it:
the same files in the same order, the same minimums, the same partition summaries (`summaries.of_columns`, over
columns each file's sections are read into once). `tests/test_simulate.py` checks each answer against the real
catalog's, and runs the simulator on both catalogs for the same figures.

What it leaves out, the simulator never does: leases (its plans commit at once), partitions set aside as uncleanable,
topics with time retention, and reading an older version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from operator import itemgetter
from typing import NamedTuple

import numpy as np

from logcompact.catalog import CatalogSection, CommitResult, DataFile, FileSummary, LevelSection, NewFile, PartitionSection, PartitionSummary, summaries
from logcompact.catalog.model import CONTENTS, TopicPartition
from logcompact.exceptions import CommitConflictError, InvalidRecordError, TopicNotFoundError
from logcompact.format.layout import SectionInfo
from logcompact.topics import Topic

CLUSTER_ID = "simulated"
_PARTITION_OF = itemgetter(0, 1)  # a SectionInfo's (topic, partition)


class SectionColumns(NamedTuple):
    """The sections of a file above L0 as the partition summaries take them (`summaries.of_columns`), one entry a section."""

    topic_ids: np.ndarray
    partitions: np.ndarray
    first: np.ndarray
    level: np.ndarray
    size: np.ndarray
    records: np.ndarray
    min_timestamp: np.ndarray
    clean: np.ndarray
    created_ms: np.ndarray
    sketches: list[bytes]

    @classmethod
    def of_file(cls, data_file: DataFile, topic_ids: dict[str, int]) -> SectionColumns:
        count = len(data_file.sections)
        infos = [section.info for section in data_file.sections]
        fields = dict(zip(SectionInfo._fields, zip(*infos))) if infos else dict.fromkeys(SectionInfo._fields, ())

        def column(name: str) -> np.ndarray:
            return np.array(fields[name], dtype=np.int64)

        return cls(
            np.fromiter(map(topic_ids.__getitem__, fields["topic"]), dtype=np.int64, count=count), column("partition"),
            np.fromiter(map(itemgetter(1), data_file.sections), dtype=np.int64, count=count), np.full(count, data_file.level, dtype=np.int64),
            column("uncompressed_bytes"), column("record_count"), column("min_timestamp"), column("clean_below_delta") > column("last_delta"),
            np.full(count, data_file.created_ms, dtype=np.int64), list(fields["key_sketch"]),
        )

    @classmethod
    def concat(cls, parts: Sequence[SectionColumns]) -> SectionColumns:
        arrays = [np.concatenate([getattr(part, name) for part in parts]) for name in cls._fields[:-1]]
        return cls._make([*arrays, [packed for part in parts for packed in part.sketches]])


class MemoryCatalog:
    """What the simulator asks of `Catalog`: topics, appends, a compaction's swap and the newest snapshot."""

    def __init__(self, topics: Sequence[Topic]) -> None:
        for topic in topics:
            if topic.config.time_retention:
                raise ValueError(f"topic {topic.name!r}: the simulator's catalog keeps no time retention; set retention.ms to -1")
        self.topics = {topic.name: topic for topic in topics}
        self.topic_ids = {topic.name: number for number, topic in enumerate(topics, start=1)}  # as created, from 1
        self.version = 1
        self._files: dict[str, DataFile] = {}  # live files in the order they were added, as file ids order them
        self._columns: dict[str, SectionColumns] = {}  # of the live files above L0
        self._next_offsets: dict[TopicPartition, int] = {}

    def append_files(self, new_files: Sequence[NewFile], now_ms: int) -> tuple[int, list[list[int]]]:
        """Add ingested files, each section at the next offsets of its partition; returns the version created and each
        file's sections' first offsets, as `Catalog.append_files` does (`now_ms` dates nothing here: no producer state)."""
        placed_files, next_offsets = [], dict(self._next_offsets)  # kept only if the commit is
        for new in new_files:
            firsts = []
            for info, tp in zip(new.sections, map(_PARTITION_OF, new.sections)):
                first = next_offsets.get(tp)
                if first is None:  # the partition's first records
                    if not 0 <= info.partition < self._topic(info.topic).partitions:
                        raise InvalidRecordError(f"topic {info.topic!r} has partitions 0 to {self.topics[info.topic].partitions - 1}, not {info.partition}")
                    first = 0
                next_offsets[tp] = first + info.last_delta + 1
                firsts.append(first)
            placed_files.append(DataFile(new.key, new.level, new.size, new.created_ms, tuple(map(CatalogSection, new.sections, firsts))))
        version = self._commit([], placed_files)
        self._next_offsets = next_offsets
        return version, [[section.first_offset for section in data_file.sections] for data_file in placed_files]

    def replace_files(self, removed: Sequence[str], added: Sequence[DataFile], now_ms: int, *, plan_id: str | None = None) -> CommitResult:
        """Swap live files for a compaction's outputs (offsets already assigned), as `Catalog.replace_files` does for a
        plan not committed before (this catalog records neither plans nor the clock)."""
        return CommitResult(self._commit(removed, added), True)

    def _commit(self, removed: Sequence[str], added: Sequence[DataFile]) -> int:
        """Remove `removed` and add `added` in a new version, or change nothing and raise."""
        if len(set(removed)) < len(removed) or len({data_file.key for data_file in added}) < len(added):
            raise ValueError("a commit names a file twice among its inputs or among its outputs; name each once")
        gone = [key for key in removed if key not in self._files]
        if gone:
            raise CommitConflictError(f"expected {len(removed)} input files live, found {len(gone)} of them gone (first: {gone[0]}); re-plan and retry")
        taken = [data_file.key for data_file in added if data_file.key in self._files]
        if taken:
            raise CommitConflictError(f"an output file is already in the catalog ({taken[0]}); plan again")
        for data_file in added:
            for name in data_file.topics:
                self._topic(name)
            if len(set(map(_PARTITION_OF, (section.info for section in data_file.sections)))) < len(data_file.sections):
                raise ValueError(f"file {data_file.key} holds two sections of one partition; a file holds one section a partition")
        columns = {data_file.key: SectionColumns.of_file(data_file, self.topic_ids) for data_file in added if data_file.level > 0}
        for key in removed:
            del self._files[key]
            self._columns.pop(key, None)
        self._files.update((data_file.key, data_file) for data_file in added)
        self._columns.update(columns)
        self.version += 1
        return self.version

    def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(self, dict(self._files), list(self._columns.values()))

    def _topic(self, name: str) -> Topic:
        try:
            return self.topics[name]
        except KeyError:
            raise TopicNotFoundError(f"topic {name!r} is not one of the simulated topics ({', '.join(self.topics)}); add it to the workload") from None


class MemorySnapshot:
    """The simulated catalog as of one version: the answers of `Snapshot` that the planners read."""

    def __init__(self, catalog: MemoryCatalog, files: dict[str, DataFile], columns: list[SectionColumns]) -> None:
        self.cluster_id = CLUSTER_ID
        self.version = catalog.version
        self.topics = dict(catalog.topics)
        self.topic_ids = dict(catalog.topic_ids)
        self.set_aside: frozenset[TopicPartition] = frozenset()
        self._files = files
        self._compacted = {name: topic.config.compacted for name, topic in self.topics.items()}
        self._columns = columns
        self._above_l0: dict[TopicPartition, list[tuple[str, int, CatalogSection]]] | None = None
        self._summaries: dict[tuple[int, int], PartitionSummary] | None = None

    def __repr__(self) -> str:
        return f"MemorySnapshot(version {self.version})"

    def topic(self, name: str) -> Topic:
        try:
            return self.topics[name]
        except KeyError:
            raise TopicNotFoundError(f"topic {name!r} is not one of the simulated topics ({', '.join(self.topics)}); add it to the workload") from None

    # -- files ----------------------------------------------------------------------------------------

    def leased_files(self, now_ms: int) -> set[str]:
        return set()  # the simulator commits each plan as it is made

    def level_counts(self, excluding: Sequence[str] = ()) -> dict[int, int]:
        left_out = set(excluding)
        return dict(sorted(Counter(f.level for key, f in self._files.items() if key not in left_out).items()))

    def file_summaries(self, *levels: int) -> list[FileSummary]:
        return [self._summary(f) for f in self._ordered() if not levels or f.level in levels]

    def file_summaries_of(self, keys: Sequence[str]) -> list[FileSummary]:
        wanted = set(keys)
        return [self._summary(f) for key, f in self._files.items() if key in wanted]

    def files(self, level: int | None = None, topics: Iterable[str] | None = None) -> list[DataFile]:
        named = None if topics is None else set(topics)
        return [f for f in self._ordered() if (level is None or f.level == level) and (named is None or not named.isdisjoint(f.topics))]

    def get_files(self, keys: Sequence[str]) -> dict[str, DataFile]:
        wanted = set(keys)
        return {key: f for key, f in self._files.items() if key in wanted}

    def _ordered(self) -> list[DataFile]:
        return sorted(self._files.values(), key=lambda f: (f.level, f.created_ms, f.key))

    def _summary(self, data_file: DataFile) -> FileSummary:
        kinds = {self._compacted[topic] for topic in data_file.topics}
        content = CONTENTS[CONTENTS.index("mixed") if len(kinds) > 1 else int(kinds == {True})]
        return FileSummary(data_file.key, data_file.level, data_file.size, data_file.created_ms, data_file.record_count, content)

    # -- partitions -------------------------------------------------------------------------------------

    def _sections(self, keys: Iterable[str] | None = None) -> Iterable[tuple[DataFile, CatalogSection]]:
        """(file, section) of every live section, of the files `keys` only when given."""
        chosen = self._files.values() if keys is None else (self._files[key] for key in keys if key in self._files)
        return ((f, section) for f in chosen for section in f.sections)

    def _partitions_above_l0(self) -> dict[TopicPartition, list[tuple[str, int, CatalogSection]]]:
        """Per partition, (file key, level, section) of its live sections above L0, in first-offset order: the
        snapshot's `sections_by_partition`, built once."""
        if self._above_l0 is None:
            found: dict[TopicPartition, list[tuple[str, int, CatalogSection]]] = {}
            for f, section in self._sections():
                if f.level > 0:
                    found.setdefault((section.info.topic, section.info.partition), []).append((f.key, f.level, section))
            for held in found.values():
                held.sort(key=lambda entry: entry[2].first_offset)
            self._above_l0 = found
        return self._above_l0

    def lowest_offsets(self, keys: Sequence[str]) -> dict[TopicPartition, int]:
        found: dict[TopicPartition, int] = {}
        for _, section in self._sections(dict.fromkeys(keys)):
            tp = (section.info.topic, section.info.partition)
            found[tp] = min(section.first_offset, found.get(tp, section.first_offset))
        return found

    def outside_floors(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._outside_floors(input_keys, partitions, l0_only=False)

    def outside_floors_in_l0(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._outside_floors(input_keys, partitions, l0_only=True)

    def _outside_floors(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition], l0_only: bool) -> dict[TopicPartition, int]:
        wanted, inputs = set(partitions), set(input_keys)
        found: dict[TopicPartition, int] = {}
        for f, section in self._sections():
            tp = (section.info.topic, section.info.partition)
            if tp in wanted and f.key not in inputs and (f.level == 0 or not l0_only):
                found[tp] = min(section.first_offset, found.get(tp, section.first_offset))
        return found

    def floors_above_l0(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return {tp: None if summary is None else summary.floor for tp, summary in self.summaries_above_l0(partitions).items()}

    def summaries_above_l0(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, PartitionSummary | None]:
        if self._summaries is None:  # every partition's, once: the live files' sections above L0 summed in one step
            self._summaries = summaries.of_columns(*SectionColumns.concat(self._columns)) if self._columns else {}
        return {(topic, partition): self._summaries.get((self.topic_ids[topic], partition)) for topic, partition in partitions}

    def stable_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {}  # the simulator's producers are not transactional

    def aborted_ranges(self, spans: Mapping[TopicPartition, tuple[int, int]]) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
        return {}

    def first_uncleanable_offsets(self, partitions: Iterable[TopicPartition], now_ms: int, excluding: Sequence[str] = ()) -> dict[TopicPartition, int]:
        cuts = {name: now_ms - topic.config.min_compaction_lag_ms for name, topic in self.topics.items() if topic.config.min_compaction_lag_ms > 0}
        wanted = {tp for tp in partitions if tp[0] in cuts}
        left_out = set(excluding)
        found: dict[TopicPartition, int] = {}
        for f, section in self._sections():
            tp = (section.info.topic, section.info.partition)
            if tp in wanted and f.key not in left_out and section.info.max_timestamp > cuts[tp[0]]:
                found[tp] = min(section.first_offset, found.get(tp, section.first_offset))
        return found

    def sections_at_levels(self, partitions: Iterable[TopicPartition], from_level: int) -> list[LevelSection]:
        by_partition = self._partitions_above_l0()
        lowest = max(from_level, 1)
        return [
            LevelSection(key, tp[0], tp[1], section.first_offset, section.last_offset, section.info.uncompressed_bytes,
                         section.info.clean_below_delta > section.info.last_delta, section.info.max_timestamp)
            for tp in sorted(set(partitions), key=lambda tp: (self.topic_ids[tp[0]], tp[1]))
            for key, level, section in by_partition.get(tp, ()) if level >= lowest
        ]

    def partition_sections(self, topics: Iterable[str], in_l0: bool) -> list[PartitionSection]:
        named = set(topics)
        return [
            PartitionSection(f.key, f.level, section.info.topic, section.info.partition, section.first_offset, section.info.last_delta,
                             section.info.clean_below_delta, section.info.min_timestamp)
            for f, section in self._sections() if section.info.topic in named and (f.level == 0) == in_l0
        ]

    def files_holding(self, partitions: Iterable[TopicPartition]) -> set[str]:
        wanted = set(partitions)
        return {f.key for f, section in self._sections() if (section.info.topic, section.info.partition) in wanted}


