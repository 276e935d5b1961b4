"""The engine against the reference model: random histories, several compaction rounds, advancing clocks.

Each example creates three topics (compact, compact,delete, delete) with drawn configs and a drawn number
of partitions (1 to 50), then runs a random program of produce steps and compaction steps (one level into
the next, or a full sweep) while the clock moves forward. A produce step writes one L0 file: a few drawn
records, and when drawn, one more record in every other partition of the topic, so files hold from one
section to one per partition. Timestamps lie before the clock out of order, some in the future, under min
lags shorter and longer than the clock's steps. After every step, what `consume` reads of each partition
the step touched (the produced ones, or those of the compaction's input files) must equal the model's log
exactly, and its sections the model's segments (so each first uncleanable offset stays a section boundary),
and every partition is read after the last step; the Kafka guarantees are checked against the produced
history directly: surviving records are the produced ones at their offsets, every key's latest record
survives (until its tombstone's horizon has passed), and no older value of a key ever comes back. Every
example runs on a fresh catalog, half of them on SQLite and half on PostgreSQL.

Under transactions, two transactional ids write a compacted topic among plain producers, committing or aborting
at drawn points between compactions: the model is told which offsets were aborted and where each partition's LSO
is, from what the harness itself produced and ended, and the engine must match it the same way (aborted records
gone after any compaction of them, nothing past the LSO cleaned, its sections cut there).
"""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from lab.reference_model import ModelRecord, ReferenceLog
from logcompact.catalog import Catalog
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS
from logcompact.consume import read_records, read_sections
from logcompact.engine.cleaner import run_plan
from logcompact.ingest import Agent, Record
from logcompact.jobs import commit_plan
from logcompact.store import LocalStore
from logcompact.topics import Topic
from tests.helpers import assert_summaries_kept, full_sweep, level_plans

MAX_PARTITIONS = 50
START = 10_000_000
BUFFER = 1 << 20

configs = st.fixed_dictionaries(
    {
        "c": st.fixed_dictionaries(
            {
                "cleanup.policy": st.just("compact"),
                "delete.retention.ms": st.sampled_from(["0", "500", "3000"]),
                "min.compaction.lag.ms": st.sampled_from(["0", "400", "2000"]),
            }
        ),
        "cd": st.fixed_dictionaries(
            {
                "cleanup.policy": st.just("compact,delete"),
                "retention.ms": st.sampled_from(["1500", "6000"]),
                "delete.retention.ms": st.sampled_from(["0", "1000"]),
                "min.compaction.lag.ms": st.sampled_from(["0", "300", "2000"]),
            }
        ),
        "d": st.fixed_dictionaries({"cleanup.policy": st.just("delete"), "retention.ms": st.sampled_from(["-1", "2500"])}),
    }
)
KEYS = [b"a", b"b", b"c", b"d", b"e", b"f"]
keys = st.sampled_from(KEYS)
values = st.one_of(st.none(), st.binary(min_size=1, max_size=4))
partition_counts = st.integers(1, MAX_PARTITIONS)
# Partitions are drawn below MAX_PARTITIONS and taken modulo the example's count. The last element: whether
# the file also gets one record in every other partition of the topic.
produce_step = st.tuples(
    st.just("produce"),
    st.sampled_from(["c", "cd", "d"]),
    # How far each record's timestamp lies before the clock: out of order, and some in the future.
    st.lists(st.tuples(st.integers(0, MAX_PARTITIONS - 1), keys, values, st.integers(-600, 3000)), min_size=1, max_size=8),
    st.booleans(),
)
compact_step = st.tuples(st.just("compact"), st.sampled_from([0, 1, 2, 3, "full"]), st.integers(0, 2500))
programs = st.lists(st.one_of(produce_step, compact_step), min_size=2, max_size=24)


