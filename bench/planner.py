"""Planning over a large catalog in a real database, and the plans' stored documents: 100,000 live files, each
with sections of several partitions.

    .venv/bin/python bench/planner.py [--files 100000] [--sections 4] [--mode all|regular|max-lag|full|l0]
                                      [--database URL] [--store DIR] [--runs 5] [--passes-only]

Builds a catalog (levels L0 to L4, sizes spread over six orders of magnitude, 64 topics of 16 partitions, a
max lag on half of them, file names and section fields as varied as real ones) in SQLite beside a local store
(a temporary one unless --store names a directory; a catalog already there with as many files is reused), or
in the database --database names (postgresql+psycopg://...), inserting files in batches of 20,000 through
`Catalog.replace_files`. Then, for each mode:

- times `choose_plans(catalog.snapshot(), ...)`, catalog reads included (target: 1 s at 100,000 files, 3 s at 300,000):
  the pass reads its files' sections as columns, and its plans hold their inputs unloaded (`PlannedInputs`);
- times reading each plan's sections as columns, a query per plan (`Snapshot.input_sections`: what its stored
  documents are encoded from and its hidden offsets found in, no section object built);
- writes its plans as a scheduler does (`exchange.write_plan`: a JSON header and an Arrow document per group)
  and prints their size and the time to write them (target for the full plan over 100,000 files: 20 MB, 2 s);
  then what each reader pays: the commit reads the header, a Spark driver a group's bytes per partition, a
  task its slice of the group (and what a task is sent, pickled as Spark sends it: independent of the plan).

With --passes-only, the passes alone are timed (what comparing two versions of the planner needs; a 300,000-file
catalog's documents take minutes more). Medians over --runs, of the wall clock and of the process's CPU time. In this catalog every mode plans nearly every file; `l0` is a regular pass in which only
L0 is due (1% of the files), what most passes of a running cluster are. Key sketches are left empty: stored
plans do not carry them, and the planner's figures stay comparable with earlier ones.

No section of this catalog is marked free of duplicates, so at Kafka's min.cleanable.dirty.ratio (0.5) every
partition is past it and every regular pass, `l0` too, would plan nearly every file for it. The topics' ratio is
set to --dirty-ratio before timing, 1 by default: no partition is weighed, not even by its summary row (about
0.01 s for this catalog's 1,024, as `bench/status.py` reads them), and the passes plan as a running cluster's, where
a few partitions pass at a time (the simulator weighs that cost). `--dirty-ratio 0.5` times a pass that takes
every partition for its ratio.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
from profiling import sampled
from results import recorded

from logcompact import sketch
from logcompact.catalog import Catalog, CatalogSection, DataFile
from logcompact.exceptions import ClusterNotFoundError, CorruptDataError
from logcompact.format.layout import SectionInfo
from logcompact.jobs import GroupSlice, run_task
from logcompact.keys import inputs_key, plan_key
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import Plan, input_sections, plan_documents, read_group, read_header, read_partition_bytes, read_plan, write_plan
from logcompact.plans.documents import check_seal, seal
from logcompact.store import LocalStore
from logcompact.topics import Topic

NOW = 1_700_000_000_000
BATCH = 20_000
PASSES = {
    "regular": ("regular", PlannerConfig()),
    "max-lag": ("max-lag", PlannerConfig()),
    "full": ("full", PlannerConfig()),
    "l0": ("regular", PlannerConfig(min_files=(32, 10**9, 10**9, 10**9), tier_min_files=10**9)),
}
PASS_TARGET_S_PER_FILE = 1 / 100_000  # a planning pass over every file: 1 s at 100,000 files, 3 s at 300,000
# A task's slice holds 1/8 of its group's partitions, as when spark_apps/compact_group.py deals a group to 8 tasks.
SLICES_PER_GROUP = 8


def build(catalog: Catalog, files: int, sections: int, sketches: bool = False) -> None:
    """The catalog described above; with `sketches`, each section carries the key sketch of up to 1,000 keys
    drawn from its partition's 100,000 (what `logcompact status` merges)."""
    rng = np.random.default_rng(5)
    keys = np.random.default_rng(7)
    # The section fields, from a generator of their own: levels, sizes and partitions are drawn as before.
    details = np.random.default_rng(6)
    catalog.ensure_created(NOW)
    for n in range(64):
        settings = {"cleanup.policy": "compact", **({"max.compaction.lag.ms": "86400000"} if n % 2 else {})}
        catalog.create_topic(Topic.create(f"t{n}", 16, settings, NOW), NOW)
    levels = rng.choice(5, size=files, p=[0.01, 0.02, 0.17, 0.3, 0.5])
    sizes = (10 ** rng.uniform(3, 9, size=files)).astype(np.int64)
    batch = []
    for n in range(files):
        placed = []
        chosen = {(int(t), int(p)) for t, p in zip(rng.integers(0, 64, sections), rng.integers(0, 16, sections))}
        created = NOW - 10**8 - int(details.integers(0, 10**9))
        position = 16
        for topic, partition in sorted(chosen):
            # As a real section's: a skewed record count, offsets with holes above L1 (compacted away), the
            # timestamps of a few hours, some tombstones, its own block (and CRC) at the next byte position.
            records = int(10 ** details.uniform(0, 5))
            holes = int(details.integers(0, records)) if levels[n] >= 2 else 0
            newest = created - int(details.integers(0, 10**6))
            tombstones = int(details.integers(0, records // 10 + 1)) if details.random() < 0.2 else 0
            length = int(details.integers(500, 1500))
            drawn = b""
            if sketches:
                ids = keys.integers(0, 100_000, min(records, 1_000), dtype=np.uint64) + np.uint64((topic * 16 + partition) << 20)
                drawn = sketch.encode(sketch.sketch_words(ids * np.uint64(0x9E3779B97F4A7C15)))
            info = SectionInfo(
                f"t{topic}", partition, records, records - 1 + holes, newest - int(details.integers(0, 10**7)), newest,
                tombstones, length * int(details.integers(5, 15)), "lz4", int(details.integers(0, 2**32)), position, length, 0,
                drawn,
            )
            position += length
            placed.append(CatalogSection(info, n * 100_000 + int(details.integers(0, 100_000))))
        # Named as real files are: an agent's L0 file, or a compaction's output.
        suffix = details.bytes(16).hex()
        key = f"data/l0/{created}-{suffix}.seg" if levels[n] == 0 else f"data/l{levels[n]}/p{created}-{suffix[:12]}-g000-s000-compacted-0000.seg"
        batch.append(DataFile(key, int(levels[n]), int(sizes[n]), created, tuple(placed)))
        if len(batch) == BATCH or n == files - 1:
            catalog.replace_files([], batch, NOW)
            batch = []


def medians(runs: int, action: Callable[[], object]) -> tuple[float, float]:
    """Median wall and CPU seconds of `action` (on a shared machine the CPU time says more)."""
    walls, cpus = [], []
    for _ in range(runs):
        gc.collect()  # a previous run's objects leave the collector a backlog that is not this run's
        wall, cpu = time.perf_counter(), time.process_time()
        action()
        walls.append(time.perf_counter() - wall)
        cpus.append(time.process_time() - cpu)
    return statistics.median(walls), statistics.median(cpus)


def seconds(runs: int, action: Callable[[], object]) -> str:
    wall, cpu = medians(runs, action)
    return f"{wall:.3f} s (CPU {cpu:.3f} s)"


def report_documents(catalog: Catalog, plans: list[Plan], runs: int, scratch: Path) -> None:
    """Write the plans as a scheduler does, print their size and what writing, reading and checking them costs."""
    from pyspark import cloudpickle  # how Spark pickles a task's function and data

    store = LocalStore(scratch / "documents")
    sizes = {}

    def write() -> None:
        for found in plans:
            sizes[found.plan_id] = write_plan(store, found)

    write_s = seconds(runs, write)
    header_bytes = sum(store.stat(key(p.plan_id)).size for p in plans for key in (plan_key, inputs_key))
    groups = sum(len(p.groups) for p in plans)
    total = sum(sizes.values())
    print(f"  stored: {len(plans)} plans, {groups} groups, {total / 1e6:.1f} MB (headers and input lists "
          f"{header_bytes / 1e6:.1f} MB, groups {(total - header_bytes) / 1e6:.1f} MB), written in {write_s}")
    if not plans:  # nothing due at this mode (a small --files)
        return
    largest = max(plans, key=lambda p: max(g.partitions for g in p.groups))
    group = max(largest.groups, key=lambda g: g.partitions).group
    header_s, _ = medians(runs, lambda: read_header(store, largest.plan_id))
    by_partition = read_partition_bytes(store, largest.plan_id, group)
    driver_s, _ = medians(runs, lambda: read_partition_bytes(store, largest.plan_id, group))
    partitions = sorted(by_partition)
    slice_partitions = partitions[: max(1, len(partitions) // SLICES_PER_GROUP)]
    task_s, _ = medians(runs, lambda: read_group(store, largest.plan_id, group, partitions=slice_partitions, slice=0))
    plan_id = largest.plan_id
    sent = len(cloudpickle.dumps((run_task, GroupSlice(store.uri, plan_id, group, 0, slice_partitions))))
    print(f"  largest plan {plan_id}: header read in {header_s:.3f} s (the commit); group {group} of "
          f"{len(partitions):,} partitions: bytes per partition read in {driver_s:.3f} s (a Spark driver), a slice "
          f"of {len(slice_partitions):,} partitions in {task_s:.3f} s (a task, sent {sent:,} bytes)")
    # What the commit does before committing a stored plan: its documents against the seal kept with its lease,
    # and its header against the catalog; and what `compact --plan` does with a plan from outside: all of it.
    snapshot = catalog.snapshot(set_aside=frozenset(largest.set_aside))
    header = read_header(store, plan_id)
    sealed = seal(plan_documents(largest))

    def commit_check() -> None:
        check_seal(store, header, sealed)
        header.check_against(snapshot, NOW)

    commit_s, _ = medians(runs, commit_check)
    try:
        full_s, _ = medians(runs, lambda: read_plan(store, plan_id).check_against(snapshot, NOW))
        in_full = f"in {full_s:.3f} s"
    except CorruptDataError as refused:
        # This catalog's first offsets are drawn, not assigned: the gaps between them are no compaction's holes.
        in_full = f"refused as the catalog's offsets leave gaps no hole explains ({str(refused)[:90]}...)"
    print(f"  largest plan checked before its commit in {commit_s:.3f} s (documents against their seal, "
          f"{sizes[plan_id] / 1e6:.1f} MB read; header against the catalog); checked in full, as `compact --plan` "
          f"does, {in_full} ({len(largest.inputs):,} files)")


def catalog_arguments(description: str | None) -> argparse.ArgumentParser:
    """The options of the benchmarks over this catalog (this one and bench/status.py)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--sections", type=int, default=4)
    parser.add_argument("--database", help="catalog URL (default: SQLite beside the store)")
    parser.add_argument("--store", type=Path, help="store directory (default: a temporary one)")
    parser.add_argument("--runs", type=int, default=5)
    return parser


def open_catalog(args: argparse.Namespace, scratch: str, sketches: bool = False) -> Catalog:
    """The catalog of --store (or `scratch`) and --database, built unless it already holds --files files."""
    catalog = Catalog(LocalStore(args.store or Path(scratch)), args.database)
    try:
        existing = sum(catalog.snapshot().level_counts().values())
    except ClusterNotFoundError:
        existing = None
    if existing != args.files:
        if existing is not None:
            raise SystemExit(f"{catalog} holds {existing:,} files, not {args.files:,}: use an empty --store or database")
        started = time.perf_counter()
        build(catalog, args.files, args.sections, sketches)
        print(f"built in {time.perf_counter() - started:.1f} s")
    return catalog


def main() -> None:
    parser = catalog_arguments(__doc__)
    parser.add_argument("--mode", choices=["all", *PASSES], default="all", help="which pass to time (default: all)")
    parser.add_argument("--dirty-ratio", default="1", help="the topics' min.cleanable.dirty.ratio while timing (default: 1)")
    parser.add_argument("--passes-only", action="store_true", help="time the planning passes alone, not their inputs loaded whole nor the documents")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-planner-") as scratch:
        catalog = open_catalog(args, scratch)
        for name in catalog.snapshot().topics:
            catalog.alter_topic(name, {"min.cleanable.dirty.ratio": args.dirty_ratio}, NOW)
        print(f"{catalog}: {args.files:,} live files, {args.runs} runs per mode, medians")
        for label, (mode, config) in PASSES.items():
            if args.mode not in ("all", label):
                continue
            plans: list[Plan] = []

            def planned(mode: str = mode, config: PlannerConfig = config, plans: list[Plan] = plans) -> None:
                plans[:] = choose_plans(catalog.snapshot(), NOW, mode, config)

            wall, cpu = medians(args.runs, planned)
            target = args.files * PASS_TARGET_S_PER_FILE
            print(f"{label:8} planned in {wall:.3f} s (CPU {cpu:.3f} s): {len(plans)} plans over {sum(len(p.inputs) for p in plans):,} files "
                  f"(target <= {target:g} s: {'met' if wall <= target else 'MISSED'})")
            if wall > target:
                with sampled(label=f"one {label} pass", rate=200) as profile:  # py-spy on the other core
                    planned()
                print("  what would close it: bench/README.md, Where the misses come from\n  " + profile.summary().replace("\n", "\n  "))
            if args.passes_only:
                continue
            # Each plan's sections are read as columns once, for its hidden offsets and its stored documents, which
            # are then encoded from them.
            read, read_cpu = time.perf_counter(), time.process_time()
            sections = sum(len(input_sections(p.inputs)) for p in plans)
            print(f"  inputs' sections read as columns ({sections:,} sections, a query per plan) in {time.perf_counter() - read:.3f} s "
                  f"(CPU {time.process_time() - read_cpu:.3f} s), once, for the documents and the hidden offsets")
            report_documents(catalog, plans, args.runs, Path(scratch))
        catalog.engine.dispose()


if __name__ == "__main__":
    with recorded():
        main()
