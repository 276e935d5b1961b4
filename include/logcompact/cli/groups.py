"""`logcompact groups ...`: consumer groups from the catalog, what Kafka's kafka-consumer-groups.sh does against a
broker: list them, describe one (each partition's committed offset, log end offset and lag, and the member it is
assigned to), reset a group's offsets (a dry run unless --execute), delete a group. Every agent's groups: the
catalog is shared. A group's state is what its coordinator last wrote (docs/agent.md)."""

from __future__ import annotations

import datetime
from typing import TYPE_CHECKING, Any

import click

from logcompact.cli.common import Context, emit, now_option, pass_context

if TYPE_CHECKING:
    from logcompact.catalog import Catalog
    from logcompact.catalog.groups import CommittedOffset, GroupRow

EMPTY = "Empty"
NO_LEADER_EPOCH = -1


@click.group()
def groups() -> None:
    """Consumer groups in the catalog, as Kafka's kafka-consumer-groups.sh: list, describe, reset-offsets, delete."""


@groups.command("list")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per group instead of the table.")
@pass_context
def groups_list(ctx: Context, as_json: bool) -> None:
    """Every consumer group: its state and protocol type. A group with committed offsets and no coordinator's row
    (offsets committed before any member joined, then the row deleted) is listed Empty, as Kafka lists it."""
    catalog = ctx.catalog
    listed = {row.group_id: (row.state, row.protocol_type) for row in catalog.groups()}
    for group_id in catalog.group_ids():
        listed.setdefault(group_id, (EMPTY, ""))
    if as_json:
        for group_id, (state, protocol_type) in sorted(listed.items()):
            emit({"group": group_id, "state": state, "protocol_type": protocol_type})
        return
    _table(["GROUP", "STATE", "PROTOCOL-TYPE"], [[group_id, state, protocol_type] for group_id, (state, protocol_type) in sorted(listed.items())])


@groups.command("describe")
@click.argument("group_id", metavar="GROUP")
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the table.")
@pass_context
def groups_describe(ctx: Context, group_id: str, as_json: bool) -> None:
    """GROUP's state, protocol and members, and per partition (committed or assigned): its committed offset, log
    end offset (the high watermark), lag, and the member it is assigned to (id, host, client id), as
    kafka-consumer-groups.sh --describe prints them. Assignments are shown once the group is Stable."""
    from logcompact.kafka.consumer_protocol import MalformedError, assigned_partitions

    catalog = ctx.catalog
    row, committed = _group(catalog, group_id)
    assigned: dict[tuple[str, int], Any] = {}
    members = []
    for member in row.members if row is not None else ():
        try:
            partitions = assigned_partitions(member.assignment) if row is not None and row.state == "Stable" else []
        except MalformedError:
            partitions = []  # not a Kafka consumer's assignment (another protocol type): the member is shown without partitions
        for key in partitions:
            assigned[key] = member
        members.append({"member_id": member.member_id, "group_instance_id": member.instance_id, "client_id": member.client_id,
                        "host": member.client_host, "partitions": [[topic, partition] for topic, partition in partitions]})
    log_ends = _log_ends(catalog, {topic for topic, _ in (*committed, *assigned)})
    partitions_shown = []
    for topic, partition in sorted({*committed, *assigned}):
        offset = committed[(topic, partition)].offset if (topic, partition) in committed else None
        end = log_ends.get(topic, {}).get(partition)
        owner = assigned.get((topic, partition))
        partitions_shown.append({
            "topic": topic, "partition": partition, "committed_offset": offset, "log_end_offset": end,
            "lag": None if offset is None or end is None else max(end - offset, 0),
            "member_id": owner.member_id if owner else None, "host": owner.client_host if owner else None,
            "client_id": owner.client_id if owner else None,
        })
    described: dict[str, Any] = {
        "group": group_id, "state": row.state if row is not None else EMPTY, "protocol_type": row.protocol_type if row is not None else "",
        "protocol": row.protocol if row is not None else "", "coordinator": row.coordinator if row is not None else None,
        "generation": row.generation if row is not None else 0, "members": members, "partitions": partitions_shown,
    }
    if as_json:
        emit(described)
        return
    protocol = "/".join(name for name in (described["protocol_type"], described["protocol"]) if name) or "none"
    click.echo(f"group {group_id}: {described['state']}, protocol {protocol}, generation {described['generation']}, {len(members)} members")
    _table(["GROUP", "TOPIC", "PARTITION", "CURRENT-OFFSET", "LOG-END-OFFSET", "LAG", "CONSUMER-ID", "HOST", "CLIENT-ID"], [
        [group_id, p["topic"], p["partition"], _shown(p["committed_offset"]), _shown(p["log_end_offset"]), _shown(p["lag"]),
         _shown(p["member_id"]), _shown(p["host"]), _shown(p["client_id"])]
        for p in partitions_shown
    ])


