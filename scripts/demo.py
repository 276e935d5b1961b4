"""`make demo`: the whole product on the embedded default (a local store, its catalog in SQLite beside the
data), through the DAGs as Airflow runs them.

A local store gets three topics (accounts: compact, clicks: delete, sessions: compact,delete) of 100
partitions each, with skewed keys and tombstones, written by agents as 40 L0 files over the last three
hours, each file holding all 300 topic-partitions. Then `dag.test()` runs
logcompact_compaction (the sensor sees 40 L0 files, L0 is split into L1), logcompact_max_lag_hourly (the
oldest records are past their 2 h max lag: deduplicated into L2), logcompact_full_sweep_daily and
logcompact_gc, each compaction through spark-submit with Spark in local mode. The report gives files and
bytes per level after each run, records removed and write amplification, and the consume check that every
key's latest value survived.

    .venv/bin/python scripts/demo.py [--records 300000] [--dir .demo] [--data-only]

`--data-only` stops after producing the data: `make airflow` uses it to give the UI something to compact.
Airflow logs only warnings here; the task logs are in the Airflow home under the work directory.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
# Plan groups of 8 MiB: the demo's tens of MB run as several mapped Spark jobs (production keeps 1 GiB).
DEMO_GROUP_BYTES = 8 * 1024**2
DAG_RUNS = ("logcompact_compaction", "logcompact_max_lag_hourly", "logcompact_full_sweep_daily", "logcompact_gc")


def configure_airflow(work: Path, store_uri: str) -> None:
    """Airflow's home, DAGs, connections and Spark settings, before Airflow is first imported."""
    os.environ.update(
        AIRFLOW_HOME=str(work / "airflow"),
        AIRFLOW__CORE__LOAD_EXAMPLES="False",
        AIRFLOW__LOGGING__LOGGING_LEVEL="WARNING",
        AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
        AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
        AIRFLOW_CONN_LOGCOMPACT_DEFAULT=json.dumps(
            {"conn_type": "generic", "extra": {"store": store_uri, "planner": {"group_bytes": DEMO_GROUP_BYTES}}}
        ),
        AIRFLOW_CONN_LOGCOMPACT_SPARK=json.dumps({"conn_type": "spark", "host": "local[2]"}),
        PATH=f"{BIN}{os.pathsep}{os.environ['PATH']}",
        PYSPARK_PYTHON=sys.executable,
        SPARK_LOCAL_IP="127.0.0.1",
    )
    sys.path.insert(0, str(REPO / "plugins"))
    for command in (["db", "migrate"], ["pools", "set", "logcompact", "4", "logcompact compactions"]):
        subprocess.run([str(BIN / "airflow"), *command], check=True, capture_output=True)


def load_dags() -> dict:
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(REPO / "dags"))
    if bag.import_errors:
        raise SystemExit(f"demo: the DAGs do not import: {bag.import_errors}")
    for dag in bag.dags.values():
        for task in dag.tasks:
            task.retries = 0  # the demo stops at the first failure instead of waiting out retry delays
    return bag.dags


def groups_run(dag_id: str, run_id: str) -> int:
    """How many mapped compact_group jobs a run ran."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.query(TaskInstance).filter_by(dag_id=dag_id, run_id=run_id, task_id="compact_group", state="success").count()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=300_000)
    parser.add_argument("--dir", type=Path, default=REPO / ".demo")
    parser.add_argument("--data-only", action="store_true", help="produce the data, run no DAG")
    args = parser.parse_args()
    work = args.dir.resolve()
    shutil.rmtree(work, ignore_errors=True)
    (work / "store").mkdir(parents=True)

    from logcompact.catalog import Catalog
    from logcompact.demo import HOUR_MS, create_skewed_topics, describe_levels, level_table, produce_skewed, verify_latest
    from logcompact.exceptions import VerificationError
    from logcompact.store import LocalStore

    store = LocalStore(work / "store")
    catalog = Catalog(store)  # the embedded default: catalog.db in the store directory
    now = int(time.time() * 1000)
    create_skewed_topics(catalog, now - 3 * HOUR_MS)
    latest = produce_skewed(catalog, args.records, files=40, first_timestamp=now - 3 * HOUR_MS, last_timestamp=now)
    start = catalog.snapshot()
    start_files = start.file_summaries()
    ingested_bytes = sum(f.size for f in start_files)
    records_in = sum(f.record_count for f in start_files)
    clicks = sum(catalog.next_offsets("clicks"))  # nothing compacted yet: every offset given is a record
    print(f"store {store.uri}: produced {records_in:,} records in {len(start_files)} L0 files ({ingested_bytes / 1e6:.1f} MB)")
    print(f"  before: {describe_levels(start)}")
    if args.data_only:
        return

    configure_airflow(work, store.uri)
    dags = load_dags()
    written_bytes = groups_total = most_groups = 0
    for dag_id in DAG_RUNS:
        before = {f.key for f in catalog.snapshot().file_summaries()}
        started = time.perf_counter()
        run = dags[dag_id].test()
        after = catalog.snapshot()
        live = after.file_summaries()
        added = [f for f in live if f.key not in before]
        written_bytes += sum(f.size for f in added)
        replaced = len(before - {f.key for f in live})
        groups = groups_run(dag_id, run.run_id)
        groups_total, most_groups = groups_total + groups, max(most_groups, groups)
        print(
            f"{dag_id}: {run.state} in {time.perf_counter() - started:.1f} s; {replaced} files replaced by {len(added)}"
            f"{f' in {groups} mapped Spark group(s)' if dag_id != 'logcompact_gc' else ''}"
        )
        print(f"  after: {describe_levels(after)}")
        if str(run.state) != "success":
            raise SystemExit(f"demo: {dag_id} ended {run.state}; its task logs are above")

    if most_groups < 2:
        raise SystemExit(f"demo: no run had more than one mapped group (groups of {DEMO_GROUP_BYTES:,} bytes); make them smaller")
    end = catalog.snapshot()
    records_out = sum(records for _files, _size, records in level_table(end).values())
    checked = verify_latest(store, end, latest, clicks)
    if records_out >= records_in:
        raise VerificationError(f"demo check failed: compaction removed no records ({records_in:,} in, {records_out:,} out)")
    print(
        f"report: {records_in:,} records in, {records_out:,} out ({records_in - records_out:,} removed, "
        f"{1 - records_out / records_in:.1%}); {ingested_bytes / 1e6:.1f} MB ingested, {written_bytes / 1e6:.1f} MB written by "
        f"compactions in {groups_total} mapped Spark groups: write amplification {(ingested_bytes + written_bytes) / ingested_bytes:.2f}"
    )
    print(f"verified through consume: all {checked:,} live keys hold their latest value, deleted keys stay deleted, "
          f"clicks (delete policy) kept all {clicks:,} records")


if __name__ == "__main__":
    main()
