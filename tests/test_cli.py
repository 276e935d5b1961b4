"""The CLI contract, exercised as users script it: a real `logcompact` process, JSON lines in and out.

The store-parametrized tests run on a file:// store with its embedded SQLite catalog and on an s3:// store
(RGW) with its catalog on PostgreSQL, named by LOGCOMPACT_CATALOG.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys

import pytest

from logcompact.catalog import Catalog
from logcompact.store import LocalStore

NOW = "1700000000000"


def run(env: dict[str, str], *args: str, stdin: str = "", expect: int = 0) -> list[dict]:
    done = subprocess.run(
        [sys.executable, "-m", "logcompact", *args], input=stdin, capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == expect, done.stderr
    if expect:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr  # one-line errors
        return [{"error": lines[0]}]
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.fixture
def env(request, store_uri_env) -> dict[str, str]:
    uri, environment = store_uri_env
    environment = {k: v for k, v in environment.items() if k != "LOGCOMPACT_CATALOG"}
    if uri.startswith("s3://"):
        environment["LOGCOMPACT_CATALOG"] = request.getfixturevalue("postgres").create_database()
    return {**environment, "LOGCOMPACT_STORE": uri, "LOGCOMPACT_NOW_MS": NOW}


def _without_catalog() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in ("LOGCOMPACT_STORE", "LOGCOMPACT_CATALOG")}


@pytest.fixture
def local_env(tmp_path, catalog_url: str | None) -> dict[str, str]:
    """A file:// store, its catalog the embedded SQLite or (LOGCOMPACT_CATALOG) a PostgreSQL database."""
    env = {**_without_catalog(), "LOGCOMPACT_STORE": f"file://{tmp_path}/store"}
    if catalog_url:
        env["LOGCOMPACT_CATALOG"] = catalog_url
    return env


def test_topic_produce_consume_files(env: dict[str, str]) -> None:
    (created,) = run(env, "topic", "create", "accounts", "--partitions", "2", "--config", "cleanup.policy=compact", "--config", "delete.retention.ms=1000")
    assert created["config"]["cleanup.policy"] == "compact" and created["config"]["delete.retention.ms"] == 1000
    assert created["created_ms"] == int(NOW)
    run(env, "topic", "create", "clicks", "--partitions", "1")
    assert [t["name"] for t in run(env, "topic", "list")] == ["accounts", "clicks"]

    lines = [
        {"partition": 0, "key": "a", "value": "1", "headers": {"trace": "x"}},
        {"partition": 1, "key": "b", "value": None, "timestamp": 5},
        {"partition": 0, "key_b64": base64.b64encode(b"\xff\x00").decode(), "value_b64": base64.b64encode(b"\x80").decode()},
    ]
    produced = run(env, "produce", "accounts", stdin="\n".join(json.dumps(line) for line in lines) + "\n")
    assert produced == [{"partition": 0, "offset": 0}, {"partition": 1, "offset": 0}, {"partition": 0, "offset": 1}]

    assert run(env, "consume", "accounts", "--partition", "0") == [
        {"offset": 0, "timestamp": int(NOW), "key": "a", "value": "1", "headers": {"trace": "x"}},
        {"offset": 1, "timestamp": int(NOW), "key_b64": "/wA=", "value_b64": "gA==", "headers": {}},
    ]
    assert run(env, "consume", "accounts", "--partition", "1") == [
        {"offset": 0, "timestamp": 5, "key": "b", "value": None, "headers": {}}
    ]
    assert [r["offset"] for r in run(env, "consume", "accounts", "--partition", "0", "--from-offset", "1")] == [1]
    assert run(env, "consume", "accounts", "--partition", "0", "--to-offset", "1")[-1]["offset"] == 0

    (live,) = run(env, "files", "--level", "0")
    assert live["level"] == 0 and live["record_count"] == 3 and live["created_ms"] == int(NOW)
    assert run(env, "files", "--level", "1") == []
    (described,) = run(env, "topic", "describe", "accounts")
    assert described["next_offsets"] == [2, 1]
    # The commit log, newest first: the cluster, two topics, one append.
    assert [c["operation"] for c in run(env, "log")] == ["append", "create topic clicks", "create topic accounts", "create"]
    assert [c["version"] for c in run(env, "log", "--limit", "2")] == [4, 3]

    # cleanup.policy changes as in Kafka; a deleted topic's name is free again.
    (altered,) = run(env, "topic", "alter", "clicks", "--config", "cleanup.policy=compact")
    assert altered["config"]["cleanup.policy"] == "compact"
    assert run(env, "topic", "delete", "clicks") == [{"deleted": "clicks", "version": 6}]
    assert [t["name"] for t in run(env, "topic", "list")] == ["accounts"]
    run(env, "topic", "create", "clicks", "--partitions", "3")
    assert run(env, "topic", "describe", "clicks")[0]["next_offsets"] == [0, 0, 0]


