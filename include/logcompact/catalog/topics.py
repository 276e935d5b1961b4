"""Topics and their partitions in the catalog: the rows each transaction reads of the topics it names (configs and
partitions are never cached: topics are deleted, made again under their name, grown and altered), and the
statements that create, alter, grow and delete them. Functions of a Connection, called by `Catalog` inside its
transactions, which take the version row after the topic rows they lock.
"""

from __future__ import annotations

import json
from collections.abc import Collection
from functools import lru_cache
from typing import NamedTuple

from sqlalchemy import Connection, Select, any_, bindparam, delete, func, insert, or_, select, union_all, update
from sqlalchemy.dialects.postgresql import ARRAY
from sqlalchemy.engine import Row

from logcompact.catalog import holes, summaries
from logcompact.catalog import schema as s
from logcompact.catalog.database import first_line, one_of
from logcompact.exceptions import CorruptDataError, LogcompactError, TopicExistsError, TopicNotFoundError
from logcompact.topics import Topic

# Where `rows` leaves whether each topic it read is compacted, for `files.insert_file_rows` in the same transaction.
COMPACTED = "logcompact_compacted_topics"
# Row locks `rows` takes.
SHARED, EXCLUSIVE = "shared", "exclusive"


def rows(connection: Connection, names: set[str], lock: str | None = None) -> dict[str, tuple[int, int]]:
    """(topic id, partitions) of each named live topic, read in the caller's transaction; an unknown one is
    TopicNotFoundError. Whether each is compacted is left in the connection's info for `files.insert_file_rows` of the
    same transaction. With `lock` (SHARED or EXCLUSIVE), the rows are locked until commit, in topic id order:
    an append holds its topics shared so that no topic it writes is deleted, altered or grown under it."""
    if not names:
        return {}
    dialect = connection.dialect.name
    query = _ROWS.get((dialect, lock))
    if query is None:
        query = _ROWS[(dialect, lock)] = _rows_query(dialect, lock)
    ordered = sorted(names)
    rows = connection.execute(query, {"names": ordered if dialect == "postgresql" else json.dumps(ordered)}).all()
    found = {row.name: (row.topic_id, row.partitions) for row in rows}
    for name in sorted(names - found.keys()):
        raise not_found(name)
    compacted = connection.info.setdefault(COMPACTED, {})
    compacted.update({row.name: _compacted(*row) for row in rows})
    return found


# `rows`' statements, by dialect and lock, built once: the names bound as one parameter (an array, a JSON list), so
# that each run binds it as it is, where an IN list was built and rendered again for every run (0.8 ms of the 1 an
# append's read of its topics took).
_ROWS: dict[tuple[str, str | None], Select] = {}


def _rows_query(dialect: str, lock: str | None) -> Select:
    topics = s.topics.c
    if dialect == "postgresql":
        named = topics.name == any_(bindparam("names", type_=ARRAY(topics.name.type)))
    else:
        named = topics.name.in_(select(func.json_each(bindparam("names")).table_valued("value").c.value))
    query = select(topics.name, topics.topic_id, topics.partitions, topics.config, topics.created_ms).where(named, topics.deleted_version.is_(None))
    if lock is not None:
        query = query.order_by(topics.topic_id).with_for_update(read=lock == SHARED)
    return query


@lru_cache(maxsize=4096)
def _compacted(name: str, topic_id: int, partitions: int, config: str, created_ms: int) -> bool:
    """Whether a topics row's topic is compacted, its row checked (`of_row`): once per row as read, for the commits
    that read it again and again (an agent's appends)."""
    return of_row(_TopicRow(name, topic_id, partitions, config, created_ms)).config.compacted


class _TopicRow(NamedTuple):
    name: str
    topic_id: int
    partitions: int
    config: str
    created_ms: int


