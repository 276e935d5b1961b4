"""`logcompact plan`, `compact`, `uncleanable ...` and `gc`: compaction run by hand, by the steps the Airflow DAGs run."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from logcompact.cli.common import NON_NEGATIVE_INT64, Context, directory_problem, emit, now_option, pass_context
from logcompact.exceptions import CorruptDataError, InvalidPlanError, LogcompactError
from logcompact.limits import (
    DEFAULT_BUFFER_BYTES,
    DEFAULT_GC_GRACE_MS,
    DEFAULT_GROUP_BYTES,
    DEFAULT_MAX_LAG_PASS_INTERVAL_MS,
    DEFAULT_MAX_ORPHAN_SHARE,
    DEFAULT_MIN_FILES,
    DEFAULT_TARGET_FILE_BYTES,
    MAX_BUFFER_BYTES,
    MAX_BYTE_COUNT,
    MAX_TARGET_FILE_BYTES,
    MIN_BUFFER_BYTES,
    MODES,
)
from logcompact.units import MINUTE_MS

if TYPE_CHECKING:
    from logcompact.catalog import PlanningSnapshot
    from logcompact.planner import PlannerConfig
    from logcompact.plans import Plan

MAX_ROUNDS = 100


def _planner_options(command):
    for option in reversed([
        click.option("--min-files", type=click.IntRange(min=1), default=DEFAULT_MIN_FILES, show_default=True,
                     help="A level is compacted into the next once it holds this many files."),
        click.option("--buffer-bytes", type=click.IntRange(MIN_BUFFER_BYTES, MAX_BUFFER_BYTES), default=DEFAULT_BUFFER_BYTES,
                     show_default=True, help="Key map size per job (pass 1's bounded buffer)."),
        click.option("--target-file-bytes", type=click.IntRange(1, MAX_TARGET_FILE_BYTES), default=DEFAULT_TARGET_FILE_BYTES,
                     show_default=True, help="Output files are cut at this size, at a section boundary."),
        click.option("--group-bytes", type=click.IntRange(1, MAX_BYTE_COUNT), default=DEFAULT_GROUP_BYTES, show_default=True,
                     help="Plans with more input (uncompressed) are split into groups of partitions of about this size."),
        click.option("--pass-interval-minutes", type=click.IntRange(1, 7 * 24 * 60), default=DEFAULT_MAX_LAG_PASS_INTERVAL_MS // MINUTE_MS,
                     show_default=True, help="max-lag mode: minutes until your next max-lag pass (your cron's interval); what is "
                     "dirty past its max lag by then is compacted now."),
    ]):
        command = option(command)
    return command


def _config(min_files: int, buffer_bytes: int, target_file_bytes: int, group_bytes: int, pass_interval_minutes: int) -> PlannerConfig:
    from logcompact.planner import PlannerConfig

    return PlannerConfig(
        min_files=(min_files,) * 4, buffer_bytes=buffer_bytes, target_file_bytes=target_file_bytes, group_bytes=group_bytes,
        max_lag_pass_interval_ms=pass_interval_minutes * MINUTE_MS,
    )


_mode_option = click.option("--mode", type=click.Choice(MODES), default="regular", show_default=True,
                            help="regular: levels and size tiers; max-lag: what would stay dirty too long; full: the sweep.")
_topics_option = click.option("--topics", multiple=True, metavar="TOPIC", help="Only these topics (full and max-lag modes; repeatable).")


@click.command("plan")
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
    from logcompact.planner import choose_plans, expected_effect
    from logcompact.plans import plan_to_json, write_plan
    from logcompact.store import LocalStore

    if dry_run and out_dir:
        raise click.UsageError("--dry-run writes nothing and --out writes plans: choose one")
    config = _config(**options)
    if out_dir and (problem := directory_problem(Path(out_dir).absolute())):
        raise click.BadParameter(f"{problem}; pass a directory for the plans", param_hint="--out")
    out = LocalStore(out_dir) if out_dir else None
    now = ctx.clock()
    snapshot = ctx.catalog.planning_snapshot(now)
    for plan in choose_plans(snapshot, now, mode, config, _topics(snapshot, mode, topics)):
        if dry_run:
            emit(expected_effect(plan))
        elif out is not None:
            written = write_plan(out, plan, prefix="")
            directory = str(out.root / plan.plan_id)
            emit({"plan_id": plan.plan_id, "plan": directory, "groups": len(plan.groups), "inputs": len(plan.inputs), "bytes": written})
        else:
            click.echo(plan_to_json(plan))


def _topics(snapshot: PlanningSnapshot, mode: str, topics: tuple[str, ...]) -> list[str] | None:
    """--topics checked by the planner's own rule, as a usage error."""
    from logcompact.planner import check_topics

    try:
        return check_topics(snapshot, mode, list(topics))
    except ValueError as exc:
        raise click.UsageError(f"--topics: {exc}") from None


_PLAN_SOURCES = "a plan `logcompact plan` printed (JSON or JSON lines, - for stdin) or a directory `plan --out` wrote"


def _read_plans(path: str) -> list[Plan]:
    """The plans at `path`: a plan's directory or a directory of them (`plan --out`), or a JSON document, or
    JSON lines (`-`: stdin)."""
    from logcompact.keys import HEADER_NAME
    from logcompact.plans import read_plan
    from logcompact.store import LocalStore

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
    from logcompact.plans import plan_from_json

    try:
        text = data.decode()
    except UnicodeDecodeError as exc:
        raise InvalidPlanError(f"{source}: not UTF-8 text (byte {exc.start + 1}: {exc.reason}); pass {_PLAN_SOURCES}") from None
    lines = [line for line in text.splitlines() if line.strip()]
    if len(lines) > 1 and all(line.lstrip().startswith("{") for line in lines):
        return [plan_from_json(line, f"{source} line {n}") for n, line in enumerate(lines, start=1)]
    return [plan_from_json(text, source)]


@click.command()
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
    from logcompact.jobs import prepare_plans, run_and_commit, run_here

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
            emit({**result.to_dict(), "committed": True} if result else {"plan_id": plan.plan_id, "committed": False})
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
            emit({**summary.stats[plan_id], "committed": plan_id in summary.committed})
    if until_idle:
        raise LogcompactError(f"still not idle after {MAX_ROUNDS} rounds of compaction; is ingest outpacing it?")


@click.group()
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
        emit({**mark.to_dict(), "held": (mark.topic, mark.partition) in held})
    emit({"uncleanable_partitions_count": len(marks), "uncleanable_bytes": sum(m.bytes for m in marks)})


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
    emit({"cleared": [f"{t}/{p}" for t, p in cleared]})


@click.command()
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
    from logcompact.jobs import collect_garbage

    report = collect_garbage(ctx.catalog, ctx.clock(), grace_ms, max_orphan_share)
    emit(report.to_dict())
    if report.damaged_rows:
        raise CorruptDataError(
            f"catalog rows are damaged ({report.damaged_rows[0]}; {len(report.damaged_rows)} in all): gc deleted no object "
            "they may name and collected the rest; restore the catalog database from a backup, or correct those rows"
        )
