"""Throughput of the two-pass compaction engine on one core, against the I/O floor of the same files.

    .venv/bin/python bench/engine.py                 # every case, 3 runs each, prints medians
    .venv/bin/python bench/engine.py --case a --repeat 1
    .venv/bin/python bench/engine.py --case b --min-lag none,0,0.1   # min lag's cost, runs alternating

Cases (8 partitions, 10 input files, LZ4, each key always in the same partition, as Kafka partitions):
  (a) 36-byte keys, 100-byte values, 1,000,000 distinct keys, 10 records per key: 10 million records
  (b) 36-byte keys, 1 KiB values, 200,000 distinct keys, 10 records per key: 2 million records
The engine runs a deduplicating plan over the files with the default 128 MiB key map (`run_plan`: both
passes, k-way merge, bitmaps, output written and uploaded; no commit). The I/O floor reads every input
file twice and writes the output's bytes with plain file I/O; the engine reads less than that (pass 1 reads
the index parts only, pass 2 skips the payload of a block none of whose records survive), so the floor is a
bound the engine may beat. The bare two-pass reads the same files through the format's streams (pass 1 the index
parts into the same key map, pass 2 every block holding a kept record whole), with the checks the
engine's streams make, and writes each key's latest record with the format's writer, and nothing else: no rules,
no merge, no stats: what the engine costs over the format it reads and writes (run after the engine, before the
floor, with the collector paused as the engine pauses it). Also printed: the engine's and the floor's CPU time (user and
system), steadier than their wall time when other work shares the core; how many distinct
keys the 128 MiB map holds. The process is pinned to one CPU and Arrow to one thread.
  (c) an L0 to L1 copy (`run_plan` of a plan that does not deduplicate) of 32 agents' files, each holding records
      of 1,000 partitions (16,000 keys, 2 records a key, 100-byte values): some 20,000 sections of a record or two,
      what the compactors copy in the regime (bench/regime.py); printed per section.
  (d) aborted ranges' cost per section: case (c)'s files copied (L0 to L1) and deduplicated (to L2) by a plain plan
      and by the same plan carrying aborted ranges, runs alternating: in every partition every tenth offset is a
      range of its own (a tenth of the records aborted, about 3 ranges a partition), as transactions of one
      record each would leave them; the engine must count every aborted record removed. Target: <= 1.1x the plain
      plan's time.

--min-lag compares variants of the topic side by side, their runs alternating: `none` (no min lag), or a
share of each partition's newest records within min.compaction.lag.ms (records' timestamps follow their
offsets): `0` costs the engine only its search for a young record, `0.1` also cuts each partition's output
before its young tenth and keeps that tenth as it is.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import uuid
from contextlib import nullcontext
from pathlib import Path

import numpy as np
import pyarrow as pa
from profiling import Profile, sampled
from results import recorded

# The lab (lab/: throw-away servers, the campaigns' harness, the reference model) is in the checkout, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.synthetic import NOW, write_compacted_log
from logcompact.catalog import CatalogSection, DataFile
from logcompact.collector import collector_paused
from logcompact.engine.cleaner import compile_kernels, run_plan
from logcompact.engine.offset_map import CompactOffsetMap
from logcompact.format import SectionStream, SegmentWriter
from logcompact.format.layout import SECTION_SCHEMA, key_hash_words
from logcompact.plans import Plan
from logcompact.store import LocalStore
from logcompact.topics import Topic

PARTITIONS = 8
FILES = 10
CASES = {"a": (1_000_000, 10, 100), "b": (200_000, 10, 1024)}
FLOOR_RATIO_TARGET = 2.0  # case (b): the engine within twice the time of reading its inputs twice and writing its output
L0_FILES = 32
L0_PARTITIONS = 1_000


def io_floor(store: LocalStore, files: list[DataFile], output_bytes: int, workdir: Path) -> float:
    """Read each input twice and write `output_bytes`, with plain file I/O and 1 MiB buffers."""
    started = time.perf_counter()
    for _ in range(2):
        for data_file in files:
            with open(store.root / data_file.key, "rb") as f:
                while f.read(1 << 20):
                    pass
    chunk = b"\0" * (1 << 20)
    with open(workdir / "floor.out", "wb") as out:
        for _ in range(output_bytes // len(chunk) + 1):
            out.write(chunk)
    elapsed = time.perf_counter() - started
    os.unlink(workdir / "floor.out")
    return elapsed


def bare_two_pass(store: LocalStore, files: list[DataFile], workdir: Path) -> tuple[float, float, int]:
    """Each key's latest record into one file, by the format's streams and writer alone: (seconds, of which in the
    writer, records written). The streams check what the engine's check (pass 1 the order of offsets, pass 2 the
    deltas too), and pass 2 reads the payload of a block only when a record of it is kept, as the engine does. Each
    key stays in one partition and no record is a tombstone (`write_compacted_log`)."""
    started = time.perf_counter()
    in_writer = 0.0
    key_map = CompactOffsetMap()
    by_partition: dict[tuple[str, int], list[tuple[DataFile, CatalogSection]]] = {}
    for data_file in files:
        for section in data_file.sections:
            by_partition.setdefault((section.topic, section.partition), []).append((data_file, section))
    pass1 = {f.key: SectionStream(store, f.key, f.size, index_only=True) for f in files}
    pass2 = {f.key: SectionStream(store, f.key, f.size) for f in files}
    written = 0
    with collector_paused(), open(workdir / "bare.out", "wb") as sink:
        writer = SegmentWriter(sink, "lz4")
        for (topic, partition), sections in sorted(by_partition.items()):
            sections.sort(key=lambda pair: pair[1].first_offset)
            key_map.clear(sum(section.info.record_count for _, section in sections))
            for data_file, section in sections:
                for batch in pass1[data_file.key].rows(section.info, check_deltas=False):
                    offsets = batch.column("offset_delta").to_numpy() + np.int64(section.first_offset)
                    assert key_map.put(key_hash_words(batch.column("key_hash")), offsets) == len(offsets), "the key map filled up"
            builder, first = None, 0
            for data_file, section in sections:

                def any_kept(index: pa.RecordBatch, first_offset: int = section.first_offset) -> bool:
                    offsets = index.column("offset_delta").to_numpy() + np.int64(first_offset)
                    return bool((key_map.get(key_hash_words(index.column("key_hash"))) <= offsets).any())

                for batch in pass2[data_file.key].rows(section.info, payload_wanted=any_kept):
                    offsets = batch.column("offset_delta").to_numpy() + np.int64(section.first_offset)
                    keep = key_map.get(key_hash_words(batch.column("key_hash"))) <= offsets
                    if not keep.any():
                        continue
                    if builder is None:
                        first = int(offsets[keep][0])
                    deltas = pa.array((offsets[keep] - first).astype(np.uint32))
                    kept = batch.filter(pa.array(keep)).set_column(0, SECTION_SCHEMA.field("offset_delta"), deltas)
                    began = time.perf_counter()
                    if builder is None:
                        builder = writer.begin_section(topic, partition)
                    builder.append(kept)
                    in_writer += time.perf_counter() - began
                    written += kept.num_rows
            if builder is not None:
                began = time.perf_counter()
                builder.finish()
                in_writer += time.perf_counter() - began
        began = time.perf_counter()
        writer.finish()
        in_writer += time.perf_counter() - began
    for stream in [*pass1.values(), *pass2.values()]:
        stream.close()
    elapsed = time.perf_counter() - started
    os.unlink(workdir / "bare.out")
    return elapsed, in_writer, written


def keys_in_128_mib() -> tuple[int, float]:
    key_map = CompactOffsetMap()
    rng = np.random.default_rng(1)
    started = time.perf_counter()
    offset = 0
    while True:
        hashes = rng.integers(0, 2**63, size=(1 << 20, 2), dtype=np.uint64)
        taken = key_map.put(hashes, np.arange(offset, offset + len(hashes), dtype=np.int64))
        offset += len(hashes)
        if taken < len(hashes):
            return key_map.size, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=["a", "b", "c", "d", "all"], default="all")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--min-lag", default="none", metavar="VARIANTS",
                        help="comma-separated: none, or the share (0 to 1) of each partition's newest records within the lag")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    pa.set_cpu_count(1)
    pa.set_io_thread_count(1)

    compile_kernels()  # numba's compilation (or loading its cache) is not the engine's time
    held, seconds = keys_in_128_mib()
    print(f"key map: {held:,} distinct keys held in 128 MiB ({128 * 2**20 / held:.1f} bytes a key), filled in {seconds:.1f} s")
    variants = args.min_lag.split(",")
    plan_now = NOW + 10**9
    if args.case in ("c", "all"):
        l0_copy(args.repeat)
    if args.case in ("d", "all"):
        aborted_ranges_cost(args.repeat)
    for case in ("a", "b") if args.case == "all" else (args.case,) if args.case in ("a", "b") else ():
        distinct, per_key, value_bytes = CASES[case]
        records = distinct * per_key
        topics = {variant: _topic(variant, records // PARTITIONS, plan_now) for variant in variants}
        with tempfile.TemporaryDirectory(prefix="logcompact-bench-engine-") as tmp:
            store = LocalStore(Path(tmp) / "store")
            files, payload = write_compacted_log(store, "bench", distinct, per_key, value_bytes, PARTITIONS, FILES)
            engine: dict[str, list[float]] = {variant: [] for variant in variants}
            floors, bare, bare_writer, young_kept, outputs = [], [], [], {}, {}
            engine_cpu, floor_cpu = [], []
            profile = Profile(f"the engine's runs of case ({case})")
            for _ in range(args.repeat):
                for variant in variants:
                    plan = Plan(
                        plan_id=f"bench-{uuid.uuid4().hex[:8]}", cluster_id="bench", manifest_version=1, now_ms=plan_now,
                        target_level=2, deduplicate=True, inputs=tuple(files), topics={"bench": topics[variant]},
                    )
                    started, cpu = time.perf_counter(), time.process_time()
                    with sampled(into=profile) if variant == "none" else nullcontext():
                        result = run_plan(store, plan)
                    engine[variant].append(time.perf_counter() - started)
                    if variant == "none":
                        engine_cpu.append(time.process_time() - cpu)
                    young_kept[variant], outputs[variant] = result.stats.young_kept, len(result.outputs)
                    if variant == "none":
                        assert result.stats.records_out == distinct, result.stats
                        seconds, in_writer, written = bare_two_pass(store, files, Path(tmp))
                        assert written == distinct, written
                        bare.append(seconds)
                        bare_writer.append(in_writer)
                        cpu = time.process_time()
                        floors.append(io_floor(store, files, result.stats.bytes_out, Path(tmp)))
                        floor_cpu.append(time.process_time() - cpu)
                    for output in result.outputs:
                        store.delete(output.key)
            size = sum(d.size for d in files)
            print(
                f"case ({case}): {records:,} records, {value_bytes} B values, {payload / 1e9:.2f} GB of keys and values, "
                f"{size / 1e9:.2f} GB in files -> {distinct:,} records out without min lag",
                flush=True,
            )
            f = statistics.median(floors) if floors else None
            for variant in variants:
                e = statistics.median(engine[variant])
                against = f"; I/O floor {f:.2f} s; engine / floor = {e / f:.1f}x" if f else ""
                if bare and variant == "none":
                    b = statistics.median(bare)
                    against += f"; bare two-pass {b:.2f} s (in the writer {statistics.median(bare_writer):.2f} s), engine / bare = {e / b:.2f}x"
                lag = "no min lag" if variant == "none" else f"{float(variant):.0%} of records within min lag ({young_kept[variant]:,} kept young)"
                print(
                    f"  {lag}: engine {e:.2f} s: {records / e / 1e6:.2f} M records/s, {payload / e / 1e9:.2f} GB/s per core{against}; "
                    f"{outputs[variant]} output file(s)  (runs: {', '.join(f'{x:.2f}' for x in engine[variant])})",
                    flush=True,
                )
            if engine_cpu and floor_cpu:
                ec, fc = statistics.median(engine_cpu), statistics.median(floor_cpu)
                print(f"  CPU time (user + system, what the process got of its core): engine {ec:.2f} s, I/O floor {fc:.2f} s, "
                      f"engine / floor = {ec / fc:.1f}x; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
            if case == "b" and f:
                ratio = statistics.median(engine["none"]) / f
                print(f"  target engine / I/O floor <= {FLOOR_RATIO_TARGET:g}x: {'met' if ratio <= FLOOR_RATIO_TARGET else 'MISSED'} ({ratio:.1f}x)", flush=True)
                if ratio > FLOOR_RATIO_TARGET:
                    print(f"  what binds it and what would close it: bench/README.md, Where the misses come from\n{profile.summary()}", flush=True)


def l0_copy(repeat: int) -> None:
    """Case (c): the L0 to L1 copy of 32 agents' files of 1,000 partitions."""
    topic = Topic.create("agents", L0_PARTITIONS, {"cleanup.policy": "compact"}, NOW)
    with tempfile.TemporaryDirectory(prefix="logcompact-bench-engine-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        files, _ = write_compacted_log(store, "agents", 16_000, 2, 100, L0_PARTITIONS, L0_FILES, level=0)
        sections = sum(len(f.sections) for f in files)
        runs = []
        for _ in range(repeat):
            plan = Plan(plan_id=f"bench-{uuid.uuid4().hex[:8]}", cluster_id="bench", manifest_version=1, now_ms=NOW + 10**6,
                        target_level=1, deduplicate=False, inputs=tuple(files), topics={"agents": topic})
            started = time.perf_counter()
            result = run_plan(store, plan)
            runs.append(time.perf_counter() - started)
            assert result.stats.records_out == result.stats.records_in == 32_000, result.stats
            for output in result.outputs:
                store.delete(output.key)
        took = statistics.median(runs)
        print(f"case (c): L0 to L1 copy of {L0_FILES} files, {sections:,} sections over {L0_PARTITIONS:,} partitions: {took:.3f} s, "
              f"{took / sections * 1e6:.1f} µs a section  (runs: {', '.join(f'{x:.3f}' for x in runs)})", flush=True)


def aborted_ranges_cost(repeat: int) -> None:
    """Case (d): case (c)'s files through a plain plan and the same plan with aborted ranges, copied to L1 and
    deduplicated to L2, the runs alternating: seconds per section of each and their ratio."""
    topic = Topic.create("agents", L0_PARTITIONS, {"cleanup.policy": "compact"}, NOW)
    with tempfile.TemporaryDirectory(prefix="logcompact-bench-engine-") as tmp:
        store = LocalStore(Path(tmp) / "store")
        files, _ = write_compacted_log(store, "agents", 16_000, 2, 100, L0_PARTITIONS, L0_FILES, level=0)
        sections = sum(len(f.sections) for f in files)
        ends: dict[int, int] = {}
        for data_file in files:
            for section in data_file.sections:
                ends[section.partition] = max(ends.get(section.partition, 0), section.first_offset + section.info.record_count)
        aborted = {("agents", p): tuple((offset, offset) for offset in range(5, end, 10)) for p, end in ends.items()}
        aborted_records = sum(len(ranges) for ranges in aborted.values())
        timings: dict[tuple[int, bool], list[float]] = {(level, with_aborted): [] for level in (1, 2) for with_aborted in (False, True)}
        cpu_times: dict[tuple[int, bool], list[float]] = {key: [] for key in timings}
        for _ in range(repeat):
            for level in (1, 2):
                for with_aborted in (False, True):
                    plan = Plan(plan_id=f"bench-{uuid.uuid4().hex[:8]}", cluster_id="bench", manifest_version=1, now_ms=NOW + 10**6,
                                target_level=level, deduplicate=level == 2, inputs=tuple(files), topics={"agents": topic},
                                aborted=aborted if with_aborted else {})
                    started, cpu = time.perf_counter(), time.process_time()
                    result = run_plan(store, plan)
                    timings[(level, with_aborted)].append(time.perf_counter() - started)
                    cpu_times[(level, with_aborted)].append(time.process_time() - cpu)
                    assert result.stats.aborted_removed == (aborted_records if with_aborted else 0), result.stats
                    for output in result.outputs:
                        store.delete(output.key)
        print(f"case (d): aborted ranges, case (c)'s {L0_FILES} files ({sections:,} sections), {aborted_records:,} of 32,000 records "
              f"in {aborted_records:,} aborted ranges, plain and aborted plans alternating, medians of {repeat}:", flush=True)
        for level, name in ((1, "L0 to L1 copy"), (2, "dedup to L2")):
            plain, with_ranges = (statistics.median(timings[(level, flag)]) for flag in (False, True))
            ratio = with_ranges / plain
            cpu_plain, cpu_ranges = (statistics.median(cpu_times[(level, flag)]) for flag in (False, True))
            print(f"  {name}: plain {plain / sections * 1e6:.1f} µs a section, with aborted ranges {with_ranges / sections * 1e6:.1f} µs: "
                  f"{ratio:.2f}x (target <= 1.1x: {'met' if ratio <= 1.1 else 'missed'}); CPU time {cpu_ranges / cpu_plain:.2f}x  "
                  f"(runs: {', '.join(f'{x:.3f}' for x in timings[(level, False)])} / {', '.join(f'{x:.3f}' for x in timings[(level, True)])})",
                  flush=True)


def _topic(variant: str, per_partition: int, plan_now: int) -> Topic:
    """The bench topic, with a min lag taking in the newest `variant` share of each partition's records: their
    timestamps are NOW plus their offset (`write_compacted_log`)."""
    if variant == "none":
        return Topic.create("bench", PARTITIONS, {"cleanup.policy": "compact"}, NOW)
    young_from = NOW + round(per_partition * (1 - float(variant)))
    lag = plan_now - young_from + 1
    return Topic.create("bench", PARTITIONS, {"cleanup.policy": "compact", "min.compaction.lag.ms": str(lag)}, NOW)


if __name__ == "__main__":
    with recorded():
        main()
