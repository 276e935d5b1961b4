"""A store and its catalog bound together: the store's cluster marker against the catalog's cluster id
and version, gc that deletes only what the catalog accounts for, and cross-checks of damaged catalog rows.

Each case is run as an operator runs it: real `logcompact` processes on a file:// store with its SQLite catalog,
then the catalog's rows damaged with plain SQL. Every refusal is one line on stderr, a non-zero exit, and every
object of the store survives it.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logcompact.catalog import DEFAULT_KEEP_VERSIONS, Catalog
from logcompact.catalog.identity import check_store_cluster, read_marker
from logcompact.exceptions import ClusterMismatchError
from logcompact.jobs import collect_garbage
from logcompact.keys import MARKER_KEY
from logcompact.store import LocalStore


def logcompact(store: Path, *args: str, catalog: str | None = None, stdin: str = "", env: dict | None = None,
               expect: int = 0) -> list[dict] | str:
    """Run the CLI; its JSON lines, or (expect != 0) its one-line error."""
    environment = {k: v for k, v in os.environ.items() if k not in ("LOGCOMPACT_STORE", "LOGCOMPACT_CATALOG", "LOGCOMPACT_NOW_MS")}
    environment.update(env or {})
    command = [sys.executable, "-m", "logcompact", "--store", f"file://{store}"]
    if catalog:
        command += ["--catalog", catalog]
    done = subprocess.run([*command, *args], input=stdin, capture_output=True, text=True, env=environment, timeout=120)
    assert done.returncode == expect, (done.stdout, done.stderr)
    if expect:
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in done.stderr, done.stderr
        return lines[0]
    return [json.loads(line) for line in done.stdout.splitlines()]


def objects(store: Path) -> dict[str, bytes]:
    return {str(p.relative_to(store)): p.read_bytes() for p in store.rglob("*") if p.is_file() and not p.name.startswith("catalog.db")}


def make_cluster(store: Path, records: int = 1) -> None:
    logcompact(store, "topic", "create", "t", "--partitions", "1", "--config", "cleanup.policy=compact")
    lines = "".join(json.dumps({"partition": 0, "key": f"k{n}", "value": str(n)}) + "\n" for n in range(records))
    logcompact(store, "produce", "t", stdin=lines)


@pytest.fixture
def two_clusters(tmp_path: Path) -> tuple[Path, Path]:
    this, other = tmp_path / "S", tmp_path / "O"
    make_cluster(this)
    logcompact(other, "topic", "create", "t", "--partitions", "1", "--config", "cleanup.policy=compact")
    return this, other


def test_gc_with_another_cluster_s_catalog_deletes_nothing(two_clusters: tuple[Path, Path]) -> None:
    """The case that made the marker: gc pointed at another cluster's catalog took every object for an orphan."""
    this, other = two_clusters
    before = objects(this)
    error = logcompact(this, "gc", "--grace-ms", "0", catalog=f"sqlite:///{other}/catalog.db", expect=1)
    assert "belongs to cluster" in error and "holds cluster" in error and "nothing was written or deleted" in error
    error = logcompact(this, "gc", "--grace-ms", "0", env={"LOGCOMPACT_CATALOG": f"sqlite:///{other}/catalog.db"}, expect=1)
    assert "belongs to cluster" in error
    assert objects(this) == before
    assert [r["value"] for r in logcompact(this, "consume", "t", "--partition", "0")] == ["0"]


def test_every_writer_refuses_another_cluster_s_catalog(two_clusters: tuple[Path, Path]) -> None:
    this, other = two_clusters
    wrong = f"sqlite:///{other}/catalog.db"
    before, other_before = objects(this), objects(other)
    record = json.dumps({"partition": 0, "key": "x", "value": "y"}) + "\n"
    for args, stdin in [
        (("produce", "t"), record), (("compact", "--full"), ""), (("topic", "create", "u", "--partitions", "1"), ""),
        (("topic", "alter", "t", "--config", "retention.ms=1000"), ""), (("uncleanable", "clear", "--all"), ""),
    ]:
        error = logcompact(this, *args, catalog=wrong, stdin=stdin, expect=1)
        assert "belongs to cluster" in error, args
    assert objects(this) == before and objects(other) == other_before
    assert logcompact(other, "files") == []  # nothing of this store reached the other cluster's catalog


