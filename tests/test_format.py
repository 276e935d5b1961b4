"""The segment file format: round trips, one GET per section or per file, packing, and clear errors on bad bytes."""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from pyroaring import BitMap

from logcompact.exceptions import CorruptDataError
from logcompact.format import PartsSink, SectionStream, SegmentWriter, read_footer, read_section, read_section_from, section_table, write_segment
from logcompact.format.layout import FILE_HEADER, MAGIC, SECTION_SCHEMA, TRAILER, SectionInfo, record_bytes, row_sizes
from logcompact.format.reader import SEEK_BYTES, BlockStream, iter_blocks, section_rows
from logcompact.format.writer import PACK_BYTES, PLAIN_FOOTER_ROWS
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
    st.tuples(st.sampled_from(["a", "b", "orders", "z.9"]), st.integers(0, 300)), min_size=1, max_size=40, unique=True
).map(sorted)


def _columns(rows):
    deltas, delta = [], 0
    for i, (gap, *_rest) in enumerate(rows):
        delta = 0 if i == 0 else delta + gap
        deltas.append(delta)
    return deltas, [r[1] for r in rows], [r[2] for r in rows], [r[3] for r in rows], [r[4] or None for r in rows]


def _bulk(partitions, tables, compression):
    """The same sections through write_sections, as an ingest agent writes them."""
    sink = io.BytesIO()
    writer = SegmentWriter(sink, compression)
    writer.write_sections(partitions, pa.concat_tables(tables), [t.num_rows for t in tables])
    infos = writer.finish()
    return sink.getvalue(), infos


@settings(max_examples=60, deadline=None)
@given(topic_partitions, st.data(), st.sampled_from(["none", "lz4", "zstd"]), st.booleans())
def test_round_trip_by_range_get_footer_and_stream(tmp_path_factory, partitions, data, compression, bulk) -> None:
    store = LocalStore(tmp_path_factory.mktemp("fmt"))
    written = {}
    tables = []
    for topic, partition in partitions:
        columns = _columns(data.draw(records))
        written[(topic, partition)] = columns
        tables.append(section_table(*columns))
    if bulk:
        blob, infos = _bulk(partitions, tables, compression)
    else:
        blob, infos = write_segment([(t, p, table) for (t, p), table in zip(partitions, tables)], compression)
    store.put("f.seg", blob)

    footer = read_footer(store, "f.seg")
    assert footer.sections == infos
    for info, bitmap in zip(infos, footer.offset_bitmaps, strict=True):
        deltas = written[(info.topic, info.partition)][0]
        assert (list(BitMap.deserialize(bitmap)) if bitmap else list(range(info.last_delta + 1))) == deltas

    stream = BlockStream(store, "f.seg")
    streamed = pa.Table.from_batches([stream.next_batch() for _ in footer.block_offsets])
    assert streamed.equals(pa.concat_tables(tables))
    for info, table in zip(infos, tables, strict=True):
        single = read_section(store, "f.seg", info)
        deltas, timestamps, keys, values, headers = written[(info.topic, info.partition)]
        got = single.table()
        assert got.equals(table)
        assert list(single.offset_deltas) == deltas
        assert [[(h["key"], h["value"]) for h in hs] if hs else None for hs in got.column("headers").to_pylist()] == headers
        assert info.record_count == len(deltas) and info.last_delta == deltas[-1]
        assert info.tombstones == sum(v is None for v in values)
        assert (info.min_timestamp, info.max_timestamp) == (min(timestamps), max(timestamps))
        assert info.compression == compression


@settings(max_examples=30, deadline=None)
@given(topic_partitions, st.data(), st.sampled_from(["none", "lz4", "zstd"]))
def test_a_file_written_as_parts_is_the_file_written_into_one_buffer(tmp_path_factory, partitions, data, compression) -> None:
    """An ingest agent's file goes to the store as the writer's parts (PartsSink, put_parts): the same bytes as
    through one buffer."""
    tables = [section_table(*_columns(data.draw(records))) for _ in partitions]
    blob, infos = _bulk(partitions, tables, compression)
    sink = PartsSink()
    writer = SegmentWriter(sink, compression)
    writer.write_sections(partitions, pa.concat_tables(tables), [t.num_rows for t in tables])
    assert writer.finish() == infos and writer.position == len(blob)
    store = LocalStore(tmp_path_factory.mktemp("parts"))
    store.put_parts("f.seg", sink.parts)
    assert store.get("f.seg") == blob


