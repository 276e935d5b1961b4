"""Choosing what to compact: functions from a catalog snapshot to plans, reading only the catalog.

Modes: `regular` (leveled merges L0 -> L1 -> ... -> top, then size tiers at the top, and the partitions whose
dirty ratio is more than their topic's min.cleanable.dirty.ratio, at any level: `dirty_ratio.py`), `full` (the daily
sweep: every file of the chosen topics, across sizes, into the top level), `max-lag` (the partitions whose
records would otherwise stay dirty past their topic's max.compaction.lag.ms). docs/planner.md explains the
rules. Files leased to an in-flight plan are never planned again until it commits, fails or expires.

Each mode asks the snapshot for the least it needs: the regular mode counts files per level and reads the file
summaries (level, size, content) of the levels due only; its dirty ratio and the max-lag pass read the partitions'
summaries (`catalog.summaries`) and the sections of only the partitions those point at; sections are loaded only
for the files a plan takes, in one read (the full sweep takes every file of its topics). Each plan comes split into
groups of topic-partitions (`PlannerConfig.group_bytes`), once: the plan records them.
"""

from __future__ import annotations

from dataclasses import replace

from logcompact.catalog import PlanningSnapshot
from logcompact.collector import collector_paused
from logcompact.exceptions import TopicNotFoundError
from logcompact.limits import MODES
from logcompact.planner.config import PlannerConfig
from logcompact.planner.estimate import expected_effect
from logcompact.planner.levels import plan_full_sweep, plan_regular, size_tiers, top_level
from logcompact.planner.max_lag import dirty_since, plan_max_lag
from logcompact.plans import Plan

__all__ = [
    "MODES",
    "PlannerConfig",
    "check_topics",
    "choose_plans",
    "dirty_since",
    "expected_effect",
    "plan_full_sweep",
    "plan_max_lag",
    "plan_regular",
    "size_tiers",
    "top_level",
]


def check_topics(snapshot: PlanningSnapshot, mode: str, topics: list[str] | None) -> list[str] | None:
    """The topics a mode is asked to plan, checked (None: every topic); one-line errors name the fix."""
    if mode not in MODES:
        raise ValueError(f"planner mode {mode!r} is not one of {', '.join(MODES)}")
    if not topics:
        return None
    if mode == "regular":
        raise ValueError("topics can only be chosen for the max-lag and full modes (levels mix topics); leave topics empty")
    unknown = sorted(set(topics) - set(snapshot.topics))
    if unknown:
        known = ", ".join(sorted(snapshot.topics)) or "none"
        raise TopicNotFoundError(f"topic(s) {', '.join(unknown)} not in cluster {snapshot.cluster_id} (topics: {known}); fix the topics")
    return sorted(set(topics))


def choose_plans(
    snapshot: PlanningSnapshot, now_ms: int, mode: str = "regular", config: PlannerConfig = PlannerConfig(), topics: list[str] | None = None
) -> list[Plan]:
    """The plans a mode calls for now, leaving out files leased to in-flight plans and the partitions the snapshot
    sets aside (`Catalog.planning_snapshot`)."""
    topics = check_topics(snapshot, mode, topics)
    with collector_paused():
        leased = snapshot.leased_files(now_ms)
        if mode == "regular":
            plans = plan_regular(snapshot, now_ms, config, leased)
        else:
            planner = plan_full_sweep if mode == "full" else plan_max_lag
            chosen = planner(snapshot, now_ms, config, leased, topics)
            plans = [chosen] if chosen is not None else []
        # The snapshot left the held-back uncleanable partitions out: each plan says so, for its commit.
        set_aside = tuple(sorted(snapshot.set_aside))
        return [replace(p, set_aside=set_aside) for p in plans] if set_aside else plans
