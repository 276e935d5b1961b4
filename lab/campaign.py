"""What the kill -9 and the corruption campaigns share (bench/kill_campaign.py, bench/corruption_campaign.py).

* `Cli` runs the real `logcompact` command as a subprocess on a local store, with a private TMPDIR (so the
  work directories jobs leave can be counted) and the clock given by `--now`;
* `Cli.start` runs a command the campaign may kill: the CLI's own `main()` under a short boot that marks on
  stderr when the command enters each phase (loading, planning, reading, writing, committing, exiting), so a
  kill can be aimed inside one (`Running.kill_in`, `phase_durations`), and samples its stack just before
  the kill, so `phase_of` says where it really landed;
* `Cli.run_many` runs several commands in one subprocess through the CLI's `main()` (`consume_all`: every
  partition);
* `check_partition` compares what a consumer sees with the records produced, by Kafka's rules, independently
  of the engine: every visible record sits at its original offset unchanged, once, in offset order; a
  compacted topic's key shows its latest record last or, when that is a tombstone or expired, nothing; a
  delete topic keeps every record within retention;
* `store_objects`, `catalog_dump` and `leaked_seals` read a local store and its SQLite catalog behind the
  product's back: what is stored byte for byte, a catalog's whole content, seals whose plan holds no lease.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections.abc import Iterable
from contextlib import closing
from dataclasses import dataclass, field
from pathlib import Path

PYTHON = sys.executable
MARKER = "Campaign phase "
# The CLI's main() under a boot that lets the campaign aim and place its kills:
# * it prints a marker line to stderr as the command enters each phase (a few of the product's functions are
#   wrapped, their behaviour unchanged), so a kill can be aimed at a random moment inside a chosen phase;
# * faulthandler writes the stack on SIGUSR1, sent just before SIGKILL, so `phase_of` says where the kill
#   really landed. The handler goes at exit, before the interpreter finalizes (dumping then can crash it),
#   and SIGUSR1 is ignored again (see `Running`).
KILLABLE_BOOT = """
import atexit, faulthandler, os, signal, sys, time
faulthandler.register(signal.SIGUSR1, all_threads=True)
atexit.register(faulthandler.unregister, signal.SIGUSR1)
from logcompact import cli
from logcompact.jobs import prepare
from logcompact.catalog.catalog import Catalog
from logcompact.format.reader import BlockStream
from logcompact.format.writer import SegmentWriter
def mark(phase):
    os.write(2, f"{MARKER}{phase} at {time.monotonic()}\\n".encode())
def around(owner, name, phase, then=None):
    original = getattr(owner, name)
    def wrapped(*args, **kwargs):
        mark(phase)
        result = original(*args, **kwargs)
        if then:
            mark(then)
        return result
    setattr(owner, name, wrapped)
around(prepare, "choose_plans", "planning")
around(BlockStream, "__init__", "reading")
around(SegmentWriter, "__init__", "writing")
around(Catalog, "replace_files", "committing", then="exiting")
around(Catalog, "append_files", "committing", then="exiting")
cli.main(sys.argv[1:])
""".replace("{MARKER}", MARKER)
# The time the stack sample gets before SIGKILL follows it.
SAMPLE_SECONDS = 0.02
_SAMPLE_HEADERS = ("Current thread 0x", "Thread 0x")

# Runs CLI commands in one process, one after another, each read from stdin as a JSON list of arguments, through
# the CLI's main(): one JSON line each with its exit code, stdout and stderr. An exception escaping main() is
# printed as Python prints an uncaught one, which is what the command line would show.
RUN_MANY = r"""
import contextlib, io, json, sys, traceback
from logcompact.cli import main
for line in sys.stdin:
    out, err, code = io.StringIO(), io.StringIO(), 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(json.loads(line))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            traceback.print_exc()
            code = 1
    print(json.dumps({"exit": code, "stdout": out.getvalue(), "stderr": err.getvalue()}), flush=True)