def test_a_swapped_catalog_db_is_refused(two_clusters: tuple[Path, Path]) -> None:
    this, other = two_clusters
    before = objects(this)
    shutil.copy(other / "catalog.db", this / "catalog.db")
    error = logcompact(this, "gc", "--grace-ms", "0", expect=1)
    assert "belongs to cluster" in error
    assert objects(this) == before


def test_a_restored_older_catalog_is_refused_until_the_operator_accepts_it(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store)
    shutil.copy(store / "catalog.db", tmp_path / "backup.db")
    logcompact(store, "produce", "t", stdin=json.dumps({"partition": 0, "key": "new", "value": "v"}) + "\n")
    logcompact(store, "compact", "--full")
    before = objects(store)
    shutil.copy(tmp_path / "backup.db", store / "catalog.db")
    for args in (("gc", "--grace-ms", "0"), ("produce", "t"), ("consume", "t", "--partition", "0")):
        error = logcompact(store, *args, stdin='{"partition": 0, "key": "a", "value": "b"}\n', expect=1)
        assert "restored from an older copy" in error and "accept-catalog --cluster-id ID" in error, args
    assert objects(store) == before

    (described,) = logcompact(store, "cluster", "describe")  # what the operator checks first
    assert "restored from an older copy" in described["refused"] and described["marker"]["cluster_id"] == described["cluster_id"]
    (accepted,) = logcompact(store, "cluster", "accept-catalog", "--cluster-id", described["cluster_id"])
    assert accepted["accepted"] is True
    report = logcompact(store, "gc", "--grace-ms", "0")[0]
    # The files of the newer commits were written after the restored catalog's newest commit: it cannot account
    # for them, so they stay, listed.
    assert report["deleted_files"] == [] and len(report["awaiting_commit"]) == 2  # the newer L0 file, the sweep's output
    assert {k for k in objects(store) if k.startswith("data/")} == {k for k in before if k.startswith("data/")}


def test_a_store_without_a_marker_is_marked_only_when_the_catalog_agrees(tmp_path: Path) -> None:
    store, other = tmp_path / "S", tmp_path / "O"
    make_cluster(store)
    make_cluster(other)
    (store / MARKER_KEY).unlink()  # a store made before markers
    (marked,) = logcompact(store, "cluster", "describe")
    assert json.loads((store / MARKER_KEY).read_text())["cluster_id"] == marked["cluster_id"]

    (store / MARKER_KEY).unlink()
    error = logcompact(store, "files", catalog=f"sqlite:///{other}/catalog.db", expect=1)
    assert "has no cluster marker and does not hold file" in error
    assert not (store / MARKER_KEY).exists()


def test_a_store_without_its_marker_takes_another_cluster_s_catalog_only_by_its_cluster_id(tmp_path: Path) -> None:
    """accept-catalog names the cluster the operator checked the catalog holds: a catalog of another cluster is not
    taken for the store's by a slip (its gc would delete the store's files as orphans)."""
    store, other = tmp_path / "S", tmp_path / "O"
    make_cluster(store)
    make_cluster(other)
    ours = json.loads((store / MARKER_KEY).read_text())["cluster_id"]
    theirs = json.loads((other / MARKER_KEY).read_text())["cluster_id"]
    (store / MARKER_KEY).unlink()
    before = objects(store)
    wrong = f"sqlite:///{other}/catalog.db"
    error = logcompact(store, "files", catalog=wrong, expect=1)
    assert "does not hold file" in error and "`logcompact cluster describe` prints for the catalog" in error
    assert "accept-catalog --cluster-id ID" in error
    (described,) = logcompact(store, "cluster", "describe", catalog=wrong)
    assert described["cluster_id"] == theirs and described["marker"] is None and "does not hold file" in described["refused"]
    assert "Missing option '--cluster-id'" in logcompact(store, "cluster", "accept-catalog", catalog=wrong, expect=2)
    error = logcompact(store, "cluster", "accept-catalog", "--cluster-id", ours, catalog=wrong, expect=1)
    assert f"holds cluster {theirs}, not {ours} (--cluster-id)" in error and "nothing was written" in error
    assert objects(store) == before  # no marker written: every command still refuses the other cluster's catalog
    assert "does not hold file" in logcompact(store, "gc", "--grace-ms", "0", catalog=wrong, expect=1)
    assert objects(store) == before
    # Its own catalog: named by another id, refused before anything is written; by its own, accepted.
    assert f"holds cluster {ours}, not {theirs}" in logcompact(store, "cluster", "accept-catalog", "--cluster-id", theirs, expect=1)
    assert not (store / MARKER_KEY).exists()
    (accepted,) = logcompact(store, "cluster", "accept-catalog", "--cluster-id", ours)
    assert accepted == {"accepted": True, "cluster_id": ours, "seen_version": accepted["seen_version"]}


