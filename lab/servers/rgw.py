"""Start and stop a real S3-compatible server for tests and benchmarks: Ceph's RADOS Gateway
(radosgw) on top of a throw-away one-node Ceph cluster.

The cluster is one monitor (auth disabled), one ``memstore`` OSD (all data in
RAM) and one radosgw with the beast frontend, all bound to 127.0.0.1 on ports
picked at runtime.  Everything the daemons write (config, mon store, OSD dump,
logs, admin sockets, pid files) lives under the ``workdir`` given by the
caller; nothing touches /etc/ceph, /var/lib/ceph or /var/log/ceph.

Usage (e.g. from a session-scoped pytest fixture)::

    from lab.servers.rgw import start_rgw, rgw_missing_reason

    reason = rgw_missing_reason()
    if reason:
        pytest.fail(reason)   # the S3 suite fails, never skips, without its server
    server, stop = start_rgw(tmp_path_factory.mktemp("rgw"))
    try:
        yield server
    finally:
        stop()

The readiness probe is a boto3 ListBuckets, as every S3 client sees the server.
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

from lab.servers.common import LOG_TAIL_BYTES, LOG_TAIL_LINES, free_port, log_tail

__all__ = ["RgwServer", "RgwStartError", "start_rgw", "rgw_missing_reason"]

# Fixed test credentials.  They are never written to any log this module
# creates (radosgw-admin's JSON output is discarded, and command lines are
# redacted in error messages).
ACCESS_KEY = "LOGCOMPACTTESTACCESS"
SECRET_KEY = "logcompact-test-secret-key-not-a-secret0"
REGION = "us-east-1"  # rgw's default zonegroup ("default", api_name "") accepts any region in SigV4
USER_ID = "logcompact-test"

_REQUIRED_BINARIES = ("ceph-mon", "ceph-osd", "radosgw", "radosgw-admin", "ceph", "monmaptool")

_MON_NAME = "a"
_OSD_ID = 0
_RGW_NAME = "client.rgw.test"


@dataclass(frozen=True)
class RgwServer:
    endpoint_url: str  # "http://127.0.0.1:PORT"
    access_key: str
    secret_key: str
    region: str
    workdir: Path

    def client(self, config: Config | None = None):
        """A boto3 S3 client for this server (logcompact's client settings unless `config` is given)."""
        if config is None:
            from logcompact.store.s3 import CLIENT_CONFIG as config
        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name=self.region,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            config=config,
        )


class RgwStartError(RuntimeError):
    """Starting the cluster failed.  The message names the failing step and
    carries the tail of the relevant log file(s)."""


def rgw_missing_reason() -> str | None:
    """None if the Ceph binaries are installed, otherwise a one-line reason."""
    missing = [b for b in _REQUIRED_BINARIES if shutil.which(b) is None]
    if not missing:
        return None
    return (
        f"Ceph RADOS Gateway not installed (missing: {', '.join(missing)}); "
        "run `make deps` (it does: apt-get install -y radosgw ceph-mon ceph-osd)"
    )


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _pid_listens(pid: int, port: int) -> bool:
    """True if process `pid` owns the listening TCP socket 127.0.0.1:port.

    Guards against a port picked by free_port() being grabbed by another
    process (e.g. a parallel test worker's cluster) before our daemon binds
    it.  Returns True when /proc cannot tell."""
    try:
        inodes = set()
        with open("/proc/net/tcp") as f:
            next(f)
            for line in f:
                fields = line.split()
                if fields[1] == f"0100007F:{port:04X}" and fields[3] == "0A":
                    inodes.add(f"socket:[{fields[9]}]")
        fd_dir = f"/proc/{pid}/fd"
        for fd in os.listdir(fd_dir):
            try:
                if os.readlink(f"{fd_dir}/{fd}") in inodes:
                    return True
            except OSError:
                pass
        return False
    except (OSError, StopIteration, IndexError):
        return True


def _redact(text: str) -> str:
    return text.replace(SECRET_KEY, "<redacted>")


def _tail(path: Path, lines: int = LOG_TAIL_LINES, max_bytes: int = LOG_TAIL_BYTES) -> str:
    return _redact(log_tail(path, lines, max_bytes))


