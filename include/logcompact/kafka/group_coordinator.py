"""Consumer groups' coordination, Kafka's classic rebalance protocol (GroupCoordinator), in this agent's memory
on the server's event loop.

One agent of the cluster coordinates a group: the live agent that the group id hashes to
(`AgentDirectory.coordinator_for`, the same answer on every agent); when the live agents change, a group may move,
and the agent that no longer coordinates it drops it from its memory and answers NOT_COORDINATOR, so its members
find the new coordinator. Its state machine is Kafka's:

* Empty (no members) -> PreparingRebalance when a member joins. Members rejoin (JoinGroup) within the rebalance
  timeout; each JoinGroup waits, parked as a future, until every known member has rejoined or the timeout drops
  those that did not. A group leaving Empty first waits `initial_rebalance_delay_ms`, extended while new members
  keep arriving (Kafka's group.initial.rebalance.delay.ms), so members starting together form one generation.
* -> CompletingRebalance: the generation is incremented, a protocol chosen by the members' votes, and every
  JoinGroup answered (the leader with the members' metadata). SyncGroups wait for the leader's assignments.
* -> Stable once the leader's SyncGroup brings them. A member whose heartbeats stop for its session timeout is
  removed; a member leaving, joining or changing its protocols sends the group back to PreparingRebalance.

JoinGroup v4+ without a member id gets MEMBER_ID_REQUIRED and an id to join with (KIP-394). Static members
(group.instance.id, KIP-345) keep their place across restarts: a rejoin with the same instance id takes a new
member id, fences the old one (FENCED_INSTANCE_ID) and, in a Stable group whose protocols did not change, gets
its assignment back without a rebalance.

Each state change writes the group's row (catalog `consumer_groups`: generation, protocol, leader, and each
member's ids, timeouts, protocols' metadata and assignment), behind the answers, one write at a time and newest
last, so ListGroups on any agent lists every group. The leader's assignments are the exception: as Kafka stores a
generation before answering its SyncGroups, the group turns Stable, and its members get their assignments, once the
row that holds them is written. A row the catalog fails to write, or does not write within `commit_timeout_ms`
(Kafka's offsets.commit.timeout.ms, which bounds a group's metadata append), is answered as Kafka answers such an
append: COORDINATOR_NOT_AVAILABLE to the SyncGroups, and a rebalance. A row the catalog failed to write is written
again `ROW_RETRY_BACKOFF_MS` later, or the group's newer row in its place.

The agent that coordinates the group next (restarted, or taking the group over when the live agents change) loads
the row on the group's first request, as Kafka's coordinator loads a group from __consumer_offsets: members keep
their ids, generation and assignments, and their commits in flight succeed; each member's session timeout (a
rebalance's timeout, for a group preparing one) restarts from the load. A coordinator writes a group's row only
while it is the one that last took it (`Catalog.save_group`): one that took the group over fences its writes
with the row it loaded until one is written, failed writes included; one that lost the group without knowing yet
finds its write refused and drops the group, so its successor's row stands; and a group dropped because it moved
takes its unwritten row with it.

Memory stays bounded whatever clients send (`GroupMemory`): a group that is Empty, without pending ids, leaves memory
once its newest row is written (the next request loads it from the row, generation and protocol type included);
a group holds at most `max_size` members and pending ids (Kafka's group.max.size); and all groups' members, with
their protocols' metadata, assignments and ids, hold at most `GroupMemory.limit` bytes. A JoinGroup past either
bound gets GROUP_MAX_SIZE_REACHED; a leader's SyncGroup whose assignments would pass the bytes is answered as Kafka
answers one whose group cannot be stored: UNKNOWN_SERVER_ERROR to every member, no assignment, a new rebalance.

Group hygiene, as Kafka's coordinator: DeleteGroups deletes an Empty group (`delete`: its offsets and row, and what
memory holds of it), OffsetDelete a group's offsets of the topics its members do not subscribe to (`delete_offsets`),
and every `offsets_retention_check_interval_ms` the offsets of the groups this agent coordinates expire past
`offsets_retention_ms` (Kafka's offsets.retention.minutes: `catalog.groups.expire_offsets` says which), a group
left Empty with none left with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from logcompact.catalog import Catalog
from logcompact.catalog.groups import Deletion, GroupRow, StoredMember
from logcompact.kafka.codec import ErrorCode
from logcompact.kafka.consumer_protocol import CONSUMER_PROTOCOL_TYPE, subscribed_topics
from logcompact.units import wall_clock_ms

log = logging.getLogger(__name__)

EMPTY, PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE, DEAD = "Empty", "PreparingRebalance", "CompletingRebalance", "Stable", "Dead"
# Kafka's group.initial.rebalance.delay.ms is 3 s; 1 s still gathers members started together into one
# generation, and keeps a group of 3 within 5 s from join to first record (bench/agent.py's target).
INITIAL_REBALANCE_DELAY_MS = 1000
# Kafka's group.min.session.timeout.ms is 6 s; 1 s lets a client detect failures faster if it asks to.
MIN_SESSION_TIMEOUT_MS = 1000
MAX_SESSION_TIMEOUT_MS = 1_800_000  # Kafka's group.max.session.timeout.ms
# Kafka's group.max.size is unbounded; the agent keeps every member (its metadata and assignment) in memory, and a
# group of more than 1,000 consumers is beyond what one coordinating agent is meant to serve.
DEFAULT_GROUP_MAX_SIZE = 1000
DEFAULT_GROUP_MAX_BYTES = 256 * 1024 * 1024
# What a member, a pending member id or a group costs beyond its bytes (its objects, dict entries, timer): each
# counts at least this, so the bytes bound bounds their numbers too.
OVERHEAD_BYTES = 1024
FULL_WARNING_INTERVAL_S = 10.0  # a client looping against a bound, or a failing catalog, logs one warning per interval, not one per request
LOADED_STATES = (PREPARING_REBALANCE, COMPLETING_REBALANCE, STABLE)  # a row's state a loaded group with members goes on in
# Kafka's offsets.commit.timeout.ms, which bounds the append of a group's metadata: SyncGroups waiting for the row
# with their assignments are answered COORDINATOR_NOT_AVAILABLE once it has not been written for this long.
OFFSETS_COMMIT_TIMEOUT_MS = 5000
# A row the catalog did not take (down, or refusing) is written again this long after: the writer waits, so a
# catalog that is down is tried once a second, not once per change.
ROW_RETRY_BACKOFF_MS = 1000
OFFSETS_RETENTION_MS = 7 * 24 * 3600 * 1000  # Kafka's offsets.retention.minutes, 7 days
OFFSETS_RETENTION_CHECK_INTERVAL_MS = 600_000  # Kafka's offsets.retention.check.interval.ms


@dataclass
class Joined:
    """A JoinGroup's answer; `members` only for the leader, with each member's metadata for the chosen protocol."""

    error: ErrorCode
    member_id: str
    generation: int = -1
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str = ""
    members: list[tuple[str, str | None, bytes]] = field(default_factory=list)
    skip_assignment: bool = False


@dataclass
class Synced:
    error: ErrorCode
    protocol_type: str | None = None
    protocol: str | None = None
    assignment: bytes = b""


@dataclass
class Member:
    member_id: str
    instance_id: str | None
    client_id: str
    session_ms: int
    rebalance_ms: int
    protocol_type: str
    protocols: list[tuple[str, bytes]]
    assignment: bytes = b""
    joining: asyncio.Future[Joined] | None = None
    syncing: asyncio.Future[Synced] | None = None
    expiry: asyncio.TimerHandle | None = None
    held: int = 0  # the bytes GroupMemory counts for it
    client_host: str = ""  # its JoinGroup's connection's address, as Kafka's DescribeGroups gives it ("/127.0.0.1")

    def size(self) -> int:
        """The bytes it holds: its ids, protocols' metadata and assignment, beyond the fixed overhead."""
        protocols = sum(len(name) + len(data) for name, data in self.protocols)
        ids = len(self.member_id) + len(self.instance_id or "") + len(self.client_id) + len(self.protocol_type) + len(self.client_host)
        return OVERHEAD_BYTES + ids + protocols + len(self.assignment)

    def metadata(self, protocol: str | None) -> bytes:
        return next((data for name, data in self.protocols if name == protocol), b"")