def test_a_section_written_into_parts_cannot_be_abandoned() -> None:
    section = SegmentWriter(PartsSink(), "none").begin_section("t", 0)
    section.append(section_table([0], [1], [b"k"], [b"v"]))
    section.end_block()
    with pytest.raises(TypeError, match="cannot seek"):
        section.abandon()


def _sample_file(store: ObjectStore, sections: int = 30, records: int = 100) -> list:
    tables = [
        ("t", p, section_table(range(records), [1] * records, [b"k%d" % i for i in range(records)], [b"v"] * records))
        for p in range(sections)
    ]
    blob, infos = write_segment(tables)
    store.put("f.seg", blob)
    return infos


def test_a_whole_file_streams_from_one_get_and_a_section_costs_one_ranged_get(store: ObjectStore) -> None:
    infos = _sample_file(store)
    footer = read_footer(store, "f.seg")
    before = store.counters.snapshot()
    stream = BlockStream(store, "f.seg")
    assert sum(stream.next_batch().num_rows for _ in footer.block_offsets) == 3000
    stream.close()
    assert (store.counters.snapshot() - before).get == 1

    before = store.counters.snapshot()
    section = read_section(store, "f.seg", infos[17])
    spent = store.counters.snapshot() - before
    assert section.info.partition == 17 and section.table().num_rows == 100
    assert spent.get == 1 and spent.bytes_read == infos[17].byte_length


@pytest.mark.parametrize("bulk", [False, True])
def test_small_sections_share_blocks_and_cost_little(bulk) -> None:
    """One schema per file and packed blocks: 3,000 sections of 3 records with incompressible values."""
    rng = np.random.default_rng(7)
    partitions = [("t", p) for p in range(3000)]
    tables = [
        section_table(range(3), [1_700_000_000_000] * 3, [b"key-%012d" % (3 * p + i) for i in range(3)],
                      [rng.bytes(120) for _ in range(3)])
        for _, p in partitions
    ]
    payload = sum(len(k) + len(v) for t in tables for k, v in zip(t.column("key").to_pylist(), t.column("value").to_pylist()))
    if bulk:  # rows cut from one table: a block of a slice must not carry its parent's buffers
        blob, infos = _bulk(partitions, tables, "lz4")
    else:
        blob, infos = write_segment([(t, p, table) for (t, p), table in zip(partitions, tables)])
    assert len({info.byte_offset for info in infos}) < 50  # blocks, not sections
    assert (len(blob) - payload) / len(infos) < 100


def test_sections_written_in_bulk_pack_blocks_a_section_at_a_time(tmp_path) -> None:
    """write_sections places runs of small sections at once (an agent's L0 file of 1,000 partitions) where it stepped
    section by section: a block still ends after the first section that brings it to PACK_BYTES, whatever the sizes."""
    rng = np.random.default_rng(11)
    partitions = [(topic, p) for topic in ("b", "c") for p in range(1500)]
    tables = []
    for _ in partitions:
        rows = int(rng.integers(1, 6))
        deltas = np.cumsum(rng.integers(1, 3, rows)) - 1
        deltas -= deltas[0]  # holes in some sections: their offset bitmaps
        big = rng.random() < 0.01  # now and then a section past PACK_BYTES alone
        tables.append(section_table(
            deltas, rng.integers(0, 2**40, rows).tolist(), [None if rng.random() < 0.1 else b"k%d" % rng.integers(9) for _ in range(rows)],
            [None if rng.random() < 0.2 else rng.bytes(int(rng.integers(0, 300)) + (PACK_BYTES if big else 0)) for _ in range(rows)],
            [[("h", b"x")] if rng.random() < 0.1 else None for _ in range(rows)],
        ))
    blob, infos = _bulk(partitions, tables, "lz4")
    block, first_row, filled, blocks = 0, 0, 0, []
    for table, info in zip(tables, infos):
        blocks.append((block, first_row))
        first_row, filled = first_row + table.num_rows, filled + record_bytes(table.to_batches()[0])
        assert info.uncompressed_bytes == record_bytes(table.to_batches()[0])
        if filled >= PACK_BYTES:
            block, first_row, filled = block + 1, 0, 0
    offsets = sorted({info.byte_offset for info in infos})
    assert [(offsets.index(info.byte_offset), info.first_row) for info in infos] == blocks
    assert len(offsets) > 10
    store = LocalStore(tmp_path)
    store.put("f.seg", blob)
    for index in rng.choice(len(infos), 40, replace=False).tolist():
        assert read_section(store, "f.seg", infos[index]).table().equals(tables[index].cast(SECTION_SCHEMA))


