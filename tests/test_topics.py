"""Topic names and configs follow Kafka's rules and WarpStream's overrides; the catalog keeps them exactly."""

from __future__ import annotations

import logging

import pytest

from logcompact.catalog import Catalog
from logcompact.exceptions import InvalidTopicError, TopicNotFoundError
from logcompact.topic_configs import TOPIC_CONFIGS
from logcompact.topics import LONG_MAX, Topic, TopicConfig, ignored_config, kafka_config_names


@pytest.mark.parametrize("name", ["orders", "a.b-c_D9", "x" * 249, "..."])
def test_valid_names(name: str) -> None:
    assert Topic.create(name, 1, {}, 0).name == name


@pytest.mark.parametrize("name", ["", ".", "..", "x" * 250, "has space", "slash/name", "ünicode"])
def test_invalid_names_are_rejected(name: str) -> None:
    with pytest.raises(InvalidTopicError, match=r"\[a-zA-Z0-9\._-\]"):
        Topic.create(name, 1, {}, 0)


def test_defaults_are_kafkas() -> None:
    config = Topic.create("t", 3, {}, 0).config
    assert config == TopicConfig("delete", 604_800_000, 86_400_000, 0, LONG_MAX)
    assert not config.compacted


@pytest.mark.parametrize("policy, normalized", [("compact", "compact"), ("delete,compact", "compact,delete"), ("compact, delete", "compact,delete")])
def test_cleanup_policies(policy: str, normalized: str) -> None:
    config = Topic.create("t", 1, {"cleanup.policy": policy}, 0).config
    assert config.cleanup_policy == normalized and config.compacted


@pytest.mark.parametrize(
    "settings, message",
    [
        ({"cleanup.policy": "compacted"}, "cleanup.policy='compacted' is invalid: use delete, compact or compact,delete"),
        ({"retention.ms": "-2"}, r"retention.ms=-2 is out of range: allowed from -1"),
        ({"delete.retention.ms": "soon"}, "delete.retention.ms='soon' is not an integer"),
        ({"min.compaction.lag.ms": "-1"}, "min.compaction.lag.ms=-1 is out of range: allowed from 0"),
        ({"max.compaction.lag.ms": "0"}, "max.compaction.lag.ms=0 is out of range: allowed from 1"),
        ({"min.cleanable.dirty.ratio": "1.01"}, r"min.cleanable.dirty.ratio='1.01' is out of range: allowed from 0 up to 1"),
        ({"min.cleanable.dirty.ratio": "-0.1"}, r"min.cleanable.dirty.ratio='-0.1' is out of range"),
        ({"min.cleanable.dirty.ratio": "NaN"}, r"min.cleanable.dirty.ratio='NaN' is out of range"),
        ({"min.cleanable.dirty.ratio": "half"}, r"min.cleanable.dirty.ratio='half' is not a number: use a decimal from 0 to 1"),
        ({"segment.bytes": "1"}, "segment.bytes='1' is not taken: .*; give 1073741824 or leave it out"),
        ({"retention.bytes": "1000"}, "retention.bytes='1000' is not taken: topics here have no size limit; give -1 or leave it out"),
        ({"segment.size": "1"}, "unknown topic config 'segment.size': supported are"),
        (
            {"min.compaction.lag.ms": "10800000", "max.compaction.lag.ms": "3600000"},
            "max.compaction.lag.ms=3600000 is below min.compaction.lag.ms=10800000",
        ),
    ],
)
def test_invalid_configs_name_the_config_and_the_range(settings: dict, message: str) -> None:
    with pytest.raises(InvalidTopicError, match=message):
        Topic.create("t", 1, settings, 0)


def test_kafka_configs_not_applied_are_taken_at_kafkas_default_and_left_out() -> None:
    """Every topic config Kafka lists that TopicConfig has no field for (topic_configs) is taken at Kafka's default,
    as a tool copying a Kafka topic gives them, and left out; the ones it applies are applied."""
    not_applied = {c.name: c.default for c in TOPIC_CONFIGS if c.name not in kafka_config_names()}
    assert {"segment.bytes", "retention.bytes", "unclean.leader.election.enable"} <= set(not_applied)
    assert "compression.type" not in not_applied  # applied by Fetch
    assert TopicConfig.from_kafka({**not_applied, "segment.bytes": " 1073741824", "unclean.leader.election.enable": "False"}) == TopicConfig()
    assert TopicConfig.from_kafka({"segment.ms": "604800000", "cleanup.policy": "compact"}).cleanup_policy == "compact"
    assert ignored_config("retention.bytes", None) and not ignored_config("retention.ms", "1") and not ignored_config("no.such", "1")


