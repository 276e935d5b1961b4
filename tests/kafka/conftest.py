"""Fixtures of the agent's tests: an agent serving the test's cluster on 127.0.0.1.

The cluster is the suite's `catalog` fixture (SQLite, then PostgreSQL); a module that needs topics overrides
`catalog` with a fixture that takes the suite's and creates them. The helpers are plain modules beside this one:
`agents` (RunningAgent, agent processes, clients), `wire` (raw frames and kio), `groups`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from lab.servers.kafka import KafkaServer, kafka_missing_reason, start_kafka
from logcompact.catalog import Catalog
from tests.kafka.agents import FLUSH_MS, MAX_MESSAGE_BYTES, RunningAgent


@pytest.fixture
def agent(catalog: Catalog) -> Iterator[RunningAgent]:
    """An agent flushing every 50 ms that takes records up to 64 KiB, stopped after the test."""
    running = RunningAgent(catalog, flush_interval_ms=FLUSH_MS, max_message_bytes=MAX_MESSAGE_BYTES)
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def kafka_broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaServer]:
    """Apache Kafka's broker (lab.servers.kafka), the reference the agent's answers are compared with; skipped, with
    the reason, only where Java 17 or its jars cannot be had (`make kafka`)."""
    missing = kafka_missing_reason()
    if missing:
        pytest.skip(missing)
    server, stop = start_kafka(tmp_path_factory.mktemp("kafka"))
    try:
        yield server
    finally:
        stop()
