"""An independent reference model of Kafka's compaction semantics, written for clarity, not speed.

It knows nothing of files, bitmaps or key maps: a log is a dict from offset to record plus its segments
(Kafka's unit of min lag), and one compaction job is a function of the records it covers, the clock, the
topic's configs and the segments outside it, applied literally as Kafka's documentation and KIP-534 state the
rules (see the cleaner's docstring for the engine's version of the same contract).

Segments: each produce call makes one per partition, as a producer's batch lands in one file. A job replaces
the segments it covers with its survivors, cut before its first record within min lag: Kafka never rewrites
the segment holding the first uncleanable offset, so that offset stays a segment boundary and never moves down.

Transactions, as Kafka's cleaner treats them: an aborted transaction's records are removed by any job that covers
them, before anything else is decided (an aborted value never removes a committed one), and nothing at or past the
partition's last stable offset (the first offset of its earliest open transaction) is cleaned: it bounds the first
uncleanable offset as min lag does. The caller says which offsets are aborted and where the LSO is (`abort`,
`hold`); markers take offsets but are no records, so the model never sees them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from logcompact.topics import TopicConfig


@dataclass(frozen=True)
class ModelRecord:
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    delete_horizon: int | None = None


def first_young(records: list[ModelRecord], config: TopicConfig, now: int) -> int | None:
    """The offset of the first record within min lag (newer than now minus the lag), None without one or without
    a min lag; Kafka's guard `minCompactionLagMs > 0` (LogCleanerManager.cleanableOffsets)."""
    if not config.compacted or config.min_compaction_lag_ms <= 0:
        return None
    young = [r.offset for r in records if r.timestamp > now - config.min_compaction_lag_ms]
    return min(young) if young else None


@dataclass(frozen=True)
class ModelSegment:
    """A segment as Kafka's cleaner manager weighs it."""

    first: int
    last: int
    size: int  # records here; Kafka counts bytes
    newest: int  # its largest timestamp


def cleanable(segments: list[ModelSegment], base_clean: bool, config: TopicConfig, now: int) -> tuple[float, list[ModelSegment]]:
    """Kafka's LogToClean for a log of `segments` in offset order whose first is below the cleaner's checkpoint when
    `base_clean`: its cleanable ratio, and the segments a cleaning takes (LogCleanerManager.cleanableOffsets and
    grabFilthiestCompactedLog: from the log start to the first uncleanable offset, the base of the first dirty
    segment whose newest record is within min lag). Kafka's segments never straddle that offset; a segment that
    does ends the range here too, since nothing from that offset on may be deduplicated."""
    clean = segments[:1] if base_clean else []
    dirty = segments[len(clean):]
    lag = config.min_compaction_lag_ms
    first_uncleanable = min((s.first for s in dirty if lag > 0 and s.newest > now - lag), default=1 << 62)
    taken = []
    for segment in dirty:
        if segment.last >= first_uncleanable:
            break
        taken.append(segment)
    clean_size, cleanable_size = sum(s.size for s in clean), sum(s.size for s in taken)
    ratio = cleanable_size / (clean_size + cleanable_size) if clean_size + cleanable_size else 0.0
    return ratio, clean + taken


def compact(
    records: list[ModelRecord],
    config: TopicConfig,
    now: int,
    deduplicate: bool,
    lowest_offset_outside: int | None,
    young_outside: int | None = None,
    aborted: frozenset[int] = frozenset(),
    stable: int | None = None,
) -> list[ModelRecord]:
    """The records of one partition that survive one compaction job covering exactly `records`. `young_outside`:
    the first offset of the first segment outside the job holding a record within min lag; `aborted`: the offsets
    of aborted transactions' records; `stable`: the partition's LSO when an open transaction holds it."""

    def expired(r: ModelRecord) -> bool:
        return "delete" in config.cleanup_policy and config.retention_ms >= 0 and r.timestamp < now - config.retention_ms

    records = [r for r in records if r.offset not in aborted]
    if not config.compacted:
        return [r for r in records if not expired(r)]
    if not deduplicate:
        return list(records)  # a copy keeps a compacted topic whole: retention needs the key map

    def may_go(r: ModelRecord) -> bool:
        """A key's record may be removed by retention or its horizon only if no older value of the key can
        live outside the job."""
        return lowest_offset_outside is None or r.offset < lowest_offset_outside

    # Kafka's first uncleanable offset: the base of the first segment whose newest record is within the min lag
    # (LogCleanerManager.cleanableOffsets), wherever it is. Within the job that is its first young record: the
    # job cuts its output there, so that record's segment starts at it.
    bounds = [b for b in (young_outside, first_young(records, config, now), stable) if b is not None]
    first_uncleanable = min(bounds) if bounds else None

    def young(r: ModelRecord) -> bool:
        return first_uncleanable is not None and r.offset >= first_uncleanable

    latest: dict[bytes, int] = {}
    for r in sorted(records, key=lambda r: r.offset):
        if r.key is not None and not young(r):
            latest[r.key] = r.offset

    survivors = []
    for r in sorted(records, key=lambda r: r.offset):
        if r.key is None or (expired(r) and may_go(r)):
            continue
        if young(r):
            survivors.append(r)
            continue
        if latest[r.key] > r.offset:
            continue  # a newer record of the key is in the job
        if r.value is None:
            if r.delete_horizon is None:
                survivors.append(replace(r, delete_horizon=now + config.delete_retention_ms))
                continue
            if now >= r.delete_horizon and may_go(r):
                continue
        survivors.append(r)
    return survivors


