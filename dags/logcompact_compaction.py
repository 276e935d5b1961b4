"""
# logcompact_compaction

Leveled and size-tiered compaction of the catalog named by the `logcompact_default` connection.

**sensor** (reschedule mode, so no worker slot is held) waits until some level holds enough files
(32 by default) → **plan** writes the plans to the store (a header and a document per group) and leases
their files → **compact_group** runs one Spark job per plan group, given the plan id and the group number
(`spark_apps/compact_group.py`, connection `logcompact_spark`) →
**commit** replaces the inputs by the outputs in one catalog transaction and publishes an asset event per
compacted topic with the stats.

Params: `dry_run` plans and logs the estimates without writing anything; `buffer_bytes` is the key-map
buffer of each job. Runs act on the catalog as it is now, so a backfill or re-run of an old date is safe.
A failed group fails the run before the commit; clearing it resumes the plan (groups already done are
not run again) until the lease expires (1 h), after which `logcompact_gc` collects the leftovers.
"""

from datetime import timedelta

from airflow.sdk import DAG

from logcompact_airflow.pipeline import DAG_SETTINGS, STORE_CONN_ID, compaction_params, compaction_pipeline
from logcompact_airflow.sensors import LogcompactThresholdSensor

with DAG(
    dag_id="logcompact_compaction",
    doc_md=__doc__,
    schedule="*/15 * * * *",
    params=compaction_params(with_topics=False),
    tags=["logcompact", "compaction"],
    **DAG_SETTINGS,
):
    wait = LogcompactThresholdSensor(
        task_id="wait_for_files",
        logcompact_conn_id=STORE_CONN_ID,
        poke_interval=60,
        timeout=timedelta(minutes=14).total_seconds(),
        soft_fail=True,
    )
    plan, _commit = compaction_pipeline("regular")
    wait >> plan
