"""Min lag is Kafka's first uncleanable offset: the catalog's sections outside a plan and the first young record
among its own inputs set it, so whichever files a plan takes, nothing from that offset on is deduplicated, and
every compaction ends its output section there.

Each history is produced twice, into two fresh catalogs, with timestamps out of order and files settled into
levels at an earlier clock on the way (so young records sit in files a later level plan does not take). Then,
at one clock, one catalog is compacted by level plans until idle (`compact --until-idle`: the planner's
regular mode, again and again) and the other by the full sweep:

* the sweep keeps what the reference model keeps for one job over every live record: record-precise, the
  first uncleanable offset is the first young record's;
* both keep every record from each partition's first uncleanable offset on, as produced;
* level plans never remove a record the sweep keeps: they may keep more (a top level's size tiers leave
  duplicates across files until the sweep), never less.

Before plans carried the catalog's first uncleanable offset, level plans found it in their own inputs only and
removed records after a young record they did not take; the crafted case below is that report.
Before compactions cut their output at the first young record, level passes merged a young record's section
with older ones, moving the first uncleanable offset down to their start; its table is the last test.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lab.reference_model import ModelRecord, ModelSegment, ReferenceLog, cleanable, first_young
from logcompact.catalog import Catalog
from logcompact.consume import read_records
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic, full_sweep, level_plans

LAG_MS = 1_000
SETTLED = NOW - 10 * LAG_MS  # the clock of the level plans run while the history is produced
CONFIG = {"cleanup_policy": "compact", "min_compaction_lag_ms": str(LAG_MS), "delete_retention_ms": str(24 * 3_600_000)}
KEYS = [b"a", b"b", b"c", b"d"]

# A record: partition (modulo the example's count), key, value (None: a tombstone), age at the final clock (young: under LAG_MS).
records = st.tuples(st.integers(0, 2), st.sampled_from(KEYS), st.one_of(st.none(), st.sampled_from([b"1", b"2", b"3"])),
                    st.sampled_from([20_000, 15_000, 12_000, 800, 300]))
produce_step = st.tuples(st.just("produce"), st.lists(records, min_size=1, max_size=6))
settle_step = st.just(("settle",))
programs = st.tuples(produce_step, st.lists(st.one_of(produce_step, produce_step, settle_step), min_size=1, max_size=11)).map(
    lambda drawn: [drawn[0], *drawn[1]]
)

# The report: the young record (offset 1) settles into an L2 file; the next L1 to L2 plan takes
# only the file of offsets 2 and 3, and used to remove offset 2 as superseded by offset 3.
ISSUE_CASE = [
    ("produce", [(0, b"a", b"1", 20_000), (0, b"y", b"2", 300)]),
    ("settle",),
    ("produce", [(0, b"a", b"2", 20_000), (0, b"a", b"3", 20_000)]),
]


def _catalog(tmp_path_factory, partitions: int, **settings: str) -> Catalog:
    catalog = Catalog(LocalStore(tmp_path_factory.mktemp("minlag")))
    create_topic(catalog, "state", partitions=partitions, **CONFIG, **settings)
    return catalog


def _until_idle(catalog: Catalog, now: int) -> None:
    while due := level_plans(catalog.planning_snapshot(now), now, 1):
        for plan in due:
            run_and_commit(catalog, plan, now)


def _replay(catalog: Catalog, program: list[tuple], partitions: int) -> None:
    for step in program:
        if step[0] == "settle":
            _until_idle(catalog, SETTLED)
            continue
        with Agent(catalog, background=False, clock=lambda: SETTLED) as agent:
            agent.produce("state", [Record(p % partitions, key, value, NOW - age) for p, key, value, age in step[1]])


def _survivors(catalog: Catalog, partitions: int) -> dict[int, list[tuple]]:
    snapshot = catalog.snapshot()
    return {
        p: [(r.offset, r.key, r.value, r.timestamp) for r in read_records(catalog.store, snapshot, "state", p)]
        for p in range(partitions)
    }


def _model_of_the_sweep(catalog: Catalog, partitions: int, now: int = NOW) -> tuple[dict[int, list[tuple]], dict[int, int]]:
    """What the reference model keeps of one job over every live record at `now`, and each partition's first
    uncleanable offset: its first young record's (a partition without one: past its last record)."""
    snapshot = catalog.snapshot()
    config = snapshot.topics["state"].config
    model, job, first = ReferenceLog(), {}, {}
    for p in range(partitions):
        live = [ModelRecord(r.offset, r.key, r.value, r.timestamp) for r in read_records(catalog.store, snapshot, "state", p)]
        model.produce("state", p, live)
        job[("state", p)] = {r.offset for r in live}
        young = first_young(live, config, now)
        first[p] = young if young is not None else 1 << 62
    model.compact(job, {"state": config}, now, deduplicate=True)
    kept = {p: [(r.offset, r.key, r.value, r.timestamp) for r in model.records("state", p)] for p in range(partitions)}
    return kept, first


