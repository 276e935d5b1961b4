#!/usr/bin/env bash
# `make airflow`: Airflow 3 on http://127.0.0.1:8080 serving logcompact's DAGs, with their connections in the metadata
# database (Admin > Connections: the store, here the demo's local store, given data on first use, its catalog the
# embedded SQLite beside it, and the planner's settings; Spark in local mode), the shared pool, Airflow's metrics sent
# by StatsD to a sink serving them as Prometheus text (scripts/statsd_sink.py, http://127.0.0.1:9102/metrics); and a
# Kafka agent (`logcompact agent`) on the same store for Kafka clients, at LOGCOMPACT_AGENT_LISTEN (PLAINTEXT,
# 127.0.0.1:9092 by default) and LOGCOMPACT_AGENT_SASL_LISTEN (SASL_SSL with SCRAM-SHA-512, 127.0.0.1:9094 by default).
# A local trial: every UI user is an admin, and the API server listens on 127.0.0.1 only.
# Settable by the environment: LOGCOMPACT_AIRFLOW_HOME (.airflow), LOGCOMPACT_AIRFLOW_PORT (8080, the API
# server's), LOGCOMPACT_AIRFLOW_STORE (a local store's directory; the default, .demo/store, is given the
# demo's data on first use), LOGCOMPACT_AIRFLOW_METRICS_LISTEN (127.0.0.1:9102, the metrics sink's HTTP),
# LOGCOMPACT_AIRFLOW_STATSD_PORT (8125, the UDP port on 127.0.0.1 Airflow sends StatsD to), LOGCOMPACT_VENV
# (.venv); Airflow's own AIRFLOW__* settings that this script does not set pass through (e.g. the log servers'
# ports, AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT and AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT). An
# AIRFLOW_CONN_LOGCOMPACT_DEFAULT or AIRFLOW_CONN_LOGCOMPACT_SPARK in the environment would take the place of the
# connection of that name (Airflow reads environment variables before its database); the script refuses to start
# with one set.
#
# Stopping: TERM or INT (Ctrl-C in `make airflow`) stops every process the script started: TERM to each,
# then, after 30 s or at a second TERM or INT, SIGKILL to those left, each named on the terminal; the script
# then ends by the signal it got. A component that exits on its own stops the others the same way. The components run one by one, not
# under `airflow standalone`: standalone stops its children only on INT, dies on TERM leaving them running,
# and pipes their output through itself, so that a component outliving it writes into a closed pipe. Here each
# component leads a session of its own (setsid), which holds everything it starts (LocalExecutor workers,
# serve-logs, task processes in their own process groups) and nothing else, so the script can find, signal and
# wait for all of them; and a Ctrl-C reaches them only through the script, which stops them in one way.
#
# The DAGs start paused and are unpaused once the API server answers its health check: a task started
# before it answers fails (its worker reports to the API server), and Airflow 3.3 has no setting that
# holds schedules until then.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
bin="${LOGCOMPACT_VENV:-$repo/.venv}/bin"
demo_store="$repo/.demo/store"
store="${LOGCOMPACT_AIRFLOW_STORE:-$demo_store}"
api_port="${LOGCOMPACT_AIRFLOW_PORT:-8080}"
pool_slots=4

export AIRFLOW_HOME="${LOGCOMPACT_AIRFLOW_HOME:-$repo/.airflow}"
export AIRFLOW__CORE__LOAD_EXAMPLES=False
export AIRFLOW__CORE__DAGS_FOLDER="$repo/dags"
export AIRFLOW__CORE__PLUGINS_FOLDER="$repo/plugins"
export AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS=True
export AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION=True  # unpaused below, once the API server answers
export AIRFLOW__CORE__EXECUTOR=LocalExecutor
# LocalExecutor forks `parallelism` workers when the scheduler starts (32 by default, ~140 MiB each), and
# every task takes a slot of the pool: as many workers as slots.
export AIRFLOW__CORE__PARALLELISM=$pool_slots
export AIRFLOW__API__HOST=127.0.0.1
export AIRFLOW__API__PORT=$api_port
export AIRFLOW__CORE__EXECUTION_API_SERVER_URL="http://127.0.0.1:$api_port/execution/"
# Airflow's metrics, the cleaner's gauges among them, to the StatsD sink started below, which serves them as
# Prometheus text on $metrics_listen.
metrics_listen="${LOGCOMPACT_AIRFLOW_METRICS_LISTEN:-127.0.0.1:9102}"
statsd_port="${LOGCOMPACT_AIRFLOW_STATSD_PORT:-8125}"
export AIRFLOW__METRICS__STATSD_ON=True
export AIRFLOW__METRICS__STATSD_HOST=127.0.0.1
export AIRFLOW__METRICS__STATSD_PORT=$statsd_port
export AIRFLOW__METRICS__STATSD_PREFIX=airflow
export PATH="$bin:$PATH"  # the Spark provider runs a bare spark-submit
export PYSPARK_PYTHON="$bin/python"
export SPARK_LOCAL_IP=127.0.0.1

