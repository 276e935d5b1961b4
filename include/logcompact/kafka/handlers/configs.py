"""DescribeConfigs (key 32) v0-4, AlterConfigs (key 33) v0-2 and IncrementalAlterConfigs (key 44) v0-1.

Topics take the configs the CLI knows (`logcompact.topics`), checked by the same rules with the same one-line
messages: an unknown name or a bad value is INVALID_CONFIG, an unknown topic UNKNOWN_TOPIC_OR_PARTITION; a Kafka
topic config the product does not apply is taken at Kafka's default only. Every topic config Kafka 4.x lists is
described (`kafka_configs`): those the product applies with the topic's value, DEFAULT_CONFIG while it holds
Kafka's default, DYNAMIC_TOPIC_CONFIG otherwise (the catalog keeps values, not whether one was given); the others
at Kafka's default. Synonyms (v1+) and documentation (v3+) when asked. AlterConfigs sets the whole set (what it leaves out goes back
to its default, as in Kafka); IncrementalAlterConfigs sets, deletes (back to the default), or appends to and
subtracts from cleanup.policy, the one list config.

A broker (this agent, by its node id or "") is described read-only: its settings under Kafka's names
(STATIC_BROKER_CONFIG where an option sets other than Kafka's default) and Kafka's defaults of the topics' configs.
Altering one is INVALID_REQUEST, as Kafka answers a config it cannot change dynamically.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import asdict
from typing import Any

from logcompact.catalog.acls import CLUSTER_NAME, AclOperation, ResourceType
from logcompact.exceptions import InvalidTopicError, TopicNotFoundError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.kafka.kafka_configs import DEFAULT_CONFIG, DYNAMIC_TOPIC_CONFIG, STATIC_BROKER_CONFIG
from logcompact.kafka.kafka_configs import entry as config_entry
from logcompact.kafka.session import Session
from logcompact.topic_configs import TOPIC_CONFIGS, TOPIC_CONFIGS_BY_NAME
from logcompact.topics import Topic, TopicConfig, ignored_config, kafka_config_names, validate_topic_name
from logcompact.units import wall_clock_ms

DESCRIBE_CONFIGS = 32
ALTER_CONFIGS = 33
INCREMENTAL_ALTER_CONFIGS = 44

# Kafka's ConfigResource.Type codes.
TOPIC = 2
BROKER = 4
BROKER_LOGGER, CLIENT_METRICS, GROUP = 8, 16, 32
RESOURCE_TYPES = {0: "UNKNOWN", 2: "TOPIC", 4: "BROKER", 8: "BROKER_LOGGER", 16: "CLIENT_METRICS", 32: "GROUP"}
# IncrementalAlterConfigs' operations.
SET, DELETE, APPEND, SUBTRACT = 0, 1, 2, 3
LIST_CONFIGS = {"cleanup.policy"}


class Refused(Exception):
    """One topic or resource of a request refused with Kafka's error; the request's others go on."""

    def __init__(self, error: codec.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


def check_authorized(broker: Broker, session: Session, resource: Any, operation: AclOperation) -> None:
    """As Kafka: DESCRIBE_CONFIGS or ALTER_CONFIGS (`operation`) on the topic, the cluster for a broker's (or its
    loggers' or client metrics') configs, the group for a group's; Refused with the resource's authorization error."""
    kind = resource.resource_type
    if kind == TOPIC:
        target, error = (ResourceType.TOPIC, resource.resource_name), codec.ErrorCode.topic_authorization_failed
    elif kind in (BROKER, BROKER_LOGGER, CLIENT_METRICS):
        target, error = (ResourceType.CLUSTER, CLUSTER_NAME), codec.ErrorCode.cluster_authorization_failed
    elif kind == GROUP:
        target, error = (ResourceType.GROUP, resource.resource_name), codec.ErrorCode.group_authorization_failed
    else:
        return  # a type Kafka does not know: refused as such after
    if not broker.authorizer.authorize(session, operation, *target):
        raise Refused(error, f"{session.principal} may not {operation.name} {RESOURCE_TYPES[kind]} {resource.resource_name!r}")


# -- describing -------------------------------------------------------------------------------------------


def topic_configs(broker: Broker, config: TopicConfig, keys: Any, with_synonyms: bool = False, with_documentation: bool = False) -> list[dict[str, Any]]:
    """A topic's configs as DescribeConfigs (and CreateTopics v5+) lists them: every topic config of Kafka's
    (`topic_configs.TOPIC_CONFIGS`), those the product applies with the topic's values; only `keys` unless None."""
    values, defaults, applied = asdict(config), asdict(TopicConfig()), set(kafka_config_names())
    described = []
    for kafka in TOPIC_CONFIGS:
        if keys is not None and kafka.name not in keys:
            continue
        field = kafka.name.replace(".", "_")
        synonym = kafka.broker_synonym
        synonyms: list[tuple[str, Any, int]] = []
        if kafka.name not in applied or values[field] == defaults[field]:
            value, source = kafka.default, DEFAULT_CONFIG
            if field == "max_message_bytes":  # unset: the agent's, as Kafka's topics take the broker's message.max.bytes
                value = str(broker.max_message_bytes)
                source = DEFAULT_CONFIG if value == kafka.default else STATIC_BROKER_CONFIG
                if source == STATIC_BROKER_CONFIG:
                    synonyms.append((str(synonym), value, STATIC_BROKER_CONFIG))
        else:
            value, source = values[field], DYNAMIC_TOPIC_CONFIG
            synonyms.append((kafka.name, value, DYNAMIC_TOPIC_CONFIG))
        if synonym is not None:
            synonyms.append((synonym, kafka.default, DEFAULT_CONFIG))
        described.append(config_entry(kafka.name, value, source, kafka.kind, synonyms=tuple(synonyms) if with_synonyms else (),
                               documentation=kafka.documentation if with_documentation else None))
    return described


