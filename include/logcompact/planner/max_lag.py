"""The max-lag pass: compact what holds records older than their topic's max.compaction.lag.ms.

A record is dirty once its timestamp is older than now - max.compaction.lag.ms (at least 2 hours) and it
has not been deduplicated against older data of its partition. A partition is clean when all its live
data sits in one section at a deduplicating level that is free of duplicates (`clean_below_delta` covers
it); otherwise its other sections are dirty from their oldest record's timestamp plus the lag.

The pass runs every `max_lag_pass_interval_ms`. A partition is planned when, by the next pass, it would
have been dirty for longer than `max_lag_deadline_ms`: with a 15-minute interval and a 30-minute
deadline, a record is compacted 15 to 30 minutes after it becomes dirty, and everything that becomes
dirty within one interval is compacted together, so files are not rewritten over and over.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from logcompact.catalog import PartitionSection, PartitionSummary, PlanningSnapshot
from logcompact.catalog.columns import SectionColumns
from logcompact.planner.columns import Loader, files_holding, read_columns, reads_columns
from logcompact.planner.config import PlannerConfig
from logcompact.planner.levels import make_plans, top_level
from logcompact.plans import Plan
from logcompact.topics import LONG_MAX, MIN_MAX_COMPACTION_LAG_MS


@dataclass
class PartitionState:
    base_offset: int = 1 << 62  # the partition's lowest section: where its oldest data is
    base_clean: bool = False
    base_min_ts: int = 0
    others_min_ts: int | None = None  # the oldest record outside the base section
    # The lowest offset of a section not free of duplicates, as far as the sections read tell (a summary does not:
    # its floor stands in).
    dirty_from: int = 1 << 62

    @classmethod
    def above_l0(cls, summary: PartitionSummary, dedup_from_level: int) -> PartitionState:
        """The state of a partition's sections above L0, from the catalog's summary of them."""
        clean = summary.base_level >= dedup_from_level and summary.base_clean
        return cls(summary.floor, clean, summary.base_min_timestamp, summary.others_min_timestamp, summary.floor)

    def add(self, section: PartitionSection, dedup_from_level: int) -> None:
        if section.first_offset < self.base_offset:
            if self.base_offset != 1 << 62:
                self._other(self.base_min_ts, self.base_offset)
            self.base_offset = section.first_offset
            self.base_clean = section.level >= dedup_from_level and section.clean_below_delta > section.last_delta
            self.base_min_ts = section.min_timestamp
            if not self.base_clean:
                self.dirty_from = min(self.dirty_from, section.first_offset)
        else:
            self._other(section.min_timestamp, section.first_offset)

    def _other(self, min_ts: int, first_offset: int) -> None:
        self.others_min_ts = min_ts if self.others_min_ts is None else min(self.others_min_ts, min_ts)
        self.dirty_from = min(self.dirty_from, first_offset)

    def dirty_since(self, lag: int) -> int | None:
        oldest_dirty = self.others_min_ts
        if not self.base_clean:
            oldest_dirty = self.base_min_ts if oldest_dirty is None else min(oldest_dirty, self.base_min_ts)
        return None if oldest_dirty is None else oldest_dirty + lag


def summarized_partition_states(snapshot: PlanningSnapshot, topics: list[str], config: PlannerConfig) -> dict[tuple[str, int], PartitionState]:
    """Per partition of `topics` holding live data but those set aside, its base section and oldest other record,
    from the catalog's summaries of its sections above L0 and its live L0 sections: no section above L0 is read, but
    those of a partition whose summary is newer than the snapshot."""
    partitions = [(name, p) for name in topics for p in range(snapshot.topics[name].partitions) if (name, p) not in snapshot.set_aside]
    summaries = snapshot.summaries_above_l0(partitions)
    states = {tp: PartitionState.above_l0(summary, config.dedup_from_level) for tp, summary in summaries.items() if summary is not None}
    stale = set(partitions) - set(summaries)
    if stale:
        above = snapshot.partition_sections(sorted({name for name, _ in stale}), in_l0=False)
        _added(states, (section for section in above if (section.topic, section.partition) in stale), config)
    return _added(states, snapshot.partition_sections(topics, in_l0=True), config)


def _added(
    states: dict[tuple[str, int], PartitionState], sections: Iterable[PartitionSection], config: PlannerConfig
) -> dict[tuple[str, int], PartitionState]:
    for section in sections:
        state = states.get((section.topic, section.partition))
        if state is None:
            state = states[(section.topic, section.partition)] = PartitionState()
        state.add(section, config.dedup_from_level)
    return states


def _states_of_sections(snapshot: PlanningSnapshot, partitions: Iterable[tuple[str, int]], config: PlannerConfig) -> dict[tuple[str, int], PartitionState]:
    """Per partition of `partitions`, its state from its live sections (read by topic: few partitions, an open
    transaction's), which tells where its dirty sections start."""
    wanted = set(partitions)
    topics = sorted({name for name, _ in wanted})
    states = {tp: PartitionState() for tp in wanted}
    for in_l0 in (False, True):
        _added(states, (s for s in snapshot.partition_sections(topics, in_l0=in_l0) if (s.topic, s.partition) in wanted), config)
    return states


def effective_max_lag(snapshot: PlanningSnapshot, topic: str) -> int:
    return max(snapshot.topics[topic].config.max_compaction_lag_ms, MIN_MAX_COMPACTION_LAG_MS)


def dirty_since(snapshot: PlanningSnapshot, topic: str, partition: int, config: PlannerConfig) -> int | None:
    """When the partition's oldest record not yet deduplicated against older data became (or becomes) dirty."""
    state = summarized_partition_states(snapshot, [snapshot.topic(topic).name], config).get((topic, partition))
    return None if state is None else state.dirty_since(effective_max_lag(snapshot, topic))


def max_lag_topics(snapshot: PlanningSnapshot, topics: list[str] | None = None) -> list[str]:
    """The compacted topics (of `topics`, when given) with a finite max.compaction.lag.ms: what the pass looks at."""
    return sorted(
        name for name, topic in snapshot.topics.items()
        if (not topics or name in topics) and topic.config.compacted and topic.config.max_compaction_lag_ms < LONG_MAX
    )


@dataclass(frozen=True)
class DirtyPartition:
    topic: str
    partition: int
    dirty_since: int  # when its oldest record not yet deduplicated against older data became (or becomes) dirty


def dirty_partitions(snapshot: PlanningSnapshot, chosen: list[str], config: PlannerConfig) -> list[DirtyPartition]:
    """The partitions of `chosen` topics holding data not deduplicated against their older data: from the
    catalog's summaries and the live L0 sections (`summarized_partition_states`)."""
    dirty = []
    for (topic, partition), state in summarized_partition_states(snapshot, chosen, config).items():
        since = state.dirty_since(effective_max_lag(snapshot, topic))
        if since is not None:
            dirty.append(DirtyPartition(topic, partition, since))
    return dirty


def due_by(now_ms: int, config: PlannerConfig) -> int:
    """A partition dirty since this time or earlier is due: by the next pass it would be dirty past the deadline."""
    return now_ms + config.max_lag_pass_interval_ms - config.max_lag_deadline_ms


def plan_max_lag(
    snapshot: PlanningSnapshot, now_ms: int, config: PlannerConfig, leased: set[str], topics: list[str] | None = None
) -> Plan | None:
    """One plan over every file holding a partition that must be compacted in this pass, or None."""
    chosen = max_lag_topics(snapshot, topics)
    if not chosen:
        return None
    horizon = due_by(now_ms, config)
    due = [(dirty.topic, dirty.partition) for dirty in dirty_partitions(snapshot, chosen, config) if dirty.dirty_since <= horizon]
    # A partition whose dirty sections all lie at or past its LSO has nothing to clean (Kafka weighs its cleanable
    # bytes to the LSO): it waits for its transactions to end, or each pass would copy the same sections again.
    held = snapshot.stable_offsets(due) if due else {}
    if held:
        states = _states_of_sections(snapshot, held, config)
        due = [tp for tp in due if tp not in held or states[tp].dirty_from < held[tp]]
    if not due:
        return None
    # With most partitions due, the files holding them are most files: every live file's columns are read at once,
    # and the files picked from them.
    read: tuple[SectionColumns, Loader] | None = None
    if 2 * len(due) >= sum(topic.partitions for topic in snapshot.topics.values()) and reads_columns(snapshot):
        read = read_columns(snapshot, now_ms)
        inputs = files_holding(read[0], due)
    else:
        inputs = snapshot.files_holding(due)
    if not inputs:
        return None
    if not inputs.isdisjoint(leased):
        return None  # an in-flight plan holds some of these files; its commit compacts them first
    target = max(config.dedup_from_level, top_level(snapshot.level_counts(), config))
    (found,) = make_plans(snapshot, [(sorted(inputs), target)], now_ms, config, "max-lag", read)
    return found
