"""How long a compaction's commit holds the catalog's version row on PostgreSQL, the row every append waits for while
it holds its partitions' rows: `--files` L0 files of 1,000 partitions each appended (as the regime's agents write
them), then an L0 to L1 copy of them committed (10 output files of 100 partitions), `--rounds` times on a throw-away
PostgreSQL server at its default settings (fsync on).

    .venv/bin/python bench/compaction_commit.py                 # 300 files, 3 rounds

Per round: the L0 files' appends, one a commit as an agent makes them on PostgreSQL (the one-step append, which
also stores the packed sections of the file before it); a planning pass's read of the live files' sections
(`Snapshot.section_columns`, the L0 files' from their packs); the read of the inputs' sections a compaction's
preparation makes (`Snapshot.input_sections`); each as wall time, this process's CPU and the database server's. Then
the commit's time (`Catalog.replace_files`, BEGIN to COMMIT) and the version row's hold (from the version taken to the
COMMIT). No target of its own: the figures behind the regime's produce-to-commit latency.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import TypeVar

from postgres_server import ThrowAwayPostgres
from results import recorded
from sqlalchemy import Connection

from logcompact.catalog import Catalog, NewFile
from logcompact.catalog import catalog as catalog_module
from logcompact.catalog.model import CatalogSection, DataFile
from logcompact.format.layout import SectionInfo
from logcompact.store import LocalStore
from logcompact.topics import Topic

PARTITIONS = 1_000
RECORDS = 10  # a section's, in each L0 file
NOW = 1_700_000_000_000
T = TypeVar("T")


def _l0_file(key: str) -> NewFile:
    return NewFile(key, 0, 100_000, NOW, tuple(SectionInfo("t", p, RECORDS, RECORDS - 1, NOW, NOW, 0, 1_000, "none", 0, 0, 100) for p in range(PARTITIONS)))


def _copy(round_: int, first: int, last: int) -> list[DataFile]:
    """The L0 to L1 copy's outputs: each partition's offsets first to last in one section, 100 partitions a file."""
    count = last - first + 1
    return [
        DataFile(f"data/l1/{round_}-{n}.seg", 1, 1_000_000, NOW, tuple(
            CatalogSection(SectionInfo("t", p, count, count - 1, NOW, NOW, 0, 100 * count, "none", 0, 0, 100), first)
            for p in range(n * 100, n * 100 + 100)
        ))
        for n in range(PARTITIONS // 100)
    ]


def _append_each(catalog: Catalog, keys: list[str]) -> None:
    for key in keys:
        catalog.append_files([_l0_file(key)], NOW)


def _timed(server: ThrowAwayPostgres, into: list[tuple[float, float, float]], read: Callable[[], T]) -> T:
    """`read()`, its seconds of wall time, of this process's CPU and of the database server's noted `into`."""
    started, cpu, server_cpu = time.perf_counter(), time.process_time(), server.cpu_seconds()
    result = read()
    into.append((time.perf_counter() - started, time.process_time() - cpu, server.cpu_seconds() - server_cpu))
    return result


def _medians(timings: list[tuple[float, float, float]]) -> tuple[float, float, float]:
    wall, cpu, server_cpu = (statistics.median(column) for column in zip(*timings, strict=True))
    return wall, cpu, server_cpu


def _ms(timing: tuple[float, ...]) -> str:
    wall, cpu, server_cpu = (1000 * seconds for seconds in timing)
    places = 1 if wall < 100 else 0
    return f"{wall:,.{places}f} ms (CPU {cpu:,.{places}f} here, {server_cpu:,.{places}f} in the database)"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=300, help="L0 files a round, each of 1,000 partitions")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    locked_at: list[float] = []
    next_version = catalog_module.versions.next_version

    def noting_the_lock(connection: Connection, operation: str, now_ms: int) -> int:
        version = next_version(connection, operation, now_ms)
        locked_at.append(time.perf_counter())
        return version

    server = ThrowAwayPostgres()
    server.start()
    held: list[float] = []
    took: list[float] = []
    appends: list[tuple[float, float, float]] = []  # the round's appends, one file each: seconds of wall time, this process's CPU, the server's
    passes: list[tuple[float, float, float]] = []  # a planning pass's read: seconds of wall time, this process's CPU, the server's
    reads: list[tuple[float, float, float]] = []  # the inputs' sections read, likewise
    try:
        with recorded():
            catalog = Catalog(LocalStore(tempfile.mkdtemp(prefix="logcompact-bench-commit-")), server.new_database(f"commit_{uuid.uuid4().hex[:12]}"))
            catalog.ensure_created(NOW)
            catalog.create_topic(Topic.create("t", PARTITIONS, {"cleanup.policy": "compact"}, NOW), NOW)
            print(f"an L0 to L1 copy of {args.files} files of {PARTITIONS:,} partitions ({args.files * PARTITIONS:,} sections) committed on PostgreSQL")
            for round_ in range(args.rounds):
                keys = [f"data/l0/{round_}-{n}.seg" for n in range(args.files)]
                _timed(server, appends, partial(_append_each, catalog, keys))
                outputs = _copy(round_, round_ * args.files * RECORDS, (round_ + 1) * args.files * RECORDS - 1)
                snapshot = catalog.snapshot()
                passed = len(_timed(server, passes, snapshot.section_columns).file)
                read = len(_timed(server, reads, partial(snapshot.input_sections, keys)))
                catalog_module.versions.next_version = noting_the_lock
                started = time.perf_counter()
                try:
                    catalog.replace_files(keys, outputs, NOW, plan_id=f"copy-{round_}", expected_version=snapshot.version)
                finally:
                    catalog_module.versions.next_version = next_version
                ended = time.perf_counter()
                took.append(ended - started)
                held.append(ended - locked_at[-1])
                print(f"  round {round_ + 1}: {args.files} appends in {_ms(appends[-1])}, a planning pass's {passed:,} sections read in {_ms(passes[-1])}, the inputs' {read:,} sections "
                      f"in {_ms(reads[-1])}, the commit {took[-1] * 1000:,.0f} ms, the version row held {held[-1] * 1000:,.0f} ms")
            each = tuple(seconds / args.files for seconds in _medians(appends))
            print(f"medians: an append {_ms(each)}, a planning pass's read {_ms(_medians(passes))}, the inputs' sections read {_ms(_medians(reads))}, the commit "
                  f"{statistics.median(took) * 1000:,.0f} ms, the version row held {statistics.median(held) * 1000:,.0f} ms "
                  "(ms of wall time, with this process's CPU and the database server's)")
    finally:
        server.stop()


if __name__ == "__main__":
    main()
