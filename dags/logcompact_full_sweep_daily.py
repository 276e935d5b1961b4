"""
# logcompact_full_sweep_daily

Daily full sweep: every file of the chosen topics, across levels and sizes, compacted into the top level,
so that size tiers that never meet are merged and tombstones past `delete.retention.ms` are removed.
Same **plan** → mapped Spark **compact_group** → **commit** steps as `logcompact_compaction`.

Params: `topics` (empty: every topic), `dry_run`, `buffer_bytes`. Runs act on the catalog as it is now,
so a backfill or a re-run of an old day is safe.
"""

import pendulum
from airflow.sdk import DAG

from logcompact_airflow.pipeline import DEFAULT_ARGS, compaction_params, compaction_pipeline

with DAG(
    dag_id="logcompact_full_sweep_daily",
    doc_md=__doc__,
    schedule="@daily",
    start_date=pendulum.datetime(2026, 1, 1, tz="UTC"),
    catchup=False,
    max_active_runs=1,
    default_args=DEFAULT_ARGS,
    params=compaction_params(with_topics=True),
    render_template_as_native_obj=True,
    tags=["logcompact", "compaction", "full-sweep"],
):
    compaction_pipeline("full")
