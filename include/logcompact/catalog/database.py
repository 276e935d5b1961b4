"""Which database holds a store's catalog, and engines configured for the catalog's transactions.

SQLite is the embedded default: for a `file://` store the database is `catalog.db` in the store's
directory, so the store URI alone names the whole cluster. It runs in WAL mode (readers never wait for the
writer) with a busy timeout, and every write transaction starts with BEGIN IMMEDIATE, so writers of several
processes queue for the lock instead of failing. PostgreSQL (`postgresql+psycopg://...`) is for clusters
whose agents and compactors run on many machines; an `s3://` store needs one.

A catalog URL is printed only through `redact_url`, which masks its password whether the URL parses or not, and a
database's own message about it through `redact_text`. `catalog_errors` turns the database going away (refused,
lost, closed, a SQLite file that is no longer a database) into one-line CatalogUnavailableError, wherever the
catalog is read or written after its first connection, and a transaction the database rolled back for a concurrent
one (a deadlock victim) into TransactionRolledBackError, which running it again remedies.
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from operator import itemgetter
from pathlib import Path
from typing import Any

from sqlalchemy import Column, ColumnElement, Connection, CursorResult, Engine, Table, any_, bindparam, create_engine, event, func, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, DatabaseError, DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeoutError
from sqlalchemy.sql.dml import UpdateBase

from logcompact.exceptions import CatalogConfigError, CatalogUnavailableError, TransactionRolledBackError
from logcompact.store.base import ObjectStore
from logcompact.store.local import LocalStore

SQLITE_FILE = "catalog.db"
SQLITE_BUSY_TIMEOUT_MS = 60_000
# SQLite's WAL resets only when a checkpoint finds no reader in it, which a cluster whose agents, compactors and
# consumers always have one reading never offers: the WAL then grows by every commit (4.6 GB in two minutes of
# WarpStream's regime), and reads search it. A writer that finds it past this size checkpoints it in TRUNCATE
# mode once its commit is done: new writers wait, readers finish, and the WAL starts again from nothing.
SQLITE_WAL_LIMIT_BYTES = 64 << 20
# Execution option that marks a connection's transactions as writes (BEGIN IMMEDIATE on SQLite).
WRITE = "logcompact_write"


# What stands for a password in a printed URL.
MASK = "***"
# `scheme://user:` and everything up to the last '@' (a password may hold '@', '/', '[' ... when not quoted).
_USER_AND_PASSWORD = re.compile(r"(://[^:/?#]*:)(.*)@", re.DOTALL)
# An unparsed `scheme://user:secret` without any '@': what follows the colon may be a port or a password.
_COLON_WITHOUT_AT = re.compile(r"(://[^:/?#@]*:)([^/?#@]+)")
# A password passed as a query parameter (`?password=...`, as libpq takes it) or in a key=value string.
_PASSWORD_PARAMETER = re.compile(r"((?:^|[?&;\s])(?:password|sslpassword|passwd|pwd)=)([^&;\s#]*)", re.IGNORECASE)


def redact_url(url: str | URL) -> str:
    """`url` fit to print: its password, and anything that may be one, replaced by `***`, whether it parses or not.

    A URL that parses is rendered by SQLAlchemy with its password hidden; in any case whatever sits between
    `://user:` and the last '@' is masked (a password holding an unquoted '@' parses as part of the host), and so
    is a `password=` parameter. An unparsed URL without '@' (`scheme://user:secret`) has what follows its colon
    masked too: a port that is not a number cannot be told from a password."""
    text = url.render_as_string(hide_password=True) if isinstance(url, URL) else str(url)
    parsed = True
    try:
        found = make_url(text)
        found.port  # noqa: B018 (a port that is not a number is only found when read)
        text = found.render_as_string(hide_password=True)
    except (ArgumentError, ValueError, TypeError):
        parsed = False
    masked = _USER_AND_PASSWORD.sub(lambda m: f"{m.group(1)}{MASK}@", text, count=1)
    if not parsed and "@" not in masked:
        masked = _COLON_WITHOUT_AT.sub(lambda m: f"{m.group(1)}{MASK}", masked, count=1)
    return _PASSWORD_PARAMETER.sub(lambda m: f"{m.group(1)}{MASK}", masked)


def url_secrets(url: str | URL) -> list[str]:
    """What may be `url`'s password, longest first: the password as SQLAlchemy parses it, whatever sits between
    `://user:` and the last '@', a `password=` parameter, and their pieces between '@'s (an unquoted '@' leaves
    the end of a password in what parses as the host). Pieces shorter than 3 characters are left out."""
    raw = url.render_as_string(hide_password=False) if isinstance(url, URL) else str(url)
    secrets: set[str] = set()
    for pattern in (_USER_AND_PASSWORD, _COLON_WITHOUT_AT):
        found = pattern.search(raw)
        if found:
            secrets.update((found.group(2), *found.group(2).split("@")))
    secrets.update(found.group(2) for found in _PASSWORD_PARAMETER.finditer(raw))
    try:
        password = make_url(raw).password
    except (ArgumentError, ValueError, TypeError):
        password = None
    if password:
        secrets.update((str(password), *str(password).split("@")))
    return sorted((secret for secret in secrets if len(secret) >= 3), key=lambda secret: (-len(secret), secret))


def redact_text(text: str, url: str | URL) -> str:
    """`text` (a database's error message about `url`) with any piece of `url`'s password masked (`url_secrets`):
    a driver names the host it could not resolve, which holds the end of a password with an unquoted '@'."""
    for secret in url_secrets(url):
        text = text.replace(secret, MASK)
    return text


def rolled_back(exc: BaseException) -> bool:
    """Whether the database rolled the transaction back for a concurrent one (SQLSTATE class 40: a deadlock victim, a
    serialization failure): the catalog is up, and running the transaction again is the remedy PostgreSQL documents.
    psycopg files these under OperationalError, which `unavailable` takes for a catalog gone: asked first."""
    sqlstate = getattr(getattr(exc, "orig", None), "sqlstate", None)
    return isinstance(sqlstate, str) and sqlstate.startswith("40")


def unavailable(exc: BaseException) -> bool:
    """Whether a database error means the catalog cannot be reached or read (connection refused or lost, the
    server gone, a timeout, a SQLite file that is not a database), rather than a statement's own failure (a
    constraint, a programming error), which stays as it is."""
    if isinstance(exc, PoolTimeoutError):
        return True
    if not isinstance(exc, DBAPIError):
        return False
    return exc.connection_invalidated or isinstance(exc, OperationalError | InterfaceError) or type(exc) is DatabaseError


@contextmanager
def catalog_errors(url: str | URL) -> Iterator[None]:
    """Turn the connection-level failures of the catalog database met inside (`unavailable`) into one-line
    CatalogUnavailableError naming the catalog, its password masked, and a transaction the database rolled back for a
    concurrent one (`rolled_back`) into TransactionRolledBackError; other errors pass unchanged."""
    try:
        yield
    except (DBAPIError, PoolTimeoutError) as exc:
        if rolled_back(exc):
            reason = redact_text(first_line(getattr(exc, "orig", None) or exc), url)
            raise TransactionRolledBackError(
                f"catalog {redact_url(url)} rolled a write transaction back for a concurrent one ({reason}); nothing was written; run it again"
            ) from exc
        if not unavailable(exc):
            raise
        raise unavailable_error(url, exc) from exc


def first_line(exc: BaseException) -> str:
    """The first line of an error's message: what a one-line error quotes of the error behind it."""
    return str(exc).splitlines()[0]


