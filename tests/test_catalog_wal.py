"""SQLite's WAL stays bounded though a reader is always open: readers overlapping without end never let a passive
checkpoint reset it, so a writer finding it past its limit checkpoints it in TRUNCATE mode."""

from __future__ import annotations

import os
import threading

from logcompact.catalog import Catalog, NewFile, database
from logcompact.format.layout import SectionInfo
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic

LIMIT = 256 << 10


def test_wal_bounded_under_overlapping_readers(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(database, "SQLITE_WAL_LIMIT_BYTES", LIMIT)
    catalog = Catalog(LocalStore(tmp_path / "store"))
    create_topic(catalog, "t", partitions=100)
    wal = tmp_path / "store" / "catalog.db-wal"
    stop = threading.Event()

    def reader() -> None:  # two of these: one of them is always inside a read transaction
        while not stop.is_set():
            catalog.snapshot().file_summaries()

    readers = [threading.Thread(target=reader) for _ in range(2)]
    for thread in readers:
        thread.start()
    largest = 0
    try:
        sections = tuple(SectionInfo("t", p, 1, 0, NOW, NOW, 0, 100, "none", 0, 0, 100) for p in range(100))
        for n in range(150):
            catalog.append_files([NewFile(f"data/l0/{n}.seg", 0, 1_000, NOW, sections)], NOW)
            largest = max(largest, os.path.getsize(wal) if wal.exists() else 0)
    finally:
        stop.set()
        for thread in readers:
            thread.join()
    one_commit = 100 * 4096  # an append of 100 sections dirties well under 100 pages
    assert 0 < largest <= LIMIT + one_commit, largest
    assert len(catalog.snapshot().file_summaries()) == 150
