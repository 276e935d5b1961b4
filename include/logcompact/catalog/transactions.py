"""Kafka's transactions in the catalog: each transactional id's producer id, epoch and state, the partitions and
groups of its open transaction, the offsets it commits, and the offset ranges of aborted transactions' data. Functions
of a Connection, called by `Catalog` inside its transactions, as `producers` and `groups` are.

A transaction's outcome is a catalog transaction (`end`, and `abort_open` for InitProducerId's fencing, timeouts and
an admin's abort): it hands out one offset, the marker, in every partition added to the transaction (as Kafka writes
a marker to each: a hole here, never a record), through the append's own statement (`appends.advance_partitions`);
on abort it records the transaction's batches' offsets as aborted ranges; on commit it moves its pending offsets
into the groups' committed offsets; and it creates a version, which wakes waiting fetches.

An append records each transactional batch in its transaction (`record_batches`): the first offset of its data in
the partition, which holds the partition's last stable offset (LSO) there until the transaction ends, and its offset
range. A batch whose transaction ended before its append (a fenced zombie, a delayed retry) is already in an L0 file
with other producers' batches, so it never fails the append: its offsets become an aborted range and its producer
is refused (`Refused`).

Writers lock in the catalog's one order: topic rows, partition rows (sorted), transaction rows (sorted by
transactional id), group_offsets rows (sorted), the version row. AddPartitionsToTxn, AddOffsetsToTxn and
TxnOffsetCommit lock only their transaction row and create no version, as consumer groups' writes.

The LSO of a partition never decreases: offsets are handed out at or past its high watermark, which is at or past
its LSO, so a first offset set later is at or past the LSO; a transaction ending removes a term of the minimum, and a
marker raises the high watermark.

What the agent's coordinator, its reads and compaction build on: `init_producer`, `add_partitions`, `add_group`,
`store_offsets`, `end`, `abort_open`, `record_batches` (+ `insert_aborted`, which returns how many ranges it
recorded), `view_of_producer`, `timed_out`, `expire`, `unstable_offsets`, `aborted_overlapping`, `listed`,
`described` (a `Described` by transactional id), `producers_on`, `drop_topic` and `forget_aborted`; `logcompact
status` reads `stability` (each partition's LSO and open transactions). Errors are `TxnRefusal` carrying a `TxnError` (Kafka's name and code). A marker is an offset no record holds, recorded in
`offset_holes` as a compaction's holes are (`holes.record_markers`), so that readers and plans do not take it for a
damaged row's gap.
"""

from __future__ import annotations

import enum
import json
from collections import defaultdict
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import NamedTuple

from sqlalchemy import Connection, and_, delete, exists, func, insert, or_, select, tuple_, update

from logcompact.catalog import appends, holes, producers, topics, versions
from logcompact.catalog import schema as s
from logcompact.catalog.database import one_of, update_rows, upsert
from logcompact.catalog.groups import CommittedOffset
from logcompact.catalog.producers import SequencedBatch
from logcompact.exceptions import LogcompactError

# A partition, as (topic id, partition).
Slot = tuple[int, int]

# Kafka's transaction states that a row holds: EndTxn is one catalog transaction, so no Prepare* state is stored,
# and an expired id's row is deleted rather than marked Dead.
EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT = "Empty", "Ongoing", "CompleteCommit", "CompleteAbort"
STATES = (EMPTY, ONGOING, COMPLETE_COMMIT, COMPLETE_ABORT)
# Kafka's Short.MAX_VALUE, and its TransactionMetadata.isEpochExhausted bound (one below, leaving room for the bump
# that fences an open transaction): InitProducerId at that epoch moves the transactional id to a new producer id.
MAX_EPOCH = 32767
EXHAUSTED_EPOCH = MAX_EPOCH - 1
# Kafka's transaction.max.timeout.ms default: the bound `init_producer` is given, by the agent.
MAX_TIMEOUT_MS = 900_000
# How many times `Catalog.end_transaction` runs again when an AddPartitionsToTxn on another agent changed the
# transaction's partitions between its read of them and its lock of the row.
END_ATTEMPTS = 3


class TxnError(enum.Enum):
    """Why a transactional request was refused, by Kafka's error names and codes (the agent answers the code)."""

    INVALID_PRODUCER_EPOCH = 47
    INVALID_TXN_STATE = 48
    INVALID_PRODUCER_ID_MAPPING = 49
    INVALID_TRANSACTION_TIMEOUT = 50
    CONCURRENT_TRANSACTIONS = 51
    PRODUCER_FENCED = 90


class TxnRefusal(LogcompactError):
    """A transactional request or batch refused with a Kafka error (`error`); nothing of the request was written."""

    def __init__(self, error: TxnError, message: str) -> None:
        super().__init__(f"{error.name}: {message}")
        self.error = error


class TransactionRow(NamedTuple):
    """A `transactions` row."""

    transactional_id: str
    producer_id: int
    epoch: int
    state: str
    timeout_ms: int
    start_ms: int
    updated_ms: int
    previous_producer_id: int
    previous_epoch: int