def _tails(*paths: Path) -> str:
    parts = []
    for p in paths:
        if p.exists():
            parts.append(f"--- tail of {p} ---\n{_tail(p)}")
        else:
            parts.append(f"--- {p}: does not exist ---")
    return "\n".join(parts)


def _clean_env() -> dict:
    env = dict(os.environ)
    # Make sure nothing from the caller's environment points the tools at a
    # real cluster or injects extra arguments.
    for k in ("CEPH_CONF", "CEPH_ARGS", "CEPH_KEYRING"):
        env.pop(k, None)
    return env


def _list_buckets(port: int, timeout: float = 2.0) -> None:
    """One signed S3 ListBuckets; raises until the gateway answers it."""
    client = boto3.client(
        "s3",
        endpoint_url=f"http://127.0.0.1:{port}",
        aws_access_key_id=ACCESS_KEY,
        aws_secret_access_key=SECRET_KEY,
        region_name=REGION,
        config=Config(connect_timeout=timeout, read_timeout=timeout, retries={"max_attempts": 1}),
    )
    client.list_buckets()


def _conf_text(w: Path, fsid: str, mon_port: int) -> str:
    # Unix socket paths are limited to 107 bytes; admin sockets are not needed
    # by this module, so drop them rather than fail on a deep workdir.
    asok = f"{w}/run/$cluster-$name.$pid.asok"
    if len(str(w)) + len("/run/ceph-client.rgw.test.4194304.asok") > 100:
        asok = ""
    # (this option is a whitespace-separated map, so it cannot take a path
    # with spaces)
    if any(ch.isspace() for ch in str(w)):
        cluster_log = "mon cluster log to file = false\n"
    else:
        cluster_log = f"mon cluster log file = {w}/log/cluster.log\nmon cluster log to file = true\n"
    return f"""\
# Generated by lab.servers.rgw -- throw-away one-node cluster.
[global]
fsid = {fsid}
mon host = [v2:127.0.0.1:{mon_port}]
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind msgr1 = false
ms bind msgr2 = true
ms bind ipv6 = false
# radosgw defaults ms_mon_client_mode to "secure", which needs cephx
ms mon client mode = crc

auth cluster required = none
auth service required = none
auth client required = none
keyring = {w}/keyring

run dir = {w}/run
crash dir = {w}/crash
admin socket = {asok}
log file = {w}/log/$name.log
log to file = true
log to stderr = false
err to stderr = true
log to syslog = false
{cluster_log}
# one OSD, pools of size 1, few PGs
mon allow pool size one = true
mon allow pool delete = true
mon warn on pool no redundancy = false
mon warn on pool no app = false
mon warn on too few osds = false
mon max pg per osd = 1000
osd max pg per osd hard ratio = 10
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
osd crush chooseleaf type = 0
mon osd auto mark new in = true

# startup speed
paxos propose interval = 0.05
paxos min wait = 0.01
mon osd prime pg temp = false
mon data avail crit = 0
mon data avail warn = 0
osd mon report interval = 1
osd beacon report interval = 60

[mon]
mon data = {w}/mon/ceph-$id
# exit at once if the port was taken (start_rgw then retries another port)
ms bind retry count = 1
pid file = {w}/run/$name.pid
mon compact on trim = false

[osd]
osd data = {w}/osd/ceph-$id
pid file = {w}/run/$name.pid
osd objectstore = memstore
# memstore keeps objects in RAM; this is only the size it reports (the
# cluster turns read-only at 95% full), memory is used only for stored data.
memstore device bytes = 2147483648
osd memory target = 939524096
osd op num shards = 2
osd op num threads per shard = 1
osd fast shutdown = true
osd mon shutdown timeout = 1
osd scrub auto repair = false
osd scrub min interval = 31536000
osd scrub max interval = 31536000
osd deep scrub interval = 31536000
osd heartbeat interval = 2
osd heartbeat grace = 10

[{_RGW_NAME}]
pid file = {w}/run/$name.pid
rgw data = {w}/rgw
rgw init timeout = 60
rgw enable apis = s3, admin
rgw thread pool size = 64
rgw dynamic resharding = false
rgw enable usage log = false
rgw enable ops log = false
rgw run sync thread = false
rgw enable lc threads = false
rgw enable quota threads = false
rgw data log num shards = 8
# reclaim the tails of deleted/overwritten objects (> 4 MiB) quickly, so a
# long session of tests or benchmarks does not fill the memstore
rgw gc obj min wait = 60
rgw gc processor period = 30
"""