"""


@dataclass
class Done:
    """A finished command."""

    args: list[str]
    returncode: int
    stdout: str
    stderr: str
    seconds: float
    kill_sent: bool = False
    phase: str | None = None  # where it was killed, for a command the campaign killed
    marks: list[tuple[str, float]] = field(default_factory=list)  # (phase, seconds after start) as it entered each

    @property
    def killed(self) -> bool:
        """Killed by the campaign: it sent the kill and the process died of a signal (SIGKILL, or a crash in the
        stack sample sent just before)."""
        return self.kill_sent and self.returncode < 0

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.stderr

    def error_lines(self) -> list[str]:
        """stderr without the campaign's phase markers and stack sample, and without logged warnings."""
        return [
            line for line in _without_stack_samples(self.stderr).splitlines()
            if line.strip() and ": WARNING: " not in line and not line.startswith(MARKER)
        ]

    def first_error_line(self) -> str:
        lines = self.error_lines()
        if self.traceback:
            return next((line for line in reversed(lines) if not line.startswith(" ")), lines[-1])  # the exception
        return lines[0] if lines else f"(exit {self.returncode}, nothing on stderr)"


def _stack_samples(stderr: str) -> list[list[str]]:
    """The stacks faulthandler wrote, in order, each its header and its indented lines (every Python thread has
    its own header; the commands run one)."""
    samples: list[list[str]] = []
    current: list[str] | None = None
    for line in stderr.splitlines():
        if line.startswith(_SAMPLE_HEADERS):
            current = [line]
            samples.append(current)
        elif current is not None and line.startswith("  "):
            current.append(line)
        else:
            current = None  # the command's own output
    return samples


def _without_stack_samples(stderr: str) -> str:
    kept, in_sample = [], False
    for line in stderr.splitlines():
        if line.startswith(_SAMPLE_HEADERS):
            in_sample = True
        elif in_sample and not line.startswith("  "):
            in_sample = False
        if not in_sample:
            kept.append(line)
    return "\n".join(kept)


class Cli:
    """The logcompact command on one local store, with a private TMPDIR for the jobs' work directories."""

    def __init__(self, store_dir: Path, tmpdir: Path) -> None:
        self.store_dir = store_dir
        self.uri = f"file://{store_dir}"
        tmpdir.mkdir(parents=True, exist_ok=True)
        self.tmpdir = tmpdir
        self.env = {**os.environ, "TMPDIR": str(tmpdir), "PYTHONUNBUFFERED": "1"}
        self.env.pop("LOGCOMPACT_CATALOG", None)  # the store's own catalog.db, which the campaigns inspect

    def _argv(self, args: Iterable[str], now: int, boot: list[str]) -> list[str]:
        return [PYTHON, *boot, "--store", self.uri, "--now", str(now), *args]

    def run(self, *args: str, now: int, stdin: str | None = None, timeout: float = 600, env: dict[str, str] | None = None) -> Done:
        """One `logcompact` process; `args` may start with global options (`--catalog URL`), `env` adds to the
        environment (`LOGCOMPACT_CATALOG`)."""
        argv = self._argv(args, now, ["-m", "logcompact"])
        started = time.monotonic()
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, env={**self.env, **(env or {})}, timeout=timeout)
        return Done(list(args), done.returncode, done.stdout, done.stderr, time.monotonic() - started)

    def start(self, *args: str, now: int, stdin: str | None = None) -> Running:
        return Running(self._argv(args, now, ["-c", KILLABLE_BOOT]), list(args), self.env, stdin)

    def run_many(self, commands: list[list[str]], now: int, timeout: float = 600, env: dict[str, str] | None = None) -> list[Done]:
        """Commands run one after another in one process (the CLI's main() each, as `logcompact` would run it),
        which saves an interpreter start per command. Commands the process did not reach, because it died, get
        its exit status and stderr."""
        argvs = [["--store", self.uri, "--now", str(now), *command] for command in commands]
        started = time.monotonic()
        done = subprocess.run([PYTHON, "-c", RUN_MANY], input="".join(json.dumps(a) + "\n" for a in argvs), capture_output=True,
                              text=True, env={**self.env, **(env or {})}, timeout=timeout)
        seconds = time.monotonic() - started
        results = []
        for command, line in zip(commands, done.stdout.splitlines()):
            found = json.loads(line)
            results.append(Done(command, found["exit"], found["stdout"], found["stderr"], seconds))
        for command in commands[len(results) :]:
            results.append(Done(command, done.returncode or 1, "", done.stderr, seconds))
        return results

    def consume_all(self, pairs: list[tuple[str, int]], now: int) -> dict[tuple[str, int], Done]:
        """Every partition read through the CLI's consume, in one process."""
        found = self.run_many([["consume", topic, "--partition", str(partition)] for topic, partition in pairs], now)
        return dict(zip(pairs, found))


