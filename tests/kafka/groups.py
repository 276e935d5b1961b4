"""What the consumer groups' tests share: the topic the groups consume, its producer, a confluent-kafka member,
and JoinGroup on raw requests."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, Producer

from tests.kafka.agents import FAST_CLIENT, RunningAgent
from tests.kafka.wire import Wire

TOPIC, PARTITIONS = "events", 6
# Kafka's API keys of the group coordinator
JOIN, HEARTBEAT, LEAVE, SYNC, DESCRIBE, LIST, COMMIT, FETCH, FIND = 11, 12, 13, 14, 15, 16, 8, 9, 10
NONE, MEMBER_ID_REQUIRED = 0, 79  # Kafka's error codes


def produce(agent: RunningAgent, per_partition: int, start: int = 0) -> set[tuple[int, int]]:
    """`per_partition` records into each partition, acked; their (partition, offset)s."""
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, **FAST_CLIENT})
    acked: set[tuple[int, int]] = set()

    def delivered(error: Any, message: Any) -> None:
        assert error is None, error
        acked.add((message.partition(), message.offset()))

    for partition in range(PARTITIONS):
        for n in range(start, start + per_partition):
            producer.produce(TOPIC, key=f"k{n}", value=f"v{n}", partition=partition, on_delivery=delivered)
    assert producer.flush(15) == 0
    assert len(acked) == PARTITIONS * per_partition
    return acked


def group_member(agent: RunningAgent, group: str, **config: Any) -> Consumer:
    return Consumer({"bootstrap.servers": agent.bootstrap, "group.id": group, "auto.offset.reset": "earliest",
                     "heartbeat.interval.ms": 300, "session.timeout.ms": 3000, **FAST_CLIENT, **config})


def join_body(group: str, member_id: str = "", protocol_type: str = "consumer", protocols: list[tuple[str, bytes]] | None = None,
              session_ms: int = 10000, instance_id: str | None = None) -> dict[str, Any]:
    return {"group_id": group, "session_timeout": session_ms, "rebalance_timeout": 10000, "member_id": member_id, "group_instance_id": instance_id,
            "protocol_type": protocol_type, "protocols": [{"name": n, "metadata": m} for n, m in (protocols if protocols is not None else [("range", b"m")])]}


def join(wire: Wire, version: int, group: str, **fields: Any) -> Any:
    """A JoinGroup as clients send it: from v4 once for a member id (MEMBER_ID_REQUIRED) and again with it."""
    answer = wire.call(JOIN, version, join_body(group, **fields))
    if version >= 4 and int(answer.error_code) == MEMBER_ID_REQUIRED:
        answer = wire.call(JOIN, version, join_body(group, **{**fields, "member_id": answer.member_id}))
    return answer
