"""The bounded cache of file ranges (`store.cache.CachedStore`) in front of a store: bytes held never above its
setting, least recently used ranges evicted first, ranges inside a held one served without a GET."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from logcompact.store import LocalStore
from logcompact.store.cache import CachedStore

DATA = os.urandom(10_000)


@pytest.fixture
def store(tmp_path: Path) -> LocalStore:
    store = LocalStore(tmp_path)
    store.put("a", DATA)
    store.put("b", DATA)
    return store


def gets(store: LocalStore) -> int:
    return store.counters.snapshot().get


def test_a_range_read_again_or_inside_a_held_one_costs_no_get(store: LocalStore) -> None:
    cache = CachedStore(store, max_bytes=5_000)
    assert cache.get_range("a", 1_000, 3_000) == DATA[1_000:4_000]
    before = gets(store)
    assert cache.get_range("a", 1_000, 3_000) == DATA[1_000:4_000]
    assert cache.get_range("a", 2_000, 500) == DATA[2_000:2_500]  # inside the held range
    assert gets(store) == before and (cache.hits, cache.misses) == (2, 1)
    assert cache.get_range("a", 3_500, 1_000) == DATA[3_500:4_500]  # reaches past it: a GET
    assert cache.get_range("b", 1_000, 3_000) == DATA[1_000:4_000]  # another object: a GET
    assert gets(store) == before + 2


def test_bytes_held_never_pass_the_setting_and_the_least_recently_used_go_first(store: LocalStore) -> None:
    cache = CachedStore(store, max_bytes=4_000)
    for start in range(0, 8_000, 1_000):  # 8 ranges of 1,000 bytes through a cache of 4,000
        cache.get_range("a", start, 1_000)
        cache.get_range("a", 0, 1_000)  # range 0 kept in use: never evicted
        assert cache.cached_bytes <= 4_000
    assert cache.cached_bytes == 4_000
    before = gets(store)
    for start in (0, 5_000, 6_000, 7_000):  # held: the one in use and the three newest
        assert cache.get_range("a", start, 1_000) == DATA[start : start + 1_000]
    assert gets(store) == before
    cache.get_range("a", 1_000, 1_000)  # evicted long ago
    assert gets(store) == before + 1
    assert cache.get_range("a", 0, 9_000) == DATA[:9_000]  # larger than the whole cache: read, never held
    assert cache.cached_bytes <= 4_000 and gets(store) == before + 2


def test_a_cache_of_no_bytes_holds_nothing(store: LocalStore) -> None:
    cache = CachedStore(store, max_bytes=0)
    cache.get_range("a", 0, 100)
    cache.get_range("a", 0, 100)
    assert (cache.cached_bytes, gets(store)) == (0, 2)


def test_sizes_are_kept_and_an_object_written_or_deleted_through_it_is_forgotten(store: LocalStore) -> None:
    cache = CachedStore(store)
    first, again = cache.stat("a"), cache.stat("a")
    assert first is not None and first == again and store.counters.snapshot().head == 1  # asked once
    cache.get_range("a", 0, 100)
    cache.put("a", b"new contents")
    assert cache.cached_bytes == 0
    assert cache.get_range("a", 0, 3) == b"new" and cache.stat("a").size == len(b"new contents")  # type: ignore[union-attr]
    cache.get_range("a", 0, 12)  # held, as is its size
    cache.put_parts("a", [b"written ", memoryview(b"in parts")])
    assert cache.cached_bytes == 0
    assert cache.get_range("a", 0, 12) == b"written in p" and cache.stat("a").size == 16  # type: ignore[union-attr]
    cache.delete("a")
    assert cache.cached_bytes == 0 and cache.stat("a") is None


def test_a_short_answer_is_handed_back_and_never_held(store: LocalStore) -> None:
    cache = CachedStore(store)
    assert cache.get_range("a", 9_900, 1_000) == DATA[9_900:]  # past the end: what the store answers, for the reader to refuse
    assert cache.cached_bytes == 0


def test_a_memo_is_built_once_counted_in_the_bound_and_goes_with_its_object(store: LocalStore) -> None:
    cache = CachedStore(store, max_bytes=4_000)
    built: list[str] = []

    def parsed(name: str) -> tuple[str, int]:
        built.append(name)
        return f"parsed {name}", 1_500

    assert cache.memo("a", "footer", lambda: parsed("a")) == cache.memo("a", "footer", lambda: parsed("a")) == "parsed a"
    assert built == ["a"] and cache.cached_bytes == 1_500
    cache.get_range("b", 0, 2_000)
    cache.memo("a", "footer", lambda: parsed("a"))  # in use: the range of b is now the least recently used
    cache.get_range("b", 5_000, 2_000)  # 5,500 bytes: the older range of b goes, the memo stays
    assert cache.cached_bytes == 3_500 and built == ["a"]
    cache.put("a", b"rewritten")  # its memos go with its ranges
    assert cache.memo("a", "footer", lambda: parsed("a")) == "parsed a" and built == ["a", "a"]
    assert cache.memo("b", "huge", lambda: ("never held", 5_000)) == "never held" and cache.cached_bytes == 3_500
