"""Compaction plans: the engine's input, specified in docs/plan.md.

A `Plan` is one object in memory, split into groups once, by the planner that makes it: a group is a run of
whole topic-partitions in (topic, partition) order. What a job runs is a plan whose inputs hold only the
sections of its group (`Plan.piece`) or of its slice of a group (`decode_group`). Written, a plan takes one of
two forms:

- one JSON document (`Plan.to_json`, `Plan.from_json`): what `logcompact plan` prints and `compact --plan` reads;
- stored: a header (`PlanHeader`: a small JSON document of settings, topics and groups, and an Arrow document
  listing the input files without their sections) and one Arrow document per group with that group's sections
  and outside floors (`encode_groups`, `decode_group`), so a group's workers read their own part and the
  commit reads the header alone (`logcompact.jobs.documents` keeps them in the store). Stored sections leave
  out the key sketches, which only the planner reads.
"""

from __future__ import annotations

import base64
import binascii
import bisect
import json
import uuid
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from itertools import repeat
from typing import TYPE_CHECKING, Any, NamedTuple, get_type_hints

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import CatalogSection, DataFile, TopicPartition
from logcompact.collector import collector_paused
from logcompact.exceptions import CommitConflictError, InvalidPlanError
from logcompact.format.layout import COMPRESSIONS, SectionInfo
from logcompact.keys import DATA_KEY_PATTERN, PLAN_ID_PATTERN, output_key
from logcompact.limits import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_MAX_PARTITION_BYTES,
    DEFAULT_TARGET_FILE_BYTES,
    MAX_BUFFER_BYTES,
    MAX_BYTE_COUNT,
    MAX_CLOCK_SKEW_MS,
    MAX_LEVEL,
    MAX_PLAN_AGE_MS,
    MAX_TARGET_FILE_BYTES,
    MIN_BUFFER_BYTES,
    MODES,
)
from logcompact.topics import Topic

if TYPE_CHECKING:  # a Spark task reads plans without loading the catalog's database layer
    from logcompact.catalog import PlanningSnapshot, Snapshot

# 3: `first_uncleanable` leaves out the plan's own inputs, whose first young record the engine finds (an
# engine reading format 2 would deduplicate them).
PLAN_FORMAT = 3


