"""
# logcompact_full_sweep_daily

Daily full sweep: every file of the chosen topics, across levels and sizes, compacted into the top level,
so that size tiers that never meet are merged and tombstones past `delete.retention.ms` are removed.
Same **plan** → mapped Spark **compact_group** → **commit** steps as `logcompact_compaction`; the plan log says
whether the sweep will `deduplicate` (with the duplicates estimated) or only `rewrite` partitions already
deduplicated (merged files, nothing but expired records and old tombstones removed).

Params: `topics` (optional; empty: every topic), `dry_run` (plan and log the estimates; the **dry_run**
task marks the run in the grid), `buffer_bytes` (optional; empty: the connection's planner setting). Runs
act on the catalog as it is now, so a backfill or a re-run of an old day is safe. An unknown topic fails
the plan at once.

Settings: **Admin > Connections** `logcompact_default` (the store, its catalog and, in the extra's `planner`, the
planner's settings such as `group_bytes`) and `logcompact_spark` (the Spark master); **Admin > Pools** `logcompact`.
"""

from airflow.sdk import DAG

from logcompact_airflow.pipeline import DAG_SETTINGS, compaction_params, compaction_pipeline

with DAG(
    dag_id="logcompact_full_sweep_daily",
    doc_md=__doc__,
    schedule="@daily",
    params=compaction_params(with_topics=True),
    tags=["logcompact", "compaction", "full-sweep"],
    **DAG_SETTINGS,
):
    compaction_pipeline("full")
