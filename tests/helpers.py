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


def assert_summaries_kept(catalog: Catalog) -> None:
    """Every partition's row of `partition_summaries` is what its live sections above L0 sum up to, read from the
    sections themselves (through the partitions and through the live files, which agree); a partition without a row,
    or with an empty one, holds none. Key sketches may hold more keys than the sections (a union since the partition
    last had one section), never fewer. Each row counts its partition's sections rows above L0, live or not."""
    from dataclasses import replace

    from sqlalchemy import func, select

    from logcompact import sketch
    from logcompact.catalog import schema, summaries

    with catalog.engine.connect() as connection:
        slots = [tuple(row) for row in connection.execute(select(schema.partitions.c.topic_id, schema.partitions.c.partition))]
        kept = summaries.read(connection, slots)
        fresh = summaries.summed_up_by_partition(connection, slots)
        through_files = summaries.summed_up_through_files(connection, slots)
        rows, sec = schema.partition_summaries.c, schema.sections.c
        indexed = {(t, p): n for t, p, n in connection.execute(select(rows.topic_id, rows.partition, rows.indexed)) if n}
        entries = connection.execute(select(sec.topic_id, sec.partition, func.count()).where(schema.ABOVE_L0).group_by(sec.topic_id, sec.partition))
    assert indexed == {(t, p): n for t, p, n in entries}, "partition_summaries.indexed does not count the partitions' sections above L0"
    assert through_files == fresh, "the live sections read through the live files sum up otherwise than through the partitions"
    assert set(kept) == set(fresh), f"partition_summaries holds {sorted(kept)}, the sections {sorted(fresh)}"
    for slot, summary in fresh.items():
        held = kept[slot]
        assert replace(held, key_sketch=b"") == replace(summary, key_sketch=b""), (slot, held, summary)
        merged = sketch.merge_packed([held.key_sketch, summary.key_sketch])
        assert (merged == sketch.decode(held.key_sketch)).all(), f"{slot}: the kept sketch lacks keys of its sections"
    assert_holes_recorded(catalog)


def assert_holes_recorded(catalog: Catalog) -> None:
    """In every compacted partition (one with a `partition_summaries` row), every offset from its log start up to its
    last live section that no live section holds is in a live row of `offset_holes`, and those rows are disjoint
    and apart (coalesced): a compaction that forgot to record what it dropped would make its partition unreadable."""
    from sqlalchemy import select

    from logcompact.catalog import holes, schema

    sec, files, part, rows = schema.sections.c, schema.files.c, schema.partitions.c, schema.offset_holes.c
    with catalog.engine.connect() as connection:
        compacted = {(t, p): start for t, p, start in connection.execute(
            select(part.topic_id, part.partition, part.log_start_offset).join(
                schema.partition_summaries, (schema.partition_summaries.c.topic_id == part.topic_id) & (schema.partition_summaries.c.partition == part.partition))
        )}
        spans: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for t, p, first, last in connection.execute(
            select(sec.topic_id, sec.partition, sec.first_offset, sec.last_offset).join(schema.files, files.file_id == sec.file_id)
            .where(files.removed_version.is_(None), sec.removed_version.is_(None))
        ):
            spans.setdefault((t, p), []).append((first, last))
        recorded: dict[tuple[int, int], list[tuple[int, int]]] = {}
        for t, p, first, last in connection.execute(
            select(rows.topic_id, rows.partition, rows.first_offset, rows.last_offset).where(rows.removed_version.is_(None))
        ):
            recorded.setdefault((t, p), []).append((first, last))
    for slot, ranges in recorded.items():
        assert sorted(ranges) == holes.coalesced(ranges), f"{slot}: offset_holes rows {sorted(ranges)} overlap or touch"
    for slot, start in compacted.items():
        unheld = holes.gaps(spans.get(slot, []), start)
        # Rows come in no order (PostgreSQL's): `without` takes them sorted.
        assert not holes.without(unheld, sorted(recorded.get(slot, []))), f"{slot}: offsets {unheld} held by no section, holes {recorded.get(slot)}"


def recorded_runs(monkeypatch) -> list[tuple[list, bool]]:
    """The runs of partitions the L0 copier makes from now on (`engine.copier._runs`: partitions, copied whole?)."""
    from logcompact.engine import copier

    made: list[tuple[list, bool]] = []
    runs = copier._runs
    monkeypatch.setattr(copier, "_runs", lambda by_partition: (made.append(run) or run for run in runs(by_partition)))
    return made


