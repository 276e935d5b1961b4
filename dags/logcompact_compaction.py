"""
# logcompact_compaction

Leveled and size-tiered compaction of the catalog named by the `logcompact_default` connection.

**wait_for_files** (reschedule mode, so no worker slot is held) waits until some level holds enough files
(32 by default, or the connection's `planner.min_files`), and skips the run when none does within 14 minutes
(a bad param or a broken connection fails it) → **plan** writes the plans to the store (a header
and a document per group) and leases their files, and logs the thresholds, each plan with its groups, the
files other plans hold, and when nothing is due, why → **compact_group** runs one Spark job per plan group,
labelled like `g0 L0>L1 12.3 MB` (`spark_apps/compact_group.py`, connection `logcompact_spark`) →
**commit** replaces the inputs by the outputs in one catalog transaction, logs a per-topic table and
publishes an asset event per compacted topic with that topic's figures → **uncleanable_partitions** fails
while partitions are set aside as uncleanable. **dry_run** succeeds only in dry runs (skipped otherwise), so
the grid shows which runs were dry.

Params:
- `force`: run now whatever the thresholds: the sensor is done at once and any level of 2 files or more
  is compacted. An unforced manual run waits (up to 14 min) like a scheduled one, and its sensor says so.
  Two runs may be active at once, so a manual run never queues behind a scheduled run's waiting sensor.
- `dry_run`: plan and log the estimates; lease, write and run nothing.
- `buffer_bytes` (optional): the key-map buffer of each job; empty takes the connection's planner setting.

Runs act on the catalog as it is now, so a backfill or re-run of an old date is safe. Bad params, unknown
topics and plans that need redoing fail at once; only store and catalog outages are retried. A failed group
fails the run before the commit; a plan that cannot commit fails the commit after the others of the run
have committed; clearing a failed group resumes the plan (groups already done are not run again) until
the lease expires (1 h), after which `logcompact_gc` collects the leftovers.
"""

from datetime import timedelta

from airflow.sdk import DAG

from logcompact_airflow.pipeline import DAG_SETTINGS, STORE_CONN_ID, compaction_params, compaction_pipeline
from logcompact_airflow.sensors.threshold import LogcompactThresholdSensor

with DAG(
    dag_id="logcompact_compaction",
    doc_md=__doc__,
    schedule="*/15 * * * *",
    params=compaction_params(with_topics=False, with_force=True),
    tags=["logcompact", "compaction"],
    # Two runs at once, so that a manual (forced) run does not queue behind a scheduled run whose sensor
    # waits (it holds no slot while it waits); the catalog's leases keep their plans off each other's files.
    **{**DAG_SETTINGS, "max_active_runs": 2},
):
    wait = LogcompactThresholdSensor(
        task_id="wait_for_files",
        logcompact_conn_id=STORE_CONN_ID,
        poke_interval=60,
        timeout=timedelta(minutes=14).total_seconds(),
        skip_on_timeout=True,  # nothing due in this run's 15 minutes: skipped, not failed
        force="{{ params.force }}",
    )
    plan, _commit = compaction_pipeline("regular", with_force=True)
    wait >> plan
