"""The agent's metrics in Prometheus' text format, under the names the Prometheus JMX exporter gives Kafka's MBeans
(its kafka-2_0_0.yml example rules, `lowercaseOutputName: true`), so dashboards made for Kafka brokers find them;
consumer lag and group members under kafka_exporter's names, which lag dashboards read (Kafka brokers have no MBean
for either). docs/metrics.md lists each with its MBean.

The serving path only counts: a few dictionary updates per request (`AgentMetrics.answered`), per partition for
Produce and Fetch bytes, never per record. Everything else is worked out at scrape time, on the scraping thread:
quantiles from the recent requests' times, group states from the coordinator's memory, and lag from one bounded
catalog read (`Catalog.consumer_lags`), done at most once a `CATALOG_READ_SECONDS` however often Prometheus
scrapes. A scrape that fails in part (the catalog unreachable) logs one line and serves the rest.
"""

from __future__ import annotations

import dataclasses
import logging
import struct
import threading
import time
import typing
from collections import deque
from collections.abc import Callable, Iterator
from functools import cache
from typing import Any
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector

from logcompact.catalog.lags import PartitionLag
from logcompact.exceptions import LogcompactError
from logcompact.kafka import codec
from logcompact.kafka.broker import Broker
from logcompact.kafka.cluster import Address
from logcompact.kafka.quota_manager import Muted
from logcompact.kafka.served_version import served_version

log = logging.getLogger(__name__)

# Kafka's histograms keep a reservoir of 1,028 samples (Yammer's); quantiles here are over each API's last 1,028 requests.
RECENT_REQUESTS = 1028
# The percentiles Kafka's histogram MBeans have (50thPercentile ... 999thPercentile), as the JMX exporter labels them.
QUANTILES = (("0.50", 0.50), ("0.75", 0.75), ("0.95", 0.95), ("0.98", 0.98), ("0.99", 0.99), ("0.999", 0.999))
# Committed offsets read per lag computation: the catalog read stays bounded however many groups the cluster has.
MAX_LAG_PARTITIONS = 10_000
CATALOG_READ_SECONDS = 1.0  # a scrape reuses the catalog's figures read less than this long ago
PRODUCE, FETCH = 0, 1
_RECORD_COUNT = struct.Struct(">i")
# Where a record batch v2 holds its record count: after its base offset 8, length 4, leader epoch 4, magic 1, CRC 4,
# attributes 2, last offset delta 4, two timestamps 16, and producer id, epoch and base sequence 14.
_RECORD_COUNT_AT = 57
GROUP_STATES = ("PreparingRebalance", "CompletingRebalance", "Stable", "Dead", "Empty")