class ReferenceLog:
    """Live records and segments per partition, produced and compacted by the model's rules."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], dict[int, ModelRecord]] = {}
        self.produced: dict[tuple[str, int], list[ModelRecord]] = {}
        self._segments: dict[tuple[str, int], list[frozenset[int]]] = {}  # the offsets of each live segment
        self.aborted: dict[tuple[str, int], set[int]] = {}  # offsets of aborted transactions' records
        self.stable: dict[tuple[str, int], int] = {}  # the LSO of partitions an open transaction holds

    def abort(self, topic: str, partition: int, offsets: set[int]) -> None:
        """Those offsets' records belong to an aborted transaction."""
        self.aborted.setdefault((topic, partition), set()).update(offsets)

    def hold(self, topic: str, partition: int, stable: int | None) -> None:
        """The partition's LSO: the first offset of its earliest open transaction (None: no open transaction)."""
        if stable is None:
            self.stable.pop((topic, partition), None)
        else:
            self.stable[(topic, partition)] = stable

    def produce(self, topic: str, partition: int, records: list[ModelRecord]) -> None:
        """One produce call's records of a partition: one segment."""
        live = self.partitions.setdefault((topic, partition), {})
        history = self.produced.setdefault((topic, partition), [])
        for r in records:
            live[r.offset] = r
            history.append(r)
        if records:
            self._segments.setdefault((topic, partition), []).append(frozenset(r.offset for r in records))

    def compact(self, job: dict[tuple[str, int], set[int]], configs: dict[str, TopicConfig], now: int, deduplicate: bool) -> None:
        """Apply one job: `job` says which live offsets of which partitions the job's input files hold, whole
        segments of them."""
        self.compact_pass([(job, deduplicate)], configs, now)

    def compact_pass(self, jobs: list[tuple[dict[tuple[str, int], set[int]], bool]], configs: dict[str, TopicConfig], now: int) -> None:
        """Apply the jobs of one planning pass, each (job, deduplicate) as in `compact`, covering different segments:
        each sees the log as the pass found it, the other jobs' segments outside it as they were then."""
        decided = []
        for job, deduplicate in jobs:
            for (topic, partition), offsets in job.items():
                config = configs[topic]
                live = self.partitions.setdefault((topic, partition), {})
                segments = self._segments.get((topic, partition), [])
                taken = [segment for segment in segments if segment & offsets]
                assert set().union(*taken) == offsets, f"{topic}/{partition}: a job covers whole segments"
                rest = [segment for segment in segments if not segment & offsets]
                outside = [o for o in live if o not in offsets]
                young_outside = [min(segment) for segment in rest if first_young([live[o] for o in segment], config, now) is not None]
                records = [live[o] for o in sorted(offsets)]
                outside_young = min(young_outside, default=None)
                stable = self.stable.get((topic, partition)) if config.compacted else None
                aborted = frozenset(self.aborted.get((topic, partition), ()))
                survivors = compact(records, config, now, deduplicate, min(outside) if outside else None, outside_young, aborted, stable)
                # The young segment starts at the first young record, or at the first uncleanable offset outside
                # the job (a young segment's, or the LSO) when its records lie on both sides of it: no segment spans
                # another.
                cuts = [first_young([r for r in records if r.offset not in aborted], config, now)]
                bound = min((b for b in (outside_young, stable) if b is not None), default=None)
                if bound is not None and records and records[0].offset < bound:
                    cuts.append(bound)
                decided.append(((topic, partition), taken, records, survivors, min((c for c in cuts if c is not None), default=None)))
        for tp, taken, records, survivors, cut in decided:
            live = self.partitions[tp]
            for r in records:
                del live[r.offset]
            for r in survivors:
                live[r.offset] = r
            below = frozenset(r.offset for r in survivors if cut is None or r.offset < cut)
            young = frozenset(r.offset for r in survivors if cut is not None and r.offset >= cut)
            replaced = {id(segment) for segment in taken}
            self._segments[tp] = [segment for segment in self._segments.get(tp, []) if id(segment) not in replaced]
            self._segments[tp] += [segment for segment in (below, young) if segment]

    def records(self, topic: str, partition: int) -> list[ModelRecord]:
        return [r for _, r in sorted(self.partitions.get((topic, partition), {}).items())]

    def segments(self, topic: str, partition: int) -> list[tuple[int, int, int, int]]:
        """Each live segment as (first offset, last offset, records, newest timestamp), in offset order."""
        live = self.partitions.get((topic, partition), {})
        return sorted(
            (min(segment), max(segment), len(segment), max(live[o].timestamp for o in segment))
            for segment in self._segments.get((topic, partition), [])
        )
