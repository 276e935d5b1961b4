"""Kafka's transactions in the catalog, on both databases: InitProducerId's producer ids and epochs (fencing,
KIP-360 retries, exhausted epochs), AddPartitionsToTxn and AddOffsetsToTxn, EndTxn's markers, aborted ranges and
committed offsets, the append's transactional batches (a late one refused alone, its offsets aborted), timeouts,
the last stable offset (never decreasing), topic deletion, expiry, and the upgrade from schema 11."""

from __future__ import annotations

import itertools
import json
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, update

from logcompact.catalog import Catalog, NewFile, groups, schema
from logcompact.catalog.catalog import Appended
from logcompact.catalog.groups import CommittedOffset, GroupRow, StoredMember
from logcompact.catalog.model import CatalogUpgrade
from logcompact.catalog.producers import PlacedBatch, SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS, TxnError, TxnRefusal
from logcompact.consume import read_records
from logcompact.exceptions import CatalogSchemaError, InvalidRecordError
from logcompact.format.layout import SectionInfo
from logcompact.ingest import Agent, Record
from logcompact.jobs import prepare_plans, run_here
from logcompact.planner import PlannerConfig
from tests.helpers import NOW, create_topic

TIMEOUT = 60_000
_keys = itertools.count()


class Producer:
    """A producer's side of the sequences: what each next batch follows, as the agent's view says."""

    def __init__(self, catalog: Catalog, transactional_id: str | None) -> None:
        self.catalog = catalog
        self.transactional_id = transactional_id
        self.producer_id, self.epoch = (
            catalog.init_producer(transactional_id, TIMEOUT, MAX_TIMEOUT_MS, None, NOW) if transactional_id
            else (catalog.allocate_producer_id(NOW), 0)
        )
        self.last: dict[tuple[str, int], tuple[int, int]] = {}

    def batch(self, topic: str, partition: int, count: int) -> SequencedBatch:
        follows = self.last.get((topic, partition))
        first = 0 if follows is None or follows[0] != self.epoch else follows[1] + 1
        self.last[(topic, partition)] = (self.epoch, first + count - 1)
        return SequencedBatch(self.producer_id, self.epoch, first, first + count - 1, follows, self.transactional_id is not None)

    def add(self, *partitions: tuple[str, int]) -> None:
        assert self.transactional_id is not None
        self.catalog.add_to_transaction(self.transactional_id, self.producer_id, self.epoch, partitions, NOW)

    def end(self, commit: bool):
        assert self.transactional_id is not None
        return self.catalog.end_transaction(self.transactional_id, self.producer_id, self.epoch, commit, NOW)


def append(catalog: Catalog, *batches: tuple[str, int, int, SequencedBatch | None]) -> Appended:
    """One L0 file of `batches`, (topic, partition, records, sequenced batch or None), appended."""
    counts: dict[tuple[str, int], int] = defaultdict(int)
    placed = []
    for topic, partition, count, sequenced in batches:
        if sequenced is not None:
            placed.append(PlacedBatch(topic, partition, counts[(topic, partition)], sequenced))
        counts[(topic, partition)] += count
    infos = tuple(
        SectionInfo(topic, partition, count, count - 1, 0, 0, 0, 0, "none", 0, 16 + 100 * n, 1)
        for n, ((topic, partition), count) in enumerate(sorted(counts.items()))
    )
    return catalog.append_files([NewFile(f"data/l0/{next(_keys)}.seg", 0, 100, NOW, infos)], NOW, [placed])


def aborted(catalog: Catalog) -> list[tuple[int, int, int, int, int]]:
    a = schema.aborted_ranges.c
    with catalog.engine.connect() as connection:
        return [tuple(row) for row in connection.execute(
            select(a.topic_id, a.partition, a.first_offset, a.last_offset, a.producer_id).order_by(a.topic_id, a.partition, a.first_offset)
        )]


def stable(catalog: Catalog, topic: str) -> list[int]:
    return [offsets.last_stable for offsets in catalog.log_offsets(topic)]


def refused_with(error: TxnError):
    return pytest.raises(TxnRefusal, match=f"^{error.name}: ")


# -- InitProducerId ---------------------------------------------------------------------------------------------


