"""Planning passes weigh their files from the sections' columns (`Snapshot.section_columns`, `planner.columns`) and hand
their plans' inputs over unloaded (`PlannedInputs`). On random catalogs, every mode's plans are those a reference
model makes from the plans' inputs loaded whole, section by section (`input_offsets`, `lowest_outside`, `size_tiers`
over file summaries), and those of the same snapshot planned from its files in hand (a snapshot without `section_columns`)."""

from __future__ import annotations

import logging
import pickle
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select, update

from logcompact.catalog import Catalog, CatalogSection, DataFile, Snapshot, schema
from logcompact.catalog.snapshot import _section_hashes
from logcompact.exceptions import CommitConflictError
from logcompact.format.layout import SectionInfo
from logcompact.planner import PlannerConfig, choose_plans, size_tiers, top_level
from logcompact.planner.columns import files_holding
from logcompact.plans import Plan, PlannedInputs, input_offsets, lowest_outside, plan_to_dict, split_into_groups
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic, section_column_rows

TOPICS = {
    "plain": {"cleanup_policy": "compact"},
    "lagged": {"cleanup_policy": "compact", "max_compaction_lag_ms": str(3 * 3_600_000), "min_compaction_lag_ms": "600000"},
    "deleted": {"cleanup_policy": "delete"},
}
PARTITIONS = 3
CONFIG = PlannerConfig(min_files=(3, 3, 3, 3), tier_min_files=3, big_cluster_files=8, group_bytes=6_000)
MODES = {"regular": CONFIG, "full": CONFIG, "max-lag": CONFIG}

# A file: its level, size, age and the (topic, partition, record count, bytes, newest record's age) of its sections.
sections = st.lists(
    st.tuples(st.sampled_from(sorted(TOPICS)), st.integers(0, PARTITIONS - 1), st.integers(1, 50), st.integers(100, 3_000),
              st.sampled_from([60_000, 600_000, 3_600_000, 10 * 3_600_000])),
    min_size=1, max_size=5, unique_by=lambda s: (s[0], s[1]),
)
files = st.lists(
    st.tuples(st.sampled_from([0, 0, 1, 2, 2, 3, 4]), st.integers(1_000, 100_000), st.integers(0, 10**7), sections), min_size=1, max_size=30
)


def _catalog(directory) -> Catalog:
    catalog = Catalog(LocalStore(directory))
    for name, topic_settings in TOPICS.items():
        create_topic(catalog, name, PARTITIONS, **topic_settings)
    return catalog


def _place(drawn: list) -> list[DataFile]:
    """The drawn files with offsets: each partition's sections one run after another, in file order."""
    next_offset: dict[tuple[str, int], int] = {}
    placed = []
    for number, (level, size, age, of_file) in enumerate(drawn):
        created = NOW - 10**8 - age
        held = []
        for topic, partition, records, uncompressed, newest_age in sorted(of_file):
            first = next_offset.get((topic, partition), 0)
            next_offset[(topic, partition)] = first + records
            info = SectionInfo(topic, partition, records, records - 1, NOW - newest_age - 10**6, NOW - newest_age, 0, uncompressed,
                               "lz4", 0, 16 + 100 * len(held), 100, 0)
            held.append(CatalogSection(info, first))
        placed.append(DataFile(f"data/l{level}/f{number:04d}.seg", level, size, created, tuple(held)))
    return placed


class _FilesInHand:
    """The snapshot without `section_columns`: planned from its files in hand."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot

    def __getattr__(self, name: str):
        if name == "section_columns":
            raise AttributeError(name)
        return getattr(self._snapshot, name)


def _documents(plans: Sequence[Plan]) -> list[dict]:
    found = []
    for plan in plans:
        document = plan_to_dict(plan)
        del document["plan_id"]
        found.append(document)
    return found


def _reference_level_merges(snapshot: Snapshot, config: PlannerConfig) -> list[list[str]]:
    """The regular pass's level merges and size tiers from the file summaries (no plan past a dirty ratio here)."""
    counts = snapshot.level_counts()
    top = top_level(counts, config)
    chosen = []
    for level in range(top):
        at_level = snapshot.file_summaries(level)
        kinds = [at_level] if level == 0 else [[f for f in at_level if f.content == c] for c in sorted({f.content for f in at_level})]
        chosen += [[f.key for f in kind] for kind in kinds if len(kind) >= config.min_files[level]]
    at_top = snapshot.file_summaries(top)
    for content in sorted({f.content for f in at_top}):
        chosen += [[f.key for f in tier] for tier in size_tiers([f for f in at_top if f.content == content], config)]
    return chosen


