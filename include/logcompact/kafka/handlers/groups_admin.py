"""Consumer groups' hygiene, as Kafka's admin tools ask for it: DeleteGroups (42) v0-2 and OffsetDelete (47) v0,
answered by the group's coordinator (`GroupCoordinator.delete`, `GroupCoordinator.delete_offsets`), NOT_COORDINATOR
elsewhere (admin clients find the coordinator of each group first).

Kafka's checks, in KafkaApis' order: DeleteGroups needs DELETE on each group (GROUP_AUTHORIZATION_FAILED), then an
Empty group is deleted with its committed offsets; one with members is NON_EMPTY_GROUP, one that does not exist
GROUP_ID_NOT_FOUND. OffsetDelete needs DELETE on the group (else the whole request GROUP_AUTHORIZATION_FAILED) and
READ on each topic (its partitions TOPIC_AUTHORIZATION_FAILED); a topic or partition the catalog does not have is
UNKNOWN_TOPIC_OR_PARTITION; a group error (INVALID_GROUP_ID, NOT_COORDINATOR, GROUP_ID_NOT_FOUND, NON_EMPTY_GROUP
for a group with members of another protocol than Kafka's consumers) answers the request alone; the partitions of a
topic the group's members subscribe to are GROUP_SUBSCRIBED_TO_TOPIC and keep their offsets.
"""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog.acls import AclOperation
from logcompact.exceptions import CatalogUnavailableError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker

DELETE_GROUPS, OFFSET_DELETE = 42, 47


async def delete_groups(broker: Broker, request: codec.Request) -> Any:
    results = []
    for group_id in request.body.groups_names:
        results.append({"group_id": group_id, "error_code": await _delete_group(broker, request, group_id)})
    return codec.build(codec.response_class(DELETE_GROUPS, request.api_version), {"throttle_time": 0, "results": results})


async def _delete_group(broker: Broker, request: codec.Request, group_id: str) -> codec.ErrorCode:
    if not broker.authorizer.authorize_group(request.session, AclOperation.DELETE, group_id):
        return codec.ErrorCode.group_authorization_failed
    if not broker.coordinates(group_id):
        return codec.ErrorCode.not_coordinator
    try:
        return await broker.groups.delete(group_id)
    except CatalogUnavailableError:  # retriable: the admin client asks again
        return codec.ErrorCode.coordinator_not_available


async def offset_delete(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    response_class = codec.response_class(OFFSET_DELETE, request.api_version)

    def answer(error: codec.ErrorCode, topics: list[dict[str, Any]]) -> Any:
        return codec.build(response_class, {"throttle_time": 0, "error_code": error, "topics": topics})

    group_id = body.group_id
    if not broker.authorizer.authorize_group(request.session, AclOperation.DELETE, group_id):
        return answer(codec.ErrorCode.group_authorization_failed, [])
    denied = broker.authorizer.denied_topics(request.session, AclOperation.READ, (topic.name for topic in body.topics))
    try:
        known = (await asyncio.to_thread(broker.catalog.snapshot)).topics  # read off the event loop, as Metadata reads it
    except CatalogUnavailableError:  # retriable: the admin client asks again
        return answer(codec.ErrorCode.coordinator_not_available, [])
    answered: dict[tuple[str, int], codec.ErrorCode] = {}
    asked: list[tuple[str, int]] = []
    for topic in body.topics:
        found = known.get(topic.name)
        for entry in topic.partitions:
            index = int(entry.partition_index)
            if topic.name in denied:
                answered[(topic.name, index)] = codec.ErrorCode.topic_authorization_failed
            elif found is None or not 0 <= index < found.partitions:
                answered[(topic.name, index)] = codec.ErrorCode.unknown_topic_or_partition
            else:
                asked.append((topic.name, index))
    if not group_id:
        return answer(codec.ErrorCode.invalid_group_id, [])
    if not broker.coordinates(group_id):
        return answer(codec.ErrorCode.not_coordinator, [])
    try:
        error, subscribed = await broker.groups.delete_offsets(group_id, asked)
    except CatalogUnavailableError:
        return answer(codec.ErrorCode.coordinator_not_available, [])
    if error != codec.ErrorCode.none:
        return answer(error, [])
    for name, index in asked:
        answered[(name, index)] = codec.ErrorCode.group_subscribed_to_topic if name in subscribed else codec.ErrorCode.none
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic in body.topics:  # in the request's order
        for entry in topic.partitions:
            index = int(entry.partition_index)
            partitions = topics.setdefault(topic.name, [])
            if all(p["partition_index"] != index for p in partitions):
                partitions.append({"partition_index": index, "error_code": answered[(topic.name, index)]})
    return answer(codec.ErrorCode.none, [{"name": name, "partitions": partitions} for name, partitions in topics.items()])
