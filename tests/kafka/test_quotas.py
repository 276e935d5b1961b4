"""Client quotas: Kafka's rate and precedence (its ClientQuotaManagerTest cases, translated), the quota APIs through
kafka-python's own request classes, and byte-rate and connection quotas enforced on real clients."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Iterator
from typing import Any, cast

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, Producer, TopicPartition
from kafka.admin import KafkaAdminClient
from kafka.protocol.admin.client_quotas import AlterClientQuotasRequest, DescribeClientQuotasRequest

from logcompact.catalog import Catalog
from logcompact.catalog.quotas import (
    CLIENT_ID,
    CONNECTION_CREATION_RATE,
    CONSUMER_BYTE_RATE,
    IP,
    PRODUCER_BYTE_RATE,
    USER,
    QuotaEntity,
    QuotaRequestError,
    check_ops,
    entity_from,
    filter_from,
)
from logcompact.cli import cli
from logcompact.kafka.quota_manager import QUOTA_WINDOW_NUM, REFRESH_SECONDS, ClientQuotaManager, Rate, record_and_throttle_ms
from logcompact.kafka.session import KafkaPrincipal, Session
from tests.helpers import create_topic
from tests.kafka.agents import RunningAgent
from tests.kafka.wire import connect, keyed_batch, kio_frame, produce_request, produce_response, receive_frame

ERROR_NONE, INVALID_REQUEST, UNSUPPORTED_VERSION = 0, 42, 35
KIB = 1024
SQLITE_ONLY = pytest.mark.parametrize("catalog_url", ["sqlite"], indirect=True)  # rates, not the catalog, are tested


# -- Kafka's rate and precedence, without an agent ----------------------------------------------------------


class Clock:
    def __init__(self) -> None:
        self.ms = 1_000_000.0

    def __call__(self) -> float:
        return self.ms


def manager(quotas: dict[QuotaEntity, dict[str, float]], clock: Clock) -> ClientQuotaManager:
    return ClientQuotaManager(cast(Catalog, None), quotas, clock)  # the catalog is read only by refresh()


def entity(**parts: str | None) -> QuotaEntity:
    return QuotaEntity.of({kind.replace("_", "-"): name for kind, name in parts.items()})


def session(user: str) -> Session:
    return Session(client_host="127.0.0.1", principal=KafkaPrincipal("User", user))


def test_rate_and_throttle_time_as_kafka_quota_violation() -> None:
    """ClientQuotaManagerTest.testQuotaViolation: a default client-id quota of 500 B/s; 400 B/s for 10 s is within
    it, a spike of 2300 after 0.5 s makes 6300 B over 10.5 s = 600 B/s, throttled (600 - 500) / 500 * 10.5 s."""
    clock = Clock()
    quotas = manager({entity(client_id=None): {PRODUCER_BYTE_RATE: 500}}, clock)
    for _ in range(10):
        assert quotas.record(PRODUCER_BYTE_RATE, session("ANONYMOUS"), "unknown", 400) == 0
        clock.ms += 1000
    clock.ms += 500
    assert quotas.record(PRODUCER_BYTE_RATE, session("ANONYMOUS"), "unknown", 2300) == 2100
    clock.ms += 2100  # the connection is read again after its throttle time
    for _ in range(10):  # delays go on until the bursty sample has rolled out of the window
        quotas.record(PRODUCER_BYTE_RATE, session("ANONYMOUS"), "unknown", 400)
        clock.ms += 1000
    assert quotas.record(PRODUCER_BYTE_RATE, session("ANONYMOUS"), "unknown", 0) == 0


def test_rate_window_is_at_least_the_samples_but_one() -> None:
    rate = Rate()
    assert rate.window_size_ms(0) == (QUOTA_WINDOW_NUM - 1) * 1000  # a first value is not measured over a moment
    assert record_and_throttle_ms(rate, 10_000, 1000, 0) == 0  # 10 KB over 10 s: exactly 1000 B/s
    assert record_and_throttle_ms(rate, 1000, 1000, 0) == 1000  # 11 KB over 10 s: (1100 - 1000) / 1000 * 10 s


def test_precedence_as_kafka_quota_config_precedence() -> None:
    """ClientQuotaManagerTest.testQuotaConfigPrecedence: each check records value * quota.window.num at one instant
    (no time passes), so it is throttled iff the sum recorded on its entity's rate exceeds bound * 10 s."""
    clock = Clock()
    configured: dict[QuotaEntity, dict[str, float]] = {
        entity(user=None): {PRODUCER_BYTE_RATE: 1000},
        entity(client_id=None): {PRODUCER_BYTE_RATE: 2000},
        entity(user=None, client_id=None): {PRODUCER_BYTE_RATE: 3000},
        entity(user="userA"): {PRODUCER_BYTE_RATE: 4000},
        entity(user="userA", client_id="client1"): {PRODUCER_BYTE_RATE: 5000},
        entity(user="userB"): {PRODUCER_BYTE_RATE: 6000},
        entity(user="userB", client_id="client1"): {PRODUCER_BYTE_RATE: 7000},
        entity(user="userB", client_id=None): {PRODUCER_BYTE_RATE: 8000},
        entity(user="userC"): {PRODUCER_BYTE_RATE: 10000},
        entity(client_id="client1"): {PRODUCER_BYTE_RATE: 9000},
    }
    quotas = manager(configured, clock)

    def check(user: str, client_id: str, bound: float, value: float, throttled: bool) -> None:
        found = quotas.quota(PRODUCER_BYTE_RATE, user, client_id)
        assert found is not None and found[0] == bound, (user, client_id)
        assert quotas.max_value_in_window(PRODUCER_BYTE_RATE, session(user), client_id) == bound * (QUOTA_WINDOW_NUM - 1)
        throttle_ms = quotas.record(PRODUCER_BYTE_RATE, session(user), client_id, value * QUOTA_WINDOW_NUM)
        assert (throttle_ms > 0) == throttled, (user, client_id, value, throttle_ms)

    def alter(changed: QuotaEntity, bound: float | None) -> None:
        if bound is None:
            del configured[changed]
        else:
            configured[changed] = {PRODUCER_BYTE_RATE: bound}
        quotas.update(configured)

    check("userA", "client1", 5000, 4500, False)  # <user, client> quota takes precedence over <user>
    check("userA", "client2", 4000, 4500, True)  # <user> quota takes precedence over <client> and defaults
    check("userA", "client3", 4000, 0, True)  # <user> quota is shared across clients of user
    check("userA", "client1", 5000, 0, False)  # <user, client> is exclusive use, unaffected by other clients
    check("userB", "client1", 7000, 8000, True)
    check("userB", "client2", 8000, 7000, False)  # default per-client quota for exclusive use of <user, client>
    check("userB", "client3", 8000, 7000, False)
    check("userD", "client1", 3000, 3500, True)  # default <user, client> quota
    check("userD", "client2", 3000, 2500, False)
    check("userE", "client1", 3000, 2500, False)
    alter(entity(user=None, client_id=None), None)  # back to the default <user> quota
    check("userD", "client1", 1000, 0, False)  # another rate: the counter restarts
    check("userE", "client4", 1000, 1500, True)
    check("userF", "client4", 1000, 800, False)  # the default <user> quota is shared across clients of the user
    check("userF", "client5", 1000, 800, True)
    alter(entity(user=None), None)  # back to the default <client-id> quota
    check("userF", "client4", 2000, 0, False)  # shared across client ids of all users
    check("userF", "client5", 2000, 0, False)
    check("userF", "client5", 2000, 2500, True)
    check("userG", "client5", 2000, 0, True)
    alter(entity(user="userA"), 8000)
    alter(entity(user="userA", client_id="client1"), 10000)
    check("userA", "client2", 8000, 0, False)
    check("userA", "client2", 8000, 4500, True)  # throttled by the sum of new and earlier values
    check("userA", "client1", 10000, 0, False)
    check("userA", "client1", 10000, 6000, True)
    alter(entity(user="userA", client_id="client1"), None)
    check("userA", "client6", 8000, 0, True)  # throttled by the shared user quota
    alter(entity(user="userA", client_id="client6"), 11000)
    check("userA", "client6", 11000, 8500, False)
    alter(entity(user="userA", client_id=None), 12000)
    alter(entity(user="userA", client_id="client6"), None)
    check("userA", "client6", 12000, 4000, True)  # throttled by the sum of new and earlier values