def test_a_big_section_spans_blocks_indexed_by_offset(tmp_path) -> None:
    store = LocalStore(tmp_path)
    n = 200_000
    big = section_table(np.arange(n) * 2, np.arange(n), [b"key%d" % i for i in range(n)], [b"v" * 40] * n)
    small = section_table([0], [1], [b"k"], [b"v"])
    blob, infos = write_segment([("a", 0, small), ("a", 1, big), ("a", 2, small)])
    store.put("f.seg", blob)
    footer = read_footer(store, "f.seg")
    blocks = footer.blocks_of(infos[1])
    assert len(blocks) > 5
    # A reader seeking offset delta D starts at the last block whose first delta is <= D.
    wanted = 2 * 150_001
    first_deltas = footer.block_first_deltas[blocks.start + 1 : blocks.stop]
    start = blocks.start + 1 + int(np.searchsorted(first_deltas, wanted, side="right")) - 1
    data = store.get_range("f.seg", int(footer.block_offsets[start]), int(footer.block_lengths[start]))
    (_, batch), = list(iter_blocks("f.seg", data, int(footer.block_offsets[start])))
    deltas = batch.column("offset_delta").to_numpy()
    assert deltas[0] <= wanted <= deltas[-1]
    assert read_section(store, "f.seg", infos[2]).table().equals(small)


def test_a_flipped_byte_fails_the_block_checksum_before_decoding(tmp_path) -> None:
    store = LocalStore(tmp_path)
    infos = _sample_file(store, sections=3, records=3000)
    blob = bytearray(store.get("f.seg"))
    blob[infos[1].byte_offset + infos[1].byte_length - 5] ^= 0xFF
    store.put("bad.seg", bytes(blob))
    with pytest.raises(CorruptDataError, match=r"bad\.seg: block at byte \d+ failed its CRC-32 check \(payload"):
        read_section(store, "bad.seg", infos[1])
    stream = BlockStream(store, "bad.seg")
    with pytest.raises(CorruptDataError, match=r"bad\.seg: block at byte \d+ failed its CRC-32"):
        for _ in infos:
            stream.next_batch()


def test_a_file_swapped_for_another_is_caught_by_the_catalogs_checksum(tmp_path) -> None:
    store = LocalStore(tmp_path)
    infos = _sample_file(store, sections=2)
    other = section_table(range(100), [2] * 100, [b"x%d" % i for i in range(100)], [b"w"] * 100)
    store.put("f.seg", write_segment([("t", 0, other), ("t", 1, other)])[0])
    with pytest.raises(CorruptDataError, match=r"f\.seg: section t/0 at byte \d+: the catalog records a block of index CRC-32"):
        read_section(store, "f.seg", infos[0])


def test_unknown_version_and_foreign_files_are_rejected(tmp_path) -> None:
    store = LocalStore(tmp_path)
    _sample_file(store, sections=1)
    blob = store.get("f.seg")
    store.put("v9.seg", FILE_HEADER.pack(MAGIC, 9, 0, 0) + blob[FILE_HEADER.size :])
    with pytest.raises(CorruptDataError, match=r"v9\.seg: segment format version 9 is not supported"):
        BlockStream(store, "v9.seg")
    store.put("other.bin", b"PK\x03\x04" + b"\0" * 100)
    with pytest.raises(CorruptDataError, match=r"other\.bin: not a logcompact segment file"):
        BlockStream(store, "other.bin")
    with pytest.raises(CorruptDataError, match=r"other\.bin: not a logcompact segment file"):
        read_footer(store, "other.bin")


