"""A plan's documents and its groups' results kept in the store, so a scheduler and remote workers share
nothing else.

A scheduler writes a plan under `plans/{plan_id}/`: one Arrow document per group, `groups/g{group}.arrow`, then
its header, the input files `inputs.arrow` and last `plan.json` (docs/plan.md), so a plan whose `plan.json` is
there has all its documents. The job of a group reads its group document and the input files (never the other
groups' sections), runs its slices and then writes one object, `results/g{group}.json`, holding every slice's
outputs and stats (never record data): a group's result exists whole or not at all. The commit reads the header
and the results, checks that every group of the plan has one, and commits the plan once
(`logcompact.jobs.commit_plans`). A retried group writes the same outputs and result again.

A run that fails after leasing releases its plans in the catalog; when the catalog cannot be reached then (the
database went away during the commit), it writes `abandoned.json` beside the plan instead (`write_abandoned`),
and `logcompact.jobs.release_abandoned` releases those plans once the catalog answers again, rather than leaving
their files leased until the lease expires.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Collection

from logcompact.catalog import TopicPartition
from logcompact.collector import collector_paused
from logcompact.exceptions import CommitConflictError, InvalidPlanError, ObjectNotFoundError
from logcompact.keys import (
    ABANDONED_NAME,
    PLANS_PREFIX,
    abandoned_key,
    group_key,
    inputs_key,
    plan_key,
    result_key,
)
from logcompact.plans.arrow_form import decode_group, decode_header, encode_groups, encode_header, group_partition_bytes
from logcompact.plans.json_form import header_cluster_id
from logcompact.plans.model import Plan, PlanHeader
from logcompact.plans.results import JobResult
from logcompact.store.base import ObjectStore


def plan_documents(plan: Plan, prefix: str = PLANS_PREFIX) -> list[tuple[str, bytes]]:
    """The plan's stored documents, (key, bytes), in the order they are written: its groups, then its inputs, and
    `plan.json` last, so a plan whose `plan.json` is there has all its documents."""
    with collector_paused():
        header, inputs = encode_header(plan.header())
        documents = [(group_key(plan.plan_id, g.group, prefix), d) for g, d in zip(plan.groups, encode_groups(plan))]
    return documents + [(inputs_key(plan.plan_id, prefix), inputs), (plan_key(plan.plan_id, prefix), header)]


def write_documents(store: ObjectStore, documents: list[tuple[str, bytes]]) -> int:
    """Write a plan's documents (`plan_documents`) in order; returns the bytes written."""
    for key, document in documents:
        store.put(key, document)
    return sum(len(document) for _, document in documents)


def write_plan(store: ObjectStore, plan: Plan, prefix: str = PLANS_PREFIX) -> int:
    """Write the plan's documents; returns the bytes written. `prefix` places the plan elsewhere than the
    cluster's plans (`logcompact plan --out`)."""
    return write_documents(store, plan_documents(plan, prefix))


def seal(documents: list[tuple[str, bytes]]) -> str:
    """The SHA-256 of a plan's documents (keys, lengths and bytes, in key order): what the catalog keeps with
    the plan's lease."""
    digest = hashlib.sha256()
    for key, document in sorted(documents):
        digest.update(f"{key}\n{len(document)}\n".encode())
        digest.update(document)
    return digest.hexdigest()


def check_seal(store: ObjectStore, header: PlanHeader, expected: str | None) -> None:
    """The stored plan's documents are those sealed when it was leased (its header names them all)."""
    if expected is None:
        raise CommitConflictError(f"plan {header.plan_id} holds no lease with a seal of its documents (expired or never leased); plan again")
    keys = [group_key(header.plan_id, g.group) for g in header.groups] + [inputs_key(header.plan_id), plan_key(header.plan_id)]
    found = seal([(key, _get(store, key, f"plan {header.plan_id} lost a document")) for key in keys])
    if found != expected:
        raise InvalidPlanError(
            f"plan {header.plan_id}: its documents in {store.uri} have SHA-256 {found[:16]}..., the catalog sealed "
            f"{expected[:16]}... when it was leased: they were changed since; plan again"
        )


def read_header(store: ObjectStore, plan_id: str, prefix: str = PLANS_PREFIX) -> PlanHeader:
    key = plan_key(plan_id, prefix)
    header = _get(store, key, f"no plan {plan_id}")
    return decode_header(header, _get(store, inputs_key(plan_id, prefix), f"plan {plan_id} lists no inputs"), key)


