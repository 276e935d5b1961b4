"""Start and stop a real Apache Kafka broker for tests and benchmarks: one KRaft node, broker and controller in one
JVM, from Apache Kafka's own jars; the reference the agent is checked and measured against.

The jars are `org.apache.kafka:kafka_2.13` (KAFKA_VERSION) with its runtime dependencies and log4j's SLF4J binding
(``kafka-broker.pom.xml`` beside this file), about 43 MB, fetched once by Maven (``mvn dependency:copy-dependencies``)
into the cache directory, ``~/.cache/logcompact/kafka`` or ``$LOGCOMPACT_KAFKA_CACHE``, which every worktree, test
and benchmark of the machine shares; once there, nothing is downloaded again.  `build_java_program` builds a Maven
project (the tests' Java clients, ``tests/java``) into the same cache, once per content of its sources.
``make kafka`` does both (``python -m lab.servers.kafka fetch tests/java``).

The node is formatted by Kafka's StorageTool (what ``kafka-storage.sh format`` runs) in ``workdir/data``, with a
static quorum of itself, and runs with Kafka's defaults except what one node needs: the internal topics'
replication factor and min.insync.replicas at 1, and the listeners, a client one (PLAINTEXT) and a controller one,
on 127.0.0.1 at ports picked at runtime.  ``log.flush`` is left to the page cache, as Kafka ships it.  The JVM runs
with ``kafka-run-class.sh``'s options, but a 512 MB heap (``kafka-server-start.sh`` gives 1 GB) on this
two-core machine.  Its log (log4j at INFO, as Kafka's) goes to ``workdir/kafka.log``.

Usage (e.g. from a module-scoped pytest fixture)::

    from lab.servers.kafka import start_kafka, kafka_missing_reason

    reason = kafka_missing_reason()
    if reason:
        pytest.skip(reason)
    server, stop = start_kafka(tmp_path_factory.mktemp("kafka"))
    try:
        yield server
    finally:
        stop()

    server.bootstrap_servers        # "127.0.0.1:PORT"
    server.admin()                  # a confluent-kafka AdminClient for it

By hand: ``python -m lab.servers.kafka`` starts a node and prints its address as a JSON line, until Ctrl-C.

The readiness probe is a Metadata request (confluent-kafka's AdminClient) that must name this node's cluster id,
so a broker of someone else's on the same port is never taken for ours.
"""

from __future__ import annotations

import argparse
import atexit
import base64
import functools
import hashlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO
from xml.etree import ElementTree

from confluent_kafka import KafkaError, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic, OffsetSpec

from lab.servers.common import HOST, LOG_TAIL_BYTES, LOG_TAIL_LINES, free_port, log_tail

__all__ = [
    "KAFKA_VERSION",
    "JavaProgram",
    "KafkaServer",
    "KafkaStartError",
    "build_java_program",
    "cache_dir",
    "fetch_broker",
    "kafka_missing_reason",
    "start_kafka",
    "tool_argv",
]

KAFKA_VERSION = "4.4.0"
MIN_JAVA = 17  # Kafka 4's broker
CACHE_ENV = "LOGCOMPACT_KAFKA_CACHE"
NODE_ID = 1
HEAP = "512m"

_BROKER_POM = Path(__file__).with_name("kafka-broker.pom.xml")
_MAVEN_TIMEOUT_S = 600

# What one node needs that Kafka's defaults (made for three brokers) do not give: the internal topics on one replica.
_ONE_NODE_SETTINGS = {
    "offsets.topic.replication.factor": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
}

# kafka-run-class.sh's KAFKA_JVM_PERFORMANCE_OPTS
_JVM_OPTIONS = (
    "-server",
    "-XX:+UseG1GC",
    "-XX:MaxGCPauseMillis=20",
    "-XX:InitiatingHeapOccupancyPercent=35",
    "-XX:+ExplicitGCInvokesConcurrent",
    "-Djava.awt.headless=true",
)