class TasksByUri:
    """A group's slices run as Spark runs them, without Spark: each through `logcompact.jobs.run_task`, which is
    sent only a `GroupSlice` and opens the store from its URI, here in this process."""

    def __init__(self, slices: int = 2) -> None:
        self.slices = slices

    def parallelism(self) -> int:
        return self.slices

    def map(self, store, slices: list) -> list:
        from logcompact.jobs import run_task

        return [run_task(share) for share in slices]



def produce_records(catalog: Catalog, topic: str, records: list) -> list[int]:
    """`records` (`logcompact.ingest.Record`s) appended to `topic` in one L0 file: their offsets."""
    from logcompact.ingest import Agent

    with Agent(catalog, background=False) as agent:
        future = agent.produce(topic, records)
    return future.result()


def rewrite_without(store, catalog: Catalog, keys: list[str], drop_offsets: set[int], level: int) -> None:
    """A stand-in compaction of topic `t`'s partition 0: merge files into one whose section keeps offsets but
    leaves holes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from logcompact.catalog import CatalogSection, DataFile
    from logcompact.consume import read_sections
    from logcompact.format import section_table, write_segment

    snapshot = catalog.snapshot()
    inputs = snapshot.get_files(keys)
    sections = sorted(((key, s) for key, f in inputs.items() for s in f.sections), key=lambda pair: pair[1].first_offset)
    dropped = pa.array(sorted(drop_offsets), pa.int64())
    merged = pa.concat_tables(
        [t.filter(pc.invert(pc.is_in(t.column("offset"), dropped))) for t in read_sections(store, sections)]
    )
    first = merged.column("offset")[0].as_py()
    deltas = pc.subtract(merged.column("offset"), first).cast(pa.uint32())
    table = section_table(deltas, merged.column("timestamp"), merged.column("key").to_pylist(), merged.column("value").to_pylist())
    blob, (info,) = write_segment([("t", 0, table)])
    store.put(f"data/l{level}/merged.seg", blob)
    output = DataFile(f"data/l{level}/merged.seg", level, len(blob), NOW, (CatalogSection(info, first),))
    assert catalog.replace_files(keys, [output], NOW).committed


# A sections row's fields its stored crc32 is bound to (`schema.section_crc_binding`), in that function's order.
BOUND = ("topic_id", "partition", "byte_offset", "byte_length", "first_row", "first_offset", "last_offset", "record_count")


def bound_fields(connection, file_id: int, partition: int) -> tuple[tuple[int, ...], int]:
    """A sections row's bound fields and its stored crc32."""
    from sqlalchemy import select

    from logcompact.catalog import schema

    sec = schema.sections.c
    row = connection.execute(
        select(*(sec[name] for name in BOUND), sec.crc32).where(sec.file_id == file_id, sec.partition == partition)
    ).one()
    return tuple(row[:-1]), row[-1]


def damage_section(catalog: Catalog, key: str, in_partition: int, rebind: bool = False, **values: int) -> str:
    """Change the catalog row of a file's section behind the library's back, as a damaged database would hold it;
    with `rebind`, its crc32 bound again to the changed row, as only an edit that knows the binding would."""
    from sqlalchemy import update

    from logcompact.catalog import schema

    sec, files = schema.sections.c, schema.files.c
    with catalog.engine.begin() as connection:
        file_id = connection.execute(schema.files.select().with_only_columns(files.file_id).where(files.key == key)).scalar_one()
        before, stored = bound_fields(connection, file_id, in_partition)
        changed = connection.execute(
            update(schema.sections).where(sec.file_id == file_id, sec.partition == in_partition).values(**values)
        ).rowcount
        if rebind:
            now_in = values.get("partition", in_partition)
            after, _ = bound_fields(connection, file_id, now_in)
            crc = stored ^ schema.section_crc_binding(*before) ^ schema.section_crc_binding(*after)
            connection.execute(update(schema.sections).where(sec.file_id == file_id, sec.partition == now_in).values(crc32=crc))
    assert changed == 1
    return key


def section_column_rows(columns) -> list[tuple]:
    """A planning pass's columns (`SectionColumns`) a section a tuple, sorted: file key, topic, partition, first and
    last offset, uncompressed bytes, newest timestamp."""
    return sorted(
        zip(
            [columns.keys[f] for f in columns.file.tolist()], [columns.topics[t] for t in columns.topic.tolist()], columns.partition.tolist(),
            columns.first_offset.tolist(), columns.last_offset.tolist(), columns.uncompressed_bytes.tolist(), columns.max_timestamp.tolist(),
            strict=True,
        )
    )