def test_init_producer_hands_out_an_id_then_bumps_its_epoch_as_kafka(catalog: Catalog) -> None:
    catalog.ensure_created(NOW)
    pid, epoch = catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    assert epoch == 0
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, None, NOW) == (pid, 1)  # a new producer: bumped
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 1), NOW) == (pid, 2)  # KIP-360: bumped
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 1), NOW) == (pid, 2)  # its retry: not again
    with refused_with(TxnError.PRODUCER_FENCED):
        catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 0), NOW)
    with refused_with(TxnError.PRODUCER_FENCED):
        catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid + 100, 2), NOW)
    for timeout in (0, MAX_TIMEOUT_MS + 1):
        with refused_with(TxnError.INVALID_TRANSACTION_TIMEOUT):
            catalog.init_producer("app", timeout, MAX_TIMEOUT_MS, None, NOW)
    other, _ = catalog.init_producer("other", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    assert other != pid
    with catalog.engine.connect() as connection:  # producer-id expiry skips rows holding a transactional id
        p = schema.producers.c
        assert dict(connection.execute(select(p.producer_id, p.transactional_id).where(p.producer_id.in_([pid, other]))).all()) == {pid: "app", other: "other"}


def test_an_exhausted_epoch_moves_the_transactional_id_to_a_new_producer_id(catalog: Catalog) -> None:
    catalog.ensure_created(NOW)
    pid, _ = catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.transactions).values(epoch=32765))
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 32765), NOW) == (pid, 32766)
    moved, epoch = catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 32766), NOW)
    assert moved != pid and epoch == 0
    # The retry of that InitProducerId, naming the old id at its exhausted epoch, is answered the new id again.
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 32766), NOW) == (moved, 0)
    with catalog.engine.connect() as connection:
        p = schema.producers.c
        assert dict(connection.execute(select(p.producer_id, p.transactional_id).where(p.producer_id.in_([pid, moved]))).all()) == {pid: None, moved: "app"}


def test_a_producer_naming_its_epoch_aborts_its_open_transaction_and_its_retry_gets_the_same_epoch(catalog: Catalog) -> None:
    """KIP-360: InitProducerId naming the current producer id and epoch aborts the open transaction and bumps the epoch
    once; its retry (the answer lost) is answered the same epoch. A producer naming an older epoch is fenced, and
    the open transaction of the current one stays open."""
    create_topic(catalog, "t", partitions=1)
    txn = Producer(catalog, "app")
    pid = txn.producer_id
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 0), NOW) == (pid, 1)
    txn.epoch = 1
    txn.add(("t", 0))
    append(catalog, ("t", 0, 2, txn.batch("t", 0, 2)))
    with refused_with(TxnError.PRODUCER_FENCED):
        catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 0), NOW)
    assert stable(catalog, "t") == [0] and catalog.next_offsets("t") == [2]  # still open
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 1), NOW) == (pid, 2)
    assert stable(catalog, "t") == [3] and len(aborted(catalog)) == 1
    assert catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, (pid, 1), NOW) == (pid, 2)  # the retry
    with pytest.raises(InvalidRecordError, match="^topic 't' has partitions 0 to 0, not 1$"):
        catalog.add_to_transaction("app", pid, 2, [("t", 1)], NOW)


# -- a transaction's life ---------------------------------------------------------------------------------------


