"""A partition whose data is damaged is set aside as uncleanable (Kafka's term); the rest of its plan commits.

The damaged partition's sections stay live where they are, untouched; planners leave it out until its backoff
passes, its damaged file changes, or the mark is cleared; then it compacts like any other."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from logcompact.catalog import Catalog
from logcompact.catalog import schema as s
from logcompact.consume import latest_values, read_records
from logcompact.exceptions import CorruptDataError
from logcompact.jobs import run_and_commit
from tests.helpers import NOW, create_topic, full_sweep, produce_l0_files

PARTITIONS = 100
KEYS = 500  # key k<i> always lands in partition i % 100
FILES = 4
RECORDS = 2000


def _expected() -> dict[int, dict[bytes, bytes]]:
    """Per partition, the latest value of each key that produce_l0_files wrote."""
    latest: dict[int, dict[bytes, bytes]] = {p: {} for p in range(PARTITIONS)}
    for sequence in range(FILES * RECORDS):
        latest[sequence % PARTITIONS][b"k%d" % (sequence % KEYS)] = b"v%d" % sequence
    return latest


def _values(catalog: Catalog, partition: int) -> dict[bytes, bytes]:
    table = latest_values(catalog.store, catalog.snapshot(), "t", partition)
    return dict(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))


def _cluster(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=PARTITIONS, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=FILES, records=RECORDS, keys=KEYS, partitions=PARTITIONS)


def _sweep(catalog: Catalog, now: int = NOW) -> dict:
    found = full_sweep(catalog.planning_snapshot(now), now)
    assert found is not None
    return run_and_commit(catalog, found, now).to_dict()


def _section_of(catalog: Catalog, partition: int, file_number: int):
    key, placed = catalog.snapshot().sections_of("t", partition)[file_number]
    return key, placed


def test_a_damaged_section_sets_one_partition_aside_and_the_other_99_commit(catalog: Catalog) -> None:
    _cluster(catalog)
    damaged_key, placed = _section_of(catalog, 37, 1)
    # The catalog's record of one section no longer matches its file (its block's CRC-32 edited).
    row = (s.sections.c.partition == 37, s.sections.c.first_offset == placed.first_offset)
    with catalog.engine.begin() as connection:
        stored = connection.execute(select(s.sections.c.crc32).where(*row)).scalar_one()  # bound to the row
        connection.execute(update(s.sections).where(*row).values(crc32=stored ^ 1))
    before = {tp: list(read_records(catalog.store, catalog.snapshot(), "t", tp)) for tp in (36, 38)}

    stats = _sweep(catalog)

    assert [(u["topic"], u["partition"]) for u in stats["uncleanable"]] == [("t", 37)]
    assert damaged_key in stats["uncleanable"][0]["reason"] and "t/37" in stats["uncleanable"][0]["reason"]
    marks = catalog.uncleanable()
    assert [(m.topic, m.partition, m.file_key, m.failures) for m in marks] == [("t", 37, damaged_key, 1)]
    assert marks[0].bytes > 0
    # The topic's figures leave the set-aside partition out, as the job's totals do.
    assert stats["topics"]["t"]["partitions"] == PARTITIONS - 1
    assert stats["topics"]["t"]["records_in"] == stats["records_in"] == FILES * RECORDS * (PARTITIONS - 1) // PARTITIONS
    expected = _expected()
    for partition in range(PARTITIONS):
        if partition != 37:
            assert _values(catalog, partition) == expected[partition]
    assert {tp: list(read_records(catalog.store, catalog.snapshot(), "t", tp)) for tp in (36, 38)} != before  # compacted
    # Partition 37 was not touched: its four sections are live in the four L0 files, the damaged one included.
    sections = catalog.snapshot().sections_of("t", 37)
    assert len(sections) == FILES
    assert all(key.startswith("data/l0/") for key, _ in sections)
    with pytest.raises(CorruptDataError, match="t/37"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 37))
    # The L0 files hold only partition 37's sections now; the other 99 partitions' sections are retired.
    live_l0 = catalog.snapshot().files(level=0)
    assert len(live_l0) == FILES and all(len(f.sections) == 1 and f.sections[0].partition == 37 for f in live_l0)

    # Within the backoff the partition is left out of plans, and files holding only it with it.
    assert catalog.planning_snapshot(NOW + 1000).set_aside == {("t", 37)}
    again = full_sweep(catalog.planning_snapshot(NOW + 1000), NOW + 1000)
    assert again is None or all(not f.key.startswith("data/l0/") for f in again.inputs)

    # The operator repairs the catalog row (or restores the file) and clears the mark: the next sweep cleans it.
    with catalog.engine.begin() as connection:
        connection.execute(update(s.sections).where(*row).values(crc32=stored))
    assert catalog.clear_uncleanable() == [("t", 37)]
    stats = _sweep(catalog, NOW + 2000)
    assert stats["uncleanable"] == [] and catalog.uncleanable() == []
    assert _values(catalog, 37) == expected[37]
    assert catalog.snapshot().files(level=0) == []


def test_a_flipped_byte_sets_aside_only_the_partitions_of_its_block(catalog: Catalog) -> None:
    _cluster(catalog)
    damaged_key, placed = _section_of(catalog, 50, 2)
    data = bytearray(catalog.store.get(damaged_key))
    data[placed.info.byte_offset + placed.info.byte_length - 8] ^= 0x40  # in the payload of the section's last block
    catalog.store.put(damaged_key, bytes(data))
    sharing = {
        p for p in range(PARTITIONS)
        for key, other in catalog.snapshot().sections_of("t", p)
        if key == damaged_key and other.info.byte_offset + other.info.byte_length == placed.info.byte_offset + placed.info.byte_length
    }

    stats = _sweep(catalog)

    set_aside = {u["partition"] for u in stats["uncleanable"]}
    assert 50 in set_aside and set_aside <= sharing
    assert all(damaged_key in u["reason"] for u in stats["uncleanable"])
    expected = _expected()
    for partition in sorted(set(range(PARTITIONS)) - set_aside):
        assert _values(catalog, partition) == expected[partition]  # no damaged row reached an output


def test_a_partition_is_retried_once_its_backoff_passes_and_the_backoff_doubles(catalog: Catalog) -> None:
    _cluster(catalog)
    damaged_key, placed = _section_of(catalog, 5, 0)
    with catalog.engine.begin() as connection:
        connection.execute(
            update(s.sections).where(s.sections.c.partition == 5, s.sections.c.first_offset == placed.first_offset)
            .values(record_count=placed.info.record_count - 1)
        )
    _sweep(catalog)
    first = catalog.uncleanable()[0]
    assert catalog.planning_snapshot(first.retry_ms - 1).set_aside == {("t", 5)}
    assert catalog.planning_snapshot(first.retry_ms).set_aside == frozenset()
    stats = _sweep(catalog, first.retry_ms)
    assert [u["partition"] for u in stats["uncleanable"]] == [5]
    second = catalog.uncleanable()[0]
    assert second.failures == 2 and second.retry_ms - first.retry_ms == 2 * (first.retry_ms - first.marked_ms)
