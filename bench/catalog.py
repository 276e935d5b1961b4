"""The catalog at scale, on SQLite and on PostgreSQL: what a commit, a reader and the storage cost.

    .venv/bin/python bench/catalog.py [--database sqlite|postgresql ...] [--sizes 1000 10000 100000]
                                      [--agents-seconds 60] [--gc-seconds 30]

For each database (by default both: SQLite in a temporary store directory, and PostgreSQL on a throw-away
server started from Debian's packages, as the tests do) it prints:

* append: the median time of one L0 append commit (4 sections, offsets assigned in the transaction)
  against catalogs of 1k, 10k and 100k live files, 4 sections each;
* wide append: the median time of one append of a file holding a section for each of 1,000 partitions (10 topics
  of 100), alone, as WarpStream's agents write them;
* consume: time to the first record of one partition, reading through the 100k-file catalog;
* storage: catalog bytes per section at 100k files (tables and indexes), and in files of 1,000 sections;
* agents: 10 agent processes, each writing and committing 4 L0 files a second (a real Agent, a real
  segment written to the store), for --agents-seconds against a 10k-file catalog: commits/s, latency
  of a flush (write + commit) p50/p99, failures;
* contended appends: 4 processes appending files of a section for each of the same 1,000 partitions back to back
  for --contention-seconds, each with a Python thread busy beside its appends (as an agent's threads writing its
  next file are): appends/s and append latency p50/p99. Each append holds the partitions' rows until it commits, so
  what the appends a second show is how long each holds them on a busy machine;
* gc under steady ingest: 4 producer processes and 2 compactor processes (plan, lease, run, commit) for
  --gc-seconds while gc runs back to back with a 2 s grace and 5 kept versions: gc runs completed and
  failed, files and objects deleted, and a check that every live file still has its object.

Planning time over 100k and 300k files is `bench/planner.py`.

The catalogs are built through the catalog's own API (`append_files`) in batches. Their filler files are
catalog rows only (their objects are never written), at L2 as compaction leaves a cluster's files: the figures are
the catalog's costs. L0 holds the files appended by the measurements, some hundreds. The partition
that is consumed holds real files. The throw-away PostgreSQL server runs on disk at its default durability
(fsync and synchronous_commit on), as users run it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import random
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path

from postgres_server import ThrowAwayPostgres
from results import recorded
from sqlalchemy import text

from logcompact.catalog import Catalog, NewFile
from logcompact.consume import read_batches
from logcompact.format import section_table, write_segment
from logcompact.ingest import Agent, Record
from logcompact.store import LocalStore
from logcompact.topics import Topic

NOW = 1_700_000_000_000
TOPICS = 64
PARTITIONS = 16
SECTIONS_PER_FILE = 4
AGENTS = 10
WIDE_TOPICS, WIDE_PARTITIONS = 10, 100
WARM_UP_S = 2
FILES_PER_SECOND = 4
# The filler files' level: where compaction keeps a catalog's files. L0 holds what agents appended since the last
# L0 to L1 pass, a few hundred files at most; a reader finds a partition's L0 sections through every live L0 file.
FILLER_LEVEL = 2


def _segment(sections: list[tuple[str, int]], records: int = 3) -> tuple[bytes, list]:
    tables = []
    for topic, partition in sections:
        keys = [b"k%d" % n for n in range(records)]
        tables.append((topic, partition, section_table(range(records), [NOW] * records, keys, [b"v" * 100] * records, [None] * records)))
    return write_segment(tables)


class Cluster:
    """A catalog on one database, with its topics, grown to a number of live files."""

    def __init__(self, url: str | None, root: Path) -> None:
        self.store = LocalStore(root / "store")
        self.catalog = Catalog(self.store, url)
        self.catalog.ensure_created(NOW)
        for n in range(TOPICS):
            self.catalog.create_topic(Topic.create(f"t{n}", PARTITIONS, {"cleanup.policy": "compact"}, NOW), NOW)
        self.files = 0
        # One real segment's sections, re-labelled per filler file: the catalog never reads the object.
        _data, self._infos = _segment([(f"t{n + 1}", 0) for n in range(SECTIONS_PER_FILE)])

    def grow_to(self, files: int, batch: int = 2_000) -> None:
        rng = random.Random(files)
        while self.files < files:
            count = min(batch, files - self.files)
            new_files = []
            for n in range(count):
                slots = sorted({(rng.randrange(1, TOPICS), rng.randrange(PARTITIONS)) for _ in range(SECTIONS_PER_FILE)})
                infos = tuple(info._replace(topic=f"t{t}", partition=p) for info, (t, p) in zip(self._infos, slots))
                new_files.append(NewFile(f"data/l2/filler-{self.files + n:09d}.seg", FILLER_LEVEL, 10_000, NOW, infos))
            self.catalog.append_files(new_files, NOW)
            self.files += count

    def append_latency(self, commits: int = 200) -> float:
        """Median seconds of one append commit of a 4-section L0 file (rows only, as an agent commits them)."""
        timings = []
        for _ in range(commits):
            infos = tuple(self._infos)
            new = NewFile(f"data/l0/probe-{uuid.uuid4().hex}.seg", 0, 10_000, NOW, infos)
            started = time.perf_counter()
            self.catalog.append_files([new], NOW)
            timings.append(time.perf_counter() - started)
        self.files += commits
        return statistics.median(timings)

    def storage_bytes(self) -> int:
        return storage_bytes(self.catalog)

    def sections(self) -> int:
        return section_count(self.catalog)


def storage_bytes(catalog: Catalog) -> int:
    """The catalog's bytes: SQLite's pages in use, PostgreSQL's sections and files tables with their indexes."""
    engine = catalog.engine
    with engine.connect() as connection:
        if engine.dialect.name == "sqlite":
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
            pages = connection.exec_driver_sql("PRAGMA page_count").scalar()
            free = connection.exec_driver_sql("PRAGMA freelist_count").scalar()
            return (pages - free) * connection.exec_driver_sql("PRAGMA page_size").scalar()
        return connection.execute(text("SELECT pg_total_relation_size('sections') + pg_total_relation_size('files')")).scalar()


