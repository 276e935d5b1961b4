"""The ingest agent: L0 files by time and size, offsets unique across agents, rejected batches leave nothing.

Every test runs on both catalog databases: on the `catalog` fixture (SQLite, PostgreSQL), or on the `store`
fixture (file with SQLite, s3 on RGW with PostgreSQL).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from sqlalchemy.exc import OperationalError

from logcompact import ingest
from logcompact.catalog import Catalog
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.transactions import TxnRefusal
from logcompact.consume import read_records
from logcompact.exceptions import IngestError, InvalidRecordError, StoreError, TopicNotFoundError
from logcompact.ingest import PRODUCE_SCHEMA, Agent, Record
from logcompact.store import LocalStore, ObjectStore
from tests.helpers import NOW, create_topic


def _with_topics(catalog: Catalog) -> Catalog:
    create_topic(catalog, "state", partitions=3, cleanup_policy="compact")
    create_topic(catalog, "events", partitions=2)
    return catalog


def test_one_l0_file_holds_every_topic_partition_received(store: ObjectStore, catalog_of) -> None:
    catalog = _with_topics(catalog_of(store))
    with Agent(catalog, background=False) as agent:
        state = agent.produce("state", [Record(p, b"k%d" % p, b"v", NOW) for p in (2, 0, 1, 0)])
        events = agent.produce("events", [Record(1, None, b"e", NOW), Record(0, b"x", None, NOW)])
    assert state.result() == [0, 0, 0, 1] and events.result() == [0, 0]
    snapshot = catalog.snapshot()
    (l0,) = snapshot.files(0)
    assert [(s.topic, s.partition, s.info.record_count) for s in l0.sections] == [
        ("events", 0, 1), ("events", 1, 1), ("state", 0, 2), ("state", 1, 1), ("state", 2, 1),
    ]
    assert store.stat(l0.key).size == l0.size
    assert [key for key, _ in snapshot.sections_of("state", 0)] == [l0.key]
    assert catalog.next_offsets("state") == [2, 1, 1] and catalog.next_offsets("events") == [1, 1]


def test_files_are_cut_at_the_size_threshold(catalog: Catalog) -> None:
    _with_topics(catalog)
    with Agent(catalog, flush_bytes=10_000, background=False) as agent:
        futures = [agent.produce("events", [Record(0, None, b"x" * 1000, NOW)] * 3) for _ in range(10)]
        assert agent.files_written == 2  # 30 records of ~1 KiB: a file at every ~10 KB
    assert [o for f in futures for o in f.result()] == list(range(30))
    assert len(catalog.snapshot().file_summaries(0)) == 3


def test_the_background_flusher_commits_within_the_interval(catalog: Catalog) -> None:
    _with_topics(catalog)
    with Agent(catalog, flush_interval_ms=50) as agent:
        offsets = agent.produce("events", [Record(1, b"k", b"v", NOW)]).result(timeout=5)
        assert offsets == [0] and agent.files_written == 1


# 1,032 bytes counted toward the size triggers (value and RECORD_OVERHEAD_BYTES), in a file of flush_bytes 40,000 (its
# quarter, limits.EARLY_SHARE: 10,000).
_KIB_RECORD = Record(0, None, b"x" * 1000, NOW)


def test_a_buffer_holding_a_quarter_of_flush_bytes_is_written_once_its_first_batch_is_fill_ms_old(catalog: Catalog) -> None:
    _with_topics(catalog)
    with Agent(catalog, flush_interval_ms=60_000, flush_bytes=40_000) as agent:
        below = agent.produce("events", [_KIB_RECORD] * 9)  # 9,288 bytes: below the quarter, kept for the interval
        time.sleep(4 * ingest.FILL_MS / 1000)
        assert not below.done() and agent.files_written == 0
        quarter = agent.produce("events", [_KIB_RECORD] * 2)
        assert quarter.result(timeout=5) == [9, 10] and below.result() == list(range(9))
        assert agent.files_written == 1
        began = time.monotonic()
        agent.produce("events", [_KIB_RECORD] * 10).result(timeout=5)  # the quarter at once: written FILL_MS after it began
        assert time.monotonic() - began >= ingest.FILL_MS / 1000 and agent.files_written == 2


def test_a_buffer_holding_flush_bytes_is_written_at_once(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    _with_topics(catalog)
    monkeypatch.setattr(ingest, "FILL_MS", 60_000)  # a quarter-full buffer waits as long as the interval
    with Agent(catalog, flush_interval_ms=60_000, flush_bytes=40_000) as agent:
        quarter = agent.produce("events", [_KIB_RECORD] * 20)
        time.sleep(0.2)
        assert not quarter.done() and agent.files_written == 0
        full = agent.produce("events", [_KIB_RECORD] * 19)  # 40,248 bytes
        assert full.result(timeout=5) == list(range(20, 39)) and agent.files_written == 1


def test_a_topic_created_after_the_agent_started_is_found(catalog: Catalog) -> None:
    _with_topics(catalog)
    with Agent(catalog, background=False) as agent:
        create_topic(Catalog(catalog.store, catalog.url), "later", partitions=1)
        future = agent.produce("later", [Record(0, None, b"v", NOW)])
        agent.flush()
    assert future.result() == [0]
    with pytest.raises(TopicNotFoundError, match="topic 'never' does not exist"):
        Agent(catalog, background=False).produce("never", [Record(0, None, b"v", NOW)])
    assert catalog.next_offsets("later") == [1]


def test_a_keyless_record_in_a_compacted_topic_rejects_the_whole_batch(store: ObjectStore, catalog_of) -> None:
    catalog = _with_topics(catalog_of(store))
    version = catalog.latest_version()
    with Agent(catalog, background=False) as agent:
        with pytest.raises(InvalidRecordError, match="record 1 of compacted topic 'state' has no key"):
            agent.produce("state", [Record(0, b"a", b"1", NOW), Record(0, None, b"2", NOW)])
        with pytest.raises(InvalidRecordError, match="partition 3 is not in 0 to 2"):
            agent.produce("state", [Record(3, b"a", b"1", NOW)])
        agent.flush()
        assert agent.files_written == 0
    assert catalog.latest_version() == version
    assert list(store.list("data/")) == []


def test_columns_are_produced_as_records_are(catalog: Catalog) -> None:
    """A batch given as Arrow columns (a Kafka Produce's way) is written as the same batch given as Records: nulls
    (tombstones, keys, headers, a null header value) kept, a null timestamp taking the agent's clock, each record in
    its partition; the future answers an array of offsets."""
    _with_topics(catalog)
    headers = [[("h", b"1"), ("none", None)], None, [("é", b"")]]
    columns = pa.RecordBatch.from_arrays(
        [pa.array([NOW, None, NOW + 2], pa.int64()), pa.array([None, b"b", b"c"]), pa.array([b"x", None, b"z"]),
         pa.array([None if h is None else [{"key": k, "value": v} for k, v in h] for h in headers], PRODUCE_SCHEMA.field("headers").type)],
        schema=PRODUCE_SCHEMA,
    )
    with Agent(catalog, background=False, clock=lambda: NOW + 1) as agent:
        by_columns = agent.produce_columns("events", np.array([1, 0, 1]), columns)
        by_records = agent.produce("events", [Record(p, r["key"], r["value"], r["timestamp"], headers[i]) for i, (p, r) in enumerate(zip([1, 0, 1], columns.to_pylist()))])
        with pytest.raises(InvalidRecordError, match="record 0 of compacted topic 'state' has no key"):
            agent.produce_columns("state", 0, columns)
        with pytest.raises(InvalidRecordError, match="record 1 of topic 'events': partition 2 is not in 0 to 1"):
            agent.produce_columns("events", np.array([0, 2, 0]), columns)
    assert by_columns.result().tolist() == [0, 0, 1] and by_records.result() == [2, 1, 3]
    stored = {p: [(r.timestamp, r.key, r.value, r.headers) for r in read_records(catalog.store, catalog.snapshot(), "events", p)] for p in (0, 1)}
    first, second, third = [(NOW, None, b"x", headers[0]), (NOW + 1, b"b", None, []), (NOW + 2, b"c", b"z", headers[2])]
    assert stored == {0: [second, second], 1: [first, third, first, third]}


def test_a_produced_batch_cannot_be_cancelled_so_its_flush_goes_on(catalog: Catalog) -> None:
    """A caller giving up on a batch (a Kafka client gone) cannot cancel its future: the flush answers it, and the
    flusher goes on to commit the next batches."""
    _with_topics(catalog)
    with Agent(catalog, flush_interval_ms=20) as agent:
        first = agent.produce("events", [Record(0, None, b"v", NOW)])
        assert not first.cancel()
        assert first.result(timeout=5) == [0]
        assert agent.produce("events", [Record(0, None, b"w", NOW)]).result(timeout=5) == [1]


def test_several_agents_never_hand_out_an_offset_twice(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2)
    results: dict[int, list[int]] = {}
    errors: list[BaseException] = []

    def run_agent(n: int) -> None:
        try:
            with Agent(Catalog(catalog.store, catalog.url), flush_interval_ms=5) as agent:
                futures = [agent.produce("t", [Record(0, b"a%d" % n, b"%d-%d" % (n, i), NOW)]) for i in range(40)]
            results[n] = [f.result()[0] for f in futures]
        except BaseException as exc:  # surfaced by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run_agent, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for offsets in results.values():
        assert offsets == sorted(offsets)  # each agent's records keep their order
    assert sorted(o for offsets in results.values() for o in offsets) == list(range(160))
    by_offset = {r.offset: r.value for r in read_records(catalog.store, catalog.snapshot(), "t", 0)}
    for n, offsets in results.items():
        assert [by_offset[o] for o in offsets] == [b"%d-%d" % (n, i) for i in range(40)]


class _FailingStore(LocalStore):
    def put_parts(self, key: str, parts: Sequence[Any]) -> None:  # how an agent writes its files
        raise StoreError(f"PUT {key} failed (SlowDown)")


def test_a_failed_flush_fails_its_futures_and_is_raised_again(catalog: Catalog) -> None:
    _with_topics(catalog)
    agent = Agent(Catalog(_FailingStore(catalog.store.root), catalog.url), flush_interval_ms=20)
    future = agent.produce("events", [Record(0, None, b"v", NOW)])
    with pytest.raises(IngestError, match=r"L0 file not committed.*SlowDown"):
        future.result(timeout=5)
    with pytest.raises(IngestError, match="SlowDown"):
        agent.produce("events", [Record(0, None, b"v", NOW)])
    with pytest.raises(IngestError):
        agent.close()
    assert catalog.next_offsets("events") == [0, 0]


def test_a_late_transactional_batch_fails_alone_and_the_batches_after_it_are_written(catalog: Catalog) -> None:
    """A transactional batch whose transaction was aborted before its append fails alone with its refusal: the other
    batch of its file is answered, and its records' offsets are an aborted range. It counts as committed for the
    producer's next batch (recorded in its sequences), which is written and refused in turn, not failed unwritten."""
    _with_topics(catalog)
    pid, epoch = catalog.init_producer("app", 60_000, 900_000, None, NOW)
    catalog.add_to_transaction("app", pid, epoch, [("events", 0)], NOW)
    agent = Agent(catalog, background=False)
    first = agent.produce("events", [Record(0, None, b"a", NOW)], SequencedBatch(pid, epoch, 0, 0, None, True))
    agent.flush()
    assert first.result() == [0]
    catalog.end_transaction("app", pid, epoch, False, NOW)  # its marker at 1
    late = agent.produce("events", [Record(0, None, b"b", NOW), Record(0, None, b"c", NOW)], SequencedBatch(pid, epoch, 1, 2, (epoch, 0), True), first)
    other = agent.produce("events", [Record(0, None, b"x", NOW), Record(1, None, b"y", NOW)])
    agent.flush()
    with pytest.raises(TxnRefusal, match="^INVALID_TXN_STATE: "):
        late.result()
    assert other.result() == [4, 0]
    follower = agent.produce("events", [Record(0, None, b"d", NOW)], SequencedBatch(pid, epoch, 3, 3, (epoch, 2), True), late)
    agent.flush()
    with pytest.raises(TxnRefusal, match="^INVALID_TXN_STATE: "):
        follower.result()
    agent.close()  # nothing failed: no error kept for the agent's next call
    assert catalog.aborted_ranges({("events", 0): (0, 10)}) == {("events", 0): [(0, 0), (2, 3), (5, 5)]}
    assert [r.value for r in read_records(catalog.store, catalog.snapshot(), "events", 0)] == [b"a", b"b", b"c", b"x", b"d"]


class _UnreachableCatalog(Catalog):
    def append_files(self, new_files, now_ms, sequenced=()):
        raise OperationalError("INSERT INTO files", {}, ConnectionRefusedError("connection refused"))


def test_a_failed_commit_fails_its_futures_and_assigns_no_offset(catalog: Catalog) -> None:
    _with_topics(catalog)
    agent = Agent(_UnreachableCatalog(catalog.store, catalog.url), background=False)
    future = agent.produce("events", [Record(0, None, b"v", NOW)])
    with pytest.raises(IngestError, match="L0 file not committed, its 1 produce batches failed.*connection refused"):
        agent.flush()
    with pytest.raises(IngestError, match="connection refused"):
        future.result()
    assert catalog.next_offsets("events") == [0, 0] and catalog.snapshot().file_summaries() == []


class _SlowCatalog(Catalog):
    """A catalog whose appends take `delay_s` (a busy database), failing the first `failures` of them, each only
    once `files_in_store` L0 files are in the store when given; it records how many files each append committed."""

    def __init__(self, store, url, delay_s: float, failures: int = 0, files_in_store: int = 0) -> None:
        super().__init__(store, url)
        self.delay_s, self.failures, self.files_in_store, self.groups = delay_s, failures, files_in_store, []

    def append_files(self, new_files, now_ms, sequenced=()):
        time.sleep(self.delay_s)
        deadline = time.monotonic() + 10
        while self.failures and len(list(self.store.list("data/l0/"))) < self.files_in_store and time.monotonic() < deadline:
            time.sleep(0.01)
        if self.failures:
            self.failures -= 1
            raise OperationalError("INSERT INTO files", {}, TimeoutError("statement timeout"))
        result = super().append_files(new_files, now_ms, sequenced)
        self.groups.append(len(new_files))
        return result


def test_files_written_while_a_commit_is_slow_are_committed_together_in_order(catalog: Catalog) -> None:
    """An agent whose commits take longer than its flush interval goes on writing a file per interval and commits
    every file written by then in one transaction: fewer transactions than files, every record committed, offsets
    in produce order."""
    _with_topics(catalog)
    slow = _SlowCatalog(catalog.store, catalog.url, delay_s=0.2)
    agent = Agent(slow, flush_interval_ms=20)
    futures = []
    for n in range(24):
        futures.append(agent.produce("events", [Record(0, b"k", b"%d" % n, NOW)]))
        time.sleep(0.03)
    agent.close()
    assert [future.result() for future in futures] == [[n] for n in range(24)]
    assert sum(slow.groups) == agent.files_written == len(catalog.snapshot().file_summaries())
    assert max(slow.groups) > 1 and len(slow.groups) < agent.files_written, slow.groups
    assert [r.value for r in read_records(catalog.store, catalog.snapshot(), "events", 0)] == [b"%d" % n for n in range(24)]


def test_a_file_following_a_failed_commit_is_failed_uncommitted(catalog: Catalog) -> None:
    """A batch written while the commit of the batch it follows was pending is failed with its file when that
    commit fails, never committed over the gap; the agent raises the failure at its next call."""
    _with_topics(catalog)
    failing = _SlowCatalog(catalog.store, catalog.url, delay_s=0.0, failures=1, files_in_store=2)  # fails once the follower's file is written
    agent = Agent(failing, flush_interval_ms=20)
    first = agent.produce("events", [Record(0, b"k", b"first", NOW)])
    while not list(catalog.store.list("data/l0/")):  # its file is written, its commit under way
        time.sleep(0.005)
    follower = agent.produce("events", [Record(0, b"k", b"second", NOW)], after=first)
    with pytest.raises(IngestError, match="statement timeout"):
        first.result(timeout=5)
    with pytest.raises(IngestError, match="batch not committed: the batch it follows was not committed"):
        follower.result(timeout=5)
    with pytest.raises(IngestError, match="statement timeout"):
        agent.close()
    assert failing.groups == [] and catalog.next_offsets("events") == [0, 0]
