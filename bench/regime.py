"""WarpStream's regime, all at once: agent processes ingesting into 1,000 compacted partitions while compactions
keep up (or do not), on SQLite and on PostgreSQL.

    .venv/bin/python bench/regime.py [--database sqlite|postgresql ...] [--agents 10] [--partitions 1000]
                                     [--flush-ms 250] [--compactors 2] [--aligned] [--seconds 600] [--find-load]

Quick look (a minute and a half, a fiftieth of the load): `bench/regime.py --database sqlite --agents 2 --partitions 100 --seconds 45`.

For each database (by default both: SQLite in the store's directory, and PostgreSQL 15 on a throw-away server
on disk at its default durability, fsync on) it runs for --seconds:

* --agents processes, each producing a record for each of --partitions topic-partitions every --flush-ms (at a
  phase of the interval drawn for each agent, as independent producers' records come; with --aligned, every agent's
  at once, so that their files reach the catalog together and their appends queue ten deep) to a
  real background `logcompact.ingest.Agent` flushing every --flush-ms, as `logcompact agent` runs one: it writes
  a real L0 segment file to a `file://` store per interval and commits every file written by then in one
  transaction (several when its commits fall behind: group commit); each file holds a record for each of --partitions
  topic-partitions (10 compacted topics, max.compaction.lag.ms 2 h, WarpStream's floor), 100-byte random values
  under 100 keys a partition, so compaction has duplicates to remove;
* --compactors processes, each doing what a run of the compaction DAG does, back to back: `prepare_plans`
  (the regular planner's level plans, leased and written to the store), `run_here` (each group run by the
  engine, then `commit_plans`); the first also runs the max-lag pass (`prepare_plans` in mode max-lag) at the
  start and then every `max_lag_pass_interval_ms` (15 min). A compactor that finds nothing due
  looks again after a second, where the DAG's sensor pokes every minute: the most compaction a scheduler gets.
  Garbage collection (a 6-hourly DAG with a 1 h grace) does not run within the window.

The window of --seconds opens once every agent has committed its first file (a warm-up file of one interval's
records, not counted) and every compactor has loaded the engine: spawned interpreters import pyarrow, SQLAlchemy
and the engine and compile numba's loops first, which for ten agents on two busy cores takes over a minute. The
output says when it opened.

It prints, every 30 s, the live files per level (the L0 backlog first), the files leased to plans in flight,
the compaction lag and the appends so far; then the appends asked and achieved (per second; one append is one
interval's records of an agent, committed within the window, a file when the agent keeps up), the latency
from produce to commit p50/p99/max (what a Kafka producer waits: up to the flush interval, then the write and
commit), the L0 files committed, the compactions committed, how long the agents' and the compactors' write
transactions took from BEGIN to COMMIT (on SQLite the one writer's lock is held throughout: a compaction's holds
every append back; the target is that none hold appends back for more than a flush interval), the catalog's size,
CPU per process group (agents, compactors, the
database server, this monitor; SQLite's work is inside the agents and compactors) and, on PostgreSQL, what its
sessions in a statement or a transaction were doing (sampled each second: on CPU, waiting on a lock or the WAL,
or waiting for their client mid-transaction), and a verdict: the regime holds when the appends achieved are at
least 95% of those asked, produce-to-commit p99 is within the flush interval plus 300 ms, the L0 backlog stayed
bounded (its low over the run's last third no higher than over its middle third plus one L0 plan's worth of files,
`min_files[0]`: compaction takes L0 in large bites, so a backlog that keeps up is a sawtooth whose lows stay put)
and no partition is past its max lag.

The compaction lag is Kafka's `max-compaction-delay-secs` (kafka.log:type=LogCleanerManager): how far the oldest
dirty record of any partition is past its topic's max.compaction.lag.ms, 0 when none is; a record is dirty until
it is deduplicated against all older data of its partition, by the max-lag planner's own test
(`planner.max_lag.dirty_partitions`, as `logcompact status` computes it). Beside it, the oldest dirty record's
age: with a 2 h max lag a shorter run cannot pass it, and that age's growth says whether a longer one would.

With --find-load, when a load does not hold it steps down a ladder of loads (10, 8, 6, 4, 3, 2, 1 agents; then one
agent's partitions a file, 500, 200, 100) to the first step at or below the records a second the failed run
achieved, until one holds, then back up by halves between the two, a run of --seconds each on a new catalog
each, and prints the largest load that held and what bound the one above it: the CPU (the machine at 85% busy
or more; the process group using the most), else the database (the machine idle while the agents wait on
commits: SQLite's one writer, or what PostgreSQL's sessions waited on, each other's locks or their own client
mid-transaction).
"""

from __future__ import annotations

import argparse
import gc
import importlib
import math
import multiprocessing
import os
import queue
import signal
import statistics
import sys
import tempfile
import time
import uuid
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field, replace
from multiprocessing.process import BaseProcess
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
from postgres_server import ThrowAwayPostgres
from profiling import Profile, sampled
from results import recorded
from sqlalchemy import event, text

