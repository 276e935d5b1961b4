"""The scheduler's steps without Airflow, on both databases: thresholds, plan-lease-write, groups run elsewhere,
commit once, gc."""

from __future__ import annotations

import json
import re
import time
from dataclasses import replace

import pyarrow as pa
import pytest
from sqlalchemy import select

from logcompact.catalog import Catalog, schema
from logcompact.consume import latest_values
from logcompact.exceptions import CommitConflictError, InvalidPlanError, ObjectNotFoundError, TopicNotFoundError
from logcompact.jobs import check_thresholds, collect_garbage, commit_plans, prepare_plans, run_group
from logcompact.keys import group_key, inputs_key, plan_key
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import Plan, read_cluster_id, read_group, read_header, read_partition_bytes, read_plan, write_plan
from logcompact.plans.arrow_form import GROUP_METADATA_KEY
from logcompact.units import mib
from tests.helpers import NOW, TasksByUri, create_topic, produce_l0_files

CONFIG = PlannerConfig(min_files=(4, 4, 4, 4))


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    """The conftest's empty cluster (on each database) with five L0 files of a compacted topic."""
    create_topic(catalog, "accounts", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=5, records=60, keys=20, partitions=3, tombstone_every=7)
    return catalog


def _run_groups(catalog: Catalog, plan_id: str, only: set[int] | None = None) -> None:
    """What the Spark job does for each group, given the plan id and the group number: its slices run as tasks that
    open the store themselves."""
    for group in read_header(catalog.store, plan_id).groups:
        if only is None or group.group in only:
            run_group(catalog.store, plan_id, group.group, mapper=TasksByUri(2))


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


def test_a_dry_run_estimates_what_its_run_then_removes(catalog: Catalog) -> None:
    """Each dry run, then the same plans run and committed on the local store: a deduplication removes what its
    key sketches estimate; a copy (L0 to L1) and a rewrite of files already deduplicated remove nothing, and their
    dry runs say so exactly (a sketch's error would make up duplicates in a clean partition)."""
    forced = PlannerConfig(min_files=(2,) * 4, tier_min_files=2)  # as a forced DAG run plans

    def dry_then_run(mode: str, topics: list[str] | None = None) -> list[tuple[dict, dict]]:
        dry = prepare_plans(catalog, mode, NOW, forced, topics, dry_run=True).estimates
        prepared = prepare_plans(catalog, mode, NOW, forced, topics)
        assert [{**e, "plan_id": ""} for e in prepared.estimates] == [{**e, "plan_id": ""} for e in dry]
        for plan_id in prepared.plan_ids:
            _run_groups(catalog, plan_id)
        summary = commit_plans(catalog, prepared.plan_ids, NOW)
        return [(estimate, summary.stats[estimate["plan_id"]]) for estimate in prepared.estimates]

    create_topic(catalog, "profiles", partitions=3, cleanup_policy="compact")
    produce_l0_files(catalog, "profiles", files=5, records=60, keys=20, partitions=3)
    for topic in ("accounts", "profiles"):  # a topic at a time: two deduplicated files at L2
        ((estimate, outcome),) = dry_then_run("full", [topic])
        assert estimate["action"] == "deduplicate" and outcome["duplicates_removed"] > 0
        # Records less the distinct keys the sketches count, within their error (about 9%) of those keys.
        assert abs(estimate["estimated_records_removed"] - outcome["duplicates_removed"]) <= 0.1 * outcome["records_out"], (estimate, outcome)
    produce_l0_files(catalog, "profiles", files=2, records=60, keys=20, partitions=3)

    done = {estimate["action"]: (estimate, outcome) for estimate, outcome in dry_then_run("regular")}
    assert sorted(done) == ["copy", "rewrite"]
    for estimate, outcome in done.values():
        assert estimate["estimated_records_removed"] == outcome["duplicates_removed"] == 0
        assert estimate["records_in"] == outcome["records_in"] == outcome["records_out"]
    assert (done["copy"][0]["target_level"], done["rewrite"][0]["input_levels"]) == (1, [2])


