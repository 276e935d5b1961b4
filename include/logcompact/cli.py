"""The `logcompact` command line. Other tools script against it: its arguments and JSON lines are a contract.

Every command reads the store from `--store` or LOGCOMPACT_STORE, the catalog database from `--catalog` or
LOGCOMPACT_CATALOG (a file:// store has its own SQLite catalog without one; an s3:// store needs one) and
the clock from `--now` or LOGCOMPACT_NOW_MS (wall clock otherwise). Errors print one line to stderr and
exit 1; usage errors exit 2.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import stat
import sys
from pathlib import Path
from typing import Any

import click
from sqlalchemy.exc import SQLAlchemyError

from logcompact.catalog import Catalog, Snapshot
from logcompact.catalog.database import redact_text
from logcompact.catalog.schema import SCHEMA_VERSION
from logcompact.consume import read_records
from logcompact.exceptions import ClusterNotFoundError, CorruptDataError, InvalidPlanError, InvalidRecordError, InvalidStoreUriError, LogcompactError
from logcompact.ingest import DEFAULT_FLUSH_BYTES, DEFAULT_FLUSH_INTERVAL_MS, Agent, Record, wall_clock_ms
from logcompact.jobs import DEFAULT_GC_GRACE_MS, collect_garbage, prepare_plans, run_and_commit, run_here
from logcompact.jobs.documents import HEADER_NAME, read_plan, write_plan
from logcompact.jobs.gc import DEFAULT_MAX_ORPHAN_SHARE
from logcompact.plan import MAX_BUFFER_BYTES, MAX_BYTE_COUNT, MAX_TARGET_FILE_BYTES, MIN_BUFFER_BYTES, Plan, file_to_json
from logcompact.planner import MODES, PlannerConfig, check_topics, choose_plans, expected_effect
from logcompact.store import LocalStore, ObjectStore, open_store
from logcompact.topics import LONG_MAX, MAX_PARTITIONS, Topic

MAX_ROUNDS = 100


class Context:
    def __init__(self, store_uri: str | None, catalog_url: str | None, now_ms: int | None, aws_conn_id: str | None) -> None:
        self._store_uri = store_uri
        self._catalog_url = catalog_url
        self._aws_conn_id = aws_conn_id
        self._store: ObjectStore | None = None
        self._catalog: Catalog | None = None
        self.now_ms = now_ms

    @property
    def store(self) -> ObjectStore:
        if self._store is None:
            if not self._store_uri:
                raise click.UsageError("no store given: pass --store URI or set LOGCOMPACT_STORE")
            store = open_store(self._store_uri, aws_conn_id=self._aws_conn_id)
            if isinstance(store, LocalStore) and (problem := _directory_problem(store.root)):
                raise InvalidStoreUriError(f"store {self._store_uri}: {problem}; pass the directory of a store (file:///path/to/store)")
            self._store = store
        return self._store

    @property
    def catalog(self) -> Catalog:
        if self._catalog is None:
            self._catalog = Catalog(self.store, self._catalog_url)
        return self._catalog

    def clock(self) -> int:
        return self.now_ms if self.now_ms is not None else wall_clock_ms()


pass_context = click.make_pass_decorator(Context)
# Times in ms and offsets: the catalog keeps them as 64-bit integers, never negative.
NON_NEGATIVE_INT64 = click.IntRange(0, LONG_MAX)


def _directory_problem(directory: Path) -> str | None:
    """Why `directory` cannot be used or created (a file at it or above it, a name too long), or None."""
    for path in (directory, *directory.parents):
        try:
            found = os.stat(path)
        except (FileNotFoundError, NotADirectoryError):  # look further up, for the file in the way
            continue
        except OSError as exc:
            return f"{exc.strerror}: {path}"
        return None if stat.S_ISDIR(found.st_mode) else f"{path} is a file, not a directory"
    return None


def _set_now(ctx: click.Context, _param: click.Parameter, value: int | None) -> None:
    if value is not None:
        ctx.ensure_object(Context).now_ms = value


# Every command that depends on time takes --now itself too (`logcompact compact --now MS`).
now_option = click.option(
    "--now", type=NON_NEGATIVE_INT64, metavar="MS", expose_value=False, callback=_set_now,
    help="Clock in epoch ms (overrides the global --now).",
)


def _emit(document: Any) -> None:
    click.echo(json.dumps(document, separators=(",", ":")))


def _parse_settings(pairs: tuple[str, ...]) -> dict[str, str]:
    settings = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE (for example cleanup.policy=compact)", param_hint="--config")
        settings[name.strip()] = value.strip()
    return settings


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.option("--store", envvar="LOGCOMPACT_STORE", metavar="URI", help="file:///path or s3://bucket/prefix [env LOGCOMPACT_STORE].")
@click.option("--catalog", "catalog_url", envvar="LOGCOMPACT_CATALOG", metavar="URL",
              help="Catalog database: postgresql+psycopg://USER:PASSWORD@HOST/DB or sqlite:////path/catalog.db; "
                   "needed for an s3:// store, a file:// store defaults to its own catalog.db [env LOGCOMPACT_CATALOG].")
@click.option("--now", "now_ms", envvar="LOGCOMPACT_NOW_MS", type=NON_NEGATIVE_INT64, metavar="MS",
              help="Clock in epoch ms [env LOGCOMPACT_NOW_MS].")
@click.option("--aws-conn-id", envvar="LOGCOMPACT_AWS_CONN_ID", metavar="ID", help="Airflow AWS connection for s3:// stores.")
@click.option("-v", "--verbose", is_flag=True, help="Log progress to stderr.")
@click.pass_context
def cli(ctx: click.Context, store: str | None, catalog_url: str | None, now_ms: int | None, aws_conn_id: str | None,
        verbose: bool) -> None:
    """Key-based compaction for a Kafka-style log kept as segment files in object storage.

    A cluster is its store (data files, plans) and its catalog database (topics, offsets, live files).
    """
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING, format="logcompact: %(levelname)s: %(message)s")
    ctx.obj = Context(store, catalog_url or None, now_ms, aws_conn_id)


# -- topics ------------------------------------------------------------------------------------------


@cli.group()
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
    now = ctx.clock()
    created = Topic.create(name, partitions, _parse_settings(configs), now)
    catalog = ctx.catalog
    catalog.ensure_created(now)
    catalog.create_topic(created, now)
    _emit(created.to_dict())


@topic.command("describe")
@click.argument("name")
@pass_context
def topic_describe(ctx: Context, name: str) -> None:
    """Print topic NAME as JSON, with each partition's next offset."""
    catalog = ctx.catalog
    described = catalog.snapshot().topic(name)
    _emit({**described.to_dict(), "next_offsets": catalog.next_offsets(name)})


