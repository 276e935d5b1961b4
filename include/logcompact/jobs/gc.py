"""The gc step: collecting what no kept manifest version references."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from logcompact.catalog import Catalog
from logcompact.catalog.database import redact_url
from logcompact.exceptions import ClusterMismatchError
from logcompact.jobs.release import release_abandoned
from logcompact.jobs.workdir import reclaim_workdirs
from logcompact.keys import DATA_KEY_PATTERN, DATA_PREFIX, PLAN_ID_PATTERN, PLANS_PREFIX, is_agent_l0_key, plan_of_output
from logcompact.limits import DEFAULT_GC_GRACE_MS, DEFAULT_MAX_ORPHAN_SHARE, MAX_CLOCK_SKEW_MS
from logcompact.store.base import ObjectInfo

MIN_ORPHANS_CHECKED = 10


@dataclass
class GcReport:
    deleted_files: list[str]
    trimmed_versions: int  # commit-log rows dropped: versions older than the kept history
    kept_unreferenced_young: int
    released_leases: list[str] = field(default_factory=list)
    deleted_plans: list[str] = field(default_factory=list)
    reclaimed_workdirs: list[str] = field(default_factory=list)  # of dead jobs, on the machine gc runs on
    abandoned_writes: list[str] = field(default_factory=list)  # temporary files of writers killed mid-write
    released_abandoned: list[str] = field(default_factory=list)  # plans a failed run could not release itself
    # Unreferenced objects written after the catalog's newest commit: judged once a later commit lands.
    awaiting_commit: list[str] = field(default_factory=list)
    # Objects under data/ no logcompact writer names so: kept, for a person to look at.
    unexplained: list[str] = field(default_factory=list)
    # Damaged catalog rows, one line each: removed files whose key is not a data file's or whose removal no commit
    # recorded (kept with their objects), sections rows without a files row, live files rows naming no stored object.
    damaged_rows: list[str] = field(default_factory=list)
    # Objects the catalog has no row for, kept because some of its rows are damaged: one may be a file they lost.
    kept_orphans: list[str] = field(default_factory=list)
    # Aborted transactions' ranges no file the catalog keeps may hold an unfiltered record of any more: forgotten.
    forgotten_aborted_ranges: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def collect_garbage(
    catalog: Catalog, now_ms: int, grace_ms: int = DEFAULT_GC_GRACE_MS, max_orphan_share: float = DEFAULT_MAX_ORPHAN_SHARE
) -> GcReport:
    """Delete data files no kept manifest version holds, once older than the grace period; never what the catalog
    cannot account for.

    First the store's cluster marker is checked against the catalog (`Catalog.check_store`): a catalog of
    another cluster, or one restored from an older copy, would take the store's newer files for garbage, so gc
    stops there with one line. Then every step is a few catalog queries, never a read of whole versions, so gc
    completes however many commits land meanwhile:

    1. expired leases are released, and the plans failed runs left abandoned, so their outputs can go;
    2. files no kept version holds (removed at or before the oldest kept version), removed longer than the
       grace ago (a reader that pinned a version may still read them for that long) by a commit that records
       removing them (a compaction, a topic's deletion), lose their object and then their rows; a row whose key is
       not a data file's, or marked removed at a version no such commit made, is left and reported
       (`damaged_rows`): its records may be in no other file. In the same catalog transaction, the aborted
       transactions' ranges no file the catalog keeps may hold an unfiltered record of (a compaction's outputs are
       filtered of those recorded by its plan's manifest version) are forgotten;
    3. objects under `data/` the catalog has no row for go once older than the grace, and only when the
       catalog's history accounts for them (`_orphan_reason`): written before the catalog's newest commit (by more
       than the clocks of the store and the committers may differ), as the output of a plan no longer in flight
       or an agent's L0 file (its agent died before committing it). What it cannot account for stays:
       `awaiting_commit` if written after the newest commit, else `unexplained`. None goes while the catalog's rows
       say a file's key was lost (`kept_orphans`): sections rows without their files row, a live files row whose
       object is not in the store (renamed). And when the objects to delete would be more than `max_orphan_share`
       of all under `data/` (and at least MIN_ORPHANS_CHECKED), the catalog looks like another cluster's and gc
       deletes none;
    4. the commit log is trimmed to the kept history, and plan documents go once past the grace;
    5. the local work directories of jobs that died on this machine are removed (each job also does so), and
       what writers killed mid-write left in a local store, once past the grace.
    """
    store = catalog.store
    catalog.check_store(now_ms)
    released = catalog.release_expired_leases(now_ms)
    released_abandoned = release_abandoned(catalog)
    # Read before the catalog's rows: a plan that commits in between has its outputs among them.
    in_flight = catalog.leased_plans(now_ms)
    oldest = catalog.oldest_kept_version()
    # The live files before the listing: each one's object was written before its row, so before the listing too.
    live = {f.key: f.size for f in catalog.snapshot().file_summaries()}
    # A file removed at version R is in the versions below R only: at R = oldest, no kept version holds it.
    removed = catalog.collectable_files(oldest + 1, now_ms - grace_ms)
    damaged = [f"removed files row {key!r} names no data file" for key in removed if not DATA_KEY_PATTERN.fullmatch(key)]
    removed = [key for key in removed if DATA_KEY_PATTERN.fullmatch(key)]
    damaged += catalog.unrecorded_removals(oldest + 1, now_ms - grace_ms)
    for key in removed:
        store.delete(key)
    forgotten_ranges = catalog.forget_files(removed)
    listed = list(store.list(DATA_PREFIX))
    stored = {info.key: info.size for info in listed}
    lost_keys = catalog.dangling_sections() + [
        f"live files row {key!r} names no object of its {size} bytes in the store" for key, size in live.items() if stored.get(key) != size
    ]
    damaged += lost_keys
    known = catalog.known_files([info.key for info in listed])
    newest_commit_ms = catalog.commit_log(limit=1)[0].created_ms
    orphans, awaiting, unexplained, young = [], [], [], 0
    for info in listed:
        if info.key in known or plan_of_output(info.key) in in_flight:
            continue
        if info.modified_ms > now_ms - grace_ms:
            young += 1
        elif _orphan_reason(info) is None:
            unexplained.append(info.key)
        elif info.modified_ms >= newest_commit_ms - MAX_CLOCK_SKEW_MS:  # it may belong to commits this catalog lacks
            awaiting.append(info.key)
        else:
            orphans.append(info.key)
    kept: list[str] = []
    if lost_keys:  # one of them may be the file whose key a damaged row lost
        kept, orphans = orphans, []
    elif len(orphans) >= MIN_ORPHANS_CHECKED and len(orphans) > max_orphan_share * len(listed):
        raise ClusterMismatchError(
            f"{len(orphans)} of the {len(listed)} objects under data/ in {store.uri} are unknown to catalog "
            f"{redact_url(catalog.engine.url)} "
            f"(first: {orphans[0]}): it looks like another cluster's catalog or an older copy, so gc deleted none; if "
            f"they are garbage, run gc with --max-orphan-share 1"
        )
    for key in orphans:
        store.delete(key)
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
    abandoned = [path for prefix in (DATA_PREFIX, PLANS_PREFIX) for path in store.delete_abandoned_writes(prefix, now_ms - grace_ms)]
    return GcReport(
        removed + orphans, trimmed, young, released, old_plans, reclaim_workdirs(), abandoned, released_abandoned, awaiting,
        unexplained, damaged, kept, forgotten_ranges,
    )


def _orphan_reason(info: ObjectInfo) -> str | None:
    """Why an object the catalog has no row for is garbage once the catalog has committed after it; None for a name
    no logcompact writer makes, which is nobody's to delete."""
    if DATA_KEY_PATTERN.fullmatch(info.key) is None:
        return None
    if PLAN_ID_PATTERN.fullmatch(plan_of_output(info.key)):
        return "output of a plan that is no longer in flight and never committed it"
    if is_agent_l0_key(info.key):
        return "L0 file of an agent that died before committing it"
    return None