def test_no_quota_no_throttle_and_keys_apart() -> None:
    clock = Clock()
    quotas = manager({entity(client_id="slow"): {CONSUMER_BYTE_RATE: 10}}, clock)
    assert quotas.record(PRODUCER_BYTE_RATE, session("ANONYMOUS"), "slow", 10**9) == 0  # a consumer quota only
    assert quotas.max_value_in_window(PRODUCER_BYTE_RATE, session("ANONYMOUS"), "slow") is None
    assert quotas.record(CONSUMER_BYTE_RATE, session("ANONYMOUS"), "other", 10**9) == 0
    assert quotas.record(CONSUMER_BYTE_RATE, session("ANONYMOUS"), "slow", 1000) > 0


def test_connection_rate_per_address_and_default() -> None:
    clock = Clock()
    quotas = manager({entity(ip="127.0.0.1"): {CONNECTION_CREATION_RATE: 2}, entity(ip=None): {CONNECTION_CREATION_RATE: 100}}, clock)
    assert [quotas.record_connection("127.0.0.1") for _ in range(20)] == [0] * 20  # 20 over the 10 s window: 2/s
    assert 0 < quotas.record_connection("127.0.0.1") <= 1000  # bounded by one window, as Kafka's
    assert quotas.record_connection("127.0.0.1") > 0  # a throttled connection is not counted: still 20
    assert quotas.connection_rate("10.0.0.9") == 100
    clock.ms += 11_000
    assert quotas.record_connection("127.0.0.1") == 0