def section_count(catalog: Catalog) -> int:
    with catalog.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM sections")).scalar()


def wide_append_latency(url: str | None, root: Path, appends: int = 50) -> tuple[float, float]:
    """Median seconds of one append of a file with a section for each of 1,000 partitions (10 topics of 100), into
    a catalog of its own (rows only: the object is never written); and that catalog's bytes per section, in files of
    agents' shape."""
    catalog = Catalog(LocalStore(root / "wide"), url)
    catalog.ensure_created(NOW)
    for n in range(WIDE_TOPICS):
        catalog.create_topic(Topic.create(f"wide{n}", WIDE_PARTITIONS, {"cleanup.policy": "compact"}, NOW), NOW)
    _data, infos = _segment([(f"wide{t}", p) for t in range(WIDE_TOPICS) for p in range(WIDE_PARTITIONS)], records=1)
    timings = []
    for n in range(appends):
        new = NewFile(f"data/l0/wide-{n:06d}.seg", 0, 1_000_000, NOW, tuple(infos))
        started = time.perf_counter()
        catalog.append_files([new], NOW)
        timings.append(time.perf_counter() - started)
    return statistics.median(timings), storage_bytes(catalog) / section_count(catalog)


def consume_first_record(cluster: Cluster, runs: int = 20) -> tuple[float, int]:
    """Median seconds to the first record of partition t0/0, which holds real files, and its section count."""
    with Agent(cluster.catalog, background=False, clock=lambda: NOW) as agent:
        for batch in range(20):
            agent.produce("t0", [Record(0, b"key-%d" % n, b"value-%d" % batch, NOW) for n in range(100)])
            agent.flush()
    timings = []
    for _ in range(runs):
        started = time.perf_counter()
        snapshot = cluster.catalog.snapshot()
        first = next(read_batches(cluster.store, snapshot, "t0", 0, from_offset=1_000))
        timings.append(time.perf_counter() - started)
        assert first.column("offset")[0].as_py() == 1_000
    return statistics.median(timings), len(cluster.catalog.snapshot().sections_of("t0", 0))


