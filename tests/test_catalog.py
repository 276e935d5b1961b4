"""The SQL catalog on both databases: appends and their offsets, compaction swaps and their conflicts, leases,
pinned snapshots and the kept history, the reads planners make, and the errors a user sees."""

from __future__ import annotations

import logging
import random
import re
import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest
from sqlalchemy import select, update

from logcompact.catalog import Catalog, CatalogSection, DataFile, NewFile, Snapshot, appends, schema, summaries
from logcompact.catalog import catalog as catalog_module
from logcompact.catalog import snapshot as snapshot_module
from logcompact.catalog.columns import pack_sections
from logcompact.exceptions import (
    CatalogConfigError,
    CatalogSchemaError,
    CatalogUnavailableError,
    ClusterNotFoundError,
    CommitConflictError,
    CorruptDataError,
    InvalidTopicError,
    ManifestVersionNotFoundError,
    TopicExistsError,
    TopicNotFoundError,
    TransactionRolledBackError,
)
from logcompact.format.layout import COMPRESSIONS, SectionInfo
from logcompact.plans import lowest_outside
from logcompact.store import LocalStore
from logcompact.store.s3 import S3Store
from logcompact.units import utc_iso
from tests.helpers import NOW, assert_summaries_kept, create_topic, section_column_rows

HOUR = 3_600_000


def _new_file(key: str, *sections: tuple[str, int, int], level: int = 0) -> NewFile:
    infos = tuple(
        SectionInfo(topic, partition, count, count - 1, 0, 0, 0, 0, "none", 0, 16 + 100 * n, 1)
        for n, (topic, partition, count) in enumerate(sections)
    )
    return NewFile(key, level, 100, NOW, infos)


def _append(catalog: Catalog, new_file: NewFile) -> list[int]:
    _, (assigned,), _ = catalog.append_files([new_file], NOW)
    return assigned


def _output(catalog: Catalog, key: str, *inputs: str) -> DataFile:
    """A compaction output holding the sections of `inputs` as they are now."""
    files = catalog.snapshot().get_files(list(inputs))
    sections = [section for name in inputs for section in files[name].sections]
    placed = tuple(CatalogSection(s.info._replace(byte_offset=16 + 100 * n), s.first_offset) for n, s in enumerate(sections))
    return DataFile(key, 1, 50, NOW, placed)


def test_appends_get_consecutive_offsets_per_partition(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2)
    assert _append(catalog, _new_file("f1", ("t", 0, 5), ("t", 1, 2))) == [0, 0]
    assert _append(catalog, _new_file("f2", ("t", 0, 3))) == [5]
    assert catalog.next_offsets("t") == [8, 2]
    snapshot = catalog.snapshot()
    assert [(key, s.first_offset, s.last_offset) for key, s in snapshot.sections_of("t", 0)] == [("f1", 0, 4), ("f2", 5, 7)]
    assert [(key, s.first_offset) for key, s in snapshot.sections_of("t", 0, from_offset=5)] == [("f2", 5)]


