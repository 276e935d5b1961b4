"""The operator's side of transactions, on both databases: `logcompact txn list|describe|abort` from the catalog,
and `logcompact status`'s last stable offsets, open transactions and gauges. A transaction is opened in the catalog
and its records appended by the ingest agent, as the Kafka agent does; the commands run as real processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from logcompact.catalog import Catalog
from logcompact.catalog.producers import SequencedBatch
from logcompact.catalog.transactions import MAX_TIMEOUT_MS, TxnError, TxnRefusal
from logcompact.ingest import Agent, Record
from logcompact.status import cluster_status
from tests.helpers import NOW, create_topic

TIMEOUT = 60_000
LATER = NOW + 5_000  # the clock of the commands: the transaction has been open 5 s


def _run(env: dict[str, str], *args: str, expect: int = 0) -> str:
    done = subprocess.run([sys.executable, "-m", "logcompact", *args], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == expect, done.stderr
    if expect:
        assert len(done.stderr.splitlines()) == 1, done.stderr  # one-line errors
        return done.stderr
    return done.stdout


def _lines(env: dict[str, str], *args: str) -> list[dict]:
    return [json.loads(line) for line in _run(env, *args).splitlines()]


@pytest.fixture
def env(tmp_path: Path, catalog_url: str | None) -> dict[str, str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("LOGCOMPACT_STORE", "LOGCOMPACT_CATALOG")}
    environment.update(LOGCOMPACT_STORE=f"file://{tmp_path}/store", LOGCOMPACT_NOW_MS=str(LATER))
    if catalog_url:
        environment["LOGCOMPACT_CATALOG"] = catalog_url
    return environment


def _hung_transaction(catalog: Catalog) -> tuple[int, int]:
    """Topic t (compacted, 2 partitions) where transactional id "app" left a transaction open: in partition 0 a plain
    record at 0, the transaction's at 1 and 2, a plain one at 3; in partition 1 the transaction's at 0 and a plain one at
    1. Transactional id "idle" has none open. The producer id and epoch of "app"."""
    create_topic(catalog, "t", partitions=2, cleanup_policy="compact")
    pid, epoch = catalog.init_producer("app", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    catalog.init_producer("idle", TIMEOUT, MAX_TIMEOUT_MS, None, NOW)
    catalog.add_to_transaction("app", pid, epoch, [("t", 0), ("t", 1)], NOW)
    sequences = {0: 0, 1: 0}
    with Agent(catalog, background=False, clock=lambda: NOW) as agent:

        def produce(partition: int, key: bytes, transactional: bool) -> None:
            sequenced = None
            if transactional:
                first = sequences[partition]
                sequenced = SequencedBatch(pid, epoch, first, first, None if first == 0 else (epoch, first - 1), True)
                sequences[partition] += 1
            future = agent.produce("t", [Record(partition, key, b"v-" + key, NOW)], sequenced)
            agent.flush()
            future.result()

        produce(0, b"a", False)
        produce(0, b"b", True)
        produce(0, b"c", True)
        produce(0, b"d", False)
        produce(1, b"e", True)
        produce(1, b"f", False)
    return pid, epoch


def _offsets(env: dict[str, str], partition: int, isolation: str) -> list[int]:
    return [record["offset"] for record in _lines(env, "consume", "t", "--partition", str(partition), "--isolation", isolation)]


def test_list_and_describe_show_the_open_transaction_with_its_partitions_and_age(catalog: Catalog, env: dict[str, str]) -> None:
    pid, epoch = _hung_transaction(catalog)
    app = {"transactional_id": "app", "producer_id": pid, "epoch": epoch, "state": "Ongoing", "timeout_ms": TIMEOUT, "start_ms": NOW,
           "duration_ms": 5_000, "updated_ms": NOW, "partitions": ["t/0", "t/1"]}
    listed = _lines(env, "txn", "list", "--json")
    assert [d["transactional_id"] for d in listed] == ["app", "idle"] and listed[0] == app
    assert (listed[1]["state"], listed[1]["start_ms"], listed[1]["duration_ms"], listed[1]["partitions"]) == ("Empty", None, None, [])
    assert _lines(env, "txn", "list", "--state", "ongoing", "--json") == [app]  # Kafka's names, any case
    assert _lines(env, "txn", "list", "--min-duration-ms", "5000", "--json") == [app]
    assert _lines(env, "txn", "list", "--min-duration-ms", "5001", "--json") == []
    assert [d["transactional_id"] for d in _lines(env, "txn", "list", "--producer-id", str(pid), "--state", "Empty", "--state", "Ongoing", "--json")] == ["app"]
    assert _lines(env, "txn", "describe", "app", "--json") == [app]
    header, *rows = _run(env, "txn", "list").splitlines()
    assert header.split() == ["transactional", "id", "producer", "id", "epoch", "state", "open", "s", "timeout", "s", "partitions"]
    assert [row.split() for row in rows] == [["app", str(pid), str(epoch), "Ongoing", "5.0", "60.0", "t/0,t/1"], ["idle", str(pid + 1), "0", "Empty", "-", "60.0", "-"]]
    assert _run(env, "txn", "describe", "app").splitlines()[1].split()[-1] == "t/0,t/1"


def test_status_shows_the_held_lso_and_abort_frees_it_and_fences_the_producer(catalog: Catalog, env: dict[str, str]) -> None:
    pid, epoch = _hung_transaction(catalog)
    held = json.loads(_run(env, "status", "--json"))
    stable = {p["partition"]: (p["high_watermark"], p["last_stable_offset"], p["lso_lag"], p["open_transactions"], p["oldest_transaction_s"])
              for p in held["partitions"]}
    assert stable == {0: (4, 1, 3, 1, 5.0), 1: (2, 0, 2, 1, 5.0)}
    assert (held["gauges"]["open-transactions"], held["gauges"]["max-last-stable-offset-lag"]) == (1, 3)
    table = _run(env, "status").splitlines()
    assert "open-transactions: 1" in table and "max-last-stable-offset-lag: 3" in table
    header = next(line for line in table if line.startswith("topic"))
    assert "LSO  LSO lag  open txns  oldest txn s" in header
    assert [line.split()[-4:] for line in table if line.startswith("t ")] == [["1", "3", "1", "5"], ["0", "2", "1", "5"]]
    assert _offsets(env, 0, "read_committed") == [0]  # held at the transaction's first offset
    assert _offsets(env, 1, "read_committed") == []

    (said,) = _run(env, "txn", "abort", "app").splitlines()
    assert said == (f"aborted the transaction of 'app' open 5.0 s: producer id {pid} epoch {epoch} fenced, a marker in each of 2 partitions, "
                    "2 aborted ranges recorded")
    # Markers at 4 and 2; the LSO is the high watermark again and read_committed readers go past, without the aborted records.
    freed = cluster_status(catalog, LATER)
    assert [(p.partition, p.high_watermark, p.last_stable_offset, p.lso_lag, p.open_transactions, p.oldest_transaction_s) for p in freed.partitions] == [
        (0, 5, 5, 0, 0, None), (1, 3, 3, 0, 0, None)]
    assert (freed.gauges["open-transactions"], freed.gauges["max-last-stable-offset-lag"]) == (0, 0)
    assert _offsets(env, 0, "read_committed") == [0, 3] and _offsets(env, 1, "read_committed") == [1]
    assert _offsets(env, 0, "read_uncommitted") == [0, 1, 2, 3]  # until compaction removes them
    # The epoch was bumped: the producer's next call with its old one is refused, as after a timeout's abort.
    with pytest.raises(TxnRefusal) as refused:
        catalog.end_transaction("app", pid, epoch, True, LATER)
    assert refused.value.error == TxnError.PRODUCER_FENCED
    with pytest.raises(TxnRefusal) as refused:
        catalog.add_to_transaction("app", pid, epoch, [("t", 0)], LATER)
    assert refused.value.error == TxnError.PRODUCER_FENCED
    (row,) = catalog.transactions(states={"CompleteAbort"})
    assert (row.transactional_id, row.epoch) == ("app", epoch + 1)
    # Nothing open any more: a second abort says so and changes nothing.
    again = _run(env, "txn", "abort", "app", expect=1)
    assert "'app' has no open transaction to abort (it is CompleteAbort)" in again and "logcompact txn list --state Ongoing" in again
    assert catalog.log_offsets("t")[0].high_watermark == 5


def test_abort_prints_json_on_request(catalog: Catalog, env: dict[str, str]) -> None:
    pid, epoch = _hung_transaction(catalog)
    assert _lines(env, "txn", "abort", "app", "--json") == [
        {"aborted": "app", "producer_id": pid, "fenced_epoch": epoch, "open_ms": 5_000, "partitions": ["t/0", "t/1"], "markers": 2, "aborted_ranges": 2}
    ]


def test_bad_input_is_one_line_naming_the_fix(catalog: Catalog, env: dict[str, str]) -> None:
    _hung_transaction(catalog)
    for command in (("txn", "describe", "app", "nobody"), ("txn", "abort", "nobody")):
        said = _run(env, *command, expect=1)
        assert said.startswith("logcompact: error: transactional id 'nobody' not in the catalog") and "`logcompact txn list`" in said
    assert "'idle' has no open transaction to abort (it is Empty)" in _run(env, "txn", "abort", "idle", expect=1)
    said = _run(env, "txn", "list", "--state", "Pending", expect=2)
    assert "'Pending' is not a transaction state; use one of Empty, Ongoing, CompleteCommit, CompleteAbort" in said and "logcompact txn list --help" in said
    assert "no row holds it here" in _run(env, "txn", "list", "--state", "PrepareCommit", expect=2)
    assert "--producer-id" in _run(env, "txn", "list", "--producer-id", "-1", expect=2)
    assert "Missing argument 'ID...'" in _run(env, "txn", "describe", expect=2)
    # Nothing was aborted by any of them.
    assert [row.transactional_id for row in catalog.transactions(states={"Ongoing"})] == ["app"]
