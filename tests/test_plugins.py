"""The Airflow plugin classes on their own: the hook's connections (a local store with its embedded SQLite
catalog, a catalog URL in the extra, a `postgres` connection on the real PostgreSQL server, S3 through an
AWS connection to the real RGW), then the sensor's poke and the plan, commit and gc operators on both
databases."""

from __future__ import annotations

import json
import os
import re
import socket
import time
import uuid

import pytest
from airflow.sdk import DAG
from airflow.sdk.exceptions import AirflowFailException, AirflowSkipException
from sqlalchemy.engine import make_url

from logcompact.catalog import Catalog, SetAside
from logcompact.exceptions import CatalogConfigError, CatalogUnavailableError, CommitConflictError, InvalidPlanError, TopicNotFoundError
from logcompact.jobs import prepare_plans, run_group
from logcompact.planner import PlannerConfig
from logcompact.store import LocalStore
from logcompact.store.s3 import S3Store
from logcompact_airflow.hooks.logcompact import LogcompactHook
from logcompact_airflow.operators import compaction as operators
from logcompact_airflow.operators.compaction import (
    COMPACTED_TOPICS,
    LogcompactCommitOperator,
    LogcompactDryRunOperator,
    LogcompactPlanOperator,
    _checked_params,
)
from logcompact_airflow.operators.gc import LogcompactGcOperator
from logcompact_airflow.operators.status import LogcompactMetricsOperator
from logcompact_airflow.policy import failing_at_once
from logcompact_airflow.sensors.threshold import LogcompactThresholdSensor
from tests.helpers import TasksByUri, create_topic, produce_l0_files


def _now_ms() -> int:
    return int(time.time() * 1000)


def _connection(monkeypatch: pytest.MonkeyPatch, conn_id: str, **fields) -> None:
    """An Airflow connection in its JSON environment form."""
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))


def test_hook_opens_a_local_store_with_its_embedded_catalog(tmp_path, monkeypatch) -> None:
    _connection(monkeypatch, "local_store", conn_type="generic", extra={"store": f"file://{tmp_path}"})
    hook = LogcompactHook("local_store")
    store = hook.get_store()
    assert isinstance(store, LocalStore) and store.uri == f"file://{tmp_path}"
    catalog = hook.get_catalog()
    assert catalog.url == f"sqlite:///{tmp_path}/catalog.db"
    create_topic(catalog, "accounts", now=_now_ms())
    assert (tmp_path / "catalog.db").is_file() and set(Catalog(store).snapshot().topics) == {"accounts"}


def test_hook_takes_the_catalog_url_from_its_extra(tmp_path, monkeypatch, postgres) -> None:
    url = postgres.create_database()
    store = LocalStore(tmp_path / "store")
    _connection(monkeypatch, "on_postgres", conn_type="generic", extra={"store": store.uri, "catalog": url})
    catalog = LogcompactHook("on_postgres").get_catalog()
    assert catalog.url == url and catalog.store.uri == store.uri
    create_topic(catalog, "accounts", now=_now_ms())
    assert set(Catalog(store, url).snapshot().topics) == {"accounts"}
    assert not (tmp_path / "store" / "catalog.db").exists()  # nothing embedded beside the store


def test_hook_builds_the_catalog_url_from_a_postgres_connection(tmp_path, monkeypatch, postgres) -> None:
    database = make_url(postgres.create_database()).database
    password = "p@ss:w/rd %#?"  # every character the URL syntax reserves (the server trusts 127.0.0.1 anyway)
    _connection(
        monkeypatch, "logcompact_catalog", conn_type="postgres", host=postgres.host, port=postgres.port,
        login=postgres.user, password=password, schema=database,
    )
    store = LocalStore(tmp_path / "store")
    _connection(monkeypatch, "by_conn_id", conn_type="generic", extra={"store": store.uri, "catalog_conn_id": "logcompact_catalog"})
    catalog = LogcompactHook("by_conn_id").get_catalog()
    url = catalog.engine.url
    assert (url.drivername, url.username, url.password, url.host, url.port, url.database) == (
        "postgresql+psycopg", postgres.user, password, postgres.host, postgres.port, database,
    )
    create_topic(catalog, "accounts", now=_now_ms())
    assert set(Catalog(store, postgres.url_for(database)).snapshot().topics) == {"accounts"}