class AgentMetrics:
    """Counters the serving path updates on the event loop, read by the scrape's thread: plain dicts and deques,
    whose single updates and copies the GIL keeps whole, so the hot path takes no lock."""

    def __init__(self) -> None:
        self.requests: dict[tuple[int, int], int] = {}  # by (API key, version)
        self.request_ms: dict[int, float] = {}  # all requests' times summed, by API key
        self.recent_ms: dict[int, deque[float]] = {}  # the last RECENT_REQUESTS times, by API key
        self.errors: dict[tuple[int, int], int] = {}  # error codes in responses, by (API key, code), NONE included
        self.bytes_in: dict[str, int] = {}  # by topic: record batches' bytes appended
        self.messages_in: dict[str, int] = {}  # by topic: records appended
        self.bytes_out: dict[str, int] = {}  # by topic: record batches' bytes sent to consumers
        self.produce_requests: dict[str, int] = {}  # by topic: partitions' batches a Produce carried (Kafka's TotalProduceRequestsPerSec)
        self.failed_produce_requests: dict[str, int] = {}  # by topic: those refused
        self.fetch_requests: dict[str, int] = {}  # by topic: partitions a Fetch asked (Kafka's TotalFetchRequestsPerSec)
        self.connections_created: dict[str, int] = {}  # by listener name
        self.connections_closed: dict[str, int] = {}

    def connected(self, listener: str) -> None:
        self.connections_created[listener] = self.connections_created.get(listener, 0) + 1

    def disconnected(self, listener: str) -> None:
        self.connections_closed[listener] = self.connections_closed.get(listener, 0) + 1

    def answered(self, request: codec.Request, response: Any, started: float) -> None:
        """A request answered (`response` None or Muted: a Produce at acks=0), `started` at its time.perf_counter()."""
        took_ms = (time.perf_counter() - started) * 1000
        api_key = request.api_key
        key = (api_key, request.api_version)
        self.requests[key] = self.requests.get(key, 0) + 1
        self.request_ms[api_key] = self.request_ms.get(api_key, 0.0) + took_ms
        recent = self.recent_ms.get(api_key)
        if recent is None:
            recent = self.recent_ms[api_key] = deque(maxlen=RECENT_REQUESTS)
        recent.append(took_ms)
        answered = response is not None and not isinstance(response, Muted)
        if api_key == PRODUCE and request.body is not None:
            self._produced(request.body, response if answered else None)  # its errors counted on the way
            return
        if answered:
            _count_errors(response, api_key, self.errors)
            if api_key == FETCH and request.body is not None:
                self._fetched(request.body, response)

    def _produced(self, body: Any, response: Any) -> None:
        """Kafka's ReplicaManager counts a partition's batch bytes and records once appended: here once answered
        without error (at acks=0, taken; a refused batch closes the connection instead)."""
        answers = response.responses if response is not None else None
        bytes_in, messages_in, requests, failed, errors = self.bytes_in, self.messages_in, self.produce_requests, self.failed_produce_requests, self.errors
        for at, topic in enumerate(body.topic_data):
            name = topic.name
            partitions = answers[at].partition_responses if answers is not None else None
            for index, partition in enumerate(topic.partition_data):
                requests[name] = requests.get(name, 0) + 1
                if partitions is not None:  # the handler answers every partition, in the request's order
                    error = (PRODUCE, int(partitions[index].error_code))
                    errors[error] = errors.get(error, 0) + 1
                    if error[1]:
                        failed[name] = failed.get(name, 0) + 1
                        continue
                batch = partition.records
                if batch is None or len(batch) < _RECORD_COUNT_AT + 4:
                    continue
                bytes_in[name] = bytes_in.get(name, 0) + len(batch)
                messages_in[name] = messages_in.get(name, 0) + _RECORD_COUNT.unpack_from(batch, _RECORD_COUNT_AT)[0]

    def _fetched(self, body: Any, response: Any) -> None:
        """Fetch up to v12 names its topics; a version naming them by id only (v13 on) is not counted per topic."""
        bytes_out, requests = self.bytes_out, self.fetch_requests
        for topic in body.topics:
            name = getattr(topic, "topic", None)
            if name is not None:
                requests[name] = requests.get(name, 0) + len(topic.partitions)
        for topic in response.responses:
            name = getattr(topic, "topic", None)
            size = sum(len(partition.records) for partition in topic.partitions if partition.records is not None)
            if size and name is not None:
                bytes_out[name] = bytes_out.get(name, 0) + size


def _count_errors(entity: Any, api_key: int, errors: dict[tuple[int, int], int]) -> None:
    """Every error code in a response counted, as Kafka's `AbstractResponse.errorCounts` counts them (NONE included)."""
    entity_class: Any = type(entity)
    codes, nested = _error_plan(entity_class)
    for name in codes:
        code = getattr(entity, name)
        if code is not None:
            error = (api_key, int(code))
            errors[error] = errors.get(error, 0) + 1
    for name, many in nested:
        value = getattr(entity, name)
        if value is None:
            continue
        for inner in value if many else (value,):
            _count_errors(inner, api_key, errors)


