"""A time-compressed run of ingest, the planner and the engine's cost model over simulated hours.

Agents flush an L0 file every 250 ms; every 32 L0 files (from all agents) are copied into one L1 file
holding a section per topic-partition that received records, whose key sketches are drawn from the workload
(keys from a Zipf or uniform distribution over all partitions of all topics, a tombstone rate). Files are columns
(`simulate/files.py`: a file's sections as arrays) and live in a catalog held in memory (`simulate/catalog.py`,
checked against the real one, SQLite in a temporary directory, which `real_catalog` runs on; no data is written):
L1 files are appended as agents append theirs (together, just before the catalog is next read, which changes
nothing it returns), and the real planner reads its snapshots as in production whenever a level reaches its
threshold, the max-lag pass runs on its interval and the full sweep once a day; each plan's outputs come from the
cost model, on its inputs' columns, and are committed at once.

Reported: write amplification, GETs and PUTs per ingested GiB, live files per level over time, the
fraction of duplicate records at rest, the delay from produce to first deduplication against all older
data of the partition (percentiles), and max-lag violations (records first so deduplicated more than
30 minutes after they became dirty, or never).
"""

from __future__ import annotations

import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Protocol

import numpy as np

from logcompact import sketch
from logcompact.catalog import Catalog, CommitResult, PlanningSnapshot, TopicPartition
from logcompact.collector import collector_paused
from logcompact.keys import DATA_PREFIX
from logcompact.lab.simulate.catalog import MemoryCatalog
from logcompact.lab.simulate.cost import SECTION_OVERHEAD_BYTES, estimate_job
from logcompact.lab.simulate.files import Layout, SimulatedFile, merge_sketches
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.plans import Plan
from logcompact.plans.grouping import input_keys
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
    the partition's slot (`Layout`), when they were produced (on average), how many."""

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


class SimulatedCatalog(Protocol):
    """What the simulator asks of its catalog: its files as columns in, planners' snapshots and the live files out."""

    def append(self, new_files: Sequence[SimulatedFile], now_ms: int) -> tuple[int, list[SimulatedFile]]: ...
    def replace(self, removed: Sequence[str], added: Sequence[SimulatedFile], now_ms: int, plan_id: str) -> CommitResult: ...
    def files(self, keys: Sequence[str]) -> list[SimulatedFile]: ...
    def live(self) -> list[SimulatedFile]: ...
    def level_count(self, level: int) -> int: ...
    def snapshot(self) -> PlanningSnapshot: ...