def test_kafka_topic_configs_not_applied_are_taken_at_kafkas_default_as_the_agent_takes_them(env: dict[str, str]) -> None:
    """A topic copied from Kafka names configs the product does not apply (topic_configs): at Kafka's default they are
    taken and left out, as by the agent's CreateTopics and AlterConfigs; another value is the agent's INVALID_CONFIG line."""
    at_default = ["segment.bytes=1073741824", "retention.bytes=-1", "unclean.leader.election.enable=FALSE", "compression.type=producer"]
    (created,) = run(env, "topic", "create", "copied", "--partitions", "1", "--config", "cleanup.policy=compact",
                     *(arg for config in at_default for arg in ("--config", config)))
    assert created["config"]["cleanup.policy"] == "compact" and not {"segment.bytes", "retention.bytes"} & set(created["config"])
    (altered,) = run(env, "topic", "alter", "copied", "--config", "segment.bytes=1073741824", "--config", "min.compaction.lag.ms=5")
    assert altered["config"]["min.compaction.lag.ms"] == 5 and "segment.bytes" not in altered["config"]
    for command in (["create", "other", "--partitions", "1"], ["alter", "copied"]):
        (error,) = run(env, "topic", *command, "--config", "segment.bytes=1", expect=1)
        assert error["error"].endswith(
            "segment.bytes='1' is not taken: the agent's flushes and the compactions' target sizes make the files; give 1073741824 or leave it out")
        (error,) = run(env, "topic", *command, "--config", "retention.bytes=1000", expect=1)
        assert error["error"].endswith("retention.bytes='1000' is not taken: topics here have no size limit; give -1 or leave it out")
    assert [t["name"] for t in run(env, "topic", "list")] == ["copied"]


@pytest.mark.parametrize(
    "args, stdin, message",
    [
        (["produce", "accounts"], '{"partition": 0, "key": null, "value": "v"}\n', "record 0 of compacted topic 'accounts' has no key"),
        (["produce", "accounts"], '{"partition": 0, "key": "k"}\nnot json\n', "line 2: not JSON"),
        (["produce", "accounts"], '{"partition": 9, "key": "k"}\n', "partition 9 is not in 0 to 1"),
        (["produce", "nope"], '{"partition": 0, "key": "k"}\n', "topic 'nope' does not exist"),
        (["consume", "accounts", "--partition", "5"], "", "has partitions 0 to 1, not 5"),
        (["topic", "create", "accounts", "--partitions", "1"], "", "topic 'accounts' already exists"),
        (["topic", "create", "x", "--partitions", "1", "--config", "retention.ms=-5"], "", "retention.ms=-5 is out of range"),
        (["topic", "delete", "nope"], "", "topic 'nope' does not exist"),
    ],
)
def test_bad_input_is_one_line_and_changes_nothing(env: dict[str, str], args, stdin, message) -> None:
    run(env, "topic", "create", "accounts", "--partitions", "2", "--config", "cleanup.policy=compact")
    (error,) = run(env, *args, stdin=stdin, expect=1)
    assert error["error"].startswith("logcompact: error: ") and message in error["error"]
    assert run(env, "files") == []
    assert run(env, "topic", "describe", "accounts")[0]["next_offsets"] == [0, 0]


