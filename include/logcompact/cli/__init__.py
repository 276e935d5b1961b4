"""The `logcompact` command line. Other tools script against it: its arguments and JSON lines are a contract.

Every command reads the store from `--store` or LOGCOMPACT_STORE, the catalog database from `--catalog` or
LOGCOMPACT_CATALOG (a file:// store has its own SQLite catalog without one; an s3:// store needs one) and
the clock from `--now` or LOGCOMPACT_NOW_MS (wall clock otherwise). Errors print one line to stderr and
exit 1; usage errors exit 2.

One module per command group; each imports what its commands run only when one runs, so `--help` loads click
and these modules alone.
"""

from __future__ import annotations

import logging
import os
import sys

import click

from logcompact.cli.acls import acl
from logcompact.cli.agent import agent
from logcompact.cli.cluster import cluster, status
from logcompact.cli.common import NON_NEGATIVE_INT64, Context
from logcompact.cli.compaction import compact, gc, plan_command, uncleanable
from logcompact.cli.demo import simulate, tour
from logcompact.cli.groups import groups
from logcompact.cli.quotas import quota
from logcompact.cli.records import consume, files, log, produce
from logcompact.cli.topics import topic
from logcompact.cli.transactions import txn
from logcompact.cli.users import user
from logcompact.exceptions import LogcompactError


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--store", envvar="LOGCOMPACT_STORE", metavar="URI", help="file:///path or s3://bucket/prefix [env LOGCOMPACT_STORE].")
@click.option("--catalog", "catalog_url", envvar="LOGCOMPACT_CATALOG", metavar="URL",
              help="Catalog database: postgresql+psycopg://USER:PASSWORD@HOST/DB or sqlite:////path/catalog.db; "
                   "needed for an s3:// store, a file:// store defaults to its own catalog.db [env LOGCOMPACT_CATALOG].")
@click.option("--now", "now_ms", envvar="LOGCOMPACT_NOW_MS", type=NON_NEGATIVE_INT64, metavar="MS",
              help="Clock in epoch ms [env LOGCOMPACT_NOW_MS].")
@click.option("--aws-conn-id", envvar="LOGCOMPACT_AWS_CONN_ID", metavar="ID", help="Airflow AWS connection for s3:// stores.")
@click.option("-v", "--verbose", count=True, help="Log progress to stderr; -vv logs debug lines too.")
@click.pass_context
def cli(ctx: click.Context, store: str | None, catalog_url: str | None, now_ms: int | None, aws_conn_id: str | None,
        verbose: int) -> None:
    """Key-based compaction for a Kafka-style log kept as segment files in object storage.

    A cluster is its store (data files, plans) and its catalog database (topics, offsets, live files).
    """
    level = (logging.WARNING, logging.INFO, logging.DEBUG)[min(verbose, 2)]
    logging.basicConfig(level=level, format="logcompact: %(levelname)s: %(message)s")
    ctx.obj = Context(store, catalog_url or None, now_ms, aws_conn_id)


for _command in (topic, produce, consume, files, log, plan_command, compact, uncleanable, gc, cluster, status, txn, groups, user, acl, quota, simulate, tour, agent):
    cli.add_command(_command)


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="logcompact", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("logcompact: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if isinstance(exc, click.UsageError) and exc.ctx else ""
        click.echo(f"logcompact: error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except LogcompactError as exc:
        click.echo(f"logcompact: error: {exc}", err=True)
        sys.exit(1)
    except Exception as exc:
        # The catalog database down, unreachable or refusing us: only a command that loaded SQLAlchemy can meet it.
        database_errors = sys.modules.get("sqlalchemy.exc")
        if database_errors is None or not isinstance(exc, database_errors.SQLAlchemyError):
            raise
        from logcompact.catalog.database import redact_text

        reason = redact_text(str(getattr(exc, "orig", None) or exc).splitlines()[0], _catalog_argument(argv or sys.argv[1:]))
        click.echo(f"logcompact: error: catalog database: {reason}; check --catalog (LOGCOMPACT_CATALOG) and the database", err=True)
        sys.exit(1)


def _catalog_argument(argv: list[str]) -> str:
    """The catalog URL a command line names (`--catalog URL`, `--catalog=URL` or LOGCOMPACT_CATALOG), to mask in a
    message the database wrote."""
    for n, argument in enumerate(argv):
        if argument == "--catalog" and n + 1 < len(argv):
            return argv[n + 1]
        if argument.startswith("--catalog="):
            return argument.split("=", 1)[1]
    return os.environ.get("LOGCOMPACT_CATALOG", "")
