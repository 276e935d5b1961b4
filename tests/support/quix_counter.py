"""A quixstreams application with exactly-once processing that counts records per key, for tests/kafka/test_quixstreams.py.

Run by the quixstreams virtualenv's python (requirements-quixstreams.txt; quixstreams needs an older confluent-kafka
than the project's), never imported by the suite:

    quix_counter.py BOOTSTRAP STATE_DIR INPUT OUTPUT

Each input record adds one to its key's count, kept in a RocksDB-backed store whose changelog is a compacted topic;
a record whose value is `reset` deletes the key's count (a tombstone in the changelog). The new count (0 after a
reset) goes to OUTPUT under the same key. The transactional.id is fixed, as for one instance of a deployed
application: a restarted instance fences its killed predecessor, whose open transaction is aborted at once instead
of holding readers until its timeout.
"""

import sys

from quixstreams import Application, State

GROUP = "quix-counter"


def count(value: bytes, state: State) -> int:
    if value == b"reset":
        state.delete("count")
        return 0
    counted = state.get("count", 0) + 1
    state.set("count", counted)
    return counted


def main(bootstrap: str, state_dir: str, input_topic: str, output_topic: str) -> None:
    app = Application(
        broker_address=bootstrap,
        consumer_group=GROUP,
        processing_guarantee="exactly-once",
        auto_offset_reset="earliest",
        commit_interval=0.5,  # many transactions, so a kill lands inside one
        state_dir=state_dir,
        producer_extra_config={"transactional.id": GROUP, "transaction.timeout.ms": 30_000},
        # the killed instance's member leaves the group within 6 s, not the default 45 s
        consumer_extra_config={"session.timeout.ms": 6_000, "heartbeat.interval.ms": 1_000},
    )
    source = app.topic(input_topic, key_deserializer="str", value_deserializer="bytes")
    counts = app.topic(output_topic, key_serializer="str", value_serializer="int")
    app.dataframe(source).apply(count, stateful=True).to_topic(counts)
    app.run()


if __name__ == "__main__":
    main(*sys.argv[1:])