def test_usage_errors_and_help(tmp_path) -> None:
    env = _without_catalog()
    (error,) = run(env, "topic", "list", expect=2)
    assert "no store given: pass --store URI or set LOGCOMPACT_STORE" in error["error"]
    for command in (["--help"], ["topic", "create", "--help"], ["produce", "--help"], ["consume", "--help"], ["files", "--help"]):
        done = subprocess.run([sys.executable, "-m", "logcompact", *command], capture_output=True, text=True, env=env)
        assert done.returncode == 0 and "Usage: logcompact" in done.stdout
    top = subprocess.run([sys.executable, "-m", "logcompact", "--help"], capture_output=True, text=True, env=env).stdout
    assert "--catalog URL" in top and "LOGCOMPACT_CATALOG" in top and "postgresql+psycopg://" in top
    (error,) = run(env, "--store", f"file://{tmp_path}/none", "topic", "list", expect=1)
    assert "no logcompact cluster in" in error["error"]


def test_catalog_option_puts_the_catalog_on_postgresql(tmp_path, postgres) -> None:
    url = postgres.create_database()
    env = {**_without_catalog(), "LOGCOMPACT_NOW_MS": NOW}
    store = ["--store", f"file://{tmp_path}/store", "--catalog", url]
    run(env, *store, "topic", "create", "t", "--partitions", "2")
    produced = run(env, *store, "produce", "t", stdin='{"partition": 1, "key": "k", "value": "v"}\n{"partition": 1, "value": "w"}\n')
    assert produced == [{"partition": 1, "offset": 0}, {"partition": 1, "offset": 1}]
    assert [(r["offset"], r["value"]) for r in run(env, *store, "consume", "t", "--partition", "1")] == [(0, "v"), (1, "w")]
    assert run(env, *store, "topic", "describe", "t")[0]["next_offsets"] == [0, 2]
    assert not (tmp_path / "store" / "catalog.db").exists()  # the store holds data only: the catalog is on PostgreSQL
    (live,) = Catalog(LocalStore(tmp_path / "store"), url).snapshot().file_summaries()
    assert (tmp_path / "store" / live.key).exists()
    # Without --catalog the same store has no cluster: its embedded catalog is another one.
    (error,) = run(env, "--store", f"file://{tmp_path}/store", "topic", "list", expect=1)
    assert "no logcompact cluster in" in error["error"]


def test_an_empty_produce_writes_nothing(tmp_path) -> None:
    env = {**_without_catalog(), "LOGCOMPACT_STORE": f"file://{tmp_path}/store", "LOGCOMPACT_NOW_MS": NOW}
    run(env, "topic", "create", "t", "--partitions", "1")
    versions = run(env, "log")
    for stdin in ("", "\n", "  \r\n\t\n"):  # no lines, or blank ones only
        assert run(env, "produce", "t", stdin=stdin) == []
    assert run(env, "log") == versions and run(env, "files") == []
    assert not (tmp_path / "store" / "data").exists()


def test_produce_reads_utf8_lines(tmp_path) -> None:
    """Input is read as bytes and decoded line by line: UTF-8 text, escaped surrogate pairs and CRLF endings
    are accepted as before."""
    env = {**_without_catalog(), "LOGCOMPACT_STORE": f"file://{tmp_path}/store", "LOGCOMPACT_NOW_MS": NOW}
    run(env, "topic", "create", "t", "--partitions", "1")
    lines = '{"partition": 0, "key": "café", "value": "\\ud83d\\ude00", "headers": {"ключ": "值"}}\r\n{"partition": 0, "key": "k"}\r\n'
    assert run(env, "produce", "t", stdin=lines) == [{"partition": 0, "offset": 0}, {"partition": 0, "offset": 1}]
    first, second = run(env, "consume", "t", "--partition", "0")
    assert (first["key"], first["value"], first["headers"]) == ("café", "\U0001f600", {"ключ": "值"})
    assert (second["key"], second["value"]) == ("k", None)


