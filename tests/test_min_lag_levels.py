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
removed records after a young record they did not take (issue 11); the crafted case below is that report.
Before compactions cut their output at the first young record, level passes merged a young record's section
with older ones, moving the first uncleanable offset down to their start (issue 23); its table is the last test.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from logcompact.catalog import Catalog
from logcompact.consume import read_records
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic, full_sweep, level_plans
from tests.reference_model import ModelRecord, ReferenceLog, first_young

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

# The report of issue 11: the young record (offset 1) settles into an L2 file; the next L1 to L2 plan takes
# only the file of offsets 2 and 3, and used to remove offset 2 as superseded by offset 3.
ISSUE_CASE = [
    ("produce", [(0, b"a", b"1", 20_000), (0, b"y", b"2", 300)]),
    ("settle",),
    ("produce", [(0, b"a", b"2", 20_000), (0, b"a", b"3", 20_000)]),
]


def _catalog(tmp_path_factory, partitions: int) -> Catalog:
    catalog = Catalog(LocalStore(tmp_path_factory.mktemp("minlag")))
    create_topic(catalog, "state", partitions=partitions, **CONFIG)
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


def _model_of_the_sweep(catalog: Catalog, partitions: int) -> tuple[dict[int, list[tuple]], dict[int, int]]:
    """What the reference model keeps of one job over every live record at NOW, and each partition's first
    uncleanable offset: its first young record's (a partition without one: past its last record)."""
    snapshot = catalog.snapshot()
    config = snapshot.topics["state"].config
    model, job, first = ReferenceLog(), {}, {}
    for p in range(partitions):
        live = [ModelRecord(r.offset, r.key, r.value, r.timestamp) for r in read_records(catalog.store, snapshot, "state", p)]
        model.produce("state", p, live)
        job[("state", p)] = {r.offset for r in live}
        young = first_young(live, config, NOW)
        first[p] = young if young is not None else 1 << 62
    model.compact(job, {"state": config}, NOW, deduplicate=True)
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
