"""The planner on catalog snapshots: thresholds, top level, size tiers, sweep, max-lag timing, leases, groups."""

from __future__ import annotations

from types import MappingProxyType

import pytest

from logcompact.catalog import Catalog, CatalogSection, DataFile, Manifest
from logcompact.engine.commit import run_and_commit
from logcompact.exceptions import CommitConflictError
from logcompact.format.layout import SectionInfo
from logcompact.ingest import Agent, Record
from logcompact.planner import PlannerConfig, dirty_since, expected_effect, plan, split_into_groups
from logcompact.store import LocalStore
from logcompact.topics import HOUR_MS, Topic
from tests.helpers import NOW, create_topic

MINUTE = 60_000


def _section(topic: str, partition: int, first: int, count: int, min_ts: int = NOW, clean: int = 0, size: int = 1000) -> CatalogSection:
    info = SectionInfo(topic, partition, count, count - 1, min_ts, min_ts, 0, size, "lz4", 0, 16, size, clean)
    return CatalogSection(info, first)


def _manifest(files: list[DataFile], **topic_settings: dict) -> Manifest:
    topics = {
        name: Topic.create(name, 4, settings, NOW)
        for name, settings in (topic_settings or {"t": {"cleanup.policy": "compact"}}).items()
    }
    return Manifest(
        cluster_id="c", version=7, commit_id="x", created_ms=NOW, operation="test",
        topics=MappingProxyType(topics), next_offsets=MappingProxyType({n: (10**6,) * 4 for n in topics}),
        files=MappingProxyType({f.key: f for f in files}),
    )


def _files(level: int, count: int, size: int = 1000, topic: str = "t", first: int = 0, min_ts: int = NOW) -> list[DataFile]:
    return [
        DataFile(f"data/l{level}/{topic}-{first + n:05d}.seg", level, size, NOW, (_section(topic, 0, first + n * 10, 10, min_ts),))
        for n in range(count)
    ]


def test_a_level_is_compacted_into_the_next_at_its_threshold() -> None:
    assert plan(_manifest(_files(0, 31)), NOW) == []
    (found,) = plan(_manifest(_files(0, 32)), NOW)
    assert (found.target_level, found.deduplicate, len(found.inputs)) == (1, False, 32)
    (found,) = plan(_manifest(_files(1, 32)), NOW)
    assert (found.target_level, found.deduplicate) == (2, True)
    config = PlannerConfig(min_files=(4, 8, 32, 32))
    assert [p.target_level for p in plan(_manifest(_files(0, 4) + _files(1, 8, first=100)), NOW, config=config)] == [1, 2]


def test_a_small_cluster_stops_at_l2_and_a_big_one_goes_to_l4() -> None:
    small = _manifest(_files(2, 40))
    assert [p.target_level for p in plan(small, NOW)] == [2]  # 40 files of one size at the top: a size tier, not L3
    big = _manifest(_files(2, 40) + _files(1, 600, first=1000))
    assert sorted(p.target_level for p in plan(big, NOW)) == [2, 3]


def test_size_tiers_merge_similar_sizes_only() -> None:
    files = _files(2, 10, size=1_000) + _files(2, 9, size=100_000, first=100) + _files(2, 3, size=30_000_000, first=200)
    (found,) = plan(_manifest(files), NOW)
    assert {f.size for f in found.inputs} == {1_000} and found.target_level == 2
    ratio = PlannerConfig(tier_size_ratio=200)
    (merged,) = plan(_manifest(files), NOW, config=ratio)
    assert {f.size for f in merged.inputs} == {1_000, 100_000}  # within 200x of the smallest


def test_compacted_and_other_topics_are_never_merged_together_above_l0() -> None:
    files = _files(1, 32, topic="t") + _files(1, 32, topic="e", first=100)
    plans = plan(_manifest(files, t={"cleanup.policy": "compact"}, e={}), NOW)
    assert sorted(sorted({s.topic for f in p.inputs for s in f.sections}) for p in plans) == [["e"], ["t"]]
    mixed_l0 = plan(_manifest(_files(0, 16, topic="t") + _files(0, 16, topic="e", first=100), t={"cleanup.policy": "compact"}, e={}), NOW)
    assert len(mixed_l0) == 1 and len(mixed_l0[0].inputs) == 32  # L0 -> L1 splits them itself


def test_the_full_sweep_takes_every_size_of_the_chosen_topics() -> None:
    files = _files(2, 3, size=10) + _files(2, 2, size=10**9, first=100) + _files(0, 2, topic="e", first=500)
    manifest = _manifest(files, t={"cleanup.policy": "compact"}, e={})
    (sweep,) = plan(manifest, NOW, "full", topics=["t"])
    assert len(sweep.inputs) == 5 and sweep.target_level == 2 and sweep.deduplicate
    assert sweep.max_partition_bytes == PlannerConfig().max_partition_bytes