from logcompact.catalog import Catalog
from logcompact.catalog.database import WRITE
from logcompact.exceptions import CommitConflictError
from logcompact.format.layout import HEADERS_TYPE
from logcompact.format.xxh3 import compile_hasher
from logcompact.ingest import PRODUCE_SCHEMA, Agent
from logcompact.jobs import prepare_plans, run_here
from logcompact.kafka.allocator import arrow_allocates_from_the_system, keep_freed_memory
from logcompact.planner import PlannerConfig
from logcompact.planner.max_lag import dirty_partitions, effective_max_lag, max_lag_topics
from logcompact.sketch import compile_sketcher
from logcompact.store import LocalStore
from logcompact.topics import MIN_MAX_COMPACTION_LAG_MS, Topic

TOPICS = 10
KEYS = 100  # per partition: each file's record of a partition takes the next of these keys, round the 100
VALUE_BYTES = 100
READY_TIMEOUT_S = 900  # for every agent's first file and every compactor's engine, before the window opens
WINDOW_MARGIN_S = 1.0  # from the last process ready to the window: each reads its start and sleeps until it
SAMPLE_S = 1.0  # backlog, CPU and PostgreSQL's wait events
PRINT_S = 30.0  # a backlog and lag line
IDLE_LOOK_AGAIN_S = 1.0
HOLDS_ACHIEVED = 0.95
PROFILE_RATE = 20  # samples a second of py-spy on one agent and one compactor, printed if the regime does not hold
HOLDS_P99_MS = 300.0
CPU_BOUND_BUSY = 0.85
AGENT_STEPS = (10, 8, 6, 4, 3, 2, 1)
PARTITION_STEPS = (500, 200, 100)  # with one agent, when even one agent's load does not hold



def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Load:
    agents: int
    partitions: int
    flush_ms: int
    compactors: int
    aligned: bool = False  # every agent's ticks at once, not each at a phase of its own

    @property
    def appends_per_s(self) -> float:
        return self.agents * 1000 / self.flush_ms

    @property
    def records_per_s(self) -> float:
        return self.appends_per_s * self.partitions

    def describe(self) -> str:
        ticks = "every agent's ticks at once" if self.aligned else "each agent's ticks at a phase of its own"
        return (f"{self.agents} agents x {1000 / self.flush_ms:g} files/s x {self.partitions:,} partitions "
                f"({TOPICS} topics x {self.partitions // TOPICS}), {self.compactors} compactors; {ticks}")


# -- the agents and the compactors, each a process of its own --------------------------------------------------------


def topic_names() -> list[str]:
    return [f"regime-{n}" for n in range(TOPICS)]


def _timed_writes(catalog: Catalog, start_at: float, seconds: float) -> list[float]:
    """The milliseconds each write transaction of this process's catalog takes, from its BEGIN (IMMEDIATE on SQLite,
    where it holds the one writer's lock from there) to its COMMIT, for those that begin within the window."""
    held: list[float] = []

    @event.listens_for(catalog.engine, "begin")
    def _began(connection) -> None:
        if connection.get_execution_options().get(WRITE) and start_at <= time.time() < start_at + seconds:
            connection.info["write_began"] = time.perf_counter()

    @event.listens_for(catalog.engine, "commit")
    def _committed(connection) -> None:
        began = connection.info.pop("write_began", None)
        if began is not None:
            held.append(1000 * (time.perf_counter() - began))

    @event.listens_for(catalog.engine, "rollback")
    def _rolled_back(connection) -> None:
        connection.info.pop("write_began", None)

    return held


def _await_window(ready, go, window_start, role: str, number: int) -> float:
    """Tell the monitor this process is ready, then wait for it to open the window: the window's start (epoch s)."""
    ready.put((role, number))
    go.wait()
    return float(window_start.value)


