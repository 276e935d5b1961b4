"""The simulator's catalog: live files held in memory as columns, read by the real planner as it reads the database.

A simulated hour of the WarpStream-like workload appends 4.5 million sections in L1 files alone; the real catalog
inserts a row for each. This one keeps the simulator's files as they are made (`SimulatedFile`, a file's sections as
arrays), places offsets as `Catalog.append_files` does, commits all or nothing, and answers what planners read of a
snapshot (`PlanningSnapshot`) from those arrays as the database answers it: the same files in the same order, the same
minimums, the same partition summaries, the same sections' columns (`section_columns`, the arrays concatenated, which
planning passes weigh and plan from); a file is made into the objects `get_files` returns (`DataFile`) only when one
asks for it, once. `tests/test_simulate.py` checks each answer against the real catalog's, and runs the simulator on
both catalogs for the same figures.

What it leaves out, the simulator never does: leases (its plans commit at once), partitions set aside as uncleanable,
topics with time retention, and reading an older version.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

import numpy as np

from logcompact import sketch
from logcompact.catalog import CommitResult, DataFile, FileSummary, LevelSection, NewFile, PartitionSection, PartitionSummary
from logcompact.catalog.columns import SectionColumns
from logcompact.catalog.database import SHORT_LIST
from logcompact.catalog.model import TopicPartition
from logcompact.catalog.snapshot import MOST_FILES
from logcompact.exceptions import CommitConflictError, TopicNotFoundError
from logcompact.lab.simulate.files import Layout, Sections, SimulatedFile, merge_sketches
from logcompact.topics import Topic

CLUSTER_ID = "simulated"
_NO_OFFSET = np.iinfo(np.int64).max


class MemoryCatalog:
    """What the simulator asks of `Catalog`: topics, appends, a compaction's swap and the newest snapshot; and, for
    the simulator itself, its live files as columns."""

    def __init__(self, topics: Sequence[Topic]) -> None:
        for topic in topics:
            if topic.config.time_retention:
                raise ValueError(f"topic {topic.name!r}: the simulator's catalog keeps no time retention; set retention.ms to -1")
        self.topics = {topic.name: topic for topic in topics}
        self.topic_ids = {topic.name: number for number, topic in enumerate(topics, start=1)}  # as created, from 1
        self.layout = Layout(topics)
        self.version = 1
        self._files: dict[str, SimulatedFile] = {}  # live files in the order they were added, as file ids order them
        self._next_offsets = np.zeros(self.layout.size, dtype=np.int64)  # by slot

    # -- the simulator's columns ---------------------------------------------------------------------

    def append(self, new_files: Sequence[SimulatedFile], now_ms: int) -> tuple[int, list[SimulatedFile]]:
        """Add ingested files, each section at the next offset of its partition, in one commit; returns the version
        created and the files placed (`now_ms` dates nothing here: no producer state)."""
        next_offsets = self._next_offsets.copy()  # kept only if the commit is
        placed = []
        for new in new_files:
            _check_one_section_a_partition(new)
            placed.append(new.placed(next_offsets[new.slot]))
            next_offsets[new.slot] += new.last_delta + 1
        version = self._commit([], placed)
        self._next_offsets = next_offsets
        return version, placed

    def replace(self, removed: Sequence[str], added: Sequence[SimulatedFile], now_ms: int, plan_id: str | None = None) -> CommitResult:
        """Swap live files for a compaction's outputs (offsets already assigned), as `Catalog.replace_files` does for a
        plan not committed before (this catalog records neither plans nor the clock)."""
        return CommitResult(self._commit(removed, added), True)

    def files(self, keys: Iterable[str]) -> list[SimulatedFile]:
        """The live files among `keys`, in that order."""
        return [self._files[key] for key in keys if key in self._files]

    def live(self) -> list[SimulatedFile]:
        return list(self._files.values())

    def level_count(self, level: int) -> int:
        return sum(1 for f in self._files.values() if f.level == level)

    # -- as `Catalog` -----------------------------------------------------------------------------

    def append_files(self, new_files: Sequence[NewFile], now_ms: int) -> tuple[int, list[list[int]]]:
        """`append` of files as objects; returns each file's sections' first offsets, as `Catalog.append_files` does."""
        version, placed = self.append([SimulatedFile.of_new_file(new, self.layout) for new in new_files], now_ms)
        return version, [f.offsets.tolist() for f in placed]

    def replace_files(self, removed: Sequence[str], added: Sequence[DataFile], now_ms: int, *, plan_id: str | None = None) -> CommitResult:
        """`replace` with the outputs as objects."""
        return self.replace(removed, [SimulatedFile.of_data_file(f, self.layout) for f in added], now_ms, plan_id)

    def snapshot(self) -> MemorySnapshot:
        return MemorySnapshot(self, dict(self._files))

    def _commit(self, removed: Sequence[str], added: Sequence[SimulatedFile]) -> int:
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
            _check_one_section_a_partition(data_file)
        for key in removed:
            del self._files[key]
        self._files.update((data_file.key, data_file) for data_file in added)
        self.version += 1
        return self.version


def _check_one_section_a_partition(data_file: SimulatedFile) -> None:
    slots = data_file.slot
    if len(slots) > 1 and not (slots[1:] > slots[:-1]).all() and len(np.unique(slots)) < len(slots):
        raise ValueError(f"file {data_file.key} holds two sections of one partition; a file holds one section a partition")


class MemorySnapshot:
    """The simulated catalog as of one version: the answers of `Snapshot` that the planners read."""

    def __init__(self, catalog: MemoryCatalog, files: dict[str, SimulatedFile]) -> None:
        self.cluster_id = CLUSTER_ID
        self.version = catalog.version
        self.topics = dict(catalog.topics)
        self.topic_ids = dict(catalog.topic_ids)
        self.set_aside: frozenset[TopicPartition] = frozenset()
        self.layout = catalog.layout
        self._files = files
        self._positions = {key: number for number, key in enumerate(files)}
        self._all: Sections | None = None
        self._summaries: list[PartitionSummary | None] | None = None

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
        numbers = None if topics is None else {self.layout.names.index(name) for name in topics if name in self.layout.bases}
        return [
            f.data_file(self.layout) for f in self._ordered()
            if (level is None or f.level == level) and (numbers is None or not numbers.isdisjoint(f.topic_numbers(self.layout)))
        ]

    def get_files(self, keys: Sequence[str]) -> dict[str, DataFile]:
        wanted = set(keys)
        return {key: f.data_file(self.layout) for key, f in self._files.items() if key in wanted}

    def section_columns(self, keys: Sequence[str] | None = None, topics: Iterable[str] | None = None, timestamps: bool = True) -> SectionColumns:
        """`Snapshot.section_columns`: the live files among `keys` (every live file without them, those holding any of
        `topics` with them) in `file_summaries`' order, with their sections' columns, the files' arrays concatenated
        (their sections in file order); the keys are not matched when they are most of the live files, as there."""
        layout = self.layout
        chosen = self._ordered()
        if topics is not None:
            wanted_topics = np.zeros(len(layout.names), dtype=bool)
            wanted_topics[[layout.names.index(self.topic(name).name) for name in topics]] = True
            chosen = [f for f in chosen if wanted_topics[layout.topic_of_slot[f.slot]].any()]
        matched = keys is not None and (len(keys) <= SHORT_LIST or len(keys) < MOST_FILES * len(self._files))
        if matched:
            wanted = set(keys or ())
            chosen = [f for f in chosen if f.key in wanted]
        counts = [len(f) for f in chosen]

        def joined(values: Iterable[np.ndarray]) -> np.ndarray:
            return np.concatenate(list(values)) if chosen else np.zeros(0, dtype=np.int64)

        slot, first = joined(f.slot for f in chosen), joined(f.offsets for f in chosen)
        return SectionColumns(
            [f.key for f in chosen], np.array([f.level for f in chosen], dtype=np.int64), np.array([f.size for f in chosen], dtype=np.int64),
            np.array([f.created_ms for f in chosen], dtype=np.int64), [f.content(layout) for f in chosen], not matched and topics is None,
            sorted(layout.names), np.repeat(np.arange(len(chosen), dtype=np.int64), counts), layout.name_rank_of_slot[slot],
            layout.partition_of_slot[slot], first, first + joined(f.last_delta for f in chosen), joined(f.uncompressed_bytes for f in chosen),
            joined(f.max_timestamp for f in chosen) if timestamps else None,
        )

    def _ordered(self) -> list[SimulatedFile]:
        return sorted(self._files.values(), key=lambda f: (f.level, f.created_ms, f.key))

    def _summary(self, data_file: SimulatedFile) -> FileSummary:
        return FileSummary(data_file.key, data_file.level, data_file.size, data_file.created_ms, data_file.records, data_file.content(self.layout))

    # -- partitions -------------------------------------------------------------------------------------

    def _sections(self) -> Sections:
        """Every live section, file after file in the catalog's order, built once."""
        if self._all is None:
            self._all = Sections.of(list(self._files.values()))
        return self._all

    def _files_mask(self, keys: Iterable[str]) -> np.ndarray:
        """A boolean per live file (in the catalog's order): is it one of `keys`?"""
        chosen = np.zeros(len(self._files), dtype=bool)
        chosen[[self._positions[key] for key in keys if key in self._positions]] = True
        return chosen

    def lowest_offsets(self, keys: Sequence[str]) -> dict[TopicPartition, int]:
        sections = self._sections()
        held = sections.take(self._files_mask(keys)[sections.file])
        return self.layout.lowest(held.slot, held.first_offset)

    def outside_floors(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._outside_floors(input_keys, partitions, l0_only=False)

    def outside_floors_in_l0(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return self._outside_floors(input_keys, partitions, l0_only=True)

    def _outside_floors(self, input_keys: Sequence[str], partitions: Iterable[TopicPartition], l0_only: bool) -> dict[TopicPartition, int]:
        sections = self._sections()
        if l0_only and not (sections.level == 0).any():
            return {}
        chosen = ~self._files_mask(input_keys)[sections.file] & self.layout.mask(partitions)[sections.slot]
        if l0_only:
            chosen &= sections.level == 0
        held = sections.take(chosen)
        return self.layout.lowest(held.slot, held.first_offset)

    def floors_above_l0(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int | None]:
        return {tp: None if summary is None else summary.floor for tp, summary in self.summaries_above_l0(partitions).items()}

    def summaries_above_l0(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, PartitionSummary | None]:
        if self._summaries is None:  # every partition's, once: the live files' sections above L0 summed in vectorized steps
            self._summaries = self._summed_above_l0()
        bases, summed = self.layout.bases, self._summaries
        return {(topic, partition): summed[bases[topic] + partition] for topic, partition in partitions}

    def _summed_above_l0(self) -> list[PartitionSummary | None]:
        """Per slot, the summary of its live sections above L0 as `summaries.of_columns` makes it (None: no section):
        the base is the section with the lowest first offset."""
        size = self.layout.size
        sections = self._sections()
        if (sections.level == 0).any():
            sections = sections.take(sections.level > 0)
        slot = sections.slot
        count = np.bincount(slot, minlength=size)

        def summed(values: np.ndarray) -> np.ndarray:
            total = np.zeros(size, dtype=np.int64)
            np.add.at(total, slot, values)
            return total

        floor = np.full(size, _NO_OFFSET, dtype=np.int64)
        np.minimum.at(floor, slot, sections.first_offset)
        # The base: the first section (in the catalog's order) at its partition's floor.
        at_floor = np.flatnonzero(sections.first_offset == floor[slot])
        base = np.full(size, len(slot), dtype=np.int64)
        np.minimum.at(base, slot[at_floor], at_floor)
        others = np.full(size, _NO_OFFSET, dtype=np.int64)
        not_base = np.ones(len(slot), dtype=bool)
        not_base[base[count > 0]] = False
        np.minimum.at(others, slot[not_base], sections.min_timestamp[not_base])
        newest = np.full(size, np.iinfo(np.int64).min, dtype=np.int64)
        np.maximum.at(newest, slot, sections.created_ms)
        registers = np.zeros((size, sketch.REGISTERS), dtype=np.uint8)
        for f in self._files.values():
            if f.level > 0:
                merge_sketches(registers, f.slot, f.registers)
        present = np.flatnonzero(count)
        rows = base[present]
        columns = zip(
            count[present].tolist(), summed(sections.uncompressed_bytes)[present].tolist(),
            summed(np.where(sections.level == 1, sections.uncompressed_bytes, 0))[present].tolist(), summed(sections.record_count)[present].tolist(),
            floor[present].tolist(), sections.level[rows].tolist(), sections.clean[rows].tolist(), sections.uncompressed_bytes[rows].tolist(),
            sections.min_timestamp[rows].tolist(), others[present].tolist(), newest[present].tolist(), sketch.encode_rows(registers[present]),
        )
        found: list[PartitionSummary | None] = [None] * size
        for slot_number, (held, total, l1, records, first, level, clean, base_bytes, base_min, others_min, created, packed) in zip(present.tolist(), columns):
            found[slot_number] = PartitionSummary(
                held, total, l1, records, first, level, clean, base_bytes, base_min, others_min if held > 1 else None, created, packed
            )
        return found

    def stable_offsets(self, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        return {}  # the simulator's producers are not transactional

    def aborted_ranges(self, spans: Mapping[TopicPartition, tuple[int, int]]) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
        return {}

    def first_uncleanable_offsets(self, partitions: Iterable[TopicPartition], now_ms: int, excluding: Sequence[str] = ()) -> dict[TopicPartition, int]:
        layout = self.layout
        cuts = np.array([now_ms - topic.config.min_compaction_lag_ms if topic.config.min_compaction_lag_ms > 0 else _NO_OFFSET
                         for topic in layout.topics], dtype=np.int64)
        if (cuts == _NO_OFFSET).all():
            return {}
        sections = self._sections()
        slot = sections.slot
        young = layout.mask(partitions)[slot] & ~self._files_mask(excluding)[sections.file] & (sections.max_timestamp > cuts[layout.topic_of_slot[slot]])
        held = sections.take(young & (cuts[layout.topic_of_slot[slot]] != _NO_OFFSET))
        return layout.lowest(held.slot, held.first_offset)

    def sections_at_levels(self, partitions: Iterable[TopicPartition], from_level: int) -> list[LevelSection]:
        sections = self._sections()
        held = sections.take(self.layout.mask(partitions)[sections.slot] & (sections.level >= max(from_level, 1)))
        order = np.lexsort((held.first_offset, held.slot))  # by (topic id, partition), then offset; ties in file order
        held = held.take(order)
        keys = list(self._files)
        return list(map(LevelSection._make, zip(
            map(keys.__getitem__, held.file.tolist()), map(self.layout.name_of_slot.__getitem__, held.slot.tolist()),
            self.layout.partition_of_slot[held.slot].tolist(), held.first_offset.tolist(), held.last_offset.tolist(),
            held.uncompressed_bytes.tolist(), held.clean.tolist(), held.max_timestamp.tolist(),
        )))

    def partition_sections(self, topics: Iterable[str], in_l0: bool) -> list[PartitionSection]:
        layout = self.layout
        numbers = [layout.names.index(name) for name in set(topics) if name in layout.bases]
        sections = self._sections()
        held = sections.take(np.isin(layout.topic_of_slot[sections.slot], numbers) & ((sections.level == 0) == in_l0))
        keys = list(self._files)
        return [
            PartitionSection(*row) for row in zip(
                map(keys.__getitem__, held.file.tolist()), held.level.tolist(), map(layout.name_of_slot.__getitem__, held.slot.tolist()),
                layout.partition_of_slot[held.slot].tolist(), held.first_offset.tolist(), held.last_delta.tolist(),
                held.clean_below_delta.tolist(), held.min_timestamp.tolist(),
            )
        ]

    def files_holding(self, partitions: Iterable[TopicPartition]) -> set[str]:
        wanted = self.layout.mask(partitions)
        return {f.key for f in self._files.values() if wanted[f.slot].any()}