def test_max_lag_compacts_within_30_minutes_of_dirty_and_batches() -> None:
    lag = 2 * HOUR_MS
    clean_l2 = DataFile("data/l2/base.seg", 2, 1000, NOW, (_section("t", 0, 0, 10, NOW - 5 * HOUR_MS, clean=10),))
    newer = DataFile("data/l0/new.seg", 0, 100, NOW, (_section("t", 0, 10, 5, NOW),))
    manifest = _manifest([clean_l2, newer], t={"cleanup.policy": "compact", "max.compaction.lag.ms": str(lag)})
    assert dirty_since(manifest, "t", 0, PlannerConfig()) == NOW + lag  # the base section is clean already
    assert dirty_since(manifest, "t", 1, PlannerConfig()) is None
    config = PlannerConfig(max_lag_pass_interval_ms=15 * MINUTE, max_lag_deadline_ms=30 * MINUTE)
    # Passes every 15 minutes: the pass at which the record has been dirty 15 to 30 minutes compacts it.
    for now, due in [(NOW + lag - 1, False), (NOW + lag + 14 * MINUTE, False), (NOW + lag + 15 * MINUTE, True)]:
        found = plan(manifest, now, "max-lag", config)
        assert bool(found) is due, now - NOW - lag
    (found,) = plan(manifest, NOW + lag + 15 * MINUTE, "max-lag", config)
    assert {f.key for f in found.inputs} == {"data/l2/base.seg", "data/l0/new.seg"}  # against the older data
    # An hourly pass compacts up to 30 minutes early rather than later than 30 minutes after.
    hourly = PlannerConfig(max_lag_pass_interval_ms=60 * MINUTE)
    assert plan(manifest, NOW + lag - 31 * MINUTE, "max-lag", hourly) == []
    assert plan(manifest, NOW + lag - 30 * MINUTE, "max-lag", hourly) != []


def test_max_lag_under_two_hours_counts_as_two_hours() -> None:
    manifest = _manifest(_files(0, 1), t={"cleanup.policy": "compact", "max.compaction.lag.ms": "60000"})
    assert dirty_since(manifest, "t", 0, PlannerConfig()) == NOW + 2 * HOUR_MS


def test_leased_files_are_not_planned_until_the_lease_ends() -> None:
    manifest = _manifest(_files(0, 40))
    leased = manifest.with_lease("p-1", [f"data/l0/t-{n:05d}.seg" for n in range(10)], NOW + HOUR_MS, NOW)
    assert plan(leased, NOW) == []  # 30 unleased files: under the threshold
    assert len(plan(leased, NOW + HOUR_MS)[0].inputs) == 40  # expired
    with pytest.raises(CommitConflictError, match="is leased to plan p-1 until"):
        leased.with_lease("p-2", ["data/l0/t-00003.seg"], NOW + HOUR_MS, NOW)


def test_two_schedulers_cannot_lease_the_same_files(tmp_path) -> None:
    store = LocalStore(tmp_path)
    catalog = Catalog(store)
    create_topic(catalog, "t", cleanup_policy="compact")
    for _ in range(3):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(0, b"k", b"v", NOW)])
    config = PlannerConfig(min_files=(3, 32, 32, 32))
    first, second = plan(catalog.load(), NOW, config=config), plan(Catalog(store).load(), NOW, config=config)
    keys = [f.key for f in first[0].inputs]
    catalog.commit("lease", lambda m: (m.with_lease(first[0].plan_id, keys, NOW + HOUR_MS, NOW), None), NOW)
    with pytest.raises(CommitConflictError, match="is leased to plan"):
        run_and_commit(Catalog(store), second[0], NOW, lease_ms=HOUR_MS)
    assert plan(catalog.load(), NOW, config=config) == []
    result = run_and_commit(catalog, first[0], NOW)
    assert result is not None and catalog.load().leases == {}


def test_large_plans_split_into_groups_of_partitions_committed_together(tmp_path) -> None:
    store = LocalStore(tmp_path)
    catalog = Catalog(store)
    create_topic(catalog, "t", partitions=8, cleanup_policy="compact")
    for _ in range(3):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(p, b"k%d" % i, b"v" * 100, NOW) for p in range(8) for i in range(20)])
    (sweep,) = plan(catalog.load(), NOW, "full")
    partition_bytes = sum(s.info.byte_length for f in sweep.inputs for s in f.sections) // 8
    groups = split_into_groups(sweep, group_bytes=2 * partition_bytes + 1)
    assert len(groups) == 4
    assert [g.partitions for g in groups][0] == (("t", 0), ("t", 1))
    assert sorted(tp for g in groups for tp in g.partitions) == [("t", p) for p in range(8)]
    result = run_and_commit(catalog, sweep, NOW, group_bytes=2 * partition_bytes + 1)
    assert len(result.groups) == 4 and result.to_dict()["records_out"] == 8 * 20
    manifest = catalog.load()
    assert {f.level for f in manifest.files.values()} == {2} and len(manifest.files) == 4  # one commit, all groups


def test_dry_run_estimates_records_removed_from_the_key_sketches(tmp_path) -> None:
    store = LocalStore(tmp_path)
    catalog = Catalog(store)
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    for round_ in range(5):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(i % 2, b"key-%d" % i, b"%d" % round_, NOW) for i in range(2000)])
    (sweep,) = plan(catalog.load(), NOW, "full")
    effect = expected_effect(sweep, PlannerConfig().group_bytes)
    assert effect["records_in"] == 10_000 and effect["files_replaced"] == 5
    actual_removed = 8_000
    assert abs(effect["estimated_records_removed"] - actual_removed) < 0.1 * actual_removed
    result = run_and_commit(catalog, sweep, NOW)
    assert result.to_dict()["duplicates_removed"] == actual_removed