class Harness:
    def __init__(self, catalog: Catalog, topic_settings: dict[str, dict[str, str]], partitions: int, buffer_bytes: int = BUFFER) -> None:
        self.store = catalog.store
        self.catalog = catalog
        self.catalog.ensure_created(START)
        self.model = ReferenceLog()
        self.now = START
        self.partitions = partitions
        self.buffer_bytes = buffer_bytes
        self.topics = {}
        for name, topic_config in topic_settings.items():
            topic = Topic.create(name, partitions, topic_config, START)
            self.catalog.create_topic(topic, START)
            self.topics[name] = topic
        self.compaction_clocks: list[int] = []
        self.touched: set[tuple[str, int]] = set()  # the partitions the last step may have changed

    def produce(self, topic: str, rows: list[tuple], every_partition: bool = False) -> None:
        rows = [(p % self.partitions, key, value, back) for p, key, value, back in rows]
        if every_partition:
            drawn = {p for p, *_ in rows}
            rows += [(p, KEYS[p % len(KEYS)], b"all-%d" % p, 0) for p in range(self.partitions) if p not in drawn]
        compacted = self.topics[topic].config.compacted
        records = [
            Record(p, key if compacted or key != b"f" else None, value if compacted else (value or b"-"), self.now - back)
            for p, key, value, back in rows
        ]
        with Agent(self.catalog, background=False) as agent:
            future = agent.produce(topic, records)
        by_partition: dict[int, list[ModelRecord]] = {}
        for record, offset in zip(records, future.result()):
            by_partition.setdefault(record.partition, []).append(ModelRecord(offset, record.key, record.value, record.timestamp))
        for partition, produced in by_partition.items():
            self.model.produce(topic, partition, produced)  # one file: one segment per partition
        self.touched = {(topic, record.partition) for record in records}

    def compact(self, what, advance: int) -> None:
        self.now += advance
        snapshot = self.catalog.snapshot()
        if what == "full":
            plan = full_sweep(snapshot, self.now, buffer_bytes=self.buffer_bytes, small_cluster_top=4)
        else:
            plans = [
                p
                for p in level_plans(snapshot, self.now, 1, buffer_bytes=self.buffer_bytes, small_cluster_top=4, tier_min_files=2)
                if p.target_level == what + 1 and p.inputs[0].level == what
            ]
            plan = plans[0] if plans else None
        self.touched = set()
        if plan is None:
            return
        job: dict[tuple[str, int], set[int]] = {}
        for data_file in plan.inputs:
            for section in data_file.sections:
                tables = read_sections(self.store, [(data_file.key, section)])
                offsets = {offset for table in tables for offset in table.column("offset").to_pylist()}
                job.setdefault((section.topic, section.partition), set()).update(offsets)
        result = run_plan(self.store, plan)
        commit_plan(self.catalog, plan, [result], self.now)
        self.model.compact(job, {n: t.config for n, t in self.topics.items()}, self.now, plan.deduplicate)
        self.compaction_clocks.append(self.now)
        self.touched = set(job)

    def check(self, everything: bool = False) -> None:
        """Consume against the model: the partitions the last step touched, or `everything`; and the catalog's
        partition summaries against its sections."""
        assert_summaries_kept(self.catalog)
        snapshot = self.catalog.snapshot()
        for name, topic in self.topics.items():
            for partition in range(self.partitions):
                if not everything and (name, partition) not in self.touched:
                    continue
                consumed = [
                    (r.offset, r.key, r.value, r.timestamp) for r in read_records(self.store, snapshot, name, partition)
                ]
                expected = [(r.offset, r.key, r.value, r.timestamp) for r in self.model.records(name, partition)]
                assert consumed == expected, f"{name}/{partition} differs from the model"
                sections = sorted(
                    (placed.first_offset, placed.last_offset, placed.info.record_count, placed.info.max_timestamp)
                    for _, placed in snapshot.sections_of(name, partition)
                )
                assert sections == self.model.segments(name, partition), f"{name}/{partition}: sections are not the model's segments"
                self._check_guarantees(name, partition, topic, consumed)

    def _check_guarantees(self, name: str, partition: int, topic: Topic, consumed: list[tuple]) -> None:
        produced = {r.offset: r for r in self.model.produced.get((name, partition), [])}
        for offset, key, value, timestamp in consumed:
            original = produced[offset]  # offsets never change, bytes are the produced ones
            assert (key, value, timestamp) == (original.key, original.value, original.timestamp)
        if topic.config.cleanup_policy != "compact":
            return
        # An aborted transaction's records are no value of their key: the latest is the newest of the others.
        aborted = self.model.aborted.get((name, partition), set())
        latest: dict[bytes, ModelRecord] = {}
        for r in sorted(produced.values(), key=lambda r: r.offset):
            if r.offset not in aborted:
                latest[r.key] = r
        newest_consumed: dict[bytes, int] = {}
        for offset, key, _, _ in consumed:
            if offset not in aborted:
                newest_consumed[key] = offset
        for key, record in latest.items():
            if record.value is not None:
                assert newest_consumed.get(key) == record.offset, f"latest value of {key!r} lost"
            else:
                # The tombstone is there, or it was removed and no older value of its key came back.
                assert newest_consumed.get(key) in (record.offset, None), f"an older value of deleted {key!r} came back"


