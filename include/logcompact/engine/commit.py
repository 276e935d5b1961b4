"""Committing a plan's outputs in one catalog commit, and collecting files no kept manifest references."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from logcompact.catalog import Catalog, Manifest
from logcompact.catalog.catalog import manifest_key
from logcompact.engine.cleaner import JobResult, run_plan
from logcompact.engine.plan import Plan
from logcompact.exceptions import CommitConflictError

log = logging.getLogger(__name__)

DEFAULT_GC_GRACE_MS = 3_600_000


def commit_plan(catalog: Catalog, plan: Plan, results: list[JobResult], now_ms: int) -> tuple[Manifest, bool]:
    """Replace the plan's inputs by the outputs of all its groups, atomically.

    Returns the manifest and whether this call committed: a plan already committed (a retried job) is a
    no-op. An input that is no longer live is a CommitConflictError and nothing changes.
    """
    outputs = [data_file for result in results for data_file in result.outputs]
    inputs = [data_file.key for data_file in plan.inputs]

    def change(manifest: Manifest) -> tuple[Manifest, bool]:
        if manifest.cluster_id != plan.cluster_id:
            raise CommitConflictError(f"plan {plan.plan_id} is for cluster {plan.cluster_id}, not {manifest.cluster_id}")
        if plan.plan_id in manifest.recent_plans:
            raise _AlreadyCommitted(manifest)
        return manifest.with_replaced_files(inputs, outputs, plan.manifest_version, plan.plan_id), True

    try:
        return catalog.commit(f"compact {plan.plan_id}", change, now_ms)
    except _AlreadyCommitted as done:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return done.manifest, False


def run_and_commit(catalog: Catalog, plan: Plan, now_ms: int) -> JobResult | None:
    """Run a plan locally and commit it; None when the plan was committed before (a retry is safe)."""
    manifest = catalog.load()
    if plan.plan_id in manifest.recent_plans:
        log.info("plan %s was already committed; nothing to do", plan.plan_id)
        return None
    plan.check_against(manifest)
    result = run_plan(catalog.store, plan)
    commit_plan(catalog, plan, [result], now_ms)
    return result


class _AlreadyCommitted(Exception):
    def __init__(self, manifest: Manifest) -> None:
        self.manifest = manifest


@dataclass
class GcReport:
    deleted_files: list[str]
    deleted_manifests: list[int]
    kept_unreferenced_young: int

    def to_dict(self) -> dict:
        return {
            "deleted_files": self.deleted_files,
            "deleted_manifests": self.deleted_manifests,
            "kept_unreferenced_young": self.kept_unreferenced_young,
        }


def collect_garbage(catalog: Catalog, now_ms: int, grace_ms: int = DEFAULT_GC_GRACE_MS) -> GcReport:
    """Delete data files no kept manifest version references, once older than the grace period.

    Young unreferenced files may belong to a job or an agent that has not committed yet: they stay. Manifest
    versions older than the kept history (left by a writer that stopped between its commit and its cleanup)
    go too.
    """
    store = catalog.store
    versions = catalog.versions()
    kept = versions[-catalog.keep_versions :]
    referenced = set()
    for version in kept:
        referenced.update(catalog.load(version).files)
    deleted, young = [], 0
    for info in store.list("data/"):
        if info.key in referenced:
            continue
        if info.modified_ms > now_ms - grace_ms:
            young += 1
            continue
        store.delete(info.key)
        deleted.append(info.key)
    stale = [v for v in versions if kept and v < kept[0]]
    for version in stale:
        store.delete(manifest_key(version))
    return GcReport(deleted, stale, young)