def test_partition_count_is_bounded() -> None:
    with pytest.raises(InvalidTopicError, match="--partitions 0 is out of range"):
        Topic.create("t", 0, {}, 0)


def test_max_lag_under_two_hours_is_raised_with_a_warning(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        config = Topic.create("t", 1, {"cleanup.policy": "compact", "max.compaction.lag.ms": "60000"}, 0).config
    assert config.max_compaction_lag_ms == 7_200_000
    assert "below the 2 hour minimum" in caplog.text


def test_cleanup_policy_changes_as_in_kafka_and_other_configs_keep() -> None:
    topic = Topic.create("t", 1, {"cleanup.policy": "delete", "retention.ms": "5000"}, 0)
    compacted = topic.altered({"cleanup.policy": "compact"})
    assert compacted.config.compacted and compacted.config.retention_ms == 5000
    altered = compacted.altered({"delete.retention.ms": "1000"})
    assert altered.config.delete_retention_ms == 1000 and altered.config.cleanup_policy == "compact"
    assert altered.altered({"cleanup.policy": "delete"}).config.cleanup_policy == "delete"


def test_timestamp_type_and_max_message_bytes() -> None:
    config = Topic.create("t", 1, {"message.timestamp.type": "LogAppendTime", "max.message.bytes": "1000"}, 0).config
    assert (config.message_timestamp_type, config.max_message_bytes) == ("LogAppendTime", 1000)
    assert TopicConfig().to_kafka().keys() == {"cleanup.policy", "retention.ms", "delete.retention.ms", "min.compaction.lag.ms",
                                               "max.compaction.lag.ms", "message.timestamp.type",
                                               "min.cleanable.dirty.ratio"}  # max.message.bytes: the agent's
    with pytest.raises(InvalidTopicError, match="message.timestamp.type='Now' is invalid: use CreateTime or LogAppendTime"):
        Topic.create("t", 1, {"message.timestamp.type": "Now"}, 0)
    with pytest.raises(InvalidTopicError, match="max.message.bytes=2147483648 is out of range: allowed from 0 up to 2147483647"):
        Topic.create("t", 1, {"max.message.bytes": str(2**31)}, 0)


@pytest.mark.parametrize("given, ratio", [({}, 0.5), ({"min.cleanable.dirty.ratio": "0"}, 0.0), ({"min.cleanable.dirty.ratio": " 1 "}, 1.0),
                                          ({"min.cleanable.dirty.ratio": "2.5e-1"}, 0.25), ({"min.cleanable.dirty.ratio": 0.75}, 0.75)])
def test_min_cleanable_dirty_ratio_is_a_share_from_0_to_1_with_kafkas_default(given: dict, ratio: float) -> None:
    assert Topic.create("t", 1, given, 0).config.min_cleanable_dirty_ratio == ratio


def test_partitions_only_grow() -> None:
    topic = Topic.create("t", 2, {}, 0)
    assert topic.with_partitions(3).partitions == 3
    with pytest.raises(InvalidTopicError, match="has 2 partitions: a topic's partitions can only grow"):
        topic.with_partitions(2)


def test_round_trip_through_the_catalog(catalog: Catalog) -> None:
    topic = Topic.create(
        "t", 4,
        {"cleanup.policy": "compact,delete", "retention.ms": "-1", "delete.retention.ms": "1000",
         "min.compaction.lag.ms": "60000", "max.compaction.lag.ms": str(LONG_MAX), "min.cleanable.dirty.ratio": "0.3"},
        123,
    )
    assert Topic.from_dict(topic.to_dict()) == topic
    catalog.ensure_created(123)
    catalog.create_topic(topic, 123)
    reopened = Catalog(catalog.store, catalog.url)
    assert reopened.snapshot().topic("t") == topic and reopened.next_offsets("t") == [0, 0, 0, 0]
    altered = catalog.alter_topic("t", {"delete.retention.ms": "5"}, 456)
    assert altered == topic.altered({"delete.retention.ms": "5"})
    assert Catalog(catalog.store, catalog.url).snapshot().topic("t") == altered
    with pytest.raises(TopicNotFoundError, match="topic 'u' does not exist"):
        catalog.alter_topic("u", {"delete.retention.ms": "5"}, 456)
