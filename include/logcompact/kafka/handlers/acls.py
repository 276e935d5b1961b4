"""DescribeAcls (key 29), CreateAcls (key 30) and DeleteAcls (key 31), v0-3: Kafka's ACLs, kept in the catalog
(`catalog.acls`) and enforced by every agent's `AclAuthorizer`.

As Kafka's AclApis: DescribeAcls needs DESCRIBE on the cluster, CreateAcls and DeleteAcls ALTER on it
(CLUSTER_AUTHORIZATION_FAILED otherwise, on the request or on each of its entries); with authorization off all three
answer SECURITY_DISABLED. v0 knows literal patterns only: its bindings and filters are LITERAL. A binding Kafka
refuses (an UNKNOWN or ANY field, an empty name, a cluster not named kafka-cluster, a principal that is not
TYPE:NAME) is INVALID_REQUEST with Kafka's message, the others of the request are created; an invalid filter is
INVALID_REQUEST. CreateAcls is idempotent; DeleteAcls answers, per filter, the bindings it deleted. This agent
applies its own changes at once, the others within their --acl-refresh-ms.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from logcompact.catalog.acls import AclBinding, AclFilter, AclOperation, AclPermissionType, InvalidAclError, PatternType, ResourceType
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker

DESCRIBE_ACLS, CREATE_ACLS, DELETE_ACLS = 29, 30, 31
SECURITY_DISABLED_MESSAGE = "No Authorizer is configured on the broker: start the agent with --authorizer acl and --super-users"

log = logging.getLogger(__name__)


def _refusal(broker: Broker, request: codec.Request, operation: AclOperation) -> tuple[codec.ErrorCode, str] | None:
    """The error of every entry of the request, if any: no authorizer, or no `operation` on the cluster."""
    if not broker.authorizer.authorize_cluster(request.session, operation):
        return codec.ErrorCode.cluster_authorization_failed, f"{request.session.principal} may not {operation.name} the cluster"
    if not broker.authorizer.enabled:
        return codec.ErrorCode.security_disabled, SECURITY_DISABLED_MESSAGE
    return None


def _codes(value: Any, kind: Any) -> Any:
    """A code of the enum `kind`, its UNKNOWN for a code Kafka does not have (refused by the checks)."""
    try:
        return kind(int(value))
    except ValueError:
        return kind.UNKNOWN


def _filter(entry: Any) -> AclFilter:
    return AclFilter(
        _codes(entry.resource_type_filter, ResourceType), entry.resource_name_filter,
        _codes(getattr(entry, "pattern_type_filter", PatternType.LITERAL), PatternType),
        entry.principal_filter, entry.host_filter, _codes(entry.operation, AclOperation), _codes(entry.permission_type, AclPermissionType),
    )


async def describe_acls(broker: Broker, request: codec.Request) -> Any:
    response_class = codec.response_class(DESCRIBE_ACLS, request.api_version)
    refused = _refusal(broker, request, AclOperation.DESCRIBE)
    if refused is None:
        acl_filter = _filter(request.body)
        try:
            acl_filter.check()
        except InvalidAclError as exc:
            refused = codec.ErrorCode.invalid_request, str(exc)
    if refused is not None:
        return codec.build(response_class, {"throttle_time": 0, "error_code": refused[0], "error_message": refused[1], "resources": []})
    by_resource: dict[tuple[ResourceType, str, PatternType], list[AclBinding]] = {}
    for binding in broker.authorizer.bindings:
        if acl_filter.matches(binding):
            by_resource.setdefault((binding.resource_type, binding.resource_name, binding.pattern_type), []).append(binding)
    return codec.build(response_class, {"throttle_time": 0, "error_code": codec.ErrorCode.none, "error_message": None, "resources": [
        {"resource_type": resource_type, "resource_name": name, "pattern_type": pattern_type, "acls": [
            {"principal": b.principal, "host": b.host, "operation": b.operation, "permission_type": b.permission} for b in bindings
        ]}
        for (resource_type, name, pattern_type), bindings in sorted(by_resource.items())
    ]})


async def create_acls(broker: Broker, request: codec.Request) -> Any:
    creations = request.body.creations
    response_class = codec.response_class(CREATE_ACLS, request.api_version)
    refused = _refusal(broker, request, AclOperation.ALTER)
    if refused is not None:
        return codec.build(response_class, {"throttle_time": 0, "results": [{"error_code": refused[0], "error_message": refused[1]} for _ in creations]})
    results: list[dict[str, Any]] = []
    valid = []
    for entry in creations:
        binding = AclBinding(
            _codes(entry.resource_type, ResourceType), entry.resource_name, _codes(getattr(entry, "resource_pattern_type", PatternType.LITERAL), PatternType),
            entry.principal, entry.host, _codes(entry.operation, AclOperation), _codes(entry.permission_type, AclPermissionType),
        )
        try:
            binding.check()
        except InvalidAclError as exc:
            results.append({"error_code": codec.ErrorCode.invalid_request, "error_message": str(exc)})
        else:
            valid.append(binding)
            results.append({"error_code": codec.ErrorCode.none, "error_message": None})
    if valid:
        await asyncio.to_thread(_write_then_refresh, broker, lambda: broker.catalog.create_acls(valid))
        log.info("%s created ACLs: %s", request.session.principal, "; ".join(map(str, valid)))
    return codec.build(response_class, {"throttle_time": 0, "results": results})


async def delete_acls(broker: Broker, request: codec.Request) -> Any:
    entries = request.body.filters
    response_class = codec.response_class(DELETE_ACLS, request.api_version)
    refused = _refusal(broker, request, AclOperation.ALTER)
    if refused is not None:
        return codec.build(response_class, {"throttle_time": 0, "filter_results": [
            {"error_code": refused[0], "error_message": refused[1], "matching_acls": []} for _ in entries
        ]})
    filters = [_filter(entry) for entry in entries]
    errors: list[str | None] = []
    for acl_filter in filters:
        try:
            acl_filter.check()
            errors.append(None)
        except InvalidAclError as exc:
            errors.append(str(exc))
    valid = [acl_filter for acl_filter, error in zip(filters, errors) if error is None]
    deleted = iter(await asyncio.to_thread(_write_then_refresh, broker, lambda: broker.catalog.delete_acls(valid)) if valid else [])
    results = []
    for error in errors:
        if error is not None:
            results.append({"error_code": codec.ErrorCode.invalid_request, "error_message": error, "matching_acls": []})
            continue
        matched = next(deleted)
        if matched:
            log.info("%s deleted ACLs: %s", request.session.principal, "; ".join(map(str, matched)))
        results.append({"error_code": codec.ErrorCode.none, "error_message": None, "matching_acls": [
            {"error_code": codec.ErrorCode.none, "error_message": None, "resource_type": b.resource_type, "resource_name": b.resource_name,
             "pattern_type": b.pattern_type, "principal": b.principal, "host": b.host, "operation": b.operation, "permission_type": b.permission}
            for b in matched
        ]})
    return codec.build(response_class, {"throttle_time": 0, "filter_results": results})


def _write_then_refresh(broker: Broker, write: Any) -> Any:
    """The catalog written, then this agent's cache read again, so the change applies here at once."""
    written = write()
    broker.authorizer.refresh()
    return written
