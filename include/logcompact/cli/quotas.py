"""`logcompact quota ...`: Kafka's client quotas in the catalog (set, list, remove), the entity named as
kafka-configs.sh names it (--user, --client-id, --ip, or their defaults), checked as AlterClientQuotas checks it."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import click

from logcompact.cli.common import Context, emit, pass_context

if TYPE_CHECKING:
    from logcompact.catalog.quotas import QuotaEntity

RATE_OPTIONS = (("producer_byte_rate", "producer-byte-rate"), ("consumer_byte_rate", "consumer-byte-rate"),
                ("connection_creation_rate", "connection-creation-rate"))


def entity_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for name, kind in (("ip", "IP address"), ("client_id", "client id"), ("user", "user (a principal's name, ANONYMOUS for unauthenticated clients)")):
        flag = name.replace("_", "-")
        command = click.option(f"--{flag}-default", f"{name}_default", is_flag=True, help=f"The default {kind.split(' (')[0]} entity.")(command)
        command = click.option(f"--{flag}", name, metavar="NAME", default=None, help=f"The {kind}.")(command)
    return command


def _parts(user: str | None, user_default: bool, client_id: str | None, client_id_default: bool,
           ip: str | None, ip_default: bool) -> list[tuple[str, str | None]]:
    parts: list[tuple[str, str | None]] = []
    for kind, name, default in (("user", user, user_default), ("client-id", client_id, client_id_default), ("ip", ip, ip_default)):
        if name is not None and default:
            raise click.UsageError(f"--{kind} and --{kind}-default name two entities: pass one of them")
        if name is not None or default:
            parts.append((kind, name))
    return parts


def _entity(parts: list[tuple[str, str | None]]) -> QuotaEntity:
    from logcompact.catalog.quotas import QuotaRequestError, entity_from

    if not parts:
        raise click.UsageError("no entity given: pass --user/--user-default, --client-id/--client-id-default (or both), or --ip/--ip-default")
    try:
        return entity_from(parts)
    except QuotaRequestError as exc:
        raise click.UsageError(str(exc)) from None


def _described(entity: QuotaEntity, values: dict[str, float]) -> dict[str, Any]:
    return {"entity": dict(entity.parts), "quotas": {key: _number(value) for key, value in sorted(values.items())}}


def _number(value: float) -> int | float:
    return int(value) if value.is_integer() else value


def _shown(entity: QuotaEntity) -> str:
    return " ".join(f"{kind}={'<default>' if name is None else name}" for kind, name in entity.parts)


@click.group()
def quota() -> None:
    """Kafka's client quotas (producer_byte_rate and consumer_byte_rate per user and client id,
    connection_creation_rate per IP address), kept in the catalog and enforced by each agent on its own clients
    within 5 s of a change (docs/security.md, Quotas)."""


@quota.command("set")
@entity_options
@click.option("--producer-byte-rate", type=int, metavar="BYTES", help="Bytes per second the entity's producers may send to one agent.")
@click.option("--consumer-byte-rate", type=int, metavar="BYTES", help="Bytes per second the entity's consumers may fetch from one agent.")
@click.option("--connection-creation-rate", type=int, metavar="N", help="New connections per second from the address (--ip entities).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the sentence.")
@pass_context
def quota_set(ctx: Context, as_json: bool, producer_byte_rate: int | None, consumer_byte_rate: int | None,
              connection_creation_rate: int | None, **names: Any) -> None:
    """Set quotas of one entity (others it has stay), as kafka-configs.sh --alter --add-config does."""
    from logcompact.catalog.quotas import QuotaRequestError, check_ops

    entity = _entity(_parts(**names))
    given = {"producer_byte_rate": producer_byte_rate, "consumer_byte_rate": consumer_byte_rate, "connection_creation_rate": connection_creation_rate}
    ops = {key: float(value) for key, value in given.items() if value is not None}
    if not ops:
        raise click.UsageError("no quota given: pass --producer-byte-rate, --consumer-byte-rate or --connection-creation-rate")
    try:
        checked = check_ops(entity, ops.items())
    except QuotaRequestError as exc:
        raise click.UsageError(str(exc)) from None
    catalog = ctx.catalog
    catalog.alter_client_quotas([(entity, checked)])
    values = catalog.client_quotas().get(entity, {})
    if as_json:
        emit(_described(entity, values))
    else:
        click.echo(f"quotas of {_shown(entity)}: " + ", ".join(f"{key}={_number(value)}" for key, value in sorted(values.items())))


@quota.command("remove")
@entity_options
@click.option("--key", "keys", multiple=True, metavar="KEY", help="A quota to remove, repeatable (producer_byte_rate ...); all of the entity's without.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the sentence.")
@pass_context
def quota_remove(ctx: Context, keys: tuple[str, ...], as_json: bool, **names: Any) -> None:
    """Remove quotas of one entity, as kafka-configs.sh --alter --delete-config does. An entity without the quotas
    named is an error, and nothing is removed."""
    entity = _entity(_parts(**names))
    catalog = ctx.catalog
    held = catalog.client_quotas().get(entity, {})
    removing = list(dict.fromkeys(keys)) if keys else sorted(held)
    missing = [key for key in removing if key not in held]
    if not removing or missing:
        has = ", ".join(sorted(held)) or "none"
        raise click.UsageError(f"{_shown(entity)} has no quota {', '.join(missing) or 'to remove'} (it has: {has})")
    catalog.alter_client_quotas([(entity, dict.fromkeys(removing))])
    if as_json:
        emit({"entity": dict(entity.parts), "removed": removing})
    else:
        click.echo(f"removed from {_shown(entity)}: {', '.join(removing)}")


@quota.command("list")
@entity_options
@click.option("--json", "as_json", is_flag=True, help="One JSON line per entity instead of the table.")
@pass_context
def quota_list(ctx: Context, as_json: bool, **names: Any) -> None:
    """The quotas in the catalog, of every entity or of those with the parts given (others may have more parts:
    --client-id app lists app's quotas under any user too), as DescribeClientQuotas' non-strict filter."""
    from logcompact.catalog.quotas import MATCH_DEFAULT, MATCH_EXACT, QuotaRequestError, filter_from

    parts = _parts(**names)
    try:
        matching = filter_from(((kind, MATCH_DEFAULT if name is None else MATCH_EXACT, name) for kind, name in parts), strict=False)
    except QuotaRequestError as exc:
        raise click.UsageError(str(exc)) from None
    found = sorted(ctx.catalog.client_quotas(matching).items())
    if as_json:
        for entity, values in found:
            emit(_described(entity, values))
        return
    if not found:
        click.echo("no client quotas")
        return
    shown = [(_shown(entity), ", ".join(f"{key}={_number(value)}" for key, value in sorted(values.items()))) for entity, values in found]
    width = max(len(entity) for entity, _ in shown)
    click.echo(f"{'ENTITY':<{width}}  QUOTAS")
    for entity_text, values_text in shown:
        click.echo(f"{entity_text:<{width}}  {values_text}")
