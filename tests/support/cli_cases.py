"""Running the `logcompact` CLI on bad input, in this process or as a real one, and telling whether it wrote; and
the cases of bad input more than one test runs.

In-process runs call `logcompact.cli.main(argv)` with stdin, stdout and stderr replaced (a few milliseconds a
run, against a second for a new interpreter); a real process checks the same contract end to end.
"""

from __future__ import annotations

import hashlib
import io
import os
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from logcompact.cli import main

# SQLite's side files: they change when a reader opens the database, though nothing in it does.
SQLITE_SIDE_FILES = ("-wal", "-shm")


class Outcome(NamedTuple):
    code: int
    stdout: str
    stderr: str


@contextmanager
def _environment(env: dict[str, str]) -> Iterator[None]:
    saved = {name: os.environ.get(name) for name in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                del os.environ[name]
            else:
                os.environ[name] = value


def run_in_process(argv: list[str], stdin: bytes = b"", env: dict[str, str] | None = None) -> Outcome:
    """`logcompact ARGV` in this process. An exception that escapes main() is what a user would see as a
    traceback: it is returned as one, in stderr, with exit code 1 as Python gives it."""
    saved = sys.stdin, sys.stdout, sys.stderr
    out, err = io.StringIO(), io.StringIO()
    sys.stdin, sys.stdout, sys.stderr = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"), out, err
    code = 0
    try:
        with _environment(env or {}):
            main(argv)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else 1
    except Exception:
        err.write(traceback.format_exc())
        code = 1
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
    return Outcome(code, out.getvalue(), err.getvalue())


def run_process(argv: list[str], stdin: bytes = b"", env: dict[str, str] | None = None) -> Outcome:
    """`python -m logcompact ARGV` as a real process."""
    done = subprocess.run(
        [sys.executable, "-m", "logcompact", *argv], input=stdin, capture_output=True, env={**os.environ, **(env or {})}, timeout=120
    )
    return Outcome(done.returncode, done.stdout.decode(errors="backslashreplace"), done.stderr.decode(errors="backslashreplace"))


def _catalog_state(path: Path) -> str:
    """What a SQLite catalog holds (every row of every table), or its bytes' hash if it is not a database."""
    try:
        connection = sqlite3.connect(path)  # read-only connections fail on a WAL database without its -shm file
        try:
            return "\n".join(connection.iterdump())
        finally:
            connection.close()
    except sqlite3.DatabaseError:
        return hashlib.sha256(path.read_bytes()).hexdigest()


def tree_state(root: Path) -> dict[str, object]:
    """Everything under `root` a command could have written: each directory and link, each file's size and
    mtime, and each SQLite catalog's content (its side files change on reads, its content does not)."""
    state: dict[str, object] = {}
    for directory, directories, files in os.walk(root):  # links are not followed
        for name in directories + files:
            path = Path(directory, name)
            relative = str(path.relative_to(root))
            if path.is_symlink():
                state[relative] = ("link", os.readlink(path))
            elif path.is_dir():
                state[relative] = "directory"
            elif name.endswith(SQLITE_SIDE_FILES):
                continue
            elif name.endswith(".db"):
                state[relative] = _catalog_state(path)
            else:
                stat = path.stat()
                state[relative] = (stat.st_size, stat.st_mtime_ns)
    return state


def changes(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The paths that appeared, vanished or changed between two `tree_state`s."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))


# -- the bad-input table's cases (tests/test_cli_bad_input.py), some run again elsewhere -----------------------

GOOD_LINE = b'{"partition": 0, "key": "k", "value": "v"}\n'


class Case(NamedTuple):
    """A command line fed bad input, and the one error line it must end with."""

    name: str
    argv: list[str]  # {store}, {work}: the cluster's store, the working directory; {stored_plan_id}: the plan in {work}/plans
    code: int  # 1 for an error, 2 for a usage error
    says: str  # a fragment the one line must hold: what is wrong, or the fix
    stdin: bytes = b""
    env: dict[str, str] = {}
    cluster: bool = True  # run with --store {store} --now NOW before argv
    damage: str | None = None  # run on a copy of the store whose catalog.db is damaged so (`_damage`)
    process: bool = False  # also run as a real process


def case(name: str, code: int, says: str, *argv: str, **options) -> Case:
    return Case(name, list(argv), code, says, **options)


# Bad --catalog URLs (tests/test_catalog_damage.py runs them again with a password planted in each).
UNREACHABLE = "postgresql+psycopg://user:s3cret@127.0.0.1:1/catalog"
CATALOG = [
    case("catalog: not a URL", 1, "is not a database URL", "--catalog", "not-a-url", "topic", "list"),
    case("catalog: mysql", 1, "the catalog runs on sqlite or postgresql+psycopg, not mysql", "--catalog", "mysql://x/y", "topic", "list"),
    case("catalog: psycopg2 driver", 1, "use the psycopg 3 driver", "--catalog", "postgresql+psycopg2://u@127.0.0.1/db", "topic", "list"),
    case("catalog: unreachable PostgreSQL, list", 1, "cannot be reached", "--catalog", UNREACHABLE, "topic", "list"),
    case("catalog: unreachable PostgreSQL, create", 1, "connection failed", "--catalog", UNREACHABLE, "topic", "create", "t", "--partitions", "1"),
    case("catalog: unreachable PostgreSQL, produce", 1, "cannot be reached", "--catalog", UNREACHABLE, "produce", "t", stdin=GOOD_LINE),
    case("catalog: unreachable PostgreSQL, from the environment", 1, "cannot be reached", "files", env={"LOGCOMPACT_CATALOG": UNREACHABLE}),
    case("catalog: unresolvable host", 1, "cannot be reached", "--catalog", "postgresql+psycopg://u:p@no-such-host.invalid/db", "files"),
    case("catalog: SQLite in a missing directory, create", 1, "does not exist; create it or fix the path", "--catalog",
         "sqlite:///{work}/missing/catalog.db", "topic", "create", "t", "--partitions", "1"),
    case("catalog: SQLite in a missing directory, list", 1, "no logcompact cluster in", "--catalog", "sqlite:///{work}/missing/catalog.db",
         "topic", "list"),
    case("catalog: SQLite file that is not a database", 1, "file is not a database", "--catalog", "sqlite:///{work}/a-file", "topic", "list"),
    case("catalog: SQLite file that is not a database, create", 1, "file is not a database", "--catalog", "sqlite:///{work}/a-file",
         "topic", "create", "t", "--partitions", "1"),
    case("catalog: a directory", 1, "unable to open database file", "--catalog", "sqlite:///{work}/empty", "topic", "list"),
    case("catalog: a port that is not a number", 1, "is not a database URL", "--catalog", "postgresql+psycopg://u:p@127.0.0.1:port/db",
         "topic", "list"),
    case("catalog: SQLite in memory", 1, "names an in-memory database, lost at exit", "--catalog", "sqlite://", "topic", "create", "t",
         "--partitions", "1"),
]

# The commands that open the catalog database, each run on a damaged one.
CATALOG_COMMANDS = [
    ["topic", "list"], ["topic", "describe", "accounts"], ["topic", "create", "new", "--partitions", "1"],
    ["topic", "alter", "accounts", "--config", "retention.ms=5"], ["produce", "accounts"], ["consume", "accounts", "--partition", "0"],
    ["files"], ["log"], ["gc"], ["plan"], ["compact", "--all"],
]
