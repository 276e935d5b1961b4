"""The server's one ingest agent and the one thread that feeds it: what Produce handlers hand over, in request
order, with the topics as last read, the idempotent producers' state and the transactional producers' transactions
(`producer_state`) kept on that thread."""

from __future__ import annotations

import logging
import time
from collections.abc import Collection
from concurrent.futures import Future, ThreadPoolExecutor

import pyarrow as pa

from logcompact.catalog import Catalog
from logcompact.catalog.model import TopicPartition
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.schema import UNKNOWN_CODEC, compile_crc_bindings
from logcompact.exceptions import IngestError
from logcompact.format.xxh3 import compile_hasher
from logcompact.ingest import Agent, FlushStats
from logcompact.kafka import codec, records
from logcompact.kafka.event_loop import LoopResults
from logcompact.kafka.producer_state import ProducerStateError, ProducerStateManager, TransactionViews
from logcompact.sketch import compile_sketcher
from logcompact.topics import Topic

# How long an agent trusts what it read of the topics before reading them again for a produce: topics are
# created, deleted, given partitions and altered by any agent or the CLI (this agent's own admin requests
# refresh at once).
TOPICS_MAX_AGE_SECONDS = 1.0

log = logging.getLogger(__name__)


class Ingest:
    """The server's one ingest agent, fed by one thread: what a handler submits to `thread` before its first
    await reaches the agent in request order, batches are decoded there (the numba loops release the GIL) while the
    event loop reads the next requests, and when producers outrun the flusher (a second buffer full before the first
    is written) the agent's inline flush blocks that thread (backpressure on every producer) instead of the event
    loop. `topic`, `produce` and `produce_sequenced` run on that thread only.

    Idempotent producers' batches are checked here, on that thread, against the producers' state (`producers`), and
    transactional producers' against their transactions (`transactions`)."""

    def __init__(self, catalog: Catalog, flush_interval_ms: int, flush_bytes: int) -> None:
        self.catalog = catalog
        self.flush_interval_ms = flush_interval_ms
        self.flush_bytes = flush_bytes
        self.thread = ThreadPoolExecutor(1, thread_name_prefix="logcompact-kafka-ingest")
        self.results = LoopResults()  # what the ingest thread and the flusher complete, to the event loop
        self.flushes = FlushStats()  # of every ingest agent this one has had (a failed flush replaces the agent)
        records.compile_decoder()  # seconds on a fresh install: before clients, not in a Produce or a flush
        compile_hasher()
        compile_sketcher()
        compile_crc_bindings()
        self._agent = self._new_agent()
        self.producers = ProducerStateManager(catalog)  # idempotent producers' state, used on the ingest thread
        self.transactions = TransactionViews(catalog)  # transactional producers' transactions, used on the ingest thread
        self._topics: dict[str, Topic] = {}
        self._topic_ids: dict[str, int] = {}  # the catalog's, which transactions name partitions by
        self._read_at = float("-inf")  # time.monotonic() of the last read of the topics; -inf: read at the next produce
        self._forgotten = 0  # forget_topics calls: a read begun before the last one does not count as fresh
        # Topics read again because of their age are read here, so no produce waits for the catalog on the ingest thread.
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="logcompact-kafka-topics")
        self._reading: Future | None = None

    def _new_agent(self) -> Agent:
        return Agent(self.catalog, flush_interval_ms=self.flush_interval_ms, flush_bytes=self.flush_bytes, stats=self.flushes)

    def topic(self, name: str) -> Topic | None:
        """The topic as the catalog describes it, or None: read at once for a name not seen in the last read or after
        `forget_topics`; a read older than TOPICS_MAX_AGE_SECONDS is renewed in the background (the produce goes on
        with it: a catalog read takes tens of milliseconds, which every request queued behind it would wait)."""
        if name not in self._topics or self._read_at == float("-inf"):
            self._read_topics()
        elif time.monotonic() - self._read_at > TOPICS_MAX_AGE_SECONDS and (self._reading is None or self._reading.done()):
            self._reading = self._reader.submit(self._read_topics)
        return self._topics.get(name)

    def forget_topics(self) -> None:
        """Read the topics again at the next produce (this agent just changed one)."""
        self._forgotten += 1
        self._read_at = float("-inf")

    def _read_topics(self) -> None:
        forgotten = self._forgotten
        snapshot = self.catalog.snapshot()
        self._topics, self._topic_ids = snapshot.topics, snapshot.topic_ids
        self._agent.use_topics(self._topics)  # the ingest agent checks partitions and keys by the same view
        self._read_at = time.monotonic() if forgotten == self._forgotten else float("-inf")

    def produce(
        self, topic: str, partition: int, columns: pa.RecordBatch, sequenced: SequencedBatch | None = None, after: Future | None = None,
        produced_codec: int = UNKNOWN_CODEC,
    ) -> Future:
        """The offsets (an array) of a batch's records (ingest.PRODUCE_SCHEMA), produced with Kafka codec `produced_codec`,
        once their L0 file is committed. An ingest
        agent whose flush failed refuses every later batch (its error raised again), so it is closed and replaced: the
        failed flush's batches were answered with its error, and the next ones get a fresh agent."""
        try:
            return self._agent.produce_columns(topic, partition, columns, sequenced, after, produced_codec)
        except IngestError as exc:
            log.warning("ingest agent replaced after a failed flush: %s", exc)
            failed, self._agent = self._agent, self._new_agent()
            try:
                failed.close()
            except IngestError:
                pass  # the same failure, already answered to its batches
            return self._agent.produce_columns(topic, partition, columns, sequenced, after, produced_codec)

    def produce_sequenced(
        self, topic: str, partition: int, columns: pa.RecordBatch, producer_id: int, epoch: int, first_sequence: int, transactional: bool = False,
        produced_codec: int = UNKNOWN_CODEC,
    ) -> Future:
        """An idempotent producer's batch: the future of its offsets, or for a retry of one of the producer's newest 5
        batches, that batch's (`ProducerStateManager.append`, which raises ProducerStateError for a batch refused).
        A transactional batch that is not a retry must be in its producer's open transaction (`TransactionViews`)."""
        check = None
        if transactional:
            def check() -> None:
                topic_id = self._topic_ids.get(topic)
                if topic_id is None:  # deleted since the request's topic was looked up
                    raise ProducerStateError(codec.ErrorCode.unknown_topic_or_partition, f"no topic {topic!r} in the catalog")
                self.transactions.check(producer_id, epoch, (topic_id, partition), f"{topic}-{partition}")
        return self.producers.append(
            topic, partition, columns.num_rows, producer_id, epoch, first_sequence,
            lambda sequenced, after: self.produce(topic, partition, columns, sequenced._replace(transactional=transactional), after, produced_codec),
            check,
        )

    def transaction_added(self, producer_id: int, epoch: int, partitions: Collection[TopicPartition]) -> None:
        """The partitions joined the producer's transaction at `epoch` (this agent's coordinator added them)."""
        if any(topic not in self._topic_ids for topic, _ in partitions):
            self._read_topics()
        ids = self._topic_ids
        self.transactions.added(producer_id, epoch, frozenset((ids[topic], partition) for topic, partition in partitions if topic in ids))

    def flush(self) -> None:
        """Commit what is buffered now. A failure is not raised: it was answered to the batches it failed."""
        try:
            self._agent.flush()
        except IngestError as exc:
            log.warning("ingest agent flush failed: %s", exc)

    def close(self) -> None:
        """Hand over what was submitted, then flush and commit everything buffered."""
        self.thread.shutdown(wait=True)
        self._reader.shutdown(wait=True)
        self._agent.close()