def _agent_process(root: str, url: str | None, number: int, load: Load, seconds: float, ready, go, window_start, out) -> None:
    catalog = Catalog(LocalStore(root), url)
    per_topic = load.partitions // TOPICS
    partitions = np.arange(per_topic, dtype=np.int64)
    keys = [pa.array([b"key-%03d" % k] * per_topic, pa.binary()) for k in range(KEYS)]
    no_timestamps, no_headers = pa.nulls(per_topic, pa.int64()), pa.nulls(per_topic, HEADERS_TYPE)  # the agent's clock stamps them
    value_offsets = pa.py_buffer(np.arange(0, (per_topic + 1) * VALUE_BYTES, VALUE_BYTES, dtype=np.int32))  # a topic's values
    rng = np.random.default_rng(number)

    def produce_tick(agent: Agent, sequence: int) -> list:
        """One interval's records, a record for each partition: the futures of its batches, a topic's each. The tick's
        values are one random buffer, each topic's batch a slice of it under the same offsets (no object per record)."""
        values = pa.py_buffer(rng.bytes(VALUE_BYTES * load.partitions))
        futures = []
        for n, name in enumerate(topic_names()):
            chunk = pa.Array.from_buffers(pa.binary(), per_topic, [None, value_offsets, values.slice(n * per_topic * VALUE_BYTES, per_topic * VALUE_BYTES)])
            columns = pa.RecordBatch.from_arrays([no_timestamps, keys[sequence % KEYS], chunk, no_headers], schema=PRODUCE_SCHEMA)
            futures.append(agent.produce_columns(name, partitions, columns))
        return futures

    # A background agent, as `logcompact agent` runs one: it writes a file per flush interval and commits every
    # file written by then in one transaction when its commits fall behind (group commit).
    keep_freed_memory()  # as `logcompact agent` does at start: freed buffers reused, not faulted in again
    agent = Agent(catalog, flush_interval_ms=load.flush_ms)
    compile_hasher()  # as `logcompact agent` does at start: the key hashes' and sketches' loops load before the first flush
    compile_sketcher()
    for future in produce_tick(agent, 0):  # the first file, written and committed before the window: the warm-up
        future.result()
    warm_up_files = agent.files_written
    # As `logcompact agent` does once started: what the process holds for its life (modules, numba's compiled loops,
    # the catalog's metadata) out of the collector's reach, so its full collections walk only what producing makes.
    gc.collect()
    gc.freeze()
    start_at = _await_window(ready, go, window_start, "agent", number)
    writes = _timed_writes(catalog, start_at, seconds)
    ticks: list[tuple[float, list[float]]] = []  # per tick: (wall time produced, wall time each batch was committed)
    failures = 0
    time.sleep(max(0.0, start_at - time.time()))
    interval = load.flush_ms / 1000
    end = time.monotonic() + seconds
    # Independent producers' records reach their agents at any moment of an interval, so each agent ticks at a phase
    # of its own (drawn from its number); aligned, every agent's file reaches the catalog at once, ten appends queued.
    time.sleep(0.0 if load.aligned else np.random.default_rng(1_000 + number).uniform(0, interval))
    tick = time.monotonic()
    sequence = 1
    while tick < end and time.monotonic() < end:
        produced, committed = time.time(), []
        try:
            for future in produce_tick(agent, sequence):  # a batch that failed is committed at NaN, and counted below
                future.add_done_callback(lambda f, committed=committed: committed.append(time.time() if f.exception() is None else float("nan")))
        except Exception as exc:  # counted and reported; an agent whose flush failed refuses batches, so a new one goes on
            failures += 1
            print(f"agent {number}: {exc}", file=sys.stderr)
            agent, warm_up_files = Agent(catalog, flush_interval_ms=load.flush_ms), 0
        ticks.append((produced, committed))
        sequence += 1
        tick += interval
        time.sleep(max(0.0, tick - time.monotonic()))
    try:
        agent.close()  # the last ticks' batches committed (after the window: they do not count as achieved)
    except Exception as exc:
        failures += 1
        print(f"agent {number}: {exc}", file=sys.stderr)
    failures += sum(1 for _, committed in ticks for at in committed if math.isnan(at))
    done = [(produced, max(committed)) for produced, committed in ticks if len(committed) == TOPICS and not any(map(math.isnan, committed))]
    out.put(("agent", number, {"ticks": done, "failures": failures, "files": agent.files_written - warm_up_files, "writes_ms": writes}))


def _compactor_process(root: str, url: str | None, number: int, seconds: float, ready, go, window_start, out) -> None:
    importlib.import_module("logcompact.engine.cleaner")  # the engine (numba) loads before the window opens
    catalog = Catalog(LocalStore(root), url)
    start_at = _await_window(ready, go, window_start, "compactor", number)
    writes = _timed_writes(catalog, start_at, seconds)
    config = PlannerConfig()
    figures = {"plans": 0, "inputs": 0, "max_lag_plans": 0, "conflicts": 0, "failures": 0, "busy_s": 0.0, "writes_ms": writes}
    time.sleep(max(0.0, start_at - time.time()))
    end = time.monotonic() + seconds
    next_max_lag_pass = time.monotonic() if number == 0 else float("inf")
    while time.monotonic() < end:
        mode = "regular"
        if time.monotonic() >= next_max_lag_pass:
            mode, next_max_lag_pass = "max-lag", next_max_lag_pass + config.max_lag_pass_interval_ms / 1000
        started = time.perf_counter()
        planned = False
        try:
            prepared = prepare_plans(catalog, mode, now_ms(), config)
            planned = bool(prepared.plan_ids)
            if planned:
                run_here(catalog, prepared.plan_ids, prepared.groups, now_ms())
                figures["plans" if mode == "regular" else "max_lag_plans"] += len(prepared.plan_ids)
                figures["inputs"] += sum(estimate["files_replaced"] for estimate in prepared.estimates)
        except CommitConflictError:
            figures["conflicts"] += 1  # the other compactor leased or replaced these files first: plan again
            planned = True
        except Exception as exc:  # counted and reported: the figure is how many compactions failed
            figures["failures"] += 1
            print(f"compactor {number}: {str(exc).splitlines()[0]}", file=sys.stderr)
            planned = True
        if planned:
            figures["busy_s"] += time.perf_counter() - started
        else:
            time.sleep(IDLE_LOOK_AGAIN_S)
    out.put(("compactor", number, figures))


# -- watching the run ---------------------------------------------------------------------------------------------


class Backends:
    """PostgreSQL's processes, each the server's child: listed by the kernel's list of the server's children (one small
    file) rather than psutil's, which reads every process of the machine to find them, each second; their psutil
    handles kept from one sample to the next."""

    def __init__(self) -> None:
        self.known: dict[int, psutil.Process] = {}

    def of(self, server: psutil.Process) -> list[psutil.Process]:
        try:
            pids = [int(pid) for pid in Path(f"/proc/{server.pid}/task/{server.pid}/children").read_text().split()]
        except OSError:  # a kernel without the list
            return server.children(recursive=True)
        processes = []
        for pid in pids:
            process = self.known.get(pid)
            if process is None:
                try:
                    process = self.known[pid] = psutil.Process(pid)
                except psutil.Error:  # gone already
                    continue
            processes.append(process)
        return processes


