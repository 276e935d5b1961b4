"""Kafka's min.cleanable.dirty.ratio in the regular pass: which partitions are dirty enough to compact now.

Kafka's LogCleanerManager cleans a log once its cleanable ratio is more than its topic's min.cleanable.dirty.ratio
(`grabFilthiestCompactedLog`): the bytes from the first dirty offset (the cleaner's checkpoint) up to the first
uncleanable offset (`cleanableOffsets`: the active segment, or the first segment holding a record within
min.compaction.lag.ms), over those bytes and the clean bytes below the checkpoint. Here, per partition of a
compacted topic, over its live sections at deduplicating levels (`dedup_from_level`, L2 by default, and up):

* **clean**: the partition's base section (its lowest offsets) when it is free of duplicates (`clean_below_delta`
  covers it): a plan deduplicated it against all older data of the partition, since none is older. This is
  the max-lag pass's and `logcompact status`'s clean part (`max_lag.PartitionState`);
* **dirty**: every other section (and the base when not clean): its records were deduplicated at most against
  the other inputs of the plan that wrote them, not against the clean part;
* **cleanable**: the dirty sections before the partition's first uncleanable offset, the first offset of its
  first section holding a record newer than now minus min.compaction.lag.ms: whole sections, as Kafka counts
  whole segments, in a run from the base (`cleaning_range`). A partition whose dirty records are all within its
  min lag has no cleanable bytes and is not taken early.

The ratio is cleanable / (clean + cleanable), in uncompressed bytes; a partition is taken when it is more than
its topic's min.cleanable.dirty.ratio (strictly, as Kafka: 1.0 never is, 0 is as soon as anything is cleanable).
L0 and the levels below `dedup_from_level` (L1) are Kafka's active segment: nothing there is deduplicated, and the
level rules move them up.

What is taken is Kafka's cleaning range, [log start, first uncleanable offset): every file holding one of the
partition's sections at a deduplicating level before that offset, the clean base with them, into the top level
with deduplication. Files are taken whole, so they bring other partitions' sections; where those are not one run
of offsets (a section outside the plan starts between two of them: a young section of its own), the file holding
it joins the plan (`_contiguous`), or the plan's output would span offsets that section holds. A partition is left
for a later pass when one of its files at deduplicating levels is leased or taken by a level plan of the same pass
(Kafka skips a log being cleaned), and when its sections in the plan's files hold more than `max_partition_bytes`
(the engine would only copy it, and the next pass would take it again); the whole plan waits when a file it needs
in between is busy.

What is read: the partitions' summaries first (`Snapshot.summaries_above_l0`, a row each), which bound the ratio
from above (every byte above L1 dirty but the clean base's, none of them young); then which partitions the busy
files at deduplicating levels hold; only the partitions whose bound passes and that hold none of those have their
sections at deduplicating levels read (`Snapshot.sections_at_levels`), one query.
"""

from __future__ import annotations

from collections.abc import Sequence

from logcompact.catalog import LevelSection, PartitionSummary, PlanningSnapshot, TopicPartition
from logcompact.planner.config import PlannerConfig

_NO_OFFSET = 1 << 62


def ratio_plan_files(snapshot: PlanningSnapshot, now_ms: int, config: PlannerConfig, busy: set[str]) -> list[str]:
    """The files of the pass's plan for the partitions past their dirty ratio (none: no plan): their cleaning ranges'
    files, with every file holding a section in between two of the plan's sections of one partition (`_contiguous`).
    Partitions with a file in `busy` (leased, or taken by a level plan of the pass) or over `max_partition_bytes`
    in the plan wait; the whole plan waits when a file it needs in between is busy."""
    taken, sections = _partitions_past_ratio(snapshot, now_ms, config, busy)
    while taken:
        files = _contiguous(snapshot, {key for keys in taken.values() for key in keys}, config.dedup_from_level, sections)
        if not busy.isdisjoint(files):
            return []
        over = [tp for tp in taken if sum(s.uncompressed_bytes for s in sections[tp] if s.key in files) > config.max_partition_bytes]
        if not over:
            return sorted(files)
        for tp in over:
            del taken[tp]
    return []


