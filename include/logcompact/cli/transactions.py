"""`logcompact txn ...`: Kafka's transactions as the catalog holds them, listed, described, and a hung one aborted,
what Kafka's `kafka-transactions.sh list|describe|abort` does against a broker (docs/transactions.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from logcompact.cli.common import NON_NEGATIVE_INT64, Context, emit, now_option, pass_context
from logcompact.exceptions import TransactionNotFoundError

if TYPE_CHECKING:
    from logcompact.catalog import TopicPartition
    from logcompact.catalog.transactions import Ended, TransactionRow

# Kafka's states that no row holds here: EndTxn is one catalog transaction, and an expired id's row is deleted.
_NEVER_STORED = ("PrepareCommit", "PrepareAbort", "PrepareEpochFence", "Dead")
# How many times `txn abort` reads the row again when it changed between its read and the abort's compare-and-set.
_ABORT_ATTEMPTS = 3


@click.group()
def txn() -> None:
    """Kafka's transactions in the catalog: list them, describe them, abort a hung one (docs/transactions.md)."""


@txn.command("list")
@now_option
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="Only transactional ids in this state, repeatable: Empty, Ongoing, CompleteCommit, CompleteAbort.")
@click.option("--producer-id", "producer_ids", multiple=True, type=NON_NEGATIVE_INT64, metavar="N", help="Only this producer id, repeatable.")
@click.option("--min-duration-ms", type=NON_NEGATIVE_INT64, default=None, metavar="MS",
              help="Only transactions open at least this long (Kafka's ListTransactions v1 filter).")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per transactional id instead of the table.")
@pass_context
def txn_list(ctx: Context, states: tuple[str, ...], producer_ids: tuple[int, ...], min_duration_ms: int | None, as_json: bool) -> None:
    """The transactional ids the catalog holds, by id: producer id, epoch, state, how long the open transaction has
    been open, its timeout and partitions. Every agent's ids: the catalog is shared."""
    catalog, now = ctx.catalog, ctx.clock()
    rows = catalog.transactions(_states(states), set(producer_ids), -1 if min_duration_ms is None else min_duration_ms, now)
    open_ids = [row.transactional_id for row in rows if row.state == "Ongoing"]
    described = catalog.describe_transactions(open_ids) if open_ids else {}
    _show([(row, described[row.transactional_id][1] if row.transactional_id in described else ()) for row in rows], now, as_json)


@txn.command("describe")
@now_option
@click.argument("transactional_ids", nargs=-1, required=True, metavar="ID...")
@click.option("--json", "as_json", is_flag=True, help="One JSON line per transactional id instead of the table.")
@pass_context
def txn_describe(ctx: Context, transactional_ids: tuple[str, ...], as_json: bool) -> None:
    """Each ID's producer id, epoch, state, timeout, how long its transaction has been open and the partitions
    added to it. An ID the catalog does not have is an error, and nothing is printed."""
    found = ctx.catalog.describe_transactions(transactional_ids)
    unknown = [tid for tid in dict.fromkeys(transactional_ids) if tid not in found]
    if unknown:
        raise _not_found(unknown)
    _show([found[tid] for tid in dict.fromkeys(transactional_ids)], ctx.clock(), as_json)


@txn.command("abort")
@now_option
@click.argument("transactional_id", metavar="ID")
@click.option("--json", "as_json", is_flag=True, help="One JSON line instead of the sentence.")
@pass_context
def txn_abort(ctx: Context, transactional_id: str, as_json: bool) -> None:
    """Abort ID's open transaction in one catalog transaction, as its timeout would: a marker in each of its
    partitions, its records' offsets recorded as aborted, its partitions' last stable offsets moved on, and its
    epoch bumped, so its producer is fenced (its next request fails with PRODUCER_FENCED; a new producer with the
    same transactional.id goes on). An ID without an open transaction is an error, and nothing is done."""
    row, partitions, ended, now = _abort(ctx, transactional_id)
    done = {"aborted": transactional_id, "producer_id": row.producer_id, "fenced_epoch": row.epoch, "open_ms": now - row.start_ms,
            "partitions": _names(partitions), "markers": len(ended.markers), "aborted_ranges": ended.aborted}
    if as_json:
        emit(done)
        return
    click.echo(
        f"aborted the transaction of {transactional_id!r} open {_seconds(now - row.start_ms)} s: producer id {row.producer_id} "
        f"epoch {row.epoch} fenced, a marker in each of {len(ended.markers)} partitions, {ended.aborted} aborted ranges recorded"
    )


