"""Plans are checked, never trusted: an edited plan is refused before it runs or commits, and nothing is written.

The first three are the edits the fault campaign committed before these checks (docs/plan.md lists every rule)."""

from __future__ import annotations

import copy

import pytest

from logcompact.catalog import Catalog
from logcompact.consume import latest_values
from logcompact.engine.commit import run_and_commit
from logcompact.engine.exchange import plan_key
from logcompact.engine.plan import Plan
from logcompact.exceptions import CommitConflictError, InvalidPlanError
from logcompact.ingest import Agent, Record
from logcompact.orchestration import commit_plans
from tests.helpers import NOW, create_topic, full_sweep

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
    # Within state's min lag: every partition's first uncleanable offset is 0.
    return full_sweep(catalog.planning_snapshot(NOW + 500), NOW + 500).to_dict()


def _edited(document: dict, edit) -> Plan:
    edited = copy.deepcopy(document)
    edit(edited)
    return Plan.from_dict(edited)


def _drop_partitions(document: dict) -> None:
    for data_file in document["inputs"]:
        data_file["sections"] = [s for s in data_file["sections"] if s["topic"] != "state" or s["partition"] == 0]


def _delete_policy(document: dict) -> None:
    for topic in document["topics"]:
        topic["config"].update({"cleanup.policy": "delete", "retention.ms": 1}) if topic["name"] == "state" else None


def _far_clock(document: dict) -> None:
    document["now_ms"] = 2**62


def _old_clock(document: dict) -> None:
    document["now_ms"] -= 2 * HOUR


def _no_uncleanable(document: dict) -> None:
    document["first_uncleanable"] = []


EDITS = [
    (_drop_partitions, InvalidPlanError, "differs from the catalog's record of it"),
    (_delete_policy, CommitConflictError, "expected topic state with 4 partitions and .*'cleanup.policy': 'delete'"),
    (_far_clock, InvalidPlanError, "a plan runs and commits within 60 minutes after its clock"),
    (_old_clock, InvalidPlanError, "a plan runs and commits within 60 minutes after its clock"),
    (_no_uncleanable, InvalidPlanError, "the first uncleanable offset of state/0 is none, the catalog's 0"),
]
REFUSED_AT_READ = [
    (lambda d: d.update(plan_id="p1/../../x"), "plan_id 'p1/../../x' is not p<clock ms>-<12 hex digits>"),
    (lambda d: d.update(buffer_bytes=10**15), "'buffer_bytes' is 1000000000000000: must be an integer, 40 to 2147483648"),
    (lambda d: d.update(target_file_bytes=0), "'target_file_bytes' is 0: must be an integer, 1 to"),
    (lambda d: d["inputs"][0].update(key="data/l3/" + d["inputs"][0]["key"].rsplit("/", 1)[1]), "is not a data file of level 0"),
    (lambda d: d["inputs"][0].update(key="data/l0/../../etc.seg"), "is not a data file of level 0"),
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
    assert run_and_commit(catalog, Plan.from_dict(document), NOW + 500) is not None  # the plan as made runs


@pytest.mark.parametrize(("edit", "message"), REFUSED_AT_READ)
def test_a_malformed_plan_field_is_refused_when_read(catalog: Catalog, edit, message) -> None:
    document = _cluster(catalog)
    edited = copy.deepcopy(document)
    edit(edited)
    with pytest.raises(InvalidPlanError, match=message):
        Plan.from_dict(edited)


def test_an_edited_stored_plan_commits_nothing(catalog: Catalog) -> None:
    """The Spark path: the planner seals the stored documents with the plan's lease; an edit breaks the seal."""
    import json

    from logcompact.engine.cleaner import run_plan
    from logcompact.engine.exchange import group_key, read_group, write_group_result
    from logcompact.orchestration import prepare_plans
    from logcompact.planner import PlannerConfig

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