def test_appends_rewrite_partition_rows_in_place_on_postgresql(catalog: Catalog) -> None:
    """Appends of files holding every partition of 10 topics of 100, as agents write them, one after another: each
    rewrites all 1,000 partition rows, and on PostgreSQL each new row version goes beside the old one on its page
    (heap-only), the last append's pruned. The table and its key's index keep about the size they had after the first
    (packed full, the table grew 7-fold and the index by 3 pages)."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite rewrites a row in its place in the key's B-tree")
    for topic in range(10):
        create_topic(catalog, f"t{topic}", partitions=100)
    wide = [(f"t{topic}", partition, 1) for topic in range(10) for partition in range(100)]

    def sizes() -> tuple[int, int]:
        with catalog.engine.connect() as connection:
            table, index = connection.exec_driver_sql("SELECT pg_relation_size('partitions'), pg_relation_size('partitions_pkey')").one()
        return table, index

    assert _append(catalog, _new_file("f0", *wide)) == [0] * 1000
    table, index = sizes()
    for n in range(1, 20):
        assert _append(catalog, _new_file(f"f{n}", *wide)) == [n] * 1000
    grown_table, grown_index = sizes()
    assert grown_table <= 2 * table and grown_index <= index + 8192, (table, index, grown_table, grown_index)


def test_concurrent_appenders_never_share_an_offset_nor_leave_a_gap(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=3)
    writers, files_each = 6, 15
    assigned: dict[str, list[int]] = {}
    sections: dict[str, tuple] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(writers)

    def append(writer: int) -> None:
        rng = random.Random(writer)
        own = Catalog(catalog.store, catalog.url)  # each writer its own catalog, as agents have
        try:
            start.wait()
            for n in range(files_each):
                new = _new_file(f"w{writer}-{n}", *(("t", p, rng.randint(1, 4)) for p in rng.sample(range(3), rng.randint(1, 3))))
                sections[new.key] = new.sections
                assigned[new.key] = _append(own, new)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=append, args=(w,)) for w in range(writers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors
    ranges: dict[int, list[tuple[int, int]]] = {0: [], 1: [], 2: []}
    for key, infos in sections.items():
        for info, first in zip(infos, assigned[key], strict=True):
            ranges[info.partition].append((first, first + info.record_count))
    snapshot = catalog.snapshot()
    for partition, taken in ranges.items():
        taken.sort()
        assert [end for _, end in taken[:-1]] == [start for start, _ in taken[1:]] and taken[0][0] == 0  # no gap, no overlap
        assert catalog.next_offsets("t")[partition] == taken[-1][1]
        assert [(s.first_offset, s.last_offset + 1) for _, s in snapshot.sections_of("t", partition)] == taken
    assert len(snapshot.file_summaries()) == writers * files_each


def test_an_append_of_several_files_places_every_section_and_binds_its_row(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """A group commit of three files, partitions repeated across them, sections wide enough that
    offsets take every byte of their 64 bits' low five: each section gets its partition's next offsets in file, then
    section, order, and its row holds them with its CRC bound to them (on PostgreSQL computed by the statement that
    hands the offsets out), its sketch and codec, the file rows their counts under the version and their sections
    packed for planners (on PostgreSQL stored by the Catalog's next one-step append)."""
    create_topic(catalog, "a", partitions=3)
    create_topic(catalog, "b", partitions=2, **{"cleanup.policy": "compact"})
    wide = 3 << 33
    layout = [
        [("a", 2, 5), ("b", 0, wide), ("a", 0, 7)],
        [("b", 0, 2), ("a", 1, wide + 11)],
        [("a", 2, 4), ("b", 1, 1), ("b", 0, 3)],
    ]
    rng = random.Random(7)
    new_files = [
        NewFile(f"group-{n}", 0, 1000 + n, NOW + n, tuple(
            SectionInfo(topic, partition, min(count, 50), count - 1, 10, 20, 0, 99, "lz4", rng.getrandbits(32), 16 + 100 * k, 50,
                        clean_below_delta=0, key_sketch=bytes(rng.randrange(256) for _ in range(k % 3 * 4)), first_row=k)
            for k, (topic, partition, count) in enumerate(sections)
        ), produced_codecs=tuple(k % 5 for k in range(len(sections))) if n != 1 else ())
        for n, sections in enumerate(layout)
    ]
    _append(catalog, _new_file("before", ("a", 2, 3)))  # a Catalog's first append expires idle producers, the long way
    one_step, in_one_step = [], appends.append_in_one_step
    monkeypatch.setattr(appends, "append_in_one_step", lambda *args: one_step.append(args) or in_one_step(*args))
    version, assigned, refused = catalog.append_files(new_files, NOW + 1)
    assert not refused
    assert len(one_step) == (catalog.engine.dialect.name == "postgresql")
    expected: list[list[int]] = []
    next_offset: dict[tuple[str, int], int] = {("a", 2): 3}
    for sections in layout:
        expected.append([])
        for topic, partition, count in sections:
            expected[-1].append(next_offset.get((topic, partition), 0))
            next_offset[(topic, partition)] = expected[-1][-1] + count
    assert assigned == expected
    assert catalog.next_offsets("a") == [next_offset[("a", p)] for p in range(3)]
    assert catalog.next_offsets("b") == [next_offset[("b", p)] for p in range(2)]
    _append(catalog, _new_file("after", ("a", 0, 1)))  # stores the packs of a one-step append's files
    sec, files = schema.sections.c, schema.files.c
    with catalog.engine.connect() as connection:
        ids = {row.name: row.topic_id for row in connection.execute(select(schema.topics.c.name, schema.topics.c.topic_id))}
        for new, firsts in zip(new_files, assigned, strict=True):
            file_row = connection.execute(select(files).where(files.key == new.key)).one()
            assert (file_row.level, file_row.size, file_row.created_ms, file_row.added_version) == (0, new.size, new.created_ms, version)
            assert file_row.record_count == sum(info.record_count for info in new.sections)
            assert schema_content(file_row.content) == ("mixed" if {info.topic for info in new.sections} == {"a", "b"} else "other")
            placed = DataFile(new.key, 0, new.size, new.created_ms, tuple(map(CatalogSection, new.sections, firsts)))
            assert file_row.sections_packed == pack_sections([placed], ids)[0]
            rows = {
                (row.topic_id, row.partition, row.first_offset): row
                for row in connection.execute(select(schema.sections).where(sec.file_id == file_row.file_id))
            }
            assert len(rows) == len(new.sections)
            for k, (info, first) in enumerate(zip(new.sections, firsts, strict=True)):
                row = rows[(ids[info.topic], info.partition, first)]
                assert row.last_offset == first + info.last_delta and row.level == 0 and row.removed_version is None
                bound = schema.section_crc_binding(ids[info.topic], info.partition, info.byte_offset, info.byte_length, info.first_row,
                                                   first, first + info.last_delta, info.record_count)
                assert row.crc32 == info.crc32 ^ bound
                assert (row.record_count, row.first_row, row.byte_offset, row.compression) == (info.record_count, info.first_row, info.byte_offset, COMPRESSIONS.index("lz4"))
                assert (row.key_sketch or b"") == info.key_sketch
                assert row.produced_compression == (new.produced_codecs[k] if new.produced_codecs else schema.UNKNOWN_CODEC)
    snapshot = catalog.snapshot()
    assert [s.first_offset for _, s in snapshot.sections_of("b", 0)] == [0, wide, wide + 2]


def test_a_one_step_append_refused_by_the_database_is_run_the_long_way_which_names_the_row(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On PostgreSQL the one-step append cannot read the advance's rows before its COMMIT: a lowered partition row, or
    a lowered version row, makes its statement divide by zero, which rolls it back; the append then runs a statement
    at a time and refuses naming the row. Nothing of either is written."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite appends a statement at a time")
    create_topic(catalog, "t", partitions=3)
    for n in range(3):
        _append(catalog, _new_file(f"f{n}", ("t", 0, 2), ("t", 1, 2), ("t", 2, 2)))
    refused, in_one_step = [], appends.append_in_one_step

    def watched(*args):  # type: ignore[no-untyped-def]
        try:
            return in_one_step(*args)
        except appends.Unplaced:
            refused.append(args)
            raise

    monkeypatch.setattr(appends, "append_in_one_step", watched)
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.partitions).where(schema.partitions.c.partition == 1).values(next_offset=2))
    with pytest.raises(CorruptDataError, match=r"partitions \('t', partition 1\) has next_offset 2 but the last append assigned offsets up to 5"):
        _append(catalog, _new_file("lowered-partition", ("t", 0, 1), ("t", 1, 1)))
    assert len(refused) == 1
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.partitions).where(schema.partitions.c.partition == 1).values(next_offset=6))
        connection.execute(update(schema.catalog_info).values(version=schema.catalog_info.c.version - 1))
    with pytest.raises(CorruptDataError, match="catalog_info.version is .* but the commit log"):
        _append(catalog, _new_file("lowered-version", ("t", 0, 1), ("t", 2, 1)))
    assert len(refused) == 2
    assert catalog.next_offsets("t") == [6, 6, 6]
    assert catalog.known_files(["lowered-partition", "lowered-version"]) == set()


