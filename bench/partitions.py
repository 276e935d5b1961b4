"""What each topic-partition in a file costs: the format, ingest, compaction and consume, on one core.

    .venv/bin/python bench/partitions.py                                   # 10, 1,000 and 10,000 partitions, 3 runs
    .venv/bin/python bench/partitions.py --partitions 10,1000 --runs 1 --skip-big      # a quick look
    .venv/bin/python bench/partitions.py --skip-files                      # the reads: first record, latest_values

For each count N of partitions per L0 file (topics of at most 1,000 partitions, all compacted), agents write
--files L0 files (32 by default), each holding every partition with 3 records: 16-byte keys (the same 3 keys
of a partition in every file) and 120-byte values from os.urandom, so 408 bytes of keys and values per
section that compression cannot shrink. Printed, medians:

* file overhead per section: (file bytes - key and value bytes) / sections, over the L0 files;
* produce one L0 file: Agent.produce of the N x 3 records and flush (the file written and committed), one
  measurement per file;
* consume one partition of one such file (read while it is the only file): store GETs and the time of a
  snapshot and read_batches, over 20 partitions spread across the file;
* L0 to L1 per section: `run_plan` of a copying plan (target level 1, no deduplication) over all the L0
  files, divided by their sections; outputs deleted between runs;
* L1 to L2 (dedup) per section: each L0 file copied alone into an L1 file, then a deduplicating plan
  (target level 2) over those L1 files, divided by their sections.

The big case (--skip-big leaves it out): one partition of --big-records records (10 million by default) over
--big-keys keys (1 million; every key the same number of times, in random order), written by an agent as
--big-files L0 files (100), then deduplicated by a full sweep (planner and commit) into one section:

* `latest_values` of the partition in a fresh process, over the L0 files and then over the one section:
  time and memory growth (peak RSS after, minus RSS before);
* consume from the middle of that section (read_batches from the offset halfway between its first and
  last): time to the first record and bytes read from the store.

The deep partitions (--skip-deep leaves them out): one partition per count in --deep-sections (40 and 40,000 by
default), each of that many sections of 3 records at L2, the first a real file's and the others catalog rows only
(their objects are never read), and two more of the largest count: one whose first section has holes, as
compaction leaves them, and one whose every other section a compaction dropped whole (its gaps between sections
recorded as holes, which a reader asks for: a query a page); above them an L0 backlog of 300 files (rows only) each holding a section of every deep partition:
the time to a partition's first record, from a fresh snapshot to read_batches' first table from the partition's
start, median of 20, against the target of <= 5 ms at both counts.

The size and write time of a full plan over 100,000 files are bench/planner.py's; the engine against the
I/O floor is bench/engine.py's. The process (and every child) is pinned to one CPU, Arrow to one thread.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path

import numpy as np
import pyarrow as pa
from profiling import sampled
from results import recorded

from logcompact.catalog import Catalog, DataFile, NewFile
from logcompact.consume import latest_values, read_batches
from logcompact.engine.cleaner import run_plan
from logcompact.format import section_table, write_segment
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.planner import choose_plans as make_plans
from logcompact.plans import Plan
from logcompact.store import LocalStore
from logcompact.topics import Topic

NOW = 1_700_000_000_000
KEY_BYTES = 16
VALUE_BYTES = 120
RECORDS_PER_SECTION = 3
PARTITIONS_PER_TOPIC = 1_000
CONSUMED_PARTITIONS = 20
BIG_TOPIC = "big"
WARM_TOPIC = "warm"  # one record, read first by the latest_values child
LATEST_VALUES_TARGET_S = 2.5  # 10 million records, of 100 files or of one section
DEEP_TOPIC = "deep"
DEEP_LEVEL = 2  # where a partition's many sections are, as compaction leaves them
DEEP_L0_FILES = 300  # the L0 backlog above them: agents' newest files, each holding every deep partition
FIRST_RECORD_RUNS = 20
VALUE_POOL = 1 << 16  # distinct random values of the big case: too many for LZ4's 64 KiB window to repeat
TARGETS = {
    "overhead": "<= 100 B",
    "produce": "<= 200 ms at 10,000",
    "consume": "1 GET, <= 10 ms",
    "copy": "<= 30 us",
    "dedup": "<= 60 us",
}


def pin(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)


def _key(topic: int, partition: int, number: int) -> bytes:
    return b"t%02dp%04dk%07d" % (topic, partition, number)  # KEY_BYTES


def _topics(partitions: int) -> list[Topic]:
    """`partitions` partitions over topics of at most PARTITIONS_PER_TOPIC, as clusters spread them."""
    sizes = [PARTITIONS_PER_TOPIC] * (partitions // PARTITIONS_PER_TOPIC)
    if partitions % PARTITIONS_PER_TOPIC:
        sizes.append(partitions % PARTITIONS_PER_TOPIC)
    return [Topic.create(f"t{number:02d}", size, {"cleanup.policy": "compact"}, NOW) for number, size in enumerate(sizes)]


def _copy_plan(files: list[DataFile], topics: dict[str, Topic], target_level: int, deduplicate: bool) -> Plan:
    return Plan(
        plan_id=f"bench-{uuid.uuid4().hex[:12]}", cluster_id="bench", manifest_version=1, now_ms=NOW + 1_000,
        target_level=target_level, deduplicate=deduplicate, inputs=tuple(files), topics=topics,
    )


def _timed_runs(store: LocalStore, make: Callable[[], Plan], runs: int, expected_records_out: int) -> float:
    """Median seconds of `run_plan` over fresh plans from `make()`; every run's outputs are deleted."""
    timings = []
    for _ in range(runs):
        job = make()
        started = time.perf_counter()
        result = run_plan(store, job)
        timings.append(time.perf_counter() - started)
        if result.stats.records_out != expected_records_out:
            raise SystemExit(f"bench: {result.stats.records_out:,} records out, expected {expected_records_out:,}")
        for output in result.outputs:
            store.delete(output.key)
    return statistics.median(timings)


