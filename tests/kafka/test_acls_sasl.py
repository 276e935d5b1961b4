"""ACLs of named principals, authenticated by SASL (SCRAM-SHA-512) on `logcompact agent`: a super user grants through
confluent-kafka's AdminClient; a user allowed a prefix produces and consumes in a group, is refused a topic a DENY
covers and one it was never granted, and sees only the topics it may describe; a user granted nothing sees nothing,
joins no group, and may not read the users' credentials (KIP-554), which the super user may."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AclBinding, AclOperation, AclPermissionType, AdminClient, NewTopic, ResourcePatternType, ResourceType
from kafka import KafkaAdminClient
from kafka.errors import ClusterAuthorizationFailedError

from logcompact.catalog import Catalog
from logcompact.catalog.credentials import new_credential
from logcompact.kafka.authorizer import AuthorizerSettings
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.store.local import LocalStore
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent

pytestmark = pytest.mark.timeout(300)

PASSWORDS = {"admin": "admin-Pl4nted-acl-pw", "alice": "alice-Pl4nted-acl-pw", "bob": "bob-Pl4nted-acl-pw"}


@pytest.fixture
def agent(tmp_path: Path) -> Iterator[RunningAgent]:
    catalog = Catalog(LocalStore(tmp_path / "store"))
    catalog.ensure_created(1_700_000_000_000)
    for user, password in PASSWORDS.items():
        catalog.put_scram_credential(user, new_credential("SCRAM-SHA-512", password, 4096))
    running = RunningAgent(catalog, (Listener(SecurityProtocol.SASL_PLAINTEXT, Address("127.0.0.1", 0)),), flush_interval_ms=FLUSH_MS,
                           sasl_mechanisms=("SCRAM-SHA-512",), authorization=AuthorizerSettings("acl", ("User:admin",), False, 200))
    try:
        yield running
    finally:
        running.stop()


def as_user(agent: RunningAgent, user: str) -> dict[str, Any]:
    return {"bootstrap.servers": agent.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-512",
            "sasl.username": user, "sasl.password": PASSWORDS[user], **FAST_CLIENT}


def produce_one(agent: RunningAgent, user: str, topic: str) -> KafkaError | None:
    """The delivery report's error of one record `user` produces to `topic` (None: delivered)."""
    producer = Producer({**as_user(agent, user), "message.timeout.ms": 10000})
    reports: list[KafkaError | None] = []
    producer.produce(topic, b"value", b"key", partition=0, on_delivery=lambda error, _message: reports.append(error))
    producer.flush(20)
    assert len(reports) == 1
    return reports[0]


def test_named_principals_get_what_their_acls_allow(agent: RunningAgent) -> None:
    admin = AdminClient(as_user(agent, "admin"))
    allow, deny = AclPermissionType.ALLOW, AclPermissionType.DENY
    bindings = [
        AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.WRITE, allow),
        AclBinding(ResourceType.TOPIC, "orders", ResourcePatternType.PREFIXED, "User:alice", "*", AclOperation.READ, allow),
        AclBinding(ResourceType.TOPIC, "orders-audit", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.WRITE, deny),
        AclBinding(ResourceType.GROUP, "billing", ResourcePatternType.LITERAL, "User:alice", "*", AclOperation.READ, allow),
    ]
    for future in admin.create_acls(bindings, request_timeout=30).values():
        future.result(timeout=30)
    for future in admin.create_topics([NewTopic(name, 1, 1) for name in ("orders", "orders-audit", "hr")], request_timeout=30).values():
        future.result(timeout=30)

    assert produce_one(agent, "alice", "orders") is None
    assert produce_one(agent, "alice", "orders-audit").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED  # DENY wins over the prefix's ALLOW
    assert produce_one(agent, "alice", "hr").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert produce_one(agent, "bob", "orders").code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert set(Producer(as_user(agent, "alice")).list_topics(timeout=10).topics) == {"orders", "orders-audit"}  # READ and WRITE imply DESCRIBE
    assert set(Producer(as_user(agent, "bob")).list_topics(timeout=10).topics) == set()
    assert set(admin.list_topics(timeout=10).topics) == {"orders", "orders-audit", "hr"}  # the super user sees all

    consumer = Consumer({**as_user(agent, "alice"), "group.id": "billing", "auto.offset.reset": "earliest"})
    consumer.subscribe(["orders"])
    deadline, message = time.monotonic() + 30, None
    while message is None and time.monotonic() < deadline:
        message = consumer.poll(0.5)
    consumer.close()
    assert message is not None and message.error() is None and message.value() == b"value"

    refused = Consumer({**as_user(agent, "bob"), "group.id": "billing", "auto.offset.reset": "earliest"})
    refused.subscribe(["orders"])
    deadline, error = time.monotonic() + 30, None
    while error is None and time.monotonic() < deadline:
        polled = refused.poll(0.5)
        if polled is not None and polled.error() is not None:
            error = polled.error()
    refused.close()
    assert error is not None and error.code() == KafkaError.GROUP_AUTHORIZATION_FAILED, error


def test_only_a_principal_with_describe_on_the_cluster_reads_the_users_credentials(agent: RunningAgent) -> None:
    def admin_as(user: str) -> KafkaAdminClient:
        return KafkaAdminClient(bootstrap_servers=agent.bootstrap, security_protocol="SASL_PLAINTEXT", sasl_mechanism="SCRAM-SHA-512",
                                sasl_plain_username=user, sasl_plain_password=PASSWORDS[user])

    admin, bob_admin = admin_as("admin"), admin_as("bob")
    try:
        assert set(admin.describe_user_scram_credentials()) == set(PASSWORDS)
        with pytest.raises(ClusterAuthorizationFailedError):
            bob_admin.describe_user_scram_credentials()
    finally:
        admin.close()
        bob_admin.close()
    binding = AclBinding(ResourceType.TOPIC, "*", ResourcePatternType.LITERAL, "User:bob", "*", AclOperation.ALL, AclPermissionType.ALLOW)
    bob = AdminClient(as_user(agent, "bob"))  # kept: a client destroyed fails what it has pending
    (creating,) = bob.create_acls([binding], request_timeout=30).values()
    with pytest.raises(KafkaException) as refused:
        creating.result(timeout=30)
    assert refused.value.args[0].code() == KafkaError.CLUSTER_AUTHORIZATION_FAILED