class Running:
    """A command running in the background, fed its stdin and drained of its output by threads; its phase
    markers are noted as they come."""

    def __init__(self, argv: list[str], args: list[str], env: dict[str, str], stdin: str | None) -> None:
        self.args = args
        self.started = time.monotonic()
        self._kill_sent = False
        self._marks: list[tuple[str, float]] = []
        self._entered: dict[str, threading.Event] = {phase: threading.Event() for phase in PHASES}
        # Ignored dispositions survive exec: a sample sent before the boot registers faulthandler is ignored
        # instead of ending the process (SIGUSR1's default action).
        previous = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        try:
            self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                            text=True, env=env)
        finally:
            signal.signal(signal.SIGUSR1, previous)
        self._out: list[str] = []
        self._err: list[str] = []
        self._threads = [
            threading.Thread(target=self._feed, args=(stdin or "",), daemon=True),
            threading.Thread(target=self._read_stdout, daemon=True),
            threading.Thread(target=self._read_stderr, daemon=True),
        ]
        for thread in self._threads:
            thread.start()

    def _feed(self, text: str) -> None:
        stdin = self.process.stdin
        assert stdin is not None  # piped by __init__
        try:
            stdin.write(text)
            stdin.close()
        except BrokenPipeError:
            pass  # killed before it read all of its input: what the campaign wanted

    def _read_stdout(self) -> None:
        stdout = self.process.stdout
        assert stdout is not None  # piped by __init__
        self._out.append(stdout.read())

    def _read_stderr(self) -> None:
        stderr = self.process.stderr
        assert stderr is not None  # piped by __init__
        for line in stderr:
            self._err.append(line)
            if line.startswith(MARKER):
                phase, _, at = line[len(MARKER) :].split()
                self._marks.append((phase, float(at) - self.started))  # CLOCK_MONOTONIC is the machine's
                self._entered[phase].set()

    def kill_in(self, phase: str, after: float) -> Done:
        """SIGKILL (after a stack sample) `after` seconds past the moment the command enters `phase` (for
        "loading", its start), unless it ends first or never enters it."""
        entered = self._entered[phase]
        if phase != "loading":
            while not entered.wait(0.005):
                if self.process.poll() is not None:
                    return self.finish()
        since = next(at for entered_phase, at in list(self._marks) if entered_phase == phase) if phase != "loading" else 0.0
        try:
            self.process.wait(max(0.0, self.started + since + after - time.monotonic()))
        except subprocess.TimeoutExpired:
            self._kill_sent = True
            self.process.send_signal(signal.SIGUSR1)
            time.sleep(SAMPLE_SECONDS)
            self.process.kill()
        return self.finish()

    def finish(self, timeout: float = 600) -> Done:
        self.process.wait(timeout)
        for thread in self._threads:
            thread.join()
        done = Done(self.args, self.process.returncode, "".join(self._out), "".join(self._err), time.monotonic() - self.started,
                    kill_sent=self._kill_sent, marks=list(self._marks))
        if done.killed:
            samples = _stack_samples(done.stderr)
            # No sample: the boot had not registered faulthandler yet, or had dropped it at exit, after printing.
            done.phase = phase_of("\n".join(samples[-1])) if samples else ("exiting" if done.stdout else "loading")
        return done


def phase_durations(done: Done) -> dict[str, float]:
    """How long a command stayed in each phase it went through, from its markers: from the first time it
    entered the phase to the next marker (or its end). Loading runs from the start to the first marker."""
    durations = {"loading": done.marks[0][1] if done.marks else done.seconds}
    for index, (phase, at) in enumerate(done.marks):
        if phase not in durations:
            following = done.marks[index + 1][1] if index + 1 < len(done.marks) else done.seconds
            durations[phase] = max(0.0, following - at)
    return durations


