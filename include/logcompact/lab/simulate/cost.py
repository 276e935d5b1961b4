"""The engine's cost model: what a plan would write and request, computed from the catalog alone.

Per partition, a deduplicating plan keeps about as many records as its inputs have distinct keys (the
sections' key sketches, merged); a copy keeps them all. A section's share of its file's bytes is its share
of the file's uncompressed bytes (small sections share blocks, so their byte ranges overlap); a partition's
output keeps its records' share of those bytes, plus one section's overhead. Outputs are cut at the target
file size at section boundaries, as the engine cuts them. Min lag as the engine keeps it, by section: from a
partition's first uncleanable offset on (the plan's, or its inputs' first section holding a record within
min.compaction.lag.ms) sections are copied whole into a section of their own in the plan's young files, never
clean; the engine cuts at the first young record (or at the plan's first uncleanable offset when its inputs
lie on both sides of it), this model at that record's section. Requests: two GETs per
input file for a deduplicating plan (the two passes' streams), one for a copy; one PUT per output file and one
for the commit. `tests/test_simulate.py` checks this model against real engine runs.

It works on the inputs' sections as columns (`SimulatedFile`), summed up per (partition, young) in vectorized steps: a
simulated hour estimates millions of sections. Its floats are Python's, in its order: a section's share of its
file's bytes is one correctly rounded division, and a partition's shares are added one after the other.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from logcompact import sketch
from logcompact.catalog import TopicPartition
from logcompact.lab.simulate.files import Layout, SimulatedFile, merge_sketches
from logcompact.plans import Plan

# What a section costs in a file beyond its records' bytes: its footer entry and its share of a block's framing
# (bench/partitions.py measures 63 to 68 bytes for 3-record sections in files of 1,000 and 10,000 partitions).
SECTION_OVERHEAD_BYTES = 60
CONTENTS = ("compacted", "other", "young")  # the kinds of output files, in the order a plan's outputs list them


@dataclass
class JobCost:
    outputs: list[SimulatedFile]  # placed at their sections' first offsets
    young_outputs: set[str]  # keys of the outputs holding the sections kept whole for min lag
    first_uncleanable: dict[TopicPartition, int]  # per partition with young input sections, the first one's offset
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    gets: int
    puts: int


_NEVER = 1 << 62
_EXACT = 1 << 53  # integers up to this convert to floats exactly


def first_uncleanable(plan: Plan, inputs: Sequence[SimulatedFile], layout: Layout) -> dict[TopicPartition, int]:
    """Per partition of a compacted topic with min.compaction.lag.ms, the plan's first uncleanable offset lowered to
    its first input section holding a record within the lag; partitions with neither are left out."""
    found = {tp: offset for tp, offset in plan.first_uncleanable.items() if plan.topics[tp[0]].config.compacted}
    young_after = np.array([
        plan.now_ms - topic.config.min_compaction_lag_ms if topic.config.compacted and topic.config.min_compaction_lag_ms > 0 else _NEVER
        for topic in layout.topics
    ], dtype=np.int64)
    if (young_after == _NEVER).all() or not inputs:
        return found
    slot = np.concatenate([f.slot for f in inputs])
    newest = young_after[layout.topic_of_slot[slot]]
    young = (newest != _NEVER) & (np.concatenate([f.max_timestamp for f in inputs]) > newest)
    for tp, first in layout.lowest(slot[young], np.concatenate([f.offsets for f in inputs])[young]).items():
        found[tp] = min(found.get(tp, first), first)
    return found


def estimate_job(plan: Plan, inputs: Sequence[SimulatedFile] | None = None, layout: Layout | None = None) -> JobCost:
    """What `plan` would write and request. `inputs`: its input files as columns, in its order, and the `layout` their
    slots number partitions by (by default made from the plan's inputs)."""
    if layout is None:
        layout = Layout([plan.topics[name] for name in sorted(plan.topics)])
    if inputs is None:
        inputs = [SimulatedFile.of_data_file(data_file, layout) for data_file in plan.inputs]
    cuts = first_uncleanable(plan, inputs, layout)
    counts = np.array([len(f) for f in inputs], dtype=np.int64)
    count = int(counts.sum())

    def column(name: str) -> np.ndarray:
        return np.concatenate([getattr(f, name) for f in inputs]) if inputs else np.zeros(0, dtype=np.int64)

    slot, first = column("slot"), column("offsets")
    cut = np.full(layout.size, _NEVER, dtype=np.int64)
    for (topic, partition), offset in cuts.items():
        cut[layout.bases[topic] + partition] = offset
    young = first >= cut[slot]
    # Sorted as (topic name, partition, young) sort; a stable sort keeps each group's sections in input order.
    codes = (layout.name_rank_of_slot[slot] << 33) | (layout.partition_of_slot[slot] << 1) | young
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if count else np.zeros(0, np.int64)
    groups = len(starts)
    lengths = np.diff(np.append(starts, count))

    def summed(values: np.ndarray, ufunc: np.ufunc = np.add) -> np.ndarray:
        return ufunc.reduceat(values[order], starts) if groups else np.zeros(0, dtype=values.dtype)

    records, uncompressed = summed(column("record_count")), summed(column("uncompressed_bytes"))
    firsts, lasts = summed(first, np.minimum), summed(first + column("last_delta"), np.maximum)
    min_timestamps, max_timestamps = summed(column("min_timestamp"), np.minimum), summed(column("max_timestamp"), np.maximum)
    # Each group's key sketches merged, file by file: a file holds one section a partition, so one of a group at most.
    group = np.empty(count, dtype=np.int64)
    group[order] = np.repeat(np.arange(groups), lengths)
    registers = np.zeros((groups, sketch.REGISTERS), dtype=np.uint8)
    for data_file, rows in zip(inputs, np.split(group, np.cumsum(counts)[:-1])):
        merge_sketches(registers, rows, data_file.registers)
    shared = _shared_bytes(inputs, counts, order, starts, lengths)

    group_slot = slot[order][starts]
    is_young = young[order][starts]
    compacted = layout.compacted_of_slot[group_slot]
    deduplicated = plan.deduplicate & compacted & ~is_young
    has_keys = registers.any(axis=1)
    kept = records.copy()
    estimated = deduplicated & has_keys
    if estimated.any():
        distinct = np.rint(sketch.estimate_rows(registers[estimated])).astype(np.int64)
        kept[estimated] = np.maximum(1, np.minimum(records[estimated], distinct))
    fraction = np.divide(kept, records, out=np.zeros(groups), where=records > 0)
    payload = np.maximum(0.0, shared - lengths * SECTION_OVERHEAD_BYTES)
    out_bytes = np.rint(payload * fraction).astype(np.int64) + SECTION_OVERHEAD_BYTES
    span = lasts - firsts

    # Outputs are cut at the target file size, at group (section) boundaries, each kind of content apart.
    kinds = np.where(is_young, 2, np.where(compacted, 0, 1))
    numbers, byte_offsets = np.zeros(groups, np.int64), np.zeros(groups, np.int64)
    sizes, made = [0] * len(CONTENTS), [0] * len(CONTENTS)
    for g, (kind, size) in enumerate(zip(kinds.tolist(), out_bytes.tolist())):
        if sizes[kind] >= plan.target_file_bytes:
            made[kind] += 1
            sizes[kind] = 0
        numbers[g], byte_offsets[g] = made[kind], sizes[kind]
        sizes[kind] += size
    outputs, young_outputs = [], set()
    by_file = np.lexsort((numbers, kinds))  # stable: each file's sections in group order
    cuts_between = np.flatnonzero((np.diff(kinds[by_file]) != 0) | (np.diff(numbers[by_file]) != 0)) + 1
    for rows in np.split(by_file, cuts_between) if groups else []:
        kind, number = CONTENTS[int(kinds[rows[0]])], int(numbers[rows[0]])
        key = plan.output_key(kind, number)
        held = len(rows)
        outputs.append(SimulatedFile(
            key, plan.target_level, int(out_bytes[rows].sum()), plan.now_ms, group_slot[rows], kept[rows], span[rows], min_timestamps[rows],
            max_timestamps[rows], np.zeros(held, np.int64), np.rint(uncompressed[rows] * fraction[rows]).astype(np.int64),
            [plan.compression] * held, np.zeros(held, np.int64), byte_offsets[rows], out_bytes[rows],
            np.where(deduplicated[rows], span[rows] + 1, 0), registers[rows], np.zeros(held, np.int64), firsts[rows],
        ))
        if kind == "young":
            young_outputs.add(key)
    gets = len(inputs) * (2 if plan.deduplicate else 1)
    return JobCost(outputs, young_outputs, cuts, int(records.sum()), int(kept.sum()), sum(f.size for f in inputs), int(out_bytes.sum()),
                   gets, len(outputs) + 1)


def _shared_bytes(inputs: Sequence[SimulatedFile], counts: np.ndarray, order: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Per group, its sections' shares of their files' bytes (a section's share of its file's uncompressed bytes),
    added in the group's order from 0.0 as Python adds floats one by one (`sum()` compensates from 3.12)."""
    if not len(starts):
        return np.zeros(0)
    uncompressed = np.concatenate([f.uncompressed_bytes for f in inputs])
    sizes = np.repeat(np.array([f.size for f in inputs], dtype=np.int64), counts)
    totals = np.repeat(np.array([int(f.uncompressed_bytes.sum()) for f in inputs], dtype=np.int64), counts)
    within = np.repeat(counts, counts)
    if int(sizes.max()) * int(uncompressed.max()) < _EXACT and int(totals.max()) < _EXACT:
        shares = np.where(totals > 0, (sizes * uncompressed) / np.maximum(totals, 1), sizes / within)
    else:  # a product past 2**53 would round before the division: Python's integers divide it exactly
        shares = np.array([size * part / total if total else size / n for size, part, total, n
                           in zip(sizes.tolist(), uncompressed.tolist(), totals.tolist(), within.tolist())])
    # One column a position within the groups: adding column after column adds each group's shares in order.
    table = np.zeros((len(starts), int(lengths.max())))
    table[np.repeat(np.arange(len(starts)), lengths), np.arange(len(order)) - np.repeat(starts, lengths)] = shares[order]
    shared = np.zeros(len(starts))
    for position in table.T:
        shared += position
    return shared
