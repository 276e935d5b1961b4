"""The range arithmetic of `catalog/holes.py` that a compaction's commit runs over its inputs' sections: coalescing
them as arrays, partition by partition, agrees with coalescing each partition's list (`holes.coalesced`)."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from logcompact.catalog import holes

_ranges = st.lists(
    st.tuples(st.integers(1, 3), st.integers(0, 3), st.integers(0, 60), st.integers(0, 8)).map(lambda r: (r[0], r[1], r[2], r[2] + r[3])),
    max_size=60,
)


@settings(max_examples=400, deadline=None)
@given(_ranges)
def test_coalesced_by_slot_agrees_with_coalescing_each_partitions_list(rows: list[tuple[int, int, int, int]]) -> None:
    expected: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for topic_id, partition, first, last in rows:
        expected.setdefault((topic_id, partition), []).append((first, last))
    columns = np.array(rows, np.int64).reshape(len(rows), 4)
    found = holes.coalesced_by_slot(columns[:, 0], columns[:, 1], columns[:, 2], columns[:, 3])
    assert found == {slot: holes.coalesced(spans) for slot, spans in expected.items()}


def test_a_range_inside_an_earlier_longer_one_does_not_end_its_run() -> None:
    # (0, 9) then (2, 3): the run's greatest end stays 9, so (10, 12) touches it and (14, 15) starts a run.
    columns = np.array([(1, 0, 0, 9), (1, 0, 2, 3), (1, 0, 10, 12), (1, 0, 14, 15), (1, 1, 0, 0)], np.int64)
    found = holes.coalesced_by_slot(columns[:, 0], columns[:, 1], columns[:, 2], columns[:, 3])
    assert found == {(1, 0): [(0, 12), (14, 15)], (1, 1): [(0, 0)]}
