"""Idempotent producers' state in the catalog: producer ids handed out, and per producer and partition the newest
batches written, as Kafka's ProducerStateManager keeps them. Functions of a Connection, called by `Catalog` inside
its transactions.

The ingest agent checks a batch's sequence against its own view of this state and records, with each batch it
accepts, the state it assumed (`SequencedBatch.follows`). The append that writes the batch checks that assumption
against the rows, in its own transaction, and writes the batch's first offset there: a batch is recorded exactly
when it is written. A row that is not what the agent assumed (another agent appended for the producer meanwhile,
or an earlier append the agent counted on failed) refuses the whole append (CommitConflictError), so a stale view
never stores a duplicate or a gap.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

from sqlalchemy import Connection, and_, delete, exists, func, insert, select

from logcompact.catalog import schema as s
from logcompact.catalog.database import one_of, update_rows
from logcompact.exceptions import CommitConflictError, LogcompactError

# Kafka's ProducerStateEntry.NUM_BATCHES_TO_RETAIN: a client has at most 5 batches in flight per partition, so a
# retry is always one of the newest 5.
BATCHES_KEPT = 5
# Kafka's producer.id.expiration.ms default: a producer's state on a partition is dropped once it wrote nothing
# there for this long, and a producer id with no state left and handed out this long ago is forgotten.
EXPIRATION_MS = 24 * 3_600_000
SEQUENCE_WRAP = 2**31  # sequences are int32 and wrap from 2^31-1 to 0


class KeptBatch(NamedTuple):
    first_sequence: int
    last_sequence: int
    first_offset: int
    # A transactional batch its append refused (its transaction had ended: `transactions.record_batches`): the
    # error's name, which a retry of it gets again; its offsets are an aborted range.
    refused: str | None = None


class PartitionState(NamedTuple):
    """A producer's state on one partition: its epoch and its newest batches, oldest first."""

    epoch: int
    batches: tuple[KeptBatch, ...]

    @property
    def last(self) -> tuple[int, int]:
        """(epoch, last sequence) of the newest batch: what the next batch must follow."""
        return self.epoch, self.batches[-1].last_sequence


class SequencedBatch(NamedTuple):
    """An idempotent producer's batch as an ingest agent accepted it. `follows` is the newest (epoch, last sequence)
    the agent assumed stored before it (None: no state for the producer on the partition); `transactional`, whether
    it is part of its producer's transaction (its append checks it there: `transactions.record_batches`)."""

    producer_id: int
    epoch: int
    first_sequence: int
    last_sequence: int
    follows: tuple[int, int] | None
    transactional: bool = False

    @property
    def record_count(self) -> int:
        return (self.last_sequence - self.first_sequence) % SEQUENCE_WRAP + 1


class PlacedBatch(NamedTuple):
    """A sequenced batch in a file being appended: its partition and its first record's offset within its section."""

    topic: str
    partition: int
    offset_delta: int
    batch: SequencedBatch


class UnknownProducerError(LogcompactError):
    """A producer id the catalog never handed out, or forgot (Kafka's UNKNOWN_PRODUCER_ID)."""


def last_sequence(first_sequence: int, record_count: int) -> int:
    """The sequence of a batch's last record, wrapping past 2^31-1 to 0 as Kafka's DefaultRecordBatch does."""
    return (first_sequence + record_count - 1) % SEQUENCE_WRAP


def allocate(connection: Connection, now_ms: int) -> int:
    """A new producer id (epoch 0)."""
    return connection.execute(
        insert(s.producers).values(epoch=0, transactional_id=None, updated_ms=now_ms).returning(s.producers.c.producer_id)
    ).scalar_one()


def load(connection: Connection, producer_id: int, topic_id: int, partition: int) -> PartitionState | None:
    """The producer's state on the partition, None when it has none; UnknownProducerError for an id never handed
    out or forgotten."""
    known = connection.execute(select(s.producers.c.producer_id).where(s.producers.c.producer_id == producer_id)).first()
    if known is None:
        raise UnknownProducerError(f"producer id {producer_id} was not handed out by InitProducerId, or expired")
    pb = s.producer_batches.c
    row = connection.execute(
        select(pb.epoch, pb.batches).where(pb.producer_id == producer_id, pb.topic_id == topic_id, pb.partition == partition)
    ).first()
    return None if row is None else _state(row.epoch, row.batches)


