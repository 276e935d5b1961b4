"""Compaction under Kafka's transactions, on both databases: nothing at or past a partition's last stable offset
(LSO) is cleaned, aborted transactions' records are removed (before pass 1, so an aborted value never removes a
committed one), markers stay holes, and aborted ranges are forgotten by gc once no file holds their records
unfiltered. Scenarios after Kafka's LogCleanerTest ones that apply to a log whose markers are holes."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from sqlalchemy import select

from logcompact.catalog import Catalog, schema
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS
from logcompact.consume import latest_values, read_records
from logcompact.exceptions import InvalidPlanError
from logcompact.format.layout import FIXED_ROW_BYTES
from logcompact.ingest import Agent, Record
from logcompact.jobs import prepare_plans, run_and_commit, run_here
from logcompact.jobs.commit import CommitSummary
from logcompact.jobs.gc import collect_garbage
from logcompact.kafka.producer_state import ProducerStateError, ProducerStateManager
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import Plan, decode_group, encode_groups, encode_header, plan_from_json, plan_to_json
from tests.helpers import NOW, create_topic, full_sweep

TIMEOUT = 60_000
HOUR = 60 * 60 * 1000


class TxnLog:
    """Partition 0 of topic `t`, compacted, written one L0 file per produce: plain records, and transactional ones
    through the catalog's coordinator methods, as the agent's coordinator calls them."""

    def __init__(self, catalog: Catalog, **settings: str) -> None:
        self.catalog = catalog
        create_topic(catalog, "t", partitions=1, cleanup_policy="compact", **settings)
        self.agent = Agent(catalog, background=False)
        self.producers: dict[str, list[int]] = {}  # transactional id: producer id, epoch, next sequence
        self.timestamp = NOW  # of the records produced next

    def close(self) -> None:
        self.agent.close()

    def plain(self, *records: tuple[bytes, bytes | None]) -> list[int]:
        return self._produce(records, None)

    def txn(self, transactional_id: str, *records: tuple[bytes, bytes | None]) -> list[int]:
        """Records of `transactional_id`'s transaction (begun by its first batch), in one batch."""
        if transactional_id not in self.producers:
            self.producers[transactional_id] = [*self.catalog.init_producer(transactional_id, TIMEOUT, MAX_TIMEOUT_MS, None, NOW), 0]
        pid, epoch, sequence = self.producers[transactional_id]
        self.catalog.add_to_transaction(transactional_id, pid, epoch, [("t", 0)], NOW)
        last = sequence + len(records) - 1
        self.producers[transactional_id][2] = last + 1
        return self._produce(records, SequencedBatch(pid, epoch, sequence, last, None if sequence == 0 else (epoch, sequence - 1), True))

    def end(self, transactional_id: str, commit: bool) -> None:
        pid, epoch, _ = self.producers[transactional_id]
        self.catalog.end_transaction(transactional_id, pid, epoch, commit, NOW)

    def _produce(self, records: tuple[tuple[bytes, bytes | None], ...], sequenced: SequencedBatch | None) -> list[int]:
        future = self.agent.produce("t", [Record(0, key, value, self.timestamp) for key, value in records], sequenced)
        self.agent.flush()
        return future.result()

    def compact(self, mode: str = "full", **config: int) -> CommitSummary:
        """One run of `mode` planned (planner knobs as keyword arguments), run and committed; its summary."""
        prepared = prepare_plans(self.catalog, mode, NOW, PlannerConfig(**config))
        assert prepared.plan_ids
        summary = run_here(self.catalog, prepared.plan_ids, prepared.groups, NOW)
        assert summary.committed == prepared.plan_ids and summary.uncleanable == []
        return summary

    def read(self) -> list[tuple[int, bytes | None, bytes | None]]:
        return [(r.offset, r.key, r.value) for r in read_records(self.catalog.store, self.catalog.snapshot(), "t", 0)]

    def lso(self) -> int:
        return self.catalog.log_offsets("t")[0].last_stable


