"""An independent reference model of Kafka's compaction semantics, written for clarity, not speed.

It knows nothing of files, sections, bitmaps or key maps: a log is a dict from offset to record, and one
compaction job is a function of the records it covers, the clock and the topic's configs, applied
literally as Kafka's documentation and KIP-534 state the rules (see the cleaner's docstring for the
engine's version of the same contract).
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


def compact(
    records: list[ModelRecord],
    config: TopicConfig,
    now: int,
    deduplicate: bool,
    lowest_offset_outside: int | None,
    segments: list[tuple[int, int]] = (),
) -> list[ModelRecord]:
    """The records of one partition that survive one compaction job covering exactly `records`; `segments` are
    the partition's live segments (first offset, newest timestamp), in the job or not."""

    def expired(r: ModelRecord) -> bool:
        return "delete" in config.cleanup_policy and config.retention_ms >= 0 and r.timestamp < now - config.retention_ms

    if not config.compacted:
        return [r for r in records if not expired(r)]
    if not deduplicate:
        return list(records)  # a copy keeps a compacted topic whole: retention needs the key map

    def may_go(r: ModelRecord) -> bool:
        """A key's record may be removed by retention or its horizon only if no older value of the key can
        live outside the job."""
        return lowest_offset_outside is None or r.offset < lowest_offset_outside

    # Kafka's first uncleanable offset: the base offset of the first segment whose newest record is within the
    # min lag (LogCleanerManager.cleanableOffsets), wherever that segment is; everything from it on.
    lag_cut = now - config.min_compaction_lag_ms
    young_offsets = [first for first, newest in segments if config.min_compaction_lag_ms > 0 and newest > lag_cut]
    first_uncleanable = min(young_offsets) if young_offsets else None

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
    """Live records per partition, produced and compacted by the model's rules."""

    def __init__(self) -> None:
        self.partitions: dict[tuple[str, int], dict[int, ModelRecord]] = {}
        self.produced: dict[tuple[str, int], list[ModelRecord]] = {}

    def produce(self, topic: str, partition: int, records: list[ModelRecord]) -> None:
        live = self.partitions.setdefault((topic, partition), {})
        history = self.produced.setdefault((topic, partition), [])
        for r in records:
            live[r.offset] = r
            history.append(r)

    def compact(
        self, job: dict[tuple[str, int], set[int]], configs: dict[str, TopicConfig], now: int, deduplicate: bool,
        segments: dict[tuple[str, int], list[tuple[int, int]]] | None = None,
    ) -> None:
        """Apply one job: `job` says which live offsets of which partitions the job's input files hold;
        `segments`, each partition's live segments (first offset, newest timestamp), all of them."""
        for (topic, partition), offsets in job.items():
            live = self.partitions[(topic, partition)]
            outside = [o for o in live if o not in offsets]
            survivors = compact(
                [live[o] for o in offsets], configs[topic], now, deduplicate, min(outside) if outside else None,
                (segments or {}).get((topic, partition), []),
            )
            for o in offsets:
                del live[o]
            for r in survivors:
                live[r.offset] = r

    def records(self, topic: str, partition: int) -> list[ModelRecord]:
        return [r for _, r in sorted(self.partitions.get((topic, partition), {}).items())]
