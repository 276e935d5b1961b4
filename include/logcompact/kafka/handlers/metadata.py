"""Metadata (key 3): the topics and partitions in the catalog, and the live agents as brokers; every partition's
leader, for the client asking, is the one agent `AgentDirectory.leader_for` names for it (every agent serves every
partition all the same). Topics are shown to principals with DESCRIBE on them, as Kafka (see `handle`); v8+ answer
the authorized operations asked.

Brokers are given at their endpoints on the listener the request arrived on, as Kafka does; agents without that
listener are left out, and never named a leader there.

The leader epoch is -1 everywhere: clients then skip leader-epoch validation (OffsetForLeaderEpoch), which
an agent that shares every partition's log through the catalog has no use for.
"""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog.acls import CLUSTER_NAME, AclOperation, ResourceType
from logcompact.kafka import codec, records
from logcompact.kafka.authorizer import OPERATIONS_NOT_ASKED
from logcompact.kafka.broker import Broker, describe
from logcompact.kafka.handlers import topics_admin
from logcompact.kafka.handlers.topics_admin import NO_TOPIC_ID
from logcompact.topics import Topic

API_KEY = 3
DESCRIBE = AclOperation.DESCRIBE


async def handle(broker: Broker, request: codec.Request) -> Any:
    snapshot, agents = await asyncio.to_thread(lambda: (broker.catalog.snapshot(), broker.agents.refresh()))
    topics, ids = snapshot.topics, snapshot.topic_ids
    authorizer, session, body, version = broker.authorizer, request.session, request.body, request.api_version
    wanted = body.topics
    listener = session.listener
    leader = broker.agents.leader_for(request.client_id, session.client_host, listener).node_id  # of every partition, for this client
    if wanted is None or (version == 0 and not wanted):  # v0 asks for all with an empty list
        # As Kafka, the listing leaves out the topics the principal may not DESCRIBE.
        described = [_topic(broker, topic, ids[name], leader) for name, topic in sorted(topics.items()) if authorizer.authorize_topic(session, DESCRIBE, name)]
    else:
        entries = _unique(wanted)
        named = [entry.name for entry in entries if entry.name is not None]
        # A topic named without DESCRIBE is TOPIC_AUTHORIZATION_FAILED whether it exists or not, so existence does not
        # leak; one to auto-create needs CREATE on the cluster or on the topic, else it is refused the same way.
        denied = authorizer.denied_topics(session, DESCRIBE, named)
        missing = [name for name in named if name not in topics and name not in denied]
        if missing and topics_admin.auto_create_allowed(broker, request) and not authorizer.authorize_cluster(session, AclOperation.CREATE):
            denied |= authorizer.denied_topics(session, AclOperation.CREATE, missing)
        created = await topics_admin.auto_create(broker, request, [name for name in missing if name not in denied])
        by_id = {broker.topic_id(name, ids[name]): topic for name, topic in topics.items()} if version >= 10 else {}
        described = [_requested(broker, request, topics, ids, by_id, entry, created, denied, leader) for entry in entries]
    if getattr(body, "include_topic_authorized_operations", False):
        for entry in described:
            if entry["name"] is not None and entry["error_code"] != codec.ErrorCode.topic_authorization_failed:
                entry["topic_authorized_operations"] = authorizer.authorized_operations(session, ResourceType.TOPIC, entry["name"])
    cluster_operations = OPERATIONS_NOT_ASKED
    if getattr(body, "include_cluster_authorized_operations", False):  # v8-10
        cluster_operations = authorizer.authorized_operations(session, ResourceType.CLUSTER, CLUSTER_NAME) if authorizer.authorize_cluster(session, DESCRIBE) else 0
    return codec.build(codec.response_class(API_KEY, version), {
        "error_code": codec.ErrorCode.none,
        "throttle_time": 0,
        "brokers": [describe(agent, listener) for agent in agents if agent.endpoint(listener) is not None],
        "cluster_id": broker.cluster_id,
        "controller_id": agents[0].node_id,
        "topics": described,
        "cluster_authorized_operations": cluster_operations,
    })


def _unique(entries: Any) -> list[Any]:
    """The requested topics without repeats (a client may name one twice), in their order."""
    seen: dict[tuple[str | None, Any], Any] = {}
    for entry in entries:
        seen.setdefault((entry.name, getattr(entry, "topic_id", None)), entry)
    return list(seen.values())


def _requested(
    broker: Broker, request: codec.Request, topics: dict[str, Topic], ids: dict[str, int], by_id: dict[Any, Topic], entry: Any,
    created: dict[str, codec.ErrorCode], denied: set[str], leader: int,
) -> dict[str, Any]:
    if entry.name is None:  # v10 on: by topic id alone
        topic = by_id.get(entry.topic_id)
        if topic is None:
            return _missing(None, entry.topic_id, codec.ErrorCode.unknown_topic_id)
        if not broker.authorizer.authorize_topic(request.session, DESCRIBE, topic.name):  # as Kafka: the id is no secret, the name is
            return _missing(None, entry.topic_id, codec.ErrorCode.topic_authorization_failed)
        return _topic(broker, topic, ids[topic.name], leader)
    if entry.name in denied:
        return _missing(entry.name, NO_TOPIC_ID, codec.ErrorCode.topic_authorization_failed)
    topic = topics.get(entry.name)
    if topic is None:  # a topic auto-created just now is LEADER_NOT_AVAILABLE this time, as in Kafka
        return _missing(entry.name, None, created.get(entry.name, codec.ErrorCode.unknown_topic_or_partition))
    return _topic(broker, topic, ids[topic.name], leader)


def _missing(name: str | None, topic_id: Any, error: codec.ErrorCode) -> dict[str, Any]:
    return {"error_code": error, "name": name, "topic_id": topic_id, "is_internal": False, "partitions": []}


def _topic(broker: Broker, topic: Topic, catalog_topic_id: int, leader: int) -> dict[str, Any]:
    partitions = [
        {
            "error_code": codec.ErrorCode.none,
            "partition_index": index,
            "leader_id": leader,
            "leader_epoch": records.NO_LEADER_EPOCH,
            "replica_nodes": [leader],
            "isr_nodes": [leader],
            "offline_replicas": [],
        }
        for index in range(topic.partitions)
    ]
    return {
        "error_code": codec.ErrorCode.none,
        "name": topic.name,
        "topic_id": broker.topic_id(topic.name, catalog_topic_id),
        "is_internal": False,
        "partitions": partitions,
    }