class TransactionView(NamedTuple):
    """What the ingest checks a transactional batch against: its producer's transaction and the partitions in it."""

    producer_id: int
    epoch: int
    state: str
    partitions: frozenset[Slot]


class Ended(NamedTuple):
    """A transaction ended: the state it was left in, the marker's offset in each partition it was added to (none for
    a retried EndTxn of a transaction ended already), and the aborted ranges recorded."""

    state: str
    markers: dict[Slot, int]
    aborted: int


class Refused(NamedTuple):
    """What `record_batches` refused: each refused batch's error by its index in `placed`, and the aborted ranges
    (first offset, last offset, producer id) of their offsets, by partition, for `insert_aborted` once the append's
    version is known."""

    errors: dict[int, TxnError]
    aborted: dict[Slot, list[tuple[int, int, int]]]


class ActiveProducer(NamedTuple):
    """A producer's state on a partition as DescribeProducers shows it."""

    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    current_txn_start_offset: int  # the first offset of its open transaction's data there; -1 for none


class Described(NamedTuple):
    """A transaction as DescribeTransactions shows it: its row and the partitions of its open transaction."""

    row: TransactionRow
    partitions: tuple[Slot, ...]


_COLUMNS = tuple(s.transactions.c[name] for name in TransactionRow._fields)


# -- the coordinator's requests ---------------------------------------------------------------------------------


def init_producer(
    connection: Connection, transactional_id: str, timeout_ms: int, max_timeout_ms: int, expected: tuple[int, int] | None, now_ms: int
) -> tuple[int, int]:
    """InitProducerId with a transactional id: the (producer id, epoch) the producer goes on with. A new id gets a new
    producer id at epoch 0. An open transaction of the id is aborted first, bumping the epoch (the previous producer
    is fenced), and that epoch is answered. Otherwise the epoch is bumped, as Kafka's
    TransactionMetadata.prepareIncrementProducerEpoch: `expected` (KIP-360: the producer's current id and epoch,
    None for a new producer) must be the current producer id, or the previous one at an exhausted epoch, else
    PRODUCER_FENCED; its epoch the current one (bumped), or the previous one (a retry whose answer was lost: the
    current epoch, not bumped again). An exhausted epoch moves the id to a new producer id at epoch 0. Unlike Kafka,
    which aborts an open transaction before it checks `expected`'s epoch, a producer naming an older epoch than the
    open transaction's is PRODUCER_FENCED with the transaction left open: only its current producer, or a new one,
    aborts it; and the abort and the bump are one step (Kafka answers CONCURRENT_TRANSACTIONS and bumps again on the
    retry), so epochs here run one behind Kafka's after a fencing."""
    if not 0 < timeout_ms <= max_timeout_ms:
        raise TxnRefusal(TxnError.INVALID_TRANSACTION_TIMEOUT,
                         f"transaction timeout {timeout_ms} ms is not within 1 to {max_timeout_ms} ms (transaction.max.timeout.ms)")
    t = s.transactions.c
    found = _row(connection, transactional_id)
    if found is None:
        producer_id = producers.allocate(connection, now_ms)
        created = connection.execute(upsert(connection, s.transactions).values(
            transactional_id=transactional_id, producer_id=producer_id, epoch=0, state=EMPTY, timeout_ms=timeout_ms,
            start_ms=-1, updated_ms=now_ms, previous_producer_id=-1, previous_epoch=-1,
        ).on_conflict_do_nothing().returning(t.transactional_id)).first()
        if created is not None:
            _own_producer_id(connection, transactional_id, producer_id, 0, now_ms)
            return producer_id, 0
        # Another agent created it meanwhile: its row is locked below. The producer id taken has no state and no
        # transactional id: producer-id expiry forgets it.
    elif found.state == ONGOING:
        _check_expected(found, expected)
        if expected is not None and expected[1] != found.epoch:  # an older producer of the id: the transaction is not its
            raise _fenced(found, *expected)
        # The open transaction's partition rows are locked before its row, as every writer does.
        if abort_open(connection, found, now_ms, bump_epoch=True) is None:
            raise TxnRefusal(TxnError.CONCURRENT_TRANSACTIONS, f"transactional id {transactional_id!r} changed while it was fenced; retry")
        fenced = _row(connection, transactional_id, lock=True)
        assert fenced is not None  # locked by abort_open
        if fenced.epoch >= EXHAUSTED_EPOCH:
            return _rotate(connection, fenced, timeout_ms, None, now_ms)
        # A retry of this InitProducerId, naming the epoch it fenced, is answered the same epoch (KIP-360).
        _set(connection, transactional_id, state=EMPTY, timeout_ms=timeout_ms, start_ms=-1, updated_ms=now_ms,
             previous_epoch=found.epoch if expected is not None else -1)
        _own_producer_id(connection, transactional_id, fenced.producer_id, fenced.epoch, now_ms)
        return fenced.producer_id, fenced.epoch
    row = _row(connection, transactional_id, lock=True)
    if row is None or row.state == ONGOING:  # expired, or began a transaction (AddPartitionsToTxn), since the read above
        raise TxnRefusal(TxnError.CONCURRENT_TRANSACTIONS, f"transactional id {transactional_id!r} changed meanwhile; retry")
    _check_expected(row, expected)
    if row.epoch >= EXHAUSTED_EPOCH and (expected is None or expected[1] == row.epoch):
        return _rotate(connection, row, timeout_ms, expected, now_ms)
    if expected is None:
        epoch, previous = row.epoch + 1, -1
    elif expected[1] == row.epoch:
        epoch, previous = row.epoch + 1, row.epoch
    elif expected[1] == row.previous_epoch:
        epoch, previous = row.epoch, row.previous_epoch  # a retry of the bump that answered it
    else:
        raise _fenced(row, *expected)
    _set(connection, transactional_id, epoch=epoch, state=EMPTY, timeout_ms=timeout_ms, start_ms=-1, updated_ms=now_ms, previous_epoch=previous)
    _own_producer_id(connection, transactional_id, row.producer_id, epoch, now_ms)
    return row.producer_id, epoch


