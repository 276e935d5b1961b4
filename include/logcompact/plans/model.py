"""A compaction plan, the engine's input (docs/plan.md): its settings, input files and their sections, per-partition
floors, and groups; its header (what leasing, scheduling and committing need); and the checks of both, alone
(`Plan.validate`) and against the catalog (`Plan.check_against`).

A `Plan` is one object in memory, split into groups once, by the planner that makes it: a group is a run of
whole topic-partitions in (topic, partition) order. What a job runs is a plan whose inputs hold only the
sections of its group (`Plan.piece`) or of its slice of a group (`arrow_form.decode_group`).
"""

from __future__ import annotations

import bisect
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, NamedTuple

from logcompact.catalog import CatalogSection, DataFile, TopicPartition
from logcompact.catalog.holes import gaps
from logcompact.collector import collector_paused
from logcompact.exceptions import CommitConflictError, CorruptDataError, InvalidPlanError
from logcompact.format.layout import COMPRESSIONS
from logcompact.keys import DATA_KEY_PATTERN, output_key
from logcompact.limits import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_MAX_PARTITION_BYTES,
    DEFAULT_TARGET_FILE_BYTES,
    MAX_CLOCK_SKEW_MS,
    MAX_PLAN_AGE_MS,
    MODES,
)
from logcompact.plans.grouping import (
    PlanGroup,
    PlannedInputs,
    input_keys,
    input_offsets,
    input_sections,
    lowest_outside,
    partition_spans,
    split_into_groups,
)
from logcompact.topics import Topic
from logcompact.units import utc_iso

if TYPE_CHECKING:  # a Spark task reads plans without loading the catalog's database layer
    from logcompact.catalog import Snapshot

# The settings a plan, its header and its group documents all carry.
SETTING_FIELDS = (
    "plan_id", "cluster_id", "manifest_version", "now_ms", "mode", "target_level", "deduplicate", "buffer_bytes",
    "target_file_bytes", "max_partition_bytes", "compression",
)


class InputFile(NamedTuple):
    """An input file as a plan's header lists it: what leasing, checking and committing the plan need."""

    key: str
    level: int
    size: int
    created_ms: int


