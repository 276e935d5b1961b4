"""Compaction as a scheduler runs it, one retry-safe step per task, with no Airflow or Spark imported here.

1. `check_thresholds`: which levels hold enough files to compact (the sensor and the plan operator share it).
2. `prepare_plans`: plan against the catalog as it is *now* (never as of a run's logical date, so a backfill
   or a re-run of an old date cannot undo newer work), lease the plans' files in the catalog (all the plans
   or none), write each plan to the store and return one `GroupJob` per group the plan records. A dry run
   plans and estimates, and writes nothing.
3. Each group runs elsewhere (`spark_apps/compact_group.py`), given the plan id and the group number only,
   and leaves its result next to its plan.
4. `commit_plans`: commit every plan from its header and its groups' results, atomically and once; a retry
   finds the plan already committed and reports the same stats from the results kept in the store.

A group that fails leaves its plan uncommitted and its files leased until the lease expires; retrying the
group resumes the plan, and groups whose results are already in the store are not run again.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from logcompact.catalog import Catalog, Snapshot
from logcompact.engine.commit import PlanResult, commit_plan
from logcompact.engine.exchange import check_seal, plan_documents, read_header, read_results, seal, write_documents
from logcompact.engine.plan import Plan, PlanGroup
from logcompact.exceptions import ObjectNotFoundError, TopicNotFoundError
from logcompact.planner import PlannerConfig, expected_effect, plan


@dataclass(frozen=True)
class ThresholdStatus:
    """Files per level (not leased to an in-flight plan) against the level's compaction threshold."""

    counts: dict[int, int]
    thresholds: dict[int, int]

    @property
    def due_levels(self) -> list[int]:
        return [level for level, threshold in self.thresholds.items() if self.counts.get(level, 0) >= threshold]

    @property
    def reached(self) -> bool:
        return bool(self.due_levels)

    def describe(self) -> str:
        levels = ", ".join(f"L{level} {self.counts.get(level, 0)}/{t}" for level, t in self.thresholds.items())
        verdict = f"due: {', '.join(f'L{level}' for level in self.due_levels)}" if self.reached else "nothing due"
        return f"files per level against thresholds: {levels}; {verdict}"


def check_thresholds(snapshot: Snapshot, now_ms: int, config: PlannerConfig = PlannerConfig()) -> ThresholdStatus:
    """Files per level not leased to an in-flight plan, from the files' summaries (no sections read)."""
    leased = snapshot.leased_files(now_ms)
    counts: dict[int, int] = {}
    for summary in snapshot.file_summaries():
        if summary.key not in leased:
            counts[summary.level] = counts.get(summary.level, 0) + 1
    return ThresholdStatus(counts, {level: n for level, n in enumerate(config.min_files)})


@dataclass(frozen=True)
class GroupJob:
    """One group of a written plan: what a Spark job needs to run it, and a label for the UI."""

    store_uri: str
    plan_id: str
    group: int
    label: str

    def application_args(self) -> list[str]:
        # One `--name=value` token each: a scheduler that renders templates as native objects would turn a
        # lone "0" into an int.
        return [f"--store={self.store_uri}", f"--plan-id={self.plan_id}", f"--group={self.group}"]


@dataclass
class PreparedRun:
    thresholds: ThresholdStatus  # of the snapshot the plans were made from
    plan_ids: list[str]
    groups: list[GroupJob]
    estimates: list[dict]


def check_topics(snapshot: Snapshot, mode: str, topics: list[str] | None) -> list[str] | None:
    """Validated topic names for a mode (None: every topic); one-line errors name the fix."""
    if not topics:
        return None
    if mode == "regular":
        raise ValueError("topics can only be chosen for the max-lag and full modes (levels mix topics); leave topics empty")
    unknown = sorted(set(topics) - set(snapshot.topics))
    if unknown:
        known = ", ".join(sorted(snapshot.topics)) or "none"
        raise TopicNotFoundError(f"topic(s) {', '.join(unknown)} not in cluster {snapshot.cluster_id} (topics: {known}); fix the topics param")
    return sorted(set(topics))


def prepare_plans(
    catalog: Catalog,
    mode: str,
    now_ms: int,
    config: PlannerConfig = PlannerConfig(),
    topics: list[str] | None = None,
    dry_run: bool = False,
) -> PreparedRun:
    snapshot = catalog.planning_snapshot(now_ms)
    thresholds = check_thresholds(snapshot, now_ms, config)
    plans = plan(snapshot, now_ms, mode, config, check_topics(snapshot, mode, topics))
    estimates = [expected_effect(p) for p in plans]
    if dry_run or not plans:
        return PreparedRun(thresholds, [], [], estimates)
    documents = [plan_documents(found) for found in plans]
    _lease_all(catalog, plans, [seal(d) for d in documents], now_ms, config.lease_ms)
    try:
        for written in documents:
            write_documents(catalog.store, written)
    except BaseException:
        _release_all(catalog, plans)
        raise
    groups = [
        GroupJob(catalog.store.uri, found.plan_id, group.group, _label(found, group)) for found in plans for group in found.groups
    ]
    return PreparedRun(thresholds, [p.plan_id for p in plans], groups, estimates)


