"""Kafka's client quotas (`client_quotas`): per entity (a user, a client id, both, or an IP address, each part named
or the default), the quota keys set and their values. Not part of the manifest: each alteration is a small
transaction that creates no version. Functions of a Connection, called by `Catalog` inside its transactions, and the
checks AlterClientQuotas and DescribeClientQuotas make, with Kafka's messages (its controller's
ClientQuotaControlManager and ClientQuotasImage), so the agent's handlers and the CLI refuse the same things.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from sqlalchemy import Connection, and_, delete, insert, select, update

from logcompact.catalog import schema as s

USER, CLIENT_ID, IP = "user", "client-id", "ip"  # Kafka's entity types (ClientQuotaEntity)
ENTITY_TYPES = (USER, CLIENT_ID, IP)
ABSENT, NAMED, DEFAULT = 0, 1, 2  # each entity part's column `*_part`
_COLUMNS = {USER: ("user_part", "user_name"), CLIENT_ID: ("client_id_part", "client_id_name"), IP: ("ip_part", "ip_name")}

PRODUCER_BYTE_RATE = "producer_byte_rate"
CONSUMER_BYTE_RATE = "consumer_byte_rate"
CONNECTION_CREATION_RATE = "connection_creation_rate"
# Kafka's quota keys per entity kind and their config types (QuotaConfig): LONG and INT must be whole numbers.
USER_CLIENT_KEYS = {PRODUCER_BYTE_RATE: "LONG", CONSUMER_BYTE_RATE: "LONG", "request_percentage": "DOUBLE", "controller_mutation_rate": "DOUBLE"}
IP_KEYS = {CONNECTION_CREATION_RATE: "INT"}
ENFORCED_KEYS = frozenset({PRODUCER_BYTE_RATE, CONSUMER_BYTE_RATE, CONNECTION_CREATION_RATE})
_LIMITS = {"LONG": (2**63 - 1, "a LONG"), "INT": (2**31 - 1, "an INT")}

# Kafka's DescribeClientQuotas match types
MATCH_EXACT, MATCH_DEFAULT, MATCH_SPECIFIED = 0, 1, 2


@dataclass(frozen=True, order=True)
class QuotaEntity:
    """An entity as Kafka's ClientQuotaEntity: each type present maps to a name, or None for the default.
    `parts` holds (type, name) in ENTITY_TYPES order."""

    parts: tuple[tuple[str, str | None], ...]

    @staticmethod
    def of(parts: Mapping[str, str | None]) -> QuotaEntity:
        return QuotaEntity(tuple((kind, parts[kind]) for kind in ENTITY_TYPES if kind in parts))

    def as_dict(self) -> dict[str, str | None]:
        return dict(self.parts)

    def __str__(self) -> str:
        return "{" + ", ".join(f"{kind}={'<default>' if name is None else name}" for kind, name in self.parts) + "}"


class QuotaRequestError(ValueError):
    """What Kafka answers INVALID_REQUEST to (or UNSUPPORTED_VERSION, `unsupported`), with its message."""

    def __init__(self, message: str, unsupported: bool = False) -> None:
        super().__init__(message)
        self.unsupported = unsupported


def entity_from(parts: Iterable[tuple[str, str | None]]) -> QuotaEntity:
    """An alteration's entity from its (type, name) pairs, checked as Kafka's controller checks it; QuotaRequestError."""
    seen: dict[str, str | None] = {}
    for kind, name in parts:
        if kind in seen:
            raise QuotaRequestError(f"Invalid client quota entity, duplicate entity entry {kind}")
        if kind not in ENTITY_TYPES:
            raise QuotaRequestError(f"Unhandled client quota entity type: {kind}")
        if name is not None and not name:
            raise QuotaRequestError(f"Empty {kind} not supported")
        seen[kind] = name
    if not seen:
        raise QuotaRequestError("Invalid empty client quota entity")
    if IP in seen:
        if USER in seen or CLIENT_ID in seen:
            raise QuotaRequestError("Invalid quota entity combination, IP entity should not be combined with User or ClientId")
        name = seen[IP]
        if name is not None and not _is_ip(name):
            # Kafka also takes a host name it can resolve; the agent matches the peer's address only.
            raise QuotaRequestError(f"{name} is not a valid IP or resolvable host.")
    return QuotaEntity.of(seen)


def check_ops(entity: QuotaEntity, ops: Iterable[tuple[str, float | None]]) -> dict[str, float | None]:
    """An entity's operations (key, value; None removes the key) checked as Kafka checks them, keys the agent does
    not enforce refused; QuotaRequestError."""
    keys = IP_KEYS if IP in entity.as_dict() else USER_CLIENT_KEYS
    checked: dict[str, float | None] = {}
    for key, value in ops:
        if key in checked:
            raise QuotaRequestError(f"Duplicate quota key {key} not updating quota for this entity {entity}")
        checked[key] = value
        if value is None:
            continue  # removing a key is never refused (Kafka's rule): there is nothing to check
        if key not in keys:
            raise QuotaRequestError(f"Invalid configuration key {key}")
        if key not in ENFORCED_KEYS:
            raise QuotaRequestError(
                f"{key} is a Kafka quota the agent does not enforce (it enforces {', '.join(sorted(ENFORCED_KEYS))}); "
                f"not setting it for {entity}"
            )
        if value <= 0.0:
            raise QuotaRequestError(f"Quota {key} must be greater than 0")
        limit, named = _LIMITS[keys[key]]
        if value > limit:
            raise QuotaRequestError(f"Proposed value for {key} is too large for {named}.")
        if abs(value % 1.0) > 1e-6:
            raise QuotaRequestError(f"{key} cannot be a fractional value.")
    return checked


@dataclass(frozen=True)
class QuotaFilter:
    """DescribeClientQuotas' filter, checked (`filter_from`): types matched exactly (a name, or None for the
    default), types that must be present, and whether entities may have other types (`strict` says not)."""

    exact: Mapping[str, str | None]
    specified: frozenset[str]
    strict: bool

    def matches(self, entity: QuotaEntity) -> bool:
        parts = entity.as_dict()
        if self.strict and len(parts) != len(self.exact) + len(self.specified):
            return False
        return (all(kind in parts and parts[kind] == name for kind, name in self.exact.items())
                and all(kind in parts for kind in self.specified))


def filter_from(components: Iterable[tuple[str, int, str | None]], strict: bool) -> QuotaFilter:
    """A filter from its components (entity type, match type, match), checked as Kafka's ClientQuotasImage does."""
    exact: dict[str, str | None] = {}
    specified: set[str] = set()
    for kind, match_type, match in components:
        if not kind:
            raise QuotaRequestError("Invalid empty entity type.")
        if kind in exact or kind in specified:
            raise QuotaRequestError(f"Entity type {kind} cannot appear more than once in the filter.")
        if kind not in ENTITY_TYPES:
            raise QuotaRequestError(f"Unsupported entity type {kind}", unsupported=True)
        if match_type == MATCH_EXACT:
            if match is None:
                raise QuotaRequestError("Request specified MATCH_TYPE_EXACT, but set match string to null.")
            exact[kind] = match
        elif match_type == MATCH_DEFAULT:
            if match is not None:
                raise QuotaRequestError("Request specified MATCH_TYPE_DEFAULT, but also specified a match string.")
            exact[kind] = None
        elif match_type == MATCH_SPECIFIED:
            if match is not None:
                raise QuotaRequestError("Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.")
            specified.add(kind)
        else:
            raise QuotaRequestError(f"Unknown match type {match_type}")
    named = set(exact) | specified
    if IP in named and (USER in named or CLIENT_ID in named):
        raise QuotaRequestError("Invalid entity filter component combination. IP filter component should not be used with "
                                "user or clientId filter component.")
    return QuotaFilter(exact, frozenset(specified), strict)


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