@topic.command("list")
@pass_context
def topic_list(ctx: Context) -> None:
    """Print one JSON line per topic."""
    for _name, found in sorted(ctx.catalog.snapshot().topics.items()):
        _emit(found.to_dict())


@topic.command("alter")
@now_option
@click.argument("name")
@click.option("--config", "configs", multiple=True, required=True, metavar="KEY=VALUE", help="Config to change, repeatable.")
@pass_context
def topic_alter(ctx: Context, name: str, configs: tuple[str, ...]) -> None:
    """Change configs of topic NAME. cleanup.policy may change as in Kafka: a topic made compacted has its older
    records compacted too, keyless ones dropped as invalid."""
    _emit(ctx.catalog.alter_topic(name, _parse_settings(configs), ctx.clock()).to_dict())


@topic.command("delete")
@now_option
@click.argument("name")
@pass_context
def topic_delete(ctx: Context, name: str) -> None:
    """Delete topic NAME: its records go (gc removes its files), its name is free for a new topic, consumer groups'
    offsets of it are dropped. Prints the version that deleted it."""
    _emit({"deleted": name, "version": ctx.catalog.delete_topic(name, ctx.clock())})


# -- produce and consume -------------------------------------------------------------------------------


def _utf8(line_number: int, field: str, text: str) -> bytes:
    """`text` as UTF-8: json.loads accepts escapes of lone surrogates ("\\ud800"), which have no UTF-8 form."""
    try:
        return text.encode()
    except UnicodeEncodeError as exc:
        raise InvalidRecordError(
            f"line {line_number}: {field} holds a lone surrogate \\u{ord(exc.object[exc.start]):04x}, which UTF-8 cannot "
            "encode: pair it (\\ud83d\\ude00 is one character) or drop it; nothing was produced"
        ) from None


def _bytes_field(line_number: int, document: dict, name: str) -> bytes | None:
    encoded = f"{name}_b64"
    if encoded in document:
        raw = document[encoded]
        if raw is None:
            return None
        try:
            return base64.b64decode(raw, validate=True)
        except (ValueError, TypeError):  # binascii.Error is a ValueError, and so is a str beyond ASCII
            raise InvalidRecordError(f"line {line_number}: {encoded} is not valid base64; nothing was produced") from None
    text = document.get(name)
    if text is None:
        return None
    if not isinstance(text, str):
        raise InvalidRecordError(f"line {line_number}: {name} must be a string or null (use {encoded} for bytes); nothing was produced")
    return _utf8(line_number, name, text)