def test_entities_keys_and_filters_refused_with_kafkas_messages() -> None:
    refusals = {
        lambda: entity_from([("group", "g")]): "Unhandled client quota entity type: group",
        lambda: entity_from([]): "Invalid empty client quota entity",
        lambda: entity_from([(USER, "")]): "Empty user not supported",
        lambda: entity_from([(USER, "a"), (USER, "b")]): "Invalid client quota entity, duplicate entity entry user",
        lambda: entity_from([(IP, "1.2.3.4"), (CLIENT_ID, "c")]): "Invalid quota entity combination, IP entity should not be combined with User or ClientId",
        lambda: entity_from([(IP, "not-an-address")]): "not-an-address is not a valid IP or resolvable host.",
        lambda: check_ops(entity(user="u"), [("bogus", 1.0)]): "Invalid configuration key bogus",
        lambda: check_ops(entity(user="u"), [(CONNECTION_CREATION_RATE, 1.0)]): "Invalid configuration key connection_creation_rate",
        lambda: check_ops(entity(ip="1.2.3.4"), [(PRODUCER_BYTE_RATE, 1.0)]): "Invalid configuration key producer_byte_rate",
        lambda: check_ops(entity(user="u"), [(PRODUCER_BYTE_RATE, 0.0)]): "Quota producer_byte_rate must be greater than 0",
        lambda: check_ops(entity(user="u"), [(PRODUCER_BYTE_RATE, 1.5)]): "producer_byte_rate cannot be a fractional value.",
        lambda: check_ops(entity(ip=None), [(CONNECTION_CREATION_RATE, 2.0**31)]): "Proposed value for connection_creation_rate is too large for an INT.",
        lambda: check_ops(entity(user="u"), [(PRODUCER_BYTE_RATE, 1.0), (PRODUCER_BYTE_RATE, 2.0)]): "Duplicate quota key producer_byte_rate",
        lambda: filter_from([("", 0, "x")], False): "Invalid empty entity type.",
        lambda: filter_from([(USER, 0, None)], False): "Request specified MATCH_TYPE_EXACT, but set match string to null.",
        lambda: filter_from([(USER, 1, "x")], False): "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
        lambda: filter_from([(USER, 2, None), (USER, 2, None)], False): "Entity type user cannot appear more than once in the filter.",
        lambda: filter_from([(IP, 2, None), (USER, 2, None)], False): "IP filter component should not be used with user or clientId",
        lambda: filter_from([(USER, 7, None)], False): "Unknown match type 7",
    }
    for call, message in refusals.items():
        with pytest.raises(QuotaRequestError, match=message.replace(".", r"\.").replace("(", r"\(")):
            call()
    for key in ("request_percentage", "controller_mutation_rate"):
        with pytest.raises(QuotaRequestError, match=f"{key} is a Kafka quota the agent does not enforce"):
            check_ops(entity(user="u"), [(key, 10.0)])
    assert check_ops(entity(user="u"), [("request_percentage", None)]) == {"request_percentage": None}  # removing is never refused


