"""The ingest agent: buffers produced records and writes them as L0 files, then commits each file.

An agent accepts records for any topics and partitions. Every `flush_interval_ms` (250 ms by default) or
once `flush_bytes` (8 MiB) are buffered, it writes one L0 file holding a section per topic-partition it
received, and commits it with one catalog transaction that also assigns the offsets: each section gets the
next offsets of its partition as that transaction reads and advances them, so several agents (threads,
processes or machines on one catalog database) can never hand out one offset twice. Flushes of one agent
are serialized, so an agent's records keep their produce order. The agent reads only the topics from the
catalog (partitions, whether compacted), never its files.

A batch is validated whole before any of it is buffered: a rejected batch leaves nothing behind. A failed
write or commit fails the futures of every record in that file, and the error is raised again by the
agent's next `produce`, `flush` or `close`; the background flusher never dies silently.
"""

from __future__ import annotations

import io
import threading
import time
import uuid
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, Sequence

import numpy as np

from logcompact.catalog import Catalog, NewFile
from logcompact.exceptions import IngestError, InvalidRecordError
from logcompact.format import SegmentWriter, section_table
from logcompact.topics import Topic

DEFAULT_FLUSH_INTERVAL_MS = 250
DEFAULT_FLUSH_BYTES = 8 * 1024 * 1024
# Bytes counted per record beyond key and value, for the size trigger (offset, timestamp, hash, framing).
RECORD_OVERHEAD_BYTES = 32


class Record(NamedTuple):
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int | None = None
    headers: Sequence[tuple[str, bytes]] | None = None


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass
class _PartitionBuffer:
    timestamps: list[int] = field(default_factory=list)
    keys: list[bytes | None] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    headers: list[Sequence[tuple[str, bytes]] | None] = field(default_factory=list)


@dataclass
class _PendingBatch:
    """One produce() call: where its records sit in the buffers, to map assigned offsets back to it."""

    future: Future
    placements: list[tuple[tuple[str, int], int]]  # per record: (topic, partition), index in that buffer


