"""How logcompact counts time and bytes, and its one clock. Times are epoch milliseconds in signed 64-bit integers, as
Kafka keeps them in records and the catalog keeps them in its rows."""

from __future__ import annotations

import time

LONG_MAX = 2**63 - 1  # Kafka's Long.MAX_VALUE: the largest offset, timestamp or retention
INT_MAX = 2**31 - 1
SECOND_MS = 1_000
MINUTE_MS = 60 * SECOND_MS
HOUR_MS = 60 * MINUTE_MS
MiB = 1024**2
GiB = 1024**3


def wall_clock_ms() -> int:
    """Now, in epoch milliseconds: the clock of every process that does not take one (agents, tasks, the CLI without --now)."""
    return time.time_ns() // 1_000_000
