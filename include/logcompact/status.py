"""`logcompact status`: the cleaner's figures, as Kafka's log cleaner reports them (docs/metrics.md).

Per partition of each compacted topic, from the catalog's summary of its sections above L0 and its live L0
sections (`Snapshot.summaries_above_l0`, `Snapshot.section_figures`), not from every section: the dirty ratio
(Kafka's cleanable ratio: bytes not yet deduplicated against all older data of the partition over all its
bytes), how far the oldest dirty record is past `max.compaction.lag.ms`, the time since a
compaction last wrote it, the duplicates its key sketches estimate, and whether it is set aside as uncleanable.
Per level: files and bytes. And the cluster's gauges under Kafka's MBean names. A partition is clean where the
max-lag planner finds it clean (`planner.max_lag.PartitionState`): its base section deduplicated at a
deduplicating level, `clean_below_delta` covering it.

Per partition too, its last stable offset (LSO) and how far it lags the high watermark, read with it from the
partition rows as Fetch reads them (`Snapshot.stability`), and the open transactions holding it: compaction cleans
nothing at or past the LSO, so a hung transaction shows as a growing lag (docs/transactions.md).
"""

from __future__ import annotations

import heapq
from collections.abc import Collection, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from logcompact import sketch
from logcompact.catalog import Catalog, PartitionSummary, SectionFigures, Snapshot
from logcompact.catalog.transactions import ONGOING
from logcompact.exceptions import LogcompactError
from logcompact.planner import PlannerConfig
from logcompact.planner.max_lag import PartitionState, effective_max_lag
from logcompact.topics import LONG_MAX
from logcompact.units import MiB, mib_figure


@dataclass
class PartitionStatus:
    topic: str
    partition: int
    bytes: int  # uncompressed bytes of its live sections
    dirty_bytes: int
    dirty_percent: float
    compaction_delay_s: float | None  # how far its oldest dirty record is past max.compaction.lag.ms (None: no finite lag)
    since_last_compaction_s: float | None  # None: no compaction has written it yet
    estimated_duplicates: int
    sections: int
    uncleanable: bool
    high_watermark: int = 0
    last_stable_offset: int = 0
    lso_lag: int = 0  # offsets between the LSO and the high watermark: held by open transactions, neither read committed nor cleaned
    open_transactions: int = 0  # open transactions this partition was added to
    oldest_transaction_s: float | None = None  # how long the oldest of them has been open (None: none is)


@dataclass
class LevelStatus:
    level: int
    files: int
    bytes: int  # file bytes in the store


@dataclass
class ClusterStatus:
    now_ms: int
    partitions: list[PartitionStatus] = field(default_factory=list)
    # The compacted partitions of the topics asked (all by default), before `worst` kept the worst of them.
    partitions_total: int = 0
    topics_asked: list[str] | None = None  # None: every compacted topic
    worst: int | None = None  # partitions kept: the worst by dirty ratio, then compaction delay, the worst first
    levels: list[LevelStatus] = field(default_factory=list)
    # Kafka's names (kafka.log:type=LogCleanerManager / LogCleaner) for the cluster's figures.
    gauges: dict[str, float | None] = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)

    def topics(self) -> dict[str, dict[str, float]]:
        """Per topic: bytes, dirty bytes and ratio, estimated duplicates, partitions."""
        totals: dict[str, dict[str, float]] = {}
        for p in self.partitions:
            topic = totals.setdefault(p.topic, {"partitions": 0, "bytes": 0, "dirty_bytes": 0, "estimated_duplicates": 0})
            topic["partitions"] += 1
            topic["bytes"] += p.bytes
            topic["dirty_bytes"] += p.dirty_bytes
            topic["estimated_duplicates"] += p.estimated_duplicates
        for topic in totals.values():
            topic["dirty_percent"] = _percent(topic["dirty_bytes"], topic["bytes"])
        return totals

    def describe(self) -> list[str]:
        """The readable table: the gauges, the levels, then a row per partition."""
        lines = [f"{name}: {'-' if value is None else f'{value:,}'}" for name, value in self.gauges.items()]
        lines.append("")
        lines += _table(
            ("level", "files", "MiB stored"), [(f"L{lv.level}", f"{lv.files:,}", mib_figure(lv.bytes)) for lv in self.levels]
        )
        lines.append("")
        if self.worst is not None:
            lines.append(f"the worst {len(self.partitions):,} of {self.partitions_total:,} partitions, by dirty ratio then compaction delay:")
        rows = [
            (p.topic, str(p.partition), mib_figure(p.bytes), f"{p.dirty_percent:.1f}",
             "-" if p.compaction_delay_s is None else f"{p.compaction_delay_s:,.0f}",
             "-" if p.since_last_compaction_s is None else f"{p.since_last_compaction_s:,.0f}",
             f"{p.estimated_duplicates:,}", f"{p.last_stable_offset:,}", f"{p.lso_lag:,}", f"{p.open_transactions:,}",
             "-" if p.oldest_transaction_s is None else f"{p.oldest_transaction_s:,.0f}", "uncleanable" if p.uncleanable else "")
            for p in self.partitions
        ]
        lines += _table(("topic", "partition", "MiB uncompressed", "dirty %", "delay s", "since compaction s", "est. duplicates", "LSO", "LSO lag",
                         "open txns", "oldest txn s", ""), rows)
        return lines