@pytest.mark.parametrize(
    "extra, catalog_conn, message",
    [
        ({"catalog": "sqlite:////tmp/x.db", "catalog_conn_id": "cat"}, None, r"connection 'bad' names its catalog twice \(catalog and catalog_conn_id\); keep one"),
        ({"catalog_conn_id": "cat"}, {"conn_type": "mysql", "host": "db", "schema": "logcompact"}, r"connection 'cat' \(catalog_conn_id of 'bad'\) is of type 'mysql'; make it a postgres connection"),
        ({"catalog_conn_id": "cat"}, {"conn_type": "postgres", "host": "db"}, r"connection 'cat' .* needs a host and, as its schema, the catalog's database"),
    ],
)
def test_hook_refuses_a_catalog_it_cannot_use(tmp_path, monkeypatch, extra, catalog_conn, message) -> None:
    if catalog_conn:
        _connection(monkeypatch, "cat", **catalog_conn)
    _connection(monkeypatch, "bad", conn_type="generic", extra={"store": f"file://{tmp_path}", **extra})
    with pytest.raises(CatalogConfigError, match=message):
        LogcompactHook("bad").get_catalog()


def test_hook_on_s3_without_a_catalog_says_what_to_pass(monkeypatch) -> None:
    _connection(monkeypatch, "s3_alone", conn_type="aws", login="KEY", password="SECRET",
                extra={"store": "s3://bucket/logs", "endpoint_url": "http://127.0.0.1:9", "region_name": "us-east-1"})
    with pytest.raises(CatalogConfigError) as raised:
        LogcompactHook("s3_alone").get_catalog()
    message = str(raised.value)
    assert "\n" not in message and message.startswith("store s3://bucket/logs needs a catalog database")
    assert "`catalog` in the Airflow connection's extra" in message


def test_hook_opens_s3_through_an_aws_connection_with_its_catalog_on_postgres(rgw, postgres, monkeypatch) -> None:
    bucket, url = f"hook-{uuid.uuid4().hex[:12]}", postgres.create_database()
    rgw.client().create_bucket(Bucket=bucket)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    _connection(monkeypatch, "trial_s3", conn_type="aws", login=rgw.access_key, password=rgw.secret_key,
                extra={"store": f"s3://{bucket}/logs", "endpoint_url": rgw.endpoint_url, "region_name": rgw.region, "catalog": url})
    hook = LogcompactHook("trial_s3")
    store = hook.get_store()
    assert isinstance(store, S3Store) and store.uri == f"s3://{bucket}/logs"
    store.put("probe", b"through the AWS connection")
    assert rgw.client().get_object(Bucket=bucket, Key="logs/probe")["Body"].read() == b"through the AWS connection"
    catalog = hook.get_catalog()
    create_topic(catalog, "accounts", now=_now_ms(), cleanup_policy="compact")
    produce_l0_files(catalog, "accounts", files=1, records=5, keys=5, partitions=1, now=_now_ms())
    (summary,) = catalog.snapshot().file_summaries()
    assert store.stat(summary.key).size == summary.size  # the data in the bucket, its metadata on PostgreSQL


def test_hook_without_a_store_says_what_to_set(monkeypatch) -> None:
    _connection(monkeypatch, "no_store", conn_type="generic", extra={})
    with pytest.raises(ValueError, match=r"connection 'no_store' has no store; set its extra to"):
        LogcompactHook("no_store").get_store()


def test_hook_reads_planner_settings_from_its_extra(tmp_path, monkeypatch) -> None:
    _connection(monkeypatch, "tuned", conn_type="generic",
                extra={"store": f"file://{tmp_path}", "planner": {"group_bytes": 8 * 1024**2, "min_files": [4, 8, 8, 8]}})
    assert LogcompactHook("tuned").get_planner_config() == PlannerConfig(group_bytes=8 * 1024**2, min_files=(4, 8, 8, 8))
    _connection(monkeypatch, "plain", conn_type="generic", extra={"store": f"file://{tmp_path}"})
    assert LogcompactHook("plain").get_planner_config() == PlannerConfig()


