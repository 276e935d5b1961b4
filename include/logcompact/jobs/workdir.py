"""Compaction jobs' local work directories, and reclaiming those of jobs that died.

A job writes its output files in a `logcompact-job-*` directory of the temporary directory before uploading
them. A job killed with SIGKILL never runs its cleanup, so the directory and its partial outputs would stay.
Each job therefore holds an exclusive `flock` on a lock file inside its directory for as long as it runs:
the kernel drops the lock when the process dies, however it dies. Whoever can take the lock without waiting
knows the owner is gone and removes the directory; the next job does so on entry, and gc does too.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger(__name__)

WORKDIR_PREFIX = "logcompact-job-"
LOCK_NAME = ".lock"
# Directories made before jobs took a lock (or by a job killed before it took one) have nothing to ask; they
# go once nothing in them changed for this long, as no running job goes that long without writing.
UNLOCKED_MAX_AGE_S = 3600


@contextmanager
def job_workdir() -> Iterator[str]:
    """A new work directory, locked to this process while the block runs and removed after it; the
    directories of dead jobs are reclaimed first."""
    reclaim_workdirs()
    path = tempfile.mkdtemp(prefix=WORKDIR_PREFIX)
    # Locked under another name first, then renamed: a reclaimer never finds the lock file unlocked while
    # this job is alive (until the rename the directory is young and unlocked, so it is left alone).
    pending = os.path.join(path, f"{LOCK_NAME}.{uuid.uuid4().hex}")
    lock = os.open(pending, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        os.rename(pending, os.path.join(path, LOCK_NAME))
        yield path
    finally:
        try:
            shutil.rmtree(path)
        finally:
            os.close(lock)  # only now may a reclaimer take the lock, and it finds the directory gone


def reclaim_workdirs() -> list[str]:
    """Remove the work directories of dead jobs in the temporary directory; the paths removed.

    A directory goes when its lock can be taken without blocking (its owner is dead), or when it has no
    lock file and nothing in it changed for UNLOCKED_MAX_AGE_S. A live job's directory is never touched, nor
    another user's, nor a symbolic link.
    """
    removed = []
    with os.scandir(tempfile.gettempdir()) as entries:
        candidates = [entry.path for entry in entries if entry.name.startswith(WORKDIR_PREFIX) and _own_directory(entry)]
    for path in candidates:
        if _reclaim(path):
            log.info("removed the work directory of a dead compaction job: %s", path)
            removed.append(path)
    return removed


def _own_directory(entry: os.DirEntry) -> bool:
    """A directory (not a link to one) of this user: the only kind this process may judge and remove."""
    try:
        return entry.is_dir(follow_symlinks=False) and entry.stat(follow_symlinks=False).st_uid == os.getuid()
    except FileNotFoundError:
        return False  # removed since it was listed


def _reclaim(path: str) -> bool:
    """Remove `path` if its job is dead; whether it was removed (by this call)."""
    try:
        lock = os.open(os.path.join(path, LOCK_NAME), os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:  # no lock file: a directory from before locks, or the directory is gone
        try:
            idle = _last_change_s(path) <= time.time() - UNLOCKED_MAX_AGE_S
        except FileNotFoundError:
            return False  # removed meanwhile
        return idle and _remove(path)
    try:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False  # its job is alive
        return _remove(path)
    finally:
        os.close(lock)


def _remove(path: str) -> bool:
    """Remove a dead job's directory; False when another reclaimer removed it first."""
    try:
        shutil.rmtree(path)
    except FileNotFoundError:
        return False
    return True


def _last_change_s(path: str) -> float:
    """The newest modification time of the directory and the files in it."""
    newest = os.stat(path).st_mtime
    with os.scandir(path) as entries:
        for entry in entries:
            try:
                newest = max(newest, entry.stat(follow_symlinks=False).st_mtime)
            except FileNotFoundError:
                continue  # removed while we looked: it changed nothing we need
    return newest
