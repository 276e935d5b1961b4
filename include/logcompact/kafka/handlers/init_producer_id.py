"""InitProducerId (key 22), v0-4: producer ids for idempotent producers, from the catalog's `producers` table.

As Kafka's TransactionCoordinator: a request without a transactional id always gets a new producer id at epoch 0,
whatever producer id and epoch it carries (v3+, KIP-360). An idempotent producer bumps its own epoch after an
error (librdkafka and the Java client do it locally, kafka-python asks here and takes the new id it gets), and
Produce takes the new epoch when it starts at sequence 0. An empty transactional id is INVALID_REQUEST, as Kafka.
Any other transactional id gets COORDINATOR_NOT_AVAILABLE: the agent has no transaction coordinator, and that is
what Kafka answers while it has none to offer (its transaction state topic not available); clients retry until
their init timeout and report it.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.units import wall_clock_ms

API_KEY = 22
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1

log = logging.getLogger(__name__)


async def handle(broker: Broker, request: codec.Request) -> Any:
    transactional_id = request.body.transactional_id
    if transactional_id is None:
        producer_id = await asyncio.to_thread(broker.catalog.allocate_producer_id, wall_clock_ms())
        return _response(request.api_version, codec.ErrorCode.none, producer_id, 0)
    if not transactional_id:
        return _response(request.api_version, codec.ErrorCode.invalid_request, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    log.debug("InitProducerId for transactional id %r refused: the agent serves no transactions", transactional_id)
    return _response(request.api_version, codec.ErrorCode.coordinator_not_available, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)


def _response(version: int, error: codec.ErrorCode, producer_id: int, epoch: int) -> Any:
    return codec.build(
        codec.response_class(API_KEY, version),
        {"throttle_time": 0, "error_code": error, "producer_id": producer_id, "producer_epoch": epoch},
    )
