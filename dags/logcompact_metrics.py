"""
# logcompact_metrics

Every 5 minutes, the cleaner's figures of the cluster behind `logcompact_default` (what `logcompact status`
prints). The log leads with a headline naming the partitions behind the maxima (`max-dirty-percent 100.0% at
accounts/17 (...)`, `max-compaction-delay-secs ... at ...`, the uncleanable ones), then the cluster's gauges, files
per level and the worst 20 partitions (by dirty ratio, then compaction delay), saying how many were left out
(`logcompact status` lists them all).

The gauges go through Airflow's metrics system, StatsD or OpenTelemetry as its `[metrics]` section configures
(`make airflow` sends StatsD to its own sink, served as Prometheus text on http://127.0.0.1:9102/metrics as
`airflow_logcompact_max_dirty_percent` and so on), under Kafka's log cleaner names: `logcompact.max-dirty-percent`,
`logcompact.max-compaction-delay-secs`, `logcompact.time-since-last-run-ms`,
`logcompact.uncleanable-partitions-count`, `logcompact.uncleanable-bytes`, and `logcompact.open-transactions`,
`logcompact.max-last-stable-offset-lag` (a hung transaction holds compaction back; docs/metrics.md). The commit task of
each compaction DAG sends the per-run ones: `logcompact.max-buffer-utilization-percent`,
`logcompact.cleaner-recopy-percent`, `logcompact.max-clean-time-secs`. Without a `[metrics]` sink they go nowhere.

Settings: **Admin > Connections** `logcompact_default` (the store, its catalog, and the planner's `dedup_from_level`,
which says what clean is); **Admin > Pools** `logcompact`.
"""

from airflow.sdk import DAG

from logcompact_airflow.operators.status import LogcompactMetricsOperator
from logcompact_airflow.pipeline import DAG_SETTINGS, STORE_CONN_ID

with DAG(
    dag_id="logcompact_metrics",
    doc_md=__doc__,
    schedule="*/5 * * * *",
    tags=["logcompact", "metrics"],
    **DAG_SETTINGS,
):
    LogcompactMetricsOperator(task_id="cleaner_metrics", logcompact_conn_id=STORE_CONN_ID)