@pytest.mark.parametrize(
    "planner, error, message",
    [
        ({"group_size": 5}, ValueError, r"connection 'tuned': extra planner has no setting 'group_size'; the settings are min_files, .*group_bytes"),
        ({"group_bytes": 0}, InvalidPlanError, r"connection 'tuned': extra planner: planner setting group_bytes is 0: must be an integer, 1 to"),
        ({"min_files": [4, 8]}, InvalidPlanError, r"extra planner: planner setting min_files is \[4, 8\]: must be 4 file counts of at least 1 \(L0 to L3\)"),
        ([8], ValueError, r"extra planner must be an object"),
    ],
)
def test_hook_refuses_planner_settings_it_cannot_use(tmp_path, monkeypatch, planner, error, message) -> None:
    _connection(monkeypatch, "tuned", conn_type="generic", extra={"store": f"file://{tmp_path}", "planner": planner})
    with pytest.raises(error, match=message) as raised:
        LogcompactHook("tuned").get_planner_config()
    assert "\n" not in str(raised.value)


@pytest.fixture
def connected_catalog(tmp_path, monkeypatch, catalog_url) -> Catalog:
    """A cluster with one compacted topic behind the connection `connected`, on each database in turn."""
    store = LocalStore(tmp_path / "store")
    extra = {"store": store.uri, **({"catalog": catalog_url} if catalog_url else {})}
    _connection(monkeypatch, "connected", conn_type="generic", extra=extra)
    catalog = Catalog(store, catalog_url)
    create_topic(catalog, "accounts", now=_now_ms(), cleanup_policy="compact")
    return catalog


def test_sensor_pokes_until_a_level_reaches_its_threshold(connected_catalog: Catalog) -> None:
    catalog, now = connected_catalog, _now_ms()
    sensor = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", min_files=(3, 3, 3, 3))
    produce_l0_files(catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=now)
    assert sensor.mode == "reschedule" and not sensor.poke({}).is_done
    produce_l0_files(catalog, "accounts", files=1, records=5, keys=5, partitions=1, now=now)
    answer = sensor.poke({})
    assert answer.is_done and answer.xcom_value == {"L0": 3}


def test_sensor_does_not_count_files_leased_to_a_plan(connected_catalog: Catalog) -> None:
    catalog, now = connected_catalog, _now_ms()
    produce_l0_files(catalog, "accounts", files=3, records=5, keys=5, partitions=1, now=now)
    catalog.lease("p-in-flight", [f.key for f in catalog.snapshot().file_summaries()][:2], now + 3_600_000, now)
    answer = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", min_files=(3, 3, 3, 3)).poke({})
    assert not answer.is_done and answer.xcom_value == {"L0": 1}


def test_sensor_says_how_to_run_now_while_it_waits_and_is_done_at_once_when_forced(connected_catalog: Catalog, capfd) -> None:
    produce_l0_files(connected_catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=_now_ms())
    waiting = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", poke_interval=60, timeout=840)
    assert not waiting.poke({}).is_done
    log = capfd.readouterr().out
    assert "waiting for a level to reach its threshold (poked every 60 s, for up to 840 s); trigger with force=true to run now" in log
    assert "files per level against thresholds: L0 2/32, L1 0/32, L2 0/32, L3 0/32; nothing due" in log

    forced = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", force=True)
    assert forced.poke({}).is_done
    assert "forced (force=true): not waiting for any threshold" in capfd.readouterr().out
    with pytest.raises(AirflowFailException, match="force must be true or false, not 'yes'"):
        LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", force="yes").poke({})