def test_undecided_transactional_data_not_cleaned(catalog: Catalog) -> None:
    """Kafka's testUndecidedTransactionalDataNotCleaned: an open transaction holds every compaction at its first offset
    (the LSO): a later plain value of a key does not remove an earlier one at or past it, nor one below it, until the
    transaction ends. Then it does."""
    log = TxnLog(catalog)
    log.plain((b"a", b"a0"), (b"b", b"b0"))  # 0, 1
    assert log.txn("app", (b"c", b"c-txn")) == [2]
    log.plain((b"a", b"a1"), (b"c", b"c1"), (b"b", b"b1"))  # 3, 4, 5
    assert log.lso() == 2
    log.compact()
    # Below the LSO nothing has a newer value below it: every record of the partition stays.
    assert [offset for offset, _, _ in log.read()] == [0, 1, 2, 3, 4, 5]
    log.end("app", commit=True)  # the marker takes offset 6
    assert log.lso() == 7
    log.compact()
    assert log.read() == [(3, b"a", b"a1"), (4, b"c", b"c1"), (5, b"b", b"b1")]
    log.close()


def test_a_partition_held_at_its_lso_is_not_taken_for_its_dirty_ratio_pass_after_pass(catalog: Catalog) -> None:
    """The dirty ratio weighs a partition's cleaning range up to its LSO, as Kafka's cleanableOffsets bounds it: the
    bytes past an open transaction's first offset are not cleanable, so they do not make the partition due again."""
    log = TxnLog(catalog, min_cleanable_dirty_ratio="0.01")
    log.plain((b"a", b"a0"), (b"b", b"b0"))  # 0, 1
    log.txn("app", (b"c", b"c-txn"))  # 2
    log.plain((b"a", b"a1"), (b"b", b"b1"))  # 3, 4
    log.compact()
    assert choose_plans(catalog.planning_snapshot(NOW), NOW, "regular", PlannerConfig()) == []
    log.end("app", commit=True)
    (due,) = choose_plans(catalog.planning_snapshot(NOW), NOW, "regular", PlannerConfig())
    assert due.first_uncleanable == {}
    log.close()


def test_a_partition_held_at_its_lso_is_not_taken_for_its_max_lag_pass_after_pass(catalog: Catalog) -> None:
    """Past max.compaction.lag.ms a partition is due, but only for its dirty data below its LSO: once that is clean,
    the sections an open transaction holds wait for it to end, rather than being copied again every pass."""
    log = TxnLog(catalog, max_compaction_lag_ms=str(2 * HOUR))
    log.timestamp = NOW - 3 * HOUR
    log.plain((b"a", b"a0"), (b"b", b"b0"))  # 0, 1
    log.txn("app", (b"c", b"c-txn"))  # 2
    log.plain((b"a", b"a1"), (b"b", b"b1"))  # 3, 4
    log.compact("max-lag")  # the older values stay: their newer ones are past the LSO
    assert [offset for offset, _, _ in log.read()] == [0, 1, 2, 3, 4]
    assert choose_plans(catalog.planning_snapshot(NOW), NOW, "max-lag", PlannerConfig()) == []
    log.end("app", commit=True)
    (due,) = choose_plans(catalog.planning_snapshot(NOW), NOW, "max-lag", PlannerConfig())
    assert due.first_uncleanable == {}
    log.compact("max-lag")
    assert [offset for offset, _, _ in log.read()] == [2, 3, 4]
    log.close()