def test_a_one_step_appends_packs_are_stored_by_the_next_and_planners_read_its_rows_until_then(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """On PostgreSQL the database hands out a one-step append's offsets, so its files' packed sections are stored by
    the Catalog's next one-step append, in that append's round trip; an append refused keeps them for the one after.
    Until then planning passes read those files' sections rows, and say nothing is wrong."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite packs a file's sections in its append's transaction")
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("first", ("t", 0, 3)))  # a Catalog's first append expires idle producers, the long way
    one_step, in_one_step = [], appends.append_in_one_step
    monkeypatch.setattr(appends, "append_in_one_step", lambda *args: one_step.append(args) or in_one_step(*args))
    files = schema.files.c

    def packs() -> dict[str, bytes | None]:
        with catalog.engine.connect() as connection:
            return dict(connection.execute(select(files.key, files.sections_packed)).all())

    def planned() -> list[tuple]:
        return [row[:5] for row in section_column_rows(catalog.snapshot().section_columns())]

    assert _append(catalog, _new_file("second", ("t", 0, 2), ("t", 1, 4))) == [3, 0]
    assert packs()["first"] is not None and packs()["second"] is None
    assert planned() == [("first", "t", 0, 0, 2), ("second", "t", 0, 3, 4), ("second", "t", 1, 0, 3)]
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.partitions).where(schema.partitions.c.partition == 1).values(next_offset=2))
    with pytest.raises(CorruptDataError, match=r"partitions \('t', partition 1\) has next_offset 2"):
        _append(catalog, _new_file("refused", ("t", 1, 1)))
    assert packs()["second"] is None  # rolled back with the refused append
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.partitions).where(schema.partitions.c.partition == 1).values(next_offset=4))
    assert _append(catalog, _new_file("third", ("t", 0, 1))) == [5]
    assert len(one_step) == 3
    topic_ids = {"t": catalog.snapshot().topic_ids["t"]}
    second = catalog.snapshot().get_files(["second"])["second"]
    assert packs()["second"] == pack_sections([second], topic_ids)[0] and packs()["third"] is None
    assert planned() == [("first", "t", 0, 0, 2), ("second", "t", 0, 3, 4), ("second", "t", 1, 0, 3), ("third", "t", 0, 5, 5)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_packs_stored_by_an_append_wait_for_a_compaction_holding_the_version_row_without_deadlocking_it(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    """A compaction takes the version row, then updates its input files' rows; an append storing an earlier file's pack
    locks that row after its partitions and the version row, in the same order: while a compaction holds the version
    row and removes the file, the append waits, then stores the pack and commits. (Stored before the partitions, the
    pack's row lock and the compaction's version row made a deadlock, one of the two aborted and the append run again.)"""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite packs a file's sections in its append's transaction")
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("first", ("t", 0, 1)))  # a Catalog's first append expires idle producers, the long way
    _append(catalog, _new_file("packed-later", ("t", 0, 1), ("t", 1, 1)))
    files, info = schema.files.c, schema.catalog_info.c
    appended: list[list[int]] = []
    with catalog.engine.connect() as compaction:
        compaction.exec_driver_sql("SET lock_timeout = '10s'")
        compaction.execute(update(schema.catalog_info).values(version=info.version + 1))  # the version row, held
        appending = threading.Thread(target=lambda: appended.append(_append(catalog, _new_file("next", ("t", 1, 1)))))
        appending.start()
        appending.join(1.0)  # waiting for the version row, its partitions locked
        assert appending.is_alive()
        compaction.execute(update(schema.files).where(files.key == "packed-later").values(removed_ms=NOW))  # no wait
        compaction.rollback()
    appending.join(30)
    assert appended == [[1]]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # not even run again after a deadlock
    with catalog.engine.connect() as connection:
        assert connection.execute(select(files.sections_packed).where(files.key == "packed-later")).scalar_one() is not None


def test_an_append_waits_for_its_turn_before_its_partition_rows_holding_back_no_row_version(catalog: Catalog) -> None:
    """On PostgreSQL an append takes its turn (`appends.TURN`, a lock only appends and EndTxn's markers take) before
    it locks a partition row: one arriving while another append is open waits there, on a connection that appended
    before holding no snapshot (its backend_xmin is NULL, so the row versions the other writes can be pruned the moment
    it commits), then hands out the offsets after the other's."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's one write lock is the turn")
    part = schema.partitions.c
    appended: list[list[int]] = []
    # Taken first, so the appends below share one other pooled connection, as an agent's committer does.
    with catalog.engine.connect() as before, catalog.engine.connect() as watcher:
        create_topic(catalog, "t", partitions=2)
        _append(catalog, _new_file("first", ("t", 0, 1)))  # a Catalog's first append expires idle producers, the long way
        _append(catalog, _new_file("second", ("t", 0, 1)))  # in one step, as the next one
        topic_id = catalog.snapshot().topic_ids["t"]
        before.exec_driver_sql(appends.TURN)
        before.execute(update(schema.partitions).where(part.topic_id == topic_id, part.partition == 0).values(next_offset=part.next_offset + 5))
        appending = threading.Thread(target=lambda: appended.append(_append(catalog, _new_file("third", ("t", 0, 1), ("t", 1, 1)))))
        appending.start()
        waiting = (
            "SELECT backend_xmin IS NULL FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            f"AND wait_event = 'relation' AND query = '{appends.TURN}'"
        )
        for _ in range(300):
            watcher.rollback()
            if found := watcher.exec_driver_sql(waiting).all():
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the append never waited for its turn")
        assert found == [(True,)]
        assert appending.is_alive() and not appended
        before.commit()
    appending.join(30)
    assert appended == [[7, 0]]


def _deadlock_an_append(catalog: Catalog, new_file: NewFile, topic_partition: tuple[int, int]) -> list[list[int] | BaseException]:
    """Append `new_file` while another transaction holds the version row, then, once the append has locked its
    partitions and waits for that row, make the other wait for one of them (`topic_partition`): a cycle, which the
    append finds first (its deadlock_timeout, 1 s, runs out; the other's is 60 s) and PostgreSQL aborts it. Returns what
    the append returned or raised."""
    outcome: list[list[int] | BaseException] = []

    def append() -> None:
        try:
            outcome.append(_append(catalog, new_file))
        except BaseException as exc:  # handed to the test
            outcome.append(exc)

    info, part = schema.catalog_info.c, schema.partitions.c
    with catalog.engine.connect() as other, catalog.engine.connect() as watcher:
        other.exec_driver_sql("SET deadlock_timeout = '60s'")
        other.execute(update(schema.catalog_info).values(version=info.version + 1))
        appending = threading.Thread(target=append)
        appending.start()
        waiting = (
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock' "
            "AND starts_with(query, 'UPDATE catalog_info')"
        )
        for _ in range(300):
            watcher.rollback()
            if watcher.exec_driver_sql(waiting).scalar_one():
                break
            time.sleep(0.05)
        else:
            raise AssertionError("the append never waited for the version row")
        topic_id, partition = topic_partition
        other.execute(update(schema.partitions).where(part.topic_id == topic_id, part.partition == partition).values(next_offset=part.next_offset))
        other.rollback()
    appending.join(30)
    return outcome


def test_an_append_rolled_back_as_a_deadlock_victim_runs_again_and_hands_its_offsets_out_once(
    catalog: Catalog, caplog: pytest.LogCaptureFixture
) -> None:
    """PostgreSQL aborts one transaction of a deadlock, and its remedy is running it again: an append it aborted
    (nothing written) runs again once the cycle is gone, says so in a warning, and its offsets are handed out once."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's one writer holds the database: its writers never deadlock")
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("first", ("t", 0, 1)))  # a Catalog's first append expires idle producers, the long way
    topic_id = catalog.snapshot().topic_ids["t"]
    assert _deadlock_an_append(catalog, _new_file("second", ("t", 0, 2), ("t", 1, 3)), (topic_id, 1)) == [[1, 0]]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "append_files: catalog" in warning and "rolled a write transaction back for a concurrent one (deadlock detected)" in warning
    assert "running it again (run 2 of 3)" in warning
    assert _append(catalog, _new_file("third", ("t", 0, 1), ("t", 1, 1))) == [3, 3]


def test_a_write_rolled_back_every_run_says_so_and_writes_nothing(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Past its runs, a write the database rolled back is TransactionRolledBackError, which says
    what happened and that nothing was written, not a catalog that "cannot be reached"."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's one writer holds the database: its writers never deadlock")
    monkeypatch.setattr(catalog_module, "ROLLED_BACK_RUNS", 1)
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("first", ("t", 0, 1)))
    topic_id = catalog.snapshot().topic_ids["t"]
    [error] = _deadlock_an_append(catalog, _new_file("second", ("t", 0, 2), ("t", 1, 3)), (topic_id, 1))
    assert isinstance(error, TransactionRolledBackError) and isinstance(error, CatalogUnavailableError)  # answered as retriable
    assert re.fullmatch(
        r"catalog postgresql\+psycopg://\S+ rolled a write transaction back for a concurrent one \(deadlock detected\); "
        r"nothing was written; run it again", str(error),
    )
    assert "second" not in {f.key for f in catalog.snapshot().file_summaries()}
    assert _append(catalog, _new_file("third", ("t", 0, 1), ("t", 1, 1))) == [1, 0]


def test_packed_sections_are_compressed_with_lz4_where_postgresql_has_it(catalog: Catalog) -> None:
    """A file's packed sections (40 KB for 1,000 sections) are compressed by the database as they are stored: with LZ4
    on a PostgreSQL server that has it (this one: 15, built with it), not pglz, which took the database 1.5 ms of CPU
    a file."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite stores values as they are")
    catalog.ensure_created(NOW)
    with catalog.engine.connect() as connection:
        method = connection.exec_driver_sql(
            "SELECT attcompression FROM pg_attribute WHERE attrelid = 'files'::regclass AND attname = 'sections_packed'"
        ).scalar_one()
    assert method == "l"


def schema_content(number: int) -> str:
    from logcompact.catalog.model import CONTENTS

    return CONTENTS[number]


def test_a_compaction_reads_its_inputs_sections_before_the_version_row_and_again_when_a_commit_retired_one_since(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction's commit reads its inputs' sections before it locks a row (under the version row they held every
    append back for most of the commit); a DeleteRecords committed between that read and the version row retired one,
    so they are read again: the commit records as holes only the offsets its inputs still held. (Read once, the
    deleted section's offsets became a hole of the compaction's as well.)"""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's writer holds the database from its first statement: no commit falls between")
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("f1", ("t", 0, 5), ("t", 1, 5)))
    planned = catalog.latest_version()
    [section_0] = [s for s in catalog.snapshot().get_files(["f1"])["f1"].sections if s.partition == 0]
    output = DataFile("l1", 1, 50, NOW, (CatalogSection(section_0.info._replace(byte_offset=16), section_0.first_offset),))
    lock_expiring = catalog_module.compactions.lock_expiring_partitions
    reads = []

    def deleting_records_first(connection, removed):  # right after the commit's read of its inputs' sections
        catalog.delete_records("t", {1: 5}, NOW)
        return lock_expiring(connection, removed)

    monkeypatch.setattr(catalog_module.compactions, "lock_expiring_partitions", deleting_records_first)
    input_spans = catalog_module.holes.input_spans
    monkeypatch.setattr(catalog_module.holes, "input_spans", lambda *args: reads.append(args) or input_spans(*args))
    assert catalog.replace_files(["f1"], [output], NOW, plan_id="p-1", expected_version=planned).committed
    assert len(reads) == 2
    topic_id = catalog.snapshot().topic_ids["t"]
    holes, part = schema.offset_holes.c, schema.partitions.c
    with catalog.engine.connect() as connection:
        assert connection.execute(select(holes.first_offset).where(holes.topic_id == topic_id, holes.partition == 1)).all() == []
        assert connection.execute(select(part.log_start_offset).where(part.topic_id == topic_id, part.partition == 1)).scalar_one() == 5
    assert [f.key for f in catalog.snapshot().file_summaries()] == ["l1"]


def test_a_compaction_sums_its_partitions_rows_before_the_version_row_and_again_when_a_commit_set_one_since(
    catalog: Catalog, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A compaction adds its outputs' sections to its partitions' summary rows read before it takes the version row
    (every append waits for that row); another compaction of the same partitions committed in between, so the rows
    are read again under the row: each holds both outputs. (Written as first read, a row lost the other's section.)"""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's writer holds the database from its first statement: no commit falls between")
    create_topic(catalog, "t", partitions=2)
    for key in ("f1", "f2"):
        _append(catalog, _new_file(key, ("t", 0, 5), ("t", 1, 5)))
    planned = catalog.latest_version()
    first, second = _output(catalog, "l1-a", "f1"), _output(catalog, "l1-b", "f2")
    lock_expiring = catalog_module.compactions.lock_expiring_partitions
    sums = []

    def committing_the_other_first(connection, removed):  # right after the commit's sums, before the version row
        if removed == ["f1"]:
            assert catalog.replace_files(["f2"], [second], NOW, plan_id="p-2").committed
        return lock_expiring(connection, removed)

    monkeypatch.setattr(catalog_module.compactions, "lock_expiring_partitions", committing_the_other_first)
    added_up = summaries.added_up
    monkeypatch.setattr(catalog_module.summaries, "added_up", lambda *args: sums.append(args[3]) or added_up(*args))
    assert catalog.replace_files(["f1"], [first], NOW, plan_id="p-1").committed
    assert_summaries_kept(catalog)
    topic_id = catalog.snapshot().topic_ids["t"]
    with catalog.engine.connect() as connection:
        assert {slot: row.sections for slot, row in summaries.read(connection, [(topic_id, 0), (topic_id, 1)]).items()} == {
            (topic_id, 0): 2, (topic_id, 1): 2,
        }
    assert sums == [planned, planned, planned + 2]  # p-1's, p-2's, then p-1's again under the row, at its version


def test_a_compaction_swaps_its_inputs_and_a_conflict_says_what_it_expected_and_found(catalog: Catalog) -> None:
    create_topic(catalog, "t")
    _append(catalog, _new_file("f1", ("t", 0, 5)))
    planned = catalog.latest_version()
    output = _output(catalog, "l1", "f1")
    done = catalog.replace_files(["f1"], [output], NOW, plan_id="p-1", expected_version=planned)
    assert done.committed and [f.key for f in catalog.snapshot().file_summaries()] == ["l1"]
    version = catalog.latest_version()
    with pytest.raises(
        CommitConflictError,
        match=rf"expected 1 input files as in manifest version {planned}, found 1 of them gone in version {version} "
        r"\(first: f1\); re-plan and retry",
    ):
        catalog.replace_files(["f1"], [replace(output, key="l1-again")], NOW, plan_id="p-2", expected_version=planned)
    assert catalog.latest_version() == version and [f.key for f in catalog.snapshot().file_summaries()] == ["l1"]
    _append(catalog, _new_file("f2", ("t", 0, 1)))
    with pytest.raises(CommitConflictError, match="an output file is already in the catalog"):
        catalog.replace_files(["f2"], [output], NOW, plan_id="p-3")
    assert [f.key for f in catalog.snapshot().file_summaries()] == ["f2", "l1"]


def test_committing_a_plan_again_is_a_no_op(catalog: Catalog) -> None:
    create_topic(catalog, "t")
    _append(catalog, _new_file("f1", ("t", 0, 5)))
    output = _output(catalog, "l1", "f1")
    first = catalog.replace_files(["f1"], [output], NOW, plan_id="p-1")
    again = catalog.replace_files(["f1"], [output], NOW, plan_id="p-1")
    assert (first.committed, again.committed, again.version) == (True, False, first.version)
    assert catalog.latest_version() == first.version and catalog.is_committed("p-1") and not catalog.is_committed("p-2")


def test_appends_never_conflict_with_a_compaction_of_other_files(catalog: Catalog) -> None:
    create_topic(catalog, "t")
    _append(catalog, _new_file("f1", ("t", 0, 5)))
    planned = catalog.latest_version()
    output = _output(catalog, "l1", "f1")
    _append(Catalog(catalog.store, catalog.url), _new_file("f2", ("t", 0, 5)))  # lands between planning and committing
    assert catalog.replace_files(["f1"], [output], NOW, plan_id="p-1", expected_version=planned).committed
    snapshot = catalog.snapshot()
    assert sorted(f.key for f in snapshot.file_summaries()) == ["f2", "l1"]
    assert [(key, s.first_offset) for key, s in snapshot.sections_of("t", 0)] == [("l1", 0), ("f2", 5)]


def test_leases_are_all_or_none_and_a_leased_commit_needs_its_lease(catalog: Catalog) -> None:
    create_topic(catalog, "t")
    for name in ("a", "b", "c"):
        _append(catalog, _new_file(name, ("t", 0, 1)))
    catalog.lease("p-1", ["a", "b"], NOW + HOUR, NOW)
    with pytest.raises(CommitConflictError, match=rf"plan p-2: file b is leased to plan p-1 until {utc_iso(NOW + HOUR)}; re-plan after it commits or expires"):
        catalog.lease("p-2", ["c", "b"], NOW + HOUR, NOW)
    assert {key: lease.plan_id for key, lease in catalog.snapshot().leases(NOW).items()} == {"a": "p-1", "b": "p-1"}  # not c
    with pytest.raises(CommitConflictError, match="plan p-2: file gone is no longer live; re-plan"):
        catalog.lease("p-2", ["c", "gone"], NOW + HOUR, NOW)
    catalog.lease("p-2", ["c"], NOW + HOUR, NOW)
    assert catalog.leased_plans(NOW) == {"p-1", "p-2"}
    # A leased commit needs every input still leased to it: c is p-2's.
    with pytest.raises(CommitConflictError, match=r"plan p-1: its lease on c \(and 0 more\) expired or was released before the commit"):
        catalog.replace_files(["a", "c"], [_output(catalog, "l1", "a")], NOW, plan_id="p-1", leased=True)
    catalog.release("p-2")
    assert catalog.snapshot().leased_files(NOW) == {"a", "b"}
    assert catalog.release_expired_leases(NOW + HOUR) == ["p-1"] and catalog.snapshot().leases(NOW) == {}
    catalog.lease("p-3", ["a"], NOW + HOUR, NOW)
    assert catalog.replace_files(["a"], [_output(catalog, "l1", "a")], NOW, plan_id="p-3", leased=True).committed
    assert catalog.leased_plans(NOW) == set()  # the commit took its leases with it


def test_lists_longer_than_an_in_list_are_one_parameter(catalog: Catalog) -> None:
    # Past database.SHORT_LIST values, a list is bound as one array (PostgreSQL) or JSON text (SQLite).
    create_topic(catalog, "t", partitions=700)
    keys = [f"f{n:04d}" for n in range(700)]
    catalog.append_files([_new_file(key, ("t", n, 1)) for n, key in enumerate(keys)], NOW)
    wide = _new_file("wide", *[("t", p, 2) for p in range(700)])  # 700 partitions in one append
    assert _append(catalog, wide) == [1] * 700
    snapshot = catalog.snapshot()
    assert sorted(snapshot.get_files(keys + ["gone"])) == keys
    assert catalog.known_files(keys + ["gone"]) == set(keys)
    catalog.lease("p-1", keys, NOW + HOUR, NOW)
    with pytest.raises(CommitConflictError, match="is leased to plan p-1"):
        catalog.lease("p-2", keys[-1:], NOW + HOUR, NOW)
    output = DataFile("l1", 1, 50, NOW, tuple(
        CatalogSection(f.sections[0].info._replace(byte_offset=16 + n), f.sections[0].first_offset)
        for n, f in enumerate(snapshot.get_files(keys).values())
    ))
    assert catalog.replace_files(keys, [output], NOW, plan_id="p-1", leased=True).committed
    assert [f.key for f in catalog.snapshot().file_summaries()] == ["wide", "l1"]
    assert catalog.snapshot().outside_floors(["l1"], [("t", p) for p in range(700)]) == {("t", p): 1 for p in range(700)}


def test_a_pinned_snapshot_sees_its_version_after_later_commits(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("f1", ("t", 0, 5), ("t", 1, 1)))
    pinned = catalog.snapshot()
    before = (pinned.file_summaries(), pinned.files(), pinned.sections_of("t", 0), pinned.level_counts())
    catalog.replace_files(["f1"], [_output(catalog, "l1", "f1")], NOW, plan_id="p-1")
    _append(catalog, _new_file("f2", ("t", 0, 3)))
    assert (pinned.file_summaries(), pinned.files(), pinned.sections_of("t", 0), pinned.level_counts()) == before
    assert [f.key for f in catalog.snapshot(pinned.version).files()] == ["f1"]
    assert [f.key for f in catalog.snapshot().file_summaries()] == ["f2", "l1"]


def test_a_version_older_than_the_kept_history_is_a_clear_error(catalog: Catalog) -> None:
    catalog = Catalog(catalog.store, catalog.url, keep_versions=3)
    create_topic(catalog, "t")
    for n in range(6):
        _append(catalog, _new_file(f"f{n}", ("t", 0, 1)))
    latest, oldest = catalog.latest_version(), catalog.oldest_kept_version()
    assert oldest == latest - 2 and catalog.trim_versions(oldest) == oldest - 1
    assert len(catalog.snapshot(oldest).file_summaries()) == 4  # an older kept version still reads whole
    assert [r.version for r in catalog.commit_log()] == [latest, latest - 1, oldest]
    with pytest.raises(ManifestVersionNotFoundError, match=rf"manifest version 2 is not in .* \(kept versions are {oldest} to {latest}\)"):
        catalog.snapshot(2)
    with pytest.raises(ManifestVersionNotFoundError, match=rf"manifest version {latest + 1} is not in"):
        catalog.snapshot(latest + 1)


def test_topic_rules(catalog: Catalog) -> None:
    create_topic(catalog, "t")
    with pytest.raises(TopicExistsError, match="topic 't' already exists"):
        create_topic(catalog, "t")
    with pytest.raises(TopicNotFoundError, match="topic 'nope' does not exist"):
        _append(catalog, _new_file("f", ("nope", 0, 1)))
    with pytest.raises(TopicNotFoundError, match="topic 'nope' does not exist in manifest version"):
        catalog.snapshot().topic("nope")


def test_file_reads_ask_for_what_they_need(catalog: Catalog) -> None:
    create_topic(catalog, "state", partitions=2, cleanup_policy="compact")
    create_topic(catalog, "events", partitions=2)
    _append(catalog, _new_file("mixed", ("state", 0, 3), ("events", 1, 2)))
    _append(catalog, _new_file("events-only", ("events", 0, 4)))
    catalog.replace_files(["mixed"], [_output(catalog, "data/l1/state", "mixed")], NOW, plan_id="p-1")
    snapshot = catalog.snapshot()
    summaries = {f.key: (f.level, f.record_count, f.content) for f in snapshot.file_summaries()}
    assert summaries == {"events-only": (0, 4, "other"), "data/l1/state": (1, 5, "mixed")}
    assert [f.key for f in snapshot.files(level=1)] == ["data/l1/state"]
    assert [f.key for f in snapshot.files(topics=["events"])] == ["events-only", "data/l1/state"]
    assert set(snapshot.get_files(["events-only", "mixed", "unknown"])) == {"events-only"}  # live ones only
    assert snapshot.level_counts() == {0: 1, 1: 1}
    facts = {(p.key, p.topic, p.partition, p.first_offset, p.last_delta) for p in snapshot.partition_sections(["state"], in_l0=False)}
    assert snapshot.partition_sections(["state"], in_l0=True) == []
    assert facts == {("data/l1/state", "state", 0, 0, 2)}


def test_outside_floors_and_lowest_offsets(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=3)
    _append(catalog, _new_file("a", ("t", 0, 5), ("t", 1, 5)))  # t/0 0-4, t/1 0-4
    _append(catalog, _new_file("b", ("t", 0, 5), ("t", 2, 5)))  # t/0 5-9, t/2 0-4
    _append(catalog, _new_file("c", ("t", 0, 5), ("t", 1, 5)))  # t/0 10-14, t/1 5-9
    snapshot = catalog.snapshot()
    partitions = [("t", 0), ("t", 1), ("t", 2)]
    assert snapshot.outside_floors(["a", "c"], partitions) == {("t", 0): 5, ("t", 2): 0}
    assert snapshot.outside_floors(["b"], partitions[:2]) == {("t", 0): 0, ("t", 1): 0}
    assert snapshot.outside_floors(["a", "b", "c"], partitions) == {}
    create_topic(catalog, "u", partitions=3)
    _append(catalog, _new_file("d", ("u", 0, 2), ("u", 1, 2)))
    snapshot = catalog.snapshot()  # only the pairs asked for, not every topic with every partition number
    assert snapshot.outside_floors(["a"], [("t", 1), ("u", 0)]) == {("t", 1): 5, ("u", 0): 0}
    assert snapshot.lowest_offsets(["b", "c", "gone"]) == {("t", 0): 5, ("t", 1): 5, ("t", 2): 0}
    # More keys than either database takes parameters in one statement: a key list is one parameter.
    many = [f"data/l0/absent-{n:06d}.seg" for n in range(70_000)]
    assert snapshot.outside_floors(["a", "c", *many], partitions) == {("t", 0): 5, ("t", 2): 0}
    assert snapshot.lowest_offsets([*many, "b"]) == {("t", 0): 5, ("t", 2): 0}
    assert set(snapshot.get_files([*many, "a"])) == {"a"}


def test_a_database_of_another_schema_version_is_refused(catalog: Catalog) -> None:
    create_topic(catalog, "t")
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.catalog_info).values(schema_version=schema.SCHEMA_VERSION + 1))
    with pytest.raises(CatalogSchemaError) as raised:
        Catalog(catalog.store, catalog.url).snapshot()
    message = str(raised.value)
    assert f"has schema version {schema.SCHEMA_VERSION + 1}, this logcompact uses {schema.SCHEMA_VERSION}" in message
    assert "\n" not in message


