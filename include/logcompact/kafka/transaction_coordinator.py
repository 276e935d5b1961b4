"""Kafka's transaction coordinator over the catalog: InitProducerId with a transactional id, AddPartitionsToTxn,
AddOffsetsToTxn and EndTxn, each one catalog transaction (`Catalog.init_producer`, `add_to_transaction`,
`add_group_to_transaction`, `end_transaction`), run off the event loop; an admin's abort of a hanging transaction
(WriteTxnMarkers, `abort_for_admin`); and the two sweeps of Kafka's coordinator, aborting transactions open past their
timeout and forgetting transactional ids unused for `transactional_id_expiration_ms`.

The state is the catalog's, none of it in this agent's memory, so any agent takes over after another dies. As for
consumer groups, one live agent coordinates a transactional id, the one it hashes to
(`AgentDirectory.coordinator_for`): the others answer NOT_COORDINATOR, and only the coordinator sweeps it. Nothing
depends on that for correctness: every change checks the row under its lock, and a timeout's abort is a
compare-and-set on the row read (`Catalog.abort_transaction`), so two agents never both end a transaction.

Each change this agent makes is passed to the ingest thread's views of the transactions (`TransactionViews`), so
a producer's batches after its AddPartitionsToTxn here are checked without a catalog read.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Collection
from dataclasses import dataclass

from logcompact.catalog import Catalog
from logcompact.catalog.model import TopicPartition
from logcompact.catalog.transactions import MAX_TIMEOUT_MS, ONGOING, Ended, TxnError, TxnRefusal
from logcompact.kafka import codec
from logcompact.kafka.cluster import AgentDirectory
from logcompact.kafka.ingest_thread import Ingest
from logcompact.units import wall_clock_ms

log = logging.getLogger(__name__)

# Kafka's defaults: transactional.id.expiration.ms (7 days), transaction.abort.timed.out.transaction.cleanup.interval.ms
# and transaction.remove.expired.transaction.cleanup.interval.ms (transaction.max.timeout.ms: MAX_TIMEOUT_MS).
ID_EXPIRATION_MS = 604_800_000
ABORT_INTERVAL_MS = 10_000
EXPIRY_INTERVAL_MS = 3_600_000
# Timed-out transactions read from the catalog at once by a sweep, which reads another page after a full one it
# aborted all of.
ABORT_PAGE = 100
# How many times an admin's abort reads the transaction again when it moved on between the read and the abort.
ADMIN_ABORT_ATTEMPTS = 3


@dataclass(frozen=True)
class TransactionSettings:
    """The coordinator's bounds, by Kafka's broker settings of the same names."""

    max_timeout_ms: int = MAX_TIMEOUT_MS  # transaction.max.timeout.ms: a producer's transaction.timeout.ms above it is refused
    id_expiration_ms: int = ID_EXPIRATION_MS  # transactional.id.expiration.ms: an id with no open transaction unused this long is forgotten
    abort_interval_ms: int = ABORT_INTERVAL_MS  # transaction.abort.timed.out.transaction.cleanup.interval.ms
    expiry_interval_ms: int = EXPIRY_INTERVAL_MS  # transaction.remove.expired.transaction.cleanup.interval.ms


def error_code(error: TxnError) -> codec.ErrorCode:
    """The wire error of a catalog refusal (the catalog names them as Kafka does)."""
    return codec.ErrorCode[error.name.lower()]


def fenced(error: codec.ErrorCode, version: int, since: int) -> codec.ErrorCode:
    """PRODUCER_FENCED as a request of `version` may be answered: INVALID_PRODUCER_EPOCH before the version that
    added it (`since`), as Kafka's KafkaApis maps it."""
    return codec.ErrorCode.invalid_producer_epoch if error == codec.ErrorCode.producer_fenced and version < since else error