class CpuGroup:
    """CPU seconds of a group of processes over the window: each process from when the window starts, or from its
    birth for one born later (a PostgreSQL backend); a process that exits keeps what it had at its last sample."""

    def __init__(self, since: float) -> None:
        self.since = since
        self.first: dict[int, float] = {}
        self.last: dict[int, float] = {}

    def sample(self, processes: list[psutil.Process]) -> None:
        for process in processes:
            try:
                times = process.cpu_times()
                used = times.user + times.system
                if process.pid not in self.first:
                    self.first[process.pid] = 0.0 if process.create_time() > self.since else used
                self.last[process.pid] = used
            except psutil.Error:
                continue

    def seconds(self) -> float:
        return sum(self.last[pid] - self.first[pid] for pid in self.last)


@dataclass
class Sample:
    at: float  # seconds into the window
    levels: dict[int, int]
    leased: int


@dataclass
class Lag:
    at: float
    oldest_dirty_s: float  # the oldest dirty record's age, over every partition
    delay_s: float  # max-compaction-delay-secs
    past_max_lag: int  # partitions whose oldest dirty record is past the max lag
    max_lag_s: float


@dataclass
class Figures:
    load: Load
    seconds: float
    asked: float = 0
    achieved: int = 0  # ticks whose every batch was committed within the window
    files: int = 0  # L0 files the agents committed
    failures: int = 0
    latencies_ms: list[float] = field(default_factory=list)  # per tick: produce to commit
    agent_writes_ms: list[float] = field(default_factory=list)  # per write transaction of the agents: BEGIN to COMMIT
    compactors: list[dict] = field(default_factory=list)
    samples: list[Sample] = field(default_factory=list)
    lags: list[Lag] = field(default_factory=list)
    cpu: dict[str, float] = field(default_factory=dict)  # cores used, per group
    machine_busy: float = 0.0
    machine_iowait: float = 0.0
    waits: Counter = field(default_factory=Counter)
    lost: int = 0  # processes that died without reporting their figures
    catalog_bytes: int = 0
    wal_bytes: int = 0  # SQLite's WAL at the end, before it is checkpointed
    live_files: int = 0
    live_sections: int = 0
    section_rows: int = 0
    profiles: list[Profile] = field(default_factory=list)  # the first agent's and the first compactor's, over the window

    def percentile(self, q: float) -> float:
        ordered = sorted(self.latencies_ms)
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] if ordered else float("nan")

    def _backlog(self, extreme) -> tuple[int, int]:
        def over(low: float, high: float) -> int:
            return extreme((s.levels.get(0, 0) for s in self.samples if low <= s.at < high), default=0)
        return over(self.seconds / 3, 2 * self.seconds / 3), over(2 * self.seconds / 3, self.seconds + 1)

    def backlog_peaks(self) -> tuple[int, int]:
        """The L0 backlog's peak over the window's middle third and over its last third."""
        return self._backlog(max)

    def backlog_troughs(self) -> tuple[int, int]:
        """The L0 backlog's low over the window's middle third and over its last third: where each compaction
        brings it back down to."""
        return self._backlog(min)

    def bounded(self) -> bool:
        """Compaction takes L0 in large bites, so a backlog that keeps up rises and falls by a plan's worth of files
        or more (a sawtooth): it is bounded when its lows do not climb, by more than one L0 plan's minimum."""
        middle, last = self.backlog_troughs()
        return last <= middle + PlannerConfig().min_files[0]

    def past_max_lag(self) -> int:
        return max((lag.past_max_lag for lag in self.lags), default=0)

    def checks(self) -> list[tuple[str, bool]]:
        achieved = self.achieved / self.asked if self.asked else 0.0
        return [
            (f"appends achieved {100 * achieved:.0f}% of asked (>= {100 * HOLDS_ACHIEVED:.0f}%)", achieved >= HOLDS_ACHIEVED),
            (f"produce to commit p99 {self.percentile(0.99):,.0f} ms (<= the {self.load.flush_ms} ms interval + {HOLDS_P99_MS:.0f} ms)",
             self.percentile(0.99) <= self.load.flush_ms + HOLDS_P99_MS),
            (f"L0 backlog {'bounded' if self.bounded() else 'growing'} (lows {self.backlog_troughs()[0]:,} then {self.backlog_troughs()[1]:,})",
             self.bounded()),
            (f"{self.past_max_lag()} partitions past their max lag", self.past_max_lag() == 0),
            (f"{self.failures} failed appends, {self.lost} processes lost", self.failures == 0 and self.lost == 0),
        ]

    def holds(self) -> bool:
        return all(ok for _, ok in self.checks())

    def binding(self) -> str:
        """What bound this load: the CPU when the machine was busy; else on SQLite its one writer at a time, and on
        PostgreSQL the commits' waits on each other's locks, or, when its sessions mostly wait on their own client
        mid-transaction, the length of one append's commit."""
        cores = os.cpu_count() or 1
        groups = ", ".join(f"{name} {used:.2f}" for name, used in self.cpu.items())
        if self.machine_busy >= CPU_BOUND_BUSY:
            heaviest = max(self.cpu, key=lambda name: self.cpu[name])
            return (f"CPU: the machine {100 * self.machine_busy:.0f}% busy; {heaviest} used the most "
                    f"({self.cpu[heaviest]:.2f} of {cores} cores; {groups})")
        busy = [c["busy_s"] / self.seconds for c in self.compactors]
        compacting = (f"; the compactors were busy {', '.join(f'{100 * b:.0f}%' for b in busy)} of the window"
                      if not self.bounded() and busy and min(busy) >= 0.9 else "")
        machine = f"the machine {100 * self.machine_busy:.0f}% busy ({100 * self.machine_iowait:.0f}% iowait; {groups})"
        if not self.waits:
            return f"the database, not the CPU: {machine} while the agents waited on their commits; SQLite takes one writer at a time{compacting}"
        total = sum(self.waits.values())
        waited = "PostgreSQL's busy sessions: " + ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in self.waits.most_common(4))
        locked = sum(n for name, n in self.waits.items() if name.startswith("Lock:"))
        on_client = sum(n for name, n in self.waits.items() if name.startswith(("in a transaction", "Client:")))
        if on_client > locked:
            return (f"the length of one append's commit, not the CPU nor other writers: {machine}; its transaction waits "
                    f"mostly on its own client's work between statements; {waited}{compacting}")
        return f"the database, not the CPU: {machine} while the commits waited on each other's row locks; {waited}{compacting}"


