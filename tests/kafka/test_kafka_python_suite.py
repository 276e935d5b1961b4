"""kafka-python 3.0.12's own integration tests (its sdist's `test/integration`, fetched by `lab.kafka_python_suite`)
run against a `logcompact agent` process, each selected test one case here that fails with its output. Its conftest
takes the agent for an external Kafka broker of KAFKA_VERSION."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from lab.kafka_python_suite import SuiteError, fetch, run
from lab.servers.kafka import stop_process
from logcompact.catalog import Catalog
from logcompact.store.local import LocalStore
from tests.kafka.agents import FLUSH_MS, free_port, start_agent_process

pytestmark = pytest.mark.timeout(900)

KAFKA_VERSION = "4.2.0"  # the broker the tests take the agent for: they check Kafka 4's answers
SELECTED = (
    "test_admin_integration.py::test_describe_configs_broker_resource_returns_configs",
    "test_admin_integration.py::test_describe_configs_topic_resource_returns_configs",
    "test_admin_integration.py::test_describe_configs_mixed_resources_returns_configs",
    "test_admin_integration.py::test_describe_configs_invalid_broker_id_raises",
    "test_admin_integration.py::test_delete_records",
    "test_admin_integration.py::test_delete_records_with_errors",
    "test_admin_integration.py::test_delete_groups",
    "test_admin_integration.py::test_delete_groups_with_errors",
    "test_consumer_integration.py::test_kafka_consumer_unsupported_encoding",
)


@pytest.fixture(scope="module")
def sdist() -> Path:
    try:
        return fetch()
    except SuiteError as exc:
        pytest.fail(f"kafka-python's sdist: {exc} (`python -m lab.kafka_python_suite fetch`, which `make test` runs)")


@pytest.fixture(scope="module")
def agent_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One `logcompact agent` for the module's tests, on a cluster of its own (its tests make their own topics)."""
    directory = tmp_path_factory.mktemp("kafka-python-suite")
    port = free_port()
    process = start_agent_process(Catalog(LocalStore(directory / "store"), None), port, FLUSH_MS, directory / "agent.log")
    try:
        yield f"127.0.0.1:{port}"
    finally:
        stop_process(process, timeout=30)


@pytest.mark.parametrize("test_id", SELECTED)
def test_kafka_python_integration(sdist: Path, agent_address: str, test_id: str) -> None:
    done = run(sdist, test_id, agent_address, KAFKA_VERSION)
    if done.returncode != 0 or " passed" not in done.stdout.splitlines()[-1]:
        pytest.fail(f"kafka-python's {test_id} against the agent: exit {done.returncode}\n{done.stdout[-12000:]}\n{done.stderr[-4000:]}", pytrace=False)
