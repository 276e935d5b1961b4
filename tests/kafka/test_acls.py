"""Kafka's ACLs through `logcompact agent` with authorization on: every served API refused without its ACL, with
Kafka's error where Kafka puts it, and served once granted; the ACLs managed by kafka-python's and confluent-kafka's
admin clients, kafka-python's `admin acls` command, Kafka's own kafka-acls.sh and `logcompact acl`; a change made through one agent applied by
another within --acl-refresh-ms.

Clients here connect as User:ANONYMOUS (no TLS or SASL listener yet), so the end-to-end tests grant and deny it, or
User:*, and test host rules by the client's address; named principals and super users are tested on the authorizer
itself (test_authorizer.py).
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer
from confluent_kafka.admin import AclBinding as ConfluentAclBinding
from confluent_kafka.admin import AclBindingFilter as ConfluentAclBindingFilter
from confluent_kafka.admin import AclOperation as ConfluentAclOperation
from confluent_kafka.admin import AclPermissionType as ConfluentAclPermissionType
from confluent_kafka.admin import AdminClient
from confluent_kafka.admin import ResourcePatternType as ConfluentPatternType
from confluent_kafka.admin import ResourceType as ConfluentResourceType
from kafka.admin import ACL, ACLFilter, ACLOperation, ACLPermissionType, ACLResourcePatternType, KafkaAdminClient, ResourcePattern, ResourcePatternFilter
from kafka.admin import ResourceType as KafkaPythonResourceType

from lab.servers.kafka import kafka_missing_reason, tool_argv
from logcompact.catalog import Catalog
from logcompact.catalog.acls import CLUSTER_NAME, AclBinding, AclOperation, AclPermissionType, PatternType, ResourceType
from logcompact.catalog.groups import CommittedOffset
from logcompact.cli import cli
from logcompact.kafka.authorizer import AuthorizerSettings
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment
from tests.kafka.test_transactions import transactional_batch
from tests.kafka.wire import Wire, keyed_batch, receive_frame

pytestmark = pytest.mark.timeout(300)

TOPIC, OTHER, DOOMED, GROUP, TXN = "orders", "payments", "doomed", "g", "tx"
ANONYMOUS, EVERYONE = "User:ANONYMOUS", "User:*"
NONE, LEADER_NOT_AVAILABLE, OPERATION_NOT_ATTEMPTED = 0, 5, 55
TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, SECURITY_DISABLED, TXN_DENIED = 29, 30, 31, 54, 53
AUTHORIZATION_ERRORS = {TOPIC_DENIED, GROUP_DENIED, CLUSTER_DENIED, TXN_DENIED}
TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
DESCRIBE_TRANSACTIONS = 65
Op, Allow, Deny = AclOperation, AclPermissionType.ALLOW, AclPermissionType.DENY


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    for name in (TOPIC, OTHER, DOOMED):
        create_topic(catalog, name, 2)
    return catalog


def secured_agent(catalog: Catalog, refresh_ms: int = 5000) -> RunningAgent:
    """An agent with authorization on, whose one super user is not the clients' principal (ANONYMOUS)."""
    return RunningAgent(catalog, flush_interval_ms=FLUSH_MS, authorization=AuthorizerSettings("acl", ("User:admin",), acl_refresh_ms=refresh_ms))


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    running = secured_agent(catalog)
    try:
        yield running
    finally:
        running.stop()


def grant(agent: RunningAgent, *bindings: AclBinding) -> None:
    """Bindings written to the catalog as `logcompact acl add` writes them, and the agent's cache read again now."""
    agent.server.catalog.create_acls(bindings)
    agent.server.broker.authorizer.refresh()


def acl(kind: ResourceType, name: str, operation: AclOperation, permission: AclPermissionType = Allow, principal: str = ANONYMOUS,
        pattern: PatternType = PatternType.LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, operation, permission)


EVERYTHING = tuple(
    acl(kind, name, Op.ALL) for kind, name in
    ((ResourceType.TOPIC, "*"), (ResourceType.GROUP, "*"), (ResourceType.TRANSACTIONAL_ID, "*"), (ResourceType.CLUSTER, CLUSTER_NAME))
)


def call(agent: RunningAgent, api_key: int, version: int, body: dict[str, Any]) -> Any:
    wire = Wire(agent)
    try:
        if api_key == DESCRIBE_TRANSACTIONS:
            wire.send(api_key, version, body)
            wire.sent.clear()
            return receive_frame(wire.socket)
        return wire.call(api_key, version, body)
    finally:
        wire.close()


def described_transactions_errors(frame: bytes) -> list[int]:
    """DescribeTransactions v0's errors, read by hand: kio 0.5 cannot read the -1 start time of an id not described.
    The frame: correlation id, header tags, throttle time, the states' compact array, each an error code first."""
    count, at = frame[9] - 1, 10
    assert count == 1, "one transactional id asked"
    return [struct.unpack_from(">h", frame, at)[0]]