class TransactionCoordinator:
    """The transactions whose ids hash to this agent: their requests and their sweeps. The ingest thread's views are
    told of each producer's transaction this agent changes: its partitions after AddPartitionsToTxn, and to forget it
    after anything else (its next batch reads the catalog)."""

    def __init__(self, catalog: Catalog, agents: AgentDirectory, settings: TransactionSettings) -> None:
        self.catalog = catalog
        self.agents = agents
        self.settings = settings
        self._ingest: Ingest | None = None
        self._sweeping: list[asyncio.Task] = []

    def coordinates(self, transactional_id: str) -> bool:
        """Whether this agent coordinates the transactional id (NOT_COORDINATOR elsewhere, as Kafka)."""
        return self.agents.coordinator_for(transactional_id).node_id == self.agents.me.node_id

    def start(self, ingest: Ingest) -> None:
        self._ingest = ingest
        self._sweeping = [
            asyncio.create_task(self._every(self.settings.abort_interval_ms, self.abort_timed_out)),
            asyncio.create_task(self._every(self.settings.expiry_interval_ms, self.expire_ids)),
        ]

    async def stop(self) -> None:
        for task in self._sweeping:
            task.cancel()
        await asyncio.gather(*self._sweeping, return_exceptions=True)
        self._sweeping = []

    # -- requests ---------------------------------------------------------------------------------------------

    async def init_producer(self, transactional_id: str, timeout_ms: int, expected: tuple[int, int] | None) -> tuple[int, int]:
        """InitProducerId: the producer id and epoch the producer goes on with, an open transaction of the id aborted
        and its producer fenced first (logged); TxnRefusal for a refusal."""
        before = await asyncio.to_thread(self.catalog.describe_transactions, [transactional_id])
        now = wall_clock_ms()
        producer_id, epoch = await asyncio.to_thread(
            self.catalog.init_producer, transactional_id, timeout_ms, self.settings.max_timeout_ms, expected, now,
        )
        found = before.get(transactional_id)
        if found is not None:
            row = found[0]
            await self._forget(row.producer_id)
            if row.state == ONGOING and (producer_id, epoch) != (row.producer_id, row.epoch):
                log.info("transaction %r aborted: open %d ms, its producer (id %d, epoch %d) fenced by a new one with the same "
                         "transactional.id (epoch %d)", transactional_id, now - row.start_ms, row.producer_id, row.epoch, epoch)
        return producer_id, epoch

    async def add_partitions(self, transactional_id: str, producer_id: int, epoch: int, partitions: Collection[TopicPartition]) -> None:
        """AddPartitionsToTxn: the partitions join the producer's transaction (TxnRefusal, TopicNotFoundError or
        InvalidRecordError else)."""
        await asyncio.to_thread(self.catalog.add_to_transaction, transactional_id, producer_id, epoch, partitions, wall_clock_ms())
        if self._ingest is not None:
            await self._on_ingest_thread(self._ingest.transaction_added, producer_id, epoch, partitions)

    async def add_offsets(self, transactional_id: str, producer_id: int, epoch: int, group_id: str) -> None:
        """AddOffsetsToTxn: the group's offsets may be committed in the producer's transaction (TxnOffsetCommit, on
        the group's coordinator), which begins unless open already (TxnRefusal else)."""
        await asyncio.to_thread(self.catalog.add_group_to_transaction, transactional_id, producer_id, epoch, group_id, wall_clock_ms())
        await self._forget(producer_id)  # its state may have moved to Ongoing: its next batch reads the catalog

    async def end(self, transactional_id: str, producer_id: int, epoch: int, commit: bool) -> Ended:
        """EndTxn: the transaction committed or aborted (TxnRefusal for a refusal)."""
        try:
            return await asyncio.to_thread(self.catalog.end_transaction, transactional_id, producer_id, epoch, commit, wall_clock_ms())
        finally:
            await self._forget(producer_id)

    async def abort_for_admin(self, producer_id: int, epoch: int, partitions: Collection[TopicPartition]) -> set[TopicPartition]:
        """WriteTxnMarkers' ABORT from an admin (Admin.abortTransaction, KIP-664): the producer's open transaction
        aborted as a whole, its producer fenced (logged), when it has data in one of the live `partitions` and `epoch`
        is at least its epoch (as Kafka takes a marker). Any agent serves it, as Kafka's partition leaders do: the
        abort is a compare-and-set on the row, run again while the transaction moves on under it (AddPartitionsToTxn
        elsewhere). Returns the partitions whose producer state is at a newer epoch than the marker's
        (INVALID_PRODUCER_EPOCH in Kafka), which do not count as open data."""
        for _ in range(ADMIN_ABORT_ATTEMPTS):
            states = await asyncio.to_thread(self.catalog.active_producers, partitions)
            mine = {tp: state for tp, listed in states.items() for state in listed if state.producer_id == producer_id}
            older = {tp for tp, state in mine.items() if state.epoch > epoch}
            if not any(state.current_txn_start_offset >= 0 for tp, state in mine.items() if tp not in older):
                return older  # no open data of the producer there at the marker's epoch: as Kafka, the marker ends nothing
            rows = [row for row in await asyncio.to_thread(self.catalog.transactions, (ONGOING,), (producer_id,)) if row.epoch <= epoch]
            if not rows:  # ended (or its producer moved on) since the read above
                return older
            row = rows[0]
            now = wall_clock_ms()
            if await asyncio.to_thread(self.catalog.abort_transaction, row, now, True) is not None:
                await self._forget(producer_id)
                log.info("transaction %r aborted by an admin (WriteTxnMarkers): open %d ms, its producer (id %d, epoch %d) fenced",
                         row.transactional_id, now - row.start_ms, producer_id, row.epoch)
                return older
        raise TxnRefusal(TxnError.CONCURRENT_TRANSACTIONS, f"the open transaction of producer id {producer_id} changed under {ADMIN_ABORT_ATTEMPTS} aborts; retry")

    # -- sweeps -----------------------------------------------------------------------------------------------

    async def abort_timed_out(self) -> int:
        """Abort, fencing their producers, the transactions this agent coordinates open past their timeout; how many.
        Pages of them are read while each is full and all of it aborted here: the rest wait for the next sweep."""
        aborted = 0
        while True:
            now = wall_clock_ms()
            rows = await asyncio.to_thread(self.catalog.timed_out_transactions, now, ABORT_PAGE)
            in_page = 0
            for row in rows:
                if not self.coordinates(row.transactional_id):
                    continue
                ended = await asyncio.to_thread(self.catalog.abort_transaction, row, wall_clock_ms(), True)
                if ended is None:  # ended or moved on meanwhile (its producer, or another agent)
                    continue
                in_page += 1
                await self._forget(row.producer_id)
                log.info("transaction %r aborted: open %d ms, past its timeout %d ms", row.transactional_id, now - row.start_ms, row.timeout_ms)
            aborted += in_page
            if len(rows) < ABORT_PAGE or in_page < len(rows):
                return aborted

    async def expire_ids(self) -> int:
        """Forget the transactional ids with no open transaction unused for `id_expiration_ms`; how many."""
        expired = await asyncio.to_thread(self.catalog.expire_transactional_ids, wall_clock_ms() - self.settings.id_expiration_ms)
        if expired:
            log.info("%d transactional ids forgotten: unused for %d ms (transactional.id.expiration.ms)", expired, self.settings.id_expiration_ms)
        return expired

    @staticmethod
    async def _every(interval_ms: int, sweep: Callable[[], Awaitable[int]]) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000)
            try:
                await sweep()
            except Exception as exc:  # the catalog down: the next sweep tries again
                log.warning("transaction sweep failed: %s; tried again in %d ms", exc, interval_ms)

    async def _forget(self, producer_id: int) -> None:
        if self._ingest is not None:
            await self._on_ingest_thread(self._ingest.transactions.forget, producer_id)

    async def _on_ingest_thread(self, call: Callable[..., None], *args: object) -> None:
        """Run `call` on the ingest thread, after the batches submitted before it: a producer's batches sent after
        this request's answer are checked by the views as changed."""
        ingest = self._ingest
        assert ingest is not None
        await ingest.results.wrap(ingest.thread.submit(call, *args))
