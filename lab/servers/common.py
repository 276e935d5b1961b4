"""What the throw-away servers share: a free port on 127.0.0.1 and the tail of a daemon's log for their errors."""

from __future__ import annotations

import os
import socket
from pathlib import Path

HOST = "127.0.0.1"
LOG_TAIL_LINES = 40
LOG_TAIL_BYTES = 6000


def free_port() -> int:
    """A port free on 127.0.0.1 now (a daemon that loses it to another process is retried by its caller)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> str:
    """The last `lines` lines of a log within its last `max_bytes`, or why there are none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - max_bytes))
            data = f.read().decode("utf-8", "replace")
    except OSError as e:
        return f"(cannot read {path}: {e})"
    out = data.splitlines()[-lines:]
    if not out:
        return f"(empty: {path})"
    return "\n".join(out)