def test_a_commit_gives_each_added_partition_a_marker_and_commits_the_pending_offsets(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=3)
    topic_id = catalog.snapshot().topic_ids["t"]
    txn, plain = Producer(catalog, "app"), Producer(catalog, None)
    txn.add(("t", 0), ("t", 1))
    catalog.add_group_to_transaction("app", txn.producer_id, txn.epoch, "g", NOW)
    catalog.commit_offsets_in_transaction("app", txn.producer_id, txn.epoch, "g", {("in", 1): CommittedOffset(7, 2, "m", NOW), ("in", 0): CommittedOffset(5, 2, "", NOW)})
    assert catalog.fetch_offsets("g", None, [("in", 0), ("in", 1), ("in", 2)]) == ({}, {("in", 0), ("in", 1)})
    assert catalog.committed_offsets("g") == {}
    append(catalog, ("t", 0, 2, plain.batch("t", 0, 2)), ("t", 2, 1, None))
    appended = append(catalog, ("t", 0, 3, txn.batch("t", 0, 3)), ("t", 2, 1, None))
    assert appended.refused == {} and appended.assigned == [[2, 1]]
    assert stable(catalog, "t") == [2, 0, 2]  # t/0 held at the transaction's first offset; t/1 has no data yet
    append(catalog, ("t", 0, 1, plain.batch("t", 0, 1)))
    assert stable(catalog, "t") == [2, 0, 2] and catalog.next_offsets("t") == [6, 0, 2]

    ended = txn.end(commit=True)
    assert ended.state == "CompleteCommit" and ended.markers == {(topic_id, 0): 6, (topic_id, 1): 0} and ended.aborted == 0
    assert catalog.next_offsets("t") == [7, 1, 2] and stable(catalog, "t") == [7, 1, 2]
    assert catalog.committed_offsets("g") == {("in", 0): CommittedOffset(5, 2, "", NOW), ("in", 1): CommittedOffset(7, 2, "m", NOW)}
    assert catalog.fetch_offsets("g", ["in"], [("in", 0)])[1] == set() and aborted(catalog) == []
    # A retried EndTxn of the same outcome is answered as it was, with no marker; the other outcome is refused.
    assert txn.end(commit=True) == (ended.state, {}, 0) and catalog.next_offsets("t") == [7, 1, 2]
    with refused_with(TxnError.INVALID_TXN_STATE):
        txn.end(commit=False)