def add_partitions(connection: Connection, transactional_id: str, producer_id: int, epoch: int, slots: Collection[Slot], now_ms: int) -> None:
    """AddPartitionsToTxn: the partitions join the producer's transaction, which begins (Ongoing, its timeout running
    from now) unless it is open already."""
    row = _checked(connection, transactional_id, producer_id, epoch)
    tp = s.transaction_partitions.c
    statement = upsert(connection, s.transaction_partitions).on_conflict_do_nothing(
        index_elements=[tp.transactional_id, tp.topic_id, tp.partition]
    )
    if slots:
        connection.execute(statement, [
            {"transactional_id": transactional_id, "topic_id": topic_id, "partition": partition, "first_offset": None, "ranges": "[]"}
            for topic_id, partition in sorted(slots)
        ])
    _begin(connection, row, now_ms)


def add_group(connection: Connection, transactional_id: str, producer_id: int, epoch: int, group_id: str, now_ms: int) -> None:
    """AddOffsetsToTxn: the group's offsets may be committed in the producer's transaction, which begins unless open
    already (in Kafka the group's offsets partition joins it)."""
    row = _checked(connection, transactional_id, producer_id, epoch)
    g = s.transaction_groups.c
    connection.execute(
        upsert(connection, s.transaction_groups).values(transactional_id=transactional_id, group_id=group_id)
        .on_conflict_do_nothing(index_elements=[g.transactional_id, g.group_id])
    )
    _begin(connection, row, now_ms)


def store_offsets(
    connection: Connection, transactional_id: str, producer_id: int, epoch: int, group_id: str,
    offsets: Mapping[tuple[str, int], CommittedOffset],
) -> None:
    """TxnOffsetCommit: the offsets wait in the open transaction, which must have added the group, until it commits
    (moved into the group's committed offsets) or aborts (dropped). Written in (topic, partition) order."""
    row = _checked(connection, transactional_id, producer_id, epoch)
    g = s.transaction_groups.c
    added = connection.execute(select(g.group_id).where(g.transactional_id == transactional_id, g.group_id == group_id)).first()
    if row.state != ONGOING or added is None:
        raise TxnRefusal(TxnError.INVALID_TXN_STATE,
                         f"transactional id {transactional_id!r} has not added group {group_id!r} to an open transaction (AddOffsetsToTxn)")
    if not offsets:
        return
    o = s.transaction_offsets.c
    statement = upsert(connection, s.transaction_offsets)
    connection.execute(statement.on_conflict_do_update(
        index_elements=[o.transactional_id, o.group_id, o.topic, o.partition],
        set_={name: statement.excluded[name] for name in ("committed_offset", "leader_epoch", "metadata", "commit_ms")},
    ), [
        {"transactional_id": transactional_id, "group_id": group_id, "topic": topic, "partition": partition,
         "committed_offset": committed.offset, "leader_epoch": committed.leader_epoch, "metadata": committed.metadata,
         "commit_ms": committed.commit_ms}
        for (topic, partition), committed in sorted(offsets.items(), key=lambda item: item[0])
    ])


def end(connection: Connection, transactional_id: str, producer_id: int, epoch: int, commit: bool, now_ms: int, *, from_client: bool = True) -> Ended:
    """EndTxn, with Kafka's checks (its first transaction protocol): another producer id is INVALID_PRODUCER_ID_MAPPING,
    another epoch PRODUCER_FENCED (from the admin, `from_client` False, an older one only); an open transaction ends
    (`Ended`); a retry of the outcome that ended it is answered as it was, with nothing done; the other outcome, or no
    open transaction, is INVALID_TXN_STATE. A transaction whose partitions changed under the end is
    CONCURRENT_TRANSACTIONS (the caller's transaction rolls back: the markers given out go with it)."""
    row = _row(connection, transactional_id)
    _check_end(row, transactional_id, producer_id, epoch, commit, from_client)
    assert row is not None
    if row.state != ONGOING:
        return Ended(row.state, {}, 0)
    try:
        return _complete(connection, row, commit, now_ms, bump_epoch=False)
    except TxnRefusal as changed:  # answered as checked under the row's lock; the markers given out roll back
        _check_end(_row(connection, transactional_id, lock=True), transactional_id, producer_id, epoch, commit, from_client)
        raise changed