def broker_configs(broker: Broker, keys: Any, with_synonyms: bool = False, with_documentation: bool = False) -> list[dict[str, Any]]:
    """This agent's settings under Kafka's names, read-only (`kafka_configs.agent_broker_configs`)."""
    return [config.described(with_synonyms, with_documentation) for config in broker.broker_configs if keys is None or config.name in keys]


async def describe_configs(broker: Broker, request: codec.Request) -> Any:
    results = await asyncio.to_thread(lambda: [_describe(broker, request.session, resource, request.body) for resource in request.body.resources])
    return codec.build(codec.response_class(DESCRIBE_CONFIGS, request.api_version), {"throttle_time": 0, "results": results})


def _describe(broker: Broker, session: Session, resource: Any, body: Any) -> dict[str, Any]:
    # include_synonyms from v1, include_documentation from v3: absent before
    asked = (getattr(body, "include_synonyms", False), getattr(body, "include_documentation", False))
    result = {"resource_type": resource.resource_type, "resource_name": resource.resource_name, "error_code": codec.ErrorCode.none, "error_message": None, "configs": []}
    try:
        check_authorized(broker, session, resource, AclOperation.DESCRIBE_CONFIGS)
        if resource.resource_type == TOPIC:
            topic = _topic(broker, resource.resource_name)
            result["configs"] = topic_configs(broker, topic.config, resource.configuration_keys, *asked)
        else:
            _check_broker(broker, resource)
            result["configs"] = broker_configs(broker, resource.configuration_keys, *asked)
    except Refused as refused:
        result.update(error_code=refused.error, error_message=str(refused))
    return result


def _topic(broker: Broker, name: str) -> Topic:
    try:
        validate_topic_name(name)
    except InvalidTopicError as exc:
        raise Refused(codec.ErrorCode.invalid_topic_exception, str(exc)) from None
    topic = broker.catalog.snapshot().topics.get(name)
    if topic is None:
        raise Refused(codec.ErrorCode.unknown_topic_or_partition, f"topic {name!r} does not exist")
    return topic


def _check_broker(broker: Broker, resource: Any) -> None:
    if resource.resource_type != BROKER:
        kind = RESOURCE_TYPES.get(resource.resource_type, f"type {resource.resource_type}")
        raise Refused(codec.ErrorCode.invalid_request, f"resources of {kind} are not served: describe or alter a TOPIC, or describe a BROKER")
    if resource.resource_name not in ("", str(broker.node_id)):
        raise Refused(codec.ErrorCode.invalid_request, f"unexpected broker id {resource.resource_name!r}: this agent is broker {broker.node_id} (or \"\")")


# -- altering ---------------------------------------------------------------------------------------------


def settings_of(entries: Any, null_error: codec.ErrorCode) -> dict[str, str]:
    """A request's configs as {name: value}; a null value or a name given twice is refused with `null_error`
    (Kafka's for the API) or INVALID_REQUEST. A Kafka topic config the product does not apply is taken at Kafka's
    default and left out (quixstreams names `retention.bytes` -1 in every changelog topic it creates; a tool copying
    a Kafka topic names them all), another value of it is INVALID_CONFIG."""
    named = Counter(entry.name for entry in entries)
    settings = {}
    for entry in entries:
        if named[entry.name] > 1:
            raise Refused(codec.ErrorCode.invalid_request, f"config {entry.name!r} is given {named[entry.name]} times")
        if entry.value is None:
            raise Refused(null_error, f"config {entry.name!r} has a null value: give a value (IncrementalAlterConfigs DELETE reverts one to its default)")
        if _ignored(entry.name, entry.value):
            continue
        settings[entry.name] = entry.value
    return settings


