"""Pass 1's key map against a dict: any sequence of puts (keys repeating, keys sharing home slots, the map filling up)
and clears leaves every key's latest offset, its size and where a full map stopped as the dict says."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from logcompact.engine.offset_map import BYTES_PER_SLOT, CompactOffsetMap

# Few distinct low words, so keys share home slots and probe past each other; the high word tells them apart.
_LOWS = st.sampled_from([0, 1, 2, 3, 2**32, 2**32 + 1, 2**63, 2**64 - 1, 0x9E3779B97F4A7C15])
_KEYS = st.tuples(st.integers(0, 3), _LOWS)
_BATCHES = st.lists(st.lists(_KEYS, max_size=40), min_size=1, max_size=8)


def _hashes(keys: list[tuple[int, int]]) -> np.ndarray:
    return np.asarray(keys, dtype=np.uint64).reshape(-1, 2)


def _check(key_map: CompactOffsetMap, model: dict[tuple[int, int], int]) -> None:
    assert key_map.size == len(model)
    asked = [*model, (7, 5), (0, 12345)]  # and keys never put
    assert key_map.get(_hashes(asked)).tolist() == [model.get(key, -1) for key in asked]
    assert sorted(key_map.offsets().tolist()) == sorted(model.values())


@settings(max_examples=300, deadline=None)
@given(slots=st.integers(2, 60), batches=_BATCHES, clear_after=st.integers(0, 8), gap=st.integers(1, 3))
def test_puts_and_gets_agree_with_a_dict(slots: int, batches: list[list[tuple[int, int]]], clear_after: int, gap: int) -> None:
    key_map = CompactOffsetMap(slots * BYTES_PER_SLOT)
    model: dict[tuple[int, int], int] = {}
    offset = 1000
    for number, keys in enumerate(batches):
        if number == clear_after:
            key_map.clear()
            model.clear()
        offsets = np.arange(offset, offset + gap * len(keys), gap, dtype=np.int64)
        offset += gap * len(keys)
        taken = key_map.put(_hashes(keys), offsets)
        expected_taken = len(keys)
        for row, (key, at) in enumerate(zip(keys, offsets.tolist(), strict=True)):
            if key not in model and len(model) >= key_map.capacity:
                expected_taken = row  # the first new key that does not fit: the map stops there
                break
            model[key] = at
        assert taken == expected_taken
        _check(key_map, model)


@settings(max_examples=100, deadline=None)
@given(keys=st.lists(st.tuples(st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), max_size=300), expected=st.integers(1, 400))
def test_a_table_sized_to_the_keys_expected_holds_them(keys: list[tuple[int, int]], expected: int) -> None:
    key_map = CompactOffsetMap(1 << 20)
    key_map.clear(expected)  # a table of at least 1,024 slots, a power of two, within the buffer
    model: dict[tuple[int, int], int] = {}
    offsets = np.arange(len(keys), dtype=np.int64) * 3
    assert key_map.put(_hashes(keys), offsets) == len(keys)
    for key, at in zip(keys, offsets.tolist(), strict=True):
        model[key] = at
    _check(key_map, model)
    key_map.clear(expected)
    _check(key_map, {})