def rows_by_id(connection: Connection, ids: set[int], lock: str | None = None) -> dict[int, tuple[str, int]]:
    """(name, partitions) of each live topic of `ids`, by topic id; a deleted one is left out. With `lock`, the rows
    are locked until commit in topic id order, as `rows` locks them."""
    if not ids:
        return {}
    topics = s.topics.c
    query = select(topics.topic_id, topics.name, topics.partitions).where(
        one_of(topics.topic_id, sorted(ids), connection.dialect.name), topics.deleted_version.is_(None)
    )
    if lock is not None:
        query = query.order_by(topics.topic_id).with_for_update(read=lock == SHARED)
    return {row.topic_id: (row.name, row.partitions) for row in connection.execute(query)}


def topic_id(connection: Connection, name: str) -> int:
    return rows(connection, {name})[name][0]


def at_version(connection: Connection, version: int) -> tuple[dict[str, Topic], dict[str, int]]:
    """The topics of manifest version `version` (created at or before it, not deleted at or before it), as they
    are now (configs and partitions), and their topic ids, by name."""
    topics = s.topics.c
    rows = connection.execute(
        select(s.topics).where(topics.created_version <= version, or_(topics.deleted_version.is_(None), topics.deleted_version > version))
    ).all()
    return {row.name: of_row(row) for row in rows}, {row.name: row.topic_id for row in rows}


def live_topic(connection: Connection, name: str) -> Topic:
    row = connection.execute(select(s.topics).where(s.topics.c.name == name, s.topics.c.deleted_version.is_(None))).first()
    if row is None:
        raise not_found(name)
    return of_row(row)


def names(connection: Connection, topic_ids: Collection[int] | None = None) -> dict[int, str]:
    """Every topic's name by topic id, or those of `topic_ids`; deleted topics' too (rows that name them may outlive
    them for a while)."""
    query = select(s.topics.c.topic_id, s.topics.c.name)
    if topic_ids is not None:
        query = query.where(one_of(s.topics.c.topic_id, sorted(topic_ids), connection.dialect.name))
    return {row.topic_id: row.name for row in connection.execute(query)}


def create(connection: Connection, topic: Topic, version: int) -> None:
    """A topic's row and its partitions' at offset 0, created in `version`; a live topic of its name is TopicExistsError."""
    live = s.topics.c.deleted_version.is_(None)
    if connection.execute(select(s.topics.c.topic_id).where(s.topics.c.name == topic.name, live)).first():
        raise TopicExistsError(f"topic {topic.name!r} already exists; describe it with `logcompact topic describe`")
    topic_id = connection.execute(
        insert(s.topics)
        .values(
            name=topic.name, partitions=topic.partitions, config=json.dumps(topic.config.to_kafka()),
            created_ms=topic.created_ms, created_version=version,
        )
        .returning(s.topics.c.topic_id)
    ).scalar_one()
    connection.execute(
        insert(s.partitions), [{"topic_id": topic_id, "partition": p, "next_offset": 0, "assigned_end": 0} for p in range(topic.partitions)]
    )


def set_config(connection: Connection, name: str, altered: Topic) -> None:
    connection.execute(
        update(s.topics).where(s.topics.c.name == name, s.topics.c.deleted_version.is_(None)).values(config=json.dumps(altered.config.to_kafka()))
    )


def grow(connection: Connection, topic_id: int, current: Topic, count: int) -> None:
    """`count` partitions for the topic, the new ones at offset 0."""
    connection.execute(update(s.topics).where(s.topics.c.topic_id == topic_id).values(partitions=count))
    connection.execute(
        insert(s.partitions), [{"topic_id": topic_id, "partition": p, "next_offset": 0, "assigned_end": 0} for p in range(current.partitions, count)]
    )


class LogOffsets(NamedTuple):
    """A partition's log start offset, high watermark (its next offset) and last stable offset (LSO): the first offset
    of its earliest open transaction's data, else its high watermark, never below its log start."""

    log_start: int
    high_watermark: int
    last_stable: int


def offsets(connection: Connection, name: str) -> list[LogOffsets]:
    """Each partition's log offsets, by partition, in one statement: the LSO is read with the high watermark."""
    part, tp = s.partitions.c, s.transaction_partitions.c
    found = topic_id(connection, name)
    unstable = (
        select(func.min(tp.first_offset)).where(tp.topic_id == part.topic_id, tp.partition == part.partition).scalar_subquery()
    )
    rows = connection.execute(
        select(part.log_start_offset, part.next_offset, func.coalesce(unstable, part.next_offset).label("stable"))
        .where(part.topic_id == found).order_by(part.partition)
    )
    return [LogOffsets(r.log_start_offset, r.next_offset, max(r.log_start_offset, r.stable)) for r in rows]


