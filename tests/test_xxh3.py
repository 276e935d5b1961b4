"""The files' key hashes computed in a compiled loop (`format.xxh3`) equal xxhash's XXH3-128 digests, which the
format defines them as, for keys of every length path (0, 1-3, 4-8, 9-16, 17-128, 129-240, longer) and nulls."""

from __future__ import annotations

import pyarrow as pa
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from logcompact.format.xxh3 import key_hash_array

keys = st.lists(st.none() | st.binary(max_size=300), max_size=60)


@settings(max_examples=200)
@given(keys=keys, cut=st.integers(0, 10))
def test_key_hashes_equal_xxhash_digests(keys: list[bytes | None], cut: int) -> None:
    array = pa.array([b"x" * 17] * cut + keys, pa.binary()).slice(cut)  # a slice: offsets and validity start mid-buffer
    assert key_hash_array(array).to_pylist() == [None if key is None else xxhash.xxh3_128_digest(key) for key in keys]


def test_every_length_up_to_past_the_long_path() -> None:
    values = [bytes(range(256))[:length] for length in range(260)]
    assert key_hash_array(pa.chunked_array([values[:100], values[100:]])).to_pylist() == [xxhash.xxh3_128_digest(v) for v in values]
