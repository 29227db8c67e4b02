"""The chaos run: real workers, real SIGKILL, then a verdict per invariant.

One engine for the lab's `chaos.py`, the book, the grader and the tests. It
enqueues documents through any module that meets the queue contract, runs
worker processes (each in its own process group) on it, kills and pauses them
on a seeded schedule (in seconds, or in claims so that a seed replays the same
schedule) and at named crash points, restarts them like a supervisor, stops the
chaos once the queue is mostly done or, with a fault quota, once the quota is
in (enqueueing more documents until it is; short of it, the run is unknown),
waits for the drain, and then judges:

- lost: enqueued, never applied, not in the DLQ, once the queue went quiet
  (a DLQ entry counts only for a job some worker's log shows claimed);
- applied_twice: more than one effect for a job (the `applied` ledger);
- unexpected: an effect for a job that was never enqueued;
- dead_without_reason: a DLQ entry with an empty reason;
- stale_ack_accepted: an ack (or fail) of attempt a that returned True although
  attempt b > a had already been claimed before the ack was sent;
- stale_extend_accepted: the same for a heartbeat;
- over_delivered: a job claimed more than max_attempts times;
- handed_out_twice: a claim that returned while an earlier attempt's lease
  surely still ran (less than a lease after that claim began, no fail in
  between), or after that attempt's ack was accepted.

Besides faults at random, a run can build the interleavings that expose a bug
on purpose: a zombie pause keeps its worker stopped until the job it holds has
been claimed again, then stops the new holder while the zombie answers; extra
reapers race the workers' own reap calls; a reaper pause stops the first extra
reaper inside a reap, between the round trip that read a job and the next, until
that job has been claimed again (or has ended), so a reap that reads and acts
in separate round trips requeues a job that is owned or done. (A job that kills
every worker that claims it comes from the workers themselves: crash point
"on-poison:1".)

Stale-ness is decided from the workers' event logs: every worker stamps its
events with CLOCK_MONOTONIC, which is one clock for the whole machine, and an
ack counts as stale only if the newer claim had returned before the ack was
sent, so overlapping calls never make a false witness.

The engine learns the queue's state only through the contract (enqueue, dead),
and takes dead() at its word only where the workers' logs back it.
Every process it starts is killed before `run` returns, also on an exception
or Ctrl-C; a run that does not finish in time is "unknown", never a pass.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import random
import shlex
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

from handson import produce, redis_server, setup_db, verify
from handson.faults.server_clock import REPORT_MS, ServerClock
from handson.infra import remote_module, warm_start
from handson.infra.learner_module import SKEW_ENV
from handson.queues.contract import ContractError, load_queue
from handson.worker import CLAIMS

INVARIANTS = {
    "lost": "enqueued, never applied, and not in the DLQ (or in it although "
            "no worker ever claimed it)",
    "applied_twice": "a job's effect applied more than once",
    "unexpected": "an effect for a job that was never enqueued",
    "dead_without_reason": "a DLQ entry with an empty reason",
    "stale_ack_accepted": "ack/fail of attempt a accepted after attempt b>a "
                          "was claimed",
    "stale_extend_accepted": "heartbeat of attempt a accepted after attempt b>a "
                             "was claimed",
    "over_delivered": "a job claimed more than max_attempts times",
    "handed_out_twice": "a job handed out again while an earlier attempt's "
                        "lease still ran, or after its ack",
}
WITNESSES = 3          # histories shown per broken invariant
TICK_S = 0.02          # supervisor loop period
FAST_TICK_S = 0.003    # ... while a constructed fault waits for a claim
CHECK_S = 0.25         # how often the done count is read
QUIET_HELD = 10        # silence (in quiet_s) that ends a drain with jobs held


@dataclass
class ChaosConfig:
    queue: str = "handson.q"
    docs: int = 2000
    workers: int = 4
    kill_every: float = 0.3          # mean seconds between SIGKILLs; 0 = none
    seed: int = 0
    idem: bool = True
    ack_delay: float = 0.0
    lease_s: float = 2.0
    max_attempts: int = 3
    crash_points: tuple[str, ...] = ()
    crash_p: float = 0.0
    iters: int = 2000
    poison_every: int = 1000
    heartbeat: bool = True
    ack_before_work: bool = False
    fused: bool = False              # workers ack and claim the next in one call
    drain_timeout_s: float = 120.0   # the whole run's budget; past it: unknown
    # A run that cannot drain (poison and no attempt limit) ends, as unknown,
    # once every job left undone has been claimed this often: keyed to claims,
    # so a loaded machine shows the same loop, only later. 0: off.
    loop_claims: int = 0
    pause_every: float = 0.0         # mean seconds between SIGSTOPs; 0 = none
    pause_s: float = 0.0             # how long a pause lasts; 0 = 1.5 leases
    reapers: int = 0                 # extra processes that only call reap()
    # Every role faulted: the first extra reaper gets the run's crash point
    # mid-reap (killed between two round trips of a reap; mid-call would
    # mostly kill it after a one-script reap, for nothing; the workers never
    # get mid-reap) and dies with every
    # `workers` kills, restarted like a worker; the others stay up to race. And
    # the reapers' wall clocks can be set off, so a reap that trusts its own
    # clock takes leases that the server's clock says still run.
    fault_reapers: bool = False
    reaper_skew_s: float = 0.0
    # Reapers paused like workers: every ~N claims the first extra reaper is
    # armed (SIGUSR1), and its next reap that reads a job id in one Redis reply
    # and then sends another request stops itself there (SIGSTOP, between the
    # read and the act) until every job it read has been claimed again or has
    # ended (at most two leases); then SIGCONT. An armed reap that takes leases
    # back in one round trip has no gap to stop in: it spends the arm, and
    # counts for the quota like a pause, so a one-script reap meets it too.
    reaper_pause_every_claims: int = 0
    min_reaper_pauses: int = 0       # quota: reaper pauses (or gapless reaps)
    kill_until: float = 0.9          # chaos stops once this fraction is done
    kill_phase_s: float = 0.0        # ... or after this many seconds (0: no cap)
    # The fault quota. While any part of it is unmet the chaos goes on, and more
    # documents are enqueued whenever the queue runs low, so the faults and not
    # the document count set the run's length; past quota_cap_s the chaos stops
    # anyway and a run short of its quota is "unknown", never a pass.
    min_kills: int = 0               # engine SIGKILLs at random
    min_pauses: int = 0              # SIGSTOPs longer than the lease
    max_pauses: int = 0              # no more SIGSTOPs than this (0: no cap)
    min_crash_kills: int = 0         # self-kills at EACH crash point on crash_p
    min_reaps: int = 0               # expired leases taken back by reap()
    quota_cap_s: float = 60.0        # the chaos phase's budget for the quota
    # Faults keyed to progress instead of the clock: a kill (pause) every ~N
    # claims, so a seed replays the same schedule on any machine at any speed.
    kill_every_claims: int = 0
    pause_every_claims: int = 0
    # Faults built on purpose rather than at random. With zombie_pauses a
    # paused worker stays stopped until its job has been claimed again, then
    # the new holder is stopped while the zombie acks, so a late ack meets a
    # newer attempt for certain; a pause ends at pause_s (or 6 leases) anyway.
    zombie_pauses: bool = False
    min_zombies: int = 0             # quota: zombies that answered past a new claim
    # How long the new holder may be stopped waiting for the zombie's answer
    # (0: half a lease, so its own lease never runs out meanwhile). Longer makes
    # the zombie answer for certain on a loaded machine; the holder's lease may
    # then run out too, which a correct queue survives.
    hold_s: float = 0.0
    # The effect and the ack as one transaction in the queue's own database
    # (the queue's `finish`; its `effects` is then the ledger), not results.db.
    tx_effect: bool = False

    def __post_init__(self):
        from handson.worker import crash_points

        self.crash_points = tuple(self.crash_points)
        own_p = crash_points(self.crash_points)     # "on-poison:1": its own p
        self.crash_names = tuple(own_p)
        # the quota counts the points that throw the common dice
        self.crash_dice = tuple(name for name, p in own_p.items() if p is None)
        self.crashing = any(self.crash_p if p is None else p
                            for p in own_p.values())
        if self.workers < 1 or self.docs < 0:
            raise ValueError("need at least one worker and a non-negative doc count")
        if self.min_crash_kills and not (self.crash_dice and self.crash_p):
            raise ValueError("min_crash_kills needs crash points and a crash_p")
        if self.min_kills and not (self.kill_every or self.kill_every_claims):
            raise ValueError("min_kills needs kill_every or kill_every_claims")
        if self.min_pauses and not (self.pause_every or self.pause_every_claims):
            raise ValueError("min_pauses needs pause_every or pause_every_claims")
        if (self.fault_reapers or self.reaper_skew_s
                or self.reaper_pause_every_claims) and not self.reapers:
            raise ValueError("fault_reapers, reaper_skew_s and "
                             "reaper_pause_every_claims need reapers")
        if self.min_reaper_pauses and not self.reaper_pause_every_claims:
            raise ValueError("min_reaper_pauses needs reaper_pause_every_claims")
        if self.min_zombies and not (self.zombie_pauses and (
                self.pause_every or self.pause_every_claims)):
            raise ValueError("min_zombies needs zombie_pauses and a pause schedule")

    @property
    def quota(self) -> dict[str, int]:
        """Faults by kind that the run must inject before its chaos may stop."""
        q = {"kills": self.min_kills, "pauses": self.min_pauses,
             "reaps": self.min_reaps,
             "zombies": self.min_zombies,
             "reaper_pauses": self.min_reaper_pauses}
        q.update({f"crash:{p}": self.min_crash_kills for p in self.crash_dice})
        return {k: v for k, v in q.items() if v}

    @property
    def quiet_s(self) -> float:
        """No progress for this long after the chaos = the queue has nothing left."""
        return 1.5 * self.lease_s + 2.0

    @property
    def chaotic(self) -> bool:
        return bool(self.kill_every or self.pause_every or self.kill_every_claims
                    or self.pause_every_claims or self.reaper_pause_every_claims
                    or self.quota or self.crashing)


@dataclass
class Invariant:
    name: str
    ok: bool | None
    count: int
    witnesses: list[str] = field(default_factory=list)
    timelines: list[dict] = field(default_factory=list)   # the witnesses, to draw


@dataclass
class Mark:
    """One step of a job's story: when (monotonic ns), what, by which worker."""

    t: int
    text: str
    pid: int | None
    kind: str
    attempt: int | None = None
    bad: bool = False          # the step that broke an invariant
    seconds: float = 0.0       # how long, for a pause


