#!/usr/bin/env bash
# `make airflow`: `airflow standalone` on http://127.0.0.1:8080 serving logcompact's DAGs, with the store
# connection (the demo's local store, given data on first use, its catalog the embedded SQLite beside it),
# Spark in local mode and the shared pool.
# A local trial: every UI user is an admin, and the API server listens on 127.0.0.1 only.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="$repo/.venv/bin"
store="$repo/.demo/store"

export AIRFLOW_HOME="$repo/.airflow"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$repo/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$repo/plugins"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=False  # a trial: the schedules run as they would in production
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=8080
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:8080/execution/
export AIRFLOW_CONN_LOGCOMPACT_DEFAULT="{\"conn_type\": \"generic\", \"extra\": {\"store\": \"file://$store\"}}"
export AIRFLOW_CONN_LOGCOMPACT_SPARK='{"conn_type": "spark", "host": "local[2]"}'
export PATH="$bin:$PATH"  # the Spark provider runs a bare spark-submit
export PYSPARK_PYTHON="$bin/python"
export SPARK_LOCAL_IP=127.0.0.1

if [ ! -f "$store/catalog.db" ]; then
  "$bin/python" "$repo/scripts/demo.py" --data-only
fi
"$bin/airflow" db migrate >/dev/null
"$bin/airflow" pools set logcompact 4 "logcompact compactions" >/dev/null
echo "Airflow UI: http://127.0.0.1:8080 (DAGs: logcompact_compaction, logcompact_max_lag_hourly, logcompact_full_sweep_daily, logcompact_gc)"
exec "$bin/airflow" standalone
