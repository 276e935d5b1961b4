"""What the cleaner keeps beside the manifest, as Kafka's LogCleanerManager does: which files are being compacted
(leases, each plan's seal) and which partitions are uncleanable (marks, with their backoff). Functions of a
Connection, called by `Catalog` inside its transactions.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence

from sqlalchemy import Connection, delete, func, insert, select

from logcompact.catalog import schema as s
from logcompact.catalog import topics
from logcompact.catalog.database import one_of
from logcompact.catalog.model import SetAside, TopicPartition, Uncleanable
from logcompact.exceptions import CommitConflictError
from logcompact.units import utc_iso

# An uncleanable partition is left out of plans this long after its first failure, twice as long after each
# further one, at most a day (or until its damaged file changes, or the mark is cleared).
UNCLEANABLE_BACKOFF_MS = 15 * 60_000
UNCLEANABLE_MAX_BACKOFF_MS = 24 * 3_600_000

# -- leases and seals -------------------------------------------------------------------------------------------


def lease(connection: Connection, plan_id: str, live: Mapping[str, int], keys: Sequence[str], expires_ms: int, now_ms: int,
          seal: str | None) -> None:
    """Lease the live files `keys` (their ids in `live`) to a plan, all or none: a file leased to another live plan is
    a conflict. The plan's seal is stored with its leases."""
    ids = [live[key] for key in keys]
    leased = one_of(s.leases.c.file_id, ids, connection.dialect.name)
    holder = connection.execute(
        select(s.leases.c.file_id, s.leases.c.plan_id, s.leases.c.expires_ms).where(
            leased, s.leases.c.plan_id != plan_id, s.leases.c.expires_ms > now_ms
        )
    ).first()
    if holder is not None:
        key = next(k for k, i in live.items() if i == holder.file_id)
        raise CommitConflictError(
            f"plan {plan_id}: file {key} is leased to plan {holder.plan_id} until {utc_iso(holder.expires_ms)}; "
            "re-plan after it commits or expires"
        )
    connection.execute(delete(s.leases).where(leased))  # expired leases, or this plan's own
    connection.execute(
        insert(s.leases), [{"file_id": i, "plan_id": plan_id, "expires_ms": expires_ms} for i in ids]
    )
    if seal is not None:
        connection.execute(delete(s.plan_seals).where(s.plan_seals.c.plan_id == plan_id))
        connection.execute(insert(s.plan_seals).values(plan_id=plan_id, sha256=seal))
    drop_unleased_seals(connection)  # of the expired plans this one took files from


def lost_leases(connection: Connection, plan_id: str | None, live: Mapping[str, int], removed: Sequence[str], now_ms: int) -> list[str]:
    """The files of `removed` (live, their ids in `live`) no longer leased to the plan: expired or released."""
    held = set(connection.execute(
        select(s.leases.c.file_id).where(
            one_of(s.leases.c.file_id, live.values(), connection.dialect.name), s.leases.c.plan_id == plan_id, s.leases.c.expires_ms > now_ms
        )
    ).scalars())
    return [key for key in removed if live[key] not in held]


def release(connection: Connection, plan_id: str) -> None:
    """A plan's leases and seal dropped."""
    connection.execute(delete(s.leases).where(s.leases.c.plan_id == plan_id))
    connection.execute(delete(s.plan_seals).where(s.plan_seals.c.plan_id == plan_id))


def release_files(connection: Connection, file_ids: Iterable[int]) -> None:
    """The leases on files, whichever plans hold them."""
    connection.execute(delete(s.leases).where(one_of(s.leases.c.file_id, file_ids, connection.dialect.name)))


def release_expired(connection: Connection, now_ms: int) -> list[str]:
    """Drop expired leases; the plans they named."""
    expired = connection.execute(
        select(s.leases.c.plan_id).where(s.leases.c.expires_ms <= now_ms).distinct()
    ).scalars().all()
    if expired:
        connection.execute(delete(s.leases).where(s.leases.c.expires_ms <= now_ms))
    drop_unleased_seals(connection)
    return sorted(expired)


def drop_unleased_seals(connection: Connection) -> None:
    """A plan's seal goes with its last lease, however that lease ended (released, expired, taken over by another
    plan): a plan is sealed in the transaction that leases its files, so a seal without a lease is a leftover."""
    seals = s.plan_seals.c
    connection.execute(delete(s.plan_seals).where(seals.plan_id.not_in(select(s.leases.c.plan_id))))