def test_truncated_file_is_reported(tmp_path) -> None:
    store = LocalStore(tmp_path)
    infos = _sample_file(store, sections=2, records=30_000)
    store.put("cut.seg", store.get("f.seg")[: infos[1].byte_offset + infos[1].byte_length // 2])
    stream = BlockStream(store, "cut.seg")
    with pytest.raises(CorruptDataError, match=r"cut\.seg: truncated"):
        for _ in range(100):
            stream.next_batch()
    with pytest.raises(CorruptDataError, match=r"cut\.seg: section t/1 at byte \d+ is cut short"):
        read_section(store, "cut.seg", infos[1])


def _claimed(record_count: int, last_delta: int, first_row: int = 0) -> SectionInfo:
    """What a catalog row might claim of a section."""
    return SectionInfo("t", 0, record_count, last_delta, 1, 1, 0, 0, "none", 0, 0, 0, 0, b"", first_row)


def test_section_rows_are_checked_against_the_catalogs_record() -> None:
    batch = section_table([0, 1, 2], [1, 1, 1], [b"a", b"b", b"c"], [b"x", b"y", b"z"]).to_batches()[0]
    assert [b.num_rows for b in section_rows("f.seg", _claimed(3, 2), iter([batch]))] == [3]
    with pytest.raises(CorruptDataError, match="hold 3 of the 4 records"):
        list(section_rows("f.seg", _claimed(4, 3), iter([batch])))
    # Counts no offsets could hold are refused before a row is read: 0 records, or more than the deltas span.
    for impossible in (_claimed(0, 2), _claimed(4, 2)):
        with pytest.raises(CorruptDataError, match=r"the catalog records \d record\(s\) in offset deltas 0 to 2, which cannot be"):
            list(section_rows("f.seg", impossible, iter([batch])))
    # A record count edited smaller, a first row or last delta pointing elsewhere: no row is handed out.
    for claimed in (_claimed(2, 2), _claimed(2, 1, first_row=1), _claimed(3, 5)):
        with pytest.raises(CorruptDataError, match=r"f\.seg: section t/0 at byte 0: expected offset deltas increasing"):
            list(section_rows("f.seg", claimed, iter([batch])))


def test_writer_enforces_section_order_and_offsets() -> None:
    writer = SegmentWriter(io.BytesIO())
    one = section_table([0], [1], [b"k"], [b"v"])
    writer.write_section("b", 0, one)
    with pytest.raises(ValueError, match="order"):
        writer.write_section("a", 5, one)
    with pytest.raises(ValueError, match="increase strictly"):
        writer.write_section("c", 0, section_table([0, 0], [1, 1], [b"k", b"k"], [b"v", b"v"]))
    bulk = SegmentWriter(io.BytesIO())
    with pytest.raises(ValueError, match=r"section t/1: offset deltas must start at 0"):
        bulk.write_sections([("t", 0), ("t", 1)], section_table([0, 1, 1], [1] * 3, [b"k"] * 3, [b"v"] * 3), [1, 2])
    two = section_table([0, 0], [1, 1], [b"k", b"k"], [b"v", b"v"])
    with pytest.raises(ValueError, match=r"section t/0 written after t/1"):
        SegmentWriter(io.BytesIO()).write_sections([("t", 1), ("t", 0)], two, [1, 1])
    after_one = SegmentWriter(io.BytesIO())
    after_one.write_section("t", 3, one)
    with pytest.raises(ValueError, match=r"section t/3 written after t/3"):
        after_one.write_sections([("t", 3), ("t", 4)], two, [1, 1])


def test_trailer_points_at_footer() -> None:
    blob, infos = write_segment([("t", 0, section_table([0, 5], [1, 2], [b"a", b"b"], [b"x", None]))], "zstd")
    footer_position, footer_length, version, compression, magic = struct.unpack("<QIHH8s", blob[-24:])
    assert magic == MAGIC and version == 2 and compression == 2
    assert blob[footer_position : footer_position + 4] == b"FOOT"
    assert footer_position + footer_length + 24 == len(blob)
    assert infos[0].tombstones == 1 and infos[0].last_delta == 5


@pytest.mark.parametrize("sections", [PLAIN_FOOTER_ROWS, PLAIN_FOOTER_ROWS + 1])
def test_a_short_footer_is_stored_plain_and_a_long_one_compressed_both_read_back(tmp_path, sections: int) -> None:
    topic = "a-topic-name-long-enough-to-find-in-the-footer"
    blob, infos = write_segment([(topic, p, section_table([0], [p], [b"k"], [b"v"])) for p in range(sections)], "lz4")
    footer_position = TRAILER.unpack(blob[-TRAILER.size:])[0]
    footer_bytes = blob[footer_position:-TRAILER.size]
    # Plain, the footer's string buffer holds the topic once a section; zstd keeps far fewer copies of it.
    assert (footer_bytes.count(topic.encode()) == sections) == (sections <= PLAIN_FOOTER_ROWS)
    store = LocalStore(tmp_path)
    store.put("f.seg", blob)
    assert read_footer(store, "f.seg").sections == infos
    assert [read_section(store, "f.seg", info).table().column("value").to_pylist() for info in infos] == [[b"v"]] * sections


def test_pass_one_reads_a_blocks_index_and_skips_its_payload_unchecked(tmp_path) -> None:
    store = LocalStore(tmp_path)
    infos = _sample_file(store, sections=1, records=3000)
    blob = bytearray(store.get("f.seg"))
    blob[infos[0].byte_offset + infos[0].byte_length - 5] ^= 0xFF  # in the payload, at the end of the block
    store.put("payload.seg", bytes(blob))
    index = BlockStream(store, "payload.seg").next_batch(index_only=True)
    assert index.schema.names == ["offset_delta", "timestamp", "key_hash"] and index.num_rows == 3000
    with pytest.raises(CorruptDataError, match=r"\(payload: expected"):
        BlockStream(store, "payload.seg").next_batch()
    blob = bytearray(store.get("f.seg"))
    blob[infos[0].byte_offset + 40] ^= 0xFF  # in the index message
    store.put("index.seg", bytes(blob))
    with pytest.raises(CorruptDataError, match=r"\(index: expected"):
        BlockStream(store, "index.seg").next_batch(index_only=True)


def test_a_stream_reads_no_payload_of_a_block_its_caller_refuses_by_the_index(tmp_path) -> None:
    """`payload_wanted` is shown each block holding the section's rows alone, by its index columns: a refused block's
    payload is neither read nor checked (damage there goes unseen) and its rows are not yielded, though its deltas are
    still checked. A block shared with another section is read whole without asking."""
    store = LocalStore(tmp_path)
    count = 40
    big = section_table(list(range(count)), [1] * count, [b"k%d" % i for i in range(count)], [os.urandom(100_000) for _ in range(count)])
    small = section_table([0, 1], [1, 1], [b"a", b"b"], [b"x", b"y"])
    blob, (before, info) = write_segment([("t", 0, small), ("t", 1, big)])
    store.put("f.seg", blob)
    footer = read_footer(store, "f.seg")
    shared = int(footer.block_rows[0]) - 2  # the big section's rows in the block it shares with the small one
    assert len(footer.block_offsets) >= 3 and info.byte_offset == before.byte_offset and shared > 0
    damaged = bytearray(blob)
    damaged[int(footer.block_offsets[1] + footer.block_lengths[1]) - 1] ^= 0xFF  # the second block's payload
    store.put("f.seg", bytes(damaged))
    shown: list[int] = []

    def refuse_all(index: pa.RecordBatch) -> bool:
        assert index.schema.names == ["offset_delta", "timestamp", "key_hash"]
        shown.append(index.num_rows)
        return False

    stream = SectionStream(store, "f.seg", len(blob))
    assert pa.Table.from_batches(list(stream.rows(before, payload_wanted=refuse_all))).column("key").to_pylist() == [b"a", b"b"]
    rows = pa.Table.from_batches(list(stream.rows(info, payload_wanted=refuse_all)))
    assert shown == [int(n) for n in footer.block_rows[1:]]
    assert rows.column("offset_delta").to_pylist() == list(range(shared))
    assert rows.column("value").to_pylist() == big.column("value").to_pylist()[:shared]
    with pytest.raises(CorruptDataError, match=r"\(payload: expected"):
        list(SectionStream(store, "f.seg", len(blob)).rows(info))


def test_a_block_read_without_its_payload_is_never_another_sections(tmp_path) -> None:
    """A catalog giving a second section the block a refused one held alone is damage, not a section without rows."""
    store = LocalStore(tmp_path)
    blob, (info,) = write_segment([("t", 0, section_table([0, 1, 2], [1, 1, 1], [b"a", b"b", b"c"], [b"x", b"y", b"z"]))])
    store.put("f.seg", blob)
    stream = SectionStream(store, "f.seg", len(blob))
    assert list(stream.rows(info, payload_wanted=lambda index: False)) == []
    with pytest.raises(CorruptDataError, match=r"no block starts at byte"):
        list(stream.rows(info))


def test_a_forward_stream_and_ranged_gets_yield_a_sections_rows_alike_from_any_delta(tmp_path) -> None:
    """The read path's two ways of fetching blocks: one streaming GET over the file (the compactor's pointer) and
    ranged GETs (consumers), on small sections sharing blocks, a section of two blocks under SEEK_BYTES (one ranged
    GET) and one of several blocks over it (read through the footer)."""
    store = LocalStore(tmp_path)

    def section(count: int, value_bytes: int, step: int = 1) -> pa.Table:
        deltas = np.arange(count, dtype=np.int64) * step
        return section_table(deltas, [1] * count, [b"k%d" % i for i in range(count)], [os.urandom(value_bytes) for _ in range(count)])

    tables = [("t", p, section(3 + p % 4, 40, step=1 + p % 2)) for p in range(12)]
    tables += [("t", 12, section(70_000, 1)), ("t", 13, section(5_000, 1000, step=2)), ("t", 14, section(4, 40))]
    blob, infos = write_segment(tables, "lz4")
    store.put("f.seg", blob)
    footer = read_footer(store, "f.seg")
    assert infos[12].byte_length < SEEK_BYTES < infos[13].byte_length and len(footer.blocks_of(infos[13])) > 3
    assert footer.blocks_of(infos[0]) == footer.blocks_of(infos[5])  # small sections share a block

    def deltas_of(info: SectionInfo) -> list[int]:
        """0, inside its first block, a block's first delta and the one after it, a hole, the last, past the last."""
        firsts = footer.block_first_deltas[footer.blocks_of(info)]
        boundary = int(firsts[1]) if len(firsts) > 1 else info.last_delta
        return [0, min(1, info.last_delta), boundary, boundary + 1, info.last_delta - 1, info.last_delta, info.last_delta + 1]

    for which in range(7):
        before = store.counters.snapshot()
        stream = SectionStream(store, "f.seg", len(blob))
        streamed = [list(stream.rows(info, deltas_of(info)[which])) for info in infos]
        stream.close()
        assert (store.counters.snapshot() - before).get == 1  # the whole file, front to back
        for info, (_, _, table), pieces in zip(infos, tables, streamed, strict=True):
            from_delta = deltas_of(info)[which]
            ranged = list(read_section_from(store, "f.seg", info, from_delta))
            assert [piece.num_rows for piece in pieces] == [piece.num_rows for piece in ranged] and all(p.num_rows for p in pieces)
            got = pa.Table.from_batches(pieces, SECTION_SCHEMA)
            assert got.equals(pa.Table.from_batches(ranged, SECTION_SCHEMA))
            assert got.equals(table.filter(pa.array(table.column("offset_delta").to_numpy() >= from_delta)))


@given(st.lists(st.tuples(st.binary(max_size=8) | st.none(), st.lists(st.tuples(st.text(max_size=4), st.binary(max_size=6) | st.none()), max_size=3)), min_size=1, max_size=30),
       st.integers(0, 29), st.integers(0, 30))
def test_a_batchs_bytes_are_the_sum_of_its_rows_however_it_is_sliced(rows: list, start: int, length: int) -> None:
    """A section's uncompressed bytes are the same whether its rows came in one batch (`SegmentWriter.write_sections`,
    by `row_sizes`) or in any slices (`SectionBuilder`, by `record_bytes`), headers included."""
    values = [value for value, _ in rows]
    headers = [entries or None for _, entries in rows]
    batch = section_table(range(len(rows)), [0] * len(rows), [b"k"] * len(rows), values, headers).combine_chunks().to_batches()[0]
    start = min(start, len(rows))
    assert record_bytes(batch.slice(start, length)) == int(row_sizes(batch)[start : start + length].sum())
