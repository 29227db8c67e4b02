"""Real processes on a learner's heartbeat module: long jobs, short leases, SIGSTOP.

The module (assignment 3's `heartbeat.py`) is a whole queue (it re-exports the
reference queue) with the learner's `extend` and
`run_with_heartbeat(r, queue, job_id, attempt, lease_s, work) -> bool`.
A trusted harness: under the grader (EO_LEARNER_PREFIX set) it never imports
the module; the learner's functions run in a host process and the work and the
refusing queue they are handed are stand-ins there (`handson.infra.remote_module`).
Runs under the sandbox's supervisor:

    python -m autograder.judges.heartbeat_trial heartbeat.py REDIS_URL --json

The trials, each judged from what the judge's side of it saw:

- long_jobs: jobs of 3 s on a lease of 0.6 s, two workers, a reaper every
  50 ms: with the heartbeat no job is reaped, none is claimed twice, each
  effect happens once and each ack succeeds.
- frozen: a worker is frozen with SIGSTOP past its lease while it works; the
  job is reaped and done by a second worker (on the long jobs' lease, run
  again if it lost it); the first is resumed. It must stop on its own
  (run_with_heartbeat returns False), its ack is refused, and the job's effect
  happens once.
- stops: run_with_heartbeat against a queue whose extend starts answering
  False must stop the work and return False within a few heartbeats, and
  leave no thread running.
- cadence: run_with_heartbeat on a 0.6 s lease and 1.8 s of work, against a
  queue whose extend says yes and notes when each call came: the gaps between
  the learner's own beats, less the longest any one thread of ours or of the
  learner's host waited for a CPU in that gap (the machine's doing), must be at
  most half a lease (the notebook's lease_s / 3, so two beats can be lost);
  no gap may reach a whole lease.
- final_check: the lease is lost just as the work returns (a worker frozen
  after its last heartbeat): run_with_heartbeat must ask once more and return
  False, as the notebook says ("True only if ... the lease is still yours").
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import os
import signal
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from pathlib import Path

from autograder.isolation import confine
from autograder.isolation.cgroup import Cgroup
from handson.faults.server_clock import ServerClock
from handson.infra import learner_host, remote_module, warm_start
from handson.infra.schedstat import ThreadWaits, Waits
from handson.queues.contract import load_queue
from handson.redis_server import connect

LEASE_S = 0.2
# long_jobs: five leases of work, as in the others, on a lease a loaded machine
# keeps. On 0.2 s a correct heartbeat lost a lease in a class graded beside the
# suite: a beat held 0.14 s is too late there, 0.4 s here.
LONG_LEASE_S = 0.6
WORK_S = 3.0
LONG_JOBS = 4
FREEZE_S = 1.0                    # five leases
FROZEN_WORK_S = 2.0               # still working when it wakes up
FINAL_RUNS = 3
CADENCE_WORK_S = 3 * LONG_LEASE_S   # a beat once a lease still leaves two gaps
# The cadence's work asks less often: a beat waits at most this long to be
# timed here, a tenth of the margin between lease_s / 3 and the rule's half.
CADENCE_TICK_S = 0.03
CADENCE_RUNS = 3                    # a run a correct beat fails is run again
NO_POLL_S = 3600.0
TICK_S = 0.01                     # one step of the stand-in work
# The CPU a run's learner processes may use, on average over a long_jobs run,
# and still have the machine's load excuse a lost lease: two correct hosts
# beating use a few hundredths of one CPU.
LEARNER_SHARE = 0.25


def _log(path: Path, **event) -> None:
    event.setdefault("t", time.monotonic())
    with open(path, "a") as fh:
        fh.write(json.dumps(event) + "\n")


def _events(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


def worker(module: str, url: str, db: str, events: Path, max_jobs: int,
           idle_s: float, work_s: float, lease_s: float = LEASE_S) -> None:
    """Claim, run with the learner's heartbeat, commit the effect, ack."""
    q = load_queue(module)
    r = connect(url)
    con = sqlite3.connect(db, timeout=30, isolation_level=None)
    pid = os.getpid()
    done, idle_since = 0, time.monotonic()
    while done < max_jobs and time.monotonic() - idle_since < idle_s:
        job = q.claim(r, lease_s)
        if job is None:
            time.sleep(0.02)
            continue
        job_id, _, attempt = job
        _log(events, ev="claim", pid=pid, job=job_id, attempt=attempt)

        work = Work(work_s)
        held, error = _heartbeat(q, r, job_id, attempt, None, work, lease_s)
        if work.stopped_at is not None:
            _log(events, ev="stopped", pid=pid, job=job_id, attempt=attempt,
                 t=work.stopped_at)
        if error:
            _log(events, ev="error", pid=pid, job=job_id, attempt=attempt, error=error)
            held = False
        _log(events, ev="result", pid=pid, job=job_id, attempt=attempt,
             held=bool(held))
        if held:
            con.execute("INSERT INTO effects VALUES (?, ?, ?)", (job_id, attempt, pid))
        acked = bool(q.ack(r, job_id, attempt))
        _log(events, ev="ack", pid=pid, job=job_id, attempt=attempt, ok=acked,
             after_abandon=not held)
        done += 1
        idle_since = time.monotonic()
    _log(events, ev="exit", pid=pid)


