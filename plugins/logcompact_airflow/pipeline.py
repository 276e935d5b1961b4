"""The plan, mapped Spark, commit chain every compaction DAG wires, and the settings the DAGs share."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import pendulum
from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk import Param

from logcompact.limits import DEFAULT_BUFFER_BYTES, MAX_BUFFER_BYTES
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.operators.compaction import (
    MIN_PARAM_BUFFER_BYTES,
    LogcompactCommitOperator,
    LogcompactDryRunOperator,
    LogcompactPlanOperator,
    LogcompactUncleanableOperator,
)

# Every logcompact task takes a slot of this pool, so the DAGs together cap the compactions in flight
# (the catalog's leases are what keep two plans off the same files).
POOL = "logcompact"
SPARK_CONN_ID = "logcompact_spark"
STORE_CONN_ID = LogcompactHook.default_conn_name
SPARK_APPLICATION = os.environ.get(
    "LOGCOMPACT_SPARK_APPLICATION", str(Path(__file__).resolve().parents[2] / "spark_apps" / "compact_group.py")
)
# What every logcompact DAG shares: one run at a time, no catch-up (a run acts on the catalog as it is now,
# so missed intervals have nothing of their own to do), native params, and the tasks' owner, retries, pool.
DAG_SETTINGS: dict[str, Any] = {
    "start_date": pendulum.datetime(2026, 1, 1, tz="UTC"),
    "catchup": False,
    "max_active_runs": 1,
    "render_template_as_native_obj": True,
    "default_args": {"owner": "data-platform", "retries": 2, "retry_delay": timedelta(minutes=2), "pool": POOL},
}


def compaction_params(with_topics: bool, with_force: bool = False) -> dict[str, Param]:
    """The trigger form's params. The form marks a param required unless its type allows null, so the optional
    ones take null (their default) when left empty."""
    params = {
        "dry_run": Param(False, type="boolean", description="Plan and report the expected effect; lease, write and run nothing."),
        "buffer_bytes": Param(
            None, type=["null", "integer"], minimum=MIN_PARAM_BUFFER_BYTES, maximum=MAX_BUFFER_BYTES,
            description=(
                "Key-map buffer of each deduplicating job (bytes); more keys per pass, more memory per task. "
                f"Empty: the connection's planner setting, else {DEFAULT_BUFFER_BYTES // 1024**2} MiB."
            ),
        ),
    }
    if with_topics:
        params["topics"] = Param(
            None, type=["null", "array"], items={"type": "string", "minLength": 1},
            description="Topics to compact, one per line (empty: every topic).",
        )
    if with_force:
        params["force"] = Param(
            False, type="boolean",
            description=(
                "Run now whatever the thresholds: no waiting, and any level of 2 files or more is compacted. L0 is copied "
                "to L1, not deduplicated (from L2 up it is); the plan's log says what each plan does."
            ),
        )
    return params


def _spark_job(job: dict) -> dict:
    return {"application_args": job["application_args"], "name": job["label"]}


def compaction_pipeline(mode: str, with_force: bool = False) -> tuple[LogcompactPlanOperator, LogcompactUncleanableOperator]:
    """plan >> compact_group (one mapped Spark job per group, labelled `48ba7f36088b g0 of 2: accounts/0-49 L0>L1, 7.5 MiB
    uncompressed`: `GroupJob.label`) >> commit >>
    uncleanable_partitions, and plan >> dry_run (done in a dry run, skipped in any other, so the grid shows
    which runs were dry); returns the first and last task. `with_force`: the DAG has the `force` param."""
    plan = LogcompactPlanOperator(
        task_id="plan",
        mode=mode,
        logcompact_conn_id=STORE_CONN_ID,
        topics=None if mode == "regular" else "{{ params.topics }}",
        dry_run="{{ params.dry_run }}",
        buffer_bytes="{{ params.buffer_bytes }}",
        force="{{ params.force }}" if with_force else False,
    )
    compact = SparkSubmitOperator.partial(
        task_id="compact_group",
        conn_id=SPARK_CONN_ID,
        application=SPARK_APPLICATION,
        map_index_template="{{ task.name }}",
    ).expand_kwargs(plan.output.map(_spark_job))
    commit = LogcompactCommitOperator(task_id="commit", group_jobs=plan.output, logcompact_conn_id=STORE_CONN_ID)
    uncleanable = LogcompactUncleanableOperator(task_id="uncleanable_partitions", logcompact_conn_id=STORE_CONN_ID, retries=0)
    plan >> LogcompactDryRunOperator(task_id="dry_run", dry_run="{{ params.dry_run }}")
    compact >> commit >> uncleanable
    return plan, uncleanable
