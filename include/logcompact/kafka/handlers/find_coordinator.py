"""FindCoordinator (key 10), v0-4: the agent that coordinates a consumer group or, key type 1, a transactional id
(v4 answers several keys at once).

Every agent answers for every group from the same list of live agents (read from the catalog for each request;
group requests check against the list as of the agent's last heartbeat, so for up to a heartbeat after an agent
joins or leaves two agents may both take a group's requests, and its members then rejoin at the one that stays),
so clients reach the group's coordinator from any bootstrap agent. A transactional id's coordinator is chosen the
same way, from the same list (`TransactionCoordinator.coordinates`). Another key type is INVALID_REQUEST, as Kafka.
The coordinator is given at its endpoint on the listener the request arrived on; one without that listener is
COORDINATOR_NOT_AVAILABLE, as Kafka answers. A key needs DESCRIBE on its group (GROUP_AUTHORIZATION_FAILED) or
transactional id (TRANSACTIONAL_ID_AUTHORIZATION_FAILED).
"""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog.acls import AclOperation, ResourceType
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker, describe
from logcompact.kafka.session import Session

API_KEY = 10
GROUP_KEY, TRANSACTION_KEY = 0, 1


async def handle(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    # The live agents read now, as Metadata does: a client is sent to the coordinator the cluster has this moment.
    await asyncio.to_thread(broker.agents.refresh)
    response_class = codec.response_class(API_KEY, version)
    listener = request.session.listener
    if version >= 4:
        coordinators = [_find(broker, request.session, key, int(body.key_type), listener) for key in body.coordinator_keys]
        return codec.build(response_class, {"throttle_time": 0, "coordinators": coordinators})
    return codec.build(response_class, {"throttle_time": 0, **_find(broker, request.session, body.key, int(getattr(body, "key_type", GROUP_KEY)), listener)})


# What a key needs (DESCRIBE on its group or transactional id), and the error without it, as Kafka.
_AUTHORIZATION = {
    GROUP_KEY: (ResourceType.GROUP, codec.ErrorCode.group_authorization_failed),
    TRANSACTION_KEY: (ResourceType.TRANSACTIONAL_ID, codec.ErrorCode.transactional_id_authorization_failed),
}


def _find(broker: Broker, session: Session, key: str, key_type: int, listener: str) -> dict[str, Any]:
    if key_type in _AUTHORIZATION and not broker.authorizer.authorize(session, AclOperation.DESCRIBE, _AUTHORIZATION[key_type][0], key):
        error = _AUTHORIZATION[key_type][1]
        return {"key": key, "error_code": error, "error_message": error.name, "node_id": -1, "host": "", "port": -1}
    if key_type not in (GROUP_KEY, TRANSACTION_KEY):
        message = f"unknown key type {key_type}: 0 (group) or 1 (transaction)"
        return {"key": key, "error_code": codec.ErrorCode.invalid_request, "error_message": message, "node_id": -1, "host": "", "port": -1}
    coordinator = broker.agents.coordinator_for(key)
    if coordinator.endpoint(listener) is None:  # as Kafka answers a coordinator not reachable on the request's listener
        message = f"the coordinator, agent {coordinator.node_id}, has no {listener} listener"
        return {"key": key, "error_code": codec.ErrorCode.coordinator_not_available, "error_message": message, "node_id": -1, "host": "", "port": -1}
    return {"key": key, "error_code": codec.ErrorCode.none, "error_message": None, **describe(coordinator, listener)}
