"""Drain rate of no-op jobs: the reference queue against RQ, Celery, huey, dramatiq.

How a rate is measured, the same way for every system: fill the queue with n
jobs while no worker runs, start the workers (separate processes, one job at a
time each), and sample the broker's waiting count every few milliseconds. The
rate is the slope between the moments 90% and 10% of the jobs were left, so
process start-up (a second for Celery) and the last stragglers do not count.

The PING loop gives the ceiling: one client doing nothing but round trips. A
job through the reference queue costs two (claim and ack), so half the PING
rate is the most one worker could do; batched mode claims and acks `BATCH`
jobs per round trip and is not bound by it.

Beside each rate is the redis-server's own CPU time per job (from INFO cpu,
over the drain), which separates what a queue costs the server from what it
costs the client and the round trips.

Where the processes run decides the result on a small machine, so it is
controlled and reported: each measurement runs with the workers and the
redis-server pinned to one CPU ("together") and to different CPUs ("apart").
Apart, every request wakes a sleeping CPU and every reply wakes another; together,
the two sides hand over on one CPU. The PING loop runs under the same placement,
and the points are measured round-robin (each repeat visits every placement and
system once) so drift on a shared machine spreads over all of them alike.

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
from dataclasses import asdict, dataclass

import redis

from handson.bench.systems import BATCH, SYSTEMS, System
from handson.redis_server import EmbeddedRedis

SIZES = {  # jobs per measurement, chosen so each drain takes a second or more
    "full": {"ping": 50_000, "reference": 40_000, "reference-batched": 150_000,
             "rq": 3_000, "celery": 4_000, "huey": 8_000, "dramatiq": 3_000},
    "small": {"ping": 5_000, "reference": 4_000, "reference-batched": 20_000,
              "rq": 300, "celery": 400, "huey": 800, "dramatiq": 800},
}
WORKERS = (1, 2)
PLACEMENTS = ("together", "apart")
POLL_S = 0.005


@dataclass
class Result:
    system: str
    workers: int
    jobs: int
    rates: list[float]            # one per repeat, jobs/s for the whole pool
    server_us: list[float]        # one per repeat, redis-server CPU per job (µs)
    placement: str = "unpinned"   # "together", "apart" or "unpinned"

    @property
    def rate(self) -> float:
        return statistics.median(self.rates)

    @property
    def per_worker(self) -> float:
        return self.rate / self.workers

    @property
    def server_us_median(self) -> float:
        return statistics.median(self.server_us)

    def spread(self) -> str:
        if len(self.rates) < 2:
            return ""
        return f"{min(self.rates):,.0f}-{max(self.rates):,.0f}"


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
    env = {**os.environ, "BENCH_REDIS_URL": url, "PYTHONUNBUFFERED": "1"}
    if cpu_set is not None:             # the worker pins itself before any thread
        env["BENCH_CPUS"] = ",".join(map(str, sorted(cpu_set)))
    err = open(os.path.join(logdir, f"{tag}.err"), "w")  # noqa: SIM115
    return subprocess.Popen([sys.executable, "-m", "handson.bench.worker", *args],
                            env=env, stdout=subprocess.PIPE, stderr=err,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            text=True)


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each worker's own process group, then SIGKILL what is left."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + 5
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait(timeout=5)


def _stderr(logdir: str, tag: str) -> str:
    with open(os.path.join(logdir, f"{tag}.err")) as f:
        return f.read()[-1500:]


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


def drain_rate(system: System, url: str, n: int, workers: int, logdir: str,
               timeout_s: float = 120.0,
               cpu_set: set[int] | None = None) -> tuple[float, float]:
    """Fill with n jobs, start the workers: (drain rate, server CPU µs per job)."""
    r = redis.Redis.from_url(url)
    r.flushall()
    os.environ["BENCH_REDIS_URL"] = url           # the fill runs in this process
    system.fill(r, n)
    left = system.remaining(r)
    if left != n:
        raise BenchError(f"{system.name}: filled {n} jobs but {left} are waiting")
    tags = [f"{system.name}-{workers}-{i}" for i in range(workers)]
    cpu0 = server_cpu_s(r)
    procs = [_spawn([system.name], url, logdir, t, cpu_set) for t in tags]
    samples: list[tuple[float, int]] = []
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            left = system.remaining(r)
            samples.append((time.monotonic(), left))
            if left <= 0.1 * n:
                break
            for p, tag in zip(procs, tags, strict=True):
                if p.poll() is not None:
                    raise BenchError(f"{system.name} worker exited with "
                                     f"{p.returncode}:\n{_stderr(logdir, tag)}")
            if time.monotonic() > deadline:
                raise BenchError(f"{system.name}: {left} of {n} jobs still waiting "
                                 f"after {timeout_s:.0f} s")
            time.sleep(POLL_S)
        cpu = server_cpu_s(r) - cpu0
    finally:
        _stop(procs)
        r.close()
    return slope_rate(samples, n), cpu * 1e6 / max(1, n - left)


def ping_rate(url: str, n: int, workers: int, logdir: str,
              cpu_set: set[int] | None = None) -> tuple[float, float]:
    """(PINGs/s of `workers` clients at once, server CPU µs per PING)."""
    r = redis.Redis.from_url(url)
    cpu0 = server_cpu_s(r)
    procs = [_spawn(["ping", str(n)], url, logdir, f"ping-{workers}-{i}", cpu_set)
             for i in range(workers)]
    rates = []
    try:
        for i, p in enumerate(procs):
            out, _ = p.communicate(timeout=120)
            if p.returncode != 0:
                raise BenchError("ping loop failed:\n"
                                 + _stderr(logdir, f"ping-{workers}-{i}"))
            rates.append(json.loads(out)["ping_per_s"])
    finally:
        _stop(procs)
    cpu = server_cpu_s(r) - cpu0
    r.close()
    return statistics.median(rates) * workers, cpu * 1e6 / (n * workers)


def run(size: str = "full", only: list[str] | None = None, repeat: int = 1,
        workers: tuple[int, ...] = WORKERS,
        placements: tuple[str, ...] = PLACEMENTS) -> dict:
    """Every measurement, `repeat` rounds of all of them; skipped peers say why."""
    sizes = SIZES[size]
    names = only or list(SYSTEMS)
    unknown = [x for x in names if x not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
    skipped = {n: why for n in names if (why := SYSTEMS[n].missing())}
    for name, why in skipped.items():
        _log(f"{name}: skipped, {why}")
    points = [(p, w, name) for p in placements for w in workers
              for name in ["ping", *(n for n in names if n not in skipped)]]
    runs: dict[tuple, list[tuple[float, float]]] = {x: [] for x in points}
    server = EmbeddedRedis().start()
    try:
        with tempfile.TemporaryDirectory(prefix="eo-bench-") as logdir:
            for k in range(repeat):
                for p, w, name in points:
                    server_cpus, worker_cpus = cpus(p)
                    pin_process(server.pid, server_cpus)
                    _log(f"{name}, {p}, {w} worker(s), {sizes[name]:,} "
                         f"{'PINGs' if name == 'ping' else 'jobs'}, "
                         f"run {k + 1}/{repeat}")
                    if name == "ping":
                        runs[(p, w, name)].append(ping_rate(
                            server.url, sizes["ping"], w, logdir, worker_cpus))
                    else:
                        runs[(p, w, name)].append(drain_rate(
                            SYSTEMS[name], server.url, sizes[name], w, logdir,
                            cpu_set=worker_cpus))
    finally:
        server.stop()
    results = [Result(name, w, sizes[name], *map(list, zip(*runs[(p, w, name)],
                                                           strict=True)), p)
               for p, w, name in points]
    return {"size": size, "repeat": repeat, "batch": BATCH,
            "cpu_count": os.cpu_count(), "skipped": skipped,
            "results": [asdict(x) | {"rate": x.rate, "per_worker": x.per_worker,
                                     "server_us_per_job": x.server_us_median}
                        for x in results],
            "goals": goals(results)}


def _find(results: list[Result], system: str, workers: int,
          placement: str) -> Result | None:
    return next((x for x in results if x.system == system and x.workers == workers
                 and x.placement == placement), None)


def goals(results: list[Result]) -> list[dict]:
    """The course's four goals per placement, each with the value and met or not."""
    out = []
    for pl in dict.fromkeys(x.placement for x in results):
        for w in sorted({x.workers for x in results if x.placement == pl}):
            out += _goals(results, w, pl)
    return out