# Kafka's own log layout and level, to stdout (= workdir/kafka.log)
_LOG4J2 = """\
appender.stdout.type = Console
appender.stdout.name = stdout
appender.stdout.layout.type = PatternLayout
appender.stdout.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = INFO
rootLogger.appenderRef.stdout.ref = stdout
"""


class KafkaStartError(RuntimeError):
    """Fetching the jars or starting the broker failed.  The message names the failing step and the log to read,
    with its last lines."""


# What a new partition answers until its leader has taken it, by librdkafka's names (the client's metadata may lag
# the broker's: UNKNOWN_LEADER_EPOCH).
_LEADER_NOT_READY = (KafkaError.NOT_LEADER_FOR_PARTITION, KafkaError.LEADER_NOT_AVAILABLE, KafkaError.UNKNOWN_TOPIC_OR_PART,
                     KafkaError.UNKNOWN_LEADER_EPOCH)


@dataclass(frozen=True)
class KafkaServer:
    host: str  # "127.0.0.1"
    port: int  # the PLAINTEXT listener, for clients
    controller_port: int
    cluster_id: str
    node_id: int
    version: str  # Apache Kafka's, e.g. "4.4.0"
    pid: int
    workdir: Path  # server.properties, log4j2.properties, kafka.log, data/

    @property
    def bootstrap_servers(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def logfile(self) -> Path:
        return self.workdir / "kafka.log"

    def admin(self, **config: str) -> AdminClient:
        """A confluent-kafka AdminClient for this broker (librdkafka properties as keyword arguments, dots as _)."""
        return AdminClient({"bootstrap.servers": self.bootstrap_servers, **{k.replace("_", "."): v for k, v in config.items()}})

    def create_topic(self, name: str, partitions: int, config: Mapping[str, str] | None = None, timeout_s: float = 60) -> None:
        """Create a topic and return once every partition's leader answers for it: until then the broker answers
        Produce and Fetch of a new partition with NOT_LEADER_OR_FOLLOWER."""
        admin = self.admin()
        admin.create_topics([NewTopic(name, partitions, 1, config=dict(config or {}))])[name].result(timeout_s)
        deadline = time.monotonic() + timeout_s
        latest = {TopicPartition(name, partition): OffsetSpec.latest() for partition in range(partitions)}
        while True:
            try:
                for future in admin.list_offsets(latest, request_timeout=timeout_s).values():
                    future.result(timeout_s)
                return
            except KafkaException as exc:
                if exc.args[0].code() not in _LEADER_NOT_READY or time.monotonic() > deadline:
                    raise
                time.sleep(0.1)


@dataclass(frozen=True)
class JavaProgram:
    """A Maven project built into the cache: its jar and its runtime dependencies, as one classpath."""

    project: Path
    classpath: str

    def argv(self, main_class: str, *args: str, jvm_options: tuple[str, ...] = ("-Xmx256m",)) -> list[str]:
        """The command line that runs `main_class` of this program with `args`."""
        return [_java(), *jvm_options, "-cp", self.classpath, main_class, *args]


# --------------------------------------------------------------------------
# Java, Maven, the cache
# --------------------------------------------------------------------------


def cache_dir() -> Path:
    """Where the jars and the built programs are kept: $LOGCOMPACT_KAFKA_CACHE, else ~/.cache/logcompact/kafka."""
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "logcompact" / "kafka").expanduser()


def _broker_dir() -> Path:
    """The broker's jars, by Kafka's version and the pom's digest: a pom that brings other jars fetches anew beside
    the directories of the poms before it (which other checkouts may still use)."""
    return cache_dir() / f"kafka_2.13-{KAFKA_VERSION}-{hashlib.sha256(_BROKER_POM.read_bytes()).hexdigest()[:16]}"


def _java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java") or "java"


@functools.cache
def _java_major() -> int | None:
    """The major version of the Java that _java() runs, or None without one."""
    try:
        out = subprocess.run([_java(), "-version"], capture_output=True, text=True, timeout=60).stderr
    except (OSError, subprocess.TimeoutExpired):
        return None
    found = re.search(r'version "(?:1\.)?(\d+)', out)
    return int(found.group(1)) if found else None


