"""DescribeUserScramCredentials (key 50) and AlterUserScramCredentials (key 51), KIP-554: users' SCRAM credentials in
the catalog, as Kafka's controller keeps them (ScramImage.describe, ScramControlManager.alterCredentials). Alter
takes a salt and a salted password, never a password; the agent derives and stores StoredKey and ServerKey. Every
agent answers from and writes to the shared catalog, so a change applies to the next authentication on any agent."""

from __future__ import annotations

import asyncio
from typing import Any

from logcompact.catalog.acls import AclOperation
from logcompact.catalog.credentials import MAX_ITERATIONS, MECHANISM_CODES, MIN_ITERATIONS, ScramCredential, from_salted_password
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker

DESCRIBE_USER_SCRAM_CREDENTIALS = 50
ALTER_USER_SCRAM_CREDENTIALS = 51

_MECHANISMS_BY_CODE = {code: name for name, code in MECHANISM_CODES.items()}
_DUPLICATE_ALTER = "A user credential cannot be altered twice in the same request"


async def describe_user_scram_credentials(broker: Broker, request: codec.Request) -> Any:
    """Without DESCRIBE on the cluster the whole request is CLUSTER_AUTHORIZATION_FAILED, as Kafka answers it."""
    if not broker.authorizer.authorize_cluster(request.session, AclOperation.DESCRIBE):
        return codec.build(codec.response_class(DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version), {
            "throttle_time": 0, "error_code": codec.ErrorCode.cluster_authorization_failed, "error_message": None, "results": []})
    asked = None if not request.body.users else [user.name for user in request.body.users]
    rows = await asyncio.to_thread(broker.catalog.scram_users, None if asked is None else sorted(set(asked)))
    infos: dict[str, list[dict[str, int]]] = {}
    for row in rows:
        infos.setdefault(row.user_name, []).append({"mechanism": MECHANISM_CODES[row.mechanism], "iterations": row.iterations})
    results = []
    for name in dict.fromkeys(asked if asked is not None else infos):
        if asked is not None and asked.count(name) > 1:
            results.append(_describe_error(name, codec.ErrorCode.duplicate_resource,
                                           f"Cannot describe SCRAM credentials for the same user twice in a single request: {name}"))
        elif name not in infos:
            results.append(_describe_error(name, codec.ErrorCode.resource_not_found, f"Attempt to describe a user credential that does not exist: {name}"))
        else:
            results.append({"user": name, "error_code": codec.ErrorCode.none, "error_message": None, "credential_infos": infos[name]})
    return codec.build(codec.response_class(DESCRIBE_USER_SCRAM_CREDENTIALS, request.api_version),
                       {"throttle_time": 0, "error_code": codec.ErrorCode.none, "error_message": None, "results": results})


def _describe_error(name: str, error: codec.ErrorCode, message: str) -> dict[str, Any]:
    return {"user": name, "error_code": error, "error_message": message, "credential_infos": []}


async def alter_user_scram_credentials(broker: Broker, request: codec.Request) -> Any:
    """Kafka's checks in its order: a user named twice (deletions and upsertions together) is DUPLICATE_RESOURCE, an
    empty name or iterations outside 4,096-16,384 UNACCEPTABLE_CREDENTIAL, an unknown mechanism
    UNSUPPORTED_SASL_MECHANISM, a deletion of no credential RESOURCE_NOT_FOUND; the rest is applied in one transaction.
    Without ALTER on the cluster every user named is CLUSTER_AUTHORIZATION_FAILED, as Kafka answers."""
    if not broker.authorizer.authorize_cluster(request.session, AclOperation.ALTER):
        names = dict.fromkeys(entry.name for entry in (*request.body.deletions, *request.body.upsertions))
        return codec.build(codec.response_class(ALTER_USER_SCRAM_CREDENTIALS, request.api_version), {"throttle_time": 0, "results": [
            {"user": name, "error_code": codec.ErrorCode.cluster_authorization_failed, "error_message": None} for name in names]})
    errors: dict[str, tuple[codec.ErrorCode, str]] = {}
    deletions: dict[str, str] = {}
    upsertions: dict[str, ScramCredential] = {}
    for deletion in request.body.deletions:
        name = deletion.name
        if name in errors:
            continue
        if deletions.pop(name, None) is not None:
            errors[name] = (codec.ErrorCode.duplicate_resource, _DUPLICATE_ALTER)
        elif (error := _name_and_mechanism_error(name, deletion.mechanism)) is not None:
            errors[name] = error
        else:
            deletions[name] = _MECHANISMS_BY_CODE[deletion.mechanism]
    for upsertion in request.body.upsertions:
        name = upsertion.name
        if name in errors:
            continue
        if deletions.pop(name, None) is not None or upsertions.pop(name, None) is not None:
            errors[name] = (codec.ErrorCode.duplicate_resource, _DUPLICATE_ALTER)
        elif (error := _name_and_mechanism_error(name, upsertion.mechanism)) is not None:
            errors[name] = error
        elif upsertion.iterations < MIN_ITERATIONS:
            errors[name] = (codec.ErrorCode.unacceptable_credential, "Too few iterations")
        elif upsertion.iterations > MAX_ITERATIONS:
            errors[name] = (codec.ErrorCode.unacceptable_credential, "Too many iterations")
        else:
            mechanism = _MECHANISMS_BY_CODE[upsertion.mechanism]
            upsertions[name] = from_salted_password(mechanism, upsertion.salt, upsertion.salted_password, upsertion.iterations)
    missing = await asyncio.to_thread(broker.catalog.alter_scram_credentials, list(upsertions.items()), list(deletions.items()))
    for name, _mechanism in missing:
        errors[name] = (codec.ErrorCode.resource_not_found, "Attempt to delete a user credential that does not exist")
    results = [{"user": name, "error_code": codec.ErrorCode.none, "error_message": None}
               for name in [*deletions, *upsertions] if name not in errors]
    results += [{"user": name, "error_code": error, "error_message": message} for name, (error, message) in errors.items()]
    return codec.build(codec.response_class(ALTER_USER_SCRAM_CREDENTIALS, request.api_version), {"throttle_time": 0, "results": results})


def _name_and_mechanism_error(name: str, mechanism: int) -> tuple[codec.ErrorCode, str] | None:
    if not name:
        return codec.ErrorCode.unacceptable_credential, "Username must not be empty"
    if mechanism not in _MECHANISMS_BY_CODE:
        return codec.ErrorCode.unsupported_sasl_mechanism, "Unknown SCRAM mechanism"
    return None