def test_an_s3_store_needs_a_catalog_url() -> None:
    with pytest.raises(CatalogConfigError) as raised:
        Catalog(S3Store("bucket", "cluster", client=object()))
    message = str(raised.value)
    assert message.startswith("store s3://bucket/cluster needs a catalog database: pass --catalog postgresql+psycopg://")
    assert "\n" not in message


def test_a_missing_cluster_is_not_found_and_creates_nothing(tmp_path: Path, catalog: Catalog) -> None:
    local = Catalog(LocalStore(tmp_path / "empty"))
    for read in (local.snapshot, local.latest_version, lambda: local.next_offsets("t")):
        with pytest.raises(ClusterNotFoundError, match=r"no logcompact cluster in file://.*/empty .*create it with `logcompact cluster create`"):
            read()
    assert not (tmp_path / "empty").exists()  # no database file (nor directory) was made
    with pytest.raises(ClusterNotFoundError, match="no logcompact cluster in"):
        catalog.snapshot()  # the fixture's database, on each backend, before anything was created


# -- deleting, growing and altering topics ---------------------------------------------------------------------


def _rows(catalog: Catalog, table) -> list[tuple]:
    with catalog.engine.connect() as connection:
        return sorted(tuple(row) for row in connection.execute(table.select()))


def test_deleting_a_topic_retires_its_sections_files_and_state_in_one_version(catalog: Catalog) -> None:
    create_topic(catalog, "gone", partitions=2, cleanup_policy="compact")
    create_topic(catalog, "kept")
    _append(catalog, _new_file("own", ("gone", 0, 3), ("gone", 1, 2)))
    _append(catalog, _new_file("mixed", ("gone", 0, 2), ("kept", 0, 4)))
    old_id = catalog.snapshot().topic_ids["gone"]
    with catalog.engine.begin() as connection:  # as an idempotent producer and a consumer group leave them
        for topic_id in (old_id, catalog.snapshot().topic_ids["kept"]):
            connection.execute(schema.producer_batches.insert().values(producer_id=7, topic_id=topic_id, partition=0, epoch=0, batches="[]", updated_ms=NOW))
        for topic in ("gone", "kept"):
            connection.execute(schema.group_offsets.insert().values(group_id="g", topic=topic, partition=0, committed_offset=1, leader_epoch=-1, metadata="", commit_ms=NOW))
    before = catalog.snapshot()

    version = catalog.delete_topic("gone", NOW)

    assert catalog.latest_version() == version == before.version + 1
    after = catalog.snapshot()
    assert set(after.topics) == {"kept"}
    assert [(f.key, [(s.topic, s.partition) for s in f.sections]) for f in after.files()] == [("mixed", [("kept", 0)])]
    assert catalog.collectable_files(version + 1, NOW + 1) == ["own"]  # gc takes the file left with no live section
    assert [row[1] for row in _rows(catalog, schema.producer_batches)] == [after.topic_ids["kept"]]
    assert [row[1] for row in _rows(catalog, schema.group_offsets)] == ["kept"]
    # A snapshot pinned before the deletion still reads the topic whole.
    assert [key for key, _ in before.sections_of("gone", 0)] == ["own", "mixed"]
    assert set(catalog.snapshot(before.version).topics) == {"gone", "kept"}
    with pytest.raises(TopicNotFoundError, match="topic 'gone' does not exist"):
        catalog.delete_topic("gone", NOW)
    with pytest.raises(TopicNotFoundError, match="topic 'gone' does not exist"):
        _append(catalog, _new_file("late", ("gone", 0, 1)))

    create_topic(catalog, "gone", partitions=1)  # the name is free: a new topic, empty, with a new id and policy
    again = catalog.snapshot()
    assert again.topic_ids["gone"] != old_id and catalog.next_offsets("gone") == [0]
    assert not again.topic("gone").config.compacted and again.sections_of("gone", 0) == []
    assert _append(catalog, _new_file("new", ("gone", 0, 2))) == [0]