def test_a_damaged_marker_is_one_line(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store)
    cluster_id = json.loads((store / MARKER_KEY).read_text())["cluster_id"]
    (store / MARKER_KEY).write_text("{not json")
    assert "cluster marker cluster.json" in logcompact(store, "files", expect=1)
    logcompact(store, "cluster", "accept-catalog", "--cluster-id", cluster_id)
    assert logcompact(store, "consume", "t", "--partition", "0")[0]["value"] == "0"


def test_a_lowered_next_offset_never_hands_an_offset_out_twice(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store, records=3)
    with sqlite3.connect(store / "catalog.db") as db:
        db.execute("UPDATE partitions SET next_offset = 1")
    error = logcompact(store, "produce", "t", stdin='{"partition": 0, "key": "a", "value": "again"}\n', expect=1)
    assert "catalog row partitions ('t', partition 0) has next_offset 1" in error and "up to 2" in error
    error = logcompact(store, "consume", "t", "--partition", "0", expect=1)  # readers do not trust the row either
    assert "ends past the partition's next offset 1" in error
    with sqlite3.connect(store / "catalog.db") as db:
        assert db.execute("SELECT count(*) FROM files").fetchone() == (1,)  # the refused append wrote no row


def test_a_lowered_catalog_version_is_refused_by_readers_and_writers(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store)
    logcompact(store, "produce", "t", stdin='{"partition": 0, "key": "k0", "value": "newer"}\n')
    logcompact(store, "compact", "--full")
    version = logcompact(store, "cluster", "describe")[0]["catalog_version"]
    with sqlite3.connect(store / "catalog.db") as db:
        db.execute("UPDATE catalog_info SET version = ?", (version - 2,))
    (store / MARKER_KEY).unlink()  # so that only the commit log can tell
    for args in (("consume", "t", "--partition", "0"), ("produce", "t"), ("files",)):
        error = logcompact(store, *args, stdin='{"partition": 0, "key": "a", "value": "b"}\n', expect=1)
        assert f"catalog_info.version is {version - 2} but the commit log (versions) holds version {version}" in error, args


def test_a_topics_row_that_is_not_json_is_one_line_for_every_command(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store)
    with sqlite3.connect(store / "catalog.db") as db:
        db.execute("UPDATE topics SET config = '{broken'")
    for args in (("topic", "list"), ("consume", "t", "--partition", "0"), ("compact", "--full"), ("status",)):
        error = logcompact(store, *args, expect=1)
        assert "catalog row topics 't'" in error and "is not a topic config" in error, args


