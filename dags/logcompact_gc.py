"""
# logcompact_gc

Garbage collection of the store behind `logcompact_default`: releases expired leases, then deletes data
files no kept manifest version references (outputs of failed or abandoned jobs, inputs replaced by
compactions), plan documents of finished plans, and manifest versions past the kept history, each only
once older than the grace period (1 h), so a job still running or an agent about to commit is never hurt.
"""

from airflow.sdk import DAG

from logcompact_airflow.operators import LogcompactGcOperator
from logcompact_airflow.pipeline import DAG_SETTINGS, STORE_CONN_ID

with DAG(
    dag_id="logcompact_gc",
    doc_md=__doc__,
    schedule="0 */6 * * *",
    tags=["logcompact", "gc"],
    **DAG_SETTINGS,
):
    LogcompactGcOperator(task_id="collect_garbage", logcompact_conn_id=STORE_CONN_ID)
