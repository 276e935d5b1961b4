"""How a plan's partitions are grouped and what planners read of its inputs: the groups of whole partitions a
plan is split into (`split_into_groups`), the inputs' offsets and sizes per partition (`input_offsets`), and the
outside floors the catalog sets (`lowest_outside`)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, NamedTuple, overload

import numpy as np

from logcompact.catalog import DataFile, TopicPartition
from logcompact.catalog.input_sections import InputSections
from logcompact.exceptions import CommitConflictError

if TYPE_CHECKING:  # a Spark task reads plans without loading the catalog's database layer
    from logcompact.catalog import PlanningSnapshot


class PlanGroup(NamedTuple):
    """A group of a plan: its whole topic-partitions from `first` to `last` in (topic, partition) order, and how
    many partitions and bytes it holds (its sections' uncompressed bytes: what a job decodes; small sections
    share their compressed blocks). Only a plan without sections has a group without partitions (`first` and
    `last` None)."""

    group: int
    first: TopicPartition | None
    last: TopicPartition | None
    partitions: int
    bytes: int

    def holds(self, tp: TopicPartition) -> bool:
        return self.first is not None and self.last is not None and self.first <= tp <= self.last


_NO_OFFSET = 1 << 63  # a partition without an outside floor or a first uncleanable offset


def lowest_outside(
    snapshot: PlanningSnapshot, inputs: Sequence[DataFile], partitions: set[TopicPartition], held: dict[TopicPartition, int] | None = None
) -> dict[TopicPartition, int]:
    """Per partition of `partitions`, the lowest offset held by a live file outside `inputs`: the outside floors of
    a plan, or of the plans, taking `inputs`. Above L0 it is the floor the catalog keeps (`Snapshot.floors_above_l0`)
    unless the inputs hold it (`held`: their lowest offsets above L0, when the caller has them), or the snapshot is
    older than it: those partitions' sections are read. Below, the live L0 files outside `inputs` are read: a few
    hundred at most."""
    if not partitions:
        return {}
    if held is None:
        held = input_offsets(inputs).lowest_above_l0
    return lowest_outside_of_keys(snapshot, input_keys(inputs), partitions, held)


def lowest_outside_of_keys(
    snapshot: PlanningSnapshot, keys: Sequence[str], partitions: set[TopicPartition], held: dict[TopicPartition, int],
    outside_in_hand: Callable[[set[TopicPartition], bool], dict[TopicPartition, int]] | None = None,
) -> dict[TopicPartition, int]:
    """`lowest_outside` of the input files `keys`, whose lowest offsets above L0 are `held`. `outside_in_hand`, when
    the caller holds every live file's sections, gives what would be read of the files outside `keys`: the lowest
    offsets of the partitions it is given, in every level or (True) in L0 only."""
    if not partitions:
        return {}
    floors = snapshot.floors_above_l0(partitions)
    read = {tp for tp in partitions if tp not in floors or _held_floor(held.get(tp), floors[tp])}
    if outside_in_hand is not None:
        found = outside_in_hand(read, False) if read else {}
        found.update(outside_in_hand(partitions - read, True))
    else:
        found = _read_outside(snapshot, keys, read) if read else {}
        found.update(snapshot.outside_floors_in_l0(keys, partitions - read))
    for tp in partitions - read:
        floor = floors[tp]
        if floor is not None:
            found[tp] = min(floor, found.get(tp, floor))
    return found


def _read_outside(snapshot: PlanningSnapshot, keys: Sequence[str], partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
    """`lowest_outside` read from the sections: those of the files outside `keys`, or those of the partitions,
    whichever costs less. A partition's sections are found through an index, about four times the cost of a file's
    (measured on SQLite; PostgreSQL is cheaper either way), so a plan of nearly every file reads by file."""
    live = sum(snapshot.level_counts().values())
    outside = live - len(keys)
    if outside <= 0:
        return {}
    if 4 * live * len(partitions) < outside * sum(topic.partitions for topic in snapshot.topics.values()):
        return snapshot.outside_floors(keys, partitions)
    taken = set(keys)
    unplanned = [f.key for f in snapshot.file_summaries() if f.key not in taken]
    return {tp: offset for tp, offset in snapshot.lowest_offsets(unplanned).items() if tp in partitions}


def _held_floor(inputs_lowest: int | None, floor: int | None) -> bool:
    """Do the inputs hold the partition's floor above L0 (their lowest offset there at or below it)?"""
    return inputs_lowest is not None and floor is not None and inputs_lowest <= floor


