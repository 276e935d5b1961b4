"""Consumer lag from the catalog: each committed offset beside its partition's high watermark, in one bounded
statement, for the agent's metrics (`kafka/metrics.py`) at scrape time. Functions of a Connection, called by
`Catalog.consumer_lags`."""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import Connection, select

from logcompact.catalog import schema as s


class PartitionLag(NamedTuple):
    group_id: str
    topic: str
    partition: int
    committed_offset: int
    high_watermark: int

    @property
    def lag(self) -> int:
        """Kafka's consumer lag (kafka-consumer-groups' LAG): the high watermark less the committed offset."""
        return self.high_watermark - self.committed_offset


def consumer_lags(connection: Connection, limit: int) -> list[PartitionLag]:
    """At most `limit` committed offsets of live topics' partitions with their high watermarks, by group, topic and
    partition (the order of group_offsets' key, so the database reads its first rows and stops)."""
    go, t, p = s.group_offsets.c, s.topics.c, s.partitions.c
    rows = connection.execute(
        select(go.group_id, go.topic, go.partition, go.committed_offset, p.next_offset)
        .join_from(s.group_offsets, s.topics, (t.name == go.topic) & t.deleted_version.is_(None))
        .join(s.partitions, (p.topic_id == t.topic_id) & (p.partition == go.partition))
        .order_by(go.group_id, go.topic, go.partition)
        .limit(limit)
    )
    return [PartitionLag(*row) for row in rows]
