"""The planner on catalog snapshots, on both databases: thresholds, top level, size tiers, sweep, max-lag timing,
leases, outside floors, groups."""

from __future__ import annotations

import pytest

from logcompact.catalog import Catalog, CatalogSection, DataFile, Snapshot
from logcompact.exceptions import CommitConflictError, InvalidPlanError
from logcompact.format.layout import SectionInfo
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.planner import PlannerConfig, choose_plans, dirty_since, expected_effect
from logcompact.plans import PlanGroup, plan_from_dict, plan_from_json, plan_to_dict, plan_to_json
from logcompact.store import LocalStore
from logcompact.topics import HOUR_MS
from tests.helpers import NOW, create_topic

MINUTE = 60_000


def _section(
    topic: str, partition: int, first: int, count: int, min_ts: int = NOW, clean: int = 0, size: int = 1000, byte_offset: int = 16
) -> CatalogSection:
    info = SectionInfo(topic, partition, count, count - 1, min_ts, min_ts, 0, size, "lz4", 0, byte_offset, size, clean)
    return CatalogSection(info, first)


@pytest.fixture
def snapshot_of(tmp_path, catalog_url, make_catalog_url):
    """A snapshot of a fresh cluster (on the test's database) holding exactly `files`, offsets as given, with
    topics of 4 partitions."""
    database = "sqlite" if catalog_url is None else "postgresql"
    made = []

    def make(files: list[DataFile], **topic_settings: dict) -> Snapshot:
        catalog = Catalog(LocalStore(tmp_path / f"cluster-{len(made)}"), catalog_url if not made else make_catalog_url(database))
        made.append(catalog)
        for name, settings in (topic_settings or {"t": {"cleanup.policy": "compact"}}).items():
            create_topic(catalog, name, 4, **{k.replace(".", "_"): v for k, v in settings.items()})
        catalog.replace_files([], files, NOW)
        return catalog.snapshot()

    return make


def _files(level: int, count: int, size: int = 1000, topic: str = "t", first: int = 0, min_ts: int = NOW) -> list[DataFile]:
    return [
        DataFile(f"data/l{level}/{topic}-{first + n:05d}.seg", level, size, NOW, (_section(topic, 0, first + n * 10, 10, min_ts),))
        for n in range(count)
    ]


def test_a_level_is_compacted_into_the_next_at_its_threshold(snapshot_of) -> None:
    assert choose_plans(snapshot_of(_files(0, 31)), NOW) == []
    (plan,) = choose_plans(snapshot_of(_files(0, 32)), NOW)
    assert (plan.target_level, plan.deduplicate, len(plan.inputs)) == (1, False, 32)
    (plan,) = choose_plans(snapshot_of(_files(1, 32)), NOW)
    assert (plan.target_level, plan.deduplicate) == (2, True)
    config = PlannerConfig(min_files=(4, 8, 32, 32))
    assert [p.target_level for p in choose_plans(snapshot_of(_files(0, 4) + _files(1, 8, first=100)), NOW, config=config)] == [1, 2]


def test_a_small_cluster_stops_at_l2_and_a_big_one_goes_to_l4(snapshot_of) -> None:
    small = snapshot_of(_files(2, 40))
    assert [p.target_level for p in choose_plans(small, NOW)] == [2]  # 40 files of one size at the top: a size tier, not L3
    big = snapshot_of(_files(2, 40) + _files(1, 600, first=1000))
    assert sorted(p.target_level for p in choose_plans(big, NOW)) == [2, 3]


def test_size_tiers_merge_similar_sizes_only(snapshot_of) -> None:
    files = _files(2, 10, size=1_000) + _files(2, 9, size=100_000, first=100) + _files(2, 3, size=30_000_000, first=200)
    snapshot = snapshot_of(files)
    (plan,) = choose_plans(snapshot, NOW)
    assert {f.size for f in plan.inputs} == {1_000} and plan.target_level == 2
    ratio = PlannerConfig(tier_size_ratio=200)
    (merged,) = choose_plans(snapshot, NOW, config=ratio)
    assert {f.size for f in merged.inputs} == {1_000, 100_000}  # within 200x of the smallest