def test_clean_segments_with_abort(catalog: Catalog) -> None:
    """Kafka's testCleanSegmentsWithAbort and testAbortMarkerRemoval: an aborted transaction's records go at the first
    compaction, counted; the committed ones and the plain ones stay at their offsets; the markers' offsets stay holes
    (no record, as before), and the latest value of each key is the committed one."""
    log = TxnLog(catalog)
    log.plain((b"a", b"a0"))  # 0
    log.txn("app", (b"b", b"b-committed"), (b"c", b"c-committed"))  # 1, 2
    log.end("app", commit=True)  # marker 3
    log.txn("app", (b"a", b"a-aborted"), (b"d", b"d-aborted"))  # 4, 5
    log.end("app", commit=False)  # marker 6
    log.plain((b"e", b"e0"))  # 7
    assert [offset for offset, _, _ in log.read()] == [0, 1, 2, 4, 5, 7]
    (estimate,) = prepare_plans(catalog, "full", NOW, dry_run=True).estimates
    assert estimate["aborted_records"] == 2 and estimate["aborted_bytes"] > 0
    summary = log.compact()
    assert log.read() == [(0, b"a", b"a0"), (1, b"b", b"b-committed"), (2, b"c", b"c-committed"), (7, b"e", b"e0")]
    figures = summary.topic_stats["t"]
    assert (figures["aborted_removed"], figures["records_out"]) == (2, 4)
    assert figures["aborted_bytes_removed"] == 2 * FIXED_ROW_BYTES + len(b"ad") + len(b"a-abortedd-aborted")  # as `record_bytes` sizes them
    assert "aborted" in summary.describe()[1]
    # The aborted records' offsets are holes beside the markers', inside the output's section (its bitmap lists the
    # four offsets it holds); no offset is handed out again, and a later compaction takes the section as it is.
    sections = [(placed.first_offset, placed.last_offset, placed.info.record_count) for _, placed in catalog.snapshot().sections_of("t", 0)]
    assert sections == [(0, 7, 4)] and catalog.log_offsets("t")[0].high_watermark == 8
    log.compact()
    assert [offset for offset, _, _ in log.read()] == [0, 1, 2, 7]
    log.close()


def test_aborted_write_does_not_shadow_the_committed_value_before_it(catalog: Catalog) -> None:
    """An aborted transaction's value of a key, and its tombstone of another, are newer than those keys' committed
    values: were they in the key map, the committed values would go as duplicates, and the keys be lost with the
    aborted records. Both passes skip them, in a full compaction and in the L0-to-L1 copy followed by one."""
    log = TxnLog(catalog)
    log.plain((b"k", b"k0"), (b"t", b"t0"))  # 0, 1
    log.txn("app", (b"k", b"k1"))  # 2
    log.end("app", commit=True)  # marker 3
    log.txn("app", (b"k", b"k-aborted"), (b"t", None))  # 4, 5: a value and a tombstone
    log.end("app", commit=False)  # marker 6
    prepared = prepare_plans(catalog, "regular", NOW, PlannerConfig(min_files=(3, 4, 4, 4)))  # the 3 L0 files to L1
    copied = run_here(catalog, prepared.plan_ids, prepared.groups, NOW)
    assert copied.topic_stats["t"]["aborted_removed"] == 2
    assert {f.level for f in catalog.snapshot().files()} == {1}
    assert log.read() == [(0, b"k", b"k0"), (1, b"t", b"t0"), (2, b"k", b"k1")]
    log.txn("app", (b"t", None), (b"k", b"k-aborted-again"))  # 7, 8
    log.end("app", commit=False)  # marker 9
    log.compact()
    assert log.read() == [(1, b"t", b"t0"), (2, b"k", b"k1")]
    log.close()


