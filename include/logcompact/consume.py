"""Reading a partition as of one manifest version: by offset, or the latest value per key.

Offsets live in the catalog: a section's records carry offset deltas, and the catalog gives each
section's first offset. A read asks the snapshot for the sections of its one partition and offset range
(one indexed query, whatever else the catalog holds), then reads them in offset order with one ranged GET
each; sections whose offset ranges overlap (a compaction output spans a hole that another file fills) are
merged by offset. Holes left by compaction are simply absent, as Kafka consumers expect.
"""

from __future__ import annotations

from typing import Iterable, Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import CatalogSection, Snapshot
from logcompact.exceptions import InvalidRecordError
from logcompact.format import read_section
from logcompact.format.layout import HEADERS_TYPE
from logcompact.store.base import ObjectStore

RECORD_SCHEMA = pa.schema(
    [
        pa.field("offset", pa.int64(), nullable=False),
        pa.field("timestamp", pa.int64(), nullable=False),
        pa.field("key", pa.binary()),
        pa.field("value", pa.binary()),
        pa.field("headers", HEADERS_TYPE),
    ]
)


class ConsumedRecord(NamedTuple):
    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]


SectionRef = tuple[str, CatalogSection]  # (file key, section)


def _overlapping_runs(sections: Iterable[SectionRef]) -> Iterator[list[SectionRef]]:
    """Group sections (sorted by first offset) into runs whose offset ranges overlap."""
    run: list[SectionRef] = []
    run_end = -1
    for pair in sections:
        if run and pair[1].first_offset > run_end:
            yield run
            run = []
        run.append(pair)
        run_end = max(run_end, pair[1].last_offset)
    if run:
        yield run


def _section_records(store: ObjectStore, key: str, section: CatalogSection) -> pa.Table:
    info = section.info
    table = read_section(store, key, info.byte_offset, info.byte_length).table()
    offsets = pc.add(table.column("offset_delta").cast(pa.int64()), pa.scalar(section.first_offset, pa.int64()))
    return pa.Table.from_arrays(
        [offsets, table.column("timestamp"), table.column("key"), table.column("value"), table.column("headers")],
        schema=RECORD_SCHEMA,
    )


def read_batches(
    store: ObjectStore,
    snapshot: Snapshot,
    topic: str,
    partition: int,
    from_offset: int = 0,
    to_offset: int | None = None,
) -> Iterator[pa.Table]:
    """Records of one partition with from_offset <= offset < to_offset, as Arrow tables in offset order."""
    partitions = snapshot.topic(topic).partitions
    if not 0 <= partition < partitions:
        raise InvalidRecordError(f"topic {topic!r} has partitions 0 to {partitions - 1}, not {partition}")
    yield from read_sections(store, snapshot.sections_of(topic, partition, from_offset, to_offset), from_offset, to_offset)


def read_sections(
    store: ObjectStore, sections: Iterable[SectionRef], from_offset: int = 0, to_offset: int | None = None
) -> Iterator[pa.Table]:
    """The records of given sections of one partition, (file key, section) pairs in first-offset order,
    with from_offset <= offset < to_offset: what read_batches reads, for a caller that chose the files
    (a compaction's inputs)."""
    for run in _overlapping_runs(sections):
        tables = [_section_records(store, key, section) for key, section in run]
        table = tables[0] if len(tables) == 1 else pa.concat_tables(tables).sort_by("offset")
        first, last = table.column("offset")[0].as_py(), table.column("offset")[-1].as_py()
        if first < from_offset or (to_offset is not None and last >= to_offset):
            offsets = table.column("offset")
            keep = pc.greater_equal(offsets, from_offset)
            if to_offset is not None:
                keep = pc.and_(keep, pc.less(offsets, to_offset))
            table = table.filter(keep)
        if table.num_rows:
            yield table


def read_records(
    store: ObjectStore,
    snapshot: Snapshot,
    topic: str,
    partition: int,
    from_offset: int = 0,
    to_offset: int | None = None,
) -> Iterator[ConsumedRecord]:
    """The same records one by one."""
    for table in read_batches(store, snapshot, topic, partition, from_offset, to_offset):
        columns = [table.column(name).to_pylist() for name in RECORD_SCHEMA.names]
        for offset, timestamp, key, value, headers in zip(*columns):
            pairs = [(h["key"], h["value"]) for h in headers] if headers else []
            yield ConsumedRecord(offset, timestamp, key, value, pairs)


def latest_values(store: ObjectStore, snapshot: Snapshot, topic: str, partition: int) -> pa.Table:
    """The materialized view of a partition: each key's latest record, unless that record is a tombstone.

    Columns offset, timestamp, key, value, headers, in offset order; keyless records are left out.
    """
    tables = list(read_batches(store, snapshot, topic, partition))
    records = pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()
    keyed = records.filter(pc.is_valid(records.column("key")))
    latest = keyed.group_by("key", use_threads=False).aggregate([("offset", "max")])
    is_latest = pc.is_in(keyed.column("offset"), value_set=latest.column("offset_max"))
    return keyed.filter(pc.and_(is_latest, pc.is_valid(keyed.column("value"))))