# -- the APIs, through kafka-python's own requests ---------------------------------------------------------------


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    """The suite's cluster with the topic the clients here use."""
    create_topic(catalog, "quota", partitions=1)
    return catalog


@pytest.fixture
def admin(agent: RunningAgent) -> Iterator[KafkaAdminClient]:
    client = KafkaAdminClient(bootstrap_servers=agent.bootstrap, client_id="quota-admin")
    try:
        yield client
    finally:
        client.close()


def send(admin: KafkaAdminClient, request: Any) -> Any:
    """A request sent by kafka-python's client (its encoding, the version it negotiates): kafka-python 3.0 has the
    quota APIs' messages and no admin method for them; confluent-kafka 2.16 has neither."""
    manager = admin._manager
    return manager.run(manager.send, request)


def alter_request(entries: list[tuple[list[tuple[str, str | None]], list[tuple[str, float | None]]]], validate_only: bool = False) -> Any:
    entry = AlterClientQuotasRequest.EntryData
    return AlterClientQuotasRequest(validate_only=validate_only, entries=[
        entry(entity=[entry.EntityData(entity_type=kind, entity_name=name) for kind, name in parts],
              ops=[entry.OpData(key=key, value=0.0 if value is None else value, remove=value is None) for key, value in ops])
        for parts, ops in entries
    ])


def describe_request(components: list[tuple[str, int, str | None]], strict: bool = False) -> Any:
    component = DescribeClientQuotasRequest.ComponentData
    return DescribeClientQuotasRequest(strict=strict, components=[component(entity_type=kind, match_type=match_type, match=match)
                                                                  for kind, match_type, match in components])


def described(response: Any) -> dict[tuple[tuple[str, str | None], ...], dict[str, float]]:
    assert response.error_code == ERROR_NONE, response.error_message
    return {tuple((part.entity_type, part.entity_name) for part in entry.entity): {value.key: value.value for value in entry.values}
            for entry in response.entries}


def test_alter_and_describe_client_quotas(agent: RunningAgent, admin: KafkaAdminClient, catalog: Catalog) -> None:
    response = send(admin, alter_request([
        ([(USER, "alice"), (CLIENT_ID, "app")], [(PRODUCER_BYTE_RATE, 1_000_000.0), (CONSUMER_BYTE_RATE, 2_000_000.0)]),
        ([(CLIENT_ID, None)], [(PRODUCER_BYTE_RATE, 500_000.0)]),
        ([(IP, "127.0.0.1")], [(CONNECTION_CREATION_RATE, 100.0)]),
        ([(USER, "bob")], [("request_percentage", 50.0)]),
        ([(IP, "10.0.0.1"), (USER, "carol")], [(CONNECTION_CREATION_RATE, 1.0)]),
        ([("group", "g")], [(PRODUCER_BYTE_RATE, 1.0)]),
    ]))
    results = [(entry.error_code, entry.error_message) for entry in response.entries]
    assert results[:3] == [(ERROR_NONE, None)] * 3
    assert results[3][0] == INVALID_REQUEST and "request_percentage is a Kafka quota the agent does not enforce" in results[3][1]
    assert results[4] == (INVALID_REQUEST, "Invalid quota entity combination, IP entity should not be combined with User or ClientId")
    assert results[5] == (INVALID_REQUEST, "Unhandled client quota entity type: group")

    everything = described(send(admin, describe_request([])))
    assert everything == {
        (("user", "alice"), ("client-id", "app")): {PRODUCER_BYTE_RATE: 1_000_000.0, CONSUMER_BYTE_RATE: 2_000_000.0},
        (("client-id", None),): {PRODUCER_BYTE_RATE: 500_000.0},
        (("ip", "127.0.0.1"),): {CONNECTION_CREATION_RATE: 100.0},
    }
    assert described(send(admin, describe_request([(USER, 0, "alice")]))) == {(("user", "alice"), ("client-id", "app")): everything[(("user", "alice"), ("client-id", "app"))]}
    assert described(send(admin, describe_request([(USER, 0, "alice")], strict=True))) == {}
    assert described(send(admin, describe_request([(CLIENT_ID, 1, None)], strict=True))) == {(("client-id", None),): {PRODUCER_BYTE_RATE: 500_000.0}}
    assert set(described(send(admin, describe_request([(CLIENT_ID, 2, None)])))) == {(("user", "alice"), ("client-id", "app")), (("client-id", None),)}
    assert set(described(send(admin, describe_request([(IP, 2, None)])))) == {(("ip", "127.0.0.1"),)}

    refused = send(admin, describe_request([(IP, 2, None), (USER, 2, None)]))
    assert refused.error_code == INVALID_REQUEST and "IP filter component should not be used" in refused.error_message
    assert send(admin, describe_request([("group", 2, None)])).error_code == UNSUPPORTED_VERSION

    # validate_only checks and writes nothing; a removal takes the key away, and the entity with its last key
    response = send(admin, alter_request([([(CLIENT_ID, None)], [(PRODUCER_BYTE_RATE, None)])], validate_only=True))
    assert response.entries[0].error_code == ERROR_NONE
    assert (("client-id", None),) in described(send(admin, describe_request([])))
    send(admin, alter_request([([(CLIENT_ID, None)], [(PRODUCER_BYTE_RATE, None)]), ([(USER, "alice"), (CLIENT_ID, "app")], [(CONSUMER_BYTE_RATE, None)])]))
    assert described(send(admin, describe_request([]))) == {
        (("user", "alice"), ("client-id", "app")): {PRODUCER_BYTE_RATE: 1_000_000.0},
        (("ip", "127.0.0.1"),): {CONNECTION_CREATION_RATE: 100.0},
    }
    # this agent enforces its own alteration at once
    assert agent.server.broker.quotas.quota(PRODUCER_BYTE_RATE, "alice", "app") == (1_000_000.0, (PRODUCER_BYTE_RATE, "alice", "app"))
    assert agent.server.broker.quotas.quota(PRODUCER_BYTE_RATE, "ANONYMOUS", "other") is None
    assert catalog.client_quotas() == {entity(user="alice", client_id="app"): {PRODUCER_BYTE_RATE: 1_000_000.0},
                                       entity(ip="127.0.0.1"): {CONNECTION_CREATION_RATE: 100.0}}


