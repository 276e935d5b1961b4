"""Reading a partition as of one manifest version: by offset, or the latest value per key.

Offsets live in the catalog: a section's records carry offset deltas, and the manifest gives each
section's first offset. Sections of one partition are read in offset order with one ranged GET each;
sections whose offset ranges overlap (a compaction output spans a hole that another file fills) are
merged by offset. Holes left by compaction are simply absent, as Kafka consumers expect.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import CatalogSection, DataFile, Manifest
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


def _overlapping_runs(
    sections: list[tuple[DataFile, CatalogSection]],
) -> Iterator[list[tuple[DataFile, CatalogSection]]]:
    """Group sections (sorted by first offset) into runs whose offset ranges overlap."""
    run: list[tuple[DataFile, CatalogSection]] = []
    run_end = -1
    for pair in sections:
        if run and pair[1].first_offset > run_end:
            yield run
            run = []
        run.append(pair)
        run_end = max(run_end, pair[1].last_offset)
    if run:
        yield run


def _section_records(store: ObjectStore, data_file: DataFile, section: CatalogSection) -> pa.Table:
    info = section.info
    table = read_section(store, data_file.key, info.byte_offset, info.byte_length).table()
    offsets = pc.add(table.column("offset_delta").cast(pa.int64()), pa.scalar(section.first_offset, pa.int64()))
    return pa.Table.from_arrays(
        [offsets, table.column("timestamp"), table.column("key"), table.column("value"), table.column("headers")],
        schema=RECORD_SCHEMA,
    )


def read_batches(
    store: ObjectStore,
    manifest: Manifest,
    topic: str,
    partition: int,
    from_offset: int = 0,
    to_offset: int | None = None,
) -> Iterator[pa.Table]:
    """Records of one partition with from_offset <= offset < to_offset, as Arrow tables in offset order."""
    partitions = manifest.topic(topic).partitions
    if not 0 <= partition < partitions:
        raise InvalidRecordError(f"topic {topic!r} has partitions 0 to {partitions - 1}, not {partition}")
    wanted = [
        pair
        for pair in manifest.sections_of(topic, partition)
        if pair[1].last_offset >= from_offset and (to_offset is None or pair[1].first_offset < to_offset)
    ]
    for run in _overlapping_runs(wanted):
        tables = [_section_records(store, data_file, section) for data_file, section in run]
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
    manifest: Manifest,
    topic: str,
    partition: int,
    from_offset: int = 0,
    to_offset: int | None = None,
) -> Iterator[ConsumedRecord]:
    """The same records one by one."""
    for table in read_batches(store, manifest, topic, partition, from_offset, to_offset):
        columns = [table.column(name).to_pylist() for name in RECORD_SCHEMA.names]
        for offset, timestamp, key, value, headers in zip(*columns):
            pairs = [(h["key"], h["value"]) for h in headers] if headers else []
            yield ConsumedRecord(offset, timestamp, key, value, pairs)


def latest_values(store: ObjectStore, manifest: Manifest, topic: str, partition: int) -> pa.Table:
    """The materialized view of a partition: each key's latest record, unless that record is a tombstone.

    Columns offset, timestamp, key, value, headers, in offset order; keyless records are left out.
    """
    tables = list(read_batches(store, manifest, topic, partition))
    records = pa.concat_tables(tables) if tables else RECORD_SCHEMA.empty_table()
    keyed = records.filter(pc.is_valid(records.column("key")))
    latest = keyed.group_by("key", use_threads=False).aggregate([("offset", "max")])
    is_latest = pc.is_in(keyed.column("offset"), value_set=latest.column("offset_max"))
    return keyed.filter(pc.and_(is_latest, pc.is_valid(keyed.column("value"))))