def _agent_process(store_root: str, url: str | None, agent: int, seconds: float, start_at: float, out) -> None:
    catalog = Catalog(LocalStore(store_root), url)
    latencies, failures = [], 0
    time.sleep(max(0.0, start_at - time.time()))
    began = time.time()  # this process's start: one that imported slower than start_at allowed starts late
    interval = 1 / FILES_PER_SECOND
    with Agent(catalog, background=False) as producer:
        tick = time.monotonic()
        end = tick + seconds
        sequence = 0
        while tick < end:
            records = [Record(p, b"a%d-%d" % (agent, sequence + p), b"v" * 100) for p in range(SECTIONS_PER_FILE)]
            producer.produce(f"t{agent % TOPICS}", records)
            sequence += SECTIONS_PER_FILE
            started = time.perf_counter()
            try:
                producer.flush()
                latencies.append((time.time() - began, time.perf_counter() - started))
            except Exception as exc:  # counted and reported: the figure is how many commits failed
                failures += 1
                print(f"agent {agent}: {exc}", file=sys.stderr)
                break
            tick += interval
            time.sleep(max(0.0, tick - time.monotonic()))
    out.put((latencies, failures))


CONTENDERS = 4


def _contender_process(store_root: str, url: str | None, number: int, seconds: float, start_at: float, out) -> None:
    catalog = Catalog(LocalStore(store_root), url)
    _data, infos = _segment([(f"wide{t}", p) for t in range(WIDE_TOPICS) for p in range(WIDE_PARTITIONS)], records=1)
    catalog.append_files([NewFile(f"data/l0/contender-{number}-warm.seg", 0, 1_000_000, NOW, tuple(infos))], NOW)
    stop = threading.Event()

    def busy() -> None:  # the interpreter's other work, which the committing thread waits on between its statements
        total = 0
        while not stop.is_set():
            total += sum(n * n for n in range(2_000))

    threading.Thread(target=busy, daemon=True).start()
    time.sleep(max(0.0, start_at - time.time()))
    latencies, end = [], time.time() + seconds
    while time.time() < end:
        started = time.perf_counter()
        catalog.append_files([NewFile(f"data/l0/contender-{number}-{len(latencies):06d}.seg", 0, 1_000_000, NOW, tuple(infos))], NOW)
        latencies.append(time.perf_counter() - started)
    stop.set()
    out.put(latencies)


