"""Splitting a large plan into groups: sets of topic-partitions over the same inputs, bounded in bytes."""

from __future__ import annotations

from dataclasses import replace

from logcompact.engine.plan import Plan


def split_into_groups(plan: Plan, group_bytes: int) -> list[Plan]:
    """Groups of whole partitions in (topic, partition) order, each holding at most about `group_bytes` of
    input (a partition larger than that is a group of its own). One group: the plan itself."""
    sizes: dict[tuple[str, int], int] = {}
    for data_file in plan.inputs:
        for section in data_file.sections:
            if plan.covers(section.topic, section.partition):
                key = (section.topic, section.partition)
                sizes[key] = sizes.get(key, 0) + section.info.byte_length
    groups: list[list[tuple[str, int]]] = []
    total = 0
    for key in sorted(sizes):
        if not groups or (total + sizes[key] > group_bytes and groups[-1]):
            groups.append([])
            total = 0
        groups[-1].append(key)
        total += sizes[key]
    if len(groups) <= 1:
        return [plan]
    return [replace(plan, partitions=tuple(group), group=number) for number, group in enumerate(groups)]