_SETTINGS = {
    "c": {"cleanup.policy": "compact", "delete.retention.ms": "0", "min.compaction.lag.ms": "400"},
    "cd": {"cleanup.policy": "compact,delete", "retention.ms": "1500", "delete.retention.ms": "0", "min.compaction.lag.ms": "0"},
    "d": {"cleanup.policy": "delete", "retention.ms": "-1"},
}


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@settings(max_examples=75)
@given(configs, partition_counts, programs)
# A young record's file copied up the levels with older ones; a later sweep must still remove k@0
# (its section ends before the young record, as Kafka's segment would).
@example(
    {**_SETTINGS, "c": {"cleanup.policy": "compact", "delete.retention.ms": "0", "min.compaction.lag.ms": "2000"}},
    1,
    [("produce", "c", [(0, b"k", b"1", 2600)], False), ("produce", "c", [(0, b"k", b"2", 2600)], False),
     ("produce", "c", [(0, b"z", b"y", 0)], False), ("compact", 0, 100), ("compact", 1, 0), ("compact", "full", 0)],
)
# Found in review: a record wholly past retention still supersedes older values of its key.
@example(_SETTINGS, 2, [("produce", "cd", [(0, b"a", b"old", 0)], False), ("produce", "cd", [(0, b"a", b"new", 600)], False), ("compact", "full", 1000)])
# Found by this test: a young older value must not outlive the tombstone that supersedes it.
@example(_SETTINGS, 2, [("produce", "c", [(1, b"b", b"v", 0), (1, b"b", None, 331)], False), ("compact", "full", 69), ("compact", "full", 0)])
# A tombstone whose horizon has passed stays while an older value of its key lives outside the job.
@example(
    _SETTINGS,
    2,
    [
        ("produce", "c", [(0, b"a", b"old", 600)], False),
        ("compact", 0, 0), ("compact", 1, 0), ("compact", 2, 0),  # the old value reaches L3
        ("produce", "c", [(0, b"a", None, 600)], False),
        ("compact", 0, 0), ("compact", 1, 0),  # the tombstone reaches L2, stamped
        ("compact", 2, 1000),  # horizon passed, but the old value lives in L3, outside this L2->L3 job
    ],
)
def test_engine_matches_the_reference_model(
    tmp_path_factory, make_catalog_url, database, topic_settings, partitions, program
) -> None:
    catalog = Catalog(LocalStore(tmp_path_factory.mktemp("prop")), make_catalog_url(database))
    harness = Harness(catalog, topic_settings, partitions)
    for step in program:
        if step[0] == "produce":
            harness.produce(step[1], step[2], step[3])
        else:
            harness.compact(step[1], step[2])
        harness.check()
    harness.compact("full", 10_000)  # a late sweep: horizons and retention have passed
    harness.check(everything=True)


# Transactions: records of two transactional ids on a compacted topic, among plain ones, committed or aborted at
# drawn points, and compactions in between (an open transaction's records sit at and past its partition's LSO).
txn_step = st.tuples(
    st.just("txn"), st.sampled_from(["x", "y"]), st.integers(0, 2),
    st.lists(st.tuples(keys, values, st.integers(-600, 3000)), min_size=1, max_size=4),
)
end_step = st.tuples(st.just("end"), st.sampled_from(["x", "y"]), st.booleans())
plain_step = st.tuples(
    st.just("produce"), st.just("c"),
    st.lists(st.tuples(st.integers(0, 2), keys, values, st.integers(-600, 3000)), min_size=1, max_size=4), st.just(False),
)
txn_programs = st.lists(st.one_of(txn_step, end_step, plain_step, compact_step), min_size=2, max_size=24)


