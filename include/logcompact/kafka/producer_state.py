"""Idempotent producers' state as this agent holds it, Kafka's ProducerStateManager: each producer-partition's epoch
and newest batches, loaded from the catalog on its first batch here plus the batches this agent accepted since, and
the checks a batch passes against it before it is written. The rows, and the check each append makes of the state
its batch assumed, are the catalog's (`logcompact.catalog.producers`).

Transactional producers' batches are checked first against their transaction (`TransactionViews`): as this agent
last read it from the catalog, or as its coordinator changed it since. The append checks each again under the
rows' locks (`logcompact.catalog.transactions.record_batches`); a batch whose transaction ended in between is
refused there alone, and a retry of it gets the same refusal (it stays in its producer's sequences)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass

from logcompact.catalog import Catalog
from logcompact.catalog.producers import BATCHES_KEPT, SEQUENCE_WRAP, PartitionState, SequencedBatch, UnknownProducerError, last_sequence
from logcompact.catalog.transactions import ONGOING, Slot, TransactionView, TxnError, TxnRefusal
from logcompact.exceptions import CatalogUnavailableError, TopicNotFoundError
from logcompact.kafka import codec

# The producer-partitions whose state an agent keeps in memory; past it, the least recently used one with nothing
# pending is dropped (its next batch reads its state from the catalog again): at most a few hundred bytes each.
MAX_PRODUCER_VIEWS = 100_000
# The transactional producers whose transaction an agent keeps in memory; past it, the least recently used one is
# dropped (its next batch reads its transaction from the catalog again).
MAX_TRANSACTION_VIEWS = 100_000

# Writes a sequenced batch, after the future of the producer's previous batch on the partition when it is pending:
# the future of the batch's offsets.
Write = Callable[[SequencedBatch, Future | None], Future]
# Checks a batch that is not a retry before it is written (a transactional batch against its transaction).
Check = Callable[[], None]


class ProducerStateError(Exception):
    """An idempotent producer's batch refused for its producer id, epoch or sequence, or because its producer's
    state could not be read: Kafka's error for it."""

    def __init__(self, error: codec.ErrorCode, message: str) -> None:
        super().__init__(message)
        self.error = error


@dataclass
class _ProducerView:
    """A producer's state on a partition as this agent sees it: as committed when loaded, then every batch the agent
    accepted since, each with its first offset, or while pending the future of its offsets."""

    epoch: int | None  # None: the catalog holds no state, so any sequence starts it (as Kafka)
    batches: list[tuple[int, int, int | Future]]  # (first sequence, last sequence, offset or future), oldest first

    @staticmethod
    def of(state: PartitionState | None) -> _ProducerView:
        if state is None:
            return _ProducerView(None, [])
        return _ProducerView(state.epoch, [(b.first_sequence, b.last_sequence, b.first_offset if b.refused is None else _refused(b.refused))
                                           for b in state.batches])

    @property
    def pending(self) -> bool:
        return any(isinstance(placed, Future) and not placed.done() for _, _, placed in self.batches)

    @property
    def failed(self) -> bool:
        """Whether a batch it counts as written failed to commit: then it no longer says what the catalog holds. A
        transactional batch its append refused was committed (its offsets aborted) and stays in the sequences."""
        return any(
            isinstance(placed, Future) and placed.done() and placed.exception() is not None and not isinstance(placed.exception(), TxnRefusal)
            for _, _, placed in self.batches
        )


