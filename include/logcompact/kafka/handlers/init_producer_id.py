"""InitProducerId (key 22), v0-4: producer ids for idempotent and transactional producers, from the catalog.

As Kafka's TransactionCoordinator: a request without a transactional id always gets a new producer id at epoch 0,
whatever producer id and epoch it carries (v3+, KIP-360). An idempotent producer bumps its own epoch after an
error (librdkafka and the Java client do it locally, kafka-python asks here and takes the new id it gets), and
Produce takes the new epoch when it starts at sequence 0. An empty transactional id is INVALID_REQUEST, as Kafka.

A transactional id is served by its coordinator (NOT_COORDINATOR elsewhere; `TransactionCoordinator`): a new id
gets a producer id at epoch 0; an id's open transaction is aborted and the epoch bumped, fencing the producer that
held it; v3+ naming the current producer id and epoch bumps the epoch (KIP-360), naming an older one is
PRODUCER_FENCED (v4+; INVALID_PRODUCER_EPOCH before), and a producer id without an epoch, or the reverse,
INVALID_REQUEST. A transaction timeout above the agent's `--transaction-max-timeout-ms` is
INVALID_TRANSACTION_TIMEOUT.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from logcompact.catalog.acls import AclOperation, ResourceType
from logcompact.catalog.transactions import TxnRefusal
from logcompact.exceptions import CatalogUnavailableError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.kafka.transaction_coordinator import error_code, fenced
from logcompact.units import wall_clock_ms

API_KEY = 22
NO_PRODUCER_ID = -1
NO_PRODUCER_EPOCH = -1
FIRST_VERSION_WITH_PRODUCER_FENCED = 4

log = logging.getLogger(__name__)


async def handle(broker: Broker, request: codec.Request) -> Any:
    body, version = request.body, request.api_version
    transactional_id = body.transactional_id
    # As Kafka: a transactional id needs WRITE on it; an idempotent producer IDEMPOTENT_WRITE on the cluster or, since
    # Kafka 3.0 (KIP-679), WRITE on any topic.
    authorizer, session = broker.authorizer, request.session
    if transactional_id is not None and not authorizer.authorize_transactional_id(session, AclOperation.WRITE, transactional_id):
        return _response(version, codec.ErrorCode.transactional_id_authorization_failed, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    if transactional_id is None and not (
        authorizer.authorize_cluster(session, AclOperation.IDEMPOTENT_WRITE) or authorizer.authorize_by_resource_type(session, AclOperation.WRITE, ResourceType.TOPIC)
    ):
        return _response(version, codec.ErrorCode.cluster_authorization_failed, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    if transactional_id is None:
        producer_id = await asyncio.to_thread(broker.catalog.allocate_producer_id, wall_clock_ms())
        return _response(version, codec.ErrorCode.none, producer_id, 0)
    if not transactional_id:
        return _response(version, codec.ErrorCode.invalid_request, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    if not broker.transactions.coordinates(transactional_id):
        return _response(version, codec.ErrorCode.not_coordinator, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    producer_id, epoch = int(getattr(body, "producer_id", NO_PRODUCER_ID)), int(getattr(body, "producer_epoch", NO_PRODUCER_EPOCH))
    if (producer_id == NO_PRODUCER_ID) != (epoch == NO_PRODUCER_EPOCH):  # Kafka's KafkaApis: both or neither
        return _response(version, codec.ErrorCode.invalid_request, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    expected = None if producer_id == NO_PRODUCER_ID else (producer_id, epoch)
    timeout_ms = int(body.transaction_timeout.total_seconds() * 1000)
    try:
        producer_id, epoch = await broker.transactions.init_producer(transactional_id, timeout_ms, expected)
    except TxnRefusal as refused:
        log.debug("InitProducerId for transactional id %r refused: %s", transactional_id, refused)
        return _response(version, fenced(error_code(refused.error), version, FIRST_VERSION_WITH_PRODUCER_FENCED), NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    except CatalogUnavailableError as exc:  # retriable: the client asks again
        log.warning("InitProducerId for transactional id %r answered COORDINATOR_NOT_AVAILABLE: %s", transactional_id, exc)
        return _response(version, codec.ErrorCode.coordinator_not_available, NO_PRODUCER_ID, NO_PRODUCER_EPOCH)
    return _response(version, codec.ErrorCode.none, producer_id, epoch)


def _response(version: int, error: codec.ErrorCode, producer_id: int, epoch: int) -> Any:
    return codec.build(
        codec.response_class(API_KEY, version),
        {"throttle_time": 0, "error_code": error, "producer_id": producer_id, "producer_epoch": epoch},
    )
