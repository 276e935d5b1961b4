"""`logcompact agent` against its targets and side by side with Apache Kafka itself, measured with confluent-kafka
(librdkafka): one agent process, one Apache Kafka broker and librdkafka's built-in mock cluster
(`test.mock.num.brokers: 1`, the client's own ceiling here), the same clients sending the same load to each in one run.

    .venv/bin/python bench/agent.py                  # every measure on agent, Kafka and mock, 3 repetitions, medians
    .venv/bin/python bench/agent.py --quick          # fewer records, 1 repetition, 10 s of many clients
    .venv/bin/python bench/agent.py --records 200000 --repeat 5
    .venv/bin/python bench/agent.py --clusters agent,mock   # without Apache Kafka
    .venv/bin/python bench/agent.py --measures txn   # the transactions' targets (about 15 minutes)
    .venv/bin/python bench/agent.py --measures security   # over SASL_SSL against PLAINTEXT (bench/agent_security.py)
    .venv/bin/python bench/agent.py --measures produce --agent-metrics   # the agent serving /metrics, scraped every second
    .venv/bin/python bench/agent.py --measures metrics    # what counting costs a request, in this process
    .venv/bin/python bench/agent.py --measures fetch-compression   # bytes sent and records/s, uncompressed, lz4, zstd
    .venv/bin/python bench/agent.py --measures fetch-costs   # Fetch's per-request costs with many consumers, in this process

Apache Kafka (KAFKA_VERSION of lab/servers/kafka.py, its jars fetched by Maven into the shared cache by `make kafka`)
runs as one KRaft node, broker and controller in one JVM, on 127.0.0.1 with the broker's defaults: `log.flush.*`
unset (an append is acknowledged from the page cache, as Kafka runs), `group.initial.rebalance.delay.ms` 3 s, and a
1 GiB heap (KAFKA_HEAP, kafka-server-start.sh's own). Each measure runs on every cluster in turn, the first one
rotating with the repetition, and the agent's ratio to Kafka is printed beside the targets of the comparison:
produce 100 B and 1 KiB >= 0.8, fetch records/s and MB/s >= 0.9 with the same client, a group of 3 from joining to
its first record <= 1.2; beside them the agent's own: ack p99 <= 400 ms at its 250 ms flush, and 50 producers at
1,000 records/s with 50 consumers (`--clients`) all acknowledged and consumed. The output says what differs in
durability: an agent's acknowledgement waits for the object store and the catalog, Kafka's for its page cache (and,
with more brokers, its replicas'). A missed target is printed with MISSED and with a py-spy profile of the agent
running that measure once more after the timed runs (a sampler in them would take CPU the agent's runs need and
Kafka's do not). Before the measures, a file fills the machine's free memory with page cache (`fill_page_cache`,
`--leave-free-memory` not to), so that both servers write into reclaimed pages, as on a machine in service.
    .venv/bin/python bench/agent.py --quick --measures produce --agent-processes 1   # `logcompact agent --processes 1`

The agent runs as `logcompact agent` on 127.0.0.1 (free ports, --flush-ms 250), as many processes as it runs by
default (one per core: `--agent-processes`), over a SQLite catalog and a local store in a temporary directory. Measures (and targets):

* produce, 100 B values, lz4, acks=all: records/s (>= 500k), and the server's CPU per million records (the agent's
  and Kafka's process; the mock runs in this one);
* produce, 1 KiB values (random, uncompressed), acks=all: MB/s of values (>= 150 MB/s). Each produce run sends
  `--produce-records` (3,000,000) of 100 B or a third as many of 1 KiB, and its rate is from the first send to the
  last acknowledgement. The agent's last acknowledgement waits out one flush interval (the wait is printed per
  cluster), which in runs of one or two seconds was a sixth to a quarter of the run; runs of four to six seconds make
  it a twentieth, as a sustained rate should (the ack latency is a measure of its own). Beside each run, how long the
  server took to answer the producer's requests under that load (librdkafka's `rtt` statistic);
* ack latency at acks=all with the agent's 250 ms flush: p50 and p99 of produce-to-delivery-report at a steady
  5,000 records/s (p99 <= 400 ms);
* fetch of a compacted topic from files: records produced with repeated keys (100 B values, and 1 KiB values for
  the MB/s), compacted by a full sweep through the library (the engine, as `logcompact compact` runs it) so every
  record is read from L1+ files (Kafka and the mock are given as many records of the same sizes, each key once), then
  read from the beginning by Debian's `kcat -C -e` (librdkafka in C, each
  record's key and value sizes written to a pipe: the client costs little beside the agent) with 4 MiB per
  partition and 50 MiB per fetch: records/s and MB/s of keys and values (>= 1M records/s, >= 300 MB/s), timed from
  the first record to the end of every partition, the median of WARM_READS (5) reads after an untimed one (which
  pays for the page cache and the agent's file cache), the clusters in turn each time; kcat reads as many records of
  the same sizes from the mock cluster, which keeps only the newest 5 MiB of batches per partition (about 20,000 of the 1 KiB records: a run too
  short to be a ceiling; its 100 B figure is the client's). Beside them, the agent's read path alone, in this
  process (`kafka.handlers.fetch.read`, what the Fetch handler runs per request, through a new file cache of the agent's
  default size, with the same limits), so a reader sees what the server takes and what the socket and the client
  add;
* a consumer group of 3 (one group, subscribing at once): seconds from subscribing to every member's first record
  (<= 5 s);
* the agent's resident memory after each measure (printed), and its largest while `--clients` (100) clients work
  at once for `--clients-seconds`: half producers (each its own librdkafka instance, acks=all, `--clients-rate`
  records a second), half consumers of one group (a partition each), beside the bounds its settings set; records
  acked of those offered and consumed (the consumers get a third more time to catch up), and when the group's first
  record came; the same against Kafka (its resident memory too), not against the mock, whose topics all have 4
  partitions.

`--measures fetch-compression` measures compressed fetches: `--records` JSON records (about 200 B, a few fields
varying) produced with lz4 into three topics alike, each with a compression.type of its own (uncompressed, lz4,
zstd), each read from the beginning by kcat as the fetch measure reads (one client, one agent of a cluster of its
own, one run, topics in turn). The agent advertises a relay in this process (splice(2) through a pipe, in the
kernel: a loopback hop) that counts the bytes it sends kcat, every response: the bytes on the wire; beside them the
bytes of the record batches alone (the agent's read path in this process, `kafka.handlers.fetch.read`), kcat's
records/s and the agent's CPU seconds per million records (user and system, from /proc).

`--measures fetch-costs` times, in this process, Fetch's per-request costs under many consumers, each before and after
in turn: a consumer of each of 50 partitions reading 20 L0 files of them (250 records of 100 B in each partition of
each file, as an agent's flushes of 50 producers at 1,000 records/s hold them) through `kafka.handlers.fetch.read`, each
reader decoding the blocks it needs or all of them sharing the agent's cache of decoded blocks (the blocks decoded
printed beside); the topic's log offsets for a request, read from the catalog or kept per catalog version; and a Fetch
response of 4 x 12 MiB of batches encoded into one buffer by kio or as parts.

`--measures txn` measures the transactions' targets, each printed with its target and whether it is met:

* EndTxn's catalog transaction (`Catalog.end_transaction`, what the EndTxn handler awaits; the agent keeps no timing
  of its own), timed in this process over real transactions of one producer, each adding 10 partitions and
  appending an L0 file with a transactional batch of 100 records in each, one in ten aborting: p50 and p99 on
  SQLite and on a throw-away PostgreSQL on disk (bench/postgres_server.py);
* on the same catalogs, bench/catalog.py's append of a file of 1,000 partitions, alone, against the same file with
  a transactional batch in 100 of its sections, and with the same 100 batches idempotent: medians, alternating;
* against the agent, with confluent-kafka: `commit_transaction()` of 1,000 records of 100 B over 10 partitions
  (p50, p99; and `flush()` alone, the acknowledgements it waits for); one transactional producer's committed
  transactions a second (100 records each); 8 transactional producers (transactions of 10,000 records) against the
  same 8 idempotent without transactions, each side in turn for 30 s (6 with --quick) per repetition; commit to the first
  `read_committed` delivery (p99); kcat's records a second at `read_committed` against `read_uncommitted` over the
  same data, all committed and with one transaction in ten aborted, beside the agent's read path alone.

`--agent-metrics` starts the agent with `--metrics-listen` and scrapes its /metrics every second meanwhile (Prometheus
scrapes every 15 to 60 s), printing the scrapes, the slowest, and the Produce requests and records the last counted.
`--measures metrics` times, in this process, what the agent's metrics add to a request on the event loop
(`AgentMetrics.answered`, kafka/metrics.py) for a Produce of one partition's batch, of 4 partitions, and a Fetch
answer of 4 partitions: microseconds per request, medians of 5 runs of 100,000.

Figures are printed, never asserted. The CPU model and load average are printed beside them: this machine is
shared, and the figures move with its load.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import math
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import agent_security
import psutil
import pyarrow.compute as pc
from catalog import WIDE_PARTITIONS, WIDE_TOPICS
from confluent_kafka import OFFSET_END, Consumer, KafkaError, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from postgres_server import ThrowAwayPostgres
from profiling import sampled
from results import recorded

from logcompact.catalog import Catalog, NewFile
from logcompact.catalog.producers import PlacedBatch, SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS
from logcompact.cli.agent_processes import available_cores
from logcompact.consume import ISOLATION_LEVELS, READ_UNCOMMITTED, read_batches
from logcompact.format import SectionInfo, section_table, write_segment
from logcompact.jobs import run_and_commit
from logcompact.kafka.handlers import fetch
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.store import LocalStore, open_store
from logcompact.store.cache import CachedStore
from logcompact.topics import Topic
from logcompact.units import wall_clock_ms

# The lab (lab/servers/kafka.py: Apache Kafka's broker) is in the checkout, not in the wheel.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from lab.servers.kafka import KAFKA_VERSION, KafkaStartError, start_kafka

PARTITIONS = 4
FLUSH_MS = 250
LATENCY_RATE = 5_000  # records/s while ack latency is measured
STATS_MS = 500  # the producer's statistics window while it produces as fast as it can
PRODUCER = {"linger.ms": 5, "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1_048_576,
            "enable.idempotence": False, "acks": "all"}
FETCH_MAX_BYTES, PARTITION_FETCH_BYTES = 52_428_800, 4_194_304
# librdkafka stops fetching a partition holding queued.min.messages (100,000) and waits fetch.error.backoff.ms (500 ms)
# before it asks again: raised and shortened, so kcat's own queue never idles the server it measures.
KCAT = {"fetch.max.bytes": FETCH_MAX_BYTES, "max.partition.fetch.bytes": PARTITION_FETCH_BYTES, "queued.max.messages.kbytes": 262_144,
        "queued.min.messages": 10_000_000, "fetch.error.backoff.ms": 10}
KCAT_SECONDS = 300
WARM_READS = 5  # timed kcat reads of each fetch measure per repetition (after an untimed one): their median is noted


@dataclass
class Cluster:
    """Where a measure runs: the agent (with its store, for compaction) or the mock cluster."""

    name: str
    bootstrap: str
    catalog: Catalog | None = None
    client: dict[str, Any] = field(default_factory=dict)  # librdkafka's settings to reach it (its security protocol), or to watch it

    def create_topic(self, name: str, cleanup_policy: str, partitions: int = PARTITIONS) -> None:
        if self.catalog is not None:
            now = int(time.time() * 1000)
            self.catalog.create_topic(Topic.create(name, partitions, {"cleanup.policy": cleanup_policy}, now), now)
        else:  # the mock cluster creates a topic when a client first asks for it, with 4 partitions
            found = Producer({"bootstrap.servers": self.bootstrap}).list_topics(name, timeout=10).topics[name]
            if len(found.partitions) != partitions:
                raise SystemExit(f"the mock cluster created {name} with {len(found.partitions)} partitions, not {partitions}")

    @property
    def creates_any_topic(self) -> bool:
        """Whether a topic of any partition count can be made (librdkafka's mock cluster answers no CreateTopics)."""
        return self.catalog is not None


@dataclass
class KafkaCluster(Cluster):
    """An Apache Kafka broker (lab/servers/kafka.py): one KRaft node on 127.0.0.1 with the broker's defaults, topics
    made by CreateTopics."""

    def create_topic(self, name: str, cleanup_policy: str, partitions: int = PARTITIONS) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        admin.create_topics([NewTopic(name, partitions, 1, config={"cleanup.policy": cleanup_policy})])[name].result(30)
        deadline = time.monotonic() + 30  # CreateTopics answers once the controller has it; the broker leads it a moment later
        while any(p.leader < 0 for p in admin.list_topics(name, timeout=10).topics[name].partitions.values()):
            if time.monotonic() > deadline:
                raise SystemExit(f"Apache Kafka: {name} has partitions without a leader 30 s after CreateTopics")
            time.sleep(0.05)

    @property
    def creates_any_topic(self) -> bool:
        return True


# Kafka's own heap, kafka-server-start.sh's -Xmx1G -Xms1G: with the agent (a few hundred MiB) and the clients it fits
# this 2-core 24 GiB machine many times over, and the broker's reads are served by the page cache, not the heap.
KAFKA_HEAP = "1g"
KAFKA_GROUP_DELAY_MS = 3_000  # group.initial.rebalance.delay.ms, the broker's default (config/server.properties sets 0 for development)


@contextmanager
def kafka_broker(directory: Path) -> Iterator[tuple[KafkaCluster, psutil.Process]]:
    """Apache Kafka's broker, one KRaft node (broker and controller in one JVM) formatted in `directory`, with its
    defaults: `log.flush.*` unset, so an append is acknowledged once it is in the page cache."""
    try:
        server, stop = start_kafka(directory, heap=KAFKA_HEAP)
    except KafkaStartError as error:
        raise SystemExit(f"Apache Kafka did not start: {error}\n(`make kafka` fetches its jars; --clusters agent,mock runs without it)") from None
    try:
        yield KafkaCluster("kafka", server.bootstrap_servers), psutil.Process(server.pid)
    finally:
        stop()


@contextmanager
def agent_process(directory: Path, *options: str, metrics_port: int | None = None, processes: int = 1) -> Iterator[tuple[Cluster, psutil.Process]]:
    """`logcompact agent` in its own process, with `options` added; with `metrics_port`, serving /metrics there, scraped
    every METRICS_SCRAPE_SECONDS meanwhile (Prometheus scrapes every 15 to 60 s: this is the pessimistic case)."""
    store = f"file://{directory / 'store'}"
    catalog = Catalog(open_store(store))
    catalog.ensure_created(int(time.time() * 1000))
    command = [sys.executable, "-m", "logcompact", "--store", store, "agent", "--listen", "127.0.0.1:0", "--flush-ms", str(FLUSH_MS),
               "--processes", str(processes), *options]
    if metrics_port is not None:
        command += ["--metrics-listen", f"127.0.0.1:{metrics_port}"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    stop_scraping = threading.Event()
    scraper = threading.Thread(target=_scrape_metrics, args=(metrics_port, stop_scraping), daemon=True) if metrics_port is not None else None
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"the agent did not start: {' '.join(command)} exited with {process.wait()}")
        if scraper is not None:
            scraper.start()
        yield Cluster("agent", json.loads(line)["listening"], catalog), psutil.Process(process.pid)
    finally:
        stop_scraping.set()
        if scraper is not None and scraper.is_alive():
            scraper.join()
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:  # a finding, printed with the figures rather than losing them
            process.kill()
            print("the agent did not stop within 60 s of SIGTERM: killed", flush=True)


METRICS_SCRAPE_SECONDS = 1.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _scrape_metrics(port: int, stop: threading.Event) -> None:
    """GET /metrics every METRICS_SCRAPE_SECONDS until `stop`; the count and the slowest printed at the end, with the
    Produce requests and records the last scrape counted (the metrics' cost is per request: bench/agent.py's reader
    multiplies it out)."""
    from prometheus_client.parser import text_string_to_metric_families

    scrapes, slowest, text = 0, 0.0, ""
    while not stop.wait(METRICS_SCRAPE_SECONDS):
        started = time.perf_counter()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as answer:
            text = answer.read().decode()
        scrapes, slowest = scrapes + 1, max(slowest, time.perf_counter() - started)
    samples = {(s.name, tuple(sorted(s.labels.items()))): s.value for family in text_string_to_metric_families(text) for s in family.samples}
    requests = samples.get(("kafka_network_requestmetrics_totaltimems_count", (("request", "Produce"),)), 0)
    records = samples.get(("kafka_server_brokertopicmetrics_messagesin_total", ()), 0)
    print(f"agent metrics: {scrapes} scrapes of /metrics, the slowest {slowest * 1000:.0f} ms; by the last, {requests:,.0f} Produce requests "
          f"of {records:,.0f} records", flush=True)


@contextmanager
def mock_cluster(rtt_ms: int = 0) -> Iterator[Cluster]:
    """librdkafka's mock cluster lives in a client: an idle producer holds it, and its broker's address serves the
    measuring clients. With `rtt_ms`, its broker answers every request that much later (test.mock.broker.rtt)."""
    holder = Producer({"test.mock.num.brokers": 1, **({"test.mock.broker.rtt": rtt_ms} if rtt_ms else {})})
    broker = next(iter(holder.list_topics(timeout=10).brokers.values()))
    try:
        yield Cluster("mock", f"{broker.host}:{broker.port}")
    finally:
        holder.flush(10)


# -- measures ---------------------------------------------------------------------------------------------


def produce(cluster: Cluster, topic: str, count: int, value_bytes: int, compression: str, keys: int, drains: list[float] | None = None,
            answers: list[float] | None = None) -> float:
    """Seconds to produce `count` records with acks=all until every delivery report is in; onto `drains`, the seconds
    from the last record handed to the producer to the last report; onto `answers`, the milliseconds the servers took
    to answer the producer's requests (librdkafka's `rtt`, p50 of each broker and STATS_MS window that had requests)."""
    values = [os.urandom(value_bytes // 2).hex().encode()[:value_bytes] if compression != "none" else os.urandom(value_bytes) for _ in range(256)]
    windows: list[str] = []  # the producer's statistics, parsed once it is done
    reporting = {"statistics.interval.ms": STATS_MS, "stats_cb": windows.append} if answers is not None else {}
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "compression.type": compression, **PRODUCER, **cluster.client, **reporting})
    failed: list[KafkaError] = []

    def report(error: KafkaError | None, _message: object) -> None:
        if error is not None:
            failed.append(error)

    producer.list_topics(topic, timeout=10)
    started = time.perf_counter()
    for n in range(count):
        while True:
            try:
                producer.produce(topic, values[n % 256], b"key-%d" % (n % keys), partition=n % PARTITIONS, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 10_000 == 0:
            producer.poll(0)
    sent = time.perf_counter()
    if producer.flush(120):
        raise SystemExit(f"{cluster.name}: records left undelivered after 120 s")
    elapsed = time.perf_counter() - started
    if drains is not None:
        drains.append(started + elapsed - sent)
    if answers is not None:
        answers += [broker["rtt"]["p50"] / 1000 for window in windows for broker in json.loads(window)["brokers"].values() if broker["rtt"]["cnt"]]
    if failed:
        raise SystemExit(f"{cluster.name}: {len(failed)} deliveries failed, the first: {failed[0]}")
    return elapsed


# Disk the servers' data keep free beside the page-cache file (`fill_page_cache`): the measures write some 10 GB.
DATA_ROOM_BYTES = 16 << 30


def fill_page_cache(directory: Path) -> int:
    """Fill this machine's free memory with the clean page cache of a file in `directory`, kept until the run ends, and
    return its size. On a machine in service the page cache fills the memory and a write takes pages the kernel
    reclaims from it. This VM hands its free memory back to its host (free page reporting, as Firecracker's balloon
    does), and a first write to memory handed back faults it in again: 1 GB written took 1.0 to 5.6 s of CPU there
    against 0.2 to 0.3 s in reclaimed pages (bench/README.md, Produce against Apache Kafka), and whichever
    server's run met that memory lost the comparison."""
    free = next(int(line.split()[1]) * 1024 for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemFree:"))
    size = min(free, shutil.disk_usage(directory).free - DATA_ROOM_BYTES)
    if size <= 0:
        return 0
    chunk = bytes(64 << 20)
    descriptor = os.open(directory / "page-cache-fill", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        for _ in range(size // len(chunk)):
            os.write(descriptor, chunk)
        os.fsync(descriptor)  # clean pages: reclaimed without waiting for their writeback
    finally:
        os.close(descriptor)
    return size // len(chunk) * len(chunk)


def ack_latencies(cluster: Cluster, topic: str, seconds: float) -> list[float]:
    """Milliseconds from produce() to each delivery report, at LATENCY_RATE records/s with acks=all."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "compression.type": "lz4", **PRODUCER})
    latencies: list[float] = []
    producer.list_topics(topic, timeout=10)
    started = time.perf_counter()
    total = int(seconds * LATENCY_RATE)
    for n in range(total):
        due = started + n / LATENCY_RATE
        while (now := time.perf_counter()) < due:
            producer.poll(min(due - now, 0.001))
        sent = time.perf_counter()
        producer.produce(topic, b"v" * 100, b"key-%d" % n, partition=n % PARTITIONS,
                         on_delivery=lambda error, _m, sent=sent: latencies.append((time.perf_counter() - sent) * 1000) if error is None else None)
    producer.flush(60)
    return latencies


def kcat_consume(cluster: Cluster, topic: str, settings: dict[str, str] | None = None) -> tuple[float, int, int]:
    """(seconds from the first record to the end of every partition, records, bytes of keys and values) of kcat reading
    every partition from the beginning, each record's key and value sizes written to a pipe; `settings` beside KCAT's."""
    options = [part for name, value in {**KCAT, **cluster.client, **(settings or {})}.items() for part in ("-X", f"{name}={value}")]
    command = ["kcat", "-C", "-q", "-e", "-b", cluster.bootstrap, "-t", topic, "-o", "beginning", "-f", "%K %S\n", *options]
    with tempfile.TemporaryFile() as errors:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=errors)
        watchdog = threading.Timer(KCAT_SECONDS, process.kill)
        watchdog.start()
        assert process.stdout is not None
        chunks, started = [], None
        while chunk := os.read(process.stdout.fileno(), 1 << 20):
            started = started or time.perf_counter()
            chunks.append(chunk)
        elapsed = time.perf_counter() - (started or 0)
        watchdog.cancel()
        if process.wait() != 0:
            errors.seek(0)
            raise SystemExit(f"{cluster.name}: {' '.join(command)} exited with {process.returncode}: {errors.read().decode(errors='replace')}")
    sizes = b"".join(chunks).split()
    return elapsed, len(sizes) // 2, sum(max(0, int(size)) for size in sizes)  # -1: a null key or value


CONTROL_BATCH = 0x20  # record batch v2 attributes: isControlBatch


def in_process_fetch(catalog: Catalog, topic: str, isolation: int = READ_UNCOMMITTED) -> tuple[float, int]:
    """(seconds, records) of the agent's read path alone, `kafka.handlers.fetch.read` (what its Fetch handler runs for each
    request), reading every partition from its log start to its end with kcat's limits at `isolation`, through a new
    file cache of the agent's default size."""
    elapsed, records, _ = in_process_batches(catalog, topic, isolation)
    return elapsed, records


def in_process_batches(catalog: Catalog, topic: str, isolation: int = READ_UNCOMMITTED) -> tuple[float, int, int]:
    """`in_process_fetch`'s (seconds, records), and the bytes of the record batches read, as Fetch sends them."""
    store = CachedStore(catalog.store)
    positions, ends = (list(column) for column in list(zip(*catalog.log_offsets(topic)))[:2])
    records = sent = 0
    started = time.perf_counter()
    while wanted := [fetch.Wanted(p, positions[p], PARTITION_FETCH_BYTES) for p in range(len(ends)) if positions[p] < ends[p]]:
        for answer in fetch.read(catalog, store, FETCH_MAX_BYTES, [(topic, wanted)], isolation)[1][0][1]:
            positions[answer.index] = answer.next_offset
            records += sum(batch_counts(answer.records))
            sent += len(answer.records)
    return time.perf_counter() - started, records, sent


def batch_counts(data: bytes) -> Iterator[int]:
    """The data records of each record batch v2 in `data` (61 bytes of header, the count last); a control batch (the
    marker ending a partition's trailing hole) counts none, as clients skip it."""
    at = 0
    while at < len(data):
        length, = struct.unpack_from(">i", data, at + 8)
        attributes, = struct.unpack_from(">h", data, at + 21)
        count, = struct.unpack_from(">i", data, at + 57)
        yield 0 if attributes & CONTROL_BATCH else count
        at += 12 + length


def key_and_value_bytes(catalog: Catalog, topic: str) -> int:
    snapshot = catalog.snapshot()
    return sum(
        sum(pc.binary_length(table.column(name)).to_numpy(zero_copy_only=False).sum() for name in ("key", "value"))
        for partition in range(PARTITIONS) for table in read_batches(catalog.store, snapshot, topic, partition)
    )


def compact(catalog: Catalog, topic: str) -> int:
    """A full sweep of the topic through the library, as `logcompact compact --mode full` runs it: the records left,
    every one of them in L1+ files."""
    now = int(time.time() * 1000) + 60_000
    for plan in choose_plans(catalog.planning_snapshot(now), now, "full", PlannerConfig(), topics=[topic]):
        run_and_commit(catalog, plan, now)
    files = catalog.snapshot().files(topics=[topic])
    if any(data_file.level == 0 for data_file in files):
        raise SystemExit(f"the full sweep left L0 files of {topic}: the fetch measure would not read from L1+ files")
    return sum(section.info.record_count for data_file in files for section in data_file.sections if section.topic == topic)


# -- transactions -----------------------------------------------------------------------------------------

TXN_PARTITIONS = 10
TXN_TIMEOUT_MS = 60_000


def percentile_line(name: str, values: list[float], bounds: list[tuple[float, float]], unit: str = "ms") -> str:
    """`name`: p50 and p99 of `values`, each beside its bound (nan: none) and whether it is met."""
    parts = []
    for fraction, bound in bounds:
        value = percentile(values, fraction)
        verdict = "" if math.isnan(bound) else f" (target <= {bound:,.0f}: {'met' if value <= bound else 'MISSED'})"
        parts.append(f"p{round(fraction * 100)} {value:,.1f} {unit}{verdict}")
    return f"{name}: {', '.join(parts)}; {len(values)} samples"


def verdict(value: float, bound: float, at_least: bool) -> str:
    met = value >= bound if at_least else value <= bound
    return f"target {'>=' if at_least else '<='} {bound:g}: {'met' if met else 'MISSED'}"


class CatalogProducer:
    """A producer's side of the catalog, as the agent's handlers drive it: a transactional one's InitProducerId, then
    per transaction AddPartitionsToTxn, appends of its batches (`Catalog.append_files` with the batches sequenced as
    the ingest sequences them) and EndTxn; an idempotent one's producer id and sequenced batches alone."""

    def __init__(self, catalog: Catalog, transactional_id: str | None) -> None:
        self.catalog, self.transactional_id = catalog, transactional_id
        self.producer_id, self.epoch = (
            catalog.init_producer(transactional_id, TXN_TIMEOUT_MS, MAX_TIMEOUT_MS, None, wall_clock_ms()) if transactional_id
            else (catalog.allocate_producer_id(wall_clock_ms()), 0)
        )
        self.last: dict[tuple[str, int], int] = {}

    def batch(self, topic: str, partition: int, offset_delta: int, count: int) -> PlacedBatch:
        follows = self.last.get((topic, partition))
        first = 0 if follows is None else follows + 1
        self.last[(topic, partition)] = first + count - 1
        return PlacedBatch(topic, partition, offset_delta, SequencedBatch(
            self.producer_id, self.epoch, first, first + count - 1, None if follows is None else (self.epoch, follows), self.transactional_id is not None))

    def begin(self, partitions: list[tuple[str, int]]) -> None:
        assert self.transactional_id is not None
        self.catalog.add_to_transaction(self.transactional_id, self.producer_id, self.epoch, partitions, wall_clock_ms())

    def end(self, commit: bool) -> float:
        """Seconds of EndTxn's catalog transaction."""
        assert self.transactional_id is not None
        started = time.perf_counter()
        self.catalog.end_transaction(self.transactional_id, self.producer_id, self.epoch, commit, wall_clock_ms())
        return time.perf_counter() - started


def section_infos(partitions: list[tuple[str, int]], records: int) -> tuple[SectionInfo, ...]:
    """The sections of one real segment of `records` records of 100 B in each partition (the catalog never reads the
    object: rows only, as bench/catalog.py builds its files)."""
    keys = [b"key-%d" % n for n in range(records)]
    tables = [(topic, partition, section_table(range(records), [0] * records, keys, [b"v" * 100] * records, [None] * records))
              for topic, partition in partitions]
    return tuple(write_segment(tables)[1])


def end_txn_times(catalog: Catalog, transactions: int) -> list[float]:
    """Milliseconds of EndTxn's catalog transaction (`Catalog.end_transaction`, what the EndTxn handler awaits) over
    `transactions` real transactions of one producer, each adding 10 partitions and appending one L0 file holding a
    transactional batch of 100 records in each; every tenth transaction aborts, the others commit."""
    topic = f"endtxn-{uuid.uuid4().hex[:8]}"
    now = wall_clock_ms()
    catalog.create_topic(Topic.create(topic, TXN_PARTITIONS, {"cleanup.policy": "compact"}, now), now)
    partitions = [(topic, p) for p in range(TXN_PARTITIONS)]
    infos = section_infos(partitions, 100)
    producer = CatalogProducer(catalog, f"{topic}-producer")
    times = []
    for n in range(transactions):
        producer.begin(partitions)
        placed = [producer.batch(topic, p, 0, 100) for _, p in partitions]
        appended = catalog.append_files([NewFile(f"data/l0/{topic}-{n:06d}.seg", 0, 100_000, wall_clock_ms(), infos)], wall_clock_ms(), [placed])
        if appended.refused:
            raise SystemExit(f"EndTxn measure: the catalog refused the transaction's batches: {appended.refused}")
        times.append(producer.end(commit=n % 10 != 9) * 1000)
    return times


def wide_append_times(catalog: Catalog, appends: int) -> dict[str, list[float]]:
    """Milliseconds of appends of a file of 1,000 sections (10 topics of 100 partitions, bench/catalog.py's wide
    file), alternating: `plain`, no sequenced batch; `transactional`, a transactional batch in 100 of its sections
    (10 producers' open transactions of 10 partitions each, ended after the append, untimed); `idempotent`, the same
    100 batches of 10 idempotent producers, which the catalog records as it records a transactional producer's
    (`producers.record`)."""
    tag = uuid.uuid4().hex[:8]
    now = wall_clock_ms()
    for t in range(WIDE_TOPICS):
        catalog.create_topic(Topic.create(f"wide{t}-{tag}", WIDE_PARTITIONS, {"cleanup.policy": "compact"}, now), now)
    partitions = [(f"wide{t}-{tag}", p) for t in range(WIDE_TOPICS) for p in range(WIDE_PARTITIONS)]
    infos = section_infos(partitions, 1)
    owned = [partitions[n * 100: n * 100 + 100: 10] for n in range(10)]  # 10 partitions a producer, over the topics
    producers = {"plain": [], "transactional": [CatalogProducer(catalog, f"wide-{tag}-{n}") for n in range(10)],
                 "idempotent": [CatalogProducer(catalog, None) for _ in range(10)]}
    times: dict[str, list[float]] = {name: [] for name in producers}
    for n in range(appends):
        for name, chosen in producers.items():
            if name == "transactional":
                for producer, mine in zip(chosen, owned):
                    producer.begin(mine)
            placed = [producer.batch(topic, partition, 0, 1) for producer, mine in zip(chosen, owned) for topic, partition in mine]
            new = NewFile(f"data/l0/wide-{tag}-{name}-{n:06d}.seg", 0, 1_000_000, wall_clock_ms(), infos)
            started = time.perf_counter()
            appended = catalog.append_files([new], wall_clock_ms(), [placed])
            times[name].append((time.perf_counter() - started) * 1000)
            if appended.refused:
                raise SystemExit(f"append measure: the catalog refused {name} batches: {appended.refused}")
            if name == "transactional":
                for producer in chosen:
                    producer.end(commit=True)
    return times


def catalog_measures(name: str, url: str | None, directory: Path, transactions: int, appends: int) -> None:
    """EndTxn's catalog transaction and the transactional wide append against the plain one, on one database."""
    catalog = Catalog(LocalStore(directory / f"catalog-{name}"), url)
    catalog.ensure_created(wall_clock_ms())
    times = end_txn_times(catalog, transactions)
    bounds = [(0.5, 30.0), (0.99, 100.0)] if url is None else [(0.5, float("nan")), (0.99, 150.0)]
    print(percentile_line(f"{name}: EndTxn's catalog transaction, {TXN_PARTITIONS} partitions of 100 records, 1 in 10 aborting", times, bounds), flush=True)
    append = {kind: median(values) for kind, values in wide_append_times(catalog, appends).items()}
    ratio = append["transactional"] / append["plain"]
    print(f"{name}: append of a 1,000-partition file, medians of {appends} alternating: plain {append['plain']:.1f} ms, 100 sections "
          f"transactional {append['transactional']:.1f} ms: {ratio:.2f}x ({verdict(ratio, 1.2, at_least=False)}); the same 100 "
          f"sections idempotent {append['idempotent']:.1f} ms: transactional {append['transactional'] / append['idempotent']:.2f}x that", flush=True)


def transactional_producer(cluster: Cluster, transactional_id: str, **settings: object) -> Producer:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "transactional.id": transactional_id, "linger.ms": 5,
                         "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000, **settings})
    producer.init_transactions(30)
    return producer


def produce_all(producer: Producer, topic: str, count: int, partitions: int) -> None:
    for n in range(count):
        while True:
            try:
                producer.produce(topic, b"v" * 100, b"key-%d" % n, partition=n % partitions)
                break
            except BufferError:
                producer.poll(0.05)


def commit_times(cluster: Cluster, topic: str, transactions: int) -> tuple[list[float], list[float]]:
    """Milliseconds of `commit_transaction()` (librdkafka: the transaction's batches flushed and acknowledged, then
    EndTxn) of transactions of 1,000 records of 100 B over 10 partitions, and of its first part alone: in a second
    run of as many transactions, `flush()` (every record acknowledged) timed before `commit_transaction()`."""
    producer = transactional_producer(cluster, f"{topic}-commit")
    times: tuple[list[float], list[float]] = ([], [])
    for flushed_first in (False, True):
        for _ in range(transactions):
            producer.begin_transaction()
            produce_all(producer, topic, 1_000, TXN_PARTITIONS)
            started = time.perf_counter()
            if flushed_first:
                producer.flush(60)
                times[1].append((time.perf_counter() - started) * 1000)
            else:
                producer.commit_transaction(60)
                times[0].append((time.perf_counter() - started) * 1000)
            if flushed_first:
                producer.commit_transaction(60)
    return times


def committed_transactions_per_second(cluster: Cluster, topic: str, seconds: float) -> float:
    """One transactional producer, transactions of 100 records over 10 partitions back to back for `seconds`:
    committed transactions a second."""
    producer = transactional_producer(cluster, f"{topic}-rate")
    committed, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        producer.begin_transaction()
        produce_all(producer, topic, 100, TXN_PARTITIONS)
        producer.commit_transaction(60)
        committed += 1
    return committed / (time.perf_counter() - started)


def eight_producers(cluster: Cluster, topic: str, seconds: float, transactional: bool) -> float:
    """8 producers, each producing units of 10,000 records of 100 B over the topic's 10 partitions for `seconds`:
    transactional (a transaction a unit, committed) or idempotent without transactions (the units back to back,
    flushed at the end): committed, or acknowledged, records a second, the last commit or flush included."""
    done, counted = [0], threading.Lock()
    failed: list[str] = []
    started = time.perf_counter()

    def run(number: int) -> None:
        try:
            if transactional:
                producer = transactional_producer(cluster, f"{topic}-{number}")
            else:
                producer = Producer({"bootstrap.servers": cluster.bootstrap, "enable.idempotence": True, "linger.ms": 5,
                                     "batch.size": 1_000_000, "queue.buffering.max.messages": 1_000_000})

            def delivered(error: KafkaError | None, _message: object) -> None:
                if error is None and not transactional:
                    with counted:
                        done[0] += 1

            while time.perf_counter() - started < seconds:
                if transactional:
                    producer.begin_transaction()
                for n in range(10_000):
                    while True:
                        try:
                            producer.produce(topic, b"v" * 100, b"p%d-%d" % (number, n), partition=n % TXN_PARTITIONS, on_delivery=delivered)
                            break
                        except BufferError:
                            producer.poll(0.05)
                if transactional:
                    producer.commit_transaction(120)
                    with counted:
                        done[0] += 10_000
                else:
                    producer.poll(0)
            if producer.flush(120):
                failed.append(f"producer {number}: records left undelivered")
        except Exception as exc:  # reported after the threads join, with the figures withheld
            failed.append(f"producer {number}: {exc}")

    threads = [threading.Thread(target=run, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failed:
        raise SystemExit(f"8 {'transactional' if transactional else 'idempotent'} producers failed: {failed[0]}")
    return done[0] / (time.perf_counter() - started)


def commit_to_delivery(cluster: Cluster, topic: str, transactions: int) -> list[float]:
    """Milliseconds from `commit_transaction()` returning to a `read_committed` consumer (assigned to the topic's
    partitions at their ends, polling) receiving the transaction's first record; transactions of 10 records over
    10 partitions, 100 ms apart."""
    consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-reader", "isolation.level": "read_committed",
                         "enable.auto.commit": False, "fetch.wait.max.ms": 500})
    consumer.assign([TopicPartition(topic, p, OFFSET_END) for p in range(TXN_PARTITIONS)])
    received: dict[int, float] = {}
    stop = threading.Event()

    def reading() -> None:
        while not stop.is_set():
            for message in consumer.consume(100, 0.05):
                if message.error() is None:
                    received.setdefault(int((message.value() or b"")[:8]), time.perf_counter())

    reader = threading.Thread(target=reading)
    reader.start()
    time.sleep(2)  # the assignment's offsets resolved before the first transaction
    producer = transactional_producer(cluster, f"{topic}-latency")
    committed: dict[int, float] = {}
    for n in range(transactions):
        producer.begin_transaction()
        for r in range(10):
            producer.produce(topic, b"%08d" % n + b"v" * 92, b"k%d" % r, partition=r % TXN_PARTITIONS)
        producer.commit_transaction(60)
        committed[n] = time.perf_counter()
        time.sleep(0.1)
    deadline = time.monotonic() + 10
    while len(received) < transactions and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    reader.join()
    consumer.close()
    if len(received) < transactions:
        raise SystemExit(f"the read_committed consumer received {len(received)} of {transactions} committed transactions within 10 s")
    return [(received[n] - committed[n]) * 1000 for n in range(transactions)]


def transactional_data(cluster: Cluster, topic: str, records: int, abort_every: int) -> int:
    """`records` of 100 B over 10 partitions in transactions of 10,000, every `abort_every`-th aborted (0: none):
    the committed records."""
    producer = transactional_producer(cluster, f"{topic}-data")
    committed = 0
    for n in range(math.ceil(records / 10_000)):
        count = min(10_000, records - n * 10_000)
        producer.begin_transaction()
        produce_all(producer, topic, count, TXN_PARTITIONS)
        if abort_every and n % abort_every == abort_every - 1:
            if producer.flush(60):  # aborting purges what is not yet sent: flushed, the aborted records are in the log
                raise SystemExit(f"{topic}: records left unsent 60 s before an abort")
            producer.abort_transaction(60)
        else:
            producer.commit_transaction(60)
            committed += count
    return committed


def txn_measures(agent: Cluster, directory: Path, quick: bool, repeat: int) -> None:
    """Issue 42's targets: each printed with its target and whether it is met."""
    assert agent.catalog is not None
    scale = 0.2 if quick else 1.0
    print(f"\ntransactions, {'quick sizes' if quick else 'full sizes'}; machine: {machine()}", flush=True)
    # The catalog's side, in this process: SQLite as the agent's own, then a throw-away PostgreSQL on disk.
    catalog_measures("SQLite", None, directory, int(500 * scale), int(50 * scale))
    server = ThrowAwayPostgres()
    try:
        server.start()
        catalog_measures("PostgreSQL", server.new_database(f"txn_{uuid.uuid4().hex[:12]}"), directory, int(500 * scale), int(50 * scale))
    finally:
        server.stop()
    # The clients' side, against the agent.
    agent.create_topic("txn-commit", "compact", partitions=TXN_PARTITIONS)
    times, flushes = commit_times(agent, "txn-commit", int(100 * scale))
    print(percentile_line("commit_transaction(), 1,000 records of 100 B over 10 partitions", times, [(0.5, 450.0), (0.99, 750.0)]), flush=True)
    print("  " + percentile_line("of which its records acknowledged (flush() timed alone)", flushes, [(0.5, float("nan")), (0.99, float("nan"))]), flush=True)
    agent.create_topic("txn-rate", "compact", partitions=TXN_PARTITIONS)
    rate = committed_transactions_per_second(agent, "txn-rate", 20 * scale)
    print(f"one transactional producer, transactions of 100 records: {rate:.2f} committed transactions/s ({verdict(rate, 2, at_least=True)})", flush=True)
    ratios = []
    for repetition in range(repeat):
        figures = {}
        for transactional in (False, True):
            topic = f"txn-eight-{repetition}-{'txn' if transactional else 'idem'}"
            agent.create_topic(topic, "compact", partitions=TXN_PARTITIONS)
            figures[transactional] = eight_producers(agent, topic, 30 * scale, transactional)
        ratios.append(figures[True] / figures[False])
        print(f"8 producers, 10,000 records of 100 B a unit, {30 * scale:.0f} s each: idempotent {figures[False]:,.0f} records/s, "
              f"transactional {figures[True]:,.0f} committed records/s: {ratios[-1]:.2f}x; load average {os.getloadavg()[0]:.2f}", flush=True)
    print(f"  median ratio of {repeat}: {median(ratios):.2f}x ({verdict(median(ratios), 0.7, at_least=True)})", flush=True)
    agent.create_topic("txn-delivery", "compact", partitions=TXN_PARTITIONS)
    delays = commit_to_delivery(agent, "txn-delivery", int(200 * scale))
    print(percentile_line("commit_transaction() returned to the first read_committed delivery", delays, [(0.5, float("nan")), (0.99, 300.0)]), flush=True)
    records = int(500_000 * scale)
    for name, abort_every, bound in (("all committed", 0, 0.9), ("1 transaction in 10 aborted", 10, 0.8)):
        topic = f"txn-fetch-{abort_every}"
        agent.create_topic(topic, "compact", partitions=TXN_PARTITIONS)
        committed = transactional_data(agent, topic, records, abort_every)
        rates: dict[str, list[float]] = {"read_committed": [], "read_uncommitted": []}
        in_process: dict[str, list[float]] = {"read_committed": [], "read_uncommitted": []}
        kcat_consume(agent, topic)  # untimed: the first read of new files pays for the page cache and the agent's file cache
        in_process_fetch(agent.catalog, topic)
        for repetition in range(max(2, repeat)):
            for isolation in list(rates)[:: 1 if repetition % 2 == 0 else -1]:  # alternating which goes first
                elapsed, read, _bytes = kcat_consume(agent, topic, {"isolation.level": isolation})
                expected = committed if isolation == "read_committed" else records
                if read != expected:
                    raise SystemExit(f"kcat read {read:,} records of {topic} at {isolation}, expected {expected:,}")
                rates[isolation].append(read / elapsed)
                elapsed, read = in_process_fetch(agent.catalog, topic, ISOLATION_LEVELS[isolation])
                if read != expected:
                    raise SystemExit(f"the agent's read path read {read:,} records of {topic} at {isolation}, expected {expected:,}")
                in_process[isolation].append(read / elapsed)
        committed_rate, uncommitted_rate = median(rates["read_committed"]), median(rates["read_uncommitted"])
        ratio = committed_rate / uncommitted_rate
        print(f"fetch with kcat, {records:,} records in transactions of 10,000, {name}: read_committed {committed_rate:,.0f} records/s, "
              f"read_uncommitted {uncommitted_rate:,.0f}: {ratio:.2f}x ({verdict(ratio, bound, at_least=True)})", flush=True)
        alone = median(in_process["read_committed"]) / median(in_process["read_uncommitted"])
        print(f"  the agent's read path alone: read_committed {median(in_process['read_committed']):,.0f} records/s, read_uncommitted "
              f"{median(in_process['read_uncommitted']):,.0f}: {alone:.2f}x", flush=True)


# -- the run ----------------------------------------------------------------------------------------------


@dataclass
class ClientsFigures:
    largest_rss: int
    offered: int  # records the producers handed to librdkafka
    produced: int  # of them, acknowledged
    consumed: int
    first_record_s: float  # from the consumers' start to the group's first record (nan: none)
    server_cpu_seconds: float  # the server's (and its children's) user and system CPU over the measure
    seconds: float  # the measure's own, producing and catching up


def many_clients(cluster: Cluster, process: psutil.Process, topic: str, clients: int, seconds: float, rate: int) -> ClientsFigures:
    """`clients` // 2 producers (each its own librdkafka instance and connections, `rate` records a second each, to a
    partition of its own) and as many consumers of one group on `topic` (a partition each) for `seconds`, then
    `seconds` / 3 more for the consumers to catch up: the server's (`process`) largest resident memory meanwhile,
    records acked and consumed. librdkafka sends a Produce request per partition: a producer spreading its records over all 50
    partitions would ask 50 times the requests for the same records."""
    stop_producing, stop_consuming = threading.Event(), threading.Event()
    counted = threading.Lock()
    offered, produced, consumed, first_record = [0], [0], [0], [float("nan")]
    started = time.monotonic()

    def add(total: list[int], count: int) -> None:
        with counted:  # `total[0] += f()` would read the total before f() blocks, and overwrite others' counts
            total[0] += count

    def delivered(error: KafkaError | None, _message: object) -> None:
        add(produced, error is None)

    def producing(number: int) -> None:
        producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all", "linger.ms": 50})
        value, sent, begun = b"v" * 100, 0, time.monotonic()
        while not stop_producing.is_set():
            due = int((time.monotonic() - begun) * rate)
            for n in range(sent, due):
                producer.produce(topic, value, b"p%d-%d" % (number, n % 1000), partition=number % partitions, on_delivery=delivered)
            sent = due
            producer.poll(0.05)
        add(offered, sent)
        producer.flush(60)

    def consuming() -> None:
        consumer = Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-readers", "auto.offset.reset": "earliest"})
        consumer.subscribe([topic])
        while not stop_consuming.is_set():
            count = sum(message.error() is None for message in consumer.consume(1000, 0.2))
            if count:
                with counted:
                    consumed[0] += count
                    if math.isnan(first_record[0]):  # this is the group's first record
                        first_record[0] = time.monotonic() - started
        consumer.close()

    partitions = clients - clients // 2
    producers = [threading.Thread(target=producing, args=(n,)) for n in range(clients // 2)]
    consumers = [threading.Thread(target=consuming) for _ in range(partitions)]
    for thread in producers + consumers:
        thread.start()
    largest = 0
    cpu_before = server_cpu_seconds(process)
    for stop, until in ((stop_producing, started + seconds), (stop_consuming, started + seconds * 4 / 3)):
        while time.monotonic() < until:
            largest = max(largest, server_rss(process))
            time.sleep(0.5)
        stop.set()
        for thread in producers if stop is stop_producing else consumers:
            thread.join(timeout=120)
    return ClientsFigures(largest, offered[0], produced[0], consumed[0], first_record[0], server_cpu_seconds(process) - cpu_before,
                          time.monotonic() - started)


def server_rss(process: psutil.Process) -> int:
    """Resident bytes of `process` and its children (an agent of --processes N: its supervisor and N agents)."""
    total = 0
    for each in [process, *process.children(recursive=True)]:
        with suppress(psutil.NoSuchProcess):
            total += each.memory_info().rss
    return total


def server_cpu_seconds(process: psutil.Process) -> float:
    """User and system CPU seconds of `process` and its children (an agent of --processes N: its N agents)."""
    total = 0.0
    for each in [process, *process.children(recursive=True)]:
        with suppress(psutil.NoSuchProcess):
            times = each.cpu_times()
            total += times.user + times.system
    return total


def group_join_to_first_record(cluster: Cluster, topic: str, members: int = 3) -> float:
    """Seconds from `members` consumers subscribing (one group, at once) to every member holding its first record."""
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "acks": "all"})
    for n in range(PARTITIONS * 10):
        producer.produce(topic, b"v", b"k%d" % n, partition=n % PARTITIONS)
    producer.flush(30)
    consumers = [Consumer({"bootstrap.servers": cluster.bootstrap, "group.id": f"{topic}-group", "auto.offset.reset": "earliest"})
                 for _ in range(members)]
    started = time.monotonic()
    for consumer in consumers:
        consumer.subscribe([topic])
    waiting = set(range(members))
    while waiting and time.monotonic() - started < 60:
        for number in list(waiting):
            message = consumers[number].poll(0.05)
            if message is not None and message.error() is None:
                waiting.discard(number)
    elapsed = time.monotonic() - started
    for consumer in consumers:
        consumer.close()
    return elapsed if not waiting else float("nan")


def metrics_measures() -> None:
    """`--measures metrics`: microseconds AgentMetrics.answered adds to a request, for Produce and Fetch answers."""
    from kio.index import load_request_schema

    from logcompact.kafka import codec
    from logcompact.kafka.metrics import AgentMetrics

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tests.kafka.wire import keyed_batch, produce_request

    def produce_pair(partitions: int) -> tuple[codec.Request, Any]:
        frame = produce_request(9, 1, {("metered", p): keyed_batch(100) for p in range(partitions)})
        request = codec.decode_request(frame[4:], lambda _key, _version: True)
        answers = [{"index": p, "error_code": 0, "base_offset": 0, "log_append_time": None, "log_start_offset": -1, "record_errors": []} for p in range(partitions)]
        return request, codec.build(codec.response_class(0, 9), {"responses": [{"name": "metered", "partition_responses": answers}], "throttle_time": 0})

    fetch_body = codec.build(load_request_schema(1, 12), {
        "replica_id": -1, "max_wait": 500, "min_bytes": 1, "max_bytes": 1 << 20, "isolation_level": 0, "session_id": 0, "session_epoch": -1,
        "topics": [{"topic": "metered", "partitions": [{"partition": p, "current_leader_epoch": -1, "fetch_offset": 0, "last_fetched_epoch": -1,
                                                         "log_start_offset": -1, "partition_max_bytes": 1 << 20} for p in range(4)]}],
        "forgotten_topics_data": [], "rack_id": ""})
    fetch_answer = codec.build(codec.response_class(1, 12), {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": "metered", "partitions": [
        {"partition_index": p, "error_code": 0, "high_watermark": 100, "last_stable_offset": 100, "log_start_offset": 0, "aborted_transactions": [],
         "preferred_read_replica": -1, "records": keyed_batch(100)} for p in range(4)]}]})
    cases = [("Produce, one partition", *produce_pair(1)), ("Produce, 4 partitions", *produce_pair(4)),
             ("Fetch answer, 4 partitions", codec.Request(1, 12, 1, "bench", fetch_body), fetch_answer)]
    runs = 100_000
    for name, request, response in cases:
        metrics = AgentMetrics()
        timings = []
        for _ in range(5):
            started = time.perf_counter()
            for _ in range(runs):
                metrics.answered(request, response, started)
            timings.append((time.perf_counter() - started) / runs * 1e6)
        print(f"metrics per request, {name:<28} {median(timings):6.2f} us", flush=True)


FETCH_COSTS_PARTITIONS = 50
FETCH_COSTS_FILES = 20  # L0 files, each 250 records of 100 B in each partition: an agent's flush of 50 producers at 1,000 records/s


def fetch_costs_measures(directory: Path, repeat: int) -> None:
    """`--measures fetch-costs`, in this process: what Fetch's per-request costs under many consumers were and are.
    A consumer of each of 50 partitions reads FETCH_COSTS_FILES L0 files of them through `fetch.read` (the handler's
    read path), with and without the cache of decoded blocks (block_cache.py): seconds and blocks decoded; the topic's log
    offsets as 50 requests at one version read them, from the catalog each time or kept per version (served_version.py);
    and a Fetch response of 4 partitions of 12 MiB of batches encoded into one bytes object by kio, or as parts."""
    from kio.serial import entity_writer

    from logcompact.ingest import Agent, Record
    from logcompact.kafka import codec
    from logcompact.kafka.block_cache import DecodedBlocks
    from logcompact.kafka.served_version import ServedVersion

    store = f"file://{directory / 'store'}"
    catalog = Catalog(open_store(store))
    now = wall_clock_ms()
    catalog.ensure_created(now)
    catalog.create_topic(Topic.create("wide", FETCH_COSTS_PARTITIONS, {}, now), now)
    value = b"v" * 100
    for _ in range(FETCH_COSTS_FILES):
        with Agent(catalog, background=False) as ingest:
            done = ingest.produce("wide", [Record(p, b"k%d-%d" % (p, n), value, now) for p in range(FETCH_COSTS_PARTITIONS) for n in range(250)])
        done.result()
    ends = [offsets.high_watermark for offsets in catalog.log_offsets("wide")]

    def read_all(blocks: DecodedBlocks | None) -> float:
        """Seconds for a consumer of each partition to read it to its end, 1 MiB a request, one after the other."""
        files = CachedStore(catalog.store)
        started = time.perf_counter()
        for partition in range(FETCH_COSTS_PARTITIONS):
            position = 0
            while position < ends[partition]:
                wanted = [("wide", [fetch.Wanted(partition, position, 1 << 20)])]
                position = fetch.read(catalog, files, FETCH_MAX_BYTES, wanted, blocks=blocks)[1][0][1][0].next_offset
        return time.perf_counter() - started

    print(f"fetch costs, in this process: {FETCH_COSTS_PARTITIONS} partitions, {FETCH_COSTS_FILES} L0 files of 250 records of 100 B in each; "
          f"machine: {machine()}", flush=True)
    timings: dict[str, list[float]] = defaultdict(list)
    decoded: dict[str, int] = {}
    for _ in range(repeat):  # in turn: the load moves
        timings["decoded per reader"].append(read_all(None))
        cached = DecodedBlocks()
        timings["decoded blocks cached"].append(read_all(cached))
        decoded["decoded blocks cached"] = cached.decoded
        counting = DecodedBlocks(0)  # what each reader decodes on its own
        read_all(counting)
        decoded["decoded per reader"] = counting.decoded
    for name, values in timings.items():
        print(f"  {FETCH_COSTS_PARTITIONS} consumers reading one partition each, {name:<22}: {median(values) * 1000:8.1f} ms, "
              f"{decoded[name]:,} blocks decoded", flush=True)

    served = ServedVersion(catalog)
    for name, read_offsets in (("from the catalog each time", lambda: catalog.log_offsets("wide")),
                               ("kept per catalog version", lambda: served.read(["wide"]))):
        values = []
        for _ in range(repeat):
            started = time.perf_counter()
            for _ in range(FETCH_COSTS_PARTITIONS):
                read_offsets()
            values.append((time.perf_counter() - started) / FETCH_COSTS_PARTITIONS * 1e6)
        print(f"  the topic's log offsets for a request, {name:<26}: {median(values):8.0f} us", flush=True)

    buffers = [bytearray(os.urandom(12 << 20)) for _ in range(4)]
    response = codec.build(codec.response_class(1, 12), {"throttle_time": 0, "error_code": 0, "session_id": 0, "responses": [{"topic": "wide", "partitions": [
        {"partition_index": p, "error_code": 0, "high_watermark": 1, "last_stable_offset": 1, "log_start_offset": 0, "aborted_transactions": None,
         "preferred_read_replica": -1, "records": memoryview(buffers[p])} for p in range(4)]}]})

    def kio_frame() -> bytes:
        """The frame as the agent encoded it before: kio's writer into one BytesIO."""
        buffer = io.BytesIO()
        buffer.write(b"\0\0\0\0")
        entity_writer(type(response).__header_schema__)(buffer, type(response).__header_schema__(correlation_id=1))
        entity_writer(type(response))(buffer, response)
        return buffer.getvalue()

    for name, encode in (("by kio into one buffer", kio_frame), ("as parts", lambda: codec.encode_response_parts(1, response))):
        values = []
        for _ in range(max(5, repeat)):
            started = time.perf_counter()
            encode()
            values.append((time.perf_counter() - started) * 1000)
        print(f"  a Fetch response of 4 x 12 MiB of batches encoded {name:<22}: {median(values):8.2f} ms", flush=True)


def security_measures(directory: Path, records: int, repeat: int) -> None:
    """The targets of `--measures security` (bench/agent_security.py says what each is), printed with their verdicts."""
    small, large = records, max(1, records // 5)
    figures: dict[str, list[float]] = defaultdict(list)
    with agent_security.security_cluster(directory) as (store, certificates, stack):
        listeners, process = stack.enter_context(agent_security.security_agent(directory, store, certificates, "--flush-ms", str(FLUSH_MS)))
        catalog = Catalog(open_store(store))
        plain = Cluster("PLAINTEXT", listeners["PLAINTEXT"], catalog)
        secure = Cluster("SASL_SSL", listeners["SASL_SSL"], catalog, agent_security.client_settings(certificates.ca))
        for repetition in range(repeat):
            for cluster in (plain, secure):
                topic = f"small-{cluster.name}-{repetition}"
                cluster.create_topic(topic, "delete")
                figures[f"produce_small {cluster.name}"].append(small / produce(cluster, topic, small, 100, "lz4", keys=small))
                topic = f"large-{cluster.name}-{repetition}"
                cluster.create_topic(topic, "delete")
                figures[f"produce_large {cluster.name}"].append(large * 1024 / produce(cluster, topic, large, 1024, "none", keys=large) / 1e6)
            topic = f"compacted-{repetition}"
            plain.create_topic(topic, "compact")
            produce(plain, topic, large, 1024, "lz4", keys=large // 2)
            survivors = compact(catalog, topic)
            for cluster in (plain, secure):
                elapsed, read_records, read = kcat_consume(cluster, topic)
                if read_records != survivors:
                    raise SystemExit(f"kcat read {read_records} records over {cluster.name}, expected {survivors}")
                figures[f"fetch {cluster.name}"].append(read / elapsed / 1e6)
            print(f"repetition {repetition + 1} of {repeat} done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

        clients_seconds, before, with_clients = asyncio.run(
            agent_security.many_authenticating(listeners["SASL_SSL"], certificates.ca, agent_security.CLIENTS, process))
        early_answers = asyncio.run(agent_security.answered_before_authentication(listeners["SASL_SSL"], certificates.ca))

        # Each of the agents below alone in a cluster of its own: clients send it every request, none to another agent.
        fast_store = agent_security.cluster_store(directory, "fast-store")
        fast, _ = stack.enter_context(agent_security.security_agent(directory, fast_store, certificates, "--flush-ms", "5"))
        Cluster("fast", fast["PLAINTEXT"], Catalog(open_store(fast_store))).create_topic("first-produce", "delete", partitions=1)
        settings = {"PLAINTEXT": {}, "SASL_SSL": agent_security.client_settings(certificates.ca)}
        connect: dict[str, list[float]] = defaultdict(list)
        for _ in range(agent_security.CONNECTIONS):
            for name, ca in (("PLAINTEXT", None), ("SASL_SSL", certificates.ca)):
                connect[name].append(asyncio.run(agent_security.first_produce_answered_raw(fast[name], "first-produce", ca)))
                connect[f"librdkafka {name}"].append(agent_security.first_produce_answered(fast[name], "first-produce", settings[name]))

        unguarded_store, acl_store = agent_security.cluster_store(directory, "open-store"), agent_security.cluster_store(directory, "acl-store")
        subprocess.run([sys.executable, "-m", "logcompact", "--store", acl_store, "acl", "add", "--allow-principal", "User:ANONYMOUS",
                        "--operation", "Write", "--operation", "Describe", "--topic", "acl-", "--resource-pattern-type", "prefixed"],
                       check=True, capture_output=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        open_agent, open_process = stack.enter_context(agent_security.security_agent(directory, unguarded_store, certificates, "--flush-ms", str(FLUSH_MS)))
        acl_agent, acl_process = stack.enter_context(agent_security.security_agent(
            directory, acl_store, certificates, "--flush-ms", str(FLUSH_MS), "--authorizer", "acl", "--super-users", f"User:{agent_security.ADMIN}"))
        without_acls = Cluster("without ACLs", open_agent["PLAINTEXT"], Catalog(open_store(unguarded_store)))
        produce_requests: list[int] = []  # the Produce requests librdkafka has sent, as of its latest statistics

        def count_requests(statistics: str) -> None:
            produce_requests.append(sum(broker["req"].get("Produce", 0) for broker in json.loads(statistics)["brokers"].values()))

        with_acls = Cluster("with ACLs", acl_agent["PLAINTEXT"], Catalog(open_store(acl_store)),
                            {"statistics.interval.ms": 100, "stats_cb": count_requests})
        cpu: dict[str, list[float]] = defaultdict(list)
        for repetition in range(repeat):
            for cluster, measured in ((without_acls, open_process), (with_acls, acl_process)):
                topic = f"acl-{cluster.name.replace(' ', '-')}-{repetition}"
                cluster.create_topic(topic, "delete")
                produce(cluster, topic, small // 10, 100, "lz4", keys=small)  # a warm-up, not measured: a new agent's first batches cost more
                seconds = agent_security.produce_cpu_seconds(measured, lambda c=cluster, t=topic: produce(c, t, small, 100, "lz4", keys=small))
                cpu[cluster.name].append(seconds / small * 1e6)
                if cluster is with_acls:
                    cpu["requests"].append(produce_requests[-1] / small * 1e6)  # per million records, about (statistics every 100 ms)
                    produce_requests.clear()

    of = {name: median(values) for name, values in figures.items()}
    print(f"\nmedians of {repeat}; one agent, PLAINTEXT and SASL_SSL (TLS, {agent_security.MECHANISM}) listeners; machine: {machine()}")
    print(f"{'measure':<52} {'PLAINTEXT':>11} {'SASL_SSL':>11}  {'ratio':>6}  {'unit':<10} target")
    for key, label, unit, bound in (("produce_small", f"produce {small:,} x 100 B, lz4, acks=all", "records/s", 0.7),
                                     ("produce_large", f"produce {large:,} x 1 KiB, acks=all", "MB/s", 0.6),
                                     ("fetch", "fetch, compacted, from files, 1 KiB, kcat", "MB/s", 0.6)):
        ratio = of[f"{key} SASL_SSL"] / of[f"{key} PLAINTEXT"]
        print(f"{label:<52} {of[f'{key} PLAINTEXT']:>11,.1f} {of[f'{key} SASL_SSL']:>11,.1f}  {ratio:6.2f}  {unit:<10} "
              f"{verdict(ratio, bound, at_least=True)}")
    print(percentile_line("new connection to first Produce answered, SASL_SSL", connect["SASL_SSL"], [(0.5, 50), (0.99, 150)]))
    print(percentile_line("  the same over PLAINTEXT", connect["PLAINTEXT"], [(0.5, math.nan), (0.99, math.nan)]))
    print(percentile_line("  librdkafka, producer created to first delivery, SASL_SSL", connect["librdkafka SASL_SSL"], [(0.5, math.nan), (0.99, math.nan)]))
    print(percentile_line("  librdkafka, the same over PLAINTEXT", connect["librdkafka PLAINTEXT"], [(0.5, math.nan), (0.99, math.nan)]))
    print(f"  (an agent of its own cluster flushing every 5 ms, {agent_security.CONNECTIONS} connections each, alternating)")
    print(f"{agent_security.CLIENTS} clients authenticating at once (TLS, {agent_security.MECHANISM}, then a Metadata): "
          f"{clients_seconds:.2f} s ({verdict(clients_seconds, 10, at_least=False)}); agent resident memory "
          f"{before / 2**20:,.0f} MiB before, {with_clients / 2**20:,.0f} MiB with them")
    without, with_acl = median(cpu["without ACLs"]), median(cpu["with ACLs"])
    share = (with_acl - without) / without
    print(f"agent CPU per million records produced (100 B, lz4, PLAINTEXT): {without:.2f} s without an authorizer, {with_acl:.2f} s with "
          f"ACLs ({share:+.1%}; {verdict(share, 0.03, at_least=False)}); two new agents, each alone in its cluster, alternating")
    check_s, requests = agent_security.acl_check_seconds(), median(cpu["requests"])
    print(f"  the check itself: {check_s * 1e6:.2f} us a Produce request (its memo, among 1,000 bindings, in this process), "
          f"{requests:,.0f} Produce requests a million records: {check_s * requests:.4f} s, "
          f"{check_s * requests / with_acl:.2%} of the agent's CPU with ACLs ({verdict(check_s * requests / with_acl, 0.03, at_least=False)})")
    print(f"requests answered before authentication other than ApiVersions, SaslHandshake, SaslAuthenticate: {early_answers} "
          f"({verdict(early_answers, 0, at_least=False)})")


FETCH_CODECS = ("uncompressed", "lz4", "zstd")


def json_values(count: int) -> list[bytes]:
    """Events as applications produce them in JSON: the same field names, a few values varying."""
    return [json.dumps({
        "id": n, "user": f"user-{n % 9973}", "event": ("click", "view", "purchase")[n % 3], "ts": 1_700_000_000_000 + n,
        "page": f"/catalog/item/{n % 5000}", "referrer": "https://shop.example.com/search?q=shoes", "amount": round(n * 1.37 % 100, 2),
    }).encode() for n in range(count)]


def produce_values(cluster: Cluster, topic: str, values: list[bytes]) -> None:
    producer = Producer({"bootstrap.servers": cluster.bootstrap, "compression.type": "lz4", **PRODUCER})
    producer.list_topics(topic, timeout=10)
    for n, value in enumerate(values):
        while True:
            try:
                producer.produce(topic, value, b"key-%d" % n, partition=n % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.05)
    if producer.flush(120):
        raise SystemExit(f"{cluster.name}: records left undelivered after 120 s")


class CountingRelay:
    """A TCP relay on 127.0.0.1 to an agent that advertises it, so its clients' every connection passes through it,
    counting the bytes the agent sends them: the bytes on the wire. They move by splice(2) through a pipe, in the
    kernel, as a loopback hop costs."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.sent = 0  # bytes from the agent to its clients
        self._lock = threading.Lock()
        self.target: tuple[str, int] | None = None

    def start(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self.target = (host, int(port))
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return  # closed
            assert self.target is not None
            upstream = socket.create_connection(self.target)
            threading.Thread(target=self._pump, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pump, args=(upstream, client, True), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, counted: bool) -> None:
        reading, writing = os.pipe()
        try:
            while moved := os.splice(source.fileno(), writing, 1 << 20):
                left = moved
                while left:
                    left -= os.splice(reading, sink.fileno(), left)
                if counted:
                    with self._lock:
                        self.sent += moved
        except OSError:
            pass  # the other side closed
        finally:
            os.close(reading)
            os.close(writing)
            with suppress(OSError):
                sink.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        self.listener.close()


def fetch_compression_measures(directory: Path, records: int, repeat: int) -> None:
    """The figures of `--measures fetch-compression`, printed: per compression.type, bytes sent and records/s, of an
    agent of its own cluster behind a CountingRelay."""
    relay = CountingRelay()
    with agent_process(directory, "--advertise", f"127.0.0.1:{relay.port}") as (agent, process):
        relay.start(agent.bootstrap)
        agent.bootstrap = f"127.0.0.1:{relay.port}"
        try:
            figures = fetch_compression_figures(agent, process, relay, records, repeat)
        finally:
            relay.close()
    size = figures.pop("size")[0]
    of = {name: median(values) for name, values in figures.items()}
    print(f"\nmedians of {repeat}; fetch compression: {records:,} JSON records ({size / records:.0f} B of key and value each, "
          f"{size / 1e6:,.1f} MB), produced with lz4, read by kcat; machine: {machine()}")
    print(f"{'compression.type':<18} {'bytes on the wire':>18} {'of keys+values':>15} {'batches':>14} {'records/s':>12} {'agent CPU s/M':>14}")
    for codec in FETCH_CODECS:
        sent = of[f"{codec} sent"]
        print(f"{codec:<18} {sent:>18,.0f} {sent / size:>14.1%} {of[f'{codec} batches']:>14,.0f} {of[f'{codec} records/s']:>12,.0f} "
              f"{of[f'{codec} cpu']:>14.2f}")


def fetch_compression_figures(agent: Cluster, process: psutil.Process, relay: CountingRelay, records: int, repeat: int) -> dict[str, list[float]]:
    assert agent.catalog is not None
    values = json_values(records)
    size = sum(len(value) + len(b"key-%d" % n) for n, value in enumerate(values))
    figures: dict[str, list[float]] = defaultdict(list, size=[size])
    for repetition in range(repeat):
        for codec in FETCH_CODECS:
            topic = f"json-{codec}-{repetition}"
            now = wall_clock_ms()
            agent.catalog.create_topic(Topic.create(topic, PARTITIONS, {"cleanup.policy": "delete", "compression.type": codec}, now), now)
            produce_values(agent, topic, values)
        for codec in FETCH_CODECS:
            topic = f"json-{codec}-{repetition}"
            sent, cpu = relay.sent, process.cpu_times()
            elapsed, read_records, read = kcat_consume(agent, topic)
            after = process.cpu_times()
            if (read_records, read) != (records, size):
                raise SystemExit(f"kcat read {read_records} records of {read} bytes of {topic}, expected {records} of {size}")
            figures[f"{codec} sent"].append(relay.sent - sent)
            figures[f"{codec} records/s"].append(records / elapsed)
            figures[f"{codec} cpu"].append((after.user + after.system - cpu.user - cpu.system) / records * 1e6)
            _, batch_records, batch_bytes = in_process_batches(agent.catalog, topic)
            if batch_records != records:
                raise SystemExit(f"the agent's read path read {batch_records} records of {topic}, expected {records}")
            figures[f"{codec} batches"].append(batch_bytes)
        print(f"repetition {repetition + 1} of {repeat} done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    return figures


def median(values: list[float]) -> float:
    return statistics.median(values)


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def machine() -> str:
    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines() if line.startswith("model name")), "unknown CPU")
    return f"{model}, {os.cpu_count()} cores, load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}"


CLUSTERS = ("agent", "kafka", "mock")


def row(measure: str, of: dict[str, dict[str, float]], key: str, unit: str, target: str, ratio_bound: float | None = None,
        at_least: bool = True) -> str:
    """A measure's medians on each cluster, the agent's ratio to Kafka, the agent's own target and the ratio's verdict."""
    agent, kafka = of["agent"][key], of["kafka"][key]
    ratio = agent / kafka if kafka else math.nan
    figures = " ".join(f"{of[name][key]:>12,.1f}" for name in CLUSTERS)
    judged = "" if ratio_bound is None or math.isnan(ratio) else f"  agent/Kafka {verdict(ratio, ratio_bound, at_least)}"
    shown = "     -" if math.isnan(ratio) else f"{ratio:6.2f}"
    return f"{measure:<44} {figures}  {shown}  {unit:<10} {target}{judged}"


PROFILE_RATE = 50  # samples a second of py-spy on the agent while it is measured: a small share of one core

DURABILITY = (
    "what an acknowledgement means (acks=all): the agent's once the record's L0 file is written to the object store and\n"
    "  committed to the catalog, so on S3 and PostgreSQL (a PUT the store has made durable, a commit fsynced) it survives\n"
    "  the agent's machine (here a local-directory store written without fsync and SQLite at synchronous=NORMAL, both\n"
    "  left to this machine's page cache too); Kafka's once the record is in the leader's page cache (log.flush.* unset, Kafka's\n"
    "  default) and, with more brokers, in every in-sync replica's page cache: here one broker, no replica, so a crash of\n"
    "  its machine loses what the kernel had not written yet; the mock cluster keeps records in the client's memory.")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="records of 100 B in every measure but produce (the 1 KiB fetch: a fifth)")
    parser.add_argument("--produce-records", type=int, default=3_000_000, help="records of 100 B per produce measure (1 KiB: a third)")
    parser.add_argument("--repeat", type=int, default=3, help="repetitions of each measure; medians are printed")
    parser.add_argument("--latency-seconds", type=float, default=10.0)
    parser.add_argument("--quick", action="store_true", help="200,000 records, one repetition, 5 s of latency, 10 s of clients")
    parser.add_argument("--measures", default="produce,latency,fetch,group,clients", help="which to run, comma-separated (txn: the transactions' targets; security: TLS, SASL and ACLs'; "
                        "fetch-compression: bytes sent and records/s by compression.type; fetch-costs: Fetch's per-request costs in this process)")
    parser.add_argument("--clusters", default=",".join(CLUSTERS), help="which of agent, kafka, mock to measure beside the agent (the agent always)")
    parser.add_argument("--agent-metrics", action="store_true", help="the agent serves /metrics (--metrics-listen), scraped every second")
    parser.add_argument("--agent-processes", type=int, default=available_cores(),
                        help="`logcompact agent --processes`: agent processes, each a broker of its own (default: as the agent's, the cores)")
    parser.add_argument("--leave-free-memory", action="store_true",
                        help="measure without first filling the machine's free memory with page cache (fill_page_cache)")
    parser.add_argument("--clients", type=int, default=100, help="producers and consumers at once in the clients measure")
    parser.add_argument("--clients-seconds", type=float, default=30.0)
    parser.add_argument("--clients-rate", type=int, default=1000, help="records a second of each producer in the clients measure")
    args = parser.parse_args()
    if args.quick:
        args.records, args.repeat, args.latency_seconds = min(args.records, 200_000), 1, 5.0
        args.produce_records = min(args.produce_records, 600_000)
        args.clients_seconds = min(args.clients_seconds, 10.0)
    small, large = args.records, max(1, args.records // 5)
    produced_small, produced_large = args.produce_records, max(1, args.produce_records // 3)
    measures = set(args.measures.split(","))
    wanted = set(args.clusters.split(",")) | {"agent"}
    if wanted - set(CLUSTERS):
        parser.error(f"--clusters: {', '.join(sorted(wanted - set(CLUSTERS)))} is not one of {', '.join(CLUSTERS)}")
    figures: dict[str, dict[str, list[float]]] = {name: {} for name in CLUSTERS}
    rss: dict[str, int] = {}
    kafka_rss: dict[str, int] = {}

    def note(cluster: Cluster, name: str, value: float) -> None:
        figures[cluster.name].setdefault(name, []).append(value)

    print(f"machine: {machine()}", flush=True)
    if "metrics" in measures:
        metrics_measures()
        if measures == {"metrics"}:
            return
    metrics_port = free_port() if args.agent_metrics else None
    if "fetch-costs" in measures:
        with tempfile.TemporaryDirectory(prefix="logcompact-bench-fetch-costs-") as directory:
            fetch_costs_measures(Path(directory), args.repeat)
        if measures == {"fetch-costs"}:
            return
    comparing = measures - {"txn", "security", "fetch-compression", "fetch-costs"}
    with tempfile.TemporaryDirectory(prefix="logcompact-bench-agent-") as directory, ExitStack() as stack:
        agent, process = stack.enter_context(agent_process(Path(directory), metrics_port=metrics_port, processes=args.agent_processes))
        servers: dict[str, psutil.Process] = {"agent": process}
        clusters: list[Cluster] = [agent]
        if "kafka" in wanted and comparing:
            kafka, servers["kafka"] = stack.enter_context(kafka_broker(Path(directory) / "kafka"))
            clusters.append(kafka)
            print(f"Apache Kafka {KAFKA_VERSION}: one KRaft node on {kafka.bootstrap}, heap {KAFKA_HEAP}, the broker's defaults "
                  f"(log.flush.* unset; group.initial.rebalance.delay.ms {KAFKA_GROUP_DELAY_MS:,})", flush=True)
        if comparing and not args.leave_free_memory:
            started = time.monotonic()
            filled = fill_page_cache(Path(directory))
            print(f"page cache: a file of {filled / 1e9:.1f} GB written into this machine's free memory first ({time.monotonic() - started:.0f} s), "
                  "so the servers' writes take pages the kernel reclaims, as on a machine in service (fill_page_cache)", flush=True)
        late_mock: Cluster | None = None  # the mock answering as late as the agent flushes
        if "mock" in wanted:
            clusters.append(stack.enter_context(mock_cluster()))
            if "produce" in measures:
                late_mock = stack.enter_context(mock_cluster(rtt_ms=FLUSH_MS))
        by_name = {cluster.name: cluster for cluster in clusters}

        def in_turn(repetition: int) -> list[Cluster]:
            """Every cluster, the first one rotating with the repetition, so no cluster always runs on the load the
            one before left."""
            turn = repetition % len(clusters)
            return clusters[turn:] + clusters[:turn]

        # Each measure once more on the agent, for its profile if it misses: a sampler in the timed runs would take a share
        # of the cores the agent shares with its clients that Kafka's runs keep (py-spy at 50 Hz used 0.3 to 0.6 s of CPU
        # a million 1 KiB records produced, an eighth of a core).
        reruns: dict[str, Callable[[], object]] = {}

        def agent_topic(name: str, partitions: int = PARTITIONS) -> str:
            """A new topic (cleanup.policy=delete) on the agent for a profiled run."""
            agent.create_topic(name, "delete", partitions)
            return name

        def produce_noting_cpu(cluster: Cluster, name: str, repetition: int, count: int, value_bytes: int, compression: str,
                               noted_as: str = "") -> float:
            """Seconds of the produce measure; this process's CPU meanwhile (the client's: its Python loop and
            librdkafka's threads, and the mock's broker when measuring the mock) and the server's noted per million
            records, under `noted_as` after the measure's name."""
            topic = f"{name}{noted_as}-{repetition}"
            cluster.create_topic(topic, "delete")
            server = servers.get(cluster.name)  # none for a mock: it runs in this process
            before, client_before = server_cpu_seconds(server) if server else 0.0, time.process_time()
            drains: list[float] = []
            answers: list[float] = []
            took = produce(cluster, topic, count, value_bytes, compression, keys=count, drains=drains, answers=answers)
            client_seconds = time.process_time() - client_before
            if server:  # an agent of --processes N: its N agents
                note(cluster, f"produce_{name}_cpu", (server_cpu_seconds(server) - before) / count * 1e6)
            if cluster is agent:
                reruns[f"produce_{name}"] = lambda: produce(agent, agent_topic(f"{name}-profiled"), count, value_bytes, compression, keys=count)
            note(cluster, f"produce_{name}{noted_as}_client_cpu", client_seconds / count * 1e6)
            note(cluster, f"produce_{name}{noted_as}_drain", drains[0] * 1000)
            note(cluster, f"produce_{name}{noted_as}_answer", median(answers) if answers else float("nan"))
            return took

        for repetition in range(args.repeat if comparing - {"clients"} else 0):
            for cluster in in_turn(repetition) if "produce" in measures else ():
                note(cluster, "produce_small", produced_small / produce_noting_cpu(cluster, "small", repetition, produced_small, 100, "lz4"))
                note(cluster, "produce_large", produced_large * 1024 / produce_noting_cpu(cluster, "large", repetition, produced_large, 1024, "none") / 1e6)
                if cluster.name == "mock" and late_mock is not None:  # noted beside the mock's, as "_late"
                    note(cluster, "produce_small_late", produced_small / produce_noting_cpu(late_mock, "small", repetition, produced_small, 100, "lz4", "_late"))
            for cluster in in_turn(repetition) if "latency" in measures else ():
                topic = f"latency-{repetition}"
                cluster.create_topic(topic, "delete")
                latencies = ack_latencies(cluster, topic, args.latency_seconds)
                if cluster is agent:
                    reruns["latency"] = partial(ack_latencies, agent, topic, args.latency_seconds)
                note(cluster, "latency_p50", percentile(latencies, 0.5))
                note(cluster, "latency_p99", percentile(latencies, 0.99))
            rss["after produce"] = max(rss.get("after produce", 0), server_rss(process))
            if "fetch" in measures:
                # Fetch from files: half the keys written twice, compacted away once on the agent; Kafka and the mock
                # are given as many records of the same sizes, each key once (Kafka's cleaner never touches the active
                # segment), and read from the page cache (Kafka) or memory (the mock).
                for name, count, value_bytes in (("fetch", small, 100), ("fetch_large", large, 1024)):
                    topic = f"compacted-{value_bytes}-{repetition}"
                    agent.create_topic(topic, "compact")
                    produce(agent, topic, count, value_bytes, "lz4", keys=count // 2)
                    assert agent.catalog is not None
                    survivors = compact(agent.catalog, topic)
                    size = key_and_value_bytes(agent.catalog, topic)
                    for other in clusters[1:]:
                        other.create_topic(topic, "compact")
                        produce(other, topic, survivors, value_bytes, "lz4", keys=survivors)
                    for cluster in in_turn(repetition):  # untimed: the first read pays for the page cache and the agent's file cache
                        kcat_consume(cluster, topic)
                    reruns[name] = partial(kcat_consume, agent, topic)
                    rates: dict[str, list[tuple[float, float]]] = defaultdict(list)
                    for read_number in range(WARM_READS):  # the clusters in turn, the first rotating, WARM_READS times
                        for cluster in in_turn(repetition + read_number):
                            elapsed, records, read = kcat_consume(cluster, topic)
                            if cluster is agent and (records, read) != (survivors, size):
                                raise SystemExit(f"kcat read {records} records of {read} bytes from the agent, expected {survivors} of {size}")
                            if cluster.name == "kafka" and records != survivors:
                                raise SystemExit(f"kcat read {records} records from Apache Kafka, expected {survivors}")
                            rates[cluster.name].append((records / elapsed, read / elapsed / 1e6))
                            if read_number == 0:
                                note(cluster, f"{name}_served", records)
                    for cluster in clusters:
                        note(cluster, f"{name}_records", median([records for records, _ in rates[cluster.name]]))
                        note(cluster, f"{name}_mb", median([mb for _, mb in rates[cluster.name]]))
                    elapsed, records = in_process_fetch(agent.catalog, topic)
                    if records != survivors:
                        raise SystemExit(f"the agent's read path read {records} records, expected {survivors}")
                    note(agent, f"{name}_inproc_records", records / elapsed)
                    note(agent, f"{name}_inproc_mb", size / elapsed / 1e6)
                rss["after fetch"] = max(rss.get("after fetch", 0), server_rss(process))
            for cluster in in_turn(repetition) if "group" in measures else ():
                topic = f"group-{repetition}"
                cluster.create_topic(topic, "delete")
                note(cluster, "group_join", group_join_to_first_record(cluster, topic))
                if cluster is agent:
                    reruns["group_join"] = lambda: group_join_to_first_record(agent, agent_topic("group-profiled"))
            if "kafka" in servers:
                kafka_rss["during the measures"] = max(kafka_rss.get("during the measures", 0), servers["kafka"].memory_info().rss)
            print(f"repetition {repetition + 1} of {args.repeat} done; load average {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)

        producers, consumers = args.clients // 2, args.clients - args.clients // 2
        offered_rate = producers * args.clients_rate
        clients: dict[str, ClientsFigures] = {}
        for cluster in clusters if "clients" in measures else ():
            if not cluster.creates_any_topic:
                print(f"clients measure: not on {cluster.name}: librdkafka's mock cluster makes every topic with {PARTITIONS} partitions "
                      f"and answers no CreateTopics, and this measure needs {consumers}", flush=True)
                continue
            cluster.create_topic("clients", "delete", partitions=consumers)
            clients[cluster.name] = many_clients(cluster, servers[cluster.name], "clients", args.clients, args.clients_seconds, args.clients_rate)
            if cluster is agent:
                reruns["clients"] = lambda: many_clients(agent, process, agent_topic("clients-profiled", consumers), args.clients, args.clients_seconds,
                                                         args.clients_rate)
            got = clients[cluster.name]
            print(f"{cluster.name}: {producers} producers at {args.clients_rate:,} records/s each for {args.clients_seconds:.0f} s and "
                  f"{consumers} consumers of one group: {got.produced:,} records acked of {got.offered:,} offered "
                  f"({got.produced / args.clients_seconds:,.0f}/s), {got.consumed:,} consumed (the group's first record "
                  f"{got.first_record_s:.1f} s after the start); the server's CPU {got.server_cpu_seconds:.1f} s in {got.seconds:.1f} s "
                  f"({got.server_cpu_seconds / got.seconds:.2f} cores); load average {os.getloadavg()[0]:.2f}", flush=True)
        if "agent" in clients:
            rss[f"with {args.clients} clients"] = clients["agent"].largest_rss
        if "kafka" in clients:
            kafka_rss[f"with {args.clients} clients"] = clients["kafka"].largest_rss
        if "txn" in measures:
            txn_measures(agent, Path(directory), args.quick, args.repeat)
            rss["after transactions"] = server_rss(process)
        if "security" in measures:
            security_measures(Path(directory), small, args.repeat)
        if "fetch-compression" in measures:
            fetch_compression_measures(Path(directory) / "fetch-compression", small, args.repeat)
        if not comparing:
            if "txn" in measures:
                print(f"agent resident memory after the transactions: {rss['after transactions'] / 2**20:,.0f} MiB")
            return

        nan = float("nan")
        of: dict[str, dict[str, float]] = {
            name: defaultdict(lambda: nan, {key: median(values) for key, values in figures[name].items()}) for name in CLUSTERS}
        missed: dict[str, str] = {}  # a missed target's name: the measure whose profile shows what binds it

        def judged(line: str, name: str, measure: str) -> str:
            if "MISSED" in line:
                missed[name] = measure
            return line

        print(f"\nmedians of {args.repeat}, every measure on each cluster in turn (the first rotating); machine: {machine()}")
        print(f"{'measure':<44} {'agent':>12} {'Kafka':>12} {'mock':>12}  {'ag/Kf':>6}  {'unit':<10} target")
        print(judged(row(f"produce {produced_small:,} x 100 B, lz4, acks=all", of, "produce_small", "records/s", ">= 500,000", 0.8), "produce 100 B", "produce_small"))
        print(judged(row(f"produce {produced_large:,} x 1 KiB, acks=all", of, "produce_large", "MB/s", ">= 150", 0.8), "produce 1 KiB", "produce_large"))
        print(f"  from the last record sent to its acknowledgement (ms; part of each run above): 100 B agent {of['agent']['produce_small_drain']:.0f}, "
              f"Kafka {of['kafka']['produce_small_drain']:.0f}, mock {of['mock']['produce_small_drain']:.0f}; 1 KiB agent "
              f"{of['agent']['produce_large_drain']:.0f}, Kafka {of['kafka']['produce_large_drain']:.0f}, mock {of['mock']['produce_large_drain']:.0f}")
        print(f"  the server's answer to a Produce request under this load (ms, librdkafka's rtt, the median of its {STATS_MS} ms windows' p50): "
              f"100 B agent {of['agent']['produce_small_answer']:.0f}, Kafka {of['kafka']['produce_small_answer']:.0f}, mock "
              f"{of['mock']['produce_small_answer']:.0f}, the late mock {of['mock']['produce_small_late_answer']:.0f}; 1 KiB agent "
              f"{of['agent']['produce_large_answer']:.0f}, Kafka {of['kafka']['produce_large_answer']:.0f}, mock {of['mock']['produce_large_answer']:.0f}")
        print(f"  the server's CPU per million records produced: 100 B agent {of['agent']['produce_small_cpu']:.2f} s, Kafka "
              f"{of['kafka']['produce_small_cpu']:.2f} s; 1 KiB agent {of['agent']['produce_large_cpu']:.2f} s, Kafka {of['kafka']['produce_large_cpu']:.2f} s")
        print(f"  the client's CPU per million records produced (this process: the Python loop and librdkafka's threads; the mock's broker too): "
              f"100 B agent {of['agent']['produce_small_client_cpu']:.2f} s, Kafka {of['kafka']['produce_small_client_cpu']:.2f} s, "
              f"mock {of['mock']['produce_small_client_cpu']:.2f} s; 1 KiB agent {of['agent']['produce_large_client_cpu']:.2f} s, "
              f"Kafka {of['kafka']['produce_large_client_cpu']:.2f} s, mock {of['mock']['produce_large_client_cpu']:.2f} s")
        late, prompt = of["mock"]["produce_small_late"], of["mock"]["produce_small"]
        if not math.isnan(late):
            print(f"  the mock answering {FLUSH_MS} ms late (test.mock.broker.rtt, the agent's flush interval), 100 B: {late:,.0f} records/s, "
                  f"{late / prompt:.2f} of its prompt answers' rate, the client's CPU {of['mock']['produce_small_late_client_cpu']:.2f} s per "
                  f"million records: what waiting for an acknowledgement alone costs a client on the cores it shares")
        print(row(f"ack latency p50, acks=all, {FLUSH_MS} ms flush", of, "latency_p50", "ms", ""))
        p99 = of["agent"]["latency_p99"]
        print(judged(row(f"ack latency p99, acks=all, {FLUSH_MS} ms flush", of, "latency_p99", "ms", "" if math.isnan(p99) else f"agent {verdict(p99, 400, at_least=False)}"),
                     "ack p99", "latency"))
        print(judged(row("fetch, compacted, from files, 100 B, kcat", of, "fetch_records", "records/s", ">= 1,000,000", 0.9), "fetch 100 B records/s", "fetch"))
        print(judged(row("fetch, compacted, from files, 100 B, kcat", of, "fetch_mb", "MB/s", "", 0.9), "fetch 100 B MB/s", "fetch"))
        print(judged(row("fetch, compacted, from files, 1 KiB, kcat", of, "fetch_large_records", "records/s", "", 0.9), "fetch 1 KiB records/s", "fetch_large"))
        print(judged(row("fetch, compacted, from files, 1 KiB, kcat", of, "fetch_large_mb", "MB/s", ">= 300", 0.9), "fetch 1 KiB MB/s", "fetch_large"))
        print(row("  the agent's read path alone, 100 B", of, "fetch_inproc_records", "records/s", "(in-process)"))
        print(row("  the agent's read path alone, 1 KiB", of, "fetch_large_inproc_mb", "MB/s", "(in-process)"))
        if "fetch" in measures:
            print("records kcat read (median): " + "; ".join(f"{name} {of[name]['fetch_served']:,.0f} and {of[name]['fetch_large_served']:,.0f}"
                                                              for name in by_name) + " (the mock: of what it kept)")
        print(judged(row("consumer group of 3: join to first record", of, "group_join", "s", "<= 5", 1.2, at_least=False), "group join", "group_join"))
        if "group" in measures and "kafka" in by_name:
            print(f"  a new group's first rebalance waits group.initial.rebalance.delay.ms for more members: Kafka's {KAFKA_GROUP_DELAY_MS:,} ms "
                  "(its default), the agent's 1,000 ms (docs/agent.md, Consumer groups)")
        for name, got in clients.items():
            kept_up = got.produced >= got.offered and got.consumed >= got.produced
            line = (f"{args.clients} clients, {name}: {got.produced / max(1, got.offered):.1%} of {offered_rate:,} records/s offered acked, "
                    f"{got.consumed / max(1, got.produced):.1%} of them consumed (target: all acked, consumers keep up: {'met' if kept_up else 'MISSED'})")
            print(judged(line, f"{args.clients} clients ({name})", "clients") if name == "agent" else line)
        print("agent resident memory (max): " + ", ".join(f"{rss[name] / 2**20:,.0f} MiB {name}" for name in rss))
        print("  its bounds (settings): the fetch cache 256 MiB, requests read and not answered 1 GiB (128 MiB a connection),"
              " the ingest buffer flush_bytes 32 MiB (a full one flushing while the next fills), 1,000 connections")
        if kafka_rss:
            print(f"Kafka resident memory (max, heap {KAFKA_HEAP}): " + ", ".join(f"{kafka_rss[name] / 2**20:,.0f} MiB {name}" for name in kafka_rss))
        print(DURABILITY)
        if missed:
            print(f"\nmissed: {', '.join(missed)}; what binds each and what would close it: bench/README.md, Where the misses come from. "
                  f"Each measure missed, run once more on the agent alone (not counted), sampled by py-spy at {PROFILE_RATE} a second "
                  "without pausing it:", flush=True)
            for measure in dict.fromkeys(missed.values()):
                if measure not in reruns:
                    print(f"no profile of {measure}: the agent did not run it")
                    continue
                with sampled(process.pid, f"the agent during {measure}", PROFILE_RATE, subprocesses=args.agent_processes > 1) as profile:
                    reruns[measure]()
                print(profile.summary(), flush=True)


if __name__ == "__main__":
    with recorded():
        main()