def _check_against_reference(snapshot: Snapshot, plans: list[Plan], now: int, config: PlannerConfig) -> None:
    """Each plan's floors, first uncleanable offsets and groups as computed from every plan's inputs loaded whole."""
    inputs = [tuple(plan.inputs) for plan in plans]
    assert [[f.key for f in of_plan] for of_plan in inputs] == [list(plan.inputs.keys) for plan in plans if isinstance(plan.inputs, PlannedInputs)]
    young_after = {name: now - t.config.min_compaction_lag_ms for name, t in snapshot.topics.items() if t.config.min_compaction_lag_ms > 0}
    offsets = [input_offsets(of_plan, young_after) for of_plan in inputs]
    every = [f for of_plan in inputs for f in of_plan]
    partitions = set().union(*(o.lowest for o in offsets))
    outside = lowest_outside(snapshot, every, partitions)
    young_outside = snapshot.first_uncleanable_offsets(partitions, now, excluding=[f.key for f in every])
    for number, (plan, of_plan) in enumerate(zip(plans, offsets)):
        others = [o for n, o in enumerate(offsets) if n != number]
        floors, young = {}, {}
        for tp in of_plan.lowest:
            if found := [o.lowest[tp] for o in others if tp in o.lowest] + ([outside[tp]] if tp in outside else []):
                floors[tp] = min(found)
            if found := [o.young[tp] for o in others if tp in o.young] + ([young_outside[tp]] if tp in young_outside else []):
                young[tp] = min(found)
        assert plan.outside_floors == floors
        assert plan.first_uncleanable == young
        assert plan.groups == split_into_groups(of_plan.sizes, config.group_bytes)
        assert sorted(plan.topics) == sorted({topic for topic, _ in of_plan.lowest})
        assert plan.header().inputs == tuple((f.key, f.level, f.size, f.created_ms) for f in plan.inputs)


@given(st.integers(1, 2**40), st.integers(1, 2**20), st.lists(st.tuples(st.integers(0, 2**31 - 1), st.integers(0, 2**62), st.integers(0, 2**40)),
                                                             min_size=2, max_size=2, unique_by=lambda s: s[0]))
def test_two_sections_trading_offsets_change_the_sum_of_their_hashes(file_id: int, topic_id: int, sections: list) -> None:
    """What vouches for the packs (`_section_hashes`, summed over sections) sees two sections of one file trade their
    offsets, which a hash linear in the values (Horner's rule alone) misses in most cases."""
    (p0, first0, span0), (p1, first1, span1) = sections
    assume((first0, span0) != (first1, span1))

    def summed(firsts: list[int], spans: list[int]) -> int:
        columns = [[file_id, file_id], [topic_id, topic_id], [p0, p1], firsts, [f + n for f, n in zip(firsts, spans)]]
        return int(_section_hashes([np.asarray(column, np.int64) for column in columns]).sum())

    assert summed([first0, first1], [span0, span1]) != summed([first1, first0], [span1, span0])


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files, st.sets(st.tuples(st.sampled_from([*sorted(TOPICS), "absent"]), st.integers(0, PARTITIONS + 1)), max_size=6))
def test_files_holding_partitions_from_columns_are_the_snapshots(tmp_path_factory, drawn: list, wanted: set) -> None:
    catalog = _catalog(tmp_path_factory.mktemp("holding"))
    catalog.replace_files([], _place(drawn), NOW)
    snapshot = catalog.snapshot()
    known = {(topic, partition) for topic, partition in wanted if topic in TOPICS}
    assert files_holding(snapshot.section_columns(), wanted) == snapshot.files_holding(known)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files)
