"""Fixtures: every store test runs on both backends, the local directory and a real Ceph RGW on 127.0.0.1,
and every catalog test on both databases, the embedded SQLite and a real PostgreSQL server on 127.0.0.1.

The RGW cluster and the PostgreSQL server start once per session, PostgreSQL as the `postgres` user. If
either cannot start, its tests fail with the reason; they are never skipped. Each test gets a database of
its own. An s3:// store's catalog is on PostgreSQL (a cluster on S3 spans machines); a local store's is
on either.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

REPO = Path(__file__).resolve().parents[1]
# Airflow reads its configuration once, when first imported: a private home for the session, set before any
# test module imports it. The DAG tests migrate its SQLite database (the `airflow_db` fixture).
os.environ.update(
    AIRFLOW_HOME=tempfile.mkdtemp(prefix="logcompact-airflow-"),
    AIRFLOW__CORE__LOAD_EXAMPLES="False",
    AIRFLOW__CORE__DAGS_FOLDER=str(REPO / "dags"),
    AIRFLOW__CORE__PLUGINS_FOLDER=str(REPO / "plugins"),
)

from lab.servers.postgres import PostgresServer, postgres_missing_reason, start_postgres
from lab.servers.rgw import RgwServer, rgw_missing_reason, start_rgw
from logcompact.catalog import Catalog
from logcompact.store import LocalStore, ObjectStore
from logcompact.store.s3 import S3Store

settings.register_profile("logcompact", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile("logcompact")

BACKENDS = ["file", "s3"]
DATABASES = ["sqlite", "postgresql"]


@pytest.fixture(autouse=True)
def no_kafka_python_client_left_running() -> Iterator[None]:
    """A kafka-python 3 client runs its network in a thread (`kafka-io-<client id>`) until closed: one a test leaves
    open goes on refreshing metadata against a stopped agent and logs into later tests. Each test closes its own."""
    before = {thread for thread in threading.enumerate() if thread.name.startswith("kafka-io-")}
    yield
    deadline = time.monotonic() + 5
    while left := [t for t in threading.enumerate() if t.name.startswith("kafka-io-") and t not in before and t.is_alive()]:
        if time.monotonic() > deadline:
            pytest.fail(f"kafka-python clients left running (close them in the test): {sorted(t.name for t in left)}", pytrace=False)
        time.sleep(0.05)


@pytest.fixture(scope="session")
def rgw(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RgwServer]:
    missing = rgw_missing_reason()
    if missing:
        pytest.fail(f"the S3 suite needs Ceph RGW: {missing}", pytrace=False)
    server, stop = start_rgw(tmp_path_factory.mktemp("rgw"))
    try:
        yield server
    finally:
        stop()


@pytest.fixture(scope="session")
def postgres(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    missing = postgres_missing_reason()
    if missing:
        pytest.fail(f"the PostgreSQL suite needs a PostgreSQL server: {missing}", pytrace=False)
    server, stop = start_postgres(tmp_path_factory.mktemp("postgres"))
    try:
        yield server
    finally:
        stop()


@pytest.fixture
def make_catalog_url(request: pytest.FixtureRequest) -> Callable[[str], str | None]:
    """A factory of catalog URLs: None for SQLite (the embedded default, beside a local store's data), a
    fresh database on the session's PostgreSQL server otherwise."""

    def make(database: str) -> str | None:
        if database == "sqlite":
            return None
        server = request.getfixturevalue("postgres")
        url = server.create_database()
        request.addfinalizer(lambda: server.drop_database(url))  # each holds ~8 MB of the server's RAM
        return url

    return make


@pytest.fixture(params=DATABASES)
def catalog_url(request: pytest.FixtureRequest, make_catalog_url: Callable[[str], str | None]) -> str | None:
    return make_catalog_url(request.param)


@pytest.fixture
def catalog(tmp_path: Path, catalog_url: str | None) -> Catalog:
    """An empty cluster on a local store, its catalog on each database in turn (not created yet: see
    `tests.helpers.create_topic`)."""
    return Catalog(LocalStore(tmp_path / "store"), catalog_url)


@pytest.fixture
def catalog_of(make_catalog_url: Callable[[str], str | None]) -> Callable[[ObjectStore], Catalog]:
    """The catalog of a store from the `store` fixture: SQLite beside a local store, PostgreSQL for S3."""
    urls: dict[str, str | None] = {}

    def make(store: ObjectStore) -> Catalog:
        if store.uri not in urls:
            urls[store.uri] = make_catalog_url("sqlite" if isinstance(store, LocalStore) else "postgresql")
        return Catalog(store, urls[store.uri])

    return make


def rgw_environment(server: RgwServer) -> dict[str, str]:
    """Environment for a subprocess that reaches the RGW through boto3's standard variables."""
    return {
        **os.environ,
        "AWS_ENDPOINT_URL": server.endpoint_url,
        "AWS_ACCESS_KEY_ID": server.access_key,
        "AWS_SECRET_ACCESS_KEY": server.secret_key,
        "AWS_REGION": server.region,
        "AWS_REQUEST_CHECKSUM_CALCULATION": "when_required",
    }


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[[str], ObjectStore]:
    """A factory of empty stores of a backend, so a test can open several independent clients of one store."""

    def make(backend: str) -> ObjectStore:
        if backend == "file":
            return LocalStore(tmp_path / "store")
        server = request.getfixturevalue("rgw")
        client = server.client()
        bucket = f"test-{uuid.uuid4().hex[:20]}"
        client.create_bucket(Bucket=bucket)
        return S3Store(bucket, "cluster", client=client)

    return make


@pytest.fixture(params=BACKENDS)
def store(request: pytest.FixtureRequest, make_store: Callable[[str], ObjectStore]) -> ObjectStore:
    return make_store(request.param)


@pytest.fixture(params=BACKENDS)
def store_uri_env(request: pytest.FixtureRequest, make_store: Callable[[str], ObjectStore]) -> tuple[str, dict[str, str]]:
    """A store URI and the environment a subprocess needs to open it."""
    made = make_store(request.param)
    env = dict(os.environ) if request.param == "file" else rgw_environment(request.getfixturevalue("rgw"))
    return made.uri, env


@pytest.fixture(scope="session")
def airflow_db() -> None:
    """Airflow's metadata database migrated, with the pool the DAGs share (the way `make airflow` sets it up)."""
    airflow = str(Path(sys.executable).parent / "airflow")
    for command in (["db", "migrate"], ["pools", "set", "logcompact", "4", "logcompact compactions"]):
        done = subprocess.run([airflow, *command], capture_output=True, text=True)
        if done.returncode:
            pytest.fail(f"airflow {' '.join(command)} failed:\n{done.stderr[-3000:]}", pytrace=False)


@pytest.fixture
def airflow_catalog(
    request: pytest.FixtureRequest, airflow_db: None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    make_catalog_url: Callable[[str], str | None],
) -> Catalog:
    """The empty cluster behind the DAGs' `logcompact_default` connection, with Spark in local mode as the
    Spark connection. Its catalog is the local store's embedded SQLite, or a fresh PostgreSQL database named
    in the connection's extra for a test parametrized with `("airflow_catalog", ["postgresql"], indirect=True)`."""
    store = LocalStore(tmp_path / "store")
    url = make_catalog_url(getattr(request, "param", "sqlite"))
    extra = {"store": store.uri, **({"catalog": url} if url else {})}
    monkeypatch.setenv("AIRFLOW_CONN_LOGCOMPACT_DEFAULT", json.dumps({"conn_type": "generic", "extra": extra}))
    monkeypatch.setenv("AIRFLOW_CONN_LOGCOMPACT_SPARK", json.dumps({"conn_type": "spark", "host": "local[2]"}))
    # The Spark provider runs a bare `spark-submit` from PATH; its Python workers run this interpreter.
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("PYSPARK_PYTHON", sys.executable)
    monkeypatch.setenv("SPARK_LOCAL_IP", "127.0.0.1")
    monkeypatch.setenv("PYTHONPATH", str(REPO))
    return Catalog(store, url)
