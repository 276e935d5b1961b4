"""The agent's listener and connection loop.

Each connection reads size-prefixed frames ahead of their responses, at most `max_in_flight` requests and
`max_in_flight_bytes` of them, and answers them in request order (Kafka's per-connection contract) while the
handlers of pipelined requests run concurrently. Deep pipelines matter here: an ack waits for its L0 file's
commit (a flush interval), and librdkafka sends one partition's batch per Produce request, so a connection
allowed few requests in flight would carry few partitions' batches per flush. A frame over `max_frame_bytes`, or
one that does not decode, closes its connection with one log line, after the responses to the requests before
it; it never stops the server. Requests read and not answered hold at most `max_queued_bytes` across the agent
(a reader waits for room), in at most `max_connections` connections (one more is closed as soon as it is
accepted, with one log line).

Handlers of one connection start in request order: each runs as its own task, and asyncio runs new tasks
first-in first-out up to their first await. So what a handler does before its first await (a Produce handing
its batch to the ingest agent) happens in request order, as Kafka's one-request-at-a-time connections would.

Stopping closes the listener, stops reading, commits what the ingest agent holds (so acks come at once, and
acks=0 batches are kept), answers waiting fetches with what they have, lets every request already read be
answered, then closes.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
from collections.abc import Callable
from dataclasses import dataclass

from logcompact.catalog import Catalog
from logcompact.catalog.groups import GroupCatalog
from logcompact.exceptions import LogcompactError
from logcompact.ingest import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL_MS
from logcompact.kafka import api_versions, codec, records
from logcompact.kafka.apis import APIS
from logcompact.kafka.broker import Address, Broker, CommitWatch, Ingest
from logcompact.kafka.cluster import AgentDirectory
from logcompact.kafka.coordinator import DEFAULT_GROUP_MAX_BYTES, DEFAULT_GROUP_MAX_SIZE, INITIAL_REBALANCE_DELAY_MS, GroupCoordinator
from logcompact.kafka.produce import DEFAULT_MAX_MESSAGE_BYTES
from logcompact.store.cache import DEFAULT_MAX_BYTES as DEFAULT_FETCH_CACHE_BYTES
from logcompact.store.cache import CachedStore

log = logging.getLogger(__name__)

DEFAULT_LISTEN = Address("127.0.0.1", 9092)
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 1000  # requests per connection (librdkafka pipelines up to 1,000,000 by default)
DEFAULT_MAX_IN_FLIGHT_BYTES = 128 * 1024 * 1024  # of requests per connection: above one frame of the largest size
DEFAULT_MAX_QUEUED_BYTES = 1024 * 1024 * 1024  # of requests read and not answered, across connections
# A connection's read buffer stops taking bytes from the socket past twice this until a frame is read out of it:
# asyncio's 64 KiB default pauses and resumes the socket several times per 1 MB Produce (a selector call each).
READ_BUFFER_BYTES = 1024 * 1024
DEFAULT_MAX_CONNECTIONS = 1000
COMMIT_POLL_SECONDS = 0.05  # how often fetches waiting for records look for a new catalog version
STOP_GRACE_SECONDS = 30  # how long a stop waits for requests already read


@dataclass(frozen=True)
class AgentSettings:
    listen: Address = DEFAULT_LISTEN
    advertise: Address | None = None  # the listen address (with its bound port) when None
    node_id: int | None = None  # the one registered for the advertised address before, or the lowest free one
    rack: str | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # of a topic that sets no max.message.bytes
    group_initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS
    group_max_size: int = DEFAULT_GROUP_MAX_SIZE  # Kafka's group.max.size: members and pending member ids of a group
    group_max_bytes: int = DEFAULT_GROUP_MAX_BYTES  # all groups' members: their metadata, assignments and ids
    fetch_cache_bytes: int = DEFAULT_FETCH_CACHE_BYTES  # file ranges Fetch keeps for consumers reading them again
    auto_create_topics: bool = True  # Kafka's auto.create.topics.enable
    num_partitions: int = 1  # Kafka's num.partitions: of a topic created without a count


class FrameError(Exception):
    """A frame size the connection cannot take."""


class ByteBudget:
    """Bytes of requests read and not answered yet, kept within `limit`: a reader waits for room. A request always
    fits while none is held (a frame is at most max_frame_bytes, checked before), so a large one is never stuck.
    Used on the event loop only."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0
        self._freed = asyncio.Event()

    async def take(self, size: int) -> None:
        while self.held and self.held + size > self.limit:
            self._freed.clear()
            await self._freed.wait()
        self.held += size

    def give(self, size: int) -> None:
        self.held -= size
        self._freed.set()