def test_a_compaction_planned_before_a_topic_was_deleted_is_a_conflict(catalog: Catalog) -> None:
    create_topic(catalog, "gone")
    create_topic(catalog, "kept")
    _append(catalog, _new_file("mixed", ("gone", 0, 2), ("kept", 0, 4)))
    planned = catalog.latest_version()
    output = _output(catalog, "l1", "mixed")  # holds gone's records too
    catalog.delete_topic("gone", NOW)
    create_topic(catalog, "gone")  # the outputs' sections would land in this new topic
    version = catalog.latest_version()

    with pytest.raises(CommitConflictError, match=rf"topic 'gone' was deleted in version {version - 1}, after the plan read its files; plan again"):
        catalog.replace_files(["mixed"], [output], NOW, plan_id="p-1", expected_version=planned)

    assert catalog.latest_version() == version and catalog.snapshot().sections_of("gone", 0) == []
    # Planned again, the file holds only kept's live section: that plan commits.
    assert catalog.replace_files(["mixed"], [_output(catalog, "l1", "mixed")], NOW, plan_id="p-2", expected_version=version).committed
    assert [(f.key, [s.topic for s in f.sections]) for f in catalog.snapshot().files()] == [("l1", ["kept"])]


def _placed(first: int, records: int, last_delta: int, n: int = 0) -> CatalogSection:
    """A section of t/0 from offset `first`, its records spread over `last_delta` + 1 offsets."""
    return CatalogSection(SectionInfo("t", 0, records, last_delta, 0, 0, 0, 0, "none", 0, 16 + 100 * n, 1), first)