def kafka_missing_reason() -> str | None:
    """None if the reference broker can be started here (fetching its jars first if need be), else a one-line reason."""
    major = _java_major()
    if major is None:
        return (
            f"Java not found (no java in $JAVA_HOME/bin or on PATH); Apache Kafka {KAFKA_VERSION}'s broker needs Java "
            f"{MIN_JAVA} or later: run `make deps` (it does: apt-get install -y openjdk-17-jdk-headless maven)"
        )
    if major < MIN_JAVA:
        return f"Java {major} found ({_java()}); Apache Kafka {KAFKA_VERSION}'s broker needs Java {MIN_JAVA} or later: set JAVA_HOME to one"
    if not _broker_dir().is_dir() and shutil.which("mvn") is None:
        return (
            f"Apache Kafka {KAFKA_VERSION}'s jars are not in {_broker_dir()} and Maven (mvn) is not installed to fetch "
            "them: run `make deps kafka`"
        )
    return None


def _maven(step: str, argv: list[str], cwd: Path) -> None:
    command = ["mvn", "-B", "-q", "-Dstyle.color=never", *argv]
    try:
        run = subprocess.run(command, cwd=cwd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                             timeout=_MAVEN_TIMEOUT_S)
    except FileNotFoundError:
        raise KafkaStartError(f"{step}: Maven (mvn) is not installed: run `make deps`") from None
    except subprocess.TimeoutExpired:
        raise KafkaStartError(f"{step}: `{' '.join(command)}` did not finish in {_MAVEN_TIMEOUT_S} s") from None
    if run.returncode != 0:
        raise KafkaStartError(
            f"{step}: `{' '.join(command)}` exited with {run.returncode}\n{(run.stdout + run.stderr)[-LOG_TAIL_BYTES:]}"
        )


def into_cache(final: Path, make: Callable[[Path], None]) -> Path:
    """`final`, made by `make` in a fresh directory beside it and renamed into place whole, unless it is there already
    (two processes making it at once both succeed; one's copy is kept)."""
    if final.is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=final.parent))
    try:
        make(work)
        try:
            work.rename(final)
        except OSError:
            if not final.is_dir():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return final


def fetch_broker() -> Path:
    """The directory of Apache Kafka's broker jars, fetched with Maven into the cache the first time."""

    def fetch(into: Path) -> None:
        _maven(f"fetching Apache Kafka {KAFKA_VERSION}'s broker jars",
               ["-f", str(_BROKER_POM), f"-Dkafka.version={KAFKA_VERSION}", "dependency:copy-dependencies",
                f"-DoutputDirectory={into}", "-DincludeScope=runtime"], cwd=into)

    return into_cache(_broker_dir(), fetch)


def tool_argv(main_class: str, *args: str) -> list[str]:
    """The command line of one of Kafka's command-line tools, as its bin/kafka-*.sh runs it (kafka-transactions.sh:
    `tool_argv("org.apache.kafka.tools.TransactionsCommand", "--bootstrap-server", ..., "list")`), from the broker's
    jars, fetched first if need be."""
    return [_java(), "-Xmx256m", "-cp", str(fetch_broker() / "*"), main_class, *args]


