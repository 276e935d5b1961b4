"""Committing a plan's outputs in one catalog transaction, and collecting what no kept version references."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from logcompact.catalog import Catalog, SetAside
from logcompact.engine.plan import PLANS_PREFIX, Plan, PlanHeader
from logcompact.engine.stats import CompactionStats, JobResult
from logcompact.engine.workdir import reclaim_workdirs
from logcompact.exceptions import CommitConflictError

log = logging.getLogger(__name__)

DEFAULT_GC_GRACE_MS = 3_600_000


def commit_plan(catalog: Catalog, plan: Plan | PlanHeader, results: list[JobResult], now_ms: int, leased: bool = False) -> bool:
    """Replace the plan's inputs by the outputs of all its groups, in one transaction; whether this call committed.
    The plan's header is enough (its ids and input files).

    A plan already committed (a retried job) is a no-op. An input that is no longer live is a
    CommitConflictError and nothing changes. With `leased`, the plan's lease must still hold at the commit:
    once it has expired, gc may collect the outputs, so the commit is refused and the plan must be made again.
    """
    if catalog.is_committed(plan.plan_id):  # first: after gc, a committed plan's outputs may be gone
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return False
    if plan.cluster_id != catalog.cluster_id:
        raise CommitConflictError(
            f"plan {plan.plan_id} is for cluster {plan.cluster_id}, not {catalog.cluster_id}; commit it to its own catalog"
        )
    outputs = [data_file for result in results for data_file in result.outputs]
    for data_file in outputs:
        if catalog.store.stat(data_file.key) is None:
            raise CommitConflictError(
                f"plan {plan.plan_id}: output {data_file.key} is missing from the store (collected by gc after the "
                "plan's lease expired?); plan again"
            )
    # Partitions a job set aside keep their sections where they are, and are marked uncleanable.
    marks = [SetAside(**mark) for result in results for mark in result.stats.uncleanable]
    committed = catalog.replace_files(
        [f.key for f in plan.inputs], outputs, now_ms, plan_id=plan.plan_id, expected_version=plan.manifest_version,
        leased=leased, kept={(m.topic, m.partition) for m in marks} | set(plan.set_aside), marks=marks,
    ).committed
    if not committed:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
    return committed


@dataclass
class PlanResult:
    """A plan run and committed: the statistics of each of its jobs (groups, or their slices)."""

    plan_id: str
    groups: list[CompactionStats]
    bytes_in: int  # the plan's input files (a file read by several jobs counts once)

    def to_dict(self) -> dict:
        totals = {name: sum(getattr(g, name) for g in self.groups) for name in _ADDITIVE}
        first = self.groups[0]
        return {
            **first.to_dict(),
            **totals,
            "bytes_in": self.bytes_in,
            "buffer_utilization": max(g.buffer_utilization for g in self.groups),
            "seconds": round(sum(g.seconds for g in self.groups), 3),
            "oversized_partitions": [p for g in self.groups for p in g.oversized_partitions],
            "warnings": sorted({w for g in self.groups for w in g.warnings}),
            "uncleanable": [p for g in self.groups for p in g.uncleanable],
            "groups": len(self.groups),
        }


_ADDITIVE = (
    "records_in", "records_out", "bytes_out", "files_out", "distinct_keys", "overflows", "duplicates_removed",
    "expired_removed", "tombstones_kept", "tombstones_stamped", "tombstones_removed", "invalid_records",
    "young_kept", "gets", "puts",
)


def run_and_commit(catalog: Catalog, plan: Plan, now_ms: int, lease_ms: int | None = None) -> PlanResult | None:
    """Run a plan locally, group by group, and commit it whole; None when it was committed before.

    With `lease_ms`, the plan's files are leased in the catalog first (a file leased to another live plan
    is a conflict) and the lease goes with the commit, or is released if a group fails.
    """
    # The engine (numba) loads only to run plans here: committing and gc need none of it, and schedulers
    # import this module when they parse their DAGs.
    from logcompact.engine.cleaner import run_plan

    if catalog.is_committed(plan.plan_id):
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return None
    plan.check_against(catalog.snapshot(set_aside=frozenset(plan.set_aside)), now_ms)
    if lease_ms is not None:
        catalog.lease(plan.plan_id, [f.key for f in plan.inputs], now_ms + lease_ms, now_ms)
    try:
        results = [run_plan(catalog.store, plan.piece(group.group)) for group in plan.groups]
        commit_plan(catalog, plan, results, now_ms, leased=lease_ms is not None)
    except BaseException:
        if lease_ms is not None:
            catalog.release(plan.plan_id)
        raise
    return PlanResult(plan.plan_id, [r.stats for r in results], sum(f.size for f in plan.inputs))


@dataclass
class GcReport:
    deleted_files: list[str]
    trimmed_versions: int  # commit-log rows dropped: versions older than the kept history
    kept_unreferenced_young: int
    released_leases: list[str] = field(default_factory=list)
    deleted_plans: list[str] = field(default_factory=list)
    reclaimed_workdirs: list[str] = field(default_factory=list)  # of dead jobs, on the machine gc runs on
    abandoned_writes: list[str] = field(default_factory=list)  # temporary files of writers killed mid-write

    def to_dict(self) -> dict:
        return asdict(self)


def collect_garbage(catalog: Catalog, now_ms: int, grace_ms: int = DEFAULT_GC_GRACE_MS) -> GcReport:
    """Delete data files no kept manifest version holds, once older than the grace period.

    Every step is a few catalog queries, never a read of whole versions, so gc completes however many
    commits land meanwhile:

    1. expired leases are released, so an abandoned plan's outputs go once its lease has expired;
    2. files no kept version holds (removed at or before the oldest kept version), removed longer than the
       grace ago (a reader that pinned a version may still read them for that long), lose their object and
       then their rows;
    3. objects under `data/` the catalog has no row for (outputs never committed, files of a crashed agent)
       are deleted once older than the grace, except the outputs of plans still holding a lease, however
       long their job runs;
    4. the commit log is trimmed to the kept history, and plan documents go once past the grace;
    5. the local work directories of jobs that died on this machine are removed (each job also does so), and
       what writers killed mid-write left in a local store, once past the grace.
    """
    store = catalog.store
    released = catalog.release_expired_leases(now_ms)
    # Read before the catalog's rows: a plan that commits in between has its outputs among them.
    in_flight = catalog.leased_plans(now_ms)
    oldest = catalog.oldest_kept_version()
    # A file removed at version R is in the versions below R only: at R = oldest, no kept version holds it.
    removed = catalog.collectable_files(oldest + 1, now_ms - grace_ms)
    for key in removed:
        store.delete(key)
    catalog.forget_files(removed)
    deleted, young = list(removed), 0
    listed = list(store.list("data/"))
    known = catalog.known_files([info.key for info in listed])
    for info in listed:
        if info.key in known or _plan_of(info.key) in in_flight:
            continue
        if info.modified_ms > now_ms - grace_ms:
            young += 1
            continue
        store.delete(info.key)
        deleted.append(info.key)
    trimmed = catalog.trim_versions(oldest)
    # A plan's documents go together, once its newest one (the last group's result) is past the grace.
    documents: dict[str, list] = {}
    for info in store.list(PLANS_PREFIX):
        documents.setdefault(info.key[len(PLANS_PREFIX) :].split("/", 1)[0], []).append(info)
    old_plans = []
    for plan_id, infos in documents.items():
        if plan_id not in in_flight and max(info.modified_ms for info in infos) <= now_ms - grace_ms:
            for info in infos:
                store.delete(info.key)
                old_plans.append(info.key)
    abandoned = [path for prefix in ("data/", PLANS_PREFIX) for path in store.delete_abandoned_writes(prefix, now_ms - grace_ms)]
    return GcReport(deleted, trimmed, young, released, old_plans, reclaim_workdirs(), abandoned)


def _plan_of(key: str) -> str:
    """The plan id an output's name starts with (`data/l2/{plan_id}-g000-...`)."""
    return key.rsplit("/", 1)[-1].split("-g")[0]
