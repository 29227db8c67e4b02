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
POLL_S = 0.005


@dataclass
class Result:
    system: str
    workers: int
    jobs: int
    rates: list[float]            # one per repeat, jobs/s for the whole pool
    server_us: list[float]        # one per repeat, redis-server CPU per job (µs)

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


def _spawn(args: list[str], url: str, logdir: str, tag: str) -> subprocess.Popen:
    env = {**os.environ, "BENCH_REDIS_URL": url, "PYTHONUNBUFFERED": "1"}
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
               timeout_s: float = 120.0) -> tuple[float, float]:
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
    procs = [_spawn([system.name], url, logdir, t) for t in tags]
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


def ping_rate(url: str, n: int, workers: int, logdir: str) -> tuple[float, float]:
    """(PINGs/s of `workers` clients at once, server CPU µs per PING)."""
    r = redis.Redis.from_url(url)
    cpu0 = server_cpu_s(r)
    procs = [_spawn(["ping", str(n)], url, logdir, f"ping-{workers}-{i}")
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
        workers: tuple[int, ...] = WORKERS) -> dict:
    """Every measurement, `repeat` times each; skipped peers say why."""
    sizes = SIZES[size]
    names = only or list(SYSTEMS)
    unknown = [x for x in names if x not in SYSTEMS]
    if unknown:
        raise SystemExit(f"unknown system(s) {unknown}; choose from {list(SYSTEMS)}")
    results: list[Result] = []
    skipped: dict[str, str] = {}
    server = EmbeddedRedis().start()
    try:
        with tempfile.TemporaryDirectory(prefix="eo-bench-") as logdir:
            for w in workers:
                runs = []
                for k in range(repeat):
                    _log(f"ping loop, {w} client(s), run {k + 1}/{repeat}")
                    runs.append(ping_rate(server.url, sizes["ping"], w, logdir))
                results.append(Result("ping", w, sizes["ping"], *map(list, zip(*runs,
                                                                       strict=True))))
            for name in names:
                system = SYSTEMS[name]
                why = system.missing()
                if why:
                    skipped[name] = why
                    _log(f"{name}: skipped, {why}")
                    continue
                for w in workers:
                    runs = []
                    for k in range(repeat):
                        _log(f"{name}, {w} worker(s), {sizes[name]:,} jobs, "
                             f"run {k + 1}/{repeat}")
                        runs.append(drain_rate(system, server.url, sizes[name], w,
                                               logdir))
                    results.append(Result(name, w, sizes[name],
                                          *map(list, zip(*runs, strict=True))))
    finally:
        server.stop()
    return {"size": size, "repeat": repeat, "batch": BATCH,
            "cpu_count": os.cpu_count(), "skipped": skipped,
            "results": [asdict(x) | {"rate": x.rate, "per_worker": x.per_worker,
                                     "server_us_per_job": x.server_us_median}
                        for x in results],
            "goals": goals(results)}


def _find(results: list[Result], system: str, workers: int) -> Result | None:
    return next((x for x in results if x.system == system and x.workers == workers),
                None)


def goals(results: list[Result]) -> list[dict]:
    """The issue's four goals, each with the measured value and met or not."""
    out = []
    for w in sorted({x.workers for x in results}):
        ping, ref = _find(results, "ping", w), _find(results, "reference", w)
        if ping and ref:
            ratio = ref.per_worker / (ping.per_worker / 2)
            out.append({"goal": f"reference >= 90% of PING/2 per worker ({w}w)",
                        "value": ratio, "shown": f"{ratio:.0%}", "met": ratio >= 0.9})
        rq = _find(results, "rq", w)
        if ref and rq:
            ratio = ref.rate / rq.rate
            out.append({"goal": f"reference >= 10x RQ ({w}w)", "value": ratio,
                        "shown": f"{ratio:.1f}x", "met": ratio >= 10})
        peers = [x for x in results if x.workers == w
                 and x.system in ("rq", "celery", "huey", "dramatiq")]
        if ref and peers:
            best = max(peers, key=lambda x: x.per_worker)
            ratio = ref.per_worker / best.per_worker
            out.append({"goal": f"reference ahead of every peer per worker ({w}w)",
                        "value": ratio, "shown": f"{ratio:.1f}x {best.system}",
                        "met": ratio > 1})
        bat = _find(results, "reference-batched", w)
        if bat:
            out.append({"goal": f"batched > 50,000 jobs/s per worker ({w}w)",
                        "value": bat.per_worker, "shown": f"{bat.per_worker:,.0f}",
                        "met": bat.per_worker > 50_000})
    return out


def table(report: dict) -> str:
    """The results as a plain-text table, then the goals."""
    res = report["results"]
    ping1 = next((x for x in res if x["system"] == "ping" and x["workers"] == 1), None)
    lines = [f"{'system':<18} {'workers':>7} {'jobs/s':>10} {'per worker':>10} "
             f"{'vs PING/2':>9} {'server µs/job':>13} {'spread (jobs/s)':>17}"]
    for x in res:
        ping = next((p for p in res if p["system"] == "ping"
                     and p["workers"] == x["workers"]), ping1)
        vs = ("" if x["system"] == "ping" or not ping
              else f"{x['per_worker'] / (ping['per_worker'] / 2):.0%}")
        spread = ""
        if len(x["rates"]) > 1:
            spread = f"{min(x['rates']):,.0f}-{max(x['rates']):,.0f}"
        lines.append(f"{x['system']:<18} {x['workers']:>7} {x['rate']:>10,.0f} "
                     f"{x['per_worker']:>10,.0f} {vs:>9} "
                     f"{x['server_us_per_job']:>13.1f} {spread:>17}")
    for name, why in report["skipped"].items():
        lines.append(f"{name:<18} skipped: {why}")
    lines.append("")
    for g in report["goals"]:
        lines.append(f"{'MET  ' if g['met'] else 'SHORT'} {g['goal']}: {g['shown']}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", choices=SIZES, default="full")
    ap.add_argument("--only", nargs="+", metavar="SYSTEM",
                    help=f"a subset of {', '.join(SYSTEMS)}")
    ap.add_argument("--repeat", type=int, default=1,
                    help="measure each point this many times (median, spread)")
    ap.add_argument("--json", action="store_true", help="print JSON, not a table")
    args = ap.parse_args(argv)
    if args.repeat < 1:
        ap.error("--repeat must be at least 1")
    try:
        report = run(args.size, args.only, args.repeat)
    except BenchError as err:
        print(f"benchmark failed: {err}", file=sys.stderr)
        return 1
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0
