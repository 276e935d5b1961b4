"""Min lag against Kafka's rule at scale, across compaction rounds and an advancing clock.

A compacted topic under min.compaction.lag.ms takes `--messages` records in small produce calls: keys drawn
from a few thousand, 10% tombstones, timestamps out of order (up to three lags old) and some in the future.
Between produce calls, at a clock that moves on, run level passes (every plan a regular pass makes, each
committed), full sweeps and gc. After each pass, what `consume` reads of every partition must equal the
reference model (lab/reference_model.py: Kafka's rule, with segments of its own: one per produce call per
partition, a job's survivors cut at its first record within the lag), and the catalog's sections must be the
model's segments. A seed stops at its first difference, printed with the step that made it.

    .venv/bin/python bench/min_lag_campaign.py                                # 200,000 messages, seeds 1 2 3
    .venv/bin/python bench/min_lag_campaign.py --messages 20000 --seeds 7
    .venv/bin/python bench/min_lag_campaign.py --records-only    # records alone, not the catalog's sections

Before compactions cut their output at the first young record, every seed failed after a sweep:
keys kept 2 to 4 records below the first file holding a young record, where Kafka keeps one.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

# The lab (lab/: throw-away servers, the campaigns' harness, the reference model) is in the checkout, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.reference_model import ModelRecord, ReferenceLog
from logcompact.catalog import Catalog
from logcompact.consume import read_records, read_sections
from logcompact.ingest import Agent, Record
from logcompact.jobs import collect_garbage, run_and_commit
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.store import LocalStore
from logcompact.topics import Topic

NOW = 1_700_000_000_000
TOPIC = "state"


class Campaign:
    def __init__(self, directory: Path, seed: int, partitions: int, keys: int, lag_ms: int, sections: bool = True) -> None:
        self.rng = random.Random(seed)
        self.catalog = Catalog(LocalStore(directory))
        self.catalog.ensure_created(NOW)
        config = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(lag_ms), "delete.retention.ms": str(5 * lag_ms)}
        self.topic = Topic.create(TOPIC, partitions, config, NOW)
        self.catalog.create_topic(self.topic, NOW)
        self.model = ReferenceLog()
        self.partitions, self.keys, self.lag_ms, self.check_sections = partitions, keys, lag_ms, sections
        self.clock = NOW
        self.counts = {"produce calls": 0, "level passes": 0, "level plans": 0, "sweeps": 0, "gc runs": 0, "checks": 0}

    def produce(self, count: int) -> None:
        rng, lag = self.rng, self.lag_ms
        records = []
        for _ in range(count):
            back = -rng.randint(1, lag) if rng.random() < 0.05 else rng.randint(0, 3 * lag)  # some in the future
            value = None if rng.random() < 0.1 else b"v%d" % rng.randrange(10**6)
            records.append(Record(rng.randrange(self.partitions), b"k%d" % rng.randrange(self.keys), value, self.clock - back))
        with Agent(self.catalog, background=False, clock=lambda: self.clock) as agent:
            future = agent.produce(TOPIC, records)
        offsets = future.result()  # the agent flushes as it closes
        by_partition: dict[int, list[ModelRecord]] = {}
        for record, offset in zip(records, offsets, strict=True):
            by_partition.setdefault(record.partition, []).append(ModelRecord(offset, record.key, record.value, record.timestamp))
        for partition, produced in by_partition.items():
            self.model.produce(TOPIC, partition, produced)
        self.counts["produce calls"] += 1

    def compact(self, mode: str) -> None:
        config = PlannerConfig(min_files=(4,) * 4) if mode == "regular" else PlannerConfig()
        plans = choose_plans(self.catalog.planning_snapshot(self.clock), self.clock, mode, config)
        jobs = []
        for plan in plans:
            job: dict[tuple[str, int], set[int]] = {}
            for data_file in plan.inputs:  # the offsets the job's sections hold, as read
                for section in data_file.sections:
                    tables = read_sections(self.catalog.store, [(data_file.key, section)])
                    job.setdefault((section.topic, section.partition), set()).update(
                        offset for table in tables for offset in table.column("offset").to_pylist()
                    )
            jobs.append((job, plan.deduplicate))
        for plan in plans:
            run_and_commit(self.catalog, plan, self.clock)
        self.model.compact_pass(jobs, {TOPIC: self.topic.config}, self.clock)
        if mode == "regular":
            self.counts["level passes"] += 1
            self.counts["level plans"] += len(plans)
        else:
            self.counts["sweeps"] += 1

    def gc(self) -> None:
        collect_garbage(self.catalog, self.clock, grace_ms=0)
        self.counts["gc runs"] += 1

    def difference(self) -> str | None:
        """The first partition whose records or sections differ from the model's, described; None when none does."""
        self.counts["checks"] += 1
        snapshot = self.catalog.snapshot()
        for partition in range(self.partitions):
            consumed = [(r.offset, r.key, r.value, r.timestamp) for r in read_records(self.catalog.store, snapshot, TOPIC, partition)]
            expected = [(r.offset, r.key, r.value, r.timestamp) for r in self.model.records(TOPIC, partition)]
            if consumed != expected:
                extra = sorted(set(consumed) - set(expected))[:3]
                missing = sorted(set(expected) - set(consumed))[:3]
                return f"partition {partition}: {len(consumed)} records, the model {len(expected)}; extra {extra}, missing {missing}"
            sections = sorted(
                (s.first_offset, s.last_offset, s.info.record_count, s.info.max_timestamp) for _, s in snapshot.sections_of(TOPIC, partition)
            )
            segments = self.model.segments(TOPIC, partition)
            if self.check_sections and sections != segments:
                return f"partition {partition}: sections {sections[:4]}..., the model's segments {segments[:4]}..."
        return None