def test_compacted_and_other_topics_are_never_merged_together_above_l0(snapshot_of) -> None:
    files = _files(1, 32, topic="t") + _files(1, 32, topic="e", first=100)
    plans = choose_plans(snapshot_of(files, t={"cleanup.policy": "compact"}, e={}), NOW)
    assert sorted(sorted({s.topic for f in p.inputs for s in f.sections}) for p in plans) == [["e"], ["t"]]
    mixed = snapshot_of(_files(0, 16, topic="t") + _files(0, 16, topic="e", first=100), t={"cleanup.policy": "compact"}, e={})
    mixed_l0 = choose_plans(mixed, NOW)
    assert len(mixed_l0) == 1 and len(mixed_l0[0].inputs) == 32  # L0 -> L1 splits them itself


def test_the_full_sweep_takes_every_size_of_the_chosen_topics(snapshot_of) -> None:
    files = _files(2, 3, size=10) + _files(2, 2, size=10**9, first=100) + _files(0, 2, topic="e", first=500)
    snapshot = snapshot_of(files, t={"cleanup.policy": "compact"}, e={})
    (sweep,) = choose_plans(snapshot, NOW, "full", topics=["t"])
    assert len(sweep.inputs) == 5 and sweep.target_level == 2 and sweep.deduplicate
    assert sweep.max_partition_bytes == PlannerConfig().max_partition_bytes
    assert sorted(sweep.inputs, key=lambda f: f.key) == sorted(snapshot.get_files([f.key for f in files[:5]]).values(), key=lambda f: f.key)
    (everything,) = choose_plans(snapshot, NOW, "full")
    assert len(everything.inputs) == 7 and everything.outside_floors == {} and set(everything.topics) == {"e", "t"}


def test_max_lag_compacts_within_30_minutes_of_dirty_and_batches(snapshot_of) -> None:
    lag = 2 * HOUR_MS
    clean_l2 = DataFile("data/l2/base.seg", 2, 1000, NOW, (_section("t", 0, 0, 10, NOW - 5 * HOUR_MS, clean=10),))
    newer = DataFile("data/l0/new.seg", 0, 100, NOW, (_section("t", 0, 10, 5, NOW),))
    snapshot = snapshot_of([clean_l2, newer], t={"cleanup.policy": "compact", "max.compaction.lag.ms": str(lag)})
    assert dirty_since(snapshot, "t", 0, PlannerConfig()) == NOW + lag  # the base section is clean already
    assert dirty_since(snapshot, "t", 1, PlannerConfig()) is None
    config = PlannerConfig(max_lag_pass_interval_ms=15 * MINUTE, max_lag_deadline_ms=30 * MINUTE)
    # Passes every 15 minutes: the pass at which the record has been dirty 15 to 30 minutes compacts it.
    for now, due in [(NOW + lag - 1, False), (NOW + lag + 14 * MINUTE, False), (NOW + lag + 15 * MINUTE, True)]:
        plans = choose_plans(snapshot, now, "max-lag", config)
        assert bool(plans) is due, now - NOW - lag
    (plan,) = choose_plans(snapshot, NOW + lag + 15 * MINUTE, "max-lag", config)
    assert {f.key for f in plan.inputs} == {"data/l2/base.seg", "data/l0/new.seg"}  # against the older data
    assert plan.target_level == 2 and plan.mode == "max-lag"
    # An hourly pass compacts up to 30 minutes early rather than later than 30 minutes after.
    hourly = PlannerConfig(max_lag_pass_interval_ms=60 * MINUTE)
    assert choose_plans(snapshot, NOW + lag - 31 * MINUTE, "max-lag", hourly) == []
    assert choose_plans(snapshot, NOW + lag - 30 * MINUTE, "max-lag", hourly) != []


def _one_section(key: str, level: int, first: int, size: int, newest: int, clean: bool, partition: int = 0) -> DataFile:
    return DataFile(key, level, size, NOW, (_section("t", partition, first, 10, newest, clean=10 if clean else 0, size=size),))