def test_sensor_skips_a_run_that_waited_out_its_timeout_but_fails_on_what_no_wait_fixes(connected_catalog: Catalog) -> None:
    produce_l0_files(connected_catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=_now_ms())
    waiting = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", mode="poke", timeout=0, skip_on_timeout=True)
    with pytest.raises(AirflowSkipException, match="no level reached its threshold within 0 s; nothing to compact this run"):
        waiting.execute({})
    # Airflow's soft_fail would have skipped these too, every run, in silence.
    broken = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", mode="poke", timeout=0, skip_on_timeout=True, force="yes")
    with pytest.raises(AirflowFailException, match="force must be true or false, not 'yes'"):
        broken.execute({})


def test_sensor_leaves_out_files_held_by_uncleanable_partitions_as_the_planner_does(connected_catalog: Catalog) -> None:
    catalog, now = connected_catalog, _now_ms()
    produce_l0_files(catalog, "accounts", files=3, records=5, keys=5, partitions=1, now=now)
    sensor = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", min_files=(3, 3, 3, 3))
    assert sensor.poke({}).is_done
    damaged = catalog.snapshot().file_summaries()[0].key
    catalog.replace_files([], [], now, marks=[SetAside("accounts", 0, "a damaged file", damaged)])  # as a job's commit marks it
    assert not sensor.poke({}).is_done  # the planner would find nothing to plan


@pytest.mark.parametrize(
    "topics, dry_run, buffer_bytes, message",
    [
        ("orders", False, None, "topics must be a list of topic names"),
        (["orders"], "yes", None, "dry_run must be true or false"),
        (None, False, 1024, "buffer_bytes must be an integer from 1048576 \\(1 MiB\\) to 2147483648"),
        (None, False, 4 * 1024**3, "buffer_bytes must be an integer from 1048576 \\(1 MiB\\) to 2147483648"),
        (None, False, True, "buffer_bytes must be an integer"),
    ],
)
def test_plan_operator_refuses_bad_params(topics, dry_run, buffer_bytes, message) -> None:
    with pytest.raises(ValueError, match=message):
        _checked_params(topics, dry_run, buffer_bytes)
    with pytest.raises(ValueError, match="force must be true or false, not 1"):
        _checked_params(None, False, None, 1)


def test_errors_no_retry_can_fix_fail_the_task_at_once(connected_catalog: Catalog) -> None:
    plan = LogcompactPlanOperator(task_id="plan", mode="full", logcompact_conn_id="connected", topics="accounts")
    with pytest.raises(AirflowFailException, match=r"^topics must be a list of topic names, not 'accounts'"):
        plan.execute({})
    unknown = LogcompactPlanOperator(task_id="plan", mode="full", logcompact_conn_id="connected", topics=["acounts"])
    with pytest.raises(AirflowFailException, match=r"^topic\(s\) acounts not in cluster .* \(topics: accounts\); fix the topics$") as raised:
        unknown.execute({})
    assert isinstance(raised.value.__cause__, TopicNotFoundError)
    commit = LogcompactCommitOperator(task_id="commit", group_jobs=[{"plan_id": "p1-never-leased"}], logcompact_conn_id="connected")
    with pytest.raises(AirflowFailException):  # no such plan in the store: only a new plan helps
        commit.execute({"outlet_events": _OutletEvents()})
    # What a retry may fix passes as it is: the store or the catalog not answering, and, where given, conflicts.
    with pytest.raises(CatalogUnavailableError), failing_at_once():
        raise CatalogUnavailableError("catalog down")
    with pytest.raises(CommitConflictError), failing_at_once(retried=(CommitConflictError,)):
        raise CommitConflictError("leased to another plan")
    with pytest.raises(AirflowFailException, match="^leased to another plan$"), failing_at_once():
        raise CommitConflictError("leased to another plan")