def partition_errors(topics: Any, partitions: str = "partitions", error: str = "error_code") -> list[int]:
    return [int(getattr(p, error)) for topic in topics for p in getattr(topic, partitions)]


def fetch_body(topic: str) -> dict[str, Any]:
    return {"replica_id": -1, "max_wait": 0, "min_bytes": 0, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
            "topics": [{"topic": topic, "partitions": [{"partition": 0, "fetch_offset": 0, "partition_max_bytes": 1 << 20}]}],
            "forgotten_topics_data": [], "rack_id": ""}


def offsets_topics(topic: str) -> list[dict[str, Any]]:
    return [{"name": topic, "partitions": [{"partition_index": 0, "committed_offset": 0, "committed_metadata": ""}]}]


# Every served API (but ApiVersions) as a raw request: (label, key, version, body, what of the answer holds the
# authorization error, that error without any ACL).
Extract = Callable[[Any], Any]
CASES: list[tuple[str, int, int, dict[str, Any], Extract, Any]] = [
    ("Produce", 0, 9, {"transactional_id": None, "acks": -1, "timeout": 5000,
                       "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": keyed_batch(1)}]}]},
     lambda r: partition_errors(r.responses, "partition_responses"), [TOPIC_DENIED]),
    ("Produce transactional", 0, 9, {"transactional_id": TXN, "acks": -1, "timeout": 5000,
                                     "topic_data": [{"name": TOPIC, "partition_data": [{"index": 0, "records": transactional_batch(7, 0, 0, [b"v"])}]}]},
     lambda r: partition_errors(r.responses, "partition_responses"), [TXN_DENIED]),
    ("Fetch", 1, 12, fetch_body(TOPIC), lambda r: partition_errors(r.responses), [TOPIC_DENIED]),
    ("ListOffsets", 2, 7, {"replica_id": -1, "isolation_level": 0, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0, "timestamp": -1}]}]},
     lambda r: partition_errors(r.topics), [TOPIC_DENIED]),
    ("Metadata", 3, 12, {"topics": [{"name": TOPIC, "topic_id": None}], "allow_auto_topic_creation": False, "include_topic_authorized_operations": False},
     lambda r: [int(t.error_code) for t in r.topics], [TOPIC_DENIED]),
    ("OffsetCommit", 8, 8, {"group_id": GROUP, "member_id": "", "topics": offsets_topics(TOPIC)}, lambda r: partition_errors(r.topics), [GROUP_DENIED]),
    ("OffsetFetch", 9, 8, {"groups": [{"group_id": GROUP, "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]},
     lambda r: [int(g.error_code) for g in r.groups], [GROUP_DENIED]),
    ("FindCoordinator group", 10, 4, {"key_type": 0, "coordinator_keys": [GROUP]}, lambda r: [int(c.error_code) for c in r.coordinators], [GROUP_DENIED]),
    ("FindCoordinator transaction", 10, 4, {"key_type": 1, "coordinator_keys": [TXN]}, lambda r: [int(c.error_code) for c in r.coordinators], [TXN_DENIED]),
    ("JoinGroup", 11, 9, {"group_id": GROUP, "session_timeout": 10000, "rebalance_timeout": 10000, "member_id": "", "protocol_type": "consumer",
                          "protocols": [{"name": "range", "metadata": b""}]}, lambda r: int(r.error_code), GROUP_DENIED),
    ("SyncGroup", 14, 5, {"group_id": GROUP, "generation_id": 1, "member_id": "m", "assignments": []}, lambda r: int(r.error_code), GROUP_DENIED),
    ("Heartbeat", 12, 4, {"group_id": GROUP, "generation_id": 1, "member_id": "m"}, lambda r: int(r.error_code), GROUP_DENIED),
    ("LeaveGroup", 13, 5, {"group_id": GROUP, "members": [{"member_id": "m"}]}, lambda r: int(r.error_code), GROUP_DENIED),
    ("DescribeGroups", 15, 5, {"groups": [GROUP], "include_authorized_operations": True}, lambda r: [int(g.error_code) for g in r.groups], [GROUP_DENIED]),
    ("OffsetDelete", 47, 0, {"group_id": GROUP, "topics": [{"name": TOPIC, "partitions": [{"partition_index": 0}]}]}, lambda r: int(r.error_code), GROUP_DENIED),
    ("DeleteGroups", 42, 2, {"groups_names": [GROUP]}, lambda r: [int(g.error_code) for g in r.results], [GROUP_DENIED]),
    ("CreateTopics", 19, 7, {"topics": [{"name": "made", "num_partitions": 1, "replication_factor": 1, "assignments": [], "configs": []}],
                             "timeout": 5000, "validate_only": False}, lambda r: [int(t.error_code) for t in r.topics], [TOPIC_DENIED]),
    ("DeleteTopics", 20, 6, {"topics": [{"name": DOOMED, "topic_id": "00000000-0000-0000-0000-000000000000"}], "timeout": 5000},
     lambda r: [int(t.error_code) for t in r.responses], [TOPIC_DENIED]),
    ("CreatePartitions", 37, 3, {"topics": [{"name": TOPIC, "count": 3, "assignments": None}], "timeout": 5000, "validate_only": True},
     lambda r: [int(t.error_code) for t in r.results], [TOPIC_DENIED]),
    ("DescribeConfigs", 32, 4, {"resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": TOPIC, "configuration_keys": None},
                                              {"resource_type": BROKER_RESOURCE, "resource_name": "", "configuration_keys": None}]},
     lambda r: [int(x.error_code) for x in r.results], [TOPIC_DENIED, CLUSTER_DENIED]),
    ("AlterConfigs", 33, 2, {"resources": [{"resource_type": TOPIC_RESOURCE, "resource_name": TOPIC, "configs": []}], "validate_only": True},
     lambda r: [int(x.error_code) for x in r.responses], [TOPIC_DENIED]),
    ("IncrementalAlterConfigs", 44, 1, {"resources": [
        {"resource_type": TOPIC_RESOURCE, "resource_name": TOPIC, "configs": [{"name": "retention.ms", "config_operation": 0, "value": "1000"}]},
        {"resource_type": BROKER_RESOURCE, "resource_name": "", "configs": []}], "validate_only": True},
     lambda r: [int(x.error_code) for x in r.responses], [TOPIC_DENIED, CLUSTER_DENIED]),
    ("InitProducerId idempotent", 22, 4, {"transactional_id": None, "transaction_timeout": 60000}, lambda r: int(r.error_code), CLUSTER_DENIED),
    ("InitProducerId transactional", 22, 4, {"transactional_id": TXN, "transaction_timeout": 60000}, lambda r: int(r.error_code), TXN_DENIED),
    ("AddPartitionsToTxn", 24, 3, {"v3_and_below_transactional_id": TXN, "v3_and_below_producer_id": 7, "v3_and_below_producer_epoch": 0,
                                   "v3_and_below_topics": [{"name": TOPIC, "partitions": [0]}]},
     lambda r: partition_errors(r.results_by_topic_v3_and_below, "results_by_partition", "partition_error_code"), [TXN_DENIED]),
    ("AddOffsetsToTxn", 25, 3, {"transactional_id": TXN, "producer_id": 7, "producer_epoch": 0, "group_id": GROUP}, lambda r: int(r.error_code), TXN_DENIED),
    ("EndTxn", 26, 3, {"transactional_id": TXN, "producer_id": 7, "producer_epoch": 0, "committed": True}, lambda r: int(r.error_code), TXN_DENIED),
    ("TxnOffsetCommit", 28, 3, {"transactional_id": TXN, "group_id": GROUP, "producer_id": 7, "producer_epoch": 0, "topics": offsets_topics(TOPIC)},
     lambda r: partition_errors(r.topics), [TXN_DENIED]),
    ("DescribeTransactions", DESCRIBE_TRANSACTIONS, 0, {"transactional_ids": [TXN]}, described_transactions_errors, [TXN_DENIED]),
    ("DescribeProducers", 61, 0, {"topics": [{"name": TOPIC, "partition_indexes": [0]}]}, lambda r: partition_errors(r.topics), [TOPIC_DENIED]),
    ("WriteTxnMarkers", 27, 1, {"markers": [{"producer_id": 7, "producer_epoch": 0, "transaction_result": False, "coordinator_epoch": 0,
                                             "topics": [{"name": TOPIC, "partition_indexes": [0]}]}]},
     lambda r: [int(p.error_code) for m in r.markers for t in m.topics for p in t.partitions], [CLUSTER_DENIED]),
    ("DescribeAcls", 29, 3, {"resource_type_filter": 1, "resource_name_filter": None, "pattern_type_filter": 1, "principal_filter": None,
                             "host_filter": None, "operation": 1, "permission_type": 1}, lambda r: int(r.error_code), CLUSTER_DENIED),
    ("CreateAcls", 30, 3, {"creations": [{"resource_type": 2, "resource_name": "x", "resource_pattern_type": 3, "principal": ANONYMOUS, "host": "*",
                                          "operation": 3, "permission_type": 3}]}, lambda r: [int(x.error_code) for x in r.results], [CLUSTER_DENIED]),
    ("DeleteAcls", 31, 3, {"filters": [{"resource_type_filter": 2, "resource_name_filter": "x", "pattern_type_filter": 3, "principal_filter": None,
                                        "host_filter": None, "operation": 1, "permission_type": 1}]},
     lambda r: [int(x.error_code) for x in r.filter_results], [CLUSTER_DENIED]),
    ("DescribeUserScramCredentials", 50, 0, {"users": None}, lambda r: int(r.error_code), CLUSTER_DENIED),
    ("AlterUserScramCredentials", 51, 0, {"deletions": [{"name": "nobody", "mechanism": 1}], "upsertions": []},
     lambda r: [int(x.error_code) for x in r.results], [CLUSTER_DENIED]),
    ("DescribeClientQuotas", 48, 1, {"components": [], "strict": False}, lambda r: int(r.error_code), CLUSTER_DENIED),
    ("AlterClientQuotas", 49, 1, {"entries": [{"entity": [{"entity_type": "client-id", "entity_name": "app"}],
                                               "ops": [{"key": "producer_byte_rate", "value": 1000.0, "remove": False}]}], "validate_only": True},
     lambda r: [int(x.error_code) for x in r.entries], [CLUSTER_DENIED]),
    ("ApiVersions", 18, 3, {"client_software_name": "test", "client_software_version": "1"}, lambda r: int(r.error_code), NONE),
    # As Kafka, DescribeCluster is answered to anyone; without DESCRIBE on the cluster its authorized operations are none.
    ("DescribeCluster", 60, 1, {"include_cluster_authorized_operations": True}, lambda r: (int(r.error_code), r.cluster_authorized_operations), (NONE, 0)),
]