def test_plan_run_commit_and_a_retried_commit(catalog: Catalog) -> None:
    expected = _latest(catalog)
    config = PlannerConfig(group_bytes=1, buffer_bytes=2 * 1024**2)  # a group per partition
    prepared = prepare_plans(catalog, "full", NOW, config)
    (plan_id,) = prepared.plan_ids
    assert len(prepared.groups) == 3 and read_header(catalog.store, plan_id).buffer_bytes == 2 * 1024**2
    snapshot = catalog.snapshot()
    assert snapshot.leased_files(NOW) == {f.key for f in snapshot.file_summaries()}
    assert prepared.groups[2].application_args() == [f"--store={catalog.store.uri}", f"--plan-id={plan_id}", "--group=2"]
    # Unique in a run and telling: the plan, the group of how many, its partitions, levels and uncompressed bytes.
    assert re.fullmatch(rf"{plan_id[-12:]} g2 of 3: accounts/2 L0>L2, 0\.\d{{3}} MiB uncompressed", prepared.groups[2].label)

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


def test_a_plan_that_cannot_commit_does_not_hold_back_the_others_of_its_run(catalog: Catalog) -> None:
    (first,) = prepare_plans(catalog, "regular", NOW, CONFIG).plan_ids
    produce_l0_files(catalog, "accounts", files=4, records=60, keys=20, partitions=3, now=NOW + 1_000)
    (second,) = prepare_plans(catalog, "regular", NOW + 1_000, CONFIG).plan_ids  # the first plan's files are leased
    _run_groups(catalog, second)  # the first plan's groups never ran
    summary = commit_plans(catalog, [first, second], NOW + 2_000, keep_going=True)
    assert summary.committed == [second] and summary.conflicts == [
        f"plan {first}: no result for group(s) 0; run those groups, then commit"
    ]
    assert summary.describe()[-1] == f"not committed: {summary.conflicts[0]}"
    with pytest.raises(CommitConflictError, match=f"plan {first}: no result for group"):  # without keep_going
        commit_plans(catalog, [first], NOW + 2_000)
    _run_groups(catalog, first)
    again = commit_plans(catalog, [first, second], NOW + 3_000)
    assert (again.committed, again.already_committed, again.conflicts) == ([first], [second], [])


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
    # Its seal went with its lease, when the newer plan took its files over.
    with pytest.raises(CommitConflictError, match=r"plan \S+ holds no lease with a seal of its documents \(expired or never leased\)"):
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
    # The outputs are judged only after a commit the catalog made later than them (by more than clocks may differ).
    wall_clock = int(time.time() * 1000)
    produce_l0_files(catalog, "accounts", files=1, records=1, keys=1, partitions=1, now=wall_clock + 600_000)
    after = collect_garbage(catalog, wall_clock + 600_001, grace_ms=0)  # objects carry wall-clock times
    assert after.released_leases == [plan_id] and not catalog.snapshot().leases(NOW)
    assert sorted(after.deleted_files) == outputs and plan_key(plan_id) in after.deleted_plans
    assert len(catalog.snapshot().file_summaries()) == 6  # the inputs stay live, beside the later L0 file


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
    def failing_write(store, documents):
        raise OSError("disk full")

    monkeypatch.setattr("logcompact.jobs.prepare.write_documents", failing_write)
    with pytest.raises(OSError, match="disk full"):
        prepare_plans(catalog, "full", NOW, CONFIG)
    assert not catalog.snapshot().leases(NOW)
    with catalog.engine.connect() as connection:  # nor a seal
        assert connection.execute(select(schema.plan_seals)).all() == []


def test_a_run_leases_all_its_plans_or_none(catalog: Catalog, monkeypatch) -> None:
    # Two plans of one run; another scheduler leases a file of the second between planning and leasing.
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full", CONFIG)
    first = replace(sweep, plan_id="p-first", inputs=sweep.inputs[:2])
    second = replace(sweep, plan_id="p-second", inputs=sweep.inputs[2:])
    monkeypatch.setattr("logcompact.jobs.prepare.choose_plans", lambda *args: [first, second])
    catalog.lease("p-other", [sweep.inputs[4].key], NOW + CONFIG.lease_ms, NOW)
    with pytest.raises(CommitConflictError, match=f"file {sweep.inputs[4].key} is leased to plan p-other"):
        prepare_plans(catalog, "full", NOW, CONFIG)
    assert {lease.plan_id for lease in catalog.snapshot().leases(NOW).values()} == {"p-other"}
    assert not list(catalog.store.list("plans/"))  # no plan written


