"""Rates of no-op jobs: the reference queue against RQ, Celery, huey, dramatiq.

A shared machine does not keep one speed. On a small virtual machine the same
loop runs a third faster or slower from one second to the next, as the host
schedules its CPUs, so two rates measured one after the other compare two
different machines. Here the systems take turns instead. Every system's workers
(separate processes, one job at a time each) start on loaded queues and are
paused with SIGSTOP; then each system in turn runs (SIGCONT) for one short
window, and the jobs that left its queue in the window give its rate. A round
gives every other system one window and the reference queue one between every
two, so each window is compared with the reference's just before and just after
it, a fraction of a second apart; a ratio is the median of that comparison over
the rounds. Start-up (a second for Celery) happens before the first window, and
a paused queue is topped up before it runs again, so no window runs dry.

The PING loop gives the ceiling: one client doing nothing but round trips,
counted by the server. A job through the reference queue costs two (claim and
ack), so half the PING rate is the most one worker could do; the fused loop
(`ack_and_claim`: the ack of one job claims the next) costs one, so its ceiling
is the PING rate itself; batched mode claims and acks `BATCH` jobs per round
trip and is not bound by it.

Beside each rate is the redis-server's own CPU time per job (from INFO cpu,
over the system's windows), which separates what a queue costs the server from
what it costs the client and the round trips. From these the report splits a
job's time (one worker, a serial loop) into its round trips at the PING loop's
cost, the server's work beyond what as many PINGs cost it, and the client's
rest: the workers' own CPU (counted by the kernel, less what the PING loop's
client spends on as many PINGs) and, left over, waiting: for a wake-up, or for
a CPU another process holds (the kernel's run-queue time is no separate part:
together, the worker queues while the server runs, time counted already); a
goal that is SHORT says how the missing microseconds divide.

Where the processes run decides the result on a small machine, so it is
controlled and reported: each measurement runs with the workers and the
redis-server pinned to one CPU ("together") and to different CPUs ("apart").
Apart, every request wakes a sleeping CPU and every reply wakes another;
together, the two sides hand over on one CPU. The PING loop runs under the same
placement. `--repeat N` measures everything N times with fresh processes, and
each goal shows the value of every repeat and how far they spread.

Everything runs on one private redis-server (never the user's: the benchmark
flushes it), on a Unix socket, no persistence.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field

import redis

from handson.bench.systems import BATCH, SYSTEMS, System
from handson.infra.schedstat import run_time_s
from handson.redis_server import EmbeddedRedis


@dataclass(frozen=True)
class Plan:
    rounds: int                   # windows per system per repeat
    window_s: float


PLANS = {"full": Plan(rounds=30, window_s=0.15),
         "small": Plan(rounds=12, window_s=0.12)}
FIRST_FILL = {"reference": 3_000, "reference-fused": 6_000,
              "reference-batched": 30_000, "rq": 300,
              "celery": 400, "huey": 1_000, "dramatiq": 400}
WORKERS = (1, 2)
# Round trips per job: what bounds each of the queue's loops.
ROUND_TRIPS = {"reference": 2, "reference-fused": 1, "reference-batched": 2 / BATCH}
PLACEMENTS = ("together", "apart")
START_S = 60.0                    # the most a system may take to take its first job
STOP_S = 2.0                      # the most a paused process may take to stop
MIN_JOBS = 100                    # jobs a window should hold, however slow
MAX_WINDOW_S = 1.0


@dataclass
class Result:
    system: str
    workers: int
    jobs: int                     # jobs (PINGs) counted in all its windows
    rates: list[float]            # one per window, jobs/s for the whole pool
    server_us: list[float]        # one per repeat, redis-server CPU per job (µs)
    placement: str = "unpinned"   # "together", "apart" or "unpinned"
    anchor: list[float] = field(default_factory=list)  # the reference around
    repeats: int = 1              #   each window; how many runs the windows span
    client_us: list[float] = field(default_factory=list)  # per repeat: the
    #   workers' own CPU per job (µs), from the kernel's count of their run time

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def per_worker(self) -> float:
        return self.rate / self.workers

    @property
    def server_us_median(self) -> float:
        return statistics.median(self.server_us)

    @property
    def client_us_median(self) -> float | None:
        return statistics.median(self.client_us) if self.client_us else None


class BenchError(RuntimeError):
    """A system failed to run: the message carries its workers' stderr."""


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def cpus(placement: str) -> tuple[set[int] | None, set[int] | None]:
    """(server CPUs, worker CPUs) for a placement; None leaves it to the kernel."""
    mine = sorted(os.sched_getaffinity(0))
    if placement == "together":
        return {mine[0]}, {mine[0]}
    if placement == "apart":
        if len(mine) < 2:
            raise BenchError("placement 'apart' needs two CPUs; this process may "
                             f"use {mine}")
        return {mine[0]}, {mine[1]}
    if placement == "unpinned":
        return None, None
    raise BenchError(f"unknown placement {placement!r}; choose from "
                     f"{', '.join(PLACEMENTS)} or unpinned")