def unavailable_error(url: str | URL, exc: BaseException) -> CatalogUnavailableError:
    """The one-line error of a catalog that cannot be reached or read, with the database's first line of why."""
    reason = getattr(exc, "orig", None) or exc
    lines = str(reason).strip().splitlines() or [type(reason).__name__]
    return CatalogUnavailableError(
        f"catalog {redact_url(url)} cannot be reached or read ({redact_text(lines[0], url)}); check --catalog "
        "(LOGCOMPACT_CATALOG) and that the database is up and intact"
    )


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


def bound_wal(connection: Connection) -> None:
    """After a commit on SQLite: checkpoint the WAL to nothing if it grew past SQLITE_WAL_LIMIT_BYTES."""
    if connection.dialect.name != "sqlite":
        return
    path = sqlite_path(str(connection.engine.url))
    try:
        size = os.path.getsize(f"{path}-wal")
    except OSError:  # no WAL yet, or another writer's checkpoint truncated it
        return
    if size > SQLITE_WAL_LIMIT_BYTES:
        # On the driver's connection, outside SQLAlchemy's transactions: the checkpoint cannot run inside one. A
        # checkpoint that waited out the busy timeout reports it in its row, not as an error: the next writer's
        # commit tries again.
        driver = connection.connection.driver_connection
        assert driver is not None
        driver.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()


# Up to this many values, a plain IN list (cheapest for the few partitions or files of one commit).
SHORT_LIST = 500