def _parse_json(line_number: int, line: bytes) -> Any:
    try:
        return json.loads(line.decode())
    except UnicodeDecodeError as exc:
        raise InvalidRecordError(
            f"line {line_number}: not UTF-8 (byte {exc.start + 1}: {exc.reason}); input lines are JSON in UTF-8, "
            "with key_b64 / value_b64 for binary data; nothing was produced"
        ) from None
    except json.JSONDecodeError as exc:
        raise InvalidRecordError(f"line {line_number}: not JSON ({exc.msg}); nothing was produced") from None
    except ValueError as exc:  # the other error json.loads raises: an integer of more digits than Python converts
        raise InvalidRecordError(f"line {line_number}: a number too long ({str(exc).partition(':')[0]}); nothing was produced") from None
    except RecursionError:
        raise InvalidRecordError(f"line {line_number}: JSON nested too deep; a record is one flat object; nothing was produced") from None


def _parse_record(line_number: int, line: bytes) -> Record:
    document = _parse_json(line_number, line)
    if not isinstance(document, dict):
        raise InvalidRecordError(f"line {line_number}: expected a JSON object; nothing was produced")
    partition = document.get("partition")
    if not isinstance(partition, int) or isinstance(partition, bool):
        raise InvalidRecordError(f"line {line_number}: \"partition\" must be an integer; nothing was produced")
    timestamp = document.get("timestamp")
    if timestamp is not None and (not isinstance(timestamp, int) or isinstance(timestamp, bool) or not 0 <= timestamp <= LONG_MAX):
        raise InvalidRecordError(f"line {line_number}: \"timestamp\" must be integer milliseconds from 0 to {LONG_MAX}; nothing was produced")
    headers = document.get("headers") or {}
    if not isinstance(headers, dict) or not all(isinstance(v, str) for v in headers.values()):
        raise InvalidRecordError(f"line {line_number}: \"headers\" must be an object of strings; nothing was produced")
    for name in headers:
        _utf8(line_number, f"header name {name!r}", name)
    return Record(
        partition,
        _bytes_field(line_number, document, "key"),
        _bytes_field(line_number, document, "value"),
        timestamp,
        [(name, _utf8(line_number, f"header {name!r}", value)) for name, value in headers.items()] or None,
    )


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@now_option
@pass_context
def produce(ctx: Context, topic_name: str) -> None:
    """Produce JSON lines from stdin to TOPIC, all or nothing; prints each record's partition and offset.

    Input lines: {"partition": int, "key": str|null, "value": str|null, "timestamp": ms, "headers": {str: str}},
    with key_b64 / value_b64 for binary data.
    """
    # Bytes, decoded line by line: an undecodable line is named, not a traceback of the stream's decoder.
    records = [_parse_record(n, line) for n, line in enumerate(sys.stdin.buffer, start=1) if line.strip()]
    with Agent(ctx.catalog, clock=ctx.clock, background=False) as agent:
        offsets_future = agent.produce(topic_name, records)
        agent.flush()
    for record, offset in zip(records, offsets_future.result()):
        _emit({"partition": record.partition, "offset": offset})


def _text_or_b64(document: dict, name: str, data: bytes | None) -> None:
    if data is None:
        document[name] = None
        return
    try:
        document[name] = data.decode()
    except UnicodeDecodeError:
        document[f"{name}_b64"] = base64.b64encode(data).decode()


@cli.command()
@click.argument("topic_name", metavar="TOPIC")
@click.option("--partition", type=int, required=True)
@click.option("--from-offset", type=NON_NEGATIVE_INT64, default=0, show_default=True, help="First offset to read.")
@click.option("--to-offset", type=NON_NEGATIVE_INT64, default=None, help="Stop before this offset (exclusive, like Kafka's end offsets).")
@pass_context
def consume(ctx: Context, topic_name: str, partition: int, from_offset: int, to_offset: int | None) -> None:
    """Print the records of one partition in offset order, one JSON line each, as of the latest manifest
    version (the catalog is asked for that partition's sections only)."""
    snapshot = ctx.catalog.snapshot()
    for record in read_records(ctx.store, snapshot, topic_name, partition, from_offset, to_offset):
        document: dict[str, Any] = {"offset": record.offset, "timestamp": record.timestamp}
        _text_or_b64(document, "key", record.key)
        _text_or_b64(document, "value", record.value)
        headers: dict[str, Any] = {}
        for name, value in record.headers:
            _text_or_b64(headers, name, value)
        document["headers"] = headers
        _emit(document)


@cli.command()
@click.option("--level", type=click.IntRange(0, 4), default=None, help="Only files of this level.")
@pass_context
def files(ctx: Context, level: int | None) -> None:
    """Print one JSON line per live file in the catalog: key, level, size, creation time, records and sections."""
    for data_file in ctx.catalog.snapshot().files(level):
        _emit({**file_to_json(data_file), "record_count": data_file.record_count})


@cli.command()
@click.option("--limit", type=click.IntRange(1, LONG_MAX), default=20, show_default=True, help="How many commits, newest first.")
@pass_context
def log(ctx: Context, limit: int) -> None:
    """Print the catalog's newest commits, one JSON line each: manifest version, commit id, time, operation."""
    for record in ctx.catalog.commit_log(limit):
        _emit({"version": record.version, "commit_id": record.commit_id, "created_ms": record.created_ms, "operation": record.operation})


