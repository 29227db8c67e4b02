"""The run's Redis, inside the sandbox like the learner's code.

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
import subprocess
import sys

import redis

from autograder.isolation import sandbox
from handson.redis_server import EmbeddedRedis, refused

MEM_MB = 512          # the server's cgroup: its data, Lua, buffers
MAXMEMORY_MB = 256    # what Redis lets the data grow to; then writes are refused
DISK_MB = 256


class ConfinedRedis(EmbeddedRedis):
    """An embedded server started by the confine launcher, with users."""

    def __init__(self):
        super().__init__(maxmemory=f"{MAXMEMORY_MB}mb", acl=True)
        self.status = self.dir.parent / f"{self.dir.name}.status.json"
        self.protections: dict = {}
        self.isolation = "none"

    def _args(self) -> list[str]:
        launcher = [sys.executable, "-m", "autograder.isolation.confine", "--workdir",
                    str(self.dir), "--mem-mb", str(MEM_MB), "--pids", "64",
                    "--disk-mb", str(DISK_MB), "--status", str(self.status), "--"]
        return launcher + super()._args()

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
        with contextlib.suppress(OSError, ValueError):
            report = json.loads(self.status.read_text())
            self.protections = report.get("protections", {})
            self.isolation = report.get("isolation", "none")
        with contextlib.suppress(OSError):
            self.status.unlink()


def start() -> ConfinedRedis:
    """A started confined server; `.url` is the judge's, `learner_url(.url)` the
    learner's (the sandbox hands learner processes only that one)."""
    return ConfinedRedis().start()
