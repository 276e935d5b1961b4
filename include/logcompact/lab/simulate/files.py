"""The simulator's files as columns: one array a section field, one entry a section, in the file's order.

A simulated hour of the WarpStream-like workload makes 4.5 million sections in L1 files alone; the simulated ingest,
the catalog in memory, the cost model and the records followed to their deduplication work on these arrays, and the
real planner reads their columns (`MemorySnapshot.section_columns`). A file is made into the object the catalog
returns (`DataFile`) only when something asks for it whole, once.

Partitions are numbered topic-major (`Layout`): a partition's slot is its topic's first slot plus its number, topics
in the order the catalog created them (by topic id), so slots sort as the catalog orders partitions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property
from itertools import repeat

import numpy as np

from logcompact import sketch
from logcompact.catalog import CatalogSection, DataFile, NewFile, TopicPartition
from logcompact.exceptions import InvalidRecordError, TopicNotFoundError
from logcompact.format.layout import SectionInfo
from logcompact.topics import Topic

# Named tuples are built from rows of columns by `tuple.__new__`, which checks no field count: these are the fields
# `SimulatedFile.data_file` fills, in order.
assert SectionInfo._fields == (
    "topic", "partition", "record_count", "last_delta", "min_timestamp", "max_timestamp", "tombstones", "uncompressed_bytes",
    "compression", "crc32", "byte_offset", "byte_length", "clean_below_delta", "key_sketch", "first_row",
), "SectionInfo changed: update SimulatedFile.data_file"
assert CatalogSection._fields == ("info", "first_offset"), "CatalogSection changed: update SimulatedFile.data_file"
_new_tuple = tuple.__new__


class Layout:
    """The partitions of the simulated topics, numbered by slot: topic-major, topics in the catalog's order."""

    def __init__(self, topics: Sequence[Topic]) -> None:
        self.topics = list(topics)
        self.names = [topic.name for topic in topics]
        counts = np.array([topic.partitions for topic in topics], dtype=np.int64)
        self.bases = dict(zip(self.names, (np.cumsum(counts) - counts).tolist()))
        self.size = int(counts.sum())
        self.topic_of_slot = np.repeat(np.arange(len(topics)), counts)
        self.partition_of_slot = np.arange(self.size) - (np.cumsum(counts) - counts)[self.topic_of_slot]
        self.name_of_slot = [self.names[number] for number in self.topic_of_slot.tolist()]
        # Plans and the cost model order partitions by topic name: each slot's topic's rank among the names.
        ranks = {name: rank for rank, name in enumerate(sorted(self.names))}
        self.name_rank_of_slot = np.array([ranks[name] for name in self.name_of_slot], dtype=np.int64)
        self.compacted_of_slot = np.array([topics[number].config.compacted for number in self.topic_of_slot.tolist()], dtype=bool)

    def slot(self, topic: str, partition: int) -> int:
        """The slot of a partition; a clear error for a topic or partition the workload does not have."""
        base = self.bases.get(topic)
        if base is None:
            raise TopicNotFoundError(f"topic {topic!r} is not one of the simulated topics ({', '.join(self.names)}); add it to the workload")
        count = self.topics[self.names.index(topic)].partitions
        if not 0 <= partition < count:
            raise InvalidRecordError(f"topic {topic!r} has partitions 0 to {count - 1}, not {partition}")
        return base + partition

    def slots(self, partitions: Iterable[TopicPartition]) -> np.ndarray:
        """The slots of `partitions` (each once, in slot order); partitions of other topics are left out."""
        bases = self.bases
        found = [bases[topic] + partition for topic, partition in partitions if topic in bases]
        return np.unique(np.array(found, dtype=np.int64))

    def mask(self, partitions: Iterable[TopicPartition]) -> np.ndarray:
        """A boolean per slot: is it one of `partitions`?"""
        wanted = np.zeros(self.size, dtype=bool)
        wanted[self.slots(partitions)] = True
        return wanted

    def partitions(self, slots: np.ndarray) -> list[TopicPartition]:
        return list(zip(map(self.name_of_slot.__getitem__, slots.tolist()), self.partition_of_slot[slots].tolist()))

    def by_partition(self, slots: np.ndarray, values: np.ndarray) -> dict[TopicPartition, int]:
        """{partition: value} of parallel arrays of slots and values."""
        return dict(zip(self.partitions(slots), values.tolist()))

    def lowest(self, slots: np.ndarray, values: np.ndarray) -> dict[TopicPartition, int]:
        """Per slot among `slots`, the lowest of its `values`, by partition (in slot order)."""
        if not len(slots):
            return {}
        lowest = np.full(self.size, np.iinfo(np.int64).max, dtype=np.int64)
        np.minimum.at(lowest, slots, values)
        held = np.flatnonzero(np.bincount(slots, minlength=self.size))
        return self.by_partition(held, lowest[held])