def integer_array(numbers: Iterable[int | None]) -> str:
    """A PostgreSQL array literal of integers (None: NULL), for a parameter cast in its statement (`%(name)s::bigint[]`):
    psycopg's list dumper costs more (10 ms for an append's five arrays of 1,000) than the statement it feeds."""
    return "{" + ",".join("NULL" if number is None else str(number) for number in numbers) + "}"


def one_of(column: Column, values: Iterable, dialect: str) -> ColumnElement[bool]:
    """`column` is one of `values`. A long list is bound as one parameter (`= ANY(array)` on PostgreSQL,
    `IN json_each(...)` on SQLite): an IN list needs a parameter per value, and each database limits them."""
    values = list(values)
    if len(values) <= SHORT_LIST:
        return column.in_(values)
    if dialect == "postgresql":
        return column == any_(bindparam(None, values, type_=ARRAY(column.type)))
    return column.in_(select(func.json_each(json.dumps(values)).table_valued("value").c.value))


def update_rows(connection: Connection, table: Table, key: Sequence[str], rows: Sequence[dict[str, Any]]) -> None:
    """Update rows of `table`, each given as its `key` columns' values and the new values of the others, by column
    name: in one statement on PostgreSQL (`UPDATE ... FROM unnest(an array a column)`), where an executemany of a
    hundred rows, even pipelined, cost several times its rows' work; an executemany on SQLite, whose writer holds the
    database's one write lock whatever it does."""
    if not rows:
        return
    names = list(rows[0])
    if connection.dialect.name == "postgresql":
        arrays = [bindparam(f"u_{name}", [row[name] for row in rows], type_=ARRAY(table.c[name].type)) for name in names]
        given = func.unnest(*arrays).table_valued(*names).render_derived()
        connection.execute(
            update(table).where(*(table.c[name] == given.c[name] for name in key)).values({name: given.c[name] for name in names if name not in key})
        )
        return
    statement = update(table).where(*(table.c[name] == bindparam(f"u_{name}") for name in key)).values(
        {name: bindparam(f"u_{name}") for name in names if name not in key}
    )
    connection.execute(statement, [{f"u_{name}": value for name, value in row.items()} for row in rows])


def driver_rows(result: CursorResult) -> list[tuple]:
    """A result's rows as the database driver hands them over: plain tuples, none made a `Row` (what reading
    hundreds of thousands of them as columns would cost as much again)."""
    with result:
        return list(result.cursor.fetchall())


def driver_connection(connection: Connection) -> Any:
    """This transaction's driver connection (psycopg's, on PostgreSQL)."""
    driver = connection.connection.driver_connection
    assert driver is not None
    return driver


@contextmanager
def driver_errors(connection: Connection, statement: str) -> Iterator[None]:
    """The driver's errors of `statement`, run on its connection past SQLAlchemy, raised as SQLAlchemy raises its own
    (`catalog_errors` tells an unreachable catalog by them, a lock timeout too); a connection the database dropped is
    invalidated, as SQLAlchemy does, so that the pool never hands it out again."""
    dialect = connection.dialect
    try:
        yield
    except dialect.loaded_dbapi.Error as exc:
        dbapi_connection = connection.connection.dbapi_connection
        disconnected = dialect.is_disconnect(exc, dbapi_connection, None)
        wrapped = DBAPIError.instance(statement, None, exc, dialect.loaded_dbapi.Error, connection_invalidated=disconnected, dialect=dialect)
        if disconnected:
            connection.invalidate(wrapped)
        raise wrapped from exc


def upsert(connection: Connection, table: Table) -> Any:
    """An INSERT that can take ON CONFLICT DO UPDATE: both databases spell it alike, SQLAlchemy per dialect."""
    dialect = postgresql if connection.dialect.name == "postgresql" else sqlite
    return dialect.insert(table)


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
            f"catalog URL {redact_url(url)!r} is not a database URL: use sqlite:////absolute/path.db or "
            "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB"
        ) from None
    backend = parsed.get_backend_name()
    if backend == "sqlite":
        if sqlite_path(url) is None:
            raise CatalogConfigError(
                f"catalog URL {redact_url(url)!r} names an in-memory database, lost at exit: use sqlite:////absolute/path.db"
            )
        return _sqlite_engine(url)
    if backend == "postgresql":
        if parsed.get_driver_name() != "psycopg":
            raise CatalogConfigError(f"catalog URL {redact_url(parsed)!r}: use the psycopg 3 driver, postgresql+psycopg://...")
        return create_engine(parsed, pool_pre_ping=True, pool_size=2, max_overflow=8)
    raise CatalogConfigError(f"catalog URL {redact_url(parsed)!r}: the catalog runs on sqlite or postgresql+psycopg, not {backend}")


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
