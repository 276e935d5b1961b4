"""The engine's rules one by one, its I/O costs, partial progress, commits and gc, on both databases (a local
store's tests on each, the S3 store's on PostgreSQL)."""

from __future__ import annotations

import contextlib
import gc
import itertools
import math
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import replace

import pytest
from pyroaring import BitMap

from logcompact.catalog import Catalog, CatalogSection, DataFile, NewFile
from logcompact.consume import latest_values, read_records
from logcompact.engine import cleaner, copier
from logcompact.engine.cleaner import run_plan
from logcompact.exceptions import CommitConflictError, InvalidPlanError
from logcompact.format import section_table, write_segment
from logcompact.format.layout import record_bytes
from logcompact.format.reader import Footer, read_footer, read_section
from logcompact.ingest import Agent, Record
from logcompact.jobs import collect_garbage, commit_plan, run_and_commit
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import Plan, plan_from_dict, plan_from_json, plan_to_dict, plan_to_json
from logcompact.store import LocalStore, ObjectStore
from logcompact.topics import Topic
from tests.helpers import NOW, create_topic, full_sweep, level_plans, produce_l0_files, recorded_runs

SMALL_BUFFER = 1 << 16


def _setup(catalog: Catalog, partitions: int = 1, **topics: dict) -> Catalog:
    for name, settings in topics.items():
        create_topic(catalog, name, partitions, **settings)
    return catalog


def _produce(catalog: Catalog, topic: str, records: list[Record]) -> list[int]:
    with Agent(catalog, background=False) as agent:
        future = agent.produce(topic, records)
    return future.result()


def _run(catalog: Catalog, plan: Plan):
    result = run_plan(catalog.store, plan)
    commit_plan(catalog, plan, [result], plan.now_ms)
    return result


def _full(catalog: Catalog, now: int = NOW, **options):
    return _run(catalog, full_sweep(catalog.snapshot(), now, buffer_bytes=options.pop("buffer_bytes", SMALL_BUFFER), **options))


def _values(catalog: Catalog, topic: str, partition: int = 0) -> list[tuple[int, bytes | None, bytes | None]]:
    return [(r.offset, r.key, r.value) for r in read_records(catalog.store, catalog.snapshot(), topic, partition)]


def test_l0_to_l1_copies_and_separates_compacted_from_other_topics(store: ObjectStore, catalog_of) -> None:
    catalog = _setup(catalog_of(store), state={"cleanup_policy": "compact"}, events={})
    for _ in range(2):
        _produce(catalog, "state", [Record(0, b"k", b"v", NOW)] * 3)
        _produce(catalog, "events", [Record(0, None, b"e", NOW)] * 2)
    (plan,) = level_plans(catalog.snapshot(), NOW, min_files=4)
    assert (plan.target_level, plan.deduplicate) == (1, False)
    result = _run(catalog, plan)
    l1 = catalog.snapshot().files(level=1)
    assert [{s.topic for s in f.sections} for f in l1] == [{"state"}, {"events"}]
    assert all("-compacted-" in f.key for f in l1[:1]) and "-other-" in l1[1].key
    assert len(_values(catalog, "state")) == 6 and result.stats.duplicates_removed == 0  # copied, not deduplicated