def abort_open(connection: Connection, row: TransactionRow, now_ms: int, bump_epoch: bool) -> Ended | None:
    """Abort the open transaction `row` read, if the row is still that one (its producer id and epoch, Ongoing):
    None otherwise, nothing done (another agent ended it, or the producer moved on). With `bump_epoch`, its producer
    is fenced (InitProducerId of another producer, a timeout, an admin's abort). A row that changes between that
    check and the row's lock is CONCURRENT_TRANSACTIONS, which the caller's transaction must roll back on."""
    if row.state != ONGOING or _row(connection, row.transactional_id) != row:
        return None
    return _complete(connection, row, False, now_ms, bump_epoch=bump_epoch)


# -- the append ---------------------------------------------------------------------------------------------------


def record_batches(connection: Connection, placed: Sequence[tuple[Slot, int, int, SequencedBatch]]) -> Refused:
    """Record an append's transactional batches, given as (partition, first offset, last offset, batch), in their
    transactions, under the rows' locks (taken in transactional id order, after the append's partition rows): a batch
    of an open transaction at its producer's epoch, in a partition added to it, extends the transaction's ranges there
    and sets its first offset if unset. Any other is refused (`Refused`): no open transaction, or the partition not
    in it, is INVALID_TXN_STATE, another epoch INVALID_PRODUCER_EPOCH, an unknown producer INVALID_PRODUCER_ID_MAPPING."""
    t, tp = s.transactions.c, s.transaction_partitions.c
    dialect = connection.dialect.name
    producer_ids = sorted({batch.producer_id for _, _, _, batch in placed})
    rows = {
        row.producer_id: TransactionRow(*row)
        for row in connection.execute(
            select(*_COLUMNS).where(one_of(t.producer_id, producer_ids, dialect)).order_by(t.transactional_id).with_for_update()
        )
    }
    by_id = {row.transactional_id: row for row in rows.values()}
    joined: dict[tuple[str, int, int], tuple[int | None, list[list[int]]]] = {}
    if by_id:
        for found in connection.execute(
            select(tp.transactional_id, tp.topic_id, tp.partition, tp.first_offset, tp.ranges).where(one_of(tp.transactional_id, sorted(by_id), dialect))
        ):
            joined[(found.transactional_id, found.topic_id, found.partition)] = (found.first_offset, json.loads(found.ranges))
    changed: set[tuple[str, int, int]] = set()
    errors: dict[int, TxnError] = {}
    aborted: dict[Slot, list[tuple[int, int, int]]] = defaultdict(list)
    for index, (slot, first, last, batch) in enumerate(placed):
        row = rows.get(batch.producer_id)
        key = None if row is None else (row.transactional_id, *slot)
        if row is None:
            errors[index] = TxnError.INVALID_PRODUCER_ID_MAPPING
        elif batch.epoch != row.epoch:
            errors[index] = TxnError.INVALID_PRODUCER_EPOCH
        elif row.state != ONGOING or key not in joined:
            errors[index] = TxnError.INVALID_TXN_STATE
        else:
            assert key is not None
            first_offset, ranges = joined[key]
            joined[key] = (first if first_offset is None else first_offset, _merged(ranges, first, last))
            changed.add(key)
            continue
        aborted[slot].append((first, last, batch.producer_id))
    update_rows(connection, s.transaction_partitions, ("transactional_id", "topic_id", "partition"), [
        {"transactional_id": key[0], "topic_id": key[1], "partition": key[2], "first_offset": joined[key][0], "ranges": json.dumps(joined[key][1])}
        for key in sorted(changed)
    ])
    return Refused(errors, dict(aborted))


def insert_aborted(connection: Connection, ranges: Mapping[Slot, Sequence[tuple[int, int, int]]], version: int) -> int:
    """Record aborted ranges, (first offset, last offset, producer id) by partition, in `version`; how many."""
    rows = [
        {"topic_id": topic_id, "partition": partition, "first_offset": first, "last_offset": last, "producer_id": producer_id, "version": version}
        for (topic_id, partition), found in sorted(ranges.items()) for first, last, producer_id in sorted(found)
    ]
    if rows:
        connection.execute(insert(s.aborted_ranges), rows)
    return len(rows)


