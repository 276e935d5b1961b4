"""`make demo`'s output: the report alone on the terminal, everything its libraries print in the log it names.
The demo itself takes minutes (Spark and Airflow); its DAG runs are tested in test_dags.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Within the demo's redirection: Airflow configures its logging onto the process's stdout when first imported (as
# the demo's DAG runs do), then an Airflow warning, a third-party deprecation, a child process's stderr (Spark,
# librdkafka), the report, and the demo's own error.
DEMO_LIKE = """
import subprocess, sys, warnings
from pathlib import Path

from logcompact.lab.demo import output_to_log

with output_to_log(Path(sys.argv[1])) as terminal:
    from airflow.assets.manager import AssetManager

    AssetManager.logger().warning("Emitting event for inactive AssetModel")
    warnings.warn("GitWildMatchPattern is deprecated", DeprecationWarning)
    subprocess.run(["sh", "-c", "echo a child process writes to stderr >&2"], check=True)
    print("report: 300,000 records in", file=terminal.out)
    print("agent: a line of its own", file=terminal.err)
    raise SystemExit("demo: the check failed")
"""


def test_the_terminal_shows_the_report_and_the_demos_error_the_log_takes_the_libraries_output(tmp_path: Path) -> None:
    log = tmp_path / "demo.log"
    done = subprocess.run([sys.executable, "-c", DEMO_LIKE, str(log)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stdout == f"logs of Airflow, Spark and the Kafka clients: {log}\nreport: 300,000 records in\n"
    assert done.stderr == "agent: a line of its own\ndemo: the check failed\n"
    written = log.read_text()
    for line in ("Emitting event for inactive AssetModel", "GitWildMatchPattern is deprecated", "a child process writes to stderr"):
        assert line in written, written
