"""Break It: four ways to break the queue, each shown failing and then fixed.

    python -m handson.breakit lease            [--size small|full]
    python -m handson.breakit attempts         [--size small|full]
    python -m handson.breakit ack-before-work  [--size small|full]
    python -m handson.breakit unbounded        [--size small|full]

Each experiment runs the broken setting, then the fix, on the same documents,
and prints the two side by side with what to look at. The first three use the
chaos engine (real workers, real SIGKILL); `unbounded` runs a producer faster
than the workers and watches Redis's memory and the oldest job's age.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from handson import produce, q, redis_server, setup_db, verify, work
from handson.faults.engine import ChaosConfig, Report
from handson.faults.engine import run as chaos_run
from handson.measure import Pool

# The small lease leaves a heartbeat (every lease/3) 0.4 s of slack: a build
# beside a CPU hog delays a thread by tens of milliseconds, not hundreds. An odd
# number of documents leaves one worker idle beside the last job: it reaps that
# job's lease mid-job (a job lasts at least job_s, longer than the lease and a
# reap tick), so the broken run duplicates on any machine.
SIZES = {
    "small": {
        "lease": {"docs": 5, "workers": 2, "job_s": 1.2, "lease_s": 0.6},
        "attempts": {"docs": 60, "workers": 2, "iters": 10_000, "poison_every": 10,
                     "loop_claims": 6, "broken_s": 60.0},
        "ack-before-work": {"docs": 150, "workers": 2, "iters": 20_000},
        "unbounded": {"workers": 2, "iters": 10_000, "rate": 1500, "seconds": 5.0,
                      "bound": 100, "sample_s": 0.25},
    },
    "full": {
        "lease": {"docs": 100, "workers": 4, "job_s": 0.02, "lease_s": 0.01},
        "attempts": {"docs": 2000, "workers": 4, "iters": 20_000,
                     "poison_every": 100, "loop_claims": 10, "broken_s": 300.0},
        "ack-before-work": {"docs": 2000, "workers": 4, "iters": 20_000},
        "unbounded": {"workers": 2, "iters": 20_000, "rate": 500, "seconds": 180.0,
                      "bound": 5000, "sample_s": 1.0},
    },
}


def _log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _progress(p: dict) -> None:
    _log(f"  [{p['elapsed_s']:5.1f} s] {p['done']}/{p['total']} done, "
         f"kills={p['kills']} ({p['phase']})")


@dataclass
class Run:
    """One chaos run, reduced to what an experiment compares."""

    label: str
    verdict: str
    kills: int
    rows: int
    distinct: int
    dlq: int
    lost: int
    deliveries: dict[str, int]      # deliveries per job -> how many jobs
    claims: list[tuple[float, str]] = field(default_factory=list)  # (s, job)
    text: str = ""

    @property
    def duplicates(self) -> int:
        return self.rows - self.distinct

    @property
    def max_deliveries(self) -> int:
        return max((int(k) for k in self.deliveries), default=0)


def _chaos(label: str, cfg: ChaosConfig, url: str) -> Run:
    _log(f"{label}: {cfg.docs} docs, {cfg.workers} workers ...")
    with tempfile.TemporaryDirectory(prefix="eo-breakit-") as work:
        rep: Report = chaos_run(cfg, redis_url=url, workdir=work, progress=_progress)
        claims = _claims(Path(work) / "events")
    s = rep.stats
    return Run(label, rep.verdict, s["kills"], s["rows"], s["distinct"], s["dlq"],
               s["lost"], s["delivery_histogram"], claims, rep.text())


def _claims(events: Path) -> list[tuple[float, str]]:
    out = []
    for path in events.glob("*.jsonl"):
        for line in path.read_text(errors="replace").splitlines():
            e = json.loads(line)
            if e.get("ev") == "claim":
                out.append((e["t"], e["job"]))
    out.sort()
    t0 = out[0][0] if out else 0
    return [((t - t0) / 1e9, job) for t, job in out]


def _runs_table(runs: list[Run]) -> str:
    lines = [f"{'':<34} {'verdict':>8} {'kills':>5} {'rows':>5} {'distinct':>8} "
             f"{'dupes':>5} {'DLQ':>4} {'lost':>4} {'max deliveries':>14}"]
    for x in runs:
        lines.append(f"{x.label:<34} {x.verdict:>8} {x.kills:>5} {x.rows:>5} "
                     f"{x.distinct:>8} {x.duplicates:>5} {x.dlq:>4} {x.lost:>4} "
                     f"{x.max_deliveries:>14}")
    return "\n".join(lines)


@dataclass
class Experiment:
    name: str
    broken: object
    fixed: object
    lesson: str
    table: str
    facts: dict = field(default_factory=dict)

    def text(self) -> str:
        return f"{self.table}\n\n{self.lesson}"


# -- 1. a lease shorter than the job ---------------------------------------------

def iters_for(seconds: float) -> int:
    """ITERS that make one document take at least `seconds` on this machine.

    The fastest of five probes: one probe taken while another process had the
    CPU made jobs that ran several times shorter than asked once it was free.
    """
    probe = 20_000
    fastest = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        work.score("calibrate", iters=probe)
        fastest = min(fastest, time.perf_counter() - t0)
    return max(1000, round(probe * seconds / fastest))


@dataclass
class PoolRun:
    """Workers on a queue of documents until nothing is pending or in flight."""

    label: str
    summary: dict                   # handson.verify.summary of the results
    dead: list[tuple[str, int, str]]
    elapsed_s: float

    @property
    def duplicates(self) -> int:
        return self.summary["naive_rows"] - self.summary["naive_distinct"]


def _pool_run(url: str, label: str, docs: int, workers: int, iters: int,
              args: tuple[str, ...], timeout_s: float = 300.0,
              env: dict | None = None) -> PoolRun:
    _log(f"{label}: {docs} docs, {workers} workers ...")
    r = redis_server.connect(url, decode_responses=True)
    q.reset(r)
    from handson.measure import fill

    with tempfile.TemporaryDirectory(prefix="eo-lease-") as work_dir:
        db = setup_db.setup(Path(work_dir) / "results.db")
        with Pool(url, db, workers, iters, args,
                  env={"IDEM": "0", **(env or {})}) as pool:
            # The documents go in once every worker is connected, so the
            # workers start together, whatever each took to import.
            deadline = time.monotonic() + 60
            while len(r.client_list()) < workers + 1:
                pool.check()
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: the workers did not connect")
                time.sleep(0.05)
            fill(r, 0, docs)
            t0 = time.monotonic()
            while (s := q.stats(r))["pending"] or s["inflight"]:
                pool.check()
                if time.monotonic() - t0 > timeout_s:
                    raise RuntimeError(f"{label}: not done after {timeout_s:g} s")
                time.sleep(0.05)
        elapsed = time.monotonic() - t0
        summary = verify.summary(str(db))
    dead = q.dead(r)
    q.reset(r)
    r.close()
    return PoolRun(label, summary, dead, elapsed)


def lease(size: str = "small", url: str | None = None) -> Experiment:
    p = SIZES[size]["lease"]
    lease_s = p["lease_s"]
    # A tenth of the job is computing, the rest waiting: its length is the
    # lesson's, not the machine's.
    iters = iters_for(p["job_s"] / 10)
    common = ("--lease", str(lease_s), "--max-attempts", "3")
    env = {"WORK_MIN_S": str(p["job_s"])}
    with ExitStack() as stack:
        url = url or stack.enter_context(redis_server.redis_url())
        broken = _pool_run(url, f"lease {lease_s} s, no heartbeat", p["docs"],
                           p["workers"], iters, (*common, "--no-heartbeat"), env=env)
        fixed = _pool_run(url, f"lease {lease_s} s, heartbeat", p["docs"],
                          p["workers"], iters, common, env=env)
    lines = [f"{'':<30} {'rows':>5} {'distinct':>8} {'dupes':>5} {'DLQ':>4} "
             f"{'seconds':>7}"]
    for x in (broken, fixed):
        lines.append(f"{x.label:<30} {x.summary['naive_rows']:>5} "
                     f"{x.summary['naive_distinct']:>8} {x.duplicates:>5} "
                     f"{len(x.dead):>4} {x.elapsed_s:>7.1f}")
    reasons = sorted({why for _, _, why in broken.dead})
    lesson = (f"Each document takes about {p['job_s']:g} s, the lease is "
              f"{lease_s:g} s, and nobody was killed. Without a heartbeat the naive "
              f"table got {broken.summary['naive_rows']} rows for "
              f"{broken.summary['naive_distinct']} documents "
              f"({broken.duplicates} duplicates), and healthy jobs in the DLQ: "
              f"{len(broken.dead)}"
              + (f" ({'; '.join(reasons)})" if reasons else "")
              + ": every lease ran out mid-job, a colleague reaped it and started "
              "again, and each finished its copy. With a heartbeat (extend every "
              f"lease/3) the same documents give {fixed.duplicates} duplicates and "
              f"{len(fixed.dead)} dead.")
    return Experiment("lease", broken, fixed, lesson, "\n".join(lines),
                      {"iters": iters})


# -- 2. no attempt limit -----------------------------------------------------------

def poison_share(claims: list[tuple[float, str]], poison: set[str],
                 bins: int = 4) -> list[float]:
    """The fraction of claims that went to poison jobs, per equal slice of time."""
    if not claims:
        return []
    end = claims[-1][0] or 1.0
    counts = [Counter() for _ in range(bins)]
    for t, job in claims:
        counts[min(bins - 1, int(t / end * bins))][job in poison] += 1
    return [c[True] / max(1, c[True] + c[False]) for c in counts]


def attempts(size: str = "small", url: str | None = None) -> Experiment:
    p = SIZES[size]["attempts"]
    poison = {f"doc-{i}" for i in range(p["docs"])
              if "POISON" in produce.doc_text(i, p["poison_every"])}
    base = dict(docs=p["docs"], workers=p["workers"], iters=p["iters"],
                poison_every=p["poison_every"], kill_every=0.0, lease_s=0.2)
    with ExitStack() as stack:
        url = url or stack.enter_context(redis_server.redis_url())
        # The broken run ends once every poison job has looped loop_claims
        # times (broken_s is only a cap): a slow machine loops later, not less.
        broken = _chaos("max_attempts = 1,000,000",
                        ChaosConfig(**base, max_attempts=1_000_000,
                                    loop_claims=p["loop_claims"],
                                    drain_timeout_s=p["broken_s"]), url)
        fixed = _chaos("max_attempts = 3", ChaosConfig(**base, max_attempts=3), url)
    share = poison_share(broken.claims, poison)
    poison_claims = sum(job in poison for _, job in broken.claims)
    span = broken.claims[-1][0] if broken.claims else 0.0
    lesson = (f"{len(poison)} of {p['docs']} documents are poison. With no limit "
              f"they were claimed {poison_claims} times in {span:.1f} s and "
              f"never left: the run ends '{broken.verdict}' with {broken.dlq} in "
              "the DLQ. Share of all claims that went to poison, by quarter of the "
              "run: " + ", ".join(f"{x:.0%}" for x in share) + ". Once the good "
              "work is done the pool does nothing but fail. With the limit back the "
              f"run is '{fixed.verdict}': {fixed.dlq} jobs in the DLQ, each after "
              f"{fixed.max_deliveries} deliveries.")
    return Experiment("attempts", broken, fixed, lesson, _runs_table([broken, fixed]),
                      {"share": share, "poison": len(poison),
                       "poison_ids": sorted(poison),
                       "poison_claims": poison_claims})


# -- 3. ack before work ------------------------------------------------------------

def ack_before_work(size: str = "small", url: str | None = None) -> Experiment:
    p = SIZES[size]["ack-before-work"]
    # Kills keyed to claims, with a quota: on a loaded machine a clock-keyed
    # schedule can finish the documents before its first kill, and a kill that
    # finds its worker between jobs loses nothing (about half did here), so
    # twelve must land.
    base = dict(docs=p["docs"], workers=p["workers"], iters=p["iters"],
                kill_every=0, kill_every_claims=10, min_kills=12, idem=True,
                lease_s=0.5)
    with ExitStack() as stack:
        url = url or stack.enter_context(redis_server.redis_url())
        broken = _chaos("ack before work", ChaosConfig(**base, ack_before_work=True),
                        url)
        fixed = _chaos("ack after commit", ChaosConfig(**base), url)
    # The poison document is lost too when acked first: its fail() finds no lease.
    poison_lost = fixed.dlq if broken.dlq == 0 else 0
    killed = broken.lost - poison_lost
    lesson = (f"Acking first, {broken.kills} kill(s) lost {killed} job(s) that were "
              f"mid-work, and the DLQ holds {broken.dlq}"
              + (f": the {poison_lost} poison document(s) vanished as well, because "
                 "fail() came after the ack and found no lease to fail"
                 if poison_lost else "")
              + f" ({broken.lost} lost in all). No error anywhere: the queue did what "
              f"it was told. Acking after the commit, {fixed.kills} kill(s) lost "
              f"{fixed.lost}.")
    return Experiment("ack-before-work", broken, fixed, lesson,
                      _runs_table([broken, fixed]),
                      {"killed_mid_work": killed, "poison_lost": poison_lost})


# -- 4. a producer faster than the consumers, no bound ---------------------------

@dataclass
class Flood:
    label: str
    bound: int | None
    samples: list[tuple[float, int, float, int]]    # (s, pending, age s, data B)
    sent: int
    refused: int

    @property
    def memory_growth(self) -> int:
        return self.samples[-1][3] - self.samples[0][3]

    @property
    def peak_pending(self) -> int:
        return max(s[1] for s in self.samples)

    @property
    def last_age(self) -> float:
        return self.samples[-1][2]


def _dataset_bytes(r) -> int:
    """What Redis holds for its keys: used_memory less the server's overhead
    (client buffers, replication, scripts). used_memory itself moved by 50 kB
    with the workers' connections, as much as a small run's whole backlog."""
    return int(r.info("memory")["used_memory_dataset"])


def _flood(url: str, p: dict, bound: int | None, label: str) -> Flood:
    _log(f"{label}: {p['workers']} workers, a producer at {p['rate']}/s for "
         f"{p['seconds']:g} s ...")
    r = redis_server.connect(url, decode_responses=True)
    q.reset(r)
    samples, sent, refused = [], 0, 0
    stop = threading.Event()
    limit = bound if bound is not None else 10**9

    def producer() -> None:
        nonlocal sent, refused
        pr = redis_server.connect(url, decode_responses=True)
        t0, i = time.monotonic(), 0
        while not stop.is_set():
            if (wait := t0 + i / p["rate"] - time.monotonic()) > 0:
                stop.wait(wait)
                continue
            try:
                q.enqueue(pr, {"doc_id": i, "text": produce.doc_text(i, 0)},
                          job_id=f"doc-{i}", max_pending=limit)
                sent += 1
            except q.QueueFull:
                refused += 1       # the app answers 503 + Retry-After here
            i += 1
        pr.close()

    with tempfile.TemporaryDirectory(prefix="eo-flood-") as work, \
            Pool(url, setup_db.setup(Path(work) / "results.db"), p["workers"],
                 p["iters"]) as pool:
        thread = threading.Thread(target=producer, daemon=True)
        t0 = time.monotonic()
        thread.start()
        try:
            while (now := time.monotonic() - t0) < p["seconds"]:
                s = q.stats(r)
                samples.append((round(now, 2), s["pending"],
                                s["oldest_pending_age_s"],
                                _dataset_bytes(r)))
                pool.check()
                time.sleep(p["sample_s"])
        finally:
            stop.set()
            thread.join(timeout=10)
    q.reset(r)
    r.close()
    return Flood(label, bound, samples, sent, refused)


def _flood_table(runs: list[Flood]) -> str:
    lines = [f"{'':<24} {'enqueued':>8} {'refused':>7} {'peak pending':>12} "
             f"{'oldest age at end':>17} {'memory growth':>13}"]
    for x in runs:
        lines.append(f"{x.label:<24} {x.sent:>8} {x.refused:>7} {x.peak_pending:>12} "
                     f"{x.last_age:>15.1f} s {x.memory_growth / 1e6:>10.2f} MB")
    return "\n".join(lines)


def unbounded(size: str = "small", url: str | None = None) -> Experiment:
    p = SIZES[size]["unbounded"]
    with ExitStack() as stack:
        url = url or stack.enter_context(redis_server.redis_url())
        broken = _flood(url, p, None, "no bound")
        fixed = _flood(url, p, p["bound"], f"QUEUE_MAX = {p['bound']}")
    mid = broken.samples[len(broken.samples) // 2]
    climbing = (broken.samples[-1][1] > mid[1] and broken.samples[-1][2] > mid[2]
                and broken.samples[-1][3] > mid[3])
    lesson = (f"Without a bound the backlog reached {broken.peak_pending:,} jobs, the "
              f"oldest had waited {broken.last_age:.1f} s and Redis's data grew by "
              f"{broken.memory_growth / 1e6:.2f} MB"
              + (", all three still climbing when the run stopped" if climbing
                 else "") + f". With QUEUE_MAX = {p['bound']} the producer was refused "
              f"{fixed.refused:,} times (QueueFull; the web app turns it into 503 "
              f"with Retry-After), the backlog stayed at {fixed.peak_pending:,} and "
              f"the oldest job was {fixed.last_age:.1f} s old at the end.")
    return Experiment("unbounded", broken, fixed, lesson,
                      _flood_table([broken, fixed]))


def flood_figure(exp: Experiment):
    """Backlog and oldest-job age over time, unbounded against bounded."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3))
    ax1, ax2 = fig.subplots(1, 2)
    for run, color in ((exp.broken, "#c0392b"), (exp.fixed, "#2c3e50")):
        ts = [s[0] for s in run.samples]
        ax1.plot(ts, [s[1] for s in run.samples], color=color, label=run.label)
        ax2.plot(ts, [s[2] for s in run.samples], color=color, label=run.label)
    ax1.set_ylabel("jobs waiting")
    ax2.set_ylabel("oldest job's age (s)")
    for ax in (ax1, ax2):
        ax.set_xlabel("seconds")
        ax.set_ylim(bottom=0)
    ax1.legend(frameon=False)
    fig.tight_layout()
    return fig


EXPERIMENTS = {"lease": lease, "attempts": attempts,
               "ack-before-work": ack_before_work, "unbounded": unbounded}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("what", choices=EXPERIMENTS)
    ap.add_argument("--size", choices=SIZES, default="full")
    args = ap.parse_args(argv)
    try:
        exp = EXPERIMENTS[args.what](args.size)
    except (RuntimeError, redis_server.RedisUnavailable) as err:
        print(f"breakit {args.what} failed: {err}", file=sys.stderr)
        return 1
    print(exp.text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
