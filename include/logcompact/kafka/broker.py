"""What every handler shares: the catalog, this agent's identity in the cluster it serves, and its ingest agent; and
the entry type of the handler table (`Api`), so the table's module (apis.py) and its handlers both point here."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from logcompact.catalog import Catalog
from logcompact.catalog.model import AgentRecord
from logcompact.catalog.producers import BATCHES_KEPT, SEQUENCE_WRAP, PartitionState, SequencedBatch, UnknownProducerError, last_sequence
from logcompact.exceptions import CatalogUnavailableError, IngestError, TopicNotFoundError
from logcompact.format.xxh3 import compile_hasher
from logcompact.ingest import Agent
from logcompact.kafka import codec, records
from logcompact.kafka.cluster import AgentDirectory
from logcompact.store.cache import CachedStore
from logcompact.topics import Topic
from logcompact.units import wall_clock_ms

# How long an agent trusts what it read of the topics before reading them again for a produce: topics are
# created, deleted, given partitions and altered by any agent or the CLI (this agent's own admin requests
# refresh at once).
TOPICS_MAX_AGE_SECONDS = 1.0

if TYPE_CHECKING:
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
    max_message_bytes: int  # of a topic that sets no max.message.bytes
    commits: CommitWatch = field(repr=False)
    groups: GroupCoordinator = field(repr=False)
    file_cache: CachedStore = field(repr=False)  # the catalog's store behind Fetch's bounded cache of file ranges
    # Kafka's auto.create.topics.enable and num.partitions: Metadata asking for an unknown topic (when the client
    # allows it) creates it with this many partitions and the default configs.
    auto_create_topics: bool = True
    num_partitions: int = 1

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

    def describe(self) -> dict[str, Any]:
        return describe(self.agents.me)


def describe(agent: AgentRecord) -> dict[str, Any]:
    """An agent as Metadata and DescribeCluster list brokers."""
    return {"node_id": agent.node_id, "host": agent.host, "port": agent.port, "rack": agent.rack}


def _retried(view: _ProducerView, key: tuple[int, str, int], epoch: int, first_sequence: int, last: int) -> Future | None:
    """Kafka's checks of a batch against its producer's state on the partition: the future of the original's offsets
    for a retry of one of the newest batches, None for a batch to write, ProducerStateError for one to refuse."""
    if view.epoch is None:  # no state: any epoch and sequence starts it
        return None
    where = f"producer {key[0]} on {key[1]}-{key[2]}"
    if epoch < view.epoch:
        raise ProducerStateError(codec.ErrorCode.invalid_producer_epoch, f"{where}: epoch {epoch} is older than its epoch {view.epoch}")
    if epoch > view.epoch:
        if first_sequence != 0:
            raise ProducerStateError(codec.ErrorCode.out_of_order_sequence_number, f"{where}: new epoch {epoch} starts at sequence {first_sequence}, not 0")
        return None
    for first, final, placed in view.batches:
        if (first, final) == (first_sequence, last):
            return placed if isinstance(placed, Future) else _offsets_future(placed)
    expected = (view.batches[-1][1] + 1) % SEQUENCE_WRAP
    if first_sequence != expected:
        raise ProducerStateError(codec.ErrorCode.out_of_order_sequence_number, f"{where}: sequence {first_sequence} where {expected} was expected")
    return None


def _offsets_future(first_offset: int) -> Future:
    """A retried batch's answer when its original is committed: only the first offset is answered."""
    future: Future = Future()
    future.set_result([first_offset])
    return future


# A handler of one API: the table in apis.py maps API keys to them, with the versions served.
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


# The producer-partitions whose state an agent keeps in memory; past it, the least recently used one with nothing
# pending is dropped (its next batch reads its state from the catalog again): at most a few hundred bytes each.
MAX_PRODUCER_VIEWS = 100_000