def view_of_producer(connection: Connection, producer_id: int) -> TransactionView | None:
    """The transaction of a transactional producer id as the ingest checks its batches against; None for a producer
    id no transactional id holds."""
    t, tp = s.transactions.c, s.transaction_partitions.c
    row = connection.execute(select(t.transactional_id, t.producer_id, t.epoch, t.state).where(t.producer_id == producer_id)).first()
    if row is None:
        return None
    slots = connection.execute(select(tp.topic_id, tp.partition).where(tp.transactional_id == row.transactional_id)).all()
    return TransactionView(row.producer_id, row.epoch, row.state, frozenset((topic_id, partition) for topic_id, partition in slots))


# -- sweeps ---------------------------------------------------------------------------------------------------------


def timed_out(connection: Connection, now_ms: int, limit: int) -> list[TransactionRow]:
    """The open transactions past their timeout, oldest first, at most `limit`, for `abort_open`."""
    t = s.transactions.c
    rows = connection.execute(
        select(*_COLUMNS).where(t.state == ONGOING, t.start_ms + t.timeout_ms < now_ms).order_by(t.start_ms, t.transactional_id).limit(limit)
    )
    return [TransactionRow(*row) for row in rows]


def expire(connection: Connection, before_ms: int) -> int:
    """Forget transactional ids with no open transaction, not used since `before_ms` (Kafka's
    transactional.id.expiration.ms); their producer ids lose their transactional id, for producer-id expiry. How many."""
    t, p = s.transactions.c, s.producers.c
    idle = and_(t.state != ONGOING, t.updated_ms < before_ms)
    connection.execute(update(s.producers).where(p.transactional_id.in_(select(t.transactional_id).where(idle))).values(transactional_id=None))
    forgotten = [row.transactional_id for row in connection.execute(select(t.transactional_id).where(idle))]
    if forgotten:
        _delete_open_parts(connection, forgotten)
        connection.execute(delete(s.transactions).where(one_of(t.transactional_id, forgotten, connection.dialect.name)))
    return len(forgotten)


# -- reads ---------------------------------------------------------------------------------------------------------


def unstable_offsets(connection: Connection, group_id: str, partitions: Iterable[tuple[str, int]]) -> set[tuple[str, int]]:
    """Of a group's `partitions`, those with offsets pending in an open transaction (OffsetFetch's require_stable)."""
    wanted = set(partitions)
    if not wanted:
        return set()
    o, t = s.transaction_offsets.c, s.transactions.c
    rows = connection.execute(
        select(o.topic, o.partition).join_from(s.transaction_offsets, s.transactions, t.transactional_id == o.transactional_id)
        .where(o.group_id == group_id, t.state == ONGOING, o.topic.in_(sorted({topic for topic, _ in wanted})))
    )
    return {(row.topic, row.partition) for row in rows} & wanted


def aborted_overlapping(connection: Connection, spans: Mapping[Slot, tuple[int, int]], version: int | None) -> dict[Slot, list[tuple[int, int]]]:
    """The aborted ranges (first, last offset) overlapping each partition's offsets [a, b), in offset order, recorded
    at or before `version` (None: any)."""
    if not spans:
        return {}
    a = s.aborted_ranges.c
    overlapping = or_(*(
        and_(a.topic_id == topic_id, a.partition == partition, a.last_offset >= start, a.first_offset < stop)
        for (topic_id, partition), (start, stop) in sorted(spans.items())
    ))
    query = select(a.topic_id, a.partition, a.first_offset, a.last_offset).where(overlapping)
    if version is not None:
        query = query.where(a.version <= version)
    found: dict[Slot, list[tuple[int, int]]] = defaultdict(list)
    for row in connection.execute(query.order_by(a.topic_id, a.partition, a.first_offset)):
        found[(row.topic_id, row.partition)].append((row.first_offset, row.last_offset))
    return dict(found)


def listed(
    connection: Connection, states: Collection[str], producer_ids: Collection[int], min_duration_ms: int, now_ms: int
) -> list[TransactionRow]:
    """ListTransactions: the rows in `states` (empty: any) of `producer_ids` (empty: any), and with `min_duration_ms`
    at least 0, open at least that long; by transactional id."""
    t = s.transactions.c
    query = select(*_COLUMNS).order_by(t.transactional_id)
    if states:
        query = query.where(t.state.in_(sorted(states)))
    if producer_ids:
        query = query.where(one_of(t.producer_id, sorted(producer_ids), connection.dialect.name))
    if min_duration_ms >= 0:
        query = query.where(t.state == ONGOING, t.start_ms <= now_ms - min_duration_ms)
    return [TransactionRow(*row) for row in connection.execute(query)]


def described(connection: Connection, transactional_ids: Collection[str]) -> dict[str, Described]:
    """DescribeTransactions: each id's row and its open transaction's partitions; an unknown id is left out."""
    t, tp = s.transactions.c, s.transaction_partitions.c
    ids = sorted(set(transactional_ids))
    dialect = connection.dialect.name
    rows = {row.transactional_id: TransactionRow(*row) for row in connection.execute(select(*_COLUMNS).where(one_of(t.transactional_id, ids, dialect)))}
    parts: dict[str, list[Slot]] = defaultdict(list)
    for row in connection.execute(
        select(tp.transactional_id, tp.topic_id, tp.partition).where(one_of(tp.transactional_id, sorted(rows), dialect))
        .order_by(tp.transactional_id, tp.topic_id, tp.partition)
    ):
        parts[row.transactional_id].append((row.topic_id, row.partition))
    return {tid: Described(row, tuple(parts.get(tid, ()))) for tid, row in rows.items()}