class Work:
    """The work a heartbeat guards, timed and counted here: the learner's
    process only asks for each step and says whether it was told to stop.
    Counted in steps, not by the clock, so a worker frozen with SIGSTOP (this
    process with it) has as much work left when it wakes as when it froze."""

    def __init__(self, seconds: float, tick: float = TICK_S):
        self.tick = tick
        self.left = max(1, round(seconds / tick))
        self.stopped_at: float | None = None
        self.ended_at: float | None = None

    def step(self, stopped: bool) -> bool:
        if stopped:
            self.stopped_at = self.stopped_at or time.monotonic()
            return False
        if self.left <= 0:
            self.ended_at = self.ended_at or time.monotonic()
            return False
        time.sleep(self.tick)
        self.left -= 1
        return True


class Granting:
    """A queue whose extend always says yes and notes when each call came:
    the learner's cadence, timed here, where no learner code runs. `mark` is
    called at each (the threads' CPU waits read there, not polled)."""

    def __init__(self, mark=lambda t: None):
        self.times: list[float] = []
        self.mark = mark

    def extend(self) -> bool:
        self.times.append(time.monotonic())
        self.mark(self.times[-1])
        return True


class Refusing:
    """A queue whose extend says yes `grant` times, then no; counted here."""

    def __init__(self, grant: int):
        self.grant, self.calls = grant, 0

    def extend(self) -> bool:
        self.calls += 1
        return self.calls <= self.grant


class LostAtTheEnd:
    """A queue whose extend says yes while its work runs, no after, and that
    work: it ends just after a heartbeat was granted (or after `seconds`
    without one), and the lease is gone as it ends. The next heartbeat is a
    whole interval away, so only a check made after the work returns sees the
    loss; a beat landing in between would hide a missing check."""

    def __init__(self, seconds: float):
        self.until = time.monotonic() + seconds
        self.done, self.beat = False, False
        self.during = self.after = 0

    def extend(self) -> bool:
        if self.done:
            self.after += 1
            return False
        self.during += 1
        self.beat = True
        return True

    def step(self, stopped: bool) -> bool:
        if self.beat or time.monotonic() >= self.until:
            self.done = True
            return False
        time.sleep(TICK_S)
        return True


