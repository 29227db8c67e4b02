"""A real PostgreSQL for the lab: the user's (DATABASE_URL) or a throwaway one.

The throwaway cluster is made by `initdb` in a temporary directory, listens only
on a Unix socket there, trusts local connections, and is stopped and deleted
afterwards. PostgreSQL refuses to run as root, so under root the directory is
handed to the `postgres` user (or `nobody`) and the binaries run as that user.

    python -m handson.pg_server      # start one, print its URL, stop on Ctrl-C
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator


class PostgresUnavailable(RuntimeError):
    """No server could be found or started; the message says what to do."""


def find_binaries() -> tuple[str, str] | None:
    """(initdb, pg_ctl) from PATH or the usual Debian place, or None."""
    for folder in [None, *sorted(glob.glob("/usr/lib/postgresql/*/bin"),
                                 reverse=True)]:
        initdb = shutil.which("initdb", path=folder)
        pg_ctl = shutil.which("pg_ctl", path=folder)
        if initdb and pg_ctl:
            return initdb, pg_ctl
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
    """Start a private cluster, yield its URL, stop and delete it."""
    found = find_binaries()
    if found is None:
        raise PostgresUnavailable("no initdb/pg_ctl found; install PostgreSQL or "
                                  "set DATABASE_URL")
    initdb, pg_ctl = found
    runner = _runner()
    home = tempfile.mkdtemp(prefix="eo-pg-")
    data = os.path.join(home, "data")
    if runner:
        user = runner[2]
        entry = pwd.getpwnam(user)
        os.chown(home, entry.pw_uid, entry.pw_gid)
    started = False
    try:
        _check([*runner, initdb, "-D", data, "-A", "trust", "-U", "postgres",
                "--no-sync", "-E", "UTF8"], timeout_s)
        opts = f"-k {home} -c listen_addresses='' -F"
        _check([*runner, pg_ctl, "-D", data, "-o", opts, "-w", "-t",
                str(int(timeout_s)), "-l", os.path.join(home, "log"), "start"],
               timeout_s + 5)
        started = True
        yield f"postgresql://postgres@/postgres?host={home}"
    finally:
        if started:
            with contextlib.suppress(subprocess.SubprocessError, OSError):
                subprocess.run([*runner, pg_ctl, "-D", data, "-m", "immediate",
                                "stop"], capture_output=True, timeout=timeout_s)
        shutil.rmtree(home, ignore_errors=True)


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
