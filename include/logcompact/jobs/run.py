"""The run-a-group step: one group of a stored plan, its partitions dealt into slices, each slice run by the
engine, the group's result written next to the plan. `run_group` is the step wherever it runs; only how its
slices are mapped differs: one after the other here (`IN_ORDER`), or as Spark tasks
(`spark_apps/compact_group.py`), each sent a `GroupSlice` and opening the store itself (`run_task`)."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from logcompact.catalog import Catalog, TopicPartition
from logcompact.catalog.identity import check_store_cluster
from logcompact.jobs.commit import CommitSummary, PlanResult, commit_plans
from logcompact.jobs.prepare import GroupJob, lease_and_write
from logcompact.jobs.release import give_up
from logcompact.jobs.workdir import job_workdir
from logcompact.planner import PlannerConfig
from logcompact.plans import JobResult, Plan, group_done, read_cluster_id, read_group, read_partition_bytes, read_results, summarize, write_group_result
from logcompact.plans.results import uncompressed_in
from logcompact.store import ObjectStore, open_store
from logcompact.units import mib


class GroupSlice(NamedTuple):
    """One slice of a group, what its task is sent: where the plan is and which partitions are its share, nothing of
    the plan itself, so what a task is sent does not grow with the plan."""

    store_uri: str
    plan_id: str
    group: int
    number: int
    partitions: list[TopicPartition]


class SliceMapper(Protocol):
    """How a group's slices run: here one after the other (`IN_ORDER`), or as Spark tasks."""

    def parallelism(self) -> int:
        """How many slices a group is dealt into when its caller does not say."""
        ...

    def map(self, store: ObjectStore, slices: list[GroupSlice]) -> list[JobResult]:
        """Every slice's result, in the slices' order."""
        ...


class InOrder:
    """Slices run here, one after the other, on the caller's store."""

    def parallelism(self) -> int:
        return 1

    def map(self, store: ObjectStore, slices: list[GroupSlice]) -> list[JobResult]:
        return [run_slice(store, share) for share in slices]


IN_ORDER = InOrder()


def deal_slices(sizes: dict[TopicPartition, int], slices: int) -> list[tuple[int, list[TopicPartition]]]:
    """Partitions, by their bytes, dealt into at most `slices` slices of about equal bytes."""
    loads: list[tuple[int, int, list[TopicPartition]]] = [(0, number, []) for number in range(max(1, min(slices, len(sizes))))]
    for tp in sorted(sizes, key=lambda tp: (-sizes[tp], tp)):  # biggest first, onto the lightest slice
        lightest = min(range(len(loads)), key=lambda i: loads[i][:2])
        load, number, tps = loads[lightest]
        loads[lightest] = (load + sizes[tp], number, tps + [tp])
    return [(number, sorted(tps)) for _, number, tps in sorted(loads, key=lambda load: load[1]) if tps]


def run_slice(store: ObjectStore, share: GroupSlice) -> JobResult:
    """Run a slice of a group, the sections of its partitions, in a work directory reclaimed if the job dies; its
    outputs go to the store, uncommitted."""
    from logcompact.engine.cleaner import run_plan  # the engine (numba) loads where slices run, never in schedulers

    piece = read_group(store, share.plan_id, share.group, partitions=share.partitions, slice=share.number)
    with job_workdir() as workdir:
        return run_plan(store, piece, workdir=workdir)


def run_task(share: GroupSlice) -> JobResult:
    """A slice run where only the store's URI travels with it (a Spark task): the store is opened here."""
    return run_slice(open_store(share.store_uri), share)


def run_group(store: ObjectStore, plan_id: str, group: int, slices: int = 0, mapper: SliceMapper = IN_ORDER) -> list[JobResult] | None:
    """Run a group of a stored plan: deal its partitions into `slices` slices (0: the mapper's parallelism), run them
    through `mapper`, write the group's result. The store must be the plan's cluster's, checked before anything
    is written. None when the group's result and outputs are already in the store (a retry after a success)."""
    check_store_cluster(store, read_cluster_id(store, plan_id), f"plan {plan_id}")
    sizes = read_partition_bytes(store, plan_id, group)
    if group_done(store, plan_id, group):
        return None
    dealt = deal_slices(sizes, slices or mapper.parallelism())
    results = mapper.map(store, [GroupSlice(store.uri, plan_id, group, number, partitions) for number, partitions in dealt])
    write_group_result(store, plan_id, group, results)
    return results


def group_report(results: list[JobResult]) -> list[str]:
    """A group's figures, for its job's log: a line per slice, then the group's totals."""
    total = summarize([r.stats for r in results], sum(r.stats.bytes_in for r in results))
    return [result.stats.describe() for result in results] + [
        f"group {results[0].group} done in {len(results)} slice(s): {total['records_in']:,} records in, "
        f"{total['records_out']:,} out; {mib(total['bytes_in'])} of its sections' stored blocks read "
        f"({mib(uncompressed_in(total['topics']))} uncompressed), {mib(total['bytes_out'])} stored written "
        f"({total['recopy_percent']}% of the stored bytes read); key map at most {total['buffer_utilization_percent']}% full; "
        f"{total['gets']} GETs, {total['puts']} PUTs; slowest slice {total['max_job_seconds']:.1f} s"
    ]


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
