"""The max-lag pass: compact what holds records older than their topic's max.compaction.lag.ms.

A record is dirty once its timestamp is older than now - max.compaction.lag.ms (at least 2 hours) and it
has not been deduplicated against older data of its partition. A partition is clean when all its live
data sits in one section at a deduplicating level that is free of duplicates (`clean_below_delta` covers
it); otherwise its other sections are dirty from their oldest record's timestamp plus the lag.

The pass runs every `max_lag_pass_interval_ms`. A partition is planned when, by the next pass, it would
have been dirty for longer than `max_lag_deadline_ms`: with a 15-minute interval and a 30-minute
deadline, a record is compacted 15 to 30 minutes after it becomes dirty, and everything that becomes
dirty within one interval is compacted together, so files are not rewritten over and over.
"""

from __future__ import annotations

from logcompact.catalog import CatalogSection, DataFile, Manifest
from logcompact.engine.plan import Plan
from logcompact.planner.config import PlannerConfig
from logcompact.planner.levels import make_plan, top_level
from logcompact.topics import LONG_MAX, MIN_MAX_COMPACTION_LAG_MS


def dirty_since(manifest: Manifest, topic: str, partition: int, config: PlannerConfig) -> int | None:
    """When the partition's oldest record not yet deduplicated against older data became (or becomes) dirty."""
    lag = max(manifest.topics[topic].config.max_compaction_lag_ms, MIN_MAX_COMPACTION_LAG_MS)
    sections: list[tuple[DataFile, CatalogSection]] = manifest.sections_of(topic, partition)
    if not sections:
        return None
    base_file, base = sections[0]
    base_is_clean = base_file.level >= config.dedup_from_level and base.info.clean_below_delta > base.info.last_delta
    dirty = sections[1:] if base_is_clean else sections
    if not dirty:
        return None
    return min(s.info.min_timestamp for _, s in dirty) + lag


def plan_max_lag(
    manifest: Manifest, now_ms: int, config: PlannerConfig, leased: set[str], topics: list[str] | None = None
) -> Plan | None:
    """One plan over every file holding a partition that must be compacted in this pass, or None."""
    horizon = now_ms + config.max_lag_pass_interval_ms - config.max_lag_deadline_ms
    due: set[tuple[str, int]] = set()
    for name, topic in manifest.topics.items():
        if topics and name not in topics:
            continue
        if not topic.config.compacted or topic.config.max_compaction_lag_ms >= LONG_MAX:
            continue
        for partition in range(topic.partitions):
            since = dirty_since(manifest, name, partition, config)
            if since is not None and since <= horizon:
                due.add((name, partition))
    if not due:
        return None
    inputs = [f for f in manifest.files.values() if not due.isdisjoint(f.partitions)]
    if any(f.key in leased for f in inputs):
        return None  # an in-flight plan holds some of these files; its commit compacts them first
    return make_plan(manifest, inputs, max(config.dedup_from_level, top_level(manifest, config)), now_ms, config, "max-lag")