# -- compaction --------------------------------------------------------------------------------------

def _planner_options(command):
    for option in reversed([
        click.option("--min-files", type=click.IntRange(min=1), default=PlannerConfig.min_files[0], show_default=True,
                     help="A level is compacted into the next once it holds this many files."),
        click.option("--buffer-bytes", type=click.IntRange(MIN_BUFFER_BYTES, MAX_BUFFER_BYTES), default=PlannerConfig.buffer_bytes,
                     show_default=True, help="Key map size per job (pass 1's bounded buffer)."),
        click.option("--target-file-bytes", type=click.IntRange(1, MAX_TARGET_FILE_BYTES), default=PlannerConfig.target_file_bytes,
                     show_default=True, help="Output files are cut at this size, at a section boundary."),
        click.option("--group-bytes", type=click.IntRange(1, MAX_BYTE_COUNT), default=PlannerConfig.group_bytes, show_default=True,
                     help="Plans with more input (uncompressed) are split into groups of partitions of about this size."),
        click.option("--pass-interval-minutes", type=click.IntRange(1, 7 * 24 * 60), default=PlannerConfig.max_lag_pass_interval_ms // 60_000,
                     show_default=True, help="max-lag mode: minutes until your next max-lag pass (your cron's interval); what is "
                     "dirty past its max lag by then is compacted now."),
    ]):
        command = option(command)
    return command


def _config(min_files: int, buffer_bytes: int, target_file_bytes: int, group_bytes: int, pass_interval_minutes: int) -> PlannerConfig:
    return PlannerConfig(
        min_files=(min_files,) * 4, buffer_bytes=buffer_bytes, target_file_bytes=target_file_bytes, group_bytes=group_bytes,
        max_lag_pass_interval_ms=pass_interval_minutes * 60_000,
    )


_mode_option = click.option("--mode", type=click.Choice(MODES), default="regular", show_default=True,
                            help="regular: levels and size tiers; max-lag: what would stay dirty too long; full: the sweep.")
_topics_option = click.option("--topics", multiple=True, metavar="TOPIC", help="Only these topics (full and max-lag modes; repeatable).")


@cli.command("plan")
@now_option
@_mode_option
@_topics_option
@click.option("--dry-run", is_flag=True, help="Print each plan's expected effect instead of the plan.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), metavar="DIR",
              help="Write each plan to DIR/PLAN_ID/ as it is stored (plan.json and a document per group) and print "
                   "where, instead of printing the plan; for large plans.")
@_planner_options
@pass_context
def plan_command(ctx: Context, mode: str, topics: tuple[str, ...], dry_run: bool, out_dir: str | None, **options: int) -> None:
    """Print the plans a mode calls for now, one JSON line each, or write them to a directory as they are stored
    (--out); nothing is leased or run."""
    if dry_run and out_dir:
        raise click.UsageError("--dry-run writes nothing and --out writes plans: choose one")
    config = _config(**options)
    if out_dir and (problem := _directory_problem(Path(out_dir).absolute())):
        raise click.BadParameter(f"{problem}; pass a directory for the plans", param_hint="--out")
    out = LocalStore(out_dir) if out_dir else None
    now = ctx.clock()
    snapshot = ctx.catalog.planning_snapshot(now)
    for plan in choose_plans(snapshot, now, mode, config, _topics(snapshot, mode, topics)):
        if dry_run:
            _emit(expected_effect(plan))
        elif out is not None:
            written = write_plan(out, plan, prefix="")
            directory = str(out.root / plan.plan_id)
            _emit({"plan_id": plan.plan_id, "plan": directory, "groups": len(plan.groups), "inputs": len(plan.inputs), "bytes": written})
        else:
            click.echo(plan.to_json())


def _topics(snapshot: Snapshot, mode: str, topics: tuple[str, ...]) -> list[str] | None:
    """--topics checked by the planner's own rule, as a usage error."""
    try:
        return check_topics(snapshot, mode, list(topics))
    except ValueError as exc:
        raise click.UsageError(f"--topics: {exc}") from None


_PLAN_SOURCES = "a plan `logcompact plan` printed (JSON or JSON lines, - for stdin) or a directory `plan --out` wrote"


