"""A time-compressed run of ingest, the planner and the engine's cost model over simulated hours.

Agents flush an L0 file every 250 ms; every 32 L0 files (from all agents) are copied into one L1 file
holding a section per topic-partition that received records, whose key sketches are drawn from the workload
(keys from a Zipf or uniform distribution over all partitions of all topics, a tombstone rate). Files live in
a catalog held in memory (`simulate/catalog.py`, checked against the real one, SQLite in a temporary directory,
which `real_catalog` runs on; no data is written): L1 files are appended as agents append theirs (together, just
before the catalog is next read, which changes nothing it returns), and the real planner reads its snapshots as
in production whenever a level reaches its threshold, the max-lag pass runs on its interval and the full sweep
once a day; each plan's outputs come from the cost model and are committed at once.

Reported: write amplification, GETs and PUTs per ingested GiB, live files per level over time, the
fraction of duplicate records at rest, the delay from produce to first deduplication against all older
data of the partition (percentiles), and max-lag violations (records first so deduplicated more than
30 minutes after they became dirty, or never).
"""

from __future__ import annotations

import tempfile
from dataclasses import asdict, dataclass, field, replace
from itertools import repeat
from pathlib import Path

import numpy as np

from logcompact import sketch
from logcompact.catalog import Catalog, NewFile, PlanningSnapshot, TopicPartition
from logcompact.collector import collector_paused
from logcompact.format.layout import SectionInfo
from logcompact.keys import DATA_PREFIX
from logcompact.lab.simulate.catalog import MemoryCatalog
from logcompact.lab.simulate.cost import SECTION_OVERHEAD_BYTES, estimate_job
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import Plan
from logcompact.store import LocalStore
from logcompact.topics import MIN_MAX_COMPACTION_LAG_MS, Topic
from logcompact.units import HOUR_MS, GiB

FLUSH_MS = 250
L0_BATCH = 32
SAMPLE_MS = 10 * 60_000
# WarpStream's promise: a record is compacted within 30 minutes of becoming dirty. Every planner is held to it.
MAX_LAG_GRACE_MS = 30 * 60_000


@dataclass(frozen=True)
class Workload:
    agents: int = 1
    records_per_s: float = 1000.0  # per agent
    record_bytes: int = 136
    keys: int = 100_000
    key_skew: float = 0.0  # Zipf exponent; 0: uniform
    tombstone_rate: float = 0.01
    partitions: int = 8  # per topic
    topics: int = 1
    hours: float = 24.0
    max_lag_ms: int | None = None
    min_lag_ms: int = 0
    min_cleanable_dirty_ratio: float = 0.5  # the topics'; 1.0: a top level is taken again only by tiers and the sweep


@dataclass
class Cohorts:
    """Records followed until their first deduplication, one entry per partition and L1 file they were ingested in:
    the partition's slot (see `Simulation._slot`), when they were produced (on average), how many."""

    slots: np.ndarray
    produced_ms: np.ndarray
    records: np.ndarray

    @classmethod
    def concat(cls, parts: list[Cohorts]) -> Cohorts:
        return cls(*(np.concatenate([getattr(p, name) for p in parts]) for name in ("slots", "produced_ms", "records")))

    def take(self, mask: np.ndarray) -> Cohorts:
        return Cohorts(self.slots[mask], self.produced_ms[mask], self.records[mask])


@dataclass
class SimulationResult:
    name: str
    workload: dict
    bytes_ingested: int = 0
    bytes_written: int = 0
    gets: int = 0
    puts: int = 0
    jobs: int = 0
    write_amplification: float = 0.0
    gets_per_gib: float = 0.0
    puts_per_gib: float = 0.0
    dedup_delay_s: dict = field(default_factory=dict)
    # From the end of a record's min lag (produce + min.compaction.lag.ms) to its first deduplication against all
    # older data: how long min lag's hold outlives it (p50, p99, max).
    past_min_lag_s: dict = field(default_factory=dict)
    max_lag_violations: int = 0
    max_minutes_past_lag: float = 0.0  # the most a deduplication came after a record's max lag
    duplicate_fraction: list = field(default_factory=list)  # (hour, fraction of records at rest that are duplicates)
    files_per_level: list = field(default_factory=list)  # (hour, [L0, L1, L2, L3, L4])

    def summary(self) -> dict:
        last_duplicates = self.duplicate_fraction[-1][1] if self.duplicate_fraction else 0.0
        return {
            "planner": self.name,
            "write_amplification": round(self.write_amplification, 3),
            "gets_per_gib": round(self.gets_per_gib, 1),
            "puts_per_gib": round(self.puts_per_gib, 1),
            "jobs": self.jobs,
            "dedup_delay_p50_s": self.dedup_delay_s.get("p50"),
            "dedup_delay_p99_s": self.dedup_delay_s.get("p99"),
            "past_min_lag_p99_s": self.past_min_lag_s.get("p99"),
            "past_min_lag_max_s": self.past_min_lag_s.get("max"),
            "max_lag_violations": self.max_lag_violations,
            "max_minutes_past_lag": self.max_minutes_past_lag,
            "duplicates_at_rest_end": round(last_duplicates, 4),
            "live_files_end": sum(self.files_per_level[-1][1]) if self.files_per_level else 0,
        }

    def to_dict(self) -> dict:
        return asdict(self)