def test_the_sensor_imports_no_operator_and_every_operator_fails_bad_settings_at_once(tmp_path, monkeypatch) -> None:
    """The providers' shape: the sensor stands on the hook and the shared policy alone; the metrics operator, like the
    others, fails at once on what no retry fixes (an s3:// store without a catalog)."""
    import subprocess
    import sys

    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, logcompact_airflow.sensors.threshold; print(sorted(m for m in sys.modules if m.startswith('logcompact_airflow')))"],
        capture_output=True, text=True, check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    ).stdout
    assert "logcompact_airflow.hooks.logcompact" in loaded and "logcompact_airflow.policy" in loaded and "operators" not in loaded, loaded
    monkeypatch.setenv("AIRFLOW_CONN_NO_CATALOG", json.dumps({"conn_type": "generic", "extra": {"store": "s3://bucket/prefix"}}))
    metrics = LogcompactMetricsOperator(task_id="metrics", logcompact_conn_id="no_catalog")
    with pytest.raises(AirflowFailException, match="catalog"):
        metrics.execute({})


def test_plan_operator_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode 'weekly' is not one of regular, max-lag, full"):
        LogcompactPlanOperator(task_id="plan", mode="weekly")


class _OutletEvents:
    """The part of Airflow's outlet-event accessors the commit operator uses: `[alias].add(asset, extra)`."""

    def __init__(self) -> None:
        self.added: list[tuple[str, dict]] = []

    def __getitem__(self, alias):
        assert alias == COMPACTED_TOPICS
        return self

    def add(self, asset, extra: dict) -> None:
        self.added.append((asset.uri, extra))


def test_plan_then_commit_operators_compact_with_asset_events(connected_catalog: Catalog, capfd) -> None:
    catalog, now = connected_catalog, _now_ms()
    create_topic(catalog, "clicks", now=now, cleanup_policy="delete")
    produce_l0_files(catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=now)
    produce_l0_files(catalog, "clicks", files=2, records=7, keys=7, partitions=1, now=now)
    inputs = {f.key for f in catalog.snapshot().file_summaries()}
    plan = LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", min_files=(3, 3, 3, 3))
    (job,) = plan.execute({})
    # A map-index label unique in the run: the plan, the group of how many, its partitions, levels and uncompressed bytes.
    assert re.fullmatch(rf"{job['plan_id'][-12:]} g0 of 1: accounts/0 to clicks/0 L0>L1, 0\.\d{{3}} MiB uncompressed", job.pop("label"))
    assert job == {
        "store_uri": catalog.store.uri, "plan_id": job["plan_id"], "group": 0,
        "application_args": [f"--store={catalog.store.uri}", f"--plan-id={job['plan_id']}", "--group=0"],
    }
    assert set(catalog.snapshot().leased_files(_now_ms())) == inputs
    log = capfd.readouterr().out
    assert "regular: files per level against thresholds: L0 4/3, L1 0/3, L2 0/3, L3 0/3; due: L0" in log
    assert re.search(
        rf"leased plan {job['plan_id']}: copy 4 files \(L0 4\) > L1: 0\.\d{{3}} MiB stored \(whole files\), 0\.\d{{3}} MiB uncompressed, 24 records in; "
        rf"copied as they are: no level below L2 is deduplicated .*; 1 group\(s\): {job['plan_id'][-12:]} g0 of 1: ", log,
    ), log

    # What the Spark job does for the group, without Spark: it is given the plan id and the group number.
    run_group(catalog.store, job["plan_id"], job["group"], mapper=TasksByUri(1))

    events = _OutletEvents()
    commit = LogcompactCommitOperator(task_id="commit", group_jobs=[job], logcompact_conn_id="connected")
    summary = commit.execute({"outlet_events": events})
    snapshot = catalog.snapshot()
    assert summary["committed"] == [job["plan_id"]] and summary["manifest_version"] == snapshot.version
    assert {f.level for f in snapshot.file_summaries()} == {1} and not snapshot.leased_files(_now_ms())
    # Each topic's event carries its own figures, not the plan's totals.
    extras = dict(events.added)
    assert set(extras) == {f"logcompact://{snapshot.cluster_id}/{topic}" for topic in ("accounts", "clicks")}
    accounts, clicks = extras[f"logcompact://{snapshot.cluster_id}/accounts"], extras[f"logcompact://{snapshot.cluster_id}/clicks"]
    assert (accounts["records_in"], accounts["records_out"], accounts["partitions"]) == (10, 10, 1)
    assert (clicks["records_in"], clicks["records_out"], clicks["duplicates_removed"]) == (14, 14, 0)
    assert accounts["plans"] == clicks["plans"] == [job["plan_id"]]
    # The commit's log holds CommitSummary's per-topic table: a row for each topic.
    rows = [line for line in capfd.readouterr().out.splitlines() if "accounts" in line or "clicks" in line]
    assert any("accounts" in row for row in rows) and any("clicks" in row for row in rows)

    again = commit.execute({"outlet_events": _OutletEvents()})  # a retried task
    assert again["already_committed"] == [job["plan_id"]] and again["manifest_version"] == snapshot.version


