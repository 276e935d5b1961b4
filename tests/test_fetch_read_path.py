"""What makes Fetch's reads cheap, each checked against the plain read it replaces: the sections of many partitions
in one catalog query, a long section read in chunks that a cache in front of the store serves after their first
GET, and a file's footer parsed once while the cache holds it."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np

from logcompact.catalog import Catalog
from logcompact.catalog.snapshot import PARTITIONS_PER_QUERY
from logcompact.format import read_footer, read_section_from, section_table, write_segment
from logcompact.format.reader import CHUNK_BYTES, SEEK_BYTES
from logcompact.jobs import run_and_commit
from logcompact.store import LocalStore
from logcompact.store.cache import CachedStore
from tests.helpers import NOW, create_topic, full_sweep, produce_l0_files


def test_sections_of_many_partitions_in_one_query_are_each_partition_s_own(catalog: Catalog) -> None:
    partitions = PARTITIONS_PER_QUERY + 4  # two queries
    create_topic(catalog, "t", partitions, cleanup_policy="compact")
    produce_l0_files(catalog, "t", files=3, records=400, keys=150, partitions=partitions)
    plan = full_sweep(catalog.planning_snapshot(NOW), NOW)  # compacted files, then L0 files again beside them
    assert plan is not None
    run_and_commit(catalog, plan, NOW)
    produce_l0_files(catalog, "t", files=2, records=200, keys=150, partitions=partitions)
    snapshot = catalog.snapshot()
    rng = random.Random(7)
    ranges: dict[int, tuple[int, int | None]] = {}
    for partition in rng.sample(range(partitions), partitions - 1):  # one left out; any order
        start = rng.randrange(0, 60)
        ranges[partition] = (start, rng.choice([None, start, start + rng.randrange(1, 40)]))
    found = snapshot.sections_of_partitions("t", ranges)
    assert set(found) == set(ranges)
    for partition, (start, end) in ranges.items():
        assert list(found[partition]) == snapshot.sections_of("t", partition, start, end)
    assert any(len(list(sections)) > 1 for sections in found.values())


def test_a_long_section_is_read_from_any_offset_through_a_cache_with_one_get_a_chunk(tmp_path: Path) -> None:
    store = LocalStore(tmp_path)
    count = (SEEK_BYTES + 2 * CHUNK_BYTES) // 1000  # about 2.5 chunks of records that do not compress
    deltas = np.arange(count, dtype=np.int64) * 2  # every other offset: holes
    values = [os.urandom(1000) for _ in range(count)]
    blob, (info,) = write_segment([("t", 0, section_table(deltas, [NOW] * count, [b"k%d" % i for i in range(count)], values))])
    store.put("f.seg", blob)
    assert info.byte_length > SEEK_BYTES  # read through the footer, chunk by chunk
    cache = CachedStore(store)
    position, read = 0, 0
    while position <= int(deltas[-1]):  # a consumer's fetches: a few records from where the last one ended
        pieces = read_section_from(cache, "f.seg", info, position)
        first = next(pieces)
        taken = first.slice(0, 50)
        row = int(np.searchsorted(deltas, position))
        assert taken.column("offset_delta").to_pylist() == deltas[row : row + taken.num_rows].tolist()
        assert taken.column("value").to_pylist() == values[row : row + taken.num_rows]
        pieces.close()
        read += taken.num_rows
        position = int(deltas[row + taken.num_rows - 1]) + 1 + (row % 3)  # now and then into a hole
    assert read > count // 3
    chunks = -(-info.byte_length // CHUNK_BYTES)
    # each chunk got once, and the footer's tail once: every later read was the cache's
    assert store.counters.snapshot().get <= chunks + 2
    assert read_footer(cache, "f.seg") is read_footer(cache, "f.seg")  # parsed once, held beside the ranges
    assert [piece.num_rows for piece in read_section_from(cache, "f.seg", info, 0)] and sum(
        piece.num_rows for piece in read_section_from(cache, "f.seg", info, int(deltas[count // 2]))
    ) == count - count // 2
