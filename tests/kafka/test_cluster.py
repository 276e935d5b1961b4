"""Several `logcompact agent`s on one catalog (SQLite and PostgreSQL): each registers, Metadata and DescribeCluster
list the live ones, each client is led by one of them for every partition and clients are spread over them, and
clients bootstrapped on one are served by all."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient
from sqlalchemy import select

from logcompact.catalog import Catalog
from logcompact.catalog import schema as s
from logcompact.catalog.model import AgentEndpoint
from logcompact.exceptions import CommitConflictError, LogcompactError
from logcompact.kafka.cluster import ALIVE_MS
from logcompact.kafka.server import AgentServer
from tests.helpers import NOW, create_topic
from tests.kafka.agents import FAST_CLIENT, RunningAgent

PARTITIONS = 6

pytestmark = pytest.mark.timeout(90)


@contextmanager
def running_agent(catalog: Catalog) -> Iterator[AgentServer]:
    """An agent on its own event loop thread, on 127.0.0.1 and a free port, stopped on exit."""
    running = RunningAgent(catalog, flush_interval_ms=50)
    try:
        yield running.server
    finally:
        running.stop()


def test_two_agents_on_one_catalog_list_each_other_each_lead_every_partition_for_their_clients_and_both_serve(catalog: Catalog) -> None:
    create_topic(catalog, "orders", PARTITIONS, cleanup_policy="compact")
    # Each agent opens the catalog as a process of its own would.
    with running_agent(Catalog(catalog.store, catalog.url)) as first, running_agent(Catalog(catalog.store, catalog.url)) as second:
        nodes = {first.broker.node_id: first.address.port, second.broker.node_id: second.address.port}
        assert sorted(nodes) == [0, 1]
        admin = AdminClient({"bootstrap.servers": str(first.address), "client.id": "admin", **FAST_CLIENT})
        metadata = admin.list_topics(timeout=10)
        assert {b.id: b.port for b in metadata.brokers.values()} == nodes
        # One leader of every partition for a client, the same on either agent; clients spread over both by their ids.
        leader_of_client = {client: first.broker.agents.leader_for(client, "127.0.0.1", "PLAINTEXT").node_id for client in (f"client-{n}" for n in range(20))}
        assert leader_of_client == {client: second.broker.agents.leader_for(client, "127.0.0.1", "PLAINTEXT").node_id for client in leader_of_client}
        assert {p.leader for p in metadata.topics["orders"].partitions.values()} == {first.broker.agents.leader_for("admin", "127.0.0.1", "PLAINTEXT").node_id}
        assert set(leader_of_client.values()) == {0, 1}
        cluster = admin.describe_cluster(request_timeout=10).result()
        assert (cluster.controller.id, sorted(n.id for n in cluster.nodes)) == (0, [0, 1])

        # Bootstrapped on the first, a producer led by each agent writes every partition there: both agents take writes.
        delivered: list[tuple[int, int]] = []
        for node in (0, 1):
            client = next(client for client, leader in leader_of_client.items() if leader == node)
            producer = Producer({"bootstrap.servers": str(first.address), "client.id": client, "acks": "all", "linger.ms": 5, **FAST_CLIENT})
            assert {p.leader for p in producer.list_topics("orders", timeout=10).topics["orders"].partitions.values()} == {node}
            for n in range(300 * node, 300 * node + 300):
                producer.produce("orders", key=f"k{n}".encode(), value=f"v{n}".encode(), partition=n % PARTITIONS,
                                 on_delivery=lambda err, msg: delivered.append((msg.partition(), msg.offset())) if err is None else None)
            assert producer.flush(30) == 0
        assert sorted(delivered) == sorted((p, o) for p in range(PARTITIONS) for o in range(100))
        assert first.broker.ingest.flushes.records == second.broker.ingest.flushes.records == 300

        # Bootstrapped on the second, a consumer reads every partition, whichever agent leads it.
        consumer = Consumer({"bootstrap.servers": str(second.address), "group.id": "unused", "enable.auto.commit": False, **FAST_CLIENT})
        consumer.assign([TopicPartition("orders", p, 0) for p in range(PARTITIONS)])
        seen: set[tuple[int, int]] = set()
        while len(seen) < 600:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, message and message.error()
            assert message.value() == f"v{int(message.key()[1:])}".encode()
            seen.add((message.partition(), message.offset()))
        consumer.close()

        # A stopped agent leaves the list at once.
    with running_agent(Catalog(catalog.store, catalog.url)) as alone:
        metadata = AdminClient({"bootstrap.servers": str(alone.address), **FAST_CLIENT}).list_topics(timeout=10)
        assert [b.id for b in metadata.brokers.values()] == [alone.broker.node_id]
        assert {p.leader for p in metadata.topics["orders"].partitions.values()} == {alone.broker.node_id}


def test_node_ids_are_kept_per_address_never_shared_by_live_agents_and_freed_by_silence(catalog: Catalog) -> None:
    create_topic(catalog, "orders", 1)
    assert catalog.register_agent("10.0.0.1", 9092, None, None, NOW, ALIVE_MS, plaintext("10.0.0.1")) == 0
    assert catalog.register_agent("10.0.0.2", 9092, "az-b", None, NOW, ALIVE_MS, plaintext("10.0.0.2")) == 1
    assert catalog.register_agent("10.0.0.1", 9092, None, None, NOW + 5, ALIVE_MS, plaintext("10.0.0.1")) == 0  # a restart keeps its id
    with pytest.raises(LogcompactError, match=r"node id 1 is held by the live agent at 10.0.0.2:9092 .*pass another --node-id"):
        catalog.register_agent("10.0.0.3", 9092, None, 1, NOW + 5, ALIVE_MS, plaintext("10.0.0.3"))
    live = catalog.agent_heartbeat(0, "10.0.0.1", 9092, NOW + 6, ALIVE_MS)
    assert [(a.node_id, a.host, a.rack) for a in live] == [(0, "10.0.0.1", None), (1, "10.0.0.2", "az-b")]
    later = NOW + ALIVE_MS + 10  # agent 1 fell silent: it is out of the list, and its id may be taken
    assert [a.node_id for a in catalog.agent_heartbeat(0, "10.0.0.1", 9092, later, ALIVE_MS)] == [0]
    assert catalog.register_agent("10.0.0.3", 9092, None, 1, later, ALIVE_MS, plaintext("10.0.0.3")) == 1
    with pytest.raises(CommitConflictError, match=r"node id 1 at 10.0.0.2:9092 is no longer registered"):
        catalog.agent_heartbeat(1, "10.0.0.2", 9092, later, ALIVE_MS)  # the silent one wakes: told to restart
    catalog.deregister_agent(0)
    assert [a.node_id for a in catalog.agent_heartbeat(1, "10.0.0.3", 9092, later + 1, ALIVE_MS)] == [1]


def plaintext(host: str) -> list[AgentEndpoint]:
    return [AgentEndpoint("PLAINTEXT", host, 9092)]


def test_endpoints_per_listener_are_listed_with_the_live_agents_replaced_with_a_node_id_and_removed_with_the_agent(catalog: Catalog) -> None:
    create_topic(catalog, "orders", 1)
    both = [AgentEndpoint("PLAINTEXT", "10.0.0.1", 9092), AgentEndpoint("SSL", "agent-0.example", 9093)]
    assert catalog.register_agent("10.0.0.1", 9092, None, None, NOW, ALIVE_MS, both) == 0
    assert catalog.register_agent("10.0.0.2", 9092, None, None, NOW, ALIVE_MS, plaintext("10.0.0.2")) == 1
    live = catalog.live_agents(NOW, ALIVE_MS)
    assert [a.endpoints for a in live] == [tuple(both), tuple(plaintext("10.0.0.2"))]
    assert live[0].endpoint("SSL") == AgentEndpoint("SSL", "agent-0.example", 9093) and live[1].endpoint("SSL") is None
    later = NOW + ALIVE_MS + 10  # agent 1 fell silent; another takes its id, with its own endpoints only
    catalog.register_agent("10.0.0.3", 9093, None, 1, later, ALIVE_MS, [AgentEndpoint("SSL", "10.0.0.3", 9093)])
    assert [a.endpoints for a in catalog.agent_heartbeat(1, "10.0.0.3", 9093, later, ALIVE_MS)] == [(AgentEndpoint("SSL", "10.0.0.3", 9093),)]
    catalog.deregister_agent(1)
    with catalog.engine.connect() as connection:
        rows = connection.execute(select(s.agent_endpoints.c.node_id, s.agent_endpoints.c.listener).order_by(s.agent_endpoints.c.listener)).all()
    assert [tuple(row) for row in rows] == [(0, "PLAINTEXT"), (0, "SSL")]


def test_a_consumer_group_bootstrapped_on_either_agent_is_coordinated_by_one_and_listed_once(catalog: Catalog) -> None:
    """The group's coordinator is one of the live agents; a consumer bootstrapped on the other finds it, consumes
    and commits; the other agent refuses group requests with NOT_COORDINATOR (the client follows FindCoordinator);
    AdminClient asks every agent and lists the group once; committed offsets are served by the coordinator."""
    create_topic(catalog, "orders", PARTITIONS, cleanup_policy="compact")
    with running_agent(Catalog(catalog.store, catalog.url)) as first, running_agent(Catalog(catalog.store, catalog.url)) as second:
        by_node = {first.broker.node_id: first, second.broker.node_id: second}
        first.broker.agents.refresh()  # as its next heartbeat would: the second agent started after it
        group = next(g for g in (f"group-{n}" for n in range(100)) if first.broker.agents.coordinator_for(g).node_id == second.broker.node_id)
        assert second.broker.agents.coordinator_for(group).node_id == second.broker.node_id  # both agents agree
        producer = Producer({"bootstrap.servers": str(first.address), "acks": "all", **FAST_CLIENT})
        for n in range(60):
            producer.produce("orders", key=b"k%d" % n, value=b"v", partition=n % PARTITIONS)
        assert producer.flush(30) == 0
        consumer = Consumer({"bootstrap.servers": str(first.address), "group.id": group, "auto.offset.reset": "earliest",
                             "enable.auto.commit": False, "session.timeout.ms": 6000, **FAST_CLIENT})
        consumer.subscribe(["orders"])
        read = 0
        while read < 60:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, message and message.error()
            read += 1
        consumer.commit(asynchronous=False)
        admin = AdminClient({"bootstrap.servers": str(first.address), **FAST_CLIENT})
        described = admin.describe_consumer_groups([group])[group].result(timeout=10)
        assert described.coordinator.id == second.broker.node_id
        listed = admin.list_consumer_groups().result(timeout=10)
        assert [g.group_id for g in listed.valid].count(group) == 1, listed.valid
        committed = consumer.committed([TopicPartition("orders", p) for p in range(PARTITIONS)], timeout=10)
        assert sorted(tp.offset for tp in committed) == [10] * PARTITIONS
        consumer.close()
        assert by_node[described.coordinator.id] is second
