"""
# logcompact_compaction

Leveled and size-tiered compaction of the catalog named by the `logcompact_default` connection.

**wait_for_files** (reschedule mode, so no worker slot is held) waits until some level holds enough files
(32 by default, or the connection's `planner.min_files`), and skips the run when none does within 14 minutes
(a bad param or a broken connection fails it) → **plan** writes the plans to the store (a header
and a document per group) and leases their files, and logs the thresholds, each plan with what it will do and its
groups, the files other plans hold, and when nothing is planned, why → **compact_group** runs one Spark job per
plan group, labelled `48ba7f36088b g0 of 2: accounts/0-49 L0>L1, 7.5 MiB uncompressed` (the plan id's end, the
group of how many, its partitions, levels and size) → **commit** replaces the inputs by the outputs in one catalog
transaction, logs a per-topic table and publishes an asset event per compacted topic with that topic's figures →
**uncleanable_partitions** fails while partitions are set aside as uncleanable. **dry_run** succeeds only in dry
runs (skipped otherwise), so the grid shows which runs were dry.

What a pass does to a plan's records, which its plan log names (`copy`, `deduplicate`, `rewrite`):
- **copy**, L0 > L1: records move up as they are, split by partition. Levels below L2 (the planner's
  `dedup_from_level`) are never deduplicated, so a forced run on fresh L0 files removes nothing but expired
  records of retention topics and aborted transactions' records.
- **deduplicate**, L1 > L2 and up, and size tiers at the top level: only each key's latest record stays; the
  log gives the duplicates estimated from the sections' key sketches (which count distinct keys within about 9%).
- **rewrite**: a deduplicating plan whose partitions hold no duplicate (each already deduplicated, or within its
  min lag), as `force` makes of two top-level files after a full sweep: the files are merged into fewer, and only
  tombstones past `delete.retention.ms` and expired records go. The dry run estimates 0 removed.

Params:
- `force`: run now whatever the thresholds: the sensor is done at once and any level of 2 files or more
  is compacted. An unforced manual run waits (up to 14 min) like a scheduled one, and its sensor says so.
  Two runs may be active at once, so a manual run never queues behind a scheduled run's waiting sensor.
- `dry_run`: plan and log the estimates; lease, write and run nothing.
- `buffer_bytes` (optional): the key-map buffer of each job; empty takes the connection's planner setting.

Settings: **Admin > Connections** `logcompact_default` (its extra: `store`, the catalog as
`catalog` or `catalog_conn_id`, and `planner`: the thresholds `min_files`, the group size `group_bytes`,
`buffer_bytes`, `lease_ms` and the other `PlannerConfig` fields) and `logcompact_spark` (the Spark master as its
host: `local[2]`, or `spark://HOST` and port 7077); **Admin > Pools** `logcompact` (the compactions in flight
across the DAGs); the params above in **Trigger DAG w/ config**. `make airflow` writes both connections and the
pool at each start.

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
