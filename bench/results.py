"""bench/results.md, the latest figures of each benchmark command: every script `make bench` runs records what it
printed there when it ends.

    if __name__ == "__main__":
        with recorded():
            main()

`recorded()` passes the script's standard output through and keeps a copy; when the block ends without an error it
replaces that command's section of bench/results.md (or adds one) with the output, stamped with the date, the commit
(`git rev-parse --short HEAD`, `+` when the worktree has changes besides this page), the library measured when it is not this
checkout's (`PYTHONPATH` naming another), the CPU model and core count from /proc/cpuinfo and the load average. A
section holds one run of one command line: a run with other arguments has a section of its own, and earlier figures
live in the commit log only.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TextIO

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results.md"
HEADING = "## "


class _Tee(io.TextIOBase):
    """Writes to the stream it wraps and keeps a copy."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream
        self.copy = io.StringIO()

    def write(self, text: str) -> int:
        self.copy.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.stream.encoding

    def isatty(self) -> bool:
        return self.stream.isatty()

    def fileno(self) -> int:
        return self.stream.fileno()


def command_line(argv: list[str]) -> str:
    """The command as the Makefile spells it: `python bench/x.py ARGS`, the script's path from the repository."""
    script = Path(argv[0]).resolve()
    with contextlib.suppress(ValueError):
        script = script.relative_to(ROOT)
    return shlex.join(["python", str(script), *argv[1:]])


def cpu_model() -> str:
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "not recorded"
    models = re.findall(r"^model name\s*:\s*(.+)$", cpuinfo, re.MULTILINE)
    return f"{models[0].strip()}, {len(models)} cores" if models else "not recorded"


def commit(checkout: Path = ROOT) -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=checkout, capture_output=True, text=True, check=True).stdout.strip()

    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results.md")  # a run before this one's figures are no change of code
    except (OSError, subprocess.CalledProcessError):
        return "not recorded"
    return head + ("+" if changed else "")


def library() -> str:
    """The library measured, when it is not this checkout's `include/` (`PYTHONPATH=OTHER/include`, to compare two
    codes alternately): its directory and commit, for the figures to name the code they measured."""
    module = sys.modules.get("logcompact")
    if module is None or module.__file__ is None:
        return ""
    include = Path(module.__file__).resolve().parents[1]
    return "" if include == ROOT / "include" else f"; library {include} at commit {commit(include)}"


def stamp() -> str:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return f"{date}; commit {commit()}{library()}; {cpu_model()}; load average {load} (1, 5, 15 min) at the end"


def section(command: str, printed: str, stamped: str) -> str:
    return f"{HEADING}`{command}`\n\n{stamped}\n\n```\n{printed.rstrip()}\n```\n"


def replace_section(text: str, command: str, new: str) -> str:
    """`text` with the section headed by `command` replaced by `new`, or with `new` added at the end."""
    heading = f"{HEADING}`{command}`\n"
    start = text.find(heading)
    if start < 0:
        return text.rstrip("\n") + "\n\n" + new
    end = text.find("\n" + HEADING, start + len(heading))
    end = len(text) if end < 0 else end + 1
    return text[:start] + new + ("\n" + text[end:] if end < len(text) else "")


def record(command: str, printed: str, path: Path = RESULTS) -> str:
    """Replace `command`'s section of the results page with what it printed, stamped now; the stamp (printed under
    every script's figures, so that `make bench`'s output carries the CPU model and load beside each)."""
    text = path.read_text() if path.exists() else "# Benchmark results\n"
    stamped = stamp()
    path.write_text(replace_section(text, command, section(command, printed, stamped)))
    return stamped


@contextlib.contextmanager
def recorded(path: Path = RESULTS) -> Iterator[None]:
    """Run the block with standard output copied; record the copy as this command's section if the block succeeds."""
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    try:
        yield
    finally:
        sys.stdout = tee.stream
    stamped = record(command_line(sys.argv), tee.copy.getvalue(), path)
    print(f"figures recorded in {path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}: {stamped}")
