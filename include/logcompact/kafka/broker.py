"""What every handler shares: the catalog, this agent's identity in the cluster it serves, and its ingest agent."""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from logcompact.catalog import Catalog
from logcompact.exceptions import IngestError
from logcompact.ingest import Agent, Record
from logcompact.topics import Topic

# How long an agent trusts what it read of the topics before reading them again for a produce: topics are
# created, deleted, given partitions and altered by any agent or the CLI (this agent's own admin requests
# refresh at once).
TOPICS_MAX_AGE_SECONDS = 1.0

if TYPE_CHECKING:
    from logcompact.kafka.apis import Api

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
    """This agent as the clients see it: one broker that leads every partition and coordinates the cluster."""

    catalog: Catalog
    cluster_id: str
    node_id: int
    advertised: Address
    apis: Mapping[int, Api] = field(repr=False)
    ingest: Ingest = field(repr=False)
    max_message_bytes: int  # of a topic that sets no max.message.bytes
    commits: CommitWatch = field(repr=False)
    # Kafka's auto.create.topics.enable and num.partitions: Metadata asking for an unknown topic (when the client
    # allows it) creates it with this many partitions and the default configs.
    auto_create_topics: bool = True
    num_partitions: int = 1

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
        return time.time_ns() // 1_000_000 if topic.config.message_timestamp_type == "LogAppendTime" else None

    def serves(self, api_key: int, version: int) -> bool:
        api = self.apis.get(api_key)
        return api is not None and api.min_version <= version <= api.max_version

    def describe(self) -> dict[str, Any]:
        return {"node_id": self.node_id, "host": self.advertised.host, "port": self.advertised.port, "rack": None}


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
        self._read_at = float("-inf")  # time.monotonic() of the last read of the topics

    def _new_agent(self) -> Agent:
        return Agent(self.catalog, flush_interval_ms=self.flush_interval_ms, flush_bytes=self.flush_bytes)

    def topic(self, name: str) -> Topic | None:
        """The topic as the catalog describes it, read at most TOPICS_MAX_AGE_SECONDS ago (at once for a name not
        seen then), or None."""
        if name not in self._topics or time.monotonic() - self._read_at > TOPICS_MAX_AGE_SECONDS:
            self._read_topics()
        return self._topics.get(name)

    def forget_topics(self) -> None:
        """Read the topics again at the next produce (this agent just changed one)."""
        self._read_at = float("-inf")

    def _read_topics(self) -> None:
        self._topics = self.catalog.snapshot().topics
        self._read_at = time.monotonic()
        self._agent.use_topics(self._topics)  # the ingest agent checks partitions and keys by the same view

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
