"""The simulator: its cost model against real engine runs, and a short side-by-side run."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

from logcompact import sketch
from logcompact.catalog import Catalog, DataFile, NewFile
from logcompact.catalog.columns import SectionColumns
from logcompact.exceptions import CommitConflictError, InvalidRecordError
from logcompact.format.layout import SectionInfo
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.lab.simulate import LOGCOMPACT, RUNS, WARPSTREAM_LIKE, Simulation, Workload, compare
from logcompact.lab.simulate.catalog import MemoryCatalog
from logcompact.lab.simulate.cost import estimate_job
from logcompact.lab.simulate.report import table, write
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.topics import Topic
from tests.helpers import NOW, create_topic


# Few partitions with many records each, and files of many partitions with a few records each.
@pytest.mark.parametrize("partitions, keys, rounds", [(4, 300, 4), (4, 3000, 3), (4, 20_000, 2), (300, 3000, 4), (1000, 2000, 3)])
def test_the_cost_model_predicts_real_output_sizes(catalog: Catalog, partitions: int, keys: int, rounds: int) -> None:
    create_topic(catalog, "t", partitions=partitions, cleanup_policy="compact")
    values = [os.urandom(100) for _ in range(512)]
    for round_ in range(rounds):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(k % partitions, b"key-%08d" % k, values[(k + round_) % 512], NOW) for k in range(keys)])
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full", PlannerConfig())
    predicted = estimate_job(sweep)
    actual = run_and_commit(catalog, sweep, NOW).to_dict()
    # The stated error of the model: 15% on records and bytes out (a 128-register HyperLogLog has 9%).
    assert abs(predicted.records_out - actual["records_out"]) <= 0.15 * actual["records_out"]
    assert abs(predicted.bytes_out - actual["bytes_out"]) <= 0.15 * actual["bytes_out"]
    assert (predicted.records_in, predicted.gets, predicted.puts) == (actual["records_in"], actual["gets"], actual["puts"] + 1)


def test_a_short_simulation_reports_every_figure(tmp_path) -> None:
    workload = Workload(agents=2, records_per_s=200, keys=5_000, hours=1.5, max_lag_ms=7_200_000)
    results = compare(workload, RUNS)
    for result in results:
        summary = result.summary()
        assert result.bytes_ingested > 0 and summary["write_amplification"] >= 2.0  # L0 and its L1 copy at least
        assert summary["gets_per_gib"] > 0 and summary["puts_per_gib"] > 0
        assert summary["dedup_delay_p50_s"] is not None and 0 < summary["dedup_delay_p50_s"] <= summary["dedup_delay_p99_s"]
        assert summary["past_min_lag_p99_s"] == summary["dedup_delay_p99_s"]  # no min lag: from produce
        assert 0.0 <= summary["duplicates_at_rest_end"] < 1.0
        assert len(result.files_per_level) >= 9  # every 10 simulated minutes
    text = table("2 agents:", results)
    assert all(name in text for name in RUNS) and "write ampl." in text and "past min lag p99 s" in text
    written = write(tmp_path, "two-agents", results)
    assert [p.suffix for p in written] == [".json", ".png", ".png"] and all(p.stat().st_size > 1000 for p in written)


def test_records_min_lag_held_back_are_deduplicated_soon_after_they_age_only_with_the_dirty_ratio() -> None:
    """A 10-minute min lag, no max lag: young records are kept whole in sections of their own at the top level.
    With Kafka's default ratio the next regular passes take them once they age; with the ratio off only a tier
    merge (or the daily sweep) does. Both report the cost in write amplification."""
    workload = Workload(agents=2, records_per_s=200, keys=5_000, hours=1.5, min_lag_ms=10 * 60_000)
    ratio, off = (summary.summary() for summary in compare(workload, {"ratio 0.5": (LOGCOMPACT, 0.5), "ratio off": (LOGCOMPACT, 1.0)}))
    # Regular passes come every 128 s (32 L1 files of 2 agents): a young section ages with its newest record.
    assert ratio["past_min_lag_max_s"] <= 300 < off["past_min_lag_max_s"]
    assert ratio["dedup_delay_p99_s"] < off["dedup_delay_p99_s"]
    assert ratio["write_amplification"] >= 2.0 and off["write_amplification"] >= 2.0


def test_a_warpstream_like_cluster_follows_every_record_of_its_1000_partitions() -> None:
    workload = replace(WARPSTREAM_LIKE, hours=0.05)  # 225 L1 files of about 1,000 sections, 7 regular plans
    assert (workload.agents, workload.topics * workload.partitions) == (10, 1000)
    simulation = Simulation("logcompact", workload, LOGCOMPACT)
    summary = simulation.run().summary()
    assert summary["jobs"] >= 225 + 7 and summary["write_amplification"] >= 2.0
    assert summary["dedup_delay_p50_s"] is not None and summary["live_files_end"] < 32 + 7
    # Every ingested record is either deduplicated (its delay counted once) or still followed in a live file.
    deduplicated = sum(simulation.deduplicated.values())
    followed = sum(int(c.records.sum()) for c in simulation.cohorts.values())
    assert deduplicated + followed == simulation.result.bytes_ingested // workload.record_bytes
    # The live files hold records of every partition of every topic, each followed as its own partition.
    live_slots = np.unique(np.concatenate([c.slots for c in simulation.cohorts.values()]))
    assert live_slots.tolist() == list(range(1000))


# Small levels (8 files), a big cluster from 24 files: merges into L2, L3 and L4, size tiers and a sweep in 2.5 hours.
_SMALL_LEVELS = PlannerConfig(min_files=(8, 8, 8, 8), big_cluster_files=24, tier_min_files=4, target_file_bytes=200_000,
                              max_lag_pass_interval_ms=3_600_000)


# (write amplification, jobs, dedup p50 and p99 s, duplicates at rest, live files) at the end of each run below, as the
# simulator reported them when it held every section as an object: its columns change how fast it runs, not what.
_FIGURES = {
    "levels-tiers-sweep": (37.801, 3144, 1190.0, 3358.0, 0.8498, 80),
    "max-lag": (3.545, 2420, 1154.0, 6358.0, 0.9458, 54),
    "warpstream-like": (3.463, 234, 38.0, 75.6, 0.3728, 21),
}


@pytest.mark.parametrize("workload, config, sweep_every_ms, figures", [
    # Levels up to L4, tiers, the dirty ratio and a sweep, over 24 partitions with a min lag.
    (Workload(agents=2, records_per_s=40, keys=20_000, key_skew=0.8, hours=2.5, min_lag_ms=600_000, max_lag_ms=7_200_000,
              partitions=8, topics=3), _SMALL_LEVELS, 5_400_000, _FIGURES["levels-tiers-sweep"]),
    # The ratio off: the max-lag pass plans.
    (Workload(agents=2, records_per_s=80, keys=20_000, key_skew=0.8, hours=2.6, min_lag_ms=600_000, max_lag_ms=7_200_000,
              partitions=8, topics=3, min_cleanable_dirty_ratio=1.0), LOGCOMPACT, 24 * 3_600_000, _FIGURES["max-lag"]),
    # Files of 1,000 partitions.
    (replace(WARPSTREAM_LIKE, hours=0.05), LOGCOMPACT, 24 * 3_600_000, _FIGURES["warpstream-like"]),
], ids=["levels-tiers-sweep", "max-lag", "warpstream-like"])
def test_the_catalog_in_memory_gives_every_figure_the_real_catalog_gives(
    workload: Workload, config: PlannerConfig, sweep_every_ms: int, figures: tuple
) -> None:
    """The simulator runs on a catalog in memory; the same run on the real catalog (SQLite) must report the same
    plans' figures to the last digit: files per level and duplicates at rest every 10 minutes, delays, requests."""
    in_memory, real = (
        Simulation("logcompact", workload, config, sweep_every_ms=sweep_every_ms, real_catalog=on_sqlite).run()
        for on_sqlite in (False, True)
    )
    assert in_memory.jobs > 0 and in_memory.to_dict() == real.to_dict()
    summary = in_memory.summary()
    names = ("write_amplification", "jobs", "dedup_delay_p50_s", "dedup_delay_p99_s", "duplicates_at_rest_end", "live_files_end")
    assert tuple(summary[name] for name in names) == figures


