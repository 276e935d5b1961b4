"""The ingest agent: buffers produced records and writes them as L0 files, then commits each file.

An agent accepts records for any topics and partitions. Every `flush_interval_ms` (250 ms by default), or once
`flush_bytes` (32 MiB) are buffered, or once a quarter of them are and the buffer's first batch is `FILL_MS` old,
it writes one L0 file holding a section per topic-partition it received, and commits it with one catalog
transaction that also assigns the offsets: each section gets the
next offsets of its partition as that transaction reads and advances them, so several agents (threads,
processes or machines on one catalog database) can never hand out one offset twice. The agent reads only the
topics from the catalog (partitions, whether compacted), never its files.

Writing and committing are a pipeline: files are written one at a time, in order, and a committer commits
every file written by then in one transaction (a group commit), in order, while the next one is written. An
agent whose commits fall behind its flushes (a busy database, agents appending to the same partitions) so
commits two or three files at once instead of queueing transactions, and its records keep their produce order.
At most `MAX_UNCOMMITTED_FILES` wait for their commit: a writer finding that many waits (backpressure).

A batch is validated whole before any of it is buffered: a rejected batch leaves nothing behind. A failed
write or commit fails the futures of every record in its files, and the error is raised again by the
agent's next `produce`, `flush` or `close`; the background threads never die silently.

An idempotent producer's batch (`sequenced`) is recorded in the catalog by the append that writes it
(`logcompact.catalog.producers`). A batch may name the batch it must follow (`after`): it is written only if
that one was committed, else failed unwritten; a file written while that one's commit was pending is failed
uncommitted when it was not, so a failed file never leaves a gap in a producer's sequences for the next file
to commit over. A transactional batch whose transaction ended before its append (`catalog.transactions`) fails
alone with TxnRefusal: the file's other batches are answered, and it counts as committed for the batches that follow
it (its offsets are an aborted range, and its producer's sequences go on from it).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import NamedTuple, cast

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import Catalog, NewFile
from logcompact.catalog.producers import PlacedBatch, SequencedBatch
from logcompact.catalog.schema import UNKNOWN_CODEC
from logcompact.catalog.transactions import TxnError, TxnRefusal
from logcompact.collector import collector_paused
from logcompact.exceptions import IngestError, InvalidRecordError
from logcompact.format import PartsSink, SegmentWriter
from logcompact.format.layout import HEADERS_TYPE, SECTION_SCHEMA
from logcompact.format.xxh3 import key_hash_array
from logcompact.keys import l0_key
from logcompact.limits import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL_MS, EARLY_SHARE, FILL_MS
from logcompact.topics import Topic
from logcompact.units import LONG_MAX, wall_clock_ms

# Files written but not committed, at most: two seconds of flushes at the default interval.
MAX_UNCOMMITTED_FILES = 8
# Bytes counted per record beyond key and value, for the size trigger (offset, timestamp, hash, framing).
RECORD_OVERHEAD_BYTES = 32

# A batch as the columns `produce_columns` takes, one row per record; a null timestamp takes the agent's clock, a
# null value is a tombstone, null headers are none.
PRODUCE_SCHEMA = pa.schema(
    [
        pa.field("timestamp", pa.int64()),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)


class Record(NamedTuple):
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    headers: Sequence[tuple[str, bytes]] | None = None


@dataclass
class _PendingBatch:
    """One produce call, validated: its records as columns (timestamps given), in order within each partition."""

    future: Future
    topic: str
    partitions: int | np.ndarray  # one partition for every record, or each record's
    columns: pa.RecordBatch  # of PRODUCE_SCHEMA
    offsets_as_list: bool  # produce() answers a list of offsets, produce_columns() an array
    sequenced: SequencedBatch | None = None
    after: Future | None = None
    produced_codec: int = UNKNOWN_CODEC  # the Kafka codec the producer sent it in


@dataclass
class _WrittenFile:
    """An L0 file in the store, waiting for its commit: what the commit needs, and how to answer its batches."""

    new_file: NewFile
    sequenced: list[PlacedBatch]
    batches: list[_PendingBatch]
    order: np.ndarray  # the records in file order, as buffer positions
    counts: np.ndarray  # records per section
    deltas: np.ndarray  # each record's offset within its section, in file order
    started: float  # time.monotonic() when its flush began
    done: threading.Event = field(default_factory=threading.Event)  # committed, or failed


# The last flushes whose longest sets how early the next one begins (`Agent._left_ms`): about 2 s at a 250 ms interval.
LEAD_FLUSHES = 8

# The flushes whose times and sizes the agent's metrics take quantiles over: Kafka's histograms keep a reservoir of 1,028.
RECENT_FLUSHES = 1028


@dataclass
class FlushStats:
    """What the agent's L0 flushes did, for its metrics: files committed, their bytes and records, and the recent
    files' sizes and times from the start of their write to their commit; the catalog commits (each of the files
    written by then) and their times. Written by the committing thread, read by the metrics' scrape (ints and
    deques, whose single steps the GIL keeps whole)."""

    files: int = 0
    bytes: int = 0
    records: int = 0
    recent_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FLUSHES))
    recent_bytes: deque[int] = field(default_factory=lambda: deque(maxlen=RECENT_FLUSHES))
    total_ms: float = 0.0
    commits: int = 0
    commit_total_ms: float = 0.0
    recent_commit_ms: deque[float] = field(default_factory=lambda: deque(maxlen=RECENT_FLUSHES))

    def appended(self, took_ms: float) -> None:
        """A catalog commit of L0 files (`Catalog.append_files`) done in `took_ms`."""
        self.commits += 1
        self.commit_total_ms += took_ms
        self.recent_commit_ms.append(took_ms)

    def committed(self, size: int, records: int, took_ms: float) -> None:
        self.files += 1
        self.bytes += size
        self.records += records
        self.total_ms += took_ms
        self.recent_ms.append(took_ms)
        self.recent_bytes.append(size)


@dataclass
class _Buffer:
    batches: list[_PendingBatch] = field(default_factory=list)
    size_bytes: int = 0
    started_ms: float = 0.0


def _uncommitted(future: Future) -> BaseException | None:
    """Why a batch answered already was not committed; None for one committed, or refused by its append (a late
    transactional batch: committed, its offsets aborted, and recorded in its producer's sequences)."""
    failure = future.exception()
    return None if isinstance(failure, TxnRefusal) else failure


def _follows_a_commit(batch: _PendingBatch) -> bool:
    """Whether a batch may be written: it follows no batch, or one committed or still waiting for its commit. One
    that may not is failed here; a batch following it then fails in turn (in buffer order)."""
    after = batch.after
    if after is None or not after.done() or _uncommitted(after) is None:
        return True
    failure = IngestError(f"batch not written: the batch it follows was not committed ({after.exception()})")
    batch.future.set_exception(failure)
    return False


def _failed_predecessor(written: _WrittenFile) -> BaseException | None:
    """Why a written file may not be committed: a batch in it follows one that failed since it was written (its
    file's commit failed). Files are committed in order, so by now every batch it follows is answered, or in a
    file committed with it."""
    for batch in written.batches:
        after = batch.after
        if after is not None and after.done() and _uncommitted(after) is not None:
            return after.exception()
    return None


def _data_bytes(array: pa.Array) -> int:
    """The bytes of a binary array's values, from its offsets (no pass over the values)."""
    offsets = array.buffers()[1]
    if offsets is None or not len(array):
        return 0
    bounds = np.frombuffer(offsets, dtype=np.int32)
    return int(bounds[array.offset + len(array)] - bounds[array.offset])


_KAFKA_CODECS = 5  # none, gzip, snappy, lz4, zstd: Kafka's codec ids 0-4


def _produced_codecs(batches: Sequence[_PendingBatch], rows: np.ndarray, order: np.ndarray, counts: np.ndarray) -> tuple[int, ...]:
    """Per section (`counts` records each, in file order `order`), the Kafka codec most of its records were produced
    with, UNKNOWN_CODEC where none is known; () when no batch's is."""
    codes = np.array([batch.produced_codec + 1 for batch in batches], dtype=np.int64)  # 0: unknown
    if not codes.any():
        return ()
    bins = _KAFKA_CODECS + 1
    section_of_record = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    tally = np.bincount(section_of_record * bins + np.repeat(codes, rows)[order], minlength=len(counts) * bins).reshape(-1, bins)
    known = tally[:, 1:]
    return tuple(np.where(known.any(axis=1), known.argmax(axis=1), UNKNOWN_CODEC).tolist())


def _first(mask: np.ndarray) -> int | None:
    found = np.flatnonzero(mask)
    return int(found[0]) if len(found) else None


class Agent:
    def __init__(
        self,
        catalog: Catalog,
        *,
        flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS,
        flush_bytes: int = DEFAULT_FLUSH_BYTES,
        clock: Callable[[], int] = wall_clock_ms,
        compression: str = "lz4",
        background: bool = True,
        stats: FlushStats | None = None,
    ) -> None:
        self.catalog = catalog
        self.store = catalog.store
        self.flush_interval_ms = flush_interval_ms
        self.flush_bytes = flush_bytes
        self._early_bytes = max(flush_bytes // EARLY_SHARE, 1)
        self.clock = clock
        self.compression = compression
        self.files_written = 0
        self.stats = FlushStats() if stats is None else stats
        self._recent_flush_ms: deque[float] = deque(maxlen=LEAD_FLUSHES)  # how long the last flushes took, write to commit
        self._topics: dict[str, Topic] = catalog.snapshot().topics
        self._buffer = _Buffer()
        self._buffer_lock = threading.Lock()
        self._write_lock = threading.Lock()  # one file written at a time, in buffer order
        self._commit_lock = threading.Lock()  # one group committed at a time, in written order
        self._uncommitted: list[_WrittenFile] = []  # written, in order, not yet taken by a commit
        self._queue = threading.Condition()  # guards _uncommitted; notified when it grows or shrinks
        self._error: Exception | None = None
        self._closed = threading.Event()
        self._wake = threading.Event()  # the flusher's: a buffer began (its deadline is set), holds a quarter or is full
        self._flusher: threading.Thread | None = None
        self._committer: threading.Thread | None = None
        if background:
            self._flusher = threading.Thread(target=self._flush_periodically, name="logcompact-agent-flusher", daemon=True)
            self._committer = threading.Thread(target=self._commit_continually, name="logcompact-agent-committer", daemon=True)
            self._flusher.start()
            self._committer.start()

    # -- producing ---------------------------------------------------------------------------------

    def produce(self, topic: str, records: Sequence[Record], sequenced: SequencedBatch | None = None, after: Future | None = None) -> Future:
        """Buffer a batch for one topic; the future resolves to the records' offsets (a list) once committed.

        `sequenced`: the batch is an idempotent producer's, all of one partition, recorded with the append that
        writes it. `after`: the future of a batch produced earlier that this one must follow; if that one is not
        committed, this one is failed unwritten."""
        self._check_open()
        # Column by column, so a batch of thousands of records costs a few passes, not thousands of steps.
        partitions, keys, values, timestamps, headers = (list(column) for column in zip(*records)) if records else ([],) * 5
        bad = next((i for i, p in enumerate(partitions) if type(p) is not int), None)
        if bad is not None:
            raise InvalidRecordError(f"record {bad} of topic {topic!r}: partition {partitions[bad]!r} is not an int; batch rejected")
        for name, column in (("key", keys), ("value", values)):
            bad = next((i for i, v in enumerate(column) if v is not None and type(v) is not bytes), None)
            if bad is not None:
                raise InvalidRecordError(f"record {bad} of topic {topic!r}: {name} must be bytes or None; batch rejected")
        bad = next((i for i, t in enumerate(timestamps) if t is not None and (type(t) is not int or not 0 <= t <= LONG_MAX)), None)
        if bad is not None:
            raise InvalidRecordError(
                f"record {bad} of topic {topic!r}: timestamp {timestamps[bad]!r} must be milliseconds from 0 to 2**63-1; batch rejected"
            )
        try:
            header_column = (
                pa.array([[{"key": k, "value": v} for k, v in hs] if hs else None for hs in headers], type=HEADERS_TYPE)
                if any(headers) else pa.nulls(len(headers), HEADERS_TYPE)
            )
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError) as exc:
            raise InvalidRecordError(f"records of topic {topic!r}: headers must be (str, bytes or None) pairs ({exc}); batch rejected") from None
        columns = pa.RecordBatch.from_arrays(
            [pa.array(timestamps, pa.int64()), pa.array(keys, pa.binary()), pa.array(values, pa.binary()), header_column],
            schema=PRODUCE_SCHEMA,
        )
        one_partition = len(set(partitions)) == 1
        if sequenced is not None and not one_partition:
            raise InvalidRecordError(f"an idempotent producer's batch of topic {topic!r} is of one partition; batch rejected")
        return self._append(topic, partitions[0] if one_partition else np.asarray(partitions, dtype=np.int64), columns, True, sequenced, after)

    def produce_columns(self, topic: str, partitions: int | np.ndarray, columns: pa.RecordBatch, sequenced: SequencedBatch | None = None,
                        after: Future | None = None, produced_codec: int = UNKNOWN_CODEC) -> Future:
        """Buffer a batch for one topic given as columns (PRODUCE_SCHEMA), of one partition (an int) or each record's
        (an int64 array); the future resolves to the records' offsets (an int64 array) once committed. No Python
        object is made per record: a Kafka Produce's decoded batch comes this way, with the Kafka codec id it was sent
        in (`produced_codec`), which its section records for Fetch. `sequenced` and `after` as for `produce`."""
        self._check_open()
        if columns.schema != PRODUCE_SCHEMA:
            raise InvalidRecordError(f"columns of topic {topic!r} are not of the produce schema ({PRODUCE_SCHEMA}); batch rejected")
        return self._append(topic, partitions, columns, False, sequenced, after, produced_codec)

    def _check_open(self) -> None:
        self._raise_background_error()
        if self._closed.is_set():
            raise IngestError("produce on a closed agent: create a new Agent")

    def _append(self, topic: str, partitions: int | np.ndarray, columns: pa.RecordBatch, offsets_as_list: bool,
                sequenced: SequencedBatch | None, after: Future | None, produced_codec: int = UNKNOWN_CODEC) -> Future:
        """The checks of the topic's rules, vectorized, then the batch into the buffer (flushed when full)."""
        rows = columns.num_rows
        highest = partitions if isinstance(partitions, int) else int(partitions.max()) if rows else 0
        described = self._topic(topic, highest)
        count = described.partitions
        if isinstance(partitions, int):
            bad = None if 0 <= partitions < count or not rows else 0
        else:
            bad = _first((partitions < 0) | (partitions >= count))
        if bad is not None:
            partition = partitions if isinstance(partitions, int) else int(partitions[bad])
            raise InvalidRecordError(f"record {bad} of topic {topic!r}: partition {partition!r} is not in 0 to {count - 1}; batch rejected")
        keys = columns.column("key")
        if described.config.compacted and keys.null_count:
            bad = _first(np.asarray(keys.is_null()))
            raise InvalidRecordError(
                f"record {bad} of compacted topic {topic!r} has no key; every record of a compacted topic needs one; batch rejected"
            )
        timestamps = columns.column("timestamp")
        if timestamps.null_count == rows and rows:  # every record stamped by the agent (as clients mostly leave them)
            timestamps = pa.array(np.full(rows, self.clock(), dtype=np.int64))
            columns = columns.set_column(0, PRODUCE_SCHEMA.field(0), timestamps)
        elif timestamps.null_count:
            timestamps = pc.fill_null(timestamps, self.clock())
            columns = columns.set_column(0, PRODUCE_SCHEMA.field(0), timestamps)
        milliseconds = timestamps.to_numpy()
        if rows and milliseconds.min() < 0:
            bad = _first(milliseconds < 0)
            raise InvalidRecordError(
                f"record {bad} of topic {topic!r}: timestamp {milliseconds[bad]} must be milliseconds from 0 to 2**63-1; batch rejected"
            )
        future: Future = Future()
        # Running: a caller cannot cancel it (a Kafka client gone while its batch waits for the flush), so the flush
        # always answers it; a set_result on a cancelled future would raise in the flusher and stop it for good.
        future.set_running_or_notify_cancel()
        if not rows:  # nothing to write: an empty L0 file would only count toward compaction thresholds
            future.set_result([] if offsets_as_list else np.empty(0, dtype=np.int64))
            return future
        if sequenced is not None and not isinstance(partitions, int):
            raise InvalidRecordError(f"an idempotent producer's batch of topic {topic!r} is of one partition; batch rejected")
        size = _data_bytes(keys) + _data_bytes(columns.column("value")) + RECORD_OVERHEAD_BYTES * rows
        with self._buffer_lock:
            buffer = self._buffer
            began = not buffer.batches
            if began:
                buffer.started_ms = time.monotonic() * 1000
            buffer.batches.append(_PendingBatch(future, topic, partitions, columns, offsets_as_list, sequenced, after, produced_codec))
            crossed = buffer.size_bytes < self._early_bytes <= buffer.size_bytes + size
            buffer.size_bytes += size
            buffered = buffer.size_bytes
        # A full buffer is the flusher's to write, so the producing thread goes on decoding while the file is written
        # and committed; a producer that fills a second buffer before the flusher takes the first flushes it itself,
        # waiting for the flush in progress: backpressure, and at most two buffers held.
        if self._flusher is not None and (began or crossed or buffered >= self.flush_bytes):
            self._wake.set()
        if buffered >= (self.flush_bytes if self._flusher is None else 2 * self.flush_bytes):
            self.flush()
        return future

    def _topic(self, name: str, highest_partition: int) -> Topic:
        """A topic as the catalog describes it, read again for a topic or a partition the agent does not know
        (created or added since it read them)."""
        known = self._topics.get(name)
        if known is None or highest_partition >= known.partitions:
            snapshot = self.catalog.snapshot()
            self._topics = snapshot.topics
            return snapshot.topic(name)
        return known

    def use_topics(self, topics: dict[str, Topic]) -> None:
        """Describe the topics as a newer read of the catalog does (a server re-reads them as they are deleted,
        re-created, altered)."""
        self._topics = topics

    # -- flushing ----------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write and commit everything buffered now; raises if this or an earlier flush failed."""
        self._write_and_commit_now()
        self._raise_background_error()

    def _write_and_commit_now(self) -> None:
        """Write the buffer, and commit it with every file written before it, in this thread."""
        written = self._write_buffer()
        self._commit_uncommitted()
        if written is not None:
            written.done.wait()  # taken by the committer's group while this thread waited for the commit lock

    def _write_buffer(self) -> _WrittenFile | None:
        """Write everything buffered as one L0 file, queued for its commit; None when nothing was buffered or the
        write failed (its batches are answered with the error)."""
        with self._write_lock:
            with self._buffer_lock:
                buffer, self._buffer = self._buffer, _Buffer()
            buffer.batches = [batch for batch in buffer.batches if _follows_a_commit(batch)]
            if not buffer.batches:
                return None
            with self._queue:
                while len(self._uncommitted) >= MAX_UNCOMMITTED_FILES and self._committer is not None:
                    self._queue.wait()
            try:
                with collector_paused():  # a file of 10,000 sections makes tens of thousands of small objects
                    written = self._write(buffer, time.monotonic())
            except Exception as exc:
                self._fail(buffer.batches, exc)
                return None
            with self._queue:
                self._uncommitted.append(written)
                self._queue.notify_all()
            return written

    def _commit_continually(self) -> None:
        """The committer: commit what is written as soon as it is, every file written by then in one group."""
        while True:
            with self._queue:
                while not self._uncommitted and not self._closed.is_set():
                    self._queue.wait()
                if not self._uncommitted:
                    return
            try:
                self._commit_uncommitted()
            except Exception as exc:  # its files are answered and released already; the agent's next call raises it
                self._error = self._error or exc

    def _commit_uncommitted(self) -> None:
        """Commit every file written and not yet taken, in one transaction, and answer their batches."""
        with self._commit_lock:
            with self._queue:
                group, self._uncommitted = self._uncommitted, []
                self._queue.notify_all()
            committable = []
            for written in group:
                failed = _failed_predecessor(written)
                if failed is None:
                    committable.append(written)
                    continue
                self._fail(written.batches, IngestError(f"batch not committed: the batch it follows was not committed ({failed})"))
                written.done.set()
            if not committable:
                return
            commit_started = time.monotonic()
            try:
                with collector_paused():
                    _version, assigned, refused = self.catalog.append_files(
                        [written.new_file for written in committable], self.clock(), [written.sequenced for written in committable]
                    )
            except Exception as exc:
                self._fail([batch for written in committable for batch in written.batches], exc)
                for written in committable:
                    written.done.set()
                return
            finished = time.monotonic()
            self.stats.appended((finished - commit_started) * 1000)
            try:
                for index, (written, firsts) in enumerate(zip(committable, assigned, strict=True)):
                    self.files_written += 1
                    self._answer(written, firsts, {number: error for (at, number), error in refused.items() if at == index})
                    took_ms = (finished - written.started) * 1000
                    self._recent_flush_ms.append(took_ms)
                    self.stats.committed(written.new_file.size, len(written.order), took_ms)
            except Exception as exc:  # committed, but a batch could not be answered: the rest are told, none waits
                self._fail([batch for written in committable for batch in written.batches if not batch.future.done()], exc)
            finally:
                for written in committable:
                    written.done.set()

    def _fail(self, batches: Sequence[_PendingBatch], exc: Exception) -> None:
        """Answer batches not committed with the error (one line: a database error's text goes on with its SQL and
        parameters), kept for the agent's next call."""
        reason = str(getattr(exc, "orig", None) or exc).splitlines()[0]
        failure = IngestError(f"L0 file not committed, its {len(batches)} produce batches failed: {reason}")
        failure.__cause__ = exc
        for batch in batches:
            batch.future.set_exception(failure)
        self._error = self._error or failure

    @staticmethod
    def _answer(written: _WrittenFile, firsts: Sequence[int], refused: Mapping[int, TxnError]) -> None:
        """Resolve a committed file's batches to their records' offsets, given each section's first offset; a
        transactional batch its append refused (`refused`, by index among the file's sequenced batches) fails with
        TxnRefusal, the others are answered as usual."""
        order = written.order
        offsets = np.empty(len(order), dtype=np.int64)
        offsets[order] = np.repeat(np.asarray(firsts, dtype=np.int64), written.counts) + written.deltas
        start, sequenced = 0, 0
        for batch in written.batches:
            end = start + batch.columns.num_rows
            error = None
            if batch.sequenced is not None:
                error, sequenced = refused.get(sequenced), sequenced + 1
            if error is not None:
                assert batch.sequenced is not None
                batch.future.set_exception(TxnRefusal(error, f"transactional batch of producer id {batch.sequenced.producer_id} refused "
                                                      "by its append: its transaction ended before it was written; its records are aborted"))
            else:
                batch.future.set_result(offsets[start:end].tolist() if batch.offsets_as_list else offsets[start:end])
            start = end

    def _write(self, buffer: _Buffer, started: float) -> _WrittenFile:
        """Write one L0 file of everything buffered, for its commit. One table for every section, made by
        concatenating the batches' Arrow columns, so a file of thousands of partitions and a million records costs a
        few Arrow calls."""
        batches = buffer.batches
        names = sorted({batch.topic for batch in batches})
        rank = {name: number for number, name in enumerate(names)}
        rows = np.array([batch.columns.num_rows for batch in batches], dtype=np.int64)
        # Records by (topic, partition), produce order kept within: `order` lists them, in buffer positions.
        if all(isinstance(batch.partitions, int) for batch in batches):
            # Every batch of one partition (a Kafka Produce's): the batches are ordered, and their columns concatenated.
            batch_slots = np.array([rank[batch.topic] << 32 | cast(int, batch.partitions) for batch in batches], dtype=np.int64)
            batch_order = np.argsort(batch_slots, kind="stable")
            firsts = np.cumsum(rows) - rows
            order = np.concatenate([np.arange(firsts[i], firsts[i] + rows[i]) for i in batch_order.tolist()])
            sorted_slots = np.repeat(batch_slots[batch_order], rows[batch_order])
            produced = pa.Table.from_batches([batches[i].columns for i in batch_order.tolist()], schema=PRODUCE_SCHEMA)
        else:
            partitions = np.concatenate([
                np.full(batch.columns.num_rows, batch.partitions, dtype=np.int64) if isinstance(batch.partitions, int) else batch.partitions
                for batch in batches
            ])
            slot_of_record = (np.repeat(np.array([rank[batch.topic] for batch in batches], dtype=np.int64), rows) << 32) | partitions
            order = np.argsort(slot_of_record, kind="stable")
            sorted_slots = slot_of_record[order]
            produced = pa.Table.from_batches([batch.columns for batch in batches], schema=PRODUCE_SCHEMA).take(order)
        starts = np.flatnonzero(np.diff(sorted_slots, prepend=-1))  # where each (topic, partition) begins
        counts = np.diff(starts, append=len(order))
        deltas = np.arange(len(order), dtype=np.int64) - np.repeat(starts, counts)
        first_slots = sorted_slots[starts]
        slots = list(zip(map(names.__getitem__, (first_slots >> 32).tolist()), (first_slots & 0xFFFFFFFF).tolist()))
        keys = produced.column("key")
        table = pa.Table.from_arrays(
            [
                pa.array(deltas.astype(np.uint32)),
                produced.column("timestamp"),
                keys,
                key_hash_array(keys),
                produced.column("value"),
                produced.column("headers"),
                pa.nulls(len(order), pa.int64()),
            ],
            schema=SECTION_SCHEMA,
        )
        # The file's parts go to the store as encoded: joining them cost two copies of the file into fresh memory.
        sink = PartsSink()
        writer = SegmentWriter(sink, self.compression)
        writer.write_sections(slots, table, counts.tolist())
        sections = writer.finish()
        now = self.clock()
        key = l0_key(now)
        self.store.put_parts(key, sink.parts)
        new_file = NewFile(key=key, level=0, size=writer.position, created_ms=now, sections=tuple(sections), produced_codecs=_produced_codecs(batches, rows, order, counts))
        record_deltas = np.empty(len(order), dtype=np.int64)  # each record's offset within its section, buffer order
        record_deltas[order] = deltas
        sequenced = []
        for batch, start in zip(batches, (np.cumsum(rows) - rows).tolist()):
            if batch.sequenced is not None:
                assert isinstance(batch.partitions, int)
                sequenced.append(PlacedBatch(batch.topic, batch.partitions, int(record_deltas[start]), batch.sequenced))
        return _WrittenFile(new_file, sequenced, batches, order, counts, deltas, started)

    def _left_ms(self, buffer: _Buffer) -> float:
        """How long until the buffer's flush is due: early by the longest of the last LEAD_FLUSHES flushes (at most half
        the interval), so that its file is committed, and its batches answered, when its first batch is
        flush_interval_ms old. The longest rather than an average: under load a few flushes take several times the
        median, and those set the acks' p99; slow flushes come in runs (the machine busy), which the window follows."""
        lead_ms = min(max(self._recent_flush_ms, default=0.0), self.flush_interval_ms / 2)
        return buffer.started_ms + self.flush_interval_ms - lead_ms - time.monotonic() * 1000

    def _due_in_ms(self, buffer: _Buffer) -> float | None:
        """How long until the buffer's flush is due (0 or less: now); None when nothing is buffered. Due when its
        first batch is flush_interval_ms old (`_left_ms`), when it is full, or when it holds a quarter (EARLY_SHARE)
        and its first batch is FILL_MS old."""
        if not buffer.batches:
            return None
        if buffer.size_bytes >= self.flush_bytes:
            return 0.0
        left_ms = self._left_ms(buffer)
        if buffer.size_bytes >= self._early_bytes:
            return min(left_ms, buffer.started_ms + FILL_MS - time.monotonic() * 1000)
        return left_ms

    def _flush_periodically(self) -> None:
        """Flush as soon as the buffer is due (`_due_in_ms`), to the millisecond rather than at the next of periodic
        checks."""
        timeout_s: float | None = None  # nothing buffered: wait for the first batch
        while not self._closed.is_set():
            self._wake.wait(timeout_s)
            self._wake.clear()
            with self._buffer_lock:
                due_in_ms = self._due_in_ms(self._buffer)
            if due_in_ms is not None and due_in_ms <= 0:
                self._write_buffer()
                with self._buffer_lock:  # batches produced during the flush began the next buffer
                    due_in_ms = self._due_in_ms(self._buffer)
            timeout_s = None if due_in_ms is None else max(due_in_ms, 0) / 1000

    def _raise_background_error(self) -> None:
        if self._error is not None:
            raise self._error

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what is buffered, stop the flusher and the committer, and raise any error a flush met."""
        self._closed.set()
        self._wake.set()
        if self._flusher is not None:
            self._flusher.join()
        self._write_and_commit_now()
        if self._committer is not None:
            with self._queue:
                self._queue.notify_all()
            self._committer.join()
        self._raise_background_error()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