def pin_process(pid: int, cpu_set: set[int] | None) -> None:
    """Every thread of `pid` onto `cpu_set` (None: every CPU this process may use)."""
    target = cpu_set or os.sched_getaffinity(0)
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            os.sched_setaffinity(int(tid), target)
        except ProcessLookupError:
            pass                        # a thread that just exited


def _spawn(args: list[str], url: str, logdir: str, tag: str,
           cpu_set: set[int] | None = None) -> subprocess.Popen:
    env = {**os.environ, "BENCH_REDIS_URL": url, "PYTHONUNBUFFERED": "1",
           "BENCH_PARENT": str(os.getpid())}
    if cpu_set is not None:             # the worker pins itself before any thread
        env["BENCH_CPUS"] = ",".join(map(str, sorted(cpu_set)))
    err = open(os.path.join(logdir, f"{tag}.err"), "w")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "handson.bench.worker", *args],
                            env=env, stdout=subprocess.DEVNULL, stderr=err,
                            stdin=subprocess.DEVNULL, start_new_session=True)


def _signal(procs: list[subprocess.Popen], sig: int) -> None:
    for p in procs:
        try:
            os.killpg(p.pid, sig)
        except ProcessLookupError:
            pass


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each worker's own process group, then SIGKILL what is left."""
    live = [p for p in procs if p.poll() is None]
    _signal(live, signal.SIGTERM)
    _signal(live, signal.SIGCONT)       # a paused process acts on SIGTERM only now
    deadline = time.monotonic() + 5
    for p in live:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            _signal([p], signal.SIGKILL)
            p.wait(timeout=5)


def _stderr(logdir: str, tag: str) -> str:
    with open(os.path.join(logdir, f"{tag}.err")) as f:
        return f.read()[-1500:]


