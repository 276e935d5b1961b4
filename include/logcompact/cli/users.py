"""`logcompact user add|remove|list`: users' SCRAM credentials in the catalog, which every agent's SASL listeners
authenticate against (docs/security.md), what Kafka's `kafka-configs.sh --alter --add-config 'SCRAM-SHA-512=[...]'
--entity-type users` does. The password is salted here and only the salt, StoredKey, ServerKey and iterations are
stored; it is never printed, logged, or taken from anything but stdin, the option, or LOGCOMPACT_USER_PASSWORD."""

from __future__ import annotations

import sys

import click

from logcompact.cli.common import Context, emit, pass_context

_MECHANISMS = click.Choice(["SCRAM-SHA-256", "SCRAM-SHA-512"])
PASSWORD_ENV = "LOGCOMPACT_USER_PASSWORD"


@click.group()
def user() -> None:
    """Users' SCRAM credentials, which SASL clients (SCRAM-SHA-256, SCRAM-SHA-512 and PLAIN) authenticate with."""


@user.command("add")
@click.argument("name")
@click.option("--mechanism", type=_MECHANISMS, default="SCRAM-SHA-512", show_default=True,
              help="The SCRAM mechanism of the credential (add one per mechanism the user's clients use; PLAIN checks the "
                   "SCRAM-SHA-512 one if the user has it, else the SCRAM-SHA-256 one).")
@click.option("--iterations", type=click.IntRange(4096, 16384), default=4096, show_default=True,
              help="SCRAM iterations, within Kafka's bounds (Kafka's iterations in SCRAM-SHA-512=[iterations=N,password=...]).")
@click.option("--password-stdin", is_flag=True, help="Read the password from the first line of stdin.")
@click.option("--password", envvar=PASSWORD_ENV, show_envvar=True, metavar="PASSWORD",
              help="The password (visible to other users of this host in the process list: prefer --password-stdin or the "
                   "environment variable).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the sentence.")
@pass_context
def user_add(ctx: Context, name: str, mechanism: str, iterations: int, password_stdin: bool, password: str | None, as_json: bool) -> None:
    """Add user NAME's credential for a mechanism, or replace the one it has (a new password or iterations)."""
    from logcompact.catalog.credentials import new_credential

    if not name:
        raise click.BadParameter("a user name must not be empty", param_hint="NAME")
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    if not password:
        raise click.UsageError(f"no password given for user {name!r}: pass --password-stdin (and the password on stdin), "
                               f"--password, or set {PASSWORD_ENV}")
    ctx.catalog.put_scram_credential(name, new_credential(mechanism, password, iterations))
    if as_json:
        emit({"user": name, "mechanism": mechanism, "iterations": iterations})
    else:
        click.echo(f"user {name!r}: {mechanism} credential stored ({iterations} iterations)")


@user.command("remove")
@click.argument("name")
@click.option("--mechanism", type=_MECHANISMS, default=None, help="Remove only this mechanism's credential [default: every one].")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the sentence.")
@pass_context
def user_remove(ctx: Context, name: str, mechanism: str | None, as_json: bool) -> None:
    """Remove user NAME's credentials: its clients can open no new connection (those open stay, as in Kafka). A user
    without such a credential is an error, and nothing is removed."""
    removed = ctx.catalog.remove_scram_credentials(name, mechanism)
    if not removed:
        raise click.ClickException(f"user {name!r} has no {mechanism or 'SCRAM'} credential; see `logcompact user list`")
    if as_json:
        emit({"user": name, "removed": removed})
    else:
        click.echo(f"user {name!r}: {', '.join(removed)} credential{'s' if len(removed) > 1 else ''} removed")


@user.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per user instead of the table.")
@pass_context
def user_list(ctx: Context, as_json: bool) -> None:
    """The users with SCRAM credentials, their mechanisms and iterations; no salt or key."""
    by_user: dict[str, list[tuple[str, int]]] = {}
    for row in ctx.catalog.scram_users():
        by_user.setdefault(row.user_name, []).append((row.mechanism, row.iterations))
    for name, mechanisms in by_user.items():
        if as_json:
            emit({"user": name, "mechanisms": [{"mechanism": m, "iterations": i} for m, i in mechanisms]})
        else:
            click.echo(f"{name}  {'  '.join(f'{m} ({i} iterations)' for m, i in mechanisms)}")
