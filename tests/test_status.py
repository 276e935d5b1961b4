"""`logcompact status`: the cleaner's figures against numbers worked out here from what the test produced."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import update

from logcompact.catalog import Catalog, SetAside, schema
from logcompact.exceptions import LogcompactError
from logcompact.jobs import run_and_commit
from logcompact.planner import PlannerConfig, choose_plans
from logcompact.status import cluster_status, job_gauges
from logcompact.store import LocalStore
from tests.helpers import NOW, create_topic, full_sweep, produce_l0_files

HOUR_MS = 3_600_000
FILES, RECORDS, KEYS, PARTITIONS = 4, 100, 10, 2


def _cluster(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", partitions=PARTITIONS, cleanup_policy="compact", max_compaction_lag_ms=str(2 * HOUR_MS))
    create_topic(catalog, "clicks", partitions=1, cleanup_policy="delete")
    produce_l0_files(catalog, "orders", files=FILES, records=RECORDS, keys=KEYS, partitions=PARTITIONS)
    produce_l0_files(catalog, "clicks", files=1, records=10, keys=10, partitions=1)
    return catalog


def test_status_before_and_after_a_sweep(catalog: Catalog) -> None:
    _cluster(catalog)
    later = NOW + 3 * HOUR_MS  # an hour past the 2 h max lag
    before = cluster_status(catalog, later)
    # Only the compacted topic, every partition all dirty: nothing was ever deduplicated.
    assert [(p.topic, p.partition) for p in before.partitions] == [("orders", 0), ("orders", 1)]
    for p in before.partitions:
        assert (p.dirty_percent, p.dirty_bytes, p.sections, p.since_last_compaction_s) == (100.0, p.bytes, FILES, None)
        assert p.compaction_delay_s == 3600.0
        # 200 records of 5 keys each: about 195 duplicates (the sketch's error is a few keys at most).
        assert abs(p.estimated_duplicates - (FILES * RECORDS // PARTITIONS - KEYS // PARTITIONS)) <= 3
    assert [(lv.level, lv.files) for lv in before.levels] == [(0, FILES + 1)]
    assert before.gauges == {
        "max-dirty-percent": 100.0, "max-compaction-delay-secs": 3600.0, "time-since-last-run-ms": None,
        "uncleanable-partitions-count": 0, "uncleanable-bytes": 0, "open-transactions": 0, "max-last-stable-offset-lag": 0,
    }

    plan = full_sweep(catalog.planning_snapshot(later), later)
    result = run_and_commit(catalog, plan, later).to_dict()
    after = cluster_status(catalog, later + 60_000)
    for p in after.partitions:
        assert (p.dirty_percent, p.dirty_bytes, p.compaction_delay_s, p.since_last_compaction_s, p.sections) == (0.0, 0, None, 60.0, 1)
        assert p.estimated_duplicates == 0  # clean: the sketches' error does not count
    assert after.gauges["max-dirty-percent"] == 0.0 and after.gauges["time-since-last-run-ms"] == 60_000
    assert {lv.level for lv in after.levels} == {2}
    assert after.topics()["orders"]["dirty_percent"] == 0.0
    gauges = job_gauges([result])
    assert gauges["cleaner-recopy-percent"] == round(100 * result["bytes_out"] / result["bytes_in"], 1) < 100
    assert gauges["max-buffer-utilization-percent"] == result["buffer_utilization_percent"] and gauges["max-clean-time-secs"] == result["max_job_seconds"]


def test_status_from_the_summaries_is_status_from_every_section(catalog: Catalog) -> None:
    """At each stage of a cluster (L0 only, L1 copies beside new L0 files, a deduplicated L2 base with dirty data
    above it), the figures read from the catalog's summaries are those read from every section (each summary
    marked newer than the snapshot, so status reads the sections instead)."""
    _cluster(catalog)
    config = PlannerConfig(min_files=(2, 2, 2, 2))
    for stage in range(4):
        now = NOW + (stage + 3) * HOUR_MS
        if stage:
            for plan in choose_plans(catalog.planning_snapshot(now), now, "regular", config):
                run_and_commit(catalog, plan, now)
            produce_l0_files(catalog, "orders", files=2, records=RECORDS, keys=KEYS, partitions=PARTITIONS, now=now)
        from_summaries = cluster_status(catalog, now + 60_000)
        with catalog.engine.begin() as connection:
            connection.execute(update(schema.partition_summaries).values(version=schema.partition_summaries.c.version + 1_000_000))
        from_sections = cluster_status(catalog, now + 60_000)
        with catalog.engine.begin() as connection:
            connection.execute(update(schema.partition_summaries).values(version=schema.partition_summaries.c.version - 1_000_000))
        assert from_summaries == from_sections, stage
    assert {lv.level for lv in from_summaries.levels} >= {0, 2}
    assert any(0 < p.dirty_percent < 100 for p in from_summaries.partitions)


def test_the_cleaners_maxima_leave_out_uncleanable_partitions_as_kafkas_do(catalog: Catalog) -> None:
    _cluster(catalog)
    damaged = catalog.snapshot().file_summaries()[0].key
    catalog.replace_files([], [], NOW, marks=[SetAside("orders", 0, "a damaged file", damaged)])
    status = cluster_status(catalog, NOW + 3 * HOUR_MS)
    assert [(p.partition, p.dirty_percent, p.uncleanable) for p in status.partitions] == [(0, 100.0, True), (1, 100.0, False)]
    assert status.gauges["uncleanable-partitions-count"] == 1 and status.gauges["max-dirty-percent"] == 100.0  # orders/1
    catalog.replace_files([], [], NOW, marks=[SetAside("orders", 1, "a damaged file", damaged)])
    both = cluster_status(catalog, NOW + 3 * HOUR_MS)
    assert both.gauges["uncleanable-partitions-count"] == 2
    assert (both.gauges["max-dirty-percent"], both.gauges["max-compaction-delay-secs"]) == (0.0, 0.0)


def test_the_cli_prints_a_table_json_and_a_plot(tmp_path) -> None:
    _cluster(Catalog(LocalStore(tmp_path / "store")))
    env = {**os.environ, "LOGCOMPACT_STORE": f"file://{tmp_path}/store", "LOGCOMPACT_NOW_MS": str(NOW + 3 * HOUR_MS)}
    env.pop("LOGCOMPACT_CATALOG", None)

    def status(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "logcompact", "status", *args], capture_output=True, text=True, env=env, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    document = json.loads(status("--json"))
    assert document["gauges"]["max-compaction-delay-secs"] == 3600.0 and document["gauges"]["time-since-last-run-ms"] is None
    assert [(p["topic"], p["partition"], p["dirty_percent"]) for p in document["partitions"]] == [("orders", 0, 100.0), ("orders", 1, 100.0)]
    table = status("--plot", str(tmp_path / "status.png")).splitlines()
    assert "max-dirty-percent: 100.0" in table and "uncleanable-partitions-count: 0" in table
    assert "time-since-last-run-ms: -" in table  # no compaction yet
    header = table.index("") + 1
    assert table[header].split() == ["level", "files", "MiB", "stored"]  # MiB, as every log of the product gives sizes
    (level,) = document["levels"]
    assert table[header + 1].split() == [f"L{level['level']}", f"{level['files']:,}", f"{level['bytes'] / 1024**2:.3f}"]
    rows = [line.split() for line in table if line.startswith("orders")]
    assert [row[:2] + row[3:5] for row in rows] == [["orders", "0", "100.0", "3,600"], ["orders", "1", "100.0", "3,600"]]
    assert [row[2] for row in rows] == [f"{p['bytes'] / 1024**2:.3f}" for p in document["partitions"]]
    assert (tmp_path / "status.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and (tmp_path / "status.png").stat().st_size > 10_000


def _uneven_cluster(catalog: Catalog) -> int:
    """Partitions the worst-first order tells apart, at the time returned: audit/0 all dirty and past its max lag,
    events/0 and /1 all dirty without a max lag, orders/0 dirtier than orders/1, orders/2 and /3 clean; clicks not
    compacted."""
    create_topic(catalog, "orders", partitions=4, cleanup_policy="compact", max_compaction_lag_ms=str(2 * HOUR_MS))
    create_topic(catalog, "clicks", partitions=1, cleanup_policy="delete")
    produce_l0_files(catalog, "orders", files=FILES, records=RECORDS, keys=KEYS, partitions=4)
    later = NOW + 3 * HOUR_MS
    run_and_commit(catalog, full_sweep(catalog.planning_snapshot(later), later), later)
    produce_l0_files(catalog, "orders", files=1, records=30, keys=30, partitions=1, now=later)
    produce_l0_files(catalog, "orders", files=1, records=10, keys=10, partitions=2, now=later)
    create_topic(catalog, "events", partitions=2, cleanup_policy="compact")
    produce_l0_files(catalog, "events", files=1, records=20, keys=20, partitions=2, now=later)
    create_topic(catalog, "audit", partitions=1, cleanup_policy="compact", max_compaction_lag_ms=str(HOUR_MS))
    produce_l0_files(catalog, "audit", files=1, records=10, keys=10, partitions=1)
    return later + 60_000


WORST_FIRST = [("audit", 0), ("events", 0), ("events", 1), ("orders", 0), ("orders", 1), ("orders", 2), ("orders", 3)]


def test_worst_partitions_come_first_by_dirty_ratio_then_delay(catalog: Catalog) -> None:
    now = _uneven_cluster(catalog)
    everything = cluster_status(catalog, now)
    by_name = {(p.topic, p.partition): p for p in everything.partitions}
    assert sorted(by_name) == sorted(WORST_FIRST) and everything.partitions_total == len(WORST_FIRST)
    audit, events, orders = by_name[("audit", 0)], by_name[("events", 0)], [by_name[("orders", n)] for n in range(4)]
    assert (audit.dirty_percent, events.dirty_percent) == (100.0, 100.0)
    assert audit.compaction_delay_s and audit.compaction_delay_s > 0 and events.compaction_delay_s is None
    assert 100.0 > orders[0].dirty_percent > orders[1].dirty_percent > orders[2].dirty_percent == orders[3].dirty_percent == 0.0
    worst = cluster_status(catalog, now, worst=4)
    assert [(p.topic, p.partition) for p in worst.partitions] == WORST_FIRST[:4]
    assert worst.partitions_total == len(WORST_FIRST) and worst.gauges == everything.gauges  # the gauges are of every partition
    assert [(p.topic, p.partition) for p in cluster_status(catalog, now, worst=100).partitions] == WORST_FIRST
    assert "the worst 4 of 7 partitions, by dirty ratio then compaction delay:" in worst.describe()


def test_status_of_some_topics(catalog: Catalog) -> None:
    now = _uneven_cluster(catalog)
    some = cluster_status(catalog, now, topics=["orders", "events", "orders"])
    assert [(p.topic, p.partition) for p in some.partitions] == [("events", 0), ("events", 1), ("orders", 0), ("orders", 1), ("orders", 2), ("orders", 3)]
    assert some.topics_asked == ["events", "orders"] and some.partitions_total == 6
    assert some.gauges["max-compaction-delay-secs"] == 0.0  # audit's delay is left out with it
    assert cluster_status(catalog, now).gauges["max-compaction-delay-secs"] > 0
    assert [(p.topic, p.partition) for p in cluster_status(catalog, now, topics=["orders"], worst=2).partitions] == [("orders", 0), ("orders", 1)]
    with pytest.raises(LogcompactError, match="no topic 'nope' in the catalog"):
        cluster_status(catalog, now, topics=["nope"])
    with pytest.raises(LogcompactError, match=r"topic 'clicks' is not compacted \(cleanup.policy=delete\)"):
        cluster_status(catalog, now, topics=["clicks"])


def test_the_cli_filters_and_orders(tmp_path) -> None:
    now = _uneven_cluster(Catalog(LocalStore(tmp_path / "store")))
    env = {**os.environ, "LOGCOMPACT_STORE": f"file://{tmp_path}/store", "LOGCOMPACT_NOW_MS": str(now)}
    env.pop("LOGCOMPACT_CATALOG", None)

    def status(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "logcompact", "status", *args], capture_output=True, text=True, env=env, timeout=120)

    document = json.loads(status("--json", "--worst", "3", "--topic", "orders", "--topic", "events").stdout)
    assert [(p["topic"], p["partition"]) for p in document["partitions"]] == [("events", 0), ("events", 1), ("orders", 0)]
    assert (document["partitions_total"], document["worst"], document["topics_asked"]) == (6, 3, ["events", "orders"])
    table = status("--worst", "2").stdout.splitlines()
    assert "the worst 2 of 7 partitions, by dirty ratio then compaction delay:" in table
    rows = [line.split()[:2] for line in table if line.startswith(("audit", "events", "orders"))]
    assert rows == [["audit", "0"], ["events", "0"]]
    refused = status("--topic", "clicks")
    assert refused.returncode != 0 and "topic 'clicks' is not compacted" in refused.stderr and len(refused.stderr.strip().splitlines()) == 1
