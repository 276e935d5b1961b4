"""DescribeCluster (key 60), v0-1: the cluster id and the live agents, the lowest node id as controller (the
catalog is the one controller there is; AdminClient's describe_cluster shows it). Brokers are given at their endpoints
on the listener the request arrived on, those without it left out, as Kafka does. As Kafka, any principal may ask;
the cluster's authorized operations, when asked, are those the ACLs allow it, 0 without DESCRIBE on the cluster."""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog.acls import CLUSTER_NAME, AclOperation, ResourceType
from logcompact.kafka import codec
from logcompact.kafka.authorizer import OPERATIONS_NOT_ASKED
from logcompact.kafka.broker import Broker

API_KEY = 60
BROKERS_ENDPOINT = 1  # v1's endpoint_type: brokers; 2 asks for KRaft controllers, which agents have none of


async def handle(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    live = await asyncio.to_thread(broker.agents.refresh)
    endpoint = getattr(body, "endpoint_type", BROKERS_ENDPOINT)
    authorizer, session = broker.authorizer, request.session
    operations = OPERATIONS_NOT_ASKED
    if body.include_cluster_authorized_operations:
        allowed = authorizer.authorize_cluster(session, AclOperation.DESCRIBE)
        operations = authorizer.authorized_operations(session, ResourceType.CLUSTER, CLUSTER_NAME) if allowed else 0
    answer: dict[str, Any] = {
        "throttle_time": 0, "cluster_id": broker.cluster_id, "controller_id": live[0].node_id, "brokers": [], "endpoint_type": endpoint,
        "cluster_authorized_operations": operations,
    }
    if endpoint != BROKERS_ENDPOINT:
        answer.update(error_code=codec.ErrorCode.unsupported_endpoint_type,
                      error_message=f"endpoint type {endpoint} is not served: agents are brokers (1), none is a controller")
    else:
        listener = request.session.listener
        answer.update(error_code=codec.ErrorCode.none, brokers=[
            {"broker_id": a.node_id, "host": endpoint.host, "port": endpoint.port, "rack": a.rack}
            for a in live if (endpoint := a.endpoint(listener)) is not None
        ])
    return codec.build(codec.response_class(API_KEY, request.api_version), answer)