def _holes(catalog: Catalog) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """t/0's rows of `offset_holes`, (first, last): the live ones and the retired ones."""
    rows = schema.offset_holes.c
    with catalog.engine.connect() as connection:
        found = connection.execute(select(rows.first_offset, rows.last_offset, rows.removed_version).order_by(rows.first_offset, rows.added_version)).all()
    return [(first, last) for first, last, removed in found if removed is None], [(first, last) for first, last, removed in found if removed is not None]


def test_compactions_record_the_offsets_they_dropped_and_retire_the_holes_their_outputs_span(catalog: Catalog) -> None:
    """`offset_holes`: a commit records the offsets its inputs' sections spanned and its outputs' do not,
    coalesced with the rows beside them; an output spanning a hole retires its row, which a snapshot older than that
    commit still reads its sections by; gc's trim of the commit log deletes the retired rows, a topic's deletion
    every row of the topic."""
    create_topic(catalog, "t")
    for key in "abcd":
        _append(catalog, _new_file(key, ("t", 0, 5)))  # offsets 0-4, 5-9, 10-14, 15-19
    catalog.replace_files(["a", "b"], [DataFile("l1", 1, 50, NOW, (_placed(2, 3, 2),))], NOW)  # 2-4 kept
    assert _holes(catalog) == ([(0, 1), (5, 9)], [])
    catalog.replace_files(["l1", "c"], [DataFile("l2a", 2, 50, NOW, (_placed(3, 1, 0),)), DataFile("l2b", 2, 50, NOW, (_placed(12, 3, 2),))], NOW)
    assert _holes(catalog) == ([(0, 2), (4, 11)], [(0, 1), (5, 9)])
    assert_summaries_kept(catalog)
    older = catalog.snapshot()
    assert [(k, s.first_offset, s.last_offset) for k, s in older.sections_of("t", 0)] == [("l2a", 3, 3), ("l2b", 12, 14), ("d", 15, 19)]
    catalog.replace_files(["l2a", "l2b"], [DataFile("l3", 3, 50, NOW, (_placed(3, 4, 11),))], NOW)  # spans 4-11: drops nothing
    assert _holes(catalog) == ([(0, 2)], [(0, 1), (4, 11), (5, 9)])
    assert_summaries_kept(catalog)
    assert [(k, s.first_offset) for k, s in catalog.snapshot().sections_of("t", 0)] == [("l3", 3), ("d", 15)]
    assert [(k, s.first_offset) for k, s in older.sections_of("t", 0)] == [("l2a", 3), ("l2b", 12), ("d", 15)]
    catalog.trim_versions(catalog.latest_version() + 1)
    assert _holes(catalog) == ([(0, 2)], [])
    catalog.delete_topic("t", NOW)
    assert _holes(catalog) == ([], [])