def test_the_view_of_latest_values_is_the_committed_one(catalog: Catalog) -> None:
    """`latest_values` reads what a read_committed consumer reads: an aborted value, or one of an open transaction,
    never stands for its key, before or after compaction."""
    log = TxnLog(catalog)

    def view() -> list[tuple[int, bytes, bytes]]:
        table = latest_values(catalog.store, catalog.snapshot(), "t", 0)
        return list(zip(*(table.column(name).to_pylist() for name in ("offset", "key", "value"))))

    log.plain((b"a", b"a0"), (b"b", b"b0"))  # 0, 1
    log.txn("app", (b"a", b"a-aborted"), (b"b", None))  # 2, 3: a value and a tombstone
    log.end("app", commit=False)  # marker 4
    log.txn("open", (b"b", b"b-open"))  # 5
    log.plain((b"c", b"c0"))  # 6: past the LSO
    assert view() == [(0, b"a", b"a0"), (1, b"b", b"b0")]
    log.end("open", commit=True)  # marker 7
    assert view() == [(0, b"a", b"a0"), (5, b"b", b"b-open"), (6, b"c", b"c0")]
    log.compact()
    assert view() == [(0, b"a", b"a0"), (5, b"b", b"b-open"), (6, b"c", b"c0")]
    log.close()


def test_aborted_and_committed_transactions_spanning_segments(catalog: Catalog) -> None:
    """Kafka's testAbortedTransactionSpanningSegments and testCommittedTransactionSpanningSegments: two transactions
    interleaved with each other and with plain records across several L0 files (their ranges not contiguous), one
    aborted, one committed; the L0-to-L1 copy and a later full compaction keep exactly the committed data."""
    log = TxnLog(catalog)
    log.txn("doomed", (b"a", b"a-aborted"))  # 0
    log.txn("kept", (b"b", b"b-committed"))  # 1
    log.plain((b"a", b"a-plain"))  # 2
    log.txn("doomed", (b"b", None), (b"c", b"c-aborted"))  # 3, 4
    log.txn("kept", (b"c", b"c-committed"))  # 5
    log.end("doomed", commit=False)  # marker 6
    assert catalog.aborted_ranges({("t", 0): (0, 7)}) == {("t", 0): [(0, 0), (3, 4)]}
    assert log.lso() == 1
    prepared = prepare_plans(catalog, "regular", NOW, PlannerConfig(min_files=(5, 4, 4, 4)))  # the 5 L0 files to L1
    assert run_here(catalog, prepared.plan_ids, prepared.groups, NOW).topic_stats["t"]["aborted_removed"] == 3
    assert log.read() == [(1, b"b", b"b-committed"), (2, b"a", b"a-plain"), (5, b"c", b"c-committed")]
    log.end("kept", commit=True)  # marker 7
    log.plain((b"b", b"b-plain"))  # 8
    log.compact()
    assert log.read() == [(2, b"a", b"a-plain"), (5, b"c", b"c-committed"), (8, b"b", b"b-plain")]
    log.close()


def test_interleaved_producers_committing_and_aborting(catalog: Catalog) -> None:
    """Kafka's testBasicTransactionAwareCleaning and testCleanWithTransactionsSpanningSegments: two transactional
    producers and a plain one interleaved batch by batch over files, one aborting and one committing, each
    transaction spanning several files; one compaction keeps every key's latest committed or plain value at its
    offset and nothing of the aborted transaction."""
    log = TxnLog(catalog)
    log.txn("doomed", (b"a", b"a-aborted"), (b"b", b"b-aborted"))  # 0, 1
    log.txn("kept", (b"b", b"b-committed"))  # 2
    log.plain((b"a", b"a-plain"), (b"c", b"c-plain"))  # 3, 4
    log.txn("doomed", (b"c", b"c-aborted"))  # 5
    log.txn("kept", (b"a", b"a-committed"), (b"d", None))  # 6, 7: a value and a tombstone
    log.plain((b"d", b"d-plain"))  # 8
    log.end("kept", commit=True)  # marker 9
    log.end("doomed", commit=False)  # marker 10
    summary = log.compact()
    assert summary.topic_stats["t"]["aborted_removed"] == 3
    assert log.read() == [(2, b"b", b"b-committed"), (4, b"c", b"c-plain"), (6, b"a", b"a-committed"), (8, b"d", b"d-plain")]
    log.close()


