"""
# logcompact_metrics

Every 5 minutes, the cleaner's figures of the cluster behind `logcompact_default` (what `logcompact status`
prints) are logged as a table and sent through Airflow's metrics system, StatsD or OpenTelemetry as its
`[metrics]` section configures, under Kafka's log cleaner names: `logcompact.max-dirty-percent`,
`logcompact.max-compaction-delay-secs`, `logcompact.time-since-last-run-ms`,
`logcompact.uncleanable-partitions-count`, `logcompact.uncleanable-bytes`, and `logcompact.open-transactions`,
`logcompact.max-last-stable-offset-lag` (a hung transaction holds compaction back; docs/metrics.md). The commit task of
each compaction DAG sends the per-run ones: `logcompact.max-buffer-utilization-percent`,
`logcompact.cleaner-recopy-percent`, `logcompact.max-clean-time-secs`.
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
