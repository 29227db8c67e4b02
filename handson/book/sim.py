"""A seeded, tick-by-tick model of a worker pool draining a queue.

This is the reference model behind the chapter "Queues and logs": the build
uses it for the lag figures and to check the numbers the prose quotes, and
`book/_static/queue-sim.js` is a line-for-line port of it that runs in the
reader's browser. Both use only integer ticks, a 32-bit PRNG (mulberry32) and
IEEE-exact arithmetic (+, *, /, floor, compare), so the same seed and the same
scenario give the same trace in both languages; a test compares them tick by
tick in headless Chromium.

One tick is 0.1 s. Arrivals are Bernoulli in ten 10 ms slots per tick (a
close stand-in for Poisson). A job takes 3 to 7 ticks (0.5 s on average, so
one worker does about 2 jobs/s). A claimed job carries a 3 s lease; a worker
killed with -9 leaves its job "leased, owner dead" until the lease runs out,
then the job goes back to the HEAD of the queue as a retry. With ack-before-
work the broker forgot the job at the claim, so the kill loses it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

TICK_S = 0.1
SLOTS_PER_TICK = 10
JOB_TICKS_MIN = 3
JOB_TICKS_SPAN = 5            # 3..7 ticks, mean 5 ticks = 0.5 s
LEASE_TICKS = 30              # 3 s
RESTART_TICKS = 10            # a supervisor restarts a killed worker after 1 s
SPIKE_JOBS = 60
_M32 = 0xFFFFFFFF


def mulberry32(seed: int):
    """The same 32-bit generator as the browser's copy: floats in [0, 1)."""
    a = seed & _M32

    def draw() -> float:
        nonlocal a
        a = (a + 0x6D2B79F5) & _M32
        t = ((a ^ (a >> 15)) * (1 | a)) & _M32
        t = ((t + (((t ^ (t >> 7)) * (61 | t)) & _M32)) & _M32) ^ t
        return ((t ^ (t >> 14)) & _M32) / 4294967296

    return draw


@dataclass
class Job:
    id: int
    retry: bool = False
    acked: bool = False       # True: the broker already forgot it (ack before work)
    deadline: int = 0         # tick at which its lease runs out


@dataclass
class Worker:
    state: str = "idle"       # idle | busy | dead
    job: Job | None = None
    left: int = 0             # ticks of work left, or ticks until restarted
    retiring: bool = False    # finish the current job, then leave the pool


@dataclass
class QueueSim:
    """The pool, the queue, the orphaned leases and the counters."""

    seed: int = 1
    arrivals: float = 6.0
    workers: int = 4
    ack_before_work: bool = False
    tick: int = 0
    queue: list = field(default_factory=list)
    orphans: list = field(default_factory=list)
    pool: list = field(default_factory=list)
    done: int = 0
    redelivered: int = 0
    lost: int = 0
    arrived: int = 0
    kills: int = 0
    history: list = field(default_factory=list)   # waiting jobs after each tick

    def __post_init__(self):
        self.rng = mulberry32(self.seed)
        self.next_id = 1
        n, self.workers = self.workers, 0
        self.set_workers(n)

    # -- controls (the widget's buttons and sliders) -------------------------
    def set_arrivals(self, rate: float) -> None:
        self.arrivals = float(rate)

    def set_ack_before_work(self, on: bool) -> None:
        self.ack_before_work = bool(on)

    def set_workers(self, n: int) -> None:
        """Grow with idle workers; shrink from the end, busy ones finish first."""
        n = max(0, int(n))
        active = [w for w in self.pool if not w.retiring]
        for w in self.pool:
            if len(active) >= n:
                break
            if w.retiring:
                w.retiring = False
                active.append(w)
        while len(active) < n:
            w = Worker()
            self.pool.append(w)
            active.append(w)
        extra = len(active) - n
        for i in range(len(self.pool) - 1, -1, -1):
            if extra <= 0:
                break
            w = self.pool[i]
            if w.retiring:
                continue
            extra -= 1
            if w.state == "busy":
                w.retiring = True
            else:
                self.pool.pop(i)
        self.workers = n

    def spike(self, n: int = SPIKE_JOBS) -> None:
        for _ in range(int(n)):
            self._arrive()

    def kill_busy(self) -> int | None:
        """kill -9 one busy worker (chosen by the seeded PRNG); its index or None."""
        busy = [i for i, w in enumerate(self.pool) if w.state == "busy"]
        if not busy:
            return None
        i = busy[math.floor(self.rng() * len(busy))]
        w = self.pool[i]
        job, w.job, w.state, w.left = w.job, None, "dead", RESTART_TICKS
        self.kills += 1
        if job.acked:
            self.lost += 1
        else:
            self.orphans.append(job)
        return i

    # -- one tick ------------------------------------------------------------
    def _arrive(self) -> None:
        self.queue.append(Job(self.next_id))
        self.next_id += 1
        self.arrived += 1

    def step(self) -> None:
        self.tick += 1
        p = self.arrivals / 100
        for _ in range(SLOTS_PER_TICK):
            if self.rng() < p:
                self._arrive()
        expired = [j for j in self.orphans if j.deadline <= self.tick]
        if expired:
            self.orphans = [j for j in self.orphans if j.deadline > self.tick]
            for j in expired:
                j.retry = True
            self.queue[:0] = expired
            self.redelivered += len(expired)
        for w in self.pool:
            if w.state == "dead":
                w.left -= 1
                if w.left == 0:
                    w.state = "idle"
            elif w.state == "busy":
                w.left -= 1
                if w.left == 0:
                    self.done += 1
                    w.state, w.job = "idle", None
        self.pool = [w for w in self.pool if not (w.retiring and w.state != "busy")]
        for w in self.pool:
            if w.state == "idle" and self.queue:
                job = self.queue.pop(0)
                job.acked = self.ack_before_work
                job.deadline = self.tick + LEASE_TICKS
                w.state, w.job = "busy", job
                w.left = JOB_TICKS_MIN + math.floor(self.rng() * JOB_TICKS_SPAN)
        self.history.append(len(self.queue))

    def run(self, seconds: float) -> None:
        for _ in range(round(seconds / TICK_S)):
            self.step()

    # -- what the tests and the widget both read -----------------------------
    def busy(self) -> int:
        return sum(w.state == "busy" for w in self.pool)

    def row(self) -> list[int]:
        """One tick of the trace the browser port must reproduce exactly."""
        return [self.tick, len(self.queue), self.busy(), len(self.orphans),
                self.done, self.redelivered, self.lost, self.arrived]

    def capacity(self) -> float:
        """Jobs per second the pool can finish: workers / mean job time."""
        mean_ticks = JOB_TICKS_MIN + (JOB_TICKS_SPAN - 1) / 2
        return pool_capacity(self.workers, mean_ticks * TICK_S)


