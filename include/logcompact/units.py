"""How logcompact counts time and bytes, and its one clock. Times are epoch milliseconds in signed 64-bit integers, as
Kafka keeps them in records and the catalog keeps them in its rows."""

from __future__ import annotations

import time
from datetime import UTC, datetime

LONG_MAX = 2**63 - 1  # Kafka's Long.MAX_VALUE: the largest offset, timestamp or retention
INT_MAX = 2**31 - 1
SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
MiB = 1024**2
GiB = 1024**3


def mib(count: float) -> str:
    """Bytes in MiB, the one unit the logs give sizes in (as the planner's settings are given): `3.0 MiB`, and below
    one MiB three decimals, `0.027 MiB`. Each use says what the bytes count: stored (compressed, as in the store) or
    uncompressed (the records' own bytes, what jobs decode and plans are grouped by)."""
    return f"{mib_figure(count)} MiB"


def mib_figure(count: float) -> str:
    """`mib`'s number without its unit, for a table whose column header names the unit: `3.0`, `0.027`."""
    value = count / MiB
    return f"{value:,.1f}" if value >= 1 else f"{value:.3f}"


def utc_iso(ms: int) -> str:
    """Epoch milliseconds as a UTC time in ISO 8601, to the millisecond as the catalog keeps times, for messages:
    `2026-12-03T03:04:05.123Z`; one outside the years 1 to 9999 (a damaged or edited value) as its number, so the
    message naming it still reads: `epoch ms 4611686018427387904`."""
    try:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    except (OverflowError, ValueError, OSError):
        return f"epoch ms {ms}"


def wall_clock_ms() -> int:
    """Now, in epoch milliseconds: the clock of every process that does not take one (agents, tasks, the CLI without --now)."""
    return time.time_ns() // 1_000_000
