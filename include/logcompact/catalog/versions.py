"""The version row (`catalog_info.version`) and the commit log (`versions`), in the caller's transaction: what
serializes writers, and what every commit adds. Functions of a Connection, called by `Catalog` inside its
transactions.
"""

from __future__ import annotations

import uuid

from sqlalchemy import Connection, delete, func, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import driver_connection, driver_errors
from logcompact.catalog.model import CommitRecord
from logcompact.exceptions import CorruptDataError

# Where a write transaction leaves the version it committed, for `Catalog._writing` to record in the store's marker.
COMMITTED = "logcompact_committed_version"


def lock(connection: Connection) -> int:
    """Serialize with every other writer (SQLite's BEGIN IMMEDIATE already has); the newest version."""
    return connection.execute(select(s.catalog_info.c.version).with_for_update()).scalar_one()


# A commit's version: the version row bumped, then the commit logged under it unless the log already holds a version
# at or past it (the row was lowered). Each statement reads what committed before it, as separate statements do; on
# PostgreSQL both go in one round trip (a pipeline), past SQLAlchemy: an append's commit is a few milliseconds.
BUMP = "UPDATE catalog_info SET version = version + 1 RETURNING version"
_LOG = """
INSERT INTO versions (version, commit_id, created_ms, operation)
SELECT version, {commit_id}, {created_ms}, {operation} FROM catalog_info AS i
WHERE NOT EXISTS (SELECT 1 FROM versions AS v WHERE v.version >= i.version) RETURNING version
"""
LOG_POSTGRESQL = _LOG.format(commit_id="%(commit_id)s", created_ms="%(created_ms)s", operation="%(operation)s")
_LOG_SQLITE = _LOG.format(commit_id=":commit_id", created_ms=":created_ms", operation=":operation")


def next_version(connection: Connection, operation: str, now_ms: int) -> int:
    """Take the next version for the caller's commit (locking the version row until it ends) and log it."""
    log = {"commit_id": str(uuid.uuid4()), "created_ms": now_ms, "operation": operation}
    if connection.dialect.name == "postgresql":
        driver = driver_connection(connection)
        with driver_errors(connection, LOG_POSTGRESQL), driver.cursor() as bump, driver.cursor() as logged:
            with driver.pipeline():
                bump.execute(BUMP)
                logged.execute(LOG_POSTGRESQL, log)
            [(version,)] = bump.fetchall()
            written = logged.fetchall()
    else:
        [(version,)] = connection.exec_driver_sql(BUMP).all()
        written = connection.exec_driver_sql(_LOG_SQLITE, log).all()
    if not written:
        raise version_behind_log(version - 1, connection.execute(select(func.max(s.versions.c.version))).scalar_one())
    connection.info[COMMITTED] = (version, operation)
    return version


def newest_version(connection: Connection) -> int:
    """The newest version, checked against the commit log: a lowered `catalog_info.version` would hide newer files."""
    version, logged = connection.execute(
        select(s.catalog_info.c.version, select(func.max(s.versions.c.version)).scalar_subquery())
    ).one()
    if logged is not None and logged > version:
        raise version_behind_log(version, logged)
    return version


def version_behind_log(version: int, logged: int) -> CorruptDataError:
    return CorruptDataError(
        f"catalog row catalog_info.version is {version} but the commit log (versions) holds version {logged}: the row was "
        "lowered, and reading or writing at it would hide newer files and hand out versions again; restore the catalog "
        "from a backup, or set catalog_info.version to the newest logged version; nothing was written"
    )


def commit_log(connection: Connection, limit: int) -> list[CommitRecord]:
    """The newest commits, newest first."""
    rows = connection.execute(select(s.versions).order_by(s.versions.c.version.desc()).limit(limit))
    return [CommitRecord(r.version, r.commit_id, r.created_ms, r.operation) for r in rows]


def trim(connection: Connection, before_version: int) -> int:
    """Drop commit-log rows older than `before_version` (readers can no longer pin them); how many."""
    return connection.execute(delete(s.versions).where(s.versions.c.version < before_version)).rowcount