class PlanGroup(NamedTuple):
    """A group of a plan: its whole topic-partitions from `first` to `last` in (topic, partition) order, and how
    many partitions and bytes it holds (its sections' uncompressed bytes: what a job decodes; small sections
    share their compressed blocks). Only a plan without sections has a group without partitions (`first` and
    `last` None)."""

    group: int
    first: TopicPartition | None
    last: TopicPartition | None
    partitions: int
    bytes: int

    def holds(self, tp: TopicPartition) -> bool:
        return self.first is not None and self.last is not None and self.first <= tp <= self.last

    def to_dict(self) -> dict:
        return {
            "group": self.group,
            "first": None if self.first is None else list(self.first),
            "last": None if self.last is None else list(self.last),
            "partitions": self.partitions,
            "bytes": self.bytes,
        }

    @classmethod
    def from_dict(cls, document: Any, source: str) -> PlanGroup:
        if not isinstance(document, dict):
            raise InvalidPlanError(f"{source}: a group is an object {{group, first, last, partitions, bytes}}")
        name = f"group {document.get('group')!r}"
        return cls(
            _integer(document, "group", 0, source=source),
            _topic_partition(document, "first", f"{source}: {name}"),
            _topic_partition(document, "last", f"{source}: {name}"),
            _integer(document, "partitions", 0, source=f"{source}: {name}"),
            _integer(document, "bytes", 0, source=f"{source}: {name}"),
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
    inputs: tuple[DataFile, ...]
    topics: dict[str, Topic]
    # Per partition: the smallest offset held by a live file outside this plan. A tombstone at or above
    # it may have older values of its key elsewhere, so it is never removed by this plan.
    outside_floors: dict[TopicPartition, int] = field(default_factory=dict)
    # Per partition whose topic sets min.compaction.lag.ms: Kafka's first uncleanable offset as the sections
    # outside this plan set it (`Snapshot.first_uncleanable_offsets`, the other plans' inputs included), so min
    # lag is the same whichever files the plan takes; the engine lowers it to the first record within the lag
    # among the plan's own inputs, and ends each output section there.
    first_uncleanable: dict[TopicPartition, int] = field(default_factory=dict)
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
            groups=(chosen,),
            group=group,
        )

    def header(self) -> PlanHeader:
        return PlanHeader(
            **{name: getattr(self, name) for name in _SETTINGS},
            topics=self.topics,
            inputs=tuple(InputFile(f.key, f.level, f.size, f.created_ms) for f in self.inputs),
            groups=self.groups,
            set_aside=self.set_aside,
        )

    # -- the single JSON document ------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            **_settings_dict(self),
            "topics": [t.to_dict() for t in self.topics.values()],
            "groups": [g.to_dict() for g in self.groups],
            "inputs": [file_to_json(f) for f in self.inputs],
            "outside_floors": [[t, p, floor] for (t, p), floor in sorted(self.outside_floors.items())],
            "first_uncleanable": [[t, p, offset] for (t, p), offset in sorted(self.first_uncleanable.items())],
            "set_aside": [list(tp) for tp in self.set_aside],
        }

    def to_json(self) -> str:
        with collector_paused():
            return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, document: Any, source: str = "plan") -> Plan:
        """A validated plan; anything malformed is an InvalidPlanError naming the field."""
        _check_format(document, source)
        if "inputs" not in document and "groups" in document:
            raise InvalidPlanError(
                f"{source}: this is the header of a stored plan, whose inputs and sections are in the documents beside it; "
                "pass the plan's directory"
            )
        try:
            with collector_paused():
                inputs = [file_from_json(entry, source) for entry in _list(document, "inputs", source)]
            plan = cls(
                **_settings_from_dict(document, source),
                topics=_topics_from_dict(document, source),
                groups=tuple(PlanGroup.from_dict(g, source) for g in _list(document, "groups", source)),
                outside_floors=_offsets_from_dict(document, "outside_floors", source),
                first_uncleanable=_offsets_from_dict(document, "first_uncleanable", source),
                set_aside=_set_aside_from_dict(document, source),
                inputs=tuple(inputs),
            )
        except InvalidPlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidPlanError(f"{source}: malformed plan ({type(exc).__name__}: {exc}); regenerate it with `logcompact plan`") from None
        plan.validate(source)
        return plan

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        with collector_paused():
            return cls.from_dict(_parse_json(text, source), source)

    @classmethod
    def from_pieces(cls, header: PlanHeader, pieces: Sequence[Plan], source: str) -> Plan:
        """The whole plan from its header and the pieces of its groups (`decode_group`), in group order."""
        sections: dict[str, list[CatalogSection]] = {f.key: [] for f in header.inputs}
        floors: dict[TopicPartition, int] = {}
        young: dict[TopicPartition, int] = {}
        for group, piece in zip(header.groups, pieces, strict=True):
            if piece.plan_id != header.plan_id or piece.groups != (group,):
                raise InvalidPlanError(f"{source}: the document of group {group.group} is not that group of this plan; plan again")
            for data_file in piece.inputs:
                if data_file.key not in sections:
                    raise InvalidPlanError(f"{source}: group {group.group} reads {data_file.key}, which the header does not list; plan again")
                sections[data_file.key].extend(data_file.sections)  # groups follow (topic, partition) order, as files do
            floors.update(piece.outside_floors)
            young.update(piece.first_uncleanable)
        with collector_paused():
            inputs = tuple(DataFile(f.key, f.level, f.size, f.created_ms, tuple(sections[f.key])) for f in header.inputs)
        plan = cls(
            **{name: getattr(header, name) for name in _SETTINGS}, topics=header.topics, inputs=inputs, outside_floors=floors,
            first_uncleanable=young, groups=header.groups, set_aside=header.set_aside,
        )
        plan.validate(source)
        return plan

    # -- validation ------------------------------------------------------------------------------

    def validate(self, source: str = "plan", whole: bool = True) -> None:
        """Rules that need no catalog: shapes, ranges, and that the inputs and groups make sense together. A piece
        (`whole` False) holds one group, and no input when its plan has no sections."""
        _check_plan(self, source, whole)
        starts = [g.first for g in self.groups[1:] if g.first is not None]  # all of them: _check_plan checked
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
        section of each (but of the partitions it sets aside: pass a snapshot setting them aside); and, when it
        deduplicates, its outside floors and first uncleanable offsets no higher than the catalog's (lower only
        keeps more)."""
        self.header().check_against(snapshot, now_ms)
        with collector_paused():
            self._check_sections(snapshot)
            if self.deduplicate:  # a copy reads neither (engine/cleaner.py): they rule deduplication only
                self._check_floors(snapshot)

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


_NO_OFFSET = 1 << 63  # a partition without an outside floor or a first uncleanable offset


def lowest_outside(
    snapshot: PlanningSnapshot, inputs: Sequence[DataFile], partitions: set[TopicPartition], held: dict[TopicPartition, int] | None = None
) -> dict[TopicPartition, int]:
    """Per partition of `partitions`, the lowest offset held by a live file outside `inputs`: the outside floors of
    a plan, or of the plans, taking `inputs`. Above L0 it is the floor the catalog keeps (`Snapshot.floors_above_l0`)
    unless the inputs hold it (`held`: their lowest offsets above L0, when the caller has them), or the snapshot is
    older than it: those partitions' sections are read. Below, the live L0 files outside `inputs` are read: a few
    hundred at most."""
    if not partitions:
        return {}
    if held is None:
        held = input_offsets(inputs).lowest_above_l0
    floors = snapshot.floors_above_l0(partitions)
    read = {tp for tp in partitions if tp not in floors or _held_floor(held.get(tp), floors[tp])}
    keys = [data_file.key for data_file in inputs]
    found = _read_outside(snapshot, keys, read) if read else {}
    found.update(snapshot.outside_floors_in_l0(keys, partitions - read))
    for tp in partitions - read:
        floor = floors[tp]
        if floor is not None:
            found[tp] = min(floor, found.get(tp, floor))
    return found


def _read_outside(snapshot: PlanningSnapshot, keys: Sequence[str], partitions: set[TopicPartition]) -> dict[TopicPartition, int]:
    """`lowest_outside` read from the sections: those of the files outside `keys`, or those of the partitions,
    whichever costs less. A partition's sections are found through an index, about four times the cost of a file's
    (measured on SQLite; PostgreSQL is cheaper either way), so a plan of nearly every file reads by file."""
    live = sum(snapshot.level_counts().values())
    outside = live - len(keys)
    if outside <= 0:
        return {}
    if 4 * live * len(partitions) < outside * sum(topic.partitions for topic in snapshot.topics.values()):
        return snapshot.outside_floors(keys, partitions)
    taken = set(keys)
    unplanned = [f.key for f in snapshot.file_summaries() if f.key not in taken]
    return {tp: offset for tp, offset in snapshot.lowest_offsets(unplanned).items() if tp in partitions}


def _held_floor(inputs_lowest: int | None, floor: int | None) -> bool:
    """Do the inputs hold the partition's floor above L0 (their lowest offset there at or below it)?"""
    return inputs_lowest is not None and floor is not None and inputs_lowest <= floor


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
                    f"{data_file.created_ms} in the plan; the catalog records level {found.level}, {found.size} bytes, made at "
                    f"{found.created_ms}; plan again"
                )
        if not now_ms - MAX_PLAN_AGE_MS <= self.now_ms <= now_ms + MAX_CLOCK_SKEW_MS:
            raise InvalidPlanError(
                f"plan {self.plan_id} is made at {self.now_ms} ms, the clock is {now_ms} ms: a plan runs and commits within "
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

    def documents(self) -> tuple[bytes, bytes]:
        """`plan.json` (settings, topics, groups) and `inputs.arrow` (the input files, one row each)."""
        document = {
            **_settings_dict(self), "topics": [t.to_dict() for t in self.topics.values()], "groups": [g.to_dict() for g in self.groups],
            "set_aside": [list(tp) for tp in self.set_aside],
        }
        columns = list(zip(*self.inputs)) if self.inputs else [()] * len(InputFile._fields)
        inputs = pa.table([pa.array(c, f.type) for c, f in zip(columns, INPUTS_SCHEMA)], schema=INPUTS_SCHEMA)
        return json.dumps(document, separators=(",", ":")).encode(), _arrow_file(inputs)

    @classmethod
    def from_documents(cls, text: bytes, inputs: bytes, source: str) -> PlanHeader:
        document = _parse_json(text, source)
        _check_format(document, source)
        table = _arrow_table(inputs, INPUTS_SCHEMA, f"{source} inputs")
        try:
            with collector_paused():
                files = tuple(map(InputFile._make, zip(*(_column(table, name) for name in InputFile._fields))))
            header = cls(
                **_settings_from_dict(document, source),
                topics=_topics_from_dict(document, source),
                inputs=files,
                groups=tuple(PlanGroup.from_dict(g, source) for g in _list(document, "groups", source)),
                set_aside=_set_aside_from_dict(document, source),
            )
        except InvalidPlanError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise InvalidPlanError(f"{source}: malformed plan header ({type(exc).__name__}: {exc}); plan again") from None
        _check_plan(header, source, whole=True)
        return header


def new_plan_id(now_ms: int) -> str:
    return f"p{now_ms}-{uuid.uuid4().hex[:12]}"


# -- groups ----------------------------------------------------------------------------------------------


class InputOffsets(NamedTuple):
    """What planners take from a plan's inputs, per topic-partition (`input_offsets`)."""

    lowest: dict[TopicPartition, int]  # the lowest first offset of its sections
    sizes: dict[TopicPartition, int]  # their uncompressed bytes (what groups are split by)
    lowest_above_l0: dict[TopicPartition, int]  # the lowest first offset of its sections above L0
    young: dict[TopicPartition, int]  # the first offset of the first section holding a record newer than `young_after`'s


def input_offsets(inputs: Iterable[DataFile], young_after: Mapping[str, int] | None = None) -> InputOffsets:
    """`InputOffsets` of `inputs`, in one pass: planners walk hundreds of thousands of sections. `young_after`: per
    topic with a min lag, the newest timestamp old enough to clean (none: `young` left empty)."""
    lowest: dict[TopicPartition, int] = {}
    sizes: dict[TopicPartition, int] = {}
    above: dict[TopicPartition, int] = {}
    young: dict[TopicPartition, int] = {}
    held, cut = lowest.get, (young_after or {}).get
    for data_file in inputs:
        upper = data_file.level > 0
        for info, first in data_file.sections:
            tp = (info.topic, info.partition)
            low = held(tp)
            if low is None:
                lowest[tp], sizes[tp] = first, info.uncompressed_bytes
            else:
                if first < low:
                    lowest[tp] = first
                sizes[tp] += info.uncompressed_bytes
            if upper and first < above.get(tp, _NO_OFFSET):
                above[tp] = first
            newest = cut(info.topic)
            if newest is not None and info.max_timestamp > newest and first < young.get(tp, _NO_OFFSET):
                young[tp] = first
    return InputOffsets(lowest, sizes, above, young)


def split_into_groups(sizes: dict[TopicPartition, int], group_bytes: int | None) -> tuple[PlanGroup, ...]:
    """Groups of whole partitions in (topic, partition) order, each holding at most about `group_bytes` of the
    inputs' sections, uncompressed (`sizes`, from `input_offsets`; a partition larger than that is a group of
    its own). None: one group of every partition."""
    runs: list[list[TopicPartition]] = []
    total = 0
    for tp in sorted(sizes):
        if not runs or (group_bytes is not None and total + sizes[tp] > group_bytes):
            runs.append([])
            total = 0
        runs[-1].append(tp)
        total += sizes[tp]
    if not runs:
        return (PlanGroup(0, None, None, 0, 0),)
    return tuple(PlanGroup(number, run[0], run[-1], len(run), sum(sizes[tp] for tp in run)) for number, run in enumerate(runs))


# -- the Arrow documents of a stored plan ---------------------------------------------------------------------

# Every SectionInfo field the engine reads is a column, typed from its annotation, so fields the format adds flow
# through. The key sketch is the planner's alone (its estimates): a stored plan's sections go without it.
_ARROW_TYPES = {str: pa.string(), int: pa.int64(), bytes: pa.binary()}
_SECTION_TYPES = get_type_hints(SectionInfo)
_PLANNER_ONLY = {"key_sketch": SectionInfo._field_defaults["key_sketch"]}
_PLACED_STRUCT = pa.struct(
    [
        pa.field("info", pa.struct([pa.field(name, _ARROW_TYPES[kind]) for name, kind in _SECTION_TYPES.items()])),
        pa.field("first_offset", pa.int64()),
    ]
)


def _column_type(kind: type) -> pa.DataType:
    # Strings (topics, compressions) repeat: stored once each, as a dictionary.
    return pa.dictionary(pa.int32(), pa.string()) if kind is str else _ARROW_TYPES[kind]


INPUTS_SCHEMA = pa.schema([pa.field(name, _ARROW_TYPES[kind], nullable=False) for name, kind in get_type_hints(InputFile).items()])
GROUP_SCHEMA = pa.schema(
    [
        pa.field("file", pa.int32(), nullable=False),  # the section's file: its row in the plan's inputs
        pa.field("first_offset", pa.int64(), nullable=False),
        *(pa.field(name, _column_type(kind), nullable=False) for name, kind in _SECTION_TYPES.items() if name not in _PLANNER_ONLY),
        pa.field("outside_floor", pa.int64()),
        pa.field("first_uncleanable", pa.int64()),
    ]
)
# The group document's schema metadata: the group's settings, topics and PlanGroup, as JSON.
GROUP_METADATA_KEY = b"logcompact.plan"
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


def encode_groups(plan: Plan) -> list[bytes]:
    """The plan's group documents, one per group in order: Arrow IPC files (zstd), one row per section, in the
    plan's file order. The sections are converted to Arrow once, then dealt to their groups by their
    (topic, partition) codes."""
    with collector_paused():
        counts = [len(f.sections) for f in plan.inputs]
        placed = pa.array([s for f in plan.inputs for s in f.sections], _PLACED_STRUCT)
    info, first_offsets = placed.flatten()
    columns = {"file": pa.array(np.repeat(np.arange(len(counts), dtype=np.int32), counts)), "first_offset": first_offsets}
    for name, values in zip(_SECTION_TYPES, info.flatten()):
        if name not in _PLANNER_ONLY:
            columns[name] = values.dictionary_encode() if _SECTION_TYPES[name] is str else values
    codes = _partition_codes(columns["topic"], columns["partition"], plan.topics)
    for column, per_partition in (("outside_floor", plan.outside_floors), ("first_uncleanable", plan.first_uncleanable)):
        keys = _partition_codes(
            pa.array([t for t, _ in per_partition], pa.string()), pa.array([p for _, p in per_partition], pa.int64()), plan.topics
        )
        columns[column] = _lookup(codes, keys, np.fromiter(per_partition.values(), np.int64, len(per_partition)))
    table = pa.table(columns, schema=GROUP_SCHEMA)
    firsts = [g.first for g in plan.groups[1:] if g.first is not None]  # all of them in a checked plan
    starts = _partition_codes(pa.array([t for t, _ in firsts], pa.string()), pa.array([p for _, p in firsts], pa.int64()), plan.topics)
    numbers = np.searchsorted(starts, codes, side="right")
    documents = []
    for group in plan.groups:
        rows = table if len(plan.groups) == 1 else table.filter(pa.array(numbers == group.group))
        topics = pc.unique(rows.column("topic").combine_chunks().dictionary_decode()).to_pylist() if rows.num_rows else []
        metadata = {**_settings_dict(plan), "topics": [plan.topics[t].to_dict() for t in sorted(topics)], "group": group.to_dict()}
        documents.append(_arrow_file(rows.replace_schema_metadata({GROUP_METADATA_KEY: json.dumps(metadata, separators=(",", ":"))})))
    return documents


def _partition_codes(topics: pa.Array, partitions: pa.Array, described: dict[str, Topic]) -> np.ndarray:
    """(topic, partition) pairs as int64 codes that sort as the pairs do: the topic's rank among the plan's topic
    names, then the partition number."""
    ranks = pc.fill_null(pc.index_in(topics, value_set=pa.array(sorted(described), pa.string())), -1)  # -1: not described
    return (ranks.to_numpy().astype(np.int64) << 32) | partitions.to_numpy(zero_copy_only=False).astype(np.int64)


def _lookup(codes: np.ndarray, keys: np.ndarray, values: np.ndarray) -> pa.Array:
    """Per code, the value of its key (null where none): a vectorized dictionary lookup."""
    if not len(keys):
        return pa.nulls(len(codes), pa.int64())
    order = np.argsort(keys)
    keys, values = keys[order], values[order]
    at = np.minimum(np.searchsorted(keys, codes), len(keys) - 1)
    return pa.array(values[at], pa.int64(), mask=keys[at] != codes)


def group_partition_bytes(data: bytes, source: str) -> dict[TopicPartition, int]:
    """Per topic-partition of a group document, the uncompressed bytes of its sections (what slices are dealt by),
    without building its sections."""
    table = _arrow_table(data, GROUP_SCHEMA, source)
    sums = table.group_by(["topic", "partition"]).aggregate([("uncompressed_bytes", "sum")])
    return dict(zip(zip(_column(sums, "topic"), _column(sums, "partition")), _column(sums, "uncompressed_bytes_sum")))


def decode_group(
    data: bytes, inputs: bytes, source: str, partitions: Collection[TopicPartition] | None = None, slice: int = 0
) -> Plan:
    """The piece of a plan a group document holds, its files from the plan's `inputs.arrow`, validated; or slice
    `slice` of it: the sections of `partitions`."""
    table = _arrow_table(data, GROUP_SCHEMA, source)
    files = _arrow_table(inputs, INPUTS_SCHEMA, f"{source}: the plan's inputs")
    metadata = (table.schema.metadata or {}).get(GROUP_METADATA_KEY)
    if metadata is None:
        raise InvalidPlanError(f"{source}: the group document has no {GROUP_METADATA_KEY.decode()} metadata; plan again")
    document = _parse_json(metadata, source)
    _check_format(document, source)
    try:
        settings = _settings_from_dict(document, source)
        topics = _topics_from_dict(document, source)
        group = PlanGroup.from_dict(document["group"], source)
    except InvalidPlanError:
        raise
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise InvalidPlanError(f"{source}: malformed group metadata ({type(exc).__name__}: {exc}); plan again") from None
    if partitions is not None:
        wanted = list(partitions)
        wanted_codes = _partition_codes(pa.array([t for t, _ in wanted], pa.string()), pa.array([p for _, p in wanted], pa.int64()), topics)
        codes = _partition_codes(table.column("topic").combine_chunks().dictionary_decode(), table.column("partition").combine_chunks(), topics)
        table = table.filter(pa.array(np.isin(codes, wanted_codes)))
    bounds = pc.min_max(table.column("file")).as_py()
    if table.num_rows and (bounds["min"] < 0 or bounds["max"] >= files.num_rows):
        raise InvalidPlanError(f"{source}: a section names file {bounds['max']}, beyond the plan's {files.num_rows} inputs; plan again")
    with collector_paused():
        columns = (repeat(_PLANNER_ONLY[name]) if name in _PLANNER_ONLY else _column(table, name) for name in SectionInfo._fields)
        infos = list(map(SectionInfo._make, zip(*columns)))
        sections = list(map(CatalogSection, infos, _column(table, "first_offset")))
        # Rows are in the plan's file order: each run of one file is that file's sections.
        rows = _column(table, "file")
        used = sorted(set(rows))
        described = dict(zip(used, map(InputFile._make, zip(*(_column(files.take(used), name) for name in InputFile._fields)))))
        inputs_of_piece, start = [], 0
        for end in [n for n in range(1, len(rows)) if rows[n] != rows[n - 1]] + ([len(rows)] if rows else []):
            key, level, size, created_ms = described[rows[start]]
            inputs_of_piece.append(DataFile(key, level, size, created_ms, tuple(sections[start:end])))
            start = end
        floors = {(i.topic, i.partition): floor for i, floor in zip(infos, _column(table, "outside_floor")) if floor is not None}
        young = {(i.topic, i.partition): offset for i, offset in zip(infos, _column(table, "first_uncleanable")) if offset is not None}
        piece = Plan(
            **settings, topics=topics, inputs=tuple(inputs_of_piece), outside_floors=floors, first_uncleanable=young, groups=(group,),
            group=group.group,
            slice=slice,
        )
        piece.validate(source, whole=False)
    return piece


def _arrow_file(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_file(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _arrow_table(data: bytes, schema: pa.Schema, source: str) -> pa.Table:
    """The table of an Arrow document, with every column of `schema` (named in the error when one is not)."""
    try:
        table = pa.ipc.open_file(pa.py_buffer(data)).read_all()
    except (pa.ArrowInvalid, OSError) as exc:
        raise InvalidPlanError(f"{source}: not an Arrow document of a plan ({str(exc).splitlines()[0]}); plan again") from None
    for expected in schema:
        index = table.schema.get_field_index(expected.name)
        if index < 0 or table.schema.field(index).type != expected.type:
            found = "missing" if index < 0 else f"of type {table.schema.field(index).type}"
            raise InvalidPlanError(f"{source}: column {expected.name!r} is {found}, expected {expected.type}; plan again")
        if not expected.nullable and table.column(index).null_count:
            raise InvalidPlanError(f"{source}: column {expected.name!r} has nulls; plan again")
    return table


def _column(table: pa.Table, name: str) -> list:
    column = table.column(name).combine_chunks()
    if pa.types.is_dictionary(column.type):
        names = column.dictionary.to_pylist()
        return [names[i] for i in column.indices.to_numpy(zero_copy_only=False).tolist()]
    if pa.types.is_integer(column.type) and column.null_count == 0:
        return column.to_numpy().tolist()
    return column.to_pylist()


# -- JSON fields, shared by the single document, the header and the group documents' metadata -----------------

_SETTINGS = (
    "plan_id", "cluster_id", "manifest_version", "now_ms", "mode", "target_level", "deduplicate", "buffer_bytes",
    "target_file_bytes", "max_partition_bytes", "compression",
)
_BYTES_FIELDS = [name for name in SectionInfo._fields if _SECTION_TYPES[name] is bytes]
_KIND_NAMES = {int: "an integer", str: "a string"}


def _settings_dict(plan: Plan | PlanHeader) -> dict[str, Any]:
    return {"format": PLAN_FORMAT, **{name: getattr(plan, name) for name in _SETTINGS}}


def _settings_from_dict(document: dict, source: str) -> dict[str, Any]:
    return {
        "plan_id": _plan_id(document, source),
        "cluster_id": _text(document, "cluster_id", source),
        "manifest_version": _integer(document, "manifest_version", 1, source=source),
        "now_ms": _integer(document, "now_ms", 0, 2**63 - 1, source=source),
        "mode": _text(document, "mode", source, "regular"),
        "target_level": _integer(document, "target_level", 1, MAX_LEVEL, source=source),
        "deduplicate": _boolean(document, "deduplicate", source),
        "buffer_bytes": _integer(document, "buffer_bytes", MIN_BUFFER_BYTES, MAX_BUFFER_BYTES, source=source),
        "target_file_bytes": _integer(document, "target_file_bytes", 1, MAX_TARGET_FILE_BYTES, source=source),
        "max_partition_bytes": _integer(document, "max_partition_bytes", 1, MAX_BYTE_COUNT, source=source),
        "compression": _text(document, "compression", source, "lz4"),
    }


def _check_format(document: Any, source: str) -> None:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: a plan is a JSON object")
    if document.get("format") != PLAN_FORMAT:
        raise InvalidPlanError(f"{source}: plan format {document.get('format')!r} is not supported (expected {PLAN_FORMAT}); plan again")


def _check_plan(plan: Plan | PlanHeader, source: str, whole: bool) -> None:
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


def _input_dict(data_file: DataFile | InputFile) -> dict[str, Any]:
    return {"key": data_file.key, "level": data_file.level, "size": data_file.size, "created_ms": data_file.created_ms}


def _input_from_dict(document: Any, source: str) -> tuple[str, int, int, int]:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: an input is an object {{key, level, size, created_ms}}")
    key = _text(document, "key", source)
    where = f"{source}: input {key}"
    return key, _integer(document, "level", 0, source=where), _integer(document, "size", 0, source=where), _integer(document, "created_ms", 0, source=where)


def file_to_json(data_file: DataFile) -> dict[str, Any]:
    """A file with its sections as JSON values (plans, job results, `logcompact files`): every SectionInfo field,
    bytes in base64, and the section's first offset."""
    return {**_input_dict(data_file), "sections": [_section_to_json(s) for s in data_file.sections]}


def file_from_json(document: Any, source: str) -> DataFile:
    """The file `file_to_json` wrote, checked field by field."""
    sections = tuple(_section_from_json(s, source) for s in _list(document, "sections", source))
    return DataFile(*_input_from_dict(document, source), sections)


def _section_to_json(section: CatalogSection) -> dict[str, Any]:
    fields = section.info._asdict()
    for name in _BYTES_FIELDS:
        fields[name] = base64.b64encode(fields[name]).decode()
    return {**fields, "first_offset": section.first_offset}


def _section_from_json(document: Any, source: str) -> CatalogSection:
    if not isinstance(document, dict):
        raise InvalidPlanError(f"{source}: a section is an object of the SectionInfo fields and first_offset")
    fields = dict(document)
    first_offset = fields.pop("first_offset")
    unknown = set(fields) - set(SectionInfo._fields)
    if unknown:
        raise InvalidPlanError(f"{source}: section field(s) {', '.join(sorted(unknown))} unknown; plan again")
    for name, value in fields.items():
        kind = _SECTION_TYPES[name]
        if kind is bytes:
            try:
                fields[name] = base64.b64decode(value, validate=True)
            except (binascii.Error, TypeError, ValueError):
                raise InvalidPlanError(f"{source}: section field {name!r} is not base64") from None
        elif not isinstance(value, kind) or isinstance(value, bool):
            raise InvalidPlanError(f"{source}: section field {name!r} is {value!r}: must be {_KIND_NAMES[kind]}")
    if not isinstance(first_offset, int) or isinstance(first_offset, bool):
        raise InvalidPlanError(f"{source}: section field 'first_offset' is {first_offset!r}: must be an integer")
    return CatalogSection(SectionInfo(**fields), first_offset)


def _topics_from_dict(document: dict, source: str) -> dict[str, Topic]:
    return {t["name"]: Topic.from_dict(t) for t in _list(document, "topics", source)}


def _offsets_from_dict(document: dict, name: str, source: str) -> dict[TopicPartition, int]:
    """A per-partition offset field, [[topic, partition, offset], ...]; a plan without it has none."""
    offsets = {}
    for entry in _list(document, name, source) if name in document else []:
        if not (isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and all(isinstance(v, int) for v in entry[1:])):
            raise InvalidPlanError(f"{source}: {name} entry {entry!r} is not [topic, partition, offset]")
        offsets[(entry[0], entry[1])] = entry[2]
    return offsets


def _plan_id(document: dict, source: str) -> str:
    plan_id = _text(document, "plan_id", source)
    if not PLAN_ID_PATTERN.fullmatch(plan_id):
        raise InvalidPlanError(f"{source}: plan_id {plan_id[:80]!r} is not p<clock ms>-<12 hex digits>, as the planner names plans; plan again")
    return plan_id


def _set_aside_from_dict(document: dict, source: str) -> tuple[TopicPartition, ...]:
    entries = document.get("set_aside", [])
    if not isinstance(entries, list) or not all(
        isinstance(e, list) and len(e) == 2 and isinstance(e[0], str) and isinstance(e[1], int) and not isinstance(e[1], bool)
        for e in entries
    ):
        raise InvalidPlanError(f"{source}: plan field 'set_aside' must be a list of [topic, partition]")
    return tuple(sorted((e[0], e[1]) for e in entries))


def _parse_json(text: str | bytes, source: str) -> Any:
    try:
        return json.loads(text.decode("utf-8") if isinstance(text, bytes) else text)
    except UnicodeDecodeError as exc:
        raise InvalidPlanError(f"{source}: not UTF-8 text (byte {exc.start}); plan again") from None
    except json.JSONDecodeError as exc:
        raise InvalidPlanError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise InvalidPlanError(f"{source}: JSON nested too deep to be a plan; plan again") from None
    except ValueError as exc:  # an integer of more digits than Python converts
        raise InvalidPlanError(f"{source}: not a plan ({str(exc).splitlines()[0]}); plan again") from None


def _list(document: dict, name: str, source: str) -> list:
    value = document[name]
    if not isinstance(value, list):
        raise InvalidPlanError(f"{source}: plan field {name!r} must be a list")
    return value


def _topic_partition(document: dict, name: str, source: str) -> TopicPartition | None:
    value = document[name]
    if value is None:
        return None
    if not (isinstance(value, list) and len(value) == 2 and isinstance(value[0], str) and isinstance(value[1], int)):
        raise InvalidPlanError(f"{source}: field {name!r} is {value!r}, not [topic, partition] or null")
    return value[0], value[1]


def _text(document: dict, name: str, source: str, default: str | None = None) -> str:
    value = document.get(name, default) if default is not None else document[name]
    if not isinstance(value, str) or not value:
        raise InvalidPlanError(f"{source}: plan field {name!r} must be a non-empty string")
    return value


def _integer(document: dict, name: str, low: int, high: int | None = None, *, source: str) -> int:
    value = document[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f"at least {low}"
        raise InvalidPlanError(f"{source}: plan field {name!r} is {value!r}: must be an integer, {allowed}")
    return value


def _boolean(document: dict, name: str, source: str) -> bool:
    value = document[name]
    if not isinstance(value, bool):
        raise InvalidPlanError(f"{source}: plan field {name!r} must be true or false")
    return value
