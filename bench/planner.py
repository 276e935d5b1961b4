"""Planning time over a large catalog: 100,000 live files, each with sections of several partitions.

    .venv/bin/python bench/planner.py [--files 100000] [--sections 4]

Builds a manifest in memory (levels L0 to L4, sizes spread over six orders of magnitude, 64 topics of 16
partitions, a max lag on half of them) and times each planner mode, median of 5 runs. Target: under 1 s.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time
from types import MappingProxyType

import numpy as np

from logcompact.catalog import CatalogSection, DataFile, Manifest
from logcompact.format.layout import SectionInfo
from logcompact.planner import plan
from logcompact.topics import Topic

NOW = 1_700_000_000_000


def build(files: int, sections: int) -> Manifest:
    rng = np.random.default_rng(5)
    topics = {
        f"t{n}": Topic.create(
            f"t{n}", 16, {"cleanup.policy": "compact", **({"max.compaction.lag.ms": "86400000"} if n % 2 else {})}, NOW
        )
        for n in range(64)
    }
    levels = rng.choice(5, size=files, p=[0.01, 0.02, 0.17, 0.3, 0.5])
    sizes = (10 ** rng.uniform(3, 9, size=files)).astype(np.int64)
    made = {}
    for n in range(files):
        placed = []
        for s in sorted({(int(t), int(p)) for t, p in zip(rng.integers(0, 64, sections), rng.integers(0, 16, sections))}):
            info = SectionInfo(f"t{s[0]}", s[1], 100, 99, NOW - 10**8, NOW - 10**7, 0, 10_000, "lz4", 0, 16, 1000, 0)
            placed.append(CatalogSection(info, n * 100))
        key = f"data/l{levels[n]}/f{n:07d}.seg"
        made[key] = DataFile(key, int(levels[n]), int(sizes[n]), NOW, tuple(placed))
    return Manifest(
        cluster_id="bench", version=1, commit_id="x", created_ms=NOW, operation="bench",
        topics=MappingProxyType(topics), next_offsets=MappingProxyType({t: (10**9,) * 16 for t in topics}),
        files=MappingProxyType(made),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--sections", type=int, default=4)
    args = parser.parse_args()
    manifest = build(args.files, args.sections)
    print(f"catalog: {len(manifest.files):,} files, {sum(len(f.sections) for f in manifest.files.values()):,} sections")
    for mode in ("regular", "max-lag", "full"):
        timings, plans = [], []
        for _ in range(5):
            fresh = build(args.files, args.sections) if not timings else manifest  # the first run also indexes
            gc.collect()  # the catalog's construction leaves the collector a backlog that is not planning's
            started = time.perf_counter()
            plans = plan(fresh, NOW, mode)
            timings.append(time.perf_counter() - started)
        inputs = sum(len(p.inputs) for p in plans)
        print(f"{mode:8} {statistics.median(timings):.3f} s median (first run, with indexing: {timings[0]:.3f} s): "
              f"{len(plans)} plans over {inputs:,} files")


if __name__ == "__main__":
    main()