def test_every_commit_keeps_the_summaries_above_l0_and_an_older_snapshot_reads_the_sections(catalog: Catalog) -> None:
    """`partition_summaries` follows appends above L0, compactions that remove the floor or not, sections kept by a
    set-aside partition and a deleted topic; a snapshot older than a floor's change leaves it out, and a plan's
    outside floors (`lowest_outside`) are the sections' at every step."""
    create_topic(catalog, "t", partitions=3)
    _append(catalog, _new_file("a", ("t", 0, 5), ("t", 1, 5)))  # L0: no floor
    assert catalog.snapshot().floors_above_l0([("t", 0), ("t", 1), ("t", 2)]) == {("t", 0): None, ("t", 1): None, ("t", 2): None}
    _append(catalog, _new_file("b", ("t", 0, 5), ("t", 2, 5), level=1))  # t/0 5-9, t/2 0-4, above L0 at once
    assert_summaries_kept(catalog)
    older = catalog.snapshot()
    assert older.floors_above_l0([("t", 0), ("t", 2)]) == {("t", 0): 5, ("t", 2): 0}
    catalog.replace_files(["a"], [_output(catalog, "l1-a", "a")], NOW)  # lowers t/0 to 0, sets t/1
    assert_summaries_kept(catalog)
    assert older.floors_above_l0([("t", 0), ("t", 1), ("t", 2)]) == {("t", 2): 0}  # t/0 and t/1 changed since
    assert catalog.snapshot().floors_above_l0([("t", 0), ("t", 1)]) == {("t", 0): 0, ("t", 1): 0}
    _append(catalog, _new_file("c", ("t", 0, 5), ("t", 1, 5)))
    catalog.replace_files(["l1-a"], [_output(catalog, "l2-a", "l1-a")], NOW)  # removes and rewrites the floor's holder
    assert_summaries_kept(catalog)
    catalog.replace_files(["b"], [], NOW, kept=[("t", 2)])  # t/0's section in b goes, t/2's stays
    assert_summaries_kept(catalog)
    assert catalog.snapshot().floors_above_l0([("t", 0), ("t", 2)]) == {("t", 0): 0, ("t", 2): 0}
    snapshot = catalog.snapshot()
    for planned in (["c"], ["l2-a"], ["l2-a", "c"], ["b"]):
        inputs = list(snapshot.get_files(planned).values())
        partitions = {(s.topic, s.partition) for f in inputs for s in f.sections}
        assert lowest_outside(snapshot, inputs, partitions) == snapshot.outside_floors(planned, partitions), planned
    catalog.delete_topic("t", NOW)
    assert_summaries_kept(catalog)