def producers_on(connection: Connection, slots: Collection[Slot]) -> dict[Slot, list[ActiveProducer]]:
    """DescribeProducers: the producers with state on each partition, by producer id, with the first offset of their
    open transaction's data there."""
    if not slots:
        return {}
    pb, t, tp = s.producer_batches.c, s.transactions.c, s.transaction_partitions.c
    start = (
        select(tp.first_offset).join_from(s.transaction_partitions, s.transactions, t.transactional_id == tp.transactional_id)
        .where(t.producer_id == pb.producer_id, t.state == ONGOING, tp.topic_id == pb.topic_id, tp.partition == pb.partition)
        .scalar_subquery()
    )
    rows = connection.execute(
        select(pb.topic_id, pb.partition, pb.producer_id, pb.epoch, pb.batches, pb.updated_ms, start.label("start"))
        .where(tuple_(pb.topic_id, pb.partition).in_(sorted(slots))).order_by(pb.topic_id, pb.partition, pb.producer_id)
    )
    found: dict[Slot, list[ActiveProducer]] = {slot: [] for slot in slots}
    for row in rows:
        batches = json.loads(row.batches)
        last_sequence = batches[-1][1] if batches else -1
        found[(row.topic_id, row.partition)].append(
            ActiveProducer(row.producer_id, row.epoch, last_sequence, row.updated_ms, -1 if row.start is None else row.start)
        )
    return found


class PartitionStability(NamedTuple):
    """A partition's high watermark and last stable offset, and the open transactions it was added to: how many, and
    the start of the oldest (None for none)."""

    high_watermark: int
    last_stable: int
    open_transactions: int
    oldest_start_ms: int | None


def stability(connection: Connection, topic_ids: Collection[int]) -> dict[Slot, PartitionStability]:
    """Each partition of `topic_ids`: its LSO read with its high watermark from the same rows, as `topics.offsets`
    reads them for Fetch, and the open transactions on it. One statement: the partitions joined to the few rows of
    open transactions' partitions, grouped."""
    if not topic_ids:
        return {}
    part, t, tp = s.partitions.c, s.transactions.c, s.transaction_partitions.c
    open_parts = (
        select(tp.topic_id, tp.partition, func.min(tp.first_offset).label("first_offset"), func.count().label("open"),
               func.min(t.start_ms).label("oldest"))
        .join_from(s.transaction_partitions, s.transactions, t.transactional_id == tp.transactional_id)
        .group_by(tp.topic_id, tp.partition).subquery()
    )
    o = open_parts.c
    rows = connection.execute(
        select(part.topic_id, part.partition, part.log_start_offset, part.next_offset, o.first_offset, o.open, o.oldest)
        .join_from(s.partitions, open_parts, and_(o.topic_id == part.topic_id, o.partition == part.partition), isouter=True)
        .where(one_of(part.topic_id, sorted(topic_ids), connection.dialect.name))
    )
    return {
        (row.topic_id, row.partition): PartitionStability(
            row.next_offset, max(row.log_start_offset, row.next_offset if row.first_offset is None else row.first_offset),
            row.open or 0, row.oldest,
        )
        for row in rows
    }


# -- topics deleted, ranges forgotten --------------------------------------------------------------------------------


def drop_topic(connection: Connection, topic_id: int) -> None:
    """A topic deleted: its partitions leave the open transactions (which stay committable; their other partitions'
    LSOs are not held by it), its aborted ranges and the offsets of it pending in transactions go."""
    tp, a, o = s.transaction_partitions.c, s.aborted_ranges.c, s.transaction_offsets.c
    name = connection.execute(select(s.topics.c.name).where(s.topics.c.topic_id == topic_id)).scalar_one()
    connection.execute(delete(s.transaction_partitions).where(tp.topic_id == topic_id))
    connection.execute(delete(s.aborted_ranges).where(a.topic_id == topic_id))
    connection.execute(delete(s.transaction_offsets).where(o.topic == name))