@dataclass(frozen=True)
class Plan:
    plan_id: str
    cluster_id: str
    manifest_version: int
    now_ms: int
    target_level: int
    deduplicate: bool
    # The files, each with its sections; a planning pass's plans hold them as `PlannedInputs`, loaded on first use.
    inputs: Sequence[DataFile]
    topics: dict[str, Topic]
    # Per partition: the smallest offset held by a live file outside this plan. A tombstone at or above
    # it may have older values of its key elsewhere, so it is never removed by this plan.
    outside_floors: dict[TopicPartition, int] = field(default_factory=dict)
    # Per partition of a compacted topic: Kafka's first uncleanable offset as the catalog sets it, the lower of its
    # LSO where an open transaction holds it and, with min.compaction.lag.ms, the first offset of the sections
    # outside this plan holding a record within the lag (`Snapshot.first_uncleanable_offsets`, the other plans'
    # inputs included), so min lag is the same whichever files the plan takes; the engine lowers it to the first
    # record within the lag among the plan's own inputs, and ends each output section there.
    first_uncleanable: dict[TopicPartition, int] = field(default_factory=dict)
    # Per partition: the aborted transactions' offset ranges (first, last), in offset order, overlapping the offsets
    # of its inputs, read after its first uncleanable offset (each range below it is here). Their records are
    # dropped by every job: a Spark task never reads the catalog.
    aborted: dict[TopicPartition, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # Partitions held back as uncleanable when the plan was made: their sections are not in the inputs, and the
    # commit leaves them live in the input files.
    set_aside: tuple[TopicPartition, ...] = ()
    # Made by the planner (`split_into_groups`); a plan made without them is one group of all its partitions.
    groups: tuple[PlanGroup, ...] = ()
    group: int = 0  # which group this piece is (names its outputs)
    slice: int = 0  # a worker's share of a group (the Spark job splits a group into slices of partitions)
    mode: str = "regular"
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    compression: str = "lz4"

    def __post_init__(self) -> None:
        if not self.groups:
            object.__setattr__(self, "groups", split_into_groups(input_offsets(self.inputs).sizes, None))

    def output_key(self, content: str, sequence: int) -> str:
        return output_key(self.plan_id, self.target_level, self.group, self.slice, content, sequence)

    def piece(self, group: int) -> Plan:
        """What the job of group `group` runs: the plan restricted to that group's sections, its outputs named
        after the group. Files holding none of them are left out."""
        if not 0 <= group < len(self.groups):
            raise InvalidPlanError(f"plan {self.plan_id} has groups 0 to {len(self.groups) - 1}, not {group}")
        if len(self.groups) == 1:
            return self
        chosen = self.groups[group]
        inputs = []
        for data_file in self.inputs:
            sections = tuple(s for s in data_file.sections if chosen.holds((s.info.topic, s.info.partition)))
            if sections:
                inputs.append(data_file if len(sections) == len(data_file.sections) else replace(data_file, sections=sections))
        topics = {s.info.topic for f in inputs for s in f.sections}
        return replace(
            self,
            inputs=tuple(inputs),
            topics={name: self.topics[name] for name in sorted(topics)},
            outside_floors={tp: floor for tp, floor in self.outside_floors.items() if chosen.holds(tp)},
            first_uncleanable={tp: offset for tp, offset in self.first_uncleanable.items() if chosen.holds(tp)},
            aborted={tp: ranges for tp, ranges in self.aborted.items() if chosen.holds(tp)},
            groups=(chosen,),
            group=group,
        )

    def header(self) -> PlanHeader:
        return PlanHeader(
            **{name: getattr(self, name) for name in SETTING_FIELDS},
            topics=self.topics,
            inputs=tuple(map(InputFile._make, self.inputs.header_files())) if isinstance(self.inputs, PlannedInputs)
            else tuple(InputFile(f.key, f.level, f.size, f.created_ms) for f in self.inputs),
            groups=self.groups,
            set_aside=self.set_aside,
        )

    @classmethod
    def from_pieces(cls, header: PlanHeader, pieces: Sequence[Plan], source: str) -> Plan:
        """The whole plan from its header and the pieces of its groups (`decode_group`), in group order."""
        sections: dict[str, list[CatalogSection]] = {f.key: [] for f in header.inputs}
        floors: dict[TopicPartition, int] = {}
        young: dict[TopicPartition, int] = {}
        aborted: dict[TopicPartition, tuple[tuple[int, int], ...]] = {}
        for group, piece in zip(header.groups, pieces, strict=True):
            if piece.plan_id != header.plan_id or piece.groups != (group,):
                raise InvalidPlanError(f"{source}: the document of group {group.group} is not that group of this plan; plan again")
            for data_file in piece.inputs:
                if data_file.key not in sections:
                    raise InvalidPlanError(f"{source}: group {group.group} reads {data_file.key}, which the header does not list; plan again")
                sections[data_file.key].extend(data_file.sections)  # groups follow (topic, partition) order, as files do
            floors.update(piece.outside_floors)
            young.update(piece.first_uncleanable)
            aborted.update(piece.aborted)
        with collector_paused():
            inputs = tuple(DataFile(f.key, f.level, f.size, f.created_ms, tuple(sections[f.key])) for f in header.inputs)
        plan = cls(
            **{name: getattr(header, name) for name in SETTING_FIELDS}, topics=header.topics, inputs=inputs, outside_floors=floors,
            first_uncleanable=young, aborted=aborted, groups=header.groups, set_aside=header.set_aside,
        )
        plan.validate(source)
        return plan

    # -- validation ------------------------------------------------------------------------------

    def validate(self, source: str = "plan", whole: bool = True) -> None:
        """Rules that need no catalog: shapes, ranges, and that the inputs and groups make sense together. A piece
        (`whole` False) holds one group, and no input when its plan has no sections."""
        check_shape(self, source, whole)
        for (topic, partition), ranges in self.aborted.items():
            if not all(first <= last for first, last in ranges) or any(a[1] >= b[0] for a, b in zip(ranges, ranges[1:])):
                raise InvalidPlanError(f"{source}: the aborted ranges of {topic}/{partition} are not disjoint [first, last] ranges in offset order; plan again")
        starts = [g.first for g in self.groups[1:] if g.first is not None]  # all of them: check_shape checked
        set_aside = set(self.set_aside)
        for data_file in self.inputs:
            for section in data_file.sections:
                tp = (section.info.topic, section.info.partition)
                if set_aside and tp in set_aside:
                    raise InvalidPlanError(f"{source}: input {data_file.key} holds {tp[0]}/{tp[1]}, which the plan sets aside as uncleanable")
                if tp[0] not in self.topics:
                    raise InvalidPlanError(f"{source}: input {data_file.key} holds topic {tp[0]!r}, which the plan does not describe")
                if not self.groups[bisect.bisect_right(starts, tp)].holds(tp):
                    raise InvalidPlanError(f"{source}: input {data_file.key} holds {tp[0]}/{tp[1]}, which no group of the plan holds")

    def check_against(self, snapshot: Snapshot, now_ms: int) -> None:
        """Every field the catalog can vouch for, checked before the plan runs or commits: its cluster, clock and
        topics (`PlanHeader.check_against`); its inputs live and equal to the catalog's record of them, every
        section of each (but of the partitions it sets aside: pass a snapshot setting them aside); its aborted
        ranges the catalog's (`_check_aborted`); and, when it deduplicates, its outside floors and first uncleanable
        offsets no higher than the catalog's (lower only keeps more)."""
        self.header().check_against(snapshot, now_ms)
        with collector_paused():
            self._check_sections(snapshot)
            self._check_aborted(snapshot)
            self.check_offsets_held(snapshot)
            if self.deduplicate:  # a copy reads neither (engine/cleaner.py): they rule deduplication only
                self._check_floors(snapshot)

    def check_offsets_held(self, snapshot: Snapshot) -> None:
        """`hidden_offsets` as a refusal, for a plan the user chose: CorruptDataError naming the first partition,
        before anything is leased."""
        retired = snapshot.retired_apart(input_sections(self.inputs).records_by_file())
        if retired:
            raise CorruptDataError(f"plan {self.plan_id}: {retired[0][3]}; compacting it would drop them; nothing was leased")
        hidden = sorted(self.hidden_offsets(snapshot).items())
        if hidden:
            (topic, partition), offsets = hidden[0]
            raise CorruptDataError(
                f"plan {self.plan_id}: {hidden_offsets_reason(topic, partition, offsets)}, and compacting it would drop "
                "them; restore the catalog database from a backup; nothing was leased"
            )

    def hidden_offsets(self, snapshot: Snapshot) -> dict[TopicPartition, HiddenOffsets]:
        """The partitions whose records the plan would drop, each with the first range of offsets hidden. A partition
        never compacted (`Snapshot.never_compacted`) holds every offset from its log start but its transactions'
        markers (`offset_holes`): a hole among the plan's sections of one that no live section outside the plan can
        fill is a damaged row hiding records (a files row
        deleted or marked removed, a section retired or moved), which the plan would leave out of its outputs, and gc
        would then collect with their file. In a compacted partition, the offsets between the plan's sections that no
        compaction dropped (`offset_holes`) nor a live section outside the plan holds (`Snapshot.unexplained_gaps`)
        are a damaged row's alike: its outputs would span them, and readers would no longer see the gap. The holes
        are read only for the partitions whose sections in the plan leave offsets between them (none in a copy of L0
        files), in one query per topic."""
        starts = snapshot.never_compacted(self.topics)
        spans = partition_spans(input_sections(self.inputs), starts)
        from_start: dict[TopicPartition, list[tuple[int, int]]] = {}
        unheld: dict[TopicPartition, list[tuple[int, int]]] = {}
        for tp, sections in spans.gapped.items():
            if between := gaps(sections, starts.get(tp)):
                (from_start if tp in starts else unheld)[tp] = between
        holes = {tp: left[0] for tp, left in snapshot.without_holes(from_start).items()}
        hidden: dict[TopicPartition, HiddenOffsets] = {}
        if holes:
            outside = lowest_outside(snapshot, self.inputs, set(holes), spans.lowest_above_l0)
            # A section outside the plan from at most the hole's last offset may hold them.
            hidden = {tp: HiddenOffsets(low, high, False) for tp, (low, high) in holes.items() if outside.get(tp, high + 1) > high}
        if unheld:
            unexplained = snapshot.unexplained_gaps(unheld, input_keys(self.inputs))
            hidden.update({tp: HiddenOffsets(low, high, True) for tp, (low, high) in unexplained.items()})
        return hidden

    def _check_sections(self, snapshot: Snapshot) -> None:
        recorded = snapshot.section_rows([f.key for f in self.inputs])
        topic_ids, codes = snapshot.topic_ids, {name: code for code, name in enumerate(COMPRESSIONS)}
        for data_file in self.inputs:
            # As the catalog's rows: topic_id, partition, byte_offset, byte_length, first_row, first_offset,
            # last_offset, record_count, min and max timestamp, tombstones, uncompressed_bytes, compression, crc32,
            # clean_below_delta (key sketches aside: stored plans leave them out). Both sorted by (topic_id,
            # partition), one section each: a stored plan puts a file's sections back together group by group.
            planned = sorted(
                (topic_ids[i.topic], i.partition, i.byte_offset, i.byte_length, i.first_row, first, first + i.last_delta,
                 i.record_count, i.min_timestamp, i.max_timestamp, i.tombstones, i.uncompressed_bytes, codes[i.compression],
                 i.crc32, i.clean_below_delta)
                for i, first in data_file.sections
            )
            if planned != sorted(recorded[data_file.key]):
                raise InvalidPlanError(
                    f"plan {self.plan_id}: input {data_file.key} differs from the catalog's record of it (its sections: "
                    f"{len(planned)} in the plan, {len(recorded[data_file.key])} in the catalog); plan again"
                )

    def _check_aborted(self, snapshot: Snapshot) -> None:
        """Each partition's aborted ranges are among the catalog's (a range it does not record would drop committed
        records), and hold every range it recorded by the plan's manifest version over the inputs (one left out
        would keep aborted records, and the outputs, filtered as of that version, would let gc forget it). A range
        gc forgot since the plan was made is refused too (plan again): the ranges a plan reads are not versioned."""
        spans: dict[TopicPartition, tuple[int, int]] = {}
        for data_file in self.inputs:
            for info, first in data_file.sections:
                tp = (info.topic, info.partition)
                low, end = spans.get(tp, (first, first + info.last_delta + 1))
                spans[tp] = (min(low, first), max(end, first + info.last_delta + 1))
        if not spans:
            return
        recorded, by_plan_version = snapshot.aborted_ranges(spans), snapshot.aborted_ranges(spans, self.manifest_version)
        for tp in sorted(set(self.aborted) | set(by_plan_version)):
            planned = set(self.aborted.get(tp, ()))
            if tp not in spans or not planned <= set(recorded.get(tp, ())) or not set(by_plan_version.get(tp, ())) <= planned:
                raise InvalidPlanError(
                    f"plan {self.plan_id}: the aborted ranges of {tp[0]}/{tp[1]} are {sorted(planned)[:5]}, the catalog's "
                    f"{list(recorded.get(tp, ()))[:5]}: a plan drops the records of exactly the aborted transactions; plan again"
                )

    def _check_floors(self, snapshot: Snapshot) -> None:
        # Per partition of a compacted topic, the offset past the plan's last: files that arrived since hold only
        # offsets from there on, and a floor or an uncleanable offset beyond the plan's records changes nothing.
        ends: dict[TopicPartition, int] = {}
        compacted = {name for name, topic in self.topics.items() if topic.config.compacted}
        for data_file in self.inputs:
            for info, first in data_file.sections:
                if info.topic in compacted:
                    tp = (info.topic, info.partition)
                    ends[tp] = max(ends.get(tp, 0), first + info.last_delta + 1)
        keys = [f.key for f in self.inputs]
        for name, planned, catalogs in (
            ("outside floor", self.outside_floors, lowest_outside(snapshot, self.inputs, set(ends))),
            ("first uncleanable offset", self.first_uncleanable, snapshot.first_uncleanable_offsets(ends, self.now_ms, keys)),
        ):
            for tp, end in sorted(ends.items()):
                if min(planned.get(tp, end), end) > min(catalogs.get(tp, end), end):
                    raise InvalidPlanError(
                        f"plan {self.plan_id}: the {name} of {tp[0]}/{tp[1]} is {planned.get(tp, 'none')}, the catalog's "
                        f"{catalogs.get(tp, 'none')}: a plan may not go below what the catalog protects; plan again"
                    )


@dataclass(frozen=True)
class PlanHeader:
    """A plan without its sections and outside floors: what leasing, scheduling and committing it need. A
    stored plan's `plan.json` and `inputs.arrow`."""

    plan_id: str
    cluster_id: str
    manifest_version: int
    now_ms: int
    mode: str
    target_level: int
    deduplicate: bool
    buffer_bytes: int
    target_file_bytes: int
    max_partition_bytes: int
    compression: str
    topics: dict[str, Topic]
    inputs: tuple[InputFile, ...]
    groups: tuple[PlanGroup, ...]
    set_aside: tuple[TopicPartition, ...] = ()

    def check_against(self, snapshot: Snapshot, now_ms: int) -> None:
        """What the header says, against the catalog and the caller's clock: the cluster, every input live at its
        level, size and creation time, the clock within MAX_PLAN_AGE_MS before and MAX_CLOCK_SKEW_MS after
        `now_ms`, the topics as the catalog has them now. One-line errors say what was expected and found."""
        if snapshot.cluster_id != self.cluster_id:
            raise InvalidPlanError(
                f"plan {self.plan_id} is for cluster {self.cluster_id}, but the store holds cluster {snapshot.cluster_id}; "
                "run it against its own store"
            )
        recorded = {f.key: f for f in snapshot.file_summaries_of([f.key for f in self.inputs])}
        for data_file in self.inputs:
            found = recorded.get(data_file.key)
            if found is None:
                raise CommitConflictError(
                    f"plan {self.plan_id} expected input {data_file.key} live as in manifest version {self.manifest_version}, "
                    f"found it gone in version {snapshot.version}; plan again"
                )
            if (found.level, found.size, found.created_ms) != (data_file.level, data_file.size, data_file.created_ms):
                raise InvalidPlanError(
                    f"plan {self.plan_id}: input {data_file.key} is at level {data_file.level}, {data_file.size} bytes, made at "
                    f"{utc_iso(data_file.created_ms)} in the plan; the catalog records level {found.level}, {found.size} bytes, made at "
                    f"{utc_iso(found.created_ms)}; plan again"
                )
        if not now_ms - MAX_PLAN_AGE_MS <= self.now_ms <= now_ms + MAX_CLOCK_SKEW_MS:
            raise InvalidPlanError(
                f"plan {self.plan_id} is made at {utc_iso(self.now_ms)}, the clock is {utc_iso(now_ms)}: a plan runs and commits within "
                f"{MAX_PLAN_AGE_MS // 60_000} minutes after its clock and never before it ({MAX_CLOCK_SKEW_MS // 60_000} "
                "minutes of skew); plan again"
            )
        for name, topic in self.topics.items():
            current = snapshot.topics.get(name)
            if current is None:
                raise InvalidPlanError(f"plan {self.plan_id} names topic {name!r}, which cluster {self.cluster_id} does not have; plan again")
            if (topic.partitions, topic.config) != (current.partitions, current.config):
                raise CommitConflictError(
                    f"plan {self.plan_id} expected topic {name} with {topic.partitions} partitions and {topic.config.to_kafka()}, "
                    f"found {current.partitions} and {current.config.to_kafka()} in the catalog; plan again"
                )


def new_plan_id(now_ms: int) -> str:
    return f"p{now_ms}-{uuid.uuid4().hex[:12]}"


def check_shape(plan: Plan | PlanHeader, source: str, whole: bool) -> None:
    """What a plan, its header and its pieces share: settings, input files and groups."""
    if plan.mode not in MODES:
        raise InvalidPlanError(f"{source}: mode {plan.mode!r} is not one of {', '.join(MODES)}")
    if plan.compression not in COMPRESSIONS:
        raise InvalidPlanError(f"{source}: compression {plan.compression!r} is not one of {', '.join(COMPRESSIONS)}")
    if whole and not plan.inputs:
        raise InvalidPlanError(f"{source}: plan {plan.plan_id} names no input files")
    keys = [f.key for f in plan.inputs]
    if len(set(keys)) != len(keys):
        raise InvalidPlanError(f"{source}: plan {plan.plan_id} names an input file twice")
    for data_file in plan.inputs:
        named = DATA_KEY_PATTERN.fullmatch(data_file.key)
        if named is None or int(named.group(1)) != data_file.level:
            raise InvalidPlanError(
                f"{source}: input {data_file.key[:120]!r} is not a data file of level {data_file.level} "
                f"(data/l{data_file.level}/NAME.seg); plan again"
            )
        if data_file.level > plan.target_level:
            raise InvalidPlanError(
                f"{source}: input {data_file.key} is at level {data_file.level}, above the target level {plan.target_level}"
            )
    if not plan.groups or (not whole and len(plan.groups) > 1):
        raise InvalidPlanError(f"{source}: plan {plan.plan_id} lists {len(plan.groups)} groups; a plan has at least one, a piece one")
    for number, group in enumerate(plan.groups):
        if whole and group.group != number:
            raise InvalidPlanError(f"{source}: group {group.group} is listed as group {number}: number the groups 0, 1, ... in order")
        if group.first is None or group.last is None:
            if len(plan.groups) > 1 or group.partitions:
                raise InvalidPlanError(f"{source}: group {group.group} has no first or last partition; only a plan without sections has such a group")
        elif group.first > group.last:
            raise InvalidPlanError(f"{source}: group {group.group} ends at {group.last} before its first partition {group.first}")
        previous_last = plan.groups[number - 1].last if number else None
        if previous_last is not None and group.first is not None and previous_last >= group.first:
            raise InvalidPlanError(f"{source}: group {group.group} starts at {group.first}, within group {number - 1}")


class HiddenOffsets(NamedTuple):
    """The first range of a partition's offsets a plan's inputs leave unheld and nothing explains (`Plan.hidden_offsets`):
    in a partition never compacted, or one whose compaction holes do not hold them (`compacted`)."""

    low: int
    high: int
    compacted: bool


def hidden_offsets_reason(topic: str, partition: int, hidden: HiddenOffsets) -> str:
    """Why a partition's records are hidden, in one line: what refuses a plan, and what marks it uncleanable."""
    why = "no compaction dropped them" if hidden.compacted else "the partition was never compacted"
    return (
        f"catalog rows of partition {topic}/{partition} hide offsets {hidden.low} to {hidden.high}: no live section holds "
        f"them, yet {why}, so a row that held them is damaged (a files row deleted or marked removed, a section retired "
        "or moved to another partition or topic)"
    )