def test_every_served_api_is_refused_without_its_acl_and_served_with_it(agent: RunningAgent) -> None:
    for label, api_key, version, body, extract, refused in CASES:
        assert extract(call(agent, api_key, version, body)) == refused, label
    grant(agent, *EVERYTHING)
    for label, api_key, version, body, extract, _ in CASES:
        answer = extract(call(agent, api_key, version, body))
        codes = set(answer) if isinstance(answer, list) else {answer[0] if isinstance(answer, tuple) else answer}
        assert not codes & AUTHORIZATION_ERRORS, (label, answer)
    described = call(agent, 60, 1, {"include_cluster_authorized_operations": True})
    assert described.cluster_authorized_operations == sum(1 << op for op in (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS,
                                                                              Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE))


def test_the_checks_refuse_only_what_is_not_granted(agent: RunningAgent) -> None:
    """One topic granted, one not, in the same request: each answered as Kafka answers it."""
    grant(agent, acl(ResourceType.TOPIC, TOPIC, Op.WRITE), acl(ResourceType.GROUP, GROUP, Op.READ), acl(ResourceType.TRANSACTIONAL_ID, TXN, Op.WRITE))
    produced = call(agent, 0, 9, {"transactional_id": None, "acks": -1, "timeout": 5000, "topic_data": [
        {"name": name, "partition_data": [{"index": 0, "records": keyed_batch(1)}]} for name in (TOPIC, OTHER)
    ]})
    assert {t.name: partition_errors([t], "partition_responses") for t in produced.responses} == {TOPIC: [NONE], OTHER: [TOPIC_DENIED]}
    committed = call(agent, 8, 8, {"group_id": GROUP, "member_id": "", "topics": offsets_topics(OTHER) + offsets_topics(TOPIC)})
    assert {t.name: partition_errors([t]) for t in committed.topics} == {OTHER: [TOPIC_DENIED], TOPIC: [TOPIC_DENIED]}  # WRITE is not READ
    added = call(agent, 24, 3, {"v3_and_below_transactional_id": TXN, "v3_and_below_producer_id": 7, "v3_and_below_producer_epoch": 0,
                                "v3_and_below_topics": [{"name": name, "partitions": [0]} for name in (TOPIC, OTHER, "ghost")]})
    assert partition_errors(added.results_by_topic_v3_and_below, "results_by_partition", "partition_error_code") == [OPERATION_NOT_ATTEMPTED, TOPIC_DENIED, TOPIC_DENIED]
    # InitProducerId of an idempotent producer: WRITE on any topic is enough (Kafka 3.0+, KIP-679).
    assert int(call(agent, 22, 4, {"transactional_id": None, "transaction_timeout": 60000}).error_code) == NONE
    # ListTransactions lists the transactional ids the principal may DESCRIBE (WRITE implies it).
    assert int(call(agent, 22, 4, {"transactional_id": TXN, "transaction_timeout": 60000}).error_code) == NONE
    listing = {"state_filters": [], "producer_id_filters": [], "duration_filter": -1}
    assert [s.transactional_id for s in call(agent, 66, 1, listing).transaction_states] == [TXN]
    grant(agent, acl(ResourceType.TRANSACTIONAL_ID, TXN, Op.DESCRIBE, Deny))
    assert [s.transactional_id for s in call(agent, 66, 1, listing).transaction_states] == []