def _read_plans(path: str) -> list[Plan]:
    """The plans at `path`: a plan's directory or a directory of them (`plan --out`), or a JSON document, or
    JSON lines (`-`: stdin)."""
    if path == "-":
        return _plans_of_text(sys.stdin.buffer.read(), "stdin")
    location = Path(path)
    try:
        if not location.is_dir():
            return _plans_of_text(location.read_bytes(), path)
    except FileNotFoundError:
        raise click.BadParameter(f"{path} does not exist; pass {_PLAN_SOURCES}", param_hint="--plan") from None
    except OSError as exc:  # a name too long, a loop of links, no permission: the path itself is wrong
        raise click.BadParameter(f"cannot read {path} ({exc.strerror}); pass {_PLAN_SOURCES}", param_hint="--plan") from None
    if (location / HEADER_NAME).is_file():
        return [read_plan(LocalStore(location.parent), location.name, prefix="")]
    plan_ids = sorted(p.parent.name for p in location.glob(f"*/{HEADER_NAME}"))
    if not plan_ids:
        raise click.BadParameter(f"{path} holds no plan (no {HEADER_NAME} in it or in its directories); write plans with `plan --out`",
                                 param_hint="--plan")
    return [read_plan(LocalStore(location), plan_id, prefix="") for plan_id in plan_ids]


