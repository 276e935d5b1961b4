"""Planning time over a large catalog in a real database: 100,000 live files, each with sections of several partitions.

    .venv/bin/python bench/planner.py [--files 100000] [--sections 4] [--database URL] [--store DIR] [--runs 5]

Builds a catalog (levels L0 to L4, sizes spread over six orders of magnitude, 64 topics of 16 partitions, a
max lag on half of them) in SQLite beside a local store (a temporary one unless --store names a directory;
a catalog already there with as many files is reused), or in the database --database names
(postgresql+psycopg://...), inserting files in batches of 20,000 through `Catalog.replace_files`. Then times
`plan(catalog.snapshot(), ...)` for each mode, catalog reads included, and prints the medians. In this
catalog every mode plans nearly every file; the last line is a regular pass in which only L0 is due (1% of
the files), what most passes of a running cluster are. Targets: 1 s at 100,000 files, 3 s at 300,000.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from logcompact.catalog import Catalog, CatalogSection, DataFile
from logcompact.exceptions import ClusterNotFoundError
from logcompact.format.layout import SectionInfo
from logcompact.planner import PlannerConfig, plan
from logcompact.store import LocalStore
from logcompact.topics import Topic

NOW = 1_700_000_000_000
BATCH = 20_000
PASSES = [
    ("regular", "regular", PlannerConfig()),
    ("max-lag", "max-lag", PlannerConfig()),
    ("full", "full", PlannerConfig()),
    ("L0 only", "regular", PlannerConfig(min_files=(32, 10**9, 10**9, 10**9), tier_min_files=10**9)),
]


def build(catalog: Catalog, files: int, sections: int) -> None:
    rng = np.random.default_rng(5)
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
        for number, (topic, partition) in enumerate(sorted(chosen)):
            info = SectionInfo(
                f"t{topic}", partition, 100, 99, NOW - 10**8, NOW - 10**7, 0, 10_000, "lz4", 0, 16 + 1000 * number, 1000, 0
            )
            placed.append(CatalogSection(info, n * 100))
        key = f"data/l{levels[n]}/f{n:07d}.seg"
        batch.append(DataFile(key, int(levels[n]), int(sizes[n]), NOW, tuple(placed)))
        if len(batch) == BATCH or n == files - 1:
            catalog.replace_files([], batch, NOW)
            batch = []


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--sections", type=int, default=4)
    parser.add_argument("--database", help="catalog URL (default: SQLite beside the store)")
    parser.add_argument("--store", type=Path, help="store directory (default: a temporary one)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-planner-") as scratch:
        catalog = Catalog(LocalStore(args.store or Path(scratch)), args.database)
        try:
            existing = sum(catalog.snapshot().level_counts().values())
        except ClusterNotFoundError:
            existing = None
        if existing != args.files:
            if existing is not None:
                raise SystemExit(f"{catalog} holds {existing:,} files, not {args.files:,}: use an empty --store or database")
            started = time.perf_counter()
            build(catalog, args.files, args.sections)
            print(f"built in {time.perf_counter() - started:.1f} s")
        print(f"{catalog}: {args.files:,} live files, {args.runs} runs per mode")
        for label, mode, config in PASSES:
            timings, plans = [], []
            for _ in range(args.runs):
                gc.collect()  # the previous run's plans leave the collector a backlog that is not this run's
                started = time.perf_counter()
                plans = plan(catalog.snapshot(), NOW, mode, config)
                timings.append(time.perf_counter() - started)
            inputs = sum(len(p.inputs) for p in plans)
            print(f"{label:8} {statistics.median(timings):.3f} s median (min {min(timings):.3f}, max {max(timings):.3f}): "
                  f"{len(plans)} plans over {inputs:,} files")
        catalog.engine.dispose()


if __name__ == "__main__":
    main()