@groups.command("reset-offsets")
@now_option
@click.argument("group_id", metavar="GROUP")
@click.option("--topic", "topics", multiple=True, metavar="TOPIC[:P[,P...]]",
              help="A topic's partitions to reset, all of them or those listed; repeatable.")
@click.option("--all-topics", is_flag=True, help="Every partition the group has committed offsets for.")
@click.option("--to-earliest", is_flag=True, help="To each partition's log start offset.")
@click.option("--to-latest", is_flag=True, help="To each partition's log end offset (its high watermark).")
@click.option("--to-offset", type=int, default=None, metavar="N", help="To offset N (within the log's start and end).")
@click.option("--to-datetime", default=None, metavar="ISO",
              help="To the first record at or after this time, ISO 8601 (2026-12-03T10:00:00, UTC unless it names an offset "
                   "such as +02:00); the log end where none is.")
@click.option("--shift-by", type=int, default=None, metavar="N", help="By N (negative: back) from each committed offset, within the log.")
@click.option("--execute", is_flag=True, help="Store the new offsets; without it, only print the plan.")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per partition instead of the table.")
@pass_context
def groups_reset_offsets(ctx: Context, group_id: str, topics: tuple[str, ...], all_topics: bool, to_earliest: bool, to_latest: bool,
                         to_offset: int | None, to_datetime: str | None, shift_by: int | None, execute: bool, as_json: bool) -> None:
    """Reset GROUP's committed offsets of the partitions named, as kafka-consumer-groups.sh --reset-offsets: a dry run
    printing each partition's new offset unless --execute, which stores them. Only a group without members (Empty)
    or one that does not exist yet (it is made, Empty) can be reset: stop its consumers first."""
    chosen = [name for name, given in (("--to-earliest", to_earliest), ("--to-latest", to_latest), ("--to-offset", to_offset is not None),
                                       ("--to-datetime", to_datetime is not None), ("--shift-by", shift_by is not None)) if given]
    if len(chosen) != 1:
        raise click.UsageError(f"give exactly one of --to-earliest, --to-latest, --to-offset, --to-datetime, --shift-by (given: {', '.join(chosen) or 'none'})")
    if bool(topics) == all_topics:
        raise click.UsageError("give --topic TOPIC[:P,...] (repeatable) or --all-topics")
    at_ms = _parse_datetime(to_datetime) if to_datetime is not None else None
    catalog, now = ctx.catalog, ctx.clock()
    row = catalog.group(group_id)
    if row is not None and row.state != EMPTY:
        raise _not_empty(group_id, row.state, "reset its offsets")
    committed = catalog.committed_offsets(group_id)
    partitions = sorted(committed) if all_topics else _partitions(catalog, topics)
    planned: dict[tuple[str, int], int] = {}
    snapshot = catalog.snapshot()
    for topic in sorted({topic for topic, _ in partitions}):
        if topic not in snapshot.topics:
            raise click.ClickException(f"topic {topic!r} does not exist (its offsets were dropped with it): `logcompact topic list` lists the topics")
        bounds = catalog.log_offsets(topic)
        for _, partition in (key for key in partitions if key[0] == topic):
            log_start, log_end = bounds[partition].log_start, bounds[partition].high_watermark
            if to_earliest:
                target = log_start
            elif to_latest:
                target = log_end
            elif to_offset is not None:
                target = to_offset
            elif at_ms is not None:
                target = _offset_at(catalog, snapshot, topic, partition, log_start, log_end, at_ms)
            else:
                previous = committed.get((topic, partition))
                if previous is None:
                    raise click.ClickException(f"cannot shift the offset of {topic}/{partition}: group {group_id!r} has none committed there; "
                                               "use --to-earliest, --to-latest or --to-offset for it")
                target = previous.offset + (shift_by or 0)
            planned[(topic, partition)] = min(max(target, log_start), log_end)  # within the log, as Kafka's checkOffsetsRange
    if execute:
        from logcompact.catalog.groups import CommittedOffset

        refused = catalog.reset_offsets(group_id, {key: CommittedOffset(offset, NO_LEADER_EPOCH, "", now) for key, offset in planned.items()}, now)
        if refused is not None:
            raise _not_empty(group_id, refused, "reset its offsets")
    elif not as_json:
        click.echo("dry run: nothing stored; add --execute to store these offsets", err=True)
    rows = [{"group": group_id, "topic": topic, "partition": partition, "new_offset": offset,
             "previous_offset": committed[(topic, partition)].offset if (topic, partition) in committed else None, "executed": execute}
            for (topic, partition), offset in sorted(planned.items())]
    if as_json:
        for shown in rows:
            emit(shown)
        return
    _table(["GROUP", "TOPIC", "PARTITION", "NEW-OFFSET"], [[group_id, r["topic"], r["partition"], r["new_offset"]] for r in rows])


