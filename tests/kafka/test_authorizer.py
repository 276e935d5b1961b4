"""The ACL authorizer's rules (Kafka's StandardAuthorizer) with named principals and hosts, and the filters of
DescribeAcls/DeleteAcls (Kafka's ResourcePatternFilter and AccessControlEntryFilter), without a server."""

from __future__ import annotations

import asyncio
import logging

import pytest

from logcompact.catalog.acls import (
    CLUSTER_NAME,
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermissionType,
    InvalidAclError,
    PatternType,
    ResourceType,
)
from logcompact.kafka.authorizer import AclAuthorizer, AuthorizerSettings
from logcompact.kafka.session import KafkaPrincipal, Session

Op, Allow, Deny = AclOperation, AclPermissionType.ALLOW, AclPermissionType.DENY
TOPIC, GROUP, CLUSTER, TXN = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER, ResourceType.TRANSACTIONAL_ID
LITERAL, PREFIXED = PatternType.LITERAL, PatternType.PREFIXED


def session(name: str, host: str = "10.0.0.1") -> Session:
    return Session("PLAINTEXT", host, KafkaPrincipal("User", name))


def acl(kind: ResourceType, name: str, principal: str, operation: AclOperation, permission: AclPermissionType = Allow,
        pattern: PatternType = LITERAL, host: str = "*") -> AclBinding:
    return AclBinding(kind, name, pattern, principal, host, operation, permission)


def authorizer(*bindings: AclBinding, allow_everyone: bool = False, super_users: tuple[str, ...] = ("User:admin",)) -> AclAuthorizer:
    made = AclAuthorizer(None, AuthorizerSettings("acl", super_users, allow_everyone))
    made.load(bindings)
    return made


def test_no_acl_denies_an_allow_allows_and_super_users_bypass_even_a_deny() -> None:
    auth = authorizer(acl(TOPIC, "orders", "User:alice", Op.READ), acl(TOPIC, "orders", "User:*", Op.ALL, Deny))
    alice, bob = session("alice"), session("bob")
    assert not auth.authorize_topic(bob, Op.READ, "payments")  # no ACL: denied
    assert not auth.authorize_topic(alice, Op.READ, "orders")  # the User:* DENY of ALL wins over alice's ALLOW
    assert auth.authorize_topic(session("admin"), Op.DELETE, "orders")  # a super user, whatever the ACLs
    assert auth.authorize_cluster(session("admin"), Op.ALTER)


def test_deny_wins_and_a_prefixed_acl_covers_names_that_start_with_it() -> None:
    auth = authorizer(
        acl(TOPIC, "sales-", "User:alice", Op.WRITE, pattern=PREFIXED),
        acl(TOPIC, "sales-secret", "User:alice", Op.WRITE, Deny),
    )
    alice = session("alice")
    assert auth.authorize_topic(alice, Op.WRITE, "sales-eu")
    assert auth.authorize_topic(alice, Op.WRITE, "sales-")
    assert not auth.authorize_topic(alice, Op.WRITE, "sales")  # shorter than the prefix
    assert not auth.authorize_topic(alice, Op.WRITE, "sales-secret")  # the literal DENY wins
    assert not auth.authorize_topic(alice, Op.WRITE, "other")


def test_read_write_delete_alter_imply_describe_and_alter_configs_implies_describe_configs_for_allows_only() -> None:
    auth = authorizer(
        acl(TOPIC, "a", "User:alice", Op.READ), acl(TOPIC, "b", "User:alice", Op.ALTER_CONFIGS),
        acl(TOPIC, "c", "User:alice", Op.DESCRIBE), acl(TOPIC, "c", "User:alice", Op.READ, Deny),
        acl(TOPIC, "d", "User:alice", Op.CREATE),
    )
    alice = session("alice")
    assert auth.authorize_topic(alice, Op.DESCRIBE, "a") and not auth.authorize_topic(alice, Op.WRITE, "a")
    assert auth.authorize_topic(alice, Op.DESCRIBE_CONFIGS, "b") and not auth.authorize_topic(alice, Op.DESCRIBE, "b")
    assert auth.authorize_topic(alice, Op.DESCRIBE, "c")  # a DENY of READ denies READ only
    assert not auth.authorize_topic(alice, Op.READ, "c")
    assert not auth.authorize_topic(alice, Op.DESCRIBE, "d")  # CREATE implies nothing