def _heartbeat(q, r, job_id: str, attempt: int, queue, work,
               lease_s: float = LEASE_S):
    """run_with_heartbeat on the judge's stand-ins: `queue` None (the learner's
    module) or a double with extend(), `work` one with step(stopped). In a host
    the learner's process gets proxies that call back here, so each count the
    judge reads stays in this process. -> (held, error)"""
    remote = isinstance(q, remote_module.RemoteModule)

    def made(kind: str, judge, method: str):
        if remote:
            return remote_module.Local(kind, caller=remote_module.Caller(
                judge, methods=(method,)))
        return learner_host.standin(kind, caller=judge)[0]

    queue = q if queue is None else made("queue_double", queue, "extend")
    try:
        held = q.run_with_heartbeat(r, queue, job_id, attempt, lease_s,
                                    made("work", work, "step"))
        error = ""
    except Exception as err:  # noqa: BLE001 - the learner's code
        held, error = None, f"{type(err).__name__}: {err}"
    return held, error


class _Worker:
    """A trial worker and where its output goes (stdout and stderr)."""

    def __init__(self, proc, log: Path):
        self.proc, self.log, self.pid = proc, log, proc.pid

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log.read_text(errors="replace").strip()[-400:]
        return ""


# The workers are forks of one warm-start server per trial process: as fresh
# interpreters, a grade's four spent about 1.5 s of CPU on the same imports.
_STARTER: list[warm_start.Starter] = []
_LOGS = itertools.count()
# A worker runs this module: imported once, with all it imports.
_PRELOAD = (__spec__.name,)


def _spawn(module: str, url: str, db: str, events: Path, max_jobs: int,
           idle_s: float, work_s: float, lease_s: float = LEASE_S) -> _Worker:
    """A worker in a process group of its own (SIGSTOP of the group reaches its
    host, which joins it: the same session as our server of hosts, which the
    worker uses)."""
    args = ["--worker", module, url, "--db", db, "--events", str(events),
            "--max-jobs", str(max_jobs), "--idle-s", str(idle_s),
            "--work-s", str(work_s), "--lease-s", str(lease_s)]
    log = events.with_name(f"{events.stem}-worker-{next(_LOGS)}.log")
    env = dict(os.environ)
    if not _STARTER or _STARTER[0].gone:
        _STARTER[:] = [warm_start.Starter("heartbeat-trial", preload=_PRELOAD)]
    hosts = remote_module.host_fds(env)
    try:
        proc = _STARTER[0].start(__spec__.name, args, env, str(log), hosts, pgid=0)
    finally:
        for fd in hosts.values():
            os.close(fd)
    if proc is None:            # its server is gone: a fresh interpreter
        env.pop(remote_module.SERVER_ENV, None)
        with open(log, "ab") as out:
            proc = subprocess.Popen([sys.executable, "-m", __spec__.name, *args],
                                    env=env, stdin=subprocess.DEVNULL, stdout=out,
                                    stderr=out, start_new_session=True)
    return _Worker(proc, log)


def _wait(workers: list[_Worker], timeout: float) -> list[str]:
    """Wait for the workers; kill any that overstay. Their output's tails."""
    deadline = time.monotonic() + timeout
    tails = []
    for w in workers:
        try:
            w.proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            w.proc.kill()
            w.proc.wait()
            tails.append(f"a worker was still running after {timeout:g} s (killed)")
        tail = w.tail()
        if w.proc.returncode not in (0, -signal.SIGKILL) and tail:
            tails.append(tail)
    return tails


def _setup(tmp: Path, name: str) -> tuple[str, Path]:
    """A fresh effects table and event log: a trial run again starts empty."""
    db = str(tmp / f"{name}.db")
    for old in (Path(db), tmp / f"{name}.jsonl"):
        old.unlink(missing_ok=True)
    con = sqlite3.connect(db)
    con.execute("CREATE TABLE effects (job_id TEXT, attempt INT, pid INT)")
    con.commit()
    con.close()
    return db, tmp / f"{name}.jsonl"


def _effects(db: str) -> dict[str, list]:
    out: dict[str, list] = {}
    con = sqlite3.connect(db)
    for job_id, attempt, pid in con.execute("SELECT * FROM effects"):
        out.setdefault(job_id, []).append((attempt, pid))
    con.close()
    return out