def cluster_status(catalog: Catalog, now_ms: int, config: PlannerConfig | None = None, topics: Collection[str] | None = None,
                   worst: int | None = None) -> ClusterStatus:
    """The cleaner's figures for every compacted topic, or those of `topics`, as the catalog holds them at `now_ms`;
    with `worst`, only that many partitions, the worst first (`worst_partitions`). Levels, the time since the last
    compaction and the open transactions stay the cluster's; the other gauges are over the topics asked."""
    config = config or PlannerConfig()
    snapshot = catalog.snapshot()
    status = ClusterStatus(now_ms, topics_asked=None if topics is None else sorted(set(topics)), worst=worst)
    levels = snapshot.level_figures()
    status.levels = [LevelStatus(level, files, size) for level, (files, size, _) in sorted(levels.items())]
    compactions = [newest for level, (_, _, newest) in levels.items() if level > 0]  # only compactions write above L0
    last_compaction_ms = max(compactions, default=None)

    marks = catalog.uncleanable()
    compacted = sorted(name for name, topic in snapshot.topics.items() if topic.config.compacted)
    if status.topics_asked is not None:
        _check_topics(snapshot, status.topics_asked)
        compacted = status.topics_asked
        marks = [m for m in marks if m.topic in compacted]
    set_aside = {(m.topic, m.partition) for m in marks}
    partitions = [(name, p) for name in compacted for p in range(snapshot.topics[name].partitions)]
    summaries = snapshot.summaries_above_l0(partitions)
    stale = {tp for tp in partitions if tp not in summaries}
    figures = snapshot.section_figures(compacted, in_l0=True)
    if stale:  # summed up by a commit after the snapshot: read from their sections
        above = snapshot.section_figures(sorted({name for name, _ in stale}), in_l0=False)
        figures += [row for row in above if (row.section.topic, row.section.partition) in stale]
    by_partition: dict[tuple[str, int], list[SectionFigures]] = {}
    for row in figures:
        by_partition.setdefault((row.section.topic, row.section.partition), []).append(row)
    summarized = {tp for tp, summary in summaries.items() if summary is not None}
    for topic, partition in sorted(summarized | set(by_partition)):
        status.partitions.append(_partition_status(
            snapshot, topic, partition, summaries.get((topic, partition)), by_partition.get((topic, partition), []),
            (topic, partition) in set_aside, now_ms, config,
        ))
    stability = snapshot.stability(compacted)
    for p in status.partitions:
        stable = stability.get((p.topic, p.partition))
        if stable is not None:
            p.high_watermark, p.last_stable_offset, p.open_transactions = stable.high_watermark, stable.last_stable, stable.open_transactions
            p.lso_lag = stable.high_watermark - stable.last_stable
            p.oldest_transaction_s = None if stable.oldest_start_ms is None else max(0.0, (now_ms - stable.oldest_start_ms) / 1000)

    # As Kafka's cleaner manager, the maxima leave out uncleanable partitions: they have gauges of their own.
    cleanable = [p for p in status.partitions if not p.uncleanable]
    delays = [p.compaction_delay_s for p in cleanable if p.compaction_delay_s is not None]
    status.gauges = {
        "max-dirty-percent": max((p.dirty_percent for p in cleanable), default=0.0),
        "max-compaction-delay-secs": round(max(delays, default=0.0), 1),
        # None (not sent) until a compaction has written a file: 0 would read as "just ran".
        "time-since-last-run-ms": None if last_compaction_ms is None else now_ms - last_compaction_ms,
        "uncleanable-partitions-count": len(marks),
        "uncleanable-bytes": sum(m.bytes for m in marks),
        # A hung transaction holds its partitions' LSO, and compaction with it: uncleanable partitions are counted too.
        "open-transactions": len(catalog.transactions(states=[ONGOING])),
        "max-last-stable-offset-lag": max((p.lso_lag for p in status.partitions), default=0),
    }
    status.partitions_total = len(status.partitions)
    if worst is not None:
        status.partitions = worst_partitions(status.partitions, worst)
    return status


def worst_partitions(partitions: Sequence[PartitionStatus], count: int) -> list[PartitionStatus]:
    """The `count` partitions an operator looks at first: the highest dirty ratio, then the longest compaction delay
    (past max.compaction.lag.ms), then by topic and partition; a partial sort, not of every partition."""
    return heapq.nsmallest(count, partitions, key=lambda p: (-p.dirty_percent, -(p.compaction_delay_s or 0.0), p.topic, p.partition))


