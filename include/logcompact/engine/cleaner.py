"""The two-pass compaction of one plan: Kafka's cleaner over object storage, the way WarpStream runs it.

Contract
--------
Input: a validated `Plan` (files at levels <= the target level, the topic configs, the clock `now`).
Output: new files at the target level holding, for every covered topic-partition, the records that
survive; records keep their offsets and their bytes, in offset order; each output section's roaring
bitmap lists exactly the offsets it holds. Nothing is committed here (see `commit.py`).

Reading. Every input file is read by at most two streaming GETs: the pass-1 stream and the pass-2 stream
are two pointers that advance independently through the file's sections, which are sorted by
(topic, partition). Per topic-partition the sections of all inputs are merged by offset, batch by batch,
so memory is bounded by the key map plus a few batches, whatever the size of the files. Pass 1 decodes each
block's index part only; pass 2 a block holding one section's rows alone index part first, and its payload only
when a record of it may survive (`_payload_wanted`).

Rules, per record (a compacted topic's rules apply only when the plan deduplicates):
* retention (`delete` and `compact,delete` topics): a record older than now - retention.ms is removed;
  in a `delete` topic a section whose newest record is that old is skipped without decoding. In a
  `compact,delete` topic retention applies only when the plan deduplicates, and only below the outside
  floor: removing a record never lets an older value of its key, in the job or outside it, come back
  (Kafka gets the same by deleting only from the start of the log);
* a record without a key in a compacted topic is removed and counted invalid (Kafka does the same);
* min lag and open transactions, as Kafka's first uncleanable offset: the lower of the plan's
  `first_uncleanable` (the partition's LSO when an open transaction holds it, and the first offset of the first
  section outside the plan holding a record newer than now - min.compaction.lag.ms, as Kafka takes the first
  such segment) and the offset of the first such record among the plan's inputs (pass
  1, or the copy, sees every timestamp). From there on no record is removed as a duplicate, used to remove
  others, or stamped; judging it by offset, not by each record's timestamp, keeps a young older value from
  outliving a tombstone that supersedes it. The output ends the partition's section before the inputs' first
  young record, or before the plan's `first_uncleanable` when inputs lie on both sides of it, and puts the
  survivors from there on in a section of their own (the plan's `young` files), copies included: the boundary
  stays a section boundary, as Kafka never rewrites the segment holding it, so it never moves down, and no
  output section spans a young section outside the plan;
* the records of the plan's aborted ranges (aborted transactions') are removed before either pass reads them:
  no aborted key enters the key map, so an aborted value never removes the committed one before it;
* pass 1 maps each other keyed record's 128-bit key hash to the latest offset of that key; pass 2 removes
  a record when the map holds a newer offset for its key;
* a tombstone that is the latest of its key is kept and stamped with a delete horizon (now +
  delete.retention.ms) the first time a deduplicating compaction keeps it; once now has passed its
  horizon it is removed, but only below the partition's outside floor (the lowest offset of any live file
  outside the plan), so no older value of its key can come back;
* a partition with more than `max_partition_bytes` of uncompressed input is copied, not deduplicated;
* compacted topics' records and the other topics' records go to separate output files, each cut at the
  target size at a section boundary.

Copies. A plan that does not deduplicate (L0 to L1) is copied by `copier.py` under the same rules, a run of
partitions (COPY_RUN_BYTES of input) at a time: each input file's blocks decoded once by one streaming GET, every
section of the run checked at once, and each partition's section written from one sorted table, where this module
costs some 20 µs a section; a run holding damage comes back here one partition at a time.

Partial progress. The key map is bounded. When it is full, pass 1 stops at that offset; pass 2 cleans
everything up to it; then the map is cleared and both passes continue from there (Kafka's partial
progress). Tombstones and expired records past that first stop are not removed in this job: older
records of their keys were not checked against them. Pass 1 starts after the partition's clean prefix (records that an earlier compaction left
with no key in common, recorded as `clean_below_delta`), while pass 2 cleans from the start, so each new
compaction deduplicates older data against the next stretch of newer keys and the log converges.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import nullcontext
from typing import IO, NamedTuple

import numba
import numpy as np
import pyarrow as pa

from logcompact.catalog import CatalogSection, DataFile, SetAside, TopicPartition
from logcompact.collector import collector_paused
from logcompact.engine.copier import CONTENTS, copy_plan
from logcompact.engine.gather import FULL, OUT_OF_ORDER, BatchColumns, BlockGatherer, binary_parts, int64_values, validity
from logcompact.engine.offset_map import CompactOffsetMap, OffsetMap
from logcompact.exceptions import CorruptDataError
from logcompact.format import PayloadWanted, SectionStream, SegmentWriter
from logcompact.format.layout import (
    FIXED_ROW_BYTES,
    INDEX_COLUMNS,
    INDEX_SCHEMA,
    MAX_OFFSET_SPAN,
    SECTION_SCHEMA,
    header_row_bytes,
    key_hash_words,
    row_sizes,
)
from logcompact.format.writer import BLOCK_ROWS, SectionBuilder
from logcompact.plans import CompactionStats, JobResult, Plan
from logcompact.store.base import ObjectStore
from logcompact.topics import TopicConfig

log = logging.getLogger(__name__)


# -- reading: two pointers per file, merged per partition --------------------------------------------


# Consecutive sections of a partition are processed as one batch of up to this many rows and bytes, so a
# partition of many small sections costs a few vectorized steps, not a few per section.
COALESCE_ROWS = 65536
COALESCE_BYTES = 4 * 1024 * 1024


# A piece of a section, batch by batch: its rows, the catalog's section and the file holding it.
_Piece = tuple[pa.RecordBatch, CatalogSection, str]


class _Rows(NamedTuple):
    """Consecutive records of a partition: their columns (SECTION_SCHEMA's, or the index columns in pass 1) and their
    offsets beside them, in a numpy array of their own, so no pass adds a column to a batch or reads one back; and
    which of them are aborted transactions' records (`aborted`, None for none), which both passes pass over where
    they lie (a filtered copy of the batch cost some 20 µs)."""

    batch: pa.RecordBatch
    offsets: np.ndarray
    aborted: np.ndarray | None = None

    def slice(self, start: int, stop: int | None = None) -> _Rows:
        end = len(self.offsets) if stop is None else stop
        aborted = None if self.aborted is None else self.aborted[start:end]
        return _Rows(self.batch.slice(start, end - start), self.offsets[start:end], aborted)


def _with_offsets(pieces: list[_Piece], columns: tuple[str, ...] | None) -> _Rows:
    """Batches of consecutive sections as one batch and its offsets (first offset + delta), checked to increase
    strictly (each piece's deltas were checked against its catalog row at its ends only)."""
    batches = [b if columns is None or b.num_columns == len(columns) else b.select(list(columns)) for b, _, _ in pieces]
    if len(batches) == 1:
        batch = batches[0]
        offsets = np.empty(batch.num_rows, dtype=np.int64)
        at = _piece_offsets(batch.column(0).to_numpy(), pieces[0][1].first_offset, offsets)  # offset_delta: first column
    else:
        batch = pa.concat_batches(batches)
        firsts = np.asarray([placed.first_offset for _, placed, _ in pieces], dtype=np.int64)
        counts = np.asarray([b.num_rows for b in batches], dtype=np.int64)
        offsets = np.empty(batch.num_rows, dtype=np.int64)
        at = _placed_offsets(batch.column(0).to_numpy(), firsts, counts, offsets)
    if at >= 0:
        counts = np.asarray([b.num_rows for b in batches], dtype=np.int64)
        _, placed, key = pieces[int(np.searchsorted(np.cumsum(counts), at, side="right"))]
        damage = CorruptDataError(
            f"{key}: section {placed.topic}/{placed.partition} from offset {placed.first_offset}: expected offsets increasing "
            f"as the catalog records, found offset {int(offsets[at])} after {int(offsets[at - 1])}; the file or the catalog "
            "is corrupt"
        )
        damage.key = key
        raise damage
    return _Rows(batch, offsets)


@numba.njit(cache=True, nogil=True)
def _placed_offsets(deltas, firsts, counts, offsets):
    """Each row's offset (its piece's first offset + its delta) into `offsets`; the first row whose offset does not
    exceed the one before, or -1."""
    row = 0
    bad = -1
    for piece in range(firsts.shape[0]):
        first = firsts[piece]
        for _ in range(counts[piece]):
            offsets[row] = first + np.int64(deltas[row])
            if bad < 0 and row > 0 and offsets[row] <= offsets[row - 1]:
                bad = row
            row += 1
    return bad


@numba.njit(cache=True, nogil=True)
def _piece_offsets(deltas, first, offsets):
    """`_placed_offsets` of one piece: the common case of a section's block big enough to go alone."""
    bad = -1
    for row in range(deltas.shape[0]):
        offsets[row] = first + np.int64(deltas[row])
        if bad < 0 and row > 0 and offsets[row] <= offsets[row - 1]:
            bad = row
    return bad


def _coalesced(sections: list[tuple[Iterator[pa.RecordBatch], CatalogSection, str]], columns: tuple[str, ...] | None) -> Iterator[_Rows]:
    """The batches of sections that follow each other in offsets, joined up to COALESCE_ROWS rows and
    COALESCE_BYTES (sized by the catalog's record of each section: no Arrow call per batch)."""
    pending: list[_Piece] = []
    rows = size = 0
    for batches, placed, key in sections:
        row_bytes = placed.info.uncompressed_bytes // max(1, placed.info.record_count)
        for batch in batches:
            if not pending and (batch.num_rows >= COALESCE_ROWS // 16 or batch.num_rows * row_bytes >= COALESCE_BYTES // 16):
                yield _with_offsets([(batch, placed, key)], columns)  # big enough alone: no copy
                continue
            pending.append((batch, placed, key))
            rows += batch.num_rows
            size += batch.num_rows * row_bytes
            if rows >= COALESCE_ROWS or size >= COALESCE_BYTES:
                yield _with_offsets(pending, columns)
                pending, rows, size = [], 0, 0
    if pending:
        yield _with_offsets(pending, columns)


def _merged(sources: list[Iterator[_Rows]]) -> Iterator[_Rows]:
    """K-way merge by offset of streams of rows that are each in offset order, a few batches at a time."""
    if len(sources) == 1:
        yield from sources[0]
        return
    pending: list[_Rows | None] = [next(s, None) for s in sources]
    while any(p is not None for p in pending):
        # Rows up to the smallest last offset among the current batches can be emitted in order now.
        bound = min(int(p.offsets[-1]) for p in pending if p is not None)
        taken = []
        for i, rows in enumerate(pending):
            if rows is None:
                continue
            cut = int(np.searchsorted(rows.offsets, bound, side="right"))
            if cut:
                taken.append(rows.slice(0, cut))
            rest = rows.slice(cut)
            pending[i] = rest if len(rest.offsets) else next(sources[i], None)
        offsets = np.concatenate([rows.offsets for rows in taken])
        order = np.argsort(offsets, kind="stable")
        yield _Rows(pa.concat_batches([rows.batch for rows in taken]).take(order), offsets[order])


class _PartitionReader:
    """One pass over a partition's records in offset order, with a push-back for partial progress."""

    def __init__(self, batches: Iterator[_Rows]) -> None:
        self._batches = batches
        self._pushed: _Rows | None = None

    def __iter__(self) -> _PartitionReader:
        return self

    def __next__(self) -> _Rows:
        if self._pushed is not None:
            rows, self._pushed = self._pushed, None
            return rows
        return next(self._batches)

    def push_back(self, rows: _Rows) -> None:
        self._pushed = rows


# -- writing: output files per content class, cut at the target size -----------------------------------


class _OutputFiles:
    def __init__(self, store: ObjectStore, plan: Plan, content: str, workdir: str) -> None:
        self._store = store
        self._plan = plan
        self._content = content
        self._workdir = workdir
        self._writer: SegmentWriter | None = None
        self._sink: IO[bytes] | None = None  # the file the writer writes: both are set, or neither
        self._first_offsets: list[int] = []  # of the sections of the file being written
        self.files: list[DataFile] = []
        self.gatherer = BlockGatherer(BLOCK_ROWS)  # the survivors of the partition being written here

    def begin_section(self, topic: str, partition: int) -> SectionBuilder:
        if self._writer is not None and self._writer.size >= self._plan.target_file_bytes:
            self.close()
        return self._open().begin_section(topic, partition)

    def _open(self) -> SegmentWriter:
        """The file being written, begun if none is."""
        if self._writer is None:
            self._sink = tempfile.NamedTemporaryFile(dir=self._workdir, suffix=".seg", delete=False)
            self._writer = SegmentWriter(self._sink, self._plan.compression)
            self._first_offsets = []
        return self._writer

    def section_done(self, first_offset: int) -> None:
        self._first_offsets.append(first_offset)

    def write_sections(self, slots: Sequence[TopicPartition], table: pa.Table, counts: np.ndarray, first_offsets: np.ndarray) -> None:
        """Many finished sections at once (a copy's run, `copier.SectionSink`), cut into files at the target size at
        section boundaries, as their rows' Arrow bytes say."""
        row_starts = np.concatenate(([0], np.cumsum(counts)))
        sizes = np.cumsum(row_sizes(table))
        start = 0
        while start < len(slots):
            if self._writer is not None and self._writer.size >= self._plan.target_file_bytes:
                self.close()
            writer = self._open()
            room = self._plan.target_file_bytes - writer.size
            below = int(sizes[row_starts[start] - 1]) if row_starts[start] else 0
            end = max(start + 1, int(np.searchsorted(sizes[row_starts[1:] - 1], below + room, side="right")))
            end = min(end, len(slots))
            rows = table.slice(int(row_starts[start]), int(row_starts[end] - row_starts[start]))
            writer.write_sections(slots[start:end], rows, counts[start:end])
            self._first_offsets += first_offsets[start:end].tolist()
            start = end
            if start < len(slots):
                self.close()  # as full as the target allows: the next sections begin the next file

    def close(self) -> None:
        if self._writer is None or self._sink is None:
            return
        if not self._first_offsets:  # every section begun in it was taken back (its partition set aside)
            self.discard()
            return
        infos = self._writer.finish()
        self._sink.close()
        key = self._plan.output_key(self._content, len(self.files))
        self._store.put_file(key, self._sink.name)
        size = os.path.getsize(self._sink.name)
        os.unlink(self._sink.name)
        sections = tuple(CatalogSection(info, first) for info, first in zip(infos, self._first_offsets, strict=True))
        self.files.append(DataFile(key, self._plan.target_level, size, self._plan.now_ms, sections))
        self._writer = None

    def discard(self) -> None:
        if self._writer is not None and self._sink is not None:
            self._sink.close()
            os.unlink(self._sink.name)
            self._writer = None


class _SectionOutput:
    """Survivors of one partition into output sections, opened at the first survivor.

    A section spans fewer than 2**32 offsets; survivors beyond that go to a new section in a new file
    (a file holds one section per partition). `clean_below` (set before pass 2 starts) is clamped to
    each section's own range. Survivors are copied by a compiled loop (`gather.BlockGatherer`) into the block the
    section's file is filling, up to the room it has, so the section's bookkeeping runs once an output block, and
    each survivor is copied once before its block is encoded.
    """

    def __init__(self, files: _OutputFiles, topic: str, partition: int) -> None:
        self._files = files
        self._topic = topic
        self._partition = partition
        self._builder: SectionBuilder | None = None
        self.first_offset = -1
        self.last_offset = -1
        self.records = 0
        self.finished = 0  # sections finished (a partition spanning 2**32 offsets has several)
        self.clean_below: int | None = None
        self._gatherer = files.gatherer
        self._gatherer.begin(-1)

    def write(self, rows: BatchColumns, keep: np.ndarray, start: int, end: int) -> None:
        """The kept rows of `start` to `end`."""
        gatherer = self._gatherer
        while start < end:
            builder = self._builder
            if builder is None:
                if not keep[start:end].any():
                    return
                builder = self._builder = self._files.begin_section(self._topic, self._partition)
            room_rows, room_bytes = builder.room()
            start, status = gatherer.gather(rows, keep, start, end, room_rows, room_bytes, builder.block_empty)
            if status == OUT_OF_ORDER:
                raise self._out_of_order(int(rows.offsets[start]))
            if status == FULL:
                if gatherer.rows:
                    self.flush()
                builder.end_block()

    def _out_of_order(self, offset: int) -> CorruptDataError:
        return CorruptDataError(
            f"{self._topic}/{self._partition}: the plan's input sections hold offsets out of order or twice (from "
            f"{offset}): their catalog rows overlap, so one was shifted or relabelled; restore the catalog from a backup"
        )

    def flush(self) -> None:
        """The gathered survivors into the section."""
        if not self._gatherer.rows:
            return
        block = self._gatherer.take()
        self._append(block.offsets, block.columns)

    def _append(self, offsets: np.ndarray, columns: list[pa.Array]) -> None:
        builder = self._builder
        if builder is None:
            builder = self._builder = self._files.begin_section(self._topic, self._partition)
        if self.first_offset < 0:
            self.first_offset = int(offsets[0])
        beyond = int(np.searchsorted(offsets, self.first_offset + MAX_OFFSET_SPAN, side="right"))
        if beyond:
            deltas = pa.array(offsets[:beyond] - self.first_offset, pa.uint32())
            here = columns if beyond == len(offsets) else [column.slice(0, beyond) for column in columns]
            builder.append(pa.RecordBatch.from_arrays([deltas, *here], schema=SECTION_SCHEMA))
            self.last_offset = int(offsets[beyond - 1])
            self.records += beyond
        if beyond < len(offsets):
            self._finish(builder)
            self._files.close()
            self._append(offsets[beyond:], [column.slice(beyond) for column in columns])

    def _finish(self, builder: SectionBuilder) -> None:
        clean = self.clean_below
        clean_delta = 0 if clean is None else max(0, min(clean, self.last_offset + 1) - self.first_offset)
        builder.finish(clean_below_delta=clean_delta)
        self._files.section_done(self.first_offset)
        self._builder = None
        self.first_offset = -1
        self.finished += 1

    def close(self) -> None:
        self.flush()
        if self._builder is not None:
            self._finish(self._builder)

    def abandon(self, damage: CorruptDataError) -> None:
        """Take back what was written of the partition. Sections already finished (in files cut at 2**32
        offsets) cannot be taken back: then the job fails with the damage."""
        if self.finished:
            raise damage
        self._gatherer.reset()
        if self._builder is not None:
            self._builder.abandon()
            self._builder = None


class _PartitionOutput:
    """A partition's survivors: those below its first input record within min lag (`split_at`, set before pass
    2 reaches it) in one section, the rest in a section of their own in the plan's young files (a file holds
    one section per partition). Both stay open until the partition ends, so damage found late takes back both."""

    def __init__(self, files: _OutputFiles, young_files: _OutputFiles, topic: str, partition: int) -> None:
        self._below = _SectionOutput(files, topic, partition)
        self._young = _SectionOutput(young_files, topic, partition)
        self.split_at: int | None = None

    @property
    def records(self) -> int:
        return self._below.records + self._young.records

    def clean_below(self, offset: int) -> None:
        self._below.clean_below = self._young.clean_below = offset

    def write(self, rows: BatchColumns, keep: np.ndarray) -> None:
        n = len(keep)
        cut = n if self.split_at is None else int(np.searchsorted(rows.offsets, self.split_at))
        if cut:
            self._below.write(rows, keep, 0, cut)
        if cut < n:
            self._young.write(rows, keep, cut, n)

    def close(self) -> None:
        # Both flushed before either is finished: damage a flush finds takes back both (a finished section cannot be).
        self._below.flush()
        self._young.flush()
        self._below.close()
        self._young.close()

    def abandon(self, damage: CorruptDataError) -> None:
        self._below.abandon(damage)
        self._young.abandon(damage)


# -- the job -----------------------------------------------------------------------------------------


def run_plan(store: ObjectStore, plan: Plan, offset_map: OffsetMap | None = None, workdir: str | None = None) -> JobResult:
    """Compact the plan's inputs into new files in the store (uncommitted) and return them with stats.

    Output files are staged in `workdir` before upload (jobs pass one that is reclaimed if the job dies,
    `logcompact.jobs.workdir`); without it, in a temporary directory removed on return."""
    started = time.perf_counter()
    requests_before = store.counters.snapshot()
    stats = CompactionStats(plan_id=plan.plan_id, group=plan.group, target_level=plan.target_level)
    stats.bytes_in = _stored_bytes(plan.inputs)
    key_map = offset_map or CompactOffsetMap(plan.buffer_bytes)
    stats.key_capacity = key_map.capacity

    # The collector paused as the planner pauses it: a plan's tens of thousands of sections, grouped by partition
    # below, and the objects a job makes per section, would set off full collections costing more than a copy's work
    # (0.12 s of 0.26 s for 32 agents' files of 1,000 partitions; 0.08 s of 0.19 s set off by the grouping alone).
    with (nullcontext(workdir) if workdir else tempfile.TemporaryDirectory(prefix="logcompact-")) as scratch, collector_paused():
        by_partition: dict[TopicPartition, list[tuple[DataFile, CatalogSection]]] = {}
        for data_file in plan.inputs:
            for section in data_file.sections:
                by_partition.setdefault((section.topic, section.partition), []).append((data_file, section))
        outputs = {
            content: _OutputFiles(store, plan, content, scratch) for content in CONTENTS
        }
        pass1 = _Cursors(store, index_only=True)
        pass2 = _Cursors(store, index_only=False)

        def one_by_one(partitions: Iterable[TopicPartition]) -> None:
            for topic, partition in partitions:
                _clean_partition(plan, topic, partition, by_partition[(topic, partition)], key_map, stats, outputs, pass1, pass2)

        try:
            if plan.deduplicate:
                one_by_one(sorted(by_partition))
            else:
                copy_plan(store, plan, by_partition, outputs, stats, one_by_one)
            for files in outputs.values():
                files.close()
        except BaseException:
            for files in outputs.values():
                files.discard()
            raise
        finally:
            pass1.close()
            pass2.close()

    result_files = [data_file for files in outputs.values() for data_file in files.files]
    stats.outputs_written(result_files)
    requests = store.counters.snapshot() - requests_before
    stats.gets, stats.puts = requests.get, requests.put
    stats.seconds = round(time.perf_counter() - started, 3)
    for warning in stats.warnings:
        log.warning("plan %s: %s", plan.plan_id, warning)
    return JobResult(plan.plan_id, plan.group, result_files, stats)


def _clean_partition(
    plan: Plan, topic: str, partition: int, sections: list[tuple[DataFile, CatalogSection]], key_map: OffsetMap, stats: CompactionStats,
    outputs: dict[str, _OutputFiles], pass1: _Cursors, pass2: _Cursors,
) -> None:
    """One partition through the cleaner; damage sets it aside (Kafka's uncleanable partition: its records stay where
    they are, the others go on)."""
    config = plan.topics[topic].config
    cleaner = _PartitionCleaner(plan, topic, partition, config, sections, key_map, stats)
    out = _PartitionOutput(outputs["compacted" if config.compacted else "other"], outputs["young"], topic, partition)
    counts = stats.checkpoint()
    try:
        cleaner.run(pass1, pass2, out)
    except CorruptDataError as damage:
        out.abandon(damage)
        stats.rewind(counts)
        stats.set_aside(SetAside(topic, partition, str(damage), damage.key or ""))
        log.warning("plan %s: %s/%d set aside as uncleanable: %s", plan.plan_id, topic, partition, damage)
    else:
        stats.partition_done(topic, counts, sum(s.info.uncompressed_bytes for _, s in sections))


def _stored_bytes(inputs: Iterable[DataFile]) -> int:
    """The stored bytes of the inputs' sections, what pass 2 reads: a job given a slice of a file's partitions
    reads only theirs (sections sharing a block count it once)."""
    return sum(sum(length for _, length in {(s.info.byte_offset, s.info.byte_length) for s in f.sections}) for f in inputs)


class _Cursors:
    """The pointers of one pass, one forward stream per input file (the format's `SectionStream`, opened on first
    use: at most one GET per input file), handing out each section's rows in file order."""

    def __init__(self, store: ObjectStore, index_only: bool) -> None:
        self._store = store
        self._index_only = index_only
        self._open: dict[str, SectionStream] = {}

    def rows(self, data_file: DataFile, placed: CatalogSection, payload_wanted: PayloadWanted | None = None) -> Iterator[pa.RecordBatch]:
        """The section's records, batch by batch, checked against the catalog's record of it; with `payload_wanted`,
        not those of blocks it refuses (`SectionStream.rows`). Damage is a CorruptDataError whose `key` names the file."""
        stream = self._open.get(data_file.key)
        if stream is None:
            stream = self._open[data_file.key] = SectionStream(self._store, data_file.key, data_file.size, self._index_only)
        # The order of offsets is checked once per coalesced batch (`_with_offsets`), not per section. Pass 1 only
        # fills the key map: pass 2 reads every section again with every check before a record is written, and a
        # partition failing there is taken back whole.
        return stream.rows(placed.info, check_order=False, check_deltas=not self._index_only, payload_wanted=payload_wanted)

    def close(self) -> None:
        for stream in self._open.values():
            stream.close()


class _PartitionCleaner:
    def __init__(
        self,
        plan: Plan,
        topic: str,
        partition: int,
        config: TopicConfig,
        sections: list[tuple[DataFile, CatalogSection]],
        key_map: OffsetMap,
        stats: CompactionStats,
    ) -> None:
        self.plan = plan
        self.topic = topic
        self.partition = partition
        self.config = config
        self.sections = sorted(sections, key=lambda pair: pair[1].first_offset)
        self.key_map = key_map
        self.stats = stats
        now = plan.now_ms
        self.expire_before = now - config.retention_ms if config.time_retention else None
        uncompressed = sum(s.info.uncompressed_bytes for _, s in self.sections)
        self.oversized = uncompressed > plan.max_partition_bytes
        if self.oversized and plan.deduplicate and config.compacted:
            stats.oversized_partitions.append(f"{topic}/{partition}")
            stats.warnings.append(
                f"{topic}/{partition} holds {uncompressed} uncompressed bytes, over the {plan.max_partition_bytes} "
                "byte cap: copied, not deduplicated"
            )
        self.deduplicate = plan.deduplicate and config.compacted and not self.oversized
        self.horizon = min(now + config.delete_retention_ms, _NEVER)  # delete.retention.ms may be Long.MAX_VALUE
        self.floor = plan.outside_floors.get((topic, partition))
        # Kafka's first uncleanable offset: from the sections outside the plan and the partition's LSO, lowered to
        # the inputs' first record within the lag once a pass reaches it (`_find_young`), so min lag keeps the same
        # records whichever files a plan takes, and a full sweep is record-precise.
        lag = config.min_compaction_lag_ms if config.compacted else 0
        self.lag_cut = now - lag if lag > 0 else None
        self.young_from = plan.first_uncleanable.get((topic, partition)) if config.compacted else None
        self.first_young: int | None = None  # the offset of the inputs' first record within the lag
        # Inputs on both sides of a young section outside the plan are cut there too: one output section spanning
        # it would interleave the partition's sections, and the first uncleanable offset would fall below them all.
        straddled = self.young_from is not None and self.sections[0][1].first_offset < self.young_from
        self.outside_cut = self.young_from if straddled else None
        self.removes_latest = True  # may a key's latest record go (tombstone, expiry)? Not after a partial stop
        aborted = plan.aborted.get((topic, partition), ())
        self.aborted_firsts = np.asarray([first for first, _ in aborted], dtype=np.int64)
        self.aborted_lasts = np.asarray([last for _, last in aborted], dtype=np.int64)
        self.decided_counts = np.zeros(len(_COUNTED), dtype=np.int64)  # `_decide`'s, in `_COUNTED` order
        self.stop: int | None = None  # where the stretch pass 2 is cleaning ends (the key map's stop); None: the end
        # The key map's lookups of the last block `_payload_wanted` let through, for `_decide` (`_latest`).
        self._looked_up: tuple[pa.Buffer, int, int, np.ndarray] | None = None

    def _records(self, cursors: _Cursors, columns: tuple[str, ...] | None = None) -> _PartitionReader:
        """This pass's reader of the partition in offset order; sections wholly past retention are skipped.

        Sections whose offset ranges overlap (one spans a hole another fills) are merged by offset; the
        others are read one after another, coalesced into few batches. Pass 2 of a deduplication does not read the
        payload of a block none of whose records survive, nor hand out its rows (`_payload_wanted`).
        """
        runs: list[list[tuple[DataFile, CatalogSection]]] = []
        run_end = -1
        for data_file, placed in self.sections:
            if columns is None and self._expired_section(placed):
                continue  # every record expired: the stream skips it, nothing is decoded
            if runs and placed.first_offset <= run_end:
                runs[-1].append((data_file, placed))
            else:
                runs.append([(data_file, placed)])
            run_end = max(run_end, placed.last_offset)

        skipping = columns is None and self.deduplicate

        def section(data_file: DataFile, placed: CatalogSection) -> tuple[Iterator[pa.RecordBatch], CatalogSection, str]:
            return cursors.rows(data_file, placed, self._payload_wanted(placed) if skipping else None), placed, data_file.key

        def in_order() -> Iterator[_Rows]:
            plain: list[tuple[Iterator[pa.RecordBatch], CatalogSection, str]] = []
            for run in runs:
                if len(run) == 1:
                    plain.append(section(*run[0]))
                    continue
                yield from _coalesced(plain, columns)
                plain = []
                yield from _merged([_coalesced([section(*pair)], columns) for pair in run])
            yield from _coalesced(plain, columns)

        return _PartitionReader(self._marking_aborted(in_order(), pass_2=columns is None) if len(self.aborted_firsts) else in_order())

    def _marking_aborted(self, batches: Iterator[_Rows], pass_2: bool) -> Iterator[_Rows]:
        """`batches` with the records of the plan's aborted ranges marked (`_Rows.aborted`), for both passes to pass
        over: no aborted key enters the key map, so an aborted value never removes a committed one of its key, and no
        aborted record is written. Pass 1 leaves out a batch of aborted records alone; pass 2 decides every batch, and
        counts each aborted record there as aborted, or as expired when retention removes it too (as the L0 copy,
        which does not read a section wholly past retention, counts it)."""
        firsts, lasts = self.aborted_firsts, self.aborted_lasts
        for rows in batches:
            offsets = rows.offsets
            if not len(offsets) or offsets[-1] < firsts[0] or offsets[0] > lasts[-1]:
                yield rows
                continue
            aborted = np.empty(len(offsets), dtype=np.bool_)
            marked = _mark_aborted(offsets, firsts, lasts, aborted)
            if not marked:
                yield rows
                continue
            if pass_2 or marked < len(offsets):
                yield rows._replace(aborted=aborted)

    def _expired_section(self, placed: CatalogSection) -> bool:
        """Pass 2 skips a `delete` topic's section whose records are all past retention. Never a compacted
        topic's: its records may be older values' only superseders, decided record by record."""
        return (
            self.expire_before is not None
            and not self.config.compacted
            and placed.info.max_timestamp < self.expire_before
        )

    def _clean_prefix_end(self) -> int:
        """Where pass 1 starts: after the first section's clean prefix, unless another section intrudes."""
        first = self.sections[0][1]
        end = first.first_offset + first.info.clean_below_delta
        for _, other in self.sections[1:]:
            end = min(end, other.first_offset)
        return end

    def run(self, pass1: _Cursors, pass2: _Cursors, out: _PartitionOutput) -> None:
        stats = self.stats
        stats.records_in += sum(s.info.record_count for _, s in self.sections)
        stats.expired_removed += sum(s.info.record_count for _, s in self.sections if self._expired_section(s))
        second = self._records(pass2)
        if not self.deduplicate:
            for rows in second:
                self._find_young(rows)
                out.split_at = self._young_cut()
                out.write(BatchColumns.of(rows.batch, rows.offsets), self._retention_only(rows))
            out.close()
            stats.records_out += out.records
            return

        first = self._records(pass1, INDEX_COLUMNS)
        expected_keys = sum(s.info.record_count for _, s in self.sections)
        map_from = self._clean_prefix_end()
        segment = 0
        while True:
            self.key_map.clear(expected_keys)
            self._looked_up = None
            stop = self._fill_map(first, map_from)
            out.split_at = self._young_cut()  # pass 1 is past the first young record, or pass 2 stops before it
            stats.distinct_keys += self.key_map.size
            stats.buffer_utilization = max(stats.buffer_utilization, round(self.key_map.utilization, 4))
            if segment == 0:
                # Everything below the first stop (and below the young records) will have no key twice.
                bounds = [b for b in (stop, self.young_from) if b is not None]
                out.clean_below(min(bounds) if bounds else (1 << 62))
            self.stop = stop
            self._clean_until(second, stop, out)
            if stop is None:
                break
            stats.overflows += 1
            segment += 1
            map_from = stop
            self.removes_latest = False
        if segment:
            stats.warnings_once(f"key map full (capacity {self.key_map.capacity} keys): partial progress, more rounds will converge")
        out.close()
        stats.records_out += out.records

    def _young_cut(self) -> int | None:
        """Where the output's young section starts: the inputs' first young record, or the young section outside
        the plan that the inputs straddle, whichever is lower."""
        cuts = [cut for cut in (self.first_young, self.outside_cut) if cut is not None]
        return min(cuts) if cuts else None

    def _find_young(self, rows: _Rows) -> None:
        """Note the first record within the lag in the inputs (they come in offset order): the first uncleanable
        offset is no higher, and the output's young section starts there."""
        if self.lag_cut is None or self.first_young is not None:
            return
        young = rows.batch.column("timestamp").to_numpy() > self.lag_cut
        if rows.aborted is not None:
            young &= ~rows.aborted
        if young.any():
            self.first_young = int(rows.offsets[int(np.argmax(young))])
            self.young_from = self.first_young if self.young_from is None else min(self.young_from, self.first_young)

    def _fill_map(self, reader: _PartitionReader, map_from: int) -> int | None:
        """Pass 1 until the map is full (returns the offset where it stopped) or the partition ends; from the
        first uncleanable offset on there is nothing more to map."""
        for rows in reader:
            offsets = rows.offsets
            self._find_young(rows)
            # Offsets increase: the rows to map are one run, from `map_from` to the first young row.
            start = int(np.searchsorted(offsets, map_from)) if offsets[0] < map_from else 0
            end = len(offsets) if self.young_from is None else int(np.searchsorted(offsets, self.young_from))
            key_hash = rows.batch.column("key_hash")
            # Records without a key (their hash is null exactly when the key is) and aborted ones are not mapped.
            mapped_rows = np.asarray(key_hash.is_valid()) if key_hash.null_count else None
            if rows.aborted is not None:
                mapped_rows = ~rows.aborted if mapped_rows is None else mapped_rows & ~rows.aborted
            if mapped_rows is not None:
                keyed = start + np.flatnonzero(mapped_rows[start:end])
                hashes, mapped = key_hash_words(key_hash)[keyed], offsets[keyed]
            else:
                keyed = None
                hashes, mapped = key_hash_words(key_hash)[start:end], offsets[start:end]
            if len(mapped):
                taken = self.key_map.put(hashes, mapped)
                if taken < len(mapped):
                    stop_row = start + taken if keyed is None else int(keyed[taken])
                    reader.push_back(rows.slice(stop_row))
                    return int(offsets[stop_row])
            if end < len(offsets):
                for _ in reader:  # the rest is young: pass 1 is done with this partition
                    pass
                return None
        return None

    def _clean_until(self, reader: _PartitionReader, stop: int | None, out: _PartitionOutput) -> None:
        """Pass 2: decide every record below `stop` (all when None) against the map, write survivors, and count them."""
        self._decide_until(reader, stop, out)
        self._count_decided()

    def _decide_until(self, reader: _PartitionReader, stop: int | None, out: _PartitionOutput) -> None:
        for rows in reader:
            if stop is not None:
                cut = int(np.searchsorted(rows.offsets, stop))
                if cut < len(rows.offsets):
                    reader.push_back(rows.slice(cut))
                    if cut:
                        out.write(*self._decide(rows.slice(0, cut)))
                    return
            out.write(*self._decide(rows))

    def _retention_only(self, rows: _Rows) -> np.ndarray:
        """A copy: retention for `delete` topics; a compacted topic's records are all kept (without the key
        map, removing one could leave an older value of its key as the latest). Aborted records are not."""
        keep = np.ones(len(rows.offsets), dtype=bool) if rows.aborted is None else ~rows.aborted
        if self.expire_before is not None and not self.config.compacted:
            expired = rows.batch.column("timestamp").to_numpy() < self.expire_before
            self.stats.expired_removed += int(expired.sum())
            keep &= ~expired
        else:
            expired = np.zeros(len(rows.offsets), dtype=bool)
        if rows.aborted is not None:
            self._count_aborted(rows.batch, rows.aborted & ~expired)
        return keep

    def _count_aborted(self, batch: pa.RecordBatch, counted: np.ndarray) -> None:
        """The aborted records of `batch` that `counted` marks (those not expired) and their bytes."""
        if counted.any():
            self.stats.aborted_removed += int(counted.sum())
            self.stats.aborted_bytes_removed += _record_bytes_of(batch, counted)

    def _decide(self, records: _Rows) -> tuple[BatchColumns, np.ndarray]:
        """The batch's columns with the delete horizons its records carry (new only where a tombstone is stamped), and
        which records survive: Kafka's rules, applied row by row in one compiled pass. The stats it counts wait in
        `decided_counts` for `_count_decided`."""
        rows = BatchColumns.of(records.batch, records.offsets)
        n = len(rows.offsets)
        keep = np.empty(n, dtype=np.bool_)
        horizons = np.empty(n, dtype=np.int64)
        stamped = np.empty(n, dtype=np.bool_)
        expired = np.empty(n, dtype=np.bool_)
        aborted = np.zeros(n, dtype=np.bool_) if records.aborted is None else records.aborted
        _decide_rows(
            rows.offsets,
            aborted,
            self._latest(rows.hashes),
            rows.keyed,
            rows.valued,
            rows.timestamps,
            rows.horizons,
            rows.stamped,
            *self._bounds(),
            keep,
            horizons,
            stamped,
            expired,
            self.decided_counts,
        )
        if records.aborted is not None:
            self._count_aborted(records.batch, aborted & ~expired)
        return rows._replace(horizons=horizons, stamped=stamped), keep

    def _bounds(self) -> tuple[int, int, bool, int, int, int]:
        """`_decide_rows`'s bounds of the partition now, in its order: the first young offset, the outside floor, whether
        a key's latest record may go, retention's cut, the clock, the horizon to stamp (sentinels for the ones it lacks)."""
        return (
            _NEVER if self.young_from is None else self.young_from,
            _NEVER if self.floor is None else self.floor,
            self.removes_latest,
            _NEVER_EXPIRES if self.expire_before is None else self.expire_before,
            self.plan.now_ms,
            self.horizon,
        )

    def _payload_wanted(self, placed: CatalogSection) -> PayloadWanted:
        """Pass 2's question to a block holding rows of `placed` alone, asked with its index columns before its payload
        is read: may any of its records survive? None may when each is a duplicate, expired, or without a key, all
        decided without the payload: then `_decide`'s counts for them are added here and the payload is never read.
        Every other block is read whole: one with a record at or past this stretch's stop, or in an aborted range
        (whose bytes are counted), or whose offsets do not increase (`_with_offsets` reports it)."""

        def wanted(index: pa.RecordBatch) -> bool:
            deltas = index.column(0).to_numpy()  # offset_delta
            if not len(deltas):
                return True
            if len(self.aborted_lasts) and self._any_aborted(placed.first_offset + int(deltas[0]), placed.first_offset + int(deltas[-1])):
                return True
            key_hash = index.column(_INDEX_KEY_HASH)
            hashes = key_hash_words(key_hash)
            latest = self.key_map.get(hashes)
            none_survive = _none_survive(
                deltas,
                placed.first_offset,
                _NEVER if self.stop is None else self.stop,
                latest,
                validity(key_hash, np.ones(index.num_rows, dtype=np.bool_)),
                int64_values(index.column(_INDEX_TIMESTAMP)),
                *self._bounds(),
                self.decided_counts,
            )
            if not none_survive:
                # `_decide` takes these lookups back for the block's rows: they are the same memory while the stash holds its buffer.
                self._looked_up = (key_hash.buffers()[1], hashes.ctypes.data, len(hashes), latest)
            return not none_survive

        return wanted

    def _latest(self, hashes: np.ndarray) -> np.ndarray:
        """The key map's offset of each row's key: the lookups `_payload_wanted` made for these very rows (the block's
        hashes alone, at the same address and length), or new ones."""
        looked_up, self._looked_up = self._looked_up, None
        if looked_up is not None and looked_up[1] == hashes.ctypes.data and looked_up[2] == len(hashes):
            return looked_up[3]
        return self.key_map.get(hashes)

    def _any_aborted(self, first: int, last: int) -> bool:
        """Does an aborted range of the plan hold an offset from `first` to `last`?"""
        lasts = self.aborted_lasts
        at = int(np.searchsorted(lasts, first))
        return at < len(lasts) and int(self.aborted_firsts[at]) <= last

    def _count_decided(self) -> None:
        """Add the counts `_decide` gathered to the stats (once a stretch of pass 2, not once a batch)."""
        counts = self.decided_counts
        stats = self.stats
        for name, count in zip(_COUNTED, counts.tolist()):
            setattr(stats, name, getattr(stats, name) + count)
        if counts[_INVALID]:
            stats.warnings_once(f"{self.topic}/{self.partition}: records without a key in a compacted topic were removed")
        counts[:] = 0


# The index columns' places (a block's index part, as pass 2's `_payload_wanted` is shown it).
_INDEX_TIMESTAMP = INDEX_SCHEMA.get_field_index("timestamp")
_INDEX_KEY_HASH = INDEX_SCHEMA.get_field_index("key_hash")
# Sentinels of `_decide_rows` for a bound the partition does not have: no young offset, no floor, no retention.
_NEVER = np.iinfo(np.int64).max
_NEVER_EXPIRES = np.iinfo(np.int64).min
# The stats `_decide_rows` counts, in the order of its `counts`.
_COUNTED = ("expired_removed", "invalid_records", "duplicates_removed", "tombstones_removed", "tombstones_stamped", "tombstones_kept", "young_kept")
_EXPIRED, _INVALID, _DUPLICATE, _TOMBSTONE_REMOVED, _STAMPED, _TOMBSTONE_KEPT, _YOUNG_KEPT = range(len(_COUNTED))


@numba.njit(cache=True, nogil=True)
def _decide_rows(
    offsets, aborted, latest, keyed, valued, timestamps, horizons, has_horizon, young_from, floor, removes_latest, expire_before,
    now, new_horizon, keep, out_horizons, out_stamped, out_expired, counts,
):
    """The rules of the module docstring for each record: `latest` is the key map's offset of its key (-1: none),
    and a key's latest record may go only below `floor` (the outside floor) and while `removes_latest`; an aborted
    record goes, counted here as expired when retention removes it too. Fills `keep`, the horizons to write, which
    records retention removes (`out_expired`: the caller counts the other aborted ones, with their bytes), and
    `counts` in `_COUNTED` order."""
    for i in range(offsets.shape[0]):
        offset = offsets[i]
        may_go = removes_latest and offset < floor
        expired = may_go and timestamps[i] < expire_before
        out_expired[i] = expired
        if aborted[i]:
            keep[i] = False
            out_horizons[i] = 0
            out_stamped[i] = False
            counts[_EXPIRED] += expired
            continue
        tombstone = not valued[i]
        eligible = keyed[i] and offset < young_from
        duplicate = eligible and latest[i] > offset and not expired
        invalid = not keyed[i] and not expired
        last_of_key = tombstone and eligible and not duplicate and not expired
        stamped = has_horizon[i]
        removed_tombstone = last_of_key and stamped and horizons[i] <= now and may_go
        kept = not (expired or invalid or duplicate or removed_tombstone)
        keep[i] = kept
        if last_of_key and not stamped:
            out_horizons[i] = new_horizon
            out_stamped[i] = True
            counts[_STAMPED] += 1
        else:
            out_horizons[i] = horizons[i] if stamped else 0
            out_stamped[i] = stamped
        counts[_EXPIRED] += expired
        counts[_INVALID] += invalid
        counts[_DUPLICATE] += duplicate
        counts[_TOMBSTONE_REMOVED] += removed_tombstone
        counts[_TOMBSTONE_KEPT] += tombstone and kept
        counts[_YOUNG_KEPT] += kept and offset >= young_from


@numba.njit(cache=True, nogil=True)
def _none_survive(
    deltas, first_offset, stop, latest, keyed, timestamps, young_from, floor, removes_latest, expire_before, now, new_horizon,
    counts,
):
    """Whether none of a block's records survives `_decide_rows`, judged from its index columns alone: each a value
    (a tombstone is removed only as the latest of its key, which survives here too), none aborted. Only a block
    whose offsets increase and end before `stop` may be judged so; when none survives, its counts are added to
    `counts` as `_decide_rows` would add them."""
    n = deltas.shape[0]
    offsets = np.empty(n, dtype=np.int64)
    if n == 0 or _piece_offsets(deltas, first_offset, offsets) >= 0 or offsets[n - 1] >= stop:
        return False
    unmarked = np.zeros(n, dtype=np.bool_)
    keep = np.empty(n, dtype=np.bool_)
    found = np.zeros_like(counts)
    _decide_rows(
        offsets, unmarked, latest, keyed, np.ones(n, dtype=np.bool_), timestamps, offsets, unmarked, young_from, floor,
        removes_latest, expire_before, now, new_horizon, keep, np.empty(n, dtype=np.int64), np.empty(n, dtype=np.bool_),
        np.empty(n, dtype=np.bool_), found,
    )
    if keep.any():
        return False
    counts += found
    return True


@numba.njit(cache=True, nogil=True)
def _mark_aborted(offsets, firsts, lasts, aborted):
    """Mark in `aborted` the `offsets` (increasing) inside the ranges `firsts[i]` to `lasts[i]` (increasing, apart);
    returns how many, walking both at once."""
    marked = 0
    at = 0
    for row in range(offsets.shape[0]):
        offset = offsets[row]
        while at < firsts.shape[0] and lasts[at] < offset:
            at += 1
        inside = at < firsts.shape[0] and firsts[at] <= offset
        aborted[row] = inside
        marked += inside
    return marked


def _record_bytes_of(batch: pa.RecordBatch, rows: np.ndarray) -> int:
    """`record_bytes` of the rows of `batch` where `rows` is true, read off its buffers, not a filtered copy."""
    every = np.ones(batch.num_rows, dtype=np.bool_)
    key, value, headers = batch.column("key"), batch.column("value"), batch.column("headers")
    size = _binary_bytes_of(rows, binary_parts(key)[0], validity(key, every), binary_parts(value)[0], validity(value, every))
    if headers.null_count < len(headers):
        size += int(header_row_bytes(headers)[rows].sum())
    return size


@numba.njit(cache=True, nogil=True)
def _binary_bytes_of(rows, key_offsets, keyed, value_offsets, valued):
    """The fixed bytes, key bytes and value bytes of the rows marked in `rows` (a null's range is none of its bytes)."""
    size = 0
    for row in range(rows.shape[0]):
        if rows[row]:
            size += FIXED_ROW_BYTES
            if keyed[row]:
                size += key_offsets[row + 1] - key_offsets[row]
            if valued[row]:
                size += value_offsets[row + 1] - value_offsets[row]
    return size


def compile_kernels() -> None:
    """Compile (or load from numba's cache) the engine's loops now, not in a job's first partition: a plan of three
    records (a duplicate, a tombstone, a header) deduplicated in a temporary store, twice over: in partition 0 they
    are two sections of two files (the second alone in its block, which pass 2 judges by its index columns first),
    in partition 1 one section, a record of each in an aborted range (the loops that mark and size aborted records).
    numba compiles a loop once for read-only arrays (a section's batch as decoded) and once for writable ones (small
    sections' batches joined), and a job meets both."""
    from logcompact.format.writer import section_table, write_segment
    from logcompact.store import LocalStore
    from logcompact.topics import Topic

    with tempfile.TemporaryDirectory(prefix="logcompact-compile-") as root:
        store = LocalStore(root)
        table = section_table([0, 1, 2], [1, 2, 3], [b"k", b"k", b"j"], [b"v", None, b"w"], [[("h", b"x")], None, None])
        inputs = []
        for name, sections, first_offset in (("first", [("compile", 0, table), ("compile", 1, table)], 0), ("second", [("compile", 0, table)], 3)):
            blob, infos = write_segment(sections)
            key = f"data/l1/compile-{name}.seg"
            store.put(key, blob)
            inputs.append(DataFile(key, 1, len(blob), 0, tuple(CatalogSection(info, first_offset if info.partition == 0 else 0) for info in infos)))
        plan = Plan(
            plan_id="compile", cluster_id="compile", manifest_version=1, now_ms=10, target_level=2, deduplicate=True,
            inputs=tuple(inputs), topics={"compile": Topic.create("compile", 2, {"cleanup.policy": "compact"}, 0)},
            aborted={("compile", 0): ((1, 1),), ("compile", 1): ((2, 2),)},
        )
        run_plan(store, plan, workdir=root)