def test_a_named_topic_without_describe_is_refused_whether_it_exists_or_not_and_the_listing_omits_it(agent: RunningAgent) -> None:
    grant(agent, acl(ResourceType.TOPIC, OTHER, Op.READ))  # READ implies DESCRIBE
    named = call(agent, 3, 12, {"topics": [{"name": n, "topic_id": None} for n in (TOPIC, "ghost", OTHER)], "allow_auto_topic_creation": False,
                                "include_topic_authorized_operations": True})
    assert [(t.name, int(t.error_code)) for t in named.topics] == [(TOPIC, TOPIC_DENIED), ("ghost", TOPIC_DENIED), (OTHER, NONE)]
    assert named.topics[2].topic_authorized_operations == (1 << Op.READ) | (1 << Op.DESCRIBE)
    listing = call(agent, 3, 12, {"topics": None, "allow_auto_topic_creation": False, "include_topic_authorized_operations": False})
    assert [t.name for t in listing.topics] == [OTHER]
    admin = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
    assert set(admin.list_topics(timeout=10).topics) == {OTHER}


def test_auto_creation_needs_create_on_the_cluster_or_the_topic(agent: RunningAgent, catalog: Catalog) -> None:
    grant(agent, acl(ResourceType.TOPIC, "auto-", Op.DESCRIBE, pattern=PatternType.PREFIXED))
    asked = {"topics": [{"name": "auto-a", "topic_id": None}], "allow_auto_topic_creation": True, "include_topic_authorized_operations": False}
    assert int(call(agent, 3, 12, asked).topics[0].error_code) == TOPIC_DENIED
    assert "auto-a" not in catalog.snapshot().topics
    grant(agent, acl(ResourceType.TOPIC, "auto-", Op.CREATE, pattern=PatternType.PREFIXED))
    assert int(call(agent, 3, 12, asked).topics[0].error_code) == LEADER_NOT_AVAILABLE
    assert "auto-a" in catalog.snapshot().topics


