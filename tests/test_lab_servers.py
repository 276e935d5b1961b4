"""The lab's throw-away PostgreSQL server (lab.servers.postgres), which the suite and the benchmarks
run against: what it promises of itself, checked on a server of this test's own."""

from __future__ import annotations

import os
import pwd
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import sqlalchemy as sa

from lab.servers.postgres import DB_USER, HOST, OS_USER, start_postgres


def _process_user(pid: int) -> str:
    uid = next(line.split()[1] for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:"))
    return pwd.getpwuid(int(uid)).pw_name


def test_a_throw_away_server_is_what_it_says_and_leaves_only_its_log(tmp_path) -> None:
    server, stop = start_postgres(tmp_path / "pg")
    try:
        with server.connect() as conn:
            settings = dict(conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name = ANY(%s)",
                (["fsync", "synchronous_commit", "full_page_writes", "max_connections", "listen_addresses"],),
            ).fetchall())
            ((pid,),) = conn.execute("SELECT pg_backend_pid()").fetchall()
            ((owner,),) = conn.execute("SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = current_database()").fetchall()
            # PostgreSQL refuses root: as root, its processes run as the postgres user (read while this one lives).
            backend_user = _process_user(pid)
        assert settings == {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off", "max_connections": "200", "listen_addresses": HOST}
        assert owner == DB_USER
        assert backend_user == (OS_USER if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name)

        url = server.create_database()  # a database of its own, empty, for a test or a run
        engine = sa.create_engine(url)
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE t (k text PRIMARY KEY, v bigint)"))
            conn.execute(sa.text("INSERT INTO t VALUES ('a', 1), ('b', 2)"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT k, v FROM t ORDER BY k")).all() == [("a", 1), ("b", 2)]
        engine.dispose()
        server.drop_database(url)
        with server.connect() as conn:
            assert conn.execute("SELECT count(*) FROM pg_database WHERE datname LIKE 'test_%%'").fetchall() == [(0,)]

        # The suite's threads and agents hold many connections at once: 150 open together, past PostgreSQL's
        # default of 100 connections.
        together = threading.Barrier(150)

        def session(_: int) -> int:
            with server.connect() as conn:
                together.wait(timeout=60)  # all open
                ((seen,),) = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend'").fetchall()
                together.wait(timeout=60)  # none closed before every one has counted
                return seen

        with ThreadPoolExecutor(150) as pool:
            assert min(pool.map(session, range(150))) >= 150
    finally:
        stop()
    stop()  # idempotent
    assert not server.datadir.exists()
    assert server.logfile.exists() and server.logfile.stat().st_size > 0  # kept for post-mortems