def _stopped(pid: int) -> bool:
    """Whether every thread of `pid` is stopped (or gone)."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return True
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except (FileNotFoundError, ProcessLookupError):
            continue
        if state not in "TtZX":
            return False
    return True


def _pause(procs: list[subprocess.Popen]) -> None:
    """SIGSTOP, and wait until every thread has stopped: nothing runs unseen."""
    _signal(procs, signal.SIGSTOP)
    deadline = time.monotonic() + STOP_S
    while not all(_stopped(p.pid) for p in procs):
        if time.monotonic() > deadline:
            raise BenchError(f"a worker did not stop within {STOP_S:.0f} s")
        time.sleep(0.0005)


def slope_rate(samples: list[tuple[float, int]], n: int) -> float:
    """Jobs/s between the first samples at or below 90% and 10% of n left."""
    hi = next((s for s in samples if s[1] <= 0.9 * n), None)
    lo = next((s for s in samples if s[1] <= 0.1 * n), None)
    if hi is None or lo is None or lo[0] <= hi[0]:
        raise BenchError(f"the queue did not drain far enough to measure "
                         f"(last sample {samples[-1] if samples else None} of {n})")
    return (hi[1] - lo[1]) / (lo[0] - hi[0])


def server_cpu_s(r: redis.Redis) -> float:
    """CPU seconds the redis-server process has used so far (user + system)."""
    info = r.info("cpu")
    return float(info["used_cpu_user"]) + float(info["used_cpu_sys"])


def pings(r: redis.Redis) -> int:
    """PINGs the server has answered since it started."""
    return int(r.info("commandstats").get("cmdstat_ping", {}).get("calls", 0))


class Turns:
    """One system's workers, paused between their windows, and its counts."""

    def __init__(self, name: str, r: redis.Redis, url: str, workers: int,
                 logdir: str, cpu_set: set[int] | None):
        self.name, self.r, self.url = name, r, url
        self.system: System | None = None if name == "ping" else SYSTEMS[name]
        self.tags = [f"{name}-{workers}-{i}" for i in range(workers)]
        self.logdir = logdir
        self.filled = 0
        self.last = 0                  # jobs in the last window
        self.rates: list[float] = []
        self.anchor: list[float] = []  # the reference's rate around each window
        self.cpu_s = self.counted = self.client_s = 0.0
        if self.system:
            self._fill(FIRST_FILL[name])
        c0 = self.count()
        self.procs = [_spawn([name], url, logdir, t, cpu_set) for t in self.tags]
        deadline = time.monotonic() + START_S
        while self.count() == c0:      # running once it has taken a job
            self._alive()
            if time.monotonic() > deadline:
                raise BenchError(f"{name} took no job in {START_S:.0f} s:\n"
                                 + _stderr(logdir, self.tags[0]))
            time.sleep(0.01)
        _pause(self.procs)

    def _fill(self, n: int) -> None:
        os.environ["BENCH_REDIS_URL"] = self.url       # some fills read it here
        self.system.fill(self.r, n)
        self.filled += n

    def count(self) -> int:
        """Jobs taken (PINGs answered) so far: only ever grows."""
        if self.system is None:
            return pings(self.r)
        return self.filled - self.system.remaining(self.r)

    def _alive(self) -> None:
        for p, tag in zip(self.procs, self.tags, strict=True):
            if p.poll() is not None:
                raise BenchError(f"{self.name} worker exited with {p.returncode}:"
                                 f"\n{_stderr(self.logdir, tag)}")

    def window(self, seconds: float) -> float:
        """Run for one window, its rate; a window that ran dry is run again.

        A slow system's window is stretched to hold about MIN_JOBS jobs, so
        the job that straddles its start or end weighs little.
        """
        if self.rates:      # a window the scheduler starved (0 jobs): the longest
            seconds = (min(MAX_WINDOW_S, max(seconds, MIN_JOBS / self.rates[-1]))
                       if self.rates[-1] > 0 else MAX_WINDOW_S)
        for _ in range(3):
            if self.system:
                need = max(FIRST_FILL[self.name], 3 * self.last)
                left = self.filled - self.count()
                if left < need:
                    self._fill(2 * need - left)
            c0, cpu0 = self.count(), server_cpu_s(self.r)
            own0 = run_time_s([p.pid for p in self.procs])
            t0 = time.perf_counter()
            _signal(self.procs, signal.SIGCONT)
            time.sleep(seconds)
            _pause(self.procs)
            t1 = time.perf_counter()
            self._alive()
            c1, cpu1 = self.count(), server_cpu_s(self.r)
            own1 = run_time_s([p.pid for p in self.procs])
            self.last = c1 - c0
            if self.system and c1 >= self.filled:
                continue                           # ran dry: it was waiting
            self.rates.append(self.last / (t1 - t0))
            self.cpu_s += cpu1 - cpu0
            self.client_s += own1 - own0
            self.counted += self.last
            return self.rates[-1]
        raise BenchError(f"{self.name}: the queue ran dry in three windows running")

    def close(self) -> None:
        _stop(self.procs)