@dataclass
class Report:
    config: ChaosConfig
    verdict: str
    reason: str
    invariants: dict[str, Invariant]
    stats: dict
    replay: str
    pids: list[int] = field(default_factory=list)
    summary: dict = field(default_factory=dict)

    @property
    def seed(self) -> int:
        return self.config.seed

    @property
    def exit_code(self) -> int:
        return {"valid": 0, "invalid": 1}.get(self.verdict, 2)

    def headline(self) -> str:
        """The seed's own line."""
        s = self.stats
        return (f"done in {s['elapsed_s']:.1f} s, kills={s['kills']}, "
                f"dlq={s['dlq']}")

    def replay_note(self) -> str:
        """What the replay command reproduces, said honestly."""
        c = self.config
        keyed = [k for k, n in (("kills", c.kill_every_claims),
                                ("pauses", c.pause_every_claims),
                                ("reaper pauses", c.reaper_pause_every_claims))
                 if n]
        timed = [k for k, n in (("kills", not c.kill_every_claims and c.kill_every),
                                ("pauses", not c.pause_every_claims
                                 and c.pause_every)) if n]
        what = []
        if keyed:
            what.append(" and ".join(keyed) + " at the same claim counts")
        if timed:
            what.append(" and ".join(timed) + " at the same times")
        if c.crashing:
            what.append("the same crash-point dice")
        if not what:
            return f"seed {c.seed}; replay with:"
        return (f"seed {c.seed} reproduces the schedule ({'; '.join(what)}); the "
                "interleaving of the workers may differ. Replay with:")

    def faults_line(self) -> str:
        """Faults injected by kind, each against its quota when it has one."""
        f, quota = self.stats["faults"], self.config.quota
        def one(label: str, key: str, n: int) -> str:
            return f"{label} {n}" + (f" (quota {quota[key]})" if key in quota else "")
        parts = [one("kills", "kills", f["kills"]),
                 one("pauses", "pauses", f["pauses"])]
        parts += [one(f"at {p}", f"crash:{p}", n)
                  for p, n in f["crash_kills"].items()]
        parts.append(one("leases reaped", "reaps", f["leases_reaped"]))
        if "raced_reaps" in f:
            parts.append(f"leases reaped by {self.config.reapers} racing reapers "
                         f"{f['raced_reaps']}")
        if "reaper_kills" in f:
            parts.append(f"reapers killed {f['reaper_kills']}")
        if self.config.reaper_skew_s:
            parts.append(f"reapers' clocks {self.config.reaper_skew_s:+g} s off")
        if "reaper_pauses" in f:
            parts.append(one("reaper pauses mid-reap or armed reaps with no gap",
                             "reaper_pauses", f["reaper_pauses"] + f["reaps_no_gap"])
                         + f" ({f['reaper_pauses']} paused, "
                         f"{f['reaper_pauses_raced']} of them while a job it had "
                         f"read was claimed again; {f['reaps_no_gap']} no gap)")
        if "zombies" in f:
            parts.append(one("zombies (answered while a new claim was held)",
                             "zombies", f["zombies"]))
        return (f"faults injected: {', '.join(parts)}; {self.stats['claims']} "
                f"claims in {self.stats['chaos_s']:.1f} s of chaos")

    def text(self) -> str:
        c, s = self.config, self.stats
        docs = s.get("enqueued", c.docs)
        out = [f"chaos run on {c.queue}: {docs} docs, {c.workers} workers, "
               f"IDEM={int(c.idem)}, ACK_DELAY={c.ack_delay}, seed {c.seed}",
               self.headline() + f", crash-point kills={s['crash_kills']}, "
               f"pauses={s['pauses']}"]
        if "faults" in s:
            out.append(self.faults_line())
        if s.get("server_clock_gained_ms", 0) >= REPORT_MS:
            out.append(f"the Redis server's clock gained "
                       f"{s['server_clock_gained_ms']:.0f} ms on the workers' during "
                       "the run (a step forward); leases run on the server's clock, "
                       "so the judge allowed for it")
        if self.summary:
            out.append(verify.line(self.summary))
        out += ["", f"verdict: {self.verdict.upper()}"
                + (f" ({self.reason})" if self.reason else "")]
        for inv in self.invariants.values():
            mark = {True: "ok  ", False: "FAIL", None: "?   "}[inv.ok]
            out.append(f"  {mark} {inv.name:<22} {inv.count:>5}   "
                       f"{INVARIANTS[inv.name]}")
        for inv in self.invariants.values():
            if inv.ok is False and inv.witnesses:
                out += ["", f"{inv.name}: first {len(inv.witnesses)} of {inv.count}"]
                out += inv.witnesses
        out += ["", "applications per job: " + _hist(s["applied_histogram"]),
                "deliveries per job:   " + _hist(s["delivery_histogram"]),
                f"commits never acked:  {s['unacked']['died']} (worker died), "
                f"{s['unacked']['refused']} (ack refused)",
                *self._orphans_line(),
                "", self.replay_note(), f"  {self.replay}"]
        return "\n".join(out)

    def _orphans_line(self) -> list[str]:
        o = self.stats.get("orphans", {})
        if not o.get("jobs"):
            return []
        return [f"jobs held by killed workers: {o['jobs']} ({o['prefetched']} "
                f"prefetched); at the kill {o['lease_left_s']:.2f} s of lease left "
                f"(median, of {self.config.lease_s:g} s); claimed again after "
                f"{o['median_wait_s']:.2f} s (median), {o['max_wait_s']:.2f} s at "
                "most"]

    def to_json(self) -> str:
        return json.dumps({
            "verdict": self.verdict, "exit_code": self.exit_code,
            "reason": self.reason, "seed": self.seed, "replay": self.replay,
            "invariants": {k: asdict(v) for k, v in self.invariants.items()},
            "stats": self.stats, "summary": self.summary,
            "config": asdict(self.config)}, indent=1)


def _hist(h: dict) -> str:
    return " | ".join(f"{k}x: {v}" for k, v in sorted(h.items(), key=lambda kv:
                                                       int(kv[0]))) or "-"


def replay_command(cfg: ChaosConfig) -> str:
    """One shell command that runs `cfg` again (same schedule, same seed)."""
    env = []
    if not cfg.idem:
        env.append("IDEM=0")
    if cfg.ack_delay:
        env.append(f"ACK_DELAY={cfg.ack_delay}")
    cmd = ["python", "-m", "handson.chaos", str(cfg.workers), "--queue", cfg.queue,
           "--docs", str(cfg.docs), "--seed", str(cfg.seed),
           "--kill-every", str(cfg.kill_every), "--min-kills", str(cfg.min_kills)]
    default = ChaosConfig()
    for f in fields(ChaosConfig):
        if f.name in ("queue", "docs", "workers", "kill_every", "seed", "idem",
                      "ack_delay", "min_kills"):
            continue
        value = getattr(cfg, f.name)
        if value == getattr(default, f.name):
            continue
        flag = "--" + f.name.replace("_", "-")
        if f.name == "crash_points":
            for p in value:
                cmd += ["--crash-point", p]
        elif isinstance(value, bool):
            cmd.append({"heartbeat": "--no-heartbeat"}.get(f.name, flag))
        else:
            cmd += [flag, str(value)]
    return " ".join(env + [shlex.quote(x) for x in cmd])