class ProducerStateManager:
    """The views of the producer-partitions this agent wrote for, used by one thread (the ingest thread). Each batch
    records the state it assumed, which its append checks in the catalog; a view holding a batch that failed to
    commit is read from the catalog again, so the producer's retry is checked there."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._views: OrderedDict[tuple[int, str, int], _ProducerView] = OrderedDict()

    def append(self, topic: str, partition: int, records: int, producer_id: int, epoch: int, first_sequence: int, write: Write,
               check: Check | None = None) -> Future:
        """An idempotent producer's batch of `records` records: the future of its offsets as `write` returns it, or for
        a retry of one of the producer's newest 5 batches on the partition, that batch's (nothing written again; for
        a batch its append refused, that refusal). ProducerStateError for an unknown producer id, an epoch older than
        the producer's, a sequence that does not follow its last one (a new epoch starts at 0), or what `check`
        raises for a batch that is not a retry. A view that refuses a batch while nothing of it is pending is read
        from the catalog again first: another agent may have written for the producer since."""
        key = (producer_id, topic, partition)
        last = last_sequence(first_sequence, records)
        view, loaded = self._view(key)
        try:
            retried = _retried(view, key, epoch, first_sequence, last)
        except ProducerStateError:
            if loaded or view.pending:
                raise
            del self._views[key]
            view, _ = self._view(key)
            retried = _retried(view, key, epoch, first_sequence, last)
        if retried is not None:
            return retried
        if check is not None:
            check()
        follows = None if view.epoch is None else (view.epoch, view.batches[-1][1])
        previous = view.batches[-1][2] if view.batches else None
        future = write(SequencedBatch(producer_id, epoch, first_sequence, last, follows), previous if isinstance(previous, Future) else None)
        if view.epoch != epoch:
            view.epoch, view.batches = epoch, []
        view.batches.append((first_sequence, last, future))
        del view.batches[:-BATCHES_KEPT]
        return future

    def _view(self, key: tuple[int, str, int]) -> tuple[_ProducerView, bool]:
        """The producer-partition's view, and whether it was just read from the catalog (first batch, or a batch of
        the view failed: the batches accepted after it fail too, unwritten, as they follow it)."""
        view = self._views.get(key)
        if view is not None and not view.failed:
            self._views.move_to_end(key)
            return view, False
        producer_id, topic, partition = key
        try:
            view = _ProducerView.of(self.catalog.producer_state(producer_id, topic, partition))
        except UnknownProducerError as exc:
            raise ProducerStateError(codec.ErrorCode.unknown_producer_id, str(exc)) from None
        except TopicNotFoundError as exc:  # deleted since the request's topic was looked up
            raise ProducerStateError(codec.ErrorCode.unknown_topic_or_partition, str(exc)) from None
        except CatalogUnavailableError as exc:  # retriable: the client sends the batch again
            raise ProducerStateError(codec.ErrorCode.kafka_storage_error, f"producer state not readable: {exc}") from None
        self._views[key] = view
        if len(self._views) > MAX_PRODUCER_VIEWS:
            idle = next((old for old, known in self._views.items() if old != key and not known.pending), None)
            if idle is not None:
                del self._views[idle]
        return view, True


def _retried(view: _ProducerView, key: tuple[int, str, int], epoch: int, first_sequence: int, last: int) -> Future | None:
    """Kafka's checks of a batch against its producer's state on the partition: the future of the original's offsets
    for a retry of one of the newest batches, None for a batch to write, ProducerStateError for one to refuse."""
    if view.epoch is None:  # no state: any epoch and sequence starts it
        return None
    where = f"producer {key[0]} on {key[1]}-{key[2]}"
    if epoch < view.epoch:
        raise ProducerStateError(codec.ErrorCode.invalid_producer_epoch, f"{where}: epoch {epoch} is older than its epoch {view.epoch}")
    if epoch > view.epoch:
        if first_sequence != 0:
            raise ProducerStateError(codec.ErrorCode.out_of_order_sequence_number, f"{where}: new epoch {epoch} starts at sequence {first_sequence}, not 0")
        return None
    for first, final, placed in view.batches:
        if (first, final) == (first_sequence, last):
            return placed if isinstance(placed, Future) else _offsets_future(placed)
    expected = (view.batches[-1][1] + 1) % SEQUENCE_WRAP
    if first_sequence != expected:
        raise ProducerStateError(codec.ErrorCode.out_of_order_sequence_number, f"{where}: sequence {first_sequence} where {expected} was expected")
    return None


def _offsets_future(first_offset: int) -> Future:
    """A retried batch's answer when its original is committed: only the first offset is answered."""
    future: Future = Future()
    future.set_result([first_offset])
    return future