def test_a_prefixed_acl_a_deny_over_an_allow_and_host_rules_with_real_producers(agent: RunningAgent) -> None:
    def produce(topic: str) -> int:
        outcome: list[KafkaError | None] = []
        producer = Producer({"bootstrap.servers": agent.bootstrap, "message.timeout.ms": 5000, "retries": 0, **FAST_CLIENT})
        producer.produce(topic, key=b"k", value=b"v", on_delivery=lambda error, _message: outcome.append(error))
        producer.flush(10)
        error = outcome[0]
        return NONE if error is None else error.code()

    assert produce(TOPIC) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(agent, acl(ResourceType.TOPIC, "ord", Op.WRITE, pattern=PatternType.PREFIXED))
    assert produce(TOPIC) == NONE
    grant(agent, acl(ResourceType.TOPIC, TOPIC, Op.WRITE, Deny, principal=EVERYONE))  # User:*'s DENY wins over ANONYMOUS's ALLOW
    assert produce(TOPIC) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(agent, acl(ResourceType.TOPIC, OTHER, Op.WRITE, host="10.9.9.9"))  # clients here come from 127.0.0.1
    assert produce(OTHER) == KafkaError.TOPIC_AUTHORIZATION_FAILED
    grant(agent, acl(ResourceType.TOPIC, OTHER, Op.WRITE, host="127.0.0.1", principal=EVERYONE))
    assert produce(OTHER) == NONE


def test_list_groups_filters_and_describe_groups_authorized_operations_follow_the_acls(agent: RunningAgent) -> None:
    grant(agent, acl(ResourceType.TOPIC, TOPIC, Op.READ), acl(ResourceType.GROUP, "*", Op.READ))
    for group in (GROUP, "h"):  # a commit outside group management makes an Empty group
        assert partition_errors(call(agent, 8, 8, {"group_id": group, "member_id": "", "topics": offsets_topics(TOPIC)}).topics) == [NONE]
    assert sorted(g.group_id for g in call(agent, 16, 4, {"states_filter": []}).groups) == [GROUP, "h"]
    grant(agent, acl(ResourceType.GROUP, "h", Op.DESCRIBE, Deny))
    assert [g.group_id for g in call(agent, 16, 4, {"states_filter": []}).groups] == [GROUP]

    admin = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
    [described] = [future.result(timeout=10) for future in admin.describe_consumer_groups([GROUP], include_authorized_operations=True).values()]
    assert {op.name for op in described.authorized_operations} == {"READ", "DESCRIBE"}
    grant(agent, acl(ResourceType.GROUP, GROUP, Op.DELETE))
    [described] = [future.result(timeout=10) for future in admin.describe_consumer_groups([GROUP], include_authorized_operations=True).values()]
    assert {op.name for op in described.authorized_operations} == {"READ", "DESCRIBE", "DELETE"}
    with pytest.raises(KafkaException) as refused:
        admin.describe_consumer_groups(["h"])["h"].result(timeout=10)
    assert refused.value.args[0].code() == KafkaError.GROUP_AUTHORIZATION_FAILED