class PlannedInputs(Sequence[DataFile]):
    """A plan's input files as a planning pass leaves them: their keys, levels, sizes and creation times, with their
    sections still in the catalog. The planner decides from the sections' columns (`Snapshot.section_columns`), so a
    pass builds no section object; the files with their sections are loaded on first use (`load`: one read for every
    plan of the pass) and must hold as many sections as the pass weighed, or the catalog changed under the snapshot.
    The header (`header_files`), the keys and the count need no load; the sections as columns (`columns`: what the
    plan's documents and its hidden offsets are made from) are read by `read` in one query of the plan's files, when
    given it (files in hand are converted). Pickled or copied, it is the loaded tuple."""

    def __init__(
        self, keys: Sequence[str], levels: Sequence[int], sizes: Sequence[int], created_ms: Sequence[int], sections: int,
        load: Callable[[Sequence[str]], Mapping[str, DataFile]], read: Callable[[Sequence[str]], InputSections] | None = None,
    ) -> None:
        self.keys = list(keys)
        self._described = (list(levels), list(sizes), list(created_ms))
        self._sections = sections
        self._load = load
        self._read = read
        self._files: tuple[DataFile, ...] | None = None
        self._columns: InputSections | None = None

    def header_files(self) -> list[tuple[str, int, int, int]]:
        """(key, level, size, created_ms) of each file, in order."""
        return list(zip(self.keys, *self._described))

    def files(self) -> tuple[DataFile, ...]:
        if self._files is None:
            loaded = self._load(self.keys)
            files = tuple(loaded[key] for key in self.keys if key in loaded)
            _check_read(self.keys, [f.key for f in files], sum(len(f.sections) for f in files), self._sections)
            self._files = files
        return self._files

    def columns(self) -> InputSections:
        if self._columns is None:
            if self._read is None or self._files is not None:
                self._columns = InputSections.from_files(self.files())
            else:
                read = self._read(self.keys)
                _check_read(self.keys, read.keys, len(read), self._sections)
                self._columns = read
        return self._columns

    def __len__(self) -> int:
        return len(self.keys)

    @overload
    def __getitem__(self, index: int) -> DataFile: ...
    @overload
    def __getitem__(self, index: slice) -> tuple[DataFile, ...]: ...
    def __getitem__(self, index: int | slice) -> DataFile | tuple[DataFile, ...]:
        return self.files()[index]

    def __iter__(self) -> Iterator[DataFile]:
        return iter(self.files())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, PlannedInputs):
            other = other.files()
        return isinstance(other, tuple) and self.files() == other

    def __hash__(self) -> int:
        return hash(self.files())

    def __repr__(self) -> str:
        return f"PlannedInputs({len(self.keys)} files)"

    def __reduce__(self) -> tuple:
        return (tuple, (self.files(),))


def _check_read(keys: Sequence[str], found: Sequence[str], sections: int, planned: int) -> None:
    """The files `keys` read back as `found` with `sections` sections: as planned, or a conflict."""
    if len(found) != len(keys) or sections != planned:
        read = set(found)
        missing = [key for key in keys if key not in read]
        gone = f"file {missing[0]} is no longer live" if missing else "its files' sections changed"
        raise CommitConflictError(f"a plan's inputs were read as planned, but {gone} in the catalog since; plan again")


def input_sections(inputs: Sequence[DataFile]) -> InputSections:
    """The sections of a plan's inputs as columns: planned inputs' read in one query, files in hand converted."""
    return inputs.columns() if isinstance(inputs, PlannedInputs) else InputSections.from_files(inputs)


class PartitionSpans(NamedTuple):
    """What `Plan.hidden_offsets` takes from a plan's inputs (`partition_spans`)."""

    gapped: dict[TopicPartition, list[tuple[int, int]]]  # the partitions whose spans may leave offsets unheld, with them
    lowest_above_l0: dict[TopicPartition, int]  # the lowest first offset of its sections above L0


