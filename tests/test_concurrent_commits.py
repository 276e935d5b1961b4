"""Eight writer processes commit at once: no file lost or duplicated, no offset given twice.

Six processes append L0 files through agents while two replace pairs of L0 files by L1 copies, on the two
deployments: an s3:// store (RGW) with its catalog on PostgreSQL, and a file:// store with its embedded
SQLite. Afterwards every produced record must be readable exactly once, at the offset its producer was
told, and each partition's offsets must be exactly 0 .. next_offset - 1.
"""

from __future__ import annotations

import multiprocessing
import time

import pytest

from logcompact.catalog import Catalog
from logcompact.consume import read_records
from logcompact.store import open_store
from tests.helpers import create_topic
from tests.support import commit_writers

APPENDERS = 6
COMPACTORS = 2
COMMITS_PER_APPENDER = 15
COMPACTION_ROUNDS = 8


@pytest.mark.timeout(600)
@pytest.mark.parametrize("store_uri_env, database", [("s3", "postgresql"), ("file", "sqlite")], indirect=["store_uri_env"])
def test_eight_concurrent_writer_processes(store_uri_env, database, make_catalog_url, monkeypatch) -> None:
    store_uri, env = store_uri_env
    for name in ("AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION"):
        if name in env:
            monkeypatch.setenv(name, env[name])
    catalog_url = make_catalog_url(database)
    store = open_store(store_uri)
    catalog = Catalog(store, catalog_url)
    create_topic(catalog, commit_writers.TOPIC, partitions=commit_writers.PARTITIONS)

    start_at = time.time() + 3  # spawned interpreters need a moment to import pyarrow
    with multiprocessing.get_context("spawn").Pool(APPENDERS + COMPACTORS) as pool:
        appends = [
            pool.apply_async(commit_writers.append, (store_uri, catalog_url, n, COMMITS_PER_APPENDER, start_at))
            for n in range(APPENDERS)
        ]
        compactions = [
            pool.apply_async(commit_writers.compact, (store_uri, catalog_url, n, COMPACTION_ROUNDS, start_at))
            for n in range(COMPACTORS)
        ]
        placed = {value: where for result in appends for value, where in result.get(timeout=540).items()}
        outcomes = [result.get(timeout=540) for result in compactions]

    snapshot = catalog.snapshot()
    assert all(o["committed"] + o["conflicts"] == COMPACTION_ROUNDS for o in outcomes), outcomes
    assert sum(o["committed"] for o in outcomes) >= 1, outcomes
    live = snapshot.file_summaries()
    assert any(f.level == 1 for f in live)
    for summary in live:
        assert store.stat(summary.key) is not None, f"live file {summary.key} is missing from the store"
    assert len({f.key for f in live}) == len(live)

    next_offsets = catalog.next_offsets(commit_writers.TOPIC)
    found: dict[str, tuple[int, int]] = {}
    for partition in range(commit_writers.PARTITIONS):
        offsets = []
        for record in read_records(store, snapshot, commit_writers.TOPIC, partition):
            value = record.value.decode()
            assert value not in found, f"{value} is in the log twice"
            found[value] = (partition, record.offset)
            offsets.append(record.offset)
        assert offsets == list(range(next_offsets[partition]))
    assert found == placed
    assert len(placed) >= APPENDERS * COMMITS_PER_APPENDER  # every commit held 1 to 3 records