def test_acls_managed_with_kafka_python_confluent_and_kafka_pythons_command(agent: RunningAgent) -> None:
    grant(agent, acl(ResourceType.CLUSTER, CLUSTER_NAME, Op.ALTER))  # ALTER implies DESCRIBE: create, list and delete ACLs
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap)
    try:
        prefixed = ACL("User:bob", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                       ResourcePattern(KafkaPythonResourceType.TOPIC, "ord", ACLResourcePatternType.PREFIXED))
        bad = ACL("User:bob", "*", ACLOperation.READ, ACLPermissionType.ALLOW, ResourcePattern(KafkaPythonResourceType.CLUSTER, "other"))
        created = admin.create_acls([prefixed, bad])
        assert created["succeeded"] == [prefixed]
        assert [error.__name__ for error in created["failed"]] == ["InvalidRequestError"]  # the cluster's one name is kafka-cluster
        matching = ACLFilter("User:bob", None, ACLOperation.ANY, ACLPermissionType.ANY,
                             ResourcePatternFilter(KafkaPythonResourceType.TOPIC, "orders", ACLResourcePatternType.MATCH))
        found, _ = admin.describe_acls(matching)
        assert [(a.resource_pattern.resource_name, a.resource_pattern.pattern_type) for a in found] == [("ord", ACLResourcePatternType.PREFIXED)]
    finally:
        admin.close()

    confluent = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
    deny = ConfluentAclBinding(ConfluentResourceType.GROUP, "g", ConfluentPatternType.LITERAL, "User:carol", "10.0.0.1",
                               ConfluentAclOperation.READ, ConfluentAclPermissionType.DENY)
    for future in confluent.create_acls([deny]).values():
        future.result(timeout=10)
    any_filter = ConfluentAclBindingFilter(ConfluentResourceType.ANY, None, ConfluentPatternType.ANY, None, None,
                                           ConfluentAclOperation.ANY, ConfluentAclPermissionType.ANY)
    listed = confluent.describe_acls(any_filter).result(timeout=10)
    assert {(b.principal, b.name) for b in listed} == {(ANONYMOUS, CLUSTER_NAME), ("User:bob", "ord"), ("User:carol", "g")}

    command = [sys.executable, "-m", "kafka.admin", "-b", agent.bootstrap, "--format", "json", "acls"]
    described = subprocess.run([*command, "describe", "--principal", "User:carol"], capture_output=True, text=True, timeout=60)
    assert described.returncode == 0, described.stderr
    assert "User:carol" in described.stdout and "User:bob" not in described.stdout

    users_filter = ConfluentAclBindingFilter(ConfluentResourceType.ANY, None, ConfluentPatternType.ANY, "User:carol", None,
                                             ConfluentAclOperation.ANY, ConfluentAclPermissionType.ANY)
    [deleted] = [future.result(timeout=10) for future in confluent.delete_acls([users_filter]).values()]
    assert [(b.name, b.host, b.permission_type) for b in deleted] == [("g", "10.0.0.1", ConfluentAclPermissionType.DENY)]
    assert {(b.principal, b.name) for b in confluent.describe_acls(any_filter).result(timeout=10)} == {(ANONYMOUS, CLUSTER_NAME), ("User:bob", "ord")}


def test_create_acls_answer_security_disabled_with_authorization_off(catalog: Catalog) -> None:
    plain = RunningAgent(catalog, flush_interval_ms=FLUSH_MS)
    try:
        confluent = AdminClient({"bootstrap.servers": plain.bootstrap, **FAST_CLIENT})
        binding = ConfluentAclBinding(ConfluentResourceType.TOPIC, TOPIC, ConfluentPatternType.LITERAL, ANONYMOUS, "*",
                                      ConfluentAclOperation.READ, ConfluentAclPermissionType.ALLOW)
        with pytest.raises(KafkaException) as refused:
            for future in confluent.create_acls([binding]).values():
                future.result(timeout=10)
        assert refused.value.args[0].code() == KafkaError.SECURITY_DISABLED
        for label, api_key, version, body, extract, _ in (case for case in CASES if case[0] in ("DescribeAcls", "CreateAcls", "DeleteAcls")):
            answer = extract(call(plain, api_key, version, body))
            assert answer in (SECURITY_DISABLED, [SECURITY_DISABLED]), label
        assert not catalog.acls()
    finally:
        plain.stop()


