"""Topics and their Kafka topic-level configs, validated by Kafka's rules and WarpStream's overrides."""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from logcompact.exceptions import InvalidTopicError
from logcompact.topic_configs import TOPIC_CONFIGS_BY_NAME, refusal
from logcompact.units import HOUR_MS, INT_MAX, LONG_MAX

log = logging.getLogger(__name__)

# WarpStream's floor: a smaller max.compaction.lag.ms is raised to this, with a warning.
MIN_MAX_COMPACTION_LAG_MS = 2 * HOUR_MS
MAX_PARTITIONS = 100_000

_TOPIC_NAME = re.compile(r"[a-zA-Z0-9._-]{1,249}")
_POLICIES = {
    "delete": "delete",
    "compact": "compact",
    "compact,delete": "compact,delete",
    "delete,compact": "compact,delete",
}
TIMESTAMP_TYPES = ("CreateTime", "LogAppendTime")


def validate_topic_name(name: str) -> str:
    if name in (".", "..") or not _TOPIC_NAME.fullmatch(name):
        raise InvalidTopicError(
            f"topic name {name!r} is invalid: use 1 to 249 characters of [a-zA-Z0-9._-], not '.' or '..'"
        )
    return name


@dataclass(frozen=True)
class TopicConfig:
    cleanup_policy: str = "delete"
    retention_ms: int = 604_800_000
    delete_retention_ms: int = 86_400_000
    min_compaction_lag_ms: int = 0
    max_compaction_lag_ms: int = LONG_MAX
    # LogAppendTime: the agent stamps every record with the time it takes the batch, whatever the producer set.
    message_timestamp_type: str = "CreateTime"
    # The largest record batch a producer may send to the topic; None: the agent's --max-message-bytes.
    max_message_bytes: int | None = None
    # Kafka's: a regular planning pass also compacts a partition once its cleanable dirty bytes are more than this
    # share of its clean and cleanable bytes (docs/planner.md); 1.0 leaves it to the levels, max lag and the sweep.
    min_cleanable_dirty_ratio: float = 0.5
    # The codec Fetch sends the records in (docs/agent.md); None: `producer`, Kafka's default, the one they were produced
    # with, left out of the configs stored as max.message.bytes is, so releases before the config still read the topic.
    compression_type: str | None = None

    @property
    def compacted(self) -> bool:
        return "compact" in self.cleanup_policy

    @property
    def time_retention(self) -> bool:
        """True when records expire by age: 'delete' and 'compact,delete' with a finite retention.ms."""
        return "delete" in self.cleanup_policy and self.retention_ms >= 0

    def reverted(self, names: Sequence[str]) -> TopicConfig:
        """The configs with `names` (Kafka names) back to their defaults; an unknown name is InvalidTopicError."""
        fields = [name.replace(".", "_") for name in names]
        for name, field in zip(names, fields, strict=True):
            if field not in _RULES:
                raise InvalidTopicError(f"unknown topic config {name!r}: supported are {', '.join(sorted(_KAFKA_NAMES))}")
        defaults = TopicConfig()
        return replace(self, **{field: getattr(defaults, field) for field in fields})

    def to_kafka(self) -> dict[str, str | int | float]:
        """The configs by Kafka name; one left to the agent (None) is not named."""
        return {name.replace("_", "."): value for name, value in asdict(self).items() if value is not None}

    @classmethod
    def from_kafka(cls, settings: Mapping[str, str | int], base: TopicConfig | None = None) -> TopicConfig:
        """Apply Kafka-named settings ('cleanup.policy': 'compact', 'retention.ms': '3600000', ...) to `base`; a Kafka
        topic config the product does not apply is taken at Kafka's default only (`ignored_config`)."""
        applied = {name: value for name, value in settings.items() if not ignored_config(name, value)}
        config = replace(base or cls(), **_config_fields(applied))
        max_lag_given = config.max_compaction_lag_ms
        if max_lag_given < config.min_compaction_lag_ms:
            raise InvalidTopicError(
                f"max.compaction.lag.ms={max_lag_given} is below min.compaction.lag.ms="
                f"{config.min_compaction_lag_ms}: set max.compaction.lag.ms >= min.compaction.lag.ms"
            )
        if max_lag_given < MIN_MAX_COMPACTION_LAG_MS:
            log.warning(
                "max.compaction.lag.ms=%d is below the 2 hour minimum; using %d", max_lag_given, MIN_MAX_COMPACTION_LAG_MS
            )
            config = replace(config, max_compaction_lag_ms=MIN_MAX_COMPACTION_LAG_MS)
        return config


def kafka_config_names() -> list[str]:
    """The topic configs a topic takes, by Kafka name, in TopicConfig's order."""
    return list(_KAFKA_NAMES)


def ignored_config(name: str, value: str | int | None) -> bool:
    """Whether topic config `name` is one of Kafka's that the product does not apply (`topic_configs`) given at Kafka's
    default, or None (deleted): taken and left out, as a tool copying a Kafka topic names them all. Another value of it
    is InvalidTopicError saying why it is not taken; a config the product applies, or no Kafka config, is False."""
    kafka = TOPIC_CONFIGS_BY_NAME.get(name)
    if kafka is None or name in _KAFKA_NAMES:
        return False
    refused = None if value is None else refusal(kafka, str(value))
    if refused is not None:
        raise InvalidTopicError(refused)
    return True


