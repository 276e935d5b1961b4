"""DeleteRecords (key 21) v0-2: each partition's log start offset raised to the offset given (-1: its high
watermark), as Kafka's `Partition.deleteRecordsOnLeader`; the answer is the partition's log start after it (its low
watermark). One catalog transaction per topic (`Catalog.delete_records`).

As Kafka: DELETE on the topic, else TOPIC_AUTHORIZATION_FAILED; an unknown topic or partition
UNKNOWN_TOPIC_OR_PARTITION; a topic whose cleanup.policy lacks `delete` POLICY_VIOLATION; an offset beyond the high
watermark (or below -1) OFFSET_OUT_OF_RANGE; an offset at or below the log start changes nothing. The request's
timeout is not waited on: the commit is the deletion.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from logcompact.catalog import topics as catalog_topics
from logcompact.catalog.acls import AclOperation
from logcompact.exceptions import TopicNotFoundError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.units import wall_clock_ms

API_KEY = 21
REFUSED_LOW_WATERMARK = -1
_ERRORS = {
    catalog_topics.UNKNOWN_PARTITION: codec.ErrorCode.unknown_topic_or_partition,
    catalog_topics.POLICY_VIOLATION: codec.ErrorCode.policy_violation,
    catalog_topics.OFFSET_OUT_OF_RANGE: codec.ErrorCode.offset_out_of_range,
}

log = logging.getLogger(__name__)


async def handle(broker: Broker, request: codec.Request) -> Any:
    body = request.body
    denied = broker.authorizer.denied_topics(request.session, AclOperation.DELETE, (topic.name for topic in body.topics))
    results = await asyncio.to_thread(lambda: [_delete(broker, topic, denied) for topic in body.topics])
    return codec.build(codec.response_class(API_KEY, request.api_version), {"throttle_time": 0, "topics": results})


def _delete(broker: Broker, topic: Any, denied: set[str]) -> dict[str, Any]:
    before = {int(entry.partition_index): int(entry.offset) for entry in topic.partitions}
    if topic.name in denied:
        errors = dict.fromkeys(before, codec.ErrorCode.topic_authorization_failed)
        return _answer(topic.name, {p: (REFUSED_LOW_WATERMARK, error) for p, error in errors.items()})
    try:
        deleted = broker.catalog.delete_records(topic.name, before, wall_clock_ms())
    except TopicNotFoundError:
        return _answer(topic.name, dict.fromkeys(before, (REFUSED_LOW_WATERMARK, codec.ErrorCode.unknown_topic_or_partition)))
    answers = {}
    for partition, found in deleted.items():
        if found.refusal is None:
            answers[partition] = (found.low_watermark, codec.ErrorCode.none)
        else:
            log.info("DeleteRecords refused: %s", found.message)
            answers[partition] = (REFUSED_LOW_WATERMARK, _ERRORS[found.refusal])
    return _answer(topic.name, answers)


def _answer(name: str, answers: dict[int, tuple[int, codec.ErrorCode]]) -> dict[str, Any]:
    return {
        "name": name,
        "partitions": [
            {"partition_index": partition, "low_watermark": low_watermark, "error_code": error}
            for partition, (low_watermark, error) in sorted(answers.items())
        ],
    }
