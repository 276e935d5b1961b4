"""The Broker: what every handler is given, this agent as the clients see it (the catalog, its identity in the
cluster it serves, the advertised address, the table of served APIs) and the managers that hold the agent's state
(the ingest thread with the producers' state, the group and transaction coordinators, the commit watch, Fetch's file
cache and decoded blocks, the ACL authorizer); and a
handler's type (`Handler`, and `Api`, the entry of the table in handlers/__init__.py), so the table and its
handlers both point here."""

from __future__ import annotations

import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from logcompact.catalog import Catalog
from logcompact.catalog.model import AgentRecord
from logcompact.kafka import codec
from logcompact.kafka.authorizer import AclAuthorizer
from logcompact.kafka.block_cache import DecodedBlocks
from logcompact.kafka.cluster import Address, AgentDirectory
from logcompact.kafka.event_loop import CommitWatch
from logcompact.kafka.group_coordinator import GroupCoordinator
from logcompact.kafka.ingest_thread import Ingest
from logcompact.kafka.kafka_configs import BrokerConfig
from logcompact.kafka.quota_manager import ClientQuotaManager
from logcompact.kafka.transaction_coordinator import TransactionCoordinator
from logcompact.store.cache import CachedStore
from logcompact.topics import Topic
from logcompact.units import wall_clock_ms


@dataclass(frozen=True)
class Broker:
    """This agent as the clients see it: one of the cluster's brokers (`agents`), each serving every partition."""

    catalog: Catalog
    cluster_id: str
    agents: AgentDirectory = field(repr=False)
    advertised: Address
    apis: Mapping[int, Api] = field(repr=False)
    ingest: Ingest = field(repr=False)
    max_message_bytes: int  # of a topic that sets no max.message.bytes
    commits: CommitWatch = field(repr=False)
    groups: GroupCoordinator = field(repr=False)
    file_cache: CachedStore = field(repr=False)  # the catalog's store behind Fetch's bounded cache of file ranges
    transactions: TransactionCoordinator = field(repr=False)
    quotas: ClientQuotaManager = field(repr=False)  # the client quotas this agent enforces (quota_manager.py)
    # Kafka's auto.create.topics.enable and num.partitions: Metadata asking for an unknown topic (when the client
    # allows it) creates it with this many partitions and the default configs.
    auto_create_topics: bool = True
    num_partitions: int = 1
    # Kafka's ACLs: every handler asks it (`authorize`, `authorize_cluster`) before doing what Kafka checks.
    authorizer: AclAuthorizer = field(default_factory=AclAuthorizer.disabled, repr=False)
    # This agent's settings under Kafka's broker config names, as DescribeConfigs of its BROKER resource lists them.
    broker_configs: tuple[BrokerConfig, ...] = field(default=(), repr=False)
    # The Kafka codec id Fetch compresses with where a topic's compression.type is `producer` and the records' is not known
    fetch_compression: int = 0
    # Fetch's bounded cache of decoded blocks, so consumers of one file decode each block once (block_cache.py)
    decoded_blocks: DecodedBlocks = field(default_factory=DecodedBlocks, repr=False)

    def __post_init__(self) -> None:
        # A group that moved away leaves memory as soon as the live agents change, not at its next request here:
        # should it move back before one came, this agent loads it again from its row instead of going on with
        # what it held before.
        self.agents.watch(self._drop_moved_groups)

    @property
    def node_id(self) -> int:
        return self.agents.me.node_id

    def _drop_moved_groups(self) -> None:
        for group in self.groups.all_groups():
            self.coordinates(group.group_id)

    def coordinates(self, group_id: str) -> bool:
        """Whether this agent coordinates the group; a group it no longer coordinates is dropped from its memory."""
        if self.agents.coordinator_for(group_id).node_id == self.node_id:
            return True
        self.groups.forget(group_id)
        return False

    def topic_id(self, topic: str, catalog_topic_id: int) -> uuid.UUID:
        """Kafka's topic id (Metadata v10 on), a UUID stable per cluster, derived from the name and the catalog's
        number for the topic: a topic deleted and made again under its name gets another id, as in Kafka."""
        return uuid.uuid5(uuid.UUID(self.cluster_id), f"{topic}/{catalog_topic_id}")

    def max_message_bytes_of(self, topic: Topic) -> int:
        """The largest record batch the topic takes: its max.message.bytes, or this agent's."""
        limit = topic.config.max_message_bytes
        return self.max_message_bytes if limit is None else limit

    @staticmethod
    def log_append_time(topic: Topic) -> int | None:
        """Now, in ms, for a topic whose message.timestamp.type is LogAppendTime (the time every record of a batch
        taken now gets); None for CreateTime (records keep the producer's timestamps)."""
        return wall_clock_ms() if topic.config.message_timestamp_type == "LogAppendTime" else None

    def serves(self, api_key: int, version: int) -> bool:
        api = self.apis.get(api_key)
        return api is not None and api.min_version <= version <= api.max_version



def describe(agent: AgentRecord, listener: str) -> dict[str, Any]:
    """An agent as Metadata and FindCoordinator give brokers to clients of `listener` (Kafka answers with the
    endpoints of the listener a request arrived on); the agent has that listener."""
    endpoint = agent.endpoint(listener)
    assert endpoint is not None, f"agent {agent.node_id} has no {listener} listener"
    return {"node_id": agent.node_id, "host": endpoint.host, "port": endpoint.port, "rack": agent.rack}


# A handler of one API: the table in handlers/__init__.py maps API keys to them, with the versions served.
Handler = Callable[[Broker, codec.Request], Awaitable[Any]]


@dataclass(frozen=True)
class Api:
    key: int
    min_version: int
    max_version: int
    handle: Handler

    def __post_init__(self) -> None:
        known = codec.kio_versions(self.key)
        if not known:
            raise ValueError(f"API key {self.key}: the codec has no schema for it; serve only APIs it knows")
        if not known.start <= self.min_version <= self.max_version < known.stop:
            raise ValueError(
                f"{codec.api_name(self.key)} v{self.min_version}-{self.max_version}: the codec decodes "
                f"v{known.start}-{known.stop - 1}; serve only versions within it"
            )
