"""`logcompact agent --processes N`: N agent processes, each an agent of the cluster (docs/agent.md, "How the agent
uses the cores").

One agent process holds one GIL, so the command uses a machine's cores with processes. Each is an agent as a
single `logcompact agent` is: its own listeners, node id and registration in the catalog, its own ingest, group and
transaction coordinators; they share nothing but the catalog and the store. Clients learn every process from
Metadata as a broker of its own and connect to each, as they do to Kafka's brokers: a group's coordinator and a
transaction's live in one process's memory, so requests go to the process that holds them.

Process `i` (from 0) listens on each listener's port + i (port 0: a free port of its own), advertises each advertised
port + i, and takes node id `--node-id` + i when one is given. The memory budgets an agent holds whole (flush,
fetch cache, requests queued, groups' members) are divided among the processes, so N of them hold what one would.

This process supervises: it starts the others (`serve_job` in a new interpreter, their settings pickled on their
stdin), writes their log lines to its stderr with each line tagged `[process I, node N]`, prints one JSON line
once every process listens, and stops them all with SIGTERM at its own SIGTERM or SIGINT. A process that ends on its
own stops the others; the command then exits 1 unless every process ended cleanly (exit 0). A process whose stdin
closes (this supervisor gone, even by SIGKILL) stops as at SIGTERM.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import signal
import struct
import sys
import threading
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

from logcompact.cli.common import emit

if TYPE_CHECKING:
    from logcompact.kafka.cluster import Address
    from logcompact.kafka.server import AgentSettings

LENGTH = struct.Struct(">Q")  # of the pickled job on a process's stdin
LOG_FORMAT = "logcompact: %(levelname)s: %(message)s"  # the CLI's own (logcompact.cli.cli)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity), the default count of agent processes."""
    counted = getattr(os, "process_cpu_count", None)  # Python 3.13
    if counted is not None:
        return int(counted() or 1)
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


# Budgets an agent holds whole in its memory, divided among the processes: buffered records, the file and block caches, requests
# read and not handled (and one address's share of them), consumer groups' members. Per-connection and per-group bounds
# (max_in_flight_bytes, group_max_size), and the connection caps, stay as given: a client connects to each process it
# uses, so each process holds a connection of every client.
DIVIDED_BUDGETS = ("flush_bytes", "fetch_cache_bytes", "fetch_block_cache_bytes", "max_queued_bytes", "max_queued_bytes_per_ip", "group_max_bytes")


def check_processes(settings: AgentSettings, count: int) -> None:
    """ValueError naming the option and the fix when `count` processes cannot take each listener's ports: port + i for
    process i must be a port, and no two listeners' (or the metrics') ranges may meet."""
    ranges: list[tuple[str, int]] = [(f"--listen {listener}", listener.address.port) for listener in settings.listeners]
    if settings.metrics_listen is not None:
        ranges.append((f"--metrics-listen {settings.metrics_listen}", settings.metrics_listen.port))
    ranges += [(f"--advertise {listener.name}://{listener.advertise}", listener.advertise.port)
               for listener in settings.listeners if listener.advertise is not None]
    for option, port in ranges:
        if port and port + count - 1 > 65535:
            raise ValueError(f"{option}: {count} processes take ports {port} to {port + count - 1}, past 65535; "
                             "give a lower port or fewer --processes")
    bound = [(option, port) for option, port in ranges if port and not option.startswith("--advertise")]
    for n, (option, port) in enumerate(bound):
        for other, other_port in bound[n + 1:]:
            if abs(port - other_port) < count:
                raise ValueError(f"{option} and {other}: with {count} processes each takes {count} ports from its own "
                                 f"(process i on port + i), and these meet; space the ports at least {count} apart or pass fewer --processes")


