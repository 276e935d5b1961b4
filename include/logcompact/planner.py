"""Choosing what to compact: pure functions from a manifest to plans.

The rule here is the reference's first one: once a level holds `min_files` files (32), all of them are
compacted into the next level; L0 to L1 copies, and from `dedup_from_level` (L2) up records are
deduplicated. A full sweep takes every live file holding the chosen topics into the top level.
"""

from __future__ import annotations

from logcompact.catalog import Manifest
from logcompact.engine.offset_map import DEFAULT_BUFFER_BYTES
from logcompact.engine.plan import DEFAULT_TARGET_FILE_BYTES, MAX_LEVEL, Plan, new_plan_id, outside_floors


DEFAULT_MIN_FILES = 32
DEFAULT_DEDUP_FROM_LEVEL = 2


def _plan(manifest: Manifest, inputs, target_level: int, now_ms: int, dedup_from_level: int, mode: str, **options) -> Plan:
    keys = {f.key for f in inputs}
    topics = {s.topic for f in inputs for s in f.sections}
    return Plan(
        plan_id=new_plan_id(now_ms),
        cluster_id=manifest.cluster_id,
        manifest_version=manifest.version,
        now_ms=now_ms,
        mode=mode,
        target_level=target_level,
        deduplicate=target_level >= dedup_from_level,
        inputs=tuple(sorted(inputs, key=lambda f: f.key)),
        topics={name: manifest.topics[name] for name in sorted(topics)},
        outside_floors=outside_floors(manifest, keys),
        **options,
    )


def plan_level_merges(
    manifest: Manifest,
    now_ms: int,
    min_files: int = DEFAULT_MIN_FILES,
    dedup_from_level: int = DEFAULT_DEDUP_FROM_LEVEL,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
) -> list[Plan]:
    """One plan per level below the top that holds at least `min_files` live files."""
    plans = []
    for level in range(MAX_LEVEL):
        files = manifest.files_at(level)
        if len(files) >= min_files:
            plans.append(
                _plan(manifest, files, level + 1, now_ms, dedup_from_level, "regular",
                      buffer_bytes=buffer_bytes, target_file_bytes=target_file_bytes)
            )
    return plans


def plan_full_sweep(
    manifest: Manifest,
    now_ms: int,
    topics: list[str] | None = None,
    dedup_from_level: int = DEFAULT_DEDUP_FROM_LEVEL,
    buffer_bytes: int = DEFAULT_BUFFER_BYTES,
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES,
) -> Plan | None:
    """Every live file holding the chosen topics (all by default), deduplicated together into the top level."""
    for name in topics or ():
        manifest.topic(name)  # raises TopicNotFoundError for an unknown name
    chosen = set(topics) if topics else set(manifest.topics)
    inputs = [f for f in manifest.files.values() if any(s.topic in chosen for s in f.sections)]
    if not inputs:
        return None
    top = max([dedup_from_level] + [f.level for f in manifest.files.values()])
    return _plan(manifest, inputs, top, now_ms, dedup_from_level, "full",
                 buffer_bytes=buffer_bytes, target_file_bytes=target_file_bytes)


