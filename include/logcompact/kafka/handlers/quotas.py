"""DescribeClientQuotas (key 48) and AlterClientQuotas (key 49), v0-1: Kafka's client quotas in the catalog, checked
with Kafka's errors and messages (`catalog.quotas`), so kafka-configs.sh and AdminClients manage them. An alteration
is answered per entity, the valid ones written in one catalog transaction, and this agent enforces them at once
(others within their refresh, `quota_manager.REFRESH_SECONDS`). Keys Kafka has and the agent does not enforce
(request_percentage, controller_mutation_rate) are refused with INVALID_REQUEST saying so."""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog import quotas
from logcompact.catalog.acls import AclOperation
from logcompact.catalog.quotas import QuotaEntity, QuotaRequestError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker

DESCRIBE_CLIENT_QUOTAS = 48
ALTER_CLIENT_QUOTAS = 49


async def describe_client_quotas(broker: Broker, request: codec.Request) -> Any:
    """Without DESCRIBE_CONFIGS on the cluster, the whole request is CLUSTER_AUTHORIZATION_FAILED, as Kafka."""
    body = request.body
    answer: dict[str, Any] = {"throttle_time": 0, "error_code": codec.ErrorCode.none, "error_message": None, "entries": []}
    if not broker.authorizer.authorize_cluster(request.session, AclOperation.DESCRIBE_CONFIGS):
        answer.update(error_code=codec.ErrorCode.cluster_authorization_failed, entries=None)
        return codec.build(codec.response_class(DESCRIBE_CLIENT_QUOTAS, request.api_version), answer)
    try:
        matching = quotas.filter_from(((c.entity_type, int(c.match_type), c.match) for c in body.components), body.strict)
    except QuotaRequestError as exc:
        error = codec.ErrorCode.unsupported_version if exc.unsupported else codec.ErrorCode.invalid_request
        answer.update(error_code=error, error_message=str(exc), entries=None)
    else:
        found = await asyncio.to_thread(broker.catalog.client_quotas, matching)
        answer["entries"] = [
            {"entity": _entity(entity), "values": [{"key": key, "value": value} for key, value in sorted(values.items())]}
            for entity, values in sorted(found.items())
        ]
    return codec.build(codec.response_class(DESCRIBE_CLIENT_QUOTAS, request.api_version), answer)


async def alter_client_quotas(broker: Broker, request: codec.Request) -> Any:
    """Without ALTER_CONFIGS on the cluster, every entity is CLUSTER_AUTHORIZATION_FAILED and nothing changes, as Kafka."""
    body = request.body
    if not broker.authorizer.authorize_cluster(request.session, AclOperation.ALTER_CONFIGS):
        return codec.build(codec.response_class(ALTER_CLIENT_QUOTAS, request.api_version), {"throttle_time": 0, "entries": [
            {"error_code": codec.ErrorCode.cluster_authorization_failed, "error_message": None,
             "entity": [{"entity_type": part.entity_type, "entity_name": part.entity_name} for part in entry.entity]}
            for entry in body.entries]})
    results: list[dict[str, Any]] = []
    valid: list[tuple[QuotaEntity, dict[str, float | None]]] = []
    seen: set[QuotaEntity] = set()
    for entry in body.entries:
        parts = [(part.entity_type, part.entity_name) for part in entry.entity]
        result: dict[str, Any] = {"error_code": codec.ErrorCode.none, "error_message": None,
                                  "entity": [{"entity_type": kind, "entity_name": name} for kind, name in parts]}
        try:
            entity = quotas.entity_from(parts)
            if entity in seen:
                raise QuotaRequestError(f"Ignoring duplicate entity {entity}")
            seen.add(entity)
            ops = quotas.check_ops(entity, ((op.key, None if op.remove else float(op.value)) for op in entry.ops))
        except QuotaRequestError as exc:
            result.update(error_code=codec.ErrorCode.invalid_request, error_message=str(exc))
        else:
            valid.append((entity, ops))
        results.append(result)
    if valid and not body.validate_only:
        await asyncio.to_thread(broker.catalog.alter_client_quotas, valid)
        await broker.quotas.refresh()
    return codec.build(codec.response_class(ALTER_CLIENT_QUOTAS, request.api_version), {"throttle_time": 0, "entries": results})


def _entity(entity: QuotaEntity) -> list[dict[str, str | None]]:
    return [{"entity_type": kind, "entity_name": name} for kind, name in entity.parts]