def _check_topics(snapshot: Snapshot, names: Sequence[str]) -> None:
    """LogcompactError naming a topic asked that the catalog does not have, or that is not compacted."""
    for name in names:
        topic = snapshot.topics.get(name)
        if topic is None:
            raise LogcompactError(f"no topic {name!r} in the catalog: `logcompact topic list` names them")
        if not topic.config.compacted:
            raise LogcompactError(f"topic {name!r} is not compacted (cleanup.policy={topic.config.cleanup_policy}): status reports compacted topics only")


def _partition_status(
    snapshot: Snapshot, name: str, partition: int, summary: PartitionSummary | None, rows: list[SectionFigures], uncleanable: bool, now_ms: int,
    config: PlannerConfig,
) -> PartitionStatus:
    """A partition's figures from the catalog's summary of its sections above L0 and its other sections' rows."""
    state = PartitionState.above_l0(summary, config.dedup_from_level) if summary is not None else PartitionState()
    for row in rows:
        state.add(row.section, config.dedup_from_level)
    total = sum(r.uncompressed_bytes for r in rows) + (summary.uncompressed_bytes if summary is not None else 0)
    clean = 0
    if state.base_clean:
        base = [r.uncompressed_bytes for r in rows if r.section.first_offset == state.base_offset]
        clean = sum(base) if base or summary is None else summary.base_bytes
    records = sum(r.record_count for r in rows) + (summary.records if summary is not None else 0)
    sketches = [r.key_sketch or b"" for r in rows] + ([summary.key_sketch] if summary is not None else [])
    compacted_ms = [r.created_ms for r in rows if r.section.level > 0] + ([summary.newest_file_ms] if summary is not None else [])
    topic = snapshot.topics[name]
    since = state.dirty_since(effective_max_lag(snapshot, name))
    return PartitionStatus(
        name, partition, total, total - clean, _percent(total - clean, total),
        None if topic.config.max_compaction_lag_ms == LONG_MAX or since is None else max(0.0, (now_ms - since) / 1000),
        (now_ms - max(compacted_ms)) / 1000 if compacted_ms else None,
        # A clean partition holds no duplicates: its sketch's error (about 9%) would make some up.
        sketch.estimated_duplicates(records, sketches) if clean < total else 0,
        len(rows) + (summary.sections if summary is not None else 0), uncleanable,
    )


def job_gauges(plan_stats: list[dict]) -> dict[str, float]:
    """Kafka's per-run cleaner gauges over the plans of one commit (`logcompact.plans.summarize` dicts):
    the fullest key map, the bytes written per byte read, the longest job."""
    if not plan_stats:
        return {}
    bytes_in = sum(s["bytes_in"] for s in plan_stats)
    return {
        "max-buffer-utilization-percent": max(s["buffer_utilization_percent"] for s in plan_stats),
        "cleaner-recopy-percent": round(100 * sum(s["bytes_out"] for s in plan_stats) / max(bytes_in, 1), 1),
        "max-clean-time-secs": max(s["max_job_seconds"] for s in plan_stats),
    }


def _percent(part: float, whole: float) -> float:
    return round(100 * part / whole, 1) if whole else 0.0


def _table(header: tuple[str, ...], rows: Sequence[tuple[str, ...]]) -> list[str]:
    widths = [max(len(row[n]) for row in [header, *rows]) for n in range(len(header))]
    return ["  ".join(cell.ljust(w) if n == 0 else cell.rjust(w) for n, (cell, w) in enumerate(zip(row, widths))).rstrip()
            for row in [header, *rows]]


def draw_status(status: ClusterStatus, path: Path) -> None:
    """A PNG of three panels: files and bytes per level, bytes per topic, dirty ratio per topic."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topics = status.topics()
    names = sorted(topics)
    figure, (levels, sizes, dirty) = plt.subplots(1, 3, figsize=(15, 4))
    labels = [f"L{lv.level}" for lv in status.levels]
    levels.bar(labels, [lv.files for lv in status.levels], color="tab:blue")
    levels.set_title("live files per level (MiB stored above the bars)")
    levels.set_ylabel("files")
    for n, lv in enumerate(status.levels):
        levels.annotate(mib_figure(lv.bytes), (n, lv.files), ha="center", va="bottom")
    sizes.bar(names, [topics[t]["bytes"] / MiB for t in names], color="tab:green", label="all")
    sizes.bar(names, [topics[t]["dirty_bytes"] / MiB for t in names], color="tab:red", label="dirty")
    sizes.set_title("uncompressed MiB per compacted topic")
    sizes.legend()
    dirty.bar(names, [topics[t]["dirty_percent"] for t in names], color="tab:red")
    dirty.set_ylim(0, 100)
    dirty.set_title("dirty ratio per topic (%)")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=80)
    plt.close(figure)
