"""A group's coordinator restarts or moves: the group goes on with its members.

A group of 3 confluent-kafka consumers commits after each record while the agent coordinating it is killed with
SIGKILL and started again on its address 4 times: no commit is refused with UNKNOWN_MEMBER_ID and every record is
delivered once. Then the coordinator itself: a loaded group keeps its members' ids, generation, leader, protocol and
assignments, a member that sends nothing after the load expires a session timeout after it, and an agent that lost
the group to another finds its write refused and drops the group. Then the coordinator's writes meeting a failing or
slow catalog: a takeover keeps its fence across failed writes and writes its rows again, a group that moved takes its
unwritten row with it, and SyncGroups wait for their row at most offsets.commit.timeout.ms.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import socket
import threading
import time
import zlib
from dataclasses import replace
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from sqlalchemy import Connection, update

from logcompact.catalog import Catalog, schema
from logcompact.catalog.database import WRITE
from logcompact.catalog.groups import GroupRow, StoredMember
from logcompact.consume import read_records
from logcompact.exceptions import CatalogUnavailableError
from logcompact.kafka.codec import ErrorCode
from logcompact.kafka.group_coordinator import COMPLETING_REBALANCE, OVERHEAD_BYTES, PREPARING_REBALANCE, ROW_RETRY_BACKOFF_MS, STABLE, GroupCoordinator
from logcompact.store import ObjectStore
from tests.helpers import create_topic
from tests.kafka.agents import RunningAgent, start_agent_process

pytestmark = pytest.mark.timeout(240)

TOPIC, PARTITIONS, MEMBERS, KILLS = "orders", 6, 3, 4
# Longer than an agent's restart on a loaded machine: librdkafka gives up a session it could not heartbeat for this
# long (and rejoins under a new member id), whatever the coordinator kept.
SESSION_MS = 30_000
QUICK_RECONNECT = {"socket.timeout.ms": 5000, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50}
# What a commit meets while the agent is down or starting: librdkafka's transport and timeout errors, Kafka's
# retriable coordinator errors. The commit is sent again, as an application committing each record does.
COMMIT_RETRIED = {KafkaError._TRANSPORT, KafkaError._TIMED_OUT, KafkaError._WAIT_COORD, KafkaError._ALL_BROKERS_DOWN,
                  KafkaError.COORDINATOR_NOT_AVAILABLE, KafkaError.NOT_COORDINATOR, KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
                  KafkaError.REQUEST_TIMED_OUT}


class Member(threading.Thread):
    """A consumer that commits each record (synchronously) before it takes the next, as an application that must
    not process a record twice: a commit the agent could not answer is sent again; one refused is counted."""

    def __init__(self, bootstrap: str, delivered: list[tuple[int, int]], refused: list[str], stop: threading.Event, group: str = "restarts") -> None:
        super().__init__(daemon=True)
        self.consumer = Consumer({
            "bootstrap.servers": bootstrap, "group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": SESSION_MS, "heartbeat.interval.ms": 500, **QUICK_RECONNECT,
        })
        self.delivered, self.refused, self.stop = delivered, refused, stop

    def run(self) -> None:
        self.consumer.subscribe([TOPIC])
        while not self.stop.is_set():
            message = self.consumer.poll(0.1)
            if message is None or message.error() is not None:
                continue
            self.delivered.append((message.partition(), message.offset()))
            while not self.stop.is_set():
                try:
                    self.consumer.commit(message, asynchronous=False)
                    break
                except KafkaException as exc:
                    error = exc.args[0]
                    if error.code() not in COMMIT_RETRIED:
                        self.refused.append(error.name())
                        break
                    time.sleep(0.05)
        self.consumer.close()


def test_a_group_committing_each_record_loses_no_member_and_redelivers_nothing_across_four_coordinator_kills(catalog: Catalog) -> None:
    create_topic(catalog, TOPIC, PARTITIONS)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    agent = start_agent_process(catalog, port, flush_ms=20)
    bootstrap = f"127.0.0.1:{port}"
    delivered: list[tuple[int, int]] = []
    refused: list[str] = []
    stop, stop_producing = threading.Event(), threading.Event()
    members = [Member(bootstrap, delivered, refused, stop) for _ in range(MEMBERS)]
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "acks": "all", "linger.ms": 5,
                         "message.timeout.ms": 120_000, **QUICK_RECONNECT})
    failed: list[Any] = []

    def produce() -> None:  # about 100 records a second, over every partition, until told to stop
        sent = 0
        while not stop_producing.is_set():
            producer.produce(TOPIC, key=b"k%d" % sent, value=b"v%d" % sent, partition=sent % PARTITIONS,
                             on_delivery=lambda error, _: error is None or failed.append(error))
            sent += 1
            producer.poll(0.01)

    producing = threading.Thread(target=produce, daemon=True)
    try:
        for member in members:
            member.start()
        producing.start()
        deadline = time.monotonic() + 60
        while len(delivered) < 100 and time.monotonic() < deadline:  # the group formed and consumes
            time.sleep(0.1)
        assert len(delivered) >= 100, "the group did not start consuming"
        formed = catalog.group("restarts")
        for _ in range(KILLS):
            before = len(delivered)
            while len(delivered) < before + 100 and time.monotonic() < deadline + 60:  # consuming, committing
                time.sleep(0.05)
            agent.send_signal(signal.SIGKILL)
            agent.wait()
            agent = start_agent_process(catalog, port, flush_ms=20)
            deadline = time.monotonic() + 60
        stop_producing.set()
        producing.join(timeout=10)
        assert producer.flush(60) == 0 and failed == []
        stored = sorted((p, record.offset) for p in range(PARTITIONS) for record in read_records(catalog.store, catalog.snapshot(), TOPIC, p))
        deadline = time.monotonic() + 60
        while len(delivered) < len(stored) and time.monotonic() < deadline:
            time.sleep(0.1)
        consumed = catalog.group("restarts")
    finally:
        stop.set()
        stop_producing.set()
        for member in members:
            member.join(timeout=30)
        agent.send_signal(signal.SIGTERM)
        agent.wait(timeout=15)
    assert refused == []  # not one commit refused with UNKNOWN_MEMBER_ID (nor any other error)
    assert len(delivered) == len(set(delivered))  # no record delivered twice
    assert sorted(delivered) == stored  # and every record delivered
    # the restarts never made the group rebalance: the generation it consumed in is the one it formed
    assert formed is not None and consumed is not None and (consumed.generation, consumed.state) == (formed.generation, STABLE)


def test_a_group_that_moves_to_a_new_agent_keeps_its_members_and_generation_and_the_agent_it_left_drops_it(catalog: Catalog) -> None:
    """On each database: a group consuming on the only agent moves when a second agent starts; the second loads it
    from its row, so the member's commits go on and nothing is delivered twice. A group that sends nothing leaves
    the first agent's memory at its next heartbeat, without waiting for a request."""
    create_topic(catalog, TOPIC, PARTITIONS)
    first = RunningAgent(Catalog(catalog.store, catalog.url), flush_interval_ms=20, group_initial_rebalance_delay_ms=0)
    second: RunningAgent | None = None
    groups = first.server.broker.groups
    moving = [g for g in (f"group-{n}" for n in range(100)) if zlib.crc32(g.encode()) % 2 == 1][:2]  # to node 1 of [0, 1]
    busy, idle = moving
    delivered: list[tuple[int, int]] = []
    refused: list[str] = []
    stop = threading.Event()
    member = Member(first.bootstrap, delivered, refused, stop, group=busy)
    try:
        assert first.server.broker.node_id == 0

        async def join_idle() -> None:
            group = await groups.group(idle, create=True)
            assert group is not None
            await groups.join(group, "", None, "idle", 60_000, 60_000, "consumer", [("range", b"")], False, False)

        first.call(join_idle())
        producer = Producer({"bootstrap.servers": first.bootstrap, "linger.ms": 5, **QUICK_RECONNECT})

        def produce(count: int) -> None:
            for n in range(count):
                producer.produce(TOPIC, key=b"k%d" % n, value=b"v", partition=n % PARTITIONS)
            assert producer.flush(30) == 0

        produce(300)
        member.start()
        deadline = time.monotonic() + 30
        while len(delivered) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        formed = catalog.group(busy)
        assert formed is not None and formed.coordinator == 0 and groups.known(idle) is not None
        second = RunningAgent(Catalog(catalog.store, catalog.url), flush_interval_ms=20)
        assert second.server.broker.node_id == 1
        deadline = time.monotonic() + 30
        while (moved := catalog.group(busy)) is not None and moved.coordinator == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert groups.known(idle) is None  # dropped at a heartbeat: no request for it came
        produce(300)  # consumed and committed on the group's new coordinator
        while len(delivered) < 600 and time.monotonic() < deadline + 30:
            time.sleep(0.1)
        moved = catalog.group(busy)
    finally:
        stop.set()
        member.join(timeout=30)
        first.stop()
        if second is not None:
            second.stop()
    assert refused == [] and len(delivered) == len(set(delivered)) == 600
    assert moved is not None and (moved.coordinator, moved.generation, moved.state) == (1, formed.generation, STABLE)
    assert [m.member_id for m in moved.members] == [m.member_id for m in formed.members]