def _partitions_past_ratio(
    snapshot: PlanningSnapshot, now_ms: int, config: PlannerConfig, busy: set[str]
) -> tuple[dict[TopicPartition, list[str]], dict[TopicPartition, list[LevelSection]]]:
    """The partitions past their dirty ratio, each with the files of its cleaning range; those holding a busy file
    at a deduplicating level left out. With the sections at deduplicating levels read to weigh them, by partition."""
    weighed = [
        (name, partition) for name, topic in sorted(snapshot.topics.items())
        if topic.config.compacted and topic.config.min_cleanable_dirty_ratio < 1.0 for partition in range(topic.partitions)
    ]
    if not weighed:
        return {}, {}
    summaries = snapshot.summaries_above_l0(weighed)
    # A partition left out of the summaries (a commit after this snapshot set its row) is weighed from its sections.
    candidates = [tp for tp in weighed if tp not in summaries or _may_pass(summaries[tp], snapshot.topics[tp[0]].config.min_cleanable_dirty_ratio, config)]
    if candidates and busy:
        waiting = _held_by(snapshot, busy, config.dedup_from_level)
        candidates = [tp for tp in candidates if tp not in waiting]
    by_partition: dict[TopicPartition, list[LevelSection]] = {}
    for section in snapshot.sections_at_levels(candidates, config.dedup_from_level):
        by_partition.setdefault((section.topic, section.partition), []).append(section)
    # An open transaction holds its partition's cleaning range at its LSO, as min lag does at its young sections: the
    # bytes past it are not cleanable, so a partition held there is not taken pass after pass for them.
    stable = snapshot.stable_offsets(by_partition)
    taken: dict[TopicPartition, list[str]] = {}
    for tp, sections in by_partition.items():
        topic_config = snapshot.topics[tp[0]].config
        young = _first_uncleanable(sections, topic_config.min_compaction_lag_ms, now_ms)
        cleaning = cleaning_range(sections, min(young, stable.get(tp, young)))
        if cleanable_ratio(sections, cleaning) > topic_config.min_cleanable_dirty_ratio:
            taken[tp] = sorted({s.key for s in cleaning})
    return taken, by_partition


def _contiguous(snapshot: PlanningSnapshot, files: set[str], from_level: int, by_partition: dict[TopicPartition, list[LevelSection]]) -> set[str]:
    """`files` with the files holding a section of one of their partitions that starts between two of that
    partition's sections in them, until none is left out: a plan must take each partition's sections as one run
    of offsets, as Kafka cleans a run of segments, or its output section would span offsets a section outside it
    holds. (Taken whole, a cleaning range's files bring other partitions' sections, not always a run.)
    `by_partition` holds the sections at `from_level` and up of partitions already read (those weighed); those of
    the files' other partitions are read and added to it."""
    files = set(files)
    while True:
        unread = [tp for tp in snapshot.lowest_offsets(sorted(files)) if tp not in by_partition]
        for tp in unread:
            by_partition[tp] = []
        for section in snapshot.sections_at_levels(unread, from_level):
            by_partition[(section.topic, section.partition)].append(section)
        between: set[str] = set()
        for sections in by_partition.values():
            inside = [n for n, s in enumerate(sections) if s.key in files]
            if inside:
                between.update(s.key for s in sections[inside[0] : inside[-1] + 1] if s.key not in files)
        if not between:
            return files
        files |= between


def _held_by(snapshot: PlanningSnapshot, keys: set[str], from_level: int) -> set[TopicPartition]:
    """The partitions with a section in the files among `keys` at `from_level` and up."""
    at_levels = [f.key for f in snapshot.file_summaries_of(sorted(keys)) if f.level >= from_level]
    return set(snapshot.lowest_offsets(at_levels)) if at_levels else set()


def _may_pass(summary: PartitionSummary | None, ratio: float, config: PlannerConfig) -> bool:
    """Whether the partition's ratio can be more than `ratio`, from its summary: at most every byte above L1 (at
    every level when dedup_from_level is 1) is cleanable but the clean base's. Bytes at levels from L2 below a
    higher dedup_from_level count as cleanable too: still a bound, since the ratio grows with the cleanable bytes."""
    if summary is None:
        return False
    at_dedup_levels = summary.uncompressed_bytes - (summary.l1_bytes if config.dedup_from_level > 1 else 0)
    clean = summary.base_bytes if summary.base_clean and summary.base_level >= config.dedup_from_level else 0
    dirty = at_dedup_levels - clean
    return dirty > 0 and dirty / at_dedup_levels > ratio


def _first_uncleanable(sections: Sequence[LevelSection], min_lag_ms: int, now_ms: int) -> int:
    """The first offset of the first section holding a record within the topic's min.compaction.lag.ms."""
    if min_lag_ms <= 0:
        return _NO_OFFSET
    return min((s.first_offset for s in sections if s.max_timestamp > now_ms - min_lag_ms), default=_NO_OFFSET)


def cleaning_range(sections: Sequence[LevelSection], first_uncleanable: int) -> list[LevelSection]:
    """Kafka's cleaning range of a partition, [log start, first uncleanable offset): its sections (in offset order)
    up to the first reaching that offset (a catalog written before the engine cut its output at a young section
    outside its plan may hold one spanning it; from that offset on nothing is deduplicated). Always a run from the partition's base, so a plan over it leaves a clean base and
    the next pass does not take the partition again for the same bytes."""
    taken = []
    for section in sections:
        if section.last_offset >= first_uncleanable:
            break
        taken.append(section)
    return taken


def cleanable_ratio(sections: Sequence[LevelSection], cleaning: Sequence[LevelSection]) -> float:
    """Cleanable dirty bytes over clean and cleanable bytes (0 without any), from a partition's sections in offset
    order and its cleaning range."""
    if not sections:
        return 0.0
    base = sections[0]
    clean_bytes = base.uncompressed_bytes if base.clean else 0
    dirty_bytes = sum(s.uncompressed_bytes for s in cleaning if not (s is base and base.clean))
    total = clean_bytes + dirty_bytes
    return dirty_bytes / total if total else 0.0