def merge_sketches(merged: np.ndarray, rows: np.ndarray, registers: np.ndarray) -> None:
    """Merge key sketches into rows of `merged` in place: `merged[rows[i]]` takes the larger registers of itself and
    `registers[i]` (`rows` distinct: a file holds one section a partition). A file of every row, in order (most L1
    files: 8,000 records over 1,000 partitions), is merged without gathering its rows."""
    if len(rows) == len(merged) and (len(rows) == 0 or (rows[0] == 0 and rows[-1] == len(rows) - 1 and (np.diff(rows) == 1).all())):
        np.maximum(merged, registers, out=merged)
    else:
        merged[rows] = np.maximum(merged[rows], registers)


@dataclass(eq=False)
class SimulatedFile:
    """A live (or new) file: its header, and its sections' fields as parallel arrays (int64 but `compression`, and
    `registers`, each section's key sketch unpacked: a row of `sketch.REGISTERS` uint8, all zero for no keys).
    `first_offset` is None until the catalog places the file in its partitions' offsets."""

    key: str
    level: int
    size: int
    created_ms: int
    slot: np.ndarray
    record_count: np.ndarray
    last_delta: np.ndarray
    min_timestamp: np.ndarray
    max_timestamp: np.ndarray
    tombstones: np.ndarray
    uncompressed_bytes: np.ndarray
    compression: list[str]
    crc32: np.ndarray
    byte_offset: np.ndarray
    byte_length: np.ndarray
    clean_below_delta: np.ndarray
    registers: np.ndarray
    first_row: np.ndarray
    first_offset: np.ndarray | None = None
    _data_file: DataFile | None = field(default=None, init=False, repr=False)  # made by `data_file`

    def __len__(self) -> int:
        return len(self.slot)

    def placed(self, first_offset: np.ndarray) -> SimulatedFile:
        return replace(self, first_offset=first_offset)

    @property
    def offsets(self) -> np.ndarray:
        if self.first_offset is None:
            raise ValueError(f"file {self.key} is not placed in its partitions' offsets yet; append it to the catalog first")
        return self.first_offset

    @cached_property
    def records(self) -> int:
        return int(self.record_count.sum())

    def topic_numbers(self, layout: Layout) -> set[int]:
        return set(np.unique(layout.topic_of_slot[self.slot]).tolist())

    def content(self, layout: Layout) -> str:
        """What it holds, as planners ask (`CONTENTS`): compacted topics' records, the others', or both."""
        compacted = layout.compacted_of_slot[self.slot]
        return "compacted" if len(compacted) and compacted.all() else "mixed" if compacted.any() else "other"

    def sections(self, layout: Layout) -> tuple[SectionInfo, ...]:
        """Its sections as a file describes them (offsets as deltas)."""
        columns = [
            column.tolist() for column in (
                self.record_count, self.last_delta, self.min_timestamp, self.max_timestamp, self.tombstones, self.uncompressed_bytes,
            )
        ]
        return tuple(map(_new_tuple, repeat(SectionInfo), zip(
            map(layout.name_of_slot.__getitem__, self.slot.tolist()), layout.partition_of_slot[self.slot].tolist(), *columns,
            self.compression, self.crc32.tolist(), self.byte_offset.tolist(), self.byte_length.tolist(), self.clean_below_delta.tolist(),
            sketch.encode_rows(self.registers), self.first_row.tolist(),
        )))

    def data_file(self, layout: Layout) -> DataFile:
        """The placed file as the catalog returns it, made once."""
        if self._data_file is None:
            sections = tuple(map(_new_tuple, repeat(CatalogSection), zip(self.sections(layout), self.offsets.tolist())))
            self._data_file = DataFile(self.key, self.level, self.size, self.created_ms, sections)
        return self._data_file

    def new_file(self, layout: Layout) -> NewFile:
        return NewFile(self.key, self.level, self.size, self.created_ms, self.sections(layout))

    @classmethod
    def of_sections(cls, key: str, level: int, size: int, created_ms: int, infos: Sequence[SectionInfo], layout: Layout,
                    first_offset: Sequence[int] | None = None) -> SimulatedFile:
        """A file from its sections as objects; a clear error for a partition the layout does not have."""
        slots = np.array([layout.slot(info.topic, info.partition) for info in infos], dtype=np.int64)
        fields = dict(zip(SectionInfo._fields, zip(*infos))) if infos else dict.fromkeys(SectionInfo._fields, ())

        def column(name: str) -> np.ndarray:
            return np.array(fields[name], dtype=np.int64)

        return cls(
            key, level, size, created_ms, slots, column("record_count"), column("last_delta"), column("min_timestamp"),
            column("max_timestamp"), column("tombstones"), column("uncompressed_bytes"), list(fields["compression"]), column("crc32"),
            column("byte_offset"), column("byte_length"), column("clean_below_delta"), sketch.decode_rows(fields["key_sketch"]),
            column("first_row"), None if first_offset is None else np.array(first_offset, dtype=np.int64),
        )

    @classmethod
    def of_new_file(cls, new: NewFile, layout: Layout) -> SimulatedFile:
        return cls.of_sections(new.key, new.level, new.size, new.created_ms, new.sections, layout)

    @classmethod
    def of_data_file(cls, data_file: DataFile, layout: Layout) -> SimulatedFile:
        return cls.of_sections(
            data_file.key, data_file.level, data_file.size, data_file.created_ms, [section.info for section in data_file.sections], layout,
            [section.first_offset for section in data_file.sections],
        )


