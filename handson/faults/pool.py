"""The run's processes: workers in slots, extra reapers, and stopping them all.

A worker is forked by the run's warm starter (a fresh interpreter only if that
server is gone), in a process group of its own, so a signal reaches it and its
queue host together. This module starts, restarts and signals processes; what
to kill or pause, and when, is the fault injection's (`inject.py`).
"""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

from handson import redis_server
from handson.faults.config import ChaosConfig
from handson.faults.server_clock import ServerClock
from handson.infra import remote_module, warm_start
from handson.infra.learner_module import SKEW_ENV

TICK_S = 0.02          # supervisor loop period
# Imported once by the run's server of workers: each fork imported what the
# worker imports anew (24 ms of CPU, about half of what a worker used).
WORKER_PRELOAD = ("handson.worker",)


class Pool:
    """The workers (one per slot) and reapers of one run, and their logs."""

    def __init__(self, cfg: ChaosConfig, url: str, workdir: Path, progress):
        self.cfg, self.url, self.dir, self.progress = cfg, url, workdir, progress
        self.db = workdir / "results.db"
        self.events_dir = workdir / "events"
        self.log_path = workdir / "workers.log"
        self.queue_spec = cfg.queue
        if cfg.queue.endswith(".py") or Path(cfg.queue).exists():
            self.queue_spec = str(Path(cfg.queue).resolve())
        self.crash_rng = random.Random(f"crash-{cfg.seed}")
        self.procs: list[subprocess.Popen | None] = [None] * cfg.workers
        self.reapers: list[subprocess.Popen] = []
        self.reaper_pids: set[int] = set()          # every reaper ever started
        self.started: list[subprocess.Popen | warm_start.WarmProcess] = []
        self.starter: warm_start.Starter | None = None    # forks the workers
        self.phase = "chaos" if cfg.chaotic else "drain"
        self.server_clock = ServerClock()

    def _spawn(self, args: list[str], chaos: bool, skew: float = 0.0,
               points: tuple[str, ...] | None = None) -> subprocess.Popen:
        cfg = self.cfg
        env = dict(os.environ, REDIS_URL=self.url, IDEM="1" if cfg.idem else "0",
                   ACK_DELAY=str(cfg.ack_delay), ITERS=str(cfg.iters),
                   WORK_MIN_S=str(cfg.work_s))
        for k in ("CRASH_POINT", "CRASH_P", "CRASH_SEED", SKEW_ENV):
            env.pop(k, None)
        if skew:
            env[SKEW_ENV] = repr(skew)
        points = cfg.crash_points if points is None else points
        if chaos and cfg.crashing and points:
            env.update(CRASH_POINT=",".join(points), CRASH_P=str(cfg.crash_p),
                       CRASH_SEED=str(self.crash_rng.randrange(2**31)))
        args = ["--queue", self.queue_spec, "--db", str(self.db), "--events",
                str(self.events_dir), "--lease", str(cfg.lease_s), "--max-attempts",
                str(cfg.max_attempts), *args]
        if self.starter is None:
            self.starter = warm_start.Starter(str(self.dir),
                                              preload=WORKER_PRELOAD)
        # the worker's queue host comes from the run's server of hosts, into the
        # worker's process group: both servers are in our session, so is it
        hosts = remote_module.host_fds(env)
        try:
            p = self.starter.start("handson.worker", args, env, str(self.log_path),
                                   hosts, pgid=0)
        finally:
            for fd in hosts.values():
                os.close(fd)
        if p is None:           # its server is gone: a fresh interpreter, slower
            with open(self.log_path, "ab") as log:
                p = subprocess.Popen([sys.executable, "-m", "handson.worker", *args],
                                     env=env, stdin=subprocess.DEVNULL, stdout=log,
                                     stderr=log, start_new_session=True,
                                     preexec_fn=functools.partial(
                                         redis_server.die_with_parent, os.getpid()))
        self.started.append(p)
        return p

    def _worker_args(self) -> list[str]:
        args = []
        if not self.cfg.heartbeat:
            args.append("--no-heartbeat")
        if self.cfg.ack_before_work:
            args.append("--ack-before-work")
        if self.cfg.tx_effect:
            args.append("--tx-effect")
        if self.cfg.fused:
            args.append("--fused")
        return args

    def _start_slot(self, slot: int) -> None:
        # mid-reap is the faulted reaper's: workers that died inside their own
        # reaps would race less, and a race is what shows a reap not atomic
        points = tuple(p for p in self.cfg.crash_points
                       if p.partition(":")[0] != "mid-reap")
        self.procs[slot] = self._spawn(self._worker_args(), self.phase == "chaos",
                                       points=points)

    def _start_reaper(self, i: int) -> None:
        cfg = self.cfg
        mid_reap = tuple(p for p in cfg.crash_points
                         if p.partition(":")[0] == "mid-reap")
        faulted = cfg.fault_reapers and i == 0 and self.phase == "chaos"
        pausing = ["--pause-mid-reap"] if cfg.reaper_pause_every_claims and i == 0 \
            else []
        p = self._spawn(["--reap-only", *pausing], faulted, cfg.reaper_skew_s,
                        mid_reap)
        self.reaper_pids.add(p.pid)
        if i < len(self.reapers):
            self.reapers[i] = p
        else:
            self.reapers.append(p)

    @staticmethod
    def _signal(p: subprocess.Popen, sig: int) -> None:
        """Signal p's process group, only while p is unreaped (its pid is ours)."""
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)

    def stop_all(self) -> None:
        """SIGCONT, SIGTERM, then SIGKILL whatever is left; wait for every child."""
        live = [p for p in self.started if p.poll() is None]
        for p in live:
            self._signal(p, signal.SIGCONT)
            self._signal(p, signal.SIGTERM)
        deadline = time.monotonic() + 3
        for p in live:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=max(0.01, deadline - time.monotonic()))
        for p in self.started:
            self._signal(p, signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=10)
        if self.starter is not None:
            self.starter.close()
            self.starter = None

    def _log_tail(self, n: int = 1500) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-n:]
        return ""

    def _workers_up(self) -> bool:
        """Every running worker has logged since it started: the queue is loaded.

        A restarted worker whose queue is slow to come up (a sandboxed learner
        process, a loaded machine) is not silence: only workers that are up and
        still make no progress mean the queue has nothing left to give.
        """
        return all(p.poll() is not None or
                   (self.events_dir / f"{p.pid}.jsonl").exists()
                   for p in self.procs if p is not None)

    def _events_size(self) -> int:
        return sum(e.stat().st_size for e in os.scandir(self.events_dir))

    def _wait_ready(self, deadline: float) -> None:
        """Until every first worker and reaper has started logging (or one
        died, or 30 s): a reaper still starting on a loaded machine races no one."""
        while time.monotonic() < deadline:
            if (len(os.listdir(self.events_dir)) >= self.cfg.workers + self.cfg.reapers
                    or any(p.poll() is not None for p in (*self.procs, *self.reapers))):
                return
            time.sleep(TICK_S)


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP took effect), as the kernel says."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].startswith(("T", "t"))