def catalog_size(catalog: Catalog) -> tuple[int, int, int, int, int]:
    """The catalog's bytes of tables and indexes (SQLite's pages in use once its WAL is checkpointed, or PostgreSQL's
    database), SQLite's WAL before that checkpoint, live files, live sections and all section rows (retired ones stay
    until garbage collection)."""
    engine = catalog.engine
    wal = 0
    if engine.dialect.name == "sqlite":
        path = Path(engine.url.database or "")
        wal_file = path.with_name(path.name + "-wal")
        wal = wal_file.stat().st_size if wal_file.exists() else 0
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as connection:  # outside any transaction
            connection.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    with engine.connect() as connection:
        live_files = connection.execute(text("SELECT count(*) FROM files WHERE removed_version IS NULL")).scalar_one()
        live_sections = connection.execute(text(
            "SELECT count(*) FROM sections JOIN files ON files.file_id = sections.file_id WHERE files.removed_version IS NULL"
        )).scalar_one()
        rows = connection.execute(text("SELECT count(*) FROM sections")).scalar_one()
        if engine.dialect.name == "sqlite":
            pages = connection.exec_driver_sql("PRAGMA page_count").scalar_one()
            free = connection.exec_driver_sql("PRAGMA freelist_count").scalar_one()
            size = (pages - free) * connection.exec_driver_sql("PRAGMA page_size").scalar_one()
        else:
            size = connection.execute(text("SELECT pg_database_size(current_database())")).scalar_one()
    return size, wal, live_files, live_sections, rows


def measure_lag(catalog: Catalog, at: float) -> Lag:
    """The oldest dirty record and how far past its max lag, over every partition, by the max-lag planner's test."""
    snapshot = catalog.snapshot()
    now = now_ms()
    topics = max_lag_topics(snapshot)
    lags = {name: effective_max_lag(snapshot, name) for name in topics}
    oldest, delay, past = 0.0, 0.0, 0
    for dirty in dirty_partitions(snapshot, topics, PlannerConfig()):
        oldest = max(oldest, (now - (dirty.dirty_since - lags[dirty.topic])) / 1000)
        delay = max(delay, (now - dirty.dirty_since) / 1000)
        past += now > dirty.dirty_since
    return Lag(at, oldest, delay, past, max(lags.values(), default=MIN_MAX_COMPACTION_LAG_MS) / 1000)


def appends_so_far(catalog: Catalog) -> int:
    """L0 files committed so far: each append adds one, and its row stays (retired or not) until garbage collection."""
    with catalog.engine.connect() as connection:
        return connection.execute(text("SELECT count(*) FROM files WHERE level = 0")).scalar_one()


def print_line(sample: Sample, lag: Lag, appends: int) -> None:
    levels = "  ".join(f"L{level} {count:>5,}" for level, count in sorted(sample.levels.items()) if level)
    lagged = f"oldest dirty {lag.oldest_dirty_s:5.0f} s, max-compaction-delay-secs {lag.delay_s:.0f}"
    print(f"  {sample.at:5.0f} s  L0 {sample.levels.get(0, 0):>6,}  {levels:<24} leased to plans {sample.leased:>4,}  "
          f"{lagged}, appends so far {appends:,}", flush=True)