# -- the coordinator -------------------------------------------------------------------------------------------


def test_a_group_row_is_written_only_by_the_coordinator_that_last_took_it(catalog: Catalog) -> None:
    """On each database: a coordinator writes over its own row; another takes it over only from the row it loaded;
    then the first one's writes are refused, and so is a takeover from a row that changed since it was loaded."""
    create_topic(catalog, TOPIC, 1)
    member = StoredMember("m", None, "client", 10_000, 30_000, (("range", b"\x00"),), b"\x01")
    first = GroupRow("g", 1, 1, "consumer", "range", STABLE, "m", (member,), 1000)
    assert catalog.save_group(first) and catalog.group("g") == first
    assert catalog.save_group(replace(first, generation=2, updated_ms=1001))
    loaded = catalog.group("g")
    assert loaded is not None
    taken = replace(loaded, coordinator=2, updated_ms=1002)
    assert catalog.save_group(taken, loaded) and catalog.group("g") == taken
    assert catalog.save_group(taken, loaded)  # written again, its answer lost: the row is node 2's already
    assert not catalog.save_group(replace(loaded, generation=3, state="Empty", members=(), updated_ms=1003))  # node 1, too late
    assert not catalog.save_group(replace(loaded, coordinator=3, updated_ms=1004), loaded)  # node 3 loaded it before node 2 wrote
    assert catalog.save_group(replace(taken, generation=3, updated_ms=1005)) and catalog.group("g") == replace(taken, generation=3, updated_ms=1005)
    assert catalog.save_group(GroupRow("h", 3, 0, "consumer", "", "Empty", "", (), 1006))  # a new group: no row to take over


