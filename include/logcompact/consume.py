"""Reading a partition as of one manifest version: by offset, or the latest value per key.

Offsets live in the catalog: a section's records carry offset deltas, and the catalog gives each
section's first offset. A read asks the snapshot for the sections of its one partition from its offset, a page at a
time as it gets to them (`Snapshot.sections_from`: the first record costs one indexed query of a few rows, however
many sections the partition holds), then reads each in offset order through the format's one
read path of a section from an offset (`format.read_section_from`: one ranged GET, or, for a long section, block
by block from the one holding the first offset wanted), the path Fetch reads too and the engine reads from one
forward stream per file (`format.SectionStream`); sections whose offset ranges overlap (a compaction output
spans a hole that another file fills) are merged by offset. Holes left by compaction are simply absent, as Kafka consumers expect.

A `read_committed` read (`READ_COMMITTED`, Kafka's isolation level) ends at the partition's last stable offset and
leaves out the records of aborted transactions, by the offset ranges the catalog recorded for them (their offsets
become holes, as compaction's): the agent filters, so no reader needs the markers Kafka's clients filter by.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import CatalogSection, Snapshot
from logcompact.exceptions import CorruptDataError, InvalidRecordError
from logcompact.format import Footer, SectionInfo, SectionStream, read_footer, read_section_from
from logcompact.format.layout import HEADERS_TYPE, INDEX_COLUMNS, key_hash_words
from logcompact.format.reader import SEEK_BYTES, read_section_blocks
from logcompact.keys import DATA_KEY_PATTERN
from logcompact.sketch import estimate, merge_packed
from logcompact.store.base import ObjectStore

if TYPE_CHECKING:
    from logcompact.engine.offset_map import OffsetMap

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
AbortedRange = tuple[int, int]  # (first offset, last offset) of aborted records

# Kafka's isolation levels (its `isolation_level` field): whether a read stops at the last stable offset and leaves out aborted records
READ_UNCOMMITTED, READ_COMMITTED = 0, 1
ISOLATION_LEVELS = {"read_uncommitted": READ_UNCOMMITTED, "read_committed": READ_COMMITTED}


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


def _records_table(batch: pa.RecordBatch, first_offset: int, columns: tuple[str, ...]) -> pa.Table:
    # The record columns are the file's as they are, so their table is of RECORD_SCHEMA without a cast.
    schema = RECORD_SCHEMA if columns == _RECORD_COLUMNS else None
    names = None if schema is not None else ["offset", *columns]
    offsets = pa.array(batch.column(0).to_numpy().astype(np.int64) + first_offset)  # offset_delta, never null
    return pa.Table.from_arrays([offsets, *(batch.column(name) for name in columns)], names=names, schema=schema)


def read_batches(
    store: ObjectStore,
    snapshot: Snapshot,
    topic: str,
    partition: int,
    from_offset: int = 0,
    to_offset: int | None = None,
    isolation: int = READ_UNCOMMITTED,
) -> Iterator[pa.Table]:
    """Records of one partition with from_offset <= offset < to_offset, as Arrow tables in offset order; under
    READ_COMMITTED only those below the partition's last stable offset, without aborted transactions' records."""
    partitions = snapshot.topic(topic).partitions
    if not 0 <= partition < partitions:
        raise InvalidRecordError(f"topic {topic!r} has partitions 0 to {partitions - 1}, not {partition}")
    aborted: Sequence[AbortedRange] = ()
    if isolation == READ_COMMITTED:
        # Every transaction with data below the last stable offset read now has ended, its aborted ranges recorded
        # with its end: read after it, they are all there (`Snapshot.aborted_ranges`).
        last_stable = snapshot.log_offsets(topic)[partition].last_stable
        to_offset = last_stable if to_offset is None else min(to_offset, last_stable)
        if from_offset >= to_offset:
            return
        aborted = snapshot.aborted_ranges({(topic, partition): (from_offset, to_offset)}).get((topic, partition), ())
    yield from read_sections(store, snapshot.sections_from(topic, partition, from_offset, to_offset), from_offset, to_offset, aborted)


# How a section's rows from an offset delta are read: `format.read_section_from`'s signature.
SectionReader = Callable[[ObjectStore, str, SectionInfo, int, bool], Iterator[pa.RecordBatch]]


def read_sections(
    store: ObjectStore, sections: Iterable[SectionRef], from_offset: int = 0, to_offset: int | None = None, aborted: Sequence[AbortedRange] = (),
    read_section: SectionReader = read_section_from,
) -> Iterator[pa.Table]:
    """The records of given sections of one partition, (file key, section) pairs in first-offset order,
    with from_offset <= offset < to_offset and outside the `aborted` ranges (in offset order, not overlapping):
    what read_batches reads, for a caller that chose the files (a compaction's inputs) and the ranges. `read_section`
    reads each section (the agent's Fetch: through its cache of decoded blocks)."""
    yield from _read(store, sections, from_offset, to_offset, _RECORD_COLUMNS, aborted, read_section)


_RECORD_COLUMNS = ("timestamp", "key", "value", "headers")


# How the pieces of a run of sections are read: (piece number, records as a table) each, in offset order.
RunReader = Callable[[int, list[SectionRef]], Iterable[tuple[int, pa.Table]]]


def _read(
    store: ObjectStore, sections: Iterable[SectionRef], from_offset: int, to_offset: int | None, columns: tuple[str, ...],
    aborted: Sequence[AbortedRange] = (), read_section: SectionReader = read_section_from,
) -> Iterator[pa.Table]:
    index_only = set(columns) <= set(INDEX_COLUMNS)

    def read_run(_number: int, run: list[SectionRef]) -> Iterable[tuple[int, pa.Table]]:
        if len(run) == 1:
            key, section = run[0]
            batches = read_section(store, key, section.info, max(0, from_offset - section.first_offset), index_only)
            return enumerate(_records_table(batch, section.first_offset, columns) for batch in batches)
        return [(0, _merged_run(store, run, columns, index_only, read_section))]

    for _, _, table in _read_runs(enumerate(_overlapping_runs(sections)), from_offset, to_offset, aborted, read_run):
        if table.num_rows:
            yield table


def _merged_run(store: ObjectStore, run: list[SectionRef], columns: tuple[str, ...], index_only: bool, read_section: SectionReader) -> pa.Table:
    """The records of a run of overlapping sections, read whole and merged by offset."""
    whole = [
        _records_table(batch, section.first_offset, columns)
        for key, section in run
        for batch in read_section(store, key, section.info, 0, index_only)
    ]
    return _merged(run, whole)


def _read_runs(
    runs: Iterable[tuple[int, list[SectionRef]]], from_offset: int, to_offset: int | None, aborted: Sequence[AbortedRange],
    read_run: RunReader,
) -> Iterator[tuple[int, int, pa.Table]]:
    """(run number, piece number, records) of each piece `read_run` reads of the numbered runs of overlapping
    sections, in offset order, with from_offset <= offset < to_offset and outside the `aborted` ranges: every piece
    read, also one left with no record, so that two reads of the same pieces count the same positions."""
    firsts = np.array([first for first, _ in aborted], dtype=np.int64)
    lasts = np.array([last for _, last in aborted], dtype=np.int64)
    read_to = from_offset - 1  # the last offset read
    for number, run in runs:
        for key, section in run:
            _check_data_key(key, section)
        for piece, table in read_run(number, run):
            if table.num_rows:
                offsets = table.column("offset")
                if offsets[0].as_py() < from_offset or (to_offset is not None and offsets[-1].as_py() >= to_offset):
                    keep = pc.greater_equal(offsets, from_offset)
                    if to_offset is not None:
                        keep = pc.and_(keep, pc.less(offsets, to_offset))
                    table = table.filter(keep)
                if len(firsts) and table.num_rows:
                    table = _without_aborted(table, firsts, lasts)
            if table.num_rows:
                first = table.column("offset")[0].as_py()
                if first <= read_to:
                    raise _offset_again(run, first, read_to)
                read_to = table.column("offset")[-1].as_py()
            yield number, piece, table


def _without_aborted(table: pa.Table, firsts: np.ndarray, lasts: np.ndarray) -> pa.Table:
    """The table without the records in the aborted ranges [firsts[i], lasts[i]] (sorted, not overlapping): each
    record's range is the last one starting at or before it, which holds it when it ends at or after it."""
    offsets = table.column("offset").to_numpy()
    at = np.searchsorted(firsts, offsets, side="right") - 1
    dropped = (at >= 0) & (offsets <= lasts[np.maximum(at, 0)])
    return table.filter(pa.array(~dropped)) if dropped.any() else table


def _check_data_key(key: str, section: CatalogSection) -> None:
    """A live file's key is a data file's (keys.py), never a path out of `data/` (`..`, an absolute path): the
    catalog wrote none other, so a row is damaged, and nothing outside the store is read for it."""
    if not DATA_KEY_PATTERN.fullmatch(key):
        error = CorruptDataError(
            f"catalog row of file {key[:120]!r} (section {section.topic}/{section.partition}, offsets {section.first_offset} "
            f"to {section.last_offset}) names no data file (data/l<level>/<name>.seg): the row is damaged; restore the "
            "catalog database from a backup"
        )
        error.key = key
        raise error


def _offset_again(run: list[SectionRef], offset: int, read_to: int) -> CorruptDataError:
    """Sections read in first-offset order that give an offset at or below one read before: their catalog rows
    place sections over each other (a section starting below the read's first offset and spanning the offsets read
    so far holds none of them: `Snapshot.sections_from`)."""
    key, section = next(((k, s) for k, s in run if s.first_offset <= offset <= s.last_offset), run[0])
    error = CorruptDataError(
        f"catalog row of section {section.topic}/{section.partition} of {key} (offsets {section.first_offset} to "
        f"{section.last_offset}) places offset {offset} after offset {read_to} was read from another section: an offset is "
        "never in two live sections, so a row is damaged; restore the catalog database from a backup"
    )
    error.key = key
    return error


def _merged(run: list[SectionRef], tables: list[pa.Table]) -> pa.Table:
    """The records of sections whose offset ranges overlap, merged by offset. Offsets never repeat among a
    partition's live sections: one that does means a damaged catalog row placed a section over another."""
    merged = pa.concat_tables(tables).sort_by("offset")
    offsets = merged.column("offset").to_numpy()
    repeated = np.flatnonzero(offsets[1:] == offsets[:-1])
    if len(repeated):
        offset = int(offsets[repeated[0]])
        holding = [f"{key} (offsets {s.first_offset} to {s.last_offset})" for key, s in run if s.first_offset <= offset <= s.last_offset]
        key, section = run[0]
        error = CorruptDataError(
            f"catalog rows of section {section.topic}/{section.partition} place offset {offset} in {' and '.join(holding)}: "
            "an offset is never in two live sections, so a row is damaged; restore the catalog database from a backup"
        )
        error.key = key
        raise error
    return merged


def read_records(
    store: ObjectStore,
    snapshot: Snapshot,
    topic: str,
    partition: int,
    from_offset: int = 0,
    to_offset: int | None = None,
    isolation: int = READ_UNCOMMITTED,
) -> Iterator[ConsumedRecord]:
    """The same records one by one."""
    for table in read_batches(store, snapshot, topic, partition, from_offset, to_offset, isolation):
        columns = [table.column(name).to_pylist() for name in RECORD_SCHEMA.names]
        for offset, timestamp, key, value, headers in zip(*columns):
            pairs = [(h["key"], h["value"]) for h in headers] if headers else []
            yield ConsumedRecord(offset, timestamp, key, value, pairs)


def latest_values(store: ObjectStore, snapshot: Snapshot, topic: str, partition: int) -> pa.Table:
    """The materialized view of a partition: each key's latest committed record, unless that record is a tombstone.

    Columns offset, timestamp, key, value, headers, in offset order; keyless records are left out. Two reads, as
    the compactor does, so memory stays near the view's own size: the first reads the index columns only and puts
    each keyed record's key hash in the compactor's key map (`CompactOffsetMap`: open addressing, 20 bytes a key,
    linear time) with the record's position in the read, so the map ends holding each key's last position; the
    second reads the records again in the same order and takes those at the positions held, a table at a time. The
    second reads only the pieces holding a position held: a section none of whose records is its key's latest is
    not read again, nor is a block of a long section (read through its file's footer, which both reads parse once).
    Both read what a `read_committed` consumer reads: nothing from the last stable offset on, no aborted
    transaction's records, so an aborted or open transaction's value never stands for its key.
    """
    partitions = snapshot.topic(topic).partitions
    if not 0 <= partition < partitions:
        raise InvalidRecordError(f"topic {topic!r} has partitions 0 to {partitions - 1}, not {partition}")
    last_stable = snapshot.log_offsets(topic)[partition].last_stable
    sections = [pair for pair in snapshot.sections_of(topic, partition) if pair[1].first_offset < last_stable]
    aborted = snapshot.aborted_ranges({(topic, partition): (0, last_stable)}).get((topic, partition), ())
    runs = list(enumerate(_overlapping_runs(sections)))
    footers: dict[str, Footer] = {}
    positions, piece_rows = _last_positions(store, sections, runs, last_stable, aborted, footers)
    # Each run's pieces' first positions, and the pieces holding a position held: all pass 2 reads.
    piece_starts: dict[int, np.ndarray] = {}
    wanted: dict[int, np.ndarray] = {}
    start = 0
    for number, _ in runs:
        starts = start + np.concatenate(([0], np.cumsum(piece_rows.get(number, []), dtype=np.int64)))
        held = np.diff(np.searchsorted(positions, starts))
        if held.any():
            piece_starts[number] = starts
            wanted[number] = np.flatnonzero(held)
        start = int(starts[-1])
    kept = []
    read_run = _view_run_reader(store, _RECORD_COLUMNS, footers, wanted, {number: len(rows) for number, rows in piece_rows.items()})
    for number, piece, table in _read_runs(((n, run) for n, run in runs if n in wanted), 0, last_stable, aborted, read_run):
        start = int(piece_starts[number][piece])
        first, end = np.searchsorted(positions, (start, start + table.num_rows))
        rows = positions[first:end] - start
        values = table.column("value")
        if values.null_count:  # tombstones: left out before the take, so the view's records are copied once
            rows = rows[pc.is_valid(values).to_numpy(zero_copy_only=False)[rows]]
        if len(rows):
            kept.append(table.take(pa.array(rows)))
    if not kept:
        return RECORD_SCHEMA.empty_table()
    return pa.concat_tables(kept).cast(RECORD_SCHEMA)


# The view decodes its blocks into the system allocator's memory: freed a block later, in Arrow's default pool
# (mimalloc) they are purged and faulted in again, up to 8 ms for a block's 700 KB payload, half the view's time.
_VIEW_POOL = pa.system_memory_pool()


def _view_run_reader(
    store: ObjectStore, columns: tuple[str, ...], footers: dict[str, Footer], wanted: dict[int, np.ndarray] | None,
    pieces_read: dict[int, int] | None = None,
) -> RunReader:
    """How a view reads a run, a piece a block: pass 1 (`wanted` None, the index columns) a section by a forward
    stream from its first block, each block's payload skipped unread (a file seeks past it); pass 2 a long section
    through its file's footer (kept in `footers`), only the blocks `wanted` for its run, a short one by its one ranged
    GET; overlapping sections whole, merged, one piece. A long section's footer must count the blocks pass 1 read
    (`pieces_read` of its run), so that a piece of pass 2 is the block of pass 1."""
    index_only = set(columns) <= set(INDEX_COLUMNS)

    def read_run(number: int, run: list[SectionRef]) -> Iterable[tuple[int, pa.Table]]:
        if len(run) > 1:
            return [(0, _merged_run(store, run, columns, index_only, read_section_from))]
        key, section = run[0]
        return ((piece, _records_table(batch, section.first_offset, columns)) for piece, batch in read_section(key, section, number))

    def read_section(key: str, section: CatalogSection, number: int) -> Iterator[tuple[int, pa.RecordBatch]]:
        if wanted is None:
            stream = SectionStream(store, key, index_only=index_only, from_section=True, memory_pool=_VIEW_POOL)
            try:
                yield from enumerate(stream.rows(section.info))
            finally:
                stream.close()
        elif section.info.byte_length <= SEEK_BYTES:
            yield from enumerate(read_section_from(store, key, section.info, 0, index_only, memory_pool=_VIEW_POOL))
        else:
            footer = footers[key] = footers.get(key) or read_footer(store, key)
            blocks = len(footer.blocks_of(section.info))
            if pieces_read is not None and blocks != pieces_read.get(number, 0):
                error = CorruptDataError(
                    f"{key}: section {section.topic}/{section.partition}: its file's footer counts {blocks} blocks of it, its "
                    f"blocks read in order were {pieces_read.get(number, 0)}; the file is corrupt, restore it from a copy"
                )
                error.key = key
                raise error
            yield from read_section_blocks(store, key, section.info, footer, wanted[number].tolist(), index_only, _VIEW_POOL)

    return read_run


def _last_positions(
    store: ObjectStore, sections: list[SectionRef], runs: list[tuple[int, list[SectionRef]]], to_offset: int,
    aborted: Sequence[AbortedRange], footers: dict[str, Footer],
) -> tuple[np.ndarray, dict[int, list[int]]]:
    """Each key's last position among the records of the numbered `runs` of `sections` below `to_offset` and outside
    the `aborted` ranges as `_read_runs` gives them (keyless records count and are left out), sorted; and the records
    of each run's pieces. The key map has two slots a key the sections' key sketches estimate; should there be twice
    as many (a sketch errs by about 9%), the records are read again into a map four times larger."""
    # numba loads with the key map: here, for the view, not for every reader (the agent's Fetch)
    from logcompact.engine.offset_map import BYTES_PER_SLOT, MAX_OFFSET_DELTA, CompactOffsetMap

    records = sum(section.info.record_count for _, section in sections)
    if records > MAX_OFFSET_DELTA:
        raise InvalidRecordError(f"a view of {records:,} records is more than the key map's positions ({MAX_OFFSET_DELTA:,})")
    keys = max(1, round(estimate(merge_packed([section.info.key_sketch for _, section in sections]))))
    read_run = _view_run_reader(store, ("key_hash",), footers, None)
    while True:
        latest = CompactOffsetMap(BYTES_PER_SLOT * max(1024, 2 * keys))
        latest.clear()
        piece_rows = _put_positions(runs, to_offset, aborted, read_run, latest)
        if piece_rows is not None:
            return np.sort(latest.offsets()), piece_rows
        if keys >= records:  # a map of as many keys as records filled up: the sections hold more than their rows count
            key, section = sections[0]
            error = CorruptDataError(
                f"sections of {section.topic}/{section.partition} hold more keyed records than the {records:,} their catalog "
                "rows count; restore the catalog database from a backup"
            )
            error.key = key
            raise error
        keys = min(4 * keys, records)


def _put_positions(
    runs: list[tuple[int, list[SectionRef]]], to_offset: int, aborted: Sequence[AbortedRange], read_run: RunReader, latest: OffsetMap
) -> dict[int, list[int]] | None:
    """Put each keyed record's key hash with its position in the read into `latest`; the records of each run's
    pieces, or None when the map fills up."""
    start = 0
    piece_rows: dict[int, list[int]] = {}
    for number, _, table in _read_runs(runs, 0, to_offset, aborted, read_run):
        piece_rows.setdefault(number, []).append(table.num_rows)
        if not table.num_rows:
            continue
        hashes = table.column("key_hash")
        words = key_hash_words(hashes)
        positions = np.arange(start, start + table.num_rows, dtype=np.int64)
        if hashes.null_count:
            keyed = pc.is_valid(hashes).to_numpy(zero_copy_only=False)
            words, positions = words[keyed], positions[keyed]
        if latest.put(words, positions) < len(positions):
            return None
        start += table.num_rows
    return piece_rows
