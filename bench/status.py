"""`logcompact status` over a large catalog: what the monitor (the logcompact_metrics DAG, every 5 minutes) pays.

    .venv/bin/python bench/status.py [--files 100000] [--sections 4] [--database URL] [--store DIR] [--runs 5]

Builds the planner benchmark's catalog (bench/planner.py: 64 compacted topics of 16 partitions, levels L0 to
L4, a max lag on half the topics), here with a key sketch in every section, in SQLite beside a local store (a
temporary one unless --store names a directory; a catalog already there with as many files is reused) or in
the database --database names. Then times, as medians of the wall clock and the process's CPU time:

- `cluster_status`, catalog reads included (what `logcompact status --json` and the metrics DAG run);
- its catalog query alone (`Snapshot.section_figures` over the compacted topics, the collector paused as there);
- its readable table (`ClusterStatus.describe`).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner import NOW, build, seconds

from logcompact.catalog import Catalog
from logcompact.collector import collector_paused
from logcompact.exceptions import ClusterNotFoundError
from logcompact.status import cluster_status
from logcompact.store import LocalStore


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--sections", type=int, default=4)
    parser.add_argument("--database", help="catalog URL (default: SQLite beside the store)")
    parser.add_argument("--store", type=Path, help="store directory (default: a temporary one)")
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-") as scratch:
        catalog = Catalog(LocalStore(args.store or Path(scratch)), args.database)
        try:
            existing = sum(catalog.snapshot().level_counts().values())
        except ClusterNotFoundError:
            existing = None
        if existing != args.files:
            if existing is not None:
                raise SystemExit(f"{catalog} holds {existing:,} files, not {args.files:,}: use an empty --store or database")
            started = time.perf_counter()
            build(catalog, args.files, args.sections, sketches=True)
            print(f"built in {time.perf_counter() - started:.1f} s")
        status = cluster_status(catalog, NOW)
        sections = sum(p.sections for p in status.partitions)
        print(f"{catalog}: {args.files:,} live files, {sections:,} sections of {len(status.partitions):,} partitions, "
              f"{args.runs} runs, medians")
        snapshot = catalog.snapshot()
        topics = sorted(snapshot.topics)
        print(f"  cluster_status        {seconds(args.runs, lambda: cluster_status(catalog, NOW))}")
        with collector_paused():  # as cluster_status reads it
            print(f"  section_figures query {seconds(args.runs, lambda: snapshot.section_figures(topics))}")
        print(f"  describe (the table)  {seconds(args.runs, status.describe)}")
        catalog.engine.dispose()


if __name__ == "__main__":
    main()
