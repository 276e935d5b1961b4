"""The agent's Prometheus metrics (--metrics-listen), scraped over HTTP and parsed by prometheus_client's own parser,
against a known load from confluent-kafka and raw requests: records and bytes in and out per topic, requests and
errors per API, connections, flushes, groups and their members, and lag per partition against the catalog."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator

import pytest
from confluent_kafka import Consumer, Producer
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families
from prometheus_client.parser import text_string_to_metric_families

from logcompact.catalog import Catalog
from logcompact.catalog.credentials import new_credential
from logcompact.exceptions import LogcompactError
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.server import AgentServer, AgentSettings
from tests.helpers import NOW, create_topic
from tests.kafka.agents import FAST_CLIENT, FLUSH_MS, RunningAgent, agent_environment, free_port
from tests.kafka.wire import Wire, keyed_batch, produce

pytestmark = pytest.mark.timeout(120)

TOPIC, GROUP, PARTITIONS = "metered", "metered-group", 3
FIRST, LATER = 300, 30  # records produced before the group consumes and commits, and after
BATCH_HEADER_BYTES = 61  # a record batch v2's header
# A record's framing in a batch v2 around its key and value: length, attributes, timestamp and offset deltas, key and
# value lengths, header count; at least one byte each, at most what these records' varints take.
RECORD_OVERHEAD_BYTES = (7, 20)
API_VERSIONS, PRODUCE = 18, 0


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    create_topic(catalog, TOPIC, PARTITIONS)
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, metrics_listen=Address("127.0.0.1", 0))
    try:
        yield running
    finally:
        running.stop()


class Scrape:
    """One /metrics page, parsed: each sample's value by its name and labels."""

    def __init__(self, agent: RunningAgent, path: str = "/metrics") -> None:
        address = agent.server.metrics_address
        assert address is not None
        with urllib.request.urlopen(f"http://{address}{path}", timeout=10) as answer:
            text = answer.read().decode()
        self.types = {}
        self.samples: dict[tuple[str, frozenset[tuple[str, str]]], float] = {}
        for family in text_string_to_metric_families(text):
            self.types[family.name] = family.type
            for sample in family.samples:
                self.samples[(sample.name, frozenset(sample.labels.items()))] = sample.value

    def __call__(self, name: str, **labels: str) -> float:
        return self.samples[(name, frozenset(labels.items()))]

    def get(self, name: str, **labels: str) -> float:
        return self.samples.get((name, frozenset(labels.items())), 0.0)

    def labelled(self, name: str) -> dict[frozenset[tuple[str, str]], float]:
        return {labels: value for (sample, labels), value in self.samples.items() if sample == name}


def scraped_until(agent: RunningAgent, done: Callable[[Scrape], bool], timeout: float = 30) -> Scrape:
    """Scrape until `done` holds (what the agent counts as connections close, or a catalog read newer than the last)."""
    deadline = time.monotonic() + timeout
    while True:
        scrape = Scrape(agent)
        if done(scrape) or time.monotonic() > deadline:
            return scrape
        time.sleep(0.2)


def produce_records(agent: RunningAgent, count: int, start: int) -> int:
    """`count` keyed records over the topic's partitions, uncompressed; their keys' and values' bytes."""
    producer = Producer({"bootstrap.servers": agent.bootstrap, "linger.ms": 5, "compression.type": "none", **FAST_CLIENT})
    payload = 0
    for index in range(start, start + count):
        key, value = f"k{index}".encode(), b"v" * (index % 50)
        producer.produce(TOPIC, value, key, partition=index % PARTITIONS)
        payload += len(key) + len(value)
    assert producer.flush(30) == 0
    return payload