def contended_appends(url: str | None, root: Path, seconds: float) -> dict:
    """CONTENDERS processes appending 1,000-partition files to the same partitions, each beside a busy thread."""
    catalog = Catalog(LocalStore(root / "contended"), url)
    catalog.ensure_created(NOW)
    for n in range(WIDE_TOPICS):
        catalog.create_topic(Topic.create(f"wide{n}", WIDE_PARTITIONS, {"cleanup.policy": "compact"}, NOW), NOW)
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 20  # spawned interpreters import pyarrow and append a first file
    processes = [
        context.Process(target=_contender_process, args=(str(catalog.store.root), catalog.url, n, seconds, start_at, out))
        for n in range(CONTENDERS)
    ]
    for process in processes:
        process.start()
    latencies = sorted(latency for _ in processes for latency in out.get(timeout=seconds + 300))
    for process in processes:
        process.join()
    return {"per_s": len(latencies) / seconds, "p50_ms": 1000 * latencies[len(latencies) // 2],
            "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)]}


def agents_run(cluster: Cluster, seconds: float) -> dict:
    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 5  # spawned interpreters need a moment to import pyarrow
    processes = [
        context.Process(target=_agent_process, args=(str(cluster.store.root), cluster.catalog.url, n, seconds, start_at, out))
        for n in range(AGENTS)
    ]
    for process in processes:
        process.start()
    results = [out.get(timeout=seconds + 120) for _ in processes]
    for process in processes:
        process.join()
    commits = sum(len(found) for found, _ in results)
    # Each process's first flushes open its connections and warm its caches (its first one at least, however
    # long it took on a loaded machine): the steady state starts after.
    warm_up = [(n == 0 or at < WARM_UP_S) for found, _ in results for n, (at, _latency) in enumerate(found)]
    flushes = [latency for found, _ in results for _at, latency in found]
    latencies = sorted(latency for latency, warming in zip(flushes, warm_up) if not warming)
    return {
        "commits": commits,
        "commits_per_s": commits / seconds,
        "warm_up_max_ms": 1000 * max(latency for latency, warming in zip(flushes, warm_up) if warming),
        "p50_ms": 1000 * latencies[len(latencies) // 2],
        "p99_ms": 1000 * latencies[int(len(latencies) * 0.99)],
        "failures": sum(failed for _, failed in results),
    }


def _producer_process(store_root: str, url: str | None, writer: int, seconds: float, start_at: float) -> None:
    catalog = Catalog(LocalStore(store_root), url)
    time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + seconds
    with Agent(catalog, background=False) as agent:
        sequence = 0
        while time.monotonic() < end:
            agent.produce("t1", [Record(p, b"k%d" % (sequence % 50), b"w%d-%d" % (writer, sequence)) for p in range(PARTITIONS)])
            agent.flush()
            sequence += 1
            time.sleep(1 / FILES_PER_SECOND)


def _compactor_process(store_root: str, url: str | None, seconds: float, start_at: float, out) -> None:
    from logcompact.exceptions import CommitConflictError
    from logcompact.jobs import run_and_commit
    from logcompact.planner import PlannerConfig, choose_plans

    catalog = Catalog(LocalStore(store_root), url)
    config = PlannerConfig(min_files=(8, 8, 8, 8), tier_min_files=4, buffer_bytes=1 << 20)
    committed = conflicts = 0
    time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        found = choose_plans(catalog.snapshot(), int(time.time() * 1000), "regular", config)
        for candidate in found:
            try:
                run_and_commit(catalog, candidate, candidate.now_ms, lease_ms=60_000)
                committed += 1
            except CommitConflictError:
                conflicts += 1  # the other compactor leased or replaced these files first
        if not found:
            time.sleep(0.2)
    out.put((committed, conflicts))


def gc_under_ingest(cluster: Cluster, seconds: float) -> dict:
    from logcompact.jobs import collect_garbage

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    start_at = time.time() + 5
    root, url = str(cluster.store.root), cluster.catalog.url
    processes = [context.Process(target=_producer_process, args=(root, url, n, seconds, start_at)) for n in range(4)]
    processes += [context.Process(target=_compactor_process, args=(root, url, seconds, start_at, out)) for _ in range(2)]
    for process in processes:
        process.start()
    collector = Catalog(cluster.store, url, keep_versions=5)
    completed, failed, deleted, missing = 0, 0, 0, 0
    time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        try:
            report = collect_garbage(collector, int(time.time() * 1000), grace_ms=2_000)
            completed += 1
            deleted += len(report.deleted_files)
        except Exception as exc:  # counted and reported: the figure is how many gc runs failed
            failed += 1
            print(f"gc: {exc}", file=sys.stderr)
        missing += sum(1 for f in collector.snapshot().file_summaries() if cluster.store.stat(f.key) is None)
        time.sleep(0.5)
    compactions = [out.get(timeout=300) for _ in range(2)]
    for process in processes:
        process.join()
        if process.exitcode:
            failed += 1
            print(f"a producer or compactor exited with {process.exitcode}", file=sys.stderr)
    return {"completed": completed, "failed": failed, "deleted": deleted, "missing": missing,
            "compactions": sum(c for c, _ in compactions)}


def bench(
    name: str, new_url: Callable[[], str | None], sizes: list[int], agents_seconds: float, gc_seconds: float, contention_seconds: float,
) -> None:
    with tempfile.TemporaryDirectory(prefix="logcompact-bench-") as tmp:
        cluster = Cluster(new_url(), Path(tmp))
        print(f"\n{name}: {cluster.catalog.engine.url.render_as_string()}")
        wide, wide_bytes = wide_append_latency(new_url(), Path(tmp))
        print(f"  append of one file of {WIDE_TOPICS * WIDE_PARTITIONS:,} sections (one per partition), alone: "
              f"{1000 * wide:6.2f} ms median; storage in files of that shape: {wide_bytes:.0f} B per section")
        appends = {}
        for size in sizes:
            started = time.perf_counter()
            cluster.grow_to(size)
            built = time.perf_counter() - started
            appends[size] = cluster.append_latency()
            print(f"  append commit (4 sections), {size:>7,} live files: {1000 * appends[size]:6.2f} ms median"
                  f"   (catalog grown in {built:.1f} s)")
        if len(sizes) > 1:
            print(f"  append at {sizes[-1]:,} / at {sizes[0]:,} files: {appends[sizes[-1]] / appends[sizes[0]]:.2f}x")
        first, sections = consume_first_record(cluster)
        print(f"  consume one partition ({sections} sections) from offset 1000, {cluster.files:,}-file catalog: "
              f"first record in {1000 * first:.1f} ms median")
        total, count = cluster.storage_bytes(), cluster.sections()
        print(f"  storage: {total / 1e6:.1f} MB for {count:,} sections and their files: {total / count:.0f} B per section")
    if agents_seconds:
        with tempfile.TemporaryDirectory(prefix="logcompact-bench-") as tmp:
            cluster = Cluster(new_url(), Path(tmp))
            cluster.grow_to(10_000)
            figures = agents_run(cluster, agents_seconds)
        print(f"  {AGENTS} agents x {FILES_PER_SECOND} files/s for {agents_seconds:.0f} s, 10k-file catalog: "
              f"{figures['commits_per_s']:.1f} commits/s, flush p50 {figures['p50_ms']:.1f} ms, "
              f"p99 {figures['p99_ms']:.1f} ms (after the first {WARM_UP_S} s; slowest before: {figures['warm_up_max_ms']:.0f} ms), "
              f"{figures['failures']} failures")
    if contention_seconds:
        with tempfile.TemporaryDirectory(prefix="logcompact-bench-") as tmp:
            figures = contended_appends(new_url(), Path(tmp), contention_seconds)
        print(f"  {CONTENDERS} processes appending files of the same {WIDE_TOPICS * WIDE_PARTITIONS:,} partitions back to back, "
              f"each beside a busy thread, {contention_seconds:.0f} s: {figures['per_s']:.1f} appends/s, "
              f"latency p50 {figures['p50_ms']:.0f} ms, p99 {figures['p99_ms']:.0f} ms")
    if gc_seconds:
        with tempfile.TemporaryDirectory(prefix="logcompact-bench-") as tmp:
            cluster = Cluster(new_url(), Path(tmp))
            figures = gc_under_ingest(cluster, gc_seconds)
        print(f"  gc under steady ingest (4 producers, 2 compactors, {gc_seconds:.0f} s): {figures['completed']} gc runs "
              f"completed, {figures['failed']} failed; {figures['deleted']} files deleted, {figures['compactions']} "
              f"compactions committed; live files without their object: {figures['missing']}")


def _new_database(server: ThrowAwayPostgres) -> str:
    return server.new_database(f"catalog_{uuid.uuid4().hex[:12]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], action="append", help="repeatable; default both")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--agents-seconds", type=float, default=60, help="0 skips the agents run")
    parser.add_argument("--gc-seconds", type=float, default=30, help="0 skips the gc run")
    parser.add_argument("--contention-seconds", type=float, default=20, help="0 skips the contended appends")
    args = parser.parse_args()
    for database in args.database or ["sqlite", "postgresql"]:
        if database == "sqlite":
            bench("SQLite", lambda: None, args.sizes, args.agents_seconds, args.gc_seconds, args.contention_seconds)
            continue
        server = ThrowAwayPostgres()
        try:
            server.start()
            bench("PostgreSQL", partial(_new_database, server), args.sizes, args.agents_seconds, args.gc_seconds, args.contention_seconds)
        finally:
            server.stop()


if __name__ == "__main__":
    with recorded():
        main()
