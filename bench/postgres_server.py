"""A throw-away PostgreSQL 15 server for the benchmarks, on disk at the server's default durability: the regime users
run, where the tests' server (in RAM, fsync off) measures only the database's CPU and round trips."""

from __future__ import annotations

import atexit
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from pathlib import Path

PG_BIN = Path("/usr/lib/postgresql/15/bin")


class ThrowAwayPostgres:
    """A PostgreSQL cluster of its own in a temporary directory on disk, at the server's default settings (fsync,
    synchronous_commit and full_page_writes on) but for where it listens: 127.0.0.1 and a free port. As root it runs
    as the `postgres` user (PostgreSQL refuses root). `stop` stops it by the PID in its postmaster.pid."""

    def __init__(self) -> None:
        self.base = Path(tempfile.mkdtemp(prefix="logcompact-bench-pg-"))
        self.data = self.base / "data"
        self.sockets = self.base / "run"
        self.sockets.mkdir()
        self.log = self.base / "postgres.log"
        self.as_postgres = os.geteuid() == 0
        if self.as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (self.base, self.sockets):
                os.chown(path, user.pw_uid, user.pw_gid)
        self.port = 0
        self.pid: int | None = None
        atexit.register(self.stop)

    def _run(self, argv: list[str]) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if self.as_postgres else []
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")} | {"LC_ALL": "C"}
        found = subprocess.run(prefix + argv, cwd=self.base, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
        if found.returncode:
            raise RuntimeError(f"{' '.join(argv[:2])} exited with {found.returncode}: {(found.stdout + found.stderr)[-2000:]}")

    def start(self) -> None:
        self._run([str(PG_BIN / "initdb"), "-D", str(self.data), "--auth=trust", "-U", "postgres", "--encoding=UTF8", "--locale=C"])
        for attempt in range(3):  # a free port may be taken between finding it and the server binding it
            with socket.socket() as probe:
                probe.bind(("127.0.0.1", 0))
                self.port = probe.getsockname()[1]
            options = f"-c listen_addresses=127.0.0.1 -p {self.port} -c unix_socket_directories={self.sockets}"
            try:
                self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "60", "-o", options, "start"])
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        self.pid = int((self.data / "postmaster.pid").read_text().split()[0])
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True) as connection:
            settings: dict[str, str] = dict(connection.execute("SELECT name, setting FROM pg_settings WHERE name IN ('fsync', 'synchronous_commit')").fetchall())
        print(f"  PostgreSQL on disk ({self.data}), pid {self.pid}, port {self.port}: fsync {settings['fsync']}, "
              f"synchronous_commit {settings['synchronous_commit']}")

    def cpu_seconds(self) -> float:
        """The CPU time, user and system, of the server's processes alive now (its backends among them)."""
        assert self.pid is not None
        ticks = os.sysconf("SC_CLK_TCK")
        total = 0.0
        for pid in Path(f"/proc/{self.pid}/task/{self.pid}/children").read_text().split():
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:  # exited since it was listed
                continue
            total += (int(fields[11]) + int(fields[12])) / ticks  # utime, stime: the 14th and 15th fields
        return total

    def new_database(self, name: str) -> str:
        import psycopg

        with psycopg.connect(host="127.0.0.1", port=self.port, user="postgres", dbname="postgres", autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{name}"

    def stop(self) -> None:
        if self.pid is not None:
            try:
                self._run([str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "60", "stop"])
            except (RuntimeError, subprocess.TimeoutExpired):
                for signal_number in (signal.SIGQUIT, signal.SIGKILL):  # an immediate shutdown, then the last resort
                    try:
                        os.kill(self.pid, signal_number)
                    except ProcessLookupError:
                        break
                    time.sleep(5)
            self.pid = None
        shutil.rmtree(self.base, ignore_errors=True)


