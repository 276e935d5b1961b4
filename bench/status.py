"""`logcompact status` over a large catalog: what the monitor (the logcompact_metrics DAG, every 5 minutes) pays.

    .venv/bin/python bench/status.py [--files 100000] [--sections 4] [--database URL] [--store DIR] [--runs 5]

Builds the planner benchmark's catalog (bench/planner.py: 64 compacted topics of 16 partitions, levels L0 to
L4, a max lag on half the topics), here with a key sketch in every section, in SQLite beside a local store (a
temporary one unless --store names a directory; a catalog already there with as many files is reused, so give
this benchmark a --store of its own: the planner benchmark's has no sketches) or in
the database --database names. Then times, as medians of the wall clock and the process's CPU time:

- `cluster_status`, catalog reads included (what `logcompact status --json` and the metrics DAG run);
- its catalog reads alone: the partitions' summaries above L0 (`Snapshot.summaries_above_l0`) and the live L0
  sections (`Snapshot.section_figures`), what it reads in place of every live section; the partitions' last
  stable offsets and open transactions (`Snapshot.stability`);
- its readable table (`ClusterStatus.describe`);
- `cluster_status(..., worst=20)` (`logcompact status --worst 20`) and its table.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from planner import NOW, catalog_arguments, open_catalog, seconds
from results import recorded

from logcompact.status import cluster_status

WORST = 20  # `logcompact status --worst 20`: what an operator of a large cluster reads first


def main() -> None:
    args = catalog_arguments(__doc__).parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-status-") as scratch:
        catalog = open_catalog(args, scratch, sketches=True)
        status = cluster_status(catalog, NOW)
        sections = sum(p.sections for p in status.partitions)
        print(f"{catalog}: {args.files:,} live files, {sections:,} sections of {len(status.partitions):,} partitions, "
              f"{args.runs} runs, medians")
        snapshot = catalog.snapshot()
        topics = sorted(snapshot.topics)
        partitions = [(name, p) for name in topics for p in range(snapshot.topics[name].partitions)]
        print(f"  cluster_status        {seconds(args.runs, lambda: cluster_status(catalog, NOW))}")
        print(f"  summaries above L0    {seconds(args.runs, lambda: snapshot.summaries_above_l0(partitions))}")
        print(f"  L0 sections           {seconds(args.runs, lambda: snapshot.section_figures(topics, in_l0=True))}")
        print(f"  LSOs, open txns       {seconds(args.runs, lambda: snapshot.stability(topics))}")
        print(f"  describe (the table)  {seconds(args.runs, status.describe)}")
        worst = cluster_status(catalog, NOW, worst=WORST)
        print(f"  {f'--worst {WORST}':<22}{seconds(args.runs, lambda: cluster_status(catalog, NOW, worst=WORST))}")
        print(f"  its table             {seconds(args.runs, worst.describe)}")
        catalog.engine.dispose()


if __name__ == "__main__":
    with recorded():
        main()