def test_a_delete_acls_on_one_agent_takes_effect_on_another_within_the_refresh_bound(catalog: Catalog) -> None:
    refresh_ms = 200
    one, two = secured_agent(catalog, refresh_ms), secured_agent(catalog, refresh_ms)
    try:
        grant(one, *EVERYTHING)
        two.server.broker.authorizer.refresh()
        metadata = {"topics": [{"name": TOPIC, "topic_id": None}], "allow_auto_topic_creation": False, "include_topic_authorized_operations": False}
        assert int(call(two, 3, 12, metadata).topics[0].error_code) == NONE
        deleted = call(one, 31, 3, {"filters": [{"resource_type_filter": 2, "resource_name_filter": None, "pattern_type_filter": 1,
                                                 "principal_filter": None, "host_filter": None, "operation": 1, "permission_type": 1}]})
        assert [(m.resource_name, int(m.operation)) for m in deleted.filter_results[0].matching_acls] == [("*", Op.ALL)]
        assert int(call(one, 3, 12, metadata).topics[0].error_code) == TOPIC_DENIED  # at once where it was deleted
        deadline = time.monotonic() + 5 * refresh_ms / 1000 + 1
        while int(call(two, 3, 12, metadata).topics[0].error_code) != TOPIC_DENIED:
            assert time.monotonic() < deadline, "the other agent still allows the topic past its refresh bound"
            time.sleep(refresh_ms / 4000)
    finally:
        one.stop()
        two.stop()


def test_the_acl_command_adds_lists_and_removes_as_kafka_acls(catalog: Catalog) -> None:
    def acl_command(*args: str) -> list[dict[str, Any]]:
        done = CliRunner().invoke(cli, ["--store", catalog.store.uri, "--catalog", catalog.url, "acl", *args, "--json"])
        assert done.exit_code == 0, done.output
        return [json.loads(line) for line in done.output.splitlines()]

    added = acl_command("add", "--allow-principal", "User:bob", "--allow-principal", "User:carol", "--operation", "Read", "--operation", "Describe",
                        "--topic", "ord", "--resource-pattern-type", "prefixed")
    assert len(added) == 4
    acl_command("add", "--deny-principal", "User:*", "--deny-host", "10.0.0.9", "--group", "g", "--cluster")
    assert len(acl_command("list")) == 6
    assert {a["principal"] for a in acl_command("list", "--topic", "orders", "--resource-pattern-type", "match")} == {"User:bob", "User:carol"}
    assert acl_command("list", "--cluster") == [{"resource_type": "CLUSTER", "resource_name": CLUSTER_NAME, "pattern_type": "LITERAL",
                                                  "principal": "User:*", "host": "10.0.0.9", "operation": "ALL", "permission": "DENY"}]
    removed = acl_command("remove", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "ord", "--resource-pattern-type", "prefixed")
    assert [(a["principal"], a["operation"]) for a in removed] == [("User:bob", "READ")]
    assert len(acl_command("remove", "--topic", "ord", "--resource-pattern-type", "prefixed")) == 3  # no principal: all of the resource's
    assert {a["resource_type"] for a in acl_command("list")} == {"GROUP", "CLUSTER"}

    refused = CliRunner().invoke(cli, ["--store", catalog.store.uri, "--catalog", catalog.url, "acl", "add", "--allow-principal", "User:bob",
                                       "--topic", "t", "--operation", "Frob"])
    assert refused.exit_code == 2 and "'Frob' is not an operation" in refused.output


