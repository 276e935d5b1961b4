"""The pieces of `make demo` (scripts/demo.py): three topics of skewed data in many L0 files for the DAGs, the
per-level report, the latest-value check through consume, and the log that takes everything else the demo's
libraries print; `logcompact tour` (logcompact.lab.tour) uses the same topics. Everything goes through the
catalog's API, on whichever database the cluster uses.

The topics have 100 partitions each: every L0 file an agent writes holds a few hundred topic-partitions, as a
WarpStream agent's files do."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from logcompact.catalog import Catalog, Snapshot
from logcompact.consume import latest_values, read_batches
from logcompact.exceptions import VerificationError
from logcompact.ingest import Agent, Record
from logcompact.store import ObjectStore
from logcompact.topics import Topic
from logcompact.units import HOUR_MS

PARTITIONS = 100


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


@dataclass(frozen=True)
class Terminal:
    """The terminal's streams while `output_to_log` sends the process's own to the log."""

    out: TextIO
    err: TextIO


@contextmanager
def output_to_log(log: Path) -> Iterator[Terminal]:
    """Whatever this process and the processes it starts write to stdout and stderr goes to `log`: Airflow's
    logs and Python's warnings, Spark's output, the Kafka clients' lines (librdkafka writes to stderr itself), so
    the terminal shows what the demo prints to the streams it is given, the first line of which names the log.
    The descriptors are redirected, not only `sys.stdout`: Airflow's handlers hold the stream they were
    configured with, and C libraries and child processes write to the descriptors. They are restored however the
    block ends, so the demo's own error reaches the terminal."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    terminal = Terminal(os.fdopen(os.dup(saved[0]), "w", buffering=1), os.fdopen(os.dup(saved[1]), "w", buffering=1))
    print(f"logs of Airflow, Spark and the Kafka clients: {log}", file=terminal.out)
    try:
        with log.open("ab") as file:
            os.dup2(file.fileno(), 1)
            os.dup2(file.fileno(), 2)
        yield terminal
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        for fd, original in zip((1, 2), saved):
            os.dup2(original, fd)
            os.close(original)
        terminal.out.close()
        terminal.err.close()


def create_skewed_topics(catalog: Catalog, now: int) -> None:
    """The three demo topics; the compacted ones promise compaction within 2 h (the max-lag pass's floor)."""
    catalog.ensure_created(now)
    for spec in TOPICS:
        configs = {"cleanup.policy": spec.policy, "retention.ms": "-1"}
        if spec.distinct_keys:
            configs["max.compaction.lag.ms"] = str(2 * HOUR_MS)
        catalog.create_topic(Topic.create(spec.name, PARTITIONS, configs, now), now)


Latest = dict[str, dict[int, dict[bytes, bytes | None]]]  # per topic and partition, each key's latest value


def skewed_rounds(records: int, files: int, first_timestamp: int, last_timestamp: int, latest: Latest,
                  seed: int = 7) -> Iterator[tuple[int, dict[str, list[Record]]]]:
    """`records` records over the three topics in `files` rounds (each one agent flush: an L0 file holding every
    topic), keys drawn from a Zipf law, every 20th record of a compacted topic a tombstone, timestamps spread from
    `first_timestamp` to `last_timestamp`: each round's timestamp and its records per topic. Fills `latest` with
    each partition's latest value per key as the rounds are produced."""
    import numpy as np

    rng = np.random.default_rng(seed)
    latest.update({t.name: {p: {} for p in range(PARTITIONS)} for t in TOPICS})
    per_file = records // files // len(TOPICS)
    sequence = 0
    for number in range(files):
        timestamp = first_timestamp + (last_timestamp - first_timestamp) * number // max(1, files - 1)
        batches: dict[str, list[Record]] = {}
        for spec in TOPICS:
            draws = (rng.zipf(1.2, per_file) - 1) % spec.distinct_keys if spec.distinct_keys else range(per_file)
            batch = batches[spec.name] = []
            for draw in draws:
                sequence += 1
                key = b"%s-%07d" % (spec.name.encode(), draw) if spec.distinct_keys else None
                value = None if key and sequence % 20 == 0 else b"%s-v%09d-%s" % (spec.name.encode(), sequence, b"x" * 60)
                partition = int(draw) % PARTITIONS
                batch.append(Record(partition, key, value, timestamp))
                if key:
                    latest[spec.name][partition][key] = value
        yield timestamp, batches


def produce_skewed(catalog: Catalog, records: int, files: int, first_timestamp: int, last_timestamp: int,
                   seed: int = 7) -> Latest:
    """`skewed_rounds` through the library: one ingest agent flush per round, on the round's clock. Returns each
    partition's latest value per key."""
    latest: Latest = {}
    for timestamp, batches in skewed_rounds(records, files, first_timestamp, last_timestamp, latest, seed):
        def clock(at: int = timestamp) -> int:
            return at

        with Agent(catalog, background=False, clock=clock) as agent:
            for topic, batch in batches.items():
                agent.produce(topic, batch)
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


def verify_latest(store: ObjectStore, snapshot: Snapshot, latest: Latest, clicks: int) -> int:
    """Through consume: every key's latest value survived, deleted keys stay deleted, the delete-policy topic
    kept all its records. Returns the live keys checked."""
    checked = 0
    for spec in TOPICS:
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
