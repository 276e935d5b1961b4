"""The key sketches' packed forms merge as their registers do, and estimate duplicates within the HLL's error."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from logcompact import sketch


def _packed(key_hashes: np.ndarray) -> bytes:
    return sketch.encode(sketch.sketch_words(key_hashes))


@given(st.lists(st.integers(0, 5_000), max_size=8))
def test_merge_packed_equals_the_maximum_of_the_decoded_registers(sizes: list[int]) -> None:
    rng = np.random.default_rng(len(sizes))
    packed = [_packed(rng.integers(0, 2**64 - 1, size, dtype=np.uint64)) for size in sizes]  # small ones are pairs, large ones full
    expected = np.zeros(sketch.REGISTERS, dtype=np.uint8)
    for one in packed:
        expected = np.maximum(expected, sketch.decode(one))
    assert np.array_equal(sketch.merge_packed(packed), expected)


@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2_000)), max_size=12))
def test_merge_by_group_packs_each_group_as_its_own_merge(owned: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(len(owned))
    groups = np.array([group for group, _ in owned], dtype=np.int64)
    packed = [_packed(rng.integers(0, 2**64 - 1, size, dtype=np.uint64)) for _, size in owned]
    merged = sketch.merge_by_group(groups, packed, 4)
    for group in range(4):
        own = [one for one, of in zip(packed, groups.tolist()) if of == group]
        assert merged[group] == sketch.encode(sketch.merge_packed(own)), group

def test_estimated_duplicates_of_overlapping_sections() -> None:
    # Three sections of 4,000 records over the same 2,000 keys: 10,000 duplicates, within the sketch's ~9%.
    keys = np.random.default_rng(3).integers(0, 2**64 - 1, 2_000, dtype=np.uint64)
    packed = [_packed(np.concatenate([keys, keys])) for _ in range(3)]
    assert abs(sketch.estimated_duplicates(12_000, packed) - 10_000) < 3 * 0.09 * 2_000
    assert sketch.estimated_duplicates(12_000, [b"", b""]) == 0  # no section has keys: nothing is known
    assert sketch.estimated_duplicates(10, packed) == 0  # never negative


@given(st.lists(st.integers(0, 3_000), max_size=40))
def test_rows_of_sketches_encode_decode_and_estimate_as_each_one_alone(sizes: list[int]) -> None:
    """The vectorized forms the simulator uses, for sketches empty, short (pairs) and full: the same bytes and the
    same floats, bit for bit, as `encode`, `decode` and `estimate` of each row."""
    rng = np.random.default_rng(len(sizes))
    rows = np.array([sketch.sketch_words(rng.integers(0, 2**64 - 1, size, dtype=np.uint64)) for size in sizes], dtype=np.uint8)
    rows = rows.reshape(len(sizes), sketch.REGISTERS)
    packed = sketch.encode_rows(rows)
    assert packed == [sketch.encode(row) for row in rows]
    assert np.array_equal(sketch.decode_rows(packed), rows)
    assert sketch.estimate_rows(rows).tolist() == [sketch.estimate(row) for row in rows]