def test_metrics_count_a_known_load(agent: RunningAgent, catalog: Catalog) -> None:
    payload = produce_records(agent, FIRST, 0)
    scrape = Scrape(agent)
    assert scrape("kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC) == FIRST
    batches = scrape("kafka_server_brokertopicmetrics_totalproducerequests_total", topic=TOPIC)
    assert scrape.get("kafka_server_brokertopicmetrics_failedproducerequests_total", topic=TOPIC) == 0
    bytes_in = scrape("kafka_server_brokertopicmetrics_bytesin_total", topic=TOPIC)
    framing = payload + BATCH_HEADER_BYTES * batches
    assert framing + RECORD_OVERHEAD_BYTES[0] * FIRST <= bytes_in <= framing + RECORD_OVERHEAD_BYTES[1] * FIRST
    assert scrape("kafka_server_brokertopicmetrics_bytesin_total") == bytes_in  # all topics: only this one took records
    assert scrape.types["kafka_server_brokertopicmetrics_bytesin"] == "counter"
    produced = sum(value for labels, value in scrape.labelled("kafka_network_requestmetrics_requests_total").items() if ("request", "Produce") in labels)
    assert produced >= 1
    assert scrape("kafka_network_requestmetrics_totaltimems_count", request="Produce") == produced
    assert scrape.types["kafka_network_requestmetrics_totaltimems"] == "summary"
    assert scrape("kafka_network_requestmetrics_totaltimems", request="Produce", quantile="0.99") > 0
    assert scrape("kafka_network_requestmetrics_errors_total", request="Produce", error="NONE") == batches
    # every record is in a committed L0 file by the time its producer was answered
    assert scrape("logcompact_agent_l0_records_total") == FIRST
    assert scrape("kafka_log_logflushstats_logflushrateandtimems_count") >= 1
    assert scrape("logcompact_agent_l0_file_bytes_sum") > 0
    commits = scrape("logcompact_agent_l0_commit_ms_count")
    assert 1 <= commits <= scrape("kafka_log_logflushstats_logflushrateandtimems_count")  # a commit takes one file or more
    assert scrape("logcompact_agent_l0_commit_ms", quantile="0.50") <= scrape("logcompact_agent_l0_commit_ms", quantile="0.999")

    consumer = Consumer({"bootstrap.servers": agent.bootstrap, "group.id": GROUP, "auto.offset.reset": "earliest",
                         "enable.auto.commit": False, **FAST_CLIENT})
    try:
        consumer.subscribe([TOPIC])
        consumed = 0
        deadline = time.monotonic() + 60
        while consumed < FIRST and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                consumed += 1
        assert consumed == FIRST
        consumer.commit(asynchronous=False)
        produce_records(agent, LATER, FIRST)
        committed = catalog.committed_offsets(GROUP)
        high = {partition: offsets.high_watermark for partition, offsets in enumerate(catalog.log_offsets(TOPIC))}
        assert sum(high.values()) - sum(c.offset for c in committed.values()) == LATER

        def lag_of(scrape: Scrape, partition: int) -> float:
            return scrape.get("kafka_consumergroup_lag", consumergroup=GROUP, topic=TOPIC, partition=str(partition))

        scrape = scraped_until(agent, lambda scrape: sum(lag_of(scrape, p) for p in range(PARTITIONS)) == LATER)
        for partition in range(PARTITIONS):
            labels = {"consumergroup": GROUP, "topic": TOPIC, "partition": str(partition)}
            assert scrape("kafka_consumergroup_current_offset", **labels) == committed[(TOPIC, partition)].offset
            assert lag_of(scrape, partition) == high[partition] - committed[(TOPIC, partition)].offset
            assert scrape("kafka_topic_partition_current_offset", topic=TOPIC, partition=str(partition)) == high[partition]
        assert scrape("kafka_consumergroup_lag_sum", consumergroup=GROUP, topic=TOPIC) == LATER
        assert scrape("kafka_consumergroup_members", consumergroup=GROUP) == 1
        assert scrape("kafka_coordinator_group_groupmetadatamanager_numgroups") == 1
        assert scrape("kafka_coordinator_group_groupmetadatamanager_numgroupsstable") == 1
        assert scrape("kafka_coordinator_group_groupmetadatamanager_numoffsets") == PARTITIONS
        assert scrape("logcompact_agent_lag_partitions_truncated") == 0
        assert scrape("kafka_server_brokertopicmetrics_bytesout_total", topic=TOPIC) >= payload + RECORD_OVERHEAD_BYTES[0] * FIRST
        assert scrape("kafka_server_brokertopicmetrics_totalfetchrequests_total", topic=TOPIC) >= 1
        fetches = scrape("kafka_network_requestmetrics_totaltimems_count", request="Fetch")
        assert fetches >= 1 and scrape("kafka_network_requestmetrics_totaltimems_count", request="FetchConsumer") == fetches
        for api in ("JoinGroup", "SyncGroup", "OffsetCommit", "FindCoordinator", "Metadata", "ApiVersions"):
            assert any(("request", api) in labels for labels in scrape.labelled("kafka_network_requestmetrics_requests_total")), api
        assert scrape("logcompact_agent_l0_records_total") == FIRST + LATER
    finally:
        consumer.close()


def test_requests_errors_and_connections_counted_exactly(agent: RunningAgent) -> None:
    wire = Wire(agent)
    try:
        # the only connection once the scrape's HTTP connection is not a Kafka one: created and closed add up
        before = scraped_until(agent, lambda scrape: scrape("kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") == 1)
        assert before("kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") == 1
        assert (before("kafka_server_socket_server_metrics_connection_creation_total", listener="PLAINTEXT")
                - before("kafka_server_socket_server_metrics_connection_close_total", listener="PLAINTEXT")) == 1
        for _ in range(5):
            assert wire.call(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}).error_code == 0
        answered = produce(agent, {(TOPIC, 0): keyed_batch(4), (TOPIC, 99): keyed_batch(2)})
        assert answered[(TOPIC, 99)].error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
        after = scraped_until(agent, lambda scrape: scrape("kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") == 1)
    finally:
        wire.close()

    def delta(name: str, **labels: str) -> float:
        return after.get(name, **labels) - before.get(name, **labels)

    assert delta("kafka_network_requestmetrics_requests_total", request="ApiVersions", version="3") == 5
    assert delta("kafka_network_requestmetrics_errors_total", request="ApiVersions", error="NONE") == 5
    assert delta("kafka_network_requestmetrics_requests_total", request="Produce", version="9") == 1
    assert delta("kafka_network_requestmetrics_errors_total", request="Produce", error="UNKNOWN_TOPIC_OR_PARTITION") == 1
    assert delta("kafka_network_requestmetrics_errors_total", request="Produce", error="NONE") == 1
    assert delta("kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC) == 4  # the refused batch's records are not counted
    assert delta("kafka_server_brokertopicmetrics_bytesin_total", topic=TOPIC) == len(keyed_batch(4))
    assert delta("kafka_server_brokertopicmetrics_failedproducerequests_total", topic=TOPIC) == 1
    assert delta("kafka_server_socket_server_metrics_connection_creation_total", listener="PLAINTEXT") == 1  # produce()'s own
    assert delta("kafka_server_socket_server_metrics_connection_close_total", listener="PLAINTEXT") == 1


def test_a_bad_scrape_leaves_the_agent_serving(agent: RunningAgent) -> None:
    address = agent.server.metrics_address
    assert address is not None
    with socket.create_connection((address.host, address.port), timeout=5) as raw:
        raw.sendall(b"\x16\x03\x01 not HTTP at all\r\n\r\n")
        raw.recv(1024)
    with socket.create_connection((address.host, address.port), timeout=5):
        pass  # connected and gone without a request
    assert Scrape(agent)("kafka_server_socket_server_metrics_connection_count", listener="PLAINTEXT") >= 0
    # Prometheus asks for OpenMetrics first: the same families, valid in that format too
    asked = urllib.request.Request(f"http://{address}/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"})
    with urllib.request.urlopen(asked, timeout=10) as answer:
        assert answer.headers["Content-Type"].startswith("application/openmetrics-text")
        families = {family.name: family.type for family in openmetrics_families(answer.read().decode())}
    assert families["kafka_network_requestmetrics_totaltimems"] == "summary" and families["kafka_server_brokertopicmetrics_bytesin"] == "counter"
    wire = Wire(agent)
    try:
        assert wire.call(API_VERSIONS, 3, {"client_software_name": "raw", "client_software_version": "1"}).error_code == 0
    finally:
        wire.close()


