"""Plans and job results kept in the store, so a scheduler and remote workers share nothing else.

A scheduler writes a plan to `plans/{plan_id}/plan.json`; the job of each group runs its slices and then
writes one object, `plans/{plan_id}/results/g{group}.json`, holding every slice's outputs and stats (never
record data): a group's result exists whole or not at all. The commit reads the results, checks that
every group of the plan has one, and commits the plan once (`logcompact.orchestration.commit_plans`). A retried group writes the same outputs and
result again.
"""

from __future__ import annotations

import json

from logcompact.engine.plan import PLANS_PREFIX, Plan
from logcompact.engine.stats import JobResult
from logcompact.exceptions import CommitConflictError, ObjectNotFoundError
from logcompact.planner.groups import split_into_groups
from logcompact.store.base import ObjectStore


def plan_key(plan_id: str) -> str:
    return f"{PLANS_PREFIX}{plan_id}/plan.json"


def result_key(plan_id: str, group: int) -> str:
    return f"{PLANS_PREFIX}{plan_id}/results/g{group:03d}.json"


def write_plan(store: ObjectStore, plan: Plan) -> str:
    key = plan_key(plan.plan_id)
    store.put(key, plan.to_json().encode())
    return key


def read_plan(store: ObjectStore, plan_id: str) -> Plan:
    key = plan_key(plan_id)
    try:
        return Plan.from_json(store.get(key).decode(), key)
    except ObjectNotFoundError:
        raise ObjectNotFoundError(f"no plan {plan_id} in {store.uri} (expected {key}); plan again") from None


def write_group_result(store: ObjectStore, plan_id: str, group: int, slices: list[JobResult]) -> str:
    """One group's result: the results of all its slices, in one object."""
    key = result_key(plan_id, group)
    document = {"plan_id": plan_id, "group": group, "slices": [r.to_dict() for r in slices]}
    store.put(key, json.dumps(document, separators=(",", ":")).encode())
    return key


def read_results(store: ObjectStore, plan: Plan, group_bytes: int) -> list[JobResult]:
    """Every result of the plan; a group with no result is a CommitConflictError naming it."""
    results, groups = [], set()
    for info in store.list(f"{PLANS_PREFIX}{plan.plan_id}/results/"):
        document = json.loads(store.get(info.key))
        groups.add(document["group"])
        results += [JobResult.from_dict(r) for r in document["slices"]]
    expected = {group.group for group in split_into_groups(plan, group_bytes)}
    missing = sorted(expected - groups)
    if missing:
        raise CommitConflictError(
            f"plan {plan.plan_id}: no result for group(s) {', '.join(map(str, missing))}; run those groups, then commit"
        )
    return results


def group_done(store: ObjectStore, plan_id: str, group: int) -> bool:
    """Whether a group's result is in the store with every output it names (gc may have taken them since)."""
    try:
        document = json.loads(store.get(result_key(plan_id, group)))
    except ObjectNotFoundError:
        return False
    return all(store.stat(f["key"]) is not None for r in document["slices"] for f in r["outputs"])
