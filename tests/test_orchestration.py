"""The scheduler's steps without Airflow, on both databases: thresholds, plan-lease-write, groups run elsewhere,
commit once, gc."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from logcompact.catalog import Catalog
from logcompact.consume import latest_values
from logcompact.engine.commit import collect_garbage
from logcompact.engine.exchange import plan_key, read_header, read_partition_bytes, write_group_result
from logcompact.engine.stats import JobResult
from logcompact.exceptions import CommitConflictError, TopicNotFoundError
from logcompact.orchestration import check_thresholds, commit_plans, prepare_plans
from logcompact.planner import PlannerConfig, plan
from spark_apps.compact_group import compact_slices, deal_slices
from tests.helpers import NOW, create_topic, produce_l0_files

CONFIG = PlannerConfig(min_files=(4, 4, 4, 4))


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    """The conftest's empty cluster (on each database) with five L0 files of a compacted topic."""
    create_topic(catalog, "accounts", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=5, records=60, keys=20, partitions=3, tombstone_every=7)
    return catalog


def _run_groups(catalog: Catalog, plan_id: str, only: set[int] | None = None) -> None:
    """What the Spark job does for each group, given the plan id and the group number, through the same per-slice
    generator."""
    for group in read_header(catalog.store, plan_id).groups:
        if only is None or group.group in only:
            slices = deal_slices(read_partition_bytes(catalog.store, plan_id, group.group), 2)
            results = [JobResult.from_dict(r) for r in compact_slices(catalog.store.uri, plan_id, group.group, slices)]
            write_group_result(catalog.store, plan_id, group.group, results)


def _objects(catalog: Catalog) -> list[str]:
    return sorted(info.key for info in catalog.store.list(""))


def _latest(catalog: Catalog) -> dict[bytes, bytes]:
    snapshot = catalog.snapshot()
    found = {}
    for partition in range(3):
        view = latest_values(catalog.store, snapshot, "accounts", partition)
        found.update(zip(view.column("key").to_pylist(), view.column("value").to_pylist()))
    return found


def test_thresholds_count_unleased_files_per_level(catalog: Catalog) -> None:
    status = check_thresholds(catalog.snapshot(), NOW, CONFIG)
    assert status.counts == {0: 5} and status.due_levels == [0] and "L0 5/4" in status.describe()
    assert not check_thresholds(catalog.snapshot(), NOW, PlannerConfig()).reached  # 5 files < 32
    assert prepare_plans(catalog, "regular", NOW, CONFIG).thresholds == status  # what the plans were made from
    assert not check_thresholds(catalog.snapshot(), NOW, CONFIG).reached  # leased to the plan now
    assert check_thresholds(catalog.snapshot(), NOW + CONFIG.lease_ms, CONFIG).counts == {0: 5}  # until it expires


def test_dry_run_writes_nothing(catalog: Catalog) -> None:
    before, version = _objects(catalog), catalog.latest_version()
    prepared = prepare_plans(catalog, "full", NOW, CONFIG, dry_run=True)
    assert prepared.groups == [] and prepared.plan_ids == []
    assert prepared.estimates[0]["files_replaced"] == 5 and prepared.estimates[0]["estimated_records_removed"] > 0
    assert _objects(catalog) == before and catalog.latest_version() == version and not catalog.snapshot().leases(NOW)


def test_plan_run_commit_and_a_retried_commit(catalog: Catalog) -> None:
    expected = _latest(catalog)
    config = PlannerConfig(group_bytes=1, buffer_bytes=2 * 1024**2)  # a group per partition
    prepared = prepare_plans(catalog, "full", NOW, config)
    (plan_id,) = prepared.plan_ids
    assert len(prepared.groups) == 3 and read_header(catalog.store, plan_id).buffer_bytes == 2 * 1024**2
    snapshot = catalog.snapshot()
    assert snapshot.leased_files(NOW) == {f.key for f in snapshot.file_summaries()}
    assert prepared.groups[2].application_args() == [f"--store={catalog.store.uri}", f"--plan-id={plan_id}", "--group=2"]
    assert prepared.groups[2].label.startswith(f"{plan_id} g2 of 3: L0 to L2, 1 partition, ")

    _run_groups(catalog, plan_id, only={0, 1})
    with pytest.raises(CommitConflictError, match=r"no result for group\(s\) 2"):  # a failed group: no commit
        commit_plans(catalog, [plan_id], NOW)
    assert catalog.snapshot().leased_files(NOW)  # still leased: a retry of group 2 resumes the plan

    _run_groups(catalog, plan_id, only={2})
    first = commit_plans(catalog, [plan_id], NOW)
    retried = commit_plans(catalog, [plan_id], NOW)
    assert first.committed == [plan_id] and retried.already_committed == [plan_id] and retried.committed == []
    assert retried.stats == first.stats and first.stats[plan_id]["records_in"] == 300
    assert retried.manifest_version == first.manifest_version and first.topics == ["accounts"]
    assert first.cluster_id == catalog.cluster_id and first.manifest_version == catalog.latest_version()
    assert {f.level for f in catalog.snapshot().file_summaries()} == {2} and not catalog.snapshot().leases(NOW)
    assert _latest(catalog) == expected


