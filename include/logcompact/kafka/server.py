"""The agent's listener and connection loop.

Each connection reads size-prefixed frames ahead of their responses, at most `max_in_flight` requests and
`max_in_flight_bytes` of them, and answers them in request order (Kafka's per-connection contract) while the
handlers of pipelined requests run concurrently. Deep pipelines matter here: an ack waits for its L0 file's
commit (a flush interval), and librdkafka sends one partition's batch per Produce request, so a connection
allowed few requests in flight would carry few partitions' batches per flush. A frame over `max_frame_bytes`, or
one that does not decode, closes its connection with one log line, after the responses to the requests before
it; it never stops the server. Requests read and not handled hold at most `max_queued_bytes` across the agent,
`max_queued_bytes_per_ip` of them from one address (a reader waits for room), taken as a frame's bytes arrive, not
at its size prefix: a frame that never completes holds only the bytes it sent, and one not all in within
`request_read_timeout_ms` of its first byte closes its connection. Answers not yet written count against their
connection's `max_in_flight_bytes` (its reader waits), not the agent's budget, so clients that do not read their
answers hold no room others need; a connection whose answers stop being taken for `connections_max_idle_ms` is
aborted.

The agent holds at most `max_connections` connections, `max_connections_per_ip` of one address (one more is
closed as soon as it is accepted, with one log line). A connection that has not sent a whole request within
`connection_setup_timeout_ms`, or that is idle (no request unanswered, nothing received) for
`connections_max_idle_ms`, is closed with one log line, so connections that never speak cannot keep others out.
One sweep of the connections finds those past a bound, as Kafka's brokers find idle ones: no timer per read.
A connection whose answer carries a quota's throttle time is not read again until it has passed (KIP-219: its
`muted_until`), and is not idle meanwhile; one over its address's connection_creation_rate is held for the
throttle time and closed (`quota_manager.py`).

On a SASL listener a connection is first authenticated (authenticator.py, Kafka's SaslServerAuthenticator): until
then its requests are read one at a time, each once the one before is answered, so nothing it pipelines runs before
it has a principal; its session then carries the principal, and reading goes on as above.

Handlers of one connection start in request order: each runs as its own task, and asyncio runs new tasks
first-in first-out up to their first await. So what a handler does before its first await (a Produce handing
its batch to the ingest agent) happens in request order, as Kafka's one-request-at-a-time connections would.

Stopping closes the listener, stops reading, commits what the ingest agent holds (so acks come at once, and
acks=0 batches are kept), answers waiting fetches with what they have, lets every request already read be
answered, then closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import math
import signal
import ssl
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from typing import Literal

import numpy as np

from logcompact.catalog import Catalog
from logcompact.catalog.model import AgentEndpoint
from logcompact.exceptions import LogcompactError
from logcompact.ingest import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL_MS
from logcompact.kafka import codec, records, tls
from logcompact.kafka.allocator import keep_freed_memory
from logcompact.kafka.authenticator import (
    DEFAULT_FAILED_AUTHENTICATION_DELAY_MS,
    DEFAULT_MECHANISMS,
    MAX_RECEIVE_BYTES,
    SaslAuthenticator,
    check_mechanisms,
)
from logcompact.kafka.authorizer import AclAuthorizer, AuthorizerSettings
from logcompact.kafka.block_cache import DEFAULT_MAX_BYTES as DEFAULT_FETCH_BLOCK_CACHE_BYTES
from logcompact.kafka.block_cache import DecodedBlocks
from logcompact.kafka.broker import Broker
from logcompact.kafka.cluster import Address, AgentDirectory
from logcompact.kafka.event_loop import CommitWatch
from logcompact.kafka.frame_writer import write_frame
from logcompact.kafka.group_coordinator import (
    DEFAULT_GROUP_MAX_BYTES,
    DEFAULT_GROUP_MAX_SIZE,
    INITIAL_REBALANCE_DELAY_MS,
    OFFSETS_COMMIT_TIMEOUT_MS,
    OFFSETS_RETENTION_CHECK_INTERVAL_MS,
    OFFSETS_RETENTION_MS,
    GroupCoordinator,
)
from logcompact.kafka.handlers import APIS, api_versions
from logcompact.kafka.handlers.produce import DEFAULT_MAX_MESSAGE_BYTES
from logcompact.kafka.ingest_thread import Ingest
from logcompact.kafka.kafka_configs import agent_broker_configs
from logcompact.kafka.listeners import Listener, SecurityProtocol, check_insecure, insecure
from logcompact.kafka.metrics import AgentMetrics, MetricsServer
from logcompact.kafka.quota_manager import ClientQuotaManager, Muted, throttle_ms_of
from logcompact.kafka.session import Session
from logcompact.kafka.tls import TlsSettings
from logcompact.kafka.transaction_coordinator import (
    ABORT_INTERVAL_MS,
    EXPIRY_INTERVAL_MS,
    ID_EXPIRATION_MS,
    MAX_TIMEOUT_MS,
    TransactionCoordinator,
    TransactionSettings,
)
from logcompact.store.cache import DEFAULT_MAX_BYTES as DEFAULT_FETCH_CACHE_BYTES
from logcompact.store.cache import CachedStore

log = logging.getLogger(__name__)

DEFAULT_LISTEN = Address("127.0.0.1", 9092)
DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024
DEFAULT_MAX_IN_FLIGHT = 1000  # requests per connection (librdkafka pipelines up to 1,000,000 by default)
DEFAULT_MAX_IN_FLIGHT_BYTES = 128 * 1024 * 1024  # of requests per connection: above one frame of the largest size
DEFAULT_MAX_QUEUED_BYTES = 1024 * 1024 * 1024  # of requests read and not handled, across connections
# Half the budget, as the per-address connection cap is half the connections: one address (frames it sends and stalls)
# leaves the other half to everyone else.
DEFAULT_MAX_QUEUED_BYTES_PER_IP = DEFAULT_MAX_QUEUED_BYTES // 2
# A connection's read buffer stops taking bytes from the socket past twice this until a frame is read out of it:
# asyncio's 64 KiB default pauses and resumes the socket several times per 1 MB Produce (a selector call each).
READ_BUFFER_BYTES = 1024 * 1024
# What one read between frames takes from the socket at most (asyncio's own), into one buffer an agent shares across
# its connections; a frame with at least DIRECT_READ_BYTES still to arrive is read straight into a buffer of its own.
SCRATCH_READ_BYTES = 256 * 1024
DIRECT_READ_BYTES = 64 * 1024
DEFAULT_MAX_CONNECTIONS = 1000  # Kafka's max.connections is unbounded; each connection costs a reader and a sender task
# Kafka's max.connections.per.ip is unbounded too: half the agent's connections, so one address (a host of many
# clients, a NAT, or one client opening sockets in a loop) leaves the other half to everyone else.
DEFAULT_MAX_CONNECTIONS_PER_IP = 500
DEFAULT_CONNECTIONS_MAX_IDLE_MS = 600_000  # Kafka's connections.max.idle.ms
# The Java client's socket.connection.setup.timeout.ms default: clients send their first request (ApiVersions) at once.
DEFAULT_CONNECTION_SETUP_TIMEOUT_MS = 10_000
# Kafka's brokers have no such bound (their idle timeout only); a client gives up on a request after its
# request.timeout.ms, 30 s by default, so a frame not all in by then is one its sender has abandoned.
DEFAULT_REQUEST_READ_TIMEOUT_MS = 30_000
# The sweep of time bounds looks every quarter of the shortest bound, within these: often enough that a connection
# is closed soon past its bound, seldom enough that tiny bounds do not keep the event loop sweeping.
SWEEP_SECONDS = (0.01, 1.0)
COMMIT_POLL_SECONDS = 0.05  # how often fetches waiting for records look for a new catalog version
STOP_GRACE_SECONDS = 30  # how long a stop waits for requests already read


@dataclass(frozen=True)
class AgentSettings:
    # Each protocol at most once; the first is the agent's own address in the catalog (its node id is kept per that
    # listener's advertised address), and what clients of the single-listener options were told.
    listeners: tuple[Listener, ...] = (Listener(SecurityProtocol.PLAINTEXT, DEFAULT_LISTEN),)
    # A listener that sends records or passwords in the clear (PLAINTEXT, or SASL_PLAINTEXT with PLAIN) off loopback.
    allow_insecure_listener: bool = False
    node_id: int | None = None  # the one registered for the advertised address before, or the lowest free one
    rack: str | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    max_in_flight: int = DEFAULT_MAX_IN_FLIGHT
    max_in_flight_bytes: int = DEFAULT_MAX_IN_FLIGHT_BYTES
    max_queued_bytes: int = DEFAULT_MAX_QUEUED_BYTES
    max_queued_bytes_per_ip: int = DEFAULT_MAX_QUEUED_BYTES_PER_IP  # of max_queued_bytes, held by one address's requests
    max_connections: int = DEFAULT_MAX_CONNECTIONS  # Kafka's max.connections
    max_connections_per_ip: int = DEFAULT_MAX_CONNECTIONS_PER_IP  # Kafka's max.connections.per.ip
    connections_max_idle_ms: int = DEFAULT_CONNECTIONS_MAX_IDLE_MS  # Kafka's connections.max.idle.ms, also for answers not taken
    connection_setup_timeout_ms: int = DEFAULT_CONNECTION_SETUP_TIMEOUT_MS  # for a connection's first whole request
    request_read_timeout_ms: int = DEFAULT_REQUEST_READ_TIMEOUT_MS  # for a frame, from its first byte
    flush_interval_ms: int = DEFAULT_FLUSH_INTERVAL_MS
    flush_bytes: int = DEFAULT_FLUSH_BYTES
    max_message_bytes: int = DEFAULT_MAX_MESSAGE_BYTES  # of a topic that sets no max.message.bytes
    group_initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS
    group_max_size: int = DEFAULT_GROUP_MAX_SIZE  # Kafka's group.max.size: members and pending member ids of a group
    group_max_bytes: int = DEFAULT_GROUP_MAX_BYTES  # all groups' members: their metadata, assignments and ids
    offsets_commit_timeout_ms: int = OFFSETS_COMMIT_TIMEOUT_MS  # Kafka's offsets.commit.timeout.ms: a group's row, an offset commit
    offsets_retention_ms: int = OFFSETS_RETENTION_MS  # Kafka's offsets.retention.minutes, in ms
    offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS  # Kafka's offsets.retention.check.interval.ms
    fetch_cache_bytes: int = DEFAULT_FETCH_CACHE_BYTES  # file ranges Fetch keeps for consumers reading them again
    fetch_block_cache_bytes: int = DEFAULT_FETCH_BLOCK_CACHE_BYTES  # decoded blocks Fetch keeps for consumers of the same file
    fetch_compression: int = 0  # the Kafka codec id Fetch sends where a topic says `producer` and the records' is not known
    auto_create_topics: bool = True  # Kafka's auto.create.topics.enable
    num_partitions: int = 1  # Kafka's num.partitions: of a topic created without a count
    transaction_max_timeout_ms: int = MAX_TIMEOUT_MS  # Kafka's transaction.max.timeout.ms
    transactional_id_expiration_ms: int = ID_EXPIRATION_MS  # Kafka's transactional.id.expiration.ms
    transaction_abort_timed_out_transaction_cleanup_interval_ms: int = ABORT_INTERVAL_MS  # Kafka's, of the same name
    transaction_remove_expired_transaction_cleanup_interval_ms: int = EXPIRY_INTERVAL_MS  # Kafka's, of the same name
    tls: TlsSettings = field(default_factory=TlsSettings)  # of the SSL and SASL_SSL listeners
    sasl_mechanisms: tuple[str, ...] = DEFAULT_MECHANISMS  # Kafka's sasl.enabled.mechanisms, for every SASL listener
    failed_authentication_delay_ms: int = DEFAULT_FAILED_AUTHENTICATION_DELAY_MS  # Kafka's connection.failed.authentication.delay.ms
    authorization: AuthorizerSettings = AuthorizerSettings()  # Kafka's ACLs: authorizer.class.name, super.users, ...
    metrics_listen: Address | None = None  # where Prometheus scrapes /metrics (metrics.py); None: not served

    def __post_init__(self) -> None:
        """ValueError naming the option and the fix for listeners the agent must not start with."""
        check_insecure(self.listeners, self.allow_insecure_listener)
        check_mechanisms(self.sasl_mechanisms, self.listeners, self.allow_insecure_listener)
        self.tls.check(next((listener.name for listener in self.listeners if listener.protocol.uses_tls), None))

    @property
    def transactions(self) -> TransactionSettings:
        return TransactionSettings(
            self.transaction_max_timeout_ms, self.transactional_id_expiration_ms,
            self.transaction_abort_timed_out_transaction_cleanup_interval_ms, self.transaction_remove_expired_transaction_cleanup_interval_ms,
        )


class FrameError(Exception):
    """A frame size the connection cannot take."""


@dataclass(frozen=True)
class Expired:
    """Why a connection is closed past one of its time bounds: setup, request read, idle (`idle`: closed in the
    ordinary course, clients reconnect when they need one) or answers not taken (`unread`: aborted, since its
    answers will never be written)."""

    reason: str
    idle: bool = False
    unread: bool = False


class ByteBudget:
    """Bytes of requests read and not handled yet, kept within `limit`: a reader waits for room. A request always
    fits while none is held (a frame is at most max_frame_bytes, checked before), so a large one is never stuck.

    The agent's budget takes a frame's bytes as they arrive, naming the frame, and is told when all are in
    (`arrived`): a frame that stops arriving holds only what it sent. Bytes of frames still arriving are given back
    by no handler, so when they are all that is held, the first of them to want more goes past the limit to finish
    (one frame at a time, so at most a frame over the limit): frames arriving together never wait on each other for
    good, and the read timeout bounds how long one may hold that place. A budget `within` another (an address's
    share of the agent's) takes and gives its bytes there too. Used on the event loop only."""

    def __init__(self, limit: int, within: ByteBudget | None = None) -> None:
        self.limit = limit
        self.within = within
        self.held = 0
        self.arriving = 0  # of held: bytes of frames not all in yet
        self._overdrawn_by: object | None = None  # the frame let past the limit, until it is all in
        self._freed = asyncio.Event()

    async def take(self, size: int, frame: object | None = None) -> None:
        while self.held and self.held + size > self.limit and not self._overdraws(frame):
            self._freed.clear()
            await self._freed.wait()
        self.held += size
        if frame is not None:
            self.arriving += size
        if self.within is not None:
            try:
                await self.within.take(size, frame)
            except BaseException:
                self._release(size, frame)
                raise

    def add(self, size: int) -> None:
        """Bytes already in memory (an answer made) held without waiting: they keep the reader waiting until given."""
        self.held += size

    def _overdraws(self, frame: object | None) -> bool:
        if frame is None or self.arriving < self.held or self._overdrawn_by not in (None, frame):
            return False
        self._overdrawn_by = frame
        return True

    def arrived(self, size: int, frame: object) -> None:
        """The frame's `size` bytes, taken as they arrived, are all in: its handler gives them back."""
        self.arriving -= size
        if self._overdrawn_by is frame:
            self._overdrawn_by = None
        if self.within is not None:
            self.within.arrived(size, frame)

    def give(self, size: int, frame: object | None = None) -> None:
        """Bytes back: a request's once handled, or what a frame that will never be all in took (`frame`)."""
        self._release(size, frame)
        if self.within is not None:
            self.within.give(size, frame)

    def _release(self, size: int, frame: object | None) -> None:
        self.held -= size
        if frame is not None:
            self.arriving -= size
            if self._overdrawn_by is frame:
                self._overdrawn_by = None
        self._freed.set()


class FrameReader(asyncio.StreamReader):
    """A connection's stream read as Kafka's NetworkReceive reads one: once a frame's size is known (`start_frame`),
    the socket reads the rest of a large frame straight into a buffer of that size, handed on as a view once all is in
    (`end_frame`). asyncio's own stream gave each read a new bytes object, copied it into its buffer and out again
    (twice: a slice, then bytes), each copy into fresh memory: at 1 KiB records, a fifth of the agent's samples.
    Bytes between frames (size prefixes, small requests arriving together) are read into the agent's one scratch
    buffer and kept in the stream's buffer; a frame takes its first bytes from there, and a frame with little left
    to arrive completes there (a read of its own for each would cost more than the copy). It tells how many bytes it
    holds and waits for more without taking any, so a frame's bytes are taken from the agent's budget as they
    arrive."""

    # StreamReader's own state and its waits, which typeshed leaves out
    _buffer: bytearray
    _eof: bool
    _wait_for_data: Callable[[str], Awaitable[None]]
    _wakeup_waiter: Callable[[], None]
    _maybe_resume_transport: Callable[[], None]
    _paused: bool

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop, scratch: memoryview) -> None:
        super().__init__(limit, loop)
        self._scratch = scratch  # the event loop's, shared: each read is copied out of it before the next
        self._size = 0  # of the frame being read
        self._direct: memoryview | None = None  # its own buffer, when it is read straight into one
        self._arrived = 0  # of `_direct`

    @property
    def buffered(self) -> int:
        """Bytes between frames held."""
        return len(self._buffer)

    @property
    def frame_arrived(self) -> int:
        return self._arrived if self._direct is not None else min(len(self._buffer), self._size)

    def start_frame(self, size: int) -> int:
        """Read the next `size` bytes as a frame; how many are in. Its own buffer is numpy's uninitialised one, not
        bytearray's zeroed one: the pages of a large frame are touched only as its bytes arrive."""
        self._size = size
        held = len(self._buffer)
        if size - held < DIRECT_READ_BYTES:
            return min(held, size)
        direct = np.empty(size, np.uint8).data
        with memoryview(self._buffer) as buffer:
            direct[:held] = buffer
        self._buffer.clear()
        self._direct, self._arrived = direct, held
        self._maybe_resume_transport()
        return held

    def end_frame(self) -> bytes | memoryview:
        """The frame, all in, read-only: a view of its own buffer, or bytes out of the stream's."""
        if (direct := self._direct) is not None:
            self._direct = None
            return direct.toreadonly()
        frame = bytes(self._buffer[: self._size])
        del self._buffer[: self._size]
        if self._paused:
            self._maybe_resume_transport()
        return frame

    def partial_frame(self) -> bytes:
        """The bytes of a frame that will not be all in (the client closed mid-frame)."""
        return bytes(self._direct[: self._arrived] if self._direct is not None else self._buffer)

    def get_buffer(self) -> memoryview:
        """Where the transport reads next: the rest of the frame read straight into its buffer, else the scratch."""
        direct = self._direct
        if direct is not None and self._arrived < len(direct):
            return direct[self._arrived :]
        return self._scratch

    def buffer_updated(self, size: int) -> None:
        direct = self._direct
        if direct is not None and self._arrived < len(direct):
            self._arrived += size
            self._wakeup_waiter()
        else:
            self.feed_data(self._scratch[:size])

    async def more(self) -> bool:
        """Wait for bytes past those held (resuming the socket paused at the buffer's limit); False at the end."""
        if (exc := self.exception()) is not None:
            raise exc
        if self._eof:
            return False
        await self._wait_for_data("more")
        return True