def test_the_catalog_in_memory_places_offsets_and_refuses_what_it_cannot_hold() -> None:
    topic = Topic.create("t", 2, {"cleanup.policy": "compact"}, 0)
    catalog = MemoryCatalog([topic])

    def new_file(key: str, *counts: int) -> NewFile:
        return NewFile(key, 1, 100, 0, tuple(
            SectionInfo("t", partition, count, count - 1, 0, 0, 0, 10, "none", 0, 0, 10) for partition, count in enumerate(counts)
        ))

    catalog.append_files([new_file("a", 3, 5), new_file("b", 2, 1)], 0)
    files = catalog.snapshot().get_files(["a", "b"])
    assert [s.first_offset for s in files["a"].sections] == [0, 0] and [s.first_offset for s in files["b"].sections] == [3, 5]
    with pytest.raises(CommitConflictError, match="found 1 of them gone"):
        catalog.replace_files(["a", "gone"], [], 0)
    assert set(catalog.snapshot().get_files(["a", "b"])) == {"a", "b"}  # nothing changed
    with pytest.raises(ValueError, match="two sections of one partition"):
        catalog.append_files([new_file("c", 1, 1), NewFile("d", 1, 100, 0, new_file("x", 1).sections * 2)], 0)
    assert catalog.append_files([new_file("c", 1)], 0)[1] == [[5]]  # the refused append advanced nothing
    with pytest.raises(ValueError, match="names a file twice"):
        catalog.replace_files(["a", "a"], [], 0)
    with pytest.raises(InvalidRecordError, match="partitions 0 to 1, not 2"):
        catalog.append_files([NewFile("e", 1, 100, 0, (new_file("x", 1).sections[0]._replace(partition=2),))], 0)
    assert set(catalog.snapshot().get_files(["a", "b", "c", "e"])) == {"a", "b", "c"}
    with pytest.raises(ValueError, match="retention.ms"):
        MemoryCatalog([Topic.create("d", 1, {"cleanup.policy": "delete", "retention.ms": "1000"}, 0)])