def test_catalog_from_the_environment(tmp_path) -> None:
    catalog_db = tmp_path / "elsewhere" / "catalog.db"
    catalog_db.parent.mkdir()
    env = {**_without_catalog(), "LOGCOMPACT_STORE": f"file://{tmp_path}/store", "LOGCOMPACT_CATALOG": f"sqlite:///{catalog_db}"}
    run(env, "topic", "create", "t", "--partitions", "1")
    run(env, "produce", "t", stdin='{"partition": 0, "value": "v"}\n')
    assert [r["value"] for r in run(env, "consume", "t", "--partition", "0")] == ["v"]
    assert catalog_db.exists() and not (tmp_path / "store" / "catalog.db").exists()
    # --catalog overrides the environment.
    (error,) = run(env, "--catalog", f"sqlite:///{tmp_path}/other.db", "topic", "list", expect=1)
    assert "no logcompact cluster in" in error["error"]


def test_a_missing_or_bad_catalog_is_one_line(tmp_path) -> None:
    env = _without_catalog()
    (error,) = run(env, "--store", "s3://bucket/cluster", "topic", "create", "t", "--partitions", "1", expect=1)
    assert error["error"].startswith("logcompact: error: store s3://bucket/cluster needs a catalog database: pass --catalog")
    assert "LOGCOMPACT_CATALOG" in error["error"]
    (error,) = run(env, "--store", f"file://{tmp_path}", "--catalog", "mysql://x/y", "topic", "list", expect=1)
    assert "the catalog runs on sqlite or postgresql+psycopg, not mysql" in error["error"]
    unreachable = "postgresql+psycopg://user:s3cret@127.0.0.1:1/catalog"
    (error,) = run(env, "--store", f"file://{tmp_path}", "--catalog", unreachable, "topic", "create", "t", "--partitions", "1", expect=1)
    assert "cannot be reached or read (connection failed" in error["error"] and "check --catalog" in error["error"]
    assert "s3cret" not in error["error"]


def test_plan_compact_and_gc(tmp_path, local_env: dict[str, str]) -> None:
    env = local_env
    run(env, "topic", "create", "accounts", "--partitions", "1", "--config", "cleanup.policy=compact")
    for round_ in range(4):
        lines = [json.dumps({"partition": 0, "key": f"k{i}", "value": f"{round_}", "timestamp": 1000}) for i in range(5)]
        run(env, "produce", "accounts", "--now", "1000", stdin="\n".join(lines))
    assert run(env, "plan", "--now", "2000") == []  # 4 L0 files: under the default 32
    (plan,) = run(env, "plan", "--min-files", "4", "--now", "2000")
    assert (plan["target_level"], plan["deduplicate"], len(plan["inputs"])) == (1, False, 4)
    (tmp_path / "plan.json").write_text(json.dumps(plan))
    (copied,) = run(env, "compact", "--plan", str(tmp_path / "plan.json"), "--now", "2000")
    assert copied["committed"] and copied["records_out"] == 20 and copied["gets"] == 4  # a copy: one GET a file
    (again,) = run(env, "compact", "--plan", str(tmp_path / "plan.json"), "--now", "2000")
    assert again == {"plan_id": plan["plan_id"], "committed": False}  # the same plan twice: a no-op

    (full,) = run(env, "compact", "--full", "--topics", "accounts", "--now", "3000")
    assert full["records_out"] == 5 and full["duplicates_removed"] == 15
    assert [(r["key"], r["value"]) for r in run(env, "consume", "accounts", "--partition", "0")] == [
        (f"k{i}", "3") for i in range(5)
    ]
    assert [f["level"] for f in run(env, "files")] == [2]
    (report,) = run(env, "gc", "--now", "3000")
    assert report == {"deleted_files": [], "trimmed_versions": 0, "kept_unreferenced_young": 0, "released_leases": [],
                      "deleted_plans": [], "reclaimed_workdirs": [], "abandoned_writes": [], "released_abandoned": [],
                      "awaiting_commit": [], "unexplained": [], "damaged_rows": [], "kept_orphans": [],
                      "forgotten_aborted_ranges": 0}

    (error,) = run(env, "compact", "--all", "--full", expect=2)
    assert "choose exactly one of --plan FILE, --all, --until-idle, --full" in error["error"]
    stale = {**plan, "plan_id": "p2000-00000000abcd"}  # a different plan over inputs that are gone
    (tmp_path / "stale.json").write_text(json.dumps(stale))
    (error,) = run(env, "compact", "--plan", str(tmp_path / "stale.json"), "--now", "2000", expect=1)
    assert "expected input data/l0/" in error["error"] and "plan again" in error["error"]
    (tmp_path / "bad.json").write_text('{"format": 4}')
    (error,) = run(env, "compact", "--plan", str(tmp_path / "bad.json"), expect=1)
    assert "plan field 'inputs' is missing; plan again" in error["error"]
    (tmp_path / "old.json").write_text('{"format": 3}')
    (error,) = run(env, "compact", "--plan", str(tmp_path / "old.json"), expect=1)
    assert "plan format 3 is not supported (expected 4); plan again" in error["error"]