def test_plan_operator_forced_compacts_below_the_thresholds(connected_catalog: Catalog, capfd) -> None:
    catalog = connected_catalog
    produce_l0_files(catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=_now_ms())
    assert LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected").execute({}) == []
    log = capfd.readouterr().out
    assert "nothing planned: L0 has 2 files, needs 32, L1 has 0 files, needs 32; the top level L2 has no 10 files within 2x" in log

    (job,) = LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", force=True).execute({})
    assert job["label"].startswith(f"{job['plan_id'][-12:]} g0 of 1: accounts/0 L0>L1, ")
    log = capfd.readouterr().out
    assert "forced (force=true): any level of 2 files or more is compacted" in log
    assert "L0 2/2, L1 0/2, L2 0/2, L3 0/2; due: L0" in log

    # A second plan finds the files held by the first, and says by whom.
    assert LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", force=True).execute({}) == []
    log = capfd.readouterr().out
    assert re.search(rf"held by in-flight plan {job['plan_id']} \(not planned again until it commits or its lease expires in 60 min\): 2 files \(L0 2\)", log)
    assert "L0 has 0 files, needs 2" in log and "files leased to in-flight plans are not counted" in log


def test_a_plan_step_that_fails_after_leasing_releases_its_plans_for_the_retry(connected_catalog: Catalog, monkeypatch) -> None:
    catalog, now = connected_catalog, _now_ms()
    produce_l0_files(catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=now)

    def broken(*args, **kwargs):
        raise ConnectionError("the catalog database went away")

    explain_run = operators.explain_run
    monkeypatch.setattr(operators, "explain_run", broken)
    with pytest.raises(ConnectionError, match="went away"):
        LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", force=True).execute({})
    assert catalog.snapshot().leases(_now_ms()) == {}
    monkeypatch.setattr(operators, "explain_run", explain_run)
    (job,) = LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", force=True).execute({})
    assert " g0 of 1: accounts/0 L0>L1, " in job["label"]  # the retry plans the same files


def test_plan_operator_says_when_the_max_lag_pass_is_due_next(connected_catalog: Catalog, capfd) -> None:
    catalog, now = connected_catalog, _now_ms()
    create_topic(catalog, "orders", partitions=2, now=now, cleanup_policy="compact", max_compaction_lag_ms=str(2 * 3_600_000))
    produce_l0_files(catalog, "orders", files=2, records=10, keys=5, partitions=2, now=now - 3_600_000)
    plan = LogcompactPlanOperator(task_id="plan", mode="max-lag", logcompact_conn_id="connected", topics=["orders"])
    assert plan.execute({}) == []
    log = capfd.readouterr().out
    # Records an hour old under a 2 h lag: dirty in 60 min, planned by the pass 15 min before they are 30 min late.
    assert re.search(r"nothing planned: max-lag: nothing would be dirty longer than 30 min by the next pass \(in 15 min\); the first "
                     r"due is orders/[01], which becomes dirty in (59|60) min and is planned in (74|75) min", log), log
    # In an hourly DAG the planner assumes the next pass at the DAG's next run: planned by the last pass before
    # they would be 30 min late, that is 90 min from now less the time to the next run.
    with DAG(dag_id="hourly_max_lag", schedule="@hourly"):
        hourly = LogcompactPlanOperator(task_id="plan", mode="max-lag", logcompact_conn_id="connected", topics=["orders"])
    assert hourly.execute({}) == []
    log = capfd.readouterr().out
    next_run = re.search(r"max-lag pass: the DAG runs next in (\d+) min; a partition is planned when by then it would be dirty longer than 30 min", log)
    planned = re.search(r"the first due is orders/[01], which becomes dirty in (59|60) min and is planned in (\d+) min", log)
    assert next_run and planned, log
    assert abs(int(planned[2]) - (90 - int(next_run[1]))) <= 1
    accounts_only = LogcompactPlanOperator(task_id="plan", mode="max-lag", logcompact_conn_id="connected", topics=["accounts"])
    assert accounts_only.execute({}) == []
    assert "max-lag: no compacted topic among accounts sets a finite max.compaction.lag.ms" in capfd.readouterr().out