@pytest.mark.parametrize("run_bytes", [copier.COPY_RUN_BYTES, 1_500], ids=["one run", "runs of a partition or two"])
def test_a_copy_by_runs_writes_what_the_cleaner_copies_one_partition_at_a_time(catalog: Catalog, run_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """The L0 -> L1 copy of runs of partitions (`engine.copier`) against the cleaner's copy of one partition at a
    time: the same sections with the same rows in each class of output (compacted, other, young), and the same
    figures, over files mixing a compacted topic with min lag and a `delete` topic whose oldest sections are past
    retention, cut into several files. With small runs, runs share blocks and the partitions of more input than a
    run go to the cleaner."""
    catalog = _setup(catalog, partitions=6, state={"cleanup_policy": "compact", "min_compaction_lag_ms": "60000"}, events={"retention_ms": "3600000"})
    rng = random.Random(7)
    for number in range(5):
        state = [
            Record(rng.randrange(6), b"k%d" % rng.randrange(20), None if rng.random() < 0.1 else b"v%d" % n, NOW - (10**4 if number >= 3 else 10**7),
                   [("h", b"x")] if rng.random() < 0.2 else None)
            for n in range(40)
        ]
        events = [Record(rng.randrange(6), None, b"e%d" % n, NOW - (2 * 3_600_000 if number == 0 else rng.choice([2 * 3_600_000, 1000]))) for n in range(30)]
        with Agent(catalog, background=False) as agent:
            agent.produce("state", state)
            agent.produce("events", events)
    (plan,) = level_plans(catalog.snapshot(), NOW, min_files=5, target_file_bytes=3000)
    assert not plan.deduplicate
    # A young section outside the plan that the inputs straddle, for half the state partitions (the cleaner's `outside_cut`).
    lowest: dict[tuple[str, int], int] = {}
    highest: dict[tuple[str, int], int] = {}
    for data_file in plan.inputs:
        for s in data_file.sections:
            lowest[(s.topic, s.partition)] = min(lowest.get((s.topic, s.partition), 1 << 62), s.first_offset)
            highest[(s.topic, s.partition)] = max(highest.get((s.topic, s.partition), -1), s.last_offset)
    plan = replace(plan, first_uncleanable={("state", p): lowest[("state", p)] + 5 for p in range(0, 6, 2)})
    # Aborted transactions' records here and there, some of them past retention as well (counted as expired by both).
    plan = replace(plan, aborted={tp: tuple((o, o + 1) for o in range(lowest[tp] + 1, highest[tp], 7)) for tp in lowest})

    def written(result) -> tuple[dict, dict]:
        by_content: dict[str, list] = {}
        for data_file in result.outputs:
            content = next(name for name in copier.CONTENTS if f"-{name}-" in data_file.key)
            for s in data_file.sections:
                rows = read_section(catalog.store, data_file.key, s.info).table().to_pylist()
                by_content.setdefault(content, []).append((s.topic, s.partition, s.first_offset, s.info._replace(byte_offset=0, byte_length=0, crc32=0, first_row=0), rows))
            catalog.store.delete(data_file.key)
        figures = {k: v for k, v in result.stats.to_dict().items() if k not in ("seconds", "gets", "puts", "bytes_out", "files_out")}
        return by_content, figures

    with monkeypatch.context() as patched:
        patched.setattr(cleaner, "copy_plan", lambda store, plan, by_partition, sinks, stats, one_by_one: one_by_one(sorted(by_partition)))
        expected = written(run_plan(catalog.store, plan))
    monkeypatch.setattr(copier, "COPY_RUN_BYTES", run_bytes)
    runs = recorded_runs(monkeypatch)
    result = run_plan(catalog.store, plan)
    if run_bytes < copier.COPY_RUN_BYTES:  # runs of several partitions, and partitions the cleaner copies
        assert any(whole and len(partitions) > 1 for partitions, whole in runs) and any(not whole for _, whole in runs)
    assert len(result.outputs) > 3 and {"compacted", "other", "young"} <= set(expected[0])
    assert expected[1]["expired_removed"] > 0 and expected[1]["aborted_removed"] > 0
    got = written(result)
    assert got == expected


def _wide_l0_file(catalog: Catalog, topic: str, deltas: list[int], timestamps: list[int], keys: list[bytes | None]) -> None:
    """An L0 file whose one section of `topic`/0 spans `deltas` (up to 2**32 - 1 offsets), appended."""
    blob, infos = write_segment([(topic, 0, section_table(deltas, timestamps, keys, [b"v"] * len(deltas)))])
    catalog.store.put("data/l0/wide.seg", blob)
    catalog.append_files([NewFile("data/l0/wide.seg", 0, len(blob), NOW, tuple(infos))], NOW)


@pytest.mark.parametrize("target_file_bytes", [10**9, 1])
def test_a_copy_whose_partition_would_span_2_32_offsets_writes_every_partition_once(catalog: Catalog, target_file_bytes: int) -> None:
    """A run whose `other` section would span 2**32 offsets goes to the cleaner whole: the compacted partition copied
    before it is not written twice (the run's sections are all made before any is written)."""
    create_topic(catalog, "state", 1, cleanup_policy="compact")
    create_topic(catalog, "events", 1)
    _wide_l0_file(catalog, "events", [0, 2**32 - 2], [NOW, NOW], [None, None])
    _produce(catalog, "events", [Record(0, None, b"3", NOW), Record(0, None, b"4", NOW)])
    _produce(catalog, "state", [Record(0, b"a", b"x", NOW), Record(0, b"b", b"y", NOW)])
    (plan,) = level_plans(catalog.snapshot(), NOW, min_files=3, target_file_bytes=target_file_bytes)
    result = _run(catalog, plan)
    assert [s.first_offset for f in result.outputs for s in f.sections if s.topic == "state"] == [0]
    assert len([s for f in result.outputs for s in f.sections if s.topic == "events"]) == 2  # cut at 2**32 offsets
    assert [r.key for r in read_records(catalog.store, catalog.snapshot(), "state", 0)] == [b"a", b"b"]
    assert len(list(read_records(catalog.store, catalog.snapshot(), "events", 0))) == 4


def test_a_copy_whose_young_section_would_span_2_32_offsets_writes_the_older_one_once(catalog: Catalog) -> None:
    create_topic(catalog, "state", 1, cleanup_policy="compact", min_compaction_lag_ms="60000")
    _wide_l0_file(catalog, "state", [0, 1, 2**32 - 2], [NOW - 10**7, NOW, NOW], [b"a", b"b", b"c"])
    _produce(catalog, "state", [Record(0, b"d", b"4", NOW), Record(0, b"e", b"5", NOW), Record(0, b"f", b"6", NOW)])
    (plan,) = level_plans(catalog.snapshot(), NOW, min_files=2, target_file_bytes=1)
    result = _run(catalog, plan)
    assert [s.first_offset for f in result.outputs for s in f.sections if "-compacted-" in f.key] == [0]
    assert [r.key for r in read_records(catalog.store, catalog.snapshot(), "state", 0)] == [b"a", b"b", b"c", b"d", b"e", b"f"]


def test_a_plan_s_sections_are_grouped_with_the_collector_paused(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The tens of thousands of (file, section) pairs a plan groups by partition would set off collections, full
    ones among them (0.08 s of a 0.19 s copy of 32 agents' files): run_plan makes them with the collector paused."""
    create_topic(catalog, "state", 1000, cleanup_policy="compact")
    produce_l0_files(catalog, "state", files=2, records=1000, keys=1000, partitions=1000)
    (plan,) = level_plans(catalog.snapshot(), NOW, min_files=2)
    assert sum(len(f.sections) for f in plan.inputs) == 2000
    events: list[str] = []
    paused = cleaner.collector_paused
    planning = threading.get_ident()

    @contextlib.contextmanager
    def pausing() -> Iterator[None]:
        events.append("paused")
        with paused():
            yield

    def collecting(phase: str, info: dict) -> None:
        if phase == "start" and threading.get_ident() == planning:  # not another test's thread left running
            events.append(f"collection of generation {info['generation']}")

    monkeypatch.setattr(cleaner, "collector_paused", pausing)
    gc.collect()  # the young generation empty: what run_plan allocates before its pause stays under its threshold
    gc.callbacks.append(collecting)
    try:
        run_plan(catalog.store, plan)
    finally:
        gc.callbacks.remove(collecting)
    assert events[0] == "paused", events


def test_from_l2_up_older_records_of_a_key_are_removed(store: ObjectStore, catalog_of) -> None:
    catalog = _setup(catalog_of(store), state={"cleanup_policy": "compact"})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW), Record(0, b"b", b"2", NOW), Record(0, b"a", b"3", NOW)])
    _produce(catalog, "state", [Record(0, b"b", b"4", NOW)])
    result = _full(catalog)
    assert _values(catalog, "state") == [(2, b"a", b"3"), (3, b"b", b"4")]
    assert (result.stats.records_in, result.stats.records_out, result.stats.duplicates_removed) == (4, 2, 2)
    assert result.stats.distinct_keys == 2