class _Aborted(Exception):
    """The run cannot be judged; the message says why."""


class _Run:
    def __init__(self, cfg: ChaosConfig, url: str, workdir: Path, progress):
        self.cfg, self.url, self.dir, self.progress = cfg, url, workdir, progress
        self.db = workdir / "results.db"
        self.events_dir = workdir / "events"
        self.log_path = workdir / "workers.log"
        self.queue_spec = cfg.queue
        if cfg.queue.endswith(".py") or Path(cfg.queue).exists():
            self.queue_spec = str(Path(cfg.queue).resolve())
        self.kill_rng = random.Random(cfg.seed)
        self.pause_rng = random.Random(f"pause-{cfg.seed}")
        self.crash_rng = random.Random(f"crash-{cfg.seed}")
        self.procs: list[subprocess.Popen | None] = [None] * cfg.workers
        self.reapers: list[subprocess.Popen] = []
        self.reaper_pids: set[int] = set()          # every reaper ever started
        self.reaper_kills = 0                       # beside the workers' kills
        self.reaper_armed: tuple[int, int] | None = None  # (pid, arms spent then)
        self.reaper_stop: dict | None = None        # the reaper pause under way
        self.reaper_pauses_buried = 0               # ... on jobs bound for the DLQ
        # (t_ns stopped, pid, jobs it had read, t_ns resumed, one claimed again)
        self.reaper_pauses: list[tuple[int, int, list[str], int, bool]] = []
        self.started: list[subprocess.Popen | warm_start.WarmProcess] = []
        self.starter: warm_start.Starter | None = None    # forks the workers
        self.kills: list[tuple[int, int]] = []       # (t_ns, pid)
        self.pauses: list[tuple[int, int, float]] = []  # (t_ns, pid, seconds)
        self.paused: dict[int, float] = {}           # slot -> resume at
        # slot -> (pid, job, attempt, t_ns): paused holding a job, waiting for
        # it to be claimed again; slot -> (zombie pid, job): a new holder
        # stopped until the zombie has answered for the job.
        self.zombies: dict[int, tuple[int, str, int, int]] = {}
        self.holds: dict[int, tuple[int, str]] = {}
        self.zombies_made = 0
        self.abnormal = 0
        self.phase = "chaos" if cfg.chaotic else "drain"
        self.tally = _Tally(self.events_dir)
        self.chaos_s = 0.0              # how long the chaos phase lasted
        self.batch = None               # (thread, ids, errors) of more documents
        # (claims seen, fault, slot, when it was due: seconds or claims)
        self.schedule: list[tuple[int, str, int, float]] = []
        self.due = 0.0                  # the due point of the fault being injected
        self.server_clock = ServerClock()
        self.loop_from: dict[str, int] = {}     # undone job -> its claims then

    # ---- processes -------------------------------------------------------
    def _spawn(self, args: list[str], chaos: bool, skew: float = 0.0,
               points: tuple[str, ...] | None = None) -> subprocess.Popen:
        cfg = self.cfg
        env = dict(os.environ, REDIS_URL=self.url, IDEM="1" if cfg.idem else "0",
                   ACK_DELAY=str(cfg.ack_delay), ITERS=str(cfg.iters))
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
            self.starter = warm_start.Starter(str(self.dir))
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

    def _arm_reaper(self) -> bool:
        """Arm the first reaper for a pause (SIGUSR1); False while it cannot be:
        not up yet, stopped, or its last arm not spent."""
        p = self.reapers[0]
        spent = (len(self.reaper_pauses) + self.reaper_pauses_buried
                 + self.tally.no_gap)
        if (p.poll() is not None or self.reaper_stop is not None
                or not (self.events_dir / f"{p.pid}.jsonl").exists()
                or self.reaper_armed and self.reaper_armed[0] == p.pid
                and self.reaper_armed[1] == spent):
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(p.pid, signal.SIGUSR1)      # the reaper only, not its host
        self.reaper_armed = (p.pid, spent)
        self.schedule.append((self.tally.claims, "arm reaper pause", 0, self.due))
        return True

    def _tend_reaper(self, now: float) -> None:
        """Resume the paused reaper once every job it read has been claimed
        again or has ended since it stopped (or two leases after it stopped).

        A worker that claimed such a job meanwhile is stopped first (a hold,
        like a zombie's) until the reaper's reap is over and the job, if that
        reap gave it back, has gone to another worker; so a requeue of a job
        that is owned meets its owner still holding it, and the next claim
        comes from someone else.
        """
        st, p = self.reaper_stop, self.reapers[0] if self.reapers else None
        if st is None:
            for e in self.tally.reaper_paused[self.tally.paused_seen:]:
                self.tally.paused_seen += 1
                if p is not None and e.get("pid") == p.pid and p.poll() is None:
                    self.reaper_stop = st = {
                        "pid": p.pid, "t": int(e["t"]), "until": None,
                        "jobs": [str(j) for j in e.get("jobs", [])], "hold": None}
            return
        if st["hold"] is not None:
            self._tend_hold(st)
            return
        if p is None or p.pid != st["pid"] or p.poll() is not None:
            self.reaper_stop = None                # killed while it was stopped
            return
        if st["until"] is None:
            if not _stopped(p.pid):                # its SIGSTOP is on its way
                return
            st["until"] = now + 2 * self.cfg.lease_s
        t, last_claim = st["t"], self.tally.last_claim
        # a job claimed max_attempts times goes to the DLQ, never to a worker:
        # a pause on such jobs only is no test; it ends at once, uncounted
        if not any(len(self.tally.claims_of.get(j, ())) < self.cfg.max_attempts
                   for j in st["jobs"]):
            self._signal(p, signal.SIGCONT)
            self.reaper_pauses_buried += 1
            self.reaper_stop = None
            return
        moved = all(max(last_claim.get(j, 0), self.tally.last_end.get(j, 0)) > t
                    for j in st["jobs"])
        if not (moved or now >= st["until"]):
            return
        raced = [j for j in st["jobs"] if last_claim.get(j, 0) > t]
        slot_of = {q.pid: i for i, q in enumerate(self.procs) if q is not None}
        for job in raced:
            holder = self.tally.claims_of[job][-1][1]
            h = slot_of.get(holder)
            if (h is not None and h not in self.paused
                    and self.tally.job_of(holder) == job):
                self._signal(self.procs[h], signal.SIGSTOP)
                self.paused[h] = now + self.cfg.lease_s / 2   # _tend_pauses ends it
                st["hold"] = (h, holder, job, self.tally.holding[holder][1])
                break
        self._signal(p, signal.SIGCONT)
        self.reaper_pauses.append((t, p.pid, st["jobs"], time.monotonic_ns(),
                                   bool(raced)))
        if st["hold"] is None:
            self.reaper_stop = None

    def _tend_hold(self, st: dict) -> None:
        """End the hold once the reaper's reap is over and gave nothing back,
        or the job was claimed by another worker (or at its end, in
        `_tend_pauses`)."""
        h, holder, job, attempt = st["hold"]
        after = [e for e in self.tally.after_pause
                 if e.get("pid") == st["pid"] and e["t"] > st["t"]]
        taken = any(a > attempt and pid != holder
                    for a, pid in self.tally.claims_of[job])
        gave_none = after and not (after[-1].get("requeued") or after[-1].get("dead"))
        if h not in self.paused or self.procs[h].pid != holder:
            self.reaper_stop = None                # its hold ended meanwhile
        elif taken or gave_none:
            self._resume(h)
            self.reaper_stop = None

    def _kill_reaper(self, i: int) -> None:
        """A reaper dies like a worker (anywhere in its loop) and is restarted."""
        p = self.reapers[i]
        self.reaper_kills += 1
        self.schedule.append((self.tally.claims, "kill reaper", i, self.due))
        self._signal(p, signal.SIGKILL)
        p.wait(timeout=10)
        self._start_reaper(i)

    @staticmethod
    def _signal(p: subprocess.Popen, sig: int) -> None:
        """Signal p's process group, only while p is unreaped (its pid is ours)."""
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, sig)

    def _kill_slot(self, slot: int | None) -> None:
        if slot is None:
            return
        p = self.procs[slot]
        self.kills.append((time.monotonic_ns(), p.pid))
        self.schedule.append((self.tally.claims, "kill", slot, self.due))
        self._signal(p, signal.SIGKILL)
        p.wait(timeout=10)
        self.paused.pop(slot, None)
        self.zombies.pop(slot, None)
        self.holds.pop(slot, None)
        self._start_slot(slot)

    def _pause_slot(self, slot: int, seconds: float) -> None:
        p = self.procs[slot]
        t_ns = time.monotonic_ns()
        self.pauses.append((t_ns, p.pid, seconds))
        self.schedule.append((self.tally.claims, "pause", slot, self.due))
        self._signal(p, signal.SIGSTOP)
        self.paused[slot] = time.monotonic() + seconds
        held = self.tally.holding.get(p.pid)
        if self.cfg.zombie_pauses and held:
            self.zombies[slot] = (p.pid, *held, t_ns)

    def _resume(self, slot: int) -> None:
        """SIGCONT; a pause's length is what it lasted, not what it was meant to."""
        p = self.procs[slot]
        self._signal(p, signal.SIGCONT)
        self.paused.pop(slot, None)
        self.holds.pop(slot, None)
        z = self.zombies.pop(slot, None)
        if z is not None:
            for i, (t, pid, _) in enumerate(self.pauses):
                if pid == z[0] and t == z[3]:
                    self.pauses[i] = (t, pid, round((time.monotonic_ns() - t) / 1e9,
                                                    3))

    def _tend_pauses(self, now: float) -> None:
        """End pauses: at their time, or once a zombie's job is claimed again.

        The new holder is then stopped (a hold) until the zombie has acked,
        failed or dropped the job, so the zombie's late call meets attempt b > a
        for certain. A pause whose worker had finished its job just before the
        SIGSTOP made no zombie: it ends at once and is not counted.
        """
        slot_of = {p.pid: i for i, p in enumerate(self.procs) if p is not None}
        for slot, (zpid, job) in list(self.holds.items()):
            if ((zpid, job) in self.tally.ended or zpid not in slot_of
                    or now >= self.paused[slot]):
                self._resume(slot)
        for slot, until in list(self.paused.items()):
            if slot in self.holds:
                continue
            z = self.zombies.get(slot)
            if z is not None:
                pid, job, attempt, t_ns = z
                if self.tally.ended.get((pid, job), t_ns + 1) <= t_ns:
                    self.pauses = [x for x in self.pauses if x[:2] != (t_ns, pid)]
                    self.zombies.pop(slot)
                    self._resume(slot)
                    continue
                newer = [(a, p) for a, p in self.tally.claims_of.get(job, ())
                         if a > attempt and p != pid]
                if newer:
                    _, holder = newer[-1]
                    h = slot_of.get(holder)
                    if (h is not None and h not in self.paused
                            and self.tally.job_of(holder) == job):
                        self._signal(self.procs[h], signal.SIGSTOP)
                        self.paused[h] = now + (self.cfg.hold_s or self.cfg.lease_s / 2)
                        self.holds[h] = (pid, job)
                        self.zombies_made += 1
                    self._resume(slot)
                    continue
            if now >= until:
                self._resume(slot)

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

    # ---- progress --------------------------------------------------------
    def effects(self, queue, r) -> tuple[list[tuple], dict]:
        """The `applied` ledger (job_id, attempt, pid, t) by time, and the
        results' summary: from results.db, or from the PostgreSQL queue's
        tables when the effect commits with the ack (tx_effect), read here by
        the course's reader, never by the queue module under test."""
        if self.cfg.tx_effect:
            from handson.queues import pgq

            return pgq.ledger()
        def read() -> tuple[list[tuple], dict]:
            con = sqlite3.connect(self.db, timeout=30)
            try:
                applied = con.execute(
                    "select job_id, attempt, pid, t from applied order by t"
                ).fetchall()
                return applied, verify.summary(con)
            finally:
                con.close()
        return setup_db.retrying(read)

    def _undone(self, ids: set[str], queue, r) -> set[str]:
        applied = {row[0] for row in self.effects(queue, r)[0]}
        dead = {d[0] for d in queue.dead(r)}
        return ids - applied - dead

    def _looping(self, undone: set[str]) -> bool:
        """Every job left has been claimed loop_claims times since the last job
        ended: counted from then, a loaded machine's long good phase, in which
        a poison job loops already, does not end the run as the work runs out."""
        n = self.cfg.loop_claims
        if not (n and undone):
            return False
        claims = {j: len(self.tally.claims_of.get(j, ())) for j in undone}
        if undone != self.loop_from.keys():         # a job ended: count anew
            self.loop_from = claims
            return False
        return all(claims[j] - self.loop_from[j] >= n for j in undone)

    def _workers_up(self) -> bool:
        """Every running worker has logged since it started: the queue is loaded.

        A restarted worker whose queue is slow to come up (a sandboxed learner
        process, a loaded machine) is not silence: only workers that are up and
        still make no progress mean the queue has nothing left to give.
        """
        return all(p.poll() is not None or
                   (self.events_dir / f"{p.pid}.jsonl").exists()
                   for p in self.procs if p is not None)

    def _quiet(self, silent_s: float) -> bool:
        """The queue has nothing left to give: silence, and no job in hand.

        A worker that holds a job, or is stopped, is not silence on a loaded
        machine; only a long silence (QUIET_HELD) judges a run whose jobs are
        all held by workers that never answer.
        """
        if silent_s <= self.cfg.quiet_s:
            return False
        held = self.paused or any(
            self.tally.job_of(p.pid) is not None
            for p in self.procs if p is not None and p.poll() is None)
        return not held or silent_s > QUIET_HELD * self.cfg.quiet_s

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

    def _victim(self, rng: random.Random, busy: bool) -> int | None:
        """A running slot to fault (with `busy`, only one holding a job), or None.

        Paused slots are skipped (a kill too: its lease ran out long ago). Kills
        take any running worker, so they land anywhere in its loop, inside
        claim() too; a pause only counts if it makes its worker outlive a lease.
        """
        answering = {zpid for zpid, _ in self.holds.values()}   # a zombie's last act
        slots = [i for i in range(self.cfg.workers) if i not in self.paused
                 and self.procs[i].pid not in answering]
        if busy:
            slots = [i for i in slots
                     if self.tally.job_of(self.procs[i].pid) is not None]
        return slots[rng.randrange(len(slots))] if slots else None

    def faults(self) -> dict[str, int]:
        """Faults injected so far, by kind (the quota's keys)."""
        # A zombie pause still waiting to learn whether its worker held a job
        # may yet be struck off (see _tend_pauses): it counts once it is kept.
        pending = {(z[3], z[0]) for z in self.zombies.values()}
        pauses = sum(1 for t, pid, _ in self.pauses if (t, pid) not in pending)
        out = {"kills": len(self.kills), "pauses": pauses,
               "reaps": self.tally.reaped, "zombies": self.zombies_made,
               "reaper_pauses": len(self.reaper_pauses) + self.tally.no_gap}
        out.update({f"crash:{p}": self.tally.crash[p] for p in self.cfg.crash_names})
        return out

    def short_of_quota(self) -> dict[str, tuple[int, int]]:
        """kind -> (injected, wanted) for every part of the quota not met yet."""
        got = self.faults()
        return {k: (got[k], n) for k, n in self.cfg.quota.items() if got[k] < n}

    def _more(self, start: int, queue) -> None:
        """Another batch of documents, in a thread so the faults keep coming."""
        def batch():
            r = redis_server.connect(self.url, decode_responses=True)
            try:
                out.extend(produce.produce(r, queue, max(1, self.cfg.docs),
                                           self.cfg.poison_every, start=start))
            except Exception as err:     # judged like any queue error: unknown
                errors.append(err)
            finally:
                r.close()

        out, errors = [], []
        self.batch = (threading.Thread(target=batch, daemon=True), out, errors)
        self.batch[0].start()

    def _merge(self, ids: list[str], idset: set[str], wait: bool) -> None:
        """Take in the batch being produced (once done, or now if `wait`)."""
        if self.batch is None:
            return
        thread, out, errors = self.batch
        if wait:
            thread.join()
        if thread.is_alive():
            return
        self.batch = None
        if errors:
            raise _Aborted(f"enqueue failed while producing more documents: "
                           f"{errors[0]!r}")
        ids.extend(out)
        idset.update(out)

    def supervise(self, ids: list[str], queue, r) -> tuple[str, str, float]:
        """Run the chaos and the drain; returns (ending, reason, elapsed_s).

        `ids` grows while the quota is unmet: the run enqueues more documents.
        """
        cfg = self.cfg
        idset = set(ids)
        for slot in range(cfg.workers):
            self._start_slot(slot)
        for i in range(cfg.reapers):
            self._start_reaper(i)
        t0 = time.monotonic()
        self._wait_ready(t0 + 30)
        t_chaos = time.monotonic()      # the schedule starts once workers are up
        gap = lambda mean, rng: mean * rng.uniform(0.5, 1.5)
        # A fault is due when its clock (seconds, or claims seen) passes `due`;
        # the dues are the seed's alone (a late fault does not shift the rest).
        by_claims = {"kill": bool(cfg.kill_every_claims),
                     "pause": bool(cfg.pause_every_claims), "reaper": True}
        mean = {"kill": cfg.kill_every_claims or cfg.kill_every,
                "pause": cfg.pause_every_claims or cfg.pause_every,
                "reaper": cfg.reaper_pause_every_claims}
        # The due points get their own dice: picking a victim draws from a pool
        # whose size depends on timing, and must not shift the schedule.
        rngs = {k: random.Random(f"{k}-due-{cfg.seed}") for k in mean}

        def clock(kind: str, now: float) -> float:
            return self.tally.claims if by_claims[kind] else now - t_chaos

        due = {k: clock(k, t_chaos) + gap(mean[k], rngs[k]) if mean[k] else None
               for k in mean}
        pause_s = cfg.pause_s or 1.5 * cfg.lease_s
        if cfg.zombie_pauses:          # at most: the wait for the job's next claim
            pause_s = max(pause_s, 6 * cfg.lease_s)
        next_check = next_report = t0
        done, last_done, last_size, last_activity = 0, -1, -1, t0
        total = len(ids)
        while True:
            now = time.monotonic()
            self.tally.update()
            self._tend_pauses(now)
            if cfg.reaper_pause_every_claims:
                self._tend_reaper(now)
            for slot, p in enumerate(self.procs):
                rc = p.poll()
                if rc is not None:
                    if rc != -signal.SIGKILL:
                        self.abnormal += 1
                    self._start_slot(slot)
            for i, p in enumerate(self.reapers):
                if p.poll() is not None:        # a crash point inside its reap
                    self._start_reaper(i)
            if self.abnormal >= max(3, 2 * cfg.workers) and done == 0:
                raise _Aborted("workers keep exiting on their own; their log "
                               f"ends with:\n{self._log_tail()}")
            if self.phase == "chaos":
                if due["kill"] is not None and clock("kill", now) >= due["kill"]:
                    self.due = round(due["kill"], 3)
                    self._kill_slot(self._victim(self.kill_rng, busy=False))
                    # and every `workers` kills the first reaper too (no dice
                    # drawn: the workers' schedule stays the seed's)
                    if cfg.fault_reapers and len(self.kills) % cfg.workers == 0:
                        self._kill_reaper(0)
                    due["kill"] += gap(mean["kill"], rngs["kill"])
                # A zombie needs a worker left running to claim its job again.
                if (due["pause"] is not None and clock("pause", now) >= due["pause"]
                        and not 0 < cfg.max_pauses <= len(self.pauses)
                        and not (cfg.zombie_pauses
                                 and len(self.paused) + 1 >= cfg.workers)):
                    victim = self._victim(self.pause_rng, busy=True)
                    if victim is not None:         # else: at the next busy tick
                        self.due = round(due["pause"], 3)
                        self._pause_slot(victim, pause_s)
                        due["pause"] += gap(mean["pause"], rngs["pause"])
                if due["reaper"] is not None and self.tally.claims >= due["reaper"]:
                    self.due = round(due["reaper"], 3)
                    if self._arm_reaper():     # else: once its last arm is spent
                        due["reaper"] += gap(mean["reaper"], rngs["reaper"])
            if now >= next_check:
                next_check = now + CHECK_S
                self.server_clock.sample(r)
                self._merge(ids, idset, wait=self.phase == "drain")
                total = len(ids)
                undone = self._undone(idset, queue, r)
                done = len(idset) - len(undone)
                size = self._events_size()
                if (done != last_done or not self._workers_up()
                        or (self.phase == "drain" and size != last_size)):
                    last_activity = now
                last_done, last_size = done, size
                running_low = (done >= cfg.kill_until * total
                               or now - last_activity > cfg.quiet_s)
                stop_chaos = running_low or (cfg.kill_phase_s and
                                             now - t_chaos >= cfg.kill_phase_s)
                if self.phase == "chaos" and cfg.quota and not self.short_of_quota():
                    stop_chaos = True           # quota in: the faults set the length
                elif self.phase == "chaos" and self.short_of_quota():
                    if now - t_chaos < cfg.quota_cap_s:
                        stop_chaos = False
                        low = total - done < max(cfg.workers, cfg.docs // 2)
                        if (low or running_low) and self.batch is None:
                            self._more(len(ids), queue)
                            last_activity = now
                    else:
                        stop_chaos = True       # the cap: judged "unknown" later
                if done == total and self.batch is None:
                    return "drained", "", now - t0
                if self.phase == "chaos" and stop_chaos:
                    self.phase, last_activity = "drain", now
                    self.chaos_s = now - t_chaos
                    self._merge(ids, idset, wait=True)
                    total = len(ids)
                elif self.phase == "drain" and self._quiet(now - last_activity):
                    return "quiet", "", now - t0
                if self.phase == "drain" and self._looping(undone):
                    return ("timeout", f"{len(undone)} job(s) claimed at least "
                            f"{cfg.loop_claims} times each and never ended",
                            now - t0)
                if now - t0 > cfg.drain_timeout_s:
                    return ("timeout", f"not drained after {cfg.drain_timeout_s:g} s "
                            f"({done}/{total} done)", now - t0)
            if self.progress and now >= next_report:
                next_report = now + 1.0
                self.progress({"done": done, "total": total, "kills": len(self.kills),
                               "pauses": len(self.pauses),
                               "elapsed_s": round(now - t0, 1), "phase": self.phase})
            time.sleep(FAST_TICK_S if self.zombies or self.reaper_stop else TICK_S)


_DONE_EVENTS = tuple(f'"ev": "{e}"'.encode() for e in (
    "ack", "ack_refused", "fail", "abandoned", "idle", "start"))
_JOB_DONE = ("ack", "ack_refused", "fail", "abandoned")
_BETWEEN_JOBS = (*_JOB_DONE, "start", "idle", "reap")    # next: reap or claim


class _Tally:
    """What the workers' logs say so far: claims, crash-point kills, reaps.

    Read incrementally (only whole lines), so the supervisor can key the fault
    schedule to claims and count the quota every tick.
    """

    def __init__(self, directory: Path):
        self.dir, self.offsets = directory, {}
        self.claims, self.reaped, self.crash = 0, 0, Counter()
        self.reaped_by: Counter = Counter()          # pid -> leases it reaped
        self.holding: dict[int, tuple[str, int] | None] = {}  # pid -> (job, attempt)
        self.claims_of: dict[str, list[tuple[int, int]]] = defaultdict(list)
        self.ended: dict[tuple[int, str], int] = {}   # (pid, job) -> t it answered
        self.acked: set[str] = set()                 # jobs with an accepted ack
        # job -> t of its latest claim, of its latest ack/fail/abandon
        self.last_claim: dict[str, int] = {}
        self.last_end: dict[str, int] = {}
        self.reaper_paused: list[dict] = []          # a reaper's pause events
        self.paused_seen = 0                         # ... the engine has taken
        self.no_gap = 0                              # armed reaps with no gap
        self.after_pause: list[dict] = []            # a paused reap's result

    def update(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.dir):
                off = self.offsets.get(entry.name, 0)
                if entry.stat().st_size <= off:
                    continue
                with open(entry.path, "rb") as f:
                    f.seek(off)
                    chunk = f.read()
                end = chunk.rfind(b"\n") + 1
                self.offsets[entry.name] = off + end
                pid = int(entry.name.split(".")[0])
                for line in chunk[:end].splitlines():
                    if b'"ev": "claim"' in line:
                        self.claims += 1
                        with contextlib.suppress(ValueError, KeyError):
                            e = json.loads(line)
                            job, attempt = str(e["job"]), int(e["attempt"])
                            self.holding[pid] = (job, attempt)
                            self.claims_of[job].append((attempt, pid))
                            self.last_claim[job] = e["t"]
                    elif any(e in line for e in _DONE_EVENTS):
                        self.holding[pid] = None
                        with contextlib.suppress(ValueError, KeyError):
                            e = json.loads(line)
                            if e["ev"] in _JOB_DONE:
                                self.ended[(pid, str(e["job"]))] = e["t"]
                                self.last_end[str(e["job"])] = e["t"]
                            if e["ev"] == "ack":
                                self.acked.add(str(e["job"]))
                    elif b'"ev": "crash_point"' in line or b'"ev": "reap"' in line:
                        with contextlib.suppress(ValueError):
                            self._count(json.loads(line))
                    elif b'"ev": "reaper_paused"' in line:
                        with contextlib.suppress(ValueError):
                            self.reaper_paused.append(json.loads(line))
                    elif b'"ev": "reap_no_gap"' in line:
                        self.no_gap += 1
                    elif b'"ev": "reap_after_pause"' in line:
                        with contextlib.suppress(ValueError):
                            self.after_pause.append(json.loads(line))

    def job_of(self, pid: int) -> str | None:
        """The job the worker holds, as far as its log says."""
        held = self.holding.get(pid)
        return held[0] if held else None

    def _count(self, e: dict) -> None:
        if e["ev"] == "crash_point":
            self.crash[e.get("point", "?")] += 1
        else:
            n = int(e.get("requeued", 0)) + int(e.get("dead", 0))
            self.reaped += n
            self.reaped_by[e.get("pid")] += n


def _stopped(pid: int) -> bool:
    """The process is stopped (SIGSTOP took effect), as the kernel says."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rfind(")") + 2:].startswith(("T", "t"))


def _poison(job: str, poison_every: int) -> bool:
    """A document the engine enqueued to fail (its worker calls fail())."""
    num = job.removeprefix("doc-")
    return num.isdigit() and "POISON" in produce.doc_text(int(num), poison_every)


def _read_events(directory: Path) -> list[dict]:
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    events.sort(key=lambda e: e["t"])
    return events


class _Judge:
    """Turns the ledger, the DLQ and the event logs into invariants and histories."""

    def __init__(self, run: _Run, ids: list[str], t_enqueued: tuple[int, int],
                 dead: list[tuple[str, int, str]], t0_ns: int,
                 effects: tuple[list[tuple], dict]):
        self.run, self.cfg, self.t0 = run, run.cfg, t0_ns
        self.ids, self.idset, self.t_enqueued = ids, set(ids), t_enqueued
        self.dead = {str(d[0]): (int(d[1]), str(d[2] or "")) for d in dead}
        self.applied, self.summary = effects
        self.events = _read_events(run.events_dir)
        self.died_in_claim = sum(e["ev"] == "crash_point" and e.get("call") in CLAIMS
                                 for e in self.events)
        self.by_job: dict[str, list[dict]] = defaultdict(list)
        for e in self.events:
            if "job" in e:
                self.by_job[str(e["job"])].append(e)
        self.unearned = self._unearned_dead()

    def _unearned_dead(self) -> set[str]:
        """DLQ entries the workers' logs do not justify: jobs no worker claimed.

        `dead()` is the queue's own word, so a queue that drops jobs could list
        them all as dead; a job is dead only after attempts that ended badly,
        and every attempt starts with a claim in a worker's log. The one claim
        no log shows is one its worker died inside (a crash point in claim(),
        or an engine kill while its log showed no job held); as many jobs as
        max_attempts such deaths could bury are excused. A worker killed before
        its first line never reached its loop and claimed nothing (on a loaded
        machine most kills land on workers still starting, and counting them
        once excused all 30 jobs dead_hides_lost dropped).
        """
        claimed = {job for job, evs in self.by_job.items()
                   if any(e["ev"] == "claim" for e in evs)}
        unseen = [j for j in self.dead if j in self.idset and j not in claimed]
        excused = self._unlogged_claims() // max(1, self.cfg.max_attempts)
        return set(unseen[excused:])

    def _unlogged_claims(self) -> int:
        """Deaths that may have cut a claim short before its worker logged it:
        inside claim(), or killed when its log last showed it between jobs
        (its "start" line is written unbuffered before its first claim)."""
        logs: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for e in self.events:
            logs[e["pid"]].append((e["t"], e["ev"]))
        # a fused worker's ack claims the next job, so right after a commit too
        ends = (*_BETWEEN_JOBS, "commit") if self.cfg.fused else _BETWEEN_JOBS
        between = 0
        for t, pid in self.run.kills:
            before = [ev for te, ev in logs.get(pid, []) if te <= t]
            between += bool(before) and before[-1] in ends
        return self.died_in_claim + between

    def lost(self) -> list[str]:
        """Enqueued, never applied, and not (earned) in the DLQ."""
        times = Counter(job for job, *_ in self.applied)
        return [j for j in self.ids if j not in times
                and (j not in self.dead or j in self.unearned)]

    def _stale(self, kinds: tuple[str, ...]) -> list[str]:
        """Jobs where an accepted call of `kinds` came after a newer claim."""
        out = []
        for job, evs in self.by_job.items():
            claimed = []   # (t, attempt) of claims that had returned
            for e in evs:
                if e["ev"] == "claim":
                    claimed.append((e["t"], e["attempt"]))
                elif e["ev"] in kinds and e.get("ok", True):
                    t_sent = e.get("t0", e["t"])
                    if any(t < t_sent and a > e["attempt"] for t, a in claimed):
                        e["stale"] = True
                        if job not in out:
                            out.append(job)
        return out

    def _handed_twice(self) -> list[str]:
        """Jobs claimed again while an earlier attempt's lease surely still ran.

        Attempt a's lease was granted after its claim call started (t0), by
        the server's clock, so it runs at least until t0 + lease, less what that
        clock gained on ours meanwhile (a step forward expires every lease
        early); a claim that returned before then (less a margin) got a job
        someone else held, unless
        a had given it back with fail(), or died in a job that calls fail(). A
        claim after an accepted ack is a finished job handed out again.
        """
        lease_ns, margin = self.cfg.lease_s * 1e9, 0.02e9
        died = defaultdict(list)
        for t, pid in self.run.kills:
            died[pid].append(t)
        for e in self.events:
            if e["ev"] == "crash_point":
                died[e["pid"]].append(e["t"])
        out = []
        for job, evs in self.by_job.items():
            claims = [e for e in evs if e["ev"] == "claim"]
            fails = (any(e["ev"] == "fail" for e in evs)
                     or _poison(job, self.cfg.poison_every))
            for i, b in enumerate(claims):
                for a in claims[:i]:
                    if a["attempt"] >= b["attempt"] or a["pid"] == b["pid"]:
                        continue
                    mine = [e for e in evs if e["pid"] == a["pid"]
                            and e.get("attempt") == a["attempt"]]
                    if any(e["ev"] == "ack" and e["t"] < b.get("t0", b["t"])
                           for e in mine):
                        out.append(job)
                        break
                    start = a.get("t0", a["t"])
                    gained = self.run.server_clock.gained_ns(start, b["t"])
                    if b["t"] + gained >= start + lease_ns - margin:
                        continue
                    if any(e["ev"] == "fail" and e.get("t0", e["t"]) < b["t"]
                           for e in mine):
                        continue
                    if fails and any(a["t"] <= t <= b["t"]
                                     for t in died[a["pid"]]):
                        continue
                    out.append(job)
                    break
                if job in out:
                    break
        return out

    def invariants(self, ending: str) -> dict[str, Invariant]:
        times = Counter(job for job, *_ in self.applied)
        deliveries = Counter(e["job"] for e in self.events if e["ev"] == "claim")
        broken = {
            "lost": self.lost(),
            "applied_twice": [j for j in self.ids if times[j] > 1],
            "unexpected": sorted({j for j in times if j not in self.idset}
                                 | {j for j in self.dead if j not in self.idset}),
            "dead_without_reason": [j for j, (_, why) in self.dead.items()
                                    if not why.strip()],
            "stale_ack_accepted": self._stale(("ack", "fail")),
            "stale_extend_accepted": self._stale(("extend",)),
            "over_delivered": [j for j, n in deliveries.items()
                               if n > self.cfg.max_attempts],
            "handed_out_twice": self._handed_twice(),
        }
        self.times, self.deliveries = times, deliveries
        out = {}
        for name, jobs in broken.items():
            ok = not jobs
            if name == "lost" and ending not in ("drained", "quiet"):
                ok = None if jobs else True
            out[name] = Invariant(name, ok, len(jobs),
                                  [self.history(j) for j in jobs[:WITNESSES]],
                                  [self.timeline(j, name) for j in jobs[:WITNESSES]]
                                  if ok is False else [])
        return out

    def _at(self, t_ns: int) -> str:
        return f"{'+%.3f' % ((t_ns - self.t0) / 1e9):>8}s"

    def _why_again(self, prev: tuple[int, int, int], how: str | None,
                   t: int) -> str:
        """Why a job was handed out again, as far as the logs can tell."""
        a, pid, t_claim = prev
        if how is None and any(k_pid == pid and t_claim <= k_t <= t
                               for k_t, k_pid in self.run.kills):
            how = "died"
        gained = self.run.server_clock.gained_ns(t_claim, t)
        if (how not in ("acked", "failed")
                and t - t_claim + gained < self.cfg.lease_s * 1e9):
            return (f"(again, {(t - t_claim) / 1e9:.3f} s after attempt {a} was "
                    "claimed, before its lease could expire: handed out twice)")
        return {
            "acked": f"(again, after attempt {a} was acked: handed out twice)",
            "died": f"(attempt {a}'s worker died; its lease expired, it was reaped)",
            "failed": f"(retry after attempt {a} failed)",
        }.get(how, f"(while attempt {a} was still running: its lease ran out, "
                   "or the job was queued twice)")

    def _marks(self, job: str) -> list[Mark]:
        """The job's merged story from the logs, the ledger and the kills, in time
        order: what `history` prints and `timeline` draws."""
        lines: list[Mark] = []
        if job in self.idset:
            lines.append(Mark(self.t_enqueued[1], "enqueued (with the others)",
                              None, "enqueue"))
        spans = []                       # (pid, attempt, t_claim, t_end)
        open_ = {}                       # pid -> (attempt, t_claim) in progress
        ended: dict[int, str] = {}       # attempt -> how it ended
        last = None                      # (attempt, pid, t_claim) of the last claim
        for e in self.by_job.get(job, []):
            pid, a, ev = e["pid"], e.get("attempt"), e["ev"]
            if ev == "claim":
                note = ""
                if last is not None:
                    note = " " + self._why_again(last, ended.get(last[0]), e["t"])
                last = (a, pid, e["t"])
                lines.append(Mark(e["t"], f"claimed by worker {pid} as attempt "
                                  f"{a}{note}", pid, "claim", a,
                                  "handed out twice" in note))
                open_[pid] = (a, e["t"])
                continue
            if ev in ("ack", "fail", "crash_point", "abandoned"):
                ended.setdefault(a, {"ack": "acked", "fail": "failed",
                                     "crash_point": "died",
                                     "abandoned": "abandoned"}[ev])
            stale = " <- STALE: a newer attempt was already claimed" \
                if e.get("stale") else ""
            if ev in ("ack", "ack_refused"):
                verdict = "accepted" if ev == "ack" else "refused"
                lines.append(Mark(e["t"], f"ack of attempt {a} by worker {pid}: "
                                  f"{verdict}{stale}", pid, ev, a,
                                  bool(stale) and ev == "ack"))
            elif ev == "fail":
                verdict = "accepted" if e.get("ok") else "refused"
                lines.append(Mark(e["t"], f"fail of attempt {a} by worker {pid} "
                                  f"({e.get('error', '')}): {verdict}{stale}", pid,
                                  "fail", a, bool(stale) and bool(e.get("ok"))))
            elif ev == "extend" and stale:
                lines.append(Mark(e["t"], f"heartbeat of attempt {a} by worker "
                                  f"{pid}: accepted{stale}", pid, "extend", a, True))
            elif ev == "extend_refused":
                lines.append(Mark(e["t"], f"heartbeat of attempt {a} by worker "
                                  f"{pid}: refused (lease gone)", pid,
                                  "extend_refused", a))
            elif ev == "abandoned":
                lines.append(Mark(e["t"], f"worker {pid} abandoned attempt {a} "
                                  "(no commit, no ack)", pid, "abandoned", a))
            elif ev == "commit" and not e.get("effect"):
                lines.append(Mark(e["t"], f"commit by worker {pid} (attempt {a}) "
                                  "changed nothing: already applied", pid, "commit",
                                  a))
            elif ev == "crash_point":
                lines.append(Mark(e["t"], f"worker {pid} SIGKILLed itself at crash "
                                  f"point {e['point']} (attempt {a})", pid, "crash",
                                  a))
            if ev in ("ack", "ack_refused", "fail", "abandoned", "crash_point"):
                if pid in open_:
                    spans.append((pid, *open_.pop(pid), e["t"]))
        for pid, (a, t) in open_.items():
            spans.append((pid, a, t, None))
        for t, pid in self.run.kills:
            for spid, a, start, end in spans:
                if spid == pid and start <= t and (end is None or t <= end):
                    lines.append(Mark(t, f"worker {pid} killed (SIGKILL by the "
                                      f"engine) holding attempt {a}", pid, "kill", a))
        for t, pid, secs in self.run.pauses:
            for spid, a, start, end in spans:
                if spid == pid and start <= t and (end is None or t <= end):
                    lines.append(Mark(t, f"worker {pid} paused (SIGSTOP) for "
                                      f"{secs:g} s holding attempt {a}", pid, "pause",
                                      a, seconds=secs))
        for t, pid, jobs, t_end, _ in self.run.reaper_pauses:
            if job in jobs:
                secs = round((t_end - t) / 1e9, 3)
                lines.append(Mark(t, f"reaper {pid} stopped (SIGSTOP) inside reap(), "
                                  "after a reply that named this job, before its "
                                  f"next request; resumed {secs:g} s later", pid,
                                  "pause", seconds=secs))
        applied = sorted(t for j, _, _, t in self.applied if j == job)
        for j, a, pid, t in self.applied:
            if j == job:
                lines.append(Mark(t, f"APPLIED by worker {pid} (attempt {a})", pid,
                                  "apply", a, len(applied) > 1 and t > applied[0]))
        lines.sort(key=lambda m: m.t)
        return lines

    def _ending(self, job: str) -> str:
        """Where the job was when the run ended, if that is part of its story."""
        if job in self.dead:
            n, why = self.dead[job]
            return f"in the DLQ after {n} attempts: {why or '(no reason)'}"
        if job not in self.times:
            return "never applied, not in the DLQ"
        return ""

    def history(self, job: str) -> str:
        """The job's merged story from the logs, the ledger, the kills and the DLQ."""
        text = [f"  {job}"] + [f"    {self._at(m.t)}  {m.text}"
                               for m in self._marks(job)]
        if job in self.dead:
            text.append(f"    at the end    {self._ending(job)}")
            if job in self.unearned:
                text.append("    but no worker's log shows it claimed: a job the "
                            "queue calls dead without handing it out is lost")
        elif job not in self.times:
            text.append(f"    at the end    {self._ending(job)}")
            if job not in self.by_job and self.died_in_claim:
                text.append(f"    note: {self.died_in_claim} workers died inside "
                            "claim() before it returned; a job taken by such a "
                            "call is gone unless claim is one atomic step")
        return "\n".join(text)

    def timeline(self, job: str, invariant: str) -> dict:
        """The job's story as data to draw: one lane per process, marks on the
        run's clock (seconds), each attempt's lease, the step that broke
        `invariant` flagged, and one sentence that says what went wrong."""
        marks = self._marks(job)
        lease = self.cfg.lease_s
        leases = [{"lane": f"worker {m.pid}", "attempt": m.attempt,
                   "start": (m.t - self.t0) / 1e9,
                   "end": (m.t - self.t0) / 1e9 + lease}
                  for m in marks if m.kind == "claim"]
        ending = self._ending(job)
        if job in self.unearned:
            ending += "; no worker's log shows it claimed, so it counts as lost"
        bad = [m for m in marks if m.bad]
        if bad:
            sentence = f"{INVARIANTS[invariant]}: {bad[0].text}"
        else:
            last = f"its last step: {marks[-1].text}" if marks else "no step logged"
            sentence = (f"{INVARIANTS[invariant]}. {job}, {last}"
                        + (f"; at the end: {ending}" if ending else ""))
        lanes = ["producer"] + sorted({self._lane(m.pid) for m in marks
                                       if m.pid is not None})
        return {"job": job, "invariant": invariant, "lanes": lanes,
                "lease_s": lease, "leases": leases, "ending": ending,
                "sentence": sentence,
                "marks": [{"t": round((m.t - self.t0) / 1e9, 4),
                           "lane": "producer" if m.pid is None
                           else self._lane(m.pid), "kind": m.kind,
                           "attempt": m.attempt, "text": m.text, "bad": m.bad,
                           **({"seconds": m.seconds} if m.seconds else {})}
                          for m in marks]}

    def _lane(self, pid: int) -> str:
        return f"{'reaper' if pid in self.run.reaper_pids else 'worker'} {pid}"

    def unacked_commits(self) -> dict[str, int]:
        """Commits whose ack never landed: the only way a fenced queue duplicates.

        The database's `applied` rows are the truth for effects (a worker killed
        while SQLite's COMMIT was returning has committed but never logged it);
        the logs add commits that changed nothing. `refused`: the lease had run
        out, the ack was turned away. `died`: the worker never got its ack in.
        """
        commits = {(str(j), int(a)) for j, a, *_ in self.applied}
        acked, refused = set(), set()
        for e in self.events:
            key = (str(e.get("job")), e.get("attempt"))
            if e["ev"] == "commit":
                commits.add(key)
            elif e["ev"] == "ack":
                acked.add(key)
            elif e["ev"] == "ack_refused":
                refused.add(key)
        unacked = commits - acked
        return {"died": len(unacked - refused), "refused": len(unacked & refused)}

    def orphans(self) -> dict:
        """Jobs a worker held when it was killed: the lease left, the wait.

        The lease left runs from the kill to the end of the last lease the
        worker was granted (its claim or its last extend, by our clock); until
        then nobody may have the job. The wait runs from the kill to the job's
        next claim: that lease, a reap, and the jobs ahead of it once requeued.
        A fused worker may die holding a job it fetched with its last ack and
        had barely started (`prefetched`): it costs about a whole lease.
        """
        lease_ns = self.cfg.lease_s * 1e9
        left, waits, prefetched = [], [], 0
        of_pid = defaultdict(list)
        for e in self.events:
            of_pid[e["pid"]].append(e)
        for t, pid in self.run.kills:
            held, granted = None, 0
            for e in of_pid[pid]:
                if e["t"] > t:
                    break
                if e["ev"] == "claim":
                    held, granted = e, e.get("t0", e["t"])
                elif held and e.get("job") == held["job"]:
                    if e["ev"] == "extend":
                        granted = e.get("t0", e["t"])
                    elif e["ev"] in _JOB_DONE:
                        held = None
            if held is None:
                continue
            later = [e["t"] for e in self.by_job[str(held["job"])]
                     if e["ev"] == "claim" and e["t"] > t]
            if later:
                left.append(max(0.0, granted + lease_ns - t) / 1e9)
                waits.append((min(later) - t) / 1e9)
                prefetched += held.get("via") == "ack_and_claim"
        out = {"jobs": len(waits), "prefetched": prefetched}
        if waits:
            out |= {"lease_left_s": round(statistics.median(left), 3),
                    "median_wait_s": round(statistics.median(waits), 3),
                    "max_wait_s": round(max(waits), 3)}
        return out

    def stats(self, elapsed: float) -> dict:
        idem = self.cfg.idem
        s = self.summary
        applied_h = Counter(self.times[j] for j in self.ids)
        delivery_h = Counter(self.deliveries[j] for j in self.ids)
        return {
            "kills": len(self.run.kills),
            "crash_kills": sum(e["ev"] == "crash_point" for e in self.events),
            "pauses": len(self.run.pauses),
            "workers_started": len(self.run.started) - len(self.run.reaper_pids),
            "rows": s["rows"] if idem else s["naive_rows"],
            "distinct": s["rows"] if idem else s["naive_distinct"],
            "counter": s["counter"],
            "dlq": len(self.dead),
            "lost": len(self.lost()),
            "elapsed_s": round(elapsed, 2),
            "unacked": self.unacked_commits(),
            "orphans": self.orphans(),
            "applied_histogram": {str(k): v for k, v in sorted(applied_h.items())},
            "delivery_histogram": {str(k): v for k, v in sorted(delivery_h.items())},
        }


def run(cfg: ChaosConfig, redis_url: str | None = None, workdir: str | None = None,
        progress=None) -> Report:
    """One chaos run of `cfg`; every process it starts is gone when it returns."""
    with contextlib.ExitStack() as stack:
        url = redis_url or stack.enter_context(redis_server.redis_url())
        if workdir is None:
            workdir = tempfile.mkdtemp(prefix="eo-chaos-")
            stack.callback(shutil.rmtree, workdir, True)
        work = Path(workdir)
        run_ = _Run(cfg, url, work, progress)
        run_.events_dir.mkdir(parents=True, exist_ok=True)
        for old in run_.events_dir.glob("*.jsonl"):
            old.unlink()
        setup_db.setup(run_.db)
        empty = {"kills": 0, "crash_kills": 0, "pauses": 0, "rows": 0,
                 "distinct": 0, "counter": 0, "dlq": 0, "lost": 0, "elapsed_s": 0.0,
                 "unacked": {"died": 0, "refused": 0},
                 "applied_histogram": {}, "delivery_histogram": {}}
        try:
            queue = load_queue(cfg.queue)
        except ContractError as err:
            return _unknown(cfg, str(err), empty)
        if cfg.tx_effect and not hasattr(queue, "finish"):
            return _unknown(cfg, f"{cfg.queue} has no finish(): it cannot commit "
                            "the effect with the ack", empty)
        try:
            r = redis_server.connect(url, decode_responses=True)
            run_.server_clock.sample(r)
            if hasattr(queue, "reset"):
                queue.reset(r)
            else:
                r.flushdb()
            t0 = time.monotonic_ns()
            ids = produce.produce(r, queue, cfg.docs, cfg.poison_every)
            t_enqueued = (t0, time.monotonic_ns())
            try:
                ending, reason, elapsed = run_.supervise(ids, queue, r)
            finally:
                run_.stop_all()
                with contextlib.suppress(_Aborted):   # a batch still in flight
                    run_._merge(ids, set(), wait=True)
            dead = list(queue.dead(r))
            effects = run_.effects(queue, r)
            run_.server_clock.sample(r)
        except _Aborted as err:
            return _unknown(cfg, str(err), empty, run_)
        except redis_server.RedisUnavailable as err:
            return _unknown(cfg, str(err), empty, run_)
        except Exception as err:
            import redis

            if isinstance(err, redis.RedisError):
                return _unknown(cfg, f"Redis at {url} failed mid-run ({err}); check "
                                "that the server is up, then replay", empty, run_)
            raise
        finally:
            run_.stop_all()
        judge = _Judge(run_, ids, t_enqueued, dead, t0, effects)
        invariants = judge.invariants(ending)
        short = run_.short_of_quota()
        if short:              # said even beside a broken invariant: no pass here
            reason = _short_reason(short, run_.chaos_s or elapsed)
        if any(inv.ok is False for inv in invariants.values()):
            verdict = "invalid"
        elif short:
            verdict = "unknown"
        elif ending in ("drained", "quiet") and not run_.abnormal:
            verdict = "valid"
        else:
            verdict = "unknown"
            if ending in ("drained", "quiet"):   # a worker died of an exception
                reason = (f"workers exited with an error {run_.abnormal} times, so "
                          f"the queue's code raised; the log ends with:\n"
                          f"{run_._log_tail()}")
        stats = judge.stats(elapsed)
        stats["worker_errors"] = run_.abnormal
        stats["server_clock_gained_ms"] = round(run_.server_clock.gained_ns() / 1e6, 1)
        stats.update(_fault_stats(run_, elapsed, len(ids)))
        return Report(cfg, verdict, reason, invariants, stats, replay_command(cfg),
                      [p.pid for p in run_.started], judge.summary)


def _short_reason(short: dict[str, tuple[int, int]], chaos_s: float) -> str:
    parts = ", ".join(f"{got} of {want} {_kind(k)}" for k, (got, want) in
                      short.items())
    return (f"too few faults to judge: {parts} in {chaos_s:.1f} s of chaos; the "
            "queue may be too slow, or blocked (see quota_cap_s)")


def _kind(key: str) -> str:
    return (f"kills at crash point {key[6:]}" if key.startswith("crash:")
            else {"reaps": "leases reaped",
                  "zombies": "zombies that answered while their job's new claim "
                             "was held",
                  "reaper_pauses": "reaper pauses mid-reap (or armed reaps with "
                                   "no gap to pause in)"}.get(key, key))


def _fault_stats(run_: _Run, elapsed: float, enqueued: int) -> dict:
    """The faults injected by kind, the quota, and the run's size (additive)."""
    got = run_.faults()
    faults = {"kills": got["kills"], "pauses": got["pauses"],
              "crash_kills": {p: got[f"crash:{p}"] for p in run_.cfg.crash_names},
              "leases_reaped": got["reaps"]}
    if run_.cfg.zombie_pauses:
        faults["zombies"] = run_.zombies_made
    if run_.cfg.reapers:           # leases taken back by the racing reapers
        faults["raced_reaps"] = sum(run_.tally.reaped_by[pid]
                                    for pid in run_.reaper_pids)
    if run_.cfg.fault_reapers:
        faults["reaper_kills"] = run_.reaper_kills
    if run_.cfg.reaper_pause_every_claims:
        faults["reaper_pauses"] = len(run_.reaper_pauses)
        faults["reaper_pauses_raced"] = sum(x[4] for x in run_.reaper_pauses)
        faults["reaps_no_gap"] = run_.tally.no_gap
    return {"faults": faults,
            "quota": run_.cfg.quota, "quota_short": {
                k: {"injected": g, "wanted": w}
                for k, (g, w) in run_.short_of_quota().items()},
            "claims": run_.tally.claims, "enqueued": enqueued,
            "schedule": [{"at_claims": c, "fault": f, "slot": s, "due": d}
                         for c, f, s, d in run_.schedule],
            "chaos_s": round(run_.chaos_s or elapsed, 2)}


def _unknown(cfg: ChaosConfig, reason: str, stats: dict, run_: _Run | None = None
             ) -> Report:
    invs = {name: Invariant(name, None, 0) for name in INVARIANTS}
    pids = [p.pid for p in run_.started] if run_ else []
    return Report(cfg, "unknown", reason, invs, dict(stats), replay_command(cfg), pids)
