"""The demos' library: `logcompact demo` (about a million records over three topics, read back, checked, swept)
and the pieces of `make demo` (scripts/demo.py: skewed data for the DAGs, the per-level report, the check
through consume). Everything goes through the catalog's API, on whichever database the cluster uses.

Both demos' topics have 100 partitions each: every L0 file an agent writes holds a few hundred
topic-partitions, as a WarpStream agent's files do."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from logcompact.catalog import Catalog, Snapshot
from logcompact.consume import RECORD_SCHEMA, latest_values, read_batches
from logcompact.exceptions import TopicExistsError, VerificationError
from logcompact.ingest import Agent, Record
from logcompact.jobs import run_and_commit
from logcompact.planner import choose_plans
from logcompact.store import ObjectStore
from logcompact.topics import Topic

PARTITIONS = 100
BATCH = 10_000


@dataclass(frozen=True)
class DemoTopic:
    name: str
    policy: str
    distinct_keys: int


TOPICS = (
    DemoTopic("accounts", "compact", 20_000),
    DemoTopic("clicks", "delete", 0),
    DemoTopic("sessions", "compact,delete", 50_000),
)


def _partition_table(store: ObjectStore, snapshot: Snapshot, topic: str, partition: int) -> pa.Table:
    """Every record of a partition in one table; an empty one for a partition that got none (a small demo)."""
    return pa.concat_tables([RECORD_SCHEMA.empty_table(), *read_batches(store, snapshot, topic, partition)])


def _record(topic: DemoTopic, sequence: int, timestamp: int) -> Record:
    partition = sequence % PARTITIONS
    key = b"key-%08d" % (sequence % topic.distinct_keys) if topic.distinct_keys else None
    # Every 50th update of a compacted topic deletes its key.
    value = None if topic.distinct_keys and sequence % 50 == 49 else b"%s-value-%010d" % (topic.name.encode(), sequence)
    return Record(partition, key, value, timestamp)


def run_demo(catalog: Catalog, total_records: int, clock: Callable[[], int], echo: Callable[[str], None]) -> None:
    store = catalog.store
    now = clock()
    catalog.ensure_created(now)
    existing = catalog.snapshot().topics
    for spec in TOPICS:
        if spec.name in existing:
            raise TopicExistsError(f"topic {spec.name!r} already exists in {store.uri}; run the demo on an empty store")
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
                raise VerificationError(f"demo check failed: {spec.name}/{partition} offsets are not 0..{len(expected) - 1}")
            if table.column("value").to_pylist() != [r.value for r in expected]:
                raise VerificationError(f"demo check failed: {spec.name}/{partition} values differ from produced")
            if spec.distinct_keys:
                latest: dict[bytes, bytes | None] = {}
                for r in expected:
                    latest[r.key] = r.value
                view = latest_values(store, snapshot, spec.name, partition)
                found = dict(zip(view.column("key").to_pylist(), view.column("value").to_pylist()))
                if found != {k: v for k, v in latest.items() if v is not None}:
                    raise VerificationError(f"demo check failed: {spec.name}/{partition} latest values differ")
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
                    raise VerificationError(f"demo check failed: {spec.name}/{partition} lost records in the sweep")
                continue
            latest: dict[bytes, Record] = {}
            for r in expected:
                latest[r.key] = r
            found = list(zip(table.column("key").to_pylist(), table.column("value").to_pylist()))
            if sorted(found) != sorted((k, r.value) for k, r in latest.items()):
                raise VerificationError(
                    f"demo check failed: {spec.name}/{partition} does not hold exactly the latest record of each key"
                )
    echo("verified: after the sweep each compacted partition holds exactly one record per key, the latest "
         "(tombstones stay until their delete horizon)")


# -- The DAG demo (`make demo`): skewed data in many L0 files, a per-level report, the latest-value check --

HOUR_MS = 3_600_000
SKEWED_TOPICS = (
    DemoTopic("accounts", "compact", 20_000),
    DemoTopic("clicks", "delete", 0),
    DemoTopic("sessions", "compact,delete", 50_000),
)


def create_skewed_topics(catalog: Catalog, now: int) -> None:
    """The three demo topics; the compacted ones promise compaction within 2 h (the max-lag pass's floor)."""
    catalog.ensure_created(now)
    for spec in SKEWED_TOPICS:
        configs = {"cleanup.policy": spec.policy, "retention.ms": "-1"}
        if spec.distinct_keys:
            configs["max.compaction.lag.ms"] = str(2 * HOUR_MS)
        catalog.create_topic(Topic.create(spec.name, PARTITIONS, configs, now), now)


def produce_skewed(catalog: Catalog, records: int, files: int, first_timestamp: int, last_timestamp: int,
                   seed: int = 7) -> dict[str, dict[int, dict[bytes, bytes | None]]]:
    """`records` records over the three topics in `files` L0 files (one agent flush each, every file holding
    every topic, as agents write them), keys drawn from a Zipf law, every 20th record of a compacted topic a tombstone,
    timestamps spread from `first_timestamp` to `last_timestamp`. Returns each partition's latest value per key."""
    import numpy as np

    rng = np.random.default_rng(seed)
    latest: dict[str, dict[int, dict[bytes, bytes | None]]] = {t.name: {p: {} for p in range(PARTITIONS)} for t in SKEWED_TOPICS}
    per_file = records // files // len(SKEWED_TOPICS)
    sequence = 0
    for number in range(files):
        timestamp = first_timestamp + (last_timestamp - first_timestamp) * number // max(1, files - 1)
        with Agent(catalog, background=False, clock=lambda t=timestamp: t) as agent:
            for spec in SKEWED_TOPICS:
                draws = (rng.zipf(1.2, per_file) - 1) % spec.distinct_keys if spec.distinct_keys else range(per_file)
                batch = []
                for draw in draws:
                    sequence += 1
                    key = b"%s-%07d" % (spec.name.encode(), draw) if spec.distinct_keys else None
                    value = None if key and sequence % 20 == 0 else b"%s-v%09d-%s" % (spec.name.encode(), sequence, b"x" * 60)
                    partition = int(draw) % PARTITIONS
                    batch.append(Record(partition, key, value, timestamp))
                    if key:
                        latest[spec.name][partition][key] = value
                agent.produce(spec.name, batch)
    return latest


def level_table(snapshot: Snapshot) -> dict[int, tuple[int, int, int]]:
    """Files, bytes and records per level (from the files' summaries: no sections are read)."""
    table: dict[int, tuple[int, int, int]] = {}
    for summary in snapshot.file_summaries():
        files, size, records = table.get(summary.level, (0, 0, 0))
        table[summary.level] = (files + 1, size + summary.size, records + summary.record_count)
    return dict(sorted(table.items()))


def describe_levels(snapshot: Snapshot) -> str:
    return "; ".join(
        f"L{level} {files} files {size / 1e6:.1f} MB {records:,} records" for level, (files, size, records) in level_table(snapshot).items()
    ) or "no files"


def verify_latest(store: ObjectStore, snapshot: Snapshot, latest: dict[str, dict[int, dict[bytes, bytes | None]]],
                  clicks: int) -> int:
    """Through consume: every key's latest value survived, deleted keys stay deleted, the delete-policy topic
    kept all its records. Returns the live keys checked."""
    checked = 0
    for spec in SKEWED_TOPICS:
        for partition in range(PARTITIONS):
            if not spec.distinct_keys:
                continue
            view = latest_values(store, snapshot, spec.name, partition)
            found = dict(zip(view.column("key").to_pylist(), view.column("value").to_pylist()))
            expected = {k: v for k, v in latest[spec.name][partition].items() if v is not None}
            if found != expected:
                missing = len(set(expected) - set(found))
                raise VerificationError(
                    f"demo check failed: {spec.name}/{partition} has {len(found)} live keys, expected {len(expected)} ({missing} missing)"
                )
            checked += len(found)
    kept = sum(
        batch.num_rows for partition in range(PARTITIONS) for batch in read_batches(store, snapshot, "clicks", partition)
    )
    if kept != clicks:
        raise VerificationError(f"demo check failed: clicks holds {kept:,} records, produced {clicks:,}")
    return checked