@settings(max_examples=40)
@given(st.integers(1, 3), programs)
@example(1, ISSUE_CASE)
def test_level_plans_never_remove_what_the_sweep_keeps_and_the_sweep_keeps_what_the_model_keeps(
    tmp_path_factory, partitions: int, program: list[tuple]
) -> None:
    levels, sweep = _catalog(tmp_path_factory, partitions), _catalog(tmp_path_factory, partitions)
    for catalog in (levels, sweep):
        _replay(catalog, program, partitions)
    before = _survivors(sweep, partitions)
    modelled, first_uncleanable = _model_of_the_sweep(sweep, partitions)

    run_and_commit(sweep, full_sweep(sweep.planning_snapshot(NOW), NOW), NOW)
    _until_idle(levels, NOW)
    swept, leveled = _survivors(sweep, partitions), _survivors(levels, partitions)
    for p in range(partitions):
        assert swept[p] == modelled[p], f"partition {p}: the sweep differs from the model"
        young = [r for r in before[p] if r[0] >= first_uncleanable[p]]
        assert [r for r in swept[p] if r[0] >= first_uncleanable[p]] == young, f"partition {p}: the sweep touched young records"
        assert [r for r in leveled[p] if r[0] >= first_uncleanable[p]] == young, f"partition {p}: level plans touched young records"
        assert set(swept[p]) <= set(leveled[p]), f"partition {p}: level plans removed records the sweep keeps"


def test_the_reported_case_keeps_the_same_records_either_way_as_the_model_does(tmp_path_factory) -> None:
    levels, sweep = _catalog(tmp_path_factory, 1), _catalog(tmp_path_factory, 1)
    for catalog in (levels, sweep):
        _replay(catalog, ISSUE_CASE, 1)
    modelled, first_uncleanable = _model_of_the_sweep(sweep, 1)
    assert first_uncleanable == {0: 1}  # the young record's: settling cut its section there

    run_and_commit(sweep, full_sweep(sweep.planning_snapshot(NOW), NOW), NOW)
    _until_idle(levels, NOW)  # the last file's L1 to L2 plan leaves the young record's L2 file out
    assert [f.level for f in levels.snapshot().files()] == [2, 2, 2]  # settled: a@0, y@1 (young, cut apart); then a@2-3
    expected = [(0, b"a", b"1", NOW - 20_000), (1, b"y", b"2", NOW - 300), (2, b"a", b"2", NOW - 20_000), (3, b"a", b"3", NOW - 20_000)]
    assert _survivors(levels, 1)[0] == _survivors(sweep, 1)[0] == modelled[0] == expected


