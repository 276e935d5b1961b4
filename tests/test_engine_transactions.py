"""Compaction under Kafka's transactions, on both databases: nothing at or past a partition's last stable offset
(LSO) is cleaned, aborted transactions' records are removed (before pass 1, so an aborted value never removes a
committed one), markers stay holes, and aborted ranges are forgotten by gc once no file holds their records
unfiltered. Scenarios after Kafka's LogCleanerTest ones that apply to a log whose markers are holes."""

from __future__ import annotations

from logcompact.catalog import Catalog
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS
from logcompact.consume import read_records
from logcompact.ingest import Agent, Record
from logcompact.jobs import prepare_plans, run_here
from logcompact.planner import PlannerConfig
from tests.helpers import NOW, create_topic

TIMEOUT = 60_000


class TxnLog:
    """Partition 0 of topic `t`, compacted, written one L0 file per produce: plain records, and transactional ones
    through the catalog's coordinator methods, as the agent's coordinator calls them."""

    def __init__(self, catalog: Catalog, **settings: str) -> None:
        self.catalog = catalog
        create_topic(catalog, "t", partitions=1, cleanup_policy="compact", **settings)
        self.agent = Agent(catalog, background=False)
        self.producers: dict[str, list[int]] = {}  # transactional id: producer id, epoch, next sequence

    def close(self) -> None:
        self.agent.close()

    def plain(self, *records: tuple[bytes, bytes | None]) -> list[int]:
        return self._produce(records, None)

    def txn(self, transactional_id: str, *records: tuple[bytes, bytes | None]) -> list[int]:
        """Records of `transactional_id`'s transaction (begun by its first batch), in one batch."""
        if transactional_id not in self.producers:
            self.producers[transactional_id] = [*self.catalog.init_producer(transactional_id, TIMEOUT, MAX_TIMEOUT_MS, None, NOW), 0]
        pid, epoch, sequence = self.producers[transactional_id]
        self.catalog.add_to_transaction(transactional_id, pid, epoch, [("t", 0)], NOW)
        last = sequence + len(records) - 1
        self.producers[transactional_id][2] = last + 1
        return self._produce(records, SequencedBatch(pid, epoch, sequence, last, None if sequence == 0 else (epoch, sequence - 1), True))

    def end(self, transactional_id: str, commit: bool) -> None:
        pid, epoch, _ = self.producers[transactional_id]
        self.catalog.end_transaction(transactional_id, pid, epoch, commit, NOW)

    def _produce(self, records: tuple[tuple[bytes, bytes | None], ...], sequenced: SequencedBatch | None) -> list[int]:
        future = self.agent.produce("t", [Record(0, key, value, NOW) for key, value in records], sequenced)
        self.agent.flush()
        return future.result()

    def compact(self, mode: str = "full") -> dict:
        """One run of `mode` planned, run and committed; its summary's figures."""
        prepared = prepare_plans(self.catalog, mode, NOW, PlannerConfig())
        assert prepared.plan_ids
        summary = run_here(self.catalog, prepared.plan_ids, prepared.groups, NOW)
        assert summary.committed == prepared.plan_ids and summary.uncleanable == []
        return summary

    def read(self) -> list[tuple[int, bytes | None, bytes | None]]:
        return [(r.offset, r.key, r.value) for r in read_records(self.catalog.store, self.catalog.snapshot(), "t", 0)]

    def lso(self) -> int:
        return self.catalog.log_offsets("t")[0].last_stable


def test_undecided_transactional_data_not_cleaned(catalog: Catalog) -> None:
    """Kafka's testUndecidedTransactionalDataNotCleaned: an open transaction holds every compaction at its first offset
    (the LSO): a later plain value of a key does not remove an earlier one at or past it, nor one below it, until the
    transaction ends. Then it does."""
    log = TxnLog(catalog)
    log.plain((b"a", b"a0"), (b"b", b"b0"))  # 0, 1
    assert log.txn("app", (b"c", b"c-txn")) == [2]
    log.plain((b"a", b"a1"), (b"c", b"c1"), (b"b", b"b1"))  # 3, 4, 5
    assert log.lso() == 2
    log.compact()
    # Below the LSO nothing has a newer value below it: every record of the partition stays.
    assert [offset for offset, _, _ in log.read()] == [0, 1, 2, 3, 4, 5]
    log.end("app", commit=True)  # the marker takes offset 6
    assert log.lso() == 7
    log.compact()
    assert log.read() == [(3, b"a", b"a1"), (4, b"c", b"c1"), (5, b"b", b"b1")]
    log.close()
