"""Writers of every kind at once, each taking its locks in the catalog's one order (topic rows, partition rows,
transaction rows, the version row last): appends of files spanning every partition, topic changes, retention commits
that raise log starts, and transactions: their batches appended, ended by EndTxn (a marker in each partition) or
aborted by a new producer of their transactional id. None may deadlock or fail, no offset is handed out twice, and
every append is published under its own version, in commit order."""

from __future__ import annotations

import threading
import time
from collections import defaultdict

import pytest
from sqlalchemy import text

from logcompact.catalog import Catalog, NewFile, appends
from logcompact.catalog.database import integer_array
from logcompact.catalog.groups import CommittedOffset
from logcompact.catalog.producers import PlacedBatch, SequencedBatch
from logcompact.format.layout import SectionInfo
from tests.helpers import NOW, create_topic

PARTITIONS = 20
APPENDERS = 4
APPENDS_EACH = 20
TOPIC_CHANGES = 10
TRANSACTIONS = 12


def _section(topic: str, partition: int, records: int) -> SectionInfo:
    return SectionInfo(topic, partition, records, records - 1, NOW, NOW, 0, 100 * records, "none", 0, 0, 100)


def test_writers_of_every_kind_at_once(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    create_topic(catalog, "kept", partitions=PARTITIONS, cleanup_policy="compact")
    create_topic(catalog, "expiring", partitions=PARTITIONS, cleanup_policy="delete", retention_ms="60000")
    appended: dict[str, int] = {}  # file key -> the version its append returned
    failures: list[BaseException] = []
    lock = threading.Lock()
    appenders_done = threading.Event()
    markers: dict[tuple[str, int], list[int | None]] = defaultdict(list)  # offsets handed out as markers (None: not known)
    kept_id = catalog.snapshot().topic_ids["kept"]

    def appender(number: int) -> None:
        for n in range(APPENDS_EACH):
            key = f"data/l0/{number}-{n}.seg"
            sections = tuple(
                _section(topic, p, 1 + (p + n) % 3) for topic in ("expiring", "kept") for p in range(PARTITIONS)
            )
            version = catalog.append_files([NewFile(key, 0, 1_000, NOW, sections)], NOW).version
            with lock:
                appended[key] = version

    def transactor(transactional_id: str, fenced: bool) -> None:
        """Transactions over two partitions of "kept", each with a batch in each; ended by EndTxn (commit and abort in
        turn), or left open for the next InitProducerId of the id to abort (`fenced`)."""
        last: dict[int, tuple[int, int]] = {}  # the producer's (epoch, last sequence) by partition
        pid, epoch = catalog.init_producer(transactional_id, 60_000, 900_000, None, NOW)
        for n in range(TRANSACTIONS):
            chosen = sorted({(n + fenced) % PARTITIONS, (7 * n + 3) % PARTITIONS})
            catalog.add_to_transaction(transactional_id, pid, epoch, [("kept", p) for p in chosen], NOW)
            placed = []
            for p in chosen:
                first = last[p][1] + 1 if p in last and last[p][0] == epoch else 0
                placed.append(PlacedBatch("kept", p, 0, SequencedBatch(pid, epoch, first, first + 1, last.get(p), True)))
                last[p] = (epoch, first + 1)
            key = f"data/l0/{transactional_id}-{n}.seg"
            done = catalog.append_files([NewFile(key, 0, 1_000, NOW, tuple(_section("kept", p, 2) for p in chosen))], NOW, [placed])
            assert done.refused == {}, done
            with lock:
                appended[key] = done.version
            ended: dict[tuple[int, int], int | None] = {}
            if fenced:
                pid, epoch = catalog.init_producer(transactional_id, 60_000, 900_000, None, NOW)
                ended = dict.fromkeys(((kept_id, p) for p in chosen), None)
            else:
                ended.update(catalog.end_transaction(transactional_id, pid, epoch, n % 2 == 0, NOW).markers)
                assert set(ended) == {(kept_id, p) for p in chosen}
            with lock:
                for (_, p), offset in ended.items():
                    markers[("kept", p)].append(offset)

    def topic_changer() -> None:
        for n in range(TOPIC_CHANGES):
            catalog.alter_topic("kept", {"min.compaction.lag.ms": str(1000 * (n + 1))}, NOW)
            catalog.add_partitions("kept", PARTITIONS + n + 1, NOW)

    def retention() -> None:  # drops the oldest files two at a time, as retention drops expired ones, while appends go on
        removed: set[str] = set()  # (a file is recorded once its append returns: an older one may come after a newer)
        while len(removed) < APPENDERS * APPENDS_EACH // 2:
            with lock:
                oldest = sorted(set(appended) - removed, key=appended.__getitem__)[:2]
            if len(oldest) < 2:
                if appenders_done.is_set():
                    return  # the appenders failed, which the test asserts on
                time.sleep(0.01)
                continue
            catalog.replace_files(oldest, [], NOW)
            removed.update(oldest)

    def guarded(work, *args) -> None:
        try:
            work(*args)
        except BaseException as exc:  # each thread's failure is asserted on below
            failures.append(exc)

    appenders = [threading.Thread(target=guarded, args=(appender, n), daemon=True) for n in range(APPENDERS)]
    appenders += [threading.Thread(target=guarded, args=(transactor, name, fenced), daemon=True) for name, fenced in (("ended", False), ("fenced", True))]
    others = [threading.Thread(target=guarded, args=(work,), daemon=True) for work in (topic_changer, retention)]
    for thread in appenders + others:
        thread.start()
    for thread in appenders:
        thread.join(timeout=300)
    appenders_done.set()
    for thread in others:
        thread.join(timeout=300)
    assert not failures, failures
    # An append or a compaction rolled back as a deadlock victim runs again (`Catalog`), with a warning.
    assert not [r.getMessage() for r in caplog.records if "rolled a write transaction back" in r.getMessage()]
    assert len(appended) == APPENDERS * APPENDS_EACH + 2 * TRANSACTIONS

    with catalog.engine.connect() as connection:
        added = dict(connection.execute(text("SELECT key, added_version FROM files")).all())
        sections = connection.execute(text(
            "SELECT t.name, s.partition, s.first_offset, s.last_offset FROM sections s JOIN topics t USING (topic_id)"
        )).all()
        starts = {
            (name, partition): (start, next_offset) for name, partition, start, next_offset in connection.execute(text(
                "SELECT t.name, p.partition, p.log_start_offset, p.next_offset FROM partitions p JOIN topics t USING (topic_id)"
            ))
        }
    # Published under the version each append returned, a version of its own; none left pending.
    assert added == appended
    assert len(set(appended.values())) == len(appended)
    # Every partition's sections, removed or not, tile its offsets from 0 to its next offset but for its markers: an
    # offset each, where EndTxn said (an InitProducerId's abort does not say where).
    by_partition = defaultdict(list)
    for name, partition, first, last in sections:
        by_partition[(name, partition)].append((first, last))
    for slot, ranges in by_partition.items():
        ranges.sort()
        assert all(a[1] < b[0] for a, b in zip(ranges, ranges[1:])), slot  # no offset twice
        ends = [(-1, -1), *ranges, (starts[slot][1], starts[slot][1])]
        holes = {offset for a, b in zip(ends, ends[1:]) for offset in range(a[1] + 1, b[0])}
        assert len(holes) == len(markers.get(slot, [])) and {m for m in markers.get(slot, []) if m is not None} <= holes, slot
    # No transaction is left open: every partition's LSO is its high watermark.
    assert all(offsets.last_stable == offsets.high_watermark for offsets in catalog.log_offsets("kept"))
    # Retention raised each expiring partition's log start to its first live offset.
    snapshot = catalog.snapshot()
    for partition in range(PARTITIONS):
        live = [section.first_offset for _, section in snapshot.sections_of("expiring", partition)]
        assert starts[("expiring", partition)][0] == min(live), partition


def test_an_append_locks_its_partition_rows_in_order_on_postgresql(catalog: Catalog) -> None:
    """On PostgreSQL the advancing UPDATE locks each partition row as it updates it, in the order its join yields
    them: that order is (topic id, partition) only while the plan reads the partitions through their primary key's
    index, probed for each entry of the sorted arrays or scanned. A hash or merge join, or a sequential scan, would
    let two appends lock shared rows in two orders. Checked with the table's statistics taken, small and large,
    for one partition and for all. The subqueries looking for rows that claim the offsets handed out run per
    partition through their indexes too."""
    if catalog.engine.dialect.name != "postgresql":
        pytest.skip("SQLite's writer holds the database's one write lock: no row locks to order")
    create_topic(catalog, "small", partitions=2, cleanup_policy="compact")
    create_topic(catalog, "large", partitions=1000, cleanup_policy="compact")
    for analyzed in (False, True):
        for counts in ({(1, 0): 1}, {(1, 0): 1, (1, 1): 3}, {(2, p): 1 for p in range(1000)}):
            slots = sorted(counts)
            arrays = {"topics": integer_array(t for t, _ in slots), "partitions": integer_array(p for _, p in slots),
                      "counts": integer_array(counts[slot] for slot in slots), "files": integer_array(1 for _ in slots)}
            with catalog.engine.begin() as connection:
                if analyzed:
                    connection.exec_driver_sql("ANALYZE partitions")
                connection.exec_driver_sql(appends._KEYED_PLAN)
                plan = "\n".join(row[0] for row in connection.exec_driver_sql("EXPLAIN " + appends._ADVANCE_POSTGRESQL, arrays))
                connection.rollback()
            assert "Nested Loop" in plan and "Index Scan using partitions_pkey on partitions p" in plan, plan
            assert not any(step in plan for step in ("Hash", "Merge", "Seq Scan", "Bitmap")), plan
            assert "using sections_by_partition" in plan and "using files_live_by_level" in plan, plan


def test_offset_commits_of_one_group_in_opposite_orders_never_deadlock(catalog: Catalog) -> None:
    """Two members' commits of the same partitions, one naming them in ascending order and one in descending (as a
    client's dict may), side by side: each writes its rows in the catalog's order, so neither waits on the other in a
    cycle (PostgreSQL would abort one with a deadlock) and every commit is stored."""
    create_topic(catalog, "t", partitions=PARTITIONS)
    failures: list[BaseException] = []
    slots = [("t", partition) for partition in range(PARTITIONS)]

    def committer(order: list[tuple[str, int]], value: int) -> None:
        try:
            for round_ in range(30):
                catalog.commit_offsets("g", {slot: CommittedOffset(value + round_, -1, "", NOW) for slot in order})
        except BaseException as exc:  # reported by the assertion below
            failures.append(exc)

    threads = [threading.Thread(target=committer, args=(slots, 0)), threading.Thread(target=committer, args=(slots[::-1], 1000))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert not failures, failures
    stored = catalog.committed_offsets("g")
    assert set(stored) == set(slots) and {c.offset for c in stored.values()} <= {29, 1029}