def test_tombstones_are_stamped_then_removed_after_their_horizon(catalog: Catalog) -> None:
    catalog = _setup(catalog, state={"cleanup_policy": "compact", "delete_retention_ms": "1000"})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW), Record(0, b"a", None, NOW)])
    first = _full(catalog, NOW + 10)
    assert _values(catalog, "state") == [(1, b"a", None)]
    assert (first.stats.tombstones_stamped, first.stats.tombstones_kept) == (1, 1)
    _full(catalog, NOW + 1009)  # before the horizon (NOW + 10 + 1000)
    assert _values(catalog, "state") == [(1, b"a", None)]
    last = _full(catalog, NOW + 1010)
    assert _values(catalog, "state") == [] and last.stats.tombstones_removed == 1


def test_a_tombstone_kept_for_the_longest_delete_retention_is_stamped_with_the_latest_horizon(catalog: Catalog) -> None:
    """delete.retention.ms may be Long.MAX_VALUE: the horizon stops at the largest int64, never wrapping to the past."""
    catalog = _setup(catalog, state={"cleanup_policy": "compact", "delete_retention_ms": str(2**63 - 1)})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW), Record(0, b"a", None, NOW)])
    first = _full(catalog, NOW + 10)
    assert first.stats.tombstones_stamped == 1
    (data_file,) = catalog.snapshot().files()
    (section,) = data_file.sections
    horizons = read_section(catalog.store, data_file.key, section.info).table(["delete_horizon"]).column(0).to_pylist()
    assert horizons == [2**63 - 1]
    _full(catalog, NOW + 10**9)
    assert _values(catalog, "state") == [(1, b"a", None)]


def test_min_lag_leaves_young_records_untouched(catalog: Catalog) -> None:
    catalog = _setup(catalog, state={"cleanup_policy": "compact", "min_compaction_lag_ms": "1000"})
    _produce(catalog, "state", [Record(0, b"a", b"old", NOW)])
    _produce(catalog, "state", [Record(0, b"a", b"mid", NOW + 700), Record(0, b"a", b"new", NOW + 1500)])
    # The second file's section holds records within the lag: as Kafka does with segments, nothing from its
    # first offset on is touched, and the old value stays (no cleanable newer value of its key).
    result = _full(catalog, NOW + 1600)
    assert _values(catalog, "state") == [(0, b"a", b"old"), (1, b"a", b"mid"), (2, b"a", b"new")]
    assert result.stats.young_kept == 2
    _full(catalog, NOW + 2600)
    assert _values(catalog, "state") == [(2, b"a", b"new")]


def test_inputs_on_both_sides_of_a_young_section_outside_the_plan_are_cut_there(catalog: Catalog) -> None:
    """A plan that leaves out a file holding a young section between two of its partition's sections writes them as
    two sections, cut at the young one's offset: one section spanning it would interleave the partition's sections."""
    catalog = _setup(catalog, state={"cleanup_policy": "compact", "min_compaction_lag_ms": "1000"})
    _produce(catalog, "state", [Record(0, b"a", b"old", NOW)])
    _produce(catalog, "state", [Record(0, b"y", b"young", NOW + 1500)])
    _produce(catalog, "state", [Record(0, b"a", b"new", NOW + 100)])  # older than the lag, despite its offset
    young_file = catalog.snapshot().files(level=0)[1]
    catalog.lease("p-elsewhere", [young_file.key], NOW + 60_000, NOW)
    (plan,) = level_plans(catalog.planning_snapshot(NOW + 1600), NOW + 1600, min_files=2)
    assert young_file.key not in {f.key for f in plan.inputs} and plan.first_uncleanable == {("state", 0): 1}
    _run(catalog, plan)
    snapshot = catalog.snapshot()
    levels = {f.key: f.level for f in snapshot.files()}
    sections = sorted((s.first_offset, s.last_offset, levels[key]) for key, s in snapshot.sections_of("state", 0))
    assert sections == [(0, 0, 1), (1, 1, 0), (2, 2, 1)]
    assert _values(catalog, "state") == [(0, b"a", b"old"), (1, b"y", b"young"), (2, b"a", b"new")]