def test_a_key_map_too_small_for_one_pass_never_lets_an_aborted_value_stand(catalog: Catalog) -> None:
    """Kafka's testMultiPassSegmentCleaningWithAbortedTransactions: with a key map of 8 keys for 20, each compaction
    makes partial progress; the aborted transactions' records go at the first (they never enter the map), every
    compaction keeps each key's latest committed value, and the rounds converge to one record a key."""
    log = TxnLog(catalog)
    keys = [b"k%02d" % k for k in range(20)]
    for round_ in range(3):
        log.plain(*[(key, b"plain-%d" % round_) for key in keys])
        log.txn("app", *[(key, b"aborted-%d" % round_) for key in keys[::2]])
        log.end("app", commit=False)
        log.txn("app", *[(key, b"committed-%d" % round_) for key in keys[1::3]])
        log.end("app", commit=True)
    latest = {key: b"committed-2" if key in keys[1::3] else b"plain-2" for key in keys}
    overflows = []
    while len(log.read()) > len(keys):
        summary = log.compact(buffer_bytes=20 * 9)  # room for 8 keys
        overflows.append(sum(stats["overflows"] for stats in summary.stats.values()))
        assert not [value for _, _, value in log.read() if value.startswith(b"aborted")]
        assert {key: value for _, key, value in log.read()} == latest
        assert len(overflows) <= 10, "no convergence"
    assert overflows[0] > 0
    log.close()


def test_a_retry_is_known_after_compaction_removed_its_records(catalog: Catalog) -> None:
    """Kafka's testDuplicateCheckAfterCleaning: a producer's state is in the catalog, not in the records, so after a
    compaction removed its batches' records (aborted, or superseded) an agent reading that state afresh still knows
    a retry of one of its newest batches (answered with the batch's first offset, nothing written), refuses a
    sequence gap, and writes its next batch after its last."""
    log = TxnLog(catalog)
    log.txn("app", (b"a", b"1"), (b"b", b"2"))  # 0, 1: sequences 0-1
    log.end("app", commit=True)  # marker 2
    log.txn("app", (b"a", b"aborted"))  # 3: sequence 2
    log.end("app", commit=False)  # marker 4
    log.plain((b"b", b"3"))  # 5
    log.compact()
    assert log.read() == [(0, b"a", b"1"), (5, b"b", b"3")]
    producer_id, epoch, _ = log.producers["app"]
    state = ProducerStateManager(catalog)  # a new agent's: read from the catalog

    def written_again(*_: object) -> None:
        raise AssertionError("a retry was written again")

    assert state.append("t", 0, 2, producer_id, epoch, 0, written_again).result() == [0]
    assert state.append("t", 0, 1, producer_id, epoch, 2, written_again).result() == [3]
    with pytest.raises(ProducerStateError, match="sequence 4 where 3 was expected"):
        state.append("t", 0, 1, producer_id, epoch, 4, written_again)
    assert log.txn("app", (b"c", b"4")) == [6]  # sequence 3
    log.end("app", commit=True)  # marker 7
    assert log.read() == [(0, b"a", b"1"), (5, b"b", b"3"), (6, b"c", b"4")]
    log.close()


