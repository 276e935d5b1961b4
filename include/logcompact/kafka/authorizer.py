"""Kafka's ACL authorizer (its StandardAuthorizer, `authorizer.class.name`), over the catalog's `acls`.

A request is allowed when its principal is a super user (`super.users`), or when an ALLOW binding matches it and no
DENY does (deny wins). A binding matches a resource when its pattern does (LITERAL: the same name, or the wildcard
`*`; PREFIXED: a prefix of the name, KIP-290), the principal when it names it or is `User:*`, the host when it is
the client's address or `*`, and the operation when it is the same, or ALL; an ALLOW of READ, WRITE, DELETE or ALTER
also allows DESCRIBE, and of ALTER_CONFIGS allows DESCRIBE_CONFIGS (a DENY denies only what it names). A resource
that no binding names at all is allowed to everyone with `allow.everyone.if.no.acl.found`, denied otherwise.

Authorization is on with `--authorizer acl` or when super users are given. Off, every request is allowed, and the
ACL APIs answer SECURITY_DISABLED, as a broker without an authorizer.

Each agent caches every binding, indexed by resource type and name, and reads them again from the catalog every
`acl_refresh_ms` (a catalog that cannot be read leaves the last cache in force, said in the log) and right after
its own CreateAcls and DeleteAcls: a change made through another agent, or `logcompact acl`, takes effect here
within `acl_refresh_ms`. Answers are memoized per (principal, host, operation, resource) until the next refresh,
so Produce's check costs a dictionary look-up.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from logcompact.catalog import Catalog
from logcompact.catalog.acls import (
    CLUSTER_NAME,
    WILDCARD,
    WILDCARD_PRINCIPAL,
    AclBinding,
    AclOperation,
    AclPermissionType,
    PatternType,
    ResourceType,
)
from logcompact.kafka.session import KafkaPrincipal, Session

log = logging.getLogger(__name__)

DEFAULT_ACL_REFRESH_MS = 5000
AUTHORIZER_ACL = "acl"  # --authorizer's one value (Kafka's authorizer.class.name, StandardAuthorizer)
OPERATIONS_NOT_ASKED = -(2**31)  # an authorized-operations field a request did not ask for (Kafka's Int.MinValue)
MEMO_LIMIT = 100_000  # answers memoized between refreshes; past it the memo starts over

Op = AclOperation
# Kafka's AclEntry.supportedOperations: what an authorized-operations bit set is computed over. A group's leaves out
# DESCRIBE_CONFIGS and ALTER_CONFIGS (KIP-848's group configs, which the agent does not serve).
SUPPORTED_OPERATIONS: dict[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (Op.READ, Op.WRITE, Op.CREATE, Op.DESCRIBE, Op.DELETE, Op.ALTER, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS),
    ResourceType.GROUP: (Op.READ, Op.DESCRIBE, Op.DELETE),
    ResourceType.CLUSTER: (Op.CREATE, Op.CLUSTER_ACTION, Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS, Op.IDEMPOTENT_WRITE, Op.ALTER, Op.DESCRIBE),
    ResourceType.TRANSACTIONAL_ID: (Op.DESCRIBE, Op.WRITE),
}
_IMPLIES_DESCRIBE = frozenset({Op.DESCRIBE, Op.READ, Op.WRITE, Op.DELETE, Op.ALTER})
_IMPLIES_DESCRIBE_CONFIGS = frozenset({Op.DESCRIBE_CONFIGS, Op.ALTER_CONFIGS})


@dataclass(frozen=True)
class AuthorizerSettings:
    """`--authorizer`, `--super-users`, `--allow-everyone-if-no-acl-found`, `--acl-refresh-ms`: checked when made, so
    an agent that nobody could grant an ACL on refuses to start."""

    authorizer: str | None = None  # "acl", or None: on only if super users are given
    super_users: tuple[str, ...] = ()  # principals, as `--super-users` gives them (semicolon-separated there)
    allow_everyone_if_no_acl_found: bool = False
    acl_refresh_ms: int = DEFAULT_ACL_REFRESH_MS

    def __post_init__(self) -> None:
        if self.authorizer not in (None, AUTHORIZER_ACL):
            raise ValueError(f"--authorizer {self.authorizer!r} is not known: give --authorizer acl (Kafka's StandardAuthorizer), or none")
        for principal in self.super_users:
            KafkaPrincipal.parse(principal, "--super-users")
        if self.acl_refresh_ms < 1:
            raise ValueError(f"--acl-refresh-ms {self.acl_refresh_ms} must be at least 1")
        if self.enabled and not self.super_users and not self.allow_everyone_if_no_acl_found:
            raise ValueError("--authorizer acl without --super-users (or --allow-everyone-if-no-acl-found) would deny every request, "
                             "CreateAcls included, so nobody could grant an ACL: give --super-users User:NAME")

    @property
    def enabled(self) -> bool:
        return self.authorizer == AUTHORIZER_ACL or bool(self.super_users)

    @staticmethod
    def parse_super_users(text: str | None) -> tuple[str, ...]:
        """Kafka's super.users: principals separated by semicolons (a certificate's DN holds commas)."""
        return tuple(part.strip() for part in (text or "").split(";") if part.strip())


@dataclass
class _Index:
    """One resource type's bindings: by literal name, the literal wildcard's, and by prefix."""

    literal: dict[str, list[AclBinding]] = field(default_factory=dict)
    wildcard: list[AclBinding] = field(default_factory=list)
    prefixed: dict[str, list[AclBinding]] = field(default_factory=dict)
    prefix_lengths: list[int] = field(default_factory=list)

    def matching(self, name: str) -> Iterable[AclBinding]:
        """Every binding whose pattern matches the resource `name`."""
        yield from self.literal.get(name, ())
        yield from self.wildcard
        for length in self.prefix_lengths:
            if length <= len(name):
                yield from self.prefixed.get(name[:length], ())


@dataclass
class _Cache:
    """The bindings as last read, indexed by resource type, and the answers memoized from them: replaced whole by a
    refresh (on a worker thread), so a check on the event loop reads one cache throughout and never memoizes an
    answer of the old bindings into the new cache."""

    bindings: list[AclBinding] = field(default_factory=list)
    indexes: dict[ResourceType, _Index] = field(default_factory=dict)
    memo: dict[tuple[str, str, AclOperation, ResourceType, str], bool] = field(default_factory=dict)


class AclAuthorizer:
    """Whether a request's principal, from its address, may do an operation on a resource; see the module."""

    def __init__(self, catalog: Catalog | None, settings: AuthorizerSettings) -> None:
        self._catalog = catalog
        self.settings = settings
        self.enabled = settings.enabled
        self._super_users = frozenset(settings.super_users)
        self._cache = _Cache()
        self._refreshing: asyncio.Task | None = None

    @classmethod
    def disabled(cls) -> AclAuthorizer:
        """Authorization off: every request allowed, nothing read from a catalog."""
        return cls(None, AuthorizerSettings())

    # -- the cache ------------------------------------------------------------------------------------------

    def load(self, bindings: Sequence[AclBinding]) -> None:
        """Replace the cache by `bindings` (the catalog's, as read now); memoized answers are dropped."""
        indexes: dict[ResourceType, _Index] = {}
        for binding in bindings:
            index = indexes.setdefault(binding.resource_type, _Index())
            if binding.pattern_type == PatternType.PREFIXED:
                index.prefixed.setdefault(binding.resource_name, []).append(binding)
            elif binding.resource_name == WILDCARD:
                index.wildcard.append(binding)
            else:
                index.literal.setdefault(binding.resource_name, []).append(binding)
        for index in indexes.values():
            index.prefix_lengths = sorted({len(prefix) for prefix in index.prefixed})
        self._cache = _Cache(list(bindings), indexes)

    @property
    def bindings(self) -> list[AclBinding]:
        """The cached bindings, as last read from the catalog."""
        return self._cache.bindings

    def refresh(self) -> None:
        """Read every binding from the catalog now (blocking); nothing while authorization is off."""
        if self._catalog is not None and self.enabled:
            self.load(self._catalog.acls())

    async def start(self) -> None:
        """Load the ACLs, then keep them fresh every acl_refresh_ms; nothing to do while authorization is off."""
        if not self.enabled:
            return
        await asyncio.to_thread(self.refresh)
        self._refreshing = asyncio.create_task(self._refresh_every())

    async def stop(self) -> None:
        if self._refreshing is not None:
            self._refreshing.cancel()
            await asyncio.gather(self._refreshing, return_exceptions=True)

    async def _refresh_every(self) -> None:
        while True:
            await asyncio.sleep(self.settings.acl_refresh_ms / 1000)
            try:
                await asyncio.to_thread(self.refresh)
            except Exception as exc:  # the catalog down: the last ACLs stay in force; the next refresh tries again
                log.warning("ACLs could not be read from the catalog (the %d cached stay in force): %s", len(self._cache.bindings), exc)

    # -- checks -----------------------------------------------------------------------------------------------

    def authorize(self, session: Session, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        """Whether the session's principal may do `operation` on the resource (always, while authorization is off)."""
        if not self.enabled:
            return True
        cache, principal = self._cache, str(session.principal)
        key = (principal, session.client_host, operation, resource_type, name)
        allowed = cache.memo.get(key)
        if allowed is None:
            allowed = principal in self._super_users or self._decide(cache, principal, session.client_host, operation, resource_type, name)
            if len(cache.memo) >= MEMO_LIMIT:
                cache.memo.clear()
            cache.memo[key] = allowed
        return allowed

    def authorize_cluster(self, session: Session, operation: AclOperation) -> bool:
        """Whether the session may do `operation` on the cluster (CreateAcls: ALTER, DescribeAcls: DESCRIBE, ...)."""
        return self.authorize(session, operation, ResourceType.CLUSTER, CLUSTER_NAME)

    def authorize_topic(self, session: Session, operation: AclOperation, name: str) -> bool:
        return self.authorize(session, operation, ResourceType.TOPIC, name)

    def authorize_group(self, session: Session, operation: AclOperation, group_id: str) -> bool:
        return self.authorize(session, operation, ResourceType.GROUP, group_id)

    def authorize_transactional_id(self, session: Session, operation: AclOperation, transactional_id: str) -> bool:
        return self.authorize(session, operation, ResourceType.TRANSACTIONAL_ID, transactional_id)

    def denied_topics(self, session: Session, operation: AclOperation, names: Iterable[str]) -> set[str]:
        """Of the topics named, those the session may not do `operation` on (none while authorization is off)."""
        if not self.enabled:
            return set()
        return {name for name in set(names) if not self.authorize(session, operation, ResourceType.TOPIC, name)}

    def authorized_operations(self, session: Session, resource_type: ResourceType, name: str) -> int:
        """Kafka's authorized-operations bit set of the resource: bit `code` set for each operation of the type allowed."""
        return sum(1 << operation for operation in SUPPORTED_OPERATIONS[resource_type] if self.authorize(session, operation, resource_type, name))

    def authorize_by_resource_type(self, session: Session, operation: AclOperation, resource_type: ResourceType) -> bool:
        """Whether the principal may do `operation` on some resource of the type (Kafka's authorizeByResourceType,
        InitProducerId's WRITE on any topic): a resource named as Kafka names it ("hardcode") is allowed (super
        users, no ACL at all), or an ALLOW binding of the operation (or ALL) that no DENY of the same name or a
        shorter prefix overrides; a DENY of the literal wildcard denies all."""
        if self.authorize(session, operation, resource_type, "hardcode"):
            return True
        principal, host = str(session.principal), session.client_host
        bindings = [
            b for b in self._cache.bindings
            if b.resource_type == resource_type and b.principal in (principal, WILDCARD_PRINCIPAL) and b.host in (WILDCARD, host)
            and b.operation in (Op.ALL, operation)
        ]
        denied = [b for b in bindings if b.permission == AclPermissionType.DENY]
        if any(b.pattern_type == PatternType.LITERAL and b.resource_name == WILDCARD for b in denied):
            return False
        allowed = [b for b in bindings if b.permission == AclPermissionType.ALLOW]
        if any(b.pattern_type == PatternType.LITERAL and b.resource_name == WILDCARD for b in allowed):
            return True
        return any(not any(_covers(deny, allow) for deny in denied) for allow in allowed)

    def _decide(self, cache: _Cache, principal: str, host: str, operation: AclOperation, resource_type: ResourceType, name: str) -> bool:
        index = cache.indexes.get(resource_type)
        allowed = named = False
        for binding in index.matching(name) if index is not None else ():
            named = True
            if not _applies(binding, principal, host, operation):
                continue
            if binding.permission == AclPermissionType.DENY:
                return False
            allowed = True
        return allowed or (not named and self.settings.allow_everyone_if_no_acl_found)


def _applies(binding: AclBinding, principal: str, host: str, operation: AclOperation) -> bool:
    """Whether the binding speaks of this principal, host and operation (StandardAuthorizerData.findResult)."""
    if binding.principal not in (principal, WILDCARD_PRINCIPAL) or binding.host not in (WILDCARD, host):
        return False
    if binding.operation in (Op.ALL, operation):
        return True
    if binding.permission != AclPermissionType.ALLOW:
        return False
    if operation == Op.DESCRIBE:
        return binding.operation in _IMPLIES_DESCRIBE
    return operation == Op.DESCRIBE_CONFIGS and binding.operation in _IMPLIES_DESCRIBE_CONFIGS


def _covers(deny: AclBinding, allow: AclBinding) -> bool:
    """Whether a DENY applies to every resource an ALLOW names (Kafka's default authorizeByResourceType)."""
    if deny.pattern_type == PatternType.LITERAL:
        return allow.pattern_type == PatternType.LITERAL and deny.resource_name == allow.resource_name
    return allow.resource_name.startswith(deny.resource_name)
