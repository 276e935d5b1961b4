"""`make airflow`'s metrics sink: receives Airflow's StatsD metrics on UDP and serves them as Prometheus text.

Airflow sends its metrics, the cleaner's gauges among them (`airflow.logcompact.max-dirty-percent`, ...;
docs/metrics.md), to StatsD when `[metrics] statsd_on` is set; with nothing listening they are lost. This
process listens where `scripts/airflow.sh` points Airflow, keeps the latest of each metric and serves them on
`http://HOST:PORT/metrics` in Prometheus' text format, for a browser, `curl` or a Prometheus server to scrape.

    python scripts/statsd_sink.py --statsd 127.0.0.1:8125 --http 127.0.0.1:9102

StatsD's line protocol, `name:value|type[|@rate][|#tags]`, one or more lines a packet: a gauge (`g`; a value signed
with + or - changes it, as StatsD does) is served as a gauge; a counter (`c`, divided by its sample rate) as a
counter, `NAME_total`; a timer (`ms`), histogram (`h`) or distribution (`d`) as a summary of its count and sum
(`NAME_count`, `NAME_sum`, in the unit sent: milliseconds for timers); a set (`s`) as a gauge of its distinct
values. Names become Prometheus names with every character outside `[a-zA-Z0-9_:]` an underscore:
`airflow.logcompact.max-dirty-percent` is `airflow_logcompact_max_dirty_percent`. Tags are dropped. A line that
is not StatsD, or that names a metric already received as another type, is counted in
`statsd_sink_rejected_lines_total` and its first occurrences are logged on stderr; nothing is swallowed silently.
Values live as long as the process: a restart starts from nothing, as a StatsD server does.
"""

from __future__ import annotations

import argparse
import math
import re
import socket
import sys
import threading
from collections.abc import Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

# The StatsD types and the Prometheus type each is served as.
KINDS = {"g": "gauge", "c": "counter", "ms": "summary", "h": "summary", "d": "summary", "s": "gauge"}
LOGGED_REJECTIONS = 20  # then only counted
_NOT_PROMETHEUS = re.compile(r"[^a-zA-Z0-9_:]")


@dataclass
class Metric:
    statsd_name: str
    kind: str  # the StatsD type: g, c, ms, h, d, s
    value: float = 0.0  # a gauge's value, a counter's total, a summary's sum
    count: int = 0  # a summary's observations
    members: set[str] = field(default_factory=set)  # a set's distinct values


