"""The lease-and-write step: plans made now, their files leased in the catalog, their documents in the store."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from logcompact.catalog import Catalog, SetAside, Snapshot, TopicPartition
from logcompact.jobs.release import give_up, release_abandoned
from logcompact.planner import PlannerConfig, choose_plans, expected_effect
from logcompact.plans import Plan, PlanGroup, hidden_offsets_reason, input_keys, input_sections, plan_documents
from logcompact.plans.documents import seal, write_documents
from logcompact.units import mib

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ThresholdStatus:
    """Files per level (not leased to an in-flight plan) against the level's compaction threshold."""

    counts: dict[int, int]
    thresholds: dict[int, int]

    @property
    def due_levels(self) -> list[int]:
        return [level for level, threshold in self.thresholds.items() if self.counts.get(level, 0) >= threshold]

    @property
    def reached(self) -> bool:
        return bool(self.due_levels)

    def describe(self) -> str:
        levels = ", ".join(f"L{level} {self.counts.get(level, 0)}/{t}" for level, t in self.thresholds.items())
        verdict = f"due: {', '.join(f'L{level}' for level in self.due_levels)}" if self.reached else "nothing due"
        return f"files per level against thresholds: {levels}; {verdict}"


def check_thresholds(snapshot: Snapshot, now_ms: int, config: PlannerConfig = PlannerConfig()) -> ThresholdStatus:
    """Files per level not leased to an in-flight plan, counted by the catalog (no file read)."""
    counts = snapshot.level_counts(excluding=sorted(snapshot.leased_files(now_ms)))
    return ThresholdStatus(counts, dict(enumerate(config.min_files)))


@dataclass(frozen=True)
class GroupJob:
    """One group of a written plan: what a Spark job needs to run it, and a label for the UI."""

    store_uri: str
    plan_id: str
    group: int
    label: str

    def application_args(self) -> list[str]:
        # One `--name=value` token each: a scheduler that renders templates as native objects would turn a
        # lone "0" into an int.
        return [f"--store={self.store_uri}", f"--plan-id={self.plan_id}", f"--group={self.group}"]


@dataclass
class PreparedRun:
    thresholds: ThresholdStatus  # of the snapshot the plans were made from
    plan_ids: list[str]
    groups: list[GroupJob]
    estimates: list[dict]
    set_aside: list[SetAside] = field(default_factory=list)  # partitions whose catalog rows hide records: not planned


def prepare_plans(
    catalog: Catalog,
    mode: str,
    now_ms: int,
    config: PlannerConfig = PlannerConfig(),
    topics: list[str] | None = None,
    dry_run: bool = False,
) -> PreparedRun:
    """Plan a mode against the catalog as it is *now* (never as of a run's logical date, so a backfill or a re-run
    of an old date cannot undo newer work), then `lease_and_write` the plans; a dry run plans and estimates, and
    writes nothing. Plans a failed run abandoned are released first, so their files can be planned again now. A
    partition whose records a plan would drop, because a damaged row hides them (`Plan.hidden_offsets`), is marked
    uncleanable (a dry run only leaves it out) and the rest planned again without it, before anything is leased."""
    if not dry_run:
        release_abandoned(catalog)
    snapshot = catalog.planning_snapshot(now_ms)
    plans = choose_plans(snapshot, now_ms, mode, config, topics)
    set_aside: list[SetAside] = []
    while hiding := [(plan.plan_id, marks) for plan in plans if (marks := _hiding(plan, snapshot))]:
        for plan_id, marks in hiding:
            for mark in marks:
                log.warning("%s as uncleanable: %s", "dry run: would set aside" if dry_run else "set aside", mark.reason)
            if not dry_run:
                catalog.set_aside(marks, plan_id, now_ms)
            set_aside += marks
        # Planned again without them (as `planning_snapshot` now leaves them out): each round leaves out one more.
        snapshot = catalog.snapshot(set_aside=snapshot.set_aside | {(m.topic, m.partition) for m in set_aside})
        plans = choose_plans(snapshot, now_ms, mode, config, topics)
    thresholds = check_thresholds(snapshot, now_ms, config)
    estimates = [expected_effect(p) for p in plans]
    if dry_run or not plans:
        return PreparedRun(thresholds, [], [], estimates, set_aside)
    groups = lease_and_write(catalog, plans, now_ms, config.lease_ms)
    return PreparedRun(thresholds, [p.plan_id for p in plans], groups, estimates, set_aside)