def read_cluster_id(store: ObjectStore, plan_id: str, prefix: str = PLANS_PREFIX) -> str:
    """The cluster of a stored plan, from its `plan.json` alone (not its input list, which grows with the plan)."""
    key = plan_key(plan_id, prefix)
    return header_cluster_id(_get(store, key, f"no plan {plan_id}"), key)


def read_group(
    store: ObjectStore,
    plan_id: str,
    group: int,
    partitions: Collection[TopicPartition] | None = None,
    slice: int = 0,
    prefix: str = PLANS_PREFIX,
) -> Plan:
    """The piece of the plan that group `group` runs (or slice `slice` of it: the sections of `partitions`), from
    its group document and the plan's input files."""
    key = group_key(plan_id, group, prefix)
    document = _get(store, key, f"plan {plan_id} has no group {group}")
    return decode_group(document, _get(store, inputs_key(plan_id, prefix), f"plan {plan_id} lists no inputs"), key, partitions, slice)


def read_partition_bytes(store: ObjectStore, plan_id: str, group: int) -> dict[TopicPartition, int]:
    """Per topic-partition of a group, the uncompressed bytes of its sections: what a job deals its slices by."""
    key = group_key(plan_id, group)
    return group_partition_bytes(_get(store, key, f"plan {plan_id} has no group {group}"), key)


def read_plan(store: ObjectStore, plan_id: str, prefix: str = PLANS_PREFIX) -> Plan:
    """The whole plan: its header with every group's sections and floors put back together."""
    header = read_header(store, plan_id, prefix)
    pieces = [read_group(store, plan_id, group.group, prefix=prefix) for group in header.groups]
    return Plan.from_pieces(header, pieces, plan_key(plan_id, prefix))


def write_group_result(store: ObjectStore, plan_id: str, group: int, slices: list[JobResult]) -> str:
    """One group's result: the results of all its slices, in one object."""
    key = result_key(plan_id, group)
    document = {"plan_id": plan_id, "group": group, "slices": [r.to_dict() for r in slices]}
    store.put(key, json.dumps(document, separators=(",", ":")).encode())
    return key


def read_results(store: ObjectStore, header: PlanHeader) -> list[JobResult]:
    """The results of every group of the plan; a group with no result is a CommitConflictError naming it."""
    results, missing = [], []
    for group in header.groups:
        try:
            document = json.loads(store.get(result_key(header.plan_id, group.group)))
        except ObjectNotFoundError:
            missing.append(group.group)
            continue
        results += [JobResult.from_dict(r) for r in document["slices"]]
    if missing:
        raise CommitConflictError(
            f"plan {header.plan_id}: no result for group(s) {', '.join(map(str, missing))}; run those groups, then commit"
        )
    return results


def group_done(store: ObjectStore, plan_id: str, group: int) -> bool:
    """Whether a group's result is in the store with every output it names (gc may have taken them since)."""
    try:
        document = json.loads(store.get(result_key(plan_id, group)))
    except ObjectNotFoundError:
        return False
    return all(store.stat(f["key"]) is not None for r in document["slices"] for f in r["outputs"])


def write_abandoned(store: ObjectStore, plan_id: str, now_ms: int, reason: str) -> str:
    """Record in the store that a failed run gave up plan `plan_id` without releasing it in the catalog; the key."""
    key = abandoned_key(plan_id)
    store.put(key, json.dumps({"plan_id": plan_id, "abandoned_ms": now_ms, "reason": reason}, separators=(",", ":")).encode())
    return key


def abandoned_plans(store: ObjectStore) -> list[str]:
    """The plans recorded as abandoned (`write_abandoned`) and not released since, in id order."""
    suffix = f"/{ABANDONED_NAME}"
    return sorted(
        info.key[len(PLANS_PREFIX) : -len(suffix)] for info in store.list(PLANS_PREFIX)
        if info.key.endswith(suffix) and info.key.count("/") == 2
    )


def _get(store: ObjectStore, key: str, missing: str) -> bytes:
    try:
        return store.get(key)
    except ObjectNotFoundError:
        raise ObjectNotFoundError(f"{missing} in {store.uri} (expected {key}); plan again") from None