def record(
    connection: Connection, placed: Iterable[tuple[int, int, int, SequencedBatch]], now_ms: int, refused: Mapping[int, str] | None = None
) -> None:
    """Record appended batches, given as (topic id, partition, first offset, batch) in append order: each must follow
    the state its agent assumed, else CommitConflictError (the transaction then writes nothing). `refused`: the
    refusal of each transactional batch refused by its append, by index in `placed`, kept with it in the chain."""
    refused = refused or {}
    placed = list(placed)
    pb = s.producer_batches.c
    stored: dict[tuple[int, int, int], PartitionState] = {}
    rows = connection.execute(
        select(pb.producer_id, pb.topic_id, pb.partition, pb.epoch, pb.batches).where(
            one_of(pb.producer_id, {batch.producer_id for _, _, _, batch in placed}, connection.dialect.name)
        )
    )
    for row in rows:
        stored[(row.producer_id, row.topic_id, row.partition)] = _state(row.epoch, row.batches)
    existing = set(stored)
    changed: dict[tuple[int, int, int], PartitionState] = {}
    for index, (topic_id, partition, first_offset, batch) in enumerate(placed):
        key = (batch.producer_id, topic_id, partition)
        current = stored.get(key)
        found = None if current is None else current.last
        if found != batch.follows:
            raise CommitConflictError(
                f"producer {batch.producer_id} on topic id {topic_id} partition {partition}: the agent's batch "
                f"(epoch {batch.epoch}, sequences {batch.first_sequence}-{batch.last_sequence}) follows "
                f"{_described(batch.follows)} but the catalog holds {_described(found)} (another agent appended for "
                "this producer, or an append it followed failed); nothing was written"
            )
        kept = () if current is None or current.epoch != batch.epoch else current.batches
        kept = (*kept, KeptBatch(batch.first_sequence, batch.last_sequence, first_offset, refused.get(index)))[-BATCHES_KEPT:]
        stored[key] = changed[key] = PartitionState(batch.epoch, kept)
    # One statement of each kind, not one a producer and partition: an append of many partitions' batches pays two.
    inserts: list[dict[str, Any]] = []
    updates: list[dict[str, Any]] = []
    for (producer_id, topic_id, partition), state in changed.items():
        values: dict[str, Any] = {"producer_id": producer_id, "topic_id": topic_id, "partition": partition, "epoch": state.epoch, "updated_ms": now_ms,
                                  "batches": json.dumps([list(b) if b.refused else list(b[:3]) for b in state.batches])}
        (updates if (producer_id, topic_id, partition) in existing else inserts).append(values)
    if inserts:
        connection.execute(insert(s.producer_batches), inserts)
    update_rows(connection, s.producer_batches, ("producer_id", "topic_id", "partition"), updates)


def expire(connection: Connection, before_ms: int) -> tuple[int, int]:
    """Drop producer state not written since `before_ms`, then producer ids handed out before it that have no state
    left, but the newest id (SQLite would hand a deleted highest id out again). Returns the rows deleted of each."""
    batches = connection.execute(delete(s.producer_batches).where(s.producer_batches.c.updated_ms < before_ms)).rowcount
    p = s.producers.c
    newest = select(func.max(p.producer_id)).scalar_subquery()
    has_state = exists().where(s.producer_batches.c.producer_id == p.producer_id)
    producers = connection.execute(
        delete(s.producers).where(and_(p.updated_ms < before_ms, p.transactional_id.is_(None), p.producer_id < newest, ~has_state))
    ).rowcount
    return batches, producers


def _state(epoch: int, batches_json: str) -> PartitionState:
    return PartitionState(epoch, tuple(KeptBatch(*batch) for batch in json.loads(batches_json)))


def _described(last: tuple[int, int] | None) -> str:
    return "no state" if last is None else f"epoch {last[0]} sequence {last[1]}"

