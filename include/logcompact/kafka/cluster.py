"""The agents serving one catalog, as each agent sees them: their addresses, registered at start, heartbeating,
listed by Metadata.

Agents are stateless (WarpStream's model): every agent serves every partition from the shared catalog and store,
so leadership is only where Metadata sends a client. As WarpStream's agents do, each client is told that one agent
leads every partition: its Produce requests then carry every partition it writes, and one agent writes them into
one L0 file a flush, where partitions spread over the agents had every agent write a slice of every producer's
records (more and smaller files for the same records, each costing a write and a commit, and a producer waiting
for the slowest of several flushes). Clients are spread over the live agents by a stable hash of their client id
and address, and a client moves when an agent joins or falls silent. A request that reaches another agent than
the one named is served all the same: no client ever sees NOT_LEADER_OR_FOLLOWER because another agent wrote a
file.
"""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from logcompact.catalog import Catalog
from logcompact.catalog.model import AgentEndpoint, AgentRecord
from logcompact.units import wall_clock_ms

log = logging.getLogger(__name__)

HEARTBEAT_SECONDS = 2.0
# An agent not heard from for this long is left out of Metadata: a few missed heartbeats, then clients move on.
ALIVE_MS = 10_000


@dataclass(frozen=True)
class Address:
    """Where an agent listens, or where clients are told to reach it."""

    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"

    @staticmethod
    def parse(text: str, option: str) -> Address:
        """HOST:PORT ([IPv6]:PORT); ValueError naming `option` otherwise."""
        host, sep, port = text.rpartition(":")
        host = host.removeprefix("[").removesuffix("]")
        if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
            raise ValueError(f"{option} {text!r} is not HOST:PORT with a port of 0 to 65535 (for example 127.0.0.1:9092)")
        return Address(host, int(port))


class AgentDirectory:
    """This agent's registration and its view of the live agents, refreshed by every heartbeat."""

    def __init__(self, catalog: Catalog, me: AgentRecord) -> None:
        self._catalog = catalog
        self.me = me
        self._live: list[AgentRecord] = [me]
        self._beating: asyncio.Task | None = None
        self._watchers: list[Callable[[], None]] = []
        self._beaten: list[int] = []  # the live node ids as of the last heartbeat

    @classmethod
    def register(cls, catalog: Catalog, endpoints: Sequence[AgentEndpoint], rack: str | None, node_id: int | None) -> AgentDirectory:
        """Register in the catalog (blocking) with each listener's advertised endpoint, the first as the agent's
        address: see `Catalog.register_agent`."""
        now = wall_clock_ms()
        first = endpoints[0]
        node_id = catalog.register_agent(first.host, first.port, rack, node_id, now, ALIVE_MS, endpoints)
        directory = cls(catalog, AgentRecord(node_id, first.host, first.port, rack, now, now, tuple(endpoints)))
        directory._live = directory._heartbeat()
        return directory

    def live(self) -> list[AgentRecord]:
        """The agents heard from lately by node id, this one always among them, as of the last heartbeat (a catalog
        that cannot be reached leaves the last list standing: clients keep the agents they know)."""
        return self._live

    def refresh(self) -> list[AgentRecord]:
        """The live agents read from the catalog now (blocking): Metadata and DescribeCluster show an agent that
        joined or stopped a moment ago, not a heartbeat later."""
        self._live = _with(self.me, self._catalog.live_agents(wall_clock_ms(), ALIVE_MS))
        return self._live

    def on(self, listener: str) -> list[AgentRecord]:
        """The live agents clients of `listener` can reach (those with that listener), as of the last refresh."""
        return [agent for agent in self._live if agent.endpoint(listener) is not None]

    def leader_for(self, client_id: str | None, client_host: str, listener: str) -> AgentRecord:
        """The agent that leads every partition for one client: among the live agents on `listener` (this one always
        is), the one a stable hash of the client's id and address ranks first. Ranked per agent (rendezvous
        hashing), so an agent joining or leaving moves only the clients it gains or had, not most of the others."""
        client = f"{client_id or ''}@{client_host}".encode()
        return max(self.on(listener), key=lambda agent: zlib.crc32(b"%d/%s" % (agent.node_id, client)))

    def coordinator_for(self, key: str) -> AgentRecord:
        """The agent coordinating a consumer group (or any keyed coordinator), by a stable hash of its key."""
        live = self._live
        return live[zlib.crc32(key.encode()) % len(live)]

    def watch(self, changed: Callable[[], None]) -> None:
        """Call `changed` on the event loop after each heartbeat that finds other live agents than the one before
        (the groups this agent coordinates may have changed)."""
        self._watchers.append(changed)

    def start(self) -> None:
        self._beaten = [agent.node_id for agent in self._live]
        self._beating = asyncio.create_task(self._beat())

    async def stop(self) -> None:
        """Stop heartbeating and leave the catalog's list at once, so clients are sent elsewhere now."""
        if self._beating is not None:
            self._beating.cancel()
            await asyncio.gather(self._beating, return_exceptions=True)
        try:
            await asyncio.to_thread(self._catalog.deregister_agent, self.me.node_id)
        except Exception as exc:  # stopping anyway: the row ages out of Metadata within ALIVE_MS
            log.warning("agent %d could not deregister from the catalog: %s", self.me.node_id, exc)

    async def _beat(self) -> None:
        while True:
            await asyncio.sleep(HEARTBEAT_SECONDS)
            try:
                self._live = await asyncio.to_thread(self._heartbeat)
            except Exception as exc:  # the catalog down: keep serving; the next beat tries again
                log.warning("agent %d heartbeat to the catalog failed: %s", self.me.node_id, exc)
                continue
            beaten = [agent.node_id for agent in self._live]
            if beaten != self._beaten:
                self._beaten = beaten
                for changed in self._watchers:
                    changed()

    def _heartbeat(self) -> list[AgentRecord]:
        me = self.me
        return _with(me, self._catalog.agent_heartbeat(me.node_id, me.host, me.port, wall_clock_ms(), ALIVE_MS))


def _with(me: AgentRecord, live: list[AgentRecord]) -> list[AgentRecord]:
    """`live` with this agent in it: it serves, whatever the catalog last said of it."""
    return live if any(agent.node_id == me.node_id for agent in live) else sorted([*live, me], key=lambda a: a.node_id)
