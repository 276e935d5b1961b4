"""Fixtures of the agent's tests: an agent serving the test's cluster on 127.0.0.1.

The cluster is the suite's `catalog` fixture (SQLite, then PostgreSQL); a module that needs topics overrides
`catalog` with a fixture that takes the suite's and creates them. The helpers are plain modules beside this one:
`agents` (RunningAgent, agent processes, clients), `wire` (raw frames and kio), `groups`.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

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
