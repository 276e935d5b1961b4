"""A plan's expected effect, from the catalog alone: bytes, files, and records a deduplication removes."""

from __future__ import annotations

from logcompact import sketch
from logcompact.plans import Plan


def expected_effect(plan: Plan) -> dict:
    """Input and output bytes, files replaced, groups, and records removed estimated from the sections' key
    sketches (a deduplicated partition keeps about as many records as it has distinct keys), and at most how many
    records of aborted transactions it removes (`aborted_records`) and about their uncompressed bytes (`aborted_bytes`)."""
    records_in = removed = 0
    per_partition: dict[tuple[str, int], list] = {}
    spans: dict[tuple[str, int], tuple[int, int]] = {}
    for data_file in plan.inputs:
        for section in data_file.sections:
            records_in += section.info.record_count
            tp = (section.topic, section.partition)
            per_partition.setdefault(tp, []).append(section.info)
            low, high = spans.get(tp, (section.first_offset, section.last_offset))
            spans[tp] = (min(low, section.first_offset), max(high, section.last_offset))
    # Aborted transactions' records: at most one per offset of their ranges within the inputs (all of them until a
    # compaction removes them), of their partition's mean size.
    aborted = aborted_bytes = 0
    for tp, ranges in plan.aborted.items():
        if tp in spans:
            count = sum(max(0, min(last, spans[tp][1]) - max(first, spans[tp][0]) + 1) for first, last in ranges)
            infos = per_partition[tp]
            aborted += count
            aborted_bytes += count * sum(i.uncompressed_bytes for i in infos) // max(1, sum(i.record_count for i in infos))
    if plan.deduplicate:
        for (topic, _partition), infos in per_partition.items():
            if not plan.topics[topic].config.compacted:
                continue
            removed += sketch.estimated_duplicates(sum(i.record_count for i in infos), [i.key_sketch for i in infos])
    bytes_in = sum(f.size for f in plan.inputs)
    kept = (records_in - removed) / records_in if records_in else 1.0
    return {
        "plan_id": plan.plan_id,
        "mode": plan.mode,
        "target_level": plan.target_level,
        "deduplicate": plan.deduplicate,
        "files_replaced": len(plan.inputs),
        "input_levels": sorted({f.level for f in plan.inputs}),
        "input_bytes": bytes_in,
        "records_in": records_in,
        "estimated_records_removed": removed,
        "aborted_records": aborted,
        "aborted_bytes": aborted_bytes,
        "estimated_output_bytes": round(bytes_in * kept),
        "groups": len(plan.groups),
    }
