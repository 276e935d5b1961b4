"""Regular planning: leveled merges up to the top level, then size tiers; and the full sweep."""

from __future__ import annotations

from typing import Iterable

from logcompact.catalog import DataFile, Manifest
from logcompact.engine.plan import MAX_LEVEL, Plan, new_plan_id, outside_floors
from logcompact.planner.config import PlannerConfig


def content_of(manifest: Manifest, data_file: DataFile) -> str:
    """'compacted' when the file holds compacted topics' records. Above L0, where this is asked, a file holds
    one kind only (the L0 to L1 job splits them), so its first section tells."""
    return "compacted" if manifest.topics[data_file.sections[0].info.topic].config.compacted else "other"


def top_level(manifest: Manifest, config: PlannerConfig) -> int:
    upper = sum(1 for f in manifest.files.values() if f.level >= 1)
    rule = config.big_cluster_top if upper >= config.big_cluster_files else config.small_cluster_top
    return max([rule] + [f.level for f in manifest.files.values()])


def make_plan(
    manifest: Manifest, inputs: Iterable[DataFile], target_level: int, now_ms: int, config: PlannerConfig, mode: str
) -> Plan:
    inputs = sorted(inputs, key=lambda f: f.key)
    keys = {f.key for f in inputs}
    partitions: set[tuple[str, int]] = set()
    for key in keys:
        partitions.update(manifest.file_partitions(key))
    topics = sorted({topic for topic, _ in partitions})
    return Plan(
        plan_id=new_plan_id(now_ms),
        cluster_id=manifest.cluster_id,
        manifest_version=manifest.version,
        now_ms=now_ms,
        mode=mode,
        target_level=target_level,
        deduplicate=target_level >= config.dedup_from_level,
        inputs=tuple(inputs),
        topics={name: manifest.topics[name] for name in topics},
        outside_floors=outside_floors(manifest, keys, partitions),
        buffer_bytes=config.buffer_bytes,
        target_file_bytes=config.target_file_bytes,
        max_partition_bytes=config.max_partition_bytes,
    )


def size_tiers(files: list[DataFile], config: PlannerConfig) -> list[list[DataFile]]:
    """Runs of files of similar size (within the ratio of the run's smallest) with enough files to merge."""
    tiers, run = [], []
    for data_file in sorted(files, key=lambda f: (f.size, f.key)):
        if run and data_file.size > run[0].size * config.tier_size_ratio:
            if len(run) >= config.tier_min_files:
                tiers.append(run)
            run = []
        run.append(data_file)
    if len(run) >= config.tier_min_files:
        tiers.append(run)
    return tiers


def plan_regular(manifest: Manifest, now_ms: int, config: PlannerConfig, leased: set[str]) -> list[Plan]:
    top = top_level(manifest, config)
    available = [f for f in manifest.files.values() if f.key not in leased]
    plans = []
    for level in range(top):
        at_level = [f for f in available if f.level == level]
        # L0 files mix both kinds (the L0 -> L1 job separates them); above, each kind is merged apart.
        kinds = [at_level] if level == 0 else _by_content(manifest, at_level)
        for files in kinds:
            if len(files) >= config.min_files[min(level, len(config.min_files) - 1)]:
                plans.append(make_plan(manifest, files, level + 1, now_ms, config, "regular"))
    for files in _by_content(manifest, [f for f in available if f.level == top]):
        for tier in size_tiers(files, config):
            plans.append(make_plan(manifest, tier, top, now_ms, config, "regular"))
    return plans


def plan_full_sweep(
    manifest: Manifest, now_ms: int, config: PlannerConfig, leased: set[str], topics: list[str] | None = None
) -> Plan | None:
    """Every live file holding the chosen topics (all by default), across sizes, into the top level."""
    for name in topics or ():
        manifest.topic(name)  # an unknown topic is an error, not an empty sweep
    chosen = set(topics) if topics else set(manifest.topics)
    if chosen == set(manifest.topics):
        inputs = [f for key, f in manifest.files.items() if key not in leased]
    else:
        inputs = [f for f in manifest.files.values() if f.key not in leased and not chosen.isdisjoint(f.topics)]
    if not inputs:
        return None
    return make_plan(manifest, inputs, min(MAX_LEVEL, top_level(manifest, config)), now_ms, config, "full")


def _by_content(manifest: Manifest, files: list[DataFile]) -> list[list[DataFile]]:
    kinds: dict[str, list[DataFile]] = {}
    for data_file in files:
        kinds.setdefault(content_of(manifest, data_file), []).append(data_file)
    return [kinds[k] for k in sorted(kinds)]
