"""An exactly-once copier, run as its own process so a test can SIGKILL it: a read_committed consumer in a group
(static member, no auto commit) and a transactional producer; per batch of a random size it begins a transaction,
sends what it read to the output topic's same partition, sends the consumer's positions with
send_offsets_to_transaction and commits, as Kafka's consume-transform-produce loop does.

    python -m tests.kafka.txn_copier CONFIG_JSON

CONFIG_JSON: bootstrap, transactional_id, group, input, output, ends ({partition: the input's end offset}). It prints
"ready" once its producer is initialised, then one JSON line per committed transaction (the positions it committed),
and exits 0 once the committed positions reach the ends. A transaction the agent made abortable is aborted and the
consumer goes back to the group's committed offsets; retriable errors are retried; a fatal one exits 3.
"""

from __future__ import annotations

import json
import random
import sys
from collections.abc import Callable
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

CLIENT = {"socket.timeout.ms": 10000, "reconnect.backoff.ms": 50, "reconnect.backoff.max.ms": 500, "retry.backoff.ms": 50}
TIMEOUT_S = 60


class Abortable(Exception):
    """The transaction cannot commit: abort it and read again from the committed offsets."""


def retried(call: Callable[[], Any]) -> Any:
    """`call` again while librdkafka says its error is retriable (the agent restarting, a coordinator moving)."""
    while True:
        try:
            return call()
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if error.txn_requires_abort():
                raise Abortable(str(error)) from exc
            if not error.retriable() or error.fatal():
                raise
            print(f"retrying: {error}", file=sys.stderr, flush=True)


def rewind(consumer: Consumer) -> None:
    for found in consumer.committed(consumer.assignment(), timeout=TIMEOUT_S):
        consumer.seek(TopicPartition(found.topic, found.partition, found.offset if found.offset >= 0 else OFFSET_BEGINNING))


def main(config: dict[str, Any]) -> int:
    ends = {int(partition): end for partition, end in config["ends"].items()}
    consumer = Consumer({"bootstrap.servers": config["bootstrap"], "group.id": config["group"], "group.instance.id": "copier",
                         "isolation.level": "read_committed", "enable.auto.commit": False, "auto.offset.reset": "earliest",
                         "session.timeout.ms": 30000, "heartbeat.interval.ms": 500,
                         # small fetches, so batches take from both partitions rather than one's whole backlog first
                         "max.partition.fetch.bytes": 4096, "queued.max.messages.kbytes": 16, **CLIENT})
    producer = Producer({"bootstrap.servers": config["bootstrap"], "transactional.id": config["transactional_id"], "linger.ms": 5, **CLIENT})
    producer.init_transactions(TIMEOUT_S)
    consumer.subscribe([config["input"]])
    print("ready", flush=True)
    # where a copier killed before left the group: it may have committed the whole input already
    found = consumer.committed([TopicPartition(config["input"], partition) for partition in ends], timeout=TIMEOUT_S)
    committed = {tp.partition: tp.offset for tp in found}
    rng = random.Random()
    while any(committed.get(partition, -1) < end for partition, end in ends.items()):
        messages = [m for m in consumer.consume(rng.randint(1, 50), 0.5) if m.error() is None]
        if not messages:
            continue
        producer.begin_transaction()
        try:
            for message in messages:
                producer.produce(config["output"], key=message.key(), value=message.value(), partition=message.partition())
            positions = [tp for tp in consumer.position(consumer.assignment()) if tp.offset >= 0]
            metadata = consumer.consumer_group_metadata()
            retried(lambda: producer.send_offsets_to_transaction(positions, metadata, TIMEOUT_S))  # noqa: B023 (called at once)
            retried(lambda: producer.commit_transaction(TIMEOUT_S))
        except Abortable as exc:
            print(f"aborting: {exc}", file=sys.stderr, flush=True)
            retried(lambda: producer.abort_transaction(TIMEOUT_S))
            rewind(consumer)
            continue
        committed.update((tp.partition, tp.offset) for tp in positions)
        print(json.dumps(committed), flush=True)
    consumer.close()
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(json.loads(sys.argv[1])))
    except KafkaException as exc:
        print(f"fatal: {exc}", file=sys.stderr, flush=True)
        sys.exit(3)