def _ignored(name: str, value: str | None) -> bool:
    """`topics.ignored_config`: whether config `name` is one the product does not apply, given at Kafka's default (or
    None: deleted); another value of it is Refused with INVALID_CONFIG."""
    try:
        return ignored_config(name, value)
    except InvalidTopicError as exc:
        raise Refused(codec.ErrorCode.invalid_config, str(exc)) from None


async def alter_configs(broker: Broker, request: codec.Request) -> Any:
    """Each topic's configs replaced by those given: the others go back to their defaults, as in Kafka."""
    def change(resource: Any) -> Any:
        settings = settings_of(resource.configs, codec.ErrorCode.invalid_request)
        return lambda topic: topic.with_config(TopicConfig.from_kafka(settings))

    return await _alter(broker, request, ALTER_CONFIGS, change)


async def incremental_alter_configs(broker: Broker, request: codec.Request) -> Any:
    return await _alter(broker, request, INCREMENTAL_ALTER_CONFIGS, _incremental_change)


def _incremental_change(resource: Any) -> Any:
    named = Counter(entry.name for entry in resource.configs)
    for entry in resource.configs:
        if named[entry.name] > 1:
            raise Refused(codec.ErrorCode.invalid_request, f"config {entry.name!r} is given {named[entry.name]} times")
        if entry.config_operation not in (SET, DELETE, APPEND, SUBTRACT):
            raise Refused(codec.ErrorCode.invalid_request, f"config {entry.name!r}: operation {entry.config_operation} is not SET (0), DELETE (1), APPEND (2) or SUBTRACT (3)")
        if entry.config_operation in (APPEND, SUBTRACT) and entry.name not in LIST_CONFIGS and entry.name in TOPIC_CONFIGS_BY_NAME:
            raise Refused(codec.ErrorCode.invalid_config, f"config {entry.name!r} is not a list: APPEND and SUBTRACT apply to cleanup.policy only")
        if entry.config_operation != DELETE and entry.value is None:
            raise Refused(codec.ErrorCode.invalid_request, f"config {entry.name!r} has a null value: give a value, or DELETE it")

    applied = [entry for entry in resource.configs if not _ignored(entry.name, None if entry.config_operation == DELETE else entry.value)]

    def change(topic: Topic) -> Topic:
        config = topic.config.reverted([entry.name for entry in applied if entry.config_operation == DELETE])
        settings = {}
        for entry in applied:
            if entry.config_operation == SET:
                settings[entry.name] = entry.value
            elif entry.config_operation in (APPEND, SUBTRACT):
                current = [item for item in str(config.to_kafka().get(entry.name, "")).split(",") if item]
                given = [item.strip() for item in entry.value.split(",") if item.strip()]
                items = current + [i for i in given if i not in current] if entry.config_operation == APPEND else [i for i in current if i not in given]
                settings[entry.name] = ",".join(items)
        return topic.with_config(TopicConfig.from_kafka(settings, base=config))

    return change


async def _alter(broker: Broker, request: codec.Request, api_key: int, change_of: Any) -> Any:
    body = request.body
    named = Counter((resource.resource_type, resource.resource_name) for resource in body.resources)
    responses = []
    for resource in body.resources:
        result = {"resource_type": resource.resource_type, "resource_name": resource.resource_name, "error_code": codec.ErrorCode.none, "error_message": None}
        try:
            if named[(resource.resource_type, resource.resource_name)] > 1:
                raise Refused(codec.ErrorCode.invalid_request, f"resource {resource.resource_name!r} is named twice in the request")
            check_authorized(broker, request.session, resource, AclOperation.ALTER_CONFIGS)
            if resource.resource_type != TOPIC:
                _check_broker(broker, resource)
                raise Refused(codec.ErrorCode.invalid_request, f"broker {broker.node_id}'s configs are its command line's: they cannot be changed dynamically")
            await asyncio.to_thread(_alter_topic, broker, resource.resource_name, change_of(resource), body.validate_only)
        except Refused as refused:
            result.update(error_code=refused.error, error_message=str(refused))
        responses.append(result)
    if not body.validate_only:
        broker.ingest.forget_topics()
    return codec.build(codec.response_class(api_key, request.api_version), {"throttle_time": 0, "responses": responses})


def _alter_topic(broker: Broker, name: str, change: Any, validate_only: bool) -> None:
    try:
        if validate_only:
            change(_topic(broker, name))
        else:
            _topic(broker, name)  # its name checked, and an unknown topic refused before a version is written
            broker.catalog.alter_topic(name, change, wall_clock_ms())
    except TopicNotFoundError as exc:
        raise Refused(codec.ErrorCode.unknown_topic_or_partition, str(exc)) from None
    except InvalidTopicError as exc:
        raise Refused(codec.ErrorCode.invalid_config, str(exc)) from None
