"""`logcompact topic ...`: create, describe, list, alter and delete topics, and delete a partition's records."""

from __future__ import annotations

import click

from logcompact.cli.common import Context, emit, now_option, parse_settings, pass_context


@click.group()
def topic() -> None:
    """Create, describe, list, alter and delete topics (kept in the catalog)."""


@topic.command("create")
@now_option
@click.argument("name")
@click.option("--partitions", type=int, required=True, help="Number of partitions (1 to 100000).")
@click.option("--config", "configs", multiple=True, metavar="KEY=VALUE", help="Topic config, repeatable (cleanup.policy=compact).")
@pass_context
def topic_create(ctx: Context, name: str, partitions: int, configs: tuple[str, ...]) -> None:
    """Create topic NAME (and the catalog's schema on first use); prints its description."""
    from logcompact.topics import Topic

    now = ctx.clock()
    created = Topic.create(name, partitions, parse_settings(configs), now)
    catalog = ctx.catalog
    catalog.ensure_created(now)
    catalog.create_topic(created, now)
    emit(created.to_dict())


@topic.command("describe")
@click.argument("name")
@pass_context
def topic_describe(ctx: Context, name: str) -> None:
    """Print topic NAME as JSON, with each partition's log start offset and next offset."""
    catalog = ctx.catalog
    described = catalog.snapshot().topic(name)
    offsets = catalog.log_offsets(name)
    emit({**described.to_dict(), "log_start_offsets": [o.log_start for o in offsets], "next_offsets": [o.high_watermark for o in offsets]})


@topic.command("list")
@pass_context
def topic_list(ctx: Context) -> None:
    """Print one JSON line per topic."""
    for _name, found in sorted(ctx.catalog.snapshot().topics.items()):
        emit(found.to_dict())


@topic.command("alter")
@now_option
@click.argument("name")
@click.option("--config", "configs", multiple=True, required=True, metavar="KEY=VALUE", help="Config to change, repeatable.")
@pass_context
def topic_alter(ctx: Context, name: str, configs: tuple[str, ...]) -> None:
    """Change configs of topic NAME. cleanup.policy may change as in Kafka: a topic made compacted has its older
    records compacted too, keyless ones dropped as invalid."""
    emit(ctx.catalog.alter_topic(name, parse_settings(configs), ctx.clock()).to_dict())


@topic.command("delete")
@now_option
@click.argument("name")
@pass_context
def topic_delete(ctx: Context, name: str) -> None:
    """Delete topic NAME: its records go (gc removes its files), its name is free for a new topic, consumer groups'
    offsets of it are dropped. Prints the version that deleted it."""
    emit({"deleted": name, "version": ctx.catalog.delete_topic(name, ctx.clock())})


@topic.command("delete-records")
@now_option
@click.argument("name")
@click.option("--partition", "partitions", type=int, multiple=True, required=True, help="Partition, repeatable.")
@click.option("--before", type=int, required=True, metavar="OFFSET",
              help="The partition's new log start offset: the records before it are deleted (-1: its high watermark, all of them).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per partition instead of the lines of Kafka's kafka-delete-records.")
@pass_context
def topic_delete_records(ctx: Context, name: str, partitions: tuple[int, ...], before: int, as_json: bool) -> None:
    """Delete the records of topic NAME's partitions before offset --before, as Kafka's DeleteRecords (kafka-delete-records):
    each partition's log start offset rises to it, consumers start there. Only for a topic whose cleanup.policy has
    delete. Prints each partition's log start offset after it (its low watermark); exits 1 if any was refused."""
    deleted = ctx.catalog.delete_records(name, dict.fromkeys(partitions, before), ctx.clock())
    for partition, found in sorted(deleted.items()):
        if as_json:
            emit({"topic": name, "partition": partition, "low_watermark": found.low_watermark, "error": found.refusal, "message": found.message or None})
        elif found.refusal is None:
            click.echo(f"partition: {name}-{partition}\tlow_watermark: {found.low_watermark}")
        else:
            click.echo(f"partition: {name}-{partition}\terror: {found.message}")
    if any(found.refusal is not None for found in deleted.values()):
        raise SystemExit(1)