def test_gc_leaves_a_removed_row_whose_key_is_not_a_data_file_and_collects_the_rest(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store)
    logcompact(store, "produce", "t", stdin='{"partition": 0, "key": "k0", "value": "newer"}\n')
    logcompact(store, "compact", "--full")
    with sqlite3.connect(store / "catalog.db") as db:
        removed = [key for (key,) in db.execute("SELECT key FROM files WHERE removed_version IS NOT NULL ORDER BY key")]
        # As after DEFAULT_KEEP_VERSIONS more commits (their commit log entries alone): the removed files are out of the
        # kept versions. (A removed_version lowered instead would be no compaction's: a damaged row, whose file gc keeps.)
        (version,) = db.execute("SELECT version FROM catalog_info").fetchone()
        later = range(version + 1, version + 1 + DEFAULT_KEEP_VERSIONS)
        db.executemany("INSERT INTO versions (version, commit_id, created_ms, operation) VALUES (?, ?, 0, 'append')",
                       [(number, f"later-{number}") for number in later])
        db.execute("UPDATE catalog_info SET version = ?", (later[-1],))
        db.execute("UPDATE files SET key = '../../outside.seg' WHERE key = ?", (removed[0],))
    (store.parent / "outside.seg").write_bytes(b"not the store's")
    now = str(int(time.time() * 1000) + 7_200_000)
    for _ in range(2):  # gc is not blocked for good
        error = logcompact(store, "gc", "--grace-ms", "0", env={"LOGCOMPACT_NOW_MS": now}, expect=1)
        assert "'../../outside.seg'" in error and "gc deleted no object they may name and collected the rest" in error
    assert (store.parent / "outside.seg").exists()
    assert not (store / removed[1]).exists()  # the other removed file went


def test_gc_deletes_no_orphan_when_most_of_the_store_looks_orphaned(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "S")
    make_cluster(store.root)
    catalog = Catalog(store)
    leftovers = [f"data/l0/{1700000000000 + n:013d}-{n:032x}.seg" for n in range(12)]
    for key in leftovers:
        store.put(key, b"an agent died before committing this")
    later = int(time.time() * 1000) + 600_000  # a commit after them, by more than clocks may differ
    logcompact(store.root, "produce", "t", stdin='{"partition": 0, "key": "k", "value": "v"}\n', env={"LOGCOMPACT_NOW_MS": str(later)})
    with pytest.raises(ClusterMismatchError, match=r"12 of the 14 objects under data/ .* gc deleted none"):
        collect_garbage(catalog, later, grace_ms=0)
    assert all(store.stat(key) for key in leftovers)
    report = collect_garbage(catalog, later, grace_ms=0, max_orphan_share=1)
    assert sorted(report.deleted_files) == leftovers


def test_an_l0_object_newer_than_the_catalog_s_newest_commit_is_kept(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "S")
    make_cluster(store.root, records=2)
    time.sleep(0.01)
    unknown = f"data/l0/{int(time.time() * 1000):013d}-{7:032x}.seg"
    store.put(unknown, b"written after the catalog's newest commit")
    odd = "data/l1/not-a-plan-output.bin"
    store.put(odd, b"no logcompact writer names a file so")
    report = collect_garbage(Catalog(store), int(time.time() * 1000) + 10_000, grace_ms=0)
    assert report.deleted_files == [] and report.awaiting_commit == [unknown] and report.unexplained == [odd]
    assert store.stat(unknown) and store.stat(odd)


def test_a_spark_job_refuses_a_store_of_another_cluster(two_clusters: tuple[Path, Path]) -> None:
    this, other = two_clusters
    store = LocalStore(this)
    marker = read_marker(store)
    assert marker is not None
    check_store_cluster(store, marker.cluster_id, "plan p1")
    with pytest.raises(ClusterMismatchError, match=r"plan p1 is of cluster .* but store .* belongs to cluster"):
        check_store_cluster(store, read_marker(LocalStore(other)).cluster_id, "plan p1")  # type: ignore[union-attr]


def test_a_new_cluster_is_never_made_over_a_store_that_has_one(tmp_path: Path) -> None:
    store = tmp_path / "S"
    logcompact(store, "topic", "create", "t", "--partitions", "1")
    (store / "catalog.db").unlink()
    error = logcompact(store, "topic", "create", "u", "--partitions", "1", expect=1)
    assert "holds no cluster but store" in error and "belongs to cluster" in error