def test_a_partition_past_its_dirty_ratio_is_taken_once_its_min_lag_has_passed(snapshot_of) -> None:
    """Kafka's cleanable ratio: the clean base (1,000 B) against the dirty sections before the first young one (an
    aged young section, 1,500 B, at L3), at any level; L1 is the active segment, never counted nor taken."""
    base = _one_section("data/l4/base.seg", 4, 0, 1000, NOW - 5 * HOUR_MS, clean=True)
    held_back = _one_section("data/l3/held-back.seg", 3, 10, 1500, NOW - 30 * MINUTE, clean=False)
    active = _one_section("data/l1/active.seg", 1, 20, 5000, NOW, clean=False)
    settings = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(HOUR_MS)}
    snapshot = snapshot_of([base, held_back, active], t=settings)
    assert choose_plans(snapshot, NOW) == []  # within its min lag: cleanable ratio 0, not taken early
    (plan,) = choose_plans(snapshot, NOW + 31 * MINUTE)  # 1,500 / 2,500 = 0.6 > 0.5
    assert {f.key for f in plan.inputs} == {"data/l4/base.seg", "data/l3/held-back.seg"}
    assert (plan.mode, plan.target_level, plan.deduplicate) == ("regular", 4, True)
    assert plan.outside_floors == {("t", 0): 20}  # the active segment stays outside
    for ratio in ("0.6", "1"):  # not more than the ratio: left to the sweep
        assert choose_plans(snapshot_of([base, held_back, active], t={**settings, "min.cleanable.dirty.ratio": ratio}), NOW + 31 * MINUTE) == []


def test_the_dirty_ratio_counts_only_what_is_before_the_first_young_section(snapshot_of) -> None:
    """Dirty sections from the first one within min lag on are not cleanable (Kafka's first uncleanable offset), even
    an older one after it; a partition whose only dedup-level section is dirty is all dirty (ratio 1)."""
    base = _one_section("data/l2/base.seg", 2, 0, 1000, NOW - 5 * HOUR_MS, clean=True)
    aged = _one_section("data/l2/aged.seg", 2, 10, 900, NOW - 2 * HOUR_MS, clean=False)
    young = _one_section("data/l2/young.seg", 2, 20, 5000, NOW, clean=False)
    after = _one_section("data/l2/after.seg", 2, 30, 5000, NOW - 2 * HOUR_MS, clean=False)
    lone = _one_section("data/l2/lone.seg", 2, 0, 100, NOW - 2 * HOUR_MS, clean=False, partition=1)
    settings = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(HOUR_MS)}
    (plan,) = choose_plans(snapshot_of([base, aged, young, after, lone], t=settings), NOW)
    assert {f.key for f in plan.inputs} == {"data/l2/lone.seg"}  # partition 0: 900 / 1,900, under 0.5
    assert plan.first_uncleanable == {}
    (plan,) = choose_plans(snapshot_of([base, aged, young, after], t={**settings, "min.cleanable.dirty.ratio": "0.4"}), NOW)
    assert {f.key for f in plan.inputs} == {"data/l2/base.seg", "data/l2/aged.seg"}
    assert plan.first_uncleanable == {("t", 0): 20}  # the young section protects what follows it


_BASE = _one_section("data/l2/base.seg", 2, 0, 1000, NOW - 5 * HOUR_MS, clean=True)
_DIRTY = _one_section("data/l2/dirty.seg", 2, 10, 3000, NOW - 5 * HOUR_MS, clean=False)


def test_a_partition_past_its_ratio_waits_for_a_level_plans_files_and_is_not_taken_over_the_partition_cap(snapshot_of) -> None:
    base, dirty = _BASE, _DIRTY
    assert choose_plans(snapshot_of([base, dirty]), NOW, config=PlannerConfig(max_partition_bytes=3999)) == []  # the engine would copy it
    # A size tier of the top level takes the dirty file in this pass: the partition waits for the next one.
    tier = [_one_section(f"data/l2/tier-{n}.seg", 2, 100 + 10 * n, 3000, NOW - 5 * HOUR_MS, clean=True, partition=2) for n in range(9)]
    (plan,) = choose_plans(snapshot_of([base, dirty, *tier]), NOW)
    assert {f.key for f in plan.inputs} == {dirty.key, *(f.key for f in tier)}


