"""The classic group membership APIs, answered by the group's coordinator (`group_coordinator.GroupCoordinator`):
JoinGroup (11) v0-9, SyncGroup (14) v0-5, Heartbeat (12) v0-4, LeaveGroup (13) v0-5, DescribeGroups (15) v0-5,
and ListGroups (16) v0-4, which each agent answers for the groups it coordinates, from the catalog's rows.

A JoinGroup or SyncGroup that has to wait for the rest of the group is parked (a future on the event loop): its
connection's later requests are still read and handled meanwhile, only their answers queue behind it (Kafka's
per-connection order). Clients send their group requests on a connection of their own to the coordinator and
nothing there depends on a later request, so a parked JoinGroup holds one in-flight slot and never a deadlock.
"""

from __future__ import annotations

import asyncio
import datetime
from typing import Any

from logcompact.catalog.acls import AclOperation, ResourceType
from logcompact.kafka import codec
from logcompact.kafka.authorizer import OPERATIONS_NOT_ASKED
from logcompact.kafka.broker import Broker
from logcompact.kafka.group_coordinator import MAX_SESSION_TIMEOUT_MS, MIN_SESSION_TIMEOUT_MS, STABLE, Joined

JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, DESCRIBE_GROUPS, LIST_GROUPS = 11, 12, 13, 14, 15, 16


def _ms(duration: datetime.timedelta) -> int:
    return int(duration.total_seconds() * 1000)


def _group_error(broker: Broker, request: codec.Request, group_id: str) -> codec.ErrorCode | None:
    """GROUP_AUTHORIZATION_FAILED without READ on the group (Kafka checks it first), INVALID_GROUP_ID for an empty
    id, NOT_COORDINATOR when another agent coordinates the group."""
    if not broker.authorizer.authorize_group(request.session, AclOperation.READ, group_id):
        return codec.ErrorCode.group_authorization_failed
    if not group_id:
        return codec.ErrorCode.invalid_group_id
    if not broker.coordinates(group_id):
        return codec.ErrorCode.not_coordinator
    return None