def _lease_all(catalog: Catalog, plans: list[Plan], seals: list[str], now_ms: int, lease_ms: int) -> None:
    """Lease every plan's files with its documents' seal: all the plans, or none (a conflict releases the plans
    leased before it)."""
    leased = []
    try:
        for found, sealed in zip(plans, seals, strict=True):
            catalog.lease(found.plan_id, [f.key for f in found.inputs], now_ms + lease_ms, now_ms, seal=sealed)
            leased.append(found)
    except BaseException:
        _release_all(catalog, leased)
        raise


def _release_all(catalog: Catalog, plans: list[Plan]) -> None:
    for found in plans:
        catalog.release(found.plan_id)


def _label(found: Plan, group: PlanGroup) -> str:
    levels = "+".join(f"L{level}" for level in sorted({f.level for f in found.inputs}))
    partitions = f"{group.partitions} partition{'' if group.partitions == 1 else 's'}"
    return (
        f"{found.plan_id} g{group.group} of {len(found.groups)}: {levels} to L{found.target_level}, {partitions}, "
        f"{group.bytes / 1e6:,.1f} MB"
    )


@dataclass
class CommitSummary:
    committed: list[str] = field(default_factory=list)
    already_committed: list[str] = field(default_factory=list)
    stats: dict[str, dict] = field(default_factory=dict)
    topics: list[str] = field(default_factory=list)
    cluster_id: str = ""
    manifest_version: int = 0  # the catalog's newest version once the plans are committed
    uncleanable: list[dict] = field(default_factory=list)  # partitions these plans set aside (SetAside as dicts)

    def to_dict(self) -> dict:
        return asdict(self)


def commit_plans(catalog: Catalog, plan_ids: list[str], now_ms: int) -> CommitSummary:
    """Commit each plan from its header and its groups' results in the store; plans committed before are counted,
    not redone.

    A plan with a group missing its result, whose inputs are no longer live, or whose lease has expired
    raises CommitConflictError and commits nothing; plans committed before it in the same call stay committed.
    """
    summary = CommitSummary()
    topics: set[str] = set()
    for plan_id in plan_ids:
        try:
            header = read_header(catalog.store, plan_id)
        except ObjectNotFoundError:
            if not catalog.is_committed(plan_id):
                raise
            # Committed long ago and its documents collected since: nothing to redo, no stats to report.
            summary.already_committed.append(plan_id)
        else:
            results = read_results(catalog.store, header)
            if not catalog.is_committed(plan_id):
                # Never trusted: the stored documents must be those the planner sealed with the lease (the planner
                # made them from the catalog, and Spark jobs never open it), and the header must still check out.
                check_seal(catalog.store, header, catalog.plan_seal(plan_id))
                header.check_against(catalog.snapshot(), now_ms)
            committed = commit_plan(catalog, header, results, now_ms, leased=True)
            (summary.committed if committed else summary.already_committed).append(plan_id)
            summary.stats[plan_id] = PlanResult(plan_id, [r.stats for r in results], sum(f.size for f in header.inputs)).to_dict()
            summary.uncleanable += summary.stats[plan_id]["uncleanable"]
            topics.update(header.topics)
    if plan_ids:
        summary.cluster_id, summary.manifest_version = catalog.cluster_id, catalog.latest_version()
    summary.topics = sorted(topics)
    return summary


def uncleanable_report(catalog: Catalog) -> tuple[int, str]:
    """Kafka's uncleanable-partitions-count for the cluster, and one line saying which partitions and what to do."""
    marks = catalog.uncleanable()
    if not marks:
        return 0, "no uncleanable partitions"
    listed = "; ".join(f"{m.topic}/{m.partition} ({m.bytes:,} bytes, {m.failures} failure(s)): {m.reason}" for m in marks[:5])
    more = f"; and {len(marks) - 5} more" if len(marks) > 5 else ""
    return len(marks), (
        f"{len(marks)} uncleanable partition(s), set aside while the rest compacted: {listed}{more}. Restore the damaged "
        "files from a copy (planners retry once a file changes, or after the backoff), then `logcompact uncleanable "
        "clear`; `logcompact uncleanable` lists them"
    )
