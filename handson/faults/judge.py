"""The judge of a run: the ledger, the DLQ and the logs become verdicts.

Once the queue has drained (or gone quiet), every invariant is judged:

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

Stale-ness is decided from the workers' event logs: every worker stamps its
events with CLOCK_MONOTONIC, which is one clock for the whole machine, and an
ack counts as stale only if the newer claim had returned before the ack was
sent, so overlapping calls never make a false witness. Each broken invariant
comes with witnesses: a job's history as text, and as a timeline to draw.
"""

from __future__ import annotations

import bisect
import statistics
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from handson import produce
from handson.faults.inject import Faults
from handson.faults.logs import _BETWEEN_JOBS, _JOB_DONE, _read_events
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
    "attempt_reused": "a job claimed again with an attempt no larger than one "
                      "an earlier claim had returned",
}
WITNESSES = 3          # histories shown per broken invariant


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


def _poison(job: str, poison_every: int) -> bool:
    """A document the engine enqueued to fail (its worker calls fail())."""
    num = job.removeprefix("doc-")
    return num.isdigit() and "POISON" in produce.doc_text(int(num), poison_every)


def reused_claims(evs: list[dict]) -> list[dict]:
    """The claims among one job's events (in time order) whose attempt is no
    larger than one an earlier claim had returned before this one began; calls
    that overlap are not compared. Each claim is read once (bisect over the
    claims' return times, with the highest attempt so far)."""
    out, times, highest = [], [], []
    for e in evs:
        if e["ev"] != "claim":
            continue
        a = e.get("attempt")
        n = bisect.bisect_left(times, e.get("t0", e["t"]))
        if type(a) is not int or (n and highest[n - 1] >= a):
            out.append(e)
            continue
        times.append(e["t"])
        highest.append(max(a, highest[-1] if highest else a))
    return out


