"""The Spark application: its per-slice logic without Spark (on both catalog databases), then real
spark-submits: local[2] with the catalog on PostgreSQL, and a standalone cluster (a master and a worker on
127.0.0.1:7077) with the embedded SQLite. The application is given the store alone: it never opens the
catalog."""

from __future__ import annotations

import random
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from logcompact.catalog import Catalog
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS
from logcompact.consume import read_records
from logcompact.exceptions import CommitConflictError
from logcompact.ingest import Agent, Record
from logcompact.jobs import GroupSlice, commit_plans, deal_slices, prepare_plans, run_group, run_task
from logcompact.planner import PlannerConfig
from logcompact.plans import Plan, group_done, read_partition_bytes, read_plan
from logcompact.store import LocalStore
from spark_apps.compact_group import main
from tests.helpers import NOW, TasksByUri, create_topic
from tests.support.spark_cluster import spark_environment, standalone_cluster

APP = Path(__file__).resolve().parents[1] / "spark_apps" / "compact_group.py"


def _cluster(catalog: Catalog, partitions: int = 6) -> Catalog:
    create_topic(catalog, "t", partitions=partitions, cleanup_policy="compact")
    for round_ in range(3):
        with Agent(catalog, background=False) as agent:
            agent.produce("t", [Record(i % partitions, b"k%d" % (i % 30), b"%d" % round_, NOW) for i in range(300)])
    return catalog


def _latest(catalog: Catalog, partitions: int) -> dict[bytes, bytes]:
    snapshot = catalog.snapshot()
    return {r.key: r.value for p in range(partitions) for r in read_records(catalog.store, snapshot, "t", p)}


def _leased_sweep(catalog: Catalog) -> Plan:
    """A full sweep planned as the DAGs plan it: files leased, plan written to the store."""
    (plan_id,) = prepare_plans(catalog, "full", NOW, PlannerConfig()).plan_ids
    return read_plan(catalog.store, plan_id)


def test_slices_share_a_group_by_bytes_and_commit_together(catalog: Catalog) -> None:
    catalog = _cluster(catalog)
    sweep = _leased_sweep(catalog)
    sizes = read_partition_bytes(catalog.store, sweep.plan_id, 0)
    assert sorted(sizes) == [("t", p) for p in range(6)] and sum(sizes.values()) == sweep.groups[0].bytes
    slices = deal_slices(sizes, 4)
    assert [n for n, _ in slices] == [0, 1, 2, 3] and sorted(tp for _, tps in slices for tp in tps) == sorted(sizes)
    with pytest.raises(CommitConflictError, match="no result for group"):
        commit_plans(catalog, [sweep.plan_id], NOW)
    results = run_group(catalog.store, sweep.plan_id, 0, slices=4, mapper=TasksByUri())
    assert results is not None and len({f.key for r in results for f in r.outputs}) == 4  # one output a slice, named apart
    assert {f.key.split("-")[-3] for r in results for f in r.outputs} == {"s000", "s001", "s002", "s003"}
    assert commit_plans(catalog, [sweep.plan_id], NOW).committed == [sweep.plan_id]
    assert _latest(catalog, 6) == {b"k%d" % k: b"2" for k in range(30)}
    assert commit_plans(catalog, [sweep.plan_id], NOW).already_committed == [sweep.plan_id]  # a retry


def test_a_slice_reports_the_bytes_of_its_own_partitions(catalog: Catalog) -> None:
    # Two partitions of 2 MB of incompressible values in one file: each slice reads its half, not the file.
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    values = random.Random(1)
    with Agent(catalog, background=False) as agent:
        agent.produce("t", [Record(i % 2, b"k%d" % i, values.randbytes(100_000), NOW) for i in range(40)])
    sweep = _leased_sweep(catalog)
    file_bytes = sum(f.size for f in sweep.inputs)
    read = [r.stats.bytes_in for r in run_group(catalog.store, sweep.plan_id, 0, slices=2, mapper=TasksByUri()) or []]
    assert len(read) == 2 and all(0.45 * file_bytes < n < 0.55 * file_bytes for n in read), (read, file_bytes)


