"""A plan's expected effect, from the catalog alone: bytes, files, and records a deduplication removes."""

from __future__ import annotations

import pyarrow as pa

from logcompact import sketch
from logcompact.catalog import TopicPartition
from logcompact.plans import Plan, input_sections


def expected_effect(plan: Plan) -> dict:
    """Input and output bytes, files replaced, groups, and the duplicates the plan removes (`duplicates_removed`),
    estimated as its engine removes them (`_duplicates`); at most how many records of aborted transactions it
    removes (`aborted_records`) and about their uncompressed bytes (`aborted_bytes`). `action` says what the plan does
    with its records: `copy` (no deduplication: the levels below `dedup_from_level`), `deduplicate` (duplicates to
    remove), `rewrite` (deduplicating, but its partitions hold no duplicate to remove: files are merged, records kept).
    Read from the inputs' sections as columns (`input_sections`), no section object built."""
    sections = input_sections(plan.inputs).table
    column = {name: _as_list(sections.column(name)) for name in _READ}
    per_partition: dict[TopicPartition, list[int]] = {}
    for row, tp in enumerate(zip(column["topic"], column["partition"])):
        per_partition.setdefault(tp, []).append(row)
    records, uncompressed = column["record_count"], column["uncompressed_bytes"]
    firsts, deltas = column["first_offset"], column["last_delta"]
    records_in = sum(records)
    removed = 0
    # Aborted transactions' records: at most one per offset of their ranges within the inputs (all of them until a
    # compaction removes them), of their partition's mean size.
    aborted = aborted_bytes = 0
    for tp, ranges in plan.aborted.items():
        if tp in per_partition:
            rows = per_partition[tp]
            low, high = min(firsts[n] for n in rows), max(firsts[n] + deltas[n] for n in rows)
            count = sum(max(0, min(last, high) - max(first, low) + 1) for first, last in ranges)
            aborted += count
            aborted_bytes += count * sum(uncompressed[n] for n in rows) // max(1, sum(records[n] for n in rows))
    if plan.deduplicate:
        for tp, rows in per_partition.items():
            removed += _duplicates(plan, tp, rows, column)
    files = plan.header().inputs
    bytes_in = sum(f.size for f in files)
    kept = (records_in - removed) / records_in if records_in else 1.0
    return {
        "plan_id": plan.plan_id,
        "mode": plan.mode,
        "target_level": plan.target_level,
        "deduplicate": plan.deduplicate,
        "action": "copy" if not plan.deduplicate else "deduplicate" if removed else "rewrite",
        "files_replaced": len(plan.inputs),
        "input_levels": sorted({f.level for f in files}),
        "input_bytes": bytes_in,
        "input_uncompressed_bytes": sum(group.bytes for group in plan.groups),
        "records_in": records_in,
        "estimated_records_removed": removed,
        "aborted_records": aborted,
        "aborted_bytes": aborted_bytes,
        "estimated_output_bytes": round(bytes_in * kept),
        "groups": len(plan.groups),
    }


def _duplicates(plan: Plan, tp: TopicPartition, rows: list[int], column: dict[str, list]) -> int:
    """The duplicates a deduplicating plan removes from a partition (its sections: `rows` of the inputs' `column`s),
    by the engine's rules (`engine.cleaner`): none in a
    topic that is not compacted, nor in a partition over `max_partition_bytes` (copied); none at or past the first
    uncleanable offset (min.compaction.lag.ms, an open transaction), so only the sections before the first section
    reaching it count (the records of that section before it are not counted: a little low). Of those, the records
    beyond their distinct keys, which the merged key sketches estimate (about 9% error); a section free of duplicates
    (`clean_below_delta` past its last record, as a deduplicating compaction leaves it) holds as many distinct keys as
    records, a floor under the estimate: one such section alone, as every partition after a full sweep, removes
    none, where the sketch's error would make some up."""
    config = plan.topics[tp[0]].config
    if not config.compacted or sum(column["uncompressed_bytes"][n] for n in rows) > plan.max_partition_bytes:
        return 0
    first_uncleanable = plan.first_uncleanable.get(tp)
    lag_cut = plan.now_ms - config.min_compaction_lag_ms if config.min_compaction_lag_ms > 0 else None
    firsts, deltas, newest = column["first_offset"], column["last_delta"], column["max_timestamp"]
    cleanable = []
    for n in sorted(rows, key=firsts.__getitem__):
        if (first_uncleanable is not None and firsts[n] + deltas[n] >= first_uncleanable) or (lag_cut is not None and newest[n] > lag_cut):
            break
        cleanable.append(n)
    sketches = [column["key_sketch"][n] for n in cleanable if column["key_sketch"][n]]
    if not sketches:
        return 0
    records, clean_below = column["record_count"], column["clean_below_delta"]
    total = sum(records[n] for n in cleanable)
    at_least = max((records[n] for n in cleanable if clean_below[n] > deltas[n]), default=0)
    return max(0, total - max(at_least, round(sketch.estimate(sketch.merge_packed(sketches)))))


# The sections' columns an estimate reads.
_READ = ("topic", "partition", "first_offset", "last_delta", "record_count", "uncompressed_bytes", "max_timestamp", "clean_below_delta", "key_sketch")


def _as_list(values: pa.ChunkedArray) -> list:
    # Integers through numpy: several times faster than Arrow's own conversion to Python.
    return values.to_numpy().tolist() if pa.types.is_integer(values.type) else values.to_pylist()