def _without_sketches(found: Plan) -> Plan:
    """The plan as stored: sections without the key sketches only the planner reads."""
    inputs = tuple(replace(f, sections=tuple(s._replace(info=s.info._replace(key_sketch=b"")) for s in f.sections)) for f in found.inputs)
    return replace(found, inputs=inputs)


def test_a_stored_plan_is_a_header_and_a_document_per_group(catalog: Catalog) -> None:
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full", replace(CONFIG, group_bytes=1))  # a group per partition
    assert len(sweep.groups) == 3 and any(s.info.key_sketch for f in sweep.inputs for s in f.sections)
    written = write_plan(catalog.store, sweep)
    keys = [plan_key(sweep.plan_id), inputs_key(sweep.plan_id), *(group_key(sweep.plan_id, g) for g in range(3))]
    assert sorted(info.key for info in catalog.store.list("plans/")) == sorted(keys)
    assert written == sum(catalog.store.stat(key).size for key in keys)
    header = read_header(catalog.store, sweep.plan_id)
    assert header == sweep.header() and [f.key for f in header.inputs] == [f.key for f in sweep.inputs]
    assert read_plan(catalog.store, sweep.plan_id) == _without_sketches(sweep)  # the whole plan put back together
    for group in sweep.groups:  # each group's document holds that group's sections only
        assert read_group(catalog.store, sweep.plan_id, group.group) == _without_sketches(sweep.piece(group.group))
    (tp,) = read_partition_bytes(catalog.store, sweep.plan_id, 1)
    assert tp == sweep.groups[1].first == ("accounts", 1)
    sliced = read_group(catalog.store, sweep.plan_id, 1, partitions=[tp, ("accounts", 0)], slice=4)  # ("accounts", 0) is group 0's
    assert sliced.slice == 4 and {(s.topic, s.partition) for f in sliced.inputs for s in f.sections} == {tp}
    assert sliced.outside_floors == {} and sliced.output_key("compacted", 0).endswith("-g001-s004-compacted-0000.seg")
    read_plan(catalog.store, sweep.plan_id).check_against(catalog.snapshot(), NOW)  # as the catalog lists them, sketches aside


def test_stored_plan_documents_that_do_not_check_out_are_one_line_errors(catalog: Catalog) -> None:
    (sweep,) = choose_plans(catalog.snapshot(), NOW, "full", CONFIG)
    store, plan_id = catalog.store, sweep.plan_id
    write_plan(store, sweep)
    header = json.loads(store.get(plan_key(plan_id)))

    def fails(key: str, data: bytes, reader, message: str) -> None:
        good = store.get(key)
        store.put(key, data)
        with pytest.raises(InvalidPlanError, match=message) as failure:
            reader()
        assert "\n" not in str(failure.value)
        store.put(key, good)

    def as_json(document: dict) -> bytes:
        return json.dumps(document).encode()

    def arrow(table: pa.Table) -> bytes:
        sink = pa.BufferOutputStream()
        with pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes()

    header_of = lambda: read_header(store, plan_id)  # noqa: E731
    fails(plan_key(plan_id), as_json({**header, "format": 1}), header_of, "plan format 1 is not supported")
    fails(plan_key(plan_id), as_json({**header, "target_level": 9}), header_of, "'target_level' is 9: must be an integer, 1 to 4")
    fails(plan_key(plan_id), as_json({**header, "mode": "weekly"}), header_of, "mode 'weekly' is not one of")
    two = [{**header["groups"][0], "last": ["accounts", 0]}, {**header["groups"][0], "group": 1, "first": ["accounts", 0]}]
    fails(plan_key(plan_id), as_json({**header, "groups": two}), header_of, r"group 1 starts at \('accounts', 0\), within group 0")
    fails(plan_key(plan_id), b"{nope", header_of, "not JSON")
    inputs = pa.ipc.open_file(store.get(inputs_key(plan_id))).read_all()
    fails(inputs_key(plan_id), b"not arrow", header_of, "not an Arrow document of a plan")
    # A plan of another format says so, whatever its input list holds: plan.json is read first.
    stored_header = store.get(plan_key(plan_id))
    store.put(plan_key(plan_id), as_json({**header, "format": 2}))
    fails(inputs_key(plan_id), b"not arrow", header_of, "plan format 2 is not supported")
    store.put(plan_key(plan_id), stored_header)
    cluster_of = lambda: read_cluster_id(store, plan_id)  # noqa: E731
    fails(plan_key(plan_id), as_json({k: v for k, v in header.items() if k != "cluster_id"}), cluster_of, "plan field 'cluster_id' is missing; plan again")
    fails(plan_key(plan_id), as_json({**header, "cluster_id": 7}), cluster_of, "'cluster_id' must be a non-empty string")
    fails(plan_key(plan_id), as_json({**header, "format": 2}), cluster_of, "plan format 2 is not supported")
    fails(inputs_key(plan_id), arrow(inputs.drop_columns(["size"])), header_of, "column 'size' is missing")
    moved = inputs.set_column(0, "key", pa.array(["../etc/passwd", *inputs.column("key").to_pylist()[1:]]))
    fails(inputs_key(plan_id), arrow(moved), header_of, r"input '../etc/passwd' is not a data file of level 0 \(data/l0/NAME.seg\)")

    group_of = lambda: read_group(store, plan_id, 0)  # noqa: E731
    document = pa.ipc.open_file(store.get(group_key(plan_id, 0))).read_all()
    retyped = document.set_column(document.schema.get_field_index("record_count"), "record_count", document.column("record_count").cast(pa.string()))
    fails(group_key(plan_id, 0), arrow(retyped), group_of, "column 'record_count' is of type string, expected int64")
    fails(group_key(plan_id, 0), arrow(document.replace_schema_metadata({})), group_of, "has no logcompact.plan metadata")
    metadata = json.loads(document.schema.metadata[GROUP_METADATA_KEY])
    unknown = document.replace_schema_metadata({GROUP_METADATA_KEY: json.dumps({**metadata, "topics": []})})
    fails(group_key(plan_id, 0), arrow(unknown), group_of, "holds topic 'accounts', which the plan does not describe")
    beyond = document.set_column(0, "file", pa.array([99] * document.num_rows, pa.int32()))
    fails(group_key(plan_id, 0), arrow(beyond), group_of, "a section names file 99, beyond the plan's 5 inputs")
    with pytest.raises(ObjectNotFoundError, match=f"plan {plan_id} has no group 1 in .* \\(expected plans/{plan_id}/groups/g001.arrow\\)"):
        read_group(store, plan_id, 1)
    with pytest.raises(ObjectNotFoundError, match="no plan p-none"):
        read_header(store, "p-none")


