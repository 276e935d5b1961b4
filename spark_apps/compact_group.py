"""Spark application: run one group of a compaction plan, its topic-partitions spread over Spark tasks.

    spark-submit --master local[2] spark_apps/compact_group.py \
        --store file:///path/to/store --plan-id p1700000000000-abc123def456 --group 0 --slices 2

The plan is read from the store (`plans/{plan_id}/plan.json`, written by the planner). The group's
partitions are dealt into `--slices` slices of about equal bytes; each Spark task runs the engine on one
slice (every input file read through at most two streaming GETs per task), writes its output files to the
store and returns only their metadata and stats. The driver writes the group's result next to the plan
(`plans/{plan_id}/results/g{group}.json`); the commit step (`logcompact.orchestration.commit_plans`)
commits the plan once every group has its result. No record data is collected on the driver. A group
whose result and outputs are already in the store (a retried task after a success) is not run again.
Neither the driver nor the tasks open the catalog database: the plan carries its input files' sections,
so the store is all they need (on a cluster, only its credentials).
"""

from __future__ import annotations

import argparse
from dataclasses import replace
from typing import Iterable, Iterator

from logcompact.engine.exchange import group_done, read_plan, write_group_result
from logcompact.engine.plan import Plan, TopicPartition
from logcompact.engine.stats import JobResult
from logcompact.planner import PlannerConfig, split_into_groups
from logcompact.store import open_store


def deal_slices(group: Plan, slices: int) -> list[tuple[int, list[TopicPartition]]]:
    """The group's partitions dealt into at most `slices` slices of about equal input bytes."""
    sizes: dict[TopicPartition, int] = {}
    for data_file in group.inputs:
        for section in data_file.sections:
            tp = (section.topic, section.partition)
            if group.covers(*tp):
                sizes[tp] = sizes.get(tp, 0) + section.info.byte_length
    loads = [[0, number, []] for number in range(max(1, min(slices, len(sizes))))]
    for tp in sorted(sizes, key=lambda tp: (-sizes[tp], tp)):  # biggest first, onto the lightest slice
        lightest = min(loads)
        lightest[0] += sizes[tp]
        lightest[2].append(tp)
    return [(number, sorted(tps)) for _, number, tps in sorted(loads, key=lambda load: load[1]) if tps]


def compact_slices(store_uri: str, plan_json: str, slices: Iterable[tuple[int, list[TopicPartition]]]) -> Iterator[dict]:
    """The per-task logic, plain Python: run the engine on each slice and yield its result (metadata only)."""
    from logcompact.engine.cleaner import run_plan  # the engine (numba) loads in the tasks, never in the driver

    store = open_store(store_uri)
    group = Plan.from_json(plan_json)
    for number, partitions in slices:
        piece = replace(group, partitions=tuple(tuple(tp) for tp in partitions), slice=number)
        yield run_plan(store, piece).to_dict()


def select_group(plan: Plan, group: int, group_bytes: int) -> Plan:
    groups = split_into_groups(plan, group_bytes)
    if not 0 <= group < len(groups):
        raise SystemExit(f"compact_group: plan {plan.plan_id} has groups 0 to {len(groups) - 1}, not {group}")
    return groups[group]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--store", required=True, help="file:///path or s3://bucket/prefix")
    parser.add_argument("--plan-id", required=True)
    parser.add_argument("--group", type=int, required=True)
    parser.add_argument("--slices", type=int, default=0, help="Spark tasks for the group (default: the default parallelism)")
    parser.add_argument("--group-bytes", type=int, default=PlannerConfig.group_bytes, help="as the planner split the plan")
    args = parser.parse_args(argv)

    store = open_store(args.store)
    group = select_group(read_plan(store, args.plan_id), args.group, args.group_bytes)
    if group_done(store, args.plan_id, args.group):
        print(f"compact_group: plan {args.plan_id} group {args.group} already has its result; nothing to redo")
        return

    # A plain SparkContext: the job uses no SQL, and a SparkSession would only add to start-up. It is not
    # stopped here: spark-submit's JVM stops it as it exits (Spark's shutdown hook), whereas PySpark's
    # stop() first waits about a second for its accumulator server to notice.
    from pyspark import SparkConf, SparkContext

    context = SparkContext.getOrCreate(SparkConf().setAppName(f"logcompact {args.plan_id} group {args.group}"))
    slices = deal_slices(group, args.slices or context.defaultParallelism)
    plan_json, store_uri = group.to_json(), args.store
    results = (
        context.parallelize(slices, len(slices))
        .mapPartitions(lambda part: compact_slices(store_uri, plan_json, part))
        .collect()
    )
    write_group_result(store, group.plan_id, group.group, [JobResult.from_dict(r) for r in results])


if __name__ == "__main__":
    main()