class OnCatalog:
    """The simulator on the real catalog: its files made into objects on the way in, and back into columns on the way
    out. What the catalog in memory is checked against."""

    def __init__(self, catalog: Catalog, layout: Layout) -> None:
        self.catalog = catalog
        self.layout = layout

    def append(self, new_files: Sequence[SimulatedFile], now_ms: int) -> tuple[int, list[SimulatedFile]]:
        appended = self.catalog.append_files([f.new_file(self.layout) for f in new_files], now_ms)
        return appended.version, [f.placed(np.array(offsets, dtype=np.int64)) for f, offsets in zip(new_files, appended.assigned)]

    def replace(self, removed: Sequence[str], added: Sequence[SimulatedFile], now_ms: int, plan_id: str) -> CommitResult:
        return self.catalog.replace_files(removed, [f.data_file(self.layout) for f in added], now_ms, plan_id=plan_id)

    def files(self, keys: Sequence[str]) -> list[SimulatedFile]:
        found = self.catalog.snapshot().get_files(keys)
        return [SimulatedFile.of_data_file(found[key], self.layout) for key in keys if key in found]

    def live(self) -> list[SimulatedFile]:
        return [SimulatedFile.of_data_file(f, self.layout) for f in self.catalog.snapshot().files()]

    def level_count(self, level: int) -> int:
        return self.catalog.snapshot().level_counts().get(level, 0)

    def snapshot(self) -> PlanningSnapshot:
        return self.catalog.snapshot()


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
        self.layout = Layout(self.topics)  # key k belongs to slot k mod (topics x partitions): topic-major
        self.lag = max(workload.max_lag_ms, MIN_MAX_COMPACTION_LAG_MS) if workload.max_lag_ms is not None else None
        self.catalog: SimulatedCatalog | None = None  # made by run()
        self.cohorts: dict[str, Cohorts] = {}  # by the key of the live file that holds them
        # Records first deduplicated, by milliseconds from produce: produce times and passes fall on the batches'
        # clock, so a day holds about 100,000 delays where it follows 100 million cohorts.
        self.deduplicated: Counter[int] = Counter()
        self.result = SimulationResult(name, asdict(workload))
        self._sequence = 0
        self._unappended: list[SimulatedFile] = []  # L1 files made since the catalog was last read
        self._l1_appended = 0  # live L1 files in the catalog (the unappended ones are live too)
        if workload.key_skew > 0:
            weights = 1.0 / np.arange(1, workload.keys + 1) ** workload.key_skew
            self._key_p = weights / weights.sum()
        else:
            self._key_p = None

    # -- ingest ----------------------------------------------------------------------------------

    def _ingest(self, start_ms: int, end_ms: int, records: int) -> None:
        """32 L0 files' worth of records, copied into one L1 file (appended with the next catalog read, which
        places its offsets), and followed as cohorts. Key k belongs to slot k mod (topics x partitions)."""
        w = self.workload
        keys = self.rng.choice(w.keys, size=records, p=self._key_p)
        slots = keys % self.layout.size
        held = np.bincount(slots, minlength=self.layout.size)
        present = np.flatnonzero(held)
        counts = held[present]
        # Each section's key sketch, from its keys' hashes: the highest rank a register of a section gets.
        row = np.cumsum(held > 0) - 1  # a slot's section
        index, rank = sketch.register_ranks(_mix(keys))
        registers = np.zeros((len(present), sketch.REGISTERS), dtype=np.uint8)
        np.maximum.at(registers.reshape(-1), row[slots] * sketch.REGISTERS + index, rank)
        tombstones = self.rng.binomial(counts, w.tombstone_rate)
        sizes = counts * w.record_bytes + SECTION_OVERHEAD_BYTES
        ends = np.cumsum(sizes)
        zeros = np.zeros(len(present), dtype=np.int64)
        self._sequence += 1
        key = f"{DATA_PREFIX}l1/ingest-{self._sequence:09d}.seg"
        self._unappended.append(SimulatedFile(
            key, 1, int(ends[-1]), end_ms, present, counts, counts - 1, np.full(len(present), start_ms), np.full(len(present), end_ms),
            tombstones, counts * w.record_bytes, ["lz4"] * len(present), zeros, ends - sizes, sizes, zeros, registers, zeros,
        ))
        self.cohorts[key] = Cohorts(present, np.full(len(present), (start_ms + end_ms) // 2), counts)

    def _append_ingested(self, now: int) -> None:
        """The L1 files made since the catalog was last read, appended in one commit."""
        if self._unappended:
            self._catalog.append(self._unappended, now)
            self._l1_appended += len(self._unappended)
            self._unappended = []

    def _snapshot(self, now: int) -> PlanningSnapshot:
        """The catalog as of now: the L1 files made since it was last read are appended first."""
        self._append_ingested(now)
        return self._catalog.snapshot()

    @property
    def _catalog(self) -> SimulatedCatalog:
        if self.catalog is None:
            raise RuntimeError("the simulator's catalog exists only while run() runs")
        return self.catalog

    # -- planning and applying -----------------------------------------------------------------------

    def _run(self, mode: str, now: int) -> None:
        for found in choose_plans(self._snapshot(now), now, mode, self.config):
            keys = input_keys(found.inputs)  # the planned inputs' sections are never loaded: their columns are in hand
            inputs = self._catalog.files(keys)
            cost = estimate_job(found, inputs, self.layout)
            result = self.result
            result.jobs += 1
            result.gets += cost.gets
            result.puts += cost.puts
            result.bytes_written += cost.bytes_out
            carried, young = self._split_young(inputs, cost.first_uncleanable)
            if found.deduplicate:
                done = ~self._older_data_outside(found, inputs)[carried.slots]
                self._deduplicated(carried.take(done), now)
                carried = carried.take(~done)
            self._catalog.replace(keys, cost.outputs, now, found.plan_id)
            for output in cost.outputs:
                held = np.zeros(self.layout.size, dtype=bool)
                held[output.slot] = True
                followed = young if output.key in cost.young_outputs else carried
                self.cohorts[output.key] = followed.take(held[followed.slots])
        self._l1_appended = self._catalog.level_count(1)

    def _split_young(self, inputs: Sequence[SimulatedFile], first_uncleanable: dict[TopicPartition, int]) -> tuple[Cohorts, Cohorts]:
        """The cohorts of a plan's inputs: those the job deduplicates, and those of the sections it keeps whole for min
        lag (from each partition's first uncleanable offset on), which go to its young files."""
        cut = np.full(self.layout.size, 1 << 62, dtype=np.int64)
        for (topic, partition), offset in first_uncleanable.items():
            cut[self.layout.bases[topic] + partition] = offset
        kept, young = [], []
        for data_file in inputs:
            cohorts = self.cohorts.pop(data_file.key)
            held_back = np.zeros(self.layout.size, dtype=bool)
            held_back[data_file.slot[data_file.offsets >= cut[data_file.slot]]] = True
            mask = held_back[cohorts.slots]
            kept.append(cohorts.take(~mask))
            young.append(cohorts.take(mask))
        return Cohorts.concat(kept), Cohorts.concat(young)

    def _older_data_outside(self, found: Plan, inputs: Sequence[SimulatedFile]) -> np.ndarray:
        """Per slot: does a live file outside the plan hold data of the partition older than the plan's? Its records
        were not deduplicated against all older data by this plan."""
        lowest = np.full(self.layout.size, -1, dtype=np.int64)  # the plan's lowest offset; none: nothing outside is older
        if inputs:
            slots = np.concatenate([f.slot for f in inputs])
            held = np.full(self.layout.size, 1 << 62, dtype=np.int64)
            np.minimum.at(held, slots, np.concatenate([f.offsets for f in inputs]))
            lowest[slots] = held[slots]
        outside = np.full(self.layout.size, 1 << 62, dtype=np.int64)
        bases = self.layout.bases
        for (topic, partition), floor in found.outside_floors.items():
            outside[bases[topic] + partition] = floor
        return outside < lowest

    def _deduplicated(self, cohorts: Cohorts, now: int) -> None:
        waited, at = np.unique(now - cohorts.produced_ms, return_inverse=True)
        records = np.zeros(len(waited), dtype=np.int64)
        np.add.at(records, at, cohorts.records)
        self.deduplicated.update(dict(zip(waited.tolist(), records.tolist())))
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
                catalog = Catalog(LocalStore(Path(directory)))
                self.catalog = OnCatalog(catalog, self.layout)
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
        self._append_ingested(now)
        files = self._catalog.live()
        levels = [0] * 5
        for data_file in files:
            levels[data_file.level] += 1
        levels[0] = L0_BATCH // 2  # L0 files waiting for their batch: half a batch on average
        hour = round(now / HOUR_MS, 3)
        self.result.files_per_level.append((hour, levels))
        # Per partition, its live records and their key sketches merged (a file holds one section a partition).
        records = np.zeros(self.layout.size, dtype=np.int64)
        registers = np.zeros((self.layout.size, sketch.REGISTERS), dtype=np.uint8)
        for data_file in files:
            records[data_file.slot] += data_file.record_count
            merge_sketches(registers, data_file.slot, data_file.registers)
        distinct = np.minimum(records, np.rint(sketch.estimate_rows(registers)).astype(np.int64))
        total = int(records.sum())
        self.result.duplicate_fraction.append((hour, (total - int(distinct.sum())) / total if total else 0.0))

    def _finish(self, end: int) -> None:
        result = self.result
        result.max_lag_violations += sum(self._late(cohorts, end) for cohorts in self.cohorts.values())
        gib = result.bytes_ingested / GiB
        result.write_amplification = result.bytes_written / result.bytes_ingested if result.bytes_ingested else 0.0
        result.gets_per_gib = result.gets / gib if gib else 0.0
        result.puts_per_gib = result.puts / gib if gib else 0.0
        if self.deduplicated:
            delays = np.array(list(self.deduplicated), dtype=np.int64) / 1000
            weights = np.array(list(self.deduplicated.values()), dtype=np.float64)
            result.dedup_delay_s = _percentiles(delays, weights)
            past = np.maximum(delays - self.workload.min_lag_ms / 1000, 0.0)
            result.past_min_lag_s = {**_percentiles(past, weights), "max": round(float(past[weights > 0].max(initial=0.0)), 1)}


def _percentiles(values: np.ndarray, weights: np.ndarray) -> dict[str, float]:
    """p50, p90 and p99 of `values`, each weighing as many records as its weight."""
    order = np.argsort(values)
    ordered = values[order]
    cumulative = np.cumsum(weights[order]) / weights.sum()
    return {f"p{q}": round(float(ordered[np.searchsorted(cumulative, q / 100)]), 1) for q in (50, 90, 99)}


def compare(workload: Workload, runs: dict[str, tuple[PlannerConfig, float]]) -> list[SimulationResult]:
    """Run each (planner, topics' min.cleanable.dirty.ratio) on the same workload (same seed, so the same records)."""
    return [
        Simulation(name, replace(workload, min_cleanable_dirty_ratio=ratio), config).run() for name, (config, ratio) in runs.items()
    ]

