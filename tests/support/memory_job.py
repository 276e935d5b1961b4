"""Write a synthetic log, or run one deduplicating job over it and print the peak RSS (the memory test).

    python -m tests.support.memory_job write WORKDIR RECORDS_PER_KEY   # writes the files and plan.json
    python -m tests.support.memory_job run WORKDIR                     # prints {"rss_peak_kib": ...}

Two processes, so the peak measured is the job's alone.
"""

from __future__ import annotations

import json
import resource
import sys
from pathlib import Path

from lab.synthetic import NOW, write_compacted_log
from logcompact.engine.cleaner import run_plan
from logcompact.plans import Plan, plan_from_json, plan_to_json
from logcompact.store import LocalStore
from logcompact.topics import Topic


def main() -> None:
    command, workdir = sys.argv[1], Path(sys.argv[2])
    store = LocalStore(workdir / "store")
    if command == "write":
        files, _ = write_compacted_log(store, "t", 20_000, int(sys.argv[3]), 1000, partitions=1, files=4)
        plan = Plan(
            plan_id="p1-00000000cafe", cluster_id="c", manifest_version=1, now_ms=NOW + 10**9, target_level=2, deduplicate=True,
            inputs=tuple(files), topics={"t": Topic.create("t", 1, {"cleanup.policy": "compact"}, NOW)},
            buffer_bytes=8 << 20,
        )
        (workdir / "plan.json").write_text(plan_to_json(plan))
        return
    plan = plan_from_json((workdir / "plan.json").read_text())
    result = run_plan(store, plan)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    print(json.dumps({"rss_peak_kib": peak, "bytes_in": result.stats.bytes_in, "records_out": result.stats.records_out}))


if __name__ == "__main__":
    main()