# -- enforced on real clients ----------------------------------------------------------------------------------


@pytest.fixture
def quota_agent(catalog: Catalog) -> Iterator[RunningAgent]:
    """An agent taking batches of up to 1 MB (Kafka's default), so producers batch as they do against Kafka."""
    running = RunningAgent(catalog, flush_interval_ms=10)
    try:
        yield running
    finally:
        running.stop()


def set_quota(catalog: Catalog, agent: RunningAgent, quota_entity: QuotaEntity, key: str, value: float) -> None:
    catalog.alter_client_quotas([(quota_entity, {key: value})])
    agent.call(agent.server.broker.quotas.refresh())


class Produced:
    """A confluent-kafka producer of 1 KiB values as fast as it is let, its acknowledged bytes by time and the
    throttle windows its statistics report (librdkafka's per-broker `throttle`)."""

    def __init__(self, bootstrap: str, client_id: str) -> None:
        self.acked: list[tuple[float, int]] = []
        self.throttle_max_ms = 0
        self.producer = Producer({
            "bootstrap.servers": bootstrap, "client.id": client_id, "acks": "all", "linger.ms": 5,
            "queue.buffering.max.kbytes": 512, "batch.size": 64 * KIB, "statistics.interval.ms": 500, "stats_cb": self._stats,
        })

    def _stats(self, stats: str) -> None:
        for broker in json.loads(stats)["brokers"].values():
            self.throttle_max_ms = max(self.throttle_max_ms, broker["throttle"]["max"])

    def _delivered(self, error: Any, message: Any) -> None:
        assert error is None, error
        self.acked.append((time.monotonic(), len(message.value())))

    def run(self, seconds: float, paced_seconds: float = 0, paced_rate: float = 0) -> None:
        """Produce for `seconds`, the first `paced_seconds` at no more than `paced_rate` bytes per second."""
        value = b"v" * KIB
        start = time.monotonic()
        end, paced_until, sent = start + seconds, start + paced_seconds, 0
        while (now := time.monotonic()) < end:
            if now < paced_until and sent >= paced_rate * (now - start):
                self.producer.poll(0.001)
                continue
            sent += KIB
            try:
                self.producer.produce("quota", value, on_delivery=self._delivered)
            except BufferError:
                self.producer.poll(0.02)
            self.producer.poll(0)
        self.producer.flush(30)

    def rate(self, start: float, end: float) -> float:
        return sum(size for at, size in self.acked if start <= at < end) / (end - start)