# Where a kill can land, in the order a command goes through them (`phase_of`).
PHASES = ("loading", "planning", "reading", "writing", "committing", "exiting")


def phase_of(stack_sample: str) -> str:
    """Where a command was, from one sampled stack: the first rule its frames match (a commit inside a
    compaction is committing, not planning). An import counts for the code that asked for it: the CLI's
    own imports are loading, the engine's lazy ones part of the job."""
    frames = []
    for line in stack_sample.splitlines():
        line = line.strip()
        if line.startswith('File "') and " in " in line:
            path = line[len('File "') : line.index('"', len('File "'))]
            frames.append((path.replace(os.sep, "/"), line.rsplit(" in ", 1)[1]))
    if not frames:
        return "exiting"  # a sample without a Python frame: the interpreter is finalizing
    importing = [i for i, (path, function) in enumerate(frames) if function == "<module>" and path != "<string>"]
    if importing:
        frames = frames[importing[-1] + 1 :]  # the frames that asked for the import
    functions = {function for _, function in frames}

    def touches(*parts: str) -> bool:
        return any(part in path for path, _ in frames for part in parts)

    if functions & {"replace_files", "commit_plan", "append_files", "release"}:
        return "committing"
    if touches("logcompact/format/writer.py") or functions & {"put_file", "put", "put_parts", "_write"}:
        return "writing"
    if touches("logcompact/format/reader.py", "logcompact/engine/cleaner.py", "logcompact/engine/offset_map.py"):
        return "reading"
    if touches("logcompact/cli/common.py") and "emit" in functions:
        return "exiting"
    if "compact" in functions and (touches("logcompact/planner/", "logcompact/catalog/") or functions & {"check_against", "lease"}):
        return "planning"
    return "loading"  # imports, arguments, the input, the topic


# -- the model ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    """A record as produced (and as `consume` prints it)."""

    partition: int
    key: str | None
    value: str | None
    timestamp: int


@dataclass(frozen=True)
class TopicSpec:
    name: str
    partitions: int
    settings: dict[str, str] = field(default_factory=dict)

    @property
    def compacted(self) -> bool:
        return "compact" in self.settings.get("cleanup.policy", "delete")

    @property
    def retention_ms(self) -> int | None:
        """Records older than this expire, in `delete` and `compact,delete` topics (Kafka's default: 7 days)."""
        if "delete" not in self.settings.get("cleanup.policy", "delete"):
            return None
        retention = int(self.settings.get("retention.ms", 604_800_000))
        return retention if retention >= 0 else None

    def create_args(self) -> list[str]:
        configs = [part for name, value in self.settings.items() for part in ("--config", f"{name}={value}")]
        return ["topic", "create", self.name, "--partitions", str(self.partitions), *configs]


def produce_input(records: list[Sent]) -> str:
    return "".join(
        json.dumps({"partition": r.partition, "key": r.key, "value": r.value, "timestamp": r.timestamp}) + "\n" for r in records
    )


def acknowledged_offsets(done: Done, records: list[Sent]) -> list[int] | None:
    """The offsets `produce` printed, when it exited 0 and printed one per record; None otherwise."""
    if done.returncode != 0:
        return None
    printed = [json.loads(line) for line in done.stdout.splitlines() if line.strip()]
    if len(printed) != len(records) or [p["partition"] for p in printed] != [r.partition for r in records]:
        return None
    return [p["offset"] for p in printed]


def consumed_records(done: Done) -> list[tuple[int, Sent]]:
    """(offset, record) per line `consume` printed. Binary keys or values (key_b64) are never produced by the
    campaigns, so one is kept in its encoded form and fails the comparison."""
    found = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        document = json.loads(line)
        key = document.get("key", document.get("key_b64"))
        value = document.get("value", document.get("value_b64"))
        found.append((document["offset"], Sent(-1, key, value, document["timestamp"])))
    return found


