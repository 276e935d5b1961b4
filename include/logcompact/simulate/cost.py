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

import numpy as np

from logcompact import sketch
from logcompact.catalog import CatalogSection, DataFile
from logcompact.format.layout import SectionInfo
from logcompact.plan import Plan, TopicPartition

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


@dataclass
class _Partition:
    """What a plan's inputs hold of one partition."""

    records: int = 0
    bytes: float = 0.0
    sections: int = 0
    uncompressed_bytes: int = 0
    first: int = 1 << 62
    last: int = -1
    min_timestamp: int = 1 << 62
    max_timestamp: int = -(1 << 62)
    registers: np.ndarray | None = None

    def add(self, section: CatalogSection, share_bytes: float) -> None:
        info = section.info
        self.records += info.record_count
        self.bytes += share_bytes
        self.sections += 1
        self.uncompressed_bytes += info.uncompressed_bytes
        self.first = min(self.first, section.first_offset)
        self.last = max(self.last, section.last_offset)
        self.min_timestamp = min(self.min_timestamp, info.min_timestamp)
        self.max_timestamp = max(self.max_timestamp, info.max_timestamp)
        if info.key_sketch:
            registers = sketch.decode(info.key_sketch)
            self.registers = registers if self.registers is None else np.maximum(self.registers, registers)


def first_uncleanable(plan: Plan) -> dict[TopicPartition, int]:
    """Per partition of a compacted topic with min.compaction.lag.ms, the plan's first uncleanable offset lowered to
    its first input section holding a record within the lag; partitions with neither are left out."""
    found = {tp: offset for tp, offset in plan.first_uncleanable.items() if plan.topics[tp[0]].config.compacted}
    for data_file in plan.inputs:
        for section in data_file.sections:
            config = plan.topics[section.topic].config
            if config.compacted and config.min_compaction_lag_ms > 0 and section.info.max_timestamp > plan.now_ms - config.min_compaction_lag_ms:
                tp = (section.topic, section.partition)
                found[tp] = min(found.get(tp, section.first_offset), section.first_offset)
    return found


def estimate_job(plan: Plan) -> JobCost:
    cuts = first_uncleanable(plan)
    by_partition: dict[tuple[str, int, bool], _Partition] = {}  # (topic, partition, young)
    for data_file in plan.inputs:
        uncompressed = sum(s.info.uncompressed_bytes for s in data_file.sections)
        for section in data_file.sections:
            share = data_file.size * section.info.uncompressed_bytes / uncompressed if uncompressed else data_file.size / len(data_file.sections)
            young = section.first_offset >= cuts.get((section.topic, section.partition), 1 << 62)
            found = by_partition.get((section.topic, section.partition, young))
            if found is None:
                found = by_partition[(section.topic, section.partition, young)] = _Partition()
            found.add(section, share)
    files: dict[str, list[list[CatalogSection]]] = {"compacted": [[]], "other": [[]], "young": [[]]}
    sizes = {"compacted": 0, "other": 0, "young": 0}
    records_out = bytes_out = 0
    for (topic, partition, young), held in sorted(by_partition.items()):
        compacted = plan.topics[topic].config.compacted
        deduplicated = plan.deduplicate and compacted and not young
        kept = held.records
        if deduplicated and held.registers is not None:
            kept = max(1, min(held.records, round(sketch.estimate(held.registers))))
        fraction = kept / held.records if held.records else 0.0
        payload = max(0.0, held.bytes - held.sections * SECTION_OVERHEAD_BYTES)
        out_bytes = round(payload * fraction) + SECTION_OVERHEAD_BYTES
        records_out += kept
        bytes_out += out_bytes
        content = "young" if young else "compacted" if compacted else "other"
        if sizes[content] >= plan.target_file_bytes:
            files[content].append([])
            sizes[content] = 0
        span = held.last - held.first
        info = SectionInfo(
            topic=topic, partition=partition, record_count=kept, last_delta=span, min_timestamp=held.min_timestamp,
            max_timestamp=held.max_timestamp, tombstones=0, uncompressed_bytes=round(held.uncompressed_bytes * fraction),
            compression=plan.compression, crc32=0, byte_offset=sizes[content], byte_length=out_bytes,
            clean_below_delta=span + 1 if deduplicated else 0,
            key_sketch=sketch.encode(held.registers) if held.registers is not None else b"",
        )
        files[content][-1].append(CatalogSection(info, held.first))
        sizes[content] += out_bytes
    outputs, young_outputs = [], set()
    for content, groups in files.items():
        for number, group in enumerate(g for g in groups if g):
            key = plan.output_key(content, number)
            outputs.append(DataFile(key, plan.target_level, sum(s.info.byte_length for s in group), plan.now_ms, tuple(group)))
            if content == "young":
                young_outputs.add(key)
    records_in = sum(p.records for p in by_partition.values())
    gets = len(plan.inputs) * (2 if plan.deduplicate else 1)
    return JobCost(outputs, young_outputs, cuts, records_in, records_out, sum(f.size for f in plan.inputs), bytes_out, gets, len(outputs) + 1)
