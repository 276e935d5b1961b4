"""Deduplicating a keyed log with Spark: the naive DataFrame job against logcompact's Spark job, same records.

    .venv/bin/python bench/spark_dedup.py             # 10 million records, 1 million keys, 3 rounds
    .venv/bin/python bench/spark_dedup.py --quick     # 1 million records, 100,000 keys, 1 round
    .venv/bin/python bench/spark_dedup.py --no-tuning # both sides with no start-up option at all

The records (default: 10 million; 36-byte keys, each of 1 million distinct keys about 10 times in random
order; random 100-byte values; 8 partitions, a key always in the same one, as Kafka partitions by key) are
made once and written twice: as Parquet files (columns topic, partition, offset, key, value, timestamp)
and as level-1 logcompact segment files (LZ4) committed to the embedded SQLite catalog of a `file://`
store, 10 files each. Then each side runs as a whole `spark-submit --master local[2]` process, the two
alternately, each timed by the wall clock from the start of spark-submit to its exit:

  naive       NAIVE_JOB below: read the Parquet files, keep row_number() == 1 over a window partitioned
              by (topic, partition, key) ordered by offset descending, write the result as Parquet.
  logcompact  spark_apps/compact_group.py on the full-sweep plan of the store (deduplicating, one group):
              the engine in two Spark tasks, outputs written to the store, the group's result next to the
              plan (plans/{plan_id}/results/g000.json). No commit: that is the job's caller's step.

Before each run the last run's output is deleted (for logcompact also its result, else the group would
be skipped). After each run the output is checked: records in must be every record, and the records kept
exactly the latest of each key, by (partition, offset); anything else stops the benchmark. Printed: every
run, each side's median, the ratio of the medians naive / logcompact, and records in and out.

Start-up options (see SPARK_OPTIONS): both sides get 4 GiB of driver memory, no Spark UI, log level WARN,
the serial GC, and a class-data-sharing archive of the classes their driver JVM loads, dumped by one
untimed warm-up run of that side (as a deployment would build it once into its image). logcompact's JVM
also compiles with C1 only (-XX:TieredStopAtLevel=1); the naive job does its work in its JVM and takes
about twice as long with C1 only, so it does not get it. Spark's settings are otherwise the defaults.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from results import recorded

from logcompact.catalog import Catalog, NewFile
from logcompact.format import key_hashes, read_section, write_segment
from logcompact.format.layout import HEADERS_TYPE, SECTION_SCHEMA
from logcompact.keys import result_key
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import JobResult, write_plan
from logcompact.store import ObjectStore, open_store
from logcompact.topics import Topic

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "spark_apps" / "compact_group.py"
VENV_BIN = Path(sys.executable).parent
TOPIC = "bench"
NOW = 1_700_000_000_000
ONE_GROUP = 1 << 40  # the planner's group size: the whole plan is its group 0

# The naive job, as a user would write it; written to the work directory and run by spark-submit.
NAIVE_JOB = '''\
import sys

from pyspark.sql import SparkSession, Window
from pyspark.sql import functions as F

spark = SparkSession.builder.appName("naive dedup").getOrCreate()
latest_first = Window.partitionBy("topic", "partition", "key").orderBy(F.col("offset").desc())
(
    spark.read.parquet(sys.argv[1])
    .withColumn("rank", F.row_number().over(latest_first))
    .where(F.col("rank") == 1)
    .drop("rank")
    .write.mode("overwrite")
    .parquet(sys.argv[2])
)
# Not stopped here, as compact_group does not stop its context: spark-submit's JVM stops it as it exits.
'''

# Start-up options of both sides. The naive job sorts 1.4 GB in its JVM: with the default 1 GiB of memory it
# spills, and takes about 1.6x as long; logcompact's JVM needs none of it, and gets it all the same.
SPARK_OPTIONS = ["--driver-memory", "4g", "--conf", "spark.ui.enabled=false", "--conf", "spark.log.level=WARN"]
JAVA_OPTIONS = ["-XX:+UseSerialGC"]
# Only for logcompact's JVM, which starts Spark, hands two tasks to Python and waits.
QUICK_JIT = ["-XX:TieredStopAtLevel=1"]


# -- the records, written as Parquet and as a logcompact store ---------------------------------------------


@dataclass
class Dataset:
    records: int
    keys: int
    payload_bytes: int  # of keys and values
    parquet_dir: Path
    parquet_bytes: int
    store: ObjectStore
    segment_bytes: int
    plan_id: str
    expected: np.ndarray  # partition << 40 | offset of each key's latest record, sorted


def make_dataset(workdir: Path, records: int, keys: int, value_bytes: int, partitions: int, files: int, seed: int) -> Dataset:
    """The same records as Parquet files and as level-1 segment files of a catalog, with a full-sweep plan."""
    rng = np.random.default_rng(seed)
    key_bytes = [b"%036d" % k for k in range(keys)]
    key_array, hash_array = pa.array(key_bytes, pa.binary()), key_hashes(key_bytes)
    # Every key records / keys times (give or take one) in random order; key k lives in partition k % P.
    ids = rng.permutation(np.arange(records, dtype=np.int64) % keys)
    partition_of = ids % partitions
    # A record's offset: how many records of its partition come before it.
    by_partition = np.argsort(partition_of, kind="stable")
    counts = np.bincount(partition_of, minlength=partitions)
    offsets = np.empty(records, dtype=np.int64)
    offsets[by_partition] = np.arange(records) - np.repeat(np.cumsum(counts) - counts, counts)
    # Offsets grow along a partition, so a key's latest record is its last one.
    last = records - 1 - np.unique(ids[::-1], return_index=True)[1]
    expected = np.sort(partition_of[last] << 40 | offsets[last])

    store = open_store((workdir / "store").as_uri())
    catalog = Catalog(store)
    catalog.ensure_created(NOW)
    catalog.create_topic(Topic.create(TOPIC, partitions, {"cleanup.policy": "compact"}, NOW), NOW)
    parquet_dir = workdir / "parquet"
    parquet_dir.mkdir()
    new_files, first_offsets, parquet_bytes = [], [], 0
    for number, rows in enumerate(np.array_split(np.arange(records), files)):
        sections, starts, tables = [], [], []
        for partition in range(partitions):
            mine = rows[partition_of[rows] == partition]
            n = len(mine)
            if not n:
                continue
            index = pa.array(ids[mine])
            keys_column, offset_column = key_array.take(index), offsets[mine]
            value_offsets = pa.py_buffer(np.arange(n + 1, dtype=np.int32) * value_bytes)
            values = pa.Array.from_buffers(pa.binary(), n, [None, value_offsets, pa.py_buffer(rng.bytes(n * value_bytes))])
            timestamps = pa.array(NOW + offset_column)
            section = pa.Table.from_arrays(
                [
                    pa.array(offset_column - offset_column[0], pa.uint32()),
                    timestamps,
                    keys_column,
                    hash_array.take(index),
                    values,
                    pa.nulls(n, HEADERS_TYPE),
                    pa.nulls(n, pa.int64()),
                ],
                schema=SECTION_SCHEMA,
            )
            sections.append((TOPIC, partition, section))
            starts.append(int(offset_column[0]))
            tables.append(
                pa.table(
                    {
                        "topic": pa.array([TOPIC] * n, pa.string()),
                        "partition": pa.array(np.full(n, partition, dtype=np.int32)),
                        "offset": pa.array(offset_column),
                        "key": keys_column,
                        "value": values,
                        "timestamp": timestamps,
                    }
                )
            )
        blob, infos = write_segment(sections, "lz4")
        key = f"data/l1/{TOPIC}-{number:03d}.seg"
        store.put(key, blob)
        new_files.append(NewFile(key, 1, len(blob), NOW, tuple(infos)))
        first_offsets.append(starts)
        path = parquet_dir / f"part-{number:03d}.parquet"
        pq.write_table(pa.concat_tables(tables), path)
        parquet_bytes += path.stat().st_size
    assigned = catalog.append_files(new_files, NOW).assigned
    if assigned != first_offsets:
        raise SystemExit("spark_dedup: the catalog placed the segment files at other offsets than the Parquet files hold")

    (sweep,) = choose_plans(catalog.snapshot(), NOW + 1, "full", PlannerConfig(group_bytes=ONE_GROUP))
    if not sweep.deduplicate or len(sweep.groups) != 1:
        raise SystemExit(f"spark_dedup: expected a deduplicating plan of one group, planned {sweep}")
    write_plan(store, sweep)
    return Dataset(
        records=records,
        keys=keys,
        payload_bytes=records * (36 + value_bytes),
        parquet_dir=parquet_dir,
        parquet_bytes=parquet_bytes,
        store=store,
        segment_bytes=sum(f.size for f in new_files),
        plan_id=sweep.plan_id,
        expected=expected,
    )


# -- the two sides, each run as a whole spark-submit process -----------------------------------------------


class Side:
    """One side of the comparison: its command, how to clear its last output, and how to count and check it."""

    name = ""
    java_options: list[str] = []

    def __init__(self, data: Dataset, workdir: Path, tuned: bool) -> None:
        self.data = data
        self.workdir = workdir
        self.tuned = tuned
        self.archive = workdir / f"{self.name}.jsa"  # class-data-sharing archive of this side's driver JVM
        self.times: list[float] = []

    def arguments(self) -> list[str]:
        raise NotImplementedError

    def clear(self) -> None:
        raise NotImplementedError

    def counts(self) -> tuple[int, int, np.ndarray]:
        """Records in, records out, and the output's records as partition << 40 | offset, sorted."""
        raise NotImplementedError

    def options(self, dump_archive: bool = False) -> list[str]:
        if not self.tuned:
            return []
        # -Xshare:on: a run that cannot use the archive fails instead of quietly starting slower.
        if dump_archive:
            sharing = [f"-XX:ArchiveClassesAtExit={self.archive}"]
        else:
            sharing = ["-Xshare:on", f"-XX:SharedArchiveFile={self.archive}"]
        return [*SPARK_OPTIONS, "--driver-java-options", " ".join([*JAVA_OPTIONS, *self.java_options, *sharing])]

    def command(self, dump_archive: bool = False) -> list[str]:
        return [str(VENV_BIN / "spark-submit"), "--master", "local[2]", *self.options(dump_archive), *self.arguments()]

    def run(self, dump_archive: bool = False) -> float:
        """One whole spark-submit process, its output checked; returns its wall-clock seconds."""
        self.clear()
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            "SPARK_LOCAL_IP": "127.0.0.1",
            "PYSPARK_PYTHON": str(VENV_BIN / "python"),
        }
        log = self.workdir / f"{self.name}.log"
        with open(log, "w") as out:
            started = time.perf_counter()
            done = subprocess.run(self.command(dump_archive), stdout=out, stderr=subprocess.STDOUT, env=env, cwd=ROOT)
            elapsed = time.perf_counter() - started
        if done.returncode != 0:
            raise SystemExit(
                f"spark_dedup: the {self.name} job failed (exit {done.returncode}); the end of its log:\n{log.read_text()[-5000:]}"
            )
        self.check()
        return elapsed

    def check(self) -> None:
        records_in, records_out, kept = self.counts()
        if records_in != self.data.records or records_out != len(self.data.expected):
            raise SystemExit(
                f"spark_dedup: {self.name} read {records_in:,} records and kept {records_out:,}; "
                f"expected {self.data.records:,} in and {len(self.data.expected):,} out"
            )
        if not np.array_equal(kept, self.data.expected):
            raise SystemExit(f"spark_dedup: {self.name} kept {records_out:,} records, but not the latest of every key")