def _rounds(ratio, *results: Result) -> dict:
    """The ratio in each repeat round alone, and how far the rounds spread.

    A round measures every point once, so its ratio compares points taken
    minutes apart at most; the spread says whether the ratio repeats.
    """
    n = min(len(x.rates) for x in results)
    rounds = [ratio(*(x.rates[k] for x in results)) for k in range(n)]
    if n < 2:
        return {}
    mid = statistics.median(rounds)
    return {"rounds": rounds, "spread": (max(rounds) - min(rounds)) / mid}


def _goals(results: list[Result], w: int, pl: str) -> list[dict]:
    out = []
    at = f"{w}w, {pl}"
    ping, ref = _find(results, "ping", w, pl), _find(results, "reference", w, pl)
    if ping and ref:
        ratio = ref.per_worker / (ping.per_worker / 2)
        out.append({"goal": f"reference >= 90% of PING/2 per worker ({at})",
                    "value": ratio, "shown": f"{ratio:.0%}", "met": ratio >= 0.9,
                    **_rounds(lambda r, p: r / (p / 2), ref, ping)})
    rq = _find(results, "rq", w, pl)
    if ref and rq:
        ratio = ref.rate / rq.rate
        out.append({"goal": f"reference >= 10x RQ ({at})", "value": ratio,
                    "shown": f"{ratio:.1f}x", "met": ratio >= 10,
                    **_rounds(lambda r, q: r / q, ref, rq)})
    peers = [x for x in results if x.workers == w and x.placement == pl
             and x.system in ("rq", "celery", "huey", "dramatiq")]
    if ref and peers:
        best = max(peers, key=lambda x: x.per_worker)
        ratio = ref.per_worker / best.per_worker
        out.append({"goal": f"reference ahead of every peer per worker ({at})",
                    "value": ratio, "shown": f"{ratio:.1f}x {best.system}",
                    "met": ratio > 1,
                    **_rounds(lambda r, *ps: r / max(ps), ref, *peers)})
    bat = _find(results, "reference-batched", w, pl)
    if bat:
        out.append({"goal": f"batched > 50,000 jobs/s per worker ({at})",
                    "value": bat.per_worker, "shown": f"{bat.per_worker:,.0f}",
                    "met": bat.per_worker > 50_000,
                    **_rounds(lambda b: b / w, bat)})
    return out