def run_scenario(scenario: dict) -> list[list[int]]:
    """Play a scripted scenario; the same JSON drives the browser port.

    scenario = {"seed", "arrivals", "workers", "ack_before_work", "ticks",
                "events": [[tick, action, arg], ...]} where an event fires
    before the step that makes `tick`; actions: spike, kill, workers,
    arrivals, ack_before_work.
    """
    sim = QueueSim(seed=scenario["seed"], arrivals=scenario["arrivals"],
                   workers=scenario["workers"],
                   ack_before_work=scenario.get("ack_before_work", False))
    events: dict[int, list] = {}
    for ev in scenario.get("events", []):
        events.setdefault(int(ev[0]), []).append(ev)
    trace = []
    for t in range(1, scenario["ticks"] + 1):
        for _, action, *arg in events.get(t, []):
            apply_event(sim, action, arg[0] if arg else None)
        sim.step()
        trace.append(sim.row())
    return trace


def apply_event(sim: QueueSim, action: str, arg) -> None:
    if action == "spike":
        sim.spike(arg if arg is not None else SPIKE_JOBS)
    elif action == "kill":
        sim.kill_busy()
    elif action == "workers":
        sim.set_workers(arg)
    elif action == "arrivals":
        sim.set_arrivals(arg)
    elif action == "ack_before_work":
        sim.set_ack_before_work(arg)
    else:
        raise ValueError(f"unknown scenario action {action!r}")


SPIKE_SEEDS = range(1, 21)     # the runs every page that quotes the drain averages


def spike_drains(seeds: range = SPIKE_SEEDS) -> list[float]:
    """The spike's drain time in each seeded run: one source for every page."""
    return [spike_drain_s(seed) for seed in seeds]


def spike_drain_s(seed: int, workers: int = 4, arrivals: float = 6.0,
                  spike: int = SPIKE_JOBS, warmup_s: float = 30.0,
                  limit_s: float = 600.0) -> float:
    """Seconds from a spike until the queue is back to its pre-spike length."""
    sim = QueueSim(seed=seed, arrivals=arrivals, workers=workers)
    sim.run(warmup_s)
    before = len(sim.queue)
    sim.spike(spike)
    start = sim.tick
    while sim.tick - start < round(limit_s / TICK_S):
        sim.step()
        if len(sim.queue) <= before:
            return (sim.tick - start) * TICK_S
    raise RuntimeError(f"the spike did not drain in {limit_s} s "
                       f"({workers} workers, {arrivals}/s)")


def pool_capacity(workers: int, s_per_job: float) -> float:
    """Little's Law for a pool: each worker finishes 1 / s_per_job jobs a second."""
    if s_per_job <= 0:
        raise ValueError("s_per_job must be positive")
    return workers / s_per_job


def predicted_drain_s(backlog: float, capacity: float, arrivals: float) -> float:
    """B / (capacity - arrivals): how long a backlog takes to clear."""
    if capacity <= arrivals:
        return math.inf
    return backlog / (capacity - arrivals)


def lag_series(seed: int, workers: int, arrivals: float, seconds: float,
               spike_at_s: float | None = None) -> tuple[list[float], list[int]]:
    """(times in s, waiting jobs) for one run: the lag shapes in the figure."""
    sim = QueueSim(seed=seed, arrivals=arrivals, workers=workers)
    for _ in range(round(seconds / TICK_S)):
        if spike_at_s is not None and sim.tick == round(spike_at_s / TICK_S):
            sim.spike()
        sim.step()
    return [i * TICK_S for i in range(1, len(sim.history) + 1)], sim.history


def scenario_json(scenario: dict) -> str:
    return json.dumps(scenario, sort_keys=True)
