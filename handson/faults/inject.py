"""Fault injection: kills and pauses on a seeded schedule, built faults, quotas.

Kills and pauses come at random, on the seed's schedule (in seconds, or in
claims so that a seed replays the same schedule); crash points are thrown by
the workers themselves. Besides faults at random, a run can build the
interleavings that expose a bug on purpose: a zombie pause keeps its worker
stopped until the job it holds has been claimed again, then stops the new
holder while the zombie answers; extra reapers race the workers' own reap
calls; a reaper pause stops the first extra reaper inside a reap, between the
round trip that read a job and the next, until that job has been claimed again
(or has ended), so a reap that reads and acts in separate round trips requeues
a job that is owned or done. (A job that kills every worker that claims it
comes from the workers themselves: crash point "on-poison:1".)

The quota counts what was injected by kind; a run short of it is unknown.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import time

from handson.faults.logs import _Tally
from handson.faults.pool import Pool, _stopped


class Faults(Pool):
    """A pool whose processes are killed and paused as the config asks."""

    def __init__(self, *args):
        super().__init__(*args)
        cfg = self.cfg
        self.kill_rng = random.Random(cfg.seed)
        self.reaper_kills = 0                       # beside the workers' kills
        self.reaper_armed: tuple[int, int] | None = None  # (pid, arms spent then)
        self.reaper_stop: dict | None = None        # the reaper pause under way
        self.reaper_pauses_buried = 0               # ... on jobs bound for the DLQ
        # (t_ns stopped, pid, jobs it had read, t_ns resumed, one claimed again)
        self.reaper_pauses: list[tuple[int, int, list[str], int, bool]] = []
        self.kills: list[tuple[int, int]] = []       # (t_ns, pid)
        self.pauses: list[tuple[int, int, float]] = []  # (t_ns, pid, seconds)
        self.paused: dict[int, float] = {}           # slot -> resume at
        # slot -> (pid, job, attempt, t_ns): paused holding a job, waiting for
        # it to be claimed again; slot -> (zombie pid, job, attempt): a new
        # holder stopped until the zombie has answered for the job.
        self.zombies: dict[int, tuple[int, str, int, int]] = {}
        self.holds: dict[int, tuple[int, str, int]] = {}
        self.zombies_made = 0
        # Zombie pauses struck off (the worker had just ended its job): each is
        # tried again at the next tick, not at the schedule's next due point.
        self.owed_pauses = 0
        self.tally = _Tally(self.events_dir)
        # (claims seen, fault, slot, when it was due: seconds or claims)
        self.schedule: list[tuple[int, str, int, float]] = []
        self.due = 0.0                  # the due point of the fault being injected

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

    def _spawn(self, *args, **kwargs):
        p = super()._spawn(*args, **kwargs)
        self.tally.started(p.pid)
        return p

    def _kill_reaper(self, i: int) -> None:
        """A reaper dies like a worker (anywhere in its loop) and is restarted."""
        p = self.reapers[i]
        self.reaper_kills += 1
        self.schedule.append((self.tally.claims, "kill reaper", i, self.due))
        self._signal(p, signal.SIGKILL)
        p.wait(timeout=10)
        self.tally.retire(p.pid)
        self._start_reaper(i)

    def _kill_slot(self, slot: int | None) -> None:
        if slot is None:
            return
        p = self.procs[slot]
        self.kills.append((time.monotonic_ns(), p.pid))
        self.schedule.append((self.tally.claims, "kill", slot, self.due))
        self._signal(p, signal.SIGKILL)
        p.wait(timeout=10)
        self.tally.retire(p.pid)
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
        for slot, zombie in list(self.holds.items()):
            if (zombie in self.tally.ended or zombie[0] not in slot_of
                    or now >= self.paused[slot]):
                self._resume(slot)
        for slot, until in list(self.paused.items()):
            if slot in self.holds:
                continue
            z = self.zombies.get(slot)
            if z is not None:
                pid, job, attempt, t_ns = z
                if self.tally.ended.get((pid, job, attempt), t_ns + 1) <= t_ns:
                    self.pauses = [x for x in self.pauses if x[:2] != (t_ns, pid)]
                    self.zombies.pop(slot)
                    self.owed_pauses += 1
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
                        self.holds[h] = (pid, job, attempt)
                        self.zombies_made += 1
                    self._resume(slot)
                    continue
            if now >= until:
                self._resume(slot)

    def _all_busy(self) -> bool:
        """Every running worker holds a job: a claim gap is long work, not an
        empty queue, so more documents would only lengthen the drain."""
        return all(self.tally.job_of(p.pid) is not None
                   for i, p in enumerate(self.procs)
                   if p is not None and i not in self.paused and p.poll() is None)

    def _running(self) -> list[int]:
        """Slots to fault: paused ones are skipped (a kill too: its lease ran
        out long ago), and so is a zombie answering for its job."""
        answering = {zpid for zpid, *_ in self.holds.values()}
        return [i for i in range(self.cfg.workers) if i not in self.paused
                and self.procs[i].pid not in answering]

    def _kill_victim(self) -> int | None:
        """Any running worker, at random: kills land anywhere in its loop,
        inside claim() too."""
        slots = self._running()
        return slots[self.kill_rng.randrange(len(slots))] if slots else None

    def _pause_victim(self) -> int | None:
        """The running worker with the latest claim, the likeliest still at its
        job: a pause only counts if it makes its worker outlive a lease. (The
        logs are read every tick and a job may take a few ms: a worker picked
        at random had often ended its job, and its pause was struck off.)"""
        slots = [i for i in self._running() if self.tally.job_of(self.procs[i].pid)]
        return max(slots, key=self._claimed_at, default=None)

    def _claimed_at(self, slot: int) -> int:
        return self.tally.last_claim.get(self.tally.job_of(self.procs[slot].pid), 0)

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


def _fault_stats(run_: Faults, elapsed: float, enqueued: int) -> dict:
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