def plan_seal(connection: Connection, plan_id: str) -> str | None:
    return connection.execute(select(s.plan_seals.c.sha256).where(s.plan_seals.c.plan_id == plan_id)).scalar_one_or_none()


def leased_plans(connection: Connection, now_ms: int) -> set[str]:
    """Plans holding a lease that has not expired."""
    return set(connection.execute(select(s.leases.c.plan_id).where(s.leases.c.expires_ms > now_ms).distinct()).scalars())


# -- uncleanable partitions -------------------------------------------------------------------------------------


def uncleanable(connection: Connection) -> list[Uncleanable]:
    """Every partition marked uncleanable, in (topic, partition) order, with its live sections' bytes."""
    unc, sec, files = s.uncleanable.c, s.sections.c, s.files.c
    names = topics.names(connection)
    rows = connection.execute(
        select(unc.topic_id, unc.partition, unc.reason, unc.file_key, unc.file_stamp, unc.marked_ms, unc.retry_ms, unc.failures,
               unc.plan_id)
    ).all()
    live_bytes: Counter[tuple[int, int]] = Counter()
    if rows:
        sizes = (
            select(sec.topic_id, sec.partition, func.sum(sec.uncompressed_bytes))
            .join(s.files, files.file_id == sec.file_id)
            .where(sec.topic_id.in_(sorted({r.topic_id for r in rows})), sec.partition.in_(sorted({r.partition for r in rows})),
                   files.removed_version.is_(None), sec.removed_version.is_(None))
            .group_by(sec.topic_id, sec.partition)
        )
        for query in s.by_partition(sizes):
            for topic_id, partition, size in connection.execute(query).all():
                live_bytes[(topic_id, partition)] += int(size)  # PostgreSQL sums a BIGINT column as NUMERIC
    return sorted(Uncleanable._make((names[r[0]], *r[1:], live_bytes[(r.topic_id, r.partition)])) for r in rows)


def update_marks(
    connection: Connection, file_ids: Iterable[int], kept: Collection[TopicPartition], marks: Sequence[SetAside],
    stamps: Mapping[str, str], plan_id: str, now_ms: int,
) -> None:
    """Mark the partitions set aside by this commit; partitions it compacted lose their old marks."""
    marked = connection.execute(select(s.uncleanable.c.topic_id, s.uncleanable.c.partition)).all()
    if marked:
        # The marked partitions with a section among the inputs, not kept: this commit compacted them.
        sec = s.sections.c
        names = topics.names(connection)
        compacted = connection.execute(
            select(sec.topic_id, sec.partition).distinct().where(
                one_of(sec.file_id, file_ids, connection.dialect.name),
                sec.topic_id.in_(sorted({t for t, _ in marked})), sec.partition.in_(sorted({p for _, p in marked})),
            )
        ).all()
        done = {(names[t], p) for t, p in compacted if (t, p) in set(marked)} - set(kept)
        clear_marks(connection, sorted(done))
    mark_uncleanable(connection, marks, stamps, plan_id, now_ms)


def mark_uncleanable(connection: Connection, marks: Sequence[SetAside], stamps: Mapping[str, str], plan_id: str, now_ms: int) -> None:
    """Mark partitions uncleanable, or mark them again: the backoff doubles with each failure in a row. `stamps`: the
    damaged files' objects as they are now (size and modification time), by key."""
    unc = s.uncleanable.c
    for mark in marks:
        topic_id = topics.topic_id(connection, mark.topic)
        where = (unc.topic_id == topic_id, unc.partition == mark.partition)
        failures = (connection.execute(select(unc.failures).where(*where)).scalar_one_or_none() or 0) + 1
        backoff = min(UNCLEANABLE_MAX_BACKOFF_MS, UNCLEANABLE_BACKOFF_MS << min(failures - 1, 20))
        connection.execute(delete(s.uncleanable).where(*where))
        connection.execute(insert(s.uncleanable).values(
            topic_id=topic_id, partition=mark.partition, reason=mark.reason, file_key=mark.file_key,
            file_stamp=stamps.get(mark.file_key, ""), marked_ms=now_ms,
            retry_ms=now_ms + backoff, failures=failures, plan_id=plan_id,
        ))


def clear_marks(connection: Connection, partitions: Iterable[TopicPartition]) -> None:
    """Partitions a commit compacted are cleanable again."""
    for topic, partition in partitions:
        connection.execute(delete(s.uncleanable).where(
            s.uncleanable.c.topic_id == topics.topic_id(connection, topic), s.uncleanable.c.partition == partition
        ))