@groups.command("delete")
@click.argument("group_id", metavar="GROUP")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the sentence.")
@pass_context
def groups_delete(ctx: Context, group_id: str, as_json: bool) -> None:
    """Delete GROUP, a group without members (Empty), with its committed offsets, as kafka-consumer-groups.sh
    --delete. A group with members is refused: stop its consumers first."""
    from logcompact.catalog.groups import Deletion

    catalog = ctx.catalog
    row = catalog.group(group_id)
    deleted = catalog.delete_group(group_id)
    if deleted is Deletion.NOT_FOUND:
        raise _no_group(group_id)
    if deleted is Deletion.NOT_EMPTY:
        raise _not_empty(group_id, row.state if row is not None else "not Empty", "delete it")
    if as_json:
        emit({"deleted": group_id})
        return
    click.echo(f"deleted consumer group {group_id!r} and its committed offsets")


def _group(catalog: Catalog, group_id: str) -> tuple[GroupRow | None, dict[tuple[str, int], CommittedOffset]]:
    row, committed = catalog.group(group_id), catalog.committed_offsets(group_id)
    if row is None and not committed:
        raise _no_group(group_id)
    return row, committed


def _log_ends(catalog: Catalog, topics: set[str]) -> dict[str, dict[int, int]]:
    """Each partition's high watermark, by topic, of the topics that exist."""
    live = catalog.snapshot().topics
    return {topic: {partition: offsets.high_watermark for partition, offsets in enumerate(catalog.log_offsets(topic))}
            for topic in sorted(topics) if topic in live}


def _partitions(catalog: Catalog, given: tuple[str, ...]) -> list[tuple[str, int]]:
    """The partitions of --topic TOPIC[:P[,P...]] options, each checked against the topic's partitions."""
    known = catalog.snapshot().topics
    chosen: set[tuple[str, int]] = set()
    for option in given:
        name, _, listed = option.partition(":")
        topic = known.get(name)
        if topic is None:
            raise click.BadParameter(f"topic {name!r} does not exist: `logcompact topic list` lists the topics", param_hint="--topic")
        if not listed:
            chosen.update((name, partition) for partition in range(topic.partitions))
            continue
        for text in listed.split(","):
            if not text.strip().isdigit() or int(text) >= topic.partitions:
                raise click.BadParameter(f"{option!r}: {text!r} is not a partition of {name!r} (0 to {topic.partitions - 1})", param_hint="--topic")
            chosen.add((name, int(text)))
    return sorted(chosen)


def _parse_datetime(text: str) -> int:
    try:
        moment = datetime.datetime.fromisoformat(text)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an ISO 8601 time (2026-12-03T10:00:00, or with an offset: 2026-12-03T10:00:00+02:00)",
                                 param_hint="--to-datetime") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def _offset_at(catalog: Catalog, snapshot: Any, topic: str, partition: int, log_start: int, log_end: int, at_ms: int) -> int:
    """The offset of the first record at or after `at_ms` (Kafka's offsetsForTimes); the log end when none is. The
    sections before the first whose newest record reaches the time hold only older records, so reading starts there."""
    from logcompact.consume import read_batches

    sections = [section for _, section in snapshot.sections_of(topic, partition, log_start, log_end)]
    first = next((section for section in sections if section.info.max_timestamp >= at_ms), None)
    if first is None:
        return log_end
    for table in read_batches(catalog.store, snapshot, topic, partition, max(first.first_offset, log_start), log_end):
        hits = (table.column("timestamp").to_numpy() >= at_ms).nonzero()[0]
        if len(hits):
            return int(table.column("offset")[int(hits[0])].as_py())
    return log_end


def _no_group(group_id: str) -> click.ClickException:
    return click.ClickException(f"consumer group {group_id!r} does not exist: `logcompact groups list` lists the groups")


def _not_empty(group_id: str, state: str, what: str) -> click.ClickException:
    return click.ClickException(f"consumer group {group_id!r} has members (it is {state}): stop its consumers, so it is Empty, to {what}")


def _shown(value: Any) -> str:
    return "-" if value is None or value == "" else str(value)


def _table(header: list[str], rows: list[list[Any]]) -> None:
    cells = [header, *[[str(cell) for cell in row] for row in rows]]
    widths = [max(len(row[n]) for row in cells) for n in range(len(header))]
    for row in cells:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
