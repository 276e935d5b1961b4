"""Small builders shared by the tests."""

from __future__ import annotations

from logcompact.catalog import Catalog
from logcompact.topics import Topic

NOW = 1_700_000_000_000


def create_topic(catalog: Catalog, name: str, partitions: int = 1, now: int = NOW, **settings: str) -> Topic:
    topic = Topic.create(name, partitions, {k.replace("_", "."): v for k, v in settings.items()}, now)
    catalog.ensure_created(now)
    catalog.create_topic(topic, now)
    return topic


def full_sweep(snapshot, now: int, **config):
    """The full-sweep plan of a catalog snapshot, or None for an empty one (planner knobs as keyword arguments)."""
    from logcompact.planner import PlannerConfig, choose_plans

    plans = choose_plans(snapshot, now, "full", PlannerConfig(**config))
    return plans[0] if plans else None


def level_plans(snapshot, now: int, min_files: int, **config):
    """Regular plans with every level's threshold at `min_files`."""
    from logcompact.planner import PlannerConfig, choose_plans

    return choose_plans(snapshot, now, "regular", PlannerConfig(min_files=(min_files,) * 4, **config))


def produce_l0_files(catalog: Catalog, topic: str, files: int, records: int, keys: int, partitions: int, now: int = NOW,
                     tombstone_every: int = 0) -> None:
    """`files` L0 files, each holding `records` records of `topic` over `keys` keys (every `tombstone_every`th a delete)."""
    from logcompact.ingest import Agent, Record

    with Agent(catalog, background=False, clock=lambda: now) as agent:
        sequence = 0
        for _ in range(files):
            batch = []
            for _ in range(records):
                value = None if tombstone_every and sequence % tombstone_every == tombstone_every - 1 else b"v%d" % sequence
                batch.append(Record(sequence % partitions, b"k%d" % (sequence % keys), value, now))
                sequence += 1
            agent.produce(topic, batch)
            agent.flush()


def assert_floors_kept(catalog: Catalog) -> None:
    """Every partition's kept floor above L0 (`partition_floors`) is the lowest first offset of its live sections
    above L0, read from the sections themselves; a partition without a row, or with floor NULL, holds none."""
    from sqlalchemy import func, select

    from logcompact.catalog import schema

    sec, files, floors = schema.sections.c, schema.files.c, schema.partition_floors.c
    lowest = (
        select(sec.topic_id, sec.partition, func.min(sec.first_offset)).join(schema.files, files.file_id == sec.file_id)
        .where(sec.level > 0, sec.removed_version.is_(None), files.removed_version.is_(None))
        .group_by(sec.topic_id, sec.partition)
    )
    with catalog.engine.connect() as connection:
        held = {(topic_id, partition): first for topic_id, partition, first in connection.execute(lowest)}
        kept = {(t, p): floor for t, p, floor in connection.execute(select(floors.topic_id, floors.partition, floors.floor))}
    assert {slot: floor for slot, floor in kept.items() if floor is not None} == held, f"partition_floors {kept}, the sections {held}"
