"""How long the simulator takes over the WarpStream-like workload: the cost of every figure in docs/planner.md.

    .venv/bin/python bench/simulator.py [--hours 0.5] [--dirty-ratio 0.5]

Runs `WARPSTREAM_LIKE` (10 agents, 10 topics of 100 partitions, 1 million keys; docs/planner.md) for --hours
simulated hours with logcompact's planner at the topics' min.cleanable.dirty.ratio, on one core, and prints the
wall clock and CPU time it took, the time per simulated hour, and the run's figures (write amplification,
deduplication delay, max-lag violations, duplicates and files at rest), which must not change when only its speed
does. The target: a simulated day in 5 minutes. The live files, not the history, make a simulated hour's
cost (the catalog is held in memory and forgets removed files), but time the hours you quote.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from profiling import sampled
from regime import machine
from results import recorded

from logcompact.lab.simulate import LOGCOMPACT, WARPSTREAM_LIKE, Simulation

DAY_TARGET_S = 300


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--hours", type=float, default=0.5, help="simulated hours (default 0.5)")
    parser.add_argument("--dirty-ratio", type=float, default=0.5, help="the topics' min.cleanable.dirty.ratio (default 0.5, Kafka's)")
    args = parser.parse_args()
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    print(f"machine: {machine()}")
    workload = replace(WARPSTREAM_LIKE, hours=args.hours, min_cleanable_dirty_ratio=args.dirty_ratio)
    with sampled(label="the simulator", rate=20) as profile:  # py-spy on the other core
        wall, cpu = time.perf_counter(), time.process_time()
        result = Simulation("logcompact", workload, LOGCOMPACT).run()
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    day = wall / args.hours * 24
    print(f"WARPSTREAM_LIKE, {args.hours:g} simulated hours at dirty ratio {args.dirty_ratio:g}: {wall:.1f} s (CPU {cpu:.1f} s), "
          f"{wall / args.hours:.0f} s a simulated hour, a day at this pace {day:.0f} s (target <= {DAY_TARGET_S} s: "
          f"{'met' if day <= DAY_TARGET_S else 'MISSED'})")
    for name, value in result.summary().items():
        print(f"  {name}: {value}")
    if day > DAY_TARGET_S:
        print(f"what would close it: bench/README.md, Where the misses come from\n{profile.summary()}")


if __name__ == "__main__":
    with recorded():
        main()