def run_seed(seed: int, args: argparse.Namespace) -> tuple[str | None, dict[str, int], float]:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="logcompact-min-lag-", dir=args.dir) as tmp:
        campaign = Campaign(Path(tmp), seed, args.partitions, args.keys, args.lag_ms, not args.records_only)
        rng, produced, step = campaign.rng, 0, 0
        while produced < args.messages:
            count = min(args.messages - produced, rng.randint(20, 2 * args.batch - 20))
            campaign.produce(count)
            produced += count
            campaign.clock += rng.randint(0, args.lag_ms // 10)
            draw = rng.random()
            mode = "full" if draw < 0.03 else "regular" if draw < 0.4 else None
            if mode:
                campaign.compact(mode)
            if rng.random() < 0.05:
                campaign.gc()
            step += 1
            if mode and (found := campaign.difference()):
                return f"after produce call {step} and a {mode} pass at clock +{campaign.clock - NOW} ms: {found}", campaign.counts, time.perf_counter() - started
        campaign.clock += 10 * args.lag_ms  # every record old: a last level pass, then a sweep
        for mode in ("regular", "full"):
            campaign.compact(mode)
            if found := campaign.difference():
                return f"at the end, after the {mode} pass: {found}", campaign.counts, time.perf_counter() - started
    return None, campaign.counts, time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200_000)
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--keys", type=int, default=4_000, help="distinct keys over the topic")
    parser.add_argument("--batch", type=int, default=250, help="mean records a produce call")
    parser.add_argument("--lag-ms", type=int, default=60_000)
    parser.add_argument("--records-only", action="store_true", help="compare records, not sections with the model's segments")
    parser.add_argument("--dir", type=Path, default=None, help="where the stores go (a temporary directory)")
    args = parser.parse_args()
    failed = 0
    for seed in args.seeds:
        difference, counts, seconds = run_seed(seed, args)
        failed += difference is not None
        figures = ", ".join(f"{value:,} {name}" for name, value in counts.items())
        print(f"seed {seed}: {'DIFFERS ' + difference if difference else 'matches the model'} ({figures}; {seconds:.0f} s)", flush=True)
    print(f"{len(args.seeds) - failed} of {len(args.seeds)} seeds match the model")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