# A client at full speed from its first byte gets the first window's allowance at once (Kafka's rate takes a quota's
# first moments as the samples but one, 10 s, so quota * 10 s passes unthrottled), and that heavy sample comes back
# as a burst each time it leaves the window: the rate rings around the quota with the window's period, a 30 s view
# of it 0.85 to 1.1 of the quota by its phase (Kafka's brokers alike). The clients here first go at the quota for a
# window, so the window holds an even history, then as fast as they are let, and the rate measured is then steady.
WARM_SECONDS = 12


@SQLITE_ONLY
def test_producer_quota_throttles_one_client_id_and_not_another(catalog: Catalog, quota_agent: RunningAgent) -> None:
    """1 MB/s on one client id: its producer (acks=all, 1 KiB values) going as fast as it is let is within 10% of it
    over 30 s, and librdkafka reports the throttling; a producer with another client id on the same agent keeps well
    above it meanwhile."""
    quota = 1_000_000
    set_quota(catalog, quota_agent, entity(client_id="throttled"), PRODUCER_BYTE_RATE, quota)
    throttled, free = Produced(quota_agent.bootstrap, "throttled"), Produced(quota_agent.bootstrap, "free")
    start = time.monotonic()
    running = threading.Thread(target=throttled.run, args=(WARM_SECONDS + 31, WARM_SECONDS, quota))
    running.start()
    time.sleep(WARM_SECONDS + 10)
    free.run(4)
    running.join()
    measured = throttled.rate(start + WARM_SECONDS, start + WARM_SECONDS + 30)
    assert abs(measured - quota) <= 0.1 * quota, f"throttled producer: {measured:.0f} B/s against its quota of {quota}"
    assert throttled.throttle_max_ms > 0, "librdkafka reported no throttling"
    free_rate = free.rate(free.acked[0][0], free.acked[-1][0])
    assert free_rate > 3 * quota, f"the other producer made only {free_rate:.0f} B/s"
    assert free.throttle_max_ms == 0


@SQLITE_ONLY
def test_consumer_quota_throttles_a_consumer(catalog: Catalog, quota_agent: RunningAgent) -> None:
    """500 kB/s on a consumer's client id: reading as fast as it is let, it reads within 10% of it over 20 s."""
    quota = 500_000
    filler = Produced(quota_agent.bootstrap, "filler")
    value = b"c" * KIB
    for _ in range(18_000):  # 18 MB: the first window's 5 MB and 20 s at the quota, with room
        while True:
            try:
                filler.producer.produce("quota", value)
                break
            except BufferError:
                filler.producer.poll(0.05)
    assert filler.producer.flush(60) == 0
    set_quota(catalog, quota_agent, entity(client_id="slow-reader"), CONSUMER_BYTE_RATE, quota)
    consumer = Consumer({
        "bootstrap.servers": quota_agent.bootstrap, "client.id": "slow-reader", "group.id": "quota-readers",
        "enable.auto.commit": False, "max.partition.fetch.bytes": 64 * KIB, "queued.max.messages.kbytes": 256,
        "statistics.interval.ms": 500, "stats_cb": lambda stats: throttles.extend(b["throttle"]["max"] for b in json.loads(stats)["brokers"].values()),
    })
    throttles: list[int] = []
    consumer.assign([TopicPartition("quota", 0, 0)])
    read: list[tuple[float, int]] = []
    start = time.monotonic()
    try:
        while (now := time.monotonic()) < start + WARM_SECONDS + 20:
            if now < start + WARM_SECONDS and sum(size for _, size in read) >= quota * (now - start):
                time.sleep(0.001)
                continue
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                read.append((time.monotonic(), len(message.value())))
    finally:
        consumer.close()
    assert sum(size for _, size in read) < 18_000 * KIB, "the consumer read everything: no throttling to measure"
    measured = sum(size for at, size in read if at >= start + WARM_SECONDS) / 20
    assert abs(measured - quota) <= 0.1 * quota, f"throttled consumer: {measured:.0f} B/s against its quota of {quota}"
    assert max(throttles) > 0, "librdkafka reported no throttling"