def test_offsets_fetched_stable_see_one_state_though_a_transaction_commits_between_the_reads(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Read apart, a commit between the committed offsets' read and the pending ones' would show the offset the
    transaction replaced as stable, and a read_committed consumer would start there."""
    create_topic(catalog, "in")
    txn = Producer(catalog, "app")
    catalog.commit_offsets("g", {("in", 0): CommittedOffset(2, 0, "", NOW)})
    catalog.add_group_to_transaction("app", txn.producer_id, txn.epoch, "g", NOW)
    catalog.commit_offsets_in_transaction("app", txn.producer_id, txn.epoch, "g", {("in", 0): CommittedOffset(5, 0, "", NOW)})
    read_committed = groups.committed_offsets

    def committed_then_the_transaction_ends(connection, group_id, topics):
        committed = read_committed(connection, group_id, topics)
        txn.end(commit=True)
        return committed

    monkeypatch.setattr(groups, "committed_offsets", committed_then_the_transaction_ends)
    assert catalog.fetch_offsets("g", ["in"], [("in", 0)]) == ({("in", 0): CommittedOffset(2, 0, "", NOW)}, {("in", 0)})
    monkeypatch.undo()
    assert catalog.fetch_offsets("g", ["in"], [("in", 0)]) == ({("in", 0): CommittedOffset(5, 0, "", NOW)}, set())


def test_an_abort_records_its_batches_ranges_as_aborted_and_drops_its_offsets(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2)
    topic_id = catalog.snapshot().topic_ids["t"]
    txn, plain = Producer(catalog, "app"), Producer(catalog, None)
    txn.add(("t", 0), ("t", 1))
    catalog.add_group_to_transaction("app", txn.producer_id, txn.epoch, "g", NOW)
    catalog.commit_offsets_in_transaction("app", txn.producer_id, txn.epoch, "g", {("in", 0): CommittedOffset(5, 0, "", NOW)})
    append(catalog, ("t", 0, 2, txn.batch("t", 0, 2)))  # 0-1
    append(catalog, ("t", 0, 3, txn.batch("t", 0, 3)))  # 2-4: contiguous, merged
    append(catalog, ("t", 0, 1, plain.batch("t", 0, 1)), ("t", 1, 2, txn.batch("t", 1, 2)))  # 5 plain; t/1 0-1
    append(catalog, ("t", 0, 2, txn.batch("t", 0, 2)))  # 6-7
    assert stable(catalog, "t") == [0, 0]
    ended = txn.end(commit=False)
    assert ended.state == "CompleteAbort" and ended.markers == {(topic_id, 0): 8, (topic_id, 1): 2} and ended.aborted == 3
    pid = txn.producer_id
    assert aborted(catalog) == [(topic_id, 0, 0, 4, pid), (topic_id, 0, 6, 7, pid), (topic_id, 1, 0, 1, pid)]
    assert stable(catalog, "t") == [9, 3] == catalog.next_offsets("t")
    assert catalog.committed_offsets("g") == {} and catalog.fetch_offsets("g", ["in"], [("in", 0)])[1] == set()
    assert catalog.aborted_ranges({("t", 0): (5, 7), ("t", 1): (2, 3)}) == {("t", 0): [(6, 7)]}
    assert catalog.aborted_ranges({("t", 0): (0, 100)}) == {("t", 0): [(0, 4), (6, 7)]}
    assert catalog.aborted_ranges({("t", 0): (0, 100)}, version=catalog.latest_version() - 1) == {}  # recorded by EndTxn's version


def test_requests_of_another_producer_id_or_epoch_are_refused_as_kafka(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=1)
    txn = Producer(catalog, "app")
    pid = txn.producer_id
    with refused_with(TxnError.INVALID_PRODUCER_ID_MAPPING):
        catalog.add_to_transaction("nobody", pid, 0, [("t", 0)], NOW)
    with refused_with(TxnError.INVALID_PRODUCER_ID_MAPPING):
        catalog.add_to_transaction("app", pid + 1, 0, [("t", 0)], NOW)
    with refused_with(TxnError.PRODUCER_FENCED):
        catalog.add_to_transaction("app", pid, 1, [("t", 0)], NOW)
    with refused_with(TxnError.INVALID_TXN_STATE):  # Empty: nothing to end
        txn.end(commit=True)
    txn.add(("t", 0))
    with refused_with(TxnError.INVALID_TXN_STATE):  # the group was not added
        catalog.commit_offsets_in_transaction("app", pid, 0, "g", {("t", 0): CommittedOffset(1, 0, "", NOW)})
    with refused_with(TxnError.PRODUCER_FENCED):
        catalog.end_transaction("app", pid, 1, True, NOW)
    with refused_with(TxnError.INVALID_PRODUCER_ID_MAPPING):
        catalog.end_transaction("app", pid + 1, 0, True, NOW)
    assert catalog.next_offsets("t") == [0]  # nothing refused gave out a marker
    view = catalog.transaction_view(pid)
    assert view is not None and (view.producer_id, view.epoch, view.state) == (pid, 0, "Ongoing")
    assert view.partitions == {(catalog.snapshot().topic_ids["t"], 0)}
    assert catalog.transaction_view(pid + 1) is None
    # The admin's abort (WriteTxnMarkers) may name a newer epoch than the producer's: accepted when not from a client.
    assert catalog.end_transaction("app", pid, 5, False, NOW, from_client=False).state == "CompleteAbort"


def test_a_new_producer_fences_the_open_transaction_and_a_late_batch_is_refused_alone(catalog: Catalog) -> None:
    """InitProducerId of the same transactional id aborts the open transaction (a marker, its range aborted, the
    LSO freed) and bumps the epoch. The zombie's next batch, in a file with another producer's, is refused alone:
    its offsets are an aborted range, the other batch is committed, and a retry of it is refused again."""
    create_topic(catalog, "t", partitions=2)
    topic_id = catalog.snapshot().topic_ids["t"]
    zombie, plain = Producer(catalog, "app"), Producer(catalog, None)
    zombie.add(("t", 0))
    append(catalog, ("t", 0, 2, zombie.batch("t", 0, 2)))
    assert stable(catalog, "t") == [0, 0]
    pid, epoch = catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    assert (pid, epoch) == (zombie.producer_id, 1)
    assert catalog.next_offsets("t") == [3, 0] and stable(catalog, "t") == [3, 0]  # the marker at 2
    assert aborted(catalog) == [(topic_id, 0, 0, 1, pid)]
    with refused_with(TxnError.PRODUCER_FENCED):
        zombie.end(commit=True)

    late = zombie.batch("t", 0, 3)
    appended = append(catalog, ("t", 0, 1, plain.batch("t", 0, 1)), ("t", 0, 3, late), ("t", 1, 1, None))
    assert appended.assigned == [[3, 0]] and appended.refused == {(0, 1): TxnError.INVALID_PRODUCER_EPOCH}
    assert aborted(catalog) == [(topic_id, 0, 0, 1, pid), (topic_id, 0, 4, 6, pid)]
    assert catalog.next_offsets("t") == [7, 1] and stable(catalog, "t") == [7, 1]
    state = catalog.producer_state(pid, "t", 0)
    assert state is not None and state.batches[-1] == (2, 4, 4, "INVALID_PRODUCER_EPOCH")  # kept in its chain, refused
    with catalog.engine.connect() as connection:  # stored as a 4th element only when refused
        stored = connection.execute(select(schema.producer_batches.c.batches).where(schema.producer_batches.c.producer_id == pid)).scalar_one()
    assert json.loads(stored) == [[0, 1, 0], [2, 4, 4, "INVALID_PRODUCER_EPOCH"]]
    # The new producer's transaction at the new epoch goes on.
    successor = Producer.__new__(Producer)
    successor.catalog, successor.transactional_id, successor.producer_id, successor.epoch, successor.last = catalog, "app", pid, epoch, {}
    successor.add(("t", 1))
    assert append(catalog, ("t", 1, 1, successor.batch("t", 1, 1))).refused == {}
    assert stable(catalog, "t") == [7, 1] and successor.end(commit=True).markers == {(topic_id, 1): 2}


def test_a_batch_after_its_transaction_committed_or_of_a_partition_not_added_is_refused(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2)
    topic_id = catalog.snapshot().topic_ids["t"]
    txn = Producer(catalog, "app")
    txn.add(("t", 0))
    assert append(catalog, ("t", 1, 2, txn.batch("t", 1, 2))).refused == {(0, 0): TxnError.INVALID_TXN_STATE}
    assert append(catalog, ("t", 0, 1, txn.batch("t", 0, 1))).refused == {}
    txn.end(commit=True)
    assert append(catalog, ("t", 0, 1, txn.batch("t", 0, 1))).refused == {(0, 0): TxnError.INVALID_TXN_STATE}
    assert aborted(catalog) == [(topic_id, 0, 2, 2, txn.producer_id), (topic_id, 1, 0, 1, txn.producer_id)]


def test_a_timed_out_transaction_is_aborted_once_by_compare_and_set(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=1)
    txn = Producer(catalog, "app")
    txn.add(("t", 0))
    append(catalog, ("t", 0, 2, txn.batch("t", 0, 2)))
    assert catalog.timed_out_transactions(NOW + TIMEOUT) == []
    (row,) = catalog.timed_out_transactions(NOW + TIMEOUT + 1)
    assert (row.transactional_id, row.state, row.start_ms, row.timeout_ms) == ("app", "Ongoing", NOW, TIMEOUT)
    ended = catalog.abort_transaction(row, NOW + TIMEOUT + 1, bump_epoch=True)
    assert ended is not None and ended.state == "CompleteAbort" and ended.aborted == 1
    assert catalog.abort_transaction(row, NOW + TIMEOUT + 2, bump_epoch=True) is None  # another agent's sweep: nothing
    assert catalog.next_offsets("t") == [3] and stable(catalog, "t") == [3]
    assert catalog.timed_out_transactions(NOW + 10 * TIMEOUT) == []
    with refused_with(TxnError.PRODUCER_FENCED):  # the epoch was bumped: the producer is fenced
        txn.end(commit=True)
    view = catalog.transaction_view(txn.producer_id)
    assert view is not None and view.epoch == 1 and view.state == "CompleteAbort" and view.partitions == frozenset()


def test_deleting_a_topic_leaves_the_transaction_committable_and_no_lso_held(catalog: Catalog) -> None:
    create_topic(catalog, "gone", partitions=1)
    create_topic(catalog, "kept", partitions=1)
    kept_id = catalog.snapshot().topic_ids["kept"]
    txn = Producer(catalog, "app")
    txn.add(("gone", 0), ("kept", 0))
    catalog.add_group_to_transaction("app", txn.producer_id, txn.epoch, "g", NOW)
    catalog.commit_offsets_in_transaction("app", txn.producer_id, txn.epoch, "g", {("gone", 0): CommittedOffset(1, 0, "", NOW), ("kept", 0): CommittedOffset(2, 0, "", NOW)})
    append(catalog, ("gone", 0, 2, txn.batch("gone", 0, 2)), ("kept", 0, 1, txn.batch("kept", 0, 1)))
    catalog.delete_topic("gone", NOW)
    assert stable(catalog, "kept") == [0]
    ended = txn.end(commit=True)
    assert ended.markers == {(kept_id, 0): 1} and stable(catalog, "kept") == [2]
    assert catalog.committed_offsets("g") == {("kept", 0): CommittedOffset(2, 0, "", NOW)}


def test_tooling_reads_and_expiry(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=1)
    txn, idle = Producer(catalog, "app"), Producer(catalog, "idle")
    txn.add(("t", 0))
    append(catalog, ("t", 0, 2, txn.batch("t", 0, 2)))
    assert [row.transactional_id for row in catalog.transactions()] == ["app", "idle"]
    assert [row.transactional_id for row in catalog.transactions(states={"Ongoing"})] == ["app"]
    assert [row.transactional_id for row in catalog.transactions(producer_ids={idle.producer_id})] == ["idle"]
    assert [row.transactional_id for row in catalog.transactions(min_duration_ms=1_000, now_ms=NOW + 1_000)] == ["app"]
    assert catalog.transactions(min_duration_ms=1_000, now_ms=NOW + 999) == []
    described = catalog.describe_transactions(["app", "nobody"])
    assert list(described) == ["app"] and described["app"][1] == (("t", 0),)
    (active,) = catalog.active_producers([("t", 0)])[("t", 0)]
    assert (active.producer_id, active.epoch, active.last_sequence, active.current_txn_start_offset) == (txn.producer_id, 0, 1, 0)
    # Expiry forgets ids with no open transaction, idle since the bound, and frees their producer ids.
    assert catalog.expire_transactional_ids(NOW + 1) == 1
    assert [row.transactional_id for row in catalog.transactions()] == ["app"]
    with catalog.engine.connect() as connection:
        p = schema.producers.c
        assert connection.execute(select(p.transactional_id).where(p.producer_id == idle.producer_id)).scalar_one() is None


def test_aborted_ranges_are_forgotten_once_no_file_may_hold_their_records_unfiltered(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=1)
    txn = Producer(catalog, "app")
    txn.add(("t", 0))
    append(catalog, ("t", 0, 2, txn.batch("t", 0, 2)))
    txn.end(commit=False)
    assert catalog.forget_aborted_ranges() == 0 and len(aborted(catalog)) == 1  # its L0 file still holds them
    with catalog.engine.begin() as connection:  # as a compaction output filtered at the range's version would be
        connection.execute(update(schema.files).values(filtered_version=catalog.latest_version()))
    assert catalog.forget_aborted_ranges() == 1 and aborted(catalog) == []


# -- the last stable offset -----------------------------------------------------------------------------------------

PRODUCERS, SLOTS = 2, [("t", 0), ("t", 1)]
_operation = st.one_of(
    st.tuples(st.just("add"), st.integers(0, PRODUCERS - 1), st.integers(0, 1)),
    st.tuples(st.just("data"), st.integers(0, PRODUCERS - 1), st.integers(0, 1)),
    st.tuples(st.just("plain"), st.integers(0, 1), st.integers(1, 3)),
    st.tuples(st.just("end"), st.integers(0, PRODUCERS - 1), st.booleans()),
    st.tuples(st.just("timeout"), st.integers(0, PRODUCERS - 1), st.none()),
    st.tuples(st.just("fence"), st.integers(0, PRODUCERS - 1), st.none()),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=st.lists(_operation, min_size=1, max_size=25))
@example(operations=[
    ("plain", 0, 2), ("add", 0, 0), ("add", 0, 1), ("data", 0, 1), ("add", 1, 0), ("data", 1, 0), ("data", 0, 0),
    ("plain", 1, 1), ("end", 0, True), ("data", 1, 1), ("add", 0, 1), ("data", 0, 1), ("timeout", 1, None),
    ("plain", 0, 1), ("add", 1, 1), ("data", 1, 1), ("fence", 0, None), ("end", 1, False),
])
def test_the_lso_never_decreases_and_is_the_first_open_offset(catalog: Catalog, operations: list[tuple]) -> None:
    """Interleaved transactional and plain appends, commits, aborts, timeouts and fencing by a new producer: after
    each, every partition's LSO is the first offset of its earliest open transaction's data, else its high watermark,
    and never lower than it was."""
    catalog.ensure_created(NOW)
    run = next(_keys)
    topic = f"t{run}"
    create_topic(catalog, topic, partitions=2)
    txns = [Producer(catalog, f"app-{run}-{n}") for n in range(PRODUCERS)]
    plain = Producer(catalog, None)
    added: list[set[int]] = [set() for _ in txns]
    firsts: list[dict[int, int]] = [{} for _ in txns]  # each open transaction's first offset by partition
    before = stable(catalog, topic)
    for kind, who, what in operations:
        if kind == "add":
            txns[who].add((topic, what))
            added[who].add(what)
        elif kind == "data":
            appended = append(catalog, (topic, what, 2, txns[who].batch(topic, what, 2)))
            if what in added[who]:
                assert appended.refused == {}
                firsts[who].setdefault(what, appended.assigned[0][0])
            else:
                assert appended.refused == {(0, 0): TxnError.INVALID_TXN_STATE}
        elif kind == "plain":
            append(catalog, (topic, who, what, plain.batch(topic, who, what)))
        elif kind in ("timeout", "fence") or added[who]:
            if kind == "end":
                txns[who].end(commit=what)
            elif kind == "timeout":
                row = {r.transactional_id: r for r in catalog.transactions()}[txns[who].transactional_id]
                catalog.abort_transaction(row, NOW, bump_epoch=True)
            if kind != "end":  # a new producer of the id fences the open transaction; one timed out starts again so
                txns[who].producer_id, txns[who].epoch = catalog.init_producer(txns[who].transactional_id, TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
            added[who], firsts[who] = set(), {}
        ends = catalog.next_offsets(topic)
        expected = [min([f[p] for f in firsts if p in f] + [ends[p]]) for p in range(2)]
        now = stable(catalog, topic)
        assert now == expected, (kind, who, what)
        assert all(a >= b for a, b in zip(now, before)), (kind, who, what, before, now)
        before = now


# -- schema 11 to 12 -------------------------------------------------------------------------------------------------


def test_a_schema_11_catalog_upgrades_to_the_transactions_tables_and_keeps_what_it_held(catalog: Catalog) -> None:
    """The upgrade from 11 adds the transactions' tables and files.filtered_version, and runs none of the steps to 11
    again: a group row keeps its members (the step from 10 empties them), partitions their newest file."""
    create_topic(catalog, "t", partitions=1)
    member = StoredMember("m-1", None, "client", 10_000, 30_000, (("range", b"\x00\x01"),), b"\x00\x02")
    group = GroupRow("g", 1, 7, "consumer", "range", "Stable", "m-1", (member,), NOW)
    catalog.save_group(group)
    append(catalog, ("t", 0, 3, None))
    with catalog.engine.connect() as connection:
        newest = connection.execute(select(schema.partitions.c.newest_file)).scalar_one()
    assert newest > 0
    with catalog.engine.begin() as connection:
        for table in reversed((*schema.TRANSACTION_TABLES, *schema.SECURITY_TABLES)):  # none of them was in schema 11
            table.drop(connection)
        connection.exec_driver_sql("ALTER TABLE files DROP COLUMN filtered_version")
        connection.exec_driver_sql("ALTER TABLE sections DROP COLUMN produced_compression")
        connection.exec_driver_sql("DROP INDEX sections_retired")
        connection.exec_driver_sql("ALTER TABLE files DROP COLUMN sections_packed")
        schema.offset_holes.drop(connection)
        connection.execute(update(schema.catalog_info).values(schema_version=11))
    with pytest.raises(CatalogSchemaError, match=f"has schema version 11, this logcompact uses {schema.SCHEMA_VERSION}: .*upgrade-catalog"):
        Catalog(catalog.store, catalog.url).snapshot()
    assert Catalog(catalog.store, catalog.url).upgrade_catalog() == CatalogUpgrade(11, 0)
    reopened = Catalog(catalog.store, catalog.url)
    assert reopened.group("g") == group
    with reopened.engine.connect() as connection:
        assert connection.execute(select(schema.partitions.c.newest_file)).scalar_one() == newest
        assert connection.execute(select(schema.files.c.filtered_version)).scalar_one() is None
    # Transactions work on the upgraded catalog.
    txn = Producer(reopened, "app")
    txn.add(("t", 0))
    append(reopened, ("t", 0, 2, txn.batch("t", 0, 2)))
    assert stable(reopened, "t") == [3] and txn.end(commit=False).aborted == 1 and stable(reopened, "t") == [6]


# -- markers as holes -------------------------------------------------------------------------------------------------


def test_markers_are_holes_that_readers_and_compaction_of_a_never_compacted_partition_take(catalog: Catalog) -> None:
    """A partition never compacted holds every offset from its log start, or a row hides records, but its markers
    (`offset_holes`). Markers of a commit and an abort among plain records read as holes, and a compaction plans, runs and
    commits over them without setting the partition aside."""
    create_topic(catalog, "t", partitions=1, cleanup_policy="compact")
    pid, epoch = catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    agent = Agent(catalog, background=False)
    sequence = 0

    def produce(key: bytes, transactional: bool) -> None:
        nonlocal sequence
        sequenced = None
        if transactional:
            sequenced = SequencedBatch(pid, epoch, sequence, sequence, None if sequence == 0 else (epoch, sequence - 1), True)
            sequence += 1
        future = agent.produce("t", [Record(0, key, key, NOW)], sequenced)
        agent.flush()
        future.result()

    produce(b"a", False)  # 0
    for commit, key in ((True, b"b"), (False, b"c")):  # 1 and its marker 2; 4 and its marker 5
        catalog.add_to_transaction("app", pid, epoch, [("t", 0)], NOW)
        produce(key, True)
        catalog.end_transaction("app", pid, epoch, commit, NOW)
        produce(key + b"-plain", False)  # 3; 6
    agent.close()
    with catalog.engine.connect() as connection:
        holes = schema.offset_holes.c
        assert connection.execute(select(holes.first_offset, holes.last_offset).order_by(holes.first_offset)).all() == [(2, 2), (5, 5)]
    offsets = [(r.offset, r.key) for r in read_records(catalog.store, catalog.snapshot(), "t", 0)]
    assert offsets == [(0, b"a"), (1, b"b"), (3, b"b-plain"), (4, b"c"), (6, b"c-plain")]
    prepared = prepare_plans(catalog, "regular", NOW, PlannerConfig(min_files=(4, 4, 4, 4)))
    assert prepared.plan_ids
    summary = run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    assert summary.committed == prepared.plan_ids and summary.uncleanable == [] and catalog.uncleanable() == []
    assert {f.level for f in catalog.snapshot().files()} == {1}
    # The copy dropped the aborted record; the rest kept their offsets.
    assert [(r.offset, r.key) for r in read_records(catalog.store, catalog.snapshot(), "t", 0)] == [o for o in offsets if o[0] != 4]
    # The aborted range stays while a file the catalog keeps may hold its record unfiltered: the removed L0 file until
    # gc forgets it, and an output not filtered of it (as if its plan predated the range).
    assert catalog.forget_aborted_ranges() == 0 and catalog.aborted_ranges({("t", 0): (0, 7)}) == {("t", 0): [(4, 4)]}
    with catalog.engine.begin() as connection:
        filtered = connection.execute(select(schema.files.c.filtered_version).where(schema.files.c.level == 1)).scalar_one()
        connection.execute(update(schema.files).where(schema.files.c.level == 1).values(filtered_version=None))
        removed = connection.execute(select(schema.files.c.key).where(schema.files.c.level == 0)).scalars().all()
    assert catalog.forget_files(removed) == 0
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.files).where(schema.files.c.level == 1).values(filtered_version=filtered))
    assert catalog.forget_aborted_ranges() == 1 and catalog.aborted_ranges({("t", 0): (0, 7)}) == {}
