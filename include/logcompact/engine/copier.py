"""The copy of a plan that does not deduplicate (L0 -> L1), a run of partitions at a time: each input file's
blocks decoded once, and every partition's section written from one table sorted by partition and offset, as an
agent writes its file (`SegmentWriter.write_sections`). The cleaner copies one partition at a time, about 20 µs a
section, and an agent's file holds one section for each of its 1,000 partitions.

The rules are the cleaner's copy's (`cleaner.py`): retention for `delete` topics (a section wholly past it is not
read), aborted transactions' records removed, young sections (min lag, open transactions) apart, the outputs cut
at the target size at a section boundary. The checks are the read path's, for every section of a run at once: its
first block the one the catalog records (index CRC-32), its offset deltas from 0 to the catalog's last, increasing,
as many as it records; and offsets increasing within a partition across files. A run where any fails, or where a
section would span 2**32 offsets, is copied by the cleaner one partition at a time (`one_by_one`), which sets the
damaged partition aside with the read path's message: nothing of a run is written before all of it is checked. So
is a partition of more than a run's bytes of input, which the cleaner streams in a few batches: a run is held in
memory whole.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import pyarrow as pa

from logcompact.catalog import CatalogSection, DataFile, TopicPartition
from logcompact.exceptions import CorruptDataError
from logcompact.format.layout import MAX_OFFSET_SPAN, SECTION_SCHEMA, row_sizes
from logcompact.format.reader import BlockStream
from logcompact.plans import CompactionStats, Plan
from logcompact.store.base import ObjectStore

# The uncompressed input bytes copied at once: what a run holds in memory, about three times (decoded, sorted, written).
COPY_RUN_BYTES = 16 * 1024 * 1024
_NEVER = np.iinfo(np.int64).max
_LONG_AGO = np.iinfo(np.int64).min
# Output classes, in `_OutputFiles` names: a run's rows go to one of these by their partition's topic and min lag.
CONTENTS = ("compacted", "other", "young")

Sections = list[tuple[DataFile, CatalogSection]]


class SectionSink(Protocol):
    """Where a run's sections of one class go (the cleaner's output files of it): sections in (topic, partition)
    order, `counts[i]` rows of `table` for `slots[i]`, offset deltas from `first_offsets[i]`."""

    def write_sections(self, slots: Sequence[TopicPartition], table: pa.Table, counts: np.ndarray, first_offsets: np.ndarray) -> None: ...


class _TooWide(Exception):
    """An output section would span 2**32 offsets: the cleaner splits it into files of their own."""


class _FileBlocks:
    """An input file's blocks front to back over one streaming GET, each decoded once; the last one kept, as the next
    run's first section may start in it. After damage its place is unknown: it reopens at the next block asked for."""

    def __init__(self, store: ObjectStore, data_file: DataFile) -> None:
        self._store = store
        self._file = data_file
        self._stream: BlockStream | None = None
        self._resume = False
        self._last: tuple[int, pa.RecordBatch, int] | None = None  # position, batch, index CRC-32

    def _block(self, position: int | None) -> tuple[int, pa.RecordBatch, int]:
        """The block at byte `position` (None: the one after the last), skipping the blocks before it."""
        if position is not None and self._last is not None and self._last[0] == position:
            return self._last
        if self._stream is None:
            start = position if self._resume and position is not None else 0
            self._stream = BlockStream(self._store, self._file.key, self._file.size, start)
        if position is not None:
            self._stream.advance_to(position)
        at = self._stream.position
        batch = self._stream.next_batch()
        self._last = (at, batch, self._stream.index_crc)
        return self._last

    def read(self, sections: np.ndarray, into: list[pa.RecordBatch]) -> np.ndarray:
        """Append to `into` the blocks holding `sections` (this file's, in file order: rows of byte offset, first row,
        record count and the catalog's index CRC-32 of the first block), each block once; per section, its first row
        among the rows of `into`. Each section's first block is checked to be the catalog's."""
        positions, first_of = np.unique(sections[:, 0], return_inverse=True)
        reach = np.zeros(len(positions), dtype=np.int64)  # the rows needed from each first block on
        np.maximum.at(reach, first_of, sections[:, 1] + sections[:, 2])
        bases = np.empty(len(positions), dtype=np.int64)
        crcs = np.empty(len(positions), dtype=np.int64)
        decoded: dict[int, tuple[int, int]] = {}  # a block's position: its first row in `into`, its index CRC-32
        total = sum(batch.num_rows for batch in into)
        try:
            for number, position in enumerate(positions.tolist()):
                held = decoded.get(position)
                if held is None:
                    _, batch, crc = self._block(position)
                    held = decoded[position] = (total, crc)
                    into.append(batch)
                    total += batch.num_rows
                bases[number], crcs[number] = held
                while total < held[0] + reach[number]:  # a section goes on in the next blocks
                    at, batch, crc = self._block(None)
                    decoded[at] = (total, crc)
                    into.append(batch)
                    total += batch.num_rows
            wrong = np.flatnonzero(crcs[first_of] != sections[:, 3])
            if len(wrong):
                at = int(sections[wrong[0], 0])
                raise CorruptDataError(f"{self._file.key}: the block at byte {at} is not the one the catalog records for its sections")
        except CorruptDataError as damage:
            self.reset()
            damage.key = self._file.key
            raise
        return bases[first_of] + sections[:, 1]

    def reset(self) -> None:
        self.close()
        self._resume, self._last = True, None

    def close(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None


@dataclass
class _Run:
    """A run's sections column-wise, in the order their rows are gathered."""

    slots: list[TopicPartition]
    slot: np.ndarray  # per section, its partition's place in `slots`
    start: np.ndarray  # its first row among the run's blocks
    count: np.ndarray
    first_offset: np.ndarray
    last_delta: np.ndarray
    blocks: list[pa.RecordBatch]
    expire_before: dict[str, int]  # per topic (`_expire_before`)


def copy_plan(
    store: ObjectStore, plan: Plan, by_partition: dict[TopicPartition, Sections], sinks: Mapping[str, SectionSink],
    stats: CompactionStats, one_by_one: Callable[[list[TopicPartition]], None],
) -> None:
    """Copy every partition of `by_partition` (a plan that does not deduplicate) into `sinks`, a run at a time;
    a run that fails a check is handed to `one_by_one`."""
    files: dict[str, _FileBlocks] = {}
    expire_before = _expire_before(plan)
    try:
        for partitions, whole in _runs(by_partition):
            if not whole:
                one_by_one(partitions)
                continue
            try:
                run = _read_run(store, partitions, by_partition, files, expire_before)
                _write_run(plan, run, sinks, stats, by_partition)
            except (CorruptDataError, _TooWide):
                for blocks in files.values():
                    blocks.reset()
                one_by_one(partitions)
    finally:
        for blocks in files.values():
            blocks.close()


def _runs(by_partition: dict[TopicPartition, Sections]) -> Iterator[tuple[list[TopicPartition], bool]]:
    """The partitions in order, in runs of about COPY_RUN_BYTES of input, each with whether it is copied whole: a
    partition of more input than that is a run of its own for the cleaner, which streams it in a few batches."""
    run: list[TopicPartition] = []
    size = 0
    for tp in sorted(by_partition):
        own = sum(section.info.uncompressed_bytes for _, section in by_partition[tp])
        if own > COPY_RUN_BYTES:
            if run:
                yield run, True
                run, size = [], 0
            yield [tp], False
            continue
        run.append(tp)
        size += own
        if size >= COPY_RUN_BYTES:
            yield run, True
            run, size = [], 0
    if run:
        yield run, True


def _expire_before(plan: Plan) -> dict[str, int]:
    """Per topic, the timestamp below which its records are past retention in a copy: a `delete` topic's (the
    cleaner's copy keeps every record of a compacted topic)."""
    cuts = {}
    for name, topic in plan.topics.items():
        config = topic.config
        cuts[name] = plan.now_ms - config.retention_ms if config.time_retention and not config.compacted else int(_LONG_AGO)
    return cuts


def _expired(expire_before: int, section: CatalogSection) -> bool:
    """A section whose records are all past retention: not read (the cleaner's `_expired_section`)."""
    return section.info.max_timestamp < expire_before


def _read_run(
    store: ObjectStore, partitions: list[TopicPartition], by_partition: dict[TopicPartition, Sections], files: dict[str, _FileBlocks],
    expire_before: dict[str, int],
) -> _Run:
    """The blocks of the run's sections, each file's read once in file order, and the sections' places in them."""
    held: dict[str, int] = {}  # each input file's number
    inputs: list[DataFile] = []
    rows = []
    for number, tp in enumerate(partitions):
        cut = expire_before[tp[0]]
        for data_file, section in by_partition[tp]:
            if not _expired(cut, section):
                file_number = held.get(data_file.key)
                if file_number is None:
                    file_number = held[data_file.key] = len(inputs)
                    inputs.append(data_file)
                info = section.info
                rows.append((file_number, info.byte_offset, info.first_row, info.record_count, info.crc32, number, section.first_offset, info.last_delta))
    blocks: list[pa.RecordBatch] = []
    if not rows:
        empty = np.zeros(0, dtype=np.int64)
        return _Run(partitions, empty, empty, empty, empty, empty, blocks, expire_before)
    table = np.array(rows, dtype=np.int64)
    table = table[np.lexsort((table[:, 2], table[:, 1], table[:, 0]))]  # by file, then in file order
    bounds = np.searchsorted(table[:, 0], np.arange(len(inputs) + 1))
    starts = np.empty(len(table), dtype=np.int64)
    for file_number, data_file in enumerate(inputs):
        reader = files.get(data_file.key)
        if reader is None:
            reader = files[data_file.key] = _FileBlocks(store, data_file)
        low, high = bounds[file_number], bounds[file_number + 1]
        starts[low:high] = reader.read(table[low:high, 1:5], blocks)
    return _Run(partitions, table[:, 5], starts, table[:, 3], table[:, 6], table[:, 7], blocks, expire_before)


def _write_run(plan: Plan, run: _Run, sinks: Mapping[str, SectionSink], stats: CompactionStats, by_partition: dict[TopicPartition, Sections]) -> None:
    """Check the run's rows, sort them by partition and offset, apply the copy's rules and write each class's sections."""
    if not run.blocks:  # every section past retention
        nothing = np.zeros(0, dtype=bool)
        _count(plan, run, stats, by_partition, np.zeros(0, dtype=np.int64), nothing, nothing, nothing, np.zeros(0, dtype=np.int64))
        return
    table = pa.Table.from_batches(run.blocks, schema=SECTION_SCHEMA)
    if (run.count < 1).any():
        _damaged(plan, run, int(np.argmax(run.count < 1)))
    # Each row's place among the blocks' rows, section after section (`_FileBlocks.read` read every row asked for).
    ends = np.cumsum(run.count)
    gathered = np.arange(int(ends[-1]), dtype=np.int64) - np.repeat(ends - run.count - run.start, run.count)
    deltas = table.column("offset_delta").take(pa.array(gathered)).to_numpy().astype(np.int64)
    _check_sections(plan, run, deltas, ends)
    offsets = np.repeat(run.first_offset, run.count) + deltas
    slot = np.repeat(run.slot, run.count)
    order = np.lexsort((offsets, slot))
    slot, offsets = slot[order], offsets[order]
    overlap = (slot[1:] == slot[:-1]) & (offsets[1:] <= offsets[:-1])
    if overlap.any():
        tp = run.slots[int(slot[1:][overlap][0])]
        raise CorruptDataError(
            f"{tp[0]}/{tp[1]}: the plan's input sections hold offsets out of order or twice (offset {int(offsets[1:][overlap][0])}): "
            "their catalog rows overlap, so one was shifted or relabelled; restore the catalog from a backup"
        )
    rows = table.take(pa.array(gathered[order]))
    timestamps = rows.column("timestamp").to_numpy()
    expire_before, lag_cut, compacted, outside_cut = _partition_rules(plan, run, by_partition)
    expired = timestamps < expire_before[slot]
    content = np.where(compacted[slot], 0, 1)
    young_row = timestamps > lag_cut[slot]
    first_young = np.full(len(run.slots), _NEVER, dtype=np.int64)
    np.minimum.at(first_young, slot[young_row], offsets[young_row])
    content[offsets >= np.minimum(first_young, outside_cut)[slot]] = 2
    aborted = _aborted(plan, run, slot, offsets) & ~expired  # an expired record counts as expired
    kept = ~expired & ~aborted
    # Every class's sections are made, and checked to span fewer than 2**32 offsets, before any is written.
    sections = []
    for number, name in enumerate(CONTENTS):
        chosen = np.flatnonzero(kept & (content == number))
        if len(chosen):
            sections.append((sinks[name], *_sections(run, rows if len(chosen) == rows.num_rows else rows.take(pa.array(chosen)), slot[chosen], offsets[chosen])))
    for sink, *written in sections:
        sink.write_sections(*written)
    aborted_bytes = row_sizes(rows.filter(pa.array(aborted))) if aborted.any() else np.zeros(0, dtype=np.int64)
    _count(plan, run, stats, by_partition, slot, expired, kept, aborted, aborted_bytes)


def _aborted(plan: Plan, run: _Run, slot: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per row (sorted by partition and offset), whether it lies in one of its partition's aborted ranges."""
    aborted = np.zeros(len(offsets), dtype=bool)
    for number, tp in enumerate(run.slots):
        ranges = plan.aborted.get(tp)
        if ranges:
            low, high = np.searchsorted(slot, number), np.searchsorted(slot, number, side="right")
            firsts = np.asarray([first for first, _ in ranges], dtype=np.int64)
            lasts = np.asarray([last for _, last in ranges], dtype=np.int64)
            at = np.searchsorted(firsts, offsets[low:high], side="right") - 1
            aborted[low:high] = (at >= 0) & (offsets[low:high] <= lasts[np.maximum(at, 0)])
    return aborted


def _check_sections(plan: Plan, run: _Run, deltas: np.ndarray, ends: np.ndarray) -> None:
    """Every section's rows (`deltas`, section after section) as the catalog records them: deltas from 0 to its
    last delta, increasing."""
    firsts = ends - run.count
    rising = np.ones(len(deltas), dtype=bool)
    rising[1:] = deltas[1:] > deltas[:-1]
    rising[firsts] = True
    bad = (run.count > run.last_delta + 1) | (deltas[firsts] != 0) | (deltas[ends - 1] != run.last_delta)
    bad |= np.logical_and.reduceat(rising, firsts) == 0
    if bad.any():
        _damaged(plan, run, int(np.argmax(bad)))


def _damaged(plan: Plan, run: _Run, at: int) -> None:
    """Section `at` of the run is not what the catalog records."""
    tp = run.slots[int(run.slot[at])]
    raise CorruptDataError(
        f"{plan.plan_id}: section {tp[0]}/{tp[1]} from offset {int(run.first_offset[at])}: expected {int(run.count[at])} "
        f"record(s) with offset deltas increasing from 0 to {int(run.last_delta[at])} as the catalog records; the file or "
        "the catalog is corrupt"
    )


def _partition_rules(plan: Plan, run: _Run, by_partition: dict[TopicPartition, Sections]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per partition of the run: the timestamp below which its records are past retention (a `delete` topic's; the
    cleaner's copy keeps a compacted topic's), above which they are within min lag, whether its topic is compacted,
    and the young section outside the plan its inputs straddle (the cleaner's `outside_cut`)."""
    expire_before, lag_cut, compacted, outside_cut = [], [], [], []
    for tp in run.slots:
        config = plan.topics[tp[0]].config
        expire_before.append(run.expire_before[tp[0]])
        lagged = config.compacted and config.min_compaction_lag_ms > 0
        lag_cut.append(plan.now_ms - config.min_compaction_lag_ms if lagged else _NEVER)
        compacted.append(config.compacted)
        young_from = plan.first_uncleanable.get(tp) if config.compacted else None
        first = min(section.first_offset for _, section in by_partition[tp])
        outside_cut.append(young_from if young_from is not None and first < young_from else _NEVER)
    return (np.asarray(expire_before, dtype=np.int64), np.asarray(lag_cut, dtype=np.int64), np.asarray(compacted, dtype=bool),
            np.asarray(outside_cut, dtype=np.int64))


def _sections(run: _Run, rows: pa.Table, slot: np.ndarray, offsets: np.ndarray) -> tuple[list[TopicPartition], pa.Table, np.ndarray, np.ndarray]:
    """One section per partition of `rows` (sorted by partition and offset), as a sink takes them: the partitions,
    the rows with their deltas from each section's first offset, the counts, the first offsets."""
    starts = np.flatnonzero(np.concatenate(([True], slot[1:] != slot[:-1])))
    counts = np.diff(np.append(starts, len(slot)))
    first_offsets = offsets[starts]
    deltas = offsets - np.repeat(first_offsets, counts)
    if deltas.max() > MAX_OFFSET_SPAN:
        raise _TooWide()
    table = rows.set_column(0, SECTION_SCHEMA.field(0), pa.array(deltas, pa.uint32()))
    return [run.slots[number] for number in slot[starts].tolist()], table, counts, first_offsets


def _count(
    plan: Plan, run: _Run, stats: CompactionStats, by_partition: dict[TopicPartition, Sections], slot: np.ndarray, expired: np.ndarray,
    kept: np.ndarray, aborted: np.ndarray, aborted_bytes: np.ndarray,
) -> None:
    """The cleaner's per-partition figures of a copy: records in (the skipped expired sections' too), expired, aborted
    (`aborted_bytes`: the aborted rows' sizes, in row order), out."""
    partitions = len(run.slots)
    expired_rows = np.bincount(slot[expired], minlength=partitions).tolist()
    out = np.bincount(slot[kept], minlength=partitions).tolist()
    aborted_rows = np.bincount(slot[aborted], minlength=partitions).tolist()
    aborted_sizes = np.bincount(slot[aborted], weights=aborted_bytes, minlength=partitions).astype(np.int64).tolist()
    for number, tp in enumerate(run.slots):
        sections = [section for _, section in by_partition[tp]]
        counts = stats.checkpoint()
        stats.records_in += sum(section.info.record_count for section in sections)
        stats.expired_removed += expired_rows[number] + sum(section.info.record_count for section in sections if _expired(run.expire_before[tp[0]], section))
        stats.records_out += out[number]
        stats.aborted_removed += aborted_rows[number]
        stats.aborted_bytes_removed += aborted_sizes[number]
        stats.partition_done(tp[0], counts, sum(section.info.uncompressed_bytes for section in sections))