def test_slices_are_dealt_by_bytes_biggest_first() -> None:
    sizes = {("t", 0): 50, ("t", 1): 40, ("t", 2): 30, ("t", 3): 20, ("u", 0): 10}
    assert deal_slices(sizes, 2) == [(0, [("t", 0), ("t", 3), ("u", 0)]), (1, [("t", 1), ("t", 2)])]
    assert deal_slices(sizes, 9) == [(n, [tp]) for n, tp in enumerate(sorted(sizes, key=lambda tp: -sizes[tp]))]
    assert deal_slices({("t", 0): 1}, 0) == [(0, [("t", 0)])]


def test_a_missing_group_is_a_one_line_exit(catalog: Catalog) -> None:
    catalog = _cluster(catalog)
    sweep = _leased_sweep(catalog)
    with pytest.raises(SystemExit, match=rf"compact_group: plan {sweep.plan_id} has no group 1 in \S+ \(expected plans/{sweep.plan_id}/groups/g001.arrow\); plan again"):
        main([f"--store={catalog.store.uri}", f"--plan-id={sweep.plan_id}", "--group=1"])


def test_a_group_counts_as_done_only_with_all_its_outputs(catalog: Catalog) -> None:
    catalog = _cluster(catalog)
    sweep = _leased_sweep(catalog)
    assert not group_done(catalog.store, sweep.plan_id, 0)
    results = run_group(catalog.store, sweep.plan_id, 0, slices=2, mapper=TasksByUri())
    assert results is not None and group_done(catalog.store, sweep.plan_id, 0)
    assert run_group(catalog.store, sweep.plan_id, 0) is None  # a retry after a success runs nothing
    catalog.store.delete(results[1].outputs[0].key)  # collected by gc after an expired lease
    assert not group_done(catalog.store, sweep.plan_id, 0)  # so a retried task runs the group again
    again = run_group(catalog.store, sweep.plan_id, 0, slices=2, mapper=TasksByUri())
    assert again is not None and [f.key for r in again for f in r.outputs] == [f.key for r in results for f in r.outputs]
    assert group_done(catalog.store, sweep.plan_id, 0)


def test_a_group_runs_only_against_its_own_clusters_store(catalog: Catalog, tmp_path) -> None:
    catalog = _cluster(catalog)
    sweep = _leased_sweep(catalog)
    other = Catalog(LocalStore(tmp_path / "other"))
    create_topic(other, "t")  # another cluster, holding a copy of the plan's documents
    for info in catalog.store.list(f"plans/{sweep.plan_id}/"):
        other.store.put(info.key, catalog.store.get(info.key))
    before = sorted(info.key for info in other.store.list(""))
    with pytest.raises(SystemExit, match=rf"compact_group: plan {sweep.plan_id} is of cluster \S+ but store \S+ belongs to cluster \S+: run it against"):
        main([f"--store={other.store.uri}", f"--plan-id={sweep.plan_id}", "--group=0"])
    assert sorted(info.key for info in other.store.list("")) == before  # nothing written, Spark never started


