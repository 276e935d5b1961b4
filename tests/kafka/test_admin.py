"""Topics created, deleted, grown and configured over the wire: confluent-kafka's AdminClient,
kafka-python's KafkaAdminClient and kcat against a real agent, raw requests for what clients do not send (topic
ids, Metadata's auto-create flag, LogAppendTime), and the catalog read back after each."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator

import pytest
from confluent_kafka import KafkaError, KafkaException, Producer, TopicCollection
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
    NewPartitions,
    NewTopic,
)
from kafka.admin import ConfigResource as KafkaPythonConfigResource
from kafka.admin import ConfigResourceType, KafkaAdminClient
from kafka.admin import NewTopic as KafkaPythonNewTopic
from kafka.errors import InvalidConfigurationError, TopicAlreadyExistsError, UnknownTopicOrPartitionError

from logcompact.catalog import Catalog
from tests.helpers import create_topic
from tests.kafka.agents import FAST_CLIENT, MAX_MESSAGE_BYTES, RunningAgent, stored
from tests.kafka.wire import keyed_batch, kio_exchange, produce, record_batch

pytestmark = pytest.mark.timeout(90)

NONE, UNKNOWN_TOPIC_OR_PARTITION, LEADER_NOT_AVAILABLE, MESSAGE_TOO_LARGE = 0, 3, 5, 10
INVALID_TOPIC_EXCEPTION, INVALID_PARTITIONS, INVALID_REPLICA_ASSIGNMENT, INVALID_CONFIG, INVALID_REQUEST = 17, 37, 39, 40, 42
UNKNOWN_TOPIC_ID = 100


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy="compact")
    create_topic(catalog, "clicks", 1)
    return catalog


def admin_client(agent: RunningAgent) -> AdminClient:
    return AdminClient({"bootstrap.servers": agent.bootstrap, **FAST_CLIENT})


def outcome(future) -> int:
    """The Kafka error code a future of the AdminClient ends with (0 for success)."""
    try:
        future.result(timeout=10)
    except KafkaException as exc:
        return exc.args[0].code()
    return NONE


def error_of(future) -> KafkaError:
    with pytest.raises(KafkaException) as raised:
        future.result(timeout=10)
    return raised.value.args[0]


def metadata(agent: RunningAgent, topics: list[dict], allow_auto_create: bool, version: int = 12):
    flags = {"allow_auto_topic_creation": allow_auto_create, "include_cluster_authorized_operations": False, "include_topic_authorized_operations": False}
    return kio_exchange(agent.server, 3, version, {"topics": topics, **flags})


# -- confluent-kafka's AdminClient ------------------------------------------------------------------------


def test_confluent_creates_topics_with_configs_and_refuses_bad_ones_whole(agent: RunningAgent, catalog: Catalog) -> None:
    admin = admin_client(agent)
    futures = admin.create_topics([
        NewTopic("accounts", 2, replication_factor=3, config={"cleanup.policy": "compact", "min.compaction.lag.ms": "1000"}),
        NewTopic("bad name!", 1),
        NewTopic("bad-value", 1, config={"retention.ms": "-5"}),
        NewTopic("unknown-config", 1, config={"segment.byte": "1"}),
        NewTopic("ignored-config", 1, config={"segment.bytes": "1"}),
        NewTopic("ignored-at-default", 1, config={"segment.bytes": "1073741824", "preallocate": "FALSE"}),
        NewTopic("no-partitions", 0),
        NewTopic("unlimited", 1, config={"retention.bytes": "-1", "cleanup.policy": "compact"}),  # as quixstreams' changelogs
        NewTopic("size-limited", 1, config={"retention.bytes": "1000"}),
    ], request_timeout=10)

    assert outcome(futures["accounts"]) == NONE
    assert outcome(futures["bad name!"]) == INVALID_TOPIC_EXCEPTION
    bad_value = error_of(futures["bad-value"])
    assert (bad_value.code(), bad_value.str()) == (INVALID_CONFIG, "retention.ms=-5 is out of range: allowed from -1 (unlimited) up to 9223372036854775807")
    unknown = error_of(futures["unknown-config"])
    assert unknown.code() == INVALID_CONFIG and "unknown topic config 'segment.byte'" in unknown.str()
    ignored = error_of(futures["ignored-config"])  # a Kafka config the product does not apply: taken at its default only
    assert (ignored.code(), ignored.str()) == (
        INVALID_CONFIG, "segment.bytes='1' is not taken: the agent's flushes and the compactions' target sizes make the files; give 1073741824 or leave it out")
    assert outcome(futures["ignored-at-default"]) == NONE
    assert outcome(futures["no-partitions"]) == INVALID_PARTITIONS
    assert outcome(futures["unlimited"]) == NONE
    size_limited = error_of(futures["size-limited"])
    assert (size_limited.code(), size_limited.str()) == (INVALID_CONFIG, "retention.bytes='1000' is not taken: topics here have no size limit; give -1 or leave it out")
    topics = catalog.snapshot().topics
    assert set(topics) == {"orders", "clicks", "accounts", "unlimited", "ignored-at-default"}  # nothing of the refused ones
    assert topics["unlimited"].config.compacted
    assert (topics["accounts"].partitions, topics["accounts"].config.cleanup_policy, topics["accounts"].config.min_compaction_lag_ms) == (2, "compact", 1000)

    assert outcome(admin.create_topics([NewTopic("accounts", 1)], request_timeout=10)["accounts"]) == 36  # TOPIC_ALREADY_EXISTS
    checked = admin.create_topics([NewTopic("checked", 4, config={"message.timestamp.type": "LogAppendTime"})], validate_only=True, request_timeout=10)
    assert outcome(checked["checked"]) == NONE and "checked" not in catalog.snapshot().topics
    assert outcome(admin.create_topics([NewTopic("assigned", 2, replica_assignment=[[0], [0]])], request_timeout=10)["assigned"]) == INVALID_REPLICA_ASSIGNMENT


def test_confluent_describes_alters_and_grows_topics(agent: RunningAgent, catalog: Catalog) -> None:
    admin = admin_client(agent)
    orders = ConfigResource(ConfigResource.Type.TOPIC, "orders")
    described = admin.describe_configs([orders], request_timeout=10)[orders].result(timeout=10)
    assert described["cleanup.policy"].value == "compact" and described["cleanup.policy"].source == ConfigSource.DYNAMIC_TOPIC_CONFIG.value
    assert described["retention.ms"].value == "604800000" and described["retention.ms"].source == ConfigSource.DEFAULT_CONFIG.value
    assert described["max.message.bytes"].value == str(MAX_MESSAGE_BYTES)  # the agent's, for a topic that sets none
    assert (described["min.cleanable.dirty.ratio"].value, described["min.cleanable.dirty.ratio"].source) == ("0.5", ConfigSource.DEFAULT_CONFIG.value)
    broker = ConfigResource(ConfigResource.Type.BROKER, "0")
    settings = admin.describe_configs([broker], request_timeout=10)[broker].result(timeout=10)
    assert settings["message.max.bytes"].value == str(MAX_MESSAGE_BYTES) and settings["message.max.bytes"].is_read_only
    assert settings["auto.create.topics.enable"].value == "true"
    assert settings["log.cleaner.min.cleanable.ratio"].value == "0.5"
    assert settings["advertised.listeners"].value == f"PLAINTEXT://{agent.bootstrap}"  # every listener's, by name

    incremental = ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[
        ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND),
        ConfigEntry("max.message.bytes", "100", incremental_operation=AlterConfigOpType.SET),
    ])
    assert outcome(admin.incremental_alter_configs([incremental], request_timeout=10)[incremental]) == NONE
    config = catalog.snapshot().topic("orders").config
    assert (config.retention_ms, config.cleanup_policy, config.max_message_bytes) == (3_600_000, "compact,delete", 100)
    # The topic's max.message.bytes holds at once on this agent.
    assert int(produce(agent, {("orders", 0): keyed_batch(3)})[("orders", 0)].error_code) == MESSAGE_TOO_LARGE
    reverted = ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[
        ConfigEntry("max.message.bytes", None, incremental_operation=AlterConfigOpType.DELETE),
        ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.SUBTRACT),
    ])
    assert outcome(admin.incremental_alter_configs([reverted], request_timeout=10)[reverted]) == NONE
    assert catalog.snapshot().topic("orders").config.max_message_bytes is None

    # AlterConfigs sets the whole set: delete -> compact on a live topic, its other configs back to their defaults.
    catalog.alter_topic("clicks", {"retention.ms": "1000"}, 0)
    whole = ConfigResource(ConfigResource.Type.TOPIC, "clicks", set_config={"cleanup.policy": "compact"})
    assert outcome(admin.alter_configs([whole], request_timeout=10)[whole]) == NONE
    clicks = catalog.snapshot().topic("clicks").config
    assert (clicks.cleanup_policy, clicks.retention_ms) == ("compact", 604_800_000)

    bad = ConfigResource(ConfigResource.Type.TOPIC, "orders", incremental_configs=[ConfigEntry("retention.ms", "soon", incremental_operation=AlterConfigOpType.SET)])
    refused = error_of(admin.incremental_alter_configs([bad], request_timeout=10)[bad])
    assert (refused.code(), refused.str()) == (INVALID_CONFIG, "retention.ms='soon' is not an integer: use a whole number of milliseconds from -1 (unlimited)")
    missing = ConfigResource(ConfigResource.Type.TOPIC, "nope", incremental_configs=[ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.SET)])
    assert outcome(admin.incremental_alter_configs([missing], request_timeout=10)[missing]) == UNKNOWN_TOPIC_OR_PARTITION
    static = ConfigResource(ConfigResource.Type.BROKER, "0", incremental_configs=[ConfigEntry("num.partitions", "3", incremental_operation=AlterConfigOpType.SET)])
    assert outcome(admin.incremental_alter_configs([static], request_timeout=10)[static]) == INVALID_REQUEST
    assert catalog.snapshot().topic("orders").config.retention_ms == 3_600_000

    grown = admin.create_partitions([NewPartitions("orders", 4), NewPartitions("clicks", 1)], request_timeout=10)
    assert outcome(grown["orders"]) == NONE and outcome(grown["clicks"]) == INVALID_PARTITIONS
    assert catalog.next_offsets("orders") == [0, 0, 0, 0]
    producer = Producer({"bootstrap.servers": agent.bootstrap, "enable.idempotence": False, "linger.ms": 0, **FAST_CLIENT})
    producer.produce("orders", key=b"k", value=b"in the new partition", partition=3)
    assert producer.flush(15) == 0
    assert [(record.offset, record.value) for record in stored(catalog, "orders", 3)] == [(0, b"in the new partition")]


def test_a_deleted_topic_is_gone_for_its_consumers_and_comes_back_empty_with_a_new_id(agent: RunningAgent, catalog: Catalog) -> None:
    admin = admin_client(agent)
    assert int(produce(agent, {("orders", 0): keyed_batch(3)})[("orders", 0)].error_code) == NONE
    old_id = admin.describe_topics(TopicCollection(["orders"]), request_timeout=10)["orders"].result(timeout=10).topic_id

    deleted = admin.delete_topics(["orders", "nope"], request_timeout=10)
    assert outcome(deleted["orders"]) == NONE and outcome(deleted["nope"]) == UNKNOWN_TOPIC_OR_PARTITION
    assert "orders" not in catalog.snapshot().topics
    old = uuid.UUID(bytes=base64.b64decode(str(old_id) + "=="))
    by_old_id = metadata(agent, [{"name": None, "topic_id": old}], allow_auto_create=False)
    assert [int(t.error_code) for t in by_old_id.topics] == [UNKNOWN_TOPIC_ID]
    fetched = kio_exchange(agent.server, 1, 12, {
        "replica_id": -1, "max_wait": 0, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "orders", "partitions": [{"partition": 0, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                                                       "log_start_offset": -1, "partition_max_bytes": 1 << 20}]}],
        "forgotten_topics_data": [], "rack_id": "",
    })
    assert [int(p.error_code) for t in fetched.responses for p in t.partitions] == [UNKNOWN_TOPIC_OR_PARTITION]

    assert outcome(admin.create_topics([NewTopic("orders", 1)], request_timeout=10)["orders"]) == NONE
    again = admin.describe_topics(TopicCollection(["orders"]), request_timeout=10)["orders"].result(timeout=10)
    assert str(again.topic_id) != str(old_id) and len(again.partitions) == 1
    assert stored(catalog, "orders", 0) == [] and catalog.next_offsets("orders") == [0]
    assert not catalog.snapshot().topic("orders").config.compacted  # the default configs, not the old topic's

    # DeleteTopics v6 by topic id: the new topic's; the old id is unknown.
    new_id = uuid.UUID(bytes=base64.b64decode(str(again.topic_id) + "=="))
    by_id = kio_exchange(agent.server, 20, 6, {"topics": [{"name": None, "topic_id": new_id}, {"name": None, "topic_id": old}], "timeout": 5000})
    assert [(r.name, int(r.error_code)) for r in by_id.responses] == [("orders", NONE), (None, UNKNOWN_TOPIC_ID)]
    assert "orders" not in catalog.snapshot().topics


def test_kafka_python_admin_creates_describes_and_deletes(agent: RunningAgent, catalog: Catalog) -> None:
    admin = KafkaAdminClient(bootstrap_servers=agent.bootstrap, request_timeout_ms=10_000)
    try:
        admin.create_topics([KafkaPythonNewTopic("events", 3, 1, topic_configs={"retention.ms": "60000"})])
        assert catalog.snapshot().topic("events").config.retention_ms == 60_000
        with pytest.raises(TopicAlreadyExistsError):
            admin.create_topics([KafkaPythonNewTopic("events", 1, 1)])
        with pytest.raises(InvalidConfigurationError, match="cleanup.policy='sometimes' is invalid"):
            admin.create_topics([KafkaPythonNewTopic("odd", 1, 1, topic_configs={"cleanup.policy": "sometimes"})])
        # By default kafka-python keeps what is not at its default, by the source each config is described with.
        modified = admin.describe_configs([KafkaPythonConfigResource(ConfigResourceType.TOPIC, "events")])["topic"]["events"]
        assert {name: config["value"] for name, config in modified.items()} == {"retention.ms": "60000"}
        admin.delete_topics(["events"])
        assert "events" not in catalog.snapshot().topics
        with pytest.raises(UnknownTopicOrPartitionError):
            admin.delete_topics(["events"])
    finally:
        admin.close()


# -- auto-create ----------------------------------------------------------------------------------------


def test_a_metadata_request_creates_an_unknown_topic_when_allowed_as_kafka_does(agent: RunningAgent, catalog: Catalog) -> None:
    refused = metadata(agent, [{"name": "kept-out", "topic_id": None}], allow_auto_create=False)
    assert [int(t.error_code) for t in refused.topics] == [UNKNOWN_TOPIC_OR_PARTITION] and "kept-out" not in catalog.snapshot().topics

    first = metadata(agent, [{"name": "fresh", "topic_id": None}, {"name": "bad name", "topic_id": None}], allow_auto_create=True)
    assert [(t.name, int(t.error_code)) for t in first.topics] == [("fresh", LEADER_NOT_AVAILABLE), ("bad name", INVALID_TOPIC_EXCEPTION)]
    second = metadata(agent, [{"name": "fresh", "topic_id": None}], allow_auto_create=True, version=3)  # v0-3 always allow
    assert [(t.name, int(t.error_code), len(t.partitions)) for t in second.topics] == [("fresh", NONE, 1)]
    # Produce itself creates nothing, as in Kafka: producers ask Metadata first.
    assert int(produce(agent, {("unasked", 0): keyed_batch(1)})[("unasked", 0)].error_code) == UNKNOWN_TOPIC_OR_PARTITION
    assert set(catalog.snapshot().topics) == {"orders", "clicks", "fresh"}


def test_kcat_produce_auto_creates_and_kcat_lists_it(agent: RunningAgent, catalog: Catalog) -> None:
    if shutil.which("kcat") is None:
        pytest.skip("kcat is not installed: `make deps` installs Debian's kcat")
    produced = subprocess.run(["kcat", "-b", agent.bootstrap, "-P", "-t", "made-by-kcat", "-K:", "-X", "message.timeout.ms=15000"],
                              input="a:1\n", capture_output=True, text=True, timeout=30)
    assert produced.returncode == 0, produced.stderr
    assert [(r.key, r.value) for r in stored(catalog, "made-by-kcat", 0)] == [(b"a", b"1")]
    listed = subprocess.run(["kcat", "-b", agent.bootstrap, "-L", "-t", "made-by-kcat"], capture_output=True, text=True, timeout=30)
    assert listed.returncode == 0, listed.stderr
    assert 'topic "made-by-kcat" with 1 partitions:' in listed.stdout


@pytest.fixture
def agent_without_auto_create(catalog: Catalog) -> Iterator[RunningAgent]:
    running = RunningAgent(catalog, auto_create_topics=False, num_partitions=5)
    try:
        yield running
    finally:
        running.stop()


def test_an_agent_without_auto_create_creates_nothing_and_creates_with_its_num_partitions(agent_without_auto_create: RunningAgent, catalog: Catalog) -> None:
    agent = agent_without_auto_create
    answered = metadata(agent, [{"name": "fresh", "topic_id": None}], allow_auto_create=True)
    assert [int(t.error_code) for t in answered.topics] == [UNKNOWN_TOPIC_OR_PARTITION] and "fresh" not in catalog.snapshot().topics
    admin = admin_client(agent)
    assert outcome(admin.create_topics([NewTopic("defaulted")], request_timeout=10)["defaulted"]) == NONE
    assert catalog.snapshot().topic("defaulted").partitions == 5


# -- message.timestamp.type -------------------------------------------------------------------------------


def test_log_append_time_stamps_records_with_the_agents_time(agent: RunningAgent, catalog: Catalog) -> None:
    catalog.alter_topic("clicks", {"message.timestamp.type": "LogAppendTime"}, 0)
    agent.server.broker.ingest.forget_topics()
    before = time.time_ns() // 1_000_000
    answered = produce(agent, {("clicks", 0): record_batch([(b"k", b"v", []), (b"l", b"w", [])])})[("clicks", 0)]
    after = time.time_ns() // 1_000_000
    timestamps = [r.timestamp for r in stored(catalog, "clicks", 0)]
    assert int(answered.error_code) == NONE and timestamps[0] == timestamps[1] and before <= timestamps[0] <= after  # the producer's set aside
    assert int(answered.log_append_time.timestamp()) == timestamps[0] // 1000  # (kio reads it to the second)