def test_a_loaded_group_keeps_its_members_and_expires_those_silent_since_the_load_and_a_coordinator_that_lost_it_drops_it(catalog: Catalog) -> None:
    """On each database."""
    create_topic(catalog, TOPIC, 1)
    protocols = {"a": [("range", b"a-range"), ("roundrobin", b"a-rr")], "b": [("range", b"b-range")]}

    async def first_generation() -> dict[str, str]:
        """Node 1 forms generation 1 of members a (static) and b, then dies with its loop (no LeaveGroup, no close)."""
        coordinator = GroupCoordinator(catalog, 1, initial_rebalance_delay_ms=50)
        group = await coordinator.group("g", create=True)
        assert group is not None
        joined = await asyncio.gather(
            coordinator.join(group, "", "instance-a", "client-a", 1000, 5000, "consumer", protocols["a"], False, False),
            coordinator.join(group, "", None, "client-b", 1000, 5000, "consumer", protocols["b"], False, False),
        )
        ids = {"a": joined[0].member_id, "b": joined[1].member_id}
        leader = joined[0].leader
        assignments = {ids["a"]: b"partitions of a", ids["b"]: b"partitions of b"}
        synced = await asyncio.gather(*(coordinator.sync(group, 1, member_id, None, "consumer", "range", assignments if member_id == leader else {})
                                        for member_id in ids.values()))
        assert [s.assignment for s in synced] == [b"partitions of a", b"partitions of b"]
        return {**ids, "leader": leader}

    ids = asyncio.run(first_generation())
    time.sleep(1.2)  # longer than the members' sessions: they restart from the load

    async def after_the_restart() -> None:
        restarted = GroupCoordinator(catalog, 1)  # node 1 again, on the catalog's row
        loaded_at = time.monotonic()
        group = await restarted.group("g", create=False)
        assert group is not None and group.state == STABLE and group.generation == 1 and group.leader == ids["leader"]
        assert group.protocol_type == "consumer" and group.protocol == "range" and group.static == {"instance-a": ids["a"]}
        a, b = group.members[ids["a"]], group.members[ids["b"]]
        assert (a.instance_id, a.client_id, a.session_ms, a.rebalance_ms, a.protocols, a.assignment) == (
            "instance-a", "client-a", 1000, 5000, protocols["a"], b"partitions of a")
        assert (b.instance_id, b.client_id, b.protocols, b.assignment) == (None, "client-b", protocols["b"], b"partitions of b")
        assert restarted.memory.held == OVERHEAD_BYTES + a.size() + b.size()  # counted as members that joined here
        assert restarted.commit_error(group, 1, ids["b"], None) is None  # a commit in flight succeeds
        # a heartbeats, b sends nothing: b is there half a session after the load, gone a session after it
        while time.monotonic() - loaded_at < 0.5:
            assert restarted.heartbeat(group, 1, ids["a"], "instance-a") == ErrorCode.none
            await asyncio.sleep(0.1)
        assert ids["b"] in group.members
        while ids["b"] in group.members and time.monotonic() - loaded_at < 5:
            restarted.heartbeat(group, 1, ids["a"], "instance-a")
            await asyncio.sleep(0.05)
        assert time.monotonic() - loaded_at >= 1.0
        assert list(group.members) == [ids["a"]] and group.state == PREPARING_REBALANCE
        assert restarted.heartbeat(group, 1, ids["a"], "instance-a") == ErrorCode.rebalance_in_progress
        rejoined = await restarted.join(group, ids["a"], "instance-a", "client-a", 1000, 5000, "consumer", protocols["a"], False, False)
        assert (rejoined.generation, rejoined.leader) == (2, ids["a"])
        assert (await restarted.sync(group, 2, ids["a"], "instance-a", None, None, {ids["a"]: b"all"})).assignment == b"all"
        row = catalog.group("g")
        assert row is not None and (row.coordinator, row.generation, row.state, [m.member_id for m in row.members]) == (1, 2, STABLE, [ids["a"]])

        # The group moves to node 2, which takes it over; node 1 does not know yet and its write is refused.
        other = GroupCoordinator(catalog, 2)
        moved = await other.group("g", create=False)
        assert moved is not None and moved.generation == 2 and list(moved.members) == [ids["a"]]
        for _ in range(2):  # node 2's row written; a heartbeats to node 2 now
            assert other.heartbeat(moved, 2, ids["a"], "instance-a") == ErrorCode.none
            await asyncio.sleep(0.1)
        assert restarted.leave(group, ids["a"], "instance-a") == ErrorCode.none
        for _ in range(2):
            assert other.heartbeat(moved, 2, ids["a"], "instance-a") == ErrorCode.none
            await asyncio.sleep(0.1)
        assert restarted.known("g") is None and restarted.memory.held == 0  # dropped, with the bytes it held
        row = catalog.group("g")
        assert row is not None and (row.coordinator, row.generation, row.state, [m.member_id for m in row.members]) == (2, 2, STABLE, [ids["a"]])
        await other.close()
        await restarted.close()

    asyncio.run(after_the_restart())