@dataclass
class Group:
    group_id: str
    state: str = EMPTY
    generation: int = 0
    protocol_type: str | None = None
    protocol: str | None = None
    leader: str | None = None
    members: dict[str, Member] = field(default_factory=dict)
    pending: dict[str, asyncio.TimerHandle] = field(default_factory=dict)  # ids given with MEMBER_ID_REQUIRED
    static: dict[str, str] = field(default_factory=dict)  # group.instance.id -> member id
    rebalance_timer: asyncio.TimerHandle | None = None
    initial_delay: bool = False  # waiting out the initial rebalance delay
    new_member_added: bool = False
    storing: bool = False  # the leader's assignments are being written: Stable once they are

    def candidate_protocols(self) -> set[str]:
        """The protocols every member supports."""
        names = [{name for name, _ in member.protocols} for member in self.members.values()]
        return set.intersection(*names) if names else set()

    def supports(self, protocol_type: str, protocols: Sequence[tuple[str, bytes]]) -> bool:
        if self.state == EMPTY or not self.members:
            return bool(protocol_type) and bool(protocols)
        return self.protocol_type == protocol_type and bool({name for name, _ in protocols} & self.candidate_protocols())

    def choose_protocol(self) -> str:
        """Each member votes for its first protocol that all support; the most votes win, ties to the earlier."""
        candidates = self.candidate_protocols()
        votes: dict[str, int] = {}
        for member in self.members.values():
            vote = next(name for name, _ in member.protocols if name in candidates)
            votes[vote] = votes.get(vote, 0) + 1
        return max(votes, key=lambda name: votes[name])

    def row(self, coordinator: int) -> GroupRow:
        members = tuple(StoredMember(m.member_id, m.instance_id, m.client_id, m.session_ms, m.rebalance_ms, tuple(m.protocols), m.assignment,
                                     m.client_host)
                        for m in self.members.values())
        return GroupRow(self.group_id, coordinator, self.generation, self.protocol_type or "", self.protocol or "",
                        STABLE if self.storing else self.state, self.leader or "", members, wall_clock_ms())


@dataclass
class Unsaved:
    """A group's row waiting for the writer: the newest, the group it describes and what waits for it to be written."""

    row: GroupRow
    group: Group
    waiting: list[asyncio.Future[bool]] = field(default_factory=list)


def _pending_size(member_id: str) -> int:
    return OVERHEAD_BYTES + len(member_id)