def test_connection_creation_rate_per_address(agent: RunningAgent, catalog: Catalog) -> None:
    """2 connections/s from 127.0.0.1: the first window takes 20 (2/s over 10 s); the next are closed unanswered,
    after their throttle time; connections from 127.0.0.2 are not limited."""
    set_quota(catalog, agent, entity(ip="127.0.0.1"), CONNECTION_CREATION_RATE, 2)
    host, port = agent.server.address.host, agent.server.address.port

    def answered(source: str, count: int) -> list[bool]:
        sockets = []
        for _ in range(count):
            connection = socket.create_connection((host, port), timeout=10, source_address=(source, 0))
            sockets.append(connection)
            time.sleep(0.005)  # accepted in order
        outcomes = []
        for index, connection in enumerate(sockets):
            with connection:
                connection.sendall(kio_frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}, correlation_id=index))
                try:
                    receive_frame(connection)
                    outcomes.append(True)
                except (ConnectionError, EOFError, AssertionError):
                    outcomes.append(False)
        return outcomes

    limited = answered("127.0.0.1", 26)
    assert limited == [True] * 20 + [False] * 6
    assert answered("127.0.0.2", 26) == [True] * 26


@SQLITE_ONLY
def test_throttled_connection_is_read_again_only_after_its_throttle_time(catalog: Catalog) -> None:
    """KIP-219 on the wire: a Produce over its client id's quota is answered with the throttle time and the next
    request on that connection only after it, at acks=0 too (no answer, the connection muted all the same); a muted
    connection is not idle, however short the idle bound."""
    running = RunningAgent(catalog, flush_interval_ms=50, connections_max_idle_ms=300)
    try:
        batch = keyed_batch(120)
        first = produce_request(9, 5, {("quota", 0): batch}, acks=1)
        # taking the rate 15% over the quota (its first 10 s allowance and 15% more): throttled 1.5 s
        set_quota(catalog, running, entity(client_id="test"), PRODUCER_BYTE_RATE, (len(first) - 4) // 11.5)  # kio_frame's client id
        api_versions = kio_frame(18, 3, {"client_software_name": "t", "client_software_version": "1"}, correlation_id=9)
        with connect(running.server) as connection:
            connection.settimeout(30)
            connection.sendall(first)
            _, answered = produce_response(frame := receive_frame(connection), 9)
            throttle_ms = produce_throttle_ms(frame)
            assert answered[("quota", 0)].error_code == ERROR_NONE and 1000 < throttle_ms <= 1500
            sent = time.monotonic()
            connection.sendall(api_versions)
            receive_frame(connection)
            assert time.monotonic() - sent >= throttle_ms / 1000 - 0.05
        with connect(running.server) as connection:
            connection.settimeout(30)
            connection.sendall(produce_request(9, 6, {("quota", 0): keyed_batch(12)}, acks=0))  # over it again: 2-3 s
            sent = time.monotonic()
            time.sleep(0.1)  # handled before the next request comes: requests read ahead of a throttle are not held
            connection.sendall(api_versions)
            receive_frame(connection)  # the ApiVersions answer: the Produce has none
            assert time.monotonic() - sent > 0.5
    finally:
        running.stop()


def produce_throttle_ms(frame: bytes) -> int:
    """A Produce v9 answer's throttle_time_ms, its last field before the tagged fields."""
    return int.from_bytes(frame[-5:-1], "big", signed=True)


# -- the CLI ---------------------------------------------------------------------------------------------------


def quota_cli(catalog: Catalog, *args: str) -> Any:
    return CliRunner().invoke(cli, ["--store", catalog.store.uri, "--catalog", catalog.url, "quota", *args])


def test_quota_cli_sets_lists_and_removes_what_agents_enforce(agent: RunningAgent, admin: KafkaAdminClient, catalog: Catalog) -> None:
    done = quota_cli(catalog, "set", "--user", "alice", "--client-id-default", "--producer-byte-rate", "2000000", "--json")
    assert done.exit_code == 0, done.output
    assert json.loads(done.output) == {"entity": {"user": "alice", "client-id": None}, "quotas": {"producer_byte_rate": 2000000}}
    assert quota_cli(catalog, "set", "--ip-default", "--connection-creation-rate", "50").exit_code == 0
    agent.call(agent.server.broker.quotas.refresh())  # as its refresh does within REFRESH_SECONDS
    assert agent.server.broker.quotas.quota(PRODUCER_BYTE_RATE, "alice", "any") == (2_000_000.0, (PRODUCER_BYTE_RATE, "alice", "any"))
    assert agent.server.broker.quotas.connection_rate("10.1.2.3") == 50
    # what the CLI wrote, DescribeClientQuotas answers, and what AlterClientQuotas wrote, the CLI lists
    assert described(send(admin, describe_request([(USER, 0, "alice")]))) == {(("user", "alice"), ("client-id", None)): {PRODUCER_BYTE_RATE: 2_000_000.0}}
    send(admin, alter_request([([(CLIENT_ID, "app")], [(CONSUMER_BYTE_RATE, 300_000.0)])]))
    listed = quota_cli(catalog, "list", "--client-id", "app", "--json")
    assert [json.loads(line) for line in listed.output.splitlines()] == [{"entity": {"client-id": "app"}, "quotas": {"consumer_byte_rate": 300000}}]
    table = quota_cli(catalog, "list").output.splitlines()
    assert table[0].split() == ["ENTITY", "QUOTAS"] and len(table) == 4

    removed = quota_cli(catalog, "remove", "--client-id", "app", "--json")
    assert json.loads(removed.output) == {"entity": {"client-id": "app"}, "removed": ["consumer_byte_rate"]}
    refusals = {
        ("set", "--ip", "10.0.0.1", "--producer-byte-rate", "5"): "Invalid configuration key producer_byte_rate",
        ("set", "--user", "a", "--ip", "10.0.0.1", "--connection-creation-rate", "5"): "IP entity should not be combined with User or ClientId",
        ("set", "--client-id", "x", "--client-id-default", "--producer-byte-rate", "5"): "--client-id and --client-id-default name two entities",
        ("set", "--client-id", "x", "--producer-byte-rate", "0"): "Quota producer_byte_rate must be greater than 0",
        ("set", "--client-id", "x"): "no quota given",
        ("set", "--producer-byte-rate", "5"): "no entity given",
        ("remove", "--client-id", "app"): "client-id=app has no quota to remove",
        ("remove", "--user", "alice", "--client-id-default", "--key", "consumer_byte_rate"): "has no quota consumer_byte_rate (it has: producer_byte_rate)",
    }
    for args, message in refusals.items():
        refused = quota_cli(catalog, *args)
        assert refused.exit_code == 2 and message in refused.output, (args, refused.output)
    assert len(catalog.client_quotas()) == 2


@pytest.mark.parametrize("catalog_url", ["postgresql"], indirect=True)  # two agents share a catalog on PostgreSQL
def test_an_alteration_through_one_agent_applies_on_another_within_the_refresh(agent: RunningAgent, admin: KafkaAdminClient,
                                                                               catalog: Catalog) -> None:
    other = RunningAgent(catalog, flush_interval_ms=50)
    try:
        send(admin, alter_request([([(CLIENT_ID, "shared")], [(PRODUCER_BYTE_RATE, 4096.0)])]))
        assert agent.server.broker.quotas.quota(PRODUCER_BYTE_RATE, "ANONYMOUS", "shared") is not None  # at once here
        deadline = time.monotonic() + REFRESH_SECONDS + 2
        while other.server.broker.quotas.quota(PRODUCER_BYTE_RATE, "ANONYMOUS", "shared") is None:
            assert time.monotonic() < deadline, f"the other agent did not take the quota within {REFRESH_SECONDS} s"
            time.sleep(0.1)
    finally:
        other.stop()


def test_a_catalog_that_cannot_be_read_leaves_the_last_quotas(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    catalog.alter_client_quotas([(entity(client_id="kept"), {PRODUCER_BYTE_RATE: 100.0})])
    unreadable = Catalog(catalog.store, "postgresql+psycopg://nobody@127.0.0.1:1/none")  # no server on port 1
    quotas = ClientQuotaManager(unreadable, catalog.client_quotas())
    asyncio.run(quotas.refresh())
    assert quotas.quota(PRODUCER_BYTE_RATE, "ANONYMOUS", "kept") is not None
    assert "client quotas could not be read from the catalog (the last ones read stay in force)" in caplog.text
