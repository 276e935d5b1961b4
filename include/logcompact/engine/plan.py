"""Compaction plans: the engine's input, a versioned JSON document specified in docs/plan.md."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from logcompact.catalog import DataFile, Snapshot
from logcompact.exceptions import CommitConflictError, InvalidPlanError
from logcompact.topics import Topic

PLAN_FORMAT = 1
MAX_LEVEL = 4
DEFAULT_TARGET_FILE_BYTES = 256 * 1024 * 1024
# The key map's buffer of each job: WarpStream's 128 MiB.
DEFAULT_BUFFER_BYTES = 128 * 1024 * 1024
DEFAULT_MAX_PARTITION_BYTES = 128 * 1024**3
MODES = ("regular", "full", "max-lag")
# Plans and their groups' results are kept in the store under this prefix (logcompact.engine.exchange).
PLANS_PREFIX = "plans/"

TopicPartition = tuple[str, int]


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
    partitions: tuple[TopicPartition, ...] | None = None  # None: every partition in the inputs
    group: int = 0
    slice: int = 0  # a worker's share of a group (the Spark job splits a group into slices of partitions)
    mode: str = "regular"
    buffer_bytes: int = DEFAULT_BUFFER_BYTES
    target_file_bytes: int = DEFAULT_TARGET_FILE_BYTES
    max_partition_bytes: int = DEFAULT_MAX_PARTITION_BYTES
    compression: str = "lz4"

    def covers(self, topic: str, partition: int) -> bool:
        return self.partitions is None or (topic, partition) in self._partition_set

    @cached_property
    def _partition_set(self) -> frozenset[TopicPartition]:
        return frozenset(self.partitions or ())

    def output_key(self, content: str, sequence: int) -> str:
        return f"data/l{self.target_level}/{self.plan_id}-g{self.group:03d}-s{self.slice:03d}-{content}-{sequence:04d}.seg"

    # -- encoding --------------------------------------------------------------------------------

    def to_dict(self) -> dict[str, Any]:
        return {
            "format": PLAN_FORMAT,
            "plan_id": self.plan_id,
            "cluster_id": self.cluster_id,
            "manifest_version": self.manifest_version,
            "now_ms": self.now_ms,
            "mode": self.mode,
            "target_level": self.target_level,
            "deduplicate": self.deduplicate,
            "buffer_bytes": self.buffer_bytes,
            "target_file_bytes": self.target_file_bytes,
            "max_partition_bytes": self.max_partition_bytes,
            "compression": self.compression,
            "group": self.group,
            "slice": self.slice,
            "partitions": None if self.partitions is None else [list(tp) for tp in self.partitions],
            "topics": [t.to_dict() for t in self.topics.values()],
            "outside_floors": [[t, p, floor] for (t, p), floor in sorted(self.outside_floors.items())],
            "inputs": [f.to_dict() for f in self.inputs],
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, document: Any, source: str = "plan") -> Plan:
        """A validated plan; anything malformed is an InvalidPlanError naming the field."""
        if not isinstance(document, dict):
            raise InvalidPlanError(f"{source}: a plan is a JSON object")
        if document.get("format") != PLAN_FORMAT:
            raise InvalidPlanError(f"{source}: plan format {document.get('format')!r} is not supported (expected {PLAN_FORMAT})")
        try:
            plan = cls(
                plan_id=_text(document, "plan_id"),
                cluster_id=_text(document, "cluster_id"),
                manifest_version=_integer(document, "manifest_version", 1),
                now_ms=_integer(document, "now_ms", 0),
                mode=document.get("mode", "regular"),
                target_level=_integer(document, "target_level", 1, MAX_LEVEL),
                deduplicate=_boolean(document, "deduplicate"),
                buffer_bytes=_integer(document, "buffer_bytes", 40),
                target_file_bytes=_integer(document, "target_file_bytes", 1),
                max_partition_bytes=_integer(document, "max_partition_bytes", 1),
                compression=document.get("compression", "lz4"),
                group=_integer(document, "group", 0),
                slice=_integer(document, "slice", 0) if "slice" in document else 0,
                partitions=None
                if document.get("partitions") is None
                else tuple((str(t), int(p)) for t, p in document["partitions"]),
                topics={t["name"]: Topic.from_dict(t) for t in document["topics"]},
                outside_floors={(str(t), int(p)): int(floor) for t, p, floor in document.get("outside_floors", [])},
                inputs=tuple(DataFile.from_dict(f) for f in document["inputs"]),
            )
        except InvalidPlanError:
            raise
        except (KeyError, TypeError, ValueError) as exc:
            raise InvalidPlanError(f"{source}: malformed plan ({type(exc).__name__}: {exc}); regenerate it with `logcompact plan`") from None
        plan.validate(source)
        return plan

    @classmethod
    def from_json(cls, text: str, source: str = "plan") -> Plan:
        try:
            document = json.loads(text)
        except json.JSONDecodeError as exc:
            raise InvalidPlanError(f"{source}: not JSON ({exc.msg} at line {exc.lineno})") from None
        return cls.from_dict(document, source)

    # -- validation ------------------------------------------------------------------------------

    def validate(self, source: str = "plan") -> None:
        """Rules that need no catalog: shapes, ranges, and that the inputs make sense together."""
        if self.mode not in MODES:
            raise InvalidPlanError(f"{source}: mode {self.mode!r} is not one of {', '.join(MODES)}")
        if self.compression not in ("none", "lz4", "zstd"):
            raise InvalidPlanError(f"{source}: compression {self.compression!r} is not none, lz4 or zstd")
        if not self.inputs:
            raise InvalidPlanError(f"{source}: plan {self.plan_id} names no input files")
        keys = [f.key for f in self.inputs]
        if len(set(keys)) != len(keys):
            raise InvalidPlanError(f"{source}: plan {self.plan_id} names an input file twice")
        for data_file in self.inputs:
            if not data_file.key.startswith("data/"):
                raise InvalidPlanError(f"{source}: input {data_file.key!r} is not a data file of a logcompact cluster")
            if data_file.level > self.target_level:
                raise InvalidPlanError(
                    f"{source}: input {data_file.key} is at level {data_file.level}, above the target level {self.target_level}"
                )
            for section in data_file.sections:
                if section.topic not in self.topics:
                    raise InvalidPlanError(f"{source}: input {data_file.key} holds topic {section.topic!r}, which the plan does not describe")

    def check_against(self, snapshot: Snapshot) -> None:
        """The plan belongs to this cluster and its inputs are still live as planned (only they are read)."""
        if snapshot.cluster_id != self.cluster_id:
            raise InvalidPlanError(
                f"plan {self.plan_id} is for cluster {self.cluster_id}, but the store holds cluster {snapshot.cluster_id}; "
                "run it against its own store"
            )
        live = snapshot.get_files([f.key for f in self.inputs])
        for data_file in self.inputs:
            found = live.get(data_file.key)
            if found is None:
                raise CommitConflictError(
                    f"plan {self.plan_id} expected input {data_file.key} live as in manifest version {self.manifest_version}, "
                    f"found it gone in version {snapshot.version}; re-plan"
                )
            if found != data_file:
                raise InvalidPlanError(f"plan {self.plan_id}: input {data_file.key} differs from the catalog's record of it")


def new_plan_id(now_ms: int) -> str:
    return f"p{now_ms}-{uuid.uuid4().hex[:12]}"


def _text(document: dict, name: str) -> str:
    value = document[name]
    if not isinstance(value, str) or not value:
        raise InvalidPlanError(f"plan field {name!r} must be a non-empty string")
    return value


def _integer(document: dict, name: str, low: int, high: int | None = None) -> int:
    value = document[name]
    if not isinstance(value, int) or isinstance(value, bool) or value < low or (high is not None and value > high):
        allowed = f"{low} to {high}" if high is not None else f"at least {low}"
        raise InvalidPlanError(f"plan field {name!r} is {value!r}: must be an integer, {allowed}")
    return value


def _boolean(document: dict, name: str) -> bool:
    value = document[name]
    if not isinstance(value, bool):
        raise InvalidPlanError(f"plan field {name!r} must be true or false")
    return value