def test_wildcards_of_principal_resource_and_host_and_host_rules() -> None:
    auth = authorizer(
        acl(GROUP, "*", "User:*", Op.READ, host="10.0.0.1"),
        acl(TXN, "tx", "User:bob", Op.WRITE, host="10.0.0.2"),
    )
    assert auth.authorize_group(session("anyone", "10.0.0.1"), Op.READ, "any-group")
    assert not auth.authorize_group(session("anyone", "10.0.0.9"), Op.READ, "any-group")
    assert auth.authorize_transactional_id(session("bob", "10.0.0.2"), Op.WRITE, "tx")
    assert not auth.authorize_transactional_id(session("bob", "10.0.0.1"), Op.WRITE, "tx")
    assert not auth.authorize_transactional_id(session("carol", "10.0.0.2"), Op.WRITE, "tx")


def test_allow_everyone_if_no_acl_found_applies_to_resources_no_acl_names() -> None:
    auth = authorizer(acl(TOPIC, "orders", "User:alice", Op.READ), allow_everyone=True, super_users=())
    assert auth.authorize_topic(session("bob"), Op.WRITE, "free")  # no ACL names it
    assert not auth.authorize_topic(session("bob"), Op.READ, "orders")  # named (for alice): denied to others
    assert auth.authorize_topic(session("alice"), Op.READ, "orders")


def test_authorized_operations_are_kafkas_bit_sets() -> None:
    auth = authorizer(acl(GROUP, "g", "User:alice", Op.READ), acl(CLUSTER, CLUSTER_NAME, "User:alice", Op.DESCRIBE))
    alice = session("alice")
    assert auth.authorized_operations(alice, GROUP, "g") == (1 << Op.READ) | (1 << Op.DESCRIBE)
    assert auth.authorized_operations(alice, CLUSTER, CLUSTER_NAME) == 1 << Op.DESCRIBE
    assert auth.authorized_operations(session("bob"), GROUP, "g") == 0
    assert AclAuthorizer.disabled().authorized_operations(session("bob"), GROUP, "g") == (1 << Op.READ) | (1 << Op.DESCRIBE) | (1 << Op.DELETE)


def test_authorize_by_resource_type_as_kafkas_default() -> None:
    alice = session("alice")
    assert authorizer(acl(TOPIC, "t-", "User:alice", Op.WRITE, pattern=PREFIXED)).authorize_by_resource_type(alice, Op.WRITE, TOPIC)
    assert not authorizer(acl(TOPIC, "t-", "User:alice", Op.READ, pattern=PREFIXED)).authorize_by_resource_type(alice, Op.WRITE, TOPIC)
    covered = authorizer(acl(TOPIC, "t-x", "User:alice", Op.WRITE), acl(TOPIC, "t-", "User:alice", Op.WRITE, Deny, PREFIXED))
    assert not covered.authorize_by_resource_type(alice, Op.WRITE, TOPIC)  # every topic it may write is denied
    everything_denied = authorizer(acl(TOPIC, "t", "User:alice", Op.WRITE), acl(TOPIC, "*", "User:*", Op.ALL, Deny))
    assert not everything_denied.authorize_by_resource_type(alice, Op.WRITE, TOPIC)
    assert authorizer().authorize_by_resource_type(session("admin"), Op.WRITE, TOPIC)


def test_a_new_cache_replaces_memoized_answers() -> None:
    auth = authorizer(acl(TOPIC, "t", "User:alice", Op.READ))
    alice = session("alice")
    assert auth.authorize_topic(alice, Op.READ, "t")
    auth.load([])
    assert not auth.authorize_topic(alice, Op.READ, "t")


def test_disabled_allows_everything() -> None:
    off = AclAuthorizer.disabled()
    assert not off.enabled
    assert off.authorize_topic(session("anyone"), Op.DELETE, "t") and off.authorize_cluster(session("anyone"), Op.ALTER)


