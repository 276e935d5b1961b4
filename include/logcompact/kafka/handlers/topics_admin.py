"""CreateTopics (key 19) v0-7, DeleteTopics (key 20) v0-6 and CreatePartitions (key 37) v0-3, and Kafka's
auto-create (`auto.create.topics.enable`), which Metadata asks for: as in Kafka, a Produce to an unknown topic
creates nothing (UNKNOWN_TOPIC_OR_PARTITION); producers ask Metadata for their topics first, and that creates them.

Each topic of a request is its own catalog transaction, answered with its own error, so a refused topic never
leaves another half made. Names follow Kafka's rules (INVALID_TOPIC_EXCEPTION), configs are the ones the CLI
takes, with the CLI's one-line message (INVALID_CONFIG).

Replication: every agent serves every partition from the object store, which keeps the data durable, so there
is no replica to place. Any replication factor of 1 or more (or -1, the default) is taken, as WarpStream does,
and Metadata shows one replica per partition; a manual assignment of replicas is INVALID_REPLICA_ASSIGNMENT.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections import Counter
from typing import Any

from logcompact.catalog import Catalog
from logcompact.catalog.acls import AclOperation
from logcompact.exceptions import InvalidTopicError, TopicExistsError, TopicNotFoundError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.kafka.handlers import configs
from logcompact.kafka.handlers.configs import Refused
from logcompact.kafka.session import Session
from logcompact.topics import MAX_PARTITIONS, Topic, TopicConfig, validate_topic_name
from logcompact.units import wall_clock_ms

CREATE_TOPICS = 19
DELETE_TOPICS = 20
CREATE_PARTITIONS = 37
DEFAULT = -1  # num_partitions or replication_factor: the broker's default
FIRST_METADATA_WITH_AUTO_CREATE_FLAG = 4  # before it, Metadata always allows auto-create
NO_TOPIC_ID = uuid.UUID(int=0)

log = logging.getLogger(__name__)


# -- CreateTopics -------------------------------------------------------------------------------------------


async def create_topics(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    authorizer, session = broker.authorizer, request.session
    named = Counter(entry.name for entry in body.topics)
    # As Kafka: CREATE on the cluster, or on each topic (TOPIC_AUTHORIZATION_FAILED without); the configs of a topic
    # made (v5+) only with DESCRIBE_CONFIGS on it, else its topic_config_error_code says why they are left out.
    denied = set() if authorizer.authorize_cluster(session, AclOperation.CREATE) else authorizer.denied_topics(
        session, AclOperation.CREATE, named)
    hidden = authorizer.denied_topics(session, AclOperation.DESCRIBE_CONFIGS, named)
    results = []
    for entry in body.topics:
        try:
            if named[entry.name] > 1:
                raise Refused(codec.ErrorCode.invalid_request, f"topic {entry.name!r} is named {named[entry.name]} times in the request")
            if entry.name in denied:
                raise Refused(codec.ErrorCode.topic_authorization_failed, f"{session.principal} may not CREATE topic {entry.name!r}")
            topic, topic_id = await asyncio.to_thread(_create, broker, entry, body.validate_only)
        except Refused as refused:
            results.append(_created(entry.name, refused.error, str(refused)))
        else:
            results.append({
                **_created(entry.name, codec.ErrorCode.none, None),
                "topic_id": NO_TOPIC_ID if topic_id is None else broker.topic_id(topic.name, topic_id),
                "num_partitions": topic.partitions,
                "replication_factor": 1,
                "configs": [] if entry.name in hidden else configs.topic_configs(broker, topic.config, None),
                "topic_config_error_code": codec.ErrorCode.topic_authorization_failed if entry.name in hidden else codec.ErrorCode.none,
            })
    if not body.validate_only:
        broker.ingest.forget_topics()
    return codec.build(codec.response_class(CREATE_TOPICS, request.api_version), {"throttle_time": 0, "topics": results})


def _created(name: str, error: codec.ErrorCode, message: str | None) -> dict[str, Any]:
    return {
        "name": name, "topic_id": NO_TOPIC_ID, "error_code": error, "error_message": message, "topic_config_error_code": 0,
        "num_partitions": DEFAULT, "replication_factor": DEFAULT, "configs": None if error else [],
    }


def _create(broker: Broker, entry: Any, validate_only: bool) -> tuple[Topic, int | None]:
    """The topic made (or checked, for validate_only) and its catalog id (None when only checked)."""
    try:
        validate_topic_name(entry.name)
    except InvalidTopicError as exc:
        raise Refused(codec.ErrorCode.invalid_topic_exception, str(exc)) from None
    if entry.assignments:
        raise Refused(codec.ErrorCode.invalid_replica_assignment, "replica assignments are not taken: every agent serves every partition from the object store")
    partitions = broker.num_partitions if entry.num_partitions == DEFAULT else int(entry.num_partitions)
    if not 1 <= partitions <= MAX_PARTITIONS:
        raise Refused(codec.ErrorCode.invalid_partitions, f"num_partitions {entry.num_partitions} is out of range: use 1 to {MAX_PARTITIONS}, or -1 for the agent's {broker.num_partitions}")
    if entry.replication_factor != DEFAULT and entry.replication_factor < 1:
        raise Refused(codec.ErrorCode.invalid_replication_factor, f"replication_factor {entry.replication_factor} is invalid: use 1 or more, or -1 (the object store keeps the data)")
    settings = configs.settings_of(entry.configs, codec.ErrorCode.invalid_config)
    try:
        config = TopicConfig.from_kafka(settings)
    except InvalidTopicError as exc:
        raise Refused(codec.ErrorCode.invalid_config, str(exc)) from None
    now_ms = wall_clock_ms()
    topic = Topic(entry.name, partitions, config, now_ms)
    if validate_only:
        if entry.name in broker.catalog.snapshot().topics:
            raise Refused(codec.ErrorCode.topic_already_exists, f"topic {entry.name!r} already exists")
        return topic, None
    broker.catalog.ensure_created(now_ms)
    try:
        broker.catalog.create_topic(topic, now_ms)
    except TopicExistsError:
        raise Refused(codec.ErrorCode.topic_already_exists, f"topic {entry.name!r} already exists") from None
    return topic, broker.catalog.snapshot().topic_ids.get(entry.name)


# -- DeleteTopics -------------------------------------------------------------------------------------------


async def delete_topics(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    # v6 names each topic by name or by topic id; before, by name only.
    entries: list[tuple[str | None, uuid.UUID | None]] = (
        [(entry.name, entry.topic_id) for entry in body.topics] if request.api_version >= 6 else [(name, None) for name in body.topic_names]
    )
    results = await asyncio.to_thread(_delete_all, broker, request, entries)
    broker.ingest.forget_topics()
    return codec.build(codec.response_class(DELETE_TOPICS, request.api_version), {"throttle_time": 0, "responses": results})


def _delete_all(broker: Broker, request: codec.Request, entries: list[tuple[str | None, uuid.UUID | None]]) -> list[dict[str, Any]]:
    """Each topic deleted, or its error. As Kafka: DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED whether it
    exists or not; a topic named by id without DESCRIBE on it is answered without its name."""
    authorizer, session = broker.authorizer, request.session
    snapshot = broker.catalog.snapshot()
    by_uuid = {broker.topic_id(name, topic_id): (name, topic_id) for name, topic_id in snapshot.topic_ids.items()}
    named = Counter(entries)
    results = []
    for name, kafka_id in entries:
        result = {"name": name, "topic_id": kafka_id or NO_TOPIC_ID, "error_code": codec.ErrorCode.none, "error_message": None}
        try:
            if named[(name, kafka_id)] > 1:
                raise Refused(codec.ErrorCode.invalid_request, f"topic {name or kafka_id} is named {named[(name, kafka_id)]} times in the request")
            if name is None:
                if kafka_id not in by_uuid:
                    raise Refused(codec.ErrorCode.unknown_topic_id, f"no topic has id {kafka_id}")
                name, catalog_id = by_uuid[kafka_id]
                if not authorizer.authorize_topic(session, AclOperation.DESCRIBE, name):
                    raise Refused(codec.ErrorCode.topic_authorization_failed, f"{session.principal} may not DESCRIBE topic id {kafka_id}")
                result["name"] = name
                _authorized_delete(broker, session, name)
                _delete(broker, name, catalog_id)
            else:
                _authorized_delete(broker, session, name)
                _delete(broker, name, None)
        except Refused as refused:
            result.update(error_code=refused.error, error_message=str(refused))
        results.append(result)
    return results


def _authorized_delete(broker: Broker, session: Session, name: str) -> None:
    if not broker.authorizer.authorize_topic(session, AclOperation.DELETE, name):
        raise Refused(codec.ErrorCode.topic_authorization_failed, f"{session.principal} may not DELETE topic {name!r}")


def _delete(broker: Broker, name: str, catalog_id: int | None) -> None:
    try:
        broker.catalog.delete_topic(name, wall_clock_ms(), catalog_id)
    except TopicNotFoundError as exc:
        error = codec.ErrorCode.unknown_topic_or_partition if catalog_id is None else codec.ErrorCode.unknown_topic_id
        raise Refused(error, str(exc)) from None


# -- CreatePartitions ---------------------------------------------------------------------------------------


async def create_partitions(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    named = Counter(entry.name for entry in body.topics)
    results = []
    for entry in body.topics:
        result = {"name": entry.name, "error_code": codec.ErrorCode.none, "error_message": None}
        try:
            if named[entry.name] > 1:
                raise Refused(codec.ErrorCode.invalid_request, f"topic {entry.name!r} is named {named[entry.name]} times in the request")
            if not broker.authorizer.authorize_topic(request.session, AclOperation.ALTER, entry.name):
                raise Refused(codec.ErrorCode.topic_authorization_failed, f"{request.session.principal} may not ALTER topic {entry.name!r}")
            if entry.assignments is not None:
                raise Refused(codec.ErrorCode.invalid_replica_assignment, "replica assignments are not taken: every agent serves every partition from the object store")
            await asyncio.to_thread(_grow, broker, entry.name, int(entry.count), body.validate_only)
        except Refused as refused:
            result.update(error_code=refused.error, error_message=str(refused))
        results.append(result)
    if not body.validate_only:
        broker.ingest.forget_topics()
    return codec.build(codec.response_class(CREATE_PARTITIONS, request.api_version), {"throttle_time": 0, "results": results})


def _grow(broker: Broker, name: str, count: int, validate_only: bool) -> None:
    try:
        if validate_only:
            broker.catalog.snapshot().topic(name).with_partitions(count)
        else:
            broker.catalog.add_partitions(name, count, wall_clock_ms())
    except TopicNotFoundError as exc:
        raise Refused(codec.ErrorCode.unknown_topic_or_partition, str(exc)) from None
    except InvalidTopicError as exc:
        raise Refused(codec.ErrorCode.invalid_partitions, str(exc)) from None


# -- auto-create --------------------------------------------------------------------------------------------


def auto_create_allowed(broker: Broker, request: codec.Request) -> bool:
    """Whether a Metadata request creates the topics it names that do not exist: the agent and the request allow it
    (v4 on, the request says; before, it always allows)."""
    allowed = request.api_version < FIRST_METADATA_WITH_AUTO_CREATE_FLAG or request.body.allow_auto_topic_creation
    return bool(allowed and broker.auto_create_topics)


async def auto_create(broker: Broker, request: codec.Request, missing: list[str]) -> dict[str, codec.ErrorCode]:
    """Create the `missing` topics a Metadata request names (those the principal may create), when allowed
    (`auto_create_allowed`). Each one's error for this response, as Kafka answers: a topic made now is
    LEADER_NOT_AVAILABLE (the client asks again), a name Kafka refuses INVALID_TOPIC_EXCEPTION."""
    if not missing or not auto_create_allowed(broker, request):
        return {}
    made = await asyncio.to_thread(lambda: {name: create_default_topic(broker.catalog, name, broker.num_partitions) for name in sorted(set(missing))})
    broker.ingest.forget_topics()
    return {name: codec.ErrorCode.leader_not_available if ok else codec.ErrorCode.invalid_topic_exception for name, ok in made.items()}


def create_default_topic(catalog: Catalog, name: str, partitions: int) -> bool:
    """Create topic `name` with `partitions` and the default configs; whether it exists now (False for a name
    Kafka's rules refuse)."""
    now_ms = wall_clock_ms()
    try:
        catalog.create_topic(Topic.create(name, partitions, {}, now_ms), now_ms)
    except InvalidTopicError:
        return False
    except TopicExistsError:
        return True  # made meanwhile by another request or agent
    log.info("topic %r created with %d partitions on first use (auto-create)", name, partitions)
    return True
