"""Plans are checked, never trusted: an edited plan is refused before it runs or commits, and nothing is written.

The first three are the edits the fault campaign committed before these checks (docs/plan.md lists every rule);
each is refused with one line, and the store and the catalog are as they were. A plan may be more conservative
than the catalog (a lower outside floor or first uncleanable offset keeps more), never less."""

from __future__ import annotations

import copy

import pytest

from logcompact.catalog import Catalog
from logcompact.consume import latest_values
from logcompact.exceptions import CommitConflictError, InvalidPlanError
from logcompact.ingest import Agent, Record
from logcompact.jobs import commit_plans, run_and_commit
from logcompact.keys import plan_key
from logcompact.plans import Plan, plan_from_dict, plan_from_json, plan_to_dict
from tests.helpers import NOW, create_topic, full_sweep, level_plans

HOUR = 3_600_000


def _cluster(catalog: Catalog) -> dict:
    create_topic(catalog, "state", partitions=4, cleanup_policy="compact", min_compaction_lag_ms="1000")
    create_topic(catalog, "events", partitions=1, cleanup_policy="delete", retention_ms=str(24 * HOUR))
    for round_number in range(3):
        with Agent(catalog, background=False, clock=lambda: NOW) as agent:
            agent.produce("state", [Record(p, b"k%d" % k, b"v%d-%d" % (round_number, k), NOW) for p in range(4) for k in range(12)])
            agent.produce("events", [Record(0, None, b"e%d" % round_number, NOW)])
    with Agent(catalog, background=False, clock=lambda: NOW) as agent:  # a stamped tombstone's key, outside later plans
        agent.produce("state", [Record(0, b"gone", None, NOW)])
    # Within state's min lag: the sweep takes every file, so the engine finds each partition's first young record.
    return plan_to_dict(full_sweep(catalog.planning_snapshot(NOW + 500), NOW + 500))


def _edited(document: dict, edit) -> Plan:
    edited = copy.deepcopy(document)
    edit(edited)
    return plan_from_dict(edited)


def _drop_partitions(document: dict) -> None:
    for data_file in document["inputs"]:
        data_file["sections"] = [s for s in data_file["sections"] if s["topic"] != "state" or s["partition"] == 0]


def _delete_policy(document: dict) -> None:
    for topic in document["topics"]:
        if topic["name"] == "state":
            topic["config"].update({"cleanup.policy": "delete", "retention.ms": 1})


def _far_clock(document: dict) -> None:
    document["now_ms"] = 2**62


def _old_clock(document: dict) -> None:
    document["now_ms"] -= HOUR + 1


EDITS = [
    (_drop_partitions, InvalidPlanError, "differs from the catalog's record of it"),
    (_delete_policy, CommitConflictError, "expected topic state with 4 partitions and .*'cleanup.policy': 'delete'"),
    (_far_clock, InvalidPlanError, "a plan runs and commits within 60 minutes after its clock"),
    (_old_clock, InvalidPlanError, "a plan runs and commits within 60 minutes after its clock"),
]
REFUSED_AT_READ = [
    (lambda d: d.update(plan_id="p1/../../x"), "plan_id 'p1/../../x' is not p<clock ms>-<12 hex digits>"),
    (lambda d: d.update(buffer_bytes=10**15), "'buffer_bytes' is 1000000000000000: must be an integer, 40 to 2147483648"),
    (lambda d: d.update(target_file_bytes=0), "'target_file_bytes' is 0: must be an integer, 1 to"),
    (lambda d: d["inputs"][0].update(key="data/l3/" + d["inputs"][0]["key"].rsplit("/", 1)[1]), "is not a data file of level 0"),
    (lambda d: d["inputs"][0].update(key="data/l0/../../etc.seg"), "is not a data file of level 0"),
    (lambda d: d["inputs"][0].update(key="secrets/" + d["inputs"][0]["key"].rsplit("/", 1)[1]), "is not a data file of level 0"),
    (lambda d: d["inputs"][0].update(key="data//l0/x.seg"), "is not a data file of level 0"),
]


def _state(catalog: Catalog) -> tuple:
    return catalog.latest_version(), sorted(info.key for info in catalog.store.list(""))


@pytest.mark.parametrize(("edit", "error", "message"), EDITS, ids=[e[0].__name__ for e in EDITS])
def test_an_edited_plan_is_refused_and_nothing_is_written(catalog: Catalog, edit, error, message) -> None:
    document = _cluster(catalog)
    plan = _edited(document, edit)
    before = _state(catalog)
    with pytest.raises(error, match=message):
        run_and_commit(catalog, plan, NOW + 500)
    assert _state(catalog) == before
    assert run_and_commit(catalog, plan_from_dict(document), NOW + 500) is not None  # the plan as made runs


