"""The key sketches' packed forms merge as their registers do, and estimate duplicates within the HLL's error."""

from __future__ import annotations

import numpy as np
import pytest
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

def _reference_registers(words: np.ndarray) -> np.ndarray:
    registers = np.zeros(sketch.REGISTERS, dtype=np.uint8)
    index, rank = sketch.register_ranks(words)
    np.maximum.at(registers, index, rank)
    return registers


# Words whose rest (the bits after the register's) converts to a float rounded up to the next power of two, which
# gives them a rank one lower than their leading zeros would: the compiled loop must round as numpy does.
_ROUNDED_UP = [(1 << 56) - 1, (1 << 50) - 1, (1 << 57) - 1, (3 << 62) | ((1 << 56) - 1), 0, (1 << 64) - 1]


@given(st.lists(st.tuples(st.integers(0, 6), st.one_of(st.integers(0, 2**64 - 1), st.sampled_from(_ROUNDED_UP))), max_size=300))
def test_a_files_sketches_are_each_groups_registers_packed(owned: list[tuple[int, int]]) -> None:
    """`encode_many` (the writer's sketches of a file's sections, one compiled pass) against `register_ranks` and a
    maximum per register of each group's words, packed by `encode`; groups without words are b""; `sketch_words`
    alike, over a column of a read-only buffer as the writer passes it."""
    owned.sort(key=lambda pair: pair[0])
    groups = np.array([group for group, _ in owned], dtype=np.int64)
    words = np.array([word for _, word in owned], dtype=np.uint64)
    expected = [sketch.encode(_reference_registers(words[groups == group])) if (groups == group).any() else b"" for group in range(7)]
    assert sketch.encode_many(groups, words, 7) == expected
    column = np.frombuffer(np.stack([words, words]).T.tobytes(), dtype=np.uint64).reshape(-1, 2)[:, 1]
    assert np.array_equal(sketch.sketch_words(column), _reference_registers(words))


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


def test_sketch_groups_outside_the_count_are_refused() -> None:
    words = np.arange(3, dtype=np.uint64)
    for groups in ([0, 1, 2], [-1, 0, 0], [0, 0]):
        with pytest.raises(ValueError, match="sketch groups must be one a word"):
            sketch.encode_many(np.array(groups, dtype=np.int64), words, 2)