class TxnHarness(Harness):
    """The harness with transactional producers, through the catalog's coordinator methods: it tells the model which
    offsets were aborted and where each partition's LSO is, from what it produced and ended itself."""

    def __init__(self, catalog: Catalog, topic_settings: dict[str, dict[str, str]]) -> None:
        super().__init__(catalog, topic_settings, 3)
        self.producers: dict[str, tuple[int, int]] = {}  # transactional id: producer id, epoch
        self.sequences: dict[tuple[str, int], int] = {}  # (transactional id, partition): the next sequence
        self.open: dict[str, dict[int, list[int]]] = {}  # transactional id: its records' offsets per partition

    def txn(self, transactional_id: str, partition: int, rows: list[tuple]) -> None:
        if transactional_id not in self.producers:
            self.producers[transactional_id] = self.catalog.init_producer(transactional_id, 60_000, MAX_TIMEOUT_MS, None, self.now)
        pid, epoch = self.producers[transactional_id]
        self.catalog.add_to_transaction(transactional_id, pid, epoch, [("c", partition)], self.now)
        sequence = self.sequences.get((transactional_id, partition), 0)
        last = sequence + len(rows) - 1
        self.sequences[(transactional_id, partition)] = last + 1
        records = [Record(partition, key, value, self.now - back) for key, value, back in rows]
        sequenced = SequencedBatch(pid, epoch, sequence, last, None if sequence == 0 else (epoch, sequence - 1), True)
        with Agent(self.catalog, background=False) as agent:
            future = agent.produce("c", records, sequenced)
        offsets = future.result()
        self.model.produce("c", partition, [ModelRecord(o, r.key, r.value, r.timestamp) for r, o in zip(records, offsets)])
        self.open.setdefault(transactional_id, {}).setdefault(partition, []).extend(offsets)
        self._hold(partition)
        self.touched = {("c", partition)}

    def end(self, transactional_id: str, commit: bool) -> None:
        self.touched = set()
        ended = self.open.pop(transactional_id, None)
        if ended is None:
            return  # nothing produced in it: never begun
        pid, epoch = self.producers[transactional_id]
        self.catalog.end_transaction(transactional_id, pid, epoch, commit, self.now)
        for partition, offsets in ended.items():
            if not commit:
                self.model.abort("c", partition, set(offsets))
            self._hold(partition)
        self.touched = {("c", partition) for partition in ended}

    def _hold(self, partition: int) -> None:
        firsts = [min(offsets[partition]) for offsets in self.open.values() if partition in offsets]
        self.model.hold("c", partition, min(firsts, default=None))


@pytest.mark.parametrize("database", ["sqlite", "postgresql"])
@settings(max_examples=30)
@given(configs, txn_programs)
# A committed value, then an aborted value and an aborted tombstone of the same keys, behind an open transaction.
@example(
    _SETTINGS,
    [("produce", "c", [(0, b"a", b"1", 0), (0, b"b", b"2", 0)], False), ("txn", "x", 0, [(b"a", b"3", 0), (b"b", None, 0)]),
     ("end", "x", False), ("txn", "y", 0, [(b"c", b"4", 0)]), ("produce", "c", [(0, b"c", b"5", 0)], False),
     ("compact", "full", 1000), ("end", "y", True), ("compact", "full", 1000)],
)
# Found by this test: a marker's hole recorded before a compaction's lower one (tests/helpers.py read them unsorted).
@example(_SETTINGS, [("txn", "x", 0, [(b"a", None, 0)]), ("produce", "c", [(0, b"a", None, 0)], False)])
def test_engine_matches_the_reference_model_under_transactions(tmp_path_factory, make_catalog_url, database, topic_settings, program) -> None:
    catalog = Catalog(LocalStore(tmp_path_factory.mktemp("txn")), make_catalog_url(database))
    harness = TxnHarness(catalog, {"c": topic_settings["c"]})
    for step in program:
        if step[0] == "produce":
            harness.produce(step[1], step[2], step[3])
        elif step[0] == "txn":
            harness.txn(step[1], step[2], step[3])
        elif step[0] == "end":
            harness.end(step[1], step[2])
        else:
            harness.compact(step[1], step[2])
        harness.check()
    for transactional_id in sorted(harness.open):
        harness.end(transactional_id, commit=False)
    harness.compact("full", 10_000)
    harness.check(everything=True)
