"""`scripts/airflow.sh` (`make airflow`), started for real on free ports with a private Airflow home and store:
a TERM to the script, or a Ctrl-C in `make airflow` (INT to make's process group), stops every process it
started within its 30 s, then SIGKILLs what is left, naming it; no listener is left; its LocalExecutor has a
worker per pool slot. What an operator opens: the DAGs' connections in Admin > Connections (the metadata
database), and Airflow's metrics, the cleaner's gauges among them, as Prometheus text from the metrics sink."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import psutil
import pytest
from click.testing import CliRunner

from lab.servers.common import HOST, free_port
from logcompact.cli import cli

REPO = Path(__file__).resolve().parents[1]
STARTUP_S = 420  # a migration and four Airflow components on a loaded 2-core machine
STOP_S = 30  # the script's own bound before it kills what is left
POOL_SLOTS = 4


def _answers(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=2):
            return True
    except OSError:
        return False


def _alive(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _command(process: psutil.Process) -> list[str]:
    """A process's command line; none for one that exited since the tree was listed (a zombie, or gone)."""
    try:
        return process.cmdline()
    except psutil.Error:
        return []


def _describe(process: psutil.Process) -> str:
    return f"{process.pid} {' '.join(_command(process))}".rstrip()


def _free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.bind((HOST, 0))
        return probe.getsockname()[1]


