"""The repository's DAGs as Airflow loads them, run with `dag.test()`, and what their runs left in Airflow's database."""

from __future__ import annotations

from pathlib import Path

DAGS = Path(__file__).resolve().parents[2] / "dags"


def load_dags():
    from airflow.dag_processing.dagbag import DagBag

    return DagBag(dag_folder=str(DAGS))


def without_retries(dagbag, dag_id: str):
    """A DAG of the bag whose failures show at once instead of after the retry delay."""
    dag = dagbag.dags[dag_id]
    for task in dag.tasks:
        task.retries = 0
    return dag


def task_instances(dag_id: str, run_id: str) -> dict[tuple[str, int], object]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id).all()
        session.expunge_all()
    return {(ti.task_id, ti.map_index): ti for ti in rows}


def task_states(dag_id: str, run_id: str) -> dict[str, str]:
    """Each task instance's state in a run, mapped ones as `task[index]`."""
    return {f"{task}[{index}]" if index >= 0 else task: str(ti.state) for (task, index), ti in task_instances(dag_id, run_id).items()}