def test_the_agent_refuses_to_start_with_authorization_on_and_no_super_user(catalog: Catalog) -> None:
    done = subprocess.run([sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--authorizer", "acl"],
                          capture_output=True, text=True, env=agent_environment(catalog), timeout=60)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.strip().splitlines()
    assert "nobody could grant an ACL: give --super-users User:NAME" in line and not done.stdout


def test_version_0_knows_literal_patterns_only(agent: RunningAgent) -> None:
    grant(agent, acl(ResourceType.CLUSTER, CLUSTER_NAME, Op.ALTER), acl(ResourceType.TOPIC, "ord", Op.READ, pattern=PatternType.PREFIXED))
    created = call(agent, 30, 0, {"creations": [{"resource_type": 2, "resource_name": TOPIC, "principal": "User:bob", "host": "*",
                                                 "operation": 3, "permission_type": 3}]})
    assert [int(r.error_code) for r in created.results] == [NONE]
    any_topic = {"resource_type_filter": 2, "resource_name_filter": None, "principal_filter": None, "host_filter": None, "operation": 1,
                 "permission_type": 1}
    described = call(agent, 29, 0, any_topic)
    assert [(r.resource_name, [a.principal for a in r.acls]) for r in described.resources] == [(TOPIC, ["User:bob"])]  # not the PREFIXED one
    deleted = call(agent, 31, 0, {"filters": [any_topic]})
    assert [(m.resource_name, m.principal) for m in deleted.filter_results[0].matching_acls] == [(TOPIC, "User:bob")]
    assert [(b.resource_name, b.pattern_type) for b in agent.server.catalog.acls() if b.resource_type == ResourceType.TOPIC] == [
        ("ord", PatternType.PREFIXED)]


def test_a_consumer_group_needs_read_on_the_group_and_the_topic(agent: RunningAgent) -> None:
    grant(agent, acl(ResourceType.TOPIC, TOPIC, Op.WRITE))
    producer = Producer({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})
    for index in range(3):
        producer.produce(TOPIC, key=b"k%d" % index, value=b"v", partition=0)
    assert producer.flush(10) == 0

    def first_error_or_records(consumer: Consumer, wanted: int) -> int | list[bytes]:
        got: list[bytes] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline and len(got) < wanted:
            message = consumer.poll(0.2)
            if message is None:
                continue
            if message.error():
                return message.error().code()
            got.append(message.key())
        return got

    consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest", **FAST_CLIENT})
    try:
        consumer.subscribe([TOPIC])
        assert first_error_or_records(consumer, 3) == KafkaError.GROUP_AUTHORIZATION_FAILED
    finally:
        consumer.close()
    grant(agent, acl(ResourceType.GROUP, GROUP, Op.READ), acl(ResourceType.TOPIC, TOPIC, Op.READ))
    consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest", **FAST_CLIENT})
    try:
        consumer.subscribe([TOPIC])
        assert first_error_or_records(consumer, 3) == [b"k0", b"k1", b"k2"]
    finally:
        consumer.close()


def test_deleting_a_group_needs_delete_on_it_and_deleting_offsets_read_on_their_topics(agent: RunningAgent, catalog: Catalog) -> None:
    catalog.commit_offsets(GROUP, {(TOPIC, 0): CommittedOffset(1, -1, "", 0), (OTHER, 0): CommittedOffset(1, -1, "", 0)})
    grant(agent, acl(ResourceType.GROUP, GROUP, Op.READ), acl(ResourceType.TOPIC, TOPIC, Op.ALL))
    delete_group = {"groups_names": [GROUP]}
    assert [int(g.error_code) for g in call(agent, 42, 2, delete_group).results] == [GROUP_DENIED]  # READ is not DELETE
    offsets = {"group_id": GROUP, "topics": [{"name": name, "partitions": [{"partition_index": 0}]} for name in (TOPIC, OTHER)]}
    assert int(call(agent, 47, 0, offsets).error_code) == GROUP_DENIED
    grant(agent, acl(ResourceType.GROUP, GROUP, Op.DELETE))
    answer = call(agent, 47, 0, offsets)
    assert int(answer.error_code) == NONE
    assert {t.name: partition_errors([t]) for t in answer.topics} == {TOPIC: [NONE], OTHER: [TOPIC_DENIED]}
    assert set(catalog.committed_offsets(GROUP)) == {(OTHER, 0)}
    assert [int(g.error_code) for g in call(agent, 42, 2, delete_group).results] == [NONE]
    assert catalog.committed_offsets(GROUP) == {}


def test_kafkas_own_kafka_acls_manages_them(agent: RunningAgent) -> None:
    """Apache Kafka's kafka-acls.sh (org.apache.kafka.tools.AclCommand, from the reference broker's jars) against the
    agent: refused with Kafka's error without ALTER on the cluster, then adds, lists (MATCH) and removes."""
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)

    def kafka_acls(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(tool_argv("org.apache.kafka.tools.AclCommand", "--bootstrap-server", agent.bootstrap, *args),
                              capture_output=True, text=True, timeout=120)

    refused = kafka_acls("--list")
    assert "ClusterAuthorizationException" in refused.stdout + refused.stderr, (refused.stdout, refused.stderr)
    grant(agent, acl(ResourceType.CLUSTER, CLUSTER_NAME, Op.ALTER))
    added = kafka_acls("--add", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "ord", "--resource-pattern-type", "prefixed")
    assert added.returncode == 0, added.stderr
    assert [(b.principal, b.resource_name, b.pattern_type) for b in agent.server.catalog.acls() if b.resource_type == ResourceType.TOPIC] == [
        ("User:bob", "ord", PatternType.PREFIXED)]
    matched = kafka_acls("--list", "--topic", TOPIC, "--resource-pattern-type", "match")
    assert "name=ord, patternType=PREFIXED" in matched.stdout and "principal=User:bob" in matched.stdout, matched.stdout
    removed = kafka_acls("--remove", "--force", "--allow-principal", "User:bob", "--operation", "Read", "--topic", "ord",
                         "--resource-pattern-type", "prefixed")
    assert removed.returncode == 0, removed.stderr
    assert [b.resource_type for b in agent.server.catalog.acls()] == [ResourceType.CLUSTER]