class _Reaper(threading.Thread):
    def __init__(self, q, r):
        super().__init__(daemon=True)
        self.q, self.r, self.requeued, self.dead = q, r, 0, 0
        self.halt = threading.Event()
        self.clock = ServerClock()
        self.stall_s = 0.0         # the longest this thread was held past its tick
        self.took: list[float] = []        # when a reap took a lease back

    def run(self) -> None:
        last = time.monotonic()
        while not self.halt.wait(0.05):
            now = time.monotonic()
            self.stall_s, last = max(self.stall_s, now - last - 0.05), now
            self.clock.sample(self.r)
            with contextlib.suppress(Exception):
                a, b = self.q.reap(self.r, 3)
                self.requeued += a
                self.dead += b
                if a or b:
                    self.took.append(time.monotonic())


def learner_cpu() -> tuple[int, int] | None:
    """(CPU used, time throttled at the cap) so far by the learner processes
    of this grading run (its cgroup), in ns; None outside the grader."""
    prefix = remote_module.prefix_from_env()
    workdir = remote_module.confined_workdir(prefix) if prefix else None
    if workdir is None:
        return None
    return Cgroup(confine.run_id(workdir)).cpu_ns()


def long_jobs(module: str, url: str, tmp: Path) -> dict:
    q, r = load_queue(module), connect(url)
    r.flushdb()
    db, events = _setup(tmp, "long")
    for i in range(LONG_JOBS):
        q.enqueue(r, {"doc_id": i}, f"long-{i}")
    reaper = _Reaper(q, r)
    reaper.start()
    cpu_before, started = learner_cpu(), time.monotonic()
    with Waits() as waits:
        procs = [_spawn(module, url, db, events, LONG_JOBS, 3.0, WORK_S, LONG_LEASE_S)
                 for _ in range(2)]
        errors = _wait(procs, 60)
        reaper.halt.set()
        reaper.join(5)
    cpu_after, elapsed = learner_cpu(), time.monotonic() - started
    # The workers (and their hosts) waiting for a CPU in the lease before a
    # reap took it back: the machine held the heartbeat, not the module. The
    # kernel counts a wait when the thread next runs, so a lease on is looked at.
    held = max((waits.between(t - LONG_LEASE_S, t + LONG_LEASE_S)
                for t in reaper.took),
               default=0.0)
    ev = _events(events)
    claims = [(e["job"], e["attempt"]) for e in ev if e["ev"] == "claim"]
    return {"claims": claims, "requeued": reaper.requeued, "dead": reaper.dead,
            "effects": _effects(db),
            "results": [(e["job"], e["held"]) for e in ev if e["ev"] == "result"],
            "acks": [(e["job"], e["ok"]) for e in ev if e["ev"] == "ack"],
            "errors": [e["error"] for e in ev if e["ev"] == "error"] + errors,
            "jobs": LONG_JOBS,
            "clock_gained_ms": round(reaper.clock.gained_ns() / 1e6, 1),
            "stall_ms": round(reaper.stall_s * 1000, 1),
            "held_ms": round(held * 1000, 1), "run_ms": round(elapsed * 1000),
            **_learner_load(cpu_before, cpu_after)}


def _learner_load(before, after) -> dict:
    if before is None or after is None:
        return {}
    return {"learner_cpu_ms": round((after[0] - before[0]) / 1e6, 1),
            "learner_throttled_ms": round((after[1] - before[1]) / 1e6, 1)}


def own_load(run: dict) -> str:
    """The load the learner's own processes made in the run ('' if none to
    speak of): a machine they loaded excuses nothing."""
    cpu_ms = run.get("learner_cpu_ms", 0)
    if run.get("learner_throttled_ms", 0) > 0:
        return (f"your processes used {cpu_ms:.0f} ms of CPU, up to the run's cap "
                f"(held there {run['learner_throttled_ms']:.0f} ms)")
    if cpu_ms > LEARNER_SHARE * run.get("run_ms", 0):
        return (f"your processes used {cpu_ms:.0f} ms of CPU in "
                f"{run['run_ms']} ms")
    return ""