def _hiding(plan: Plan, snapshot: Snapshot) -> list[SetAside]:
    """A mark per partition whose offsets the plan would drop: a section of its inputs retired alone by damage
    (`Snapshot.retired_apart`), or offsets no section holds nor compaction dropped (`Plan.hidden_offsets`), naming the file
    whose section of them was retired alone where one was. The other partitions of such a file are set aside with
    it, so that it stays live whole (a commit compacting them would remove it, and gc would collect the hidden
    records)."""
    marks: dict[TopicPartition, SetAside] = {}
    hiding: list[tuple[TopicPartition, int, int, dict[str, set[TopicPartition]]]] = []
    for key, (topic, partition), section, why in snapshot.retired_apart(input_sections(plan.inputs).records_by_file()):
        if (topic, partition) not in marks:
            marks[(topic, partition)] = SetAside(topic, partition, why, key)
            low, high = section.first_offset, section.last_offset
            hiding.append(((topic, partition), low, high, snapshot.files_hiding(topic, partition, low, high)))
    for (topic, partition), hidden in sorted(plan.hidden_offsets(snapshot).items()):
        if (topic, partition) in marks:
            continue
        low, high = hidden.low, hidden.high
        holding = snapshot.files_hiding(topic, partition, low, high)
        named = f" (file {min(holding)} holds them in a section row marked retired)" if holding else ""
        reason = f"{hidden_offsets_reason(topic, partition, hidden)}{named}; restore the catalog database from a backup"
        marks[(topic, partition)] = SetAside(topic, partition, reason, min(holding, default=""))
        hiding.append(((topic, partition), low, high, holding))
    for (topic, partition), low, high, holding in hiding:
        for key, partitions in sorted(holding.items()):
            for other in sorted(partitions - set(marks)):
                marks[other] = SetAside(
                    *other, f"set aside with {topic}/{partition}: file {key} holds offsets {low} to {high} of it, which its catalog "
                    f"rows hide, and compacting {other[0]}/{other[1]} would remove the file; restore the catalog database from a backup", key,
                )
    return list(marks.values())


def lease_and_write(catalog: Catalog, plans: list[Plan], now_ms: int, lease_ms: int) -> list[GroupJob]:
    """Lease every plan's files with its documents' seal (all the plans or none: a conflict releases the plans
    leased before it), then write the documents to the store; one `GroupJob` per group the plans record."""
    documents = [plan_documents(p) for p in plans]
    leased: list[Plan] = []
    try:
        for leasing, sealed in zip(plans, [seal(d) for d in documents], strict=True):
            catalog.lease(leasing.plan_id, input_keys(leasing.inputs), now_ms + lease_ms, now_ms, seal=sealed)
            leased.append(leasing)
        for written in documents:
            write_documents(catalog.store, written)
    except BaseException as failure:
        give_up(catalog, [p.plan_id for p in leased], now_ms, failure)  # a catalog gone meanwhile: released later
        raise
    return [GroupJob(catalog.store.uri, p.plan_id, group.group, _label(p, group)) for p in plans for group in p.groups]


def _label(plan: Plan, group: PlanGroup) -> str:
    """A group's map-index label, unique in a run and telling on one line of the grid: the plan (its id's random
    part, as the plan log names it), the group of how many, its partitions, levels and uncompressed bytes, e.g.
    `48ba7f36088b g2 of 4: accounts/50-74 L0>L1, 7.5 MiB uncompressed`."""
    levels = "+".join(f"L{level}" for level in sorted({f.level for f in plan.header().inputs}))
    return (
        f"{plan.plan_id.rsplit('-', 1)[-1]} g{group.group} of {len(plan.groups)}: {_partitions(group)} "
        f"{levels}>L{plan.target_level}, {mib(group.bytes)} uncompressed"
    )


def _partitions(group: PlanGroup) -> str:
    """A group's run of partitions: `accounts/3`, `accounts/0-49`, `accounts/50 to clicks/9`."""
    if group.first is None or group.last is None:
        return "no partitions"
    (first_topic, first), (last_topic, last) = group.first, group.last
    if first_topic != last_topic:
        return f"{first_topic}/{first} to {last_topic}/{last}"
    return f"{first_topic}/{first}" if first == last else f"{first_topic}/{first}-{last}"