class UnreachableCatalog(Catalog):
    """The catalog of a database that went down: no group row is written."""

    def save_group(self, group: GroupRow, loaded: GroupRow | None = None) -> bool:
        raise CatalogUnavailableError("catalog cannot be reached (test)")


def test_a_group_loaded_while_rebalancing_completes_with_the_members_that_rejoin_and_assignments_wait_for_their_row(catalog: Catalog) -> None:
    """On each database: a group whose coordinator died preparing a rebalance is loaded preparing it: the members
    that rejoin form the next generation, one that does not is dropped a rebalance timeout after the load. A
    leader's assignments the catalog cannot keep are not handed out: COORDINATOR_NOT_AVAILABLE, and a rebalance. A
    group whose members would pass group_max_bytes is not loaded."""
    create_topic(catalog, TOPIC, 1)
    stored = [StoredMember(f"m-{n}", None, f"client-{n}", 60_000, 300, (("range", b"meta"),), b"old") for n in range(3)]
    catalog.save_group(GroupRow("g", 1, 4, "consumer", "range", PREPARING_REBALANCE, "m-0", tuple(stored), 1000))

    async def scenario() -> None:
        coordinator = GroupCoordinator(catalog, 1, initial_rebalance_delay_ms=0)
        group = await coordinator.group("g", create=False)
        assert group is not None and group.state == PREPARING_REBALANCE and list(group.members) == ["m-0", "m-1", "m-2"]
        assert coordinator.heartbeat(group, 4, "m-2", None) == ErrorCode.rebalance_in_progress
        assert coordinator.commit_error(group, 4, "m-2", None) is None  # the generation's commits still count
        started = time.monotonic()
        joined = await asyncio.gather(*(coordinator.join(group, member_id, None, "client", 60_000, 300, "consumer", [("range", b"meta")], False, False)
                                        for member_id in ("m-0", "m-1")))  # m-2 never rejoins
        assert time.monotonic() - started >= 0.25  # held for the rebalance timeout from the load
        assert [(j.error, j.generation, j.leader) for j in joined] == [(ErrorCode.none, 5, "m-0")] * 2 and list(group.members) == ["m-0", "m-1"]

        await asyncio.sleep(0.1)  # generation 5's row written
        # The catalog goes down: the leader's assignments are not handed out, since no coordinator could load them.
        coordinator.catalog = UnreachableCatalog(catalog.store, catalog.url)
        synced = await asyncio.gather(coordinator.sync(group, 5, "m-1", None, None, None, {}),
                                      coordinator.sync(group, 5, "m-0", None, None, None, {"m-0": b"new", "m-1": b"new"}))
        assert [s.error for s in synced] == [ErrorCode.coordinator_not_available] * 2
        assert group.state == PREPARING_REBALANCE and all(m.assignment == b"" for m in group.members.values())
        await coordinator.close()

        row = catalog.group("g")  # written before the catalog went down: generation 5 completing, its members kept
        assert row is not None and (row.generation, row.state, [m.member_id for m in row.members]) == (5, "CompletingRebalance", ["m-0", "m-1"])
        small = GroupCoordinator(catalog, 1, max_bytes=2 * OVERHEAD_BYTES)
        unkept = await small.group("g", create=False)
        assert unkept is not None and unkept.generation == 5 and not unkept.members and small.known("g") is None and small.memory.held == 0
        await small.close()

    asyncio.run(scenario())


