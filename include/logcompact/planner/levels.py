"""Regular planning: leveled merges up to the top level, then size tiers, and the partitions past their dirty
ratio (`dirty_ratio`); the full sweep; and making plans.

Level plans are chosen from file summaries (key, level, size, content: no sections); the chosen files' sections are
read as columns, in one read for all the plans of a pass (`planner.columns`), and loaded whole only where something
needs them as objects.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import TypeVar

import numpy as np

from logcompact.catalog import DataFile, FileSummary, PlanningSnapshot, TopicPartition
from logcompact.catalog.columns import SectionColumns, ordered_then_by_key
from logcompact.limits import MAX_LEVEL
from logcompact.planner.columns import Loader, lowest_unplanned, offsets_by_plan, planned_inputs, read_columns, reads_columns, young_after
from logcompact.planner.config import PlannerConfig
from logcompact.planner.dirty_ratio import ratio_plan_files
from logcompact.plans import InputOffsets, Plan, new_plan_id, split_into_groups
from logcompact.plans.grouping import lowest_outside_of_keys

Sized = TypeVar("Sized", FileSummary, DataFile)
# A regular pass whose due levels hold this share of the live files reads every live file's columns at once.
_MOST_FILES = 0.9
_NO_OFFSET = 1 << 62


def top_level(level_counts: dict[int, int], config: PlannerConfig) -> int:
    """The top level from the live files per level (`Snapshot.level_counts`)."""
    upper = sum(count for level, count in level_counts.items() if level >= 1)
    rule = config.big_cluster_top if upper >= config.big_cluster_files else config.small_cluster_top
    return max([rule, *level_counts])


def size_tiers(files: list[Sized], config: PlannerConfig) -> list[list[Sized]]:
    """Runs of files of similar size (within the ratio of the run's smallest) with enough files to merge."""
    order = ordered_then_by_key([f.key for f in files], np.array([f.size for f in files], np.int64))
    sizes = np.array([files[n].size for n in order.tolist()], np.int64)
    return [[files[n] for n in order[start:end].tolist()] for start, end in _tier_bounds(sizes, config)]


def _tier_bounds(sizes: np.ndarray, config: PlannerConfig) -> list[tuple[int, int]]:
    """`size_tiers` of sizes in increasing order: where each tier starts and ends. A run takes every size up to its
    smallest times the ratio: one search a run, none a file."""
    bounds = []
    start = 0
    while start < len(sizes):
        end = max(start + 1, int(np.searchsorted(sizes, sizes[start] * config.tier_size_ratio, side="right")))
        if end - start >= config.tier_min_files:
            bounds.append((start, end))
        start = end
    return bounds


def plan_regular(snapshot: PlanningSnapshot, now_ms: int, config: PlannerConfig, leased: set[str]) -> list[Plan]:
    """The level merges and size tiers due, and one plan over the partitions past their topic's
    min.cleanable.dirty.ratio (`dirty_ratio`). The files of a level are read only when it holds enough of them to
    be due: most passes read the few hundred L0 files, not the 100,000 above (bench/planner.py, mode l0). When the
    levels due hold most live files, every live file is read at once with its sections' columns, from which the
    merges are chosen and planned."""
    counts = snapshot.level_counts()
    top = top_level(counts, config)
    due = [level for level in range(top) if counts.get(level, 0) >= _min_files(level, config)]
    if counts.get(top, 0) >= config.tier_min_files:
        due.append(top)
    read: tuple[SectionColumns, Loader] | None = None
    if sum(counts.get(level, 0) for level in due) >= _MOST_FILES * sum(counts.values()) and reads_columns(snapshot):
        read = read_columns(snapshot, now_ms)
        columns = read[0]
        if columns.contents is None:
            raise AssertionError("a database snapshot's columns carry the files' contents")
        keys, merges = columns.keys, level_merges(columns.keys, columns.levels, columns.sizes, columns.contents, top, config, leased)
    else:
        summaries = snapshot.file_summaries(*due) if due else []
        keys = [f.key for f in summaries]
        merges = level_merges(
            keys, np.array([f.level for f in summaries], np.int64), np.array([f.size for f in summaries], np.int64),
            [f.content for f in summaries], top, config, leased,
        )
    chosen = [([keys[n] for n in at.tolist()], level) for at, level in merges]
    in_level_plans = {key for keys, _ in chosen for key in keys}
    dirty = ratio_plan_files(snapshot, now_ms, config, leased | in_level_plans)
    if dirty:
        chosen.append((dirty, max(config.dedup_from_level, top)))
        read = None  # its files may be outside the levels read
    if not chosen:
        return []
    # Merges chosen from the columns read name their files by entry there too: no key is looked up again.
    return make_plans(snapshot, chosen, now_ms, config, "regular", read, [at for at, _ in merges] if read is not None else None)


def level_merges(
    keys: Sequence[str], levels: np.ndarray, sizes: np.ndarray, contents: Sequence[str], top: int, config: PlannerConfig, leased: set[str]
) -> list[tuple[np.ndarray, int]]:
    """(input files, target level) of each level below `top` that reached its threshold and each size tier of the top
    level, from the files' keys, levels, sizes and contents in `file_summaries`' order (those of other levels are
    passed over); the files as their entries in those."""
    free = np.fromiter((key not in leased for key in keys), bool, len(keys)) if leased else np.ones(len(keys), bool)
    kinds = sorted(set(contents))
    kind = np.fromiter(map({name: n for n, name in enumerate(kinds)}.__getitem__, contents), np.int64, len(contents))
    chosen: list[tuple[np.ndarray, int]] = []
    for level in range(top + 1):
        at_level = free & (levels == level)
        # L0 files mix both kinds (the L0 -> L1 job separates them); above, each kind is merged apart.
        runs = [at_level] if level == 0 and level < top else [at_level & (kind == n) for n in range(len(kinds))]
        for run in map(np.flatnonzero, runs):
            if level < top and len(run) >= _min_files(level, config):
                chosen.append((run, level + 1))
            elif level == top:
                by_size = run[ordered_then_by_key([keys[n] for n in run.tolist()], sizes[run])]
                chosen.extend((by_size[start:end], top) for start, end in _tier_bounds(sizes[by_size], config))
    return chosen


def plan_full_sweep(
    snapshot: PlanningSnapshot, now_ms: int, config: PlannerConfig, leased: set[str], topics: list[str] | None = None
) -> Plan | None:
    """Every live file holding the chosen topics (all by default), across sizes, into the top level."""
    for name in topics or ():
        snapshot.topic(name)  # an unknown topic is an error, not an empty sweep
    chosen = set(topics) if topics else set(snapshot.topics)
    # The sweep's plan holds every live file (of its topics): reading their columns is the narrowest read there is.
    every = chosen == set(snapshot.topics)
    columns, load = read_columns(snapshot, now_ms, topics=None if every else sorted(chosen))
    counts = dict(Counter(columns.levels.tolist())) if every else snapshot.level_counts()
    # In file summaries' order: by level, creation time and key.
    ordered = ordered_then_by_key(columns.keys, columns.levels, columns.created_ms)
    if leased:
        ordered = ordered[np.fromiter((columns.keys[n] not in leased for n in ordered.tolist()), bool, len(ordered))]
    if not len(ordered):
        return None
    inputs = [columns.keys[n] for n in ordered.tolist()]
    target = min(MAX_LEVEL, top_level(counts, config))
    (sweep,) = make_plans(snapshot, [(inputs, target)], now_ms, config, "full", (columns, load), [ordered])
    return sweep


def make_plans(
    snapshot: PlanningSnapshot,
    chosen: Sequence[tuple[list[str], int]],
    now_ms: int,
    config: PlannerConfig,
    mode: str,
    read: tuple[SectionColumns, Loader] | None = None,
    entries: Sequence[np.ndarray] | None = None,
) -> list[Plan]:
    """One plan per (input keys, target level), split into groups, from the columns of all their inputs' sections,
    read at once (unless the caller has them: `read_columns`, and with them, maybe, each plan's files as `entries`
    there). A plan's outside floors come from the other plans'
    inputs, which are in hand, and from the files no plan takes, which are asked of the catalog (`lowest_outside`)."""
    planned = [key for keys, _ in chosen for key in keys]
    columns, load = read if read is not None else read_columns(snapshot, now_ms, planned)
    if entries is None:
        entry = dict(zip(columns.keys, range(len(columns.keys))))
        entries = [np.fromiter(map(entry.__getitem__, keys), np.int64, len(keys)) for keys, _ in chosen]
    plan_of_file = np.full(len(columns.keys), -1, np.int64)
    for number, at in enumerate(entries):
        plan_of_file[at] = number
    offsets, sections = offsets_by_plan(columns, plan_of_file, len(chosen), young_after(snapshot, now_ms))
    inputs = [planned_inputs(columns, keys, at, count, load) for (keys, _), at, count in zip(chosen, entries, sections.tolist())]
    lowest = [o.lowest for o in offsets]
    partitions = set().union(*lowest)
    held_above_l0: dict[TopicPartition, int] = {}
    for of_plan in offsets:
        for tp, first in of_plan.lowest_above_l0.items():
            held_above_l0[tp] = min(first, held_above_l0.get(tp, first))
    # Holding every live file's sections, the pass has those of the files no plan takes in hand.
    in_hand = (lambda wanted, l0_only: lowest_unplanned(columns, plan_of_file, wanted, l0_only)) if columns.every_live_file else None
    outside = lowest_outside_of_keys(snapshot, planned, partitions, held_above_l0, in_hand)
    # A plan's own inputs are never outside it; the other plans' inputs are: what their lowest offsets (floors)
    # and young sections (Kafka's first uncleanable offset) say counts for it, as the files no plan takes do. The
    # catalog's first uncleanable offsets hold each partition's LSO (an open transaction's data is never cleaned).
    floors_elsewhere = _lowest_elsewhere(lowest, lowest)
    young_outside = snapshot.first_uncleanable_offsets(partitions, now_ms, excluding=planned)
    young_elsewhere = _lowest_elsewhere([o.young for o in offsets], lowest)
    # The aborted ranges over every plan's inputs, read after the LSOs above: each range below a plan's first
    # uncleanable offset is among them (its transaction had ended), so no aborted record is cleaned as committed.
    spans: dict[TopicPartition, tuple[int, int]] = {}
    for of_plan in offsets:
        for tp, first in of_plan.lowest.items():
            low, high = spans.get(tp, (first, of_plan.ends[tp]))
            spans[tp] = (min(low, first), max(high, of_plan.ends[tp]))
    aborted = snapshot.aborted_ranges(spans) if spans else {}
    plans = []
    for number, ((_keys, target_level), of_plan) in enumerate(zip(chosen, offsets)):
        floors = _lowest_of(of_plan.lowest, floors_elsewhere[number], outside)
        young = _lowest_of(of_plan.lowest, young_elsewhere[number], young_outside)
        topics = sorted({topic for topic, _ in of_plan.lowest})
        plans.append(Plan(
            plan_id=new_plan_id(now_ms),
            cluster_id=snapshot.cluster_id,
            manifest_version=snapshot.version,
            now_ms=now_ms,
            mode=mode,
            target_level=target_level,
            deduplicate=target_level >= config.dedup_from_level,
            inputs=inputs[number],
            topics={name: snapshot.topics[name] for name in topics},
            outside_floors=floors,
            first_uncleanable=young,
            aborted=_overlapping(aborted, of_plan),
            groups=split_into_groups(of_plan.sizes, config.group_bytes),
            buffer_bytes=config.buffer_bytes,
            target_file_bytes=config.target_file_bytes,
            max_partition_bytes=config.max_partition_bytes,
        ))
    return plans


def _lowest_elsewhere(per_plan: Sequence[dict[TopicPartition, int]], wanted: Sequence[Iterable[TopicPartition]]) -> list[dict[TopicPartition, int]]:
    """For each plan, per partition of its `wanted` ones, the lowest offset among the other plans' `per_plan`
    offsets. The two lowest per partition and which plan holds the lowest keep a pass over many plans linear."""
    first: dict[TopicPartition, tuple[int, int]] = {}
    second: dict[TopicPartition, int] = {}
    for number, offsets in enumerate(per_plan):
        for tp, offset in offsets.items():
            held = first.get(tp)
            if held is None or offset < held[0]:
                if held is not None:
                    second[tp] = held[0]
                first[tp] = (offset, number)
            elif offset < second.get(tp, _NO_OFFSET):
                second[tp] = offset
    elsewhere: list[dict[TopicPartition, int]] = []
    for number, partitions in enumerate(wanted):
        found = {}
        for tp in partitions:
            held = first.get(tp)
            if held is not None and held[1] != number:
                found[tp] = held[0]
            elif tp in second:
                found[tp] = second[tp]
        elsewhere.append(found)
    return elsewhere


def _overlapping(aborted: dict[TopicPartition, tuple[tuple[int, int], ...]], of_plan: InputOffsets) -> dict[TopicPartition, tuple[tuple[int, int], ...]]:
    """Of `aborted`, the ranges overlapping the offsets a plan's inputs span, per partition."""
    found = {}
    for tp, ranges in aborted.items():
        if tp in of_plan.lowest:
            low, end = of_plan.lowest[tp], of_plan.ends[tp]
            if overlapping := tuple(r for r in ranges if r[1] >= low and r[0] < end):
                found[tp] = overlapping
    return found


def _lowest_of(partitions: dict[TopicPartition, int], *sources: dict[TopicPartition, int]) -> dict[TopicPartition, int]:
    """Per partition of `partitions`, the lowest offset any of `sources` holds (partitions none holds are left out)."""
    found: dict[TopicPartition, int] = {}
    for source in sources:
        for tp in partitions:
            offset, held = source.get(tp), found.get(tp)
            if offset is not None and (held is None or offset < held):
                found[tp] = offset
    return found


def _min_files(level: int, config: PlannerConfig) -> int:
    return config.min_files[min(level, len(config.min_files) - 1)]
