"""Running the `logcompact` CLI on bad input, in this process or as a real one, and telling whether it wrote.

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