def _refused(error: str) -> Future:
    """The answer of a transactional batch its append refused, for its retries."""
    future: Future = Future()
    future.set_exception(TxnRefusal(TxnError[error], "transactional batch refused by its append: its transaction had ended before it was written"))
    return future


class TransactionViews:
    """Transactional producers' transactions as this agent knows them, by producer id, used by one thread (the ingest
    thread): read from the catalog on a producer's first batch here, and changed by this agent's coordinator. A
    batch is checked against the view, and a refusal is checked against the catalog once more (AddPartitionsToTxn
    usually ran on another agent, the coordinator): a partition not in the transaction is INVALID_TXN_STATE, another
    epoch INVALID_PRODUCER_EPOCH, a producer id no transactional id holds INVALID_PRODUCER_ID_MAPPING."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog
        self._views: OrderedDict[int, TransactionView] = OrderedDict()

    def check(self, producer_id: int, epoch: int, slot: Slot, where: str) -> None:
        """A transactional batch of the producer at `epoch` into the partition `slot` (`where`, its name): returns
        when its transaction holds the partition, ProducerStateError else."""
        view = self._views.get(producer_id)
        if view is None or _refusal(view, epoch, slot) is not None:
            view = self._read(producer_id)
        else:
            self._views.move_to_end(producer_id)
        refusal = TxnError.INVALID_PRODUCER_ID_MAPPING if view is None else _refusal(view, epoch, slot)
        if refusal is None:
            return
        held = "no transactional id" if view is None else f"epoch {view.epoch}, transaction {view.state}"
        reason = {
            TxnError.INVALID_PRODUCER_ID_MAPPING: "its producer id is not a transactional producer's (InitProducerId with its transactional.id first)",
            TxnError.INVALID_PRODUCER_EPOCH: "its epoch is not its producer's: a newer producer with the same transactional.id fenced it",
            TxnError.INVALID_TXN_STATE: "the partition was not added to its producer's open transaction (AddPartitionsToTxn first)",
        }[refusal]
        raise ProducerStateError(codec.ErrorCode[refusal.name.lower()],
                                 f"transactional batch of producer {producer_id} epoch {epoch} on {where} refused ({held}): {reason}")

    def added(self, producer_id: int, epoch: int, slots: frozenset[Slot]) -> None:
        """The partitions joined the producer's transaction at `epoch` (its coordinator here said so)."""
        view = self._views.get(producer_id)
        held = view.partitions if view is not None and view.epoch == epoch and view.state == ONGOING else frozenset()
        self._keep(producer_id, TransactionView(producer_id, epoch, ONGOING, held | slots))

    def forget(self, producer_id: int) -> None:
        """The producer's transaction changed otherwise (ended, fenced): its next batch reads it from the catalog."""
        self._views.pop(producer_id, None)

    def _read(self, producer_id: int) -> TransactionView | None:
        try:
            view = self.catalog.transaction_view(producer_id)
        except CatalogUnavailableError as exc:  # retriable: the client sends the batch again
            raise ProducerStateError(codec.ErrorCode.kafka_storage_error, f"transaction of producer {producer_id} not readable: {exc}") from None
        if view is None:
            self._views.pop(producer_id, None)
        else:
            self._keep(producer_id, view)
        return view

    def _keep(self, producer_id: int, view: TransactionView) -> None:
        self._views[producer_id] = view
        self._views.move_to_end(producer_id)
        if len(self._views) > MAX_TRANSACTION_VIEWS:
            self._views.popitem(last=False)


def _refusal(view: TransactionView, epoch: int, slot: Slot) -> TxnError | None:
    """Why the transaction refuses a batch at `epoch` into `slot`, as the append checks it; None when it takes it."""
    if epoch != view.epoch:
        return TxnError.INVALID_PRODUCER_EPOCH
    if view.state != ONGOING or slot not in view.partitions:
        return TxnError.INVALID_TXN_STATE
    return None
