"""Kafka's configs as DescribeConfigs lists them: every topic config of Kafka 4.x with its default, type, broker
synonym and what it does here, and the broker configs that say what this agent's settings are.

A topic config the product applies (`logcompact.topics.kafka_config_names`: a field of TopicConfig) is described
with the topic's value; every other one is accepted at Kafka's default only and described at it (it means nothing
for a log kept in object storage, or names a feature the product does not have): `docs/agent.md` lists both kinds.

Config sources, as Kafka gives them: DYNAMIC_TOPIC_CONFIG for a value set on the topic (here: a value other than
Kafka's default, as the catalog keeps values, not whether one was given), STATIC_BROKER_CONFIG for what an agent's
option sets to other than Kafka's default, DEFAULT_CONFIG for Kafka's default. Synonyms as Kafka's: the topic's
value, then the broker config that would give its default.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from logcompact.kafka.cluster import Address
    from logcompact.kafka.server import AgentSettings

# Kafka's DescribeConfigs ConfigSource and ConfigType (v3+) codes.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5
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


def entry(name: str, value: Any, source: int, kind: int, *, read_only: bool = False, sensitive: bool = False,
          synonyms: tuple[tuple[str, Any, int], ...] = (), documentation: str | None = None) -> dict[str, Any]:
    """One config of a DescribeConfigs answer, every version's fields (each version's encoder takes its own)."""
    shown = None if sensitive else _text(value)
    return {
        "name": name, "value": shown, "read_only": read_only, "is_default": source == DEFAULT_CONFIG, "config_source": source,
        "is_sensitive": sensitive, "config_type": kind, "documentation": documentation,
        "synonyms": [{"name": n, "value": None if sensitive else _text(v), "source": s} for n, v, s in synonyms],
    }


@dataclass(frozen=True)
class BrokerConfig:
    """One broker config: the agent's value (None: it sets none) and Kafka's default (None: Kafka has none)."""

    name: str
    value: Any
    default: Any
    kind: int
    sensitive: bool = False

    def described(self, with_synonyms: bool, with_documentation: bool) -> dict[str, Any]:
        """As Kafka: STATIC_BROKER_CONFIG where the agent's value is not Kafka's default; read-only, as the agent's
        configs are its command line's; synonyms the static value and Kafka's default."""
        static = self.value is not None and _text(self.value) != _text(self.default)
        value, source = (self.value, STATIC_BROKER_CONFIG) if static else (self.default, DEFAULT_CONFIG)
        synonyms: list[tuple[str, Any, int]] = []
        if with_synonyms:
            if static:
                synonyms.append((self.name, self.value, STATIC_BROKER_CONFIG))
            if self.default is not None:
                synonyms.append((self.name, self.default, DEFAULT_CONFIG))
        documentation = ("Set by the agent's command line." if static else "Kafka's default.") if with_documentation else None
        return entry(self.name, _text(value), source, self.kind, read_only=True, sensitive=self.sensitive,
                     synonyms=tuple(synonyms), documentation=documentation)


def _text(value: Any) -> str | None:
    if value is None:
        return None
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


AUTHORIZER_CLASS = "logcompact.kafka.authorizer.AclAuthorizer"
KAFKA_PROTOCOL_MAP = "SASL_SSL:SASL_SSL,PLAINTEXT:PLAINTEXT,SSL:SSL,SASL_PLAINTEXT:SASL_PLAINTEXT"


def agent_broker_configs(settings: AgentSettings, bound: Mapping[str, Address], advertised: Mapping[str, Address],
                         node_id: int) -> tuple[BrokerConfig, ...]:
    """This agent's settings under Kafka's broker config names (its options, `--listen` and the others, by the Kafka
    config each stands for), then Kafka's defaults of the topic configs' broker synonyms."""
    listeners = settings.listeners
    authorization = settings.authorization
    mine = [
        BrokerConfig("broker.id", node_id, -1, INT),
        BrokerConfig("node.id", node_id, None, INT),
        BrokerConfig("broker.rack", settings.rack, None, STRING),
        BrokerConfig("listeners", ",".join(f"{name}://{address}" for name, address in bound.items()), "PLAINTEXT://:9092", LIST),
        BrokerConfig("advertised.listeners", ",".join(f"{name}://{address}" for name, address in advertised.items()), None, LIST),
        BrokerConfig("listener.security.protocol.map", ",".join(f"{lst.name}:{lst.protocol.value}" for lst in listeners), KAFKA_PROTOCOL_MAP, STRING),
        BrokerConfig("auto.create.topics.enable", settings.auto_create_topics, True, BOOLEAN),
        BrokerConfig("num.partitions", settings.num_partitions, 1, INT),
        BrokerConfig("default.replication.factor", None, 1, INT),
        BrokerConfig("message.max.bytes", settings.max_message_bytes, 1048588, INT),
        BrokerConfig("socket.request.max.bytes", settings.max_frame_bytes, 104857600, INT),
        BrokerConfig("max.connections", settings.max_connections, 2147483647, INT),
        BrokerConfig("max.connections.per.ip", settings.max_connections_per_ip, 2147483647, INT),
        BrokerConfig("connections.max.idle.ms", settings.connections_max_idle_ms, 600000, LONG),
        BrokerConfig("group.initial.rebalance.delay.ms", settings.group_initial_rebalance_delay_ms, 3000, INT),
        BrokerConfig("group.max.size", settings.group_max_size, 2147483647, INT),
        BrokerConfig("offsets.commit.timeout.ms", settings.offsets_commit_timeout_ms, 5000, INT),
        BrokerConfig("transaction.max.timeout.ms", settings.transaction_max_timeout_ms, 900000, INT),
        BrokerConfig("transactional.id.expiration.ms", settings.transactional_id_expiration_ms, 604800000, INT),
        BrokerConfig("transaction.abort.timed.out.transaction.cleanup.interval.ms",
                     settings.transaction_abort_timed_out_transaction_cleanup_interval_ms, 10000, INT),
        BrokerConfig("transaction.remove.expired.transaction.cleanup.interval.ms",
                     settings.transaction_remove_expired_transaction_cleanup_interval_ms, 3600000, INT),
        BrokerConfig("sasl.enabled.mechanisms", ",".join(settings.sasl_mechanisms), "GSSAPI", LIST),
        BrokerConfig("connection.failed.authentication.delay.ms", settings.failed_authentication_delay_ms, 100, INT),
        BrokerConfig("authorizer.class.name", AUTHORIZER_CLASS if authorization.enabled else None, "", STRING),
        BrokerConfig("super.users", ";".join(authorization.super_users) or None, None, STRING),
        BrokerConfig("allow.everyone.if.no.acl.found", authorization.allow_everyone_if_no_acl_found, False, BOOLEAN),
        BrokerConfig("log.retention.ms", None, None, LONG),
        BrokerConfig("log.retention.hours", None, 168, INT),
    ]
    named = {config.name for config in mine}
    defaults = [BrokerConfig(c.broker_synonym, None, c.default, c.kind) for c in TOPIC_CONFIGS if c.broker_synonym and c.broker_synonym not in named]
    return tuple(mine + defaults)