def test_a_partition_is_held_to_the_cap_over_every_file_the_ratio_plan_takes(snapshot_of) -> None:
    """Partition 0's cleaning range (base and dirty, 4,000 B) is within a 5,000 B cap, but partition 1's range takes a
    whole file that also holds partition 0's young section of 2,000 B: in that plan partition 0 would hold 6,000 B,
    and the engine would copy it, so it waits; partition 1 is taken alone."""
    lag = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(HOUR_MS)}
    shared = DataFile("data/l2/shared.seg", 2, 2600, NOW, (
        _section("t", 0, 20, 10, NOW, size=2000), _section("t", 1, 10, 10, NOW - 5 * HOUR_MS, size=600, byte_offset=2016),
    ))
    other_base = _one_section("data/l2/base-1.seg", 2, 0, 400, NOW - 5 * HOUR_MS, clean=True, partition=1)
    snapshot = snapshot_of([_BASE, _DIRTY, shared, other_base], t=lag)
    (plan,) = choose_plans(snapshot, NOW, config=PlannerConfig(max_partition_bytes=5000))
    assert {f.key for f in plan.inputs} == {shared.key, other_base.key}
    (plan,) = choose_plans(snapshot, NOW, config=PlannerConfig(max_partition_bytes=6000))
    assert {f.key for f in plan.inputs} == {_BASE.key, _DIRTY.key, shared.key, other_base.key}


def test_a_partition_past_its_ratio_waits_for_a_lease_to_end(catalog: Catalog) -> None:
    base, dirty = _BASE, _DIRTY
    create_topic(catalog, "t", 4, cleanup_policy="compact")
    catalog.replace_files([], [base, dirty], NOW)
    catalog.lease("p-1", [base.key], NOW + HOUR_MS, NOW)
    assert choose_plans(catalog.snapshot(), NOW) == []
    assert {f.key for f in choose_plans(catalog.snapshot(), NOW + HOUR_MS)[0].inputs} == {base.key, dirty.key}


def test_the_dirty_ratio_is_weighed_from_the_summaries_bound_and_from_the_sections_of_an_older_snapshot(catalog: Catalog) -> None:
    """A clean base of 1,000 B under 800 B of dirty L2 bytes and 5,000 B at L1: the summary's bound (800 / 1,800,
    L1 left out) is under 0.5, so the partition is not weighed further and not taken. A snapshot taken before a
    commit that set the partition's row again weighs it from its own sections, as they stood."""
    base = _BASE
    dirty = _one_section("data/l2/dirty-800.seg", 2, 10, 800, NOW - 5 * HOUR_MS, clean=False)
    active = _one_section("data/l1/active.seg", 1, 20, 5000, NOW, clean=False)
    create_topic(catalog, "t", 4, cleanup_policy="compact")
    catalog.replace_files([], [base, dirty, active], NOW)
    assert catalog.snapshot().summaries_above_l0([("t", 0)])[("t", 0)].l1_bytes == 5000
    older = catalog.snapshot()
    asked: list[tuple[str, int]] = []
    read_sections = older.sections_at_levels

    def recorded(partitions: list[tuple[str, int]], from_level: int) -> list:
        asked.extend(partitions)
        return read_sections(partitions, from_level)

    older.sections_at_levels = recorded  # type: ignore[method-assign]
    assert choose_plans(older, NOW) == [] and asked == []  # the bound sufficed: no section read
    more = _one_section("data/l2/dirty-more.seg", 2, 30, 1000, NOW - 5 * HOUR_MS, clean=False)
    catalog.replace_files([], [more], NOW)  # 1,800 of 2,800 B dirty now: past 0.5
    assert ("t", 0) not in older.summaries_above_l0([("t", 0)])  # its row is newer than that snapshot
    assert choose_plans(older, NOW) == [] and asked == [("t", 0)]
    (plan,) = choose_plans(catalog.snapshot(), NOW)
    assert {f.key for f in plan.inputs} == {base.key, dirty.key, more.key}