def test_inputs_changed_before_commit_is_a_clean_conflict(catalog: Catalog) -> None:
    expected = _latest(catalog)
    stale = prepare_plans(catalog, "full", NOW, CONFIG)
    _run_groups(catalog, stale.plan_ids[0])
    # Another scheduler compacts the same files after the lease expired.
    later = NOW + CONFIG.lease_ms + 1
    newer = prepare_plans(catalog, "full", later, CONFIG)
    _run_groups(catalog, newer.plan_ids[0])
    commit_plans(catalog, newer.plan_ids, later)
    version = catalog.latest_version()
    with pytest.raises(CommitConflictError, match="expected 5 input files as in manifest version .*, found 5 of them gone"):
        commit_plans(catalog, stale.plan_ids, later)
    assert catalog.latest_version() == version and _latest(catalog) == expected


def test_topics_are_checked_against_the_catalog_and_the_mode(catalog: Catalog) -> None:
    with pytest.raises(TopicNotFoundError, match=r"topic\(s\) nope not in cluster \S+ \(topics: accounts\)"):
        prepare_plans(catalog, "full", NOW, CONFIG, topics=["nope"])
    with pytest.raises(ValueError, match="only be chosen for the max-lag and full modes"):
        prepare_plans(catalog, "regular", NOW, CONFIG, topics=["accounts"])
    assert prepare_plans(catalog, "full", NOW, CONFIG, topics=["accounts"], dry_run=True).estimates


def test_gc_releases_expired_leases_then_collects_an_abandoned_plan(catalog: Catalog) -> None:
    abandoned = prepare_plans(catalog, "full", NOW, CONFIG)
    (plan_id,) = abandoned.plan_ids
    _run_groups(catalog, plan_id)  # outputs written, never committed
    outputs = [k for k in _objects(catalog) if k.startswith(f"data/l2/{plan_id}")]
    assert outputs
    during = collect_garbage(catalog, NOW + 1, grace_ms=0)
    assert during.released_leases == [] and during.deleted_files == [] and during.deleted_plans == []
    after = collect_garbage(catalog, int(time.time() * 1000) + 1, grace_ms=0)  # objects carry wall-clock times
    assert after.released_leases == [plan_id] and not catalog.snapshot().leases(NOW)
    assert sorted(after.deleted_files) == outputs and plan_key(plan_id) in after.deleted_plans
    assert len(catalog.snapshot().file_summaries()) == 5  # the inputs stay live


def test_a_commit_after_the_lease_expired_is_refused(catalog: Catalog) -> None:
    prepared = prepare_plans(catalog, "full", NOW, CONFIG)
    _run_groups(catalog, prepared.plan_ids[0])
    version = catalog.latest_version()
    with pytest.raises(CommitConflictError, match="lease on .* expired or was released before the commit; .* plan again"):
        commit_plans(catalog, prepared.plan_ids, NOW + CONFIG.lease_ms)
    assert catalog.latest_version() == version  # gc may now collect the outputs: nothing may point at them


def test_a_retried_commit_after_gc_collected_the_plan_is_still_a_no_op(catalog: Catalog) -> None:
    prepared = prepare_plans(catalog, "full", NOW, CONFIG)
    _run_groups(catalog, prepared.plan_ids[0])
    commit_plans(catalog, prepared.plan_ids, NOW)
    report = collect_garbage(catalog, int(time.time() * 1000) + 1, grace_ms=0)
    assert plan_key(prepared.plan_ids[0]) in report.deleted_plans
    retried = commit_plans(catalog, prepared.plan_ids, NOW)
    assert retried.already_committed == prepared.plan_ids and retried.committed == []


def test_plans_that_cannot_be_written_leave_nothing_leased(catalog: Catalog, monkeypatch) -> None:
    def failing_write(store, plan):
        raise OSError("disk full")

    monkeypatch.setattr("logcompact.orchestration.write_plan", failing_write)
    with pytest.raises(OSError, match="disk full"):
        prepare_plans(catalog, "full", NOW, CONFIG)
    assert not catalog.snapshot().leases(NOW)


def test_a_run_leases_all_its_plans_or_none(catalog: Catalog, monkeypatch) -> None:
    # Two plans of one run; another scheduler leases a file of the second between planning and leasing.
    (sweep,) = plan(catalog.snapshot(), NOW, "full", CONFIG)
    first = replace(sweep, plan_id="p-first", inputs=sweep.inputs[:2])
    second = replace(sweep, plan_id="p-second", inputs=sweep.inputs[2:])
    monkeypatch.setattr("logcompact.orchestration.plan", lambda *args: [first, second])
    catalog.lease("p-other", [sweep.inputs[4].key], NOW + CONFIG.lease_ms, NOW)
    with pytest.raises(CommitConflictError, match=f"file {sweep.inputs[4].key} is leased to plan p-other"):
        prepare_plans(catalog, "full", NOW, CONFIG)
    assert {lease.plan_id for lease in catalog.snapshot().leases(NOW).values()} == {"p-other"}
    assert not list(catalog.store.list("plans/"))  # no plan written
