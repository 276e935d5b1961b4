"""The group coordinator's memory stays bounded whatever clients send: group.max.size refuses a
third confluent-kafka consumer while two keep consuming; 10,000 JoinGroups with fresh group ids are held within
--group-max-bytes and leave nothing in memory once their pending ids expire; a leader's assignments past the bytes
are refused as Kafka refuses assignments it cannot store; an Empty group leaves memory and keeps its generation.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError

from logcompact.catalog import Catalog
from logcompact.kafka.group_coordinator import OVERHEAD_BYTES, GroupCoordinator
from tests.helpers import create_topic
from tests.kafka.agents import RunningAgent
from tests.kafka.groups import DESCRIBE, JOIN, LEAVE, LIST, MEMBER_ID_REQUIRED, NONE, PARTITIONS, SYNC, TOPIC, group_member, join, join_body, produce
from tests.kafka.wire import Wire

pytestmark = pytest.mark.timeout(60)

GROUP_MAX_SIZE_REACHED, UNKNOWN_SERVER_ERROR = 81, -1


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, TOPIC, PARTITIONS)
    return catalog


def coordinator(agent: RunningAgent) -> GroupCoordinator:
    return agent.server.broker.groups


def on_loop(agent: RunningAgent, read: Callable[[GroupCoordinator], Any]) -> Any:
    """Read the coordinator on its event loop, between two of its steps."""
    async def reading() -> Any:
        return read(coordinator(agent))
    return agent.call(reading())


def wait_until(condition: Callable[[], bool], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "not reached in time"
        time.sleep(0.05)


def read_some(members: list[Consumer], consumed: set[tuple[int, int]]) -> None:
    for member in members:
        message = member.poll(0.1)
        if message is not None and message.error() is None:
            partition, offset = message.partition(), message.offset()
            assert partition is not None and offset is not None
            consumed.add((partition, offset))


@pytest.fixture
def small_agent(catalog: Catalog) -> Iterator[RunningAgent]:
    """Groups of 2 at most, 1 MiB for all members; no initial rebalance delay."""
    running = RunningAgent(catalog, flush_interval_ms=20, group_initial_rebalance_delay_ms=0, group_max_size=2, group_max_bytes=1 << 20)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture
def small_wire(small_agent: RunningAgent) -> Iterator[Wire]:
    connection = Wire(small_agent)
    yield connection
    connection.close()


def test_a_third_confluent_consumer_of_a_group_of_two_is_refused_and_the_two_keep_consuming(catalog: Catalog) -> None:
    agent = RunningAgent(catalog, flush_interval_ms=20, group_max_size=2)
    members = [group_member(agent, "pair") for _ in range(2)]
    third = None
    try:
        produced = produce(agent, 5)
        consumed: set[tuple[int, int]] = set()
        for member in members:
            member.subscribe([TOPIC])
        deadline = time.monotonic() + 20
        while len(consumed) < len(produced) and time.monotonic() < deadline:
            read_some(members, consumed)
        assert consumed == produced

        third = group_member(agent, "pair")
        third.subscribe([TOPIC])
        error = None
        deadline = time.monotonic() + 15
        while error is None and time.monotonic() < deadline:
            for member in members:  # the two keep polling (heartbeats) while the third tries to join
                member.poll(0.05)
            message = third.poll(0.1)
            if message is not None and message.error() is not None:
                error = message.error()
        # librdkafka reports it as a consumer error, not fatal, and tries to join again every 2 s or so
        assert error is not None and error.code() == KafkaError.GROUP_MAX_SIZE_REACHED and not error.fatal(), error
        assert third.assignment() == []
        assert on_loop(agent, lambda groups: len(groups.known("pair").members)) == 2  # type: ignore[union-attr]

        more = produce(agent, 3, start=5)  # the two still own every partition and read on
        deadline = time.monotonic() + 15
        while not more <= consumed and time.monotonic() < deadline:
            read_some(members, consumed)
        assert more <= consumed
    finally:
        for consumer in [*members, *([third] if third is not None else [])]:
            consumer.close()
        agent.stop()
    assert coordinator(agent).memory.held == 0  # all given back when the agent stopped


def test_ten_thousand_join_groups_with_fresh_group_ids_stay_within_the_bytes_and_leave_memory(small_agent: RunningAgent, small_wire: Wire) -> None:
    answers: dict[int, int] = {}
    pending: dict[str, str] = {}  # group -> the member id handed out
    peak_groups = peak_held = 0
    for batch in range(100):  # pipelined, 100 at a time
        sent = [f"fresh-{batch * 100 + n}" for n in range(100)]
        for group in sent:
            small_wire.send(JOIN, 5, join_body(group, session_ms=30_000))
        for group in sent:
            answer = small_wire.receive()
            answers[int(answer.error_code)] = answers.get(int(answer.error_code), 0) + 1
            if int(answer.error_code) == MEMBER_ID_REQUIRED:
                pending[group] = answer.member_id
        groups, held = on_loop(small_agent, lambda c: (len(c.all_groups()), c.memory.held))
        peak_groups, peak_held = max(peak_groups, groups), max(peak_held, held)
    # each group held its pending id until the bytes were spent (2 KiB and more a group); the rest were refused
    assert set(answers) == {MEMBER_ID_REQUIRED, GROUP_MAX_SIZE_REACHED} and sum(answers.values()) == 10_000
    assert answers[MEMBER_ID_REQUIRED] <= (1 << 20) // (2 * OVERHEAD_BYTES)
    assert peak_held <= 1 << 20 and peak_groups <= (1 << 20) // OVERHEAD_BYTES
    # the ids leave: the Empty groups leave memory and nothing is held
    for group, member_id in pending.items():
        small_wire.send(LEAVE, 5, {"group_id": group, "members": [{"member_id": member_id, "group_instance_id": None}]})
    assert {int(small_wire.receive().error_code) for _ in pending} == {NONE}
    wait_until(lambda: on_loop(small_agent, lambda c: (len(c.all_groups()), c.memory.held)) == (0, 0), 10)
    listed = small_wire.call(LIST, 4, {"states_filter": []})  # still listed, from their rows
    assert {g.group_id for g in listed.groups} >= set(pending)
    # a pending id not used expires with its session, and its group leaves memory
    assert int(small_wire.call(JOIN, 5, join_body("short", session_ms=1000)).error_code) == MEMBER_ID_REQUIRED
    assert on_loop(small_agent, lambda c: c.memory.held) > 0
    wait_until(lambda: on_loop(small_agent, lambda c: (len(c.all_groups()), c.memory.held)) == (0, 0), 5)


def test_a_leaders_assignments_past_the_bytes_are_refused_and_the_group_rebalances(small_agent: RunningAgent, small_wire: Wire) -> None:
    joined = join(small_wire, 5, "big", session_ms=10_000)
    assert int(joined.error_code) == NONE
    sync = {"group_id": "big", "generation_id": joined.generation_id, "member_id": joined.member_id, "group_instance_id": None,
            "protocol_type": "consumer", "protocol_name": "range", "assignments": [{"member_id": joined.member_id, "assignment": b"x" * (1 << 20)}]}
    assert int(small_wire.call(SYNC, 5, sync).error_code) == UNKNOWN_SERVER_ERROR
    group = on_loop(small_agent, lambda c: (c.known("big").state, [m.assignment for m in c.known("big").members.values()]))  # type: ignore[union-attr]
    assert group == ("PreparingRebalance", [b""])
    rejoined = small_wire.call(JOIN, 5, join_body("big", member_id=joined.member_id, session_ms=10_000))
    assert int(rejoined.error_code) == NONE and rejoined.generation_id == joined.generation_id + 1
    small = {**sync, "generation_id": rejoined.generation_id, "assignments": [{"member_id": joined.member_id, "assignment": b"p0"}]}
    assert (int((synced := small_wire.call(SYNC, 5, small)).error_code), synced.assignment) == (NONE, b"p0")
    # the member leaves: the group is Empty, its row written, and it leaves memory with every byte it held
    left = small_wire.call(LEAVE, 5, {"group_id": "big", "members": [{"member_id": joined.member_id, "group_instance_id": None}]})
    assert int(left.error_code) == NONE
    wait_until(lambda: on_loop(small_agent, lambda c: (c.known("big"), c.memory.held)) == (None, 0), 5)


def test_an_empty_group_reloaded_from_its_row_keeps_its_generation_and_answers_as_before(small_agent: RunningAgent, small_wire: Wire) -> None:
    first = join(small_wire, 5, "again", session_ms=10_000)
    assert (int(first.error_code), first.generation_id) == (NONE, 1)
    small_wire.call(LEAVE, 5, {"group_id": "again", "members": [{"member_id": first.member_id, "group_instance_id": None}]})  # generation 2, Empty
    wait_until(lambda: on_loop(small_agent, lambda c: c.known("again")) is None, 5)
    described = small_wire.call(DESCRIBE, 5, {"groups": ["again"], "include_authorized_operations": False}).groups[0]
    assert (described.group_state, described.protocol_type, list(described.members)) == ("Empty", "consumer", [])
    # the group a DescribeGroups loaded leaves memory again
    wait_until(lambda: on_loop(small_agent, lambda c: c.known("again")) is None, 5)
    second = join(small_wire, 5, "again", session_ms=10_000)
    assert (int(second.error_code), second.generation_id) == (NONE, 3)  # generations continue from the row
    # a group of 2: a third member id is refused while the two ids are held
    assert int(small_wire.call(JOIN, 5, join_body("again", session_ms=10_000)).error_code) == MEMBER_ID_REQUIRED
    assert int(small_wire.call(JOIN, 5, join_body("again", session_ms=10_000)).error_code) == GROUP_MAX_SIZE_REACHED