def test_metrics_listen_taken_is_refused_before_serving(catalog: Catalog) -> None:
    catalog.ensure_created(NOW)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = AgentServer(catalog, AgentSettings(metrics_listen=Address("127.0.0.1", port)))
        with pytest.raises(LogcompactError, match=rf"cannot serve metrics on 127\.0\.0\.1:{port}: .*pass another --metrics-listen"):
            asyncio.run(server.start())
        assert not server._servers  # no Kafka listener was opened


def test_the_agent_command_serves_metrics(catalog: Catalog) -> None:
    """`logcompact agent --metrics-listen 127.0.0.1:0` as a process: its startup line reports the port /metrics is
    served on, /metrics answers there, and SIGTERM stops both."""
    catalog.ensure_created(NOW)
    command = [sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0"]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        metrics = json.loads(line)["metrics"]
        host, metrics_port = metrics.rsplit(":", 1)
        assert host == "127.0.0.1" and int(metrics_port) > 0
        with urllib.request.urlopen(f"http://{metrics}/metrics", timeout=10) as answer:
            families = {family.name for family in text_string_to_metric_families(answer.read().decode())}
        assert {"kafka_server_brokertopicmetrics_bytesin", "kafka_network_requestmetrics_totaltimems",
                "kafka_coordinator_group_groupmetadatamanager_numgroups", "kafka_log_logflushstats_logflushrateandtimems"} <= families
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0
    with socket.socket() as probe:  # nothing listens on the metrics port any more (the scrape's own close may linger in TIME_WAIT)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", int(metrics_port)))


def test_the_agent_command_reports_no_metrics_address_without_the_option(catalog: Catalog) -> None:
    catalog.ensure_created(NOW)
    process = subprocess.Popen([sys.executable, "-m", "logcompact", "agent", "--listen", "127.0.0.1:0"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=agent_environment(catalog))
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, process.stderr.read() if process.stderr else ""
        started = json.loads(line)
        assert "metrics" in started and started["metrics"] is None
    finally:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=60) == 0


def test_a_bad_metrics_address_is_refused_in_one_line(catalog: Catalog) -> None:
    catalog.ensure_created(NOW)
    done = subprocess.run([sys.executable, "-m", "logcompact", "agent", "--metrics-listen", "9404"], capture_output=True, text=True,
                          env=agent_environment(catalog), timeout=120)
    assert done.returncode != 0 and "--metrics-listen '9404' is not HOST:PORT" in done.stderr


def test_a_listener_address_taken_stops_the_metrics_server_too(catalog: Catalog) -> None:
    catalog.ensure_created(NOW)
    metrics_port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        listener = Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", taken.getsockname()[1]))
        server = AgentServer(catalog, AgentSettings((listener,), metrics_listen=Address("127.0.0.1", metrics_port)))
        with pytest.raises(LogcompactError, match="agent cannot listen on"):
            asyncio.run(server.start())
    with socket.socket() as probe:  # nothing listens on the metrics port
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", metrics_port))


def test_sasl_requests_and_connections_by_listener(catalog: Catalog) -> None:
    create_topic(catalog, TOPIC, PARTITIONS)
    catalog.put_scram_credential("alice", new_credential("SCRAM-SHA-256", "alice-secret", 4096))
    listeners = (Listener(SecurityProtocol.SASL_PLAINTEXT, Address("127.0.0.1", 0)), Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0)))
    agent = RunningAgent(catalog, listeners, flush_interval_ms=FLUSH_MS, metrics_listen=Address("127.0.0.1", 0))
    try:
        producer = Producer({"bootstrap.servers": agent.bootstrap, "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                             "sasl.username": "alice", "sasl.password": "alice-secret", **FAST_CLIENT})
        for index in range(3):
            producer.produce(TOPIC, b"v", b"k%d" % index, partition=0)
        assert producer.flush(30) == 0
        scrape = Scrape(agent)
        requests = scrape.labelled("kafka_network_requestmetrics_requests_total")
        for api in ("SaslHandshake", "SaslAuthenticate", "Produce"):
            assert sum(value for labels, value in requests.items() if ("request", api) in labels) >= 1, api
        assert scrape("kafka_server_brokertopicmetrics_messagesin_total", topic=TOPIC) == 3
        assert scrape("kafka_server_socket_server_metrics_connection_count", listener="SASL_PLAINTEXT") >= 1
        assert scrape("kafka_server_socket_server_metrics_connection_creation_total", listener="PLAINTEXT") == 0
    finally:
        agent.stop()
