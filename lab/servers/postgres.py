"""Start and stop a real PostgreSQL server for tests and benchmarks: a throw-away cluster
made with Debian's PostgreSQL binaries (``/usr/lib/postgresql/15/bin``, else
the newest ``/usr/lib/postgresql/*/bin``, else ``PATH``).

The server listens on 127.0.0.1 only, on a port picked at runtime, with
``trust`` authentication for the superuser ``postgres`` and no durability
(fsync, synchronous_commit and full_page_writes off): it is a throw-away server,
never a place for data anyone wants back.  It holds a database ``logcompact``
and makes more on request, so each test or run can have an empty one of its own.

PostgreSQL refuses to run as root.  As root, the cluster is made and run as
the ``postgres`` system user (Debian's postgresql package creates it): initdb
and pg_ctl through ``runuser -u postgres --``, the server itself through
``setpriv`` (which execs it, so the PID this module holds is the server's).
The data directory and the Unix socket directory live in a fresh
``tempfile.mkdtemp()`` directory (owned by that user when root, so it need
not traverse the caller's mode-700 pytest directories; a short path, as Unix
socket paths are limited to 107 bytes); stop() deletes it.  That directory
is made in /dev/shm when it is a tmpfs with 2 GiB free (creating a database
there takes ~10 ms instead of ~230 ms on an ext4 /tmp), so the cluster is
held in RAM: ~40 MB, plus ~8 MB per database made from template0, plus up to
256 MB of WAL; drop the per-test databases when done.  The server log is
written to ``workdir/postgres.log`` (and initdb's output to
``workdir/initdb.log``), where it survives the server for post-mortems.

Usage (e.g. from a session-scoped pytest fixture)::

    from lab.servers.postgres import start_postgres, postgres_missing_reason

    reason = postgres_missing_reason()
    if reason:
        pytest.fail(reason)
    server, stop = start_postgres(tmp_path_factory.mktemp("postgres"))
    try:
        yield server
    finally:
        stop()

    server.url                      # postgresql+psycopg://postgres@127.0.0.1:PORT/logcompact
    url = server.create_database()  # a new, empty database (test_<hex>); its SQLAlchemy URL
    server.drop_database(url)        # (or by name: create_database("x"), drop_database("x"))

The readiness probe is a psycopg connection over TCP that also checks the
server's data_directory, so a server of someone else's on the same port is
never taken for ours.
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import os
import pwd
import re
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import psycopg
from psycopg import sql
from sqlalchemy.engine import URL, make_url

from lab.servers.common import HOST, LOG_TAIL_BYTES, free_port, log_tail

__all__ = ["PostgresServer", "PostgresStartError", "start_postgres", "postgres_missing_reason"]

DB_USER = "postgres"  # the cluster's superuser (initdb -U)
DB_NAME = "logcompact"
OS_USER = "postgres"  # the system account the server runs as when we are root

_REQUIRED_BINARIES = ("initdb", "pg_ctl", "postgres")
_PREFERRED_BINDIR = Path("/usr/lib/postgresql/15/bin")

# Throw-away server: no durability, many connections (the tests run many
# concurrent writer processes), log to stderr (= workdir/postgres.log).
_SERVER_SETTINGS = {
    "listen_addresses": HOST,
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "200",
    "logging_collector": "off",
    "log_destination": "stderr",
    "log_line_prefix": "%m [%p] %q%a ",
    "log_min_messages": "warning",
    "log_checkpoints": "off",
    # a test that forgets to commit must not hang the suite forever
    "idle_in_transaction_session_timeout": "600s",
    # the WAL may live in RAM (/dev/shm): keep it small
    "min_wal_size": "32MB",
    "max_wal_size": "256MB",
}

# The data directory goes to /dev/shm when that is a tmpfs with room: CREATE
# DATABASE there takes ~10 ms instead of ~230 ms on an ext4 /tmp
# (it creates ~300 files), and initdb ~0.5 s instead of ~1.4 s.
_SHM = "/dev/shm"
_SHM_MIN_FREE = 2 << 30

_SOCKET_NAME_LEN = len("/run/.s.PGSQL.65535.lock")


@dataclass(frozen=True)
class PostgresServer:
    host: str  # "127.0.0.1"
    port: int
    user: str  # "postgres", a superuser; trust authentication, no password
    dbname: str  # "logcompact"
    version_num: int  # server_version_num, e.g. 150018
    workdir: Path  # the caller's directory: postgres.log, initdb.log
    datadir: Path  # in a private temporary directory, deleted by stop()
    socket_dir: Path

    @property
    def url(self) -> str:
        """SQLAlchemy URL of the database ``logcompact``."""
        return self.url_for(self.dbname)

    @property
    def logfile(self) -> Path:
        return self.workdir / "postgres.log"

    def url_for(self, dbname: str) -> str:
        """SQLAlchemy URL (psycopg 3 driver) of database `dbname` on this server."""
        return URL.create(
            "postgresql+psycopg", username=self.user, host=self.host, port=self.port, database=dbname
        ).render_as_string(hide_password=False)

    def conninfo(self, dbname: str | None = None) -> str:
        """libpq connection string, for psycopg.connect() or psql."""
        return psycopg.conninfo.make_conninfo(
            host=self.host, port=self.port, user=self.user, dbname=dbname or self.dbname
        )

    def connect(self, dbname: str | None = None, autocommit: bool = True, **kwargs) -> psycopg.Connection:
        """A new psycopg connection (autocommit by default) to `dbname` (default ``logcompact``)."""
        return _connect(self.port, dbname or self.dbname, autocommit=autocommit, **kwargs)

    def create_database(self, name: str | None = None) -> str:
        """Create a new, empty database (a copy of template0) and return its SQLAlchemy URL.

        Without a name, a unique one (``test_<hex>``) is chosen.  Raises
        psycopg.errors.DuplicateDatabase if it exists."""
        name = name or f"test_{uuid.uuid4().hex[:16]}"
        _check_dbname(name)
        with _connect(self.port, "postgres") as conn:
            _create_database(conn, name, self.version_num)
        return self.url_for(name)

    def drop_database(self, name: str) -> None:
        """Drop a database (by name, or by the URL create_database() returned) if it exists,
        disconnecting its sessions first."""
        if "://" in name:
            name = make_url(name).database or ""
        _check_dbname(name)
        with _connect(self.port, "postgres") as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))


class PostgresStartError(RuntimeError):
    """Starting the server failed.  The message names the failing step and
    carries the tail of the server log (or initdb's output)."""


# --------------------------------------------------------------------------
# binaries, missing reason
# --------------------------------------------------------------------------


def _version_key(bindir: str) -> tuple:
    # /usr/lib/postgresql/15/bin -> (15,), /usr/lib/postgresql/9.6/bin -> (9, 6)
    parts = re.findall(r"\d+", Path(bindir).parent.name)
    return tuple(int(p) for p in parts) if parts else (-1,)


def _find_binaries() -> dict[str, str] | None:
    """Paths of initdb, pg_ctl and postgres, all from one directory when possible."""
    candidates = [str(_PREFERRED_BINDIR)]
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for d in candidates:
        paths = {b: os.path.join(d, b) for b in _REQUIRED_BINARIES}
        if all(os.path.isfile(p) and os.access(p, os.X_OK) for p in paths.values()):
            return paths
    found = {b: shutil.which(b) for b in _REQUIRED_BINARIES}
    if all(found.values()):
        return found  # type: ignore[return-value]
    return None


def _is_root() -> bool:
    return os.geteuid() == 0


def postgres_missing_reason() -> str | None:
    """None if a PostgreSQL server can be started here, otherwise a one-line reason."""
    if _find_binaries() is None:
        return (
            "PostgreSQL server not installed (no initdb, pg_ctl and postgres in /usr/lib/postgresql/*/bin "
            "or on PATH); run `make deps` (`make test` and `make bench` run it; it does: apt-get install -y postgresql)"
        )
    if _is_root():
        try:
            pwd.getpwnam(OS_USER)
        except KeyError:
            return (
                f"running as root, which PostgreSQL refuses, and there is no `{OS_USER}` system user to run "
                "it as; run `apt-get install -y postgresql` (its postgresql-common creates the user)"
            )
        missing = [b for b in ("runuser", "setpriv") if shutil.which(b) is None]
        if missing:
            return (
                f"running as root, and {', '.join(missing)} (to run PostgreSQL as `{OS_USER}`) not found; "
                "run `apt-get install -y util-linux`"
            )
    return None


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _check_dbname(name: str) -> None:
    if not name or "\x00" in name or len(name.encode()) > 63:
        raise ValueError(f"not a usable PostgreSQL database name (1 to 63 bytes, no NUL): {name!r}")


def _connect(port: int, dbname: str, autocommit: bool = True, **kwargs) -> psycopg.Connection:
    kwargs.setdefault("connect_timeout", 10)
    kwargs.setdefault("sslmode", "disable")
    return psycopg.connect(host=HOST, port=port, user=DB_USER, dbname=dbname, autocommit=autocommit, **kwargs)


def _create_database(conn: psycopg.Connection, name: str, version_num: int) -> None:
    query = "CREATE DATABASE {} OWNER {} TEMPLATE template0 ENCODING 'UTF8'"
    if version_num >= 150000:
        # PostgreSQL 15's default, WAL_LOG, writes the whole template to the
        # WAL (~8 MB); FILE_COPY copies the files (faster without fsync)
        query += " STRATEGY FILE_COPY"
    conn.execute(sql.SQL(query).format(sql.Identifier(name), sql.Identifier(DB_USER)))


def _tmp_parent() -> str | None:
    """/dev/shm when it is a writable tmpfs with room, else None (the default temporary directory)."""
    try:
        st = os.statvfs(_SHM)
        with open("/proc/mounts") as f:
            on_tmpfs = any(line.split()[1:3] == [_SHM, "tmpfs"] for line in f)
    except (OSError, IndexError):
        return None
    if on_tmpfs and os.access(_SHM, os.W_OK | os.X_OK) and st.f_bavail * st.f_frsize >= _SHM_MIN_FREE:
        return _SHM
    return None


def _sweep_stale(parent: str) -> None:
    """Delete the private directories of servers whose process was killed
    (stop() never ran; the server stopped on its own, see --pdeathsig): in
    /dev/shm they would hold RAM until reboot.  Each live one holds an flock
    on its .lock for as long as the process that made it lives, so a
    directory goes only when that lock is free (or, without a .lock, when it
    is an hour old).  No process is ever signalled."""
    for d in glob.glob(os.path.join(parent, "logcompact-pg-*")):
        try:
            fd = os.open(os.path.join(d, ".lock"), os.O_RDONLY)
        except FileNotFoundError:
            try:
                if time.time() - os.stat(d).st_mtime > 3600:
                    shutil.rmtree(d, ignore_errors=True)
            except OSError:
                pass
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # in use
        else:
            shutil.rmtree(d, ignore_errors=True)
        finally:
            os.close(fd)


def _clean_env() -> dict:
    # Nothing from the caller's environment may point the tools at another
    # cluster (PGDATA, PGPORT, PGHOST...) or inject options (PGOPTIONS).
    env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
    env["LC_ALL"] = "C"
    return env


def _runuser(argv: list[str]) -> list[str]:
    """`argv` run as the postgres system user when we are root (short-lived tools)."""
    return ["runuser", "-u", OS_USER, "--"] + argv if _is_root() else argv


def _read_pidfile(datadir: Path) -> int | None:
    try:
        return int((datadir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None


def _same_dir(a: str, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


class _Cluster:
    """The server process and its private directory.  stop() is idempotent."""

    def __init__(self, workdir: Path, binaries: dict[str, str]):
        self.workdir = workdir
        self.bin = binaries
        self.owner_pid = os.getpid()
        self.proc: subprocess.Popen | None = None
        self.logfile = workdir / "postgres.log"
        self._log: BinaryIO | None = None
        self._lock = threading.Lock()
        self._stopped = False
        # PR_SET_PDEATHSIG fires when the *thread* that spawned the child
        # exits, so use it only from the main thread (pytest fixtures).
        self._pdeathsig = threading.current_thread() is threading.main_thread()

        # data + socket directory: fresh, short, private, reachable by the server's user
        parent = _tmp_parent()
        _sweep_stale(parent or tempfile.gettempdir())
        base = tempfile.mkdtemp(prefix="logcompact-pg-", dir=parent)
        if len(base) + _SOCKET_NAME_LEN > 100:
            os.rmdir(base)
            base = tempfile.mkdtemp(prefix="logcompact-pg-", dir="/tmp")
        self.base = Path(base)
        # held until stop() or the death of this process (and its forks): _sweep_stale()
        # leaves the directory alone meanwhile (locked before it gets its name, so
        # a sweeper never sees it unlocked)
        self._lockfd = os.open(self.base / ".lock.new", os.O_CREAT | os.O_RDWR, 0o644)
        fcntl.flock(self._lockfd, fcntl.LOCK_EX)
        os.rename(self.base / ".lock.new", self.base / ".lock")
        self.datadir = self.base / "data"
        self.socket_dir = self.base / "run"
        self.socket_dir.mkdir(mode=0o700)
        if _is_root():
            pw = pwd.getpwnam(OS_USER)
            for p in (self.base, self.socket_dir):
                os.chown(p, pw.pw_uid, pw.pw_gid)

    def run(self, step: str, argv: list[str], timeout: float, output: Path | None = None) -> str:
        try:
            r = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=self.base,
                env=_clean_env(),
                timeout=timeout,
            )
        except subprocess.TimeoutExpired as e:
            out = e.output.decode("utf-8", "replace") if isinstance(e.output, bytes) else (e.output or "")
            raise PostgresStartError(f"{step}: `{' '.join(argv)}` timed out after {timeout:.0f}s\n{out[-LOG_TAIL_BYTES:]}") from None
        if output is not None:
            try:
                output.write_text(r.stdout)
            except OSError:
                pass
        if r.returncode != 0:
            raise PostgresStartError(
                f"{step}: `{' '.join(argv)}` exited with {r.returncode}\n{r.stdout[-LOG_TAIL_BYTES:]}"
            )
        return r.stdout

    def spawn(self, port: int) -> subprocess.Popen:
        argv = [self.bin["postgres"], "-D", str(self.datadir), "-p", str(port),
                "-c", f"unix_socket_directories={self.socket_dir}"]
        for k, v in _SERVER_SETTINGS.items():
            argv += ["-c", f"{k}={v}"]
        if _is_root():
            # setpriv execs (runuser would stay in between as a watching parent),
            # so self.proc.pid is the postmaster's PID.
            pre = ["setpriv", f"--reuid={OS_USER}", f"--regid={OS_USER}", "--init-groups"]
        elif self._pdeathsig and shutil.which("setpriv"):
            pre = ["setpriv"]
        else:
            pre = []
        if pre and self._pdeathsig:
            # The server stops (fast shutdown) even if the process that started it is killed.
            # (Set by setpriv after it changes user: a uid change clears it.)
            pre += ["--pdeathsig", "INT"]
        if pre:
            argv = pre + ["--"] + argv
        if self._log is None:
            self._log = open(self.logfile, "ab")
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=self.base,
            env=_clean_env(),
            close_fds=True,
        )
        return self.proc

    def stop(self) -> None:
        if os.getpid() != self.owner_pid:
            return  # a forked child (multiprocessing) must not stop its parent's server
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            try:
                self._stop_server()
            finally:
                if self._log is not None:
                    try:
                        self._log.close()
                    except OSError:
                        pass
                shutil.rmtree(self.base, ignore_errors=True)
                os.close(self._lockfd)
        _ACTIVE.discard(self)

    def _stop_server(self) -> None:
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        # 1. a fast shutdown: disconnect the sessions, roll back, checkpoint, exit
        try:
            r = subprocess.run(
                _runuser([self.bin["pg_ctl"], "-D", str(self.datadir), "-m", "fast", "-w", "-t", "30", "stop"]),
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                cwd=self.base,
                env=_clean_env(),
                timeout=40,
            )
            stopped = r.returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            stopped = False
        try:
            proc.wait(timeout=10 if stopped else 0.1)
            return
        except subprocess.TimeoutExpired:
            pass
        # 2. pg_ctl failed: signal the PID in postmaster.pid, if it is ours (it
        # is the process we spawned: setpriv and postgres exec, no fork)
        pid = _read_pidfile(self.datadir)
        if pid is None or pid != proc.pid:
            pid = proc.pid
        for sig, wait in ((signal.SIGINT, 10), (signal.SIGQUIT, 10), (signal.SIGKILL, 10)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                break
            try:
                proc.wait(timeout=wait)
                break
            except subprocess.TimeoutExpired:
                continue


_ACTIVE: set[_Cluster] = set()


@atexit.register
def _stop_all() -> None:
    for c in list(_ACTIVE):
        c.stop()


# --------------------------------------------------------------------------
# start
# --------------------------------------------------------------------------


def start_postgres(workdir: Path, timeout_s: float = 30.0) -> tuple[PostgresServer, Callable[[], None]]:
    """initdb a new cluster, start its server on 127.0.0.1:<free port>, wait
    until a psycopg connection succeeds, create the database ``logcompact``.

    Returns the server and an idempotent stop() (also run at exit) that shuts
    it down (pg_ctl stop -m fast, else signals to its PID) and deletes the
    data directory.  On failure everything started is stopped and
    PostgresStartError is raised with the tail of the server log.
    """
    reason = postgres_missing_reason()
    if reason:
        raise PostgresStartError(reason)
    binaries = _find_binaries()
    assert binaries is not None
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    deadline = time.monotonic() + timeout_s
    cluster = _Cluster(workdir, binaries)
    _ACTIVE.add(cluster)
    try:
        port, version_num = _start(cluster, deadline)
    except BaseException:
        cluster.stop()
        raise
    server = PostgresServer(
        host=HOST,
        port=port,
        user=DB_USER,
        dbname=DB_NAME,
        version_num=version_num,
        workdir=workdir,
        datadir=cluster.datadir,
        socket_dir=cluster.socket_dir,
    )
    return server, cluster.stop


def _start(c: _Cluster, deadline: float) -> tuple[int, int]:
    if _is_root():
        # The server's user must reach its directory (a TMPDIR under /root would not do).
        try:
            c.run("checking the postgres user can write its directory",
                  _runuser(["test", "-w", str(c.socket_dir)]), timeout=30)
        except PostgresStartError as e:
            raise PostgresStartError(
                f"the `{OS_USER}` user cannot write {c.socket_dir} (is TMPDIR={tempfile.gettempdir()} "
                f"traversable by it?)\n{e}"
            ) from None
    c.run(
        "initdb",
        _runuser([c.bin["initdb"], "-D", str(c.datadir), "--auth=trust", "-U", DB_USER,
                  "--encoding=UTF8", "--locale=C", "--no-sync"]),
        timeout=max(5.0, deadline - time.monotonic()),
        output=c.workdir / "initdb.log",
    )

    # The port is picked now and bound a moment later; if someone else grabbed
    # it meanwhile, the server exits and we retry with a fresh port.
    for attempt in range(3):
        port = free_port()
        log_start = c.logfile.stat().st_size if c.logfile.exists() else 0
        proc = c.spawn(port)
        last = "no connection yet"
        while True:
            if proc.poll() is not None:
                text = _log_since(c.logfile, log_start)
                if attempt < 2 and ("could not bind" in text or "could not create any TCP/IP sockets" in text):
                    break  # port taken: next attempt
                raise PostgresStartError(
                    f"starting postgres: it exited with {proc.returncode}\n--- tail of {c.logfile} ---\n"
                    + log_tail(c.logfile)
                )
            try:
                with _connect(port, "postgres", connect_timeout=2) as conn:
                    ((datadir,),) = conn.execute("SHOW data_directory").fetchall()
                    if _same_dir(datadir, c.datadir):
                        ((version,),) = conn.execute("SHOW server_version_num").fetchall()
                        version_num = int(version)
                        _create_database(conn, DB_NAME, version_num)
                        return port, version_num
                    last = f"port {port} answered by another server (data directory {datadir})"
            except psycopg.Error as e:
                last = f"{type(e).__name__}: {str(e).strip()}"
            if time.monotonic() > deadline:
                raise PostgresStartError(
                    f"waiting for postgres: no connection to 127.0.0.1:{port} before the timeout "
                    f"(last: {last})\n--- tail of {c.logfile} ---\n" + log_tail(c.logfile)
                )
            time.sleep(0.05)
    raise AssertionError("not reached")


def _log_since(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(200_000).decode("utf-8", "replace")
    except OSError:
        return ""