def test_spark_submit_runs_a_group_with_local_spark(tmp_path, make_catalog_url) -> None:
    """A full sweep's group on local Spark, its inputs holding an aborted transaction's newer values of two keys: the
    job drops them by the plan's aborted ranges (it never reads the catalog), so the committed values stay."""
    catalog = _cluster(Catalog(LocalStore(tmp_path / "store"), make_catalog_url("postgresql")))
    producer_id, epoch = catalog.init_producer("app", 60_000, MAX_TIMEOUT_MS, None, NOW)
    catalog.add_to_transaction("app", producer_id, epoch, [("t", 0)], NOW)
    with Agent(catalog, background=False) as agent:
        agent.produce("t", [Record(0, key, b"aborted", NOW) for key in (b"k0", b"k6")], SequencedBatch(producer_id, epoch, 0, 1, None, True))
    catalog.end_transaction("app", producer_id, epoch, False, NOW)
    sweep = _leased_sweep(catalog)
    assert len(sweep.groups) == 1 and sweep.aborted
    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent))
    done = subprocess.run(
        [spark_submit, "--master", "local[2]", str(APP), "--store", catalog.store.uri, "--plan-id", sweep.plan_id,
         "--group", "0", "--slices", "2"],
        capture_output=True, text=True, env=spark_environment(), timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    # The log says what the job did, a line per slice and the group's totals, and Spark's INFO lines are gone.
    lines = [line for line in done.stdout.splitlines() if line.startswith("compact_group: ")]
    assert len(lines) == 3 and all(re.search(rf"plan {sweep.plan_id} group 0 > L2: [\d,]+ records in", line) for line in lines[:2])
    assert re.match(
        r"compact_group: group 0 done in 2 slice\(s\): 902 records in, 30 out; [\d.]+ MiB of its sections' stored blocks read \([\d.]+ MiB uncompressed\), "
        r"[\d.]+ MiB stored written .* GETs", lines[2],
    ), lines[2]
    assert done.stderr.count(" INFO ") <= 3, done.stderr[:3000]  # those before the SparkContext applies the level
    assert not (tmp_path / "store" / "catalog.db").exists()  # the application made no catalog of its own
    assert commit_plans(catalog, [sweep.plan_id], NOW).committed == [sweep.plan_id]
    snapshot = catalog.snapshot()
    assert [f.level for f in snapshot.file_summaries()] == [2, 2]  # two slices
    assert _latest(catalog, 6) == {b"k%d" % k: b"2" for k in range(30)}
    assert sum(1 for p in range(6) for _ in read_records(catalog.store, snapshot, "t", p)) == 30


def test_spark_submit_runs_a_group_on_a_standalone_cluster(tmp_path) -> None:
    catalog = _cluster(Catalog(LocalStore(tmp_path / "store")))
    sweep = _leased_sweep(catalog)
    spark_submit = shutil.which("spark-submit", path=str(Path(sys.executable).parent))
    with standalone_cluster(tmp_path) as master:
        done = subprocess.run(
            [spark_submit, "--master", master, str(APP), f"--store={catalog.store.uri}", f"--plan-id={sweep.plan_id}",
             "--group=0", "--slices=3"],
            capture_output=True, text=True, env=spark_environment(), timeout=300,
        )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"Registering app logcompact {sweep.plan_id} group 0" in (tmp_path / "spark-master.log").read_text()
    assert commit_plans(catalog, [sweep.plan_id], NOW).committed == [sweep.plan_id]
    assert len(catalog.snapshot().file_summaries()) == 3  # three slices, each on an executor of the cluster
    assert _latest(catalog, 6) == {b"k%d" % k: b"2" for k in range(30)}


def test_what_a_task_is_sent_does_not_grow_with_the_plan(catalog: Catalog) -> None:
    from pyspark import cloudpickle  # how Spark sends a task its function

    small = _leased_sweep(_cluster(catalog, partitions=2))
    create_topic(catalog, "u", partitions=60, cleanup_policy="compact")
    with Agent(catalog, background=False) as agent:
        agent.produce("u", [Record(i % 60, b"k%d" % i, b"v", NOW) for i in range(6000)])
    large = _leased_sweep(catalog)  # the small plan's files are leased to it: this plan takes the others
    assert sum(len(f.sections) for f in large.inputs) == 10 * sum(len(f.sections) for f in small.inputs)
    # A task is sent the function every task runs and its GroupSlice: a slice of one partition, of either plan.
    sent = [len(cloudpickle.dumps((run_task, GroupSlice(catalog.store.uri, p.plan_id, 0, 0, [p.groups[0].first])))) for p in (small, large)]
    assert sent[0] == sent[1] < 2000
