"""`make demo`'s output: the report alone on the terminal, everything its libraries print in the log it names; and its
transactional step. The demo itself takes minutes (Spark and Airflow); its DAG runs are tested in test_dags.py."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from logcompact.catalog import Catalog
from logcompact.consume import read_batches
from logcompact.exceptions import VerificationError
from logcompact.jobs import run_and_commit
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.store import LocalStore

ROOT = Path(__file__).resolve().parents[1]

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


def test_the_demos_transactional_producer_leaves_no_aborted_record_after_compaction_and_a_read_committed_group_reads_the_committed(
    tmp_path: Path,
) -> None:
    """The demo's transactional step against a real agent, with the compaction its DAGs run made through the library
    (the same engine, without Airflow and Spark)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    import demo

    store = LocalStore(tmp_path / "store")
    catalog = Catalog(store)
    now = int(time.time() * 1000)
    catalog.ensure_created(now)
    demo.create_ledger(catalog, now)
    with demo.running_agent(store.uri, sys.stderr) as bootstrap:
        ledger = demo.produce_transactions(bootstrap)
    assert (ledger.committed, ledger.aborted, ledger.aborted_records) == (6, 3, 3 * demo.LEDGER_RECORDS)
    values = [value for p in range(demo.LEDGER_PARTITIONS) for batch in read_batches(store, catalog.snapshot(), demo.LEDGER, p)
              for value in batch.column("value").to_pylist()]
    assert sum(value.startswith(b"aborted") for value in values) == ledger.aborted_records  # in the log until compacted
    with pytest.raises(VerificationError, match="aborted records after compaction"):
        demo.verify_ledger_compacted(store, catalog.snapshot(), ledger)

    later = now + 60_000
    for plan in choose_plans(catalog.planning_snapshot(later), later, "full", PlannerConfig(), topics=[demo.LEDGER]):
        run_and_commit(catalog, plan, later)
    held = demo.verify_ledger_compacted(store, catalog.snapshot(), ledger)
    with demo.running_agent(store.uri, sys.stderr) as bootstrap:
        read = demo.read_ledger_committed(bootstrap, ledger)
    keys = sum(len(latest) for latest in ledger.latest.values())
    assert held == read == keys == demo.LEDGER_KEYS
    assert demo.ledger_report(ledger, held, read) == (
        f"verified transactions: 6 committed and 3 aborted ({3 * demo.LEDGER_RECORDS} aborted records) on ledger; after compaction its "
        f"files hold {keys} records, none aborted, and a read_committed consumer group read {keys}, each key's latest committed value once"
    )
