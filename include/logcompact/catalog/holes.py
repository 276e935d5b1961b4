"""The offsets between sections no record holds rightly (`offset_holes`), those compactions dropped and those
transactions' markers took: what tells a partition's gaps from a damaged row's (docs/catalog.md, "Cross-checks of
the catalog's rows"). Functions of a Connection, called by `Catalog`, `Snapshot`, `transactions` and the upgrade to
schema 12; and the range arithmetic their callers share.

A partition's live rows are disjoint ranges, adjacent ones coalesced, so that a gap between two sections is held by
one row. A compaction records the offsets its inputs' sections spanned and its outputs' do not, and retires the rows
(or their parts) its outputs now span, so that the table holds about a row per gap between live sections; a retired
row still explains gaps to the snapshots older than its retirement until gc trims the commit log past it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import numpy as np
from sqlalchemy import BindParameter, ColumnElement, Connection, Select, bindparam, delete, or_, select, update

from logcompact.catalog import schema as s
from logcompact.catalog.database import driver_rows, execute_many, one_of

# A partition, as (topic id, partition); a range of offsets, (first, last), both held.
Slot = tuple[int, int]
Range = tuple[int, int]


def coalesced(ranges: Iterable[Range]) -> list[Range]:
    """`ranges` sorted, those that overlap or touch merged."""
    merged: list[Range] = []
    for first, last in sorted(ranges):
        if merged and first <= merged[-1][1] + 1:
            if last > merged[-1][1]:
                merged[-1] = (merged[-1][0], last)
        else:
            merged.append((first, last))
    return merged


def without(ranges: Sequence[Range], taking: Sequence[Range]) -> list[Range]:
    """The offsets of `ranges` that none of `taking` holds, both coalesced (`coalesced`)."""
    left: list[Range] = []
    position = 0
    for first, last in ranges:
        while position < len(taking) and taking[position][1] < first:
            position += 1
        at, n = first, position
        while n < len(taking) and taking[n][0] <= last:
            if taking[n][0] > at:
                left.append((at, taking[n][0] - 1))
            at = max(at, taking[n][1] + 1)
            n += 1
        if at <= last:
            left.append((at, last))
    return left


def gaps(spans: Iterable[Range], low: int | None = None) -> list[Range]:
    """The offsets between sections spanning `spans` that none holds: from `low` (from the first span without it) to
    where the last span ends."""
    held = coalesced(spans)
    if not held:
        return []
    start = held[0][0] if low is None else low
    return without([(start, held[-1][1])], held) if start <= held[-1][1] else []


def live_at(version: int | BindParameter[int] | None) -> list[ColumnElement[bool]]:
    """Conditions picking the rows live at `version` (now, without one)."""
    rows = s.offset_holes.c
    if version is None:
        return [rows.removed_version.is_(None)]
    return [rows.added_version <= version, or_(rows.removed_version.is_(None), rows.removed_version > version)]


def of_partitions(connection: Connection, wanted: Mapping[Slot, Range], version: int | None = None) -> dict[Slot, list[Range]]:
    """Per partition of `wanted`, its rows live at `version` (now, without one) holding an offset in its range,
    coalesced: one query per topic (a partition's rows are about its gaps between live sections, a few)."""
    rows = s.offset_holes.c
    found: dict[Slot, list[Range]] = {}
    for topic_id, slots in _by_topic(wanted):
        query = select(rows.partition, rows.first_offset, rows.last_offset).where(
            rows.topic_id == topic_id, rows.partition.in_(sorted(p for _, p in slots)),
            rows.first_offset <= max(wanted[slot][1] for slot in slots), rows.last_offset >= min(wanted[slot][0] for slot in slots),
            *live_at(version),
        )
        for partition, first, last in connection.execute(query):
            low, high = wanted.get((topic_id, partition), (1, 0))
            if first <= high and last >= low:
                found.setdefault((topic_id, partition), []).append((first, last))
    return {slot: coalesced(ranges) for slot, ranges in found.items()}


def of_partition(connection: Connection, slot: Slot, low: int, high: int, version: int) -> list[Range]:
    """`of_partitions` of one partition (a reader's page), by a query built once: building it costs more than
    running it."""
    topic_id, partition = slot
    found = connection.execute(_OF_PARTITION, {"topic_id": topic_id, "partition": partition, "low": low, "high": high, "version": version})
    return coalesced(tuple(row) for row in found)


def input_spans(connection: Connection, file_ids: Sequence[int], kept: Iterable[Slot]) -> dict[Slot, list[Range]]:
    """Per partition, the spans of the live sections of a compaction's inputs `file_ids` (those of `kept`
    partitions, set aside, left out), coalesced: read before the commit retires them, and before it takes the version
    row that every append waits for (`Catalog.replace_files`). Read as the driver hands the rows over and coalesced as
    arrays (`coalesced_by_slot`): an L0 to L1 copy of 300 agents' files has 300,000 of them, which made a tuple each
    and grouped in Python took 1.8 s."""
    sec = s.sections.c
    query = select(sec.topic_id, sec.partition, sec.first_offset, sec.last_offset).where(
        one_of(sec.file_id, file_ids, connection.dialect.name), sec.removed_version.is_(None)
    )
    rows = driver_rows(connection.execute(query))
    values = np.array(rows, np.int64).reshape(len(rows), 4)
    if kept := set(kept):  # rare: partitions set aside
        values = values[np.fromiter(((t, p) not in kept for t, p in values[:, :2].tolist()), bool, len(values))]
    return coalesced_by_slot(values[:, 0], values[:, 1], values[:, 2], values[:, 3])


def coalesced_by_slot(topic_ids: np.ndarray, partitions: np.ndarray, firsts: np.ndarray, lasts: np.ndarray) -> dict[Slot, list[Range]]:
    """Ranges given as columns, a partition each, `coalesced` per partition: sorted, those that overlap or touch
    merged. A range starts a run of its own where it begins past the greatest end of the ranges before it in its
    partition; that running greatest end is one cumulative maximum over (partition's place, rank of the end) packed
    in an int64, which a later partition's always exceeds."""
    if not len(firsts):
        return {}
    order = np.lexsort((lasts, firsts, partitions, topic_ids))
    topic_ids, partitions = np.asarray(topic_ids, np.int64)[order], np.asarray(partitions, np.int64)[order]
    firsts, lasts = np.asarray(firsts, np.int64)[order], np.asarray(lasts, np.int64)[order]
    new_slot = np.empty(len(firsts), bool)
    new_slot[0], new_slot[1:] = True, (topic_ids[1:] != topic_ids[:-1]) | (partitions[1:] != partitions[:-1])
    ends, end_ranks = np.unique(lasts, return_inverse=True)
    width = int(len(ends)).bit_length()
    running = np.maximum.accumulate(((np.cumsum(new_slot) - 1) << width) | end_ranks.reshape(-1))
    greatest_end = ends[running & ((1 << width) - 1)]
    starts = new_slot.copy()
    starts[1:] |= firsts[1:] > greatest_end[:-1] + 1
    at = np.flatnonzero(starts)
    spans: dict[Slot, list[Range]] = {}
    runs = zip(topic_ids[at].tolist(), partitions[at].tolist(), firsts[at].tolist(), np.maximum.reduceat(lasts, at).tolist(), strict=True)
    for topic_id, partition, first, last in runs:
        spans.setdefault((topic_id, partition), []).append((first, last))
    return spans


def record(connection: Connection, inputs: Mapping[Slot, list[Range]], outputs: Mapping[Slot, list[Range]], version: int) -> None:
    """After a compaction of `version` replaced sections spanning `inputs` by sections spanning `outputs` (per
    partition), record the offsets the inputs spanned and the outputs do not, coalesced with the rows around them,
    and retire the rows the outputs now span. A partition whose outputs span what its inputs did (a copy) reads and
    writes nothing. The caller holds the version row, as every writer of the rows does."""
    changing: dict[Slot, tuple[list[Range], list[Range]]] = {}
    around: dict[Slot, Range] = {}
    for slot, spans in inputs.items():
        held, out = coalesced(spans), coalesced(outputs.get(slot, ()))
        dropped = without(held, out)
        if dropped or without(out, held):  # outputs spanning offsets no input did may span recorded holes
            changing[slot] = (dropped, out)
            both = coalesced(held + out)
            around[slot] = (both[0][0] - 1, both[-1][1] + 1)  # rows touching them are coalesced with them
    if not changing:
        return
    rows = _live_rows(connection, around)
    retired, added = [], []
    for slot, (dropped, out) in changing.items():
        old = rows.get(slot, {})
        new = without(coalesced([*old, *dropped]), out)
        retired += [(version, *slot, first, added_version) for (first, last), added_version in old.items() if (first, last) not in new]
        added += [(*slot, first, last, version) for first, last in new if (first, last) not in old]
    table = s.offset_holes.c
    execute_many(connection, update(s.offset_holes).where(
        table.topic_id == bindparam("t"), table.partition == bindparam("p"), table.first_offset == bindparam("f"),
        table.added_version == bindparam("a"),
    ).values(removed_version=bindparam("v")), ("v", "t", "p", "f", "a"), retired)
    insert(connection, added)


def record_markers(connection: Connection, markers: Mapping[Slot, int], version: int) -> None:
    """The markers an ended transaction of `version` was given, one offset per partition: offsets no record holds,
    holes as a compaction's."""
    record(connection, {slot: [(offset, offset)] for slot, offset in markers.items()}, {}, version)


def insert(connection: Connection, rows: Sequence[tuple[int, int, int, int, int]]) -> None:
    """Insert live rows (topic id, partition, first offset, last offset, added version)."""
    execute_many(connection, s.offset_holes.insert().values(
        topic_id=bindparam("t"), partition=bindparam("p"), first_offset=bindparam("f"), last_offset=bindparam("l"), added_version=bindparam("a"),
    ), ("t", "p", "f", "l", "a"), rows)


def _live_rows(connection: Connection, around: Mapping[Slot, Range]) -> dict[Slot, dict[Range, int]]:
    """The live rows of each partition holding an offset of its range, each with the version that added it: one
    query per topic."""
    table = s.offset_holes.c
    found: dict[Slot, dict[Range, int]] = {}
    for topic_id, slots in _by_topic(around):
        query = select(table.partition, table.first_offset, table.last_offset, table.added_version).where(
            table.topic_id == topic_id, table.partition.in_(sorted(p for _, p in slots)), table.removed_version.is_(None),
            table.first_offset <= max(around[slot][1] for slot in slots), table.last_offset >= min(around[slot][0] for slot in slots),
        )
        for partition, first, last, added_version in connection.execute(query):
            low, high = around.get((topic_id, partition), (1, 0))
            if first <= high and last >= low:
                found.setdefault((topic_id, partition), {})[(first, last)] = added_version
    return found


def _by_topic(slots: Iterable[Slot]) -> list[tuple[int, list[Slot]]]:
    by_topic: dict[int, list[Slot]] = {}
    for slot in slots:
        by_topic.setdefault(slot[0], []).append(slot)
    return sorted(by_topic.items())


def drop_topic(connection: Connection, topic_id: int) -> None:
    """A deleted topic's rows: none of its offsets is read again."""
    connection.execute(delete(s.offset_holes).where(s.offset_holes.c.topic_id == topic_id))


def trim(connection: Connection, before_version: int) -> None:
    """Delete the rows retired before `before_version`: no snapshot older than it can be taken any more."""
    connection.execute(delete(s.offset_holes).where(s.offset_holes.c.removed_version < before_version))


def record_every_gap(connection: Connection) -> None:
    """The upgrade to schema 12: every gap between the live sections of each compacted partition (it has a
    `partition_summaries` row), from its log start to its next offset, recorded at the newest version, as the
    catalog's state is trusted at an upgrade. One read of every live section."""
    sec, files, part, tops = s.sections.c, s.files.c, s.partitions.c, s.topics.c
    summarized = select(s.partition_summaries.c.topic_id).where(
        s.partition_summaries.c.topic_id == part.topic_id, s.partition_summaries.c.partition == part.partition
    ).exists()
    bounds = {
        (topic_id, partition): (start, end - 1) for topic_id, partition, start, end in connection.execute(
            select(part.topic_id, part.partition, part.log_start_offset, part.next_offset)
            .join(s.topics, tops.topic_id == part.topic_id).where(summarized, tops.deleted_version.is_(None))
        )
    }
    spans: dict[Slot, list[Range]] = {slot: [] for slot in bounds}
    live = select(sec.topic_id, sec.partition, sec.first_offset, sec.last_offset).join(s.files, files.file_id == sec.file_id).where(
        files.removed_version.is_(None), sec.removed_version.is_(None)
    )
    for topic_id, partition, first, last in connection.execute(live):
        if (topic_id, partition) in spans:
            spans[(topic_id, partition)].append((first, last))
    version = connection.execute(select(s.catalog_info.c.version)).scalar_one()
    insert(connection, [
        (*slot, first, last, version)
        for slot, (start, end) in sorted(bounds.items()) if start <= end
        for first, last in without([(start, end)], coalesced(spans[slot]))
    ])


def _of_partition_query() -> Select:
    rows = s.offset_holes.c
    return select(rows.first_offset, rows.last_offset).where(
        rows.topic_id == bindparam("topic_id"), rows.partition == bindparam("partition"), rows.first_offset <= bindparam("high"),
        rows.last_offset >= bindparam("low"), *live_at(bindparam("version")),
    )


_OF_PARTITION = _of_partition_query()
