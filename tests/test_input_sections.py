"""A plan's sections as columns (`Snapshot.input_sections`, `InputSections`): read from the catalog for a planned plan,
they are what its files loaded whole hold, and its stored documents are byte for byte those of its files in hand."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logcompact.catalog import Catalog, CatalogSection, DataFile
from logcompact.catalog.input_sections import InputSections
from logcompact.exceptions import CorruptDataError
from logcompact.format.layout import COMPRESSIONS, SectionInfo
from logcompact.planner import PlannerConfig, choose_plans, expected_effect
from logcompact.plans import PlannedInputs
from logcompact.plans.arrow_form import encode_groups
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic

TOPICS = {"b-plain": {"cleanup_policy": "compact"}, "a-deleted": {"cleanup_policy": "delete"}}
PARTITIONS = 4
CONFIG = PlannerConfig(min_files=(3, 3, 3, 3), tier_min_files=3, big_cluster_files=8, group_bytes=4_000)

# A file: its level, size and the (topic, partition, records, bytes, compression, crc, clean below, first row, key sketch) of its
# sections.
sections = st.lists(
    st.tuples(st.sampled_from(sorted(TOPICS)), st.integers(0, PARTITIONS - 1), st.integers(1, 50), st.integers(100, 3_000),
              st.sampled_from(COMPRESSIONS), st.integers(0, 2**32 - 1), st.integers(0, 60), st.integers(0, 1_000),
              st.sampled_from([b"", b"\x01\x02", bytes(range(40))])),
    min_size=1, max_size=6, unique_by=lambda s: (s[0], s[1]),
)
files = st.lists(st.tuples(st.sampled_from([0, 0, 1, 2, 3]), st.integers(1_000, 100_000), sections), min_size=1, max_size=20)


def _place(drawn: list) -> list[DataFile]:
    next_offset: dict[tuple[str, int], int] = {}
    placed = []
    for number, (level, size, of_file) in enumerate(drawn):
        held = []
        for n, (topic, partition, records, uncompressed, compression, crc, clean, first_row, key_sketch) in enumerate(of_file):
            first = next_offset.get((topic, partition), 0)
            next_offset[(topic, partition)] = first + records
            # Byte offsets out of the sections' order: the catalog loads a file's sections by byte offset.
            info = SectionInfo(topic, partition, records, records - 1, NOW - 10**6 - n, NOW - n, records // 3, uncompressed, compression, crc,
                               16 + 100 * ((n * 7) % len(of_file)), 100, clean, key_sketch, first_row)
            held.append(CatalogSection(info, first))
        placed.append(DataFile(f"data/l{level}/f{number:04d}.seg", level, size, NOW - 10**8 - number, tuple(held)))
    return placed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files)
def test_documents_encoded_from_the_catalogs_columns_are_those_of_the_files_loaded_whole(tmp_path_factory, drawn: list) -> None:
    catalog = Catalog(LocalStore(tmp_path_factory.mktemp("sections")))
    for name, topic_settings in TOPICS.items():
        create_topic(catalog, name, PARTITIONS, **topic_settings)
    catalog.replace_files([], _place(drawn), NOW)
    snapshot = catalog.snapshot()
    for mode in ("regular", "full", "max-lag"):
        for plan in choose_plans(snapshot, NOW, mode, CONFIG):
            assert isinstance(plan.inputs, PlannedInputs)
            read = snapshot.input_sections(plan.inputs.keys)
            in_hand = InputSections.from_files(tuple(plan.inputs))
            assert read.keys == in_hand.keys and read.levels.tolist() == in_hand.levels.tolist()
            assert read.table.to_pylist() == in_hand.table.to_pylist()
            assert encode_groups(plan) == encode_groups(replace(plan, inputs=tuple(plan.inputs)))


def test_sections_read_on_each_database_are_the_files_and_their_documents_estimates_the_same(catalog: Catalog) -> None:
    for name, topic_settings in TOPICS.items():
        create_topic(catalog, name, PARTITIONS, **topic_settings)
    sketches = [b"", b"\x01\x02", bytes(range(40))]
    drawn = [
        (level, 10_000 + n, [(topic, partition, 5 + n, 900 + 10 * n, COMPRESSIONS[n % len(COMPRESSIONS)], (n * 2654435761) % 2**32, n % 7, n, sketches[n % 3])
                             for topic in sorted(TOPICS) for partition in range(n % PARTITIONS, PARTITIONS)])
        for n, level in enumerate([0, 0, 0, 0, 1, 1, 1, 2])
    ]
    catalog.replace_files([], _place(drawn), NOW)
    snapshot = catalog.snapshot()
    (plan,) = choose_plans(snapshot, NOW, "full", CONFIG)
    assert isinstance(plan.inputs, PlannedInputs) and len(plan.groups) > 1
    in_hand = replace(plan, inputs=tuple(snapshot.get_files(plan.inputs.keys)[key] for key in plan.inputs.keys))
    assert snapshot.input_sections(plan.inputs.keys).table.to_pylist() == InputSections.from_files(in_hand.inputs).table.to_pylist()
    assert encode_groups(plan) == encode_groups(in_hand)
    assert expected_effect(plan) == expected_effect(in_hand)


def test_a_sections_row_holding_no_integer_is_corrupt_data_and_a_sketch_kept_as_text_is_its_bytes(tmp_path) -> None:
    """SQLite keeps whatever a column is set to: a partition set as text is named as the column's damage, never parsed
    as a number or passed over; a key sketch set as text (an estimate, bound to nothing) reads as its bytes."""
    catalog = Catalog(LocalStore(tmp_path))
    for name, topic_settings in TOPICS.items():
        create_topic(catalog, name, PARTITIONS, **topic_settings)
    drawn = [(0, 10_000 + n, [("b-plain", partition, 5, 900, "none", n, 0, 0, b"\x01\x02") for partition in range(PARTITIONS)]) for n in range(3)]
    catalog.replace_files([], _place(drawn), NOW)
    keys = [f"data/l0/f{number:04d}.seg" for number in range(3)]
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE sections SET key_sketch = 'ab' WHERE partition = 2")
    sketches = catalog.snapshot().input_sections(keys).table.column("key_sketch").to_pylist()
    assert sorted(set(sketches)) == [b"\x01\x02", b"ab"] and sketches.count(b"ab") == 3
    with catalog.engine.begin() as connection:
        connection.exec_driver_sql("UPDATE sections SET partition = 'three' WHERE partition = 1")
    with pytest.raises(CorruptDataError, match="sections.partition that is not a 64-bit integer .*restore the catalog database from a backup"):
        catalog.snapshot().input_sections(keys)
