"""Spark application: run one group of a compaction plan, its topic-partitions spread over Spark tasks.

    spark-submit --master local[2] spark_apps/compact_group.py \
        --store file:///path/to/store --plan-id p1700000000000-abc123def456 --group 0 --slices 2

The plan is in the store, split into groups by the planner that made it; the group's document
(`plans/{plan_id}/groups/g{group}.arrow`) holds the group's sections. The driver reads the bytes per
partition from it and deals the partitions into `--slices` slices of about equal bytes. Each Spark task is
sent the store's URI, the plan id, the group, its slice number and its partitions (what a task is sent does not
grow with the plan), reads its slice of the group document itself, runs the engine on it (every input file
read through at most two streaming GETs per task), writes its output files to the store and returns only
their metadata and stats. The driver writes the group's result next to the plan
(`plans/{plan_id}/results/g{group}.json`); the commit step (`logcompact.jobs.commit_plans`) commits
the plan once every group has its result. No record data is collected on the driver. A group whose result
and outputs are already in the store (a retried task after a success) is not run again. Neither the driver
nor the tasks open the catalog database: the plan carries its input files' sections, so the store is all
they need (on a cluster, only its credentials).

These are the steps of `logcompact.jobs.run_group`, the same wherever a group runs: this application gives
it only how the slices are mapped (`SparkTasks`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from logcompact.jobs import GroupSlice, JobResult, LogcompactError, group_report, run_group, run_task
from logcompact.store import ObjectStore, open_store

if TYPE_CHECKING:
    from pyspark import SparkContext


class SparkTasks:
    """A group's slices mapped over Spark tasks, one task a slice. The SparkContext starts on first use, so a group
    found done, or a plan not found, never starts Spark.

    A plain SparkContext: the job uses no SQL, and a SparkSession would only add to start-up. It is not stopped
    here: spark-submit's JVM stops it as it exits (Spark's shutdown hook), whereas PySpark's stop() first waits
    about a second for its accumulator server to notice."""

    def __init__(self, app_name: str) -> None:
        self.app_name = app_name
        self._context: SparkContext | None = None

    def context(self) -> SparkContext:
        if self._context is None:
            from pyspark import SparkConf, SparkContext

            # Spark's own INFO lines would bury the job's (the task log of an Airflow run is this process's output).
            conf = SparkConf().setAppName(self.app_name)
            conf.setIfMissing("spark.log.level", "WARN").setIfMissing("spark.ui.showConsoleProgress", "false")
            self._context = SparkContext.getOrCreate(conf)
        return self._context

    def parallelism(self) -> int:
        return self.context().defaultParallelism

    def map(self, store: ObjectStore, slices: list[GroupSlice]) -> list[JobResult]:
        return self.context().parallelize(slices, len(slices)).map(run_task).collect()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="file:///path or s3://bucket/prefix")
    parser.add_argument("--plan-id", required=True)
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--slices", type=int, default=0, help="Spark tasks for the group (default: the default parallelism)")
    args = parser.parse_args(argv)

    try:
        results = run_group(open_store(args.store), args.plan_id, args.group, args.slices, SparkTasks(f"logcompact {args.plan_id} group {args.group}"))
    except LogcompactError as exc:
        raise SystemExit(f"compact_group: {exc}") from None
    if results is None:
        print(f"compact_group: plan {args.plan_id} group {args.group} already has its result; nothing to redo")
        return
    for line in group_report(results):
        print(f"compact_group: {line}", flush=True)


if __name__ == "__main__":
    main()