def _plans_of_text(data: bytes, source: str) -> list[Plan]:
    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidPlanError(f"{source}: not UTF-8 text (byte {exc.start + 1}: {exc.reason}); pass {_PLAN_SOURCES}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
        return [Plan.from_json(line, f"{source} line {n}") for n, line in enumerate(lines, start=1)]
    return [Plan.from_json(text, source)]


@cli.command()
@now_option
@click.option("--plan", "plan_file", metavar="PATH",
              help="Run the plan(s) at PATH: a JSON document or JSON lines (- for stdin), or a directory `plan --out` wrote.")
@click.option("--all", "run_all", is_flag=True, help="Plan now (--mode), run every plan locally, commit.")
@click.option("--until-idle", is_flag=True, help="Repeat --all until nothing is left to plan.")
@click.option("--full", is_flag=True, help="Full sweep: every live file of the topics, deduplicated into the top level.")
@_mode_option
@_topics_option
@_planner_options
@pass_context
def compact(
    ctx: Context, plan_file: str | None, run_all: bool, until_idle: bool, full: bool, mode: str, topics: tuple[str, ...],
    **options: int,
) -> None:
    """Run compaction locally and commit it, by the steps the Airflow DAGs run (lease and write the plans, run each
    group, commit); prints each plan's stats as a JSON line.

    Plans made here lease their files in the catalog until they commit, fail or expire, so concurrent
    schedulers never compact the same files twice.
    """
    if sum(map(bool, (plan_file, run_all, until_idle, full))) != 1:
        raise click.UsageError("choose exactly one of --plan FILE, --all, --until-idle, --full")
    catalog = ctx.catalog
    config = _config(**options)
    if plan_file:
        if topics:
            raise click.UsageError("--topics goes with --all, --until-idle or --full (a plan file names its own files)")
        for plan in _read_plans(plan_file):
            result = run_and_commit(catalog, plan, ctx.clock(), config.lease_ms)
            # A partition set aside is in the stats' "uncleanable", and logged.
            _emit({**result.to_dict(), "committed": True} if result else {"plan_id": plan.plan_id, "committed": False})
        return
    mode = "full" if full else mode
    for _ in range(MAX_ROUNDS if until_idle else 1):
        now = ctx.clock()
        chosen = _topics(catalog.snapshot(), mode, topics)
        prepared = prepare_plans(catalog, mode, now, config, chosen)
        if not prepared.plan_ids:
            return
        summary = run_here(catalog, prepared.plan_ids, prepared.groups, now)
        for plan_id in prepared.plan_ids:
            _emit({**summary.stats[plan_id], "committed": plan_id in summary.committed})
    if until_idle:
        raise LogcompactError(f"still not idle after {MAX_ROUNDS} rounds of compaction; is ingest outpacing it?")


@cli.group()
def uncleanable() -> None:
    """Partitions set aside because their data is damaged (Kafka's uncleanable partitions)."""


@uncleanable.command("list")
@now_option
@pass_context
def uncleanable_list(ctx: Context) -> None:
    """Print one JSON line per uncleanable partition (reason, damaged file, failures in a row, live bytes, when
    it is retried, whether planners hold it back now), then a line with the count and bytes."""
    catalog = ctx.catalog
    marks = catalog.uncleanable()
    held = catalog.held_uncleanable(ctx.clock())
    for mark in marks:
        _emit({**mark.to_dict(), "held": (mark.topic, mark.partition) in held})
    _emit({"uncleanable_partitions_count": len(marks), "uncleanable_bytes": sum(m.bytes for m in marks)})


def _topic_partition(text: str) -> tuple[str, int]:
    topic_name, sep, number = text.rpartition("/")
    if not sep or not topic_name or not number.isdigit():
        raise click.BadParameter(f"{text!r} is not TOPIC/PARTITION (for example orders/3)", param_hint="PARTITIONS")
    return topic_name, int(number)


@uncleanable.command("clear")
@click.argument("partitions", nargs=-1, metavar="TOPIC/PARTITION...")
@click.option("--all", "clear_all", is_flag=True, help="Clear every mark.")
@pass_context
def uncleanable_clear(ctx: Context, partitions: tuple[str, ...], clear_all: bool) -> None:
    """Clear the marks of the partitions named (or --all), so the next compaction tries them again; prints
    those cleared. Restore their damaged files first, or they are set aside again."""
    if clear_all == bool(partitions):
        raise click.UsageError("name the partitions to clear (TOPIC/PARTITION ...) or pass --all")
    chosen = None if clear_all else [_topic_partition(text) for text in partitions]
    if chosen is not None:
        missing = sorted(set(chosen) - {(m.topic, m.partition) for m in ctx.catalog.uncleanable()})
        if missing:
            raise LogcompactError(
                f"{', '.join(f'{t}/{p}' for t, p in missing)} not marked uncleanable (nothing cleared); see `logcompact uncleanable list`"
            )
    cleared = ctx.catalog.clear_uncleanable(chosen)
    _emit({"cleared": [f"{t}/{p}" for t, p in cleared]})


@cli.command()
@now_option
@click.option("--grace-ms", type=NON_NEGATIVE_INT64, default=DEFAULT_GC_GRACE_MS, show_default=True,
              help="Only files older than this are deleted (younger ones may await a commit).")
@click.option("--max-orphan-share", type=click.FloatRange(0, 1), default=DEFAULT_MAX_ORPHAN_SHARE, show_default=True,
              help="Delete no unreferenced object when more than this share of the store's data objects would go "
                   "(the catalog looks like another cluster's); 1 lifts the check.")
@pass_context
def gc(ctx: Context, grace_ms: int, max_orphan_share: float) -> None:
    """Release expired leases; delete data files no kept manifest version holds and finished plans, past the
    grace; trim the catalog's commit log to the kept versions. Objects the catalog cannot account for are kept
    and listed; a catalog of another cluster or an older copy is refused before anything is deleted."""
    report = collect_garbage(ctx.catalog, ctx.clock(), grace_ms, max_orphan_share)
    _emit(report.to_dict())
    if report.damaged_rows:
        raise CorruptDataError(
            f"catalog rows of removed files name no data file ({report.damaged_rows[0]!r}, {len(report.damaged_rows)} "
            "in all): gc left them and collected the rest; restore those rows of table files from a backup, or delete them"
        )


@cli.group()
def cluster() -> None:
    """The cluster a store and its catalog belong to (the store's cluster.json marker)."""


@cluster.command("create")
@now_option
@pass_context
def cluster_create(ctx: Context) -> None:
    """Create an empty cluster in the store and catalog (its schema and version 1), or do nothing if one is there:
    what deployments run once before their first agent (`logcompact agent` serves an existing cluster only, so
    a mistyped --catalog never starts an empty one). Prints the cluster id and whether it was created."""
    catalog = ctx.catalog
    try:
        _emit({"cluster_id": catalog.cluster_id, "created": False})
    except ClusterNotFoundError:
        _emit({"cluster_id": catalog.ensure_created(ctx.clock()), "created": True})


@cluster.command("describe")
@pass_context
def cluster_describe(ctx: Context) -> None:
    """The cluster id, the catalog's newest version and what the store's marker recorded, as JSON."""
    catalog = ctx.catalog
    marker = catalog.marker
    _emit({"cluster_id": catalog.cluster_id, "catalog_version": catalog.latest_version(), "marker": marker.__dict__})


@cluster.command("accept-catalog")
@now_option
@pass_context
def cluster_accept_catalog(ctx: Context) -> None:
    """Take the catalog as the store's: mark a store that lost its marker, or go on from a catalog restored from an
    older copy (files written after that copy then count as orphans for gc). A catalog of another cluster is
    still refused."""
    marker = ctx.catalog.accept_catalog(ctx.clock())
    _emit({"accepted": True, "cluster_id": marker.cluster_id, "seen_version": marker.seen_version})


@cluster.command("upgrade-catalog")
@pass_context
def cluster_upgrade_catalog(ctx: Context) -> None:
    """Upgrade a catalog of schema 3 to 9 to schema 10 in one transaction (docs/catalog.md says what each step
    changes). Stop the older release's agents and compactions and back the database up first. On a catalog at
    schema 10 there is nothing to do; another schema is refused."""
    upgrade = ctx.catalog.upgrade_catalog()
    if upgrade is None:
        _emit({"upgraded": False, "schema_version": SCHEMA_VERSION, "note": f"the catalog is at schema version {SCHEMA_VERSION}: nothing to do"})
    else:
        _emit({"upgraded": True, "from_schema_version": upgrade.from_schema_version, "schema_version": SCHEMA_VERSION,
               "sections_rewritten": upgrade.sections_rewritten})


@cli.command()
@now_option
@click.option("--json", "as_json", is_flag=True, help="One JSON document instead of the table.")
@click.option("--plot", type=click.Path(dir_okay=False, writable=True), metavar="FILE.png",
              help="Also draw files and bytes per level, and bytes and dirty ratio per topic, into a PNG.")
@pass_context
def status(ctx: Context, as_json: bool, plot: str | None) -> None:
    """The cleaner's figures as Kafka's log cleaner names them: per partition of each compacted topic the dirty
    ratio, the delay past max.compaction.lag.ms, the time since its last compaction, the estimated duplicates
    and uncleanable marks; files and bytes per level (docs/metrics.md)."""
    from logcompact.status import cluster_status, draw_status

    report = cluster_status(ctx.catalog, ctx.clock())
    if plot:
        draw_status(report, Path(plot))
    if as_json:
        _emit(report.to_dict())
    else:
        for line in report.describe():
            click.echo(line)


@cli.command()
@click.option("--agents", type=click.IntRange(min=1), multiple=True, default=(1, 10), show_default=True,
              help="Agent counts to simulate, one workload each (repeatable).")
@click.option("--hours", type=click.FloatRange(min=0.1), default=24.0, show_default=True, help="Simulated hours.")
@click.option("--rate", type=click.FloatRange(min=0.001), default=1000.0, show_default=True, help="Records per second per agent.")
@click.option("--record-bytes", type=click.IntRange(min=1), default=136, show_default=True)
@click.option("--keys", type=click.IntRange(min=1), default=100_000, show_default=True, help="Key cardinality.")
@click.option("--skew", type=click.FloatRange(min=0), default=0.0, show_default=True, help="Zipf exponent of key popularity (0: uniform).")
@click.option("--tombstone-rate", type=click.FloatRange(0, 1), default=0.01, show_default=True)
@click.option("--topics", type=click.IntRange(min=1), default=1, show_default=True, help="Compacted topics.")
@click.option("--partitions", type=click.IntRange(min=1), default=8, show_default=True, help="Partitions per topic.")
@click.option("--max-lag-ms", type=click.IntRange(min=1), default=2 * 3_600_000, show_default=True)
@click.option("--min-lag-ms", type=click.IntRange(min=0), default=0, show_default=True,
              help="The topics' min.compaction.lag.ms: records younger are kept whole, as the engine keeps them.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=".simulate", show_default=True,
              help="Where the JSON summaries and PNG plots go.")
def simulate(agents: tuple[int, ...], hours: float, rate: float, record_bytes: int, keys: int, skew: float,
             tombstone_rate: float, topics: int, partitions: int, max_lag_ms: int, min_lag_ms: int, out_dir: str) -> None:
    """Simulate ingest, the planner and the engine's cost model; compare logcompact's planner, with
    min.cleanable.dirty.ratio at Kafka's default and off, with the reference's literal rules on the same workload."""
    from pathlib import Path

    from logcompact.simulate import RUNS, Workload, compare
    from logcompact.simulate.report import table, write

    for count in agents:
        workload = Workload(agents=count, records_per_s=rate, record_bytes=record_bytes, keys=keys, key_skew=skew,
                            tombstone_rate=tombstone_rate, topics=topics, partitions=partitions, hours=hours,
                            max_lag_ms=max_lag_ms, min_lag_ms=min_lag_ms)
        results = compare(workload, RUNS)
        name = f"{count}-agent{'s' if count > 1 else ''}"
        click.echo(table(f"{name}, {hours:g} simulated hours, {rate:g} records/s per agent, {keys:,} keys:", results))
        for path in write(Path(out_dir), name, results):
            click.echo(f"  wrote {path}")


@cli.command()
@now_option
@click.option("--records", type=click.IntRange(min=3), default=1_000_000, show_default=True, help="Records to produce in all.")
@pass_context
def tour(ctx: Context, records: int) -> None:
    """The library without Airflow or Spark: create three topics (compact, delete, compact,delete), produce,
    consume back, sweep, verify, summarize."""
    from logcompact.tour import run_tour

    run_tour(ctx.catalog, records, ctx.clock, echo=click.echo)


@cli.command()
@click.option("--listen", default="127.0.0.1:9092", show_default=True, metavar="HOST:PORT", help="Address to accept Kafka clients on (port 0: any free port).")
@click.option("--advertise", default=None, metavar="HOST:PORT", help="Address clients are told to connect to [default: the listen address].")
@click.option("--node-id", type=click.IntRange(min=0), default=None,
              help="Broker id clients see [default: the one this advertised address had before, else the lowest free one].")
@click.option("--rack", default=None, help="Rack (availability zone) clients see, for their rack-aware choices.")
@click.option("--flush-ms", type=click.IntRange(min=1), default=DEFAULT_FLUSH_INTERVAL_MS, show_default=True,
              help="Write and commit an L0 file of what producers sent at least this often; acks wait for it.")
@click.option("--flush-bytes", type=click.IntRange(min=1), default=DEFAULT_FLUSH_BYTES, show_default=True,
              help="Or as soon as this many bytes are buffered.")
@click.option("--max-message-bytes", type=click.IntRange(min=1), default=1_048_588, show_default=True,
              help="Largest record batch taken (Kafka's message.max.bytes; a topic's max.message.bytes overrides it).")
@click.option("--fetch-cache-bytes", type=click.IntRange(min=0), default=256 * 1024 * 1024, show_default=True,
              help="Bytes of file ranges kept for consumers that read them again (the tail); 0: no cache.")
@click.option("--auto-create-topics/--no-auto-create-topics", default=True, show_default=True,
              help="Create a topic a producer or a Metadata request names that does not exist (Kafka's auto.create.topics.enable).")
@click.option("--num-partitions", type=click.IntRange(1, MAX_PARTITIONS), default=1, show_default=True,
              help="Partitions of a topic auto-created or created without a count (Kafka's num.partitions).")
# Kafka's group.max.size is unbounded; the agent keeps every member in memory (coordinator.DEFAULT_GROUP_MAX_SIZE)
@click.option("--group-max-size", type=click.IntRange(min=1), default=1000, show_default=True,
              help="Members a consumer group may have (Kafka's group.max.size); more get GROUP_MAX_SIZE_REACHED.")
@click.option("--group-max-bytes", type=click.IntRange(min=1), default=256 * 1024 * 1024, show_default=True,
              help="Bytes all consumer groups' members may hold in memory (their metadata, assignments and ids, 1 KiB at least "
                   "each); JoinGroups past it get GROUP_MAX_SIZE_REACHED.")
@pass_context
def agent(
    ctx: Context, listen: str, advertise: str | None, node_id: int | None, rack: str | None, flush_ms: int, flush_bytes: int,
    max_message_bytes: int, fetch_cache_bytes: int, auto_create_topics: bool, num_partitions: int, group_max_size: int,
    group_max_bytes: int,
) -> None:
    """Serve Kafka's protocol over this cluster (produce, fetch, consumer groups, idempotent producers, admin; every API
    and version in docs/agent.md) until SIGTERM or SIGINT, then commit what producers sent. Registers in the catalog
    beside the other agents. Prints one JSON line once listening: its address, advertised address, node id and
    cluster id."""
    from logcompact.kafka.broker import Address
    from logcompact.kafka.server import AgentSettings, run_agent

    try:
        settings = AgentSettings(
            Address.parse(listen, "--listen"), Address.parse(advertise, "--advertise") if advertise else None, node_id, rack,
            flush_interval_ms=flush_ms, flush_bytes=flush_bytes, max_message_bytes=max_message_bytes,
            fetch_cache_bytes=fetch_cache_bytes,
            auto_create_topics=auto_create_topics, num_partitions=num_partitions,
            group_max_size=group_max_size, group_max_bytes=group_max_bytes,
        )
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None
    run_agent(ctx.catalog, settings, lambda broker, bound: _emit(
        {"listening": str(bound), "advertised": str(broker.advertised), "node_id": broker.node_id, "cluster_id": broker.cluster_id}
    ))


def main(argv: list[str] | None = None) -> None:
    try:
        cli.main(args=argv, prog_name="logcompact", standalone_mode=False)
    except click.exceptions.Abort:
        click.echo("logcompact: aborted", err=True)
        sys.exit(1)
    except click.ClickException as exc:
        hint = f" (see `{exc.ctx.command_path} --help`)" if isinstance(exc, click.UsageError) and exc.ctx else ""
        click.echo(f"logcompact: error: {exc.format_message()}{hint}", err=True)
        sys.exit(exc.exit_code)
    except LogcompactError as exc:
        click.echo(f"logcompact: error: {exc}", err=True)
        sys.exit(1)
    except SQLAlchemyError as exc:  # the catalog database is down, unreachable or refuses us
        reason = redact_text(str(getattr(exc, "orig", None) or exc).splitlines()[0], _catalog_argument(argv or sys.argv[1:]))
        click.echo(f"logcompact: error: catalog database: {reason}; check --catalog (LOGCOMPACT_CATALOG) and the database", err=True)
        sys.exit(1)


def _catalog_argument(argv: list[str]) -> str:
    """The catalog URL a command line names (`--catalog URL`, `--catalog=URL` or LOGCOMPACT_CATALOG), to mask in a
    message the database wrote."""
    for n, argument in enumerate(argv):
        if argument == "--catalog" and n + 1 < len(argv):
            return argv[n + 1]
        if argument.startswith("--catalog="):
            return argument.split("=", 1)[1]
    return os.environ.get("LOGCOMPACT_CATALOG", "")