def test_each_topic_reports_its_own_figures_and_they_add_up_to_the_plan(catalog: Catalog) -> None:
    create_topic(catalog, "clicks", partitions=2, cleanup_policy="delete")
    produce_l0_files(catalog, "clicks", files=4, records=40, keys=5, partitions=2)
    prepared = prepare_plans(catalog, "full", NOW, PlannerConfig(group_bytes=1))
    (plan_id,) = prepared.plan_ids
    _run_groups(catalog, plan_id)
    summary = commit_plans(catalog, [plan_id], NOW)

    accounts, clicks = summary.topic_stats["accounts"], summary.topic_stats["clicks"]
    assert (accounts["partitions"], accounts["records_in"]) == (3, 300) and accounts["duplicates_removed"] > 0
    # A delete topic keeps every record: nothing of the compacted topic's removals is put down to it.
    assert (clicks["partitions"], clicks["records_in"], clicks["records_out"], clicks["duplicates_removed"]) == (2, 160, 160, 0)
    plan = summary.stats[plan_id]
    for name in ("records_in", "records_out", "duplicates_removed", "tombstones_removed", "expired_removed"):
        assert accounts[name] + clicks[name] == plan[name], name
    assert 0 < accounts["uncompressed_bytes_out"] < accounts["uncompressed_bytes_in"]
    lines = summary.describe()
    assert lines[0] == (
        f"committed 1 plan(s): {plan_id} ({mib(plan['bytes_in'])} of input files stored, {mib(plan['bytes_out'])} written); "
        f"manifest version {summary.manifest_version}"
    )
    assert commit_plans(catalog, [plan_id], NOW).describe()[0] == (  # a retried commit
        f"committed no plan; committed before (a retry): {plan_id}; manifest version {summary.manifest_version}"
    )
    header = next(n for n, line in enumerate(lines) if line.startswith("topic "))
    assert lines[header + 1].split()[:5] == ["accounts", "3", "300", f"{accounts['records_out']:,}", f"{accounts['duplicates_removed']:,}"]
    assert lines[header + 2].split()[:5] == ["clicks", "2", "160", "160", "0"]