@dataclass
class PartitionCheck:
    changed: int = 0  # visible records that differ from the record produced at that offset, or sit where none was
    repeated: int = 0  # visible records at an offset already shown, or below one (offsets must only increase)
    lost: int = 0  # records that must be visible and are not
    resurrected: int = 0  # keys whose last visible record is not their latest (an older value, or a deleted key)
    duplicate_keys: int = 0  # keys visible more than once
    tombstones: int = 0  # tombstones visible
    expired: int = 0  # records visible though past retention
    examples: list[str] = field(default_factory=list)

    def note(self, text: str) -> None:
        if len(self.examples) < 5:
            self.examples.append(text)


def check_partition(spec: TopicSpec, produced: dict[int, Sent], visible: list[tuple[int, Sent]], now: int) -> PartitionCheck:
    """What a consumer of one partition sees, against the records produced at their offsets.

    `now` is the newest clock any compaction ran at: records older than now - retention.ms may be gone.
    Compaction may remove any record but a key's latest one, so only those (and, in a delete topic, every
    record within retention) must be visible.
    """
    check = PartitionCheck()
    expire_before = now - spec.retention_ms if spec.retention_ms is not None else None

    def expirable(record: Sent) -> bool:
        return expire_before is not None and record.timestamp < expire_before

    seen: dict[int, Sent] = {}
    highest = -1
    for offset, record in visible:
        if offset <= highest:
            check.repeated += 1
            check.note(f"offset {offset}: shown again, after offset {highest}")
        highest = max(highest, offset)
        original = produced.get(offset)
        if original is None or (original.key, original.value, original.timestamp) != (record.key, record.value, record.timestamp):
            check.changed += 1
            check.note(f"offset {offset}: consumed {record} but produced {original}")
        else:
            seen[offset] = original
        if expirable(record):
            check.expired += 1
    if not spec.compacted:
        for offset, record in produced.items():
            if offset not in seen and not expirable(record):
                check.lost += 1
                check.note(f"offset {offset} ({record.value}) within retention is missing")
        return check

    latest: dict[str, int] = {}
    for offset, record in produced.items():
        if record.key is not None and offset > latest.get(record.key, -1):
            latest[record.key] = offset
    last_seen: dict[str | None, int] = {}
    times_seen: dict[str | None, int] = {}
    for offset, record in sorted(seen.items()):
        last_seen[record.key] = offset
        times_seen[record.key] = times_seen.get(record.key, 0) + 1
        check.tombstones += record.value is None
    check.duplicate_keys = sum(1 for count in times_seen.values() if count > 1)
    for key, offset in latest.items():
        record = produced[offset]
        shown = last_seen.get(key)
        if shown is not None and shown != offset:
            check.resurrected += 1
            check.note(f"key {key}: offset {shown} ({produced[shown].value}) shows as latest, not {offset} ({record.value})")
        if shown != offset and record.value is not None and not expirable(record):
            check.lost += 1
            check.note(f"key {key}: latest value at offset {offset} ({record.value}) is missing")
    return check


# -- the store and its catalog, read behind the product's back --------------------------------------------------

# The SQLite catalog's files in a file:// store's directory: the database and its WAL, not objects of the store.
CATALOG_FILES = ("catalog.db", "catalog.db-wal", "catalog.db-shm", "catalog.db-journal")


def store_objects(store_dir: Path) -> dict[str, bytes]:
    """Every object of a local store (its catalog.db aside), byte for byte, by key."""
    return {
        path.relative_to(store_dir).as_posix(): path.read_bytes()
        for path in sorted(store_dir.rglob("*")) if path.is_file() and path.name not in CATALOG_FILES
    }


def catalog_dump(database: Path) -> list[str]:
    """A SQLite catalog's whole content as SQL statements, to tell whether anything wrote to it."""
    if not database.exists():
        return []
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        return list(connection.iterdump())


def leaked_seals(database: Path) -> int:
    """Rows of `plan_seals` whose plan holds no lease: a seal goes with its plan's last lease (docs/catalog.md)."""
    with closing(sqlite3.connect(f"file:{database}?mode=ro", uri=True)) as connection:
        return connection.execute("SELECT count(*) FROM plan_seals WHERE plan_id NOT IN (SELECT plan_id FROM leases)").fetchone()[0]