def _partitions_with_older_data_outside(found) -> set[TopicPartition]:
    """Partitions for which a live file outside the plan holds data older than the plan's: their records
    were not deduplicated against all older data by this plan."""
    starts: dict[TopicPartition, int] = {}
    for data_file in found.inputs:
        for section in data_file.sections:
            tp = (section.topic, section.partition)
            starts[tp] = min(starts.get(tp, 1 << 62), section.first_offset)
    return {tp for tp, floor in found.outside_floors.items() if floor < starts.get(tp, -1)}


def _mix(values: np.ndarray) -> np.ndarray:
    """splitmix64: key ids to well-spread 64-bit hashes, as the real key hashes are."""
    z = values.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Simulation:
    def __init__(
        self, name: str, workload: Workload, config: PlannerConfig, seed: int = 11, max_lag_every_ms: int | None = None,
        sweep_every_ms: int = 24 * HOUR_MS, real_catalog: bool = False,
    ) -> None:
        """`max_lag_every_ms`: how often the max-lag pass really runs (its DAG's schedule); by default the interval
        the planner is told, `config.max_lag_pass_interval_ms`. `sweep_every_ms`: how often the full sweep runs (daily).
        `real_catalog`: run on the real catalog (SQLite in a temporary directory) rather than the one in memory, which
        is checked against it."""
        self.name = name
        self.real_catalog = real_catalog
        self.workload = workload
        self.config = config
        self.max_lag_every_ms = max_lag_every_ms or config.max_lag_pass_interval_ms
        self.sweep_every_ms = sweep_every_ms
        self.rng = np.random.default_rng(seed)
        settings = {"cleanup.policy": "compact", "min.compaction.lag.ms": str(workload.min_lag_ms),
                    "min.cleanable.dirty.ratio": str(workload.min_cleanable_dirty_ratio)}
        if workload.max_lag_ms is not None:
            settings["max.compaction.lag.ms"] = str(workload.max_lag_ms)
        width = len(str(workload.topics - 1))  # names sort as their numbers, as sections are ordered
        self.topics = [Topic.create(f"t{number:0{width}d}", workload.partitions, settings, 0) for number in range(workload.topics)]
        self._topic_numbers = {topic.name: number for number, topic in enumerate(self.topics)}
        self._slot_topics = [topic.name for topic in self.topics for _ in range(workload.partitions)]  # by `_slot`
        self.lag = max(workload.max_lag_ms, MIN_MAX_COMPACTION_LAG_MS) if workload.max_lag_ms is not None else None
        self.catalog: Catalog | MemoryCatalog | None = None  # made by run()
        self.cohorts: dict[str, Cohorts] = {}  # by the key of the live file that holds them
        self.delays: list[tuple[np.ndarray, np.ndarray]] = []  # (seconds to deduplication, records)
        self.result = SimulationResult(name, asdict(workload))
        self._sequence = 0
        self._unappended: list[NewFile] = []  # L1 files made since the catalog was last read
        self._l1_appended = 0  # live L1 files in the catalog (the unappended ones are live too)
        if workload.key_skew > 0:
            weights = 1.0 / np.arange(1, workload.keys + 1) ** workload.key_skew
            self._key_p = weights / weights.sum()
        else:
            self._key_p = None

    # -- ingest ----------------------------------------------------------------------------------

    def _slot(self, tp: TopicPartition) -> int:
        """A partition's number among all partitions of all topics, topic-major."""
        return self._topic_numbers[tp[0]] * self.workload.partitions + tp[1]

    def _ingest(self, start_ms: int, end_ms: int, records: int) -> None:
        """32 L0 files' worth of records, copied into one L1 file (appended with the next catalog read, which
        places its offsets), and followed as cohorts. Key k belongs to slot k mod (topics x partitions)."""
        w = self.workload
        keys = self.rng.choice(w.keys, size=records, p=self._key_p)
        slots = keys % (w.topics * w.partitions)
        order = np.argsort(slots, kind="stable")
        counts = np.bincount(slots, minlength=w.topics * w.partitions)
        present = np.flatnonzero(counts)
        counts = counts[present]
        sketches = sketch.encode_many(np.repeat(np.arange(len(present)), counts), _mix(keys[order]), len(present))
        tombstones = self.rng.binomial(counts, w.tombstone_rate)
        sizes = counts * w.record_bytes + SECTION_OVERHEAD_BYTES
        ends = np.cumsum(sizes)
        # Built positionally from columns, in SectionInfo's field order: a simulated hour makes 4.5 million.
        sections = tuple(map(
            SectionInfo, map(self._slot_topics.__getitem__, present.tolist()), (present % w.partitions).tolist(), counts.tolist(),
            (counts - 1).tolist(), repeat(start_ms), repeat(end_ms), tombstones.tolist(), (counts * w.record_bytes).tolist(), repeat("lz4"),
            repeat(0), (ends - sizes).tolist(), sizes.tolist(), repeat(0), sketches,
        ))
        self._sequence += 1
        key = f"{DATA_PREFIX}l1/ingest-{self._sequence:09d}.seg"
        self._unappended.append(NewFile(key, 1, int(ends[-1]), end_ms, sections))
        self.cohorts[key] = Cohorts(present, np.full(len(present), (start_ms + end_ms) // 2), counts)

    def _snapshot(self, now: int) -> PlanningSnapshot:
        """The catalog as of now: the L1 files made since it was last read are appended first, in one commit."""
        if self._unappended:
            self._catalog.append_files(self._unappended, now)
            self._l1_appended += len(self._unappended)
            self._unappended = []
        return self._catalog.snapshot()

    @property
    def _catalog(self) -> Catalog | MemoryCatalog:
        if self.catalog is None:
            raise RuntimeError("the simulator's catalog exists only while run() runs")
        return self.catalog

    # -- planning and applying -----------------------------------------------------------------------

    def _run(self, mode: str, now: int) -> None:
        for found in choose_plans(self._snapshot(now), now, mode, self.config):
            cost = estimate_job(found)
            result = self.result
            result.jobs += 1
            result.gets += cost.gets
            result.puts += cost.puts
            result.bytes_written += cost.bytes_out
            carried, young = self._split_young(found, cost.first_uncleanable)
            if found.deduplicate:
                incomplete = [self._slot(tp) for tp in _partitions_with_older_data_outside(found)]
                done = ~np.isin(carried.slots, incomplete)
                self._deduplicated(carried.take(done), now)
                carried = carried.take(~done)
            self._catalog.replace_files([f.key for f in found.inputs], cost.outputs, now, plan_id=found.plan_id)
            for output in cost.outputs:
                held = [self._slot((s.topic, s.partition)) for s in output.sections]
                followed = young if output.key in cost.young_outputs else carried
                self.cohorts[output.key] = followed.take(np.isin(followed.slots, held))
        self._l1_appended = self._catalog.snapshot().level_counts().get(1, 0)

    def _split_young(self, found: Plan, first_uncleanable: dict[TopicPartition, int]) -> tuple[Cohorts, Cohorts]:
        """The cohorts of a plan's inputs: those the job deduplicates, and those of the sections it keeps whole for min
        lag (from each partition's first uncleanable offset on), which go to its young files."""
        kept, young = [], []
        for data_file in found.inputs:
            cohorts = self.cohorts.pop(data_file.key)
            held_back = [self._slot((s.topic, s.partition)) for s in data_file.sections
                         if s.first_offset >= first_uncleanable.get((s.topic, s.partition), 1 << 62)]
            mask = np.isin(cohorts.slots, held_back)
            kept.append(cohorts.take(~mask))
            young.append(cohorts.take(mask))
        return Cohorts.concat(kept), Cohorts.concat(young)

    def _deduplicated(self, cohorts: Cohorts, now: int) -> None:
        self.delays.append(((now - cohorts.produced_ms) / 1000, cohorts.records))
        self.result.max_lag_violations += self._late(cohorts, now)
        if self.lag is not None and cohorts.records.any():
            past_lag = (now - cohorts.produced_ms[cohorts.records > 0] - self.lag).max() / 60_000
            self.result.max_minutes_past_lag = max(self.result.max_minutes_past_lag, round(float(past_lag), 1))

    def _late(self, cohorts: Cohorts, now: int) -> int:
        """Records of `cohorts` that are past their max lag and its grace at `now`."""
        if self.lag is None:
            return 0
        return int(cohorts.records[now > cohorts.produced_ms + self.lag + MAX_LAG_GRACE_MS].sum())

    # -- the clock ---------------------------------------------------------------------------------

    def run(self) -> SimulationResult:
        # A run builds millions of sections, plans and cohorts: the collector stays paused, as in the planner.
        with collector_paused():
            if not self.real_catalog:
                self.catalog = MemoryCatalog(self.topics)
                return self._simulate()
            with tempfile.TemporaryDirectory(prefix="logcompact-simulate-") as directory:
                self.catalog = catalog = Catalog(LocalStore(Path(directory)))
                catalog.ensure_created(0)
                for topic in self.topics:
                    catalog.create_topic(topic, 0)
                try:
                    return self._simulate()
                finally:
                    catalog.engine.dispose()

    def _simulate(self) -> SimulationResult:
        w, result = self.workload, self.result
        batch_ms = FLUSH_MS * L0_BATCH // w.agents  # time for all agents to write 32 L0 files
        records_per_batch = w.records_per_s * w.agents * batch_ms / 1000
        end = int(w.hours * HOUR_MS)
        next_max_lag = self.max_lag_every_ms
        next_sweep = self.sweep_every_ms
        next_sample = 0
        regular_due = False
        now = 0
        while now < end:
            start, now = now, now + batch_ms
            records = int(self.rng.poisson(records_per_batch))
            if records:
                self._ingest(start, now, records)
                result.bytes_ingested += records * w.record_bytes
                result.bytes_written += 2 * records * w.record_bytes  # the L0 files, then their L1 copy
                result.puts += 2 * L0_BATCH + 2  # 32 L0 files and their commits; the L1 file and its commit
                result.gets += L0_BATCH
                result.jobs += 1
                regular_due = True
            if regular_due and self._l1_appended + len(self._unappended) >= self.config.min_files[1]:
                self._run("regular", now)
                regular_due = False
            if self.lag is not None and now >= next_max_lag:
                self._run("max-lag", now)
                next_max_lag += self.max_lag_every_ms
            if now >= next_sweep:
                self._run("full", now)
                self._run("regular", now)
                next_sweep += self.sweep_every_ms
            if now >= next_sample:
                self._sample(now)
                next_sample += SAMPLE_MS
        self._sample(now)
        self._finish(end)
        return result

    def _sample(self, now: int) -> None:
        files = self._snapshot(now).files()
        levels = [0] * 5
        for data_file in files:
            levels[data_file.level] += 1
        levels[0] = L0_BATCH // 2  # L0 files waiting for their batch: half a batch on average
        hour = round(now / HOUR_MS, 3)
        self.result.files_per_level.append((hour, levels))
        by_partition: dict[TopicPartition, tuple[int, np.ndarray]] = {}
        for data_file in files:
            for section in data_file.sections:
                tp = (section.topic, section.partition)
                count, registers = by_partition.get(tp, (0, None))
                found = sketch.decode(section.info.key_sketch)
                by_partition[tp] = (count + section.info.record_count, found if registers is None else np.maximum(registers, found))
        records = sum(count for count, _ in by_partition.values())
        distinct = sum(min(count, round(sketch.estimate(registers))) for count, registers in by_partition.values())
        self.result.duplicate_fraction.append((hour, (records - distinct) / records if records else 0.0))

    def _finish(self, end: int) -> None:
        result = self.result
        result.max_lag_violations += sum(self._late(cohorts, end) for cohorts in self.cohorts.values())
        gib = result.bytes_ingested / GiB
        result.write_amplification = result.bytes_written / result.bytes_ingested if result.bytes_ingested else 0.0
        result.gets_per_gib = result.gets / gib if gib else 0.0
        result.puts_per_gib = result.puts / gib if gib else 0.0
        delays = np.concatenate([d for d, _ in self.delays]) if self.delays else np.zeros(0)
        if len(delays):
            weights = np.concatenate([n for _, n in self.delays]).astype(np.float64)
            result.dedup_delay_s = _percentiles(delays, weights)
            past = np.maximum(delays - self.workload.min_lag_ms / 1000, 0.0)
            result.past_min_lag_s = {**_percentiles(past, weights), "max": round(float(past[weights > 0].max(initial=0.0)), 1)}


def _percentiles(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """p50, p90 and p99 of `values`, each weighing as many records as its weight."""
    order = np.argsort(values)
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return {f"p{q}": round(float(values[order][np.searchsorted(cumulative, q / 100)]), 1) for q in (50, 90, 99)}


def compare(workload: Workload, runs: dict[str, tuple[PlannerConfig, float]]) -> list[SimulationResult]:
    """Run each (planner, topics' min.cleanable.dirty.ratio) on the same workload (same seed, so the same records)."""
    return [
        Simulation(name, replace(workload, min_cleanable_dirty_ratio=ratio), config).run() for name, (config, ratio) in runs.items()
    ]