def partition_spans(sections: InputSections, starts: Mapping[TopicPartition, int]) -> PartitionSpans:
    """Per partition, the (first, last) offsets of the sections of `sections` that count for its holes (all of them at
    L0; above L0 only of partitions not in `starts`, those never compacted, with their log starts), for the partitions
    where they may leave offsets unheld: from its log start where `starts` gives one, between them otherwise. Found over
    the columns by partition (sorted by first offset, a running end each): spans built only for those."""
    table = sections.table
    if not table.num_rows:
        return PartitionSpans({}, {})
    topics = table.column("topic").combine_chunks().dictionary_encode()
    names = topics.dictionary.to_pylist()
    codes = (topics.indices.to_numpy().astype(np.int64) << 32) | sections.integers("partition")
    first = sections.integers("first_offset")
    last = first + sections.integers("last_delta")
    upper = sections.levels[sections.integers("file")] > 0
    lowest_above: dict[TopicPartition, int] = {}
    if upper.any():
        order = np.argsort(codes[upper], kind="stable")
        above, firsts = codes[upper][order], first[upper][order]
        heads = np.flatnonzero(np.concatenate(([True], above[1:] != above[:-1])))
        for code, low in zip(above[heads].tolist(), np.minimum.reduceat(firsts, heads).tolist()):
            lowest_above[(names[code >> 32], code & 0xFFFFFFFF)] = low
    start_of = {code: starts.get((names[code >> 32], code & 0xFFFFFFFF)) for code in np.unique(codes).tolist()}
    never_compacted = np.array([code for code, start in start_of.items() if start is not None], np.int64)
    counted = ~upper | ~np.isin(codes, never_compacted)
    codes, first, last = codes[counted], first[counted], last[counted]
    order = np.lexsort((first, codes))
    codes, first, last = codes[order], first[order], last[order]
    heads = np.flatnonzero(np.concatenate(([True], codes[1:] != codes[:-1])))
    gapped: dict[TopicPartition, list[tuple[int, int]]] = {}
    for head, end in zip(heads.tolist(), [*heads[1:].tolist(), len(codes)]):
        firsts, reached = first[head:end], np.maximum.accumulate(last[head:end])
        start = start_of[int(codes[head])]
        if (start is not None and start < firsts[0]) or (firsts[1:] > reached[:-1] + 1).any():
            code = int(codes[head])
            gapped[(names[code >> 32], code & 0xFFFFFFFF)] = list(zip(firsts.tolist(), last[head:end].tolist()))
    return PartitionSpans(gapped, lowest_above)


def input_keys(inputs: Sequence[DataFile]) -> list[str]:
    """The keys of a plan's inputs, without loading planned inputs' sections."""
    return list(inputs.keys) if isinstance(inputs, PlannedInputs) else [f.key for f in inputs]


class InputOffsets(NamedTuple):
    """What planners take from a plan's inputs, per topic-partition (`input_offsets`)."""

    lowest: dict[TopicPartition, int]  # the lowest first offset of its sections
    sizes: dict[TopicPartition, int]  # their uncompressed bytes (what groups are split by)
    lowest_above_l0: dict[TopicPartition, int]  # the lowest first offset of its sections above L0
    young: dict[TopicPartition, int]  # the first offset of the first section holding a record newer than `young_after`'s
    ends: dict[TopicPartition, int]  # the offset past its sections' last


def input_offsets(inputs: Iterable[DataFile], young_after: Mapping[str, int] | None = None) -> InputOffsets:
    """`InputOffsets` of `inputs`, in one pass: planners walk hundreds of thousands of sections. `young_after`: per
    topic with a min lag, the newest timestamp old enough to clean (none: `young` left empty)."""
    lowest: dict[TopicPartition, int] = {}
    sizes: dict[TopicPartition, int] = {}
    above: dict[TopicPartition, int] = {}
    young: dict[TopicPartition, int] = {}
    ends: dict[TopicPartition, int] = {}
    held, cut = lowest.get, (young_after or {}).get
    for data_file in inputs:
        upper = data_file.level > 0
        for info, first in data_file.sections:
            tp = (info.topic, info.partition)
            low = held(tp)
            end = first + info.last_delta + 1
            if low is None:
                lowest[tp], sizes[tp], ends[tp] = first, info.uncompressed_bytes, end
            else:
                if first < low:
                    lowest[tp] = first
                if end > ends[tp]:
                    ends[tp] = end
                sizes[tp] += info.uncompressed_bytes
            if upper and first < above.get(tp, _NO_OFFSET):
                above[tp] = first
            newest = cut(info.topic)
            if newest is not None and info.max_timestamp > newest and first < young.get(tp, _NO_OFFSET):
                young[tp] = first
    return InputOffsets(lowest, sizes, above, young, ends)


def split_into_groups(sizes: dict[TopicPartition, int], group_bytes: int | None) -> tuple[PlanGroup, ...]:
    """Groups of whole partitions in (topic, partition) order, each holding at most about `group_bytes` of the
    inputs' sections, uncompressed (`sizes`, from `input_offsets`; a partition larger than that is a group of
    its own). None: one group of every partition."""
    runs: list[list[TopicPartition]] = []
    total = 0
    for tp in sorted(sizes):
        if not runs or (group_bytes is not None and total + sizes[tp] > group_bytes):
            runs.append([])
            total = 0
        runs[-1].append(tp)
        total += sizes[tp]
    if not runs:
        return (PlanGroup(0, None, None, 0, 0),)
    return tuple(PlanGroup(number, run[0], run[-1], len(run), sum(sizes[tp] for tp in run)) for number, run in enumerate(runs))
