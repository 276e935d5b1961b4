"""`logcompact acl add|remove|list`: Kafka's ACLs in the catalog, what Kafka's `kafka-acls.sh --add|--remove|--list`
does against a broker, with its option names (docs/security.md). Every agent applies a change within its
--acl-refresh-ms."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from logcompact.cli.common import Context, emit, pass_context

if TYPE_CHECKING:
    from logcompact.catalog.acls import AclBinding, AclOperation, ResourceType

PATTERN_TYPES = ("literal", "prefixed", "any", "match")


def _options(*options: Callable[[Any], Any]) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    def decorate(command: Callable[..., Any]) -> Callable[..., Any]:
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


_ENTRY_OPTIONS = (
    click.option("--allow-principal", "allow_principals", multiple=True, metavar="TYPE:NAME",
                 help="A principal allowed (User:alice, User:* for every one), repeatable."),
    click.option("--deny-principal", "deny_principals", multiple=True, metavar="TYPE:NAME", help="A principal denied, repeatable."),
    click.option("--allow-host", "allow_hosts", multiple=True, metavar="HOST",
                 help="An address the allowed principals may come from, repeatable [default: * (any)]."),
    click.option("--deny-host", "deny_hosts", multiple=True, metavar="HOST",
                 help="An address the denied principals are denied from, repeatable [default: * (any)]."),
    click.option("--operation", "operations", multiple=True, metavar="OPERATION",
                 help="Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs, IdempotentWrite "
                      "or All, repeatable [default: All]."),
)
_RESOURCE_OPTIONS = (
    click.option("--topic", "topics", multiple=True, metavar="NAME", help="A topic (or * for every topic), repeatable."),
    click.option("--group", "groups", multiple=True, metavar="NAME", help="A consumer group (or *), repeatable."),
    click.option("--cluster", is_flag=True, help="The cluster (its one name is kafka-cluster)."),
    click.option("--transactional-id", "transactional_ids", multiple=True, metavar="ID", help="A transactional id (or *), repeatable."),
    click.option("--json", "as_json", is_flag=True, help="One JSON line per ACL instead of the table."),
)


@click.group()
def acl() -> None:
    """Kafka's ACLs in the catalog, as kafka-acls.sh manages them: add, remove, list (docs/security.md). Agents
    started with --authorizer acl or --super-users enforce them."""


@acl.command("add")
@_options(*_ENTRY_OPTIONS, *_RESOURCE_OPTIONS)
@click.option("--resource-pattern-type", type=click.Choice(PATTERN_TYPES[:2], case_sensitive=False), default="literal", show_default=True,
              help="literal: the resource's name (or *); prefixed: every resource whose name starts with it (KIP-290).")
@pass_context
def acl_add(ctx: Context, resource_pattern_type: str, as_json: bool, **given: Any) -> None:
    """Add ACLs: each principal given, from each of its hosts, each operation, on each resource. An ACL that exists
    already stays as it is."""
    from logcompact.catalog.acls import AclBinding, InvalidAclError, PatternType

    pattern_type = PatternType[resource_pattern_type.upper()]
    entries = _entries(given)
    if not entries:
        raise click.UsageError("give a principal: --allow-principal User:NAME or --deny-principal User:NAME")
    bindings = [AclBinding(kind, name, pattern_type, *entry) for kind, name in _resources(given, required=True) for entry in entries]
    for binding in bindings:
        try:
            binding.check()
        except InvalidAclError as exc:
            raise click.UsageError(f"ACL {_text(binding)}: {exc}") from None
    ctx.catalog.create_acls(bindings)
    _show(bindings, as_json, "added")


@acl.command("remove")
@_options(*_ENTRY_OPTIONS, *_RESOURCE_OPTIONS)
@click.option("--resource-pattern-type", type=click.Choice(PATTERN_TYPES, case_sensitive=False), default="literal", show_default=True,
              help="Which bindings of the resources are removed: literal or prefixed ones of that name, any of that name, or "
                   "match: every binding that applies to it (literal, * and prefixes).")
@pass_context
def acl_remove(ctx: Context, resource_pattern_type: str, as_json: bool, **given: Any) -> None:
    """Remove ACLs of the resources given: those of the principals, hosts and operations given, or every one of the
    resources when no principal is given (as kafka-acls.sh --remove). Prints what was removed."""
    from logcompact.catalog.acls import AclFilter, PatternType

    pattern_type = PatternType[resource_pattern_type.upper()]
    entries = _entries(given)
    filters = []
    for kind, name in _resources(given, required=True):
        if not entries:
            filters.append(AclFilter(kind, name, pattern_type))
        filters.extend(AclFilter(kind, name, pattern_type, *entry) for entry in entries)
    removed = [binding for deleted in ctx.catalog.delete_acls(filters) for binding in deleted]
    _show(removed, as_json, "removed")


@acl.command("list")
@_options(*_RESOURCE_OPTIONS)
@click.option("--resource-pattern-type", type=click.Choice(PATTERN_TYPES, case_sensitive=False), default=None,
              help="Of the resources given: literal or prefixed bindings of that name, any of that name, or match: every binding that "
                   "applies to it [default: literal; any when no resource is given].")
@click.option("--principal", "principals", multiple=True, metavar="TYPE:NAME", help="Only the ACLs of this principal, repeatable.")
@pass_context
def acl_list(ctx: Context, resource_pattern_type: str | None, principals: tuple[str, ...], as_json: bool, **given: Any) -> None:
    """The ACLs in the catalog: all, or those of the resources given (and principals)."""
    from logcompact.catalog.acls import AclFilter, PatternType

    resources = _resources(given, required=False)
    pattern_type = PatternType[(resource_pattern_type or ("literal" if resources else "any")).upper()]
    filters = [AclFilter(kind, name, pattern_type) for kind, name in resources] or [AclFilter(pattern_type=pattern_type)]
    listed = [b for b in ctx.catalog.acls() if any(f.matches(b) for f in filters) and (not principals or b.principal in principals)]
    _show(listed, as_json, None)


def _operation(text: str) -> AclOperation:
    from logcompact.catalog.acls import AclOperation

    wanted = text.replace("-", "").replace("_", "").upper()
    for operation in AclOperation:
        if operation.name.replace("_", "") == wanted and operation not in (AclOperation.UNKNOWN, AclOperation.ANY):
            return operation
    raise click.BadParameter(f"{text!r} is not an operation: Read, Write, Create, Delete, Alter, Describe, ClusterAction, "
                             "DescribeConfigs, AlterConfigs, IdempotentWrite or All", param_hint="--operation")


def _entries(given: dict[str, Any]) -> list[tuple[str, str, AclOperation, Any]]:
    """(principal, host, operation, permission) of every combination given, allowed ones first."""
    from logcompact.catalog.acls import WILDCARD, AclOperation, AclPermissionType

    operations = [_operation(text) for text in given["operations"]] or [AclOperation.ALL]
    for kind in ("allow", "deny"):
        if given[f"{kind}_hosts"] and not given[f"{kind}_principals"]:
            raise click.UsageError(f"--{kind}-host applies to the principals of --{kind}-principal: give one")
    entries: list[tuple[str, str, AclOperation, Any]] = []
    for principals, hosts, permission in ((given["allow_principals"], given["allow_hosts"], AclPermissionType.ALLOW),
                                          (given["deny_principals"], given["deny_hosts"], AclPermissionType.DENY)):
        for principal in principals:
            for host in hosts or (WILDCARD,):
                entries.extend((principal, host, operation, permission) for operation in operations)
    return entries


def _resources(given: dict[str, Any], required: bool) -> list[tuple[ResourceType, str]]:
    from logcompact.catalog.acls import CLUSTER_NAME, ResourceType

    resources = [(ResourceType.TOPIC, name) for name in given["topics"]] + [(ResourceType.GROUP, name) for name in given["groups"]]
    resources += [(ResourceType.TRANSACTIONAL_ID, name) for name in given["transactional_ids"]]
    if given["cluster"]:
        resources.append((ResourceType.CLUSTER, CLUSTER_NAME))
    if required and not resources:
        raise click.UsageError("give a resource: --topic NAME, --group NAME, --cluster or --transactional-id ID")
    return resources


def _text(binding: AclBinding) -> str:
    return (f"{binding.permission.name} {binding.principal} from {binding.host} {binding.operation.name} on "
            f"{binding.resource_type.name} {binding.pattern_type.name} {binding.resource_name!r}")


def _show(bindings: list[AclBinding], as_json: bool, done: str | None) -> None:
    if as_json:
        for binding in bindings:
            emit({
                "resource_type": binding.resource_type.name, "resource_name": binding.resource_name, "pattern_type": binding.pattern_type.name,
                "principal": binding.principal, "host": binding.host, "operation": binding.operation.name, "permission": binding.permission.name,
            })
        return
    if done is not None:
        click.echo(f"{done} {len(bindings)} ACL{'' if len(bindings) == 1 else 's'}")
    if not bindings:
        return
    rows = [(b.resource_type.name, b.pattern_type.name, b.resource_name, b.principal, b.host, b.operation.name, b.permission.name) for b in bindings]
    header = ("RESOURCE", "PATTERN", "NAME", "PRINCIPAL", "HOST", "OPERATION", "PERMISSION")
    widths = [max(len(str(row[i])) for row in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(str(cell).ljust(width) for cell, width in zip(row, widths)).rstrip())

