"""Reads that start where they are asked: a partition's sections read a page at a time from the asked
offset give exactly what one read of them all gives, across page boundaries, holes, a compaction output spanning
a hole another file fills, damaged rows and older versions; and the view of a partition (`latest_values`) equals
a reference, whatever its key map's first size."""

from __future__ import annotations

import random
from itertools import islice

import pytest

import logcompact.catalog.snapshot as snapshot_module
import logcompact.consume as consume
from logcompact.catalog import Catalog, Snapshot
from logcompact.consume import latest_values, read_records
from logcompact.exceptions import CorruptDataError
from logcompact.format import read_footer
from logcompact.format.layout import BLOCK_PREFIX
from logcompact.format.reader import SEEK_BYTES
from logcompact.ingest import Record
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic, damage_section, produce_records, rewrite_without

ALL_AT_ONCE = 1 << 20  # a page larger than any partition here: the sections read in one query


def _pages_of(monkeypatch: pytest.MonkeyPatch, sections: int) -> None:
    monkeypatch.setattr(snapshot_module, "FIRST_PAGE_SECTIONS", sections)
    monkeypatch.setattr(snapshot_module, "LAST_PAGE_SECTIONS", sections)


def _records(catalog: Catalog, snapshot: Snapshot, from_offset: int = 0, to_offset: int | None = None) -> list[tuple[int, bytes | None]]:
    return [(r.offset, r.value) for r in read_records(catalog.store, snapshot, "t", 0, from_offset, to_offset)]


def _pages_asked(monkeypatch: pytest.MonkeyPatch) -> list[list]:
    """Each query of sections pages from now on, as the list of pages (`_Page`) it asked for."""
    asked: list[list] = []
    page_rows = Snapshot._page_rows

    def recording(self: Snapshot, topic_id: int, pages: list) -> list:
        asked.append(list(pages))
        return page_rows(self, topic_id, pages)

    monkeypatch.setattr(Snapshot, "_page_rows", recording)
    return asked


def _spans_asked(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, bool]]:
    """Each question `Snapshot.may_span` is asked from now on, as (offset, first_at_most, its answer)."""
    asked: list[tuple[int, int, bool]] = []
    may_span = Snapshot.may_span

    def recording(self: Snapshot, topic_id: int, partition: int, offset: int, first_at_most: int) -> bool:
        answer = may_span(self, topic_id, partition, offset, first_at_most)
        asked.append((offset, first_at_most, answer))
        return answer

    monkeypatch.setattr(Snapshot, "may_span", recording)
    return asked


@pytest.fixture
def layered(catalog: Catalog) -> Catalog:
    """Partition t/0 of 12 files of 3 records (offsets 0 to 35), then: files 1 and 3 compacted without file 2 into
    a section of offsets 3 to 11 with holes at 4 and 10 that spans file 2's 6 to 8 (which stays live), and files
    5 to 7 into a section of 15 to 23 with holes at 16, 19 and 20. Live sections, by first offset: 0-2, 3-11
    (spanning), 6-8, 12-14, 15-23 (holes), 24-26 ... 33-35."""
    create_topic(catalog, "t", cleanup_policy="compact")
    for number in range(12):
        produce_records(catalog, "t", [Record(0, b"k%d" % (3 * number + i), b"v%d" % (3 * number + i), NOW) for i in range(3)])
    l0 = [f.key for f in catalog.snapshot().file_summaries(0)]
    rewrite_without(catalog.store, catalog, [l0[1], l0[3]], drop_offsets={4, 10}, level=1)
    rewrite_without(catalog.store, catalog, l0[5:8], drop_offsets={16, 19, 20}, level=2)
    return catalog


