"""Agents as the tests run them, in this process on an event loop thread of their own or as `logcompact agent`
processes, and what real clients need around them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, Message

from logcompact.catalog import Catalog
from logcompact.consume import ConsumedRecord, read_records
from logcompact.kafka.cluster import Address
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.server import AgentServer, AgentSettings

FLUSH_MS = 50
MAX_MESSAGE_BYTES = 64 * 1024
FAST_CLIENT = {"socket.timeout.ms": 5000, "socket.connection.setup.timeout.ms": 5000}


def eventually(condition: Callable[[], bool], seconds: float = 20) -> bool:
    """Whether `condition` held within `seconds`, checked every 20 ms."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


class RunningAgent:
    """An AgentServer on its own event loop thread, as `logcompact agent` runs it."""

    def __init__(self, catalog: Catalog, listeners: tuple[Listener, ...] = (Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0)),),
                 **settings: Any) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="agent", daemon=True)
        self.thread.start()
        self.server = AgentServer(catalog, AgentSettings(listeners, **settings))
        # The first start of a fresh checkout compiles the agent's numba loops (its cache is then on disk): up to a
        # minute or more on a loaded 2-core machine, and the Kafka tests are the suite's first.
        self.call(self.server.start(), timeout=300)

    def call(self, coroutine: Any, timeout: float = 30) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=timeout)

    @property
    def bootstrap(self) -> str:
        return str(self.server.address)

    def stop(self) -> None:
        self.call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)
        self.loop.close()


def agent_environment(catalog: Catalog) -> dict[str, str]:
    """The environment of a `logcompact` process on `catalog`'s cluster: its store and its catalog database
    (LOGCOMPACT_CATALOG, which keeps a PostgreSQL URL's password off the command line), and one agent process per
    `logcompact agent` (LOGCOMPACT_AGENT_PROCESSES; the default is a process per core): the tests expect one node each."""
    return {**os.environ, "LOGCOMPACT_STORE": catalog.store.uri, "LOGCOMPACT_CATALOG": catalog.url, "LOGCOMPACT_AGENT_PROCESSES": "1"}


def start_agent_process(catalog: Catalog, port: int, flush_ms: int, log: Path | None = None) -> subprocess.Popen:
    """`logcompact agent` as its own process on 127.0.0.1:`port` (one a test can SIGKILL), once it says it listens.
    Its stderr goes to the file `log` (appended) when given: a long run logs more than a pipe nobody reads holds."""
    command = [sys.executable, "-m", "logcompact", "agent", "--listen", f"127.0.0.1:{port}", "--flush-ms", str(flush_ms)]
    with open(log, "a") if log is not None else contextlib.nullcontext(subprocess.PIPE) as stderr:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=stderr, text=True, env=agent_environment(catalog))
    assert process.stdout is not None
    line = process.stdout.readline()
    assert line, process.stderr.read() if process.stderr is not None else Path(str(log)).read_text()[-4000:]
    assert json.loads(line)["listening"] == f"127.0.0.1:{port}"
    return process


class AgentProcesses:
    """`count` agent processes on one catalog, each on a port of its own that it keeps across restarts (and so its
    node id), their stderr in files under `logs`."""

    def __init__(self, catalog: Catalog, count: int, logs: Path, flush_ms: int = FLUSH_MS) -> None:
        self.catalog, self.logs, self.flush_ms = catalog, logs, flush_ms
        self.ports = [free_port() for _ in range(count)]
        self.processes: list[subprocess.Popen] = []
        for port in self.ports:
            self.processes.append(start_agent_process(catalog, port, flush_ms, logs / f"agent-{port}.log"))

    @property
    def bootstrap(self) -> str:
        return ",".join(f"127.0.0.1:{port}" for port in self.ports)

    def kill_and_restart(self, index: int) -> None:
        """SIGKILL, then the agent started again on its address, as a supervisor would."""
        self.processes[index].send_signal(signal.SIGKILL)
        self.processes[index].wait()
        self.processes[index] = start_agent_process(self.catalog, self.ports[index], self.flush_ms, self.logs / f"agent-{self.ports[index]}.log")

    def stop(self) -> None:
        for process in self.processes:
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def stored(catalog: Catalog, topic: str, partition: int) -> list[ConsumedRecord]:
    """A partition's records as the library reads them from the store."""
    return list(read_records(catalog.store, catalog.snapshot(), topic, partition))


def confluent_consumer(agent: RunningAgent, **config: Any) -> Consumer:
    """A confluent-kafka Consumer for assign() with explicit offsets, told of each partition's end."""
    return Consumer({"bootstrap.servers": agent.bootstrap, "group.id": "fetch-tests", "enable.auto.commit": False,
                     "enable.partition.eof": True, **FAST_CLIENT, **config})


def consume(consumer: Consumer, count: int, timeout: float = 10) -> list[Message]:
    """`count` messages, then the partition end (enable.partition.eof): a consumer that stalls fails here."""
    messages: list[Message] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is None:
            continue
        if message.error():
            assert message.error().code() == KafkaError._PARTITION_EOF, message.error()
            if len(messages) >= count:
                return messages
            continue
        messages.append(message)
    raise AssertionError(f"{len(messages)} of {count} messages and no end of partition within {timeout} s")
