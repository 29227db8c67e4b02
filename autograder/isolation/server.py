"""The run's servers, inside the sandbox like the learner's code.

Every server a learner's code reaches starts through `prefix` (the confine
launcher with a cgroup, a disk budget and, for a server that refuses root, an
identity of its own), and reports which protections held through `Report`:
the run's Redis here (`ConfinedRedis`), its PostgreSQL in `pg_run`.

Anything the learner's code can talk to is as untrusted as that code. A grading
run's `redis-server` obeys its clients, and its Lua interpreter is one more
place where a crafted script could run native code; so it runs under the same
launcher as learner code (`autograder.isolation.confine`): its own cgroup with a memory
cap, new PID, network and IPC namespaces, a file system view that holds only
the system, the Python installation (where the binary is) and its own
directory, Landlock (write only there), no capabilities. Redis itself holds it
to `maxmemory` with no eviction. Its socket is a file in its directory, so the
judge outside and the learner's processes (which see that directory read-only)
reach it; nothing else does.

On top of that, the server has two users (`handson.redis_server`): the judge,
and the learner, who may run what a queue needs and nothing else. Every command
the learner's user was refused is in the server's ACL log, which the judge
reads back as one line per command (`refusals`).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import redis

from autograder.isolation import sandbox
from handson.redis_server import EmbeddedRedis, refused

MEM_MB = 512          # the server's cgroup: its data, Lua, buffers
MAXMEMORY_MB = 256    # what Redis lets the data grow to; then writes are refused
DISK_MB = 256


def prefix(workdir, status, mem_mb: int, pids: int, disk_mb: int,
           identity: str | None = None) -> list[str]:
    """The argv prefix that starts one server confined in `workdir`."""
    argv = [sys.executable, "-m", "autograder.isolation.confine", "--workdir",
            str(workdir), "--mem-mb", str(mem_mb), "--pids", str(pids),
            "--disk-mb", str(disk_mb), "--status", str(status), "--account",
            "server"]
    return argv + (["--identity", identity] if identity else []) + ["--"]


class Report:
    """What the launcher said of a server once it stopped."""

    def __init__(self, name: str, status: Path, mem_mb: int, disk_mb: int):
        self.name, self.mem_mb, self.disk_mb = name, mem_mb, disk_mb
        self.data: dict = {}
        with contextlib.suppress(OSError, ValueError):
            self.data = json.loads(status.read_text())
        with contextlib.suppress(OSError):
            status.unlink()
        self.protections: dict = self.data.get("protections", {})
        self.isolation: str = self.data.get("isolation", "none")
        if self.protections.get("identity"):
            self.isolation += f"; runs as {self.protections['identity']}"

    def problems(self) -> list[str]:
        """One line per budget the server passed, naming what it used."""
        out = []
        if self.data.get("disk_exceeded"):
            out.append(f"the run's {self.name} passed its disk budget of "
                       f"{self.disk_mb} MB (it held "
                       f"{self.data.get('disk_used_mb', '?')} MB): it was stopped, "
                       "and every check that needed it after that failed")
        if self.data.get("oom_kills"):
            out.append(f"the run's {self.name} passed its memory cap of "
                       f"{self.mem_mb} MB (peak {self.data.get('mem_peak_mb', '?')} "
                       f"MB; {self.data['oom_kills']} of its processes killed)")
        return out


class ConfinedRedis(EmbeddedRedis):
    """An embedded server started by the confine launcher, with users."""

    def __init__(self):
        super().__init__(maxmemory=f"{MAXMEMORY_MB}mb", acl=True)
        # Its own uid owns the directory; learner processes (root without
        # capabilities) may reach the socket by name, and log in with a password.
        os.chmod(self.dir, 0o711)
        self.status = self.dir.parent / f"{self.dir.name}.status.json"
        self.protections: dict = {}
        self.isolation = "none"

    def _args(self) -> list[str]:
        args = super()._args()
        args[args.index("--unixsocketperm") + 1] = "777"
        return prefix(self.dir, self.status, MEM_MB, 64, DISK_MB,
                      identity="redis") + args

    def refusals(self) -> list[str]:
        """One line per command the learner's code was refused (none: [])."""
        try:
            with contextlib.closing(redis.Redis.from_url(self.url,
                                                         socket_timeout=10)) as r:
                seen = refused(r)
        except redis.RedisError as err:
            return [f"the run's Redis could not be asked what it refused ({err}); "
                    "did your code stop it?"]
        return [f"your code ran the Redis command {name}: not allowed (refused "
                f"{n} time{'s' if n > 1 else ''}; a queue's Redis user may run data, "
                "script and transaction commands, never the server's "
                "administration: files, config, modules, other clients, "
                "replication, shutdown)" for name, n in seen]

    def stop(self) -> None:
        """Shut the server down through the judge's user, so the launcher reports
        which protections held; then whatever is left goes the hard way."""
        proc = self.proc
        if proc and proc.poll() is None:
            with contextlib.suppress(redis.RedisError, OSError):
                r = redis.Redis.from_url(self.url, socket_timeout=5)
                r.shutdown(nosave=True)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        super().stop()
        sandbox.cleanup(self.dir)
        report = Report("Redis", self.status, MEM_MB, DISK_MB)
        self.protections, self.isolation = report.protections, report.isolation


def start() -> ConfinedRedis:
    """A started confined server; `.url` is the judge's, `learner_url(.url)` the
    learner's (the sandbox hands learner processes only that one)."""
    return ConfinedRedis().start()