class FrameStreamProtocol(asyncio.StreamReaderProtocol, asyncio.BufferedProtocol):
    """asyncio's stream protocol whose transport reads into the buffers its FrameReader hands out (a TLS transport
    too: asyncio's SSL protocol decrypts into them)."""

    _stream_reader: FrameReader | None  # StreamReaderProtocol's, which typeshed leaves out

    def get_buffer(self, sizehint: int) -> memoryview:
        assert self._stream_reader is not None
        return self._stream_reader.get_buffer()

    def buffer_updated(self, nbytes: int) -> None:
        if (reader := self._stream_reader) is not None:
            reader.buffer_updated(nbytes)


@dataclass
class Connection:
    """What a connection's reader, handlers and sender share, and what the agent's sweep of time bounds reads. The
    reader takes a slot and the bytes of each request, from the connection's in-flight bytes and its address's share
    of the agent's budget; its handler gives the share back and adds its answer's bytes to the in-flight ones; the
    sender gives those back once the answer is written."""

    peer: str
    session: Session  # what its requests carry: the listener, the client's address, the principal once authenticated
    in_flight: asyncio.Semaphore
    held: ByteBudget  # bytes of its requests read and of their answers not written, within max_in_flight_bytes
    queued: ByteBudget  # its address's share of the agent's budget
    responses: asyncio.Queue[tuple[asyncio.Task[codec.FrameParts | None], int] | None]
    writer: asyncio.StreamWriter
    accepted_at: float
    answered_at: float = -math.inf
    requests_read: int = 0
    unanswered: int = 0
    handling: int = 0  # bytes of requests read whose handlers have not ended, held in `queued`
    settled: bool = False  # what it held in `queued` given back as it closed: handlers ending later give nothing
    authenticator: SaslAuthenticator | None = None  # on a SASL listener, until authentication completes
    # What the reader waits for from the client, since when: None while the agent holds it up (room, its answers).
    waiting: Literal["request", "frame"] | None = None
    waiting_since: float = 0.0
    frame_waited: float = 0.0  # seconds spent waiting for the client in the frame being read, before waiting_since
    # While the sender waits for the client to take an answer: the bytes not yet taken, as last seen shrinking, and when.
    sending: bool = False
    unsent: int = 0
    sent_at: float = 0.0
    closed_for: Expired | None = None
    muted_until: float = -math.inf  # over a client quota: no frame is read before then (KIP-219), and it is not idle

    def expired(self, now: float, settings: AgentSettings) -> Expired | None:
        """The bound this connection is past now, if any: the idle timeout for answers the client stopped taking,
        the setup timeout until a first request is read, the read timeout for a frame from its first byte, the idle
        timeout between frames once every request is answered."""
        if self.sending:
            unsent = self.writer.transport.get_write_buffer_size()
            if unsent < self.unsent:
                self.unsent, self.sent_at = unsent, now
            elif now >= self.sent_at + settings.connections_max_idle_ms / 1000:
                return Expired(f"it stopped reading its answers: none of {unsent} bytes taken for {settings.connections_max_idle_ms} ms "
                               "(connections max idle)", unread=True)
        if self.waiting is None:
            return None
        if not self.requests_read and now >= self.accepted_at + settings.connection_setup_timeout_ms / 1000:
            return Expired(f"no whole request within {settings.connection_setup_timeout_ms} ms of connecting (the connection setup timeout)")
        if self.waiting == "frame" and self.frame_waited + now - self.waiting_since >= settings.request_read_timeout_ms / 1000:
            return Expired(f"its frame was not all in within {settings.request_read_timeout_ms} ms of its first byte (the request read timeout)")
        if (self.waiting == "request" and self.requests_read and not self.unanswered
                and now >= max(self.waiting_since, self.answered_at) + settings.connections_max_idle_ms / 1000):
            return Expired(f"idle for {settings.connections_max_idle_ms} ms (connections max idle)", idle=True)
        return None