health="http://127.0.0.1:$api_port/api/v2/monitor/health"
dag_ids=()
for dag_file in "$repo"/dags/logcompact_*.py; do
  dag_ids+=("$(basename "$dag_file" .py)")  # each DAG file is named for its DAG
done
startup_wait_s=300
stop_wait_s=30

sessions=()             # the PID of each component, the leader of its own session
declare -A component=() # PID -> the component's name
step_pid=""             # the script's own step in progress (a migration, a health check)

# NAME COMMAND...: runs COMMAND in a session of its own, its output in $AIRFLOW_HOME/NAME.log. A background
# child of a script is never a process group leader, so setsid makes the session in place: $! is its leader.
start_component() {
  local name=$1
  shift
  setsid "$@" </dev/null >"$AIRFLOW_HOME/$name.log" 2>&1 &
  sessions+=("$!")
  component[$!]=$name
}

# COMMAND...: runs a step of the script as a child it waits for, so that a TERM stops the step at once
# instead of after it.
step() {
  local status=0
  "$@" &
  step_pid=$!
  wait "$step_pid" || status=$?
  step_pid=""
  return "$status"
}

# The live processes the script started, one "PID ARGS" a line: everything in the components' sessions, and
# the step in progress.
started_processes() {
  local sids
  sids=$(IFS=,; echo "${sessions[*]}")
  {
    [[ -z $sids ]] || ps -o pid=,stat=,args= -s "$sids" || true  # ps fails when it finds none
    [[ -z $step_pid ]] || ps -o pid=,stat=,args= -p "$step_pid" || true
  } | awk '$2 !~ /^Z/ { pid = $1; $1 = $2 = ""; sub(/^ +/, ""); print pid, $0 }'  # zombies have ended
}

# Sets `left` to started_processes' list; lists again (a few times) if a Ctrl-C, reaching the listing too, cut
# it short.
list_left() {
  local tries=0
  until left=$(started_processes) || ((++tries == 5)); do :; done
}

# Each line of $1, indented, on stderr (builtins alone: a Ctrl-C cannot cut it short).
say_list() {
  local line
  while read -r line; do echo "  $line"; done <<<"$1" >&2
}

