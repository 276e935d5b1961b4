"""Fixtures: every store test runs on both backends, the local directory and a real Ceph RGW on 127.0.0.1.

The RGW cluster starts once per session. If it cannot start, the S3 tests fail with the reason; they are
never skipped.
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Callable, Iterator

import pytest
from hypothesis import HealthCheck, settings

from logcompact.store import LocalStore, ObjectStore
from logcompact.store.s3 import S3Store
from tests.support.rgw import RgwServer, rgw_missing_reason, start_rgw

settings.register_profile("logcompact", deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
settings.load_profile("logcompact")

BACKENDS = ["file", "s3"]


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