def test_the_catalog_in_memory_answers_each_planning_question_as_the_database(catalog: Catalog) -> None:
    """The same files in both catalogs, at L0, L1 and L2, of topics with and without min lag and of a topic that is
    not compacted; each question planners ask of a snapshot (`PlanningSnapshot`) gets the same answer."""
    topics = [
        Topic.create("a", 2, {"cleanup.policy": "compact", "min.compaction.lag.ms": "60000"}, NOW),
        Topic.create("b", 2, {"cleanup.policy": "compact"}, NOW),
        Topic.create("c", 1, {"cleanup.policy": "delete", "retention.ms": "-1"}, NOW),
    ]
    catalog.ensure_created(NOW)
    for topic in topics:
        catalog.create_topic(topic, NOW)
    memory = MemoryCatalog(topics)
    rng = np.random.default_rng(5)

    def new_file(key: str, level: int, created: int, partitions: list[tuple[str, int]]) -> NewFile:
        sections = []
        for number, (topic, partition) in enumerate(partitions):
            count = int(rng.integers(1, 20))
            words = rng.integers(0, 2**63, size=count, dtype=np.uint64)
            sections.append(SectionInfo(topic, partition, count, count - 1, created - 90_000 + number, created - number,
                                        0, count * 100, "lz4", 0, 200 * number, 200, 0, sketch.encode(sketch.sketch_words(words))))
        return NewFile(key, level, 200 * len(partitions), created, tuple(sections))

    everything = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)]
    for files in (
        [new_file("l1-1", 1, NOW, everything), new_file("l1-2", 1, NOW + 1000, [("a", 0), ("b", 1)])],
        [new_file("l0-1", 0, NOW + 2000, everything), new_file("l1-3", 1, NOW + 3000, [("a", 1), ("c", 0)])],
        [new_file("l0-2", 0, NOW + 4000, [("a", 0), ("b", 0), ("c", 0)])],
    ):
        assert catalog.append_files(files, NOW)[1] == memory.append_files(files, NOW)[1]
    # A compaction of the first L1 file into L2: one output deduplicated (clean), one holding the other topic.
    merged = catalog.snapshot().get_files(["l1-1"])["l1-1"].sections
    compacted = tuple(s._replace(info=s.info._replace(clean_below_delta=s.info.last_delta + 1)) for s in merged if s.topic != "c")
    outputs = [DataFile("l2-1", 2, 900, NOW + 5000, compacted), DataFile("l2-2", 2, 200, NOW + 5000, tuple(s for s in merged if s.topic == "c"))]
    catalog.replace_files(["l1-1"], outputs, NOW + 5000, plan_id="p")
    memory.replace_files(["l1-1"], outputs, NOW + 5000, plan_id="p")

    real, held = catalog.snapshot(), memory.snapshot()
    partitions = [("a", 0), ("a", 1), ("b", 0), ("b", 1), ("c", 0)]
    keys = ["l0-1", "l1-3", "gone"]
    now = NOW + 60_000
    for question in (
        lambda s: s.level_counts(), lambda s: s.level_counts(["l0-2"]), lambda s: s.file_summaries(), lambda s: s.file_summaries(0, 2),
        lambda s: sorted(s.file_summaries_of(keys), key=repr), lambda s: s.files(), lambda s: s.files(level=2), lambda s: s.files(topics=["c"]),
        lambda s: s.get_files(keys), lambda s: s.lowest_offsets(keys), lambda s: s.outside_floors(keys, partitions),
        lambda s: s.outside_floors_in_l0(["l0-2"], partitions), lambda s: s.floors_above_l0(partitions), lambda s: s.summaries_above_l0(partitions),
        lambda s: s.first_uncleanable_offsets(partitions, now), lambda s: s.first_uncleanable_offsets(partitions, now, ["l0-1"]),
        lambda s: s.sections_at_levels(partitions, 0), lambda s: s.sections_at_levels(partitions, 2),
        lambda s: sorted(s.partition_sections(["a", "c"], True), key=repr), lambda s: sorted(s.partition_sections(["a", "b"], False), key=repr),
        lambda s: s.files_holding([("c", 0)]), lambda s: s.leased_files(now),
    ):
        assert question(held) == question(real)
    assert held.summaries_above_l0([("b", 1)])[("b", 1)] is not None and held.first_uncleanable_offsets(partitions, now)  # not all empty
    # The sections' columns: the same files in the same order, the same facts of each section (in no set order).
    for keys_asked, topics_asked, timestamps in (
        (None, None, True), (None, None, False), (keys, None, True), (None, ["c"], True), (keys, ["a"], False), (["l0-2", "l1-2", "l1-3", "l2-1", "l2-2"], None, True),
    ):
        assert _columns(held.section_columns(keys_asked, topics_asked, timestamps)) == _columns(real.section_columns(keys_asked, topics_asked, timestamps))


def _columns(columns: SectionColumns) -> tuple:
    """`SectionColumns` as plain values, each column's dtype with it, the sections in (file, topic, partition) order."""
    order = np.lexsort((columns.partition, columns.topic, columns.file))
    per_file = tuple((array.dtype.str, array.tolist()) for array in (columns.levels, columns.sizes, columns.created_ms))
    per_section = tuple(
        None if array is None else (array.dtype.str, array[order].tolist())
        for array in (columns.file, columns.topic, columns.partition, columns.first_offset, columns.last_offset, columns.uncompressed_bytes,
                      columns.max_timestamp)
    )
    return columns.keys, columns.contents, columns.every_live_file, columns.topics, per_file, per_section