def test_every_mode_plans_from_columns_as_from_the_files_loaded_whole(tmp_path_factory, drawn: list) -> None:
    catalog = _catalog(tmp_path_factory.mktemp("columns"))
    catalog.replace_files([], _place(drawn), NOW)
    snapshot = catalog.snapshot()
    for mode, config in MODES.items():
        plans = choose_plans(snapshot, NOW, mode, config)
        assert all(isinstance(plan.inputs, PlannedInputs) for plan in plans)
        in_hand = choose_plans(_FilesInHand(snapshot), NOW, mode, config)  # type: ignore[arg-type]
        assert _documents(plans) == _documents(in_hand)
        _check_against_reference(snapshot, plans, NOW, config)
        if mode == "regular":  # the level merges first, then at most a plan of the partitions past their dirty ratio
            merges = _reference_level_merges(snapshot, config)
            taken = [list(plan.inputs.keys) for plan in plans if isinstance(plan.inputs, PlannedInputs)]
            assert taken[: len(merges)] == merges and len(taken) - len(merges) <= 1
        if mode == "full" and plans:
            assert sorted(plans[0].inputs.keys) == sorted(f.key for f in snapshot.file_summaries())  # type: ignore[attr-defined]


def test_planned_inputs_load_once_as_the_snapshot_holds_them_and_pickle_as_a_tuple(catalog: Catalog) -> None:
    create_topic(catalog, "t", 2, cleanup_policy="compact")
    catalog.replace_files([], _place([(0, 1_000, n, [("t", n % 2, 10, 500, 60_000)]) for n in range(4)]), NOW)
    snapshot = catalog.snapshot()
    (plan,) = choose_plans(snapshot, NOW, "full")
    assert isinstance(plan.inputs, PlannedInputs) and len(plan.inputs) == 4
    loaded = snapshot.get_files(plan.inputs.keys)
    assert tuple(plan.inputs) == tuple(loaded[key] for key in plan.inputs.keys)
    assert plan.inputs == tuple(plan.inputs) and plan.inputs[0] is plan.inputs[0]
    copied = pickle.loads(pickle.dumps(plan))
    assert type(copied.inputs) is tuple and copied == plan