def run(name: str, url: str | None, store_root: Path, load: Load, seconds: float, postgres: ThrowAwayPostgres | None) -> Figures:
    store = LocalStore(store_root)
    catalog = Catalog(store, url)
    catalog.ensure_created(now_ms())
    per_topic = load.partitions // TOPICS
    for topic in topic_names():
        config = {"cleanup.policy": "compact", "max.compaction.lag.ms": str(MIN_MAX_COMPACTION_LAG_MS)}
        catalog.create_topic(Topic.create(topic, per_topic, config, now_ms()), now_ms())
    print(f"\n{name} ({catalog.engine.url.render_as_string()}): {load.describe()}, {seconds:.0f} s; "
          f"load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    context = multiprocessing.get_context("spawn")
    out, ready, go, window_start = context.Queue(), context.Queue(), context.Event(), context.Value("d", 0.0)
    processes: list[BaseProcess] = [
        context.Process(target=_agent_process, args=(str(store_root), url, n, load, seconds, ready, go, window_start, out), daemon=True)
        for n in range(load.agents)
    ]
    processes += [
        context.Process(target=_compactor_process, args=(str(store_root), url, n, seconds, ready, go, window_start, out), daemon=True)
        for n in range(load.compactors)
    ]
    figures = Figures(load, seconds, asked=load.appends_per_s * seconds)
    try:
        # The agents' interpreters load pyarrow with Arrow's pool named in their environment, as `logcompact agent`'s
        # do (kafka/allocator.py); the compactors' with the environment this process was given.
        given = dict(os.environ)
        arrow_allocates_from_the_system()
        for process in processes[: load.agents]:
            process.start()
        os.environ.clear()
        os.environ.update(given)
        for process in processes[load.agents:]:
            process.start()
        start_at = open_window(processes, ready, go, window_start)
        with ExitStack() as profiling:
            sampled_processes = [("agent", processes[0])] + ([("compactor", processes[load.agents])] if load.compactors else [])
            for role, process in sampled_processes:
                if process.pid is not None:
                    figures.profiles.append(profiling.enter_context(sampled(process.pid, f"the first {role} over the window", rate=PROFILE_RATE)))
            watch(catalog, processes, load, start_at, seconds, postgres, figures)
        results = collect(out, processes)
    finally:
        go.set()  # a process still waiting for the window goes on to its end (or is stopped below)
        for process in processes:  # stopped by their PIDs, whatever happened
            if process.is_alive():
                process.terminate()
            process.join(30)
            if process.is_alive():
                process.kill()
                process.join()
    end = start_at + seconds
    figures.lost = len(processes) - len(results)
    for kind, _number, result in results:
        if kind == "agent":
            figures.achieved += sum(1 for _, committed in result["ticks"] if committed <= end)
            figures.latencies_ms += [1000 * (committed - produced) for produced, committed in result["ticks"]]
            figures.files += result["files"]
            figures.failures += result["failures"]
            figures.agent_writes_ms += result["writes_ms"]
        else:
            figures.compactors.append(result)
    figures.catalog_bytes, figures.wal_bytes, figures.live_files, figures.live_sections, figures.section_rows = catalog_size(catalog)
    catalog.engine.dispose()
    report(figures)
    return figures


def open_window(processes: list[BaseProcess], ready, go, window_start) -> float:
    """The window's start (epoch s): a moment after every agent has committed its first file and every compactor has
    loaded the engine. Spawned interpreters import pyarrow, SQLAlchemy and the engine and compile numba's loops first,
    which on a busy machine of two cores takes longer than a minute for ten agents: a window opened on a fixed delay
    measured their start-up, not the regime."""
    started = time.monotonic()
    waiting = len(processes)
    while waiting:
        try:
            ready.get(timeout=5)
            waiting -= 1
        except queue.Empty:
            dead = [p for p in processes if not p.is_alive()]
            if dead:
                raise SystemExit(f"{len(dead)} of the agent and compactor processes exited (codes {', '.join(str(p.exitcode) for p in dead)}) "
                                 "before the window opened: see their errors above") from None
            if time.monotonic() - started > READY_TIMEOUT_S:
                raise SystemExit(f"{waiting} of {len(processes)} agent and compactor processes not ready after {READY_TIMEOUT_S} s: "
                                 "the machine is too busy for this load") from None
    start_at = time.time() + WINDOW_MARGIN_S
    window_start.value = start_at
    go.set()
    print(f"  the window opens {time.monotonic() - started + WINDOW_MARGIN_S:.0f} s after the processes started: when every agent "
          f"had committed its first file (a warm-up, not counted) and every compactor had loaded the engine", flush=True)
    return start_at


def collect(out, processes: list[BaseProcess]) -> list[tuple[str, int, dict]]:
    """Each process's figures, as they come; a process that died without them is left out (and counted)."""
    results: list[tuple[str, int, dict]] = []
    deadline = time.monotonic() + 600  # a compactor finishes the plan it is running
    while len(results) < len(processes) and time.monotonic() < deadline:
        try:
            results.append(out.get(timeout=5))
        except queue.Empty:
            if not any(process.is_alive() for process in processes):
                break
    return results


def watch(catalog: Catalog, processes: list[BaseProcess], load: Load, start_at: float, seconds: float,
          postgres: ThrowAwayPostgres | None, figures: Figures) -> None:
    """Sample the backlog, CPU and PostgreSQL's waits every second of the window; a backlog and lag line every 30 s."""
    time.sleep(max(0.0, start_at - time.time()))
    agents = [psutil.Process(p.pid) for p in processes[: load.agents] if p.pid]
    compactors = [psutil.Process(p.pid) for p in processes[load.agents:] if p.pid]
    groups = {name: CpuGroup(start_at) for name in ("agents", "compactors", "database", "monitor")}
    server = psutil.Process(postgres.pid) if postgres is not None and postgres.pid else None
    backends = Backends()
    me = psutil.Process()

    def sample_cpu() -> None:
        groups["agents"].sample(agents)
        groups["compactors"].sample(compactors)
        groups["monitor"].sample([me])
        if server is not None:
            groups["database"].sample([server, *backends.of(server)])

    machine_before = psutil.cpu_times()
    sample_cpu()
    next_print = PRINT_S
    while (at := time.time() - start_at) < seconds:
        snapshot = catalog.snapshot()
        sample = Sample(at, snapshot.level_counts(), len(snapshot.leased_files(now_ms())))
        figures.samples.append(sample)
        sample_cpu()
        if server is not None:
            with catalog.engine.connect() as connection:
                for state, wait_type, wait_event, count in connection.execute(text(
                    "SELECT state, wait_event_type, wait_event, count(*) FROM pg_stat_activity WHERE state IN "
                    "('active', 'idle in transaction') AND backend_type = 'client backend' AND pid <> pg_backend_pid() GROUP BY 1, 2, 3"
                )):
                    waiting = f"{wait_type}:{wait_event}" if wait_type else "on CPU"
                    figures.waits["in a transaction, waiting for its client" if state != "active" else waiting] += count
        if at >= next_print:
            lag = measure_lag(catalog, at)
            figures.lags.append(lag)
            print_line(sample, lag, appends_so_far(catalog))
            next_print += PRINT_S
        time.sleep(max(0.0, SAMPLE_S - (time.time() - start_at - at)))
    sample_cpu()
    machine_after = psutil.cpu_times()
    elapsed = {name: getattr(machine_after, name) - getattr(machine_before, name) for name in machine_after._fields}
    total = sum(elapsed.values())
    figures.machine_busy = 1 - (elapsed["idle"] + elapsed.get("iowait", 0.0)) / total if total else 0.0
    figures.machine_iowait = elapsed.get("iowait", 0.0) / total if total else 0.0
    figures.cpu = {name: group.seconds() / seconds for name, group in groups.items() if name != "database" or server is not None}
    lag = measure_lag(catalog, seconds)
    figures.lags.append(lag)
    snapshot = catalog.snapshot()
    final = Sample(seconds, snapshot.level_counts(), len(snapshot.leased_files(now_ms())))
    figures.samples.append(final)
    print_line(final, lag, appends_so_far(catalog))


def report(f: Figures) -> None:
    seconds = f.seconds
    print(f"  appends: asked {f.asked:,.0f} ({f.asked / seconds:.1f}/s), achieved {f.achieved:,} ({f.achieved / seconds:.1f}/s), "
          f"{f.failures} failed" + (f"; {f.lost} processes died without their figures (see above)" if f.lost else ""))
    print(f"  produce to commit (a record waits up to the {f.load.flush_ms} ms flush interval, then its file's write and "
          f"commit): p50 {f.percentile(0.5):,.0f} ms, p99 {f.percentile(0.99):,.0f} ms, "
          f"max {max(f.latencies_ms, default=float('nan')):,.0f} ms over {len(f.latencies_ms):,} ticks; {f.files:,} L0 files committed")
    plans = sum(c["plans"] for c in f.compactors)
    busy = ", ".join(f"{100 * c['busy_s'] / seconds:.0f}%" for c in f.compactors)
    print(f"  compactions: {plans} regular plans committed ({sum(c['inputs'] for c in f.compactors):,} files in), "
          f"{sum(c['max_lag_plans'] for c in f.compactors)} max-lag plans, {sum(c['conflicts'] for c in f.compactors)} lease conflicts, "
          f"{sum(c['failures'] for c in f.compactors)} failures; compactors busy {busy} of the time")
    compactor_writes = [ms for c in f.compactors for ms in c["writes_ms"]]
    print(f"  write transactions, BEGIN to COMMIT (on SQLite the one writer held throughout): agents' {_spread(f.agent_writes_ms)}; "
          f"compactors' {_spread(compactor_writes)}")
    (middle, last), (low_middle, low_last) = f.backlog_peaks(), f.backlog_troughs()
    backlog = [s.levels.get(0, 0) for s in f.samples]
    print(f"  L0 backlog (live L0 files): median {statistics.median(backlog) if backlog else 0:,.0f}; over the middle third, then "
          f"the last: lows {low_middle:,} then {low_last:,}, peaks {middle:,} then {last:,}: {'bounded' if f.bounded() else 'growing'}")
    lag = f.lags[-1] if f.lags else None
    if lag is not None:
        ages = [x.oldest_dirty_s for x in f.lags]
        print(f"  compaction lag: max-compaction-delay-secs {max(x.delay_s for x in f.lags):.0f} (max.compaction.lag.ms "
              f"{lag.max_lag_s:,.0f} s); oldest dirty record {lag.oldest_dirty_s:,.0f} s old at the end "
              f"(every 30 s and at the end: {', '.join(f'{a:.0f}' for a in ages)}); partitions past their max lag: {f.past_max_lag()}")
    wal = f", and a WAL of {f.wal_bytes / 1e6:,.1f} MB before a checkpoint" if f.wal_bytes else ""
    print(f"  catalog at the end: {f.catalog_bytes / 1e6:,.1f} MB of tables and indexes{wal}; {f.live_files:,} live files, "
          f"{f.live_sections:,} live sections, {f.section_rows:,} section rows (retired ones kept until gc), "
          f"{f.catalog_bytes / max(1, f.section_rows):,.0f} B a section row")
    cores = ", ".join(f"{name} {used:.2f}" for name, used in f.cpu.items())
    print(f"  CPU (cores of {os.cpu_count()}): {cores}; machine {100 * f.machine_busy:.0f}% busy, {100 * f.machine_iowait:.0f}% iowait")
    if f.waits:
        total = sum(f.waits.values())
        print("  PostgreSQL's sessions in a statement or a transaction, sampled each second: "
              + ", ".join(f"{name} {100 * n / total:.0f}%" for name, n in f.waits.most_common(6)))
    print("  verdict: " + ("HOLDS" if f.holds() else "DOES NOT HOLD") + ": " + "; ".join(
        f"{what} {'ok' if ok else 'MISSED'}" for what, ok in f.checks()))
    if not f.holds():
        print(f"  bound by {f.binding()}; what would close it: bench/README.md, Where the misses come from")
        for profile in f.profiles:
            print("  " + profile.summary().replace("\n", "\n  "))


def _spread(milliseconds: list[float]) -> str:
    if not milliseconds:
        return "none"
    ordered = sorted(milliseconds)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    return f"{len(ordered):,}, p50 {statistics.median(ordered):,.1f} ms, p99 {p99:,.1f} ms, max {ordered[-1]:,.1f} ms"


# -- main ---------------------------------------------------------------------------------------------------------


def run_step(database: str, postgres: ThrowAwayPostgres | None, load: Load, seconds: float) -> Figures:
    """One run of a load on a new catalog: a new store directory, and on PostgreSQL a new database."""
    with tempfile.TemporaryDirectory(prefix="logcompact-regime-") as tmp:
        url = postgres.new_database(f"regime_{uuid.uuid4().hex[:12]}") if postgres is not None else None
        return run("PostgreSQL" if postgres else "SQLite", url, Path(tmp), load, seconds, postgres)


def bench(database: str, load: Load, seconds: float, find_load: bool) -> None:
    postgres = None
    try:
        if database == "postgresql":
            postgres = ThrowAwayPostgres()
            postgres.start()
        steps = [load] + [replace(load, agents=n) for n in AGENT_STEPS if n < load.agents]
        steps += [replace(load, agents=1, partitions=n) for n in PARTITION_STEPS if n < load.partitions]
        if not find_load:
            run_step(database, postgres, load, seconds)
            return
        # Down the ladder to the first load at or below the records a second the failed run achieved (a run that kept
        # up with a tenth of its appends is not tried again at 80%), then back up between the two by halves.
        failed: tuple[int, Figures] | None = None
        held: tuple[int, Figures] | None = None
        index = 0
        while index < len(steps):
            figures = run_step(database, postgres, steps[index], seconds)
            if figures.holds():
                held = (index, figures)
                break
            failed = (index, figures)
            achieved = steps[index].records_per_s * min(1.0, figures.achieved / figures.asked if figures.asked else 0.0)
            index = next((j for j in range(index + 1, len(steps)) if steps[j].records_per_s <= achieved), index + 1)
        while held is not None and failed is not None and held[0] - failed[0] > 1:
            middle = (held[0] + failed[0]) // 2
            figures = run_step(database, postgres, steps[middle], seconds)
            if figures.holds():
                held = (middle, figures)
            else:
                failed = (middle, figures)
        if held is None:
            print(f"\n{database}: no load held, down to {steps[-1].describe()}")
            return
        step = steps[held[0]]
        print(f"\n{database}: the largest load that held: {step.describe()} ({step.appends_per_s:g} appends/s, "
              f"{step.records_per_s:,.0f} records/s)"
              + (f"; the one above it, {failed[1].load.describe()}, was bound by {failed[1].binding()}" if failed else ""))
    finally:
        if postgres is not None:
            postgres.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database", choices=["sqlite", "postgresql"], action="append", help="repeatable; default both")
    parser.add_argument("--agents", type=int, default=10)
    parser.add_argument("--partitions", type=int, default=1_000, help=f"a multiple of {TOPICS}: {TOPICS} topics share them")
    parser.add_argument("--flush-ms", type=int, default=250, help="each agent writes and commits a file this often")
    parser.add_argument("--compactors", type=int, default=2)
    parser.add_argument("--aligned", action="store_true", help="every agent ticks at once (their files reach the catalog together)")
    parser.add_argument("--seconds", type=float, default=600, help="the window measured (each step's, with --find-load)")
    parser.add_argument("--find-load", action="store_true", help="step the agents down until the regime holds")
    args = parser.parse_args()
    if args.partitions < TOPICS or args.partitions % TOPICS:
        parser.error(f"--partitions must be a positive multiple of {TOPICS}")
    # A SIGTERM runs the finally blocks and atexit: the processes started here are stopped, the server too.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    print(f"machine: {machine()}")
    load = Load(args.agents, args.partitions, args.flush_ms, args.compactors, args.aligned)
    for database in args.database or ["sqlite", "postgresql"]:
        bench(database, load, args.seconds, args.find_load)
    print(f"\nmachine at the end: {machine()}")


if __name__ == "__main__":
    with recorded():
        main()
