#!/usr/bin/env bash
# `make airflow`: `airflow standalone` on http://127.0.0.1:8080 serving logcompact's DAGs, with the store
# connection (the demo's local store, given data on first use, its catalog the embedded SQLite beside it),
# Spark in local mode and the shared pool; and a Kafka agent (`logcompact agent`) on the same store for Kafka
# clients, at LOGCOMPACT_AGENT_LISTEN (127.0.0.1:9092 by default), stopped with Airflow.
# A local trial: every UI user is an admin, and the API server listens on 127.0.0.1 only.
# The DAGs start paused and a background step unpauses them once the API server answers its health check:
# a task started before it answers fails (its worker reports to the API server), and Airflow 3.3 has no
# setting that holds schedules until then.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="$repo/.venv/bin"
store="$repo/.demo/store"

export AIRFLOW_HOME="$repo/.airflow"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$repo/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$repo/plugins"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True  # unpaused below, once the API server answers
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=8080
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL=http://127.0.0.1:8080/execution/
# Groups of 8 MiB: the demo data's tens of MB make several mapped Spark jobs per plan.
export AIRFLOW_CONN_LOGCOMPACT_DEFAULT="{\"conn_type\": \"generic\", \"extra\": {\"store\": \"file://$store\", \"planner\": {\"group_bytes\": 8388608}}}"
export AIRFLOW_CONN_LOGCOMPACT_SPARK='{"conn_type": "spark", "host": "local[2]"}'
export PATH="$bin:$PATH"  # the Spark provider runs a bare spark-submit
export PYSPARK_PYTHON="$bin/python"
export SPARK_LOCAL_IP=127.0.0.1

if [ ! -f "$store/catalog.db" ]; then
  "$bin/python" "$repo/scripts/demo.py" --data-only
fi
health="http://$AIRFLOW__API__HOST:$AIRFLOW__API__PORT/api/v2/monitor/health"
dag_ids=()
for dag_file in "$repo"/dags/logcompact_*.py; do
  dag_ids+=("$(basename "$dag_file" .py)")  # each DAG file is named for its DAG
done
startup_wait_s=300

# Unpause every logcompact DAG once the API server answers and the DAG processor has stored the DAGs; says on
# the terminal what it did, or why not. Ends with this script.
unpause_when_ready() {
  local deadline=$((SECONDS + startup_wait_s)) unpaused="" dag_id missing
  until curl --silent --fail --max-time 5 "$health" >/dev/null; do
    kill -0 "$$" 2>/dev/null || return 0
    if ((SECONDS >= deadline)); then
      echo "logcompact: the API server did not answer $health within ${startup_wait_s} s; the DAGs stay paused: unpause them in the UI or with \`airflow dags unpause DAG_ID\`" >&2
      return 1
    fi
    sleep 3
  done
  echo "logcompact: the API server answers; unpausing ${dag_ids[*]}"
  while :; do
    # Lists the DAGs it unpaused: those the DAG processor has stored by now.
    unpaused+=" $("$bin/airflow" dags unpause --treat-dag-id-as-regex --yes --output plain '^logcompact_' 2>&1 | tr '\n' ' ')"
    missing=()
    for dag_id in "${dag_ids[@]}"; do
      [[ " $unpaused " == *" $dag_id "* ]] || missing+=("$dag_id")
    done
    ((${#missing[@]})) || break
    kill -0 "$$" 2>/dev/null || return 0
    if ((SECONDS >= deadline)); then
      echo "logcompact: ${missing[*]} not stored by the DAG processor within ${startup_wait_s} s (see \`airflow dags list-import-errors\`); they stay paused" >&2
      return 1
    fi
    sleep 5
  done
  echo "logcompact: unpaused ${dag_ids[*]}; their schedules run from now"
}

# The Kafka agent: up before Airflow, or the script stops with its error (a port in use, say).
agent_listen="${LOGCOMPACT_AGENT_LISTEN:-127.0.0.1:9092}"
agent_log="$AIRFLOW_HOME/agent.log"
mkdir -p "$AIRFLOW_HOME"
"$bin/logcompact" --store "file://$store" agent --listen "$agent_listen" >"$agent_log" 2>&1 &
agent_pid=$!
trap 'kill -TERM "$agent_pid" 2>/dev/null; wait "$agent_pid" 2>/dev/null || true' EXIT
until grep -q '"listening"' "$agent_log" 2>/dev/null; do
  if ! kill -0 "$agent_pid" 2>/dev/null; then
    echo "logcompact: the Kafka agent did not start (LOGCOMPACT_AGENT_LISTEN=$agent_listen): $(tail -n 1 "$agent_log")" >&2
    exit 1
  fi
  sleep 0.2
done
echo "Kafka agent: bootstrap.servers=$agent_listen (log: $agent_log), e.g. kcat -b $agent_listen -L"

"$bin/airflow" db migrate >/dev/null
"$bin/airflow" pools set logcompact 4 "logcompact compactions" >/dev/null
# A home kept from an earlier run has its DAGs unpaused: pause them until the API server answers again.
"$bin/airflow" dags pause --treat-dag-id-as-regex --yes --output plain '^logcompact_' >/dev/null
echo "Airflow UI: http://127.0.0.1:8080 (DAGs: ${dag_ids[*]}; unpaused once the API server answers)"
unpause_when_ready &
# Airflow in the background so that a TERM or INT of this script reaches it and the agent alike.
"$bin/airflow" standalone &
airflow_pid=$!
trap 'kill -TERM "$airflow_pid" 2>/dev/null' TERM INT
wait "$airflow_pid" || wait "$airflow_pid" || true  # a trapped signal ends the first wait early
