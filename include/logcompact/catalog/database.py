"""Which database holds a store's catalog, and engines configured for the catalog's transactions.

SQLite is the embedded default: for a `file://` store the database is `catalog.db` in the store's
directory, so the store URI alone names the whole cluster. It runs in WAL mode (readers never wait for the
writer) with a busy timeout, and every write transaction starts with BEGIN IMMEDIATE, so writers of several
processes queue for the lock instead of failing. PostgreSQL (`postgresql+psycopg://...`) is for clusters
whose agents and compactors run on many machines; an `s3://` store needs one.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterable, Sequence
from operator import itemgetter
from pathlib import Path

from sqlalchemy import Column, ColumnElement, Connection, Engine, any_, bindparam, create_engine, event, func, select
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError
from sqlalchemy.sql.dml import UpdateBase

from logcompact.exceptions import CatalogConfigError
from logcompact.store.base import ObjectStore
from logcompact.store.local import LocalStore

SQLITE_FILE = "catalog.db"
SQLITE_BUSY_TIMEOUT_MS = 60_000
# Execution option that marks a connection's transactions as writes (BEGIN IMMEDIATE on SQLite).
WRITE = "logcompact_write"


def catalog_url_for(store: ObjectStore, url: str | None) -> str:
    """The catalog URL to use with `store`: `url` itself, or the embedded SQLite file of a local store."""
    if url:
        return url
    if isinstance(store, LocalStore):
        return f"sqlite:///{Path(store.root) / SQLITE_FILE}"
    raise CatalogConfigError(
        f"store {store.uri} needs a catalog database: pass --catalog postgresql+psycopg://USER:PASSWORD@HOST/DB "
        "(or set LOGCOMPACT_CATALOG, or `catalog` in the Airflow connection's extra)"
    )


def sqlite_path(url: str) -> Path | None:
    """The file of a SQLite URL, None for another database or an in-memory one."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


# Up to this many values, a plain IN list (cheapest for the few partitions or files of one commit).
SHORT_LIST = 500


def one_of(column: Column, values: Iterable, dialect: str) -> ColumnElement[bool]:
    """`column` is one of `values`. A long list is bound as one parameter (`= ANY(array)` on PostgreSQL,
    `IN json_each(...)` on SQLite): an IN list needs a parameter per value, and each database limits them."""
    values = list(values)
    if len(values) <= SHORT_LIST:
        return column.in_(values)
    if dialect == "postgresql":
        return column == any_(bindparam(None, values, type_=ARRAY(column.type)))
    return column.in_(select(func.json_each(json.dumps(values)).table_valued("value").c.value))


_engines: dict[tuple[int, str], Engine] = {}
_engines_lock = threading.Lock()


def execute_many(connection: Connection, statement: UpdateBase, names: Sequence[str], rows: Sequence[tuple]) -> None:
    """One statement for many rows (tuples of the parameters `names`), compiled once and handed to the driver's
    executemany: SQLAlchemy's own executemany builds a parameter set per row in Python, which costs more than
    the database's work when an agent's file holds 10,000 sections."""
    if not rows:
        return
    compiled = statement.compile(dialect=connection.dialect)
    order = compiled.positiontup
    if not compiled.positional or order is None:
        parameters: Sequence = [dict(zip(names, row)) for row in rows]
    elif tuple(order) == tuple(names):
        parameters = rows
    else:
        pick = itemgetter(*(names.index(name) for name in order))
        parameters = [pick(row) for row in rows]
    connection.exec_driver_sql(str(compiled), parameters)


def engine_for(url: str) -> Engine:
    """One engine (and connection pool) per URL and process: a forked child makes its own."""
    key = (os.getpid(), url)
    with _engines_lock:
        engine = _engines.get(key)
        if engine is None:
            engine = _engines[key] = _create_engine(url)
        return engine


def _create_engine(url: str) -> Engine:
    try:
        parsed = make_url(url)
        parsed.port  # noqa: B018 (a port that is not a number is only found when read)
    except (ArgumentError, ValueError):
        raise CatalogConfigError(
            f"catalog URL {url!r} is not a database URL: use sqlite:////absolute/path.db or "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if sqlite_path(url) is None:
            raise CatalogConfigError(f"catalog URL {url!r} names an in-memory database, lost at exit: use sqlite:////absolute/path.db")
        return _sqlite_engine(url)
    if backend == "postgresql":
        if parsed.get_driver_name() != "psycopg":
            raise CatalogConfigError(f"catalog URL {parsed.render_as_string()!r}: use the psycopg 3 driver, postgresql+psycopg://...")
        return create_engine(parsed, pool_pre_ping=True, pool_size=2, max_overflow=8)
    raise CatalogConfigError(f"catalog URL {parsed.render_as_string()!r}: the catalog runs on sqlite or postgresql+psycopg, not {backend}")


def _sqlite_engine(url: str) -> Engine:
    path = sqlite_path(url)
    engine = create_engine(url, connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record) -> None:
        # The driver's own transaction handling is off: the "begin" hook below says how each one starts.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        if path is not None:
            cursor.execute("PRAGMA journal_mode=WAL")
        # In WAL mode NORMAL never corrupts the database; a power loss may undo the last commits, not a crash.
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=OFF")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _begin(connection) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE" if connection.get_execution_options().get(WRITE) else "BEGIN")

    return engine