def test_paged_reads_give_the_records_of_one_read_from_every_offset(layered: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    snapshot = layered.snapshot()
    held = sorted(set(range(36)) - {4, 10, 16, 19, 20})
    _pages_of(monkeypatch, ALL_AT_ONCE)
    whole = {(start, end): _records(layered, snapshot, start, end) for start in range(37) for end in (None, start + 1, start + 7)}
    sections = {start: sorted(snapshot.sections_of("t", 0, start)) for start in range(37)}
    assert [offset for offset, _ in whole[0, None]] == held
    assert [offset for offset, _ in whole[7, 14]] == [7, 8, 9, 11, 12, 13]
    for size in (2, 3, 5):
        _pages_of(monkeypatch, size)
        for (start, end), expected in whole.items():
            assert _records(layered, snapshot, start, end) == expected, (size, start, end)
        for start, expected_sections in sections.items():
            assert sorted(snapshot.sections_of("t", 0, start)) == expected_sections, (size, start)


def test_a_page_asks_for_sections_spanning_its_holes_and_none_past_the_end(layered: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """In pages of 2 from offset 0: the first page ends at 2 (0-2 holds every offset to there); the second at 8 (6-8),
    which leaves 3 to 5 unheld, so the sections ending past 8 and starting by it are asked for (3-11), with those
    ending up to where they end, once the index says some may; then whether any spans past 11: the index says none,
    and no rows are read for it. From 30 to 34: 30-32, then 33-35, no more."""
    _pages_of(monkeypatch, 2)
    snapshot = layered.snapshot()
    asked = _pages_asked(monkeypatch)
    spans = _spans_asked(monkeypatch)
    first_two = [section.first_offset for _, section in islice(snapshot.sections_from("t", 0), 2)]
    from_start = [(page.low, page.high, page.first_at_most) for (page,) in asked]
    asked.clear()
    tail = [section.first_offset for _, section in snapshot.sections_from("t", 0, 30, 34)]
    assert first_two == [0, 3]
    end = snapshot_module._NO_END
    assert from_start == [(0, end, end), (3, end, end), (9, end, 8), (9, 11, end)]
    assert spans == [(8, 8, True), (11, 11, False)]
    assert tail == [30, 33] and [page.low for (page,) in asked] == [30, 33]


def test_a_damaged_row_is_found_across_a_page_boundary(layered: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """The row of 27-29 shifted to 25-27, over 24-26: in pages of 2 they come in different pages."""
    snapshot = layered.snapshot()
    key = next(k for k, s in snapshot.sections_of("t", 0) if s.first_offset == 27)
    damage_section(layered, key, 0, rebind=True, first_offset=25, last_offset=27)
    for size in (2, 3, ALL_AT_ONCE):
        _pages_of(monkeypatch, size)
        for start in (0, 13, 24):
            with pytest.raises(CorruptDataError, match=f"section t/0 of {key} \\(offsets 25 to 27, 3 record\\(s\\)\\) is damaged: it overlaps"):
                layered.snapshot().sections_of("t", 0, start)
            with pytest.raises(CorruptDataError, match=key):
                _records(layered, layered.snapshot(), start)


def test_an_older_snapshot_pages_through_the_sections_of_its_version(layered: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Sections removed by a later compaction are still read by a snapshot of the version before it, and the newer
    one reads the compaction's output in their place."""
    old = layered.snapshot()
    _pages_of(monkeypatch, ALL_AT_ONCE)
    before = _records(layered, old)
    keys = [k for k, s in old.sections_of("t", 0) if s.first_offset >= 24]
    rewrite_without(layered.store, layered, keys, drop_offsets={25, 26, 30}, level=3)
    after = _records(layered, layered.snapshot())
    assert [offset for offset, _ in before if offset >= 24] == list(range(24, 36))
    assert [offset for offset, _ in after if offset >= 24] == [24, 27, 28, 29, 31, 32, 33, 34, 35]
    for size in (2, 3):
        _pages_of(monkeypatch, size)
        assert _records(layered, layered.snapshot(old.version)) == before
        assert _records(layered, old, 20) == [r for r in before if r[0] >= 20]
        assert _records(layered, layered.snapshot()) == after


def test_a_fetch_with_little_room_reads_one_page_of_a_long_partition(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """40 sections of 2 records of 100 bytes, a Fetch of 1 KiB: one page of the partition's sections is read."""
    from logcompact.kafka.handlers.fetch import Wanted, read

    create_topic(catalog, "t", cleanup_policy="compact")
    for number in range(40):
        produce_records(catalog, "t", [Record(0, b"k%d" % (2 * number + i), bytes(100), NOW) for i in range(2)])
    asked = _pages_asked(monkeypatch)
    _, ((_, (answer,)),) = read(catalog, catalog.store, 1024, [("t", [Wanted(0, 3, 1024)])])
    assert 3 < answer.next_offset < 32  # some records, fewer than the first page's 16 sections hold
    assert [[(page.low, page.limit) for page in pages] for pages in asked] == [[(3, snapshot_module.FIRST_PAGE_SECTIONS)]]


# -- latest_values ------------------------------------------------------------------------------------------


def _reference_view(records: list[tuple[int, bytes | None, bytes | None]]) -> list[tuple[int, bytes, bytes]]:
    """Each key's last record by offset, unless a tombstone; keyless records left out; in offset order."""
    last: dict[bytes, tuple[int, bytes | None]] = {}
    for offset, key, value in records:
        if key is not None:
            last[key] = (offset, value)
    return sorted((offset, key, value) for key, (offset, value) in last.items() if value is not None)


@pytest.mark.parametrize("sketch_says", [None, 1.0], ids=["sized by the sketches", "a sketch far too low"])
def test_latest_values_equal_a_reference_over_files_with_tombstones_and_repeated_keys(
    tmp_path, sketch_says: float | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Six files of 900 records over 2,500 keys (most keys in two files or more), a tenth of them tombstones and
    some keyless, then the first three compacted (holes): the view is the reference's. With the key sketches made
    to say one key, the smallest map (1,024 slots) fills and is made larger until it holds them."""
    if sketch_says is not None:
        monkeypatch.setattr(consume, "estimate", lambda registers: sketch_says)
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t")  # not compacted: keyless records are taken
    rng = random.Random(21)
    produced: list[tuple[int, bytes | None, bytes | None]] = []
    for _ in range(6):
        batch = []
        for _ in range(900):
            key = None if rng.random() < 0.03 else b"key-%d" % rng.randrange(2_500)
            value = None if rng.random() < 0.1 else b"value-%d" % rng.randrange(10**6)
            batch.append(Record(0, key, value, NOW))
        first = produce_records(catalog, "t", batch)[0]
        produced += [(first + i, r.key, r.value) for i, r in enumerate(batch)]
    l0 = [f.key for f in catalog.snapshot().file_summaries(0)]
    dropped = set(rng.sample(range(2_700), 300))
    rewrite_without(catalog.store, catalog, l0[:3], drop_offsets=dropped, level=1)
    produced = [r for r in produced if r[0] not in dropped]
    view = latest_values(catalog.store, catalog.snapshot(), "t", 0)
    got = list(zip(view.column("offset").to_pylist(), view.column("key").to_pylist(), view.column("value").to_pylist()))
    expected = _reference_view(produced)
    assert got == expected
    assert len(expected) > 1_100


def _view(catalog: Catalog, partition: int) -> list[tuple[int, bytes, bytes]]:
    view = latest_values(catalog.store, catalog.snapshot(), "t", partition)
    return list(zip(view.column("offset").to_pylist(), view.column("key").to_pylist(), view.column("value").to_pylist()))


def _damage_payload(store: LocalStore, key: str, block: int) -> None:
    """Flip a byte in the payload of the file's block `block`: only a read of its payload finds it."""
    path = store.root / key
    data = bytearray(path.read_bytes())
    at = int(read_footer(store, key).block_offsets[block])
    index_length = BLOCK_PREFIX.unpack_from(data, at)[0]
    data[at + BLOCK_PREFIX.size + index_length + 100] ^= 0xFF
    path.write_bytes(bytes(data))


def test_latest_values_read_again_only_the_blocks_holding_a_latest_record(tmp_path) -> None:
    """A long section (read through its file's footer), compacted with holes, whose first blocks hold only keys
    written again later, its last ones keys with tombstones; then a file whose small sections of four partitions
    share a block, tombstones among them. Every partition's view is the reference's; a block without a latest record
    is not read again: its payload damaged, the view is the same (a whole read finds the damage), while damage in a
    block holding one is found."""
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t", partitions=4)
    rng = random.Random(8)
    produced: dict[int, list[tuple[int, bytes | None, bytes | None]]] = {p: [] for p in range(4)}
    old = [Record(0, b"old-%d" % n, rng.randbytes(300), NOW) for n in range(12_000)]
    recent = [
        Record(0, b"key-%d" % rng.randrange(3_000), None if rng.random() < 0.1 else rng.randbytes(300), NOW) for _ in range(12_000)
    ]
    first = produce_records(catalog, "t", old + recent)[0]
    produced[0] = [(first + i, r.key, r.value) for i, r in enumerate(old + recent)]
    (long_file,) = [f.key for f in catalog.snapshot().file_summaries(0)]
    dropped = set(rng.sample(range(24_000), 2_000))
    rewrite_without(catalog.store, catalog, [long_file], drop_offsets=dropped, level=1)
    produced[0] = [r for r in produced[0] if r[0] not in dropped]
    again = [Record(0, b"old-%d" % n, None if n % 7 == 0 else b"again-%d" % n, NOW) for n in range(12_000)]
    small = [Record(p, b"s-%d" % rng.randrange(4), None if rng.random() < 0.2 else b"%d" % n, NOW) for n in range(30) for p in range(1, 4)]
    offsets = produce_records(catalog, "t", again + small)
    for record, offset in zip(again + small, offsets):
        produced[record.partition].append((offset, record.key, record.value))
    expected = {p: _reference_view(produced[p]) for p in range(4)}
    assert all(_view(catalog, p) == expected[p] for p in range(4))
    assert all(expected[p] for p in range(4))

    compacted, section = catalog.snapshot().sections_of("t", 0)[0]  # offsets from 0: the compaction's output
    assert section.info.byte_length > SEEK_BYTES  # read through the footer
    blocks = len(read_footer(catalog.store, compacted).block_offsets)
    assert blocks >= 5
    _damage_payload(catalog.store, compacted, 0)  # only records of keys written again
    with pytest.raises(CorruptDataError, match="CRC-32"):
        list(read_records(catalog.store, catalog.snapshot(), "t", 0))
    assert _view(catalog, 0) == expected[0]
    _damage_payload(catalog.store, compacted, blocks - 1)  # latest records of recent keys
    with pytest.raises(CorruptDataError, match="CRC-32"):
        latest_values(catalog.store, catalog.snapshot(), "t", 0)
