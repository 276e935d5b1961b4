"""What every handler shares: the catalog, this agent's identity in the cluster it serves, and its ingest agent."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logcompact.catalog import Catalog
from logcompact.catalog.model import AgentRecord
from logcompact.exceptions import IngestError
from logcompact.ingest import Agent, Record
from logcompact.kafka.cluster import AgentDirectory
from logcompact.store.cache import CachedStore
from logcompact.topics import Topic

if TYPE_CHECKING:
    from logcompact.kafka.apis import Api
    from logcompact.kafka.coordinator import GroupCoordinator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Address:
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


@dataclass(frozen=True)
class Broker:
    """This agent as the clients see it: one of the cluster's brokers (`agents`), each serving every partition."""

    catalog: Catalog
    cluster_id: str
    agents: AgentDirectory = field(repr=False)
    advertised: Address
    apis: Mapping[int, Api] = field(repr=False)
    ingest: Ingest = field(repr=False)
    max_message_bytes: int
    commits: CommitWatch = field(repr=False)
    groups: GroupCoordinator = field(repr=False)
    file_cache: CachedStore = field(repr=False)  # the catalog's store behind Fetch's bounded cache of file ranges

    @property
    def node_id(self) -> int:
        return self.agents.me.node_id

    def topic_id(self, topic: str) -> uuid.UUID:
        """Kafka's topic id (Metadata v10 on): the catalog numbers topics, so derive a UUID stable per cluster."""
        return uuid.uuid5(uuid.UUID(self.cluster_id), topic)

    def serves(self, api_key: int, version: int) -> bool:
        api = self.apis.get(api_key)
        return api is not None and api.min_version <= version <= api.max_version

    def describe(self) -> dict[str, Any]:
        return describe(self.agents.me)


def describe(agent: AgentRecord) -> dict[str, Any]:
    """An agent as Metadata and DescribeCluster list brokers."""
    return {"node_id": agent.node_id, "host": agent.host, "port": agent.port, "rack": agent.rack}


class CommitWatch:
    """The catalog's newest version, polled every `interval_seconds` by one task while any fetch waits for a
    commit: a thousand long-polling consumers cost one catalog read per interval, not a thousand. Runs on the
    server's event loop."""

    def __init__(self, catalog: Catalog, interval_seconds: float) -> None:
        self._catalog = catalog
        self._interval = interval_seconds
        self._version = -1
        self._waiters = 0
        self._changed = asyncio.Event()
        self._poller: asyncio.Task | None = None
        self._released = False

    async def wait_past(self, version: int, timeout_seconds: float) -> bool:
        """Whether a version newer than `version` is committed within the timeout (False at once once released)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        self._waiters += 1
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll())
        try:
            while self._version <= version:
                if self._released:
                    return False
                remaining = deadline - loop.time()
                if remaining <= 0:
                    return False
                try:
                    await asyncio.wait_for(self._changed.wait(), remaining)
                except TimeoutError:
                    return False
            return True
        finally:
            self._waiters -= 1

    async def _poll(self) -> None:
        while self._waiters:
            try:
                version = await asyncio.to_thread(self._catalog.latest_version)
            except Exception as exc:  # the catalog down: waiting fetches time out, their next read fails
                log.warning("cannot read the catalog's version for waiting fetches: %s", exc)
            else:
                if version != self._version:
                    self._version = version
                    self._changed.set()
                    self._changed = asyncio.Event()
            await asyncio.sleep(self._interval)

    def release(self) -> None:
        """Stop every wait now and for good (the server is stopping): waiting fetches answer with what they have."""
        self._released = True
        self._changed.set()

    async def close(self) -> None:
        """Stop polling (the server stops once its connections are answered)."""
        if self._poller is not None:
            self._poller.cancel()
            await asyncio.gather(self._poller, return_exceptions=True)


class Ingest:
    """The server's one ingest agent, fed by one thread: what a handler submits to `thread` before its first
    await reaches the agent in request order, and the agent's inline flush of a full buffer blocks that thread
    (backpressure on every producer) instead of the event loop. `topic` and `produce` run on that thread only."""

    def __init__(self, catalog: Catalog, flush_interval_ms: int, flush_bytes: int) -> None:
        self.catalog = catalog
        self.flush_interval_ms = flush_interval_ms
        self.flush_bytes = flush_bytes
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="logcompact-kafka-ingest")
        self._agent = self._new_agent()
        self._topics: dict[str, Topic] = {}

    def _new_agent(self) -> Agent:
        return Agent(self.catalog, flush_interval_ms=self.flush_interval_ms, flush_bytes=self.flush_bytes)

    def topic(self, name: str) -> Topic | None:
        """The topic as the catalog describes it, or None; partitions and cleanup.policy never change, so the
        catalog is read again only for a name not seen yet (a topic created since)."""
        if name not in self._topics:
            self._topics = self.catalog.snapshot().topics
        return self._topics.get(name)

    def produce(self, topic: str, records: Sequence[Record]) -> Future:
        """The records' offsets once their L0 file is committed. An ingest agent whose flush failed refuses every
        later batch (its error raised again), so it is closed and replaced: the failed flush's batches were
        answered with its error, and the next ones get a fresh agent."""
        try:
            return self._agent.produce(topic, records)
        except IngestError as exc:
            log.warning("ingest agent replaced after a failed flush: %s", exc)
            failed, self._agent = self._agent, self._new_agent()
            try:
                failed.close()
            except IngestError:
                pass  # the same failure, already answered to its batches
            return self._agent.produce(topic, records)

    def flush(self) -> None:
        """Commit what is buffered now. A failure is not raised: it was answered to the batches it failed."""
        try:
            self._agent.flush()
        except IngestError as exc:
            log.warning("ingest agent flush failed: %s", exc)

    def close(self) -> None:
        """Hand over what was submitted, then flush and commit everything buffered."""
        self.thread.shutdown(wait=True)
        self._agent.close()