# TERM to every process the script started, SIGKILL to those left after $stop_wait_s s (or at a second TERM
# or INT); says what it did. Runs once, on the script's exit, whatever ends it.
stop_deadline=""
stop_all() {
  [[ -z $stop_deadline ]] || return 0
  stop_deadline=$((SECONDS + stop_wait_s))
  trap 'stop_deadline=0' TERM INT  # a command, not a function: bash 5.2 fails returning from one run inside this
  local left pid args names="" rounds=0 started=$SECONDS
  ((${#sessions[@]})) || return 0
  for pid in "${sessions[@]}"; do names+="${component[$pid]} "; done
  echo "logcompact: stopping ${names}(TERM; SIGKILL to what is left after ${stop_wait_s} s or at a second Ctrl-C)"
  list_left
  while read -r pid args; do kill -TERM "$pid" 2>/dev/null || true; done <<<"$left"
  while list_left && [[ -n $left ]] && ((SECONDS < stop_deadline)); do
    sleep 0.5 || true  # a second Ctrl-C ends it early
  done
  if [[ -n $left ]]; then
    echo "logcompact: killed with SIGKILL, still running $((SECONDS - started)) s after the TERM:" >&2
    say_list "$left"
    # A process forking while it is killed leaves a child: kill again until nothing is left.
    while [[ -n $left ]] && ((rounds++ < 20)); do
      while read -r pid args; do kill -KILL "$pid" 2>/dev/null || true; done <<<"$left"
      sleep 0.1 || true
      list_left
    done
    if [[ -n $left ]]; then
      echo "logcompact: could not stop:" >&2
      say_list "$left"
      return 1
    fi
  fi
  echo "logcompact: stopped"
}

# SIGNAL: stops everything, then ends the script by that signal, as its callers (make, a shell) expect.
on_signal() {
  stop_all || true
  trap - "$1" EXIT
  kill -"$1" "$$"
}
trap stop_all EXIT
trap 'on_signal TERM' TERM
trap 'on_signal INT' INT

# PID STATUS: the component PID has exited: ends the script (and so everything it started), naming the
# component with the last line of its log.
component_exited() {
  local log="$AIRFLOW_HOME/${component[$1]}.log"
  echo "logcompact: the ${component[$1]} exited (status $2); the end of $log: $(tail -n 1 "$log")" >&2
  exit 1
}

# Ends the script as component_exited does if a component has exited.
check_components() {
  local pid status=0
  for pid in "${sessions[@]}"; do
    kill -0 "$pid" 2>/dev/null && continue
    wait "$pid" || status=$?
    component_exited "$pid" "$status"
  done
}

# Unpause every logcompact DAG once the API server answers and the DAG processor has stored the DAGs; says on
# the terminal what it did, or why not.
unpause_when_ready() {
  local deadline=$((SECONDS + startup_wait_s)) unpaused="" dag_id missing out="$AIRFLOW_HOME/dags-unpause.log"
  until step curl --silent --fail --max-time 5 "$health" >/dev/null; do
    check_components
    if ((SECONDS >= deadline)); then
      echo "logcompact: the API server did not answer $health within ${startup_wait_s} s; the DAGs stay paused: unpause them in the UI or with \`airflow dags unpause DAG_ID\`" >&2
      return 0
    fi
    step sleep 3
  done
  echo "logcompact: the API server answers; unpausing ${dag_ids[*]}"
  while :; do
    # Lists the DAGs it unpaused: those the DAG processor has stored by now.
    step "$bin/airflow" dags unpause --treat-dag-id-as-regex --yes --output plain '^logcompact_' >"$out" 2>&1 || true
    unpaused+=" $(tr '\n' ' ' <"$out")"
    missing=()
    for dag_id in "${dag_ids[@]}"; do
      [[ " $unpaused " == *" $dag_id "* ]] || missing+=("$dag_id")
    done
    ((${#missing[@]})) || break
    check_components
    if ((SECONDS >= deadline)); then
      echo "logcompact: ${missing[*]} not stored by the DAG processor within ${startup_wait_s} s (see \`airflow dags list-import-errors\`); they stay paused" >&2
      return 0
    fi
    step sleep 5
  done
  echo "logcompact: unpaused ${dag_ids[*]}; their schedules run from now"
}

for name in AIRFLOW_CONN_LOGCOMPACT_DEFAULT AIRFLOW_CONN_LOGCOMPACT_SPARK; do
  if [[ -n ${!name:-} ]]; then
    echo "logcompact: $name is set in the environment, where it would hide the connection this script writes to the metadata database (the agent serves LOGCOMPACT_AIRFLOW_STORE); unset it" >&2
    exit 2
  fi
done
mkdir -p "$AIRFLOW_HOME"
if [[ $store == "$demo_store" && ! -f $store/catalog.db ]]; then
  step "$bin/python" "$repo/scripts/demo.py" --data-only
fi

# The Kafka agent: up before Airflow, or the script stops with its error (a port in use, say). Two listeners:
# PLAINTEXT on loopback, and SASL_SSL (SCRAM-SHA-512, a trial CA's certificate made on first use) with the user
# `logcompact`, whose generated password and client settings are kept in $agent_dir/client.properties (mode 0600).
agent_listen="${LOGCOMPACT_AGENT_LISTEN:-127.0.0.1:9092}"
agent_sasl_listen="${LOGCOMPACT_AGENT_SASL_LISTEN:-127.0.0.1:9094}"
agent_dir="$AIRFLOW_HOME/agent"
agent_log="$AIRFLOW_HOME/agent.log"
: >"$agent_log"
step "$repo/docker/bin/logcompact-agent-certs" "$agent_dir" localhost 127.0.0.1 >/dev/null
start_component agent "$bin/logcompact" --store "file://$store" agent --listen "$agent_listen" --listen "SASL_SSL://$agent_sasl_listen" \
  --ssl-certfile "$agent_dir/agent.pem" --ssl-keyfile "$agent_dir/agent.key" --sasl-mechanisms SCRAM-SHA-512 \
  --processes "${LOGCOMPACT_AGENT_PROCESSES:-1}"  # one beside Airflow and Spark; more take each listener's next ports
until grep -q '"listening"' "$agent_log" 2>/dev/null; do
  if ! kill -0 "${sessions[0]}" 2>/dev/null; then
    echo "logcompact: the Kafka agent did not start (LOGCOMPACT_AGENT_LISTEN=$agent_listen): $(tail -n 1 "$agent_log")" >&2
    exit 1
  fi
  step sleep 0.2
done
# The user once the agent is up: on an empty store the agent creates the cluster the credential is kept in.
if [[ ! -f $agent_dir/client.properties ]]; then
  password=$("$bin/python" -c 'import secrets; print(secrets.token_urlsafe(24))')
  "$bin/logcompact" --store "file://$store" user add logcompact --mechanism SCRAM-SHA-512 --password-stdin <<<"$password" >/dev/null
  (umask 077; printf '%s\n' "bootstrap.servers=$agent_sasl_listen" security.protocol=SASL_SSL sasl.mechanism=SCRAM-SHA-512 \
    sasl.username=logcompact "sasl.password=$password" "ssl.ca.location=$agent_dir/ca.pem" >"$agent_dir/client.properties")
  unset password
fi
echo "Kafka agent: bootstrap.servers=$agent_listen (log: $agent_log), e.g. kcat -b $agent_listen -L"
echo "  and SASL_SSL on $agent_sasl_listen, the settings in $agent_dir/client.properties, e.g. kcat -F $agent_dir/client.properties -L"

# The metrics sink: up before Airflow sends to it, or the script stops with its error (a port in use, say).
metrics_log="$AIRFLOW_HOME/metrics-sink.log"
: >"$metrics_log"
start_component metrics-sink "$bin/python" "$repo/scripts/statsd_sink.py" --statsd "127.0.0.1:$statsd_port" --http "$metrics_listen"
until grep -q '^statsd_sink: receiving' "$metrics_log" 2>/dev/null; do
  check_components
  step sleep 0.2
done
echo "Metrics: http://$metrics_listen/metrics (Airflow's StatsD metrics as Prometheus text, the cleaner's gauges as airflow_logcompact_*; log: $metrics_log)"

step "$bin/airflow" db migrate >/dev/null
step "$bin/airflow" pools set logcompact "$pool_slots" "logcompact compactions" >/dev/null
# The DAGs' connections, in the metadata database where Admin > Connections shows them (environment variables
# would not show there), written at each start: the agent serves the same store. Groups of 8 MiB (the planner's
# group_bytes): the demo data's tens of MiB make several mapped Spark jobs per plan.
connections="$AIRFLOW_HOME/connections.json"
step env STORE_URI="file://$store" "$bin/python" -c '
import json, os, sys
json.dump({
    "logcompact_default": {
        "conn_type": "generic",
        "description": "logcompact: the store (extra store), its catalog (the embedded SQLite beside a file:// store unless "
                       "extra catalog or catalog_conn_id names one) and the planner settings of every DAG (extra planner: "
                       "PlannerConfig fields such as group_bytes, min_files); written by make airflow at each start",
        "extra": json.dumps({"store": os.environ["STORE_URI"], "planner": {"group_bytes": 8388608}}),
    },
    "logcompact_spark": {
        "conn_type": "spark", "host": "local[2]",
        "description": "logcompact: the Spark master the compact_group jobs are submitted to (host: local[N], or spark://HOST with "
                       "port 7077 for a standalone cluster); written by make airflow at each start",
    },
}, open(sys.argv[1], "w"), indent=2)
' "$connections"
step "$bin/airflow" connections import --overwrite "$connections" >/dev/null
# A home kept from an earlier run has its DAGs unpaused: pause them until the API server answers again.
step "$bin/airflow" dags pause --treat-dag-id-as-regex --yes --output plain '^logcompact_' >/dev/null
for name in api-server scheduler dag-processor triggerer; do
  start_component "$name" "$bin/airflow" "$name"
done
echo "Airflow UI: http://127.0.0.1:$api_port (DAGs: ${dag_ids[*]}; unpaused once the API server answers; logs: $AIRFLOW_HOME/{api-server,scheduler,dag-processor,triggerer}.log)"
unpause_when_ready
# Until a component exits (the script then stops the others) or a TERM or INT stops them all.
status=0
wait -n -p exited "${sessions[@]}" || status=$?
component_exited "$exited" "$status"