def test_dry_run_task_runs_only_in_dry_runs(capfd) -> None:
    LogcompactDryRunOperator(task_id="dry_run", dry_run=True).execute({})
    assert "dry run: planned and estimated only; nothing was leased, written or run" in capfd.readouterr().out
    with pytest.raises(AirflowSkipException, match="not a dry run"):
        LogcompactDryRunOperator(task_id="dry_run", dry_run=False).execute({})


def test_gc_operator_deletes_an_abandoned_output_past_its_grace(connected_catalog: Catalog) -> None:
    catalog = connected_catalog
    produce_l0_files(catalog, "accounts", files=1, records=5, keys=5, partitions=1, now=_now_ms())
    leftover = "data/l1/p1700000000000-0123456789ab-g000-s000-compacted-0000.seg"  # a plan that never committed
    catalog.store.put(leftover, b"left by a job that never committed")
    two_hours_ago = time.time() - 2 * 3600  # past the 1 h grace
    os.utime(catalog.store.root / leftover, (two_hours_ago, two_hours_ago))

    report = LogcompactGcOperator(task_id="gc", logcompact_conn_id="connected").execute({})

    assert report["deleted_files"] == [leftover] and catalog.store.stat(leftover) is None
    (live,) = catalog.snapshot().file_summaries()
    assert catalog.store.stat(live.key) is not None


def test_a_connection_to_another_cluster_s_catalog_fails_every_task_and_deletes_nothing(
    connected_catalog: Catalog, tmp_path, monkeypatch
) -> None:
    catalog = connected_catalog
    produce_l0_files(catalog, "accounts", files=3, records=5, keys=5, partitions=1, now=_now_ms() - 3 * 3_600_000)
    other = Catalog(LocalStore(tmp_path / "other"))
    create_topic(other, "accounts", now=_now_ms(), cleanup_policy="compact")
    _connection(monkeypatch, "crossed", conn_type="generic", extra={"store": catalog.store.uri, "catalog": other.url})
    before = {info.key: info.size for info in catalog.store.list("")}

    for task in (
        LogcompactGcOperator(task_id="gc", logcompact_conn_id="crossed"),
        LogcompactPlanOperator(task_id="plan", mode="full", logcompact_conn_id="crossed"),
    ):
        with pytest.raises(AirflowFailException, match=r"belongs to cluster .* but catalog .* holds cluster"):
            task.execute({})
    assert {info.key: info.size for info in catalog.store.list("")} == before