def _sources_digest(project: Path) -> str:
    """A digest of a Maven project's pom.xml and src/: a change to either makes a new build."""
    files = [project / "pom.xml", *sorted(p for p in (project / "src").rglob("*") if p.is_file())]
    digest = hashlib.sha256()
    for path in files:
        digest.update(str(path.relative_to(project)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


def _artifact_id(project: Path) -> str:
    pom = ElementTree.parse(project / "pom.xml").getroot()
    return pom.findtext("{http://maven.apache.org/POM/4.0.0}artifactId") or project.name


def build_java_program(project: Path, kafka_version: str | None = None) -> JavaProgram:
    """A Maven project (a pom.xml and src/) built into the cache, once for each content of its sources: `mvn package`
    in a copy, so the project's own directory gets no target/.  `kafka_version` (e.g. "3.9.2") builds it against
    that version of Kafka's artifacts (the pom's `kafka.version` property), in a cache entry of its own; None takes
    the pom's."""
    project = Path(project).resolve()
    if not (project / "pom.xml").is_file():
        raise KafkaStartError(f"building a Java program: no pom.xml in {project}")
    name = _artifact_id(project)
    version_suffix = f"-kafka-{kafka_version}" if kafka_version else ""
    final = cache_dir() / "programs" / f"{name}-{_sources_digest(project)}{version_suffix}"
    version_property = [f"-Dkafka.version={kafka_version}"] if kafka_version else []

    def build(into: Path) -> None:
        source = into / "source"
        shutil.copytree(project, source, ignore=shutil.ignore_patterns("target"))
        _maven(f"building the Java program {project}{f' against Kafka {kafka_version}' if kafka_version else ''}",
               ["-f", str(source / "pom.xml"), *version_property, "package", "dependency:copy-dependencies",
                f"-DoutputDirectory={into / 'lib'}", "-DincludeScope=runtime"], cwd=into)
        (jar,) = (source / "target").glob("*.jar")
        jar.rename(into / "lib" / f"{name}.jar")
        shutil.rmtree(source)

    lib = into_cache(final, build) / "lib"
    return JavaProgram(project, os.pathsep.join(str(p) for p in sorted(lib.glob("*.jar"))))


# --------------------------------------------------------------------------
# the node
# --------------------------------------------------------------------------


def _cluster_id() -> str:
    """A random cluster id as Kafka's Uuid.randomUuid() makes one: 16 bytes in URL-safe base64, not starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def _properties(settings: Mapping[str, str]) -> str:
    def escape(text: str) -> str:
        return text.replace("\\", "\\\\").replace("\n", "\\n").replace(":", "\\:").replace("=", "\\=")

    return "".join(f"{escape(k)}={escape(v)}\n" for k, v in settings.items())


def stop_process(process: subprocess.Popen, timeout: float) -> None:
    """SIGTERM (Kafka's controlled shutdown), then SIGKILL after `timeout` seconds."""
    if process.poll() is not None:
        return
    try:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=timeout)
    except ProcessLookupError:
        return
    except subprocess.TimeoutExpired:
        try:
            process.kill()
        except ProcessLookupError:
            return
        process.wait(timeout=30)


class _Node:
    """The broker's process and its files.  stop() is idempotent."""

    def __init__(self, workdir: Path, jars: Path, overrides: Mapping[str, str], heap: str):
        self.workdir = workdir
        self.classpath = str(jars / "*")
        self.overrides = dict(overrides)
        self.heap = heap
        self.cluster_id = _cluster_id()
        self.owner_pid = os.getpid()
        self.process: subprocess.Popen | None = None
        self.logfile = workdir / "kafka.log"
        self._log: BinaryIO | None = None
        self._lock = threading.Lock()
        self._stopped = False
        # PR_SET_PDEATHSIG fires when the *thread* that spawned the child exits, so use it only from the main thread.
        self._pdeathsig = threading.current_thread() is threading.main_thread() and shutil.which("setpriv") is not None

    def java(self, main_class: str, *args: str) -> list[str]:
        return [_java(), f"-Xmx{self.heap}", f"-Xms{self.heap}", *_JVM_OPTIONS,
                f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
                "-cp", self.classpath, main_class, *args]

    def configure(self, port: int, controller_port: int) -> Path:
        settings = {
            "process.roles": "broker,controller",
            "node.id": str(NODE_ID),
            "controller.quorum.voters": f"{NODE_ID}@{HOST}:{controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{port},CONTROLLER://{HOST}:{controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            **_ONE_NODE_SETTINGS,
            **self.overrides,
        }
        path = self.workdir / "server.properties"
        path.write_text("# Written by lab.servers.kafka: one KRaft node, Kafka's defaults but for these.\n" + _properties(settings))
        (self.workdir / "log4j2.properties").write_text(_LOG4J2)
        return path

    def format(self, config: Path, timeout: float) -> None:
        """kafka-storage.sh format: the log dir's meta.properties and the cluster's bootstrap metadata."""
        output = self.workdir / "format.log"
        argv = self.java("kafka.tools.StorageTool", "format", "--cluster-id", self.cluster_id, "--config", str(config))
        with open(output, "wb") as out:
            try:
                code = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                      cwd=self.workdir, timeout=timeout).returncode
            except subprocess.TimeoutExpired:
                code = None
        if code != 0:
            outcome = f"did not finish in {timeout:.0f} s" if code is None else f"exited with {code}"
            raise KafkaStartError(f"formatting the KRaft log dir: kafka.tools.StorageTool {outcome}; see {output}:\n"
                                  + _log_excerpt(output))

    def spawn(self, config: Path) -> subprocess.Popen:
        argv = self.java("kafka.Kafka", str(config))
        if self._pdeathsig:
            # The broker stops (controlled shutdown) even if the process that started it is killed; setpriv execs
            # java, so the PID held is the broker's.
            argv = ["setpriv", "--pdeathsig", "TERM", "--", *argv]
        if self._log is None:
            self._log = open(self.logfile, "ab")
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=subprocess.STDOUT,
                                        cwd=self.workdir, close_fds=True)
        return self.process

    def stop(self) -> None:
        if os.getpid() != self.owner_pid:
            return  # a forked child must not stop its parent's broker
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                if self.process is not None:
                    stop_process(self.process, timeout=30)
            finally:
                if self._log is not None:
                    self._log.close()
        _ACTIVE.discard(self)