def test_settings_refuse_an_authorizer_nobody_could_grant_on_and_read_super_users_as_kafka() -> None:
    with pytest.raises(ValueError, match="nobody could grant an ACL"):
        AuthorizerSettings("acl")
    with pytest.raises(ValueError, match="not a principal"):
        AuthorizerSettings(super_users=("alice",))
    assert not AuthorizerSettings().enabled
    assert AuthorizerSettings(super_users=("User:admin",)).enabled  # super users alone turn it on, as Kafka
    assert AuthorizerSettings("acl", allow_everyone_if_no_acl_found=True).enabled
    assert AuthorizerSettings.parse_super_users("User:CN=a,O=b; User:bob;") == ("User:CN=a,O=b", "User:bob")


class _FailingCatalog:
    """A catalog whose ACLs cannot be read (the database down)."""

    def acls(self) -> list[AclBinding]:
        raise OSError("catalog database unreachable")


def test_a_refresh_that_fails_keeps_the_last_acls_and_says_so(caplog: pytest.LogCaptureFixture) -> None:
    auth = AclAuthorizer(_FailingCatalog(), AuthorizerSettings("acl", ("User:admin",), acl_refresh_ms=10))  # type: ignore[arg-type]
    auth.load([acl(TOPIC, "t", "User:alice", Op.READ)])

    async def refresh_a_few_times() -> None:
        refreshing = asyncio.create_task(auth._refresh_every())
        await asyncio.sleep(0.1)
        refreshing.cancel()

    with caplog.at_level(logging.WARNING):
        asyncio.run(refresh_a_few_times())
    assert "ACLs could not be read from the catalog (the 1 cached stay in force): catalog database unreachable" in caplog.text
    assert auth.authorize_topic(session("alice"), Op.READ, "t")


@pytest.mark.parametrize(("acl_filter", "matched"), [
    (AclFilter(), {"lit", "pre", "star"}),
    (AclFilter(TOPIC, "orders-eu", PatternType.MATCH), {"lit", "pre", "star"}),
    (AclFilter(TOPIC, "orders-", PatternType.ANY), {"pre"}),  # ANY with a name: that exact name, any pattern type
    (AclFilter(TOPIC, "orders-", PatternType.MATCH), {"pre", "star"}),
    (AclFilter(TOPIC, None, PREFIXED), {"pre"}),
    (AclFilter(TOPIC, "*", LITERAL), {"star"}),
    (AclFilter(principal="User:bob"), {"pre"}),
    (AclFilter(operation=Op.WRITE, permission=Allow), {"star"}),
    (AclFilter(GROUP), set()),
])
def test_filters_match_as_kafkas(acl_filter: AclFilter, matched: set[str]) -> None:
    bindings = {
        "lit": acl(TOPIC, "orders-eu", "User:alice", Op.READ),
        "pre": acl(TOPIC, "orders-", "User:bob", Op.READ, Deny, PREFIXED),
        "star": acl(TOPIC, "*", "User:alice", Op.WRITE),
    }
    assert {name for name, binding in bindings.items() if acl_filter.matches(binding)} == matched


def test_bindings_kafka_refuses() -> None:
    good = acl(TOPIC, "t", "User:alice", Op.READ)
    good.check()
    for bad, message in [
        (AclBinding(ResourceType.ANY, "t", LITERAL, "User:a", "*", Op.READ, Allow), "Invalid resourceType ANY"),
        (AclBinding(TOPIC, "t", PatternType.MATCH, "User:a", "*", Op.READ, Allow), "Invalid patternType MATCH"),
        (AclBinding(TOPIC, "t", LITERAL, "User:a", "*", Op.ANY, Allow), "Invalid operation ANY"),
        (AclBinding(TOPIC, "t", LITERAL, "User:a", "*", Op.READ, AclPermissionType.ANY), "Invalid permissionType ANY"),
        (AclBinding(TOPIC, "", LITERAL, "User:a", "*", Op.READ, Allow), "Invalid empty resource name"),
        (AclBinding(CLUSTER, "c", LITERAL, "User:a", "*", Op.ALTER, Allow), "The only valid name for the CLUSTER resource is kafka-cluster"),
        (AclBinding(TOPIC, "t", LITERAL, "alice", "*", Op.READ, Allow), "is not TYPE:NAME"),
    ]:
        with pytest.raises(InvalidAclError, match=message):
            bad.check()
    with pytest.raises(InvalidAclError, match="Unknown patternFilter"):
        AclFilter(pattern_type=PatternType.UNKNOWN).check()