def test_max_lag_under_two_hours_counts_as_two_hours(snapshot_of) -> None:
    snapshot = snapshot_of(_files(0, 1), t={"cleanup.policy": "compact", "max.compaction.lag.ms": "60000"})
    assert dirty_since(snapshot, "t", 0, PlannerConfig()) == NOW + 2 * HOUR_MS


def test_leased_files_are_not_planned_until_the_lease_ends(catalog: Catalog) -> None:
    create_topic(catalog, "t", 4, cleanup_policy="compact")
    catalog.replace_files([], _files(0, 40), NOW)
    catalog.lease("p-1", [f"data/l0/t-{n:05d}.seg" for n in range(10)], NOW + HOUR_MS, NOW)
    assert choose_plans(catalog.snapshot(), NOW) == []  # 30 unleased files: under the threshold
    assert len(choose_plans(catalog.snapshot(), NOW + HOUR_MS)[0].inputs) == 40  # expired
    with pytest.raises(CommitConflictError, match="file data/l0/t-00003.seg is leased to plan p-1 until"):
        catalog.lease("p-2", ["data/l0/t-00003.seg"], NOW + HOUR_MS, NOW)


def _brute_force_floors(snapshot: Snapshot, input_keys: set[str]) -> dict[tuple[str, int], int]:
    """Per partition of the inputs, the lowest offset of any live file outside them, from every file's sections."""
    files = snapshot.files()
    held = {(s.topic, s.partition) for f in files if f.key in input_keys for s in f.sections}
    floors: dict[tuple[str, int], int] = {}
    for data_file in files:
        if data_file.key not in input_keys:
            for section in data_file.sections:
                tp = (section.topic, section.partition)
                if tp in held:
                    floors[tp] = min(floors.get(tp, section.first_offset), section.first_offset)
    return floors


def _spread(level: int, count: int, partitions: int, first: int, step: int = 1) -> list[DataFile]:
    """Files each holding a section of every one of `partitions` partitions, at offsets interleaved with other levels'."""
    return [
        DataFile(
            f"data/l{level}/spread-{first + n:06d}.seg", level, 1000, NOW,
            tuple(_section("t", p, first + n * 1000 + p * step, 10, byte_offset=16 + 100 * p) for p in range(partitions)),
        )
        for n in range(count)
    ]


@pytest.mark.parametrize("spread_partitions", [1, 64])
def test_outside_floors_hold_every_live_file_outside_each_plan(catalog: Catalog, spread_partitions: int) -> None:
    # Two plans of one pass (L0 and L1), files no plan takes (L2, the top, without a tier; a leased L0 file)
    # and, with 1 spread partition, many files elsewhere: each plan's floors come from the other plan's inputs
    # and from the unplanned files, read by partition (1) or by file (64: the planner picks the narrower read).
    # min.cleanable.dirty.ratio 1: the dirty L2 files stay outside every plan.
    create_topic(catalog, "t", 64, cleanup_policy="compact", min_cleanable_dirty_ratio="1")
    files = _spread(0, 5, spread_partitions, first=500) + _spread(1, 5, spread_partitions, first=0, step=3)
    files += _spread(2, 3, spread_partitions, first=100, step=7) + _spread(0, 1, spread_partitions, first=900)
    files += [DataFile(f"data/l2/other-{p:02d}.seg", 2, 1000, NOW, (_section("t", p, 0, 10),)) for p in range(8, 8 + 40 // spread_partitions)]
    catalog.replace_files([], files, NOW)
    catalog.lease("p-elsewhere", ["data/l0/spread-000900.seg"], NOW + HOUR_MS, NOW)
    snapshot = catalog.snapshot()
    plans = choose_plans(snapshot, NOW, config=PlannerConfig(min_files=(5, 5, 32, 32), tier_min_files=1000))
    assert [(p.target_level, len(p.inputs)) for p in plans] == [(1, 5), (2, 5)]
    for plan in plans:
        expected = _brute_force_floors(snapshot, {f.key for f in plan.inputs})
        assert plan.outside_floors == expected and len(expected) == spread_partitions


def test_two_schedulers_cannot_lease_the_same_files(catalog: Catalog) -> None:
    create_topic(catalog, "t", cleanup_policy="compact")
    for _ in range(3):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(0, b"k", b"v", NOW)])
    config = PlannerConfig(min_files=(3, 32, 32, 32))
    other = Catalog(catalog.store, catalog.url)
    first, second = choose_plans(catalog.snapshot(), NOW, config=config), choose_plans(other.snapshot(), NOW, config=config)
    catalog.lease(first[0].plan_id, [f.key for f in first[0].inputs], NOW + HOUR_MS, NOW)
    with pytest.raises(CommitConflictError, match="is leased to plan"):
        run_and_commit(other, second[0], NOW, lease_ms=HOUR_MS)
    assert choose_plans(catalog.snapshot(), NOW, config=config) == []
    result = run_and_commit(catalog, first[0], NOW)
    assert result is not None and catalog.snapshot().leases(NOW) == {}