def test_a_re_lease_of_an_expired_plan_s_files_drops_its_seal(tmp_path: Path) -> None:
    store = LocalStore(tmp_path / "S")
    make_cluster(store.root)
    catalog = Catalog(store)
    (key,) = [f.key for f in catalog.snapshot().file_summaries()]
    catalog.lease("p1-000000000001", [key], expires_ms=1_000, now_ms=0, seal="a" * 64)
    catalog.lease("p2-000000000002", [key], expires_ms=10**13, now_ms=2_000, seal="b" * 64)  # p1's lease expired
    assert catalog.plan_seal("p1-000000000001") is None and catalog.plan_seal("p2-000000000002") == "b" * 64
    with sqlite3.connect(store.root / "catalog.db") as db:
        db.execute("INSERT INTO plan_seals VALUES ('p3-000000000003', ?)", ("c" * 64,))  # leaked by an older release
    catalog.release_expired_leases(now_ms=3_000)
    assert catalog.plan_seal("p3-000000000003") is None and catalog.plan_seal("p2-000000000002") == "b" * 64


def test_a_lowered_version_with_the_marker_gone_writes_no_marker(tmp_path: Path) -> None:
    store = tmp_path / "S"
    make_cluster(store)
    logcompact(store, "produce", "t", stdin='{"partition": 0, "key": "k0", "value": "newer"}\n')
    with sqlite3.connect(store / "catalog.db") as db:
        db.execute("UPDATE catalog_info SET version = version - 2")
    (store / MARKER_KEY).unlink()
    for args in (("files",), ("log",), ("uncleanable", "list"), ("uncleanable", "clear", "--all")):
        assert "catalog row catalog_info.version is" in logcompact(store, *args, expect=1), args
    assert not (store / MARKER_KEY).exists()


def _three_l0_files(store: Path) -> None:
    logcompact(store, "topic", "create", "t", "--partitions", "2", "--config", "cleanup.policy=compact")
    for n in range(3):
        lines = "".join(json.dumps({"partition": p, "key": f"k{r}", "value": f"{n}.{r}"}) + "\n" for p in (0, 1) for r in range(3))
        logcompact(store, "produce", "t", stdin=lines)


@pytest.mark.parametrize("damage", [
    "UPDATE sections SET record_count = 0 WHERE partition = 0 AND file_id = (SELECT max(file_id) FROM files)",
    "UPDATE sections SET first_offset = first_offset - 1, last_offset = last_offset - 1 "
    "WHERE partition = 0 AND file_id = (SELECT min(file_id) + 1 FROM files)",
], ids=["record_count 0", "shifted over another section"])
def test_a_compaction_sets_a_partition_with_an_impossible_row_aside_and_loses_nothing(tmp_path: Path, damage: str) -> None:
    store = tmp_path / "S"
    _three_l0_files(store)
    with sqlite3.connect(store / "catalog.db") as db:
        db.execute(damage)
    logcompact(store, "compact", "--until-idle", "--min-files", "3")
    marks = logcompact(store, "uncleanable", "list")
    assert [(m["topic"], m["partition"]) for m in marks[:-1]] == [("t", 0)]
    assert "catalog row of section t/0" in logcompact(store, "consume", "t", "--partition", "0", expect=1)
    with sqlite3.connect(store / "catalog.db") as db:  # partition 0's rows all stay live where they were
        live = db.execute(
            "SELECT count(*) FROM sections JOIN files USING (file_id) WHERE partition = 0 AND files.removed_version IS NULL "
            "AND sections.removed_version IS NULL"
        ).fetchone()
    assert live == (3,)
    # Partition 1 was compacted (copied to L1) with every record where it was.
    assert [r["value"] for r in logcompact(store, "consume", "t", "--partition", "1")] == [f"{n}.{r}" for n in range(3) for r in range(3)]


def test_cluster_create_makes_an_empty_cluster_once_that_an_agent_then_serves(tmp_path: Path) -> None:
    """`logcompact cluster create`: the cluster and no topic; run again, the same cluster, nothing changed."""
    store = tmp_path / "store"
    assert "no logcompact cluster in" in logcompact(store, "cluster", "describe", expect=1)
    ((created,),) = [logcompact(store, "cluster", "create")]
    assert created["created"] is True
    assert logcompact(store, "cluster", "create") == [{"cluster_id": created["cluster_id"], "created": False}]
    assert logcompact(store, "cluster", "describe")[0]["cluster_id"] == created["cluster_id"]
    assert logcompact(store, "topic", "list") == []
