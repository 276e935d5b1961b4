"""The segment file format: round trips, one GET per section or per file, and clear errors on bad bytes."""

from __future__ import annotations

import io
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from logcompact.exceptions import ChecksumMismatchError, SegmentFormatError
from logcompact.format import SectionStream, SegmentWriter, read_footer, read_section, section_table, write_segment
from logcompact.format.layout import FILE_HEADER, MAGIC, SECTION_PREFIX
from logcompact.store import LocalStore, ObjectStore

records = st.lists(
    st.tuples(
        st.integers(min_value=1, max_value=1000),  # gap to the previous offset (1 = no hole)
        st.integers(min_value=0, max_value=2**50),
        st.one_of(st.none(), st.binary(max_size=40)),
        st.one_of(st.none(), st.binary(max_size=200)),
        st.lists(st.tuples(st.text(max_size=8), st.binary(max_size=8)), max_size=3),
    ),
    min_size=1,
    max_size=60,
)
topic_partitions = st.lists(
    st.tuples(st.sampled_from(["a", "b", "orders", "z.9"]), st.integers(0, 7)), min_size=1, max_size=6, unique=True
).map(sorted)


def _columns(rows):
    deltas, delta = [], 0
    for i, (gap, *_rest) in enumerate(rows):
        delta = 0 if i == 0 else delta + gap
        deltas.append(delta)
    return deltas, [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], [r[4] or None for r in rows]


@given(topic_partitions, st.data(), st.sampled_from(["none", "lz4", "zstd"]))
def test_round_trip_by_range_get_and_by_stream(tmp_path_factory, partitions, data, compression) -> None:
    store = LocalStore(tmp_path_factory.mktemp("fmt"))
    written = {}
    tables = []
    for topic, partition in partitions:
        columns = _columns(data.draw(records))
        written[(topic, partition)] = columns
        tables.append((topic, partition, section_table(*columns)))
    blob, infos = write_segment(tables, compression)
    store.put("f.seg", blob)

    assert read_footer(store, "f.seg") == infos
    streamed = [(s.info, s.offset_deltas, s.table()) for s in SectionStream(store, "f.seg")]
    for info, from_stream in zip(infos, streamed, strict=True):
        single = read_section(store, "f.seg", info.byte_offset, info.byte_length)
        for got in (from_stream, (single.info, single.offset_deltas, single.table())):
            deltas, timestamps, keys, values, headers = written[(info.topic, info.partition)]
            got_info, got_bitmap, table = got
            assert got_info == info
            assert list(got_bitmap) == deltas
            assert table.column("offset_delta").to_pylist() == deltas
            assert table.column("timestamp").to_pylist() == timestamps
            assert table.column("key").to_pylist() == keys
            assert table.column("value").to_pylist() == values
            assert [[(h["key"], h["value"]) for h in hs] if hs else None for hs in table.column("headers").to_pylist()] == headers
            assert info.record_count == len(deltas) and info.last_delta == deltas[-1]
            assert info.tombstones == sum(v is None for v in values)
            assert (info.min_timestamp, info.max_timestamp) == (min(timestamps), max(timestamps))


def _sample_file(store: ObjectStore, sections: int = 30) -> list:
    tables = [("t", p, section_table(range(100), [1] * 100, [b"k%d" % i for i in range(100)], [b"v"] * 100)) for p in range(sections)]
    blob, infos = write_segment(tables)
    store.put("f.seg", blob)
    return infos


def test_a_whole_file_streams_from_one_get_and_a_section_costs_one_ranged_get(store: ObjectStore) -> None:
    infos = _sample_file(store)
    before = store.counters.snapshot()
    assert len(list(SectionStream(store, "f.seg"))) == 30
    assert (store.counters.snapshot() - before).get == 1

    before = store.counters.snapshot()
    section = read_section(store, "f.seg", infos[17].byte_offset, infos[17].byte_length)
    spent = store.counters.snapshot() - before
    assert section.info.partition == 17 and spent.get == 1 and spent.bytes_read == infos[17].byte_length


def test_checksum_mismatch_names_file_and_section(tmp_path) -> None:
    store = LocalStore(tmp_path)
    infos = _sample_file(store, sections=3)
    blob = bytearray(store.get("f.seg"))
    blob[infos[1].byte_offset + infos[1].byte_length - 5] ^= 0xFF
    store.put("bad.seg", bytes(blob))
    with pytest.raises(ChecksumMismatchError, match=r"bad\.seg: section 1 at byte \d+ failed its CRC-32"):
        list(SectionStream(store, "bad.seg"))
    with pytest.raises(ChecksumMismatchError, match=r"bad\.seg: section 1"):
        read_section(store, "bad.seg", infos[1].byte_offset, infos[1].byte_length, index=1)


def test_unknown_version_and_foreign_files_are_rejected(tmp_path) -> None:
    store = LocalStore(tmp_path)
    _sample_file(store, sections=1)
    blob = store.get("f.seg")
    store.put("v9.seg", FILE_HEADER.pack(MAGIC, 9, 0, 0) + blob[FILE_HEADER.size :])
    with pytest.raises(SegmentFormatError, match=r"v9\.seg: segment format version 9 is not supported"):
        list(SectionStream(store, "v9.seg"))
    store.put("other.bin", b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(SegmentFormatError, match=r"other\.bin: not a logcompact segment file"):
        list(SectionStream(store, "other.bin"))
    with pytest.raises(SegmentFormatError, match=r"other\.bin: not a logcompact segment file"):
        read_footer(store, "other.bin")


def test_truncated_file_is_reported(tmp_path) -> None:
    store = LocalStore(tmp_path)
    infos = _sample_file(store, sections=2)
    store.put("cut.seg", store.get("f.seg")[: infos[1].byte_offset + SECTION_PREFIX.size + 10])
    with pytest.raises(SegmentFormatError, match=r"cut\.seg: truncated in section 1"):
        list(SectionStream(store, "cut.seg"))


def test_writer_enforces_section_order_and_offsets() -> None:
    writer = SegmentWriter(io.BytesIO())
    one = section_table([0], [1], [b"k"], [b"v"])
    writer.write_section("b", 0, one)
    with pytest.raises(ValueError, match="order"):
        writer.write_section("a", 5, one)
    with pytest.raises(ValueError, match="increase strictly"):
        writer.write_section("c", 0, section_table([0, 0], [1, 1], [b"k", b"k"], [b"v", b"v"]))


def test_trailer_points_at_footer() -> None:
    blob, infos = write_segment([("t", 0, section_table([0, 5], [1, 2], [b"a", b"b"], [b"x", None]))])
    footer_position, footer_length, version, _, magic = struct.unpack("<QIHH8s", blob[-24:])
    assert magic == MAGIC and version == 1
    assert blob[footer_position : footer_position + 4] == b"FOOT"
    assert footer_position + footer_length + 24 == len(blob)
    assert infos[0].tombstones == 1 and infos[0].last_delta == 5