@pytest.mark.parametrize("age", [LAG_MS + 1, LAG_MS - 1])
def test_a_young_record_in_a_file_no_plan_takes_still_protects_the_partition(tmp_path_factory, age: int) -> None:
    """The catalog's first uncleanable offset comes from every live section outside a plan. Settled while y was
    young, its record sits in a section of its own: the boundary is y's offset, not its file's first."""
    catalog = _catalog(tmp_path_factory, 1)
    _replay(catalog, [("produce", [(0, b"a", b"1", 20_000), (0, b"y", b"2", age)]), ("settle",)], 1)
    snapshot = catalog.snapshot()
    (_, old), (key, young) = snapshot.sections_of("state", 0)
    assert [(old.first_offset, old.last_offset), (young.first_offset, young.last_offset)] == [(0, 0), (1, 1)]
    assert snapshot.first_uncleanable_offsets([("state", 0)], NOW) == ({} if age > LAG_MS else {("state", 0): 1})
    _replay(catalog, [("produce", [(0, b"a", b"2", 20_000), (0, b"a", b"3", 20_000)])], 1)
    (plan,) = level_plans(catalog.planning_snapshot(NOW), NOW, 1)
    assert key not in {f.key for f in plan.inputs}
    assert plan.first_uncleanable == ({} if age > LAG_MS else {("state", 0): 1})


@pytest.mark.parametrize("compactions", [["--full"], ["--until-idle --min-files 1"], ["--until-idle --min-files 1", "--full"]])
def test_the_table_of_issue_23_reads_1_2_in_every_row(tmp_path, compactions: list[str]) -> None:
    """Three produce calls at T under a 60 s min lag: k=old1 and k=old2 ten minutes old, z=young at T. At T+1 s,
    whether level passes copy the young file up with the old ones first or not, k@0 goes: its section ends
    before the young record."""
    from click.testing import CliRunner

    from logcompact.cli import cli

    def logcompact(now: int, *args: str, stdin: str = "") -> str:
        done = CliRunner().invoke(cli, ["--store", f"file://{tmp_path}", "--now", str(now), *args], input=stdin)
        assert done.exit_code == 0, done.output
        return done.output

    logcompact(NOW, "topic", "create", "t", "--partitions", "1", "--config", "cleanup.policy=compact",
               "--config", "min.compaction.lag.ms=60000")
    for key, value, timestamp in (("k", "old1", NOW - 600_000), ("k", "old2", NOW - 600_000), ("z", "young", NOW)):
        logcompact(NOW, "produce", "t", stdin=json.dumps({"partition": 0, "key": key, "value": value, "timestamp": timestamp}))
    for compaction in compactions:
        logcompact(NOW + 1_000, "compact", *compaction.split())
    consumed = [json.loads(line) for line in logcompact(NOW + 1_000, "consume", "t", "--partition", "0").splitlines()]
    assert [(r["offset"], r["key"], r["value"]) for r in consumed] == [(1, "k", "old2"), (2, "z", "young")]


AGED = NOW + 2 * LAG_MS  # every record is past its min lag


def _model_of_a_regular_pass(catalog: Catalog, partitions: int, now: int) -> dict[int, list[tuple]]:
    """What the reference model keeps when Kafka's cleaner manager looks at each partition once at `now`: the
    catalog's sections as its segments (the base below the checkpoint when `clean_below_delta` covers it), and a
    job over the cleaning range of each partition whose cleanable ratio, by records, is more than the topic's."""
    snapshot = catalog.snapshot()
    config = snapshot.topics["state"].config
    kept = {}
    for p in range(partitions):
        live = [ModelRecord(r.offset, r.key, r.value, r.timestamp) for r in read_records(catalog.store, snapshot, "state", p)]
        sections = [section for _, section in snapshot.sections_of("state", p)]
        segments = []
        for section in sections:
            held = [r for r in live if section.first_offset <= r.offset <= section.last_offset]
            segments.append(ModelSegment(section.first_offset, section.last_offset, len(held), max(r.timestamp for r in held)))
        assert sum(s.size for s in segments) == len(live), f"partition {p}: sections interleave"
        model = ReferenceLog()
        for segment in segments:
            model.produce("state", p, [r for r in live if segment.first <= r.offset <= segment.last])
        base_clean = bool(sections) and sections[0].info.clean_below_delta > sections[0].info.last_delta
        ratio, taken = cleanable(segments, base_clean, config, now)
        if ratio > config.min_cleanable_dirty_ratio:
            offsets = {r.offset for r in live if any(s.first <= r.offset <= s.last for s in taken)}
            model.compact({("state", p): offsets}, {"state": config}, now, deduplicate=True)
        kept[p] = [(r.offset, r.key, r.value, r.timestamp) for r in model.records("state", p)]
    return kept