# -- the table ------------------------------------------------------------------------------------------------


def _key_columns(entity: QuotaEntity) -> dict[str, object]:
    parts = entity.as_dict()
    values: dict[str, object] = {}
    for kind, (part, name) in _COLUMNS.items():
        if kind not in parts:
            values[part], values[name] = ABSENT, ""
        elif parts[kind] is None:
            values[part], values[name] = DEFAULT, ""
        else:
            values[part], values[name] = NAMED, parts[kind]
    return values


def alter(connection: Connection, entity: QuotaEntity, ops: Mapping[str, float | None]) -> None:
    """Set (a value) or remove (None) each key of the entity's quotas."""
    columns = _key_columns(entity)
    cq = s.client_quotas.c
    of_entity = and_(*(cq[column] == value for column, value in columns.items()))
    for key, value in ops.items():
        row = and_(of_entity, cq.quota_key == key)
        if value is None:
            connection.execute(delete(s.client_quotas).where(row))
        elif not connection.execute(update(s.client_quotas).where(row).values(value=value)).rowcount:
            connection.execute(insert(s.client_quotas).values(**columns, quota_key=key, value=value))


def all_quotas(connection: Connection) -> dict[QuotaEntity, dict[str, float]]:
    """Every entity's quotas, by entity."""
    found: dict[QuotaEntity, dict[str, float]] = {}
    for row in connection.execute(select(s.client_quotas)):
        parts: dict[str, str | None] = {}
        for kind, (part, name) in _COLUMNS.items():
            value = getattr(row, part)
            if value != ABSENT:
                parts[kind] = getattr(row, name) if value == NAMED else None
        found.setdefault(QuotaEntity.of(parts), {})[row.quota_key] = row.value
    return found
