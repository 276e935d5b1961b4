"""Compaction jobs' work directories: real processes hold them, die by SIGKILL, and the next job or gc reclaims
what they left, never a live job's directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from logcompact.jobs.workdir import LOCK_NAME, UNLOCKED_MAX_AGE_S, WORKDIR_PREFIX, job_workdir, reclaim_workdirs

# A job in a child process: it holds a work directory with a partial output in it, prints the directory, and
# leaves the block (removing it) when its stdin closes.
JOB = """
import os, sys
from logcompact.jobs.workdir import job_workdir
with job_workdir() as path:
    with open(os.path.join(path, "partial.seg"), "wb") as out:
        out.write(b"half an output file")
    print(path, flush=True)
    sys.stdin.read()
"""


@pytest.fixture
def tmpdir_of_jobs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private temporary directory for this process and its children (the real one may hold other jobs)."""
    directory = tmp_path / "tmp"
    directory.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(directory))
    monkeypatch.setenv("TMPDIR", str(directory))
    return directory


def start_job() -> tuple[subprocess.Popen, Path]:
    child = subprocess.Popen([sys.executable, "-c", JOB], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = child.stdout.readline()
    assert line, f"the job exited with {child.wait()} before holding its directory"
    return child, Path(line.strip())


def dead_jobs(count: int) -> list[Path]:
    """The directories of `count` jobs killed with SIGKILL. All run before any dies: a job starting after one
    died would reclaim its directory."""
    started = [start_job() for _ in range(count)]
    for child, _ in started:
        kill(child)
    return [path for _, path in started]


def kill(child: subprocess.Popen) -> None:
    child.send_signal(signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL


def test_a_job_killed_with_sigkill_leaves_its_directory_and_reclaim_removes_it(tmpdir_of_jobs: Path) -> None:
    [path] = dead_jobs(1)
    assert path.parent == tmpdir_of_jobs and path.name.startswith(WORKDIR_PREFIX)
    assert (path / "partial.seg").is_file()  # nothing ran to clean up after SIGKILL

    assert reclaim_workdirs() == [str(path)]
    assert not path.exists()
    assert reclaim_workdirs() == []


def test_a_live_jobs_directory_is_kept_and_removed_by_the_job_when_it_ends(tmpdir_of_jobs: Path) -> None:
    child, path = start_job()
    try:
        assert reclaim_workdirs() == []
        assert (path / "partial.seg").is_file() and (path / LOCK_NAME).is_file()
    finally:
        child.stdin.close()
    assert child.wait() == 0
    assert not path.exists()


def test_the_next_job_reclaims_dead_jobs_directories_but_not_live_ones(tmpdir_of_jobs: Path) -> None:
    live, live_path = start_job()
    dead = dead_jobs(3)
    assert all((path / "partial.seg").is_file() for path in dead)
    try:
        with job_workdir() as mine:
            assert [p.exists() for p in dead] == [False, False, False]
            assert live_path.is_dir() and Path(mine).is_dir()
            # This process's own job is live too: flock locks belong to the open file, not the process.
            assert reclaim_workdirs() == []
            assert Path(mine, LOCK_NAME).is_file()
        assert not Path(mine).exists()
        assert live_path.is_dir()
    finally:
        live.stdin.close()
        assert live.wait() == 0


def test_a_job_that_fails_removes_its_directory(tmpdir_of_jobs: Path) -> None:
    with pytest.raises(RuntimeError, match="the job failed"):
        with job_workdir() as path:
            Path(path, "partial.seg").write_bytes(b"half")
            raise RuntimeError("the job failed")
    assert not Path(path).exists()


def test_directories_without_a_lock_go_once_nothing_changed_for_an_hour(tmpdir_of_jobs: Path) -> None:
    old = tmpdir_of_jobs / f"{WORKDIR_PREFIX}from-an-old-release"
    recent = tmpdir_of_jobs / f"{WORKDIR_PREFIX}still-writing"
    for directory in (old, recent):
        directory.mkdir()
        (directory / "output.seg").write_bytes(b"records")
    assert reclaim_workdirs() == []  # young: an old-style job may still be writing

    long_ago = time.time() - UNLOCKED_MAX_AGE_S - 60
    for path in (old / "output.seg", old, recent):
        os.utime(path, (long_ago, long_ago))
    # `recent`'s file was written just now: its job is still at work, whatever the directory's own time.
    assert reclaim_workdirs() == [str(old)]
    assert not old.exists() and (recent / "output.seg").is_file()


def test_links_and_other_names_are_left_alone(tmpdir_of_jobs: Path, tmp_path: Path) -> None:
    target = tmp_path / "precious"
    target.mkdir()
    (target / "data").write_bytes(b"keep")
    long_ago = time.time() - 2 * UNLOCKED_MAX_AGE_S
    os.utime(target / "data", (long_ago, long_ago))
    os.utime(target, (long_ago, long_ago))
    (tmpdir_of_jobs / f"{WORKDIR_PREFIX}link").symlink_to(target, target_is_directory=True)
    other = tmpdir_of_jobs / "some-other-job"
    other.mkdir()
    os.utime(other, (long_ago, long_ago))

    assert reclaim_workdirs() == []
    assert (target / "data").read_bytes() == b"keep" and other.is_dir()
    assert (tmpdir_of_jobs / f"{WORKDIR_PREFIX}link").is_symlink()


def test_concurrent_reclaimers_remove_each_dead_directory_once_and_no_live_one(tmpdir_of_jobs: Path) -> None:
    live, live_path = start_job()
    dead = [str(path) for path in dead_jobs(6)]
    reclaimer = "from logcompact.jobs.workdir import reclaim_workdirs\nfor path in reclaim_workdirs(): print(path)"
    try:
        runs = [subprocess.Popen([sys.executable, "-c", reclaimer], stdout=subprocess.PIPE, text=True) for _ in range(4)]
        outputs = [run.communicate()[0] for run in runs]
        assert [run.returncode for run in runs] == [0, 0, 0, 0]
        removed = [line for output in outputs for line in output.splitlines()]
        assert sorted(removed) == sorted(dead)  # each once, by whichever reclaimer took its lock
        assert live_path.is_dir() and (live_path / "partial.seg").is_file()
    finally:
        live.stdin.close()
        assert live.wait() == 0