@pytest.mark.parametrize(("edit", "message"), REFUSED_AT_READ)
def test_a_malformed_plan_field_is_refused_when_read(catalog: Catalog, edit, message) -> None:
    document = _cluster(catalog)
    edited = copy.deepcopy(document)
    edit(edited)
    with pytest.raises(InvalidPlanError, match=message):
        plan_from_dict(edited)


# Fields a plan may leave out: the per-partition offsets and set-aside list (none), the mode and compression (their
# defaults) and any topic config (its default).
OPTIONAL_FIELDS = {("outside_floors",), ("first_uncleanable",), ("aborted",), ("set_aside",), ("mode",), ("compression",)}
# What the refusal says where it is not the field's name: a document with groups and no inputs is a stored plan's header.
SAYS = {("missing", "inputs"): "this is the header of a stored plan"}


def _field_paths(document: dict) -> list[tuple]:
    """Every field of a plan document: its own, and those of its first topic (with its configs), group, input and
    section."""
    first = {"topics": document["topics"][0], "groups": document["groups"][0], "inputs": document["inputs"][0]}
    paths = [(name,) for name in document if name != "format"]
    paths += [(list_name, 0, name) for list_name, entry in first.items() for name in entry]
    paths += [("topics", 0, "config", name) for name in first["topics"]["config"]]
    paths += [("inputs", 0, "sections", 0, name) for name in first["inputs"]["sections"][0]]
    return paths


def _misshapen(value):
    """A value of another JSON shape than `value`'s."""
    return [] if isinstance(value, dict) else {"x": 1}


def test_every_missing_or_misshapen_plan_field_is_named_in_words(catalog: Catalog) -> None:
    document = _cluster(catalog)
    python_errors = ("KeyError", "TypeError", "ValueError", "AttributeError", "malformed")
    checked, unnamed = 0, []
    for path in _field_paths(document):
        *parents, name = path
        for change in ("missing", "misshapen"):
            edited = copy.deepcopy(document)
            holder = edited
            for step in parents:
                holder = holder[step]
            if change == "missing":
                del holder[name]
                if tuple(path) in OPTIONAL_FIELDS or parents[-1:] == ["config"]:
                    plan_from_dict(edited)  # a default stands in
                    continue
            else:
                holder[name] = _misshapen(holder[name])
            with pytest.raises(InvalidPlanError) as refused:
                plan_from_dict(edited)
            message = str(refused.value)
            named = f"{name}=" if parents[-1:] == ["config"] else repr(name)  # a config as the CLI names it
            says = SAYS.get((change, *path), f"{name!r} is missing" if change == "missing" else named)
            if says not in message or any(word in message for word in python_errors):
                unnamed.append(f"{change} {path}: {message}")
            checked += 1
    assert not unnamed, "\n".join(unnamed)
    assert checked > 60


def test_json_nested_deep_is_one_line(catalog: Catalog) -> None:
    for text in ("[" * 100_000 + "]" * 100_000, '{"a":' * 100_000 + "1" + "}" * 100_000):
        with pytest.raises(InvalidPlanError, match="^plan: JSON nested too deep to be a plan; plan again$"):
            plan_from_json(text)


def _level_plan(catalog: Catalog, first_age: int = HOUR) -> dict:
    """An L1 to L2 plan that leaves an older L2 file out: its outside floors are that file's first offsets (0).
    The records of that file are `first_age` old, the plan's an hour."""
    create_topic(catalog, "state", partitions=2, cleanup_policy="compact", min_compaction_lag_ms="1000")
    for steps, age in ((2, first_age), (1, HOUR)):  # the first file to L2 (L0 to L1, L1 to L2), the second to L1
        with Agent(catalog, background=False, clock=lambda: NOW) as agent:
            agent.produce("state", [Record(p, b"k%d" % k, b"v%d" % k, NOW - age) for p in range(2) for k in range(6)])
        for _ in range(steps):
            (step,) = level_plans(catalog.planning_snapshot(NOW), NOW, 1)
            run_and_commit(catalog, step, NOW)
    (plan,) = level_plans(catalog.planning_snapshot(NOW), NOW, 1)
    assert plan.target_level == 2 and plan.deduplicate and plan.outside_floors == {("state", 0): 0, ("state", 1): 0}
    # The plan's own records are older than the lag: only a young file outside it sets a first uncleanable offset.
    assert plan.first_uncleanable == ({} if first_age > 1000 else {("state", 0): 0, ("state", 1): 0})
    return plan_to_dict(plan)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(outside_floors=[]), "the outside floor of state/0 is none, the catalog's 0"),
        (lambda d: d.update(outside_floors=[[t, p, o + 3] for t, p, o in d["outside_floors"]]), "the outside floor of state/0 is 3, the catalog's 0"),
    ],
    ids=["floors_removed", "floors_raised"],
)
def test_edited_outside_floors_are_refused_and_nothing_is_written(catalog: Catalog, edit, message) -> None:
    document = _level_plan(catalog)
    before = _state(catalog)
    with pytest.raises(InvalidPlanError, match=message):
        run_and_commit(catalog, _edited(document, edit), NOW)
    assert _state(catalog) == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(first_uncleanable=[]), "the first uncleanable offset of state/0 is none, the catalog's 0"),
        (lambda d: d.update(first_uncleanable=[[t, p, o + 5] for t, p, o in d["first_uncleanable"]]),
         "the first uncleanable offset of state/0 is 5, the catalog's 0: a plan may not go below what the catalog protects"),
    ],
    ids=["uncleanable_removed", "uncleanable_raised"],
)
def test_edited_first_uncleanable_offsets_are_refused_and_nothing_is_written(catalog: Catalog, edit, message) -> None:
    document = _level_plan(catalog, first_age=0)  # the L2 file outside the plan is young
    before = _state(catalog)
    with pytest.raises(InvalidPlanError, match=message):
        run_and_commit(catalog, _edited(document, edit), NOW)
    assert _state(catalog) == before
    assert run_and_commit(catalog, plan_from_dict(document), NOW).to_dict()["young_kept"] == 12  # the plan as made runs


