"""
# logcompact_max_lag_hourly

Hourly max-lag pass: compacts the partitions whose records would otherwise stay uncompacted past their
topic's `max.compaction.lag.ms`, through the same **plan** → mapped Spark **compact_group** → **commit**
steps as `logcompact_compaction`. The planner assumes a pass every interval of this DAG's schedule (read
from it when the plan runs): change the schedule and the planner follows, so no record stays dirty more than
30 minutes past its lag.

Params: `topics` (empty: every topic), `dry_run`, `buffer_bytes`. Runs act on the catalog as it is now,
so a backfill or a re-run of an old hour is safe.
"""

from airflow.sdk import DAG

from logcompact_airflow.pipeline import DAG_SETTINGS, compaction_params, compaction_pipeline

with DAG(
    dag_id="logcompact_max_lag_hourly",
    doc_md=__doc__,
    schedule="@hourly",
    params=compaction_params(with_topics=True),
    tags=["logcompact", "compaction", "max-lag"],
    **DAG_SETTINGS,
):
    compaction_pipeline("max-lag")
