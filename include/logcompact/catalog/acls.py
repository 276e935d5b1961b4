"""Kafka's ACLs in the catalog (`acls`): one row per binding (Kafka's AclBinding: a resource pattern and an access
control entry), every field Kafka's code or text, so CreateAcls, DescribeAcls, DeleteAcls and `logcompact acl` all
read and write the same rows. Not part of the manifest: each write is a small transaction that creates no version.
Agents cache the rows (`kafka.authorizer.AclAuthorizer`) and read them again every --acl-refresh-ms.

Here also the model both sides share: Kafka's codes, a binding, and a filter with Kafka's matching rules
(ResourcePatternFilter and AccessControlEntryFilter: ANY, MATCH, LITERAL and PREFIXED). Functions of a Connection,
called by `Catalog` inside its transactions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import IntEnum

from sqlalchemy import Connection, and_, delete, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import upsert


class ResourceType(IntEnum):  # Kafka's org.apache.kafka.common.resource.ResourceType codes
    UNKNOWN = 0
    ANY = 1
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(IntEnum):  # Kafka's PatternType codes (KIP-290)
    UNKNOWN = 0
    ANY = 1
    MATCH = 2
    LITERAL = 3
    PREFIXED = 4


class AclOperation(IntEnum):  # Kafka's AclOperation codes
    UNKNOWN = 0
    ANY = 1
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermissionType(IntEnum):  # Kafka's AclPermissionType codes
    UNKNOWN = 0
    ANY = 1
    DENY = 2
    ALLOW = 3


WILDCARD = "*"  # a LITERAL resource name or a host matching every one
WILDCARD_PRINCIPAL = "User:*"
CLUSTER_NAME = "kafka-cluster"  # the one name of the CLUSTER resource


class InvalidAclError(ValueError):
    """A binding or filter Kafka refuses (its InvalidRequestException): INVALID_REQUEST on the wire."""


@dataclass(frozen=True, order=True)
class AclBinding:
    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str  # TYPE:NAME, or User:*
    host: str  # an address, or *
    operation: AclOperation
    permission: AclPermissionType

    def check(self) -> None:
        """Kafka's checks of a new binding (AclControlManager.validateNewAcl, AclApis): InvalidAclError otherwise."""
        if self.resource_type in (ResourceType.UNKNOWN, ResourceType.ANY):
            raise InvalidAclError(f"Invalid resourceType {self.resource_type.name}")
        if self.pattern_type not in (PatternType.LITERAL, PatternType.PREFIXED):
            raise InvalidAclError(f"Invalid patternType {self.pattern_type.name}")
        if self.operation in (AclOperation.UNKNOWN, AclOperation.ANY):
            raise InvalidAclError(f"Invalid operation {self.operation.name}")
        if self.permission not in (AclPermissionType.ALLOW, AclPermissionType.DENY):
            raise InvalidAclError(f"Invalid permissionType {self.permission.name}")
        if not self.resource_name:
            raise InvalidAclError("Invalid empty resource name")
        if self.resource_type == ResourceType.CLUSTER and self.resource_name != CLUSTER_NAME:
            raise InvalidAclError(f"The only valid name for the CLUSTER resource is {CLUSTER_NAME}")
        principal_type, colon, name = self.principal.partition(":")
        if not colon or not principal_type or not name:
            raise InvalidAclError(f"principal {self.principal!r} is not TYPE:NAME (for example User:alice, or User:* for every one)")
        if not self.host:
            raise InvalidAclError("Invalid empty host: give an address, or * for every host")


@dataclass(frozen=True)
class AclFilter:
    """Kafka's AclBindingFilter: None (a name, principal or host) and ANY match everything; a resource name with
    pattern type MATCH matches the bindings that would apply to that resource (literal, wildcard and prefixes)."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermissionType = AclPermissionType.ANY

    def check(self) -> None:
        """Kafka refuses a filter with an UNKNOWN field (AclControlManager.validateFilter)."""
        if ResourceType.UNKNOWN == self.resource_type or PatternType.UNKNOWN == self.pattern_type:
            raise InvalidAclError("Unknown patternFilter.")
        if AclOperation.UNKNOWN == self.operation or AclPermissionType.UNKNOWN == self.permission:
            raise InvalidAclError("Unknown entryFilter.")

    def matches(self, binding: AclBinding) -> bool:
        return self._matches_pattern(binding) and self._matches_entry(binding)

    def _matches_pattern(self, binding: AclBinding) -> bool:  # ResourcePatternFilter.matches
        if self.resource_type != ResourceType.ANY and self.resource_type != binding.resource_type:
            return False
        if self.pattern_type not in (PatternType.ANY, PatternType.MATCH) and self.pattern_type != binding.pattern_type:
            return False
        if self.resource_name is None:
            return True
        if self.pattern_type in (PatternType.ANY, binding.pattern_type):
            return self.resource_name == binding.resource_name
        if binding.pattern_type == PatternType.LITERAL:
            return self.resource_name == binding.resource_name or binding.resource_name == WILDCARD
        return self.resource_name.startswith(binding.resource_name)

    def _matches_entry(self, binding: AclBinding) -> bool:  # AccessControlEntryFilter.matches
        return (
            (self.principal is None or self.principal == binding.principal)
            and (self.host is None or self.host == binding.host)
            and self.operation in (AclOperation.ANY, binding.operation)
            and self.permission in (AclPermissionType.ANY, binding.permission)
        )


def create(connection: Connection, bindings: Iterable[AclBinding]) -> None:
    """Add the bindings; one that exists already stays as it is (CreateAcls is idempotent, as Kafka's)."""
    rows = [_row(binding) for binding in bindings]
    if rows:
        connection.execute(upsert(connection, s.acls).on_conflict_do_nothing(), rows)


def delete_matching(connection: Connection, filters: Sequence[AclFilter]) -> list[list[AclBinding]]:
    """Delete the bindings matching each filter; each filter's deleted bindings, in its order (one that an earlier
    filter of the same call matched is that filter's only)."""
    bindings = listed(connection)
    taken: set[AclBinding] = set()
    deleted = []
    for acl_filter in filters:
        mine = [binding for binding in bindings if binding not in taken and acl_filter.matches(binding)]
        taken.update(mine)
        deleted.append(mine)
    a = s.acls.c
    for binding in taken:
        row = _row(binding)
        connection.execute(delete(s.acls).where(and_(*(a[name] == value for name, value in row.items()))))
    return deleted


def listed(connection: Connection) -> list[AclBinding]:
    """Every binding, in a stable order."""
    return sorted(
        AclBinding(ResourceType(r.resource_type), r.resource_name, PatternType(r.pattern_type), r.principal, r.host,
                   AclOperation(r.operation), AclPermissionType(r.permission_type))
        for r in connection.execute(select(s.acls))
    )


def _row(binding: AclBinding) -> dict[str, object]:
    return {
        "resource_type": int(binding.resource_type), "resource_name": binding.resource_name, "pattern_type": int(binding.pattern_type),
        "principal": binding.principal, "host": binding.host, "operation": int(binding.operation), "permission_type": int(binding.permission),
    }
