"""The DAGs as Airflow runs them: integrity, then `dag.test()` runs with Spark in local mode on small data.

Every run is made on the embedded SQLite catalog. The compaction DAG end to end, a failed group and gc run on
PostgreSQL too (the catalog named in the connection's extra); the max-lag and full-sweep DAGs differ from the
compaction DAG only in their planner mode, which the planner and job tests run on both databases.
Each compaction run submits real Spark jobs (about 10 s each here), so there are few of them.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from logcompact.catalog import Catalog
from logcompact.consume import latest_values
from tests.helpers import create_topic, produce_l0_files
from tests.support.dags import load_dags, task_instances, task_states, without_retries

EXPECTED_TASKS = {
    "logcompact_compaction": {
        "wait_for_files": set(), "plan": {"wait_for_files"}, "compact_group": {"plan"}, "commit": {"plan", "compact_group"},
        "uncleanable_partitions": {"commit"}, "dry_run": {"plan"},
    },
    "logcompact_max_lag_hourly": {
        "plan": set(), "compact_group": {"plan"}, "commit": {"plan", "compact_group"}, "uncleanable_partitions": {"commit"},
        "dry_run": {"plan"},
    },
    "logcompact_full_sweep_daily": {
        "plan": set(), "compact_group": {"plan"}, "commit": {"plan", "compact_group"}, "uncleanable_partitions": {"commit"},
        "dry_run": {"plan"},
    },
    "logcompact_gc": {"collect_garbage": set()},
    "logcompact_metrics": {"cleaner_metrics": set()},
}
HOUR_MS = 3_600_000
# The runs that also go through a PostgreSQL catalog (the `airflow_catalog` fixture's default is SQLite).
ON_BOTH_DATABASES = pytest.mark.parametrize("airflow_catalog", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture(scope="module")
def dagbag():
    return load_dags()


def _now_ms() -> int:
    return int(time.time() * 1000)


def _asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        return [
            event.extra
            for event in session.query(AssetEvent).join(AssetModel, AssetModel.id == AssetEvent.asset_id).filter(AssetModel.uri == uri)
        ]


def _latest(catalog: Catalog, topic: str, partitions: int) -> dict[bytes, bytes]:
    snapshot = catalog.snapshot()
    found = {}
    for partition in range(partitions):
        view = latest_values(catalog.store, snapshot, topic, partition)
        found.update(zip(view.column("key").to_pylist(), view.column("value").to_pylist()))
    return found


def _levels(catalog: Catalog) -> set[int]:
    return {f.level for f in catalog.snapshot().file_summaries()}


def _objects(catalog: Catalog) -> list[str]:
    """The store's data files and plan documents (a SQLite catalog's own files sit beside them)."""
    return sorted(info.key for prefix in ("data/", "plans/") for info in catalog.store.list(prefix))


def test_dags_import_with_the_expected_structure() -> None:
    dagbag = load_dags()  # as written, before any test lowers retries
    assert dagbag.import_errors == {}
    assert sorted(dagbag.dags) == sorted(EXPECTED_TASKS)
    for dag_id, tasks in EXPECTED_TASKS.items():
        dag = dagbag.dags[dag_id]
        assert {t.task_id: set(t.upstream_task_ids) for t in dag.tasks} == tasks
        # The compaction DAG lets a manual run start beside a scheduled run whose sensor waits.
        assert dag.max_active_runs == (2 if dag_id == "logcompact_compaction" else 1)
        assert "logcompact" in dag.tags and dag.doc_md.lstrip().startswith(f"# {dag_id}")
        assert "Settings: **Admin > Connections** `logcompact_default`" in dag.doc_md  # where its settings live
        assert dag.catchup is False
        for task in dag.tasks:
            # A check that reports the catalog's state has nothing to gain from a retry.
            retries = 0 if task.task_id == "uncleanable_partitions" else 2
            assert (task.owner, task.retries, task.pool) == ("data-platform", retries, "logcompact")
    compaction = dagbag.dags["logcompact_compaction"]
    assert compaction.get_task("wait_for_files").mode == "reschedule"
    assert compaction.get_task("compact_group").map_index_template == "{{ task.name }}"
    assert set(compaction.params) == {"dry_run", "buffer_bytes", "force"}
    # What a forced pass does, where an operator triggering one reads it.
    assert "L0 is copied to L1, not deduplicated" in compaction.params.get_param("force").description
    assert all(f"- **{action}**" in compaction.doc_md for action in ("copy", "deduplicate", "rewrite"))
    sweep_params = dagbag.dags["logcompact_full_sweep_daily"].params
    assert set(sweep_params) == {"dry_run", "buffer_bytes", "topics"}
    # The trigger form marks a param required unless its type allows null.
    for name in ("topics", "buffer_bytes"):
        assert "null" in sweep_params.get_param(name).schema["type"] and sweep_params[name] is None


@ON_BOTH_DATABASES
def test_compaction_dag_compacts_l0_through_spark_and_publishes_asset_events(dagbag, airflow_catalog: Catalog) -> None:
    catalog = airflow_catalog
    create_topic(catalog, "accounts", partitions=2, now=_now_ms(), cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=33, records=20, keys=40, partitions=2, now=_now_ms())
    expected = _latest(catalog, "accounts", 2)

    run = without_retries(dagbag, "logcompact_compaction").test()

    assert str(run.state) == "success", task_states("logcompact_compaction", run.run_id)
    instances = task_instances("logcompact_compaction", run.run_id)

    assert str(instances[("dry_run", -1)].state) == "skipped"
    assert _levels(catalog) == {1} and not catalog.snapshot().leases(_now_ms())
    assert _latest(catalog, "accounts", 2) == expected
    (event,) = _asset_events(f"logcompact://{catalog.cluster_id}/accounts")
    assert event["records_in"] == event["records_out"] == 660 and event["partitions"] == 2 and len(event["plans"]) == 1
    (plan_id,) = event["plans"]
    assert re.fullmatch(rf"{plan_id[-12:]} g0 of 1: accounts/0-1 L0>L1, 0\.\d{{3}} MiB uncompressed", instances[("compact_group", 0)].rendered_map_index)


def test_a_forced_compaction_runs_at_once_below_the_thresholds(dagbag, airflow_catalog: Catalog, capfd) -> None:
    catalog = airflow_catalog
    create_topic(catalog, "accounts", partitions=1, now=_now_ms(), cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=2, records=10, keys=5, partitions=1, now=_now_ms())
    expected = _latest(catalog, "accounts", 1)

    started = time.monotonic()
    run = without_retries(dagbag, "logcompact_compaction").test(run_conf={"force": True})

    assert str(run.state) == "success", task_states("logcompact_compaction", run.run_id)
    assert time.monotonic() - started < 60  # the sensor did not wait out its poke interval
    assert task_states("logcompact_compaction", run.run_id)["compact_group[0]"] == "success"
    assert _levels(catalog) == {1} and _latest(catalog, "accounts", 1) == expected
    # The plan task's log says what the forced pass does with fresh L0 files: a copy, nothing deduplicated.
    log = capfd.readouterr().out
    assert re.search(r"leased plan \S+: copy 2 files \(L0 2\) > L1: .* 20 records in; copied as they are: no level below L2 is deduplicated", log), log[-3000:]


def test_max_lag_dag_compacts_what_became_dirty(dagbag, airflow_catalog: Catalog) -> None:
    catalog = airflow_catalog
    three_hours_ago = _now_ms() - 3 * HOUR_MS
    create_topic(catalog, "orders", partitions=2, now=three_hours_ago, cleanup_policy="compact", max_compaction_lag_ms=str(2 * HOUR_MS))
    produce_l0_files(catalog, "orders", files=3, records=40, keys=10, partitions=2, now=three_hours_ago)

    run = without_retries(dagbag, "logcompact_max_lag_hourly").test(run_conf={"topics": ["orders"]})

    assert str(run.state) == "success", task_states("logcompact_max_lag_hourly", run.run_id)
    summaries = catalog.snapshot().file_summaries()
    assert {f.level for f in summaries} == {2}
    assert sum(f.record_count for f in summaries) == 10  # one record per key


def test_full_sweep_dry_run_changes_nothing_then_a_run_deduplicates(dagbag, airflow_catalog: Catalog) -> None:
    catalog = airflow_catalog
    create_topic(catalog, "accounts", partitions=2, now=_now_ms(), cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=4, records=50, keys=25, partitions=2, now=_now_ms(), tombstone_every=9)
    expected, before, version = _latest(catalog, "accounts", 2), _objects(catalog), catalog.latest_version()
    dag = without_retries(dagbag, "logcompact_full_sweep_daily")

    dry = dag.test(run_conf={"dry_run": True, "topics": ["accounts"]})
    assert str(dry.state) == "success"
    assert task_states(dag.dag_id, dry.run_id) == {  # the dry_run task marks the run in the grid
        "plan": "success", "dry_run": "success", "compact_group": "skipped", "commit": "skipped", "uncleanable_partitions": "success",
    }
    assert _objects(catalog) == before and catalog.latest_version() == version and not catalog.snapshot().leases(_now_ms())

    # dag.test() keeps a run's conf in the DAG object's params: every key is given again.
    run = dag.test(run_conf={"dry_run": False, "topics": None, "buffer_bytes": 4 * 1024**2})
    assert str(run.state) == "success", task_states(dag.dag_id, run.run_id)
    assert task_states(dag.dag_id, run.run_id)["dry_run"] == "skipped"
    assert _levels(catalog) == {2} and _latest(catalog, "accounts", 2) == expected


def test_bad_params_are_refused_before_anything_runs(dagbag, airflow_catalog: Catalog) -> None:
    from airflow.exceptions import ParamValidationError

    dag = without_retries(dagbag, "logcompact_full_sweep_daily")
    with pytest.raises(ParamValidationError, match="buffer_bytes"):
        dag.test(run_conf={"buffer_bytes": 5})
    with pytest.raises(ParamValidationError, match="topics"):
        dag.test(run_conf={"topics": "accounts"})


@ON_BOTH_DATABASES
def test_a_failed_group_fails_the_run_without_a_commit(dagbag, airflow_catalog: Catalog) -> None:
    catalog = airflow_catalog
    create_topic(catalog, "accounts", partitions=1, now=_now_ms(), cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=2, records=10, keys=5, partitions=1, now=_now_ms())
    keys = {f.key for f in catalog.snapshot().file_summaries()}
    (catalog.store.root / min(keys)).unlink()  # not damage a partition can be set aside for: the object is gone
    version = catalog.latest_version()

    run = without_retries(dagbag, "logcompact_full_sweep_daily").test()

    assert str(run.state) == "failed"
    assert task_states("logcompact_full_sweep_daily", run.run_id) == {
        "plan": "success", "dry_run": "skipped", "compact_group[0]": "failed", "commit": "upstream_failed",
        "uncleanable_partitions": "upstream_failed",
    }
    # Nothing committed: the files stay live on L0, leased to the plan until its lease expires.
    assert catalog.latest_version() == version and _levels(catalog) == {0}
    assert catalog.snapshot().leased_files(_now_ms()) == keys


def test_a_damaged_partition_is_set_aside_the_rest_commits_and_the_run_shows_it(dagbag, airflow_catalog: Catalog) -> None:
    from sqlalchemy import update

    from logcompact.catalog import schema

    catalog = airflow_catalog
    create_topic(catalog, "accounts", partitions=2, now=_now_ms(), cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=3, records=40, keys=10, partitions=2, now=_now_ms())
    expected = _latest(catalog, "accounts", 1)  # partition 0's
    with catalog.engine.begin() as connection:  # the catalog's record of one section of partition 1 no longer matches
        connection.execute(update(schema.sections).where(schema.sections.c.partition == 1).values(crc32=0))

    run = without_retries(dagbag, "logcompact_full_sweep_daily").test()

    assert task_states("logcompact_full_sweep_daily", run.run_id) == {
        "plan": "success", "dry_run": "skipped", "compact_group[0]": "success", "commit": "success", "uncleanable_partitions": "failed",
    }
    assert [(m.topic, m.partition) for m in catalog.uncleanable()] == [("accounts", 1)]
    assert _latest(catalog, "accounts", 1) == expected
    assert {f.level for f in catalog.snapshot().file_summaries()} == {0, 2}  # partition 1 stays in its L0 files


@ON_BOTH_DATABASES
def test_gc_dag_collects(dagbag, airflow_catalog: Catalog) -> None:
    catalog = airflow_catalog
    create_topic(catalog, "accounts", partitions=1, now=_now_ms(), cleanup_policy="compact")
    leftover = "data/l2/p1700000000000-0123456789ab-g000-s000-compacted-0000.seg"  # of a plan that never committed
    catalog.store.put(leftover, b"left by a job that never committed")
    two_hours_ago = time.time() - 2 * 3600  # past the 1 h grace
    os.utime(catalog.store.root / leftover, (two_hours_ago, two_hours_ago))

    run = without_retries(dagbag, "logcompact_gc").test()

    assert str(run.state) == "success"
    assert _objects(catalog) == []