_ACTIVE: set[_Node] = set()


@atexit.register
def _stop_all() -> None:
    for node in list(_ACTIVE):
        node.stop()


# --------------------------------------------------------------------------
# start
# --------------------------------------------------------------------------


def start_kafka(workdir: Path, timeout_s: float = 120.0, overrides: Mapping[str, str] | None = None,
                heap: str = HEAP) -> tuple[KafkaServer, Callable[[], None]]:
    """Fetch the jars if need be, format a KRaft node in `workdir`, start it on 127.0.0.1 and wait until it answers a
    Metadata request with its cluster id.  `overrides` are broker settings laid over the node's.

    Returns the server and an idempotent stop() (also run at exit): SIGTERM, then SIGKILL after 30 s.  The
    workdir, its data and its log are left for post-mortems.  On failure the broker is stopped and KafkaStartError
    names the log and carries its last lines."""
    reason = kafka_missing_reason()
    if reason:
        raise KafkaStartError(reason)
    jars = fetch_broker()
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    if (workdir / "data").exists():
        raise KafkaStartError(f"{workdir / 'data'} exists: start the broker in a directory of its own")
    node = _Node(workdir, jars, overrides or {}, heap)
    _ACTIVE.add(node)
    deadline = time.monotonic() + timeout_s
    try:
        port, controller_port = _start(node, deadline)
    except BaseException:
        node.stop()
        raise
    assert node.process is not None
    server = KafkaServer(host=HOST, port=port, controller_port=controller_port, cluster_id=node.cluster_id,
                         node_id=NODE_ID, version=KAFKA_VERSION, pid=node.process.pid, workdir=workdir)
    return server, node.stop


def _start(node: _Node, deadline: float) -> tuple[int, int]:
    # The ports are picked now and bound a moment later; if another process took one meanwhile, the broker exits
    # and starts again on fresh ones (the static quorum keeps no port in the formatted log dir).
    for attempt in range(3):
        port, controller_port = free_port(), free_port()
        config = node.configure(port, controller_port)
        if attempt == 0:
            node.format(config, timeout=max(10.0, deadline - time.monotonic()))
        log_start = node.logfile.stat().st_size if node.logfile.exists() else 0
        process = node.spawn(config)
        last = "not listening yet"
        while process.poll() is None:
            try:
                last = _probe(port, node.cluster_id)
            except OSError as e:
                last = f"port {port}: {e.strerror or e}"
            if not last:
                return port, controller_port
            if time.monotonic() > deadline:
                raise KafkaStartError(f"waiting for Apache Kafka on {HOST}:{port}: no answer before the timeout "
                                      f"(last: {last}); see {node.logfile}:\n" + _log_excerpt(node.logfile))
            time.sleep(0.2)
        if attempt < 2 and "Address already in use" in _log_since(node.logfile, log_start):
            continue
        raise KafkaStartError(f"starting Apache Kafka: it exited with {process.returncode}; see {node.logfile}:\n"
                              + _log_excerpt(node.logfile))
    raise AssertionError("not reached")