class _Judge:
    """Turns the ledger, the DLQ and the event logs into invariants and histories."""

    def __init__(self, run: Faults, ids: list[str], t_enqueued: tuple[int, int],
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
        once excused all 30 jobs dead_hides_lost dropped). Nor is a job dead
        once a worker's ack of it was accepted: it was done, whatever `dead()`
        says (a queue whose effect was lost after its ack could list it there).
        """
        claimed = {job for job, evs in self.by_job.items()   # or handed out
                   if any(e["ev"] in ("claim", "bad_attempt") for e in evs)}
        acked = {job for job, evs in self.by_job.items()
                 if any(e["ev"] == "ack" for e in evs)}
        unseen = [j for j in self.dead if j in self.idset and j not in claimed]
        excused = self._unlogged_claims() // max(1, self.cfg.max_attempts)
        return set(unseen[excused:]) | {j for j in self.dead if j in acked}

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
            # claims that had returned, by time, and the highest attempt so far
            # (a job claimed thousands of times must not cost their square)
            times: list[int] = []
            highest: list[int] = []
            for e in evs:
                if e["ev"] == "claim":
                    times.append(e["t"])
                    highest.append(max(e["attempt"], highest[-1] if highest else 0))
                elif e["ev"] in kinds and e.get("ok", True):
                    n = bisect.bisect_left(times, e.get("t0", e["t"]))
                    if n and highest[n - 1] > e["attempt"]:
                        e["stale"] = True
                        if job not in out:
                            out.append(job)
        return out

    def _attempt_reused(self) -> list[str]:
        """Jobs claimed with an attempt no larger than one an earlier claim had
        returned before this claim began (`reused_claims`).

        The attempt is the fencing token: if it does not grow, a zombie's ack
        looks like its owner's, and neither the zombie pauses (built on a
        larger attempt) nor the stale-ack count (a larger attempt before the
        ack) can see a missing fence."""
        return [job for job, evs in self.by_job.items() if reused_claims(evs)]

    def _handed_twice(self) -> list[str]:
        """Jobs claimed again while an earlier attempt's lease surely still ran.

        Attempt a's lease was granted after its claim call started (t0), by
        the server's clock, so it runs at least until t0 + lease, less what that
        clock gained on ours meanwhile (a step forward expires every lease
        early); a claim that returned before then (less a margin) got a job
        someone else held, unless
        a had given it back with fail(), or died in a job that calls fail(). A
        claim after an accepted ack is a finished job handed out again.

        Claims are taken in time order, each against the earlier attempts still
        open then (not given back, lease not surely over): a job claimed
        thousands of times (a poison job that loops) costs their number, not
        its square.
        """
        lease_ns, margin = self.cfg.lease_s * 1e9, 0.02e9
        died = self.deaths()
        never = float("inf")
        out = []
        for job, evs in self.by_job.items():
            claims = [e for e in evs if e["ev"] == "claim"]
            if len(claims) < 2:
                continue
            fails = (any(e["ev"] == "fail" for e in evs)
                     or _poison(job, self.cfg.poison_every))
            acks, failed = defaultdict(list), defaultdict(lambda: never)
            for e in evs:
                key = (e["pid"], e.get("attempt"))
                if e["ev"] == "ack":
                    acks[key].append(e["t"])
                elif e["ev"] == "fail":
                    failed[key] = min(failed[key], e.get("t0", e["t"]))
            acked: list[tuple[int, int, int]] = []   # (t, attempt, pid), earlier
            open_: list[tuple[dict, float]] = []     # (claim, its worker's death)
            for b in claims:
                t_b = b.get("t0", b["t"])
                if any(t < t_b and att < b["attempt"] and pid != b["pid"]
                       for t, att, pid in acked):
                    out.append(job)
                    break
                open_ = [(a, dies) for a, dies in open_
                         if a["t"] >= b["t"] - lease_ns + margin
                         and failed[(a["pid"], a["attempt"])] >= b["t"]
                         and dies > b["t"]]
                if any(self._held(a, b, lease_ns, margin) for a, _ in open_):
                    out.append(job)
                    break
                key = (b["pid"], b["attempt"])
                acked += [(t, b["attempt"], b["pid"]) for t in acks.get(key, ())]
                deaths = died.get(b["pid"], [])
                k = bisect.bisect_left(deaths, b["t"])
                open_.append((b, deaths[k] if fails and k < len(deaths) else never))
        return out

    def deaths(self) -> dict[int, list[int]]:
        """pid -> when its worker died (an engine kill or a crash point), in order."""
        died = defaultdict(list)
        for t, pid in self.run.kills:
            died[pid].append(t)
        for e in self.events:
            if e["ev"] == "crash_point":
                died[e["pid"]].append(e["t"])
        for times in died.values():
            times.sort()
        return died

    def _held(self, a: dict, b: dict, lease_ns: float, margin: float) -> bool:
        """Claim b came while a's lease surely still ran (a: an earlier attempt
        of another worker, neither given back nor ended by its worker's death)."""
        if a["attempt"] >= b["attempt"] or a["pid"] == b["pid"]:
            return False
        start = a.get("t0", a["t"])
        gained = self.run.server_clock.gained_ns(start, b["t"])
        return b["t"] + gained < start + lease_ns - margin
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
            "attempt_reused": self._attempt_reused(),
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
        reused = {id(e) for e in reused_claims(self.by_job.get(job, []))}
        for e in self.by_job.get(job, []):
            pid, a, ev = e["pid"], e.get("attempt"), e["ev"]
            if ev == "claim":
                note = ""
                if last is not None:
                    note = " " + self._why_again(last, ended.get(last[0]), e["t"])
                if id(e) in reused:
                    note += (" <- REUSED: an earlier claim had already handed out "
                             "this attempt (or a later one)")
                last = (a, pid, e["t"])
                lines.append(Mark(e["t"], f"claimed by worker {pid} as attempt "
                                  f"{a}{note}", pid, "claim", a,
                                  "handed out twice" in note or id(e) in reused))
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
        out, the ack was turned away. `died`: the worker never got its ack in,
        so the job was claimed again or dead-lettered. `unlogged`: no ack in the
        log, yet the job was never handed out again nor dead: the ack reached
        the server and the worker was killed before it could log it.
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
        silent = unacked - refused
        again = {(job, a) for job, a in silent if job in self.dead or any(
            e["ev"] == "claim" and (e.get("attempt") or 0) > a
            for e in self.by_job.get(job, ()))}
        return {"died": len(again), "refused": len(unacked & refused),
                "unlogged": len(silent - again)}

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