def _abort(ctx: Context, transactional_id: str) -> tuple[TransactionRow, tuple[TopicPartition, ...], Ended, int]:
    """The open transaction of `transactional_id` aborted, its epoch bumped: the row and partitions it had, what the
    abort did, and when. The abort is a compare-and-set on the row read, which is read again if it changed."""
    catalog = ctx.catalog
    for _ in range(_ABORT_ATTEMPTS):
        now = ctx.clock()
        found = catalog.describe_transactions([transactional_id]).get(transactional_id)
        if found is None:
            raise _not_found([transactional_id])
        row, partitions = found
        if row.state != "Ongoing":
            raise TransactionNotFoundError(
                f"transactional id {transactional_id!r} has no open transaction to abort (it is {row.state}): nothing done; "
                "`logcompact txn list --state Ongoing` lists the open ones"
            )
        ended = catalog.abort_transaction(row, now, bump_epoch=True)
        if ended is not None:
            return row, partitions, ended, now
    raise TransactionNotFoundError(
        f"transactional id {transactional_id!r} changed under each of {_ABORT_ATTEMPTS} aborts (its producer is active): "
        f"check it with `logcompact txn describe {transactional_id}` and run the abort again"
    )


def _states(given: tuple[str, ...]) -> set[str]:
    """--state values as the catalog names them (any case); a name not stored is a usage error naming the names."""
    from logcompact.catalog.transactions import STATES

    by_folded = {state.casefold(): state for state in STATES}
    chosen = set()
    for state in given:
        if state.casefold() not in by_folded:
            never = " (Kafka's, but no row holds it here: EndTxn is one catalog transaction, an expired id is deleted)" if (
                state.casefold() in {name.casefold() for name in _NEVER_STORED}) else ""
            raise click.BadParameter(f"{state!r} is not a transaction state{never}; use one of {', '.join(STATES)}", param_hint="--state")
        chosen.add(by_folded[state.casefold()])
    return chosen


def _not_found(transactional_ids: list[str]) -> TransactionNotFoundError:
    named = ", ".join(repr(tid) for tid in transactional_ids)
    return TransactionNotFoundError(
        f"transactional id {named} not in the catalog (never initialized by a producer, or expired after "
        "transactional.id.expiration.ms): `logcompact txn list` lists the ids it holds"
    )


def _names(partitions: tuple[TopicPartition, ...]) -> list[str]:
    return [f"{topic}/{partition}" for topic, partition in partitions]


def _seconds(ms: int) -> str:
    return f"{ms / 1000:,.1f}"


def _document(row: TransactionRow, partitions: tuple[TopicPartition, ...], now_ms: int) -> dict:
    started = row.start_ms if row.state == "Ongoing" else None
    return {
        "transactional_id": row.transactional_id, "producer_id": row.producer_id, "epoch": row.epoch, "state": row.state,
        "timeout_ms": row.timeout_ms, "start_ms": started, "duration_ms": None if started is None else now_ms - started,
        "updated_ms": row.updated_ms, "partitions": _names(partitions),
    }


def _show(found: list[tuple[TransactionRow, tuple[TopicPartition, ...]]], now_ms: int, as_json: bool) -> None:
    documents = [_document(row, partitions, now_ms) for row, partitions in found]
    if as_json:
        for document in documents:
            emit(document)
        return
    header = ("transactional id", "producer id", "epoch", "state", "open s", "timeout s", "partitions")
    rows = [
        (d["transactional_id"], str(d["producer_id"]), str(d["epoch"]), d["state"],
         "-" if d["duration_ms"] is None else _seconds(d["duration_ms"]), _seconds(d["timeout_ms"]), ",".join(d["partitions"]) or "-")
        for d in documents
    ]
    widths = [max(len(row[n]) for row in [header, *rows]) for n in range(len(header))]
    for row in [header, *rows]:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())