def test_cleaner_gauges_reach_a_statsd_server_under_kafkas_names(connected_catalog: Catalog, monkeypatch) -> None:
    """Through Airflow's own metrics setup (what the task runner does at start), to a real UDP StatsD receiver."""
    from airflow.sdk.observability.metrics.stats_utils import get_stats_factory
    from airflow.sdk.observability.stats import Stats

    produce_l0_files(connected_catalog, "accounts", files=2, records=20, keys=5, partitions=1, now=_now_ms() - 3 * 3_600_000)
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(5)
    for name, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(receiver.getsockname()[1]),
                        "STATSD_PREFIX": "airflow"}.items():
        monkeypatch.setenv(f"AIRFLOW__METRICS__{name}", value)
    Stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
    try:
        gauges = LogcompactMetricsOperator(task_id="cleaner_metrics", logcompact_conn_id="connected").execute({})
        measured = {name: value for name, value in gauges.items() if value is not None}
        packets = {}
        while len(packets) < len(measured):
            name, value = receiver.recv(1024).decode().split("|")[0].split(":")
            packets[name] = float(value)
    finally:
        monkeypatch.undo()
        Stats.initialize(factory=get_stats_factory(), export_legacy_names=False)
        receiver.close()
    assert packets == {f"airflow.logcompact.{name}": float(value) for name, value in measured.items()}
    assert gauges["time-since-last-run-ms"] is None  # nothing compacted yet: not sent
    # Nothing of accounts (no finite max lag) was ever deduplicated: all of it is dirty.
    assert packets["airflow.logcompact.max-dirty-percent"] == 100.0 and packets["airflow.logcompact.uncleanable-partitions-count"] == 0


def test_the_metrics_log_leads_with_the_worst_partitions(connected_catalog: Catalog, capfd) -> None:
    """A headline naming the partitions behind the maxima, then the worst 20 partitions, and how many were left out."""
    from logcompact.ingest import Agent, Record
    from logcompact.jobs.run import run_here

    catalog, now, hour = connected_catalog, _now_ms(), 3_600_000
    create_topic(catalog, "orders", partitions=24, now=now - 5 * hour, cleanup_policy="compact", max_compaction_lag_ms=str(2 * hour))
    produce_l0_files(catalog, "orders", files=2, records=480, keys=240, partitions=24, now=now - 4 * hour)
    prepared = prepare_plans(catalog, "full", now, PlannerConfig(), ["orders"])
    run_here(catalog, prepared.plan_ids, prepared.groups, now)  # every partition of orders clean
    with Agent(catalog, background=False, clock=lambda: now - 3 * hour) as agent:  # then orders/13 dirty, past its max lag
        agent.produce("orders", [Record(13, b"k%d" % n, b"again", now - 3 * hour) for n in range(40)])

    LogcompactMetricsOperator(task_id="cleaner_metrics", logcompact_conn_id="connected").execute({})

    lines = capfd.readouterr().out.splitlines()
    (headline,) = [line for line in lines if "cleaner: " in line]
    assert re.search(
        r"cleaner: max-dirty-percent [\d.]+% at orders/13 \(0\.\d{3} MiB of 0\.\d{3} MiB uncompressed not yet deduplicated\); "
        r"max-compaction-delay-secs [\d,]+ at orders/13; 0 uncleanable; 24 partitions of compacted topics, the 20 worst listed below",
        headline,
    ), headline
    rows = [re.search(r"(orders +\d+) ", line)[1].split() for line in lines if re.search(r"\] orders +\d+ ", line)]
    # `logcompact status --worst`'s order: the dirtiest, then the clean ones by topic and partition.
    assert rows == [["orders", str(n)] for n in [13, *range(13), *range(14, 20)]]
    assert any("... 4 partitions less dirty not listed (`logcompact status` lists every partition)" in line for line in lines)


def test_a_due_partition_held_by_an_in_flight_plan_is_said_so(connected_catalog: Catalog, capfd) -> None:
    catalog, now = connected_catalog, _now_ms()
    create_topic(catalog, "orders", partitions=1, now=now - 4 * 3_600_000, cleanup_policy="compact", max_compaction_lag_ms=str(2 * 3_600_000))
    produce_l0_files(catalog, "orders", files=2, records=10, keys=5, partitions=1, now=now - 3 * 3_600_000)
    (job,) = LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", force=True).execute({})
    capfd.readouterr()
    assert LogcompactPlanOperator(task_id="plan", mode="max-lag", logcompact_conn_id="connected", topics=["orders"]).execute({}) == []
    log = capfd.readouterr().out
    assert "nothing planned: max-lag: orders/0 is due, but an in-flight plan holds some of its files; that plan's commit compacts them first" in log
    assert f"held by in-flight plan {job['plan_id']}" in log