async def join_group(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    session_ms = _ms(body.session_timeout)
    rebalance_ms = _ms(body.rebalance_timeout) if version >= 1 else session_ms
    error = _group_error(broker, request, body.group_id)
    if error is None and not MIN_SESSION_TIMEOUT_MS <= session_ms <= MAX_SESSION_TIMEOUT_MS:
        error = codec.ErrorCode.invalid_session_timeout
    if error is not None:
        joined = Joined(error, body.member_id)
    else:
        group = await broker.groups.group(body.group_id, create=not body.member_id)
        if group is None:
            joined = Joined(codec.ErrorCode.unknown_member_id, body.member_id)
        else:
            protocols = [(protocol.name, bytes(protocol.metadata)) for protocol in body.protocols]
            joined = await broker.groups.join(
                group, body.member_id, getattr(body, "group_instance_id", None), request.client_id or "", session_ms, rebalance_ms,
                body.protocol_type, protocols, require_known_member_id=version >= 4, skip_assignment_allowed=version >= 9,
                client_host=f"/{request.session.client_host}",
            )
    return codec.build(codec.response_class(JOIN_GROUP, version), {
        "throttle_time": 0,
        "error_code": joined.error,
        "generation_id": joined.generation,
        "protocol_type": joined.protocol_type,
        "protocol_name": joined.protocol if joined.protocol is not None or version >= 7 else "",
        "leader": joined.leader,
        "skip_assignment": joined.skip_assignment,
        "member_id": joined.member_id,
        "members": [{"member_id": member_id, "group_instance_id": instance_id, "metadata": metadata} for member_id, instance_id, metadata in joined.members],
    })


async def sync_group(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    response_class = codec.response_class(SYNC_GROUP, version)
    error = _group_error(broker, request, body.group_id)
    if error is not None:
        return codec.build(response_class, {"throttle_time": 0, "error_code": error, "assignment": b""})
    group = await broker.groups.group(body.group_id, create=False)
    synced = await broker.groups.sync(
        group, int(body.generation_id), body.member_id, getattr(body, "group_instance_id", None),
        getattr(body, "protocol_type", None), getattr(body, "protocol_name", None),
        {entry.member_id: bytes(entry.assignment) for entry in body.assignments},
    )
    return codec.build(response_class, {
        "throttle_time": 0, "error_code": synced.error, "protocol_type": synced.protocol_type, "protocol_name": synced.protocol, "assignment": synced.assignment,
    })


async def heartbeat(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    error = _group_error(broker, request, body.group_id)
    if error is None:
        group = await broker.groups.group(body.group_id, create=False)
        error = broker.groups.heartbeat(group, int(body.generation_id), body.member_id, getattr(body, "group_instance_id", None))
    return codec.build(codec.response_class(HEARTBEAT, request.api_version), {"throttle_time": 0, "error_code": error})


async def leave_group(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    leaving = [(body.member_id, None)] if version < 3 else [(member.member_id, member.group_instance_id) for member in body.members]
    error = _group_error(broker, request, body.group_id)
    answers: list[dict[str, Any]] = []
    if error is None:
        group = await broker.groups.group(body.group_id, create=False)
        for member_id, instance_id in leaving:
            answer = broker.groups.leave(group, member_id, instance_id)
            answers.append({"member_id": member_id, "group_instance_id": instance_id, "error_code": answer})
        if version < 3:  # one member: its answer is the request's
            error = answers[0]["error_code"]
    return codec.build(codec.response_class(LEAVE_GROUP, version), {"throttle_time": 0, "error_code": error or codec.ErrorCode.none, "members": answers})


async def describe_groups(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    authorizer, session = broker.authorizer, request.session
    asked = getattr(body, "include_authorized_operations", False)  # v3+
    described = []
    for group_id in body.groups:
        entry: dict[str, Any] = {"group_id": group_id, "error_code": codec.ErrorCode.none, "group_state": "", "protocol_type": "",
                                 "protocol_data": "", "members": [], "authorized_operations": OPERATIONS_NOT_ASKED}
        if not authorizer.authorize_group(session, AclOperation.DESCRIBE, group_id):
            described.append({**entry, "error_code": codec.ErrorCode.group_authorization_failed})
            continue
        if asked:  # Kafka's bit set of the operations the principal may do on the group (all of them without an authorizer)
            entry["authorized_operations"] = authorizer.authorized_operations(session, ResourceType.GROUP, group_id)
        if not broker.coordinates(group_id):
            entry["error_code"] = codec.ErrorCode.not_coordinator
        elif (group := await broker.groups.group(group_id, create=False)) is None:
            entry["group_state"] = "Dead"  # as Kafka describes a group it does not know
        else:
            stable = group.state == STABLE  # metadata and assignments only once they are settled, as Kafka
            entry.update(group_state=group.state, protocol_type=group.protocol_type or "", protocol_data=(group.protocol or "") if stable else "")
            entry["members"] = [
                {"member_id": m.member_id, "group_instance_id": m.instance_id, "client_id": m.client_id, "client_host": m.client_host,
                 "member_metadata": m.metadata(group.protocol) if stable else b"", "member_assignment": m.assignment if stable else b""}
                for m in group.members.values()
            ]
        described.append(entry)
    return codec.build(codec.response_class(DESCRIBE_GROUPS, version), {"throttle_time": 0, "groups": described})


async def list_groups(broker: Broker, request: codec.Request) -> Any:
    """The groups this agent coordinates, as Kafka's brokers list theirs (admin clients ask every broker and join
    the answers, so each group is listed once): from the catalog's rows, which any coordinator before wrote, and
    from memory for those it holds. A group that leaves memory while the rows are read (an Empty group, once its
    newest row is written) may have been read before that row: the rows are read again."""
    while True:
        held_before = {group.group_id for group in broker.groups.all_groups()}
        rows = await asyncio.to_thread(broker.groups.catalog.groups)
        held = broker.groups.all_groups()
        if held_before <= {group.group_id for group in held}:
            break
    mine = broker.node_id
    listed = {row.group_id: (row.protocol_type, row.state) for row in rows if broker.agents.coordinator_for(row.group_id).node_id == mine}
    for group in held:
        listed[group.group_id] = (group.protocol_type or "", group.state)
    wanted = {state.lower() for state in getattr(request.body, "states_filter", ())}
    # As Kafka: DESCRIBE on the cluster lists every group, else only those the principal may DESCRIBE.
    authorizer, session = broker.authorizer, request.session
    every = authorizer.authorize_cluster(session, AclOperation.DESCRIBE)
    groups = [
        {"group_id": group_id, "protocol_type": protocol_type, "group_state": state}
        for group_id, (protocol_type, state) in sorted(listed.items())
        if (not wanted or state.lower() in wanted) and (every or authorizer.authorize_group(session, AclOperation.DESCRIBE, group_id))
    ]
    return codec.build(codec.response_class(LIST_GROUPS, request.api_version), {"throttle_time": 0, "error_code": codec.ErrorCode.none, "groups": groups})
