"""DeleteRecords in the catalog (`Catalog.delete_records`): the log start rises, the sections wholly before it are
retired and the files left without a live section removed, which gc collects (with the commit log trimmed past the
version: the removal stays recorded); a section holding the new start stays live; compaction after it takes only the
live sections, and readers from the log start see the records from it on."""

from __future__ import annotations

import pytest

from logcompact.catalog import Catalog
from logcompact.catalog.topics import OFFSET_OUT_OF_RANGE, POLICY_VIOLATION, UNKNOWN_PARTITION, RecordsDeleted
from logcompact.consume import read_records
from logcompact.exceptions import CommitConflictError
from logcompact.ingest import Record
from logcompact.jobs import collect_garbage, commit_plans, prepare_plans, run_group
from logcompact.planner import PlannerConfig
from logcompact.plans import read_header
from tests.helpers import NOW, TasksByUri, assert_summaries_kept, create_topic, produce_records


def fill(catalog: Catalog, topic: str, files: int, per_partition: int, partitions: int) -> None:
    """`files` L0 files, each with `per_partition` records of every partition."""
    for n in range(files):
        produce_records(catalog, topic, [Record(p, b"k%d" % i, b"v%d-%d" % (n, i), NOW) for p in range(partitions) for i in range(per_partition)])


def live_sections(catalog: Catalog, topic: str, partition: int) -> list[tuple[int, int]]:
    return sorted((section.first_offset, section.last_offset) for _, section in catalog.snapshot().sections_of(topic, partition))


def offsets_read(catalog: Catalog, topic: str, partition: int, start: int) -> list[int]:
    return [record.offset for record in read_records(catalog.store, catalog.snapshot(), topic, partition) if record.offset >= start]


def run_all(catalog: Catalog, plan_ids: list[str]) -> None:
    """What the Spark job does for each group of each plan."""
    for plan_id in plan_ids:
        for group in read_header(catalog.store, plan_id).groups:
            run_group(catalog.store, plan_id, group.group, mapper=TasksByUri(2))


def test_sections_before_the_new_log_start_retire_and_gc_collects_the_emptied_files(store, catalog_of) -> None:
    catalog = Catalog(store, catalog_of(store).url, keep_versions=1)  # the commit log trimmed at once
    create_topic(catalog, "events", 2)
    fill(catalog, "events", files=3, per_partition=10, partitions=2)  # each file holds both partitions
    create_topic(catalog, "alone", 1)
    fill(catalog, "alone", files=3, per_partition=10, partitions=1)
    removed_before = {f.key for f in catalog.snapshot().file_summaries()}

    assert catalog.delete_records("alone", {0: 15}, NOW) == {0: RecordsDeleted(15)}
    assert catalog.delete_records("events", {0: 20, 1: -1}, NOW) == {0: RecordsDeleted(20), 1: RecordsDeleted(30)}
    assert [o.log_start for o in catalog.log_offsets("events")] == [20, 30]
    assert live_sections(catalog, "alone", 0) == [(10, 19), (20, 29)]  # the one holding offset 15 stays whole
    assert live_sections(catalog, "events", 0) == [(20, 29)] and live_sections(catalog, "events", 1) == []
    assert offsets_read(catalog, "alone", 0, 15) == list(range(15, 30))
    gone = removed_before - {f.key for f in catalog.snapshot().file_summaries()}
    assert len(gone) == 3  # "alone"'s first file, and the two files of "events" that hold nothing from the new starts

    report = collect_garbage(catalog, NOW + 10, grace_ms=0)
    assert sorted(report.deleted_files) == sorted(gone) and report.damaged_rows == []
    assert collect_garbage(catalog, NOW + 20, grace_ms=0).damaged_rows == []
    assert_summaries_kept(catalog)


def test_a_compaction_after_it_takes_the_live_sections_only(catalog: Catalog) -> None:
    create_topic(catalog, "events", 2)
    fill(catalog, "events", files=4, per_partition=10, partitions=2)
    catalog.delete_records("events", {0: 25}, NOW)
    prepared = prepare_plans(catalog, "full", NOW, PlannerConfig(min_files=(4, 4, 4, 4)))
    run_all(catalog, prepared.plan_ids)
    committed = commit_plans(catalog, prepared.plan_ids, NOW)
    assert committed.committed == prepared.plan_ids
    # a delete topic's records are copied, from the section holding offset 25 on; the log starts stay
    assert min(first for first, _ in live_sections(catalog, "events", 0)) == 20
    assert [o.log_start for o in catalog.log_offsets("events")] == [25, 0]
    assert offsets_read(catalog, "events", 0, 25) == list(range(25, 40))
    assert offsets_read(catalog, "events", 1, 0) == list(range(40))
    assert_summaries_kept(catalog)


def test_refusals(catalog: Catalog) -> None:
    create_topic(catalog, "events", 1)
    create_topic(catalog, "profiles", 1, cleanup_policy="compact")
    fill(catalog, "events", files=1, per_partition=10, partitions=1)
    version = catalog.latest_version()
    found = catalog.delete_records("events", {0: 11, 3: 0}, NOW)
    assert (found[0].refusal, found[3].refusal) == (OFFSET_OUT_OF_RANGE, UNKNOWN_PARTITION)
    assert found[0].message == "cannot delete events/0 before offset 11: give an offset from 0 to its high watermark 10, or -1 for the high watermark"
    assert catalog.delete_records("profiles", {0: 0}, NOW)[0].refusal == POLICY_VIOLATION
    assert catalog.latest_version() == version  # nothing answered: no version


def test_a_compaction_planned_before_it_is_refused_at_its_commit_then_planned_again(catalog: Catalog) -> None:
    create_topic(catalog, "events", 2)
    fill(catalog, "events", files=4, per_partition=10, partitions=2)
    config = PlannerConfig(min_files=(4, 4, 4, 4))
    prepared = prepare_plans(catalog, "full", NOW, config)
    run_all(catalog, prepared.plan_ids)
    catalog.delete_records("events", {0: 25}, NOW)  # retires sections the plan read
    with pytest.raises(CommitConflictError, match=r"records of events/0 up to offset 19 were deleted \(DeleteRecords\) after the plan read its files; plan again"):
        commit_plans(catalog, prepared.plan_ids, NOW)
    assert offsets_read(catalog, "events", 0, 25) == list(range(25, 40))

    release = collect_garbage(catalog, NOW + 3_600_001, grace_ms=0)  # the failed plan's leases expire
    assert release.released_leases == prepared.plan_ids
    again = prepare_plans(catalog, "full", NOW + 3_600_001, config)
    run_all(catalog, again.plan_ids)
    assert commit_plans(catalog, again.plan_ids, NOW + 3_600_001).committed == again.plan_ids
    assert min(first for first, _ in live_sections(catalog, "events", 0)) == 20
    assert offsets_read(catalog, "events", 0, 25) == list(range(25, 40))