def forget_aborted(connection: Connection, limit: int) -> int:
    """Delete at most `limit` aborted ranges that no file the catalog still has a row of (live, or removed and not yet
    forgotten) may hold an unfiltered record of: no sections row of the partition overlapping the range lies in a
    file not filtered at or after the range's version. How many."""
    a, sec, f = s.aborted_ranges.c, s.sections.c, s.files.c
    overlapping = and_(sec.topic_id == a.topic_id, sec.partition == a.partition, sec.first_offset <= a.last_offset,
                       sec.last_offset >= a.first_offset, or_(f.filtered_version.is_(None), f.filtered_version < a.version))
    # Each by its own path, as readers find sections: above L0 through `sections_by_partition`, at L0 through the L0
    # files (live or removed and kept) by primary key.
    above_l0 = select(sec.file_id).join_from(s.sections, s.files, f.file_id == sec.file_id).where(sec.level > 0, overlapping)
    at_l0 = select(sec.file_id).join_from(s.files, s.sections, f.file_id == sec.file_id).where(f.level == 0, overlapping)
    forgettable = connection.execute(
        select(a.topic_id, a.partition, a.first_offset).where(~exists(above_l0), ~exists(at_l0))
        .order_by(a.topic_id, a.partition, a.first_offset).limit(limit)
    ).all()
    if forgettable:
        connection.execute(delete(s.aborted_ranges).where(tuple_(a.topic_id, a.partition, a.first_offset).in_([tuple(row) for row in forgettable])))
    return len(forgettable)


# -- within -----------------------------------------------------------------------------------------------------------


def _row(connection: Connection, transactional_id: str, lock: bool = False) -> TransactionRow | None:
    query = select(*_COLUMNS).where(s.transactions.c.transactional_id == transactional_id)
    if lock:
        query = query.with_for_update()
    row = connection.execute(query).first()
    return None if row is None else TransactionRow(*row)


def _set(connection: Connection, transactional_id: str, **values: int | str) -> None:
    connection.execute(update(s.transactions).where(s.transactions.c.transactional_id == transactional_id).values(**values))


def _checked(connection: Connection, transactional_id: str, producer_id: int, epoch: int) -> TransactionRow:
    """The row, locked, of a request naming the producer's id and epoch (AddPartitionsToTxn, AddOffsetsToTxn,
    TxnOffsetCommit), as Kafka checks them."""
    row = _row(connection, transactional_id, lock=True)
    if row is None or row.producer_id != producer_id:
        raise _unmapped(transactional_id, producer_id, row)
    if row.epoch != epoch:
        raise _fenced(row, producer_id, epoch)
    return row


def _begin(connection: Connection, row: TransactionRow, now_ms: int) -> None:
    """The transaction of a locked row open (Ongoing), its timeout running from now, unless it was already."""
    if row.state != ONGOING:
        _set(connection, row.transactional_id, state=ONGOING, start_ms=now_ms, updated_ms=now_ms)


def _check_expected(row: TransactionRow, expected: tuple[int, int] | None) -> None:
    """Kafka's TransactionCoordinator.isValidProducerId: a producer naming its id and epoch (KIP-360) holds the
    current producer id, or the previous one at an exhausted epoch (a retry of the move to a new one)."""
    if expected is None:
        return
    producer_id, epoch = expected
    if producer_id != row.producer_id and not (producer_id == row.previous_producer_id and epoch >= EXHAUSTED_EPOCH):
        raise _fenced(row, producer_id, epoch)


def _check_end(row: TransactionRow | None, transactional_id: str, producer_id: int, epoch: int, commit: bool, from_client: bool) -> None:
    if row is None or row.producer_id != producer_id:
        raise _unmapped(transactional_id, producer_id, row)
    if epoch < row.epoch or (from_client and epoch != row.epoch):
        raise _fenced(row, producer_id, epoch)
    done = COMPLETE_COMMIT if commit else COMPLETE_ABORT
    if row.state not in (ONGOING, done):
        outcome = "commit" if commit else "abort"
        raise TxnRefusal(TxnError.INVALID_TXN_STATE, f"transactional id {transactional_id!r} is {row.state}: it has no open transaction to {outcome}")


def _rotate(connection: Connection, row: TransactionRow, timeout_ms: int, expected: tuple[int, int] | None, now_ms: int) -> tuple[int, int]:
    """The id's epochs exhausted: a new producer id at epoch 0 (Kafka's prepareProducerIdRotation), the old one kept
    as the previous, to answer a retry of this InitProducerId."""
    producer_id = producers.allocate(connection, now_ms)
    connection.execute(update(s.producers).where(s.producers.c.producer_id == row.producer_id).values(transactional_id=None))
    _set(connection, row.transactional_id, producer_id=producer_id, epoch=0, state=EMPTY, timeout_ms=timeout_ms, start_ms=-1,
         updated_ms=now_ms, previous_producer_id=row.producer_id, previous_epoch=row.epoch if expected is not None else -1)
    _own_producer_id(connection, row.transactional_id, producer_id, 0, now_ms)
    return producer_id, 0


def _own_producer_id(connection: Connection, transactional_id: str, producer_id: int, epoch: int, now_ms: int) -> None:
    """The producers row of a transactional id's producer id: its epoch, and the id (producer-id expiry skips it)."""
    connection.execute(
        update(s.producers).where(s.producers.c.producer_id == producer_id).values(transactional_id=transactional_id, epoch=epoch, updated_ms=now_ms)
    )


