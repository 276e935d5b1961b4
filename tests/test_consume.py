"""Consumption as of one manifest version: by offset across files and levels, holes skipped; latest per key.

On both catalog databases; a read asks the catalog for its one partition's sections only.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import event

from logcompact.catalog import Catalog
from logcompact.consume import latest_values, read_records
from logcompact.exceptions import InvalidRecordError
from logcompact.ingest import Record
from logcompact.store import LocalStore, ObjectStore
from tests.helpers import NOW, create_topic, produce_records, rewrite_without


def test_read_by_offset_across_levels_skipping_holes(store: ObjectStore, catalog_of) -> None:
    catalog = catalog_of(store)
    create_topic(catalog, "t", cleanup_policy="compact")
    for batch in range(3):
        produce_records(catalog, "t", [Record(0, b"k%d" % (i % 3), b"%d" % (batch * 4 + i), NOW + i) for i in range(4)])
    l0 = [f.key for f in catalog.snapshot().file_summaries(0)]
    rewrite_without(store, catalog, l0[:2], drop_offsets={1, 2, 5}, level=1)
    produce_records(catalog, "t", [Record(0, b"k9", b"12", NOW)])
    snapshot = catalog.snapshot()
    assert [f.level for f in snapshot.file_summaries()] == [0, 0, 1]

    offsets = [r.offset for r in read_records(store, snapshot, "t", 0)]
    assert offsets == [0, 3, 4, 6, 7, 8, 9, 10, 11, 12]
    assert [r.value for r in read_records(store, snapshot, "t", 0, from_offset=1, to_offset=7)] == [b"3", b"4", b"6"]
    assert [r.offset for r in read_records(store, snapshot, "t", 0, from_offset=12)] == [12]
    assert list(read_records(store, snapshot, "t", 0, from_offset=13)) == []


def test_sections_whose_ranges_overlap_are_merged_by_offset(catalog: Catalog) -> None:
    store = catalog.store
    create_topic(catalog, "t")
    for batch in range(3):
        produce_records(catalog, "t", [Record(0, None, b"%d" % (batch * 3 + i), NOW) for i in range(3)])
    first, middle, last = catalog.snapshot().file_summaries(0)
    # Compacting the first and last files without the middle one gives a section spanning 0..8 with a
    # hole at 3..5, which the middle file still fills.
    rewrite_without(store, catalog, [first.key, last.key], drop_offsets=set(range(3, 6)), level=1)
    snapshot = catalog.snapshot()
    spans = [(s.first_offset, s.last_offset) for _, s in snapshot.sections_of("t", 0)]
    assert spans == [(0, 8), (3, 5)]
    records = list(read_records(store, snapshot, "t", 0))
    assert [(r.offset, r.value) for r in records] == [(i, b"%d" % i) for i in range(9)]
    assert [r.offset for r in read_records(store, snapshot, "t", 0, from_offset=2, to_offset=7)] == [2, 3, 4, 5, 6]


def test_a_read_asks_the_catalog_for_its_partition_only(catalog: Catalog) -> None:
    store = catalog.store
    create_topic(catalog, "t", partitions=4)
    create_topic(catalog, "other", partitions=2)
    for batch in range(5):
        produce_records(catalog, "t", [Record(p, None, b"%d-%d" % (batch, p), NOW) for p in range(4)])
        produce_records(catalog, "other", [Record(p, None, b"x", NOW) for p in range(2)])
    snapshot = catalog.snapshot()
    statements: list[str] = []

    def record(_conn, _cursor, statement, _parameters, _context, _executemany) -> None:
        statements.append(statement)

    event.listen(catalog.engine, "before_cursor_execute", record)
    try:
        values = [r.value for r in read_records(store, snapshot, "t", 2, from_offset=1, to_offset=4)]
    finally:
        event.remove(catalog.engine, "before_cursor_execute", record)
    assert values == [b"1-2", b"2-2", b"3-2"]
    reads = [s for s in statements if s.lstrip().upper().startswith("SELECT")]
    assert len(reads) == 1 and "partition" in reads[0] and "first_offset" in reads[0], statements
    with pytest.raises(InvalidRecordError, match="topic 't' has partitions 0 to 3, not 4"):
        list(read_records(store, snapshot, "t", 4))


def _reference_latest(records: list[Record]) -> dict[bytes, bytes]:
    latest: dict[bytes, bytes | None] = {}
    for record in records:
        if record.key is not None:
            latest[record.key] = record.value
    return {k: v for k, v in latest.items() if v is not None}


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@settings(max_examples=25)
@given(
    st.lists(
        st.lists(
            st.tuples(st.one_of(st.none(), st.sampled_from([b"a", b"b", b"c", b"d"])), st.one_of(st.none(), st.binary(max_size=5))),
            min_size=1,
            max_size=12,
        ),
        min_size=1,
        max_size=4,
    )
)
def test_latest_values_match_a_reference_model(tmp_path_factory, make_catalog_url, database, batches) -> None:
    catalog = Catalog(LocalStore(tmp_path_factory.mktemp("latest")), make_catalog_url(database))
    store = catalog.store
    create_topic(catalog, "t")
    produced = []
    for batch in batches:
        records = [Record(0, key, value, NOW) for key, value in batch]
        produce_records(catalog, "t", records)
        produced += records
    view = latest_values(store, catalog.snapshot(), "t", 0)
    assert dict(zip(view.column("key").to_pylist(), view.column("value").to_pylist())) == _reference_latest(produced)
    assert view.column("offset").to_pylist() == sorted(view.column("offset").to_pylist())


def test_an_old_manifest_version_reads_what_it_listed(catalog: Catalog) -> None:
    store = catalog.store
    create_topic(catalog, "t")
    produce_records(catalog, "t", [Record(0, None, b"a", NOW)])
    produce_records(catalog, "t", [Record(0, None, b"b", NOW)])
    old = catalog.snapshot()
    rewrite_without(store, catalog, [f.key for f in old.file_summaries(0)], drop_offsets={0}, level=1)
    produce_records(catalog, "t", [Record(0, None, b"c", NOW)])
    assert [r.value for r in read_records(store, old, "t", 0)] == [b"a", b"b"]
    assert [r.value for r in read_records(store, catalog.snapshot(old.version), "t", 0)] == [b"a", b"b"]
    assert [r.value for r in read_records(store, catalog.snapshot(), "t", 0)] == [b"b", b"c"]


def test_a_long_section_is_read_through_its_footer_only_as_the_catalog_records_it(catalog: Catalog, monkeypatch) -> None:
    from sqlalchemy import update

    import logcompact.format.reader as reader
    from logcompact.catalog import schema
    from logcompact.exceptions import CorruptDataError

    create_topic(catalog, "t", cleanup_policy="compact")
    produce_records(catalog, "t", [Record(0, b"k%d" % (n % 50), b"v" * 200, NOW) for n in range(20_000)])
    monkeypatch.setattr(reader, "SEEK_BYTES", 1024)  # every section is "long": read through the footer's blocks
    offsets = [r.offset for r in read_records(catalog.store, catalog.snapshot(), "t", 0, 12_345, 12_400)]
    assert offsets == list(range(12_345, 12_400))
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.sections).values(record_count=19_999))
    with pytest.raises(CorruptDataError, match=r"section t/0: the catalog records record_count 19999 \(found 20000\)"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0, 12_345))
