"""The run-a-group step: one group of a stored plan, its partitions dealt into slices, each slice run by the
engine, the group's result written next to the plan. Spark runs the slices as tasks
(`spark_apps/compact_group.py`); `run_group` runs them here, one after the other."""

from __future__ import annotations

from logcompact.catalog import Catalog
from logcompact.engine.stats import JobResult
from logcompact.jobs.commit import CommitSummary, PlanResult, commit_plans
from logcompact.jobs.documents import give_up, group_done, read_group, read_partition_bytes, read_results, write_group_result
from logcompact.jobs.prepare import GroupJob, lease_and_write
from logcompact.jobs.workdir import job_workdir
from logcompact.plan import Plan, TopicPartition
from logcompact.planner import PlannerConfig
from logcompact.store import ObjectStore


def deal_slices(sizes: dict[TopicPartition, int], slices: int) -> list[tuple[int, list[TopicPartition]]]:
    """Partitions, by their bytes, dealt into at most `slices` slices of about equal bytes."""
    loads: list[tuple[int, int, list[TopicPartition]]] = [(0, number, []) for number in range(max(1, min(slices, len(sizes))))]
    for tp in sorted(sizes, key=lambda tp: (-sizes[tp], tp)):  # biggest first, onto the lightest slice
        lightest = min(range(len(loads)), key=lambda i: loads[i][:2])
        load, number, tps = loads[lightest]
        loads[lightest] = (load + sizes[tp], number, tps + [tp])
    return [(number, sorted(tps)) for _, number, tps in sorted(loads, key=lambda load: load[1]) if tps]


def run_slice(store: ObjectStore, plan_id: str, group: int, number: int, partitions: list[TopicPartition]) -> JobResult:
    """Run slice `number` of a group, the sections of `partitions`, in a work directory reclaimed if the job dies;
    its outputs go to the store, uncommitted."""
    from logcompact.engine.cleaner import run_plan  # the engine (numba) loads where slices run, never in schedulers

    piece = read_group(store, plan_id, group, partitions=[(topic, partition) for topic, partition in partitions], slice=number)
    with job_workdir() as workdir:
        return run_plan(store, piece, workdir=workdir)


def run_group(store: ObjectStore, plan_id: str, group: int, slices: int = 1) -> list[JobResult] | None:
    """Run a group of a stored plan here, slice after slice, and write its result; None when its result and
    outputs are already in the store (a retry after a success)."""
    sizes = read_partition_bytes(store, plan_id, group)
    if group_done(store, plan_id, group):
        return None
    results = [run_slice(store, plan_id, group, number, tps) for number, tps in deal_slices(sizes, slices)]
    write_group_result(store, plan_id, group, results)
    return results


def run_here(catalog: Catalog, plan_ids: list[str], groups: list[GroupJob], now_ms: int) -> CommitSummary:
    """Run leased plans' groups here, one after the other, then commit them: what a DAG run does with Spark. A
    failure releases the plans' leases, as nothing here resumes them (`give_up`), and is raised as it was."""
    try:
        for job in groups:
            run_group(catalog.store, job.plan_id, job.group)
        return commit_plans(catalog, plan_ids, now_ms)
    except BaseException as failure:
        give_up(catalog, plan_ids, now_ms, failure)
        raise


def run_and_commit(catalog: Catalog, plan: Plan, now_ms: int, lease_ms: int = PlannerConfig.lease_ms) -> PlanResult | None:
    """A plan made elsewhere, through every step here: checked against the catalog now, leased and written, its
    groups run, committed. None when it was committed before."""
    if catalog.is_committed(plan.plan_id):
        return None
    plan.check_against(catalog.snapshot(set_aside=frozenset(plan.set_aside)), now_ms)
    run_here(catalog, [plan.plan_id], lease_and_write(catalog, [plan], now_ms, lease_ms), now_ms)
    results = read_results(catalog.store, plan.header())
    return PlanResult(plan.plan_id, [r.stats for r in results], sum(f.size for f in plan.inputs))
