"""DescribeConfigs as Kafka answers it, compared with Apache Kafka's broker: a topic lists every topic config Kafka
4.x lists, each with Kafka's source, type and synonyms where the product has the same setting; a broker lists the
agent's settings under Kafka's names (STATIC_BROKER_CONFIG where an option sets them, Kafka's defaults as
DEFAULT_CONFIG); confluent-kafka's AdminClient (which asks for synonyms) sees the sources; v3+ carries
documentation when asked; configs the product does not apply are taken at Kafka's default only. Kafka's own
`kafka-configs --describe --all` and `kafka-topics --describe` agree with `logcompact topic describe`."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, ConfigSource, NewTopic
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient

from lab.servers.kafka import KafkaServer, kafka_missing_reason, tool_argv
from logcompact.catalog import Catalog
from logcompact.topic_configs import TOPIC_CONFIGS
from logcompact.topics import kafka_config_names
from tests.kafka.agents import FAST_CLIENT, MAX_MESSAGE_BYTES, RunningAgent, agent_environment
from tests.kafka.wire import kio_exchange

pytestmark = pytest.mark.timeout(600)

TOPIC_CONFIG = {"cleanup.policy": "compact", "retention.ms": "3600000"}
TOOL_TIMEOUT_S = 180  # a JVM's start on a loaded two-core machine
# Where the agent's answer is not Kafka's, and why: Kafka's KRaft controller sets min.insync.replicas as a dynamic
# default of the cluster; the test agent takes records up to 64 KiB (--max-message-bytes), Kafka's broker 1048588.
KAFKA_ONLY_SOURCES = {"min.insync.replicas": ("DYNAMIC_DEFAULT_BROKER_CONFIG", "DEFAULT_CONFIG"),
                      "max.message.bytes": ("DEFAULT_CONFIG", "STATIC_BROKER_CONFIG")}


def described(bootstrap: str, kind: int, name: str, synonyms: bool = True) -> dict[str, dict[str, Any]]:
    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        found = admin.describe_configs([KafkaPythonConfigResource(kind, name)], include_synonyms=synonyms, config_filter="all")
    finally:
        admin.close()
    [configs] = next(iter(found.values())).values()
    return configs


def make_topic(bootstrap: str, name: str, config: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **FAST_CLIENT})
    admin.create_topics([NewTopic(name, 2, replication_factor=1, config=config)])[name].result(timeout=30)
    deadline = time.monotonic() + 30
    while name not in admin.list_topics(timeout=10).topics and time.monotonic() < deadline:
        time.sleep(0.2)


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    catalog.ensure_created(0)
    return catalog


@pytest.fixture
def kafka_topic(kafka_broker: KafkaServer) -> Iterator[str]:
    name = f"described-{time.monotonic_ns()}"
    make_topic(kafka_broker.bootstrap_servers, name, TOPIC_CONFIG)
    yield name


def test_a_topic_lists_kafkas_configs_with_kafkas_sources_and_synonyms(agent: RunningAgent, kafka_broker: KafkaServer, kafka_topic: str) -> None:
    make_topic(agent.bootstrap, "described", TOPIC_CONFIG)
    ours = described(agent.bootstrap, ConfigResourceType.TOPIC, "described")
    kafkas = described(kafka_broker.bootstrap_servers, ConfigResourceType.TOPIC, kafka_topic)
    assert set(ours) == set(kafkas) == {config.name for config in TOPIC_CONFIGS}
    assert set(kafka_config_names()) <= set(ours)
    for name, kafka in kafkas.items():
        mine = ours[name]
        assert (mine["config_type"], mine["read_only"], mine["is_sensitive"]) == (kafka["config_type"], False, False), name
        if name in KAFKA_ONLY_SOURCES:
            assert (kafka["config_source"], mine["config_source"]) == KAFKA_ONLY_SOURCES[name]
            continue
        assert (mine["value"], mine["config_source"]) == (kafka["value"], kafka["config_source"]), name
        assert mine["synonyms"] == kafka["synonyms"], name
    assert ours["max.message.bytes"]["value"] == str(MAX_MESSAGE_BYTES)
    assert ours["max.message.bytes"]["synonyms"] == [
        {"name": "message.max.bytes", "value": str(MAX_MESSAGE_BYTES), "source": "STATIC_BROKER_CONFIG"},
        {"name": "message.max.bytes", "value": "1048588", "source": "DEFAULT_CONFIG"}]


def test_a_broker_lists_the_agents_settings_under_kafkas_names(agent: RunningAgent, kafka_broker: KafkaServer) -> None:
    ours = described(agent.bootstrap, ConfigResourceType.BROKER, str(agent.server.broker.node_id))
    kafkas = described(kafka_broker.bootstrap_servers, ConfigResourceType.BROKER, str(kafka_broker.node_id))
    authorizer_only = {"super.users", "allow.everyone.if.no.acl.found"}  # the authorizer's: Kafka lists them only with one
    assert set(ours) - authorizer_only <= set(kafkas)
    for name, mine in ours.items():
        assert mine["read_only"] is True, name
        if name in kafkas:
            assert mine["config_type"] == kafkas[name]["config_type"], name
    assert ours["advertised.listeners"]["value"] == f"PLAINTEXT://{agent.bootstrap}"
    assert ours["advertised.listeners"]["config_source"] == kafkas["advertised.listeners"]["config_source"] == "STATIC_BROKER_CONFIG"
    assert ours["message.max.bytes"]["config_source"] == "STATIC_BROKER_CONFIG"  # --max-message-bytes 64 KiB
    # an option left at Kafka's default is Kafka's default, as Kafka answers for a setting no server.properties names
    for name in ("auto.create.topics.enable", "num.partitions", "default.replication.factor", "log.cleanup.policy", "log.retention.bytes",
                 "connections.max.idle.ms", "compression.type", "log.segment.bytes"):
        assert (ours[name]["value"], ours[name]["config_source"]) == (kafkas[name]["value"], "DEFAULT_CONFIG"), name
        assert ours[name]["synonyms"] == kafkas[name]["synonyms"], name


def test_confluent_sees_the_sources_and_synonyms(agent: RunningAgent) -> None:
    make_topic(agent.bootstrap, "described", TOPIC_CONFIG)
    admin = AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})  # librdkafka asks for synonyms from v1 on
    [future] = admin.describe_configs([ConfigResource("topic", "described")]).values()
    configs = future.result(timeout=20)
    policy = configs["cleanup.policy"]
    assert (policy.value, policy.source, policy.is_default, policy.is_read_only) == ("compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value, False, False)
    assert [(s.name, s.value, s.source) for s in policy.synonyms.values()] == [
        ("cleanup.policy", "compact", ConfigSource.DYNAMIC_TOPIC_CONFIG.value), ("log.cleanup.policy", "delete", ConfigSource.DEFAULT_CONFIG.value)]
    assert configs["retention.bytes"].source == ConfigSource.DEFAULT_CONFIG.value and configs["retention.bytes"].value == "-1"
    assert configs["segment.bytes"].source == ConfigSource.DEFAULT_CONFIG.value
    [future] = admin.describe_configs([ConfigResource("broker", str(agent.server.broker.node_id))]).values()
    broker = future.result(timeout=20)
    assert broker["advertised.listeners"].source == ConfigSource.STATIC_BROKER_CONFIG.value
    assert broker["log.retention.hours"].source == ConfigSource.DEFAULT_CONFIG.value and broker["log.retention.hours"].value == "168"


def test_documentation_and_synonyms_only_when_asked(agent: RunningAgent) -> None:
    make_topic(agent.bootstrap, "described", TOPIC_CONFIG)

    def ask(version: int, **flags: bool) -> Any:
        body = {"resources": [{"resource_type": 2, "resource_name": "described", "configuration_keys": ["retention.ms", "segment.bytes"]}], **flags}
        return kio_exchange(agent.server, 32, version, body).results[0].configs

    plain = ask(3, include_synonyms=False, include_documentation=False)
    assert [(c.name, c.documentation, c.synonyms) for c in plain] == [("retention.ms", None, ()), ("segment.bytes", None, ())]
    documented = {c.name: c for c in ask(4, include_synonyms=True, include_documentation=True)}
    assert "applied by the engine" in documented["retention.ms"].documentation
    assert documented["segment.bytes"].documentation.startswith("Accepted at Kafka's default only, and has no effect here")
    assert [(s.name, s.value) for s in documented["retention.ms"].synonyms] == [("retention.ms", "3600000")]
    assert [c.name for c in ask(0)] == ["retention.ms", "segment.bytes"]


# -- Kafka's own tools against the agent, compared with `logcompact topic describe` --------------------------------


def tool(main_class: str, agent: RunningAgent, *args: str) -> str:
    done = subprocess.run(tool_argv(main_class, "--bootstrap-server", agent.bootstrap, *args), capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def topic_describe(catalog: Catalog, name: str) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "logcompact", "topic", "describe", name], capture_output=True, text=True,
                          env=agent_environment(catalog), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def java_tools() -> None:
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)


def test_kafka_configs_and_kafka_topics_describe_agree_with_topic_describe(java_tools: None, agent: RunningAgent, catalog: Catalog) -> None:
    make_topic(agent.bootstrap, "described", {**TOPIC_CONFIG, "min.compaction.lag.ms": "60000"})
    ours = topic_describe(catalog, "described")

    out = tool("org.apache.kafka.tools.ConfigCommand", agent, "--describe", "--entity-type", "topics", "--entity-name", "described", "--all")
    listed = dict(re.findall(r"^\s+([a-z0-9.]+)=(\S*) sensitive=false", out, re.MULTILINE))
    assert set(listed) == {config.name for config in TOPIC_CONFIGS}
    for name in kafka_config_names():
        if name in ours["config"]:
            assert listed[name] == str(ours["config"][name]), name
    assert "cleanup.policy=compact sensitive=false synonyms={DYNAMIC_TOPIC_CONFIG:cleanup.policy=compact, DEFAULT_CONFIG:log.cleanup.policy=delete}" in out

    out = tool("org.apache.kafka.tools.ConfigCommand", agent, "--describe", "--entity-type", "brokers", "--entity-name",
               str(agent.server.broker.node_id), "--all")
    assert f"advertised.listeners=PLAINTEXT://{agent.bootstrap} sensitive=false synonyms={{STATIC_BROKER_CONFIG:advertised.listeners=" in out

    out = tool("org.apache.kafka.tools.TopicCommand", agent, "--describe", "--topic", "described")
    header = next(line for line in out.splitlines() if line.startswith("Topic: described\t"))
    assert f"PartitionCount: {ours['partitions']}\t" in header and "ReplicationFactor: 1\t" in header
    # kafka-topics lists the configs not at Kafka's default: those set on the topic, and max.message.bytes, which the
    # agent's --max-message-bytes sets (STATIC_BROKER_CONFIG), as Kafka's does for a broker's message.max.bytes
    configs = dict(pair.split("=", 1) for pair in header.split("Configs: ", 1)[1].split(","))
    assert configs == {"cleanup.policy": "compact", "retention.ms": "3600000", "min.compaction.lag.ms": "60000", "max.message.bytes": str(MAX_MESSAGE_BYTES)}
    assert {k: str(v) for k, v in ours["config"].items() if k in configs} == {k: v for k, v in configs.items() if k != "max.message.bytes"}
