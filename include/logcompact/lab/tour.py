"""`logcompact tour`: the library alone, without Airflow or Spark: about a million records over the demo's three
topics (compact, delete, compact,delete), read back, one full sweep, and the check that each compacted partition
holds exactly the latest record of each key."""

from __future__ import annotations

import time
from collections.abc import Callable

import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import Catalog, Snapshot
from logcompact.consume import RECORD_SCHEMA, latest_values, read_batches
from logcompact.exceptions import TopicExistsError, VerificationError
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.lab.demo import PARTITIONS, TOPICS, DemoTopic
from logcompact.planner import choose_plans
from logcompact.store import ObjectStore
from logcompact.topics import Topic

BATCH = 10_000


def _partition_table(store: ObjectStore, snapshot: Snapshot, topic: str, partition: int) -> pa.Table:
    """Every record of a partition in one table; an empty one for a partition that got none (a small tour)."""
    return pa.concat_tables([RECORD_SCHEMA.empty_table(), *read_batches(store, snapshot, topic, partition)])


def _record(topic: DemoTopic, sequence: int, timestamp: int) -> Record:
    partition = sequence % PARTITIONS
    key = b"key-%08d" % (sequence % topic.distinct_keys) if topic.distinct_keys else None
    # Every 50th update of a compacted topic deletes its key.
    value = None if topic.distinct_keys and sequence % 50 == 49 else b"%s-value-%010d" % (topic.name.encode(), sequence)
    return Record(partition, key, value, timestamp)


def run_tour(catalog: Catalog, total_records: int, clock: Callable[[], int], echo: Callable[[str], None]) -> None:
    store = catalog.store
    now = clock()
    catalog.ensure_created(now)
    existing = catalog.snapshot().topics
    for spec in TOPICS:
        if spec.name in existing:
            raise TopicExistsError(f"topic {spec.name!r} already exists in {store.uri}; run the tour on an empty store")
        catalog.create_topic(Topic.create(spec.name, PARTITIONS, {"cleanup.policy": spec.policy, "retention.ms": "-1"}, now), now)
    echo(f"cluster {catalog.cluster_id} in {store.uri}: topics " + ", ".join(f"{t.name} ({t.policy})" for t in TOPICS))

    per_topic = total_records // len(TOPICS)
    produced = {spec.name: [_record(spec, i, now + i) for i in range(per_topic)] for spec in TOPICS}
    payload = sum(len(r.key or b"") + len(r.value or b"") for records in produced.values() for r in records)

    started = time.perf_counter()
    with Agent(catalog, clock=clock) as agent:
        futures = []
        for spec in TOPICS:
            records = produced[spec.name]
            futures += [agent.produce(spec.name, records[i : i + BATCH]) for i in range(0, per_topic, BATCH)]
    for future in futures:
        future.result()
    produce_s = time.perf_counter() - started
    echo(
        f"produced {per_topic * len(TOPICS):,} records ({payload / 1e6:.1f} MB of keys and values) in {produce_s:.2f} s: "
        f"{per_topic * len(TOPICS) / produce_s:,.0f} records/s, {payload / 1e6 / produce_s:.1f} MB/s, "
        f"{agent.files_written} L0 files"
    )

    snapshot = catalog.snapshot()
    started = time.perf_counter()
    consumed: dict[tuple[str, int], pa.Table] = {}
    for spec in TOPICS:
        for partition in range(PARTITIONS):
            consumed[(spec.name, partition)] = _partition_table(store, snapshot, spec.name, partition)
    consume_s = time.perf_counter() - started
    echo(
        f"consumed {sum(t.num_rows for t in consumed.values()):,} records as Arrow batches in {consume_s:.2f} s: "
        f"{sum(t.num_rows for t in consumed.values()) / consume_s:,.0f} records/s"
    )

    for spec in TOPICS:
        for partition in range(PARTITIONS):
            expected = produced[spec.name][partition::PARTITIONS]
            table = consumed[(spec.name, partition)]
            offsets = table.column("offset").to_numpy()
            if table.num_rows != len(expected) or not (offsets == range(len(expected))).all():
                raise VerificationError(f"tour check failed: {spec.name}/{partition} offsets are not 0..{len(expected) - 1}")
            if table.column("value").to_pylist() != [r.value for r in expected]:
                raise VerificationError(f"tour check failed: {spec.name}/{partition} values differ from produced")
            if spec.distinct_keys:
                latest: dict[bytes | None, bytes | None] = {}
                for r in expected:
                    latest[r.key] = r.value
                view = latest_values(store, snapshot, spec.name, partition)
                found = dict(zip(view.column("key").to_pylist(), view.column("value").to_pylist()))
                if found != {k: v for k, v in latest.items() if v is not None}:
                    raise VerificationError(f"tour check failed: {spec.name}/{partition} latest values differ")
    live_keys = sum(
        latest_values(store, snapshot, spec.name, p).num_rows for spec in TOPICS if spec.distinct_keys for p in range(PARTITIONS)
    )
    tombstones = sum(pc.sum(pc.is_null(t.column("value"))).as_py() or 0 for t in consumed.values())
    counts = store.counters.snapshot()
    echo(
        f"verified: every offset, value and latest value per key matches what was produced "
        f"({live_keys:,} live keys, {tombstones:,} tombstones); manifest version {snapshot.version}, "
        f"{sum(snapshot.level_counts().values())} live files"
    )
    echo(f"store requests: {counts.put:,} PUT, {counts.get:,} GET, {counts.list:,} LIST, {counts.delete:,} DELETE")

    compact_and_verify(catalog, produced, clock(), echo)


def compact_and_verify(catalog: Catalog, produced: dict[str, list[Record]], now: int, echo: Callable[[str], None]) -> None:
    """A full sweep (`logcompact compact --full`), then: exactly one record per key in compacted topics."""
    store = catalog.store
    (sweep,) = choose_plans(catalog.snapshot(), now, "full")
    result = run_and_commit(catalog, sweep, now)
    if result is None:
        raise VerificationError(f"tour check failed: the full sweep {sweep.plan_id} was committed before it ran")
    stats = result.jobs[0]
    echo(
        f"full sweep into L{sweep.target_level}: {stats.records_in:,} records in, {stats.records_out:,} out "
        f"({stats.duplicates_removed:,} duplicates removed, {stats.tombstones_stamped:,} tombstones stamped) "
        f"in {stats.seconds:.2f} s: {stats.records_in / stats.seconds:,.0f} records/s, {stats.gets} GETs, {stats.puts} PUTs"
    )
    snapshot = catalog.snapshot()
    for spec in TOPICS:
        for partition in range(PARTITIONS):
            table = _partition_table(store, snapshot, spec.name, partition)
            expected = produced[spec.name][partition::PARTITIONS]
            if not spec.distinct_keys:
                if table.num_rows != len(expected):
                    raise VerificationError(f"tour check failed: {spec.name}/{partition} lost records in the sweep")
                continue
            latest: dict[bytes | None, Record] = {}
            for r in expected:
                latest[r.key] = r
            found = list(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
            if sorted(found) != sorted((k, r.value) for k, r in latest.items()):
                raise VerificationError(
                    f"tour check failed: {spec.name}/{partition} does not hold exactly the latest record of each key"
                )
    echo("verified: after the sweep each compacted partition holds exactly one record per key, the latest "
         "(tombstones stay until their delete horizon)")
