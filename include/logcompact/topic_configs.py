"""Kafka's topic configs, as data below the topics and the agent: every topic config of Kafka 4.x with its default,
type, broker synonym and what it does here, and the rule for those the product does not apply: taken at Kafka's
default only (they mean nothing for a log kept in object storage, or name a feature the product does not have).

Which ones the product applies is `logcompact.topics.kafka_config_names` (a field of TopicConfig); `topics` takes the
others at their default for `logcompact topic create/alter` and the agent's CreateTopics and AlterConfigs alike, and
`kafka.kafka_configs` describes them all as DescribeConfigs does. `docs/agent.md` lists both kinds.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# Kafka's DescribeConfigs ConfigType codes (v3+).
BOOLEAN, STRING, INT, SHORT, LONG, DOUBLE, LIST, CLASS, PASSWORD = 1, 2, 3, 4, 5, 6, 7, 8, 9
LONG_MAX = "9223372036854775807"


@dataclass(frozen=True)
class KafkaTopicConfig:
    name: str
    default: str  # Kafka's, as DescribeConfigs writes it
    kind: int  # ConfigType
    broker_synonym: str | None  # the broker config giving the default, as Kafka lists it among the synonyms
    documentation: str  # what it does here


IGNORED = "Accepted at Kafka's default only, and has no effect here: "
TOPIC_CONFIGS: tuple[KafkaTopicConfig, ...] = tuple(KafkaTopicConfig(*row) for row in (
    ("cleanup.policy", "delete", LIST, "log.cleanup.policy", "delete, compact or compact,delete: applied by the planner and the engine (docs/agent.md)."),
    ("compression.gzip.level", "-1", INT, "compression.gzip.level", IGNORED + "Produce keeps the batches as the producer compressed them."),
    ("compression.lz4.level", "9", INT, "compression.lz4.level", IGNORED + "Produce keeps the batches as the producer compressed them."),
    ("compression.type", "producer", STRING, "compression.type", "The codec Fetch sends batches with: producer (the one they were produced with, where known; "
     "else the agent's --fetch-compression), uncompressed, gzip, snappy, lz4 or zstd."),
    ("compression.zstd.level", "3", INT, "compression.zstd.level", IGNORED + "Produce keeps the batches as the producer compressed them."),
    ("delete.retention.ms", "86400000", LONG, "log.cleaner.delete.retention.ms", "How long a tombstone outlives the compaction that first keeps it: applied by the engine."),
    ("errors.deadletterqueue.group.enable", "false", BOOLEAN, None, IGNORED + "share groups are not served."),
    ("file.delete.delay.ms", "60000", LONG, "log.segment.delete.delay.ms", IGNORED + "gc removes the files no kept version holds."),
    ("flush.messages", LONG_MAX, LONG, "log.flush.interval.messages", IGNORED + "the agent's --flush-ms and --flush-bytes decide when a file is written."),
    ("flush.ms", LONG_MAX, LONG, None, IGNORED + "the agent's --flush-ms and --flush-bytes decide when a file is written."),
    ("follower.replication.throttled.replicas", "", LIST, None, IGNORED + "the object store keeps the replicas."),
    ("index.interval.bytes", "4096", INT, "log.index.interval.bytes", IGNORED + "each file has its own section index."),
    ("leader.replication.throttled.replicas", "", LIST, None, IGNORED + "the object store keeps the replicas."),
    ("local.retention.bytes", "-2", LONG, "log.local.retention.bytes", IGNORED + "there is no local tier."),
    ("local.retention.ms", "-2", LONG, "log.local.retention.ms", IGNORED + "there is no local tier."),
    ("max.compaction.lag.ms", LONG_MAX, LONG, "log.cleaner.max.compaction.lag.ms", "The longest a record stays uncompacted: applied by the planner (raised to 2 hours)."),
    ("max.decompressed.message.bytes", "2147483639", INT, "max.decompressed.message.bytes", IGNORED + "max.message.bytes bounds a batch."),
    ("max.message.bytes", "1048588", INT, "message.max.bytes", "The largest record batch Produce takes for the topic; unset, the agent's --max-message-bytes."),
    ("message.timestamp.after.max.ms", "3600000", LONG, "log.message.timestamp.after.max.ms", IGNORED + "Produce takes any CreateTime."),
    ("message.timestamp.before.max.ms", LONG_MAX, LONG, "log.message.timestamp.before.max.ms", IGNORED + "Produce takes any CreateTime."),
    ("message.timestamp.type", "CreateTime", STRING, "log.message.timestamp.type", "CreateTime, or LogAppendTime: Produce stamps each record with the time the agent takes it."),
    ("min.cleanable.dirty.ratio", "0.5", DOUBLE, "log.cleaner.min.cleanable.ratio", "The dirty share from which a regular planning pass compacts a partition: applied by the planner."),
    ("min.compaction.lag.ms", "0", LONG, "log.cleaner.min.compaction.lag.ms", "How long a record stays uncompacted at least: applied by the planner and the engine."),
    ("min.insync.replicas", "1", INT, "min.insync.replicas", IGNORED + "a Produce is acknowledged once its file is in the object store and the catalog."),
    ("preallocate", "false", BOOLEAN, "log.preallocate", IGNORED + "files are written whole."),
    ("remote.copy.lag.bytes", "-1", LONG, "log.remote.copy.lag.bytes", IGNORED + "every file is in the object store from its write on."),
    ("remote.copy.lag.ms", "0", LONG, "log.remote.copy.lag.ms", IGNORED + "every file is in the object store from its write on."),
    ("remote.log.copy.disable", "false", BOOLEAN, None, IGNORED + "every file is in the object store from its write on."),
    ("remote.log.delete.on.disable", "false", BOOLEAN, None, IGNORED + "every file is in the object store from its write on."),
    ("remote.storage.enable", "false", BOOLEAN, None, IGNORED + "every file is in the object store from its write on."),
    ("retention.bytes", "-1", LONG, "log.retention.bytes", IGNORED + "topics here have no size limit."),
    ("retention.ms", "604800000", LONG, None, "How long a delete topic keeps a record (-1: for ever): applied by the engine."),
    ("segment.bytes", "1073741824", INT, "log.segment.bytes", IGNORED + "the agent's flushes and the compactions' target sizes make the files."),
    ("segment.index.bytes", "10485760", INT, "log.index.size.max.bytes", IGNORED + "each file has its own section index."),
    ("segment.jitter.ms", "0", LONG, None, IGNORED + "the agent's flushes and the compactions' target sizes make the files."),
    ("segment.ms", "604800000", LONG, None, IGNORED + "the agent's flushes and the compactions' target sizes make the files."),
    ("unclean.leader.election.enable", "false", BOOLEAN, "unclean.leader.election.enable", IGNORED + "every agent serves every partition."),
))
TOPIC_CONFIGS_BY_NAME: Mapping[str, KafkaTopicConfig] = {config.name: config for config in TOPIC_CONFIGS}


def is_kafka_default(config: KafkaTopicConfig, value: str) -> bool:
    """Whether `value` (as a client gives it) is Kafka's default of `config`: a number compared as a number."""
    given, default = value.strip(), config.default
    if config.kind in (INT, SHORT, LONG):
        try:
            return int(given) == int(default)
        except ValueError:
            return False
    if config.kind == BOOLEAN:
        return given.lower() == default
    return given == default


def refusal(config: KafkaTopicConfig, value: str) -> str | None:
    """Why a value of a config the product does not apply is refused (None: it is Kafka's default, taken)."""
    if is_kafka_default(config, value):
        return None
    why = config.documentation.removeprefix(IGNORED).rstrip(".")
    return f"{config.name}={value!r} is not taken: {why}; give {config.default or repr('')} or leave it out"