def _integer(name: str, raw: str | int, low: int, low_text: str, unit: str = "milliseconds", high: int = LONG_MAX) -> int:
    try:
        value = int(raw)
    except (TypeError, ValueError):
        raise InvalidTopicError(f"{name}={raw!r} is not an integer: use a whole number of {unit} {low_text}") from None
    if not low <= value <= high:
        raise InvalidTopicError(f"{name}={value} is out of range: allowed {low_text} up to {high}")
    return value


def _ratio(name: str, raw: str | int | float) -> float:
    """A share from 0 to 1, as Kafka's DOUBLE configs with `between(0, 1)` take it (a number or its text)."""
    try:
        if isinstance(raw, bool):
            raise ValueError("a boolean")
        value = float(raw.strip() if isinstance(raw, str) else raw)
    except (TypeError, ValueError):
        raise InvalidTopicError(f"{name}={raw!r} is not a number: use a decimal from 0 to 1, such as 0.5") from None
    # Kafka's range check lets NaN through (every comparison with it is false); here it is refused.
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise InvalidTopicError(f"{name}={raw!r} is out of range: allowed from 0 up to 1")
    return value


def _policy(name: str, raw: str | int) -> str:
    policy = _POLICIES.get(str(raw).replace(" ", ""))
    if policy is None:
        raise InvalidTopicError(f"{name}={raw!r} is invalid: use delete, compact or compact,delete")
    return policy


PRODUCER_COMPRESSION = "producer"
COMPRESSION_TYPES = (PRODUCER_COMPRESSION, "uncompressed", "gzip", "snappy", "lz4", "zstd")  # Kafka's, in its order


def _compression_type(name: str, raw: str | int) -> str | None:
    if raw not in COMPRESSION_TYPES:
        raise InvalidTopicError(f"{name}={raw!r} is invalid: use one of {', '.join(COMPRESSION_TYPES)}")
    return None if raw == PRODUCER_COMPRESSION else str(raw)


def _timestamp_type(name: str, raw: str | int) -> str:
    if raw not in TIMESTAMP_TYPES:
        raise InvalidTopicError(f"{name}={raw!r} is invalid: use {' or '.join(TIMESTAMP_TYPES)}")
    return str(raw)


_RULES = {
    "cleanup_policy": _policy,
    "retention_ms": lambda name, raw: _integer(name, raw, -1, "from -1 (unlimited)"),
    "delete_retention_ms": lambda name, raw: _integer(name, raw, 0, "from 0"),
    "min_compaction_lag_ms": lambda name, raw: _integer(name, raw, 0, "from 0"),
    "max_compaction_lag_ms": lambda name, raw: _integer(name, raw, 1, "from 1"),
    "message_timestamp_type": _timestamp_type,
    "max_message_bytes": lambda name, raw: _integer(name, raw, 0, "from 0", "bytes", INT_MAX),
    "min_cleanable_dirty_ratio": _ratio,
    "compression_type": _compression_type,
}
_KAFKA_NAMES = [field.replace("_", ".") for field in _RULES]


def _config_fields(configs: Mapping[str, Any]) -> dict[str, Any]:
    """Configs by Kafka name as TopicConfig's fields, each value of its field's type as its rule made it; an unknown
    name or a value its rule refuses is InvalidTopicError naming it."""
    fields = {}
    for name, value in configs.items():
        field = name.replace(".", "_")
        if field not in _RULES:
            raise InvalidTopicError(f"unknown topic config {name!r}: supported are {', '.join(sorted(_KAFKA_NAMES))}")
        fields[field] = _RULES[field](name, value)
    return fields


@dataclass(frozen=True)
class Topic:
    name: str
    partitions: int
    config: TopicConfig
    created_ms: int

    @staticmethod
    def create(name: str, partitions: int, settings: Mapping[str, str | int], created_ms: int) -> Topic:
        validate_topic_name(name)
        if not 1 <= partitions <= MAX_PARTITIONS:
            raise InvalidTopicError(f"topic {name!r}: --partitions {partitions} is out of range: use 1 to {MAX_PARTITIONS}")
        return Topic(name, partitions, TopicConfig.from_kafka(settings), created_ms)

    def altered(self, settings: Mapping[str, str | int]) -> Topic:
        """The topic with `settings` changed. cleanup.policy may change as in Kafka: a topic made compacted has its
        older records compacted too (the engine drops keyless ones as invalid, as Kafka's cleaner does); one made
        `delete` keeps its records until retention.ms."""
        return replace(self, config=TopicConfig.from_kafka(settings, base=self.config))

    def with_config(self, config: TopicConfig) -> Topic:
        return replace(self, config=config)

    def with_partitions(self, count: int) -> Topic:
        """The topic grown to `count` partitions (Kafka's CreatePartitions: never fewer)."""
        if count <= self.partitions:
            raise InvalidTopicError(
                f"topic {self.name!r} has {self.partitions} partitions: a topic's partitions can only grow, ask for more than {self.partitions}"
            )
        if count > MAX_PARTITIONS:
            raise InvalidTopicError(f"topic {self.name!r}: {count} partitions is out of range: use at most {MAX_PARTITIONS}")
        return replace(self, partitions=count)

    def to_dict(self) -> dict:
        return {"name": self.name, "partitions": self.partitions, "config": self.config.to_kafka(), "created_ms": self.created_ms}

    @classmethod
    def from_dict(cls, data: dict) -> Topic:
        """The topic `to_dict` wrote (a catalog row, a plan), its configs checked by the rules that let them in: a
        value no rule takes (a row or a plan damaged) is InvalidTopicError naming it, never a policy run as none."""
        return cls(data["name"], data["partitions"], TopicConfig(**_config_fields(data["config"])), data["created_ms"])