@cache
def _error_plan(entity_class: Any) -> tuple[tuple[str, ...], tuple[tuple[str, bool], ...]]:
    """A kio entity's error code fields, and the fields holding entities (one, or a tuple: `many`) that have some."""
    hints = typing.get_type_hints(entity_class)
    codes, nested = [], []
    for field in dataclasses.fields(entity_class):
        if field.metadata.get("kafka_type") == "error_code":
            codes.append(field.name)
            continue
        entity, many = _entity_of(hints[field.name])
        if entity is not None and any(_error_plan(entity)):
            nested.append((field.name, many))
    return tuple(codes), tuple(nested)


def _entity_of(hint: Any) -> tuple[Any, bool]:
    """The kio entity class a field holds, and whether a tuple of them; (None, False) for anything else."""
    args = [arg for arg in typing.get_args(hint) if arg is not type(None) and arg is not Ellipsis]
    if typing.get_origin(hint) is tuple and len(args) == 1 and dataclasses.is_dataclass(args[0]):
        return args[0], True
    if dataclasses.is_dataclass(hint):
        return hint, False
    if len(args) == 1 and dataclasses.is_dataclass(args[0]):  # Optional[Entity]
        return args[0], False
    return None, False


def request_name(api_key: int) -> str:
    """Kafka's name of an API as its RequestMetrics MBeans carry it (ApiKeys' name): Produce, ListOffsets, ..."""
    return "".join(word.capitalize() for word in codec.api_name(api_key).split("_"))


def error_name(code: int) -> str:
    """Kafka's name of an error code (its Errors enum): NONE, UNKNOWN_TOPIC_OR_PARTITION, ..."""
    try:
        return codec.ErrorCode(code).name.upper()
    except ValueError:
        return f"UNKNOWN_{code}"


def _quantiles(samples: list[float]) -> Iterator[tuple[str, float]]:
    """Kafka's Yammer histogram percentiles of the samples (its Snapshot.getValue: the value at rank q*(n+1))."""
    samples.sort()
    count = len(samples)
    for label, q in QUANTILES:
        position = q * (count + 1)
        if position < 1:
            yield label, samples[0]
        elif position >= count:
            yield label, samples[-1]
        else:
            lower = samples[int(position) - 1]
            yield label, lower + (position - int(position)) * (samples[int(position)] - lower)


def _add_summary(family: Metric, labels: dict[str, str], recent: list[float], count: int, total: float) -> None:
    """A Kafka histogram MBean as the JMX exporter gives it: a sample per percentile with a `quantile` label, its
    Count as `_count`; `_sum` added (the MBean's Mean times its Count), which Prometheus' summaries carry."""
    if recent:
        for label, value in _quantiles(recent):
            family.add_sample(family.name, {**labels, "quantile": label}, value)
    family.add_sample(family.name + "_count", labels, count)
    family.add_sample(family.name + "_sum", labels, total)


@dataclasses.dataclass(frozen=True)
class CatalogFigures:
    """What a scrape reads of the catalog: groups (id and stored state) and committed offsets with high watermarks."""

    groups: dict[str, str]
    lags: list[PartitionLag]
    truncated: bool


