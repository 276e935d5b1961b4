"""The engine's cost model: what a plan would write and request, computed from the catalog alone.

Per partition, a deduplicating plan keeps about as many records as its inputs have distinct keys (the
sections' key sketches, merged); a copy keeps them all. Bytes scale with records. Outputs are cut at the
target file size at section boundaries, as the engine cuts them. Requests: two GETs per input file for a
deduplicating plan (the two passes' streams), one for a copy; one PUT per output file and one for the
commit. `tests/test_simulate.py` checks this model against real engine runs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from logcompact import sketch
from logcompact.catalog import CatalogSection, DataFile
from logcompact.engine.plan import Plan
from logcompact.format.layout import SectionInfo


@dataclass
class JobCost:
    outputs: list[DataFile]
    records_in: int
    records_out: int
    bytes_in: int
    bytes_out: int
    gets: int
    puts: int


def estimate_job(plan: Plan) -> JobCost:
    by_partition: dict[tuple[str, int], list[CatalogSection]] = {}
    for data_file in plan.inputs:
        for section in data_file.sections:
            by_partition.setdefault((section.topic, section.partition), []).append(section)
    files: dict[str, list[list[CatalogSection]]] = {"compacted": [[]], "other": [[]]}
    sizes = {"compacted": 0, "other": 0}
    records_in = records_out = bytes_out = 0
    for (topic, partition), sections in sorted(by_partition.items()):
        compacted = plan.topics[topic].config.compacted
        infos = [s.info for s in sections]
        records = sum(i.record_count for i in infos)
        length = sum(i.byte_length for i in infos)
        sketches = [sketch.decode(i.key_sketch) for i in infos if i.key_sketch]
        merged = sketch.merge(*sketches) if sketches else np.zeros(sketch.REGISTERS, dtype=np.uint8)
        kept = records
        if plan.deduplicate and compacted and sketches:
            kept = max(1, min(records, round(sketch.estimate(merged))))
        out_bytes = round(length * kept / records) if records else 0
        records_in += records
        records_out += kept
        bytes_out += out_bytes
        first = min(s.first_offset for s in sections)
        last = max(s.last_offset for s in sections)
        content = "compacted" if compacted else "other"
        if sizes[content] >= plan.target_file_bytes:
            files[content].append([])
            sizes[content] = 0
        info = SectionInfo(
            topic, partition, kept, last - first, min(i.min_timestamp for i in infos), max(i.max_timestamp for i in infos),
            0, round(sum(i.uncompressed_bytes for i in infos) * kept / records) if records else 0, plan.compression, 0,
            sizes[content], out_bytes, (last - first + 1) if plan.deduplicate and compacted else 0,
            sketch.encode(merged) if sketches else "",
        )
        files[content][-1].append(CatalogSection(info, first))
        sizes[content] += out_bytes
    outputs = []
    for content, groups in files.items():
        for number, group in enumerate(g for g in groups if g):
            key = plan.output_key(content, number)
            outputs.append(DataFile(key, plan.target_level, sum(s.info.byte_length for s in group), plan.now_ms, tuple(group)))
    gets = len(plan.inputs) * (2 if plan.deduplicate else 1)
    return JobCost(outputs, records_in, records_out, sum(f.size for f in plan.inputs), bytes_out, gets, len(outputs) + 1)