def test_aborted_ranges_are_forgotten_once_no_kept_file_holds_their_records_unfiltered(catalog: Catalog) -> None:
    """A compaction's outputs are filtered of the ranges aborted by its plan's manifest version
    (`files.filtered_version`); gc forgets a range with the removed files that held it, not before."""
    log = TxnLog(catalog)
    log.txn("app", (b"k", b"aborted"))  # 0
    log.end("app", commit=False)  # marker 1
    log.plain((b"k", b"v"))  # 2
    log.compact()
    with catalog.engine.connect() as connection:
        f = schema.files.c
        rows = connection.execute(select(f.level > 0, f.removed_version.is_(None), f.filtered_version)).all()
    # The full sweep's plan was made at the version before its commit.
    assert sorted(rows) == [(False, False, None), (False, False, None), (True, True, catalog.latest_version() - 1)]
    assert catalog.aborted_ranges({("t", 0): (0, 3)}) == {("t", 0): [(0, 0)]}
    assert catalog.forget_aborted_ranges() == 0  # the removed L0 file still has its row
    report = collect_garbage(Catalog(catalog.store, catalog.url, keep_versions=1), NOW + 60_000, grace_ms=0)
    assert len(report.deleted_files) == 2 and report.forgotten_aborted_ranges == 1
    assert catalog.aborted_ranges({("t", 0): (0, 3)}) == {}
    assert log.read() == [(2, b"k", b"v")]
    log.close()


def test_plans_carry_the_aborted_ranges_over_their_inputs_in_both_forms(catalog: Catalog) -> None:
    """Plan format 4: each partition's aborted ranges overlapping its inputs, in the JSON and the stored (Arrow) forms
    and in each group's piece; ranges out of order are refused with one line."""
    create_topic(catalog, "u", partitions=2, cleanup_policy="compact")
    log = TxnLog(catalog)
    log.txn("app", (b"a", b"1"), (b"b", b"2"))  # 0, 1
    log.end("app", commit=False)  # marker 2
    log.txn("app", (b"c", b"3"))  # 3
    log.end("app", commit=False)  # marker 4
    with Agent(catalog, background=False) as agent:
        agent.produce("u", [Record(1, b"x", b"y", NOW)])
    plan = full_sweep(catalog.snapshot(), NOW, group_bytes=1)
    assert plan.aborted == {("t", 0): ((0, 1), (3, 3))} and len(plan.groups) == 2
    assert json.loads(plan_to_json(plan))["aborted"] == [["t", 0, [[0, 1], [3, 3]]]]
    assert plan_from_json(plan_to_json(plan)) == plan
    _, inputs = encode_header(plan.header())
    pieces = [decode_group(document, inputs, f"group {n}") for n, document in enumerate(encode_groups(plan))]
    assert [piece.aborted for piece in pieces] == [plan.piece(0).aborted, plan.piece(1).aborted]
    assert sorted(tp for piece in pieces for tp in piece.aborted) == [("t", 0)]
    assert Plan.from_pieces(plan.header(), pieces, "stored plan").aborted == plan.aborted
    with pytest.raises(InvalidPlanError, match="the aborted ranges of t/0 are not disjoint"):
        plan_from_json(plan_to_json(replace(plan, aborted={("t", 0): ((3, 3), (0, 1))})))
    log.close()


def test_a_plan_whose_aborted_ranges_are_not_the_catalogs_is_refused(catalog: Catalog) -> None:
    """A plan run from a file is checked against the catalog: a range the catalog does not record would drop committed
    records, one left out would keep aborted ones (and its outputs, marked filtered, would let gc forget it)."""
    log = TxnLog(catalog)
    log.plain((b"k", b"v0"))  # 0
    log.txn("app", (b"k", b"aborted"))  # 1
    log.end("app", commit=False)  # marker 2
    log.plain((b"k", b"v1"))  # 3
    plan = full_sweep(catalog.snapshot(), NOW)
    assert plan.aborted == {("t", 0): ((1, 1),)}
    for forged in ({}, {("t", 0): ((0, 1),)}, {("t", 0): ((1, 1), (3, 3))}):
        with pytest.raises(InvalidPlanError, match=r"the aborted ranges of t/0 are .*, the catalog's \[\(1, 1\)\]: a plan drops"):
            run_and_commit(catalog, replace(plan, aborted=forged), NOW)
    assert [offset for offset, _, _ in log.read()] == [0, 1, 3]
    run_and_commit(catalog, plan, NOW)
    assert log.read() == [(3, b"k", b"v1")]
    log.close()