@dataclass
class _Buffer:
    partitions: dict[tuple[str, int], _PartitionBuffer] = field(default_factory=dict)
    batches: list[_PendingBatch] = field(default_factory=list)
    size_bytes: int = 0
    started_ms: float = 0.0


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
    ) -> None:
        self.catalog = catalog
        self.store = catalog.store
        self.flush_interval_ms = flush_interval_ms
        self.flush_bytes = flush_bytes
        self.clock = clock
        self.compression = compression
        self.files_written = 0
        self._topics: dict[str, Topic] = catalog.snapshot().topics
        self._buffer = _Buffer()
        self._buffer_lock = threading.Lock()
        self._flush_lock = threading.Lock()
        self._error: Exception | None = None
        self._closed = threading.Event()
        self._flusher: threading.Thread | None = None
        if background:
            self._flusher = threading.Thread(target=self._flush_periodically, name="logcompact-agent-flusher", daemon=True)
            self._flusher.start()

    # -- producing ---------------------------------------------------------------------------------

    def produce(self, topic: str, records: Sequence[Record]) -> Future:
        """Buffer a batch for one topic; the future resolves to the records' offsets once committed."""
        self._raise_background_error()
        if self._closed.is_set():
            raise IngestError("produce on a closed agent: create a new Agent")
        described = self._topic(topic)
        partitions = described.partitions
        requires_key = described.config.compacted
        now = self.clock()
        checked = []
        size = 0
        for index, record in enumerate(records):
            partition, key, value, timestamp, headers = record
            if not isinstance(partition, int) or not 0 <= partition < partitions:
                raise InvalidRecordError(
                    f"record {index} of topic {topic!r}: partition {partition!r} is not in 0 to {partitions - 1}; batch rejected"
                )
            if key is None:
                if requires_key:
                    raise InvalidRecordError(
                        f"record {index} of compacted topic {topic!r} has no key; every record of a compacted topic "
                        "needs one; batch rejected"
                    )
            elif not isinstance(key, bytes):
                raise InvalidRecordError(f"record {index} of topic {topic!r}: key must be bytes or None; batch rejected")
            if value is not None and not isinstance(value, bytes):
                raise InvalidRecordError(f"record {index} of topic {topic!r}: value must be bytes or None; batch rejected")
            if timestamp is None:
                timestamp = now
            elif not isinstance(timestamp, int) or timestamp < 0:
                raise InvalidRecordError(
                    f"record {index} of topic {topic!r}: timestamp {timestamp!r} must be milliseconds >= 0; batch rejected"
                )
            size += len(key or b"") + len(value or b"") + RECORD_OVERHEAD_BYTES
            checked.append((partition, key, value, timestamp, headers or None))

        future: Future = Future()
        with self._buffer_lock:
            buffer = self._buffer
            if not buffer.partitions:
                buffer.started_ms = time.monotonic() * 1000
            placements = []
            for partition, key, value, timestamp, headers in checked:
                slot = (topic, partition)
                target = buffer.partitions.get(slot)
                if target is None:
                    target = buffer.partitions[slot] = _PartitionBuffer()
                placements.append((slot, len(target.keys)))
                target.timestamps.append(timestamp)
                target.keys.append(key)
                target.values.append(value)
                target.headers.append(headers)
            buffer.batches.append(_PendingBatch(future, placements))
            buffer.size_bytes += size
            full = buffer.size_bytes >= self.flush_bytes
        if full:
            self.flush()
        return future

    def _topic(self, name: str) -> Topic:
        """A topic as the catalog describes it; its partitions and cleanup.policy never change, so the
        agent reads the catalog again only for a topic it does not know (created after it started?)."""
        if name not in self._topics:
            snapshot = self.catalog.snapshot()
            self._topics = snapshot.topics
            return snapshot.topic(name)
        return self._topics[name]

    # -- flushing ----------------------------------------------------------------------------------

    def flush(self) -> None:
        """Write and commit everything buffered now; raises if this or an earlier flush failed."""
        self._flush_once()
        self._raise_background_error()

    def _flush_once(self) -> None:
        with self._flush_lock:
            with self._buffer_lock:
                buffer, self._buffer = self._buffer, _Buffer()
            if not buffer.batches:
                return
            try:
                offsets = self._write_and_commit(buffer)
            except Exception as exc:
                failure = IngestError(f"L0 file not committed, its {len(buffer.batches)} produce batches failed: {exc}")
                failure.__cause__ = exc
                for batch in buffer.batches:
                    batch.future.set_exception(failure)
                self._error = self._error or failure
                return
            for batch in buffer.batches:
                batch.future.set_result([offsets[slot] + index for slot, index in batch.placements])

    def _write_and_commit(self, buffer: _Buffer) -> dict[tuple[str, int], int]:
        # One table for every section, so a file of thousands of partitions costs a few Arrow calls, not
        # thousands.
        slots = sorted(buffer.partitions)
        parts = [buffer.partitions[slot] for slot in slots]
        counts = [len(part.keys) for part in parts]
        table = section_table(
            np.concatenate([np.arange(count, dtype=np.uint32) for count in counts]),
            [t for part in parts for t in part.timestamps],
            [k for part in parts for k in part.keys],
            [v for part in parts for v in part.values],
            [h for part in parts for h in part.headers],
        )
        sink = io.BytesIO()
        writer = SegmentWriter(sink, self.compression)
        writer.write_sections(slots, table, counts)
        sections = writer.finish()
        data = sink.getvalue()
        now = self.clock()
        key = f"data/l0/{now:013d}-{uuid.uuid4().hex}.seg"
        self.store.put(key, data)
        new_file = NewFile(key=key, level=0, size=len(data), created_ms=now, sections=tuple(sections))
        _version, assigned = self.catalog.append_files([new_file], now)
        self.files_written += 1
        return dict(zip(slots, assigned[0]))

    def _flush_periodically(self) -> None:
        interval_s = self.flush_interval_ms / 1000
        while not self._closed.wait(interval_s / 4):
            with self._buffer_lock:
                due = bool(self._buffer.batches) and (
                    time.monotonic() * 1000 - self._buffer.started_ms >= self.flush_interval_ms
                )
            if due:
                self._flush_once()

    def _raise_background_error(self) -> None:
        if self._error is not None:
            raise self._error

    # -- lifecycle ---------------------------------------------------------------------------------

    def close(self) -> None:
        """Flush what is buffered, stop the flusher, and raise any error a flush met."""
        self._closed.set()
        if self._flusher is not None:
            self._flusher.join()
        self._flush_once()
        self._raise_background_error()

    def __enter__(self) -> Agent:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