def table(report: dict) -> str:
    """The results as a plain-text table, then the goals."""
    res = report["results"]
    lines = [f"{'system':<18} {'placement':<9} {'workers':>7} {'jobs/s':>9} "
             f"{'per worker':>10} {'vs PING/2':>9} {'server µs/job':>13} "
             f"{'spread (jobs/s)':>15}"]
    for x in res:
        pl = x.get("placement", "unpinned")
        ping = next((p for p in res if p["system"] == "ping"
                     and p["workers"] == x["workers"]
                     and p.get("placement", "unpinned") == pl), None)
        vs = ("" if x["system"] == "ping" or not ping
              else f"{x['per_worker'] / (ping['per_worker'] / 2):.0%}")
        spread = ""
        if len(x["rates"]) > 1:
            spread = f"{min(x['rates']):,.0f}-{max(x['rates']):,.0f}"
        lines.append(f"{x['system']:<18} {pl:<9} {x['workers']:>7} "
                     f"{x['rate']:>9,.0f} {x['per_worker']:>10,.0f} {vs:>9} "
                     f"{x['server_us_per_job']:>13.1f} {spread:>15}")
    for name, why in report["skipped"].items():
        lines.append(f"{name:<18} skipped: {why}")
    lines.append("")
    for g in report["goals"]:
        rounds = ""
        if "spread" in g:
            each = ", ".join(f"{v:,.0f}" if v >= 1000 else f"{v:.3g}"
                             for v in g["rounds"])
            rounds = f"  (rounds {each}: spread {g['spread']:.0%})"
        lines.append(f"{'MET  ' if g['met'] else 'SHORT'} {g['goal']}: "
                     f"{g['shown']}{rounds}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=SIZES, default="full")
    ap.add_argument("--only", nargs="+", metavar="SYSTEM",
                    help=f"a subset of {', '.join(SYSTEMS)}")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each point this many times (median, spread)")
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
    try:
        report = run(args.size, args.only, args.repeat, tuple(args.workers),
                     tuple(args.placement))
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0