def test_plans_written_to_a_directory_as_stored_and_run_from_it(tmp_path, local_env: dict[str, str]) -> None:
    env = local_env
    run(env, "topic", "create", "t", "--partitions", "4", "--config", "cleanup.policy=compact")
    for round_ in range(3):
        lines = [json.dumps({"partition": i % 4, "key": f"k{i}", "value": f"{round_}", "timestamp": 1000}) for i in range(8)]
        run(env, "produce", "t", "--now", "1000", stdin="\n".join(lines))
    out = tmp_path / "plans"
    (written,) = run(env, "plan", "--mode", "full", "--group-bytes", "1", "--out", str(out), "--now", "2000")  # a group a partition
    directory = out / written["plan_id"]
    documents = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    assert documents == ["groups/g000.arrow", "groups/g001.arrow", "groups/g002.arrow", "groups/g003.arrow", "inputs.arrow", "plan.json"]
    assert written == {"plan_id": written["plan_id"], "plan": str(directory), "groups": 4, "inputs": 3,
                       "bytes": sum((directory / name).stat().st_size for name in documents)}
    (error,) = run(env, "compact", "--plan", str(directory / "plan.json"), expect=1)
    assert "this is the header of a stored plan" in error["error"] and "pass the plan's directory" in error["error"]
    (error,) = run(env, "compact", "--plan", str(tmp_path), expect=2)
    assert "holds no plan" in error["error"]
    (error,) = run(env, "plan", "--dry-run", "--out", str(out), expect=2)
    assert "--dry-run writes nothing and --out writes plans: choose one" in error["error"]

    inputs = run(env, "files")
    (job,) = run(env, "compact", "--plan", str(out), "--now", "2000")  # every plan of the directory
    assert job["plan_id"] == written["plan_id"] and job["committed"] and job["groups"] == 4 and job["records_out"] == 8
    assert job["bytes_in"] == sum(f["size"] for f in inputs)  # each file once, though every group read it
    (again,) = run(env, "compact", "--plan", str(directory), "--now", "2000")  # one plan's directory
    assert again == {"plan_id": written["plan_id"], "committed": False}


def test_compact_until_idle_cascades_levels(local_env: dict[str, str]) -> None:
    env = {**local_env, "LOGCOMPACT_NOW_MS": "5000"}
    run(env, "topic", "create", "t", "--partitions", "2", "--config", "cleanup.policy=compact")
    for round_ in range(2):
        run(env, "produce", "t", stdin="\n".join(json.dumps({"partition": i % 2, "key": f"k{i}", "value": f"{round_}"}) for i in range(6)))
    jobs = run(env, "compact", "--until-idle", "--min-files", "1")
    assert [j["target_level"] for j in jobs] == [1, 2]  # a small cluster's top level is L2
    assert [f["level"] for f in run(env, "files")] == [2]
    assert sorted(r["value"] for p in (0, 1) for r in run(env, "consume", "t", "--partition", str(p))) == ["1"] * 6


