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
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from operator import add, itemgetter

import numpy as np

from logcompact import sketch
from logcompact.catalog import CatalogSection, DataFile, TopicPartition
from logcompact.format.layout import SectionInfo
from logcompact.plans import Plan, input_offsets

# What a section costs in a file beyond its records' bytes: its footer entry and its share of a block's framing
# (bench/partitions.py measures 63 to 68 bytes for 3-record sections in files of 1,000 and 10,000 partitions).
SECTION_OVERHEAD_BYTES = 60


@dataclass
class JobCost:
    outputs: list[DataFile]
    young_outputs: set[str]  # keys of the outputs holding the sections kept whole for min lag
    first_uncleanable: dict[TopicPartition, int]  # per partition with young input sections, the first one's offset
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    gets: int
    puts: int


_NEVER = 1 << 62
_FIELD = {name: number for number, name in enumerate(SectionInfo._fields)}


def first_uncleanable(plan: Plan) -> dict[TopicPartition, int]:
    """Per partition of a compacted topic with min.compaction.lag.ms, the plan's first uncleanable offset lowered to
    its first input section holding a record within the lag; partitions with neither are left out."""
    found = {tp: offset for tp, offset in plan.first_uncleanable.items() if plan.topics[tp[0]].config.compacted}
    young_after = {
        name: plan.now_ms - topic.config.min_compaction_lag_ms
        for name, topic in plan.topics.items() if topic.config.compacted and topic.config.min_compaction_lag_ms > 0
    }
    if young_after:
        for tp, first in input_offsets(plan.inputs, young_after).young.items():
            found[tp] = min(found.get(tp, first), first)
    return found


def estimate_job(plan: Plan) -> JobCost:
    """What `plan` would write and request. Its inputs' sections are summed up per (partition, young) column-wise:
    a simulated hour estimates millions of them."""
    cuts = first_uncleanable(plan)
    sections = [section for data_file in plan.inputs for section in data_file.sections]
    infos = [info for info, _ in sections]
    count = len(sections)

    def column(name: str) -> np.ndarray:
        return np.fromiter(map(itemgetter(_FIELD[name]), infos), np.int64, count)

    ranks = {name: rank for rank, name in enumerate(sorted(plan.topics))}
    first = np.fromiter(map(itemgetter(1), sections), np.int64, count)
    partition = column("partition")
    young = np.fromiter(
        (offset >= cuts.get((info.topic, info.partition), _NEVER) for info, offset in sections), bool, count
    ) if cuts else np.zeros(count, bool)
    # Sorted as (topic, partition, young) tuples sort; a stable sort keeps each group's sections in input order.
    codes = (np.fromiter((ranks[info.topic] for info in infos), np.int64, count) << 33) | (partition << 1) | young
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    starts = np.flatnonzero(np.concatenate(([True], ordered[1:] != ordered[:-1]))) if count else np.zeros(0, np.int64)
    groups = len(starts)
    group = np.empty(count, np.int64)
    group[order] = np.repeat(np.arange(groups), np.diff(np.append(starts, count)))
    # A section's share of its file's bytes, and their sums, in Python's floats and order, as the model defines them.
    shares: list[float] = []
    for data_file in plan.inputs:
        within = [info.uncompressed_bytes for info, _ in data_file.sections]
        total = sum(within)
        shares.extend(data_file.size * size / total if total else data_file.size / len(within) for size in within)
    ordered_shares = [shares[n] for n in order.tolist()]
    bounds = [*starts.tolist(), count]
    shared = [reduce(add, ordered_shares[bounds[g]:bounds[g + 1]], 0.0) for g in range(groups)]  # not sum(): compensated from 3.12

    def summed(values: np.ndarray, ufunc: np.ufunc = np.add) -> list[int]:
        return ufunc.reduceat(values[order], starts).tolist() if groups else []

    records, uncompressed = summed(column("record_count")), summed(column("uncompressed_bytes"))
    firsts, lasts = summed(first, np.minimum), summed(first + column("last_delta"), np.maximum)
    min_timestamps, max_timestamps = summed(column("min_timestamp"), np.minimum), summed(column("max_timestamp"), np.maximum)
    registers = sketch.registers_by_group(group, [info.key_sketch for info in infos], groups)
    files: dict[str, list[list[CatalogSection]]] = {"compacted": [[]], "other": [[]], "young": [[]]}
    sizes = {"compacted": 0, "other": 0, "young": 0}
    records_out = bytes_out = 0
    names = sorted(plan.topics)
    for g, code in enumerate(ordered[starts].tolist()):
        topic, number, is_young = names[code >> 33], (code >> 1) & 0xFFFFFFFF, bool(code & 1)
        compacted = plan.topics[topic].config.compacted
        deduplicated = plan.deduplicate and compacted and not is_young
        has_keys = bool(registers[g].any())
        held = records[g]
        kept = held
        if deduplicated and has_keys:
            kept = max(1, min(held, round(sketch.estimate(registers[g]))))
        fraction = kept / held if held else 0.0
        payload = max(0.0, shared[g] - (bounds[g + 1] - bounds[g]) * SECTION_OVERHEAD_BYTES)
        out_bytes = round(payload * fraction) + SECTION_OVERHEAD_BYTES
        records_out += kept
        bytes_out += out_bytes
        content = "young" if is_young else "compacted" if compacted else "other"
        if sizes[content] >= plan.target_file_bytes:
            files[content].append([])
            sizes[content] = 0
        span = lasts[g] - firsts[g]
        info = SectionInfo(
            topic=topic, partition=number, record_count=kept, last_delta=span, min_timestamp=min_timestamps[g],
            max_timestamp=max_timestamps[g], tombstones=0, uncompressed_bytes=round(uncompressed[g] * fraction),
            compression=plan.compression, crc32=0, byte_offset=sizes[content], byte_length=out_bytes,
            clean_below_delta=span + 1 if deduplicated else 0,
            key_sketch=sketch.encode(registers[g]) if has_keys else b"",
        )
        files[content][-1].append(CatalogSection(info, firsts[g]))
        sizes[content] += out_bytes
    outputs, young_outputs = [], set()
    for content, made in files.items():
        for number, group_sections in enumerate(g for g in made if g):
            key = plan.output_key(content, number)
            outputs.append(DataFile(key, plan.target_level, sum(s.info.byte_length for s in group_sections), plan.now_ms, tuple(group_sections)))
            if content == "young":
                young_outputs.add(key)
    gets = len(plan.inputs) * (2 if plan.deduplicate else 1)
    return JobCost(outputs, young_outputs, cuts, sum(records), records_out, sum(f.size for f in plan.inputs), bytes_out, gets, len(outputs) + 1)
