"""Spark application: run one group of a compaction plan, its topic-partitions spread over Spark tasks.

    spark-submit --master local[2] spark_apps/compact_group.py \
        --store file:///path/to/store --plan-id p1700000000000-abc123def456 --group 0 --slices 2

The plan is in the store, split into groups by the planner that made it; the group's document
(`plans/{plan_id}/groups/g{group}.arrow`) holds the group's sections. The driver reads the bytes per
partition from it and deals the partitions into `--slices` slices of about equal bytes. Each Spark task is
sent the store, the plan id, the group, its slice number and its partitions (what a task is sent does not
grow with the plan), reads its slice of the group document itself, runs the engine on it (every input file
read through at most two streaming GETs per task), writes its output files to the store and returns only
their metadata and stats. The driver writes the group's result next to the plan
(`plans/{plan_id}/results/g{group}.json`); the commit step (`logcompact.jobs.commit_plans`) commits
the plan once every group has its result. No record data is collected on the driver. A group whose result
and outputs are already in the store (a retried task after a success) is not run again. Neither the driver
nor the tasks open the catalog database: the plan carries its input files' sections, so the store is all
they need (on a cluster, only its credentials).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable, Iterator

from logcompact.catalog.identity import check_store_cluster
from logcompact.engine.stats import JobResult, summarize
from logcompact.exceptions import LogcompactError
from logcompact.jobs import deal_slices, run_slice
from logcompact.jobs.documents import group_done, read_header, read_partition_bytes, write_group_result
from logcompact.plan import TopicPartition
from logcompact.store import open_store


def compact_slices(store_uri: str, plan_id: str, group: int, slices: Iterable[tuple[int, list[TopicPartition]]]) -> Iterator[dict]:
    """The per-task logic, plain Python: run each slice of the group (`logcompact.jobs.run_slice`) and yield its
    result (metadata only)."""
    store = open_store(store_uri)
    for number, partitions in slices:
        yield run_slice(store, plan_id, group, number, partitions).to_dict()


def slice_task(store_uri: str, plan_id: str, group: int) -> Callable[[Iterable[tuple[int, list[TopicPartition]]]], Iterator[dict]]:
    """The function every Spark task of the group runs over its slices: it carries the store, the plan id and the
    group number, nothing of the plan itself."""
    return lambda slices: compact_slices(store_uri, plan_id, group, slices)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="file:///path or s3://bucket/prefix")
    parser.add_argument("--plan-id", required=True)
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--slices", type=int, default=0, help="Spark tasks for the group (default: the default parallelism)")
    args = parser.parse_args(argv)

    store = open_store(args.store)
    try:
        check_store_cluster(store, read_header(store, args.plan_id).cluster_id, f"plan {args.plan_id}")
        sizes = read_partition_bytes(store, args.plan_id, args.group)
    except LogcompactError as exc:
        raise SystemExit(f"compact_group: {exc}") from None
    if group_done(store, args.plan_id, args.group):
        print(f"compact_group: plan {args.plan_id} group {args.group} already has its result; nothing to redo")
        return

    # A plain SparkContext: the job uses no SQL, and a SparkSession would only add to start-up. It is not
    # stopped here: spark-submit's JVM stops it as it exits (Spark's shutdown hook), whereas PySpark's
    # stop() first waits about a second for its accumulator server to notice.
    from pyspark import SparkConf, SparkContext

    # Spark's own INFO lines would bury the job's (the task log of an Airflow run is this process's output).
    conf = SparkConf().setAppName(f"logcompact {args.plan_id} group {args.group}")
    conf.setIfMissing("spark.log.level", "WARN").setIfMissing("spark.ui.showConsoleProgress", "false")
    context = SparkContext.getOrCreate(conf)
    slices = deal_slices(sizes, args.slices or context.defaultParallelism)
    results = [JobResult.from_dict(r) for r in context.parallelize(slices, len(slices)).mapPartitions(slice_task(args.store, args.plan_id, args.group)).collect()]
    write_group_result(store, args.plan_id, args.group, results)
    report(results)


def report(results: list[JobResult]) -> None:
    """The group's figures on the driver's output, which is the Airflow task's log: a line per slice, then the
    group's totals."""
    for result in results:
        print(f"compact_group: {result.stats.describe()}", flush=True)
    total = summarize([r.stats for r in results], sum(r.stats.bytes_in for r in results))
    print(
        f"compact_group: group {results[0].group} done in {len(results)} slice(s): {total['records_in']:,} records in, "
        f"{total['records_out']:,} out; {total['bytes_in'] / 1e6:,.1f} MB read, {total['bytes_out'] / 1e6:,.1f} MB written "
        f"({total['recopy_percent']}% recopied); key map at most {total['buffer_utilization_percent']}% full; "
        f"{total['gets']} GETs, {total['puts']} PUTs; slowest slice {total['max_job_seconds']:.1f} s",
        flush=True,
    )


if __name__ == "__main__":
    main()