@settings(max_examples=30)
@given(st.integers(1, 3), programs, st.sampled_from(["0", "1"]), st.sampled_from([NOW, AGED]))
@example(1, ISSUE_CASE, "0", AGED)
@example(1, ISSUE_CASE, "1", AGED)
# Partition 1's cleaning range takes whole files holding partition 0's sections around its young one: the plan takes
# the young one's file too, or its output would span offsets that file holds.
@example(3, [("produce", [(0, b"a", None, 20_000)]), ("produce", [(0, b"a", None, 800), (1, b"a", None, 20_000)]), ("settle",),
             ("produce", [(0, b"a", None, 20_000), (1, b"a", None, 20_000)])], "0", NOW)
def test_a_regular_pass_deduplicates_what_min_lag_held_back_once_it_ages_when_the_dirty_ratio_passes(
    tmp_path_factory, partitions: int, program: list[tuple], ratio: str, now: int
) -> None:
    """Settled into the levels (everything at L2, young records in sections of their own), one regular pass with no
    level plan due keeps what Kafka's cleaner manager and cleaner keep (the model). At ratio 0 anything cleanable
    passes: at AGED, when nothing is young any more, that is what a full sweep keeps, the records min lag held back
    deduplicated; at NOW the young ones are untouched. At ratio 1 nothing passes: the pass plans nothing."""
    catalog = _catalog(tmp_path_factory, partitions, min_cleanable_dirty_ratio=ratio)
    _replay(catalog, [*program, ("settle",)], partitions)
    assert {f.level for f in catalog.snapshot().files()} <= {2}
    before = _survivors(catalog, partitions)
    modelled = _model_of_a_regular_pass(catalog, partitions, now)
    swept, _ = _model_of_the_sweep(catalog, partitions, now)

    plans = choose_plans(catalog.planning_snapshot(now), now, "regular", PlannerConfig(tier_min_files=1000))
    for plan in plans:
        run_and_commit(catalog, plan, now)
    after = _survivors(catalog, partitions)
    assert after == modelled
    if ratio == "1":
        assert plans == [] and after == before
    elif now == AGED:
        assert after == swept


@pytest.mark.parametrize("ratio, aged_survivors", [("0.5", [(1, b"y"), (3, b"a")]), ("0.8", [(0, b"a"), (1, b"y"), (2, b"a"), (3, b"a")])])
def test_the_reported_case_is_deduplicated_by_a_regular_pass_once_y_ages_if_the_ratio_passes(
    tmp_path_factory, ratio: str, aged_survivors: list[tuple]
) -> None:
    """Settled: a@0 (clean base, 50 B), y@1 (young, 50 B), a@2-3 (not deduplicated: after the first uncleanable
    offset, 100 B). While y is young nothing is cleanable; once it ages 150 of 200 bytes are: 0.75, more than
    Kafka's default 0.5 but not more than 0.8, where the duplicates wait for the sweep."""
    catalog = _catalog(tmp_path_factory, 1, min_cleanable_dirty_ratio=ratio)
    _replay(catalog, [*ISSUE_CASE, ("settle",)], 1)
    sections = [(s.first_offset, s.last_offset, s.info.uncompressed_bytes) for _, s in catalog.snapshot().sections_of("state", 0)]
    assert sections == [(0, 0, 50), (1, 1, 50), (2, 3, 100)]
    assert choose_plans(catalog.planning_snapshot(NOW), NOW) == []
    for plan in choose_plans(catalog.planning_snapshot(AGED), AGED):
        run_and_commit(catalog, plan, AGED)
    assert [(r[0], r[1]) for r in _survivors(catalog, 1)[0]] == aged_survivors
