"""Kafka's configs as DescribeConfigs lists them: every topic config of Kafka 4.x (`logcompact.topic_configs`: its
default, type, broker synonym and what it does here), and the broker configs that say what this agent's settings are.

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

from logcompact.topic_configs import BOOLEAN, INT, LIST, LONG, STRING, TOPIC_CONFIGS

if TYPE_CHECKING:
    from logcompact.kafka.cluster import Address
    from logcompact.kafka.server import AgentSettings

# Kafka's DescribeConfigs ConfigSource codes.
DYNAMIC_TOPIC_CONFIG = 1
STATIC_BROKER_CONFIG = 4
DEFAULT_CONFIG = 5


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
