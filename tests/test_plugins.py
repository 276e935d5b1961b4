"""The Airflow plugin classes on their own: the hook's connections (a local store, and S3 through an AWS
connection to the real RGW), the sensor's poke, and the operators' parameter checks."""

from __future__ import annotations

import json
import time
import uuid

import pytest

from logcompact.catalog import Catalog
from logcompact.store import LocalStore
from logcompact.store.s3 import S3Store
from logcompact_airflow.hooks import LogcompactHook
from logcompact_airflow.operators import LogcompactPlanOperator, _checked_params
from logcompact_airflow.sensors import LogcompactThresholdSensor
from tests.helpers import create_topic, produce_l0_files


def test_hook_opens_a_local_store(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_LOCAL_STORE", json.dumps({"conn_type": "generic", "extra": {"store": f"file://{tmp_path}"}}))
    store = LogcompactHook("local_store").get_store()
    assert isinstance(store, LocalStore) and store.uri == f"file://{tmp_path}"


def test_hook_opens_s3_through_an_aws_connection_with_its_endpoint(rgw, monkeypatch) -> None:
    bucket = f"hook-{uuid.uuid4().hex[:12]}"
    rgw.client().create_bucket(Bucket=bucket)
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    monkeypatch.setenv("AIRFLOW_CONN_TRIAL_S3", json.dumps({
        "conn_type": "aws", "login": rgw.access_key, "password": rgw.secret_key,
        "extra": {"store": f"s3://{bucket}/logs", "endpoint_url": rgw.endpoint_url, "region_name": rgw.region},
    }))
    store = LogcompactHook("trial_s3").get_store()
    assert isinstance(store, S3Store) and store.uri == f"s3://{bucket}/logs"
    store.put("probe", b"through the AWS connection")
    assert rgw.client().get_object(Bucket=bucket, Key="logs/probe")["Body"].read() == b"through the AWS connection"


def test_hook_without_a_store_says_what_to_set(monkeypatch) -> None:
    monkeypatch.setenv("AIRFLOW_CONN_NO_STORE", json.dumps({"conn_type": "generic", "extra": {}}))
    with pytest.raises(ValueError, match=r"connection 'no_store' has no store; set its extra to"):
        LogcompactHook("no_store").get_store()


@pytest.fixture
def connected_catalog(tmp_path, monkeypatch) -> Catalog:
    """A cluster with one compacted topic behind the connection `connected`."""
    store = LocalStore(tmp_path / "store")
    monkeypatch.setenv("AIRFLOW_CONN_CONNECTED", json.dumps({"conn_type": "generic", "extra": {"store": store.uri}}))
    catalog = Catalog(store)
    create_topic(catalog, "accounts", now=int(time.time() * 1000), cleanup_policy="compact")
    return catalog


def test_sensor_pokes_until_a_level_reaches_its_threshold(connected_catalog: Catalog) -> None:
    catalog, now = connected_catalog, int(time.time() * 1000)
    sensor = LogcompactThresholdSensor(task_id="wait", logcompact_conn_id="connected", min_files=(3, 3, 3, 3))
    produce_l0_files(catalog, "accounts", files=2, records=5, keys=5, partitions=1, now=now)
    assert sensor.mode == "reschedule" and not sensor.poke({}).is_done
    produce_l0_files(catalog, "accounts", files=1, records=5, keys=5, partitions=1, now=now)
    answer = sensor.poke({})
    assert answer.is_done and answer.xcom_value == {"L0": 3}


@pytest.mark.parametrize(
    "topics, dry_run, buffer_bytes, message",
    [
        ("orders", False, None, "topics must be a list of topic names"),
        (["orders"], "yes", None, "dry_run must be true or false"),
        (None, False, 1024, "buffer_bytes must be an integer of at least 1048576"),
        (None, False, True, "buffer_bytes must be an integer"),
    ],
)
def test_plan_operator_refuses_bad_params(topics, dry_run, buffer_bytes, message) -> None:
    with pytest.raises(ValueError, match=message):
        _checked_params(topics, dry_run, buffer_bytes)


def test_plan_operator_refuses_an_unknown_mode() -> None:
    with pytest.raises(ValueError, match="mode 'weekly' is not one of regular, max-lag, full"):
        LogcompactPlanOperator(task_id="plan", mode="weekly")


def test_plan_operator_plans_with_the_thresholds_the_sensor_waited_for(connected_catalog: Catalog) -> None:
    catalog, now = connected_catalog, int(time.time() * 1000)
    produce_l0_files(catalog, "accounts", files=3, records=5, keys=5, partitions=1, now=now)
    operator = LogcompactPlanOperator(task_id="plan", mode="regular", logcompact_conn_id="connected", min_files=(3, 3, 3, 3))
    (job,) = operator.execute({})
    assert job["application_args"][0] == f"--store={catalog.store.uri}" and job["label"].endswith("L0 to L1, 3 files, all partitions")
    assert catalog.load().leased_files(now) == set(catalog.load().files)
