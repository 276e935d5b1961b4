"""A partition whose data is damaged is set aside as uncleanable (Kafka's term); the rest of its plan commits.

The damaged partition's sections stay live where they are, untouched; planners leave it out until its backoff
passes, its damaged file changes, or the mark is cleared; then it compacts like any other."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from logcompact.catalog import Catalog
from logcompact.catalog import schema as s
from logcompact.consume import latest_values, read_records
from logcompact.engine import copier
from logcompact.exceptions import CorruptDataError
from logcompact.jobs import run_and_commit
from tests.helpers import NOW, create_topic, full_sweep, level_plans, produce_l0_files, recorded_runs

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


@pytest.mark.parametrize("few_partitions", [False, True], ids=["one run", "runs of a few partitions"])
def test_damage_in_an_l0_copy_sets_aside_only_the_damaged_partitions_and_copies_the_rest(
    catalog: Catalog, few_partitions: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The L0 -> L1 copy reads a run of partitions at once (`engine.copier`); a run holding damage is copied one
    partition at a time, so a damaged catalog row sets aside its partition alone, and a flipped byte the partitions of
    its block, while every other record is copied as it was. With runs of a few partitions, runs share blocks, and the
    files' streams go on past the damage."""
    _cluster(catalog)
    if few_partitions:
        largest = max(sum(placed.info.uncompressed_bytes for _, placed in catalog.snapshot().sections_of("t", p)) for p in range(PARTITIONS))
        monkeypatch.setattr(copier, "COPY_RUN_BYTES", 3 * largest)
    runs = recorded_runs(monkeypatch)
    row_damaged, placed = _section_of(catalog, 37, 1)
    row = (s.sections.c.partition == 37, s.sections.c.first_offset == placed.first_offset)
    with catalog.engine.begin() as connection:
        stored = connection.execute(select(s.sections.c.crc32).where(*row)).scalar_one()
        connection.execute(update(s.sections).where(*row).values(crc32=stored ^ 1))
    byte_damaged, flipped = _section_of(catalog, 80, 2)
    data = bytearray(catalog.store.get(byte_damaged))
    data[flipped.info.byte_offset + flipped.info.byte_length - 8] ^= 0x40
    catalog.store.put(byte_damaged, bytes(data))
    sharing = {
        p for p in range(PARTITIONS) for key, other in catalog.snapshot().sections_of("t", p)
        if key == byte_damaged and other.info.byte_offset + other.info.byte_length == flipped.info.byte_offset + flipped.info.byte_length
    }
    assert 37 not in sharing
    before = {p: list(read_records(catalog.store, catalog.snapshot(), "t", p)) for p in range(PARTITIONS) if p != 37 and p not in sharing}

    (copy,) = level_plans(catalog.planning_snapshot(NOW), NOW, min_files=FILES)
    assert copy.target_level == 1 and not copy.deduplicate
    stats = run_and_commit(catalog, copy, NOW).to_dict()
    assert all(whole for _, whole in runs) and (len(runs) > 20 if few_partitions else len(runs) == 1)

    set_aside = {u["partition"] for u in stats["uncleanable"]}
    assert 37 in set_aside and 80 in set_aside and set_aside - {37} <= sharing
    assert stats["records_in"] == stats["records_out"] == sum(len(records) for records in before.values()) + sum(
        len(list(read_records(catalog.store, catalog.snapshot(), "t", p))) for p in sharing - set_aside
    )
    for partition, records in before.items():
        assert list(read_records(catalog.store, catalog.snapshot(), "t", partition)) == records
        assert all(key.startswith("data/l1/") for key, _ in catalog.snapshot().sections_of("t", partition))


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