def _complete(connection: Connection, read: TransactionRow, commit: bool, now_ms: int, bump_epoch: bool) -> Ended:
    """End the open transaction `read` in one catalog transaction, in the writers' lock order: the topic rows (shared;
    a deleted topic's partitions are skipped), the partition rows, each given one offset (the marker) by the append's
    own statement, then the transaction's row, checked unchanged (else CONCURRENT_TRANSACTIONS: the partitions advanced
    roll back with the caller's transaction), then group_offsets
    (commit), then the version row, then the aborted ranges (abort)."""
    tid = read.transactional_id
    tp = s.transaction_partitions.c
    slots = {(row.topic_id, row.partition) for row in connection.execute(select(tp.topic_id, tp.partition).where(tp.transactional_id == tid))}
    live = topics.rows_by_id(connection, {topic_id for topic_id, _ in slots}, lock=topics.SHARED)
    marked = {slot: 1 for slot in slots if slot[0] in live}
    markers = appends.advance_partitions(connection, marked, dict.fromkeys(marked, 0))
    if len(markers) < len(marked):
        unadvanced = min(set(marked) - set(markers))
        raise appends.unadvanced_partition(connection, unadvanced, {name: (topic_id, parts) for topic_id, (name, parts) in live.items()})
    row = _row(connection, tid, lock=True)
    parts = connection.execute(select(tp.topic_id, tp.partition, tp.ranges).where(tp.transactional_id == tid)).all()
    if row != read or {(part.topic_id, part.partition) for part in parts if part.topic_id in live} != set(marked):
        raise TxnRefusal(TxnError.CONCURRENT_TRANSACTIONS, f"transactional id {tid!r} changed while its transaction was ended; retry")
    if commit:
        _commit_offsets(connection, tid)
    _delete_open_parts(connection, [tid])
    state = COMPLETE_COMMIT if commit else COMPLETE_ABORT
    epoch = min(row.epoch + 1, MAX_EPOCH) if bump_epoch else row.epoch
    _set(connection, tid, state=state, epoch=epoch, updated_ms=now_ms)
    if bump_epoch:
        connection.execute(update(s.producers).where(s.producers.c.producer_id == row.producer_id).values(epoch=epoch, updated_ms=now_ms))
    version = versions.next_version(connection, END_TRANSACTION, now_ms)
    holes.record_markers(connection, markers, version)
    aborted = 0
    if not commit:
        ranges = {
            (part.topic_id, part.partition): [(first, last, row.producer_id) for first, last in json.loads(part.ranges)]
            for part in parts if (part.topic_id, part.partition) in marked
        }
        aborted = insert_aborted(connection, ranges, version)
    return Ended(state, markers, aborted)


def _commit_offsets(connection: Connection, transactional_id: str) -> None:
    """The transaction's pending offsets into its groups' committed offsets, in (group, topic, partition) order."""
    o, g = s.transaction_offsets.c, s.group_offsets.c
    rows = connection.execute(
        select(o.group_id, o.topic, o.partition, o.committed_offset, o.leader_epoch, o.metadata, o.commit_ms)
        .where(o.transactional_id == transactional_id).order_by(o.group_id, o.topic, o.partition)
    ).all()
    if not rows:
        return
    statement = upsert(connection, s.group_offsets)
    connection.execute(statement.on_conflict_do_update(
        index_elements=[g.group_id, g.topic, g.partition],
        set_={name: statement.excluded[name] for name in ("committed_offset", "leader_epoch", "metadata", "commit_ms")},
    ), [row._asdict() for row in rows])


def _delete_open_parts(connection: Connection, transactional_ids: Sequence[str]) -> None:
    """The partitions, groups and pending offsets of transactions: ended, or their ids forgotten."""
    dialect = connection.dialect.name
    for table in (s.transaction_partitions, s.transaction_groups, s.transaction_offsets):
        connection.execute(delete(table).where(one_of(table.c.transactional_id, transactional_ids, dialect)))


def _merged(ranges: list[list[int]], first: int, last: int) -> list[list[int]]:
    """`ranges` with [first, last] added, joined to the last range when contiguous (a batch lands past the earlier)."""
    if ranges and ranges[-1][1] + 1 == first:
        return [*ranges[:-1], [ranges[-1][0], last]]
    return sorted([*ranges, [first, last]])


def _unmapped(transactional_id: str, producer_id: int, row: TransactionRow | None) -> TxnRefusal:
    held = "no producer id (InitProducerId was not called, or the id expired)" if row is None else f"producer id {row.producer_id}"
    return TxnRefusal(TxnError.INVALID_PRODUCER_ID_MAPPING, f"transactional id {transactional_id!r} holds {held}, not {producer_id}")


def _fenced(row: TransactionRow, producer_id: int, epoch: int) -> TxnRefusal:
    return TxnRefusal(
        TxnError.PRODUCER_FENCED,
        f"transactional id {row.transactional_id!r} is held by producer id {row.producer_id} epoch {row.epoch}, not {producer_id} "
        f"epoch {epoch}: a newer producer with the same transactional.id fenced this one",
    )


# The operation of an EndTxn's version in the commit log.
END_TRANSACTION = "end transaction"