def test_large_plans_split_into_groups_of_partitions_committed_together(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=8, cleanup_policy="compact")
    for _ in range(3):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(p, b"k%d" % i, b"v" * 100, NOW) for p in range(8) for i in range(20)])
    (whole,) = choose_plans(catalog.snapshot(), NOW, "full")
    sizes: dict[int, int] = {}
    for data_file in whole.inputs:
        for section in data_file.sections:
            sizes[section.partition] = sizes.get(section.partition, 0) + section.info.uncompressed_bytes
    assert whole.groups == (PlanGroup(0, ("t", 0), ("t", 7), 8, sum(sizes.values())),) and whole.piece(0) is whole
    # Groups of whole partitions in order, each within group_bytes: the planner splits the plan when it makes it.
    config = PlannerConfig(group_bytes=max(sizes[p] + sizes[p + 1] for p in range(0, 8, 2)))
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full", config)
    assert sweep.groups == tuple(
        PlanGroup(n, ("t", 2 * n), ("t", 2 * n + 1), 2, sizes[2 * n] + sizes[2 * n + 1]) for n in range(4)
    )
    assert expected_effect(sweep)["groups"] == 4
    for group in sweep.groups:  # a group's job reads only its own sections
        piece = sweep.piece(group.group)
        assert piece.group == group.group and piece.groups == (group,) and len(piece.inputs) == 3
        assert sorted({s.partition for f in piece.inputs for s in f.sections}) == [2 * group.group, 2 * group.group + 1]
    version = catalog.latest_version()
    result = run_and_commit(catalog, sweep, NOW)
    assert len(result.jobs) == 4 and result.to_dict()["records_out"] == 8 * 20
    assert result.to_dict()["bytes_in"] == sum(f.size for f in sweep.inputs)
    files = catalog.snapshot().files()
    assert {f.level for f in files} == {2} and len(files) == 4  # all groups' outputs...
    assert catalog.latest_version() == version + 1  # ...in one commit


def test_a_group_reads_only_the_files_holding_its_partitions(snapshot_of) -> None:
    # Partitions 0 and 1 in every file, partition 2 in the last one only: the group of partition 2 reads one file.
    files = [
        DataFile(f"data/l0/f{n}.seg", 0, 1000, NOW, tuple(_section("t", p, 100 * n + 10 * p, 10, byte_offset=16 + 100 * p) for p in range(2 + (n == 3))))
        for n in range(4)
    ]
    snapshot = snapshot_of(files)
    (sweep,) = choose_plans(snapshot, NOW, "full", PlannerConfig(group_bytes=1000))
    assert [(g.first, g.last, g.partitions, g.bytes) for g in sweep.groups] == [
        (("t", 0), ("t", 0), 1, 4000), (("t", 1), ("t", 1), 1, 4000), (("t", 2), ("t", 2), 1, 1000),
    ]
    assert [len(sweep.piece(g.group).inputs) for g in sweep.groups] == [4, 4, 1]
    (last,) = sweep.piece(2).inputs
    assert last.key == "data/l0/f3.seg" and [s.partition for s in last.sections] == [2] and last.size == 1000


