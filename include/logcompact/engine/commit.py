"""Committing a plan's outputs in one catalog commit, and collecting files no kept manifest references."""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass, field

from logcompact.catalog import Catalog, Manifest
from logcompact.catalog.catalog import manifest_key
from logcompact.engine.plan import PLANS_PREFIX, Plan
from logcompact.engine.stats import CompactionStats, JobResult
from logcompact.planner.groups import split_into_groups
from logcompact.exceptions import CommitConflictError

log = logging.getLogger(__name__)

DEFAULT_GC_GRACE_MS = 3_600_000


def commit_plan(
    catalog: Catalog, plan: Plan, results: list[JobResult], now_ms: int, leased: bool = False
) -> tuple[Manifest, bool]:
    """Replace the plan's inputs by the outputs of all its groups, atomically.

    Returns the manifest and whether this call committed: a plan already committed (a retried job) is a
    no-op. An input that is no longer live is a CommitConflictError and nothing changes. With `leased`, the
    plan's lease must still hold at the commit: once it has expired, gc may collect the outputs, so the
    commit is refused and the plan must be made again.
    """
    manifest = catalog.load()
    if plan.plan_id in manifest.recent_plans:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return manifest, False
    outputs = [data_file for result in results for data_file in result.outputs]
    inputs = [data_file.key for data_file in plan.inputs]
    for data_file in outputs:
        if catalog.store.stat(data_file.key) is None:
            raise CommitConflictError(
                f"plan {plan.plan_id}: output {data_file.key} is missing from the store (collected by gc after the "
                "plan's lease expired?); plan again"
            )

    def change(manifest: Manifest) -> tuple[Manifest, bool]:
        if manifest.cluster_id != plan.cluster_id:
            raise CommitConflictError(f"plan {plan.plan_id} is for cluster {plan.cluster_id}, not {manifest.cluster_id}")
        if plan.plan_id in manifest.recent_plans:
            raise _AlreadyCommitted(manifest)
        if leased:
            held = {key for key, (holder, expires) in manifest.leases.items() if holder == plan.plan_id and expires > now_ms}
            # Inputs no longer live are with_replaced_files' conflict, which says more.
            lost = [key for key in inputs if key in manifest.files and key not in held]
            if lost:
                raise CommitConflictError(
                    f"plan {plan.plan_id}: its lease on {lost[0]} (and {len(lost) - 1} more) expired or was released "
                    "before the commit; its outputs may be collected, plan again"
                )
        return manifest.with_replaced_files(inputs, outputs, plan.manifest_version, plan.plan_id), True

    try:
        return catalog.commit(f"compact {plan.plan_id}", change, now_ms)
    except _AlreadyCommitted as done:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return done.manifest, False


@dataclass
class PlanResult:
    """A plan run and committed: the statistics of each of its groups."""

    plan_id: str
    groups: list[CompactionStats]

    def to_dict(self) -> dict:
        totals = {name: sum(getattr(g, name) for g in self.groups) for name in _ADDITIVE}
        first = self.groups[0]
        return {
            **first.to_dict(),
            **totals,
            "buffer_utilization": max(g.buffer_utilization for g in self.groups),
            "seconds": round(sum(g.seconds for g in self.groups), 3),
            "oversized_partitions": [p for g in self.groups for p in g.oversized_partitions],
            "warnings": sorted({w for g in self.groups for w in g.warnings}),
            "groups": len(self.groups),
        }


_ADDITIVE = (
    "records_in", "records_out", "bytes_out", "files_out", "distinct_keys", "overflows", "duplicates_removed",
    "expired_removed", "tombstones_kept", "tombstones_stamped", "tombstones_removed", "invalid_records",
    "young_kept", "gets", "puts",
)


def run_and_commit(
    catalog: Catalog, plan: Plan, now_ms: int, group_bytes: int | None = None, lease_ms: int | None = None
) -> PlanResult | None:
    """Run a plan locally, group by group, and commit it whole; None when it was committed before.

    With `lease_ms`, the plan's files are leased in the catalog first (a file leased to another live plan
    is a conflict) and the lease goes with the commit, or is released if a group fails.
    """
    # The engine (numba) loads only to run plans here: committing and gc need none of it, and schedulers
    # import this module when they parse their DAGs.
    from logcompact.engine.cleaner import run_plan

    manifest = catalog.load()
    if plan.plan_id in manifest.recent_plans:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return None
    plan.check_against(manifest)
    keys = [f.key for f in plan.inputs]
    if lease_ms is not None:
        catalog.commit(f"lease {plan.plan_id}", lambda m: (m.with_lease(plan.plan_id, keys, now_ms + lease_ms, now_ms), None), now_ms)
    try:
        groups = split_into_groups(plan, group_bytes) if group_bytes else [plan]
        results = [run_plan(catalog.store, group) for group in groups]
        commit_plan(catalog, plan, results, now_ms, leased=lease_ms is not None)
    except BaseException:
        if lease_ms is not None:
            catalog.commit(f"release {plan.plan_id}", lambda m: (m.without_lease(plan.plan_id), None), now_ms)
        raise
    return PlanResult(plan.plan_id, [r.stats for r in results])


class _AlreadyCommitted(Exception):
    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest


@dataclass
class GcReport:
    deleted_files: list[str]
    deleted_manifests: list[int]
    kept_unreferenced_young: int
    released_leases: list[str] = field(default_factory=list)
    deleted_plans: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def collect_garbage(catalog: Catalog, now_ms: int, grace_ms: int = DEFAULT_GC_GRACE_MS) -> GcReport:
    """Delete data files no kept manifest version references, once older than the grace period.

    Young unreferenced files may belong to a job or an agent that has not committed yet: they stay, and so
    do the outputs of plans that hold a lease, whatever their age. Expired leases are dropped from the
    catalog first, so an abandoned plan's outputs go once its lease has expired and the grace has passed.
    Manifest versions older than the kept history (left by a writer that stopped between its commit and its
    cleanup) go too, and so do plan documents and results older than the grace of plans no longer leased.
    """
    store = catalog.store
    released = _release_expired_leases(catalog, now_ms)
    # Outputs of plans still holding a lease may not be committed yet, however long their job runs. Read
    # before the referenced files: a plan that commits in between is then in one set or the other.
    in_flight = {plan_id for plan_id, expires in catalog.load().leases.values() if expires > now_ms}
    versions = catalog.versions()
    kept = versions[-catalog.keep_versions :]
    referenced = set()
    for version in kept:
        referenced.update(catalog.load(version).files)
    deleted, young = [], 0
    for info in store.list("data/"):
        if info.key in referenced or info.key.rsplit("/", 1)[-1].split("-g")[0] in in_flight:
            continue
        if info.modified_ms > now_ms - grace_ms:
            young += 1
            continue
        store.delete(info.key)
        deleted.append(info.key)
    stale = [v for v in versions if kept and v < kept[0]]
    for version in stale:
        store.delete(manifest_key(version))
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
    return GcReport(deleted, stale, young, released, old_plans)


def _release_expired_leases(catalog: Catalog, now_ms: int) -> list[str]:
    """Drop expired leases from the catalog (one commit, only when there are any); the plans they named."""
    expired = sorted({plan_id for plan_id, expires in catalog.load().leases.values() if expires <= now_ms})
    if expired:
        catalog.commit(
            "release expired leases",
            lambda m: (m.without_expired_leases(now_ms), None),
            now_ms,
        )
    return expired