def test_plan_modes_and_dry_run(local_env: dict[str, str]) -> None:
    env = {**local_env, "LOGCOMPACT_NOW_MS": "1700000000000"}
    run(env, "topic", "create", "t", "--partitions", "2", "--config", "cleanup.policy=compact", "--config", "max.compaction.lag.ms=7200000")
    for round_ in range(3):
        run(env, "produce", "t", stdin="\n".join(json.dumps({"partition": i % 2, "key": f"k{i % 10}", "value": f"{round_}"}) for i in range(100)))
    (effect,) = run(env, "plan", "--mode", "full", "--dry-run")
    assert effect["files_replaced"] == 3 and effect["records_in"] == 300 and effect["groups"] == 1
    assert 260 <= effect["estimated_records_removed"] <= 300  # 280: 20 keys survive of 300 records
    assert run(env, "plan", "--mode", "max-lag") == []  # nothing is dirty yet
    (due,) = run(env, "plan", "--mode", "max-lag", "--now", str(1700000000000 + 7200000 + 15 * 60000))  # dirty 15 min
    assert due["mode"] == "max-lag" and len(due["inputs"]) == 3
    (error,) = run(env, "plan", "--topics", "t", expect=2)
    assert "--topics: topics can only be chosen for the max-lag and full modes" in error["error"]
    (error,) = run(env, "plan", "--mode", "sideways", expect=2)
    assert "'sideways' is not one of" in error["error"]


def test_tour_produces_consumes_and_sweeps(local_env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "logcompact", "tour", "--records", "3000"], capture_output=True, text=True, env=local_env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].startswith("cluster ") and "topics accounts (compact), clicks (delete), sessions (compact,delete)" in lines[0]
    assert "produced 3,000 records" in lines[1]
    assert sum(line.startswith("verified: ") for line in lines) == 2
    assert any(line.startswith("full sweep into L2: 3,000 records in") for line in lines)
    (error,) = run(local_env, "tour", "--records", "3000", expect=1)  # its topics exist now
    assert "topic 'accounts' already exists" in error["error"] and "run the tour on an empty store" in error["error"]


def test_uncleanable_partitions_are_listed_and_cleared(tmp_path) -> None:
    import sqlite3

    env = {**_without_catalog(), "LOGCOMPACT_STORE": f"file://{tmp_path}/store", "LOGCOMPACT_NOW_MS": "1700000000000"}
    run(env, "topic", "create", "t", "--partitions", "3", "--config", "cleanup.policy=compact")
    for _ in range(2):
        lines = "".join(json.dumps({"partition": n % 3, "key": f"k{n % 7}", "value": f"v{n}"}) + "\n" for n in range(30))
        run(env, "produce", "t", stdin=lines)
    with sqlite3.connect(tmp_path / "store" / "catalog.db") as database:  # one section's catalog row goes wrong
        database.execute("UPDATE sections SET crc32 = crc32 + 1 WHERE partition = 1 AND file_id = 2")

    (stats,) = run(env, "compact", "--full")
    assert stats["committed"] and [(u["topic"], u["partition"]) for u in stats["uncleanable"]] == [("t", 1)]
    *marks, totals = run(env, "uncleanable", "list")
    assert [(m["topic"], m["partition"], m["failures"], m["held"]) for m in marks] == [("t", 1, 1, True)]
    assert totals["uncleanable_partitions_count"] == 1 and totals["uncleanable_bytes"] > 0
    (error,) = run(env, "uncleanable", "clear", "t/2", expect=1)
    assert "t/2 not marked uncleanable (nothing cleared)" in error["error"]
    assert run(env, "uncleanable", "clear", "t/1") == [{"cleared": ["t/1"]}]
    assert run(env, "uncleanable", "list") == [{"uncleanable_partitions_count": 0, "uncleanable_bytes": 0}]
