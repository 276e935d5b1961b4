"""A Spark standalone cluster on 127.0.0.1 for tests: one master on port 7077 and one worker.

The pyspark wheel ships no sbin/start-master.sh, so the daemons run through `spark-class`; they are
stopped by the PIDs started here. Logs go to the caller's work directory.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from lab.servers.common import free_port

MASTER_URL = "spark://127.0.0.1:7077"


def spark_environment() -> dict[str, str]:
    return {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": sys.executable,
            "PYTHONPATH": str(Path(__file__).resolve().parents[2])}


@contextmanager
def standalone_cluster(workdir: Path, cores: int = 2, timeout_s: float = 90) -> Iterator[str]:
    """Start a master and a worker, wait until the worker has registered, yield the master URL."""
    spark_class = str(Path(sys.executable).parent / "spark-class")
    ui_port = free_port()
    env = spark_environment()
    daemons = []
    try:
        for name, arguments in (
            ("master", ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", "7077",
                        "--webui-port", str(ui_port)]),
            ("worker", ["org.apache.spark.deploy.worker.Worker", MASTER_URL, "--host", "127.0.0.1", "--cores", str(cores),
                        "--memory", "2g", "--webui-port", str(free_port())]),
        ):
            log = open(workdir / f"spark-{name}.log", "wb")
            daemons.append(subprocess.Popen([spark_class, *arguments], env=env, stdout=log, stderr=subprocess.STDOUT))
        deadline = time.monotonic() + timeout_s
        while True:
            for daemon in daemons:
                if daemon.poll() is not None:
                    raise RuntimeError(f"a Spark daemon exited with {daemon.returncode}; see {workdir}/spark-*.log")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{ui_port}/json/", timeout=2) as answer:
                    if json.load(answer).get("aliveworkers", 0) >= 1:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"no Spark worker registered with {MASTER_URL} in {timeout_s} s; see {workdir}/spark-*.log")
            time.sleep(0.5)
        yield MASTER_URL
    finally:
        for daemon in daemons:
            daemon.send_signal(signal.SIGTERM)
        for daemon in daemons:
            try:
                daemon.wait(timeout=20)
            except subprocess.TimeoutExpired:
                daemon.kill()
                daemon.wait()
