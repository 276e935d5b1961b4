"""
# logcompact_gc

Garbage collection of the cluster behind `logcompact_default`: releases expired leases, then deletes the
data files no kept manifest version holds (inputs replaced by compactions, with their catalog rows;
outputs of failed or abandoned jobs the catalog never listed) and the plan documents of finished plans,
each only once older than the grace period (1 h), so a job still running, an agent about to commit or a
reader of a kept version is never hurt; and trims the catalog's commit log to the kept versions. Each step
is a few catalog queries, so a run completes under steady ingest.

Settings: **Admin > Connections** `logcompact_default` (the store and its catalog); **Admin > Pools** `logcompact`.
"""

from airflow.sdk import DAG

from logcompact_airflow.operators.gc import LogcompactGcOperator
from logcompact_airflow.pipeline import DAG_SETTINGS, STORE_CONN_ID

with DAG(
    dag_id="logcompact_gc",
    doc_md=__doc__,
    schedule="0 */6 * * *",
    tags=["logcompact", "gc"],
    **DAG_SETTINGS,
):
    LogcompactGcOperator(task_id="collect_garbage", logcompact_conn_id=STORE_CONN_ID)