def _probe(port: int, cluster_id: str) -> str:
    """'' once the broker on `port` answers Metadata with `cluster_id`, else what it did instead."""
    with socket.create_connection((HOST, port), timeout=1):
        pass  # listening: now ask librdkafka (which logs every refused connection)
    try:
        metadata = AdminClient({"bootstrap.servers": f"{HOST}:{port}"}).list_topics(timeout=2)
    except KafkaException as e:
        return f"Metadata: {e}"
    if metadata.cluster_id != cluster_id:
        return f"port {port} answered by another cluster ({metadata.cluster_id})"
    return ""


def _log_excerpt(path: Path, lines: int = 10) -> str:
    """The last `lines` lines of a log but for Java's stack frames, which would leave no room for the error they follow."""
    kept = [line for line in log_tail(path, lines=LOG_TAIL_LINES * 5, max_bytes=LOG_TAIL_BYTES * 5).splitlines()
            if not line.startswith(("\tat ", "\t... "))]
    return "\n".join(kept[-lines:])


def _log_since(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode("utf-8", "replace")
    except OSError:
        return ""


# --------------------------------------------------------------------------
# python -m lab.servers.kafka
# --------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m lab.servers.kafka",
        description=f"Apache Kafka {KAFKA_VERSION}'s broker, one KRaft node on 127.0.0.1 (cache: {cache_dir()}).")
    commands = parser.add_subparsers(dest="command")
    fetch = commands.add_parser("fetch", help="fetch the broker's jars and build the given Maven projects into the cache")
    fetch.add_argument("projects", nargs="*", type=Path, metavar="MAVEN_PROJECT")
    start = commands.add_parser("start", help="start a node, print its address as a JSON line, stop it on Ctrl-C (the default)")
    start.add_argument("--workdir", type=Path, help="its directory (default: a new one in the temporary directory)")
    args = parser.parse_args(argv)
    try:
        if args.command == "fetch":
            return _fetch_command(args.projects)
        return _start_command(args.workdir if args.command == "start" else None)
    except KafkaStartError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1


def _fetch_command(projects: list[Path]) -> int:
    reason = kafka_missing_reason()
    if reason:
        print(f"error: {reason}", file=sys.stderr)
        return 1
    started = time.monotonic()
    jars = fetch_broker()
    size = sum(p.stat().st_size for p in jars.glob("*.jar"))
    print(json.dumps({"broker_jars": str(jars), "bytes": size, "seconds": round(time.monotonic() - started, 1)}))
    for project in projects:
        started = time.monotonic()
        program = build_java_program(project)
        print(json.dumps({"program": str(program.project), "classpath": program.classpath,
                          "seconds": round(time.monotonic() - started, 1)}))
    return 0


def _running(pid: int) -> bool:
    """Whether process `pid` runs (a zombie, exited but not yet reaped, does not)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _start_command(workdir: Path | None) -> int:
    workdir = workdir or Path(tempfile.mkdtemp(prefix="logcompact-kafka-"))
    started = time.monotonic()
    server, stop = start_kafka(workdir)
    stopping = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    print(json.dumps({"bootstrap_servers": server.bootstrap_servers, "version": server.version,
                      "cluster_id": server.cluster_id, "pid": server.pid, "log": str(server.logfile),
                      "started_in_s": round(time.monotonic() - started, 1)}), flush=True)
    try:
        while not stopping.is_set() and _running(server.pid):
            stopping.wait(1)
    finally:
        stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
