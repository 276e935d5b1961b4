"""A plan's expected effect, from the catalog alone: bytes, files, and records a deduplication removes."""

from __future__ import annotations

from logcompact import sketch
from logcompact.catalog import CatalogSection, TopicPartition
from logcompact.plans import Plan


def expected_effect(plan: Plan) -> dict:
    """Input and output bytes, files replaced, groups, and the duplicates the plan removes (`duplicates_removed`),
    estimated as its engine removes them (`_duplicates`); at most how many records of aborted transactions it
    removes (`aborted_records`) and about their uncompressed bytes (`aborted_bytes`). `action` says what the plan does
    with its records: `copy` (no deduplication: the levels below `dedup_from_level`), `deduplicate` (duplicates to
    remove), `rewrite` (deduplicating, but its partitions hold no duplicate to remove: files are merged, records kept)."""
    records_in = removed = 0
    per_partition: dict[TopicPartition, list[CatalogSection]] = {}
    for data_file in plan.inputs:
        for section in data_file.sections:
            records_in += section.info.record_count
            per_partition.setdefault((section.topic, section.partition), []).append(section)
    # Aborted transactions' records: at most one per offset of their ranges within the inputs (all of them until a
    # compaction removes them), of their partition's mean size.
    aborted = aborted_bytes = 0
    for tp, ranges in plan.aborted.items():
        if tp in per_partition:
            sections = per_partition[tp]
            low, high = min(s.first_offset for s in sections), max(s.last_offset for s in sections)
            count = sum(max(0, min(last, high) - max(first, low) + 1) for first, last in ranges)
            aborted += count
            aborted_bytes += count * sum(s.info.uncompressed_bytes for s in sections) // max(1, sum(s.info.record_count for s in sections))
    if plan.deduplicate:
        for tp, sections in per_partition.items():
            removed += _duplicates(plan, tp, sections)
    bytes_in = sum(f.size for f in plan.inputs)
    kept = (records_in - removed) / records_in if records_in else 1.0
    return {
        "plan_id": plan.plan_id,
        "mode": plan.mode,
        "target_level": plan.target_level,
        "deduplicate": plan.deduplicate,
        "action": "copy" if not plan.deduplicate else "deduplicate" if removed else "rewrite",
        "files_replaced": len(plan.inputs),
        "input_levels": sorted({f.level for f in plan.inputs}),
        "input_bytes": bytes_in,
        "input_uncompressed_bytes": sum(group.bytes for group in plan.groups),
        "records_in": records_in,
        "estimated_records_removed": removed,
        "aborted_records": aborted,
        "aborted_bytes": aborted_bytes,
        "estimated_output_bytes": round(bytes_in * kept),
        "groups": len(plan.groups),
    }


def _duplicates(plan: Plan, tp: TopicPartition, sections: list[CatalogSection]) -> int:
    """The duplicates a deduplicating plan removes from a partition, by the engine's rules (`engine.cleaner`): none in a
    topic that is not compacted, nor in a partition over `max_partition_bytes` (copied); none at or past the first
    uncleanable offset (min.compaction.lag.ms, an open transaction), so only the sections before the first section
    reaching it count (the records of that section before it are not counted: a little low). Of those, the records
    beyond their distinct keys, which the merged key sketches estimate (about 9% error); a section free of duplicates
    (`clean_below_delta` past its last record, as a deduplicating compaction leaves it) holds as many distinct keys as
    records, a floor under the estimate: one such section alone, as every partition after a full sweep, removes
    none, where the sketch's error would make some up."""
    config = plan.topics[tp[0]].config
    if not config.compacted or sum(s.info.uncompressed_bytes for s in sections) > plan.max_partition_bytes:
        return 0
    first_uncleanable = plan.first_uncleanable.get(tp)
    lag_cut = plan.now_ms - config.min_compaction_lag_ms if config.min_compaction_lag_ms > 0 else None
    cleanable = []
    for section in sorted(sections, key=lambda s: s.first_offset):
        if (first_uncleanable is not None and section.last_offset >= first_uncleanable) or (
            lag_cut is not None and section.info.max_timestamp > lag_cut
        ):
            break
        cleanable.append(section.info)
    sketches = [info.key_sketch for info in cleanable if info.key_sketch]
    if not sketches:
        return 0
    records = sum(info.record_count for info in cleanable)
    at_least = max((info.record_count for info in cleanable if info.clean_below_delta > info.last_delta), default=0)
    return max(0, records - max(at_least, round(sketch.estimate(sketch.merge_packed(sketches)))))