@dataclass
class Sections:
    """The sections of several placed files concatenated, with the position of each one's file."""

    file: np.ndarray
    level: np.ndarray
    slot: np.ndarray
    first_offset: np.ndarray
    last_delta: np.ndarray
    record_count: np.ndarray
    uncompressed_bytes: np.ndarray
    min_timestamp: np.ndarray
    max_timestamp: np.ndarray
    clean_below_delta: np.ndarray
    created_ms: np.ndarray

    @classmethod
    def of(cls, files: Sequence[SimulatedFile]) -> Sections:
        counts = [len(f) for f in files]

        def joined(name: str) -> np.ndarray:
            return np.concatenate([getattr(f, name) for f in files]) if files else np.zeros(0, dtype=np.int64)

        def each(values: list[int]) -> np.ndarray:
            return np.repeat(np.array(values, dtype=np.int64), counts)

        return cls(
            each(list(range(len(files)))), each([f.level for f in files]), joined("slot"), joined("offsets"), joined("last_delta"),
            joined("record_count"), joined("uncompressed_bytes"), joined("min_timestamp"), joined("max_timestamp"), joined("clean_below_delta"),
            each([f.created_ms for f in files]),
        )

    def take(self, mask: np.ndarray) -> Sections:
        return Sections(*(getattr(self, name)[mask] for name in self.__dataclass_fields__))

    @property
    def last_offset(self) -> np.ndarray:
        return self.first_offset + self.last_delta

    @property
    def clean(self) -> np.ndarray:
        return self.clean_below_delta > self.last_delta
