"""The chaos run: real workers, real SIGKILL, then a verdict per invariant.

One engine for the lab's `chaos.py`, the book, the grader and the tests. It
enqueues documents through any module that meets the queue contract, runs
worker processes (each in its own process group) on it, kills and pauses them
on a seeded schedule (in seconds, or in claims so that a seed replays the same
schedule) and at named crash points, restarts them like a supervisor, stops the
chaos once the queue is mostly done or, with a fault quota, once the quota is
in (enqueueing more documents until it is; short of it, the run is unknown),
waits for the drain, and then judges.

This module is the run itself: `run`, and the supervisor loop that drives the
parts, each a module of its own: the settings (`config.py`), the processes
(`pool.py`), the faults (`inject.py`), the workers' logs (`logs.py`), the
judge of a run (`judge.py`, which lists the invariants) and its report
(`report.py`). Their public names are importable from here too.

The engine learns the queue's state only through the contract (enqueue, dead),
and takes dead() at its word only where the workers' logs back it.
Every process it starts is killed before `run` returns, also on an exception
or Ctrl-C; a run that does not finish in time is "unknown", never a pass.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import signal
import sqlite3
import tempfile
import threading
import time
from pathlib import Path

from handson import produce, redis_server, setup_db, verify
from handson.faults.config import ChaosConfig, replay_command
from handson.faults.inject import Faults, _fault_stats, _short_reason
from handson.faults.judge import INVARIANTS, Invariant, _Judge
from handson.faults.pool import TICK_S
from handson.faults.report import Report
from handson.queues.contract import ContractError, load_queue

# what the lab, the book and the grader import from here
__all__ = ["CHECK_S", "INVARIANTS", "ChaosConfig", "Report", "replay_command", "run"]

FAST_TICK_S = 0.003    # ... while a constructed fault waits for a claim
CHECK_S = 0.25         # how often the done count is read
QUIET_HELD = 10        # silence (in quiet_s) that ends a drain with jobs held
REAPLESS_LEASES = 8    # leases after the kills with no reap: none will come


class _Aborted(Exception):
    """The run cannot be judged; the message says why."""



class _Run(Faults):
    """One run's pool under faults, driven to its end: chaos, then the drain."""

    def __init__(self, cfg: ChaosConfig, url: str, workdir: Path, progress):
        super().__init__(cfg, url, workdir, progress)
        self.abnormal = 0
        self.chaos_s = 0.0              # how long the chaos phase lasted
        self.batch = None               # (thread, ids, errors) of more documents
        self.loop_from: dict[str, int] = {}     # undone job -> its claims then
        self.loop_t = 0.0                        # ... and when that was
        self.unreachable = ""           # why the quota could not be met, if known

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

    def dead_letters(self, queue, r) -> list[tuple]:
        """The DLQ: the queue's `dead()`, or with tx_effect the PostgreSQL
        queue's tables as the course's reader sees them (a job whose row is
        done is not dead, whatever the queue module says)."""
        if self.cfg.tx_effect:
            from handson.queues import pgq

            return pgq.dead_letters()
        return list(queue.dead(r))

    def _undone(self, ids: set[str], queue, r) -> set[str]:
        applied = {row[0] for row in self.effects(queue, r)[0]}
        dead = {d[0] for d in self.dead_letters(queue, r)}
        return ids - applied - dead

    def _looping(self, undone: set[str], now: float) -> tuple[int, int]:
        """(looping, silent): since the last job ended, no job has, and of the
        jobs left, `looping` were claimed loop_claims times each and `silent`
        (the rest) not once in quiet_s; (0, 0) while that is not so. Counted
        from the last end, a loaded machine's long good phase, in which a
        poison job loops already, does not end the run as the work runs out;
        and a job lost meanwhile (never claimed again) does not keep a loop
        going until the drain's time is up."""
        n = self.cfg.loop_claims or 2 * self.cfg.max_attempts
        claims = {j: len(self.tally.claims_of.get(j, ())) for j in undone}
        if undone != self.loop_from.keys():         # a job ended: count anew
            self.loop_from, self.loop_t = claims, now
            return 0, 0
        grown = [claims[j] - self.loop_from[j] for j in undone]
        looping = sum(1 for g in grown if g >= n)
        silent = sum(1 for g in grown if g == 0)
        if looping and looping + silent == len(grown) and (
                not silent or now - self.loop_t > self.cfg.quiet_s):
            return looping, silent
        return 0, 0

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

    def _unreachable(self, now: float, kills_met_at: float) -> bool:
        """The quota waits only for what needs a lease taken back (a reaper
        pause; zombies and reaps beside it), and none was ever taken back
        although the kills' quota was met REAPLESS_LEASES leases ago: jobs of
        killed workers never expire (acked as they were claimed, or lost).
        Waiting on to the cap changes nothing."""
        short = self.short_of_quota()
        if ("reaper_pauses" not in short
                or short.keys() - {"reaper_pauses", "reaps", "zombies"}
                or self.tally.reaped or not kills_met_at
                or now - kills_met_at < REAPLESS_LEASES * self.cfg.lease_s):
            return False
        self.unreachable = (f"no reap took a lease back in {now - kills_met_at:.0f} s "
                            f"after {len(self.kills)} kills of workers, so no "
                            "reaper could be paused mid-reap: were the killed "
                            "workers' jobs ever in flight?")
        return True

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
            pause_s = max(pause_s, 3 * cfg.lease_s)
        next_check = next_report = t0
        seen_claims, claimed_at, kills_met_at = -1, t0, 0.0
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
                    self.tally.retire(p.pid)
                    self._start_slot(slot)
            for i, p in enumerate(self.reapers):
                if p.poll() is not None:        # a crash point inside its reap
                    self.tally.retire(p.pid)
                    self._start_reaper(i)
            if self.abnormal >= max(3, 2 * cfg.workers) and done == 0:
                raise _Aborted("workers keep exiting on their own; their log "
                               f"ends with:\n{self._log_tail()}")
            if self.phase == "chaos":
                if (due["kill"] is not None and clock("kill", now) >= due["kill"]
                        and not 0 < cfg.max_kills <= len(self.kills)):
                    self.due = round(due["kill"], 3)
                    self._kill_slot(self._kill_victim())
                    # and every `workers` kills the first reaper too (no dice
                    # drawn: the workers' schedule stays the seed's)
                    if cfg.fault_reapers and len(self.kills) % cfg.workers == 0:
                        self._kill_reaper(0)
                    due["kill"] += gap(mean["kill"], rngs["kill"])
                # A zombie needs a worker left running to claim its job again.
                pause_due = (due["pause"] is not None
                             and clock("pause", now) >= due["pause"])
                if ((pause_due or self.owed_pauses)
                        and not 0 < cfg.max_pauses <= len(self.pauses)
                        and not (cfg.zombie_pauses
                                 and len(self.paused) + 1 >= cfg.workers)):
                    victim = self._pause_victim()
                    if victim is not None:         # else: at the next busy tick
                        self.due = round(due["pause"], 3)
                        self._pause_slot(victim, pause_s)
                        if pause_due:
                            due["pause"] += gap(mean["pause"], rngs["pause"])
                        else:
                            self.owed_pauses -= 1
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
                if not kills_met_at and "kills" not in self.short_of_quota():
                    kills_met_at = now
                if self.phase == "chaos" and cfg.quota and not self.short_of_quota():
                    stop_chaos = True           # quota in: the faults set the length
                elif self.phase == "chaos" and self.short_of_quota():
                    if self.tally.claims != seen_claims:
                        seen_claims, claimed_at = self.tally.claims, now
                    if self._unreachable(now, kills_met_at):
                        stop_chaos = True       # judged "unknown", and says why
                    elif now - t_chaos < cfg.quota_cap_s:
                        stop_chaos = False
                        # few jobs left, or none handed out for a lease while
                        # a worker had none (the rest lost: a queue that loses
                        # jobs still gets faults; workers all busy on long jobs
                        # are not a reason, or the backlog grows without end)
                        low = (total - done < max(cfg.workers, cfg.docs // 2)
                               or now - claimed_at > cfg.lease_s
                               and not self._all_busy())
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
                looping, silent = (self._looping(undone, now)
                                   if self.phase == "drain" else (0, 0))
                if looping:
                    n = cfg.loop_claims or 2 * cfg.max_attempts
                    return ("timeout", f"{looping} job(s) claimed {n} times each "
                            "since a job last ended, and never ended" + (
                                f"; {silent} more not claimed again in "
                                f"{cfg.quiet_s:g} s" if silent else ""), now - t0)
                if now - t0 > cfg.drain_timeout_s:
                    return ("timeout", f"not drained after {cfg.drain_timeout_s:g} s "
                            f"({done}/{total} done)", now - t0)
            if self.progress and now >= next_report:
                next_report = now + 1.0
                self.progress({"done": done, "total": total, "kills": len(self.kills),
                               "pauses": len(self.pauses),
                               "elapsed_s": round(now - t0, 1), "phase": self.phase})
            time.sleep(FAST_TICK_S if self.zombies or self.reaper_stop else TICK_S)


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
                 "unacked": {"died": 0, "refused": 0, "unlogged": 0},
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
            dead = run_.dead_letters(queue, r)
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
            if run_.unreachable:
                reason += "; " + run_.unreachable
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


def _unknown(cfg: ChaosConfig, reason: str, stats: dict, run_: _Run | None = None
             ) -> Report:
    invs = {name: Invariant(name, None, 0) for name in INVARIANTS}
    pids = [p.pid for p in run_.started] if run_ else []
    stats = dict(stats, **({"worker_errors": run_.abnormal} if run_ else {}))
    return Report(cfg, "unknown", reason, invs, stats, replay_command(cfg), pids)
