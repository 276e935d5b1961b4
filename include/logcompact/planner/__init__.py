"""Choosing what to compact: pure functions from a catalog snapshot to plans (no I/O of their own).

Modes: `regular` (leveled merges L0 -> L1 -> ... -> top, then size tiers at the top), `full` (the daily
sweep: every file of the chosen topics, across sizes, into the top level), `max-lag` (the partitions whose
records would otherwise stay dirty past their topic's max.compaction.lag.ms). docs/planner.md explains the
rules. Files leased to an in-flight plan are never planned again until it commits, fails or expires.
"""

from __future__ import annotations

import gc

from logcompact.catalog import Manifest
from logcompact.engine.plan import Plan
from logcompact.planner.config import PlannerConfig
from logcompact.planner.estimate import expected_effect
from logcompact.planner.groups import split_into_groups
from logcompact.planner.levels import plan_full_sweep, plan_regular, size_tiers, top_level
from logcompact.planner.max_lag import dirty_since, plan_max_lag

MODES = ("regular", "max-lag", "full")

__all__ = [
    "MODES",
    "PlannerConfig",
    "dirty_since",
    "expected_effect",
    "plan",
    "plan_full_sweep",
    "plan_max_lag",
    "plan_regular",
    "size_tiers",
    "split_into_groups",
    "top_level",
]


def plan(
    manifest: Manifest, now_ms: int, mode: str = "regular", config: PlannerConfig = PlannerConfig(), topics: list[str] | None = None
) -> list[Plan]:
    """The plans a mode calls for now, leaving out files leased to in-flight plans."""
    if mode not in MODES:
        raise ValueError(f"planner mode {mode!r} is not one of {', '.join(MODES)}")
    # Planning a large catalog allocates hundreds of thousands of small acyclic objects; a full collection
    # over the catalog in the middle of it would cost more than the planning itself.
    collecting = gc.isenabled()
    gc.disable()
    try:
        leased = manifest.leased_files(now_ms)
        if mode == "regular":
            return plan_regular(manifest, now_ms, config, leased)
        planner = plan_full_sweep if mode == "full" else plan_max_lag
        found = planner(manifest, now_ms, config, leased, topics)
        return [found] if found is not None else []
    finally:
        if collecting:
            gc.enable()
