"""The profile printed beside a missed target: py-spy samples of a process while a measure runs, summarised as the
functions that held the samples.

    with sampled(agent.pid) as profile:      # or sampled() for this script's own process
        measure()
    ...
    if missed:
        print(profile.summary())

py-spy (`requirements.txt`) samples from a process of its own at `rate` a second without stopping the sampled one
(`--nonblocking`), so a measure taken while sampled costs the sampled process nothing but the sampler's share of
the cores. Where py-spy cannot attach (no ptrace permission, not installed) the summary says why instead.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TRUNK = 0.9  # a function in this share of the samples or more is on every path: not shown among the product's


class Profile:
    """py-spy's collapsed stacks of one measure (`--format raw`: `frame;frame;... count` a line)."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.stacks: Counter[tuple[str, ...]] = Counter()
        self.failure = ""

    def read(self, raw: str) -> None:
        for line in raw.splitlines():
            stack, _, count = line.rpartition(" ")
            frames = tuple(_function(frame) for frame in stack.split(";") if frame)
            if frames and count.isdigit():
                self.stacks[frames] += int(count)

    def summary(self, top: int = 8) -> str:
        """The functions holding most samples on their own (the leaf frame) and, among the product's, most samples
        with their callees: where the time goes and which of the product's calls it is spent under."""
        if self.failure:
            return f"profile of {self.label}: none ({self.failure})"
        total = sum(self.stacks.values())
        if not total:
            return f"profile of {self.label}: no samples (the process was idle or ended before the sampler attached)"
        own: Counter[str] = Counter()
        within: Counter[str] = Counter()
        for frames, count in self.stacks.items():
            own[frames[-1]] += count
            for frame in set(frames):
                if "logcompact" in frame:
                    within[frame] += count
        lines = [f"profile of {self.label}, {total:,} samples by py-spy; own time:"]
        lines += [f"  {count / total:6.1%}  {name}" for name, count in own.most_common(top)]
        # Below the trunk every sample passes through (the measure's own entry points): where the time divides.
        branches = [(name, count) for name, count in within.most_common() if count < TRUNK * total][:top]
        if branches:
            lines.append("  the product's functions, with what they call:")
            lines += [f"  {count / total:6.1%}  {name}" for name, count in branches]
        return "\n".join(lines)


def _function(frame: str) -> str:
    """`name (path:line)` as `name (path from the repository)`: samples of one function at different lines add up."""
    name, _, where = frame.partition(" (")
    path = where.rstrip(")").rsplit(":", 1)[0]
    for prefix in (str(ROOT) + "/", str(ROOT / "include") + "/"):
        path = path.removeprefix(prefix)
    if "site-packages/" in path:
        path = path.split("site-packages/", 1)[1]
    return f"{name} ({path})" if path else name


@contextmanager
def sampled(pid: int | None = None, label: str = "", rate: int = 100, subprocesses: bool = False, into: Profile | None = None) -> Iterator[Profile]:
    """Samples process `pid` (this one by default; its child processes too with `subprocesses`) while the block runs,
    adding the samples to `into` where given (a measure repeated: one profile of all its runs)."""
    pid = os.getpid() if pid is None else pid
    profile = into if into is not None else Profile(label or f"process {pid}")
    # The virtualenv's own, which `.venv/bin/python bench/...` runs without the virtualenv on PATH, else PATH's.
    spy = shutil.which("py-spy", path=os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]))
    if spy is None:
        profile.failure = "py-spy is not installed: pip install -r requirements.txt"
        yield profile
        return
    with tempfile.TemporaryDirectory(prefix="logcompact-profile-") as directory:
        output = Path(directory) / "stacks.txt"
        argv = [spy, "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking", "--format", "raw", "--output", str(output)]
        sampler = subprocess.Popen(argv + (["--subprocesses"] if subprocesses else []), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        # A script pinned to a core (taskset) would share it with its sampler: the sampler runs on the others.
        others = set(range(os.cpu_count() or 1)) - os.sched_getaffinity(0)
        if others:
            os.sched_setaffinity(sampler.pid, others)
        try:
            yield profile
        finally:
            sampler.send_signal(signal.SIGINT)  # py-spy writes what it sampled and exits
            try:
                _, errors = sampler.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                sampler.kill()
                _, errors = sampler.communicate()
            if output.exists():
                # Sampling without pausing the process (--nonblocking), py-spy may read a name as it changes: garbled
                # bytes are shown replaced rather than losing the run's figures.
                profile.read(output.read_text(errors="replace"))
            else:
                last = [line for line in errors.splitlines() if line.strip()]
                profile.failure = f"py-spy wrote nothing: {last[-1] if last else f'exit code {sampler.returncode}'}"
