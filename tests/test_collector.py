"""The collector's pause: bulk work's objects leave the youngest generation on the way out (no collection walks them
then), unless the pause made few or the process froze objects itself."""

from __future__ import annotations

import gc
import subprocess
import sys

from logcompact.collector import MOVED_ON_AT, collector_paused


def _young_collections() -> int:
    return gc.get_stats()[0]["collections"]


def test_a_pause_that_made_many_objects_moves_them_to_the_oldest_generation() -> None:
    # In a process of its own: the collector's counts are the process's, and threads that other tests leave behind
    # (agents' and clients') allocate while this one counts.
    body = """
import gc
from logcompact.collector import MOVED_ON_AT, collector_paused
gc.collect()
with collector_paused():
    made = [(n, str(n)) for n in range(2 * MOVED_ON_AT)]
    before = gc.get_stats()[0]["collections"]
after = [None for _ in range(1000)]  # allocations that would set off a young collection
assert gc.isenabled()
assert gc.get_stats()[0]["collections"] == before, "the first allocations after the pause walked its objects"
assert gc.get_freeze_count() == 0
"""
    result = subprocess.run([sys.executable, "-c", body], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr


def test_a_small_pause_leaves_its_objects_to_a_young_collection() -> None:
    gc.collect()
    with collector_paused():
        made = [(n, str(n)) for n in range(MOVED_ON_AT // 10)]
        before = _young_collections()
    after = [None for _ in range(1000)]
    assert gc.isenabled()
    assert _young_collections() > before
    del made, after


def test_a_pause_never_thaws_what_the_process_froze() -> None:
    gc.collect()
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        with collector_paused():
            made = [(n, str(n)) for n in range(2 * MOVED_ON_AT)]
        assert gc.isenabled()
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
    del made


def test_a_nested_pause_leaves_the_collector_to_the_outer_one() -> None:
    with collector_paused():
        with collector_paused():
            pass
        assert not gc.isenabled()
    assert gc.isenabled()