def _set_aside(run: dict) -> str:
    """Why a long_jobs run says nothing of the learner's heartbeat ('' if it does).

    The server's clock gained a heartbeat's worth (its leases end early), or a
    lease was lost while the machine held this harness for a heartbeat's worth
    (it may have held the beating thread longer): the lease ran out through no
    fault of theirs.
    """
    if own_load(run):
        return ""
    if run.get("clock_gained_ms", 0) >= LONG_LEASE_S * 1000 / 3:
        return f"the Redis server's clock gained {run['clock_gained_ms']:.0f} ms"
    if run.get("requeued") and run.get("stall_ms", 0) >= LONG_LEASE_S * 1000 / 3:
        return f"the machine held the grader for {run['stall_ms']:.0f} ms"
    return _held(run)


def _held(run: dict) -> str:
    """The kernel's word that the machine, not the learner's own processes,
    held the workers as a lease was lost, or held the reaper so long that it
    could not have seen a lease run out."""
    if own_load(run):
        return ""
    if run.get("requeued") and run.get("held_ms", 0) >= LONG_LEASE_S * 1000 / 3:
        return (f"the workers waited {run['held_ms']:.0f} ms for a CPU in the "
                "lease before a reap took it back")
    if run.get("stall_ms", 0) >= (WORK_S - LONG_LEASE_S) * 1000:
        return (f"the machine held the grader's reaper for {run['stall_ms']:.0f} "
                "ms: it could not have seen a lease run out")
    return ""


def _long_jobs_until_a_fair_run(run, tries: int = 3) -> dict:
    """long_jobs up to `tries` times, until a run is not set aside. The last
    is judged, unless the kernel counts the workers waiting for a CPU as its
    lease was lost (`excused`): a module that stops or slows itself is judged."""
    aside: list[str] = []
    for i in range(tries):
        got = run()
        why = _set_aside(got)
        if not why:
            break
        if i == tries - 1:
            if _held(got):
                got["excused"] = _held(got)
            break
        aside.append(why)
    if aside:
        got["rerun"] = (f"{len(aside)} earlier run(s) set aside: "
                        + "; ".join(aside))
    return got


def frozen(module: str, url: str, tmp: Path) -> dict:
    q, r = load_queue(module), connect(url)
    r.flushdb()
    db, events = _setup(tmp, "frozen")
    q.enqueue(r, {"doc_id": 1}, "frozen-job")
    reaper = _Reaper(q, r)
    reaper.start()
    a = _spawn(module, url, db, events, 1, 5.0, FROZEN_WORK_S)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and not any(
            e["ev"] == "claim" for e in _events(events)):
        time.sleep(0.02)
    time.sleep(0.1)
    os.killpg(a.pid, signal.SIGSTOP)
    frozen_at = time.monotonic()
    b = _spawn(module, url, db, events, 1, 5.0, FROZEN_WORK_S, LONG_LEASE_S)
    time.sleep(FREEZE_S)
    os.killpg(a.pid, signal.SIGCONT)
    resumed_at = time.monotonic()
    errors = _wait([a, b], 30)
    reaper.halt.set()
    reaper.join(5)
    ev = _events(events)
    first = [e for e in ev if e.get("pid") == a.pid]
    return {"frozen_pid": a.pid, "frozen_at": frozen_at, "resumed_at": resumed_at,
            "first": first, "second": [e for e in ev if e.get("pid") == b.pid],
            "effects": _effects(db), "requeued": reaper.requeued,
            "errors": [e["error"] for e in ev if e["ev"] == "error"] + errors}