class _Cluster:
    """Processes and state of one throw-away cluster.  stop() is idempotent."""

    def __init__(self, workdir: Path):
        self.w = workdir
        self.conf = workdir / "ceph.conf"
        self.logdir = workdir / "log"
        self.procs: list[tuple[str, subprocess.Popen]] = []
        self._outs: list = []
        self._lock = threading.Lock()
        self._stopped = False
        # PR_SET_PDEATHSIG fires when the *thread* that spawned the child
        # exits, so use it only from the main thread (pytest fixtures).
        self._pdeathsig = (
            threading.current_thread() is threading.main_thread() and shutil.which("setpriv") is not None
        )

    # -- process management ------------------------------------------------

    def spawn(self, name: str, argv: list[str]) -> subprocess.Popen:
        out = open(self.logdir / f"{name}.out", "ab")
        self._outs.append(out)
        cmd = list(argv)
        if self._pdeathsig:
            # The daemons die with us even if the process that started them is killed.
            cmd = ["setpriv", "--pdeathsig", "TERM", "--"] + cmd
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            cwd=self.w,
            env=_clean_env(),
            close_fds=True,
        )
        self.procs.append((name, proc))
        return proc

    def stop(self) -> None:
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            # reverse start order: rgw, osd, mon
            for _name, proc in reversed(self.procs):
                _stop_proc(proc, timeout=10.0)
            for out in self._outs:
                try:
                    out.close()
                except OSError:
                    pass
        _ACTIVE.discard(self)

    def run(self, step: str, argv: list[str], timeout: float, logs: tuple[Path, ...] = ()) -> str:
        """Run a short-lived tool; fail fast if one of our daemons dies meanwhile."""
        proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=self.w,
            env=_clean_env(),
        )
        deadline = time.monotonic() + timeout
        try:
            while True:
                try:
                    stdout, stderr = proc.communicate(timeout=0.1)
                    break
                except subprocess.TimeoutExpired:
                    pass
                self.check_alive(step)
                if time.monotonic() > deadline:
                    raise RgwStartError(
                        f"{step}: `{_redact(' '.join(argv))}` timed out after {timeout:.1f}s\n{_tails(*logs)}"
                    )
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        if proc.returncode != 0:
            raise RgwStartError(
                f"{step}: `{_redact(' '.join(argv))}` exited with {proc.returncode}\n"
                f"{_redact(stdout + stderr)[-LOG_TAIL_BYTES:]}\n{_tails(*logs)}"
            )
        return stdout

    def check_alive(self, step: str) -> None:
        for name, proc in self.procs:
            if proc.poll() is not None:
                raise RgwStartError(
                    f"{step}: {name} (pid {proc.pid}) exited with {proc.returncode}\n"
                    + _tails(*self.daemon_logs(name))
                )

    def daemon_logs(self, name: str) -> tuple[Path, ...]:
        logname = {"mon": f"mon.{_MON_NAME}", "osd": f"osd.{_OSD_ID}", "rgw": _RGW_NAME}[name]
        return (self.logdir / f"{name}.out", self.logdir / f"{logname}.log")