class AgentServer:
    def __init__(self, catalog: Catalog, settings: AgentSettings) -> None:
        self.catalog = catalog
        self.settings = settings
        self._server: asyncio.Server | None = None
        self._broker: Broker | None = None
        self._readers: set[asyncio.Task] = set()
        self._queued = ByteBudget(settings.max_queued_bytes)
        self._connections: set[asyncio.Task] = set()

    @property
    def broker(self) -> Broker:
        assert self._broker is not None, "start() first"
        return self._broker

    @property
    def address(self) -> Address:
        """The bound listen address (its real port when --listen asked for port 0)."""
        assert self._server is not None, "start() first"
        host, port = self._server.sockets[0].getsockname()[:2]
        return Address(host, port)

    async def start(self) -> None:
        # The cluster must exist before clients are told its id: ClusterNotFoundError otherwise.
        cluster_id = await asyncio.to_thread(lambda: self.catalog.cluster_id)
        await asyncio.to_thread(records.compile_encoder)  # seconds on a fresh install: before clients, not in a Fetch
        listen = self.settings.listen
        try:
            self._server = await asyncio.start_server(self._connection, listen.host, listen.port, limit=READ_BUFFER_BYTES)
        except OSError as exc:
            raise LogcompactError(f"agent cannot listen on {listen}: {exc.strerror or exc}; pass another --listen HOST:PORT") from None
        settings = self.settings
        ingest = await asyncio.to_thread(Ingest, self.catalog, settings.flush_interval_ms, settings.flush_bytes)
        commits = CommitWatch(self.catalog, COMMIT_POLL_SECONDS)
        advertised = settings.advertise or self.address
        agents = await asyncio.to_thread(AgentDirectory.register, self.catalog, advertised.host, advertised.port, settings.rack, settings.node_id)
        agents.start()
        groups = GroupCoordinator(GroupCatalog(self.catalog.engine), agents.me.node_id, settings.group_initial_rebalance_delay_ms,
                                  settings.group_max_size, settings.group_max_bytes)
        file_cache = CachedStore(self.catalog.store, settings.fetch_cache_bytes)
        self._broker = Broker(
            self.catalog, cluster_id, agents, advertised, APIS, ingest, settings.max_message_bytes, commits, groups, file_cache,
            settings.auto_create_topics, settings.num_partitions,
        )
        # What the agent holds for its life is made by now (modules, compiled loops, the catalog's metadata): put out
        # of the collector's reach, so its full collections, which walked all of it with the GIL held (100-200 ms in
        # which no request is read and no flush goes on), walk only what serving makes.
        gc.collect()
        gc.freeze()

    async def stop(self) -> None:
        assert self._server is not None, "start() first"
        self._server.close()
        await self.broker.agents.stop()
        for reader in self._readers:
            reader.cancel()
        # One turn of the loop lets every request already read reach its first await (a Produce its submission
        # to the ingest thread); the flush queued behind them commits those batches now, not a flush interval later.
        await asyncio.sleep(0)
        flushing = asyncio.get_running_loop().run_in_executor(self.broker.ingest.thread, self.broker.ingest.flush)
        self.broker.commits.release()  # long-polling fetches answer now, not at their max_wait
        groups_closing = asyncio.create_task(self.broker.groups.close())  # waiting JoinGroups answer now
        if self._connections:
            _, late = await asyncio.wait(self._connections, timeout=STOP_GRACE_SECONDS)
            for connection in late:
                connection.cancel()
        await self._server.wait_closed()
        await self.broker.commits.close()
        await groups_closing
        await flushing
        await asyncio.to_thread(self.broker.ingest.close)

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        this = asyncio.current_task()
        assert this is not None
        peer = _peer(writer)
        if len(self._connections) >= self.settings.max_connections:
            log.warning("connection from %s refused: the agent holds its maximum of %d connections", peer, self.settings.max_connections)
            writer.close()
            return
        self._connections.add(this)
        # The reader takes a slot and the bytes of each request, the sender gives them back once it is answered.
        in_flight = asyncio.Semaphore(self.settings.max_in_flight)
        held = ByteBudget(self.settings.max_in_flight_bytes)
        responses: asyncio.Queue[tuple[asyncio.Task[bytes | None], int] | None] = asyncio.Queue()
        reading = asyncio.create_task(self._read(reader, responses, in_flight, held, peer))
        self._readers.add(reading)
        try:
            await self._send(writer, responses, in_flight, held, peer)
        finally:
            reading.cancel()
            await asyncio.gather(reading, return_exceptions=True)  # so what it holds is settled
            self._readers.discard(reading)
            self._connections.discard(this)
            self._queued.give(held.held)  # the requests this connection read and will never answer
            writer.close()

    async def _read(
        self, reader: asyncio.StreamReader, responses: asyncio.Queue, in_flight: asyncio.Semaphore, held: ByteBudget, peer: str,
    ) -> None:
        """Frames into answering tasks, in order; None queued last however reading ends (a stop cancels it)."""
        try:
            while True:
                size = await self._frame_size(reader)
                if size is None:
                    return
                await in_flight.acquire()
                await held.take(size)
                try:
                    await self._queued.take(size)
                except BaseException:
                    held.give(size)
                    raise
                request = codec.decode_request(await reader.readexactly(size), self.broker.serves)
                responses.put_nowait((asyncio.create_task(self._answer(request)), size))
        except (FrameError, codec.MalformedRequestError) as exc:
            log.warning("connection from %s closed: %s", peer, exc)
        except asyncio.IncompleteReadError as exc:
            log.warning("connection from %s closed by the client in the middle of a frame (%d bytes read)", peer, len(exc.partial))
        except ConnectionError as exc:
            log.warning("connection from %s lost: %s", peer, exc)
        finally:
            responses.put_nowait(None)

    async def _frame_size(self, reader: asyncio.StreamReader) -> int | None:
        """The next frame's size from its prefix, or None when the client closed between frames."""
        prefix = await reader.read(4)
        if not prefix:
            return None
        if len(prefix) < 4:
            prefix += await reader.readexactly(4 - len(prefix))
        size = int.from_bytes(prefix, "big", signed=True)
        if not 0 <= size <= self.settings.max_frame_bytes:
            raise FrameError(f"frame size {size} is outside 0 to {self.settings.max_frame_bytes} bytes (the agent's max frame size)")
        return size

    async def _answer(self, request: codec.Request) -> bytes | None:
        """The response frame, or None for a request answered with none (Produce with acks=0)."""
        if request.body is None:
            response = api_versions.unsupported(self.broker)
        else:
            response = await self.broker.apis[request.api_key].handle(self.broker, request)
        return None if response is None else codec.encode_response(request.correlation_id, response)

    async def _send(
        self, writer: asyncio.StreamWriter, responses: asyncio.Queue, in_flight: asyncio.Semaphore, held: ByteBudget, peer: str,
    ) -> None:
        while (queued := await responses.get()) is not None:
            answering, size = queued
            try:
                frame = await answering
                if frame is not None:
                    writer.write(frame)
                    await writer.drain()
            except ConnectionError as exc:
                log.warning("connection from %s lost: %s", peer, exc)
                break
            except Exception as exc:  # a failed handler: the client reconnects and retries; the agent goes on
                log.warning("connection from %s closed: its request failed: %s: %s", peer, type(exc).__name__, exc)
                break
            in_flight.release()
            held.give(size)
            self._queued.give(size)
        _cancel_queued(responses)


def _cancel_queued(responses: asyncio.Queue) -> None:
    while not responses.empty():
        queued = responses.get_nowait()
        if queued is not None:
            queued[0].cancel()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(Address(peer[0], peer[1])) if peer else "an unknown peer"


async def serve(catalog: Catalog, settings: AgentSettings, on_listening: Callable[[Broker, Address], None]) -> None:
    """Serve until SIGTERM or SIGINT, then stop as `AgentServer.stop` does."""
    server = AgentServer(catalog, settings)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Not loop.add_signal_handler: it learns of a signal through the loop's wakeup socket, which threads' wakeups
    # (a byte per answered ingest call) fill while the loop is busy, and a signal that finds it full is lost. A
    # Python-level handler runs whatever the socket holds.
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda _number, _frame: loop.call_soon_threadsafe(stopping.set))
    on_listening(server.broker, server.address)
    await stopping.wait()
    await server.stop()


def run_agent(catalog: Catalog, settings: AgentSettings, on_listening: Callable[[Broker, Address], None]) -> None:
    asyncio.run(serve(catalog, settings, on_listening))