# Why DeleteRecords refused a partition (`delete_records`), each Kafka's error of the same name.
UNKNOWN_PARTITION, POLICY_VIOLATION, OFFSET_OUT_OF_RANGE = "unknown partition", "policy violation", "offset out of range"
HIGH_WATERMARK = -1  # DeleteRecords' offset meaning the partition's high watermark, as Kafka's
DELETE_RECORDS = "delete records"  # the operation of its versions


class RecordsDeleted(NamedTuple):
    """A partition's answer to DeleteRecords: its log start offset after it (Kafka's low watermark), or why it was
    refused (`refusal`, one of the constants above, with a one-line `message`; the low watermark is then -1)."""

    low_watermark: int
    refusal: str | None = None
    message: str = ""


def delete_records(connection: Connection, topic_id: int, topic: Topic, before: dict[int, int]) -> dict[int, RecordsDeleted]:
    """Kafka's DeleteRecords (`Partition.deleteRecordsOnLeader`) for each partition of `before`: its log start raised
    to the offset given (HIGH_WATERMARK: its high watermark), never lowered. Refused for a topic whose cleanup.policy
    lacks `delete`, for an offset beyond the high watermark or below -1, and for a partition the topic does not
    have. The partitions' rows are locked in order; the caller takes the version row after them, then retires what the
    new log starts left behind (`retire_below_log_starts`)."""
    found: dict[int, RecordsDeleted] = {}
    part = s.partitions.c
    for partition in sorted(before):
        if not 0 <= partition < topic.partitions:
            found[partition] = RecordsDeleted(-1, UNKNOWN_PARTITION, f"topic {topic.name!r} has partitions 0 to {topic.partitions - 1}, not {partition}")
        elif "delete" not in topic.config.cleanup_policy:
            found[partition] = RecordsDeleted(-1, POLICY_VIOLATION, f"records of {topic.name}/{partition} cannot be deleted: its cleanup.policy "
                                              f"is {topic.config.cleanup_policy!r}; add delete to it")
    wanted = sorted(p for p in before if p not in found)
    if not wanted:
        return found
    rows = connection.execute(
        select(part.partition, part.log_start_offset, part.next_offset).where(part.topic_id == topic_id, part.partition.in_(wanted))
        .order_by(part.partition).with_for_update()
    ).all()
    for partition, log_start, high_watermark in rows:
        offset = high_watermark if before[partition] == HIGH_WATERMARK else before[partition]
        if not 0 <= offset <= high_watermark:
            found[partition] = RecordsDeleted(-1, OFFSET_OUT_OF_RANGE, f"cannot delete {topic.name}/{partition} before offset {before[partition]}: "
                                              f"give an offset from 0 to its high watermark {high_watermark}, or -1 for the high watermark")
        elif offset > log_start:
            connection.execute(update(s.partitions).where(part.topic_id == topic_id, part.partition == partition).values(log_start_offset=offset))
            found[partition] = RecordsDeleted(offset)
        else:
            found[partition] = RecordsDeleted(log_start)
    return found


