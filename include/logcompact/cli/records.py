"""`logcompact produce`, `consume`, `files` and `log`: records in and out as JSON lines (`logcompact.jsonlines`), and
what the catalog holds."""

from __future__ import annotations

import sys

import click

from logcompact.cli.common import NON_NEGATIVE_INT64, Context, emit, now_option, pass_context
from logcompact.units import LONG_MAX


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@now_option
@pass_context
def produce(ctx: Context, topic_name: str) -> None:
    """Produce JSON lines from stdin to TOPIC, all or nothing; prints each record's partition and offset.

    Input lines: {"partition": int, "key": str|null, "value": str|null, "timestamp": ms, "headers": {str: str}},
    with key_b64 / value_b64 for binary data.
    """
    from logcompact.ingest import Agent
    from logcompact.jsonlines import parse_record

    # Bytes, decoded line by line: an undecodable line is named, not a traceback of the stream's decoder.
    records = [parse_record(n, line) for n, line in enumerate(sys.stdin.buffer, start=1) if line.strip()]
    with Agent(ctx.catalog, clock=ctx.clock, background=False) as agent:
        offsets_future = agent.produce(topic_name, records)
        agent.flush()
    for record, offset in zip(records, offsets_future.result()):
        emit({"partition": record.partition, "offset": offset})


@click.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--partition", type=int, required=True)
@click.option("--from-offset", type=NON_NEGATIVE_INT64, default=0, show_default=True, help="First offset to read.")
@click.option("--to-offset", type=NON_NEGATIVE_INT64, default=None, help="Stop before this offset (exclusive, like Kafka's end offsets).")
@click.option(
    "--isolation", type=click.Choice(["read_uncommitted", "read_committed"]), default="read_uncommitted", show_default=True,
    help="read_committed: only below the last stable offset, without aborted transactions' records (Kafka's isolation.level).",
)
@pass_context
def consume(ctx: Context, topic_name: str, partition: int, from_offset: int, to_offset: int | None, isolation: str) -> None:
    """Print the records of one partition in offset order, one JSON line each, as of the latest manifest
    version (the catalog is asked for that partition's sections only)."""
    from logcompact.consume import ISOLATION_LEVELS, read_records
    from logcompact.jsonlines import record_document

    snapshot = ctx.catalog.snapshot()
    for record in read_records(ctx.store, snapshot, topic_name, partition, from_offset, to_offset, ISOLATION_LEVELS[isolation]):
        emit(record_document(record))


@click.command()
@click.option("--level", type=click.IntRange(0, 4), default=None, help="Only files of this level.")
@pass_context
def files(ctx: Context, level: int | None) -> None:
    """Print one JSON line per live file in the catalog: key, level, size, creation time, records and sections."""
    from logcompact.plans import file_to_json

    for data_file in ctx.catalog.snapshot().files(level):
        emit({**file_to_json(data_file), "record_count": data_file.record_count})


@click.command()
@click.option("--limit", type=click.IntRange(1, LONG_MAX), default=20, show_default=True, help="How many commits, newest first.")
@pass_context
def log(ctx: Context, limit: int) -> None:
    """Print the catalog's newest commits, one JSON line each: manifest version, commit id, time, operation."""
    for record in ctx.catalog.commit_log(limit):
        emit({"version": record.version, "commit_id": record.commit_id, "created_ms": record.created_ms, "operation": record.operation})