def partitions_case(partitions: int, files: int, runs: int, compaction: bool, work: Path) -> dict[str, str]:
    store = LocalStore(work / f"n{partitions}")
    catalog = Catalog(store)
    catalog.ensure_created(NOW)
    topics = _topics(partitions)
    for topic in topics:
        catalog.create_topic(topic, NOW)
    batches = [
        (number, topic, [
            Record(partition, _key(number, partition, k), os.urandom(VALUE_BYTES), NOW)
            for partition in range(topic.partitions) for k in range(RECORDS_PER_SECTION)
        ])
        for number, topic in enumerate(topics)
    ]
    payload = partitions * RECORDS_PER_SECTION * (KEY_BYTES + VALUE_BYTES)
    produce_times, consume_times, consume_gets = [], [], set()
    with Agent(catalog, background=False, clock=lambda: NOW, flush_bytes=1 << 40) as agent:
        for number in range(files):
            started = time.perf_counter()
            for _, topic, records in batches:
                agent.produce(topic.name, records)
            agent.flush()
            produce_times.append(time.perf_counter() - started)
            if number == 0:
                spread = sorted({(i * partitions) // CONSUMED_PARTITIONS for i in range(CONSUMED_PARTITIONS)})
                for slot in spread:
                    topic = topics[slot // PARTITIONS_PER_TOPIC]
                    before = store.counters.snapshot()
                    started = time.perf_counter()
                    rows = sum(t.num_rows for t in read_batches(store, catalog.snapshot(), topic.name, slot % PARTITIONS_PER_TOPIC))
                    consume_times.append(time.perf_counter() - started)
                    consume_gets.add((store.counters.snapshot() - before).get)
                    if rows != RECORDS_PER_SECTION:
                        raise SystemExit(f"bench: read {rows} records of {topic.name}/{slot}, expected {RECORDS_PER_SECTION}")
    print(f"  {partitions:,} partitions: {files} L0 files written, {sum(produce_times):.1f} s", flush=True)
    snapshot = catalog.snapshot()
    l0 = snapshot.files()
    overheads = [(f.size - payload) / partitions for f in l0]
    figures = {
        "overhead": f"{statistics.median(overheads):,.0f} B",
        "produce": _duration(statistics.median(produce_times)),
        "consume": f"{'/'.join(map(str, sorted(consume_gets)))} GET, {_duration(statistics.median(consume_times))}",
    }
    if compaction:
        described = snapshot.topics
        sections = files * partitions
        copy = _timed_runs(store, lambda: _copy_plan(l0, described, 1, False), runs, sections * RECORDS_PER_SECTION)
        figures["copy"] = f"{copy / sections * 1e6:,.0f} us"
        l1 = [out for f in l0 for out in run_plan(store, _copy_plan([f], described, 1, False)).outputs]
        dedup = _timed_runs(store, lambda: _copy_plan(l1, described, 2, True), runs, partitions * RECORDS_PER_SECTION)
        figures["dedup"] = f"{dedup / sections * 1e6:,.0f} us"
    catalog.engine.dispose()
    return figures


def _duration(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    return f"{seconds * 1000:.1f} ms" if seconds < 0.1 else f"{seconds * 1000:.0f} ms"


# -- deep partitions: the first record ------------------------------------------------------------------


def deep_case(counts: list[int], work: Path) -> list[tuple[str, str, str]]:
    """The time to the first record of partitions of `counts` sections, and of two of the largest count: one whose
    first section has holes, as compaction leaves them (so a reader also asks for sections spanning them), and one
    whose every other section after the first was dropped by a commit replacing their files with none (so a reader
    asks for the holes recorded between its sections). Each partition's first section is a real file's (one file
    holds them all); the others are rows appended to the catalog in batches of 2,000 files, as agents commit them,
    whose objects are never read."""
    store = LocalStore(work / "deep")
    catalog = Catalog(store)
    catalog.ensure_created(NOW)
    cases = [(count, "") for count in counts] + [(max(counts), "holes"), (max(counts), "apart")]
    catalog.create_topic(Topic.create(DEEP_TOPIC, len(cases), {"cleanup.policy": "compact"}, NOW), NOW)
    heads = []
    for partition, (_, kind) in enumerate(cases):
        deltas = np.arange(RECORDS_PER_SECTION) * (2 if kind == "holes" else 1)
        keys = [_key(0, partition, k) for k in range(RECORDS_PER_SECTION)]
        heads.append((DEEP_TOPIC, partition, section_table(deltas, [NOW] * RECORDS_PER_SECTION, keys, [os.urandom(VALUE_BYTES) for _ in keys])))
    blob, infos = write_segment(heads)
    store.put("data/l0/deep-heads.seg", blob)
    catalog.append_files([NewFile("data/l0/deep-heads.seg", DEEP_LEVEL, len(blob), NOW, tuple(infos))], NOW)
    dense = infos[0]
    fillers = [
        NewFile(f"data/l0/deep-{partition}-{n:06d}.seg", DEEP_LEVEL, 10_000, NOW, (dense._replace(partition=partition),))
        for partition, (count, _) in enumerate(cases) for n in range(count - 1)
    ]
    backlog = [
        NewFile(f"data/l0/deep-backlog-{n:06d}.seg", 0, 10_000, NOW, tuple(dense._replace(partition=p) for p in range(len(cases))))
        for n in range(DEEP_L0_FILES)
    ]
    started = time.perf_counter()
    for first in range(0, len(fillers), 2_000):
        catalog.append_files(fillers[first : first + 2_000], NOW)
    catalog.append_files(backlog, NOW)
    apart = len(cases) - 1
    dropped = [f.key for f in fillers if f.sections[0].partition == apart][::2]
    catalog.replace_files(dropped, [], NOW)
    print(f"  deep partitions: {len(fillers):,} rows at L{DEEP_LEVEL} and {len(backlog) * len(cases):,} in {len(backlog)} L0 files "
          f"appended in {time.perf_counter() - started:.0f} s", flush=True)
    timings: list[list[float]] = [[] for _ in cases]
    for _ in range(FIRST_RECORD_RUNS):  # the partitions in turn, so that the machine's load falls on each alike
        for partition in range(len(cases)):
            started = time.perf_counter()
            first = next(read_batches(store, catalog.snapshot(), DEEP_TOPIC, partition))
            timings[partition].append(time.perf_counter() - started)
            if first.column("offset")[0].as_py() != 0:
                raise SystemExit(f"bench: the first record of {DEEP_TOPIC}/{partition} is not at offset 0")
    rows = []
    for partition, (count, kind) in enumerate(cases):
        held = len(catalog.snapshot().sections_of(DEEP_TOPIC, partition)) - len(backlog)
        expected = count - len(dropped) if kind == "apart" else count
        if held != expected:
            raise SystemExit(f"bench: {DEEP_TOPIC}/{partition} holds {held:,} sections, expected {expected:,}")
        label = f"first record of a partition of {count:,} sections, from its start"
        label += {"": "", "holes": ", its first section with holes", "apart": f", every other one dropped ({held:,} left, holes between)"}[kind]
        rows.append((label, _duration(statistics.median(timings[partition])), "<= 5 ms"))
    catalog.engine.dispose()
    return rows


# -- the big partition --------------------------------------------------------------------------------


def _memory(field: str) -> int:
    """A line of /proc/self/status in bytes: VmRSS (resident now) or VmHWM (peak resident)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise SystemExit(f"bench: /proc/self/status has no {field}")


def _latest_values_in_child(root: str, cpu: int) -> tuple[float, float, int, int, str]:
    """In a fresh process: seconds of latest_values, wall and CPU, growth of the process (bytes), rows returned, its
    profile.

    A first call on a one-record topic loads what any call loads once (Arrow's kernels); then the peak
    resident size is reset (clear_refs) so the growth is this call's."""
    pin(cpu)
    catalog = Catalog(LocalStore(Path(root)))
    snapshot = catalog.snapshot()
    latest_values(catalog.store, snapshot, WARM_TOPIC, 0)
    with open("/proc/self/clear_refs", "w") as clear_refs:
        clear_refs.write("5")
    resident_before = _memory("VmRSS")
    with sampled(label="latest_values") as profile:  # py-spy on the other cores: it takes nothing from this one
        started, cpu_started = time.perf_counter(), time.process_time()
        view = latest_values(catalog.store, snapshot, BIG_TOPIC, 0)
        seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - cpu_started
    return seconds, cpu_seconds, max(0, _memory("VmHWM") - resident_before), view.num_rows, profile.summary()


def _latest_values(root: Path, cpu: int, runs: int, keys: int, what: str) -> str:
    """The median time (wall, and CPU: what compares code on a loaded machine) and memory growth of `runs` calls, each
    in a fresh process; the profile of the last printed when the median misses LATEST_VALUES_TARGET_S."""
    timings, cpu_timings, growths = [], [], []
    for _ in range(runs):
        with ProcessPoolExecutor(1, mp_context=get_context("spawn")) as child:
            seconds, cpu_seconds, growth, rows, profile = child.submit(_latest_values_in_child, str(root), cpu).result()
        if rows != keys:
            raise SystemExit(f"bench: latest_values returned {rows:,} keys, expected {keys:,}")
        timings.append(seconds)
        cpu_timings.append(cpu_seconds)
        growths.append(growth)
    if statistics.median(timings) > LATEST_VALUES_TARGET_S:
        print(f"  latest_values {what}: {_duration(statistics.median(timings))}, target <= {LATEST_VALUES_TARGET_S:g} s MISSED; what "
              f"would close it: bench/README.md, Where the misses come from\n  " + profile.replace("\n", "\n  "), flush=True)
    return f"{_duration(statistics.median(timings))} (CPU {_duration(statistics.median(cpu_timings))}), +{statistics.median(growths) / 1e6:,.0f} MB"


def big_case(records: int, keys: int, files: int, runs: int, cpu: int, work: Path) -> list[tuple[str, str, str]]:
    root = work / "big"
    store = LocalStore(root)
    catalog = Catalog(store)
    catalog.ensure_created(NOW)
    for name in (BIG_TOPIC, WARM_TOPIC):
        catalog.create_topic(Topic.create(name, 1, {"cleanup.policy": "compact"}, NOW), NOW)
    rng = np.random.default_rng(3)
    pool = [os.urandom(VALUE_BYTES) for _ in range(VALUE_POOL)]
    key_bytes = [_key(0, 0, k) for k in range(keys)]
    order = np.concatenate([rng.permutation(keys) for _ in range(-(-records // keys))])[:records]
    started = time.perf_counter()
    with Agent(catalog, background=False, clock=lambda: NOW, flush_bytes=1 << 40) as agent:
        for chunk in np.array_split(order, files):
            picks = rng.integers(0, VALUE_POOL, len(chunk)).tolist()
            agent.produce(BIG_TOPIC, [Record(0, key_bytes[k], pool[v], NOW) for k, v in zip(chunk.tolist(), picks)])
            agent.flush()
        agent.produce(WARM_TOPIC, [Record(0, b"warm", b"up", NOW)])
    print(f"  big partition: {records:,} records in {files} L0 files, written in {time.perf_counter() - started:.0f} s",
          flush=True)
    distinct = len(np.unique(order))
    spread = _latest_values(root, cpu, runs, distinct, f"over {files} files")

    (sweep,) = make_plans(catalog.snapshot(), NOW + 1_000, "full")
    run_and_commit(catalog, sweep, NOW + 1_000)
    sections = catalog.snapshot().sections_of(BIG_TOPIC, 0)
    if len(sections) != 1 or sections[0][1].info.record_count != distinct:
        raise SystemExit(f"bench: the sweep left {len(sections)} sections, expected one of {distinct:,} records")
    section = sections[0][1]
    middle = (section.first_offset + section.last_offset) // 2
    timings, read = [], []
    for _ in range(max(runs, 5)):
        before = store.counters.snapshot()
        started = time.perf_counter()
        first = next(read_batches(store, catalog.snapshot(), BIG_TOPIC, 0, from_offset=middle))
        timings.append(time.perf_counter() - started)
        read.append((store.counters.snapshot() - before).bytes_read)
        if first.column("offset")[0].as_py() < middle:
            raise SystemExit("bench: the read from the middle started before its offset")
    compacted = _latest_values(root, cpu, runs, distinct, "of one section")
    catalog.engine.dispose()
    return [
        (f"consume from the middle of a {distinct:,}-record section: first record, bytes read",
         f"{_duration(statistics.median(timings))}, {statistics.median(read) / 1e6:,.1f} MB", "<= 20 ms, <= 2 MB"),
        (f"latest_values of {distinct:,} keys in one section: time, memory growth", compacted, f"<= {LATEST_VALUES_TARGET_S:g} s, <= 300 MB"),
        (f"latest_values of {distinct:,} keys over {files} files ({records:,} records): time, memory growth", spread,
         f"<= {LATEST_VALUES_TARGET_S:g} s, <= 300 MB"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--partitions", default="10,1000,10000", help="partitions per L0 file, comma-separated")
    parser.add_argument("--files", type=int, default=32, help="L0 files per partition count")
    parser.add_argument("--runs", type=int, default=3, help="runs of each compaction and latest_values measurement")
    parser.add_argument("--cpu", type=int, default=min(os.sched_getaffinity(0)), help="the CPU to pin to")
    parser.add_argument("--skip-compaction", action="store_true", help="leave out the L0 to L1 and L1 to L2 figures")
    parser.add_argument("--skip-big", action="store_true", help="leave out the big partition")
    parser.add_argument("--skip-deep", action="store_true", help="leave out the deep partitions' first record")
    parser.add_argument("--deep-sections", default="40,40000", help="sections of each deep partition, comma-separated")
    parser.add_argument("--skip-files", action="store_true", help="leave out the figures per partition count of L0 files")
    parser.add_argument("--big-records", type=int, default=10_000_000)
    parser.add_argument("--big-keys", type=int, default=1_000_000)
    parser.add_argument("--big-files", type=int, default=100)
    args = parser.parse_args()
    try:
        counts = [int(n) for n in args.partitions.split(",")]
        deep = [int(n) for n in args.deep_sections.split(",")]
    except ValueError:
        parser.error("--partitions and --deep-sections: give counts separated by commas, e.g. 10,1000,10000")
    if min(counts) < 1 or min(deep) < 1 or args.files < 1 or args.runs < 1 or min(args.big_records, args.big_keys, args.big_files) < 1:
        parser.error("--partitions, --deep-sections, --files, --runs and the --big-* sizes must be at least 1")
    pin(args.cpu)
    print(f"pinned to CPU {args.cpu}; {args.files} L0 files per partition count, {RECORDS_PER_SECTION} records of "
          f"{KEY_BYTES} + {VALUE_BYTES} B per section; medians of {args.runs} runs", flush=True)

    with tempfile.TemporaryDirectory(prefix="logcompact-bench-partitions-") as tmp:
        work = Path(tmp)
        print("  warm-up (not reported): loads what a first run loads once, the engine's compiled key map and Arrow's kernels")
        partitions_case(10, 2, 1, True, work / "warm-up")
        if not args.skip_files:
            figures = {n: partitions_case(n, args.files, args.runs, not args.skip_compaction, work) for n in counts}
            rows = [
                ("overhead", "file overhead per section (payload 408 B)"),
                ("produce", "produce one L0 file (write + commit)"),
                ("consume", "consume one partition of one file: GETs, time"),
                ("copy", f"L0 to L1 per section, {args.files} files"),
                ("dedup", f"L1 to L2 (dedup) per section, {args.files} files"),
            ]
            print(f"| partitions per L0 file | {' | '.join(f'{n:,}' for n in counts)} | target |")
            print(f"|---|{'---|' * len(counts)}---|")
            for name, label in rows:
                if name in figures[counts[0]]:
                    print(f"| {label} | {' | '.join(figures[n][name] for n in counts)} | {TARGETS[name]} |")
            print("| full plan over 100,000 files: document size, time to write | see bench/planner.py "
                  f"(--files 100000 --mode full) |{' |' * (len(counts) - 1)} <= 20 MB, <= 2 s |", flush=True)
        if not args.skip_deep:
            print("| deep partition | measured | target |")
            print("|---|---|---|")
            for label, measured, target in deep_case(deep, work):
                print(f"| {label} | {measured} | {target} |", flush=True)
        if not args.skip_big:
            rows = big_case(args.big_records, args.big_keys, args.big_files, args.runs, args.cpu, work)
            print("| big partition | measured | target |")
            print("|---|---|---|")
            for label, measured, target in rows:
                print(f"| {label} | {measured} | {target} |", flush=True)


if __name__ == "__main__":
    with recorded():
        main()
