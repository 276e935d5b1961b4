"""The cleaner's figures as Airflow metrics: StatsD or OpenTelemetry, as the deployment's `[metrics]` section
configures Airflow (statsd_on, otel_on, statsd_datadog_enabled); nothing is sent where metrics are off.

Names are Kafka's log cleaner MBeans under the prefix `logcompact.` (docs/metrics.md):
`logcompact.max-dirty-percent`, `logcompact.max-compaction-delay-secs`, `logcompact.time-since-last-run-ms`,
`logcompact.uncleanable-partitions-count`, `logcompact.uncleanable-bytes`, and the transactions' own
`logcompact.open-transactions` and `logcompact.max-last-stable-offset-lag` from the catalog (the metrics DAG), and `logcompact.max-buffer-utilization-percent`, `logcompact.cleaner-recopy-percent`,
`logcompact.max-clean-time-secs` from each commit's jobs (the commit task). The metrics DAG's operator is
`operators.status.LogcompactMetricsOperator`.
"""

from __future__ import annotations

from collections.abc import Mapping

from airflow.sdk.observability.stats import Stats

PREFIX = "logcompact."


def emit_gauges(gauges: Mapping[str, float | None]) -> None:
    """Each gauge with a value (None: nothing to measure yet, as `time-since-last-run-ms` before any compaction)."""
    for name, value in gauges.items():
        if value is not None:
            Stats.gauge(PREFIX + name, value)