def settings_of_process(settings: AgentSettings, index: int, count: int) -> AgentSettings:
    """Process `index`'s settings of `count`: ports + index, node id + index, budgets divided."""
    listeners = tuple(replace(listener, address=_shifted(listener.address, index),
                              advertise=None if listener.advertise is None else _shifted(listener.advertise, index))
                      for listener in settings.listeners)
    divided: dict[str, Any] = {name: max(1, getattr(settings, name) // count) if getattr(settings, name) else 0 for name in DIVIDED_BUDGETS}
    return replace(settings, listeners=listeners, node_id=None if settings.node_id is None else settings.node_id + index,
                   metrics_listen=None if settings.metrics_listen is None else _shifted(settings.metrics_listen, index), **divided)


def _shifted(address: Address, index: int) -> Address:
    return replace(address, port=address.port + index) if address.port else address


@dataclass(frozen=True)
class Job:
    """What a process needs to be an agent of the cluster: the cluster's store and catalog, how much to log, its
    settings."""

    store_uri: str
    catalog_url: str | None
    aws_conn_id: str | None
    log_level: int
    settings: AgentSettings


@dataclass(eq=False)  # each child is itself alone
class Child:
    index: int
    process: asyncio.subprocess.Process
    listening: dict[str, Any] | None = None  # its JSON line once it listens

    @property
    def tag(self) -> str:
        node = "" if self.listening is None else f", node {self.listening['node_id']}"
        return f"[process {self.index}{node}]"

    def describe(self) -> str:
        node = "" if self.listening is None else f" (node {self.listening['node_id']})"
        return f"agent process {self.index}{node}, pid {self.process.pid}"


def run_processes(store_uri: str, catalog_url: str | None, aws_conn_id: str | None, settings: AgentSettings, count: int) -> int:
    """Run `count` agent processes until SIGTERM or SIGINT (or one ends); the command's exit status."""
    jobs = [Job(store_uri, catalog_url, aws_conn_id, logging.getLogger().getEffectiveLevel(), settings_of_process(settings, index, count))
            for index in range(count)]
    return asyncio.run(_supervise(jobs, {name: getattr(jobs[0].settings, name) for name in DIVIDED_BUDGETS}))


async def _supervise(jobs: list[Job], budgets: dict[str, int]) -> int:
    loop = asyncio.get_running_loop()
    stopping = asyncio.Event()
    for number in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(number, stopping.set)
    children = [await _start(index, job) for index, job in enumerate(jobs)]
    relays = [asyncio.create_task(_relay(child)) for child in children]
    ended: dict[asyncio.Future[Any], Child] = {asyncio.create_task(child.process.wait()): child for child in children}
    started: asyncio.Future[Any] = asyncio.gather(*(_listening(child) for child in children))
    stop: asyncio.Future[Any] = asyncio.create_task(stopping.wait())
    done, _ = await asyncio.wait([started, stop, *ended], return_when=asyncio.FIRST_COMPLETED)
    if started in done:  # every process listens, or one ended before it did: wait for its end then
        if started.exception() is None:
            first = children[0].listening
            assert first is not None
            emit({**first, "processes": [{"pid": child.process.pid, **{key: value for key, value in (child.listening or {}).items() if key != "cluster_id"}}
                                         for child in children], "budgets_per_process": budgets})
        done, _ = await asyncio.wait([stop, *ended], return_when=asyncio.FIRST_COMPLETED)
    failed = False
    for task in done:
        if task in ended:
            child = ended[task]
            status = task.result()
            failed = failed or status != 0
            how = f"was killed by {signal.Signals(-status).name}" if status < 0 else f"exited with status {status}"
            _say(f"logcompact: {'error' if status else 'info'}: {child.describe()} {how}; stopping the other agent processes")
    started.cancel()
    stopped = []  # those this process stopped: SIGTERM before they took it (still starting) is a clean stop too
    for child in children:
        if child.process.returncode is None:
            stopped.append(child)
            try:
                child.process.send_signal(signal.SIGTERM)
            except ProcessLookupError:
                pass
    statuses = [await child.process.wait() for child in children]
    await asyncio.gather(started, *relays, return_exceptions=True)
    stop.cancel()
    unclean = [child for child, status in zip(children, statuses, strict=True)
               if status != 0 and not (child in stopped and status == -signal.SIGTERM)]
    return 1 if failed or unclean else 0


async def _start(index: int, job: Job) -> Child:
    process = await asyncio.create_subprocess_exec(
        sys.executable, "-c", "import sys; from logcompact.cli.agent_processes import serve_job; sys.exit(serve_job())", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    assert process.stdin is not None
    pickled = pickle.dumps(job)
    process.stdin.write(LENGTH.pack(len(pickled)) + pickled)  # stdin stays open: its end tells the process this one is gone
    await process.stdin.drain()
    return Child(index, process)


async def _listening(child: Child) -> None:
    """Wait for the child's JSON line; ValueError if it ends first."""
    import json

    assert child.process.stdout is not None
    line = await child.process.stdout.readline()
    if not line:
        raise ValueError(f"{child.describe()} ended before it listened")
    child.listening = json.loads(line)


async def _relay(child: Child) -> None:
    """The child's stderr to ours, each line tagged with its process index (and node id once it listens)."""
    assert child.process.stderr is not None
    pending = b""
    while chunk := await child.process.stderr.read(65536):
        *lines, pending = (pending + chunk).split(b"\n")
        if lines:
            _say("".join(f"{child.tag} {line.decode(errors='replace')}\n" for line in lines), end="")
    if pending:
        _say(f"{child.tag} {pending.decode(errors='replace')}")


def _say(text: str, end: str = "\n") -> None:
    sys.stderr.write(text + end)
    sys.stderr.flush()


def serve_job() -> int:
    """A process's side: read its job from stdin, serve as `logcompact agent` does, stop when stdin closes."""
    from logcompact.cli.agent import listening_line
    from logcompact.cli.common import Context
    from logcompact.exceptions import LogcompactError
    from logcompact.kafka.server import run_agent

    stdin = sys.stdin.fileno()  # read raw: a daemon thread blocked in a buffered read stops the interpreter's exit
    (size,) = LENGTH.unpack(_read_exactly(stdin, LENGTH.size))
    job: Job = pickle.loads(_read_exactly(stdin, size))
    logging.basicConfig(level=job.log_level, format=LOG_FORMAT)

    def watch_supervisor() -> None:
        while os.read(stdin, 4096):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch_supervisor, name="supervisor", daemon=True).start()
    try:
        run_agent(Context(job.store_uri, job.catalog_url, None, job.aws_conn_id).catalog, job.settings, lambda broker, bound, metrics: emit(listening_line(broker, bound, metrics)))
    except LogcompactError as exc:
        _say(f"logcompact: error: {exc}")
        return 1
    return 0


def _read_exactly(fd: int, size: int) -> bytes:
    read = bytearray()
    while len(read) < size:
        if not (chunk := os.read(fd, size - len(read))):
            raise EOFError("the supervisor closed stdin before it sent the job")
        read += chunk
    return bytes(read)