def retire_below_log_starts(connection: Connection, topic_id: int, starts: dict[int, int], version: int, now_ms: int) -> None:
    """After DeleteRecords raised the log starts `starts` (by partition) in `version`: the partitions' sections wholly
    below their log start retired, the files left with no live section removed (gc collects them), and the rows of
    `partition_summaries` of the partitions that lost a section above L0 set again. A section holding the log start
    stays live whole: readers start at the log start within it.

    The version is recorded among the committed plans' (as `delete-records-VERSION`), the record kept for ever of the
    versions that retire sections and remove files (`schema.removal_recorded`): the commit log is trimmed, and gc
    would then take what this version removed for a damaged row's doing, and keep it."""
    sec, files = s.sections.c, s.files.c
    dialect = connection.dialect.name
    holding: set[int] = set()
    emptied_above_l0: set[tuple[int, int]] = set()
    for partition, start in sorted(starts.items()):
        below = select(sec.file_id, sec.level).where(sec.topic_id == topic_id, sec.partition == partition, sec.removed_version.is_(None),
                                                     sec.last_offset < start)
        found = connection.execute(union_all(*s.by_partition(below))).all()
        if not found:
            continue
        ids = sorted({file_id for file_id, _ in found})
        holding.update(ids)
        if any(level > 0 for _, level in found):
            emptied_above_l0.add((topic_id, partition))
        connection.execute(
            update(s.sections).where(one_of(sec.file_id, ids, dialect), sec.topic_id == topic_id, sec.partition == partition,
                                     sec.removed_version.is_(None), sec.last_offset < start)
            .values(removed_version=version)
        )
    if not holding:
        return
    connection.execute(insert(s.committed_plans).values(plan_id=f"delete-records-{version}", version=version, committed_ms=now_ms))
    still_live = select(sec.file_id).where(sec.file_id == files.file_id, sec.removed_version.is_(None)).exists()
    connection.execute(
        update(s.files).where(one_of(files.file_id, sorted(holding), dialect), files.removed_version.is_(None), ~still_live)
        .values(removed_version=version, removed_ms=now_ms)
    )
    summaries.settle(connection, emptied_above_l0, {}, version)


def delete_topic(connection: Connection, topic_id: int, name: str, version: int, now_ms: int) -> None:
    """Delete a topic in `version`: its row marked deleted, its sections retired and the files left with no live
    section removed, its compaction holes, producers' batches, uncleanable marks and consumer groups' committed offsets
    dropped."""
    sec, files = s.sections.c, s.files.c
    dialect = connection.dialect.name
    connection.execute(update(s.topics).where(s.topics.c.topic_id == topic_id).values(deleted_version=version))
    live_sections = select(sec.file_id).where(sec.topic_id == topic_id, sec.removed_version.is_(None))
    holding = sorted(set(connection.execute(union_all(*s.by_partition(live_sections))).scalars()))
    connection.execute(
        update(s.sections).where(one_of(sec.file_id, holding, dialect), sec.topic_id == topic_id, sec.removed_version.is_(None))
        .values(removed_version=version)
    )
    still_live = select(sec.file_id).where(sec.file_id == files.file_id, sec.removed_version.is_(None)).exists()
    connection.execute(
        update(s.files).where(one_of(files.file_id, holding, dialect), files.removed_version.is_(None), ~still_live)
        .values(removed_version=version, removed_ms=now_ms)
    )
    summaries.clear_topic(connection, topic_id, version)
    holes.drop_topic(connection, topic_id)
    connection.execute(delete(s.producer_batches).where(s.producer_batches.c.topic_id == topic_id))
    connection.execute(delete(s.uncleanable).where(s.uncleanable.c.topic_id == topic_id))
    connection.execute(delete(s.group_offsets).where(s.group_offsets.c.topic == name))


def not_found(name: str) -> TopicNotFoundError:
    return TopicNotFoundError(f"topic {name!r} does not exist: create it with `logcompact topic create`")


def of_row(row: Row | _TopicRow) -> Topic:
    """A topics row as a Topic; a damaged one (config not JSON, or not configs Kafka allows) is CorruptDataError."""
    try:
        config = json.loads(row.config)
        if not isinstance(config, dict):
            raise ValueError(f"a JSON {type(config).__name__}, not an object")
        return Topic.from_dict({"name": row.name, "partitions": row.partitions, "config": config, "created_ms": row.created_ms})
    except (ValueError, TypeError, RecursionError, LogcompactError) as exc:  # JSONDecodeError is a ValueError
        raise CorruptDataError(
            f"catalog row topics {row.name!r} (topic_id {row.topic_id}) is damaged: its config {str(row.config)[:80]!r} "
            f"is not a topic config ({first_line(exc)}); restore the row from a backup, or write the topic's configs "
            "back as a JSON object of Kafka names"
        ) from None