class AgentCollector(Collector):
    """The agent's metrics for prometheus_client, built at each scrape."""

    def __init__(self, metrics: AgentMetrics, broker: Callable[[], Broker | None], listeners: tuple[str, ...]) -> None:
        self.metrics = metrics
        self.broker = broker  # None until the agent has started: its flushes, groups and lag are left out until then
        self.listeners = listeners  # their names, each reported even before its first connection
        self._read_lock = threading.Lock()  # one catalog read at a time: concurrent scrapes wait for it and share it
        self._figures: CatalogFigures | None = None
        self._read_at = -float("inf")

    def collect(self) -> Iterator[Metric]:
        yield from self._topics()
        yield from self._requests()
        yield from self._connections()
        broker = self.broker()
        if broker is None:
            return
        yield from self._flushes(broker)
        yield from self._fetch_reads(broker)
        try:
            figures = self._catalog_figures(broker)
        except Exception as exc:  # the catalog unreachable: the rest is served, the next scrape tries again
            log.warning("metrics: consumer groups and lag left out of this scrape: the catalog read failed: %s: %s", type(exc).__name__, exc)
            return
        yield from self._groups(broker, figures)

    def _topics(self) -> Iterator[Metric]:
        m = self.metrics
        for name, counts, what in (
            ("bytesin", m.bytes_in, "Record batches' bytes appended (Kafka's BrokerTopicMetrics BytesInPerSec)"),
            ("bytesout", m.bytes_out, "Record batches' bytes sent to consumers (BytesOutPerSec)"),
            ("messagesin", m.messages_in, "Records appended (MessagesInPerSec)"),
            ("totalproducerequests", m.produce_requests, "Partitions' batches in Produce requests (TotalProduceRequestsPerSec)"),
            ("failedproducerequests", m.failed_produce_requests, "Partitions' batches refused (FailedProduceRequestsPerSec)"),
            ("totalfetchrequests", m.fetch_requests, "Partitions asked by Fetch requests (TotalFetchRequestsPerSec)"),
        ):
            family = CounterMetricFamily(f"kafka_server_brokertopicmetrics_{name}", what, labels=["topic"])
            by_topic = dict(counts)
            for topic, value in sorted(by_topic.items()):
                family.add_metric([topic], value)
            # Kafka's MBean without a topic key, of all topics, which dashboards of the cluster's rate read
            family.add_sample(family.name + "_total", {}, sum(by_topic.values()))
            yield family

    def _requests(self) -> Iterator[Metric]:
        m = self.metrics
        requests = dict(m.requests)
        by_api: dict[int, int] = {}
        rates = CounterMetricFamily("kafka_network_requestmetrics_requests", "Requests answered (Kafka's RequestMetrics RequestsPerSec)",
                                    labels=["request", "version"])
        times = SummaryMetricFamily("kafka_network_requestmetrics_totaltimems",
                         "Milliseconds from a request read to its answer made, over the last 1,028 of each API (RequestMetrics TotalTimeMs)")
        for (api_key, version), count in sorted(requests.items()):
            by_api[api_key] = by_api.get(api_key, 0) + count
            rates.add_metric([request_name(api_key), str(version)], count)
            if api_key == FETCH:  # Kafka's Fetch metrics are also kept as FetchConsumer (FetchFollower: replicas, none here)
                rates.add_metric(["FetchConsumer", str(version)], count)
        for api_key, count in sorted(by_api.items()):
            recent = list(m.recent_ms.get(api_key, ()))
            total = m.request_ms.get(api_key, 0.0)
            names = (request_name(api_key), "FetchConsumer") if api_key == FETCH else (request_name(api_key),)
            for name in names:
                _add_summary(times, {"request": name}, list(recent), count, total)
        errors = CounterMetricFamily("kafka_network_requestmetrics_errors", "Error codes in responses, NONE included (RequestMetrics ErrorsPerSec)",
                                     labels=["request", "error"])
        for (api_key, code), count in sorted(dict(m.errors).items()):
            errors.add_metric([request_name(api_key), error_name(code)], count)
        yield from (rates, times, errors)

    def _connections(self) -> Iterator[Metric]:
        m = self.metrics
        created, closed = dict(m.connections_created), dict(m.connections_closed)
        count = GaugeMetricFamily("kafka_server_socket_server_metrics_connection_count", "Connections open (socket-server-metrics connection-count)",
                                  labels=["listener"])
        creations = CounterMetricFamily("kafka_server_socket_server_metrics_connection_creation",
                                        "Connections accepted (socket-server-metrics connection-creation-total)", labels=["listener"])
        closes = CounterMetricFamily("kafka_server_socket_server_metrics_connection_close",
                                     "Connections closed (socket-server-metrics connection-close-total)", labels=["listener"])
        for listener in self.listeners:
            opened, ended = created.get(listener, 0), closed.get(listener, 0)
            count.add_metric([listener], opened - ended)
            creations.add_metric([listener], opened)
            closes.add_metric([listener], ended)
        yield from (count, creations, closes)

    @staticmethod
    def _flushes(broker: Broker) -> Iterator[Metric]:
        stats = broker.ingest.flushes
        files, total_ms, size, records = stats.files, stats.total_ms, stats.bytes, stats.records
        times = SummaryMetricFamily("kafka_log_logflushstats_logflushrateandtimems",
                         "Milliseconds from an L0 file's write begun to its commit in the catalog, the agent's durable point (LogFlushStats LogFlushRateAndTimeMs)")
        _add_summary(times, {}, list(stats.recent_ms), files, total_ms)
        sizes = SummaryMetricFamily("logcompact_agent_l0_file_bytes", "Bytes of the L0 files committed, in the store (Kafka has no such MBean)")
        _add_summary(sizes, {}, [float(b) for b in stats.recent_bytes], files, size)
        written = CounterMetricFamily("logcompact_agent_l0_records", "Records in the L0 files committed")
        written.add_metric([], records)
        commits = SummaryMetricFamily("logcompact_agent_l0_commit_ms",
                                      "Milliseconds of each catalog commit of L0 files (Catalog.append_files, one or more files)")
        _add_summary(commits, {}, list(stats.recent_commit_ms), stats.commits, stats.commit_total_ms)
        yield from (times, sizes, written, commits)

    @staticmethod
    def _fetch_reads(broker: Broker) -> Iterator[Metric]:
        """What Fetch's reads cost and saved (Kafka has no such MBeans): blocks decoded and served decoded from the cache
        (block_cache.py), and topics' log offsets read from the catalog (served_version.py)."""
        blocks = broker.decoded_blocks
        decoded = CounterMetricFamily("logcompact_agent_fetch_blocks_decoded", "Blocks of files decoded for Fetch (checksums, Arrow IPC, decompression)")
        decoded.add_metric([], blocks.decoded)
        hits = CounterMetricFamily("logcompact_agent_fetch_block_cache_hits", "Blocks Fetch read from its cache of decoded blocks, not decoded again")
        hits.add_metric([], blocks.hits)
        held = GaugeMetricFamily("logcompact_agent_fetch_block_cache_bytes", "Bytes of decoded blocks held (--fetch-block-cache-bytes bounds them)")
        held.add_metric([], blocks.cached_bytes)
        reads = CounterMetricFamily("logcompact_agent_log_offsets_reads",
                                    "Topics' log offsets read from the catalog by Fetch and ListOffsets: once per topic and catalog version")
        reads.add_metric([], served_version(broker.catalog).offsets_reads)
        yield from (decoded, hits, held, reads)

    def _catalog_figures(self, broker: Broker) -> CatalogFigures:
        with self._read_lock:
            if self._figures is None or time.monotonic() - self._read_at >= CATALOG_READ_SECONDS:
                catalog = broker.catalog
                groups = {row.group_id: row.state for row in catalog.groups()}
                lags = catalog.consumer_lags(MAX_LAG_PARTITIONS + 1)
                self._figures = CatalogFigures(groups, lags[:MAX_LAG_PARTITIONS], len(lags) > MAX_LAG_PARTITIONS)
                self._read_at = time.monotonic()
            return self._figures

    @staticmethod
    def _groups(broker: Broker, figures: CatalogFigures) -> Iterator[Metric]:
        """The groups this agent coordinates: each agent reports its own, so a dashboard's sum over agents counts each once."""
        mine = broker.agents.me.node_id

        def coordinated(group_id: str) -> bool:
            return broker.agents.coordinator_for(group_id).node_id == mine

        states = {group_id: state for group_id, state in figures.groups.items() if coordinated(group_id)}
        for lag in figures.lags:
            if lag.group_id not in states and coordinated(lag.group_id):
                states[lag.group_id] = "Empty"  # offsets committed without joining (a consumer assigning itself partitions)
        members: dict[str, int] = {}
        for group in broker.groups.all_groups():  # what this coordinator holds now, newer than its rows
            if coordinated(group.group_id):
                states[group.group_id] = group.state
                members[group.group_id] = len(group.members)
        by_state = dict.fromkeys(GROUP_STATES, 0)
        for state in states.values():
            by_state[state] = by_state.get(state, 0) + 1
        prefix = "kafka_coordinator_group_groupmetadatamanager_"
        counted = GaugeMetricFamily(prefix + "numgroups", "Consumer groups this agent coordinates (GroupMetadataManager NumGroups)")
        counted.add_metric([], len(states))
        yield counted
        for state in GROUP_STATES:
            family = GaugeMetricFamily(prefix + f"numgroups{state.lower()}", f"Those in state {state} (GroupMetadataManager NumGroups{state})")
            family.add_metric([], by_state.get(state, 0))
            yield family
        mine_lags = [lag for lag in figures.lags if lag.group_id in states]
        offsets = GaugeMetricFamily(prefix + "numoffsets", "Committed offsets of those groups (GroupMetadataManager NumOffsets)")
        offsets.add_metric([], len(mine_lags))
        yield offsets
        member_counts = GaugeMetricFamily("kafka_consumergroup_members", "Members of a consumer group (kafka_exporter's)", labels=["consumergroup"])
        for group_id in sorted(states):
            member_counts.add_metric([group_id], members.get(group_id, 0))
        yield member_counts
        current = GaugeMetricFamily("kafka_consumergroup_current_offset", "A group's committed offset of a partition (kafka_exporter's)",
                                    labels=["consumergroup", "topic", "partition"])
        lag_family = GaugeMetricFamily("kafka_consumergroup_lag", "The partition's high watermark less the group's committed offset (kafka_exporter's)",
                                       labels=["consumergroup", "topic", "partition"])
        lag_sum = GaugeMetricFamily("kafka_consumergroup_lag_sum", "A group's lag summed over a topic's partitions (kafka_exporter's)",
                                    labels=["consumergroup", "topic"])
        high = GaugeMetricFamily("kafka_topic_partition_current_offset", "A partition's high watermark (kafka_exporter's), of the partitions groups committed",
                                 labels=["topic", "partition"])
        sums: dict[tuple[str, str], int] = {}
        seen: set[tuple[str, int]] = set()
        for lag in mine_lags:
            labels = [lag.group_id, lag.topic, str(lag.partition)]
            current.add_metric(labels, lag.committed_offset)
            lag_family.add_metric(labels, lag.lag)
            sums[(lag.group_id, lag.topic)] = sums.get((lag.group_id, lag.topic), 0) + lag.lag
            if (lag.topic, lag.partition) not in seen:
                seen.add((lag.topic, lag.partition))
                high.add_metric([lag.topic, str(lag.partition)], lag.high_watermark)
        for (group_id, topic), total in sorted(sums.items()):
            lag_sum.add_metric([group_id, topic], total)
        truncated = GaugeMetricFamily("logcompact_agent_lag_partitions_truncated",
                                      f"1 when the cluster holds more than {MAX_LAG_PARTITIONS} committed offsets: lag is reported for the first, by group")
        truncated.add_metric([], int(figures.truncated))
        yield from (current, lag_family, lag_sum, high, truncated)


class MetricsServer:
    """`/metrics` over HTTP on its own threads (prometheus_client's server), so a scrape never holds the event loop."""

    def __init__(self, address: Address, metrics: AgentMetrics, broker: Callable[[], Broker | None], listeners: tuple[str, ...]) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(AgentCollector(metrics, broker, listeners))
        try:
            self._server, self._thread = start_http_server(address.port, address.host, self.registry)
        except OSError as exc:
            raise LogcompactError(f"agent cannot serve metrics on {address}: {exc.strerror or exc}; pass another --metrics-listen HOST:PORT") from None

    @property
    def address(self) -> Address:
        server: WSGIServer = self._server
        host, port = server.server_address[:2]
        return Address(str(host), int(port))

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
