"""aiokafka (asyncio, its own protocol code) through `logcompact agent`: produce with every codec at acks 1 and
all (idempotent at all), then consume from the beginning and from a timestamp; and kcat's consumer from a
timestamp."""

from __future__ import annotations

import asyncio
import shutil
import subprocess

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from logcompact.catalog import Catalog
from tests.helpers import create_topic
from tests.kafka.agents import RunningAgent
from tests.kafka.wire import TIMESTAMP

CODECS = [None, "gzip", "snappy", "lz4", "zstd"]
COUNT = 30

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def catalog(catalog: Catalog) -> Catalog:
    create_topic(catalog, "orders", 2, cleanup_policy="compact")
    return catalog


async def produce(bootstrap: str, codec: str | None, acks: int | str) -> list[tuple[int, int]]:
    # aiokafka's idempotent producer needs acks=all: on with it, as Kafka clients default to now
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, acks=acks, compression_type=codec, linger_ms=5, enable_idempotence=acks == "all")
    await producer.start()
    try:
        sent = [
            await producer.send("orders", b"v%d" % n, key=b"k%d" % n, partition=n % 2, timestamp_ms=TIMESTAMP + n,
                                headers=[("n", b"%d" % n)])
            for n in range(COUNT)
        ]
        placed = [await future for future in sent]
    finally:
        await producer.stop()
    return [(metadata.partition, metadata.offset) for metadata in placed]


async def consume(bootstrap: str, start: dict[int, int | None]) -> list[tuple[int, int, bytes, bytes, int, list]]:
    """Each partition from its start (None: from the timestamp TIMESTAMP + 20), to its end."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False)
    await consumer.start()
    try:
        partitions = [TopicPartition("orders", p) for p in start]
        consumer.assign(partitions)
        found = await consumer.offsets_for_times(dict.fromkeys(partitions, TIMESTAMP + 20))
        for tp in partitions:
            offset = start[tp.partition]
            consumer.seek(tp, found[tp].offset if offset is None else offset)
        ends = await consumer.end_offsets(partitions)
        got = []
        while [tp for tp in partitions if await consumer.position(tp) < ends[tp]]:
            for messages in (await consumer.getmany(timeout_ms=2000)).values():
                got += [(m.partition, m.offset, m.key, m.value, m.timestamp, list(m.headers)) for m in messages]
        return sorted(got)
    finally:
        await consumer.stop()


@pytest.mark.parametrize("acks", [1, "all"])
@pytest.mark.parametrize("codec", CODECS)
def test_aiokafka_produces_with_every_codec_and_consumes_from_the_beginning_and_a_timestamp(
    agent: RunningAgent, codec: str | None, acks: int | str,
) -> None:
    placed = asyncio.run(produce(agent.bootstrap, codec, acks))
    assert sorted(placed) == sorted((n % 2, n // 2) for n in range(COUNT))
    records = [(n % 2, n // 2, b"k%d" % n, b"v%d" % n, TIMESTAMP + n, [("n", b"%d" % n)]) for n in range(COUNT)]
    assert asyncio.run(consume(agent.bootstrap, {0: 0, 1: 0})) == sorted(records)
    assert asyncio.run(consume(agent.bootstrap, {0: None, 1: None})) == sorted(r for r in records if r[4] >= TIMESTAMP + 20)


@pytest.mark.skipif(shutil.which("kcat") is None, reason="Debian's kcat is installed by `make deps`")
def test_kcat_consumes_from_a_timestamp(agent: RunningAgent) -> None:
    asyncio.run(produce(agent.bootstrap, "lz4", "all"))
    done = subprocess.run(
        ["kcat", "-b", agent.bootstrap, "-C", "-t", "orders", "-p", "0", "-o", f"s@{TIMESTAMP + 20}", "-e", "-f", "%o %k %s %T\\n"],
        capture_output=True, text=True, timeout=30,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"{n // 2} k{n} v{n} {TIMESTAMP + n}" for n in range(20, COUNT, 2)]
