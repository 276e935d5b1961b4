"""The gc step: collecting what no kept manifest version references."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from logcompact.catalog import Catalog
from logcompact.jobs.workdir import reclaim_workdirs
from logcompact.plan import PLANS_PREFIX

DEFAULT_GC_GRACE_MS = 3_600_000


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
