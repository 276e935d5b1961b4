"""
# logcompact_max_lag_hourly

Hourly max-lag pass: compacts the partitions whose records would otherwise stay uncompacted past their
topic's `max.compaction.lag.ms`, through the same **plan** → mapped Spark **compact_group** → **commit**
steps as `logcompact_compaction`. The planner assumes the next pass at this DAG's next run, read from its
schedule at each pass (`logcompact_airflow.schedule.next_pass_in_ms`): change the schedule and the planner
follows, so no record stays dirty more than 30 minutes past its lag. A schedule without runs of its own
(None) leaves the interval to the connection's `planner.max_lag_pass_interval_ms`.

Params: `topics` (empty: every topic), `dry_run`, `buffer_bytes`. Runs act on the catalog as it is now,
so a backfill or a re-run of an old hour is safe.

Settings: **Admin > Connections** `logcompact_default` (the store, its catalog and, in the extra's `planner`, the
planner's settings such as `group_bytes`) and `logcompact_spark` (the Spark master); **Admin > Pools** `logcompact`.
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