class Sink:
    """The latest of each metric received, by Prometheus name; safe to feed and read from several threads."""

    def __init__(self) -> None:
        self._metrics: dict[str, Metric] = {}
        self._lock = threading.Lock()
        self.packets = 0
        self.rejected = 0

    def receive(self, packet: bytes) -> None:
        with self._lock:
            self.packets += 1
        for line in packet.decode("utf-8", "replace").splitlines():
            if line.strip():
                problem = self._line(line.strip())
                if problem:
                    with self._lock:
                        self.rejected += 1
                        rejected = self.rejected
                    if rejected <= LOGGED_REJECTIONS:
                        print(f"statsd_sink: rejected {line!r}: {problem}", file=sys.stderr, flush=True)

    def _line(self, line: str) -> str | None:
        """Take one StatsD line; what is wrong with it, or None."""
        name, colon, rest = line.partition(":")
        fields = rest.split("|")
        if not colon or not name or len(fields) < 2:
            return "not name:value|type"
        raw, kind = fields[0], fields[1]
        if kind not in KINDS:
            return f"unknown type {kind!r} (one of {', '.join(KINDS)})"
        rate = 1.0
        for extra in fields[2:]:
            if extra.startswith("@"):
                try:
                    rate = float(extra[1:])
                except ValueError:
                    return f"sample rate {extra!r} is not a number"
                if not 0 < rate <= 1:
                    return f"sample rate {extra!r} is not within (0, 1]"
        value = 0.0
        if kind != "s":
            try:
                value = float(raw)
            except ValueError:
                return f"value {raw!r} is not a number"
            if not math.isfinite(value):
                return f"value {raw!r} is not finite"
        key = _NOT_PROMETHEUS.sub("_", name)
        if key[0].isdigit():
            key = f"_{key}"
        with self._lock:
            metric = self._metrics.setdefault(key, Metric(name, kind))
            if KINDS[metric.kind] != KINDS[kind]:
                return f"{key} was received as a {KINDS[metric.kind]} ({metric.statsd_name}|{metric.kind}), not a {KINDS[kind]}"
            if kind == "g":
                metric.value = metric.value + value if raw[0] in "+-" else value
            elif kind == "c":
                metric.value += value / rate
            elif kind == "s":
                metric.members.add(raw)
            else:
                metric.value += value
                metric.count += max(1, round(1 / rate))
        return None

    def prometheus_text(self) -> str:
        """Every metric in Prometheus' text format (version 0.0.4), by name, then the sink's own counters."""
        with self._lock:
            metrics = sorted(self._metrics.items())
            packets, rejected = self.packets, self.rejected
        lines: list[str] = []
        for key, metric in metrics:
            kind = KINDS[metric.kind]
            family = f"{key}_total" if kind == "counter" else key  # as prometheus_client writes a counter in this format
            lines += [f"# HELP {family} StatsD {metric.statsd_name}|{metric.kind}", f"# TYPE {family} {kind}"]
            if metric.kind == "s":
                lines.append(f"{key} {len(metric.members)}")
            elif kind == "summary":
                lines += [f"{key}_count {metric.count}", f"{key}_sum {_number(metric.value)}"]
            else:
                lines.append(f"{family} {_number(metric.value)}")
        lines += _own("statsd_sink_packets", "StatsD packets received", packets)
        lines += _own("statsd_sink_rejected_lines", "StatsD lines rejected (logged on the sink's stderr)", rejected)
        return "\n".join(lines) + "\n"


def _own(name: str, help_text: str, value: int) -> Iterable[str]:
    return [f"# HELP {name}_total {help_text}", f"# TYPE {name}_total counter", f"{name}_total {value}"]


def _number(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


def _address(text: str, what: str, example: str) -> tuple[str, int]:
    host, _, port = text.rpartition(":")
    if not host or not port.isdigit():
        raise SystemExit(f"statsd_sink: {what} {text!r} is not HOST:PORT, e.g. {example}")
    return host, int(port)


def serve(sink: Sink, udp: socket.socket, http: ThreadingHTTPServer) -> None:
    """Serve `http` in a thread and receive on `udp` here until the process is stopped: should receiving fail, the
    process ends with the error (`make airflow` then stops, naming it) rather than serve stale values."""
    threading.Thread(target=http.serve_forever, name="http", daemon=True).start()
    while True:
        sink.receive(udp.recv(65535))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--statsd", default="127.0.0.1:8125", help="UDP HOST:PORT StatsD clients send to (default %(default)s)")
    parser.add_argument("--http", default="127.0.0.1:9102", help="HOST:PORT serving /metrics (default %(default)s)")
    args = parser.parse_args(argv)
    sink = Sink()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?")[0] not in ("/", "/metrics"):
                self.send_error(404, "the metrics are at /metrics")
                return
            body = sink.prometheus_text().encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # a scrape every few seconds would fill the log

    statsd_address, http_address = _address(args.statsd, "--statsd", "127.0.0.1:8125"), _address(args.http, "--http", "127.0.0.1:9102")
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        udp.bind(statsd_address)
    except OSError as exc:
        raise SystemExit(f"statsd_sink: cannot receive StatsD on udp://{args.statsd} ({exc.strerror}); free the port or pass another --statsd") from None
    try:
        http = ThreadingHTTPServer(http_address, Handler)
    except OSError as exc:
        raise SystemExit(f"statsd_sink: cannot serve http://{args.http} ({exc.strerror}); free the port or pass another --http") from None
    print(f"statsd_sink: receiving StatsD on udp://{args.statsd}, serving http://{args.http}/metrics", flush=True)
    serve(sink, udp, http)


if __name__ == "__main__":
    main()