class Naive(Side):
    name = "naive"

    def __init__(self, data: Dataset, workdir: Path, tuned: bool) -> None:
        super().__init__(data, workdir, tuned)
        self.script = workdir / "naive_dedup.py"
        self.script.write_text(NAIVE_JOB)
        self.output = workdir / "naive-output"

    def arguments(self) -> list[str]:
        return [str(self.script), str(self.data.parquet_dir), str(self.output)]

    def clear(self) -> None:
        shutil.rmtree(self.output, ignore_errors=True)

    def counts(self) -> tuple[int, int, np.ndarray]:
        # Records in: the input's (the window reads every record); out: what the job wrote.
        records_in = sum(pq.read_metadata(p).num_rows for p in self.data.parquet_dir.glob("*.parquet"))
        kept = pq.read_table(self.output, columns=["partition", "offset"])
        where = kept.column("partition").to_numpy().astype(np.int64) << 40 | kept.column("offset").to_numpy()
        return records_in, kept.num_rows, np.sort(where)


class Logcompact(Side):
    name = "logcompact"
    java_options = QUICK_JIT

    def arguments(self) -> list[str]:
        plan_id, store_uri = self.data.plan_id, self.data.store.uri
        return [str(APP), "--store", store_uri, "--plan-id", plan_id, "--group", "0"]

    def clear(self) -> None:
        store, plan_id = self.data.store, self.data.plan_id
        live = {f.key for f in Catalog(store).snapshot().file_summaries()}
        store.delete(result_key(plan_id, 0))
        for info in list(store.list("data/")):
            if f"/{plan_id}-" in info.key and info.key not in live:
                store.delete(info.key)

    def counts(self) -> tuple[int, int, np.ndarray]:
        # Both counts from the group's result (the engine's stats); the records kept read from the outputs.
        store = self.data.store
        slices = json.loads(store.get(result_key(self.data.plan_id, 0)))["slices"]
        kept = [np.zeros(0, dtype=np.int64)]
        for output in (f for s in slices for f in JobResult.from_dict(s).outputs):
            for section in output.sections:
                read = read_section(store, output.key, section.info, index_only=True)
                deltas = read.table(["offset_delta"]).column(0).to_numpy().astype(np.int64)
                kept.append(section.partition << 40 | (section.first_offset + deltas))
        records_in = sum(s["stats"]["records_in"] for s in slices)
        records_out = sum(s["stats"]["records_out"] for s in slices)
        return records_in, records_out, np.sort(np.concatenate(kept))