def test_a_pack_stored_during_a_pass_is_read_from_rows_by_that_pass_without_a_disagreement(
    catalog: Catalog, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A one-step append on PostgreSQL stores its files' packs just after its commit, so a pass may read a file row
    without its pack and the rows that vouch for the packs after it was stored: the pass reads that file from its rows,
    vouches for the packs it read, and says nothing is wrong."""
    create_topic(catalog, "plain", PARTITIONS)
    catalog.replace_files([], [_file("data/l0/a.seg", 0, ("plain", 0, 0, 5)), _file("data/l0/b.seg", 0, ("plain", 1, 0, 5), ("plain", 2, 0, 3))], NOW)
    files = schema.files.c
    with catalog.engine.begin() as connection:
        b_id, b_pack = connection.execute(select(files.file_id, files.sections_packed).where(files.key == "data/l0/b.seg")).one()
        connection.execute(update(schema.files).where(files.file_id == b_id).values(sections_packed=None))
    packed_sections = Snapshot._packed_sections

    def storing_b_meanwhile(self: Snapshot, connection, packed):  # type: ignore[no-untyped-def]
        with catalog.engine.begin() as other:
            other.execute(update(schema.files).where(files.file_id == b_id).values(sections_packed=b_pack))
        return packed_sections(self, connection, packed)

    monkeypatch.setattr(Snapshot, "_packed_sections", storing_b_meanwhile)
    rows = section_column_rows(catalog.snapshot().section_columns())
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [row[:5] for row in rows] == [
        ("data/l0/a.seg", "plain", 0, 0, 4), ("data/l0/b.seg", "plain", 1, 0, 4), ("data/l0/b.seg", "plain", 2, 0, 2),
    ]


def test_planned_inputs_whose_files_changed_since_the_pass_are_refused() -> None:
    info = SectionInfo("t", 0, 1, 0, NOW, NOW, 0, 10, "lz4", 0, 16, 10)
    data_file = DataFile("data/l0/a.seg", 0, 10, NOW, (CatalogSection(info, 0),))
    gone = PlannedInputs(["data/l0/a.seg", "data/l0/b.seg"], [0, 0], [10, 10], [NOW, NOW], 2, lambda keys: {"data/l0/a.seg": data_file})
    with pytest.raises(CommitConflictError, match="file data/l0/b.seg is no longer live in the catalog since; plan again"):
        list(gone)
    changed = PlannedInputs(["data/l0/a.seg"], [0], [10], [NOW], 2, lambda keys: {"data/l0/a.seg": data_file})
    with pytest.raises(CommitConflictError, match="its files' sections changed in the catalog since; plan again"):
        changed[0]


def _file(key: str, level: int, *sections: tuple[str, int, int, int]) -> DataFile:
    held = tuple(
        CatalogSection(SectionInfo(topic, partition, count, count - 1, NOW - 2_000, NOW - 1_000 + partition, 0, 100 * count, "lz4", 0, 16, 100, 0), first)
        for topic, partition, first, count in sections
    )
    return DataFile(key, level, 10_000, NOW - 10**7, held)


def test_sections_read_from_files_packs_are_those_of_their_rows(catalog: Catalog, caplog: pytest.LogCaptureFixture) -> None:
    """A planning pass reads each file's sections from its pack (`files.sections_packed`), and those of a file without
    one (PostgreSQL's one-step appends, rows from before schema 15) from its sections rows: the same columns either
    way, without the sections retired alone by the snapshot's version (a commit that kept a set-aside partition's
    section of an input) nor those of partitions set aside, and with them in a snapshot older than their retirement."""
    for name, topic_settings in TOPICS.items():
        create_topic(catalog, name, PARTITIONS, **topic_settings)
    catalog.replace_files([], [
        _file("data/l1/a.seg", 1, ("plain", 0, 0, 10), ("plain", 1, 0, 10), ("lagged", 2, 0, 10)),
        _file("data/l2/b.seg", 2, ("plain", 0, 10, 10), ("plain", 1, 10, 10)),
        _file("data/l0/c.seg", 0, ("plain", 2, 0, 5)),
        _file("data/l1/e.seg", 1, ("deleted", 0, 0, 10), ("deleted", 1, 0, 10), ("deleted", 2, 0, 10)),
    ], NOW)
    older = catalog.snapshot()
    catalog.replace_files(["data/l1/a.seg"], [_file("data/l2/d.seg", 2, ("plain", 1, 0, 10), ("lagged", 2, 0, 10))], NOW, kept=[("plain", 0)])
    # e.seg keeps a section of a partition set aside below (deleted/2) beside one retired alone (deleted/0).
    catalog.replace_files(["data/l1/e.seg"], [_file("data/l2/f.seg", 2, ("deleted", 0, 0, 10))], NOW, kept=[("deleted", 1), ("deleted", 2)])
    newer = catalog.snapshot(set_aside=frozenset({("plain", 1), ("deleted", 2)}))
    packed = [section_column_rows(snapshot.section_columns()) for snapshot in (older, newer)]
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]  # the rows vouched for the packs: read from them
    assert [(key, topic, partition) for key, topic, partition, *_ in packed[1]] == [
        ("data/l0/c.seg", "plain", 2), ("data/l1/a.seg", "plain", 0), ("data/l1/e.seg", "deleted", 1), ("data/l2/b.seg", "plain", 0),
        ("data/l2/d.seg", "lagged", 2), ("data/l2/f.seg", "deleted", 0),
    ]
    assert len(packed[0]) == 9
    with catalog.engine.begin() as connection:
        assert connection.execute(select(func.count()).where(schema.files.c.sections_packed.is_(None))).scalar_one() == 0
        connection.execute(update(schema.files).values(sections_packed=None))
    assert [section_column_rows(snapshot.section_columns()) for snapshot in (older, newer)] == packed
