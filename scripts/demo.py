"""`make demo`: the whole product on the embedded default (a local store, its catalog in SQLite beside the
data), from a Kafka producer through the DAGs as Airflow runs them to a Kafka consumer group.

A local store gets three topics (accounts: compact, clicks: delete, sessions: compact,delete) of 100
partitions each, with skewed keys and tombstones, produced by a Kafka producer (confluent-kafka, acks=all,
lz4) through `logcompact agent` in 40 rounds with timestamps over the last three hours, each round acknowledged
(committed as L0 files) before the next. Then `dag.test()` runs logcompact_compaction (the sensor sees the L0
files, L0 is split into L1), logcompact_max_lag_hourly (the
oldest records are past their 2 h max lag: deduplicated into L2), logcompact_full_sweep_daily and
logcompact_gc, each compaction through spark-submit with Spark in local mode. The report gives files and
bytes per level after each run, records removed and write amplification, and two checks that every key's latest
value survived: through the library's consume, and through a Kafka consumer group reading the compacted topics
back from the agent (each compacted key once, its latest value; every clicks record; the group's committed
offsets at the end of every partition). Beside them a transactional producer commits some transactions and aborts
others on a fourth topic (ledger: compact); after the DAGs' compactions its files hold no aborted record, and a
`read_committed` consumer group reads each key's latest committed value once.

    .venv/bin/python scripts/demo.py [--records 300000] [--dir .demo] [--data-only]

`--data-only` stops after producing the data, through the library: `make airflow` uses it to give the UI
something to compact.
The terminal shows the report alone, and the agent's own log lines; what Airflow (the task logs among it),
Spark and the Kafka clients print goes to demo.log in the work directory, which the first line names.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:  # imported where used, as everything the demo takes from the library
    from logcompact.catalog import Catalog, Snapshot
    from logcompact.store import ObjectStore

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Plan groups of 8 MiB: the demo's tens of MB run as several mapped Spark jobs (production keeps 1 GiB).
DEMO_GROUP_BYTES = 8 * 1024**2
DAG_RUNS = ("logcompact_compaction", "logcompact_max_lag_hourly", "logcompact_full_sweep_daily", "logcompact_gc")
# The transactional producer's compacted topic: its transactions write these keys, a third of them aborted.
LEDGER, LEDGER_PARTITIONS, LEDGER_KEYS = "ledger", 4, 100
LEDGER_TRANSACTIONS, LEDGER_RECORDS = 9, 200  # records a transaction


def configure_airflow(work: Path, store_uri: str) -> None:
    """Airflow's home, DAGs, connections and Spark settings, before Airflow is first imported."""
    os.environ.update(
        AIRFLOW_HOME=str(work / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__LOGGING__LOGGING_LEVEL="INFO",  # into demo.log: the task logs
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW_CONN_LOGCOMPACT_DEFAULT=json.dumps(
            {"conn_type": "generic", "extra": {"store": store_uri, "planner": {"group_bytes": DEMO_GROUP_BYTES}}}
        ),
        AIRFLOW_CONN_LOGCOMPACT_SPARK=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    sys.path.insert(0, str(REPO / "plugins"))
    for command in (["db", "migrate"], ["pools", "set", "logcompact", "4", "logcompact compactions"]):
        subprocess.run([str(BIN / "airflow"), *command], check=True, capture_output=True)


def load_dags() -> dict:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    if bag.import_errors:
        raise SystemExit(f"demo: the DAGs do not import: {bag.import_errors}")
    for dag in bag.dags.values():
        for task in dag.tasks:
            task.retries = 0  # the demo stops at the first failure instead of waiting out retry delays
    return bag.dags


def register_topic_assets(cluster_id: str) -> None:
    """The demo topics' assets, registered and active before the first commit emits events for them. The
    commit task emits one through an alias for each topic it compacted; Airflow creates an asset first seen that
    way inactive (with a warning per event) until its scheduler activates it, and dag.test() runs no scheduler."""
    from airflow.assets.manager import asset_manager
    from airflow.models.asset import AssetActive
    from airflow.serialization.definitions.assets import SerializedAsset
    from airflow.utils.session import create_session

    from logcompact.lab.demo import TOPICS
    from logcompact_airflow.operators.compaction import topic_asset

    assets = [topic_asset(cluster_id, name) for name in [spec.name for spec in TOPICS] + [LEDGER]]
    with create_session() as session:
        models = asset_manager.create_assets(
            [SerializedAsset(name=asset.name, uri=asset.uri, group=asset.group, extra={}, watchers=[]) for asset in assets], session=session
        )
        session.flush()
        session.add_all(AssetActive.for_asset(model) for model in models)


def groups_run(dag_id: str, run_id: str) -> int:
    """How many mapped compact_group jobs a run ran."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id="compact_group", state="success").count()


@contextmanager
def running_agent(store_uri: str, stderr: TextIO) -> Iterator[str]:
    """`logcompact agent` as a process of its own on a free port of 127.0.0.1, its log lines to `stderr`: its
    address; stopped by SIGTERM."""
    command = [str(BIN / "logcompact"), "--store", store_uri, "agent", "--listen", "127.0.0.1:0", "--processes", "1"]
    agent = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True)
    try:
        assert agent.stdout is not None
        listening = agent.stdout.readline()
        if not listening:
            raise SystemExit(f"demo: the Kafka agent did not start (exit {agent.wait()}); its error is above")
        yield json.loads(listening)["listening"]
    finally:
        agent.send_signal(signal.SIGTERM)
        if agent.wait(timeout=60) != 0:
            raise SystemExit(f"demo: the Kafka agent exited {agent.returncode} when stopped; its log is above")


def produce_through_kafka(bootstrap: str, records: int, first_timestamp: int, last_timestamp: int) -> dict:
    """The demo's rounds (`skewed_rounds`) from a Kafka producer, each round acknowledged (committed) before the
    next; returns each partition's latest value per key. librdkafka's default, idempotence off: an idempotent
    librdkafka producer keeps at most 5 requests in flight per connection, each of one partition's batch, and each
    waits for its L0 file's commit, so over the demo's 300 partitions it would send a few hundred records a second
    (docs/agent.md, Produce)."""
    from confluent_kafka import KafkaError, Producer

    from logcompact.lab.demo import skewed_rounds

    producer = Producer({
        "bootstrap.servers": bootstrap, "acks": "all", "compression.type": "lz4",
        "linger.ms": 20, "batch.size": 1_000_000,
    })
    failed: list[KafkaError] = []

    def delivered(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failed.append(error)

    latest: dict = {}
    for _round_timestamp, batches in skewed_rounds(records, 40, first_timestamp, last_timestamp, latest):
        for topic, batch in batches.items():
            for record in batch:
                while True:
                    try:
                        producer.produce(topic, record.value, record.key, record.partition, on_delivery=delivered, timestamp=record.timestamp)
                        break
                    except BufferError:  # the client's queue is full: let deliveries drain it
                        producer.poll(0.1)
        if producer.flush(120) or failed:
            raise SystemExit(f"demo: the Kafka producer could not deliver every record: {failed[:1] or 'flush timed out'}")
    return latest


def read_back_with_a_consumer_group(bootstrap: str, latest: dict, clicks: int, high_watermarks: dict[str, list[int]]) -> int:
    """A Kafka consumer group reads every topic back from the agent: each compacted key once, with its latest
    value (a deleted key's tombstone, or nothing), every clicks record; then commits, and its committed offsets
    are the partitions' ends. Returns the records read."""
    from confluent_kafka import Consumer, KafkaError, TopicPartition

    from logcompact.lab.demo import PARTITIONS, TOPICS

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "logcompact-demo", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "enable.partition.eof": True,
    })
    consumer.subscribe([spec.name for spec in TOPICS])
    found: dict[tuple[str, int], dict[bytes, bytes | None]] = {}
    at_end: set[tuple[str, int]] = set()
    read = clicks_read = 0
    deadline = time.monotonic() + 300
    while len(at_end) < len(TOPICS) * PARTITIONS:
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: the consumer group reached the end of {len(at_end)} of {len(TOPICS) * PARTITIONS} partitions in 300 s")
        message = consumer.poll(1)
        if message is None:
            continue
        place = (message.topic(), message.partition())
        if message.error():
            if message.error().code() != KafkaError._PARTITION_EOF:
                raise SystemExit(f"demo: the consumer group failed: {message.error()}")
            at_end.add(place)
            continue
        read += 1
        if message.topic() == "clicks":
            clicks_read += 1
            continue
        keys = found.setdefault(place, {})
        if message.key() in keys:
            raise SystemExit(f"demo: key {message.key()!r} read twice from {place}: the full sweep left a duplicate")
        keys[message.key()] = message.value()
    for (topic, partition), keys in found.items():
        live = {k: v for k, v in keys.items() if v is not None}
        expected = {k: v for k, v in latest[topic][partition].items() if v is not None}
        if live != expected:
            raise SystemExit(f"demo: the consumer group read {len(live)} live keys from {topic}/{partition}, expected {len(expected)}")
    if clicks_read != clicks:
        raise SystemExit(f"demo: the consumer group read {clicks_read:,} clicks records, produced {clicks:,}")
    consumer.commit(asynchronous=False)
    ends = [TopicPartition(spec.name, p) for spec in TOPICS for p in range(PARTITIONS)]
    committed = {(tp.topic, tp.partition): tp.offset for tp in consumer.committed(ends, timeout=30)}
    consumer.close()
    behind = [place for place, offset in committed.items() if offset != high_watermarks[place[0]][place[1]]]
    if behind:
        raise SystemExit(f"demo: the group's committed offsets are not at the end of {len(behind)} partitions (first: {behind[0]})")
    return read



@dataclass
class Ledger:
    """What the transactional producer left: each key's latest committed value by partition, and its counts."""

    latest: dict[int, dict[bytes, bytes]] = field(default_factory=dict)
    committed: int = 0  # transactions
    aborted: int = 0
    aborted_records: int = 0


def create_ledger(catalog: Catalog, now: int) -> None:
    from logcompact.topics import Topic

    catalog.create_topic(Topic.create(LEDGER, LEDGER_PARTITIONS, {"cleanup.policy": "compact"}, now), now)


def produce_transactions(bootstrap: str) -> Ledger:
    """A transactional producer (confluent-kafka) writes LEDGER_TRANSACTIONS transactions of LEDGER_RECORDS records
    over the ledger's keys and aborts every third, its records first delivered (an abort purges what is unsent), so
    the aborted records are in the log and an aborted value is written after a committed one of the same key."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "logcompact-demo-ledger", "linger.ms": 20})
    producer.init_transactions(30)
    ledger = Ledger()
    for number in range(LEDGER_TRANSACTIONS):
        aborting = number % 3 == 2
        producer.begin_transaction()
        writes = {}
        for n in range(LEDGER_RECORDS):
            key = b"account-%03d" % ((number * 37 + n) % LEDGER_KEYS)
            value = b"%s in transaction %d" % (b"aborted" if aborting else b"committed", number)
            partition = int(key[-3:]) % LEDGER_PARTITIONS
            producer.produce(LEDGER, value, key, partition)
            writes[(partition, key)] = value
        if aborting:
            if producer.flush(60):
                raise SystemExit("demo: the transactional producer could not deliver its records before aborting")
            producer.abort_transaction(60)
            ledger.aborted += 1
            ledger.aborted_records += LEDGER_RECORDS
        else:
            producer.commit_transaction(60)
            ledger.committed += 1
            for (partition, key), value in writes.items():
                ledger.latest.setdefault(partition, {})[key] = value
    return ledger


def verify_ledger_compacted(store: ObjectStore, snapshot: Snapshot, ledger: Ledger) -> int:
    """Through consume at read_uncommitted, which leaves nothing out: the ledger's files hold each key once, with its
    latest committed value, and no aborted record. Returns the records held."""
    from logcompact.consume import read_batches
    from logcompact.exceptions import VerificationError

    held = 0
    for partition in range(LEDGER_PARTITIONS):
        keys: list[bytes] = []
        values: list[bytes] = []
        for batch in read_batches(store, snapshot, LEDGER, partition):
            keys += batch.column("key").to_pylist()
            values += batch.column("value").to_pylist()
        aborted = sum(value.startswith(b"aborted") for value in values)
        if aborted:
            raise VerificationError(f"demo check failed: {LEDGER}/{partition} still holds {aborted} aborted records after compaction")
        if len(keys) != len(set(keys)) or dict(zip(keys, values)) != ledger.latest.get(partition, {}):
            raise VerificationError(f"demo check failed: {LEDGER}/{partition} holds {len(keys)} records, not each of its "
                                    f"{len(ledger.latest.get(partition, {}))} keys once with its latest committed value")
        held += len(keys)
    return held


def read_ledger_committed(bootstrap: str, ledger: Ledger) -> int:
    """A read_committed consumer group reads the ledger to its end: each key once, its latest committed value, no
    aborted record. Returns the records read."""
    from confluent_kafka import Consumer, KafkaError

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": "logcompact-demo-ledger", "auto.offset.reset": "earliest",
        "isolation.level": "read_committed", "enable.partition.eof": True,
    })
    consumer.subscribe([LEDGER])
    found: dict[int, dict[bytes, bytes]] = {}
    at_end: set[int] = set()
    read = 0
    deadline = time.monotonic() + 120
    while len(at_end) < LEDGER_PARTITIONS:
        if time.monotonic() > deadline:
            raise SystemExit(f"demo: the read_committed group reached the end of {len(at_end)} of {LEDGER_PARTITIONS} ledger partitions in 120 s")
        message = consumer.poll(1)
        if message is None:
            continue
        error, partition = message.error(), message.partition()
        assert partition is not None  # a message of a subscribed partition
        if error is not None:
            if error.code() != KafkaError._PARTITION_EOF:
                raise SystemExit(f"demo: the read_committed group failed: {error}")
            at_end.add(partition)
            continue
        read += 1
        key, value = message.key(), message.value()
        assert key is not None and value is not None  # the producer wrote no null
        keys = found.setdefault(partition, {})
        if key in keys or value.startswith(b"aborted"):
            raise SystemExit(f"demo: the read_committed group read {key!r} = {value!r} from {LEDGER}/{partition}: a duplicate or an aborted record")
        keys[key] = value
    consumer.close()
    if {p: keys for p, keys in found.items() if keys} != {p: keys for p, keys in ledger.latest.items() if keys}:
        raise SystemExit("demo: the read_committed group did not read each ledger key's latest committed value")
    return read


def ledger_report(ledger: Ledger, held: int, read: int) -> str:
    return (f"verified transactions: {ledger.committed} committed and {ledger.aborted} aborted ({ledger.aborted_records:,} aborted records) "
            f"on {LEDGER}; after compaction its files hold {held:,} records, none aborted, and a read_committed consumer group read "
            f"{read:,}, each key's latest committed value once")

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--dir", type=Path, default=REPO / ".demo")
    parser.add_argument("--data-only", action="store_true", help="produce the data, run no DAG")
    args = parser.parse_args()
    work = args.dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "store").mkdir(parents=True)

    from logcompact.lab.demo import Terminal, output_to_log

    log = work / "demo.log"
    # Producing through the library alone (--data-only) runs nothing that prints: the terminal's streams stay.
    with nullcontext(Terminal(sys.stdout, sys.stderr)) if args.data_only else output_to_log(log) as terminal:
        run_demo(args.records, work, args.data_only, log, terminal.out, terminal.err)


def run_demo(records: int, work: Path, data_only: bool, log: Path, out: TextIO, agent_log: TextIO) -> None:
    """The demo in `work`: the report to `out`, the agents' log lines to `agent_log`; `log` holds the rest."""
    from logcompact.catalog import Catalog
    from logcompact.exceptions import VerificationError
    from logcompact.lab.demo import HOUR_MS, TOPICS, create_skewed_topics, describe_levels, level_table, produce_skewed, verify_latest
    from logcompact.store import LocalStore

    store = LocalStore(work / "store")
    catalog = Catalog(store)  # the embedded default: catalog.db in the store directory
    now = int(time.time() * 1000)
    create_skewed_topics(catalog, now - 3 * HOUR_MS)
    ledger = None
    if data_only:
        latest = produce_skewed(catalog, records, files=40, first_timestamp=now - 3 * HOUR_MS, last_timestamp=now)
    else:
        with running_agent(store.uri, agent_log) as bootstrap:
            print(f"logcompact agent on {bootstrap}: producing through Kafka (confluent-kafka, acks=all, lz4)", file=out)
            latest = produce_through_kafka(bootstrap, records, now - 3 * HOUR_MS, now)
            create_ledger(catalog, now)
            ledger = produce_transactions(bootstrap)
            print(f"  and a transactional producer: {ledger.committed} transactions committed and {ledger.aborted} aborted on {LEDGER}", file=out)
    start = catalog.snapshot()
    start_files = start.file_summaries()
    ingested_bytes = sum(f.size for f in start_files)
    records_in = sum(f.record_count for f in start_files)
    clicks = sum(catalog.next_offsets("clicks"))  # nothing compacted yet: every offset given is a record
    print(f"store {store.uri}: produced {records_in:,} records in {len(start_files)} L0 files ({ingested_bytes / 1e6:.1f} MB)", file=out)
    print(f"  before: {describe_levels(start)}", file=out)
    if data_only or ledger is None:
        return

    configure_airflow(work, store.uri)
    dags = load_dags()
    register_topic_assets(catalog.cluster_id)
    written_bytes = groups_total = most_groups = 0
    for dag_id in DAG_RUNS:
        before = {f.key for f in catalog.snapshot().file_summaries()}
        started = time.perf_counter()
        run = dags[dag_id].test()
        after = catalog.snapshot()
        live = after.file_summaries()
        added = [f for f in live if f.key not in before]
        written_bytes += sum(f.size for f in added)
        replaced = len(before - {f.key for f in live})
        groups = groups_run(dag_id, run.run_id)
        groups_total, most_groups = groups_total + groups, max(most_groups, groups)
        print(
            f"{dag_id}: {run.state} in {time.perf_counter() - started:.1f} s; {replaced} files replaced by {len(added)}"
            f"{f' in {groups} mapped Spark group(s)' if dag_id != 'logcompact_gc' else ''}",
            file=out,
        )
        print(f"  after: {describe_levels(after)}", file=out)
        if str(run.state) != "success":
            raise SystemExit(f"demo: {dag_id} ended {run.state}; its task logs are in {log}")

    if most_groups < 2:
        raise SystemExit(f"demo: no run had more than one mapped group (groups of {DEMO_GROUP_BYTES:,} bytes); make them smaller")
    end = catalog.snapshot()
    records_out = sum(records for _files, _size, records in level_table(end).values())
    checked = verify_latest(store, end, latest, clicks)
    if records_out >= records_in:
        raise VerificationError(f"demo check failed: compaction removed no records ({records_in:,} in, {records_out:,} out)")
    print(
        f"report: {records_in:,} records in, {records_out:,} out ({records_in - records_out:,} removed, "
        f"{1 - records_out / records_in:.1%}); {ingested_bytes / 1e6:.1f} MB ingested, {written_bytes / 1e6:.1f} MB written by "
        f"compactions in {groups_total} mapped Spark groups: write amplification {(ingested_bytes + written_bytes) / ingested_bytes:.2f}",
        file=out,
    )
    print(f"verified through consume: all {checked:,} live keys hold their latest value, deleted keys stay deleted, "
          f"clicks (delete policy) kept all {clicks:,} records", file=out)
    held = verify_ledger_compacted(store, end, ledger)
    with running_agent(store.uri, agent_log) as bootstrap:
        ends = {spec.name: catalog.next_offsets(spec.name) for spec in TOPICS}
        read = read_back_with_a_consumer_group(bootstrap, latest, clicks, ends)
        ledger_read = read_ledger_committed(bootstrap, ledger)
    print(f"verified through a Kafka consumer group on {bootstrap}: {read:,} records read, each compacted key once with its "
          f"latest value, all {clicks:,} clicks records; offsets committed at every partition's end", file=out)
    print(ledger_report(ledger, held, ledger_read), file=out)


if __name__ == "__main__":
    main()