def _frozen_until_a_fair_run(run, tries: int = 3) -> dict:
    """The frozen trial up to `tries` times, while the second worker lost its
    own lease: then the job went undone for a reason the trial is not about
    (long_jobs judges keeping a lease). The last run is judged as it is."""
    aside = 0
    for i in range(tries):
        got = run()
        lost = any(e["ev"] == "result" and not e["held"] for e in got["second"])
        if not lost or i == tries - 1:
            break
        aside += 1
    if aside:
        got["rerun"] = (f"{aside} earlier run(s) set aside: the second worker "
                        "lost its own lease")
    return got


def _threads(q) -> int:
    if isinstance(q, remote_module.RemoteModule):
        return q.threads()
    return remote_module.os_threads(os.getpid())


def stops(module: str, url: str, q=None) -> dict:
    return _stops(q or load_queue(module), connect(url))


def _stops(q, r) -> dict:
    """A queue whose extend says yes twice, then no, on a work of 3 s."""
    before = _threads(q)
    start = time.monotonic()
    queue, work = Refusing(grant=2), Work(3.0)
    held, error = _heartbeat(q, r, "job-x", 1, queue, work)
    elapsed = time.monotonic() - start
    time.sleep(0.3)
    return {"held": held, "elapsed": elapsed,
            "stopped_after": (None if work.stopped_at is None
                              else work.stopped_at - start),
            "extend_calls": queue.calls,
            "threads_left": _threads(q) - before, "error": error}


def cadence(module: str, url: str, q=None) -> dict:
    """The learner's beats timed, up to CADENCE_RUNS times while a run is off
    the rule (a correct beat off it only on a machine that held it): the last
    run is judged. `q`: the module already loaded, whose host it reuses."""
    q, r = q or load_queue(module), connect(url)
    for run in range(1, CADENCE_RUNS + 1):
        got = _cadence_once(q, r)
        got.update(run=run, runs=CADENCE_RUNS)
        if got["error"] or not cadence_problem(got):
            break
    return got


def _late(q, times: list[float], returned: float) -> int:
    """Beats after run_with_heartbeat returned: over the pipe, refused there."""
    if isinstance(q, remote_module.RemoteModule):
        return q.late_callbacks()
    return sum(t > returned for t in times)


def _cadence_once(q, r) -> dict:
    before, late_before = _threads(q), _late(q, [], 0.0)
    # Read at the start, at each beat and at the end only: no sampler to pay.
    with ThreadWaits(tick=NO_POLL_S) as waits:
        queue = Granting(waits.sample)
        work = Work(CADENCE_WORK_S, CADENCE_TICK_S)
        start = time.monotonic()
        held, error = _heartbeat(q, r, "job-c", 1, queue, work, LONG_LEASE_S)
        end = work.ended_at or work.stopped_at or time.monotonic()
        returned = time.monotonic()
        beats = [t for t in queue.times if t <= end]
        marks = [start, *beats, end]
        # (gap, gap less the longest one thread waited for a CPU in it)
        gaps = [(round(b - a, 3), round(b - a - waits.between(a, b), 3))
                for a, b in zip(marks, marks[1:], strict=False)]
    time.sleep(LONG_LEASE_S)        # time for a beat left running to show
    return {"gaps": gaps[:-1], "tail": gaps[-1], "beats": len(beats),
            "after_return": _late(q, queue.times, returned) - late_before,
            "threads_left": _threads(q) - before,
            "lease": LONG_LEASE_S, "work": CADENCE_WORK_S, "held": held,
            "error": error}


def _bursts_merged(gaps: list, close: float) -> list:
    """Gaps with beats closer than `close` taken as one beat: two beats sent
    back to back every so often must not halve the median gap."""
    out, carry = [], (0.0, 0.0)
    for raw, own in gaps:
        raw, own = raw + carry[0], own + carry[1]
        if raw < close:
            carry = (raw, own)
            continue
        out.append((raw, own))
        carry = (0.0, 0.0)
    return out