def test_damage_found_among_young_survivors_at_the_end_sets_the_partition_aside(tmp_path) -> None:
    """Survivors gather a block's worth before they are written, so damage among the young ones (two input rows
    sharing offsets 2 and 3) may surface only when the partition's outputs close: both outputs are taken back and
    the partition set aside, even though the section below the young ones was complete."""
    store = LocalStore(tmp_path / "store")
    topic = Topic.create("t", 1, {"cleanup.policy": "compact", "min.compaction.lag.ms": "1000"}, NOW)
    old_and_young = section_table([0, 1, 2, 3], [NOW, NOW, NOW + 5000, NOW + 5000], [b"a", b"b", b"c", b"d"], [b"1"] * 4)
    young = section_table([0, 1], [NOW + 5000, NOW + 5000], [b"e", b"f"], [b"2"] * 2)
    inputs = []
    for number, (table, first_offset) in enumerate([(old_and_young, 0), (young, 2)]):
        blob, (info,) = write_segment([("t", 0, table)])
        store.put(f"data/l1/in-{number}.seg", blob)
        inputs.append(DataFile(f"data/l1/in-{number}.seg", 1, len(blob), NOW, (CatalogSection(info, first_offset),)))
    plan = Plan(plan_id="p-damage", cluster_id="c", manifest_version=1, now_ms=NOW + 5500, target_level=2, deduplicate=True,
                inputs=tuple(inputs), topics={"t": topic})
    result = run_plan(store, plan)
    assert [u["partition"] for u in result.stats.uncleanable] == [0] and "out of order or twice" in result.stats.uncleanable[0]["reason"]
    assert result.outputs == [] and list(store.list("data/l2/")) == []


def _superseded_blocks_file(store: ObjectStore, value_bytes: int = 100_000) -> tuple[DataFile, Footer]:
    """One section of 40 records of `value_bytes`, about ten a block: the first 20 (keys k0 to k19, k5's record keyless
    and k7's a tombstone) all superseded by the last 20 (k3's latest a tombstone), so the first block holds no survivor."""
    keys: list[bytes | None] = [b"k%d" % (i % 20) for i in range(40)]
    keys[5] = None
    values: list[bytes | None] = [bytes([i]) * value_bytes for i in range(40)]
    values[7] = values[23] = None
    blob, (info,) = write_segment([("t", 0, section_table(list(range(40)), [NOW] * 40, keys, values))])
    store.put("data/l1/superseded.seg", blob)
    footer = read_footer(store, "data/l1/superseded.seg")
    assert len(footer.block_offsets) >= 3 and footer.block_rows[0] < 20
    return DataFile("data/l1/superseded.seg", 1, len(blob), NOW, (CatalogSection(info, 0),)), footer


def _damage_payload(store: ObjectStore, key: str, footer: Footer, block: int) -> None:
    """Flip the last byte of a block's payload, which its CRC-32 then refuses."""
    data = bytearray(store.get(key))
    data[int(footer.block_offsets[block] + footer.block_lengths[block]) - 1] ^= 0xFF
    store.put(key, bytes(data))


def _read_everything(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cleaner._PartitionCleaner, "_payload_wanted", lambda self, placed: lambda index: True)


def _output_records(store: ObjectStore, result) -> list[tuple[int, bytes | None, bool]]:
    return [
        (placed.first_offset + delta, key, value is None)
        for output in result.outputs
        for placed in output.sections
        for delta, key, value in zip(*read_section(store, output.key, placed.info).table(["offset_delta", "key", "value"]).to_pydict().values())
    ]