class GroupMemory:
    """The bytes the coordinator's groups hold: each group in memory, member and pending member id, counted here
    only, taken as they come and given back on every way out, so `held` is 0 once no group is in memory."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.held = 0

    def fits(self, more: int) -> bool:
        return self.held + more <= self.limit

    def group_in(self, groups: dict[str, Group], group: Group) -> None:
        groups[group.group_id] = group
        self.held += OVERHEAD_BYTES

    def group_out(self, groups: dict[str, Group], group: Group) -> None:
        """Take the group out of memory with all it holds (its members' and pending ids' bytes)."""
        del groups[group.group_id]
        for member in group.members.values():
            self.member_out(member)
        for member_id in group.pending:
            self.held -= _pending_size(member_id)
        self.held -= OVERHEAD_BYTES

    def member(self, member: Member) -> None:
        """Count the member as it is now (joined, or its protocols or assignment replaced)."""
        size = member.size()
        self.held += size - member.held
        member.held = size

    def member_out(self, member: Member) -> None:
        self.held -= member.held
        member.held = 0

    def pending_in(self, group: Group, member_id: str, expiry: asyncio.TimerHandle) -> None:
        group.pending[member_id] = expiry
        self.held += _pending_size(member_id)

    def pending_out(self, group: Group, member_id: str) -> None:
        group.pending.pop(member_id).cancel()
        self.held -= _pending_size(member_id)


class GroupCoordinator:
    """The groups this agent coordinates. Every method runs on the server's event loop."""

    def __init__(self, catalog: Catalog, node_id: int, initial_rebalance_delay_ms: int = INITIAL_REBALANCE_DELAY_MS,
                 max_size: int = DEFAULT_GROUP_MAX_SIZE, max_bytes: int = DEFAULT_GROUP_MAX_BYTES,
                 commit_timeout_ms: int = OFFSETS_COMMIT_TIMEOUT_MS, offsets_retention_ms: int = OFFSETS_RETENTION_MS,
                 offsets_retention_check_interval_ms: int = OFFSETS_RETENTION_CHECK_INTERVAL_MS) -> None:
        self.catalog = catalog
        self.node_id = node_id
        self.initial_rebalance_delay_ms = initial_rebalance_delay_ms
        self.max_size = max_size
        self.memory = GroupMemory(max_bytes)
        self.commit_timeout_ms = commit_timeout_ms
        self.offsets_retention_ms = offsets_retention_ms
        self.offsets_retention_check_interval_ms = offsets_retention_check_interval_ms
        self._groups: dict[str, Group] = {}
        self._unsaved: dict[str, Unsaved] = {}
        # The row of another coordinator each group was taken over from, which fences its writes until one is written.
        self._fences: dict[str, GroupRow] = {}
        self._writing: str | None = None  # the group whose row the writer is writing
        self._write_in_flight: asyncio.Future[bool] | None = None  # that write
        self._expiring: asyncio.Task | None = None
        self._last_full_warning = -FULL_WARNING_INTERVAL_S
        self._last_write_warning = -FULL_WARNING_INTERVAL_S
        self._wake_writer = asyncio.Event()
        self._writer: asyncio.Task | None = None
        self._writer_stopping = asyncio.Event()
        self._closed = False

    # -- groups in memory ------------------------------------------------------------------------------------

    async def group(self, group_id: str, create: bool) -> Group | None:
        """The group, loaded from its row when it is not in memory (with its members, when it has any); a new
        Empty group when there is none and `create`. When holding the group would pass the bytes bound, it is not
        kept: the request is answered from it (an Empty group of its generation), and JoinGroup refuses to join it."""
        group = self._groups.get(group_id)
        if group is not None:
            return group
        row = await asyncio.to_thread(self.catalog.group, group_id)
        group = self._groups.get(group_id)  # loaded by another request meanwhile
        if group is not None:
            return group
        if row is None and not create:
            return None
        group = Group(group_id)
        members: list[Member] = []
        if row is not None:
            group.generation, group.protocol_type = row.generation, row.protocol_type or None
            if row.state in LOADED_STATES:
                members = [_member_of(stored, row.protocol_type) for stored in row.members]
        if self._closed or self._over_bytes(OVERHEAD_BYTES + sum(member.size() for member in members), f"group {group_id}: loading it"):
            return group
        self.memory.group_in(self._groups, group)
        if row is not None and members:
            self._load(group, row, members)
        taken_over = row is not None and row.coordinator != self.node_id
        if row is None or taken_over or row.state != group.state:  # new, another's, or its members not kept
            self._save(group, loaded=row if taken_over else None)
        elif group.state == EMPTY:  # its row is saved: it leaves memory again unless this request gives it a member
            asyncio.get_running_loop().call_soon(self._maybe_unload, group_id)
        return group

    def _load(self, group: Group, row: GroupRow, members: list[Member]) -> None:
        """Go on with the group as its row left it, as Kafka's coordinator loading a group: the members' sessions,
        and a rebalance being prepared, restart from now."""
        group.state, group.protocol = row.state, row.protocol or None
        for member in members:
            group.members[member.member_id] = member
            self.memory.member(member)
            if member.instance_id is not None:
                group.static[member.instance_id] = member.member_id
            self._schedule_expiry(group, member)
        group.leader = row.leader if row.leader in group.members else members[0].member_id
        if group.state == PREPARING_REBALANCE:  # members rejoin, their JoinGroups lost with the coordinator
            group.rebalance_timer = asyncio.get_running_loop().call_later(self._rebalance_ms(group) / 1000, self._complete_join, group)
        log.info("group %s: loaded generation %d (%s) with %d members from the catalog, written by agent %d",
                 group.group_id, group.generation, group.state, len(members), row.coordinator)

    def known(self, group_id: str) -> Group | None:
        return self._groups.get(group_id)

    def all_groups(self) -> list[Group]:
        return list(self._groups.values())

    def forget(self, group_id: str) -> None:
        """Drop a group this agent no longer coordinates: its waiting members are told NOT_COORDINATOR, and its row
        not written yet never is (written after the new coordinator loaded the group, it would refuse that one's
        takeover; after its first write, be refused and drop the group here again)."""
        group = self._groups.get(group_id)
        if group is not None:
            self._abandon(group, ErrorCode.not_coordinator)
        self._fences.pop(group_id, None)
        queued = self._unsaved.pop(group_id, None)
        for waiting in queued.waiting if queued else []:
            _answer(waiting, False)

    async def close(self) -> None:
        """The agent stops: waiting JoinGroups and SyncGroups answer NOT_COORDINATOR (clients look for the
        coordinator again), then the descriptions not yet written are."""
        self._closed = True
        if self._expiring is not None:
            self._expiring.cancel()
            await asyncio.gather(self._expiring, return_exceptions=True)
        for group in list(self._groups.values()):
            self._abandon(group, ErrorCode.not_coordinator)
        if self._writer is not None:
            self._writer_stopping.set()
            self._wake_writer.set()
            await self._writer

    def _abandon(self, group: Group, error: ErrorCode) -> None:
        """Take the group out of memory, its timers stopped and its waiting requests answered with `error`."""
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        for timer in group.pending.values():
            timer.cancel()
        for member in group.members.values():
            if member.expiry is not None:
                member.expiry.cancel()
            _answer(member.joining, Joined(error, member.member_id))
            _answer(member.syncing, Synced(error))
        self.memory.group_out(self._groups, group)

    def _maybe_unload(self, group_id: str) -> None:
        """An Empty group with nothing pending leaves memory once its newest row is written (Kafka keeps Empty
        groups until their offsets expire; here the row keeps what the group needs: its generation, protocol type
        and state for ListGroups and DescribeGroups)."""
        group = self._groups.get(group_id)
        if group is None or group.state != EMPTY or group.members or group.pending:
            return
        if group_id in self._unsaved or group_id == self._writing:
            return  # the writer unloads it once its row is written
        self.memory.group_out(self._groups, group)

    # -- bounds ----------------------------------------------------------------------------------------------

    def _admits(self, group: Group, member_id: str) -> bool:
        """Kafka's acceptJoiningMember, with pending member ids counted as members (each is memory held for up to
        its session timeout): a member already counted joins again; a new one only while the group holds fewer
        than `max_size`. While a rebalance is prepared only the members that rejoined count, so of a group over
        the size the last to rejoin are the ones refused."""
        if member_id in group.pending:
            return True
        known = group.members.get(member_id)
        if known is not None and (group.state != PREPARING_REBALANCE or known.joining is not None):
            return True
        counted = sum(m.joining is not None for m in group.members.values()) if group.state == PREPARING_REBALANCE else len(group.members)
        return counted + len(group.pending) < self.max_size

    def _over_bytes(self, more: int, what: str) -> bool:
        if self.memory.fits(more):
            return False
        now = time.monotonic()
        if now - self._last_full_warning >= FULL_WARNING_INTERVAL_S:
            self._last_full_warning = now
            log.warning("%s refused: consumer groups hold %d bytes of this agent's group_max_bytes %d; raise --group-max-bytes", what, self.memory.held, self.memory.limit)
        return True

    def _refuse(self, group: Group, member_id: str) -> Joined:
        """GROUP_MAX_SIZE_REACHED, as Kafka answers it (no member id); a member or pending id refused is removed,
        as Kafka does."""
        known = group.members.get(member_id)
        if known is not None:
            self._remove(group, known, "was refused: the group is full")
        elif member_id in group.pending:
            self.memory.pending_out(group, member_id)
            self._maybe_complete_join(group)
        self._maybe_unload(group.group_id)
        return Joined(ErrorCode.group_max_size_reached, "")

    # -- JoinGroup -------------------------------------------------------------------------------------------

    async def join(
        self, group: Group, member_id: str, instance_id: str | None, client_id: str, session_ms: int, rebalance_ms: int,
        protocol_type: str, protocols: list[tuple[str, bytes]], require_known_member_id: bool, skip_assignment_allowed: bool,
        client_host: str = "",
    ) -> Joined:
        if self._closed:
            return Joined(ErrorCode.not_coordinator, member_id)
        if self._groups.get(group.group_id) is not group:  # not kept: holding it would pass the bytes bound
            self._over_bytes(OVERHEAD_BYTES, f"group {group.group_id}: a JoinGroup")
            return Joined(ErrorCode.group_max_size_reached, "")
        if not group.supports(protocol_type, protocols):
            return Joined(ErrorCode.inconsistent_group_protocol, member_id)
        member = Member(member_id, instance_id, client_id, session_ms, rebalance_ms, protocol_type, protocols, client_host=client_host)
        if not member_id:
            member.member_id = f"{instance_id or client_id}-{uuid.uuid4()}"
            # a static member restarting takes its old place, counted already: never refused for the size
            if not self._admits(group, group.static.get(instance_id, "") if instance_id is not None else ""):
                return self._refuse(group, "")
            if instance_id is not None:
                return await self._join_static(group, member, skip_assignment_allowed)
            if require_known_member_id:  # KIP-394: the id comes back with MEMBER_ID_REQUIRED, the member joins with it
                if self._over_bytes(_pending_size(member.member_id), f"group {group.group_id}: a JoinGroup"):
                    return self._refuse(group, "")
                loop = asyncio.get_running_loop()
                self.memory.pending_in(group, member.member_id, loop.call_later(session_ms / 1000, self._expire_pending, group, member.member_id))
                return Joined(ErrorCode.member_id_required, member.member_id)
            if self._over_bytes(member.size(), f"group {group.group_id}: a JoinGroup"):
                return self._refuse(group, "")
            return await self._add_and_rebalance(group, member)
        if instance_id is not None and group.static.get(instance_id, member_id) != member_id:
            return Joined(ErrorCode.fenced_instance_id, member_id)
        if not self._admits(group, member_id):
            return self._refuse(group, member_id)
        if member_id in group.pending:
            if self._over_bytes(member.size() - _pending_size(member_id), f"group {group.group_id}: a JoinGroup"):
                return self._refuse(group, member_id)
            self.memory.pending_out(group, member_id)
            return await self._add_and_rebalance(group, member)
        known = group.members.get(member_id)
        if known is None:
            return Joined(ErrorCode.unknown_member_id, member_id)
        changed = known.protocols != protocols
        member.assignment = known.assignment
        if self._over_bytes(member.size() - known.held, f"group {group.group_id}: a JoinGroup"):
            return self._refuse(group, member_id)
        _update(known, member)
        self.memory.member(known)
        if group.state == COMPLETING_REBALANCE and not changed:  # its JoinGroup answer was lost: the same again
            return self._joined(group, known)
        if group.state == STABLE and not changed and group.leader != member_id:
            return self._joined(group, known)
        return await self._rejoin(group, known)

    async def _join_static(self, group: Group, member: Member, skip_assignment_allowed: bool) -> Joined:
        assert member.instance_id is not None
        old_id = group.static.get(member.instance_id)
        if old_id is None:
            if self._over_bytes(member.size(), f"group {group.group_id}: a JoinGroup"):
                return self._refuse(group, "")
            group.static[member.instance_id] = member.member_id
            return await self._add_and_rebalance(group, member)
        # The instance restarted (or a second process took its id): the newcomer takes the old member's place.
        old = group.members[old_id]
        member.assignment = old.assignment
        if self._over_bytes(member.size() - old.held, f"group {group.group_id}: a JoinGroup"):
            return self._refuse(group, old_id)
        del group.members[old_id]
        self.memory.member_out(old)
        _answer(old.joining, Joined(ErrorCode.fenced_instance_id, old_id))
        _answer(old.syncing, Synced(ErrorCode.fenced_instance_id))
        if old.expiry is not None:
            old.expiry.cancel()
        changed = old.protocols != member.protocols
        group.members[member.member_id] = member
        self.memory.member(member)
        group.static[member.instance_id] = member.member_id
        if group.leader == old_id:
            group.leader = member.member_id
        self._save(group)
        if group.state == STABLE and not changed:
            self._schedule_expiry(group, member)
            joined = self._joined(group, member)
            leader = group.leader == member.member_id
            # KIP-814: a leader told to skip the assignment keeps the current one; before v9 it gets no members
            joined.skip_assignment = leader and skip_assignment_allowed
            if leader and not skip_assignment_allowed:
                joined.members = []
            return joined
        return await self._rejoin(group, member)

    async def _add_and_rebalance(self, group: Group, member: Member) -> Joined:
        if not group.members:  # the first member sets the group's protocol type, the others must share it
            group.protocol_type = member.protocol_type
        group.members[member.member_id] = member
        self.memory.member(member)
        if group.leader is None:
            group.leader = member.member_id
        if group.initial_delay:
            group.new_member_added = True
        return await self._rejoin(group, member)

    async def _rejoin(self, group: Group, member: Member) -> Joined:
        if member.expiry is not None:  # a member waiting for its JoinGroup answer is kept by the rebalance timeout
            member.expiry.cancel()
            member.expiry = None
        if self._closed:
            return Joined(ErrorCode.not_coordinator, member.member_id)
        _answer(member.joining, Joined(ErrorCode.rebalance_in_progress, member.member_id))  # a JoinGroup sent again
        member.joining = asyncio.get_running_loop().create_future()
        waiting = member.joining
        if group.state == PREPARING_REBALANCE:
            self._maybe_complete_join(group)
        else:
            self._prepare_rebalance(group, f"member {member.member_id} joined")
        return await waiting

    def _joined(self, group: Group, member: Member) -> Joined:
        leader = group.leader == member.member_id
        members = [(m.member_id, m.instance_id, m.metadata(group.protocol)) for m in group.members.values()] if leader else []
        return Joined(ErrorCode.none, member.member_id, group.generation, group.protocol_type, group.protocol, group.leader or "", members)

    # -- rebalancing -----------------------------------------------------------------------------------------

    def _prepare_rebalance(self, group: Group, reason: str) -> None:
        log.info("group %s: preparing to rebalance in state %s with old generation %d (%s)", group.group_id, group.state, group.generation, reason)
        if group.state == COMPLETING_REBALANCE:  # the assignments of this generation will never come
            self._reset_assignments(group, ErrorCode.rebalance_in_progress)
        loop = asyncio.get_running_loop()
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
        if group.state == EMPTY and self.initial_rebalance_delay_ms > 0:
            group.initial_delay, group.new_member_added = True, False
            delay = self.initial_rebalance_delay_ms
            remaining = max(self._rebalance_ms(group) - delay, 0)
            group.rebalance_timer = loop.call_later(delay / 1000, self._initial_delay_over, group, remaining)
        else:
            group.rebalance_timer = loop.call_later(self._rebalance_ms(group) / 1000, self._complete_join, group)
        group.state = PREPARING_REBALANCE
        self._save(group)
        self._maybe_complete_join(group)

    def _rebalance_ms(self, group: Group) -> int:
        return max((member.rebalance_ms for member in group.members.values()), default=0)

    def _initial_delay_over(self, group: Group, remaining_ms: int) -> None:
        """Kafka's InitialDelayedJoin: while members keep arriving, wait another delay, up to the rebalance timeout."""
        if group.new_member_added and remaining_ms > 0:
            group.new_member_added = False
            delay = min(self.initial_rebalance_delay_ms, remaining_ms)
            group.rebalance_timer = asyncio.get_running_loop().call_later(delay / 1000, self._initial_delay_over, group, remaining_ms - delay)
            return
        group.initial_delay = False
        self._complete_join(group)

    def _maybe_complete_join(self, group: Group) -> None:
        if group.state != PREPARING_REBALANCE or group.initial_delay or group.pending:
            return
        if all(member.joining is not None for member in group.members.values()):
            self._complete_join(group)

    def _complete_join(self, group: Group) -> None:
        """Every member rejoined, or the rebalance timeout passed: those that did not are dropped and a new
        generation starts."""
        if group.state != PREPARING_REBALANCE or self._groups.get(group.group_id) is not group:
            return
        if group.rebalance_timer is not None:
            group.rebalance_timer.cancel()
            group.rebalance_timer = None
        group.initial_delay = False
        for member_id in list(group.pending):
            self.memory.pending_out(group, member_id)
        for member in [m for m in group.members.values() if m.joining is None]:
            self._drop(group, member)
        group.generation += 1
        if not group.members:
            group.state, group.protocol, group.leader = EMPTY, None, None
            self._save(group)
            return
        group.state = COMPLETING_REBALANCE
        group.protocol = group.choose_protocol()
        log.info("group %s: generation %d stabilized with %d members", group.group_id, group.generation, len(group.members))
        if group.leader not in group.members:
            group.leader = next(iter(group.members))
        for member in group.members.values():
            _answer(member.joining, self._joined(group, member))
            member.joining = None
            self._schedule_expiry(group, member)
        self._save(group)

    # -- SyncGroup, Heartbeat, LeaveGroup --------------------------------------------------------------------

    def member_error(self, group: Group | None, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Kafka's check of a request's member: UNKNOWN_MEMBER_ID, or FENCED_INSTANCE_ID for a static member
        whose id another instance took."""
        if group is None:
            return ErrorCode.unknown_member_id
        if instance_id is not None and instance_id in group.static and group.static[instance_id] != member_id:
            return ErrorCode.fenced_instance_id
        if member_id not in group.members:
            return ErrorCode.unknown_member_id
        return None

    async def sync(self, group: Group | None, generation: int, member_id: str, instance_id: str | None,
                   protocol_type: str | None, protocol: str | None, assignments: Mapping[str, bytes]) -> Synced:
        error = self.member_error(group, member_id, instance_id)
        if error is not None:
            return Synced(error)
        assert group is not None
        if generation != group.generation:
            return Synced(ErrorCode.illegal_generation)
        if (protocol_type is not None and protocol_type != group.protocol_type) or (protocol is not None and protocol != group.protocol):
            return Synced(ErrorCode.inconsistent_group_protocol)
        member = group.members[member_id]
        if group.state == PREPARING_REBALANCE:
            return Synced(ErrorCode.rebalance_in_progress)
        self._schedule_expiry(group, member)
        if group.state == STABLE:
            return Synced(ErrorCode.none, group.protocol_type, group.protocol, member.assignment)
        if self._closed:
            return Synced(ErrorCode.not_coordinator)
        if member_id == group.leader:
            growth = sum(len(assignments.get(each.member_id, b"")) - len(each.assignment) for each in group.members.values())
            if self._over_bytes(growth, f"group {group.group_id}: the assignments of generation {group.generation}"):
                # Kafka's answer to assignments it cannot store: UNKNOWN_SERVER_ERROR to all, none kept, a new rebalance
                self._reset_assignments(group, ErrorCode.unknown_server_error)
                self._prepare_rebalance(group, f"the assignments from leader {member_id} could not be kept")
                return Synced(ErrorCode.unknown_server_error)
        _answer(member.syncing, Synced(ErrorCode.rebalance_in_progress))
        member.syncing = asyncio.get_running_loop().create_future()
        waiting = member.syncing
        if member_id == group.leader and not group.storing:
            for each in group.members.values():
                each.assignment = assignments.get(each.member_id, b"")
                self.memory.member(each)
            group.storing = True
            log.info("group %s: assignment of generation %d received from leader %s", group.group_id, group.generation, member_id)
            self._store_assignments(group)
        return await waiting

    def _store_assignments(self, group: Group) -> None:
        """Queue the row holding the leader's assignments; its SyncGroups are answered once it is written, or once
        it has not been for `commit_timeout_ms`, as Kafka bounds a group's metadata append by offsets.commit.timeout.ms."""
        generation = group.generation
        written = self._save_and_wait(group)
        expiry = asyncio.get_running_loop().call_later(self.commit_timeout_ms / 1000, self._store_timed_out, group, generation, written)

        def stored(done: asyncio.Future[bool]) -> None:
            expiry.cancel()
            self._assignments_stored(group, generation, done.result())

        written.add_done_callback(stored)

    def _store_timed_out(self, group: Group, generation: int, written: asyncio.Future[bool]) -> None:
        if written.done() or not self._storing(group, generation):
            return
        log.warning("group %s: the row with the assignments of generation %d was not written to the catalog within %d ms "
                    "(offsets.commit.timeout.ms): its SyncGroups are answered COORDINATOR_NOT_AVAILABLE", group.group_id, generation,
                    self.commit_timeout_ms)
        _answer(written, False)  # the write goes on: a newer row of the group follows it

    def _storing(self, group: Group, generation: int) -> bool:
        """Whether the group still waits for the row with the assignments of `generation` (no rebalance, not dropped)."""
        return group.storing and group.generation == generation and self._groups.get(group.group_id) is group

    def _assignments_stored(self, group: Group, generation: int, written: bool) -> None:
        """The row with the leader's assignments is written (or not, or not in time): the group turns Stable and its
        members get their assignments, as Kafka answers SyncGroups once the group is stored, unless the group moved on
        meanwhile (a rebalance, or dropped)."""
        if not self._storing(group, generation):
            return
        group.storing = False
        if not written:  # Kafka's answer to a group metadata append that failed or timed out (appendGroupMetadataErrorToResponseError)
            self._reset_assignments(group, ErrorCode.coordinator_not_available)
            self._prepare_rebalance(group, f"the assignments of generation {generation} were not written to the catalog")
            return
        group.state = STABLE
        for each in group.members.values():
            _answer(each.syncing, Synced(ErrorCode.none, group.protocol_type, group.protocol, each.assignment))
            each.syncing = None

    def _reset_assignments(self, group: Group, error: ErrorCode) -> None:
        """Kafka's resetAndPropagateAssignmentError: no member keeps an assignment, waiting SyncGroups get `error`."""
        group.storing = False
        for member in group.members.values():
            member.assignment = b""
            self.memory.member(member)
            _answer(member.syncing, Synced(error))
            member.syncing = None

    def heartbeat(self, group: Group | None, generation: int, member_id: str, instance_id: str | None) -> ErrorCode:
        error = self.member_error(group, member_id, instance_id)
        if error is not None:
            return error
        assert group is not None
        if generation != group.generation:
            return ErrorCode.illegal_generation
        self._schedule_expiry(group, group.members[member_id])
        return ErrorCode.rebalance_in_progress if group.state == PREPARING_REBALANCE else ErrorCode.none

    def leave(self, group: Group | None, member_id: str, instance_id: str | None) -> ErrorCode:
        if group is None:
            return ErrorCode.unknown_member_id
        if instance_id is not None:  # by instance id; an admin's removal names no member id
            found = group.static.get(instance_id)
            if found is None:
                return ErrorCode.unknown_member_id
            if member_id and found != member_id:
                return ErrorCode.fenced_instance_id
            member_id = found
        if member_id in group.pending:
            self.memory.pending_out(group, member_id)
            self._maybe_complete_join(group)
            self._maybe_unload(group.group_id)
            return ErrorCode.none
        member = group.members.get(member_id)
        if member is None:
            return ErrorCode.unknown_member_id
        self._remove(group, member, "left the group")
        return ErrorCode.none

    # -- deleting groups and offsets, offsets' retention ---------------------------------------------------------

    async def delete(self, group_id: str) -> ErrorCode:
        """Kafka's DeleteGroups of a group this agent coordinates: an Empty group leaves memory, then its offsets and
        row are deleted; NON_EMPTY_GROUP for one with members (here, or in its row), GROUP_ID_NOT_FOUND for none."""
        group = await self.group(group_id, create=False)
        if group is not None and (group.state != EMPTY or group.members):
            return ErrorCode.non_empty_group
        self.forget(group_id)  # its pending member ids go with it: their JoinGroups find no group and join anew
        if self._writing == group_id and self._write_in_flight is not None:  # a row being written would bring it back
            await asyncio.wait([self._write_in_flight])
        deleted = await asyncio.to_thread(self.catalog.delete_group, group_id)
        if deleted is Deletion.DELETED:
            log.info("group %s: deleted, with its committed offsets (DeleteGroups)", group_id)
        return {Deletion.DELETED: ErrorCode.none, Deletion.NOT_FOUND: ErrorCode.group_id_not_found, Deletion.NOT_EMPTY: ErrorCode.non_empty_group}[deleted]

    async def delete_offsets(self, group_id: str, partitions: Collection[tuple[str, int]]) -> tuple[ErrorCode, frozenset[str]]:
        """Kafka's OffsetDelete for a group this agent coordinates: the group's offsets of these partitions deleted,
        but for the topics its members subscribe to, which keep theirs (their partitions are answered
        GROUP_SUBSCRIBED_TO_TOPIC). The group's error and those topics: GROUP_ID_NOT_FOUND for a group that does not
        exist, NON_EMPTY_GROUP for one with members that are not Kafka consumers (whose subscriptions are not known)."""
        group = await self.group(group_id, create=False)
        subscribed: frozenset[str] = frozenset()
        if group is not None and group.state != EMPTY:
            if group.protocol_type != CONSUMER_PROTOCOL_TYPE:
                return ErrorCode.non_empty_group, subscribed
            metadata = (member.metadata(group.protocol) for member in group.members.values())
            subscribed = subscribed_topics(group.protocol_type, group.protocol, metadata) or subscribed
        deletable = [(topic, partition) for topic, partition in partitions if topic not in subscribed]
        found = await asyncio.to_thread(self.catalog.delete_offsets, group_id, deletable)
        if not found and group is None:
            return ErrorCode.group_id_not_found, subscribed
        return ErrorCode.none, subscribed

    def start(self, coordinates: Callable[[str], bool]) -> None:
        """Expire offsets every offsets_retention_check_interval_ms, of the groups `coordinates` says are this agent's."""
        self._expiring = asyncio.create_task(self._expire_offsets_every(coordinates))

    async def _expire_offsets_every(self, coordinates: Callable[[str], bool]) -> None:
        while True:
            await asyncio.sleep(self.offsets_retention_check_interval_ms / 1000)
            try:
                await self.expire_offsets(coordinates)
            except Exception as exc:  # the catalog down or failing: the next interval tries again
                log.warning("committed offsets past offsets.retention.minutes not expired: %s; tried again in %d ms",
                            exc, self.offsets_retention_check_interval_ms)

    async def expire_offsets(self, coordinates: Callable[[str], bool]) -> int:
        """Delete the offsets past the retention of the groups this agent coordinates, and the groups left Empty with
        none left (`catalog.groups.expire_offsets`), skipping those this agent holds in a rebalance (their rows lag
        behind); returns how many offsets were deleted."""
        cutoff_ms = wall_clock_ms() - self.offsets_retention_ms
        removed = 0
        for group_id in await asyncio.to_thread(self.catalog.group_ids):
            held = self._groups.get(group_id)
            if not coordinates(group_id) or (held is not None and held.state not in (EMPTY, STABLE)):
                continue
            expired = await asyncio.to_thread(self.catalog.expire_offsets, group_id, cutoff_ms, _subscribed_of_row)
            if expired:
                log.info("group %s: %d committed offsets expired (offsets.retention.minutes)", group_id, expired)
            removed += expired
        return removed

    # -- offsets ---------------------------------------------------------------------------------------------

    def commit_error(self, group: Group | None, generation: int, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Whether an OffsetCommit may write, as Kafka decides: a commit naming a generation or member must come
        from a current member of the current generation; one naming neither (a consumer that assigns its own
        partitions) only to a group without members."""
        if generation >= 0 or member_id or instance_id is not None:
            if group is None:
                return ErrorCode.illegal_generation
            error = self.member_error(group, member_id, instance_id)
            if error is not None:
                return error
            if generation != group.generation:
                return ErrorCode.illegal_generation
            if group.state == COMPLETING_REBALANCE:
                return ErrorCode.rebalance_in_progress
            self._schedule_expiry(group, group.members[member_id])
            return None
        if group is not None and group.state != EMPTY:
            return ErrorCode.unknown_member_id
        return None

    def txn_commit_error(self, group: Group | None, generation: int, member_id: str, instance_id: str | None) -> ErrorCode | None:
        """Whether a TxnOffsetCommit may write, as Kafka's validateOffsetCommit decides for a transactional commit:
        one with no generation to an Empty group (or none) always may; one naming a generation or member (v3, KIP-447)
        must come from a current member of the current generation (a group that does not exist: ILLEGAL_GENERATION,
        as Kafka's OffsetMetadataManager answers it). Unlike OffsetCommit, a commit naming neither may write to a
        group with members (v0-2 name none), and a rebalance does not refuse it."""
        if generation < 0 and (group is None or group.state == EMPTY):
            return None
        if group is None and generation >= 0:
            return ErrorCode.illegal_generation
        if generation >= 0 or member_id or instance_id is not None:
            error = self.member_error(group, member_id, instance_id)
            if error is not None:
                return error
            assert group is not None
            if generation != group.generation:
                return ErrorCode.illegal_generation
        return None

    # -- members' sessions -----------------------------------------------------------------------------------

    def _schedule_expiry(self, group: Group, member: Member) -> None:
        if member.expiry is not None:
            member.expiry.cancel()
        member.expiry = asyncio.get_running_loop().call_later(member.session_ms / 1000, self._expire, group, member.member_id)

    def _expire(self, group: Group, member_id: str) -> None:
        member = group.members.get(member_id)
        if member is None or self._groups.get(group.group_id) is not group:
            return
        member.expiry = None
        if member.joining is not None or member.syncing is not None:
            return  # waiting for the group: the rebalance decides its fate
        self._remove(group, member, f"sent no heartbeat for {member.session_ms} ms")

    def _expire_pending(self, group: Group, member_id: str) -> None:
        if member_id in group.pending and self._groups.get(group.group_id) is group:
            self.memory.pending_out(group, member_id)
            self._maybe_complete_join(group)
            self._maybe_unload(group.group_id)

    def _drop(self, group: Group, member: Member) -> None:
        """Take a member out: its waiting requests answer UNKNOWN_MEMBER_ID."""
        if member.expiry is not None:
            member.expiry.cancel()
        _answer(member.joining, Joined(ErrorCode.unknown_member_id, member.member_id))
        _answer(member.syncing, Synced(ErrorCode.unknown_member_id))
        del group.members[member.member_id]
        self.memory.member_out(member)
        if member.instance_id is not None and group.static.get(member.instance_id) == member.member_id:
            del group.static[member.instance_id]
        if group.leader == member.member_id:
            group.leader = next(iter(group.members), None)

    def _remove(self, group: Group, member: Member, reason: str) -> None:
        self._drop(group, member)
        if group.state in (STABLE, COMPLETING_REBALANCE):
            self._prepare_rebalance(group, f"member {member.member_id} {reason}")
        elif group.state == PREPARING_REBALANCE:
            self._maybe_complete_join(group)

    # -- description rows ------------------------------------------------------------------------------------

    def _save(self, group: Group, loaded: GroupRow | None = None) -> Unsaved:
        """Queue the group's row for the catalog; the writer writes the newest of each group, in order. `loaded`:
        the row of another coordinator this agent loaded the group from, which fences its writes until one is written."""
        if loaded is not None:
            self._fences[group.group_id] = loaded
        queued = self._unsaved.get(group.group_id)
        unsaved = Unsaved(group.row(self.node_id), group, queued.waiting if queued else [])
        self._unsaved[group.group_id] = unsaved
        self._wake_writer.set()
        if self._writer is None:
            self._writer = asyncio.create_task(self._write_rows())
        return unsaved

    def _save_and_wait(self, group: Group) -> asyncio.Future[bool]:
        """Queue the group's row; the future says whether it (or a newer row of the group) was written."""
        written = asyncio.get_running_loop().create_future()
        self._save(group).waiting.append(written)
        return written

    async def _write_rows(self) -> None:
        while True:
            await self._wake_writer.wait()
            self._wake_writer.clear()
            while self._unsaved:
                if await self._write_next() and not self._writer_stopping.is_set():
                    with contextlib.suppress(TimeoutError):  # the catalog is given time, unless the agent stops
                        await asyncio.wait_for(self._writer_stopping.wait(), ROW_RETRY_BACKOFF_MS / 1000)
            if self._writer_stopping.is_set():
                return

    async def _write_next(self) -> bool:
        """Write the first queued row, fenced by the row its group was taken over from until one is written; returns
        whether it failed and its group's row is queued again."""
        group_id = next(iter(self._unsaved))
        unsaved = self._unsaved.pop(group_id)
        fence = self._fences.get(group_id)
        self._writing = group_id
        self._write_in_flight = writing = asyncio.ensure_future(asyncio.to_thread(self.catalog.save_group, unsaved.row, fence))
        try:
            written = await writing
        except Exception as exc:  # the catalog down or failing: the fence stays, the row is written again
            for waiting in unsaved.waiting:
                _answer(waiting, False)
            return self._write_failed(unsaved, exc)
        finally:
            self._writing, self._write_in_flight = None, None
        held = self._groups.get(group_id) is unsaved.group
        if not written and held:
            self._lost(group_id)
        for waiting in unsaved.waiting:
            _answer(waiting, written)
        if written:
            if fence is not None and self._fences.get(group_id) is fence:
                del self._fences[group_id]
            self._maybe_unload(group_id)
        return False

    def _write_failed(self, unsaved: Unsaved, exc: Exception) -> bool:
        """The group's row was not written: the group, still here, queues its newest row again (and stays in memory
        till one is written). While the catalog fails, one warning per interval, the other failures at DEBUG; a row
        given up (the group dropped, the agent stopping) always warns."""
        group = unsaved.group
        again = self._groups.get(group.group_id) is group and not self._writer_stopping.is_set()
        now = time.monotonic()
        level = logging.DEBUG
        if not again or now - self._last_write_warning >= FULL_WARNING_INTERVAL_S:
            level = logging.WARNING
            self._last_write_warning = now
        log.log(level, "group %s: its row was not written to the catalog: %s%s", group.group_id, exc,
                f"; written again in {ROW_RETRY_BACKOFF_MS} ms (one such warning per {FULL_WARNING_INTERVAL_S:.0f} s)" if again else "")
        if again:
            self._save(group)
        return again

    def _lost(self, group_id: str) -> None:
        """Another coordinator wrote the group's row since this agent took the group: the group is its now. Drop it
        with what is queued for it; its members, told NOT_COORDINATOR, find the coordinator again."""
        log.info("group %s: another agent coordinates it now (it wrote the group's row): dropped from this agent's memory", group_id)
        self.forget(group_id)


def _subscribed_of_row(row: GroupRow) -> frozenset[str] | None:
    metadata = (next((data for name, data in member.protocols if name == row.protocol), b"") for member in row.members)
    return subscribed_topics(row.protocol_type, row.protocol, metadata)


def _member_of(stored: StoredMember, protocol_type: str) -> Member:
    return Member(stored.member_id, stored.instance_id, stored.client_id, stored.session_ms, stored.rebalance_ms, protocol_type,
                  list(stored.protocols), stored.assignment, client_host=stored.client_host)


def _update(member: Member, joining: Member) -> None:
    member.client_id, member.session_ms, member.rebalance_ms = joining.client_id, joining.session_ms, joining.rebalance_ms
    member.protocol_type, member.protocols, member.client_host = joining.protocol_type, joining.protocols, joining.client_host


def _answer(waiting: asyncio.Future | None, result: Any) -> None:
    """Answer a parked request unless it is answered already or its connection went away (cancelled)."""
    if waiting is not None and not waiting.done():
        waiting.set_result(result)