def _stop_proc(proc: subprocess.Popen, timeout: float) -> None:
    if proc.poll() is not None:
        return
    try:
        proc.send_signal(signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        try:
            proc.kill()
        except ProcessLookupError:
            pass
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass


_ACTIVE: set[_Cluster] = set()


@atexit.register
def _stop_all() -> None:
    for c in list(_ACTIVE):
        c.stop()


# --------------------------------------------------------------------------
# start
# --------------------------------------------------------------------------


def start_rgw(workdir: Path, timeout_s: float = 120.0) -> tuple[RgwServer, Callable[[], None]]:
    """Start mon + memstore osd + radosgw in workdir; create an S3 user with a
    fixed access/secret key; wait until a signed S3 ListBuckets succeeds.

    Returns the server and an idempotent stop() that stops all daemons by PID.
    On failure everything started is stopped and RgwStartError is raised with
    a one-line summary followed by the tail of the failing daemon's log.
    """
    reason = rgw_missing_reason()
    if reason:
        raise RgwStartError(reason)
    workdir = Path(workdir).resolve()
    if any(ch in str(workdir) for ch in "$#;\n\r"):
        raise RgwStartError(f"workdir path not usable in a ceph.conf (contains $, #, ; or a newline): {workdir}")
    workdir.mkdir(parents=True, exist_ok=True)
    cluster = _Cluster(workdir)
    _ACTIVE.add(cluster)
    try:
        port = _start(cluster, time.monotonic() + timeout_s)
    except BaseException:
        cluster.stop()
        raise
    server = RgwServer(
        endpoint_url=f"http://127.0.0.1:{port}",
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        region=REGION,
        workdir=workdir,
    )
    return server, cluster.stop


def _remaining(deadline: float, step: str) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise RgwStartError(f"{step}: overall start timeout exceeded")
    return left


def _bind_failed(c: _Cluster, name: str) -> bool:
    text = "\n".join(_tail(p, lines=200, max_bytes=40000) for p in c.daemon_logs(name))
    return any(m in text for m in ("Address already in use", "unable to bind", "failed to bind"))


def _forget(c: _Cluster, name: str, proc: subprocess.Popen) -> None:
    """Drop a daemon that failed to bind its port (radosgw lingers after that)."""
    _stop_proc(proc, timeout=1.0)
    c.procs.remove((name, proc))


def _start(c: _Cluster, deadline: float) -> int:
    w = c.w
    # start from scratch if the workdir held an earlier cluster (only our own
    # subdirectories are touched; stale logs would confuse the boot check)
    for sub in ("log", "run", "mon", "osd", "rgw"):
        if (w / sub).exists():
            shutil.rmtree(w / sub)
    for sub in ("log", "run", "crash", "rgw"):
        (w / sub).mkdir(parents=True, exist_ok=True)
    conf = str(c.conf)
    fsid = str(uuid.uuid4())
    mon_logs = c.daemon_logs("mon")
    osd_logs = c.daemon_logs("osd")

    # ---- monitor + OSD registration.  The mon port is picked now and bound
    # a moment later; if someone else grabbed it meanwhile, the mon exits
    # (ms bind retry count = 1) and we retry with a fresh port. -------------
    osd_uuid = str(uuid.uuid4())
    for attempt in range(3):
        mon_port = free_port()
        c.conf.write_text(_conf_text(w, fsid, mon_port))
        mon_dir = w / "mon" / f"ceph-{_MON_NAME}"
        if mon_dir.exists():
            shutil.rmtree(mon_dir)
        mon_dir.mkdir(parents=True)
        monmap = w / "monmap"
        c.run(
            "monmaptool",
            ["monmaptool", "-c", conf, "--create", "--clobber", "--fsid", fsid,
             "--addv", _MON_NAME, f"[v2:127.0.0.1:{mon_port}]", str(monmap)],
            timeout=30,
        )
        c.run(
            "ceph-mon --mkfs",
            ["ceph-mon", "-c", conf, "--mkfs", "-i", _MON_NAME, "--monmap", str(monmap)],
            timeout=60,
            logs=mon_logs,
        )
        mon = c.spawn("mon", ["ceph-mon", "-c", conf, "-f", "-i", _MON_NAME])
        try:
            # blocks until the mon answers (fails fast if the mon exits)
            left = _remaining(deadline, "registering the OSD")
            out = c.run(
                "registering the OSD (ceph osd new)",
                ["ceph", "-c", conf, "--connect-timeout", str(max(1, int(min(60, left)))),
                 "osd", "new", osd_uuid, str(_OSD_ID)],
                timeout=min(70, left),
                logs=mon_logs,
            )
        except RgwStartError:
            if mon.poll() is not None and attempt < 2 and _bind_failed(c, "mon"):
                _forget(c, "mon", mon)
                continue
            raise
        if not _pid_listens(mon.pid, mon_port):
            # we talked to someone else's monitor on our port; ours failed to bind
            if attempt < 2:
                _forget(c, "mon", mon)
                continue
            raise RgwStartError(f"starting ceph-mon: it does not listen on port {mon_port}\n" + _tails(*mon_logs))
        if out.strip() != str(_OSD_ID):
            raise RgwStartError(
                f"registering the OSD: `ceph osd new` printed {out.strip()!r}, expected {_OSD_ID}\n"
                + _tails(*mon_logs)
            )
        break

    # ---- OSD (memstore: mkfs needs no monitor since the fsid is in the conf)
    osd_dir = w / "osd" / f"ceph-{_OSD_ID}"
    if osd_dir.exists():
        shutil.rmtree(osd_dir)
    osd_dir.mkdir(parents=True)
    c.run(
        "ceph-osd --mkfs",
        ["ceph-osd", "-c", conf, "--mkfs", "-i", str(_OSD_ID), "--osd-uuid", osd_uuid],
        timeout=60,
        logs=osd_logs,
    )
    c.spawn("osd", ["ceph-osd", "-c", conf, "-f", "-i", str(_OSD_ID)])
    # Wait until the OSD has seen itself marked up before radosgw-admin
    # creates the rgw pools: pools created while the OSD is still booting
    # leave their first client ops stalled for ~5 s (until an objecter tick).
    osd_log = c.logdir / f"osd.{_OSD_ID}.log"
    seen = b""
    while True:
        c.check_alive("waiting for ceph-osd to boot")
        try:
            with open(osd_log, "rb") as f:
                f.seek(max(0, len(seen) - 200))  # re-read a little overlap for split lines
                seen = seen[: max(0, len(seen) - 200)] + f.read()
        except OSError:
            pass
        if b"state: booting -> active" in seen:
            break
        if time.monotonic() > deadline:
            raise RgwStartError(
                "waiting for ceph-osd to boot: osd.0 was not marked up before the timeout\n"
                + _tails(*osd_logs, *mon_logs)
            )
        time.sleep(0.05)

    # ---- S3 user.  radosgw-admin talks to RADOS directly; it creates the
    # default realm/zonegroup/zone and the rgw pools.  Done before radosgw
    # starts so the two do not race on creating the default zone.  Its JSON
    # output (which contains the secret key) is discarded. ------------------
    c.run(
        "creating the S3 user (radosgw-admin user create)",
        ["radosgw-admin", "-c", conf, "user", "create", "--uid", USER_ID,
         "--display-name", USER_ID, "--access-key", ACCESS_KEY, "--secret-key", SECRET_KEY],
        timeout=_remaining(deadline, "creating the S3 user"),
        logs=osd_logs + (c.logdir / "client.admin.log",),
    )

    # ---- radosgw (retry with a new port if the one we picked got taken) ----
    for attempt in range(3):
        rgw_port = free_port()
        rgw = c.spawn(
            "rgw",
            # tcp_nodelay: without it a response smaller than one loopback segment waits ~40 ms for
            # the client's delayed ACK (Nagle), which made every small ranged GET cost 44 ms.
            ["radosgw", "-c", conf, "-f", "-n", _RGW_NAME,
             "--rgw-frontends", f"beast endpoint=127.0.0.1:{rgw_port} tcp_nodelay=1"],
        )
        last = "no response yet"
        rgw_log = c.logdir / f"{_RGW_NAME}.log"
        bind_error = f"failed to bind address 127.0.0.1:{rgw_port}"
        while rgw.poll() is None:
            c.check_alive("waiting for radosgw")
            # radosgw does not exit promptly when beast cannot bind its port
            if bind_error in _tail(rgw_log, lines=200, max_bytes=40000):
                break
            try:
                _list_buckets(rgw_port)
                if rgw.poll() is None and _pid_listens(rgw.pid, rgw_port):
                    return rgw_port
                last = "answered, but from another process's port"
            except (BotoCoreError, ClientError) as e:
                last = _redact(f"{type(e).__name__}: {e}")
            if time.monotonic() > deadline:
                raise RgwStartError(
                    f"waiting for radosgw: no successful S3 ListBuckets on port {rgw_port} "
                    f"before the timeout (last: {last})\n" + _tails(*c.daemon_logs("rgw"))
                )
            time.sleep(0.05)
        if attempt < 2 and _bind_failed(c, "rgw"):
            _forget(c, "rgw", rgw)
            continue
        c.check_alive("starting radosgw")
        raise RgwStartError(f"starting radosgw: it could not bind port {rgw_port}\n" + _tails(*c.daemon_logs("rgw")))
    raise AssertionError("not reached")