def test_partitions_read_through_the_live_files_as_through_the_partition_index(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every read of partitions' sections above L0 that may go through the live files (`summaries.read_through_files`)
    finds what the partition index finds: at the newest version and at one whose files were removed since, with
    files at several levels, removed ones, and a set-aside partition's section kept alone."""
    create_topic(catalog, "t", partitions=3, min_compaction_lag_ms=str(HOUR))
    create_topic(catalog, "u", partitions=2, min_compaction_lag_ms=str(HOUR))
    _append(catalog, _new_file("a", ("t", 0, 5), ("t", 1, 5), ("u", 0, 3)))
    _append(catalog, _new_file("b", ("t", 0, 5), ("t", 2, 5), ("u", 1, 4), level=1))
    young = _new_file("c", ("t", 1, 5), ("u", 0, 2), level=2)
    _append(catalog, replace(young, sections=tuple(s._replace(max_timestamp=NOW) for s in young.sections)))
    catalog.replace_files(["a"], [_output(catalog, "l1-a", "a")], NOW)
    older = catalog.snapshot()
    catalog.replace_files(["b"], [], NOW, kept=[("t", 2)])  # b's other sections go, t/2's stays alone
    catalog.replace_files(["l1-a"], [_output(catalog, "l2-a", "l1-a")], NOW)
    newer = catalog.snapshot()
    every = [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1)]

    def reads(snapshot: Snapshot) -> list:
        return [
            snapshot.sections_at_levels(every, 1), snapshot.sections_at_levels(every, 2), snapshot.files_holding(every),
            snapshot.files_holding([("t", 1)]), snapshot.outside_floors(["c"], every), snapshot.first_uncleanable_offsets(every, NOW + HOUR // 2),
            sorted(snapshot.partition_sections(["t", "u"], in_l0=False), key=repr), sorted(snapshot.section_figures(["t", "u"], in_l0=False), key=repr),
        ]

    held_back = catalog.snapshot(set_aside=frozenset({("u", 0)}))  # planners leave a set-aside partition out
    monkeypatch.setattr(summaries, "THROUGH_FILES_SHARE", float("inf"))  # never through the files
    by_index = [reads(older), reads(newer), reads(held_back)]
    monkeypatch.setattr(summaries, "THROUGH_FILES_SHARE", 0.0)  # always
    assert [reads(older), reads(newer), reads(held_back)] == by_index
    assert ("u", 0) in by_index[1][4] and ("u", 0) not in {(s.topic, s.partition) for s in by_index[2][0]}
    assert by_index[0][2] == {"b", "c", "l1-a"} and by_index[1][2] == {"b", "c", "l2-a"}
    assert by_index[1][5] == {("t", 1): 5, ("u", 0): 3}  # c's young sections


def test_get_files_of_most_live_files_reads_them_all_and_keeps_those_asked_for(catalog: Catalog, monkeypatch: pytest.MonkeyPatch) -> None:
    """Asked for most live files, `get_files` reads every live file and drops the rest: the same files as matching
    the keys, a live file not asked for, removed and unknown keys left out, at the newest version and at an older one."""
    create_topic(catalog, "t", partitions=2)
    for name in ("a", "b", "c", "d"):
        _append(catalog, _new_file(name, ("t", 0, 2), ("t", 1, 3)))
    older = catalog.snapshot()
    catalog.replace_files(["a"], [_output(catalog, "l1-a", "a")], NOW)
    newer = catalog.snapshot()
    asked = ["a", "b", "c", "l1-a", "unknown"]  # four of the five live files at each version, d not among them
    matched = [older.get_files(asked), newer.get_files(asked)]
    monkeypatch.setattr(snapshot_module, "SHORT_LIST", 0)  # every list is long enough to weigh
    assert [older.get_files(asked), newer.get_files(asked)] == matched
    assert set(matched[0]) == {"a", "b", "c"} and set(matched[1]) == {"b", "c", "l1-a"}
    assert set(newer.get_files(["b"])) == {"b"}  # one key of four live files: matched, not read whole


def test_partitions_are_added_at_offset_zero_and_never_removed(catalog: Catalog) -> None:
    create_topic(catalog, "t", partitions=2)
    _append(catalog, _new_file("f1", ("t", 0, 5)))
    grown = catalog.add_partitions("t", 4, NOW)
    assert grown.partitions == 4 and catalog.snapshot().topic("t").partitions == 4
    assert catalog.next_offsets("t") == [5, 0, 0, 0]
    assert _append(catalog, _new_file("f2", ("t", 3, 2))) == [0]
    with pytest.raises(InvalidTopicError, match="has 4 partitions: a topic's partitions can only grow"):
        catalog.add_partitions("t", 3, NOW)
    with pytest.raises(TopicNotFoundError):
        catalog.add_partitions("nope", 3, NOW)
    assert catalog.next_offsets("t") == [5, 0, 0, 2]


def test_altering_a_topic_reads_it_in_the_same_transaction(catalog: Catalog) -> None:
    create_topic(catalog, "t", cleanup_policy="delete")
    _append(catalog, _new_file("before", ("t", 0, 1)))
    altered = catalog.alter_topic("t", lambda topic: topic.altered({"cleanup.policy": "compact"}), NOW)
    assert altered.config.compacted and catalog.snapshot().topic("t").config.compacted
    _append(catalog, _new_file("after", ("t", 0, 1)))  # files written since are of compacted content
    assert {f.key: f.content for f in catalog.snapshot().file_summaries()} == {"before": "other", "after": "compacted"}