# -- the benchmark ---------------------------------------------------------------------------------------


def benchmark(args: argparse.Namespace) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="logcompact-bench-spark-", dir=args.workdir))
    try:
        started = time.perf_counter()
        data = make_dataset(workdir, args.records, args.keys, args.value_bytes, args.partitions, args.files, args.seed)
        print(
            f"{data.records:,} records, {data.keys:,} distinct keys, {args.partitions} partitions "
            f"({data.payload_bytes / 1e9:.2f} GB of keys and values): {data.parquet_bytes / 1e9:.2f} GB as Parquet, "
            f"{data.segment_bytes / 1e9:.2f} GB as segments; made in {time.perf_counter() - started:.1f} s",
            flush=True,
        )
        sides = [Naive(data, workdir, not args.no_tuning), Logcompact(data, workdir, not args.no_tuning)]
        for side in sides:
            print(f"{side.name}: {shlex.join(side.command())}")
        # Warm-up, untimed: the page cache, numba's cache, and with tuning each side's class-data archive.
        for side in sides:
            print(f"  warm-up {side.name}: {side.run(dump_archive=True):.1f} s", flush=True)
        for round_ in range(1, args.rounds + 1):
            for side in sides:
                side.times.append(side.run())
            print(f"  round {round_}: " + ", ".join(f"{s.name} {s.times[-1]:.2f} s" for s in sides), flush=True)
        for side in sides:
            records_in, records_out, _ = side.counts()
            print(
                f"{side.name:>10}: median {statistics.median(side.times):6.2f} s a whole process "
                f"(runs {', '.join(f'{t:.2f}' for t in side.times)}); {records_in:,} records in, {records_out:,} out"
            )
        naive, ours = (statistics.median(s.times) for s in sides)
        print(f"naive / logcompact: {naive / ours:.1f}x (same records in and kept, local[2], whole spark-submit processes)")
    finally:
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=10_000_000)
    parser.add_argument("--keys", type=int, default=1_000_000, help="distinct keys")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--partitions", type=int, default=8)
    parser.add_argument("--files", type=int, default=10, help="input files (each as Parquet and as a segment file)")
    parser.add_argument("--rounds", type=int, default=3, help="timed runs of each side, alternating")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quick", action="store_true", help="1 million records, 100,000 keys, 1 round")
    parser.add_argument("--no-tuning", action="store_true", help="run both sides with no start-up option")
    parser.add_argument("--workdir", help="where to make the temporary work directory (default: the system's)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    if args.quick:
        args.records, args.keys, args.rounds = 1_000_000, 100_000, 1
    benchmark(args)


if __name__ == "__main__":
    with recorded():
        main()