def test_a_plan_more_conservative_than_the_catalog_runs(catalog: Catalog) -> None:
    """A first uncleanable offset the catalog does not ask for only keeps more: from it on, nothing is deduplicated."""
    document = _level_plan(catalog)
    result = run_and_commit(catalog, _edited(document, lambda d: d.update(first_uncleanable=[["state", 0, 0]])), NOW)
    assert result is not None and result.to_dict()["young_kept"] == 6  # partition 0's records in the plan


def test_an_edited_stored_plan_commits_nothing(catalog: Catalog) -> None:
    """The Spark path: the planner seals the stored documents with the plan's lease; an edit breaks the seal."""
    import json

    from logcompact.engine.cleaner import run_plan
    from logcompact.jobs import prepare_plans
    from logcompact.keys import group_key
    from logcompact.planner import PlannerConfig
    from logcompact.plans import read_group, write_group_result

    _cluster(catalog)
    (plan_id,) = prepare_plans(catalog, "full", NOW + 500, PlannerConfig()).plan_ids
    write_group_result(catalog.store, plan_id, 0, [run_plan(catalog.store, read_group(catalog.store, plan_id, 0))])
    header = catalog.store.get(plan_key(plan_id))
    edited = json.loads(header)
    for topic in edited["topics"]:
        topic["config"].update({"cleanup.policy": "delete", "retention.ms": 1})
    group = catalog.store.get(group_key(plan_id, 0))
    version = catalog.latest_version()
    for key, document in ((plan_key(plan_id), json.dumps(edited).encode()), (group_key(plan_id, 0), group[:-1] + b"\0")):
        catalog.store.put(key, document)
        with pytest.raises(InvalidPlanError, match=f"plan {plan_id}: its documents in .* were changed since; plan again"):
            commit_plans(catalog, [plan_id], NOW + 500)
        assert catalog.latest_version() == version
    catalog.store.put(plan_key(plan_id), header)
    catalog.store.put(group_key(plan_id, 0), group)
    assert commit_plans(catalog, [plan_id], NOW + 500).committed == [plan_id]  # the plan as sealed commits
    assert len(latest_values(catalog.store, catalog.snapshot(), "state", 1)) == 12


def test_a_stored_plan_edited_to_cover_one_partition_commits_nothing(catalog: Catalog) -> None:
    """The campaign's first edit on the Spark path: the stored documents rewritten, well formed, to hold partition
    0 only, and the job run on them; the commit (which alone would replace the whole input files) refuses."""
    from logcompact.engine.cleaner import run_plan
    from logcompact.jobs import prepare_plans
    from logcompact.planner import PlannerConfig
    from logcompact.plans import read_group, read_plan, write_group_result, write_plan

    _cluster(catalog)
    (plan_id,) = prepare_plans(catalog, "full", NOW + 500, PlannerConfig()).plan_ids
    write_plan(catalog.store, _edited(plan_to_dict(read_plan(catalog.store, plan_id)), _drop_partitions))
    write_group_result(catalog.store, plan_id, 0, [run_plan(catalog.store, read_group(catalog.store, plan_id, 0))])
    before = _state(catalog)
    with pytest.raises(InvalidPlanError, match=f"plan {plan_id}: its documents in .* were changed since; plan again"):
        commit_plans(catalog, [plan_id], NOW + 500)
    assert _state(catalog) == before
    assert all(len(latest_values(catalog.store, catalog.snapshot(), "state", p)) == 12 for p in range(4))