class AgentServer:
    def __init__(self, catalog: Catalog, settings: AgentSettings) -> None:
        self.catalog = catalog
        self.settings = settings
        self._servers: dict[str, asyncio.Server] = {}  # by listener name, in the settings' order
        self._broker: Broker | None = None
        self._readers: dict[asyncio.Task, Connection] = {}
        self._queued = ByteBudget(settings.max_queued_bytes)
        self._connections: set[asyncio.Task] = set()
        self._per_ip: Counter[str] = Counter()
        self._per_ip_queued: dict[str, ByteBudget] = {}  # each address's share of `_queued`, while it has connections
        self._scratch = memoryview(bytearray(SCRATCH_READ_BYTES))  # the connections' reads between frames (`FrameReader`)
        self._sweeping: asyncio.Task | None = None
        self._tls_context: ssl.SSLContext | None = None  # of the TLS listeners, made at start
        self._principal_mapper = tls.PrincipalMapper(settings.tls.principal_mapping_rules)
        self._quotas: ClientQuotaManager | None = None
        self.metrics = AgentMetrics()  # what the serving path counts, for --metrics-listen
        self._metrics_server: MetricsServer | None = None

    @property
    def broker(self) -> Broker:
        assert self._broker is not None, "start() first"
        return self._broker

    @property
    def address(self) -> Address:
        """The first listener's bound address (its real port when --listen asked for port 0)."""
        return next(iter(self.addresses.values()))

    @property
    def addresses(self) -> dict[str, Address]:
        """Each listener's bound address by its name."""
        assert self._servers, "start() first"
        return {name: Address(*server.sockets[0].getsockname()[:2]) for name, server in self._servers.items()}

    @property
    def metrics_address(self) -> Address | None:
        """Where /metrics is served (its real port when --metrics-listen asked for port 0), None when it is not."""
        return None if self._metrics_server is None else self._metrics_server.address

    async def start(self) -> None:
        # The cluster must exist before clients are told its id: ClusterNotFoundError otherwise.
        cluster_id = await asyncio.to_thread(lambda: self.catalog.cluster_id)
        await asyncio.to_thread(records.compile_encoder)  # seconds on a fresh install: before clients, not in a Fetch
        self._quotas = quotas = await asyncio.to_thread(ClientQuotaManager.load, self.catalog)  # before connections count against them
        settings = self.settings
        if settings.metrics_listen is not None:  # before the listeners: an address taken stops the start with nothing to undo
            self._metrics_server = await asyncio.to_thread(
                MetricsServer, settings.metrics_listen, self.metrics, lambda: self._broker, tuple(listener.name for listener in settings.listeners))
        if any(listener.protocol.uses_tls for listener in settings.listeners):
            self._tls_context = tls.server_context(settings.tls)
        for listener in settings.listeners:
            await self._listen(listener)
        for listener in insecure(settings.listeners, "PLAIN" in settings.sasl_mechanisms):  # allowed by --allow-insecure-listener, else refused
            log.warning("listener %s sends records%s in the clear to anyone on the network (--allow-insecure-listener)", listener,
                        " and PLAIN passwords" if listener.protocol is SecurityProtocol.SASL_PLAINTEXT else "")
        ingest = await asyncio.to_thread(Ingest, self.catalog, settings.flush_interval_ms, settings.flush_bytes)
        commits = CommitWatch(self.catalog, COMMIT_POLL_SECONDS)
        bound = self.addresses
        advertised_at = {listener.name: listener.advertise or bound[listener.name] for listener in settings.listeners}
        endpoints = [AgentEndpoint(name, address.host, address.port) for name, address in advertised_at.items()]
        advertised = advertised_at[settings.listeners[0].name]
        agents = await asyncio.to_thread(AgentDirectory.register, self.catalog, endpoints, settings.rack, settings.node_id)
        agents.start()
        groups = GroupCoordinator(self.catalog, agents.me.node_id, settings.group_initial_rebalance_delay_ms,
                                  settings.group_max_size, settings.group_max_bytes, settings.offsets_commit_timeout_ms,
                                  settings.offsets_retention_ms, settings.offsets_retention_check_interval_ms)
        file_cache = CachedStore(self.catalog.store, settings.fetch_cache_bytes)
        transactions = TransactionCoordinator(self.catalog, agents, settings.transactions)
        transactions.start(ingest)
        authorizer = AclAuthorizer(self.catalog, settings.authorization)
        await authorizer.start()
        self._broker = Broker(
            self.catalog, cluster_id, agents, advertised, APIS, ingest, settings.max_message_bytes, commits, groups, file_cache,
            transactions, quotas, settings.auto_create_topics, settings.num_partitions, authorizer,
            agent_broker_configs(settings, bound, advertised_at, agents.me.node_id), fetch_compression=settings.fetch_compression,
            decoded_blocks=DecodedBlocks(settings.fetch_block_cache_bytes),
        )
        quotas.start()
        groups.start(self._broker.coordinates)  # offsets' retention, of the groups this agent coordinates
        # What the agent holds for its life is made by now (modules, compiled loops, the catalog's metadata): put out
        # of the collector's reach, so its full collections, which walked all of it with the GIL held (100-200 ms in
        # which no request is read and no flush goes on), walk only what serving makes.
        gc.collect()
        gc.freeze()
        self._sweeping = asyncio.create_task(self._sweep())

    async def _listen(self, listener: Listener) -> None:
        loop = asyncio.get_running_loop()
        scratch = self._scratch

        def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Awaitable[None]:
            return self._connection(listener, reader, writer)

        address = listener.address
        try:
            # asyncio.start_server's own factory, with the reader that reads frames into their own buffers
            self._servers[listener.name] = await loop.create_server(
                lambda: FrameStreamProtocol(FrameReader(READ_BUFFER_BYTES, loop, scratch), accepted, loop), address.host, address.port,
            )
        except OSError as exc:
            for server in self._servers.values():
                server.close()
            if self._metrics_server is not None:
                self._metrics_server.stop()
            raise LogcompactError(f"agent cannot listen on {listener}: {exc.strerror or exc}; pass another --listen {listener.name}://HOST:PORT") from None

    async def stop(self) -> None:
        assert self._servers, "start() first"
        for server in self._servers.values():
            server.close()
        if self._sweeping is not None:
            self._sweeping.cancel()
            await asyncio.gather(self._sweeping, return_exceptions=True)
        await self.broker.transactions.stop()
        await self.broker.authorizer.stop()
        await self.broker.quotas.stop()
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
        for server in self._servers.values():
            await server.wait_closed()
        await self.broker.commits.close()
        await groups_closing
        await flushing
        await asyncio.to_thread(self.broker.ingest.close)
        if self._metrics_server is not None:
            await asyncio.to_thread(self._metrics_server.stop)

    async def _connection(self, listener: Listener, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        assert isinstance(reader, FrameReader)
        this = asyncio.current_task()
        assert this is not None
        peer = _peer(writer)
        host = (writer.get_extra_info("peername") or ("",))[0]
        settings = self.settings
        if len(self._connections) >= settings.max_connections:
            log.warning("connection from %s refused: the agent holds its maximum of %d connections", peer, settings.max_connections)
            writer.close()
            return
        if self._per_ip[host] >= settings.max_connections_per_ip:
            log.warning("connection from %s refused: the agent holds its maximum of %d connections from one address",
                        peer, settings.max_connections_per_ip)
            writer.close()
            return
        assert self._quotas is not None  # loaded before listening
        if throttle_ms := self._quotas.record_connection(host):
            # Kafka's ConnectionQuotas: a connection over its address's connection_creation_rate is not served, and
            # closed only after the throttle time, so a client reconnecting in a loop is slowed to the rate.
            log.warning("connection from %s closed in %d ms: over its address's connection_creation_rate quota of %g per second",
                        peer, throttle_ms, self._quotas.connection_rate(host))
            await asyncio.sleep(throttle_ms / 1000)
            writer.close()
            return
        if host not in self._per_ip_queued:
            self._per_ip_queued[host] = ByteBudget(settings.max_queued_bytes_per_ip, self._queued)
        queued = self._per_ip_queued[host]
        sasl = listener.protocol.uses_sasl
        connection = Connection(
            peer, Session(listener.name, host, authenticated=not sasl), asyncio.Semaphore(settings.max_in_flight),
            ByteBudget(settings.max_in_flight_bytes), queued, asyncio.Queue(), writer, asyncio.get_running_loop().time(),
            authenticator=SaslAuthenticator(self.broker, settings.sasl_mechanisms, settings.failed_authentication_delay_ms, peer) if sasl else None,
        )
        self._connections.add(this)
        self._per_ip[host] += 1
        self.metrics.connected(listener.name)
        reading: asyncio.Task | None = None
        try:
            # Nothing is awaited before the handshake: the stream's reader would otherwise take the client's first
            # bytes (its ClientHello) off the socket before TLS sits in between.
            if listener.protocol.uses_tls and not await self._secure(connection):
                return
            reading = asyncio.create_task(self._read(reader, connection))
            self._readers[reading] = connection
            await self._send(writer, connection)
        finally:
            if reading is not None:
                reading.cancel()
                await asyncio.gather(reading, return_exceptions=True)  # so what it holds is settled
                del self._readers[reading]
            self._connections.discard(this)
            self._per_ip[host] -= 1
            self.metrics.disconnected(listener.name)
            if not self._per_ip[host]:
                del self._per_ip[host], self._per_ip_queued[host]
            connection.settled = True
            queued.give(connection.handling)  # the requests this connection read whose handlers have not ended
            writer.close()

    async def _secure(self, connection: Connection) -> bool:
        """The TLS handshake, then the client certificate's principal in the connection's session; False, with one log
        line, when the handshake fails or no mapping rule names the certificate's DN (Kafka fails the authentication)."""
        assert self._tls_context is not None
        writer = connection.writer
        if not await tls.handshake(writer, self._tls_context, self.settings.tls.handshake_timeout_ms, connection.peer):
            return False
        try:
            principal = tls.principal_of(writer.get_extra_info("ssl_object"), self._principal_mapper)
        except (tls.NoMatchingRule, ValueError) as exc:
            log.warning("connection from %s closed: its certificate names no principal: %s", connection.peer, exc)
            return False
        connection.session = replace(connection.session, principal=principal)
        log.debug("connection from %s on %s authenticated as %s", connection.peer, connection.session.listener, principal)
        return True

    async def _read(self, reader: FrameReader, connection: Connection) -> None:
        """Frames into answering tasks, in order; None queued last however reading ends (a stop cancels it)."""
        peer = connection.peer
        try:
            if connection.authenticator is not None and not await self._authenticate(reader, connection, connection.authenticator):
                return
            while (read := await self._request(reader, connection)) is not None:
                request, size = read
                connection.responses.put_nowait((asyncio.create_task(self._answer(request, connection, size)), size))
        except (FrameError, codec.MalformedRequestError) as exc:
            log.warning("connection from %s closed: %s", peer, exc)
        except asyncio.CancelledError:
            if connection.closed_for is None:  # the agent stopping; the sweep logged why it closed the connection otherwise
                raise
        except asyncio.IncompleteReadError as exc:
            log.warning("connection from %s closed by the client in the middle of a frame (%d bytes read)", peer, len(exc.partial))
        except ConnectionError as exc:  # a client that stops with answers unread resets it: ordinary (Kafka logs it at debug)
            log.info("connection from %s lost: %s", peer, exc)
        except ssl.SSLError as exc:  # TLS records that do not decrypt, or an alert from the client
            log.warning("connection from %s closed: TLS error: %s", peer, tls.ssl_reason(exc))
        finally:
            connection.responses.put_nowait(None)

    async def _authenticate(self, reader: FrameReader, connection: Connection, authenticator: SaslAuthenticator) -> bool:
        """Requests before SASL authentication completes, one at a time: the next is read only once the authenticator
        has answered the one before. Whether it completed (the connection's session then carries the principal)."""
        while authenticator.principal is None:
            if authenticator.failed or (read := await self._frame_read(reader, connection, MAX_RECEIVE_BYTES)) is None:
                return False
            frame, size = read
            # after SaslHandshake v0 the client sends bare tokens, not requests
            received = bytes(frame) if authenticator.unframed else codec.decode_request(frame, self.broker.serves, connection.session)
            answering = asyncio.create_task(self._authentication_step(received, connection, size, authenticator))
            connection.responses.put_nowait((answering, size))
            await asyncio.wait([answering])  # its failure is the sender's to log
            if answering.cancelled() or answering.exception() is not None:
                return False
        connection.session = replace(connection.session, principal=authenticator.principal, authenticated=True)
        connection.authenticator = None
        return True

    async def _request(self, reader: FrameReader, connection: Connection) -> tuple[codec.Request, int] | None:
        """The next request and its frame's size, its slot and bytes taken; None when the client closed between frames."""
        read = await self._frame_read(reader, connection)
        if read is None:
            return None
        frame, size = read
        return codec.decode_request(frame, self.broker.serves, connection.session), size

    async def _frame_read(self, reader: FrameReader, connection: Connection, limit: int | None = None) -> tuple[bytes | memoryview, int] | None:
        """The next frame and its size, its slot and bytes taken; None when the client closed between frames."""
        size = await self._frame_size(reader, connection, limit)
        if size is None:
            return None
        while (muted := connection.muted_until - asyncio.get_running_loop().time()) > 0:
            await asyncio.sleep(muted)  # waiting None meanwhile: the agent holds it up, the sweep leaves it be
        await connection.in_flight.acquire()
        await connection.held.take(size)
        try:
            frame = await self._frame(reader, connection, size)
        except BaseException:
            connection.held.give(size)
            raise
        connection.handling += size
        connection.requests_read += 1
        connection.unanswered += 1
        return frame, size

    async def _frame_size(self, reader: FrameReader, connection: Connection, limit: int | None = None) -> int | None:
        """The next frame's size from its prefix, or None when the client closed between frames; one over `limit`
        (what an unauthenticated client may send) or the agent's max frame size is FrameError."""
        connection.frame_waited = 0.0
        while reader.buffered < 4:
            if not await self._more(reader, connection, "frame" if reader.buffered else "request"):
                if not reader.buffered:
                    return None
                raise asyncio.IncompleteReadError(await reader.read(), 4)
        size = int.from_bytes(await reader.readexactly(4), "big", signed=True)
        if not 0 <= size <= self.settings.max_frame_bytes:
            raise FrameError(f"frame size {size} is outside 0 to {self.settings.max_frame_bytes} bytes (the agent's max frame size)")
        if limit is not None and size > limit:
            raise FrameError(f"frame size {size} is over {limit} bytes, the most a client may send before it authenticated "
                             "(Kafka's sasl.server.max.receive.size)")
        return size

    async def _frame(self, reader: FrameReader, connection: Connection, size: int) -> bytes | memoryview:
        """The frame's `size` bytes (a large frame's read straight into a buffer of its own: `FrameReader`). Its
        address's share of the agent's budget takes them as they arrive, so a frame that stops arriving holds only
        what it sent."""
        frame = object()
        taken = 0
        arrived = reader.start_frame(size)
        try:
            while True:
                if arrived > taken:
                    await connection.queued.take(arrived - taken, frame)
                    taken = arrived
                if taken == size:
                    break
                if not await self._more(reader, connection, "frame"):
                    raise asyncio.IncompleteReadError(reader.partial_frame(), size)
                arrived = reader.frame_arrived
        except BaseException:
            connection.queued.give(taken, frame)
            raise
        connection.queued.arrived(size, frame)
        return reader.end_frame()

    @staticmethod
    async def _more(reader: FrameReader, connection: Connection, waiting: Literal["request", "frame"]) -> bool:
        """Wait for more bytes from the client, False at the end of the stream; the sweep closes the connection if
        they are later than the bound of what it waits for. Time waiting within a frame adds up (`frame_waited`),
        time the agent holds the reader up (waiting for room) does not."""
        loop = asyncio.get_running_loop()
        connection.waiting, connection.waiting_since = waiting, loop.time()
        try:
            return await reader.more()
        finally:
            if waiting == "frame":
                connection.frame_waited += loop.time() - connection.waiting_since
            connection.waiting = None

    async def _sweep(self) -> None:
        """Close the connections past a time bound, as Kafka's brokers expire idle ones, with one log line each: a
        look every quarter of the shortest bound (within SWEEP_SECONDS) costs no timer per read."""
        settings, loop = self.settings, asyncio.get_running_loop()
        every = sweep_seconds(settings)
        while True:
            await asyncio.sleep(every)
            now = loop.time()
            for reading, connection in self._readers.items():
                if connection.closed_for is None and (expired := connection.expired(now, settings)) is not None:
                    connection.closed_for = expired
                    log.log(logging.INFO if expired.idle else logging.WARNING, "connection from %s closed: %s", connection.peer, expired.reason)
                    reading.cancel()
                    if expired.unread:  # its sender waits on answers the client will not take
                        connection.writer.transport.abort()

    async def _answer(self, request: codec.Request, connection: Connection, size: int) -> codec.FrameParts | None:
        """The response frame, or None for a request answered with none (Produce with acks=0). The request's bytes
        go back to the agent's budget as its handler ends; the answer's count in its connection's until written."""
        started = time.perf_counter()
        try:
            if request.body is None:
                response = api_versions.unsupported(self.broker)
            else:
                response = await self.broker.apis[request.api_key].handle(self.broker, request)
            self.metrics.answered(request, response, started)
            if throttle_ms := throttle_ms_of(response):
                connection.muted_until = max(connection.muted_until, asyncio.get_running_loop().time() + throttle_ms / 1000)
            frame = None if response is None or isinstance(response, Muted) else codec.encode_response_parts(request.correlation_id, response)
        finally:
            self._handled(connection, size)
        if frame is not None:
            connection.held.add(codec.frame_size(frame))
        return frame

    async def _authentication_step(self, received: codec.Request | bytes, connection: Connection, size: int,
                                   authenticator: SaslAuthenticator) -> codec.FrameParts | None:
        """`_answer` for what a connection sends before it authenticated: the authenticator's answer, None to close."""
        started = time.perf_counter()
        try:
            frame = await authenticator.answer(received)
        finally:
            self._handled(connection, size)
        if isinstance(received, codec.Request):  # counted and timed; its answer is a frame already, whose errors are not counted
            self.metrics.answered(received, None, started)
        if frame is not None:
            connection.held.add(len(frame))
        return None if frame is None else [frame]

    @staticmethod
    def _handled(connection: Connection, size: int) -> None:
        """A request's bytes back to the agent's budget as its handler ends."""
        if not connection.settled:
            connection.handling -= size
            connection.queued.give(size)

    async def _send(self, writer: asyncio.StreamWriter, connection: Connection) -> None:
        loop = asyncio.get_running_loop()
        while (queued := await connection.responses.get()) is not None:
            answering, size = queued
            try:
                frame = await answering
                if frame is not None:
                    write_frame(writer.transport, frame)
                    await self._drain(writer, connection)
            except ConnectionError as exc:  # the client stopped with answers unread: ordinary (Kafka logs it at debug)
                if connection.closed_for is None:  # else aborted by the sweep, which said why
                    log.info("connection from %s lost: %s", connection.peer, exc)
                break
            except Exception as exc:  # a failed handler: the client reconnects and retries; the agent goes on
                log.warning("connection from %s closed: its request failed: %s: %s", connection.peer, type(exc).__name__, exc)
                break
            connection.in_flight.release()
            connection.held.give(size + (codec.frame_size(frame) if frame is not None else 0))
            connection.unanswered -= 1
            connection.answered_at = loop.time()
        _cancel_queued(connection.responses)

    @staticmethod
    async def _drain(writer: asyncio.StreamWriter, connection: Connection) -> None:
        """Wait until the client has taken enough of what is written; the sweep aborts the connection if it takes
        none of it for the idle bound."""
        connection.sending, connection.unsent, connection.sent_at = True, writer.transport.get_write_buffer_size(), asyncio.get_running_loop().time()
        try:
            await writer.drain()
        finally:
            connection.sending = False


def sweep_seconds(settings: AgentSettings) -> float:
    """How often the sweep looks for connections past a time bound: a quarter of the shortest, within SWEEP_SECONDS."""
    shortest = min(settings.connection_setup_timeout_ms, settings.request_read_timeout_ms, settings.connections_max_idle_ms)
    low, high = SWEEP_SECONDS
    return min(high, max(low, shortest / 4000))


def _cancel_queued(responses: asyncio.Queue) -> None:
    while not responses.empty():
        queued = responses.get_nowait()
        if queued is not None:
            queued[0].cancel()


def _peer(writer: asyncio.StreamWriter) -> str:
    peer = writer.get_extra_info("peername")
    return str(Address(peer[0], peer[1])) if peer else "an unknown peer"


async def serve(catalog: Catalog, settings: AgentSettings, on_listening: Callable[[Broker, dict[str, Address], Address | None], None]) -> None:
    """Serve until SIGTERM or SIGINT, then stop as `AgentServer.stop` does. `on_listening` gets the broker, each listener's bound
    address by name and where /metrics is served (None when it is not)."""
    server = AgentServer(catalog, settings)
    await server.start()
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    # Not loop.add_signal_handler: it learns of a signal through the loop's wakeup socket, which threads' wakeups
    # (a byte per answered ingest call) fill while the loop is busy, and a signal that finds it full is lost. A
    # Python-level handler runs whatever the socket holds.
    def stop(_number: int, _frame: object) -> None:
        with contextlib.suppress(RuntimeError):  # the loop closed: a signal after the stop (a process group's, then its supervisor's)
            loop.call_soon_threadsafe(stopping.set)

    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, stop)
    on_listening(server.broker, server.addresses, server.metrics_address)
    await stopping.wait()
    await server.stop()


def run_agent(catalog: Catalog, settings: AgentSettings, on_listening: Callable[[Broker, dict[str, Address], Address | None], None]) -> None:
    keep_freed_memory()
    asyncio.run(serve(catalog, settings, on_listening))
