"""A consumer subscribing to a topic an idempotent producer just auto-created: kafka-python 3.0.12's own test
`test_idempotent_producer_max_in_flight[5]`, run against one agent, with the Metadata requests the agent answered.

    .venv/bin/python bench/subscribe_race.py                           # 20 runs as the test does them
    .venv/bin/python bench/subscribe_race.py --subscribe-after-ms 100  # subscribe as a loaded machine does

Each run: a KafkaProducer (enable_idempotence, max_in_flight_requests_per_connection=5) writes 100 records to a new
topic, auto-created by its Metadata request; then a new KafkaConsumer (no group) subscribes to the topic and reads
100 records, giving up after --timeout-ms without one. A run that reads nothing prints every Metadata request the
agent answered from the consumer's start: the topics asked for, and those answered. The closing line counts the
runs that read everything, and the consumer's Metadata requests that named the topic and were answered without
it (an agent's view of the topics older than the commit that created the topic would show there).

--subscribe-after-ms waits between making the consumer and subscribing: on a loaded machine the consumer's
constructor returns that much later after its bootstrap Metadata. docs/agent.md (Topics and configs) says what
the runs show.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import logging
import tempfile
import threading
import time
import uuid
from typing import Any

from kafka import KafkaConsumer, KafkaProducer

from logcompact.catalog import Catalog
from logcompact.kafka import handlers
from logcompact.kafka.cluster import Address
from logcompact.kafka.handlers import metadata
from logcompact.kafka.listeners import Listener, SecurityProtocol
from logcompact.kafka.server import AgentServer, AgentSettings
from logcompact.store import open_store
from logcompact.units import wall_clock_ms

RECORDS = 100


class MetadataLog:
    """The Metadata requests the agent answers: when, the topics asked for (None: all), the topics answered."""

    def __init__(self) -> None:
        self.entries: list[tuple[float, list[str] | None, list[tuple[str, int]]]] = []
        self._serve = metadata.handle

    async def handle(self, broker: Any, request: Any) -> Any:
        response = await self._serve(broker, request)
        asked = None if request.body.topics is None else [entry.name for entry in request.body.topics]
        self.entries.append((time.monotonic(), asked, [(topic.name, int(topic.error_code)) for topic in response.topics]))
        return response


class Agent:
    """One agent on its own event loop thread, serving a fresh cluster in a temporary directory."""

    def __init__(self, directory: str) -> None:
        catalog = Catalog(open_store(f"file://{directory}/store"))
        catalog.ensure_created(wall_clock_ms())
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()
        self.server = AgentServer(catalog, AgentSettings((Listener(SecurityProtocol.PLAINTEXT, Address("127.0.0.1", 0)),), flush_interval_ms=50))
        self._call(self.server.start())
        self.bootstrap = str(self.server.address)

    def _call(self, coroutine: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout=60)

    def stop(self) -> None:
        self._call(self.server.stop())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=10)


def one_run(bootstrap: str, log: MetadataLog, subscribe_after_ms: int, timeout_ms: int) -> tuple[str, int, float]:
    """The topic, the records the consumer read, and when the consumer was made (time.monotonic())."""
    topic = f"t{uuid.uuid4().hex[:8]}"
    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True, max_in_flight_requests_per_connection=5)
    futures = [producer.send(topic, value=b"msg %d" % i) for i in range(RECORDS)]
    for future in futures:
        future.get(timeout=30)
    producer.close()
    started = time.monotonic()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, group_id=None, consumer_timeout_ms=timeout_ms, auto_offset_reset="earliest")
    time.sleep(subscribe_after_ms / 1000)
    consumer.subscribe([topic])
    received = set()
    for _ in range(RECORDS):
        try:
            received.add(next(consumer).value)
        except StopIteration:
            break
    consumer.close()
    return topic, len(received), started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--subscribe-after-ms", type=int, default=0)
    parser.add_argument("--timeout-ms", type=int, default=30_000, help="the consumer's consumer_timeout_ms (the test's 30 s)")
    options = parser.parse_args()
    logging.getLogger("kafka").setLevel(logging.CRITICAL)  # the client's warnings are not the figures
    log = MetadataLog()
    handlers.APIS[metadata.API_KEY] = dataclasses.replace(handlers.APIS[metadata.API_KEY], handle=log.handle)
    complete = stale = 0
    with tempfile.TemporaryDirectory() as directory:
        agent = Agent(directory)
        try:
            for run in range(options.runs):
                seen = len(log.entries)
                topic, read, started = one_run(agent.bootstrap, log, options.subscribe_after_ms, options.timeout_ms)
                complete += read == RECORDS
                answered = [entry for entry in log.entries[seen:] if entry[0] >= started]  # the consumer's, after every ack
                stale += sum((topic, 0) not in topics for _, asked, topics in answered if asked and topic in asked)
                print(f"run {run}: {topic} read {read} of {RECORDS}", flush=True)
                if read < RECORDS:
                    for at, asked, topics in answered:
                        print(f"    Metadata at +{(at - started) * 1000:.0f} ms: asked {asked}, answered {topics}")
        finally:
            agent.stop()
    print(f"{complete} of {options.runs} runs read all {RECORDS} records; Metadata requests naming the topic answered "
          f"without it: {stale}")


if __name__ == "__main__":
    main()
