"""The Kafka agents in the catalog (`agents`): each one's node id, address and last heartbeat, and where each of its
listeners is reached (`agent_endpoints`), from which every agent answers Metadata. Not part of the manifest: each write is a small transaction that creates no version.
Functions of a Connection, called by `Catalog` inside its transactions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from sqlalchemy import Connection, delete, insert, select, update

from logcompact.catalog import schema as s
from logcompact.catalog.model import AgentEndpoint, AgentRecord
from logcompact.exceptions import CommitConflictError, LogcompactError


def register(
    connection: Connection, host: str, port: int, rack: str | None, node_id: int | None, now_ms: int, alive_ms: int,
    endpoints: Sequence[AgentEndpoint],
) -> int:
    """Register an agent serving clients at host:port (its first listener's address), each of its listeners at its
    endpoint; returns its node id. Without `node_id`, the agent keeps the id registered for its address before (a
    restart), or takes the lowest id no agent holds. An id held by an agent of another address heard from within
    `alive_ms` is refused: two live agents never share one."""
    rows = connection.execute(select(s.agents).with_for_update()).all()
    if node_id is None:
        same = [row.node_id for row in rows if (row.host, row.port) == (host, port)]
        taken = {row.node_id for row in rows}
        node_id = same[0] if same else next(n for n in range(len(taken) + 1) if n not in taken)
    holder = next((row for row in rows if row.node_id == node_id), None)
    if holder is not None and (holder.host, holder.port) != (host, port) and now_ms - holder.heartbeat_ms < alive_ms:
        raise LogcompactError(
            f"node id {node_id} is held by the live agent at {holder.host}:{holder.port} (heard from "
            f"{now_ms - holder.heartbeat_ms} ms ago); pass another --node-id, or none to take a free one"
        )
    deregister(connection, node_id)  # the row of the agent that held the id before, and its endpoints
    connection.execute(insert(s.agents).values(
        node_id=node_id, host=host, port=port, rack=rack, started_ms=now_ms, heartbeat_ms=now_ms
    ))
    if endpoints:
        connection.execute(insert(s.agent_endpoints), [
            {"node_id": node_id, "listener": endpoint.listener, "host": endpoint.host, "port": endpoint.port} for endpoint in endpoints
        ])
    return node_id


def heartbeat(connection: Connection, node_id: int, host: str, port: int, now_ms: int) -> None:
    """Record that agent `node_id` at host:port is alive. An agent whose row is gone (deregistered, or its id taken
    by another after it fell silent) is CommitConflictError."""
    ag = s.agents.c
    mine = (ag.node_id == node_id, ag.host == host, ag.port == port)
    if not connection.execute(update(s.agents).where(*mine).values(heartbeat_ms=now_ms)).rowcount:
        raise CommitConflictError(
            f"agent node id {node_id} at {host}:{port} is no longer registered in the catalog (expected its row, "
            "found none: another agent took the id after this one fell silent); restart this agent"
        )


def live(connection: Connection, now_ms: int, alive_ms: int) -> list[AgentRecord]:
    """The agents heard from within `alive_ms` with their endpoints, by node id: one statement, as Metadata reads it
    for every request."""
    ag, ep = s.agents.c, s.agent_endpoints.c
    rows = connection.execute(
        select(ag.node_id, ag.host, ag.port, ag.rack, ag.started_ms, ag.heartbeat_ms,
               ep.listener, ep.host.label("endpoint_host"), ep.port.label("endpoint_port"))
        .select_from(s.agents.outerjoin(s.agent_endpoints, ep.node_id == ag.node_id))
        .where(ag.heartbeat_ms > now_ms - alive_ms)
        .order_by(ag.node_id, ep.listener)
    )
    agents: dict[int, AgentRecord] = {}
    for r in rows:
        agent = agents.get(r.node_id) or AgentRecord(r.node_id, r.host, r.port, r.rack, r.started_ms, r.heartbeat_ms)
        if r.listener is not None:
            agent = replace(agent, endpoints=(*agent.endpoints, AgentEndpoint(r.listener, r.endpoint_host, r.endpoint_port)))
        agents[r.node_id] = agent
    return list(agents.values())


def deregister(connection: Connection, node_id: int) -> None:
    """An agent stopping: clients are no longer sent to it, on any listener."""
    connection.execute(delete(s.agent_endpoints).where(s.agent_endpoints.c.node_id == node_id))
    connection.execute(delete(s.agents).where(s.agents.c.node_id == node_id))
