"""What a scheduled plan step did and why, in a few lines for its log: the thresholds, each plan leased (files
per level, groups with their labels, estimated effect), the partitions set aside, the files other in-flight plans
hold, and when nothing is due, the reason (which level lacks files, or which partition comes due next under its max
lag, and when)."""

from __future__ import annotations

from collections import Counter

from logcompact.catalog import Snapshot
from logcompact.jobs.prepare import PreparedRun
from logcompact.planner import PlannerConfig, top_level
from logcompact.planner.max_lag import dirty_partitions, due_by, max_lag_topics
from logcompact.units import MINUTE_MS, mib


def explain_run(
    mode: str, snapshot: Snapshot, prepared: PreparedRun, now_ms: int, config: PlannerConfig, topics: list[str] | None, dry_run: bool
) -> list[str]:
    """What the plan did and why, in a few lines: thresholds, each plan with its groups, other plans' leases,
    and when nothing is due, the reason."""
    lines = [f"{mode}: {prepared.thresholds.describe()}" if mode == "regular" else f"{mode}: topics {', '.join(topics) if topics else 'all'}"]
    leases = snapshot.leases(now_ms)
    levels = {f.key: f.level for f in snapshot.file_summaries()}
    labels: dict[str, list[str]] = {}
    for job in prepared.groups:
        labels.setdefault(job.plan_id, []).append(job.label)
    for estimate in prepared.estimates:
        plan_id = estimate["plan_id"]
        held = Counter(levels[key] for key, lease in leases.items() if lease.plan_id == plan_id and key in levels)
        per_level = ", ".join(f"L{level} {n}" for level, n in sorted(held.items())) or ", ".join(f"L{level}" for level in estimate["input_levels"])
        lines.append(
            f"{'dry run, would lease' if dry_run else 'leased'} plan {plan_id}: {estimate['action']} {estimate['files_replaced']} files "
            f"({per_level}) > L{estimate['target_level']}: {mib(estimate['input_bytes'])} stored (whole files), "
            f"{mib(estimate['input_uncompressed_bytes'])} uncompressed, {estimate['records_in']:,} records in; "
            f"{_what_it_does(estimate, config)}"
            + (f"; up to {estimate['aborted_records']:,} records of aborted transactions removed" if estimate["aborted_records"] else "")
            + f"; {estimate['groups']} group(s)"
            + (f": {'; '.join(labels[plan_id])}" if plan_id in labels else "")
        )
    for mark in prepared.set_aside:
        lines.append(f"{'dry run, would set aside' if dry_run else 'set aside'} as uncleanable (not planned): {mark.reason}")
    others: dict[str, Counter] = {}
    for key, lease in leases.items():
        if lease.plan_id not in prepared.plan_ids and key in levels:
            others.setdefault(lease.plan_id, Counter())[levels[key]] += 1
    for plan_id, held_levels in sorted(others.items()):
        expires = max(lease.expires_ms for lease in leases.values() if lease.plan_id == plan_id)
        lines.append(
            f"held by in-flight plan {plan_id} (not planned again until it commits or its lease expires in "
            f"{minutes(expires - now_ms)}): {held_levels.total()} files "
            f"({', '.join(f'L{level} {n}' for level, n in sorted(held_levels.items()))})"
        )
    if not prepared.estimates:
        lines.append(f"nothing planned: {_why_nothing(mode, snapshot, prepared, now_ms, config, topics, bool(others))}")
    elif dry_run:
        lines.append(f"dry run: {len(prepared.estimates)} plan(s); nothing leased, written or run")
    else:
        lines.append(f"{len(prepared.estimates)} plan(s), {len(prepared.groups)} group job(s)")
    return lines

def _why_nothing(
    mode: str, snapshot: Snapshot, prepared: PreparedRun, now_ms: int, config: PlannerConfig, topics: list[str] | None, others: bool
) -> str:
    held = "; files leased to in-flight plans are not counted" if others else ""
    if mode == "regular":
        counts, thresholds = prepared.thresholds.counts, prepared.thresholds.thresholds
        top = top_level(snapshot.level_counts(), config)
        below = ", ".join(f"L{level} has {counts.get(level, 0)} files, needs {thresholds[level]}" for level in range(min(top, len(thresholds))))
        return (
            f"{below}; the top level L{top} has no {config.tier_min_files} files within {config.tier_size_ratio:g}x "
            f"of each other's size{held}"
        )
    if mode == "full":
        return f"no live file{' of topics ' + ', '.join(topics) if topics else ''} outside in-flight plans{held}"
    return _why_no_max_lag(snapshot, now_ms, config, topics, others)


def _why_no_max_lag(snapshot: Snapshot, now_ms: int, config: PlannerConfig, topics: list[str] | None, others: bool) -> str:
    """The max-lag pass planned nothing: which partition comes due next, and when (the planner's own rule)."""
    chosen = max_lag_topics(snapshot, topics)
    if not chosen:
        return f"max-lag: no compacted topic {'among ' + ', '.join(topics) + ' ' if topics else ''}sets a finite max.compaction.lag.ms"
    dirty = dirty_partitions(snapshot, chosen, config)
    if not dirty:
        return f"max-lag: every partition of {', '.join(chosen)} is clean"
    first, horizon = min(dirty, key=lambda d: (d.dirty_since, d.topic, d.partition)), due_by(now_ms, config)
    name = f"{first.topic}/{first.partition}"
    if first.dirty_since <= horizon and others:
        return f"max-lag: {name} is due, but an in-flight plan holds some of its files; that plan's commit compacts them first"
    when = f"is dirty since {minutes(now_ms - first.dirty_since)} ago" if first.dirty_since <= now_ms else f"becomes dirty in {minutes(first.dirty_since - now_ms)}"
    return (
        f"max-lag: nothing would be dirty longer than {minutes(config.max_lag_deadline_ms)} by the next pass (in "
        f"{minutes(config.max_lag_pass_interval_ms)}); the first due is {name}, which {when} and is planned in "
        f"{minutes(first.dirty_since - horizon)}"
    )


def _what_it_does(estimate: dict, config: PlannerConfig) -> str:
    """What a plan does with its records (`expected_effect`'s action), and what it is expected to remove."""
    if estimate["action"] == "copy":
        return (
            f"copied as they are: no level below L{config.dedup_from_level} is deduplicated (duplicates stay until a plan "
            f"into L{config.dedup_from_level} removes them), only expired records of retention topics are removed"
        )
    if estimate["action"] == "rewrite":
        return (
            "no duplicates to remove (each partition's sections here are already deduplicated, or within their min lag): "
            "the files are rewritten into fewer, only tombstones past delete.retention.ms and expired records are removed"
        )
    return (
        f"~{estimate['estimated_records_removed']:,} duplicates removed (estimated from the sections' key sketches), "
        f"~{mib(estimate['estimated_output_bytes'])} stored out"
    )


def minutes(ms: int) -> str:
    return f"{max(0, ms) / MINUTE_MS:,.0f} min"