class ProducerStateError(Exception):
    """An idempotent producer's batch refused for its producer id, epoch or sequence, or because its producer's
    state could not be read: Kafka's error for it."""

    def __init__(self, error: codec.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass
class _ProducerView:
    """A producer's state on a partition as this agent sees it: as committed when loaded, then every batch the agent
    accepted since, each with its first offset, or while pending the future of its offsets."""

    epoch: int | None  # None: the catalog holds no state, so any sequence starts it (as Kafka)
    batches: list[tuple[int, int, int | Future]]  # (first sequence, last sequence, offset or future), oldest first

    @staticmethod
    def of(state: PartitionState | None) -> _ProducerView:
        if state is None:
            return _ProducerView(None, [])
        return _ProducerView(state.epoch, [(b.first_sequence, b.last_sequence, b.first_offset) for b in state.batches])

    @property
    def pending(self) -> bool:
        return any(isinstance(placed, Future) and not placed.done() for _, _, placed in self.batches)

    @property
    def failed(self) -> bool:
        """Whether a batch it counts as written failed to commit: then it no longer says what the catalog holds."""
        return any(isinstance(placed, Future) and placed.done() and placed.exception() is not None for _, _, placed in self.batches)


class LoopResults:
    """Futures completed on other threads, delivered to the event loop in bursts: one wakeup of the loop for all that
    completed since the last, where asyncio.wrap_future costs one each (a callback and a byte on the loop's wakeup
    socket), two per Produce request: thousands a second under fifty producers, a fifth of the loop's time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._completed: list[tuple[asyncio.Future, Future]] = []

    def wrap(self, future: Future) -> asyncio.Future:
        """An asyncio future of the event loop this is called on, taking `future`'s result or exception."""
        loop = asyncio.get_running_loop()
        waiting = loop.create_future()
        future.add_done_callback(lambda done: self._complete(loop, waiting, done))
        return waiting

    def _complete(self, loop: asyncio.AbstractEventLoop, waiting: asyncio.Future, done: Future) -> None:
        with self._lock:
            self._completed.append((waiting, done))
            if len(self._completed) > 1:  # a delivery is scheduled and has not begun: it takes this one too
                return
        loop.call_soon_threadsafe(self._deliver)

    def _deliver(self) -> None:
        with self._lock:
            completed, self._completed = self._completed, []
        for waiting, done in completed:
            if waiting.cancelled():
                continue
            if done.cancelled():
                waiting.cancel()
            elif (error := done.exception()) is not None:
                waiting.set_exception(error)
            else:
                waiting.set_result(done.result())


class Ingest:
    """The server's one ingest agent, fed by one thread: what a handler submits to `thread` before its first
    await reaches the agent in request order, batches are decoded there (the numba loops release the GIL) while the
    event loop reads the next requests, and when producers outrun the flusher (a second buffer full before the first
    is written) the agent's inline flush blocks that thread (backpressure on every producer) instead of the event
    loop. `topic`, `produce` and `produce_sequenced` run on that thread only.

    Idempotent producers' batches are checked here as Kafka's ProducerStateManager checks them, against a view of
    each producer-partition loaded from the catalog on its first batch plus the batches accepted since; each batch
    records the state it assumed, which its append checks in the catalog (`logcompact.catalog.producers`). A view
    holding a batch that failed to commit is read from the catalog again, so the producer's retry is checked there."""

    def __init__(self, catalog: Catalog, flush_interval_ms: int, flush_bytes: int) -> None:
        self.catalog = catalog
        self.flush_interval_ms = flush_interval_ms
        self.flush_bytes = flush_bytes
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="logcompact-kafka-ingest")
        self.results = LoopResults()  # what the ingest thread and the flusher complete, to the event loop
        records.compile_decoder()  # seconds on a fresh install: before clients, not in a Produce or a flush
        compile_hasher()
        self._agent = self._new_agent()
        self._topics: dict[str, Topic] = {}
        self._views: OrderedDict[tuple[int, str, int], _ProducerView] = OrderedDict()
        self._read_at = float("-inf")  # time.monotonic() of the last read of the topics; -inf: read at the next produce
        self._forgotten = 0  # forget_topics calls: a read begun before the last one does not count as fresh
        # Topics read again because of their age are read here, so no produce waits for the catalog on the ingest thread.
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="logcompact-kafka-topics")
        self._reading: Future | None = None

    def _new_agent(self) -> Agent:
        return Agent(self.catalog, flush_interval_ms=self.flush_interval_ms, flush_bytes=self.flush_bytes)

    def topic(self, name: str) -> Topic | None:
        """The topic as the catalog describes it, or None: read at once for a name not seen in the last read or after
        `forget_topics`; a read older than TOPICS_MAX_AGE_SECONDS is renewed in the background (the produce goes on
        with it: a catalog read takes tens of milliseconds, which every request queued behind it would wait)."""
        if name not in self._topics or self._read_at == float("-inf"):
            self._read_topics()
        elif time.monotonic() - self._read_at > TOPICS_MAX_AGE_SECONDS and (self._reading is None or self._reading.done()):
            self._reading = self._reader.submit(self._read_topics)
        return self._topics.get(name)

    def forget_topics(self) -> None:
        """Read the topics again at the next produce (this agent just changed one)."""
        self._forgotten += 1
        self._read_at = float("-inf")

    def _read_topics(self) -> None:
        forgotten = self._forgotten
        self._topics = self.catalog.snapshot().topics
        self._agent.use_topics(self._topics)  # the ingest agent checks partitions and keys by the same view
        self._read_at = time.monotonic() if forgotten == self._forgotten else float("-inf")

    def produce(self, topic: str, partition: int, columns: pa.RecordBatch, sequenced: SequencedBatch | None = None, after: Future | None = None) -> Future:
        """The offsets (an array) of a batch's records (ingest.PRODUCE_SCHEMA) once their L0 file is committed. An ingest
        agent whose flush failed refuses every later batch (its error raised again), so it is closed and replaced: the
        failed flush's batches were answered with its error, and the next ones get a fresh agent."""
        try:
            return self._agent.produce_columns(topic, partition, columns, sequenced, after)
        except IngestError as exc:
            log.warning("ingest agent replaced after a failed flush: %s", exc)
            failed, self._agent = self._agent, self._new_agent()
            try:
                failed.close()
            except IngestError:
                pass  # the same failure, already answered to its batches
            return self._agent.produce_columns(topic, partition, columns, sequenced, after)

    def produce_sequenced(self, topic: str, partition: int, columns: pa.RecordBatch, producer_id: int, epoch: int, first_sequence: int) -> Future:
        """An idempotent producer's batch: the future of its offsets, or for a retry of one of the producer's newest 5
        batches on the partition, that batch's (nothing written again). ProducerStateError for an unknown producer id,
        an epoch older than the producer's, or a sequence that does not follow its last one (a new epoch starts at 0).
        A view that refuses a batch while nothing of it is pending is read from the catalog again first: another agent
        may have written for the producer since."""
        key = (producer_id, topic, partition)
        last = last_sequence(first_sequence, columns.num_rows)
        view, loaded = self._view(key)
        try:
            retried = _retried(view, key, epoch, first_sequence, last)
        except ProducerStateError:
            if loaded or view.pending:
                raise
            del self._views[key]
            view, _ = self._view(key)
            retried = _retried(view, key, epoch, first_sequence, last)
        if retried is not None:
            return retried
        follows = None if view.epoch is None else (view.epoch, view.batches[-1][1])
        previous = view.batches[-1][2] if view.batches else None
        future = self.produce(topic, partition, columns, SequencedBatch(producer_id, epoch, first_sequence, last, follows),
                              previous if isinstance(previous, Future) else None)
        if view.epoch != epoch:
            view.epoch, view.batches = epoch, []
        view.batches.append((first_sequence, last, future))
        del view.batches[:-BATCHES_KEPT]
        return future

    def _view(self, key: tuple[int, str, int]) -> tuple[_ProducerView, bool]:
        """The producer-partition's view, and whether it was just read from the catalog (first batch, or a batch of
        the view failed: the batches accepted after it fail too, unwritten, as they follow it)."""
        view = self._views.get(key)
        if view is not None and not view.failed:
            self._views.move_to_end(key)
            return view, False
        producer_id, topic, partition = key
        try:
            view = _ProducerView.of(self.catalog.producer_state(producer_id, topic, partition))
        except UnknownProducerError as exc:
            raise ProducerStateError(codec.ErrorCode.unknown_producer_id, str(exc)) from None
        except TopicNotFoundError as exc:  # deleted since the request's topic was looked up
            raise ProducerStateError(codec.ErrorCode.unknown_topic_or_partition, str(exc)) from None
        except CatalogUnavailableError as exc:  # retriable: the client sends the batch again
            raise ProducerStateError(codec.ErrorCode.kafka_storage_error, f"producer state not readable: {exc}") from None
        self._views[key] = view
        if len(self._views) > MAX_PRODUCER_VIEWS:
            idle = next((old for old, known in self._views.items() if old != key and not known.pending), None)
            if idle is not None:
                del self._views[idle]
        return view, True

    def flush(self) -> None:
        """Commit what is buffered now. A failure is not raised: it was answered to the batches it failed."""
        try:
            self._agent.flush()
        except IngestError as exc:
            log.warning("ingest agent flush failed: %s", exc)

    def close(self) -> None:
        """Hand over what was submitted, then flush and commit everything buffered."""
        self.thread.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._agent.close()
