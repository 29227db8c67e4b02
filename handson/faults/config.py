"""What a chaos run is asked to do: `ChaosConfig`, checked as it is built.

Its own module so that the lab's command line, the book, the grader and the
replay command build and read a run's settings without the machinery that runs
it: a config says what to inject and how long to try; `replay_command` turns
one back into the shell line that runs it again.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, fields


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
    # Each job also lasts at least this long, sleeping out what its hashing
    # left (handson/work.py's WORK_MIN_S): for runs that need jobs of a
    # length but not the CPU they would burn, such as a correct queue under
    # kills. The graded run keeps computed work (a loaded machine slows it).
    work_s: float = 0.0
    poison_every: int = 1000
    heartbeat: bool = True
    ack_before_work: bool = False
    fused: bool = False              # workers ack and claim the next in one call
    drain_timeout_s: float = 120.0   # the whole run's budget; past it: unknown
    # A drain that cannot end (poison and no attempt limit) ends once no job
    # has ended while each one left has been claimed this often since, or not
    # at all for quiet_s (lost): keyed to claims, so a loaded machine shows the
    # same loop, only later. 0: twice max_attempts, more claims than a job of
    # a correct queue ever gets.
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
    max_kills: int = 0               # no more of them than this (0: no cap)
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
    # newer attempt for certain; a pause ends at pause_s (3 leases at least) anyway.
    zombie_pauses: bool = False
    min_zombies: int = 0             # quota: zombies that answered past a new claim
    # How long the new holder may be stopped waiting for the zombie's answer
    # (0: half a lease, so its own lease never runs out meanwhile). Longer makes
    # the zombie answer for certain on a loaded machine; the holder's lease may
    # then run out too, which a correct queue survives.
    hold_s: float = 0.0
    # The effect and the ack as one transaction in the queue's own database
    # (the queue's `finish`; `pgq.ledger` then reads it), not results.db.
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
        if 0 < self.max_kills < self.min_kills:
            raise ValueError("max_kills is below min_kills: the quota could not "
                             "be met")
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