def test_a_group_row_whose_members_are_damaged_is_loaded_without_them_and_written_again(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    """On each database: members that are not the JSON logcompact writes cost the members only (they join again,
    one warning line names the row); the group keeps its generation and its row is written again, Empty."""
    create_topic(catalog, TOPIC, 1)
    catalog.save_group(GroupRow("g", 1, 3, "consumer", "range", STABLE, "m", (), 1000))
    with catalog.engine.begin() as connection:
        connection.execute(update(schema.consumer_groups).values(members='[{"member_id": "m", "assignment": "%%%"}]'))

    async def load() -> None:
        coordinator = GroupCoordinator(catalog, 2)
        group = await coordinator.group("g", create=False)
        assert group is not None and (group.state, group.generation, group.members) == ("Empty", 3, {})
        await coordinator.close()

    with caplog.at_level(logging.WARNING, logger="logcompact.catalog.groups"):
        asyncio.run(load())
    assert [r.getMessage().split(":")[0] for r in caplog.records if r.name == "logcompact.catalog.groups"] == ["catalog row consumer_groups 'g' is damaged"]
    row = catalog.group("g")
    assert row is not None and (row.coordinator, row.generation, row.state, row.members) == (2, 3, "Empty", ())


class FailingCatalog(Catalog):
    """The catalog of a database that is down while `down` is set (each write fails as a connection refused
    does), or that loses the answers of its writes while `answers_lost` is (each write commits, then fails as a
    connection lost before the COMMIT's answer does)."""

    def __init__(self, store: ObjectStore, url: str) -> None:
        super().__init__(store, url)
        self.down = self.answers_lost = False
        self.failed = 0

    def save_group(self, group: GroupRow, loaded: GroupRow | None = None) -> bool:
        if self.down:
            self.failed += 1
            raise CatalogUnavailableError("catalog cannot be reached (test)")
        written = super().save_group(group, loaded)
        if self.answers_lost:
            self.failed += 1
            raise CatalogUnavailableError("catalog connection lost (test)")
        return written


async def _row_becomes(catalog: Catalog, group_id: str, wanted: tuple[int, int, str], within_s: float) -> GroupRow | None:
    """The group's row once its (coordinator, generation, state) is `wanted`, or as it is `within_s` later."""
    deadline = time.monotonic() + within_s
    while True:
        row = catalog.group(group_id)
        if (row is not None and (row.coordinator, row.generation, row.state) == wanted) or time.monotonic() > deadline:
            return row
        await asyncio.sleep(0.05)


def test_a_takeover_whose_writes_fail_keeps_its_fence_writes_its_row_again_and_keeps_the_group(catalog: Catalog) -> None:
    """On each database: an agent takes groups over from another's rows while the catalog is down, or while it loses
    the answers of its writes. Its rows are written again once the catalog answers, fenced by the rows it loaded,
    without a request; a group that rebalanced meanwhile gets its assignments and stays on the agent. Before, the
    first failed write lost the fence, and the group's next write was refused as if another agent had taken it."""
    create_topic(catalog, TOPIC, 1)
    member = StoredMember("m", None, "client", 60_000, 300, (("range", b"meta"),), b"old")
    for group_id in ("busy", "idle", "unanswered"):
        catalog.save_group(GroupRow(group_id, 1, 3, "consumer", "range", STABLE, "m", (member,), 1000))
    failing = FailingCatalog(catalog.store, catalog.url)

    async def scenario() -> None:
        taking = GroupCoordinator(failing, 2, initial_rebalance_delay_ms=0)
        failing.down = True
        busy = await taking.group("busy", create=False)
        idle = await taking.group("idle", create=False)
        assert busy is not None and idle is not None and (busy.state, list(busy.members)) == (STABLE, ["m"])
        joined = await taking.join(busy, "m", None, "client", 60_000, 300, "consumer", [("range", b"meta")], False, False)
        assert (joined.error, joined.generation, joined.leader) == (ErrorCode.none, 4, "m")  # the leader rejoined: generation 4
        while failing.failed < 2:  # the takeovers' rows were not written
            await asyncio.sleep(0.01)
        assert taking.known("busy") is busy and taking.known("idle") is idle
        failing.down = False
        synced = await asyncio.wait_for(taking.sync(busy, 4, "m", None, None, None, {"m": b"new"}), 10)
        assert (synced.error, synced.assignment) == (ErrorCode.none, b"new") and taking.known("busy") is busy
        row = catalog.group("busy")
        assert row is not None and (row.coordinator, row.generation, row.state, [m.assignment for m in row.members]) == (2, 4, STABLE, [b"new"])
        # No request for the idle group: its row is written again within a retry of the catalog's return.
        row = await _row_becomes(catalog, "idle", (2, 3, STABLE), ROW_RETRY_BACKOFF_MS / 1000 + 5)
        assert row is not None and (row.coordinator, row.generation, row.state) == (2, 3, STABLE) and taking.known("idle") is idle

        # A takeover whose write commits but whose answer is lost writes it again, and is still the group's coordinator.
        failing.answers_lost = True
        unanswered = await taking.group("unanswered", create=False)
        failed = failing.failed
        while failing.failed == failed:
            await asyncio.sleep(0.01)
        failing.answers_lost = False
        assert unanswered is not None and taking.heartbeat(unanswered, 3, "m", None) == ErrorCode.none
        await asyncio.sleep(ROW_RETRY_BACKOFF_MS / 1000 + 0.5)  # written again
        assert taking.known("unanswered") is unanswered and taking.heartbeat(unanswered, 3, "m", None) == ErrorCode.none
        row = catalog.group("unanswered")
        assert row is not None and (row.coordinator, row.generation, row.state) == (2, 3, STABLE)
        await taking.close()

    asyncio.run(scenario())


def test_an_agent_that_loses_a_group_before_its_row_is_written_never_writes_it(catalog: Catalog) -> None:
    """On each database: an agent takes a group over, and the live agents change again (the group moves on) before
    its row is written: the row is dropped with the group, so the catalog keeps the row the next coordinator loads
    and fences its own write with, and that coordinator keeps the group and its member."""
    create_topic(catalog, TOPIC, 1)
    member = StoredMember("m", None, "client", 60_000, 300, (("range", b"meta"),), b"assigned")
    before = GroupRow("g", 0, 3, "consumer", "range", STABLE, "m", (member,), 1000)
    catalog.save_group(before)

    async def scenario() -> None:
        first = GroupCoordinator(catalog, 1)
        assert await first.group("g", create=False) is not None  # taken over from node 0: its row queued
        first.forget("g")  # the group moved to node 2 before the writer ran
        await asyncio.sleep(0.5)
        assert catalog.group("g") == before and first.known("g") is None and first.memory.held == 0
        second = GroupCoordinator(catalog, 2)
        moved = await second.group("g", create=False)
        assert moved is not None and (moved.generation, list(moved.members)) == (3, ["m"])
        row = await _row_becomes(catalog, "g", (2, 3, STABLE), 5)
        assert row is not None and (row.coordinator, [m.member_id for m in row.members]) == (2, ["m"])
        assert second.known("g") is moved and second.heartbeat(moved, 3, "m", None) == ErrorCode.none
        await first.close()
        await second.close()
        assert catalog.group("g") == row  # nothing of the first agent's written at its close either

    asyncio.run(scenario())


def _hold_row(catalog: Catalog, group_id: str) -> Connection:
    """A transaction that has written the group's row and holds it (its lock) until rolled back: a catalog whose
    writes of the row wait, as a slow or stalled database's do."""
    connection = catalog.engine.connect()
    connection.execution_options(**{WRITE: True})  # SQLite: BEGIN IMMEDIATE, the database's write lock
    connection.begin()
    table = schema.consumer_groups
    connection.execute(update(table).where(table.c.group_id == group_id).values(updated_ms=table.c.updated_ms))
    return connection


def test_sync_groups_wait_for_their_row_at_most_the_commit_timeout_then_the_group_rebalances(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    """On each database: while another transaction holds the group's row, the leader's assignments are not handed
    out, and the SyncGroups waiting for them are answered COORDINATOR_NOT_AVAILABLE once the row has not been written
    for offsets.commit.timeout.ms (Kafka's answer to a group metadata append that timed out), with one warning line;
    the group rebalances, and once the row is free the members' next generation gets its assignments."""
    create_topic(catalog, TOPIC, 1)
    timeout_ms = 500

    async def scenario() -> None:
        coordinator = GroupCoordinator(catalog, 1, initial_rebalance_delay_ms=50, commit_timeout_ms=timeout_ms)
        group = await coordinator.group("g", create=True)
        assert group is not None

        async def join(member_id: str, client_id: str) -> Any:
            return await coordinator.join(group, member_id, None, client_id, 60_000, 5_000, "consumer", [("range", b"meta")], False, False)

        joined = await asyncio.gather(join("", "a"), join("", "b"))
        ids = [j.member_id for j in joined]
        leader = joined[0].leader
        assert [j.generation for j in joined] == [1, 1]
        await _row_becomes(catalog, "g", (1, 1, COMPLETING_REBALANCE), 5)
        holder = await asyncio.to_thread(_hold_row, catalog, "g")
        try:
            started = time.monotonic()
            synced = await asyncio.wait_for(asyncio.gather(*(
                coordinator.sync(group, 1, member_id, None, None, None, {ids[0]: b"first", ids[1]: b"second"} if member_id == leader else {})
                for member_id in ids)), 10)
            waited = time.monotonic() - started
            assert [s.error for s in synced] == [ErrorCode.coordinator_not_available] * 2 and [s.assignment for s in synced] == [b"", b""]
            assert timeout_ms / 1000 <= waited < timeout_ms / 1000 + 3  # the bound, with room for a loaded machine
            assert group.state == PREPARING_REBALANCE and all(m.assignment == b"" for m in group.members.values())
        finally:
            await asyncio.to_thread(holder.close)  # rolls the holding transaction back: the row is free again
        rejoined = await asyncio.gather(*(join(member_id, "client") for member_id in ids))
        assert [j.generation for j in rejoined] == [2, 2]
        leader = rejoined[0].leader
        synced = await asyncio.wait_for(asyncio.gather(*(
            coordinator.sync(group, 2, member_id, None, None, None, {ids[0]: b"first", ids[1]: b"second"} if member_id == leader else {})
            for member_id in ids)), 10)
        assert [(s.error, s.assignment) for s in synced] == [(ErrorCode.none, b"first"), (ErrorCode.none, b"second")] and group.state == STABLE
        row = await _row_becomes(catalog, "g", (1, 2, STABLE), 5)
        assert row is not None and [m.assignment for m in row.members] == [b"first", b"second"]
        await coordinator.close()

    with caplog.at_level(logging.WARNING, logger="logcompact.kafka.group_coordinator"):
        asyncio.run(scenario())
    assert [r.getMessage() for r in caplog.records] == [
        f"group g: the row with the assignments of generation 1 was not written to the catalog within {timeout_ms} ms "
        "(offsets.commit.timeout.ms): its SyncGroups are answered COORDINATOR_NOT_AVAILABLE"]


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)  # a row held alone: SQLite would hold every write
def test_a_confluent_consumer_whose_row_is_held_is_answered_within_the_commit_timeout_and_consumes_once_it_is_free(
    catalog: Catalog, caplog: pytest.LogCaptureFixture,
) -> None:
    """A confluent-kafka consumer joins a group whose row another transaction holds: its SyncGroups are answered
    COORDINATOR_NOT_AVAILABLE after offsets.commit.timeout.ms (5 s) instead of waiting for the row, librdkafka joins
    again, and once the row is free the consumer is assigned the partitions and reads every record once."""
    create_topic(catalog, TOPIC, 2)
    agent = RunningAgent(Catalog(catalog.store, catalog.url), flush_interval_ms=20, group_initial_rebalance_delay_ms=0)
    consumer: Consumer | None = None
    holder: Connection | None = None
    try:
        producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5})
        for n in range(10):
            producer.produce(TOPIC, key=b"k%d" % n, value=b"v%d" % n, partition=n % 2)
        assert producer.flush(30) == 0
        catalog.save_group(GroupRow("held", agent.server.broker.node_id, 0, "", "", "Empty", "", (), 1000))
        holder = _hold_row(catalog, "held")
        consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": "held", "auto.offset.reset": "earliest",
                             "session.timeout.ms": 30_000, **QUICK_RECONNECT})
        consumer.subscribe([TOPIC])
        delivered: list[tuple[int, int]] = []
        def coordinator_warnings() -> list[str]:  # the coordinator's only: a loaded machine may make others
            return [r.getMessage() for r in caplog.records if r.name == "logcompact.kafka.group_coordinator"]

        with caplog.at_level(logging.WARNING, logger="logcompact.kafka.group_coordinator"):
            deadline = time.monotonic() + 20
            while not coordinator_warnings() and time.monotonic() < deadline:  # the first SyncGroup answered, the row still held
                message = consumer.poll(0.2)
                assert message is None or message.error() is not None
        assert [m.split(" was not written")[0] for m in coordinator_warnings()][:1] == ["group held: the row with the assignments of generation 1"]
        holder.close()
        holder = None
        deadline = time.monotonic() + 60
        while len(delivered) < 10 and time.monotonic() < deadline:
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                delivered.append((message.partition(), message.offset()))
        assert sorted(delivered) == [(p, o) for p in range(2) for o in range(5)]
    finally:
        if holder is not None:
            holder.close()
        if consumer is not None:
            consumer.close()
        agent.stop()