@contextmanager
def _running_script(tmp_path: Path, argv: list[str]) -> Iterator[tuple[subprocess.Popen, dict[str, int], dict[str, str], Path]]:
    """The script started on free ports with a private home and store, once Airflow is up: the process, the TCP
    ports that must answer while it runs (and not after), its environment and its terminal output. Whatever the
    test leaves running is killed at the end."""
    store = tmp_path / "store"
    created = CliRunner().invoke(cli, ["--store", f"file://{store}", "topic", "create", "t", "--partitions", "1", "--config", "cleanup.policy=compact"])
    assert created.exit_code == 0, created.output
    ports = {name: free_port() for name in ("api", "agent", "worker logs", "trigger logs", "metrics")}
    env = {
        **os.environ,
        "LOGCOMPACT_VENV": sys.prefix,
        "LOGCOMPACT_AIRFLOW_STORE": str(store),
        "LOGCOMPACT_AIRFLOW_HOME": str(tmp_path / "airflow"),
        "LOGCOMPACT_AIRFLOW_PORT": str(ports["api"]),
        "LOGCOMPACT_AGENT_LISTEN": f"{HOST}:{ports['agent']}",
        "LOGCOMPACT_AIRFLOW_METRICS_LISTEN": f"{HOST}:{ports['metrics']}",
        "LOGCOMPACT_AIRFLOW_STATSD_PORT": str(_free_udp_port()),
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(ports["worker logs"]),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(ports["trigger logs"]),
    }
    output = tmp_path / "output.txt"
    # A session of its own, as a shell starts a job: its process group is the one a Ctrl-C signals. SIGINT at its
    # default, as a terminal's job has it, whatever the suite inherited: one started in the background ignores it,
    # and a shell cannot trap a signal ignored when it started.
    with open(output, "wb") as out:
        started = subprocess.Popen(
            argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
    tree: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + STARTUP_S
        # Up: the API server answered, the DAGs run, and every port has its listener (serve-logs may come last).
        while "their schedules run from now" not in output.read_text() or not all(map(_answers, ports.values())):
            assert started.poll() is None, f"the script ended ({started.returncode}) before Airflow was up:\n{output.read_text()}"
            assert time.monotonic() < deadline, f"Airflow not up within {STARTUP_S} s: {[n for n, port in ports.items() if not _answers(port)]} not answering\n{output.read_text()}"
            time.sleep(2)
        yield started, ports, env, output
    finally:
        # This test's own processes, should it fail before they stopped.
        if started.poll() is None:
            tree = [psutil.Process(started.pid), *psutil.Process(started.pid).children(recursive=True)]
        for process in tree:
            if _alive(process):
                process.kill()
        started.wait()


@pytest.mark.parametrize(
    ("argv", "stop"),
    [
        (["scripts/airflow.sh"], "TERM to the script"),
        # `-o install`: the virtualenv is this interpreter's (LOGCOMPACT_VENV), not one make would build.
        (["make", "--no-print-directory", "-o", "install", "airflow"], "Ctrl-C in make"),
    ],
    ids=["term", "ctrl-c"],
)
def test_stopping_the_script_stops_everything_it_started(tmp_path: Path, argv: list[str], stop: str) -> None:
    with _running_script(tmp_path, argv) as (started, ports, _env, output):
        tree = [psutil.Process(started.pid), *psutil.Process(started.pid).children(recursive=True)]
        # A worker running a task forks the task's process, titled as the worker until it names itself.
        executor = [p for p in tree if "LocalExecutor" in _describe(p)]
        workers = [p for p in executor if p.ppid() not in {w.pid for w in executor}]
        assert len(workers) == POOL_SLOTS, "\n".join(map(_describe, tree))

        if stop == "TERM to the script":
            # A scheduler that does not heed the TERM (as one was seen ignoring it for 85 s) is killed at 30 s.
            (scheduler,) = [p for p in tree if _command(p)[-1:] == ["scheduler"]]
            scheduler.suspend()
            os.kill(started.pid, signal.SIGTERM)
            expected_status = -signal.SIGTERM
        else:
            os.killpg(started.pid, signal.SIGINT)  # what the terminal sends to the foreground job
            expected_status = -signal.SIGINT
        try:
            status = started.wait(timeout=STOP_S + 30)
        except subprocess.TimeoutExpired:
            states = "\n".join(f"{_describe(p)}: {p.status()}, in {Path(f'/proc/{p.pid}/wchan').read_text()}" for p in tree if _alive(p))
            pytest.fail(f"the script still runs {STOP_S + 30} s after {stop}:\n{output.read_text()}\n{states}")
        left = [p for p in tree if _alive(p)]
        assert not left, "left running after the stop:\n" + "\n".join(map(_describe, left))
        assert {name: _answers(port) for name, port in ports.items()} == dict.fromkeys(ports, False)
        said = output.read_text()
        assert status == expected_status, said  # ended by the signal, as a shell or make expects
        assert "logcompact: stopped" in said.splitlines(), said
        if stop == "TERM to the script":
            killed = said[said.index("logcompact: killed with SIGKILL") :]
            assert f"  {scheduler.pid} " in killed, said


def test_an_operator_finds_the_connections_in_airflow_and_the_metrics_at_the_sink(tmp_path: Path) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    with _running_script(tmp_path, ["scripts/airflow.sh"]) as (started, ports, env, output):
        airflow = Path(sys.prefix) / "bin" / "airflow"
        airflow_env = {**env, "AIRFLOW_HOME": env["LOGCOMPACT_AIRFLOW_HOME"]}

        def cli_json(*args: str) -> list[dict]:
            done = subprocess.run([str(airflow), *args, "--output", "json"], env=airflow_env, capture_output=True, text=True, check=True)
            return json.loads(done.stdout)

        # In the metadata database, as Admin > Connections lists them: each says what it is for.
        assert {c["conn_id"] for c in cli_json("connections", "list")} >= {"logcompact_default", "logcompact_spark"}
        ((store,), (spark,)) = (cli_json("connections", "get", conn_id) for conn_id in ("logcompact_default", "logcompact_spark"))
        assert store["extra_dejson"]["store"] == f"file://{env['LOGCOMPACT_AIRFLOW_STORE']}"
        assert "group_bytes" in store["description"] and (spark["conn_type"], spark["host"]) == ("spark", "local[2]")
        assert "Spark master" in spark["description"]
        said = output.read_text()
        assert f"Metrics: http://{HOST}:{ports['metrics']}/metrics" in said, said

        # A run of the metrics DAG: its task process sends the cleaner's gauges to the sink, served as Prometheus text.
        subprocess.run([str(airflow), "dags", "trigger", "logcompact_metrics"], env=airflow_env, capture_output=True, check=True)
        deadline, families = time.monotonic() + STARTUP_S, dict[str, Any]()
        while "airflow_logcompact_max_dirty_percent" not in families:
            assert started.poll() is None, output.read_text()
            assert time.monotonic() < deadline, f"no cleaner gauge at the sink within {STARTUP_S} s: {sorted(families)}"
            time.sleep(3)
            with urllib.request.urlopen(f"http://{HOST}:{ports['metrics']}/metrics", timeout=10) as response:
                families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
        # The topic's partition holds nothing yet: nothing dirty. Airflow's own metrics are there too.
        assert [s.value for s in families["airflow_logcompact_max_dirty_percent"].samples] == [0.0]
        assert families["airflow_logcompact_uncleanable_partitions_count"].type == "gauge"
        assert families["airflow_scheduler_heartbeat"].type == "counter"
        assert [s.value for s in families["statsd_sink_rejected_lines"].samples] == [0.0]
        os.kill(started.pid, signal.SIGTERM)
        assert started.wait(timeout=STOP_S + 30) == -signal.SIGTERM
        assert not _answers(ports["metrics"])


def test_the_metrics_sink_serves_what_a_statsd_client_sends_as_prometheus_text(tmp_path: Path) -> None:
    """The sink alone, fed by the StatsD client Airflow uses (`statsd`), read by prometheus_client's parser."""
    import statsd
    from prometheus_client.parser import text_string_to_metric_families

    udp, http = _free_udp_port(), free_port()
    log = tmp_path / "sink.log"
    with open(log, "wb") as out:
        sink = subprocess.Popen([sys.executable, str(REPO / "scripts" / "statsd_sink.py"), "--statsd", f"{HOST}:{udp}", "--http", f"{HOST}:{http}"],
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 60
        while not _answers(http):
            assert sink.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.2)
        client = statsd.StatsClient(HOST, udp, prefix="airflow")
        client.gauge("logcompact.max-dirty-percent", 87.5)
        client.gauge("pool.open_slots", 4)
        client.gauge("pool.open_slots", -1, delta=True)
        client.incr("scheduler_heartbeat")
        client.incr("scheduler_heartbeat", 2)
        client.timing("dagrun.duration.success.logcompact_gc", 1250)
        client.timing("dagrun.duration.success.logcompact_gc", 750)
        client.gauge("scheduler_heartbeat", 1)  # a counter's name sent as a gauge: rejected, not mixed in
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as raw:
            raw.sendto(b"not statsd at all", (HOST, udp))
        expected = {"airflow_logcompact_max_dirty_percent", "airflow_pool_open_slots", "airflow_scheduler_heartbeat",
                    "airflow_dagrun_duration_success_logcompact_gc"}
        while True:
            with urllib.request.urlopen(f"http://{HOST}:{http}/metrics", timeout=10) as response:
                families = {f.name: f for f in text_string_to_metric_families(response.read().decode())}
            samples = {s.name: s.value for f in families.values() for s in f.samples}
            received = samples.get("airflow_dagrun_duration_success_logcompact_gc_count") == 2 and log.read_text().count("rejected") == 2
            if expected <= set(families) and samples.get("statsd_sink_rejected_lines_total") == 2 and received:
                break
            assert time.monotonic() < deadline, samples
            time.sleep(0.2)
        assert {name: families[name].type for name in expected} == {
            "airflow_logcompact_max_dirty_percent": "gauge", "airflow_pool_open_slots": "gauge",
            "airflow_scheduler_heartbeat": "counter", "airflow_dagrun_duration_success_logcompact_gc": "summary",
        }
        assert (samples["airflow_logcompact_max_dirty_percent"], samples["airflow_pool_open_slots"]) == (87.5, 3)
        assert (samples["airflow_scheduler_heartbeat_total"], samples["airflow_dagrun_duration_success_logcompact_gc_sum"]) == (3, 2000)
        said = log.read_text()
        assert "rejected 'airflow.scheduler_heartbeat:1|g': airflow_scheduler_heartbeat was received as a counter" in said, said
        assert "rejected 'not statsd at all': not name:value|type" in said, said
    finally:
        sink.terminate()
        sink.wait()
