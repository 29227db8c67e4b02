"""The run's cgroup: one memory, process and CPU cap for every learner process
of a grading run (v1 memory and pids; v1 or v2 cpu), and the CPU it used.

The launcher (`confine`) creates and joins it; the sandbox and the heartbeat
trial read what it used; `python -m autograder bench` reads the cost log.
"""

from __future__ import annotations

import contextlib
import json
import os
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
CPU_PERIOD_US = 100_000
# The weight of a run's whole cgroup: that of four processes outside it (4096,
# v1; 400, v2), so however many processes a learner forks, together they weigh
# as four beside the judge's. At one process's weight the run's own harness
# (inside it too) starved in a loaded suite: three gradings beside six spinners
# took 35 s for a check that takes 3.4 s alone (8-12 s at four), and in CI past
# its 40 s limit.
CPU_SHARES, CPU_WEIGHT = 4096, 400
COST_LOG = "EO_COST_LOG"       # a file the launchers append their cgroups' CPU to


class Cgroup:
    """One memory, pids and CPU cgroup for a run, under the launcher's own.

    The CPU cap (`cpus`) and low weight keep the learner's processes from
    starving the judge; the CPU they used is counted (`cpu_ns`), so a judge
    can tell a machine's load from the one the learner made.
    """

    def __init__(self, name: str):
        self.dirs: dict[str, Path] = {}
        self.parents: dict[str, Path] = {}
        self.cpu_capped = False
        own = {}
        with contextlib.suppress(OSError):
            for line in Path("/proc/self/cgroup").read_text().splitlines():
                _, ctrls, path = line.split(":", 2)
                for c in ctrls.split(","):
                    own[c] = path
        for ctrl in ("memory", "pids", "cpu", "cpuacct"):
            base = CGROUP_ROOT / ctrl
            if ctrl in own and (base / "cgroup.procs").exists():
                parent = base / own[ctrl].lstrip("/")
                self.parents[ctrl] = parent
                self.dirs[ctrl] = parent / name
        unified = self._unified(own.get(""))
        if "cpu" not in self.dirs and unified is not None:
            self.parents["cpu2"] = unified
            self.dirs["cpu2"] = unified / name

    @staticmethod
    def _unified(path: str | None) -> Path | None:
        """The v2 cgroup we are in, if its children may have the cpu controller."""
        if path is None:
            return None
        for base in (CGROUP_ROOT, CGROUP_ROOT / "unified"):
            parent = base / path.lstrip("/")
            with contextlib.suppress(OSError):
                if "cpu" in (parent / "cgroup.controllers").read_text().split():
                    return parent
        return None

    def setup(self, mem_mb: int, pids: int, cpus: float = 0.0) -> bool:
        """Create, limit and join; False (and nothing left) when not possible.
        The CPU cap is set when `cpus` > 0 and the machine has the controller."""
        try:
            for d in self.dirs.values():
                d.mkdir(exist_ok=True)
            if "memory" not in self.dirs or "pids" not in self.dirs:
                raise OSError("no memory and pids controllers")
            mem = self.dirs["memory"]
            limit = str(mem_mb * 1024 * 1024)
            (mem / "memory.limit_in_bytes").write_text(limit)
            with contextlib.suppress(OSError):
                (mem / "memory.memsw.limit_in_bytes").write_text(limit)
            (self.dirs["pids"] / "pids.max").write_text(str(pids))
            self.cpu_capped = cpus > 0 and self._cap(cpus)
            for d in self.dirs.values():
                (d / "cgroup.procs").write_text(str(os.getpid()))
            return True
        except OSError:
            self.leave()
            return False

    def _cap(self, cpus: float) -> bool:
        quota = max(1000, int(cpus * CPU_PERIOD_US))
        with contextlib.suppress(OSError):
            if "cpu" in self.dirs:
                d = self.dirs["cpu"]
                (d / "cpu.cfs_period_us").write_text(str(CPU_PERIOD_US))
                (d / "cpu.cfs_quota_us").write_text(str(quota))
                (d / "cpu.shares").write_text(str(CPU_SHARES))
                return True
            if "cpu2" in self.dirs:
                ctl = self.parents["cpu2"] / "cgroup.subtree_control"
                if "cpu" not in ctl.read_text().split():
                    ctl.write_text("+cpu")
                d = self.dirs["cpu2"]
                (d / "cpu.max").write_text(f"{quota} {CPU_PERIOD_US}")
                (d / "cpu.weight").write_text(str(CPU_WEIGHT))
                return True
        return False

    def cpu_ns(self) -> tuple[int, int] | None:
        """(CPU used, time throttled at the cap) by the run's processes so far,
        in nanoseconds; None where neither is counted."""
        used = throttled = None
        with contextlib.suppress(OSError, ValueError, KeyError):
            if "cpu2" in self.dirs:
                stat = self._stat(self.dirs["cpu2"] / "cpu.stat")
                used = stat["usage_usec"] * 1000
                throttled = stat.get("throttled_usec", 0) * 1000
            else:
                used = int((self.dirs["cpuacct"] / "cpuacct.usage").read_text())
                throttled = self._stat(self.dirs["cpu"] / "cpu.stat")["throttled_time"]
        return None if used is None else (used, throttled or 0)

    @staticmethod
    def _stat(path: Path) -> dict[str, int]:
        return {k: int(v) for k, v in (ln.split() for ln in
                                       path.read_text().splitlines())}

    def oom_kills(self) -> int:
        with contextlib.suppress(OSError, KeyError, ValueError):
            text = (self.dirs["memory"] / "memory.oom_control").read_text()
            return int(dict(ln.split() for ln in text.splitlines())["oom_kill"])
        return 0

    def peak_mb(self) -> int:
        """The most memory the cgroup's processes held at once."""
        with contextlib.suppress(OSError, KeyError, ValueError):
            return int((self.dirs["memory"] / "memory.max_usage_in_bytes")
                       .read_text()) >> 20
        return 0

    def leave(self) -> int | None:
        """Move back out and remove the cgroups if no other process uses them.
        Returns the CPU (ns) the cgroup used in its whole life when this removed
        it; None while another launcher of the run is still in it."""
        for ctrl in self.dirs:
            with contextlib.suppress(OSError):
                (self.parents[ctrl] / "cgroup.procs").write_text(str(os.getpid()))
        return self.remove()

    def remove(self) -> int | None:
        """Remove the cgroups if no process is left in them: the CPU (ns) they
        used in their whole life if this removed them, else None."""
        used = self.cpu_ns()
        for d in self.dirs.values():
            with contextlib.suppress(OSError):
                d.rmdir()
        counted = self.dirs.get("cpu2", self.dirs.get("cpuacct"))
        gone = counted is not None and not counted.exists()
        return used[0] if used and gone else None


def account(role: str, lifetime_ns: int | None) -> None:
    """Add a removed cgroup's CPU to the cost log (`COST_LOG`), if one is kept:
    `python -m autograder bench` splits a grading's CPU by role with it."""
    log = os.environ.get(COST_LOG)
    if log and lifetime_ns is not None:
        line = json.dumps({"role": role, "cpu_s": round(lifetime_ns / 1e9, 3)})
        with contextlib.suppress(OSError), open(log, "a") as fh:
            fh.write(line + "\n")