def test_dry_run_estimates_records_removed_from_the_key_sketches(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    for round_ in range(5):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(i % 2, b"key-%d" % i, b"%d" % round_, NOW) for i in range(2000)])
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full")
    effect = expected_effect(sweep)
    assert effect["records_in"] == 10_000 and effect["files_replaced"] == 5
    actual_removed = 8_000
    assert abs(effect["estimated_records_removed"] - actual_removed) < 0.1 * actual_removed
    result = run_and_commit(catalog, sweep, NOW)
    assert result.to_dict()["duplicates_removed"] == actual_removed


def test_a_plan_as_one_json_document_keeps_its_groups_and_is_checked(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=3, cleanup_policy="compact")
    with Agent(catalog, background=False) as agent:
        agent.produce("t", [Record(p, b"k%d" % i, b"v", NOW) for p in range(3) for i in range(10)])
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full", PlannerConfig(group_bytes=1))
    document = plan_to_dict(sweep)
    assert plan_from_json(plan_to_json(sweep)) == sweep and len(sweep.groups) == 3  # key sketches and all
    section = document["inputs"][0]["sections"][0]
    assert isinstance(section["key_sketch"], str) and section["first_offset"] == 0  # bytes in base64
    cases = [
        ({**document, "groups": document["groups"][:2]}, r"holds t/2, which no group of the plan holds"),
        ({**document, "groups": [document["groups"][1], document["groups"][0], document["groups"][2]]}, "number the groups 0, 1, ... in order"),
        ({**document, "inputs": [{**document["inputs"][0], "sections": [{**section, "key_sketch": "%%"}]}]}, "'key_sketch' is not base64"),
        ({**document, "inputs": [{**document["inputs"][0], "sections": [{**section, "nope": 1}]}]}, r"section field\(s\) nope unknown"),
        ({**document, "inputs": [{**document["inputs"][0], "sections": [{**section, "partition": "0"}]}]}, "'partition' is '0': must be an integer"),
        ({k: v for k, v in document.items() if k != "inputs"}, "this is the header of a stored plan"),
        ({**document, "inputs": [{k: v for k, v in document["inputs"][0].items() if k != "sections"}]}, "input data/.*: plan field 'sections' is missing"),
        ({**document, "outside_floors": [["t", 0]]}, r"outside_floors entry \['t', 0\] is not \[topic, partition, offset\]"),
    ]
    for broken, message in cases:
        with pytest.raises(InvalidPlanError, match=message):
            plan_from_dict(broken)


@pytest.mark.parametrize(
    ("setting", "value", "message"),
    [
        ("buffer_bytes", 10**15, "buffer_bytes is 1000000000000000: must be an integer, 40 to 2147483648"),
        ("buffer_bytes", 39, "buffer_bytes is 39: must be an integer, 40 to"),
        ("target_file_bytes", 0, "target_file_bytes is 0: must be an integer, 1 to 17179869184"),
        ("max_partition_bytes", 2**51, "max_partition_bytes is 2251799813685248: must be an integer, 1 to 1125899906842624"),
        ("group_bytes", 2**51, "group_bytes is 2251799813685248: must be an integer, 1 to 1125899906842624"),
        ("group_bytes", 1.5, "group_bytes is 1.5: must be an integer"),
        ("lease_ms", HOUR_MS + 1, "lease_ms is 3600001: must be an integer, 1 to 3600000"),
    ],
)
def test_planner_settings_outside_a_plans_bounds_are_refused(setting: str, value, message: str) -> None:
    with pytest.raises(InvalidPlanError, match=f"^planner setting {message}"):
        PlannerConfig(**{setting: value})
    assert PlannerConfig(buffer_bytes=40, target_file_bytes=1, group_bytes=2**50, lease_ms=HOUR_MS).group_bytes == 2**50