def test_pass_2_reads_no_payload_of_a_block_none_of_whose_records_survive(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pass 2 judges a block by its index columns first: the first block's records are all superseded (one keyless,
    one a tombstone), so its payload is never read, and damage there goes unseen, while the same plan reading every
    payload sets the partition aside. The records written and every figure are the same either way."""
    store = LocalStore(tmp_path / "store")
    data_file, footer = _superseded_blocks_file(store)
    topic = Topic.create("t", 1, {"cleanup.policy": "compact"}, NOW)
    plan = Plan(plan_id="p-skip", cluster_id="c", manifest_version=1, now_ms=NOW, target_level=2, deduplicate=True,
                inputs=(data_file,), topics={"t": topic})
    skipping = run_plan(store, plan)
    with monkeypatch.context() as patched:
        _read_everything(patched)
        reading = run_plan(store, plan)
    expected = [(20 + i, b"k%d" % i, i == 3) for i in range(20)]
    assert _output_records(store, skipping) == _output_records(store, reading) == expected
    figures = ("records_in", "records_out", "duplicates_removed", "invalid_records", "tombstones_stamped", "tombstones_kept", "warnings")
    assert [getattr(skipping.stats, f) for f in figures] == [getattr(reading.stats, f) for f in figures]
    assert (skipping.stats.duplicates_removed, skipping.stats.invalid_records) == (19, 1)

    _damage_payload(store, data_file.key, footer, 0)
    assert _output_records(store, run_plan(store, plan)) == expected
    with monkeypatch.context() as patched:
        _read_everything(patched)
        damaged = run_plan(store, plan)
    assert damaged.outputs == [] and "CRC-32" in damaged.stats.uncleanable[0]["reason"]


def test_an_aborted_range_early_in_a_section_leaves_its_later_blocks_judged_by_their_index(tmp_path) -> None:
    """The first block holds an aborted record, so it is read whole (its bytes are counted); the second, all superseded,
    is still skipped: damage in its payload goes unseen."""
    store = LocalStore(tmp_path / "store")
    data_file, footer = _superseded_blocks_file(store, value_bytes=120_000)
    assert footer.block_rows[0] + footer.block_rows[1] <= 20
    _damage_payload(store, data_file.key, footer, 1)
    topic = Topic.create("t", 1, {"cleanup.policy": "compact"}, NOW)
    plan = Plan(plan_id="p-aborted", cluster_id="c", manifest_version=1, now_ms=NOW, target_level=2, deduplicate=True,
                inputs=(data_file,), topics={"t": topic}, aborted={("t", 0): ((0, 0),)})
    result = run_plan(store, plan)
    assert result.stats.uncleanable == [] and result.stats.aborted_removed == 1
    assert _output_records(store, result) == [(20 + i, b"k%d" % i, i == 3) for i in range(20)]


@pytest.mark.parametrize(("policy", "deduplicate"), [("compact,delete", True), ("delete", False)], ids=["deduplicated", "copied"])
def test_an_aborted_record_past_retention_counts_as_expired(tmp_path, policy: str, deduplicate: bool) -> None:
    """As the L0 copy counts it (it does not read a section wholly past retention): records 0 and 1 are aborted, 0 and
    2 past retention; 0 counts as expired, 1 as aborted with its bytes."""
    store = LocalStore(tmp_path / "store")
    table = section_table([0, 1, 2, 3], [NOW - 5000, NOW, NOW - 5000, NOW], [b"a", b"b", b"c", b"d"], [b"x" * 10, b"y" * 20, b"z", b"w"])
    blob, (info,) = write_segment([("t", 0, table)])
    store.put("data/l1/in.seg", blob)
    topic = Topic.create("t", 1, {"cleanup.policy": policy, "retention.ms": "1000"}, NOW)
    plan = Plan(plan_id="p-both", cluster_id="c", manifest_version=1, now_ms=NOW, target_level=2 if deduplicate else 1,
                deduplicate=deduplicate, inputs=(DataFile("data/l1/in.seg", 1 if deduplicate else 0, len(blob), NOW, (CatalogSection(info, 0),)),),
                topics={"t": topic}, aborted={("t", 0): ((0, 1),)})
    stats = run_plan(store, plan).stats
    assert (stats.expired_removed, stats.aborted_removed, stats.records_out) == (2, 1, 1)
    assert stats.aborted_bytes_removed == record_bytes(table.slice(1, 1).to_batches()[0])


def test_pass_2_reads_the_payload_of_a_block_holding_a_survivor(tmp_path) -> None:
    store = LocalStore(tmp_path / "store")
    data_file, footer = _superseded_blocks_file(store)
    _damage_payload(store, data_file.key, footer, len(footer.block_offsets) - 1)
    topic = Topic.create("t", 1, {"cleanup.policy": "compact"}, NOW)
    plan = Plan(plan_id="p-read", cluster_id="c", manifest_version=1, now_ms=NOW, target_level=2, deduplicate=True,
                inputs=(data_file,), topics={"t": topic})
    result = run_plan(store, plan)
    assert result.outputs == [] and "CRC-32" in result.stats.uncleanable[0]["reason"]


def test_retention_removes_old_records_and_skips_whole_sections(catalog: Catalog) -> None:
    catalog = _setup(catalog, events={"retention_ms": "1000"}, mixed={"cleanup_policy": "compact,delete", "retention_ms": "1000"})
    _produce(catalog, "events", [Record(0, None, b"old", NOW)] * 3)
    _produce(catalog, "events", [Record(0, None, b"old", NOW), Record(0, None, b"new", NOW + 800)])
    _produce(catalog, "mixed", [Record(0, b"k", b"old", NOW), Record(0, b"j", b"new", NOW + 800)])
    result = _full(catalog, NOW + 1500)
    assert _values(catalog, "events") == [(4, None, b"new")]
    assert _values(catalog, "mixed") == [(1, b"j", b"new")]
    assert result.stats.expired_removed == 5


def test_a_keyless_record_in_a_compacted_topic_is_removed_and_counted(catalog: Catalog) -> None:
    store = catalog.store
    catalog = _setup(catalog, state={"cleanup_policy": "compact"})
    # Data written before the rule: a file the agent would refuse, committed directly.
    blob, infos = write_segment([("state", 0, section_table([0, 1], [NOW, NOW], [None, b"k"], [b"x", b"y"]))])
    store.put("data/l0/legacy.seg", blob)
    catalog.append_files([NewFile("data/l0/legacy.seg", 0, len(blob), NOW, tuple(infos))], NOW)
    result = _full(catalog)
    assert _values(catalog, "state") == [(1, b"k", b"y")]
    assert result.stats.invalid_records == 1
    assert any("without a key" in w for w in result.stats.warnings)


def test_an_oversized_partition_is_copied_not_deduplicated(catalog: Catalog) -> None:
    catalog = _setup(catalog, partitions=2, state={"cleanup_policy": "compact"})
    _produce(catalog, "state", [Record(0, b"a", b"x" * 100, NOW)] * 10 + [Record(1, b"a", b"x", NOW)] * 2)
    plan = replace(full_sweep(catalog.snapshot(), NOW, buffer_bytes=SMALL_BUFFER), max_partition_bytes=500)
    result = _run(catalog, plan)
    assert len(_values(catalog, "state", 0)) == 10 and len(_values(catalog, "state", 1)) == 1
    assert result.stats.oversized_partitions == ["state/0"]


def test_outputs_are_cut_at_the_target_size_at_section_boundaries(catalog: Catalog) -> None:
    catalog = _setup(catalog, partitions=6, events={})
    _produce(catalog, "events", [Record(p, None, os.urandom(2000), NOW) for p in range(6) for _ in range(5)])
    result = _full(catalog, target_file_bytes=15_000)
    assert result.stats.files_out == 3
    assert [len(f.sections) for f in result.outputs] == [2, 2, 2]
    assert all(len(_values(catalog, "events", p)) == 5 for p in range(6))


def test_every_input_file_is_read_by_at_most_two_gets(store: ObjectStore, catalog_of) -> None:
    catalog = _setup(catalog_of(store), partitions=20, state={"cleanup_policy": "compact"})
    for round_ in range(3):
        _produce(catalog, "state", [Record(p, b"k%d" % (i % 3), b"%d" % round_, NOW) for p in range(20) for i in range(6)])
    result = _full(catalog)
    assert result.stats.gets == 2 * 3  # two streaming GETs per input file, not one per partition
    assert result.stats.puts == 1


def test_a_full_buffer_makes_partial_progress_and_converges_over_rounds(catalog: Catalog) -> None:
    catalog = _setup(catalog, state={"cleanup_policy": "compact"})
    keys = 40
    for round_ in range(3):
        _produce(catalog, "state", [Record(0, b"key-%02d" % k, b"%d" % round_, NOW) for k in range(keys)])
    buffer_bytes = 20 * 12  # room for 11 keys
    # Each round maps the next 11 keys past the clean prefix and cleans everything before them, as
    # Kafka's cleaner advances its first dirty offset: at worst one round per map's worth of records.
    max_rounds = math.ceil(3 * keys / 11) + 1
    overflows, remaining = [], [3 * keys]
    while len(_values(catalog, "state")) > keys:
        result = _full(catalog, buffer_bytes=buffer_bytes)
        overflows.append(result.stats.overflows)
        remaining.append(len(_values(catalog, "state")))
        assert len(overflows) <= max_rounds, f"no convergence after {max_rounds} rounds: {remaining}"
        latest = {k: v for _, k, v in _values(catalog, "state")}
        assert latest == {b"key-%02d" % k: b"2" for k in range(keys)}  # never a newer value lost
    assert overflows[0] > 0 and len(overflows) > 1
    assert sorted(v for _, _, v in _values(catalog, "state")) == [b"2"] * keys


def test_plans_are_validated(catalog: Catalog) -> None:
    catalog = _setup(catalog, state={"cleanup_policy": "compact"})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW)])
    plan = full_sweep(catalog.snapshot(), NOW)
    document = plan_to_dict(plan)
    assert plan_from_json(plan_to_json(plan)) == plan
    with pytest.raises(InvalidPlanError, match="plan format 9 is not supported"):
        plan_from_dict({**document, "format": 9})
    with pytest.raises(InvalidPlanError, match="'target_level' is 7: must be an integer, 1 to 4"):
        plan_from_dict({**document, "target_level": 7})
    with pytest.raises(InvalidPlanError, match="names no input files"):
        plan_from_dict({**document, "inputs": []})
    with pytest.raises(InvalidPlanError, match="is not a data file"):
        plan_from_dict({**document, "inputs": [{**document["inputs"][0], "key": "../etc/passwd"}]})
    with pytest.raises(InvalidPlanError, match="not JSON"):
        plan_from_json("{nope")
    foreign = plan_from_dict({**document, "cluster_id": "another-cluster"})
    with pytest.raises(InvalidPlanError, match="is for cluster another-cluster, but the store holds cluster"):
        foreign.check_against(catalog.snapshot(), NOW)
    _produce(catalog, "state", [Record(0, b"b", b"2", NOW)])  # a later version: the inputs still check
    plan.check_against(catalog.snapshot(), NOW)
    changed = plan_from_dict({**document, "inputs": [{**document["inputs"][0], "size": 1}]})
    with pytest.raises(InvalidPlanError, match=r"1 bytes, made at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z in the plan; the catalog records level 0, \d+ bytes, made at \S+Z;"):
        changed.check_against(catalog.snapshot(), NOW)


def test_commit_is_atomic_idempotent_and_conflicts_when_inputs_are_gone(catalog: Catalog) -> None:
    catalog = _setup(catalog, state={"cleanup_policy": "compact"})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW), Record(0, b"a", b"2", NOW)])
    plan = full_sweep(catalog.snapshot(), NOW)
    rival = full_sweep(catalog.snapshot(), NOW)
    result = run_plan(catalog.store, plan)
    assert commit_plan(catalog, plan, [result], NOW) is True
    assert [f.key for f in catalog.snapshot().file_summaries()] == [result.outputs[0].key]
    version = catalog.latest_version()
    assert commit_plan(catalog, plan, [result], NOW) is False  # a retried job: no-op
    assert catalog.latest_version() == version
    rival_result = run_plan(catalog.store, rival)
    with pytest.raises(CommitConflictError, match="found 1 of them gone"):
        commit_plan(catalog, rival, [rival_result], NOW)
    assert catalog.latest_version() == version


def test_gc_deletes_only_old_unreferenced_files(catalog: Catalog) -> None:
    store = catalog.store
    catalog = _setup(Catalog(store, catalog.url, keep_versions=2), state={"cleanup_policy": "compact"})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW)])
    l0 = catalog.snapshot().files(level=0)[0].key
    orphan_plan = full_sweep(catalog.snapshot(), NOW)
    orphan = run_plan(store, orphan_plan).outputs[0].key  # written, never committed
    _full(catalog)  # removes l0 at NOW
    pinned = catalog.snapshot(catalog.latest_version() - 1)  # a reader of the version that still lists l0
    # That version leaves the kept history; this commit comes later than the orphan by more than clocks may differ,
    # so gc may judge the orphan.
    with Agent(catalog, background=False, clock=lambda: store.stat(orphan).modified_ms + 600_000) as agent:
        produced = agent.produce("state", [Record(0, b"b", b"2", NOW)])
    produced.result()
    young = collect_garbage(catalog, NOW + 1, grace_ms=60_000)
    assert young.deleted_files == [] and young.kept_unreferenced_young == 1  # the orphan, and l0's removal, are too young
    assert young.trimmed_versions == catalog.oldest_kept_version() - 1  # the commit log keeps 2 versions
    assert [r.value for r in read_records(store, pinned, "state", 0)] == [b"1"]  # the pinned reader still reads l0
    later = store.stat(orphan).modified_ms + 60_001
    report = collect_garbage(catalog, later, grace_ms=60_000)
    assert sorted(report.deleted_files) == sorted([l0, orphan])  # replaced and out of every kept version; never committed
    assert catalog.known_files([l0, orphan]) == set()  # l0's rows are gone with its object
    for summary in catalog.snapshot().file_summaries():
        assert store.stat(summary.key) is not None
    assert collect_garbage(catalog, later, grace_ms=60_000).deleted_files == []


def test_output_sections_list_exactly_their_offsets_and_keep_record_bytes(catalog: Catalog) -> None:
    from logcompact.format import read_footer, read_section

    catalog = _setup(catalog, partitions=2, state={"cleanup_policy": "compact"})
    produced = []
    for _ in range(3):
        records = [Record(i % 2, b"k%d" % (i % 7), os.urandom(20), NOW + i, [("h", b"%d" % i)]) for i in range(30)]
        offsets = _produce(catalog, "state", records)
        produced += list(zip(offsets, records))
    result = _full(catalog)
    by_partition_offset = {(r.partition, o): r for o, r in produced}
    for data_file in result.outputs:
        footer = read_footer(catalog.store, data_file.key)
        for placed, bitmap in zip(data_file.sections, footer.offset_bitmaps, strict=True):
            section = read_section(catalog.store, data_file.key, placed.info)
            deltas = section.table().column("offset_delta").to_pylist()
            assert list(section.offset_deltas) == deltas and deltas[0] == 0
            assert (list(BitMap.deserialize(bitmap)) if bitmap else list(range(len(deltas)))) == deltas
            for record in read_records(catalog.store, catalog.snapshot(), "state", placed.partition):
                original = by_partition_offset[(placed.partition, record.offset)]
                assert (record.key, record.value, record.timestamp, record.headers) == (
                    original.key, original.value, original.timestamp, list(original.headers),
                )


def test_an_expired_tombstone_in_its_own_file_still_supersedes_older_values(catalog: Catalog) -> None:
    # Found in review: pass 1 once skipped wholly expired sections, so their keys never reached the map.
    catalog = _setup(catalog, mixed={"cleanup_policy": "compact,delete", "retention_ms": "1500"})
    _produce(catalog, "mixed", [Record(0, b"user-1", b"alice", NOW)])
    _produce(catalog, "mixed", [Record(0, b"user-1", None, NOW - 600)])  # newer offset, older timestamp
    _full(catalog, NOW + 1000)  # only the tombstone is past retention
    assert _values(catalog, "mixed") == []


def test_retention_never_lets_an_older_value_outside_the_job_come_back(catalog: Catalog) -> None:
    catalog = _setup(catalog, mixed={"cleanup_policy": "compact,delete", "retention_ms": "1500"})
    _produce(catalog, "mixed", [Record(0, b"k", b"old", NOW + 5000)])  # an older offset, a recent timestamp
    _full(catalog, NOW)
    for _ in range(32):
        _produce(catalog, "mixed", [Record(0, b"k", b"new", NOW)])
    (copy,) = level_plans(catalog.snapshot(), NOW + 2000, min_files=32)
    _run(catalog, copy)  # L0 -> L1 copies a compacted topic whole: no retention without the key map
    (merge,) = level_plans(catalog.snapshot(), NOW + 2000, min_files=1, dedup_from_level=1)
    assert merge.outside_floors  # the old value sits in a file outside this job
    _run(catalog, merge)
    assert _values(catalog, "mixed")[-1] == (32, b"k", b"new")  # expired, but removing it would revive "old"


def test_a_partition_spanning_more_than_2_pow_32_offsets_is_split_across_files(catalog: Catalog) -> None:
    store = catalog.store
    catalog = _setup(catalog, state={"cleanup_policy": "compact"})
    blob, infos = write_segment([("state", 0, section_table([0, 2**32 - 2], [NOW] * 2, [b"a", b"b"], [b"1", b"2"]))])
    store.put("data/l0/big.seg", blob)
    catalog.append_files([NewFile("data/l0/big.seg", 0, len(blob), NOW, tuple(infos))], NOW)
    _produce(catalog, "state", [Record(0, b"c", b"3", NOW), Record(0, b"d", b"4", NOW)])
    result = _full(catalog)
    assert [len(f.sections) for f in result.outputs] == [1, 1]
    assert [(o, k) for o, k, _ in _values(catalog, "state")] == [(0, b"a"), (2**32 - 2, b"b"), (2**32 - 1, b"c"), (2**32, b"d")]


def test_gc_spares_the_outputs_of_a_leased_plan_and_a_commit_checks_its_outputs(catalog: Catalog) -> None:
    store = catalog.store
    catalog = _setup(catalog, state={"cleanup_policy": "compact"})
    _produce(catalog, "state", [Record(0, b"a", b"1", NOW)])
    plan = full_sweep(catalog.snapshot(), NOW)
    catalog.lease(plan.plan_id, [f.key for f in plan.inputs], NOW + 10**12, NOW)
    result = run_plan(store, plan)
    far_future = NOW + 10**11
    assert collect_garbage(catalog, far_future, grace_ms=0).deleted_files == []  # a long job, still leased
    store.delete(result.outputs[0].key)
    with pytest.raises(CommitConflictError, match="is missing from the store"):
        commit_plan(catalog, plan, [result], NOW)


def test_gc_completes_under_steady_ingest_and_never_deletes_a_live_file(catalog: Catalog) -> None:
    # Four producers append L0 files and two compactors lease, run and commit regular plans while gc runs
    # over and over with a short grace; everything on the wall clock, as in production.
    store, url, grace_ms = catalog.store, catalog.url, 3_000
    create_topic(catalog, "t", partitions=4, cleanup_policy="compact")
    config = PlannerConfig(min_files=(4, 4, 4, 4), tier_min_files=4, buffer_bytes=SMALL_BUFFER)
    stop, errors = threading.Event(), []
    produced: dict[bytes, tuple[bytes, int, int]] = {}  # value -> (key, partition, offset)
    compactions, reports = [0], []

    def wall_clock() -> int:
        return int(time.time() * 1000)

    def guarded(work):
        def run(*args) -> None:
            try:
                work(*args)
            except BaseException as exc:
                errors.append(exc)
                stop.set()
        return run

    @guarded
    def produce(writer: int) -> None:
        with Agent(Catalog(store, url), background=False, clock=wall_clock) as agent:
            for n in itertools.count():
                if stop.is_set():
                    return
                records = [Record(p, b"k%d" % (n % 5), b"w%d-%d-%d" % (writer, n, p), wall_clock()) for p in range(4)]
                future = agent.produce("t", records)
                agent.flush()
                for record, offset in zip(records, future.result()):
                    produced[record.value] = (record.key, record.partition, offset)

    @guarded
    def compact() -> None:
        own = Catalog(store, url)
        while not stop.is_set():
            for found in choose_plans(own.snapshot(), wall_clock(), "regular", config):
                try:
                    run_and_commit(own, found, found.now_ms, lease_ms=60_000)
                    compactions[0] += 1
                except CommitConflictError:
                    pass  # the other compactor took (some of) these files first

    @guarded
    def collect() -> None:
        collector = Catalog(store, url, keep_versions=5)
        while not stop.is_set():
            reports.append(collect_garbage(collector, wall_clock(), grace_ms))
            for summary in collector.snapshot().file_summaries():  # every live file still has its object
                assert store.stat(summary.key) is not None, f"gc deleted live file {summary.key}"

    threads = [threading.Thread(target=produce, args=(w,)) for w in range(4)]
    threads += [threading.Thread(target=compact) for _ in range(2)] + [threading.Thread(target=collect)]
    for thread in threads:
        thread.start()
    time.sleep(10)
    stop.set()
    for thread in threads:
        thread.join()
    assert not errors, errors
    assert len(reports) >= 5 and compactions[0] >= 5  # every gc run completed, while compactions committed
    assert any(r.deleted_files for r in reports) and sum(r.trimmed_versions for r in reports) > 0
    latest: dict[tuple[bytes, int], tuple[int, bytes]] = {}
    for value, (key, partition, offset) in produced.items():
        latest[(key, partition)] = max(latest.get((key, partition), (-1, b"")), (offset, value))
    snapshot = catalog.snapshot()
    for partition in range(4):  # every live file reads back, with every key's latest value
        view = latest_values(store, snapshot, "t", partition)
        found = dict(zip(view.column("key").to_pylist(), view.column("value").to_pylist()))
        assert found == {key: value for (key, p), (_, value) in latest.items() if p == partition}


def _level_plans_until_idle(catalog: Catalog, now: int) -> None:
    while plans := level_plans(catalog.planning_snapshot(now), now, 1):
        for found in plans:
            run_and_commit(catalog, found, now)


def _min_lag_scenario(catalog: Catalog) -> None:
    """A young record (timestamps out of order) sits in an L2 file that the next L1 to L2 plan does not take."""
    catalog = _setup(catalog, state={"cleanup_policy": "compact", "min_compaction_lag_ms": "1000"})
    _produce(catalog, "state", [Record(0, b"a", b"old", NOW - 10_000), Record(0, b"y", b"young", NOW)])
    _level_plans_until_idle(catalog, NOW - 10_000)  # to L2, the top level of a small cluster
    _produce(catalog, "state", [Record(0, b"a", b"mid", NOW - 10_000), Record(0, b"a", b"new", NOW - 10_000)])


def test_min_lag_keeps_the_same_records_whichever_files_a_plan_takes(tmp_path_factory, make_catalog_url) -> None:
    from logcompact.store import LocalStore

    survivors = []
    for sweep in (False, True):
        catalog = Catalog(LocalStore(tmp_path_factory.mktemp("minlag")), make_catalog_url("sqlite"))
        _min_lag_scenario(catalog)
        if sweep:
            _full(catalog, NOW + 500)
        else:
            _level_plans_until_idle(catalog, NOW + 500)  # its L1 to L2 plan takes only the new file
            assert {f.level for f in catalog.snapshot().files()} == {2}
        survivors.append(_values(catalog, "state"))
    # From the young record's section on (offset 0: its first), nothing is deduplicated, in both.
    assert survivors[0] == survivors[1] == [(0, b"a", b"old"), (1, b"y", b"young"), (2, b"a", b"mid"), (3, b"a", b"new")]


def test_gc_removes_what_a_writer_killed_mid_write_left_once_past_the_grace(catalog: Catalog) -> None:
    import time as clock

    _setup(catalog, state={"cleanup_policy": "compact"})
    store = catalog.store
    old = store.root / "data" / "l0" / ".x.seg.0123.tmp-logcompact"
    young = store.root / "plans" / "p1-0123456789ab" / ".plan.json.4567.tmp-logcompact"
    for path in (old, young):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"half an object")
    now = int(clock.time() * 1000)
    os.utime(old, (now / 1000 - 7200, now / 1000 - 7200))
    report = collect_garbage(catalog, now, grace_ms=3_600_000)
    assert report.abandoned_writes == ["data/l0/.x.seg.0123.tmp-logcompact"]
    assert not old.exists() and young.exists()


def test_compile_kernels_compiles_every_loop_of_the_engine() -> None:
    """A job's first partition never waits for numba: `compile_kernels` (run before jobs and the suite) leaves every
    compiled loop of the engine with a signature, those marking and sizing aborted records and judging a block by its
    index columns among them."""
    cleaner.compile_kernels()
    kernels = {name: value for name, value in vars(cleaner).items() if hasattr(value, "signatures") and hasattr(value, "py_func")}
    assert {"_mark_aborted", "_binary_bytes_of", "_decide_rows", "_none_survive", "_piece_offsets", "_placed_offsets"} <= set(kernels)
    assert [name for name, kernel in kernels.items() if not kernel.signatures] == []
