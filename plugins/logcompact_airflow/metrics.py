"""The cleaner's figures as Airflow metrics: StatsD or OpenTelemetry, as the deployment's `[metrics]` section
configures Airflow (statsd_on, otel_on, statsd_datadog_enabled); nothing is sent where metrics are off.

Names are Kafka's log cleaner MBeans under the prefix `logcompact.` (docs/metrics.md):
`logcompact.max-dirty-percent`, `logcompact.max-compaction-delay-secs`, `logcompact.time-since-last-run-ms`,
`logcompact.uncleanable-partitions-count`, `logcompact.uncleanable-bytes` from the catalog (the metrics DAG),
and `logcompact.max-buffer-utilization-percent`, `logcompact.cleaner-recopy-percent`,
`logcompact.max-clean-time-secs` from each commit's jobs (the commit task).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from airflow.sdk import BaseOperator
from airflow.sdk.observability.stats import Stats

from logcompact.status import cluster_status
from logcompact_airflow.hooks import LogcompactHook

PREFIX = "logcompact."


def emit_gauges(gauges: Mapping[str, float | None]) -> None:
    """Each gauge with a value (None: nothing to measure yet, as `time-since-last-run-ms` before any compaction)."""
    for name, value in gauges.items():
        if value is not None:
            Stats.gauge(PREFIX + name, value)


class LogcompactMetricsOperator(BaseOperator):
    """Compute `logcompact status`, log its table, emit the cluster's gauges; return the gauges."""

    def __init__(self, *, logcompact_conn_id: str = LogcompactHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.logcompact_conn_id = logcompact_conn_id

    def execute(self, context: Any) -> dict[str, float | None]:
        hook = LogcompactHook(self.logcompact_conn_id)
        # The connection's planner settings: status's notion of clean is the planner's (dedup_from_level).
        status = cluster_status(hook.get_catalog(), int(time.time() * 1000), hook.get_planner_config())
        for line in status.describe():
            self.log.info("%s", line)
        emit_gauges(status.gauges)
        return status.gauges