def cadence_problem(run: dict) -> str:
    """What is wrong with the beats' cadence ('' if nothing). Whole gaps (from
    the call or a beat to the next beat) are judged by their median, so one beat
    held now and then is no fault; the gap before the work ended, too, must
    stay under a lease."""
    lease, gaps = run["lease"], _bursts_merged(run["gaps"], run["lease"] / 10)
    if not gaps:
        return (f"extend was never called in {run['work']:g} s of work on a "
                f"{lease:g} s lease")
    own = sorted(g[1] for g in gaps)
    median = own[len(own) // 2] if len(own) % 2 else (
        own[len(own) // 2 - 1] + own[len(own) // 2]) / 2
    if median > lease / 2:
        return (f"the beats came {median:.2f} s apart (median of {len(own)} "
                f"gaps), past half the {lease:g} s lease")
    longest = max(g[1] for g in [*gaps, run["tail"]])
    if longest >= lease:
        return f"no beat for {longest:.2f} s, a whole {lease:g} s lease"
    if run["after_return"] or run["threads_left"] > 0:
        return (f"{run['lease']:g} s after run_with_heartbeat returned, "
                f"{run['threads_left']} more thread(s) ran and extend had been "
                f"called {run['after_return']} more time(s): the heartbeat "
                "outlived its job (end it and join it before returning)")
    return ""


def final_check(module: str, url: str, q=None) -> dict:
    """The lease lost as the work ends, FINAL_RUNS times: a module that does not
    check once more says True in each (a heartbeat landing just as the work
    ended could hide that once, never every time); judged on the first wrong
    answer, or the last run."""
    q, r = q or load_queue(module), connect(url)
    for run in range(1, FINAL_RUNS + 1):
        pair = LostAtTheEnd(LEASE_S)
        held, error = _heartbeat(q, r, "job-f", 1, pair, pair)
        got = {"held": held, "extends_during": pair.during,
               "extends_after": pair.after, "error": error,
               "run": run, "runs": FINAL_RUNS}
        if error or held is not False:
            break
    return got


def trial(module: str, url: str) -> dict:
    out: dict = {}
    loaded: list = []

    def q():
        """The module's host, shared by the trials run in this process: each
        host costs a process and an import."""
        if not loaded:
            loaded.append(load_queue(module))
        return loaded[0]

    with tempfile.TemporaryDirectory(prefix="eo-hb-") as tmp:
        for name, fn in (("stops", lambda: stops(module, url, q())),
                         ("final_check", lambda: final_check(module, url, q())),
                         ("cadence", lambda: cadence(module, url, q())),
                         ("long_jobs", lambda: _long_jobs_until_a_fair_run(
                             lambda: long_jobs(module, url, Path(tmp)))),
                         ("frozen", lambda: _frozen_until_a_fair_run(
                             lambda: frozen(module, url, Path(tmp))))):
            if "NotImplementedError" in out.get("stops", {}).get("error", ""):
                out[name] = {"crashed": "skipped: run_with_heartbeat still raises "
                                        "NotImplementedError"}
                continue
            try:
                out[name] = fn()
            except Exception:  # noqa: BLE001 - reported, never a crash
                out[name] = {"crashed": traceback.format_exc()[-600:]}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("module")
    p.add_argument("url")
    p.add_argument("--json", action="store_true")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--db", help=argparse.SUPPRESS)
    p.add_argument("--events", help=argparse.SUPPRESS)
    p.add_argument("--max-jobs", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--idle-s", type=float, default=3.0, help=argparse.SUPPRESS)
    p.add_argument("--work-s", type=float, default=WORK_S, help=argparse.SUPPRESS)
    p.add_argument("--lease-s", type=float, default=LEASE_S, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        worker(args.module, args.url, args.db, Path(args.events), args.max_jobs,
               args.idle_s, args.work_s, args.lease_s)
        return 0
    print(json.dumps(trial(args.module, args.url), indent=None if args.json else 2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