def measure(url: str, names: list[str], workers: int, placement: str,
            plan: Plan, logdir: str, label: str) -> dict[str, Turns]:
    """Every system in `names` (and the PING loop) in turns, `plan.rounds` each.

    The reference runs between every two windows of the others, so each of
    them is compared with the reference's rate just before and just after it.
    """
    worker_cpus = cpus(placement)[1]
    r = redis.Redis.from_url(url)
    r.flushall()
    turns: dict[str, Turns] = {}
    try:
        for name in ["ping", *names]:
            _log(f"{label}: starting {name}")
            turns[name] = Turns(name, r, url, workers, logdir, worker_cpus)
        ref = turns.get("reference")
        others = [t for t in turns.values() if t is not ref]
        for k in range(plan.rounds):
            if k % 6 == 0:
                _log(f"{label}: round {k + 1}/{plan.rounds}")
            before = ref.window(plan.window_s) if ref else 0.0
            for t in others[k % len(others):] + others[:k % len(others)]:
                t.window(plan.window_s)
                if ref:             # every other window is the reference's
                    after = ref.window(plan.window_s)
                    t.anchor.append((before + after) / 2)
                    before = after
    finally:
        for t in turns.values():
            t.close()
        r.close()
    return turns


def run(size: str = "full", only: list[str] | None = None, repeat: int = 1,
        workers: tuple[int, ...] = WORKERS,
        placements: tuple[str, ...] = PLACEMENTS) -> dict:
    """Every measurement, `repeat` times over; skipped peers say why."""
    plan = PLANS[size]
    names = only or list(SYSTEMS)
    unknown = [x for x in names if x not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
    skipped = {n: why for n in names if (why := SYSTEMS[n].missing())}
    for name, why in skipped.items():
        _log(f"{name}: skipped, {why}")
    names = [n for n in names if n not in skipped]
    groups = [(p, w) for p in placements for w in workers]
    rates: dict[tuple, list[float]] = {}
    anchor: dict[tuple, list[float]] = {}
    server_us: dict[tuple, list[float]] = {}
    client_us: dict[tuple, list[float]] = {}
    counted: dict[tuple, int] = {}
    server = EmbeddedRedis().start()
    try:
        with tempfile.TemporaryDirectory(prefix="eo-bench-") as logdir:
            for k in range(repeat):
                for p, w in groups:
                    pin_process(server.pid, cpus(p)[0])
                    label = (f"{p}, {w} worker(s)"
                             + (f", repeat {k + 1}/{repeat}" if repeat > 1 else ""))
                    for name, t in measure(server.url, names, w, p, plan, logdir,
                                           label).items():
                        key = (p, w, name)
                        rates.setdefault(key, []).extend(t.rates)
                        anchor.setdefault(key, []).extend(t.anchor)
                        server_us.setdefault(key, []).append(
                            t.cpu_s * 1e6 / max(1, t.counted))
                        client_us.setdefault(key, []).append(
                            t.client_s * 1e6 / max(1, t.counted))
                        counted[key] = counted.get(key, 0) + int(t.counted)
    finally:
        server.stop()
    results = [Result(name, w, counted[(p, w, name)], rates[(p, w, name)],
                      server_us[(p, w, name)], p, anchor[(p, w, name)], repeat,
                      client_us[(p, w, name)])
               for p, w in groups for name in ["ping", *names]]
    return {"size": size, "repeat": repeat, "batch": BATCH,
            "rounds": plan.rounds, "window_s": plan.window_s,
            "cpu_count": os.cpu_count(), "skipped": skipped,
            "results": [asdict(x) | {"rate": x.rate, "per_worker": x.per_worker,
                                     "server_us_per_job": x.server_us_median,
                                     "vs_ping_half": _vs_ping_half(results, x)}
                        for x in results],
            "goals": goals(results), "costs": costs(results)}


def _find(results: list[Result], system: str, workers: int,
          placement: str) -> Result | None:
    return next((x for x in results if x.system == system and x.workers == workers
                 and x.placement == placement), None)


def _vs_ref(x: Result) -> list[float | None]:
    """x's rate over the reference's just around it, window by window; None
    for a window in which either made no progress at all (a machine so loaded
    that it starved one of them says nothing of their ratio)."""
    return [v / a if v > 0 and a > 0 else None
            for v, a in zip(x.rates, x.anchor, strict=True)]


def _each(k: float, ratios: list[float | None]) -> list[float]:
    """k over each ratio that was measured."""
    return [k / r for r in ratios if r]


def _over(tops: list[float | None], bottoms: list[float | None]) -> list[float]:
    """Window by window, where both were measured."""
    return [t / b for t, b in zip(tops, bottoms, strict=True) if t and b]


def _vs_ping_half(results: list[Result], x: Result) -> float | None:
    ping = _find(results, "ping", x.workers, x.placement)
    if x.system == "ping" or ping is None:
        return None
    if x.system == "reference" and ping.anchor:
        rounds = _each(2, _vs_ref(ping))
    elif x.anchor and ping.anchor:      # through the reference beside each
        rounds = [2 * r for r in _over(_vs_ref(x), _vs_ref(ping))]
    else:
        rounds = [2 * r for r in _over(x.rates, ping.rates)]
    return summary(rounds, x.repeats)["value"]


def _vs_ping(results: list[Result], x: Result) -> list[float]:
    """x's rate over the PING loop's, round by round, through the reference."""
    ping = _find(results, "ping", x.workers, x.placement)
    if x.system == "reference":
        return _each(1, _vs_ref(ping))
    return _over(_vs_ref(x), _vs_ref(ping))


def cost(results: list[Result], x: Result) -> dict | None:
    """Where one job's microseconds go, per worker: round trips, server, client,
    waiting.

    A worker's loop is serial: it waits while its request travels and the
    server works. So a job takes its round trips at the PING loop's cost, plus
    the server's CPU beyond what as many PINGs cost it (the scripts), plus the
    worker's own CPU beyond what as many PINGs cost the PING loop (building
    requests, reading replies, the loop), plus what no CPU count explains:
    waiting, for a wake-up or for a CPU another process holds. Without the
    workers' CPU (an old report) the client is what is left and `wait_us` is
    None.
    """
    ping = _find(results, "ping", x.workers, x.placement)
    trips = ROUND_TRIPS.get(x.system)
    if ping is None or trips is None or not (ping.anchor and x.system == "reference"
                                             or x.anchor):
        return None
    ping_us = 1e6 / ping.per_worker
    job_us = ping_us / statistics.median(_vs_ping(results, x))
    rt_us = trips * ping_us
    script_us = x.server_us_median - trips * ping.server_us_median
    rest = job_us - rt_us - script_us
    client_us, wait_us = rest, None
    if x.client_us_median is not None and ping.client_us_median is not None:
        client_us = x.client_us_median - trips * ping.client_us_median
        wait_us = rest - client_us
    return {"system": x.system, "workers": x.workers, "placement": x.placement,
            "round_trips": trips, "job_us": job_us, "round_trip_us": rt_us,
            "script_us": script_us, "client_us": client_us, "wait_us": wait_us}


def costs(results: list[Result]) -> list[dict]:
    return [c for x in results if (c := cost(results, x))]


COST_PARTS = (("round_trip_us", "round trips", "#2c3e50"),
              ("script_us", "server scripts", "#e67e22"),
              ("client_us", "client CPU", "#16a085"),
              ("wait_us", "waiting", "#95a5a6"))


def cost_figure(rows: list[dict]):
    """Stacked bars: each row's µs per job, split as `cost` splits it."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 0.9 + 0.45 * len(rows)))
    ax = fig.subplots()
    names = {"reference": "plain", "reference-fused": "fused",
             "reference-batched": "batched"}
    labels = [f"{names.get(c['system'], c['system'])}, {c['placement']}"
              for c in rows]
    left = [0.0] * len(rows)
    for key, name, color in COST_PARTS:
        widths = [max(0.0, c.get(key) or 0.0) for c in rows]
        ax.barh(labels, widths, left=left, color=color, label=name)
        left = [a + w for a, w in zip(left, widths, strict=True)]
    ax.invert_yaxis()
    ax.set_xlabel("µs per job, one worker")
    ax.legend(frameon=False, fontsize=8, ncol=4, loc="lower center",
              bbox_to_anchor=(0.5, 1.0))
    fig.tight_layout()
    return fig


def _shortfall(results: list[Result], x: Result) -> str:
    """What the microseconds past a goal's round trips are spent on."""
    c = cost(results, x)
    if c is None:
        return ""
    text = (f"{c['job_us'] - c['round_trip_us']:.1f} µs a job past "
            f"{c['round_trips']:g} round trip(s): scripts {c['script_us']:.1f}, ")
    if c["wait_us"] is None:
        return text + f"client and rest {c['client_us']:.1f}"
    return text + f"client CPU {c['client_us']:.1f}, waiting {c['wait_us']:.1f}"


def goals(results: list[Result]) -> list[dict]:
    """The course's four goals per placement, each with the value and met or not."""
    out = []
    for pl in dict.fromkeys(x.placement for x in results):
        for w in sorted({x.workers for x in results if x.placement == pl}):
            out += _goals(results, w, pl)
    return out


def summary(rounds: list[float], repeats: int = 1) -> dict:
    """The median of a ratio's rounds, their middle half, and each repeat's median.

    Each round compares two systems a fraction of a second apart, on the same
    machine-second; the spread of the repeats says whether the value repeats.
    """
    out = {"value": statistics.median(rounds), "rounds": len(rounds)}
    if len(rounds) >= 4:
        q1, _, q3 = statistics.quantiles(rounds, n=4)
        out["middle"] = [q1, q3]
    if repeats > 1:
        per = len(rounds) // repeats
        reps = [statistics.median(rounds[i * per:(i + 1) * per])
                for i in range(repeats)]
        out |= {"repeats": reps,
                "spread": (max(reps) - min(reps)) / statistics.median(reps)}
    return out


def _goals(results: list[Result], w: int, pl: str) -> list[dict]:
    """Each goal compares the reference with the windows of the other just
    around it (the reference runs between every two windows of the others)."""
    out = []
    at = f"{w}w, {pl}"
    ping, ref = _find(results, "ping", w, pl), _find(results, "reference", w, pl)
    if ping and ref:
        got = summary(_each(2, _vs_ref(ping)), ping.repeats)
        out.append({"goal": f"reference >= 90% of PING/2 per worker ({at})",
                    "shown": f"{got['value']:.0%}", "met": got["value"] >= 0.9,
                    "where": _shortfall(results, ref), **got})
    fused = _find(results, "reference-fused", w, pl)
    if ping and ref and fused:
        got = summary(_vs_ping(results, fused), fused.repeats)
        out.append({"goal": f"fused >= 90% of PING per worker ({at})",
                    "shown": f"{got['value']:.0%}", "met": got["value"] >= 0.9,
                    "where": _shortfall(results, fused), **got})
    rq = _find(results, "rq", w, pl)
    if ref and rq:
        got = summary(_each(1, _vs_ref(rq)), rq.repeats)
        out.append({"goal": f"reference >= 10x RQ ({at})",
                    "shown": f"{got['value']:.1f}x", "met": got["value"] >= 10,
                    **got})
    peers = [x for x in results if x.workers == w and x.placement == pl
             and x.system in ("rq", "celery", "huey", "dramatiq")]
    if ref and peers:
        best = max(peers, key=lambda x: x.per_worker)
        each = zip(*(_vs_ref(x) for x in peers), strict=True)
        got = summary([1 / max(vs) for vs in each if all(vs)], best.repeats)
        out.append({"goal": f"reference ahead of every peer per worker ({at})",
                    "shown": f"{got['value']:.1f}x {best.system}",
                    "met": got["value"] > 1, "best": best.system, **got})
    bat = _find(results, "reference-batched", w, pl)
    if bat:
        got = summary([b / w for b in bat.rates], bat.repeats)
        if bat.anchor:
            got["vs_reference"] = summary([r for r in _vs_ref(bat) if r],
                                          bat.repeats)
        out.append({"goal": f"batched > 50,000 jobs/s per worker ({at})",
                    "shown": f"{got['value']:,.0f}",
                    "met": got["value"] > 50_000, **got})
    return out


def goal(report: dict, name: str, workers: int, placement: str) -> dict:
    """One goal of a report by its words before the parenthesis."""
    return next(g for g in report["goals"]
                if g["goal"] == f"{name} ({workers}w, {placement})")


def _num(v: float) -> str:
    return f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"


def table(report: dict) -> str:
    """The results as a plain-text table (under 90 columns), then the goals."""
    lines = [f"{'system':<17} {'placed':<8} {'w':>2} {'jobs/s':>8} {'per w.':>8} "
             f"{'vs PING/2':>9} {'srv µs/job':>10} {'middle half':>13}"]
    for x in report["results"]:
        pl = x.get("placement", "unpinned")
        vs = "" if x.get("vs_ping_half") is None else f"{x['vs_ping_half']:.0%}"
        middle = ""
        if len(x["rates"]) >= 4:
            q1, _, q3 = statistics.quantiles(x["rates"], n=4)
            middle = f"{q1:,.0f}-{q3:,.0f}"
        lines.append(f"{x['system']:<17} {pl:<8} {x['workers']:>2} "
                     f"{x['rate']:>8,.0f} {x['per_worker']:>8,.0f} {vs:>9} "
                     f"{x['server_us_per_job']:>10.1f} {middle:>13}")
    for name, why in report["skipped"].items():
        lines.append(f"{name:<17} skipped: {why}")
    lines += ["", "jobs/s: the median window; middle half: of the windows' rates; "
              "w: workers"]
    if report.get("costs"):
        lines += ["", "µs a job, per worker = round trips (at the PING loop's) + "
                  "server past those PINGs", "  + client CPU past those PINGs + "
                  "waiting (what no CPU count explains: wake-ups, busy CPU)"]
    for c in report.get("costs", []):
        wait = "" if c.get("wait_us") is None else f" + {c['wait_us']:5.1f}"
        lines.append(f"  {c['system']:<17} {c['placement']:<8} {c['workers']:>2}w "
                     f"{c['job_us']:6.1f} = {c['round_trip_us']:5.1f} + "
                     f"{c['script_us']:5.1f} + {c['client_us']:5.1f}{wait}")
    lines.append("")
    for g in report["goals"]:
        lines.append(f"{'MET  ' if g['met'] else 'SHORT'} {g['goal']}: {g['shown']}")
        how = f"{g['rounds']} round" + ("s" if g["rounds"] != 1 else "")
        if "middle" in g:
            how += f", middle half {_num(g['middle'][0])}-{_num(g['middle'][1])}"
        if "vs_reference" in g:
            how += f"; {g['vs_reference']['value']:.1f}x the reference beside it"
        lines.append(f"      {how}")
        if not g["met"] and g.get("where"):
            lines.append(f"      {g['where']}")
        for got, what in ((g, ""), (g.get("vs_reference", {}), " (vs reference)")):
            if "repeats" in got:
                each = ", ".join(_num(v) for v in got["repeats"])
                lines.append(f"      repeats{what} {each}: spread "
                             f"{got['spread']:.0%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=PLANS, default="full",
                    help="full: 30 rounds of 0.15 s windows; small: 12 of 0.12 s")
    ap.add_argument("--only", nargs="+", metavar="SYSTEM",
                    help=f"a subset of {', '.join(SYSTEMS)}")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure everything this many times, with fresh "
                         "processes, and show how far the goals spread")
    ap.add_argument("--workers", type=int, nargs="+", default=list(WORKERS),
                    help="worker processes per point (default: 1 2)")
    ap.add_argument("--placement", nargs="+", default=list(PLACEMENTS),
                    choices=[*PLACEMENTS, "unpinned"],
                    help="workers and server on one CPU, on different CPUs, or "
                         "wherever the kernel puts them (default: together apart)")
    ap.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    if min(args.workers) < 1:
        ap.error("--workers must be at least 1")
    # SIGTERM unwinds like Ctrl-C, so the paused workers are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    try:
        report = run(args.size, args.only, args.repeat, tuple(args.workers),
                     tuple(args.placement))
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0
