"""The course's headline numbers, recomputed small enough for a review page.

The review pages quote what each chapter measured; this module reruns the same
lab code at a size that takes seconds, so those pages glue numbers from a run
instead of copying them from another page.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from contextlib import ExitStack

from handson import c01_job_scheduler as c01
from handson import cluster_runs, outbox, outbox_runs, replay_matrix
from handson.book import sim
from handson.effects.sqldb import default_target
from handson.faults.engine import ChaosConfig
from handson.faults.engine import run as chaos_run
from handson.redis_server import redis_url


def delivery() -> dict:
    """Chapter 1's stream: every crash is a lost job (ack first) or a repeat."""
    jobs = c01.stream()
    return {"jobs": len(jobs), "crashes": sum(crashed for _, crashed in jobs)}


def drain() -> dict:
    """The simulation's spike against backlog / (capacity - arrivals).

    The same seeded runs "Queues and logs" averages, so both pages show one
    number.
    """
    cap = sim.QueueSim(workers=4).capacity()
    runs = sim.spike_drains()
    return {"spike": sim.SPIKE_JOBS, "capacity": cap, "arrivals": 6.0,
            "predicted_s": sim.predicted_drain_s(sim.SPIKE_JOBS, cap, 6.0),
            "mean_s": statistics.mean(runs), "runs": len(runs),
            "lease_s": sim.LEASE_TICKS * sim.TICK_S}


CRASH_P = 0.1     # share of commits after which the worker is killed


def chaos(url: str, docs: int = 60) -> dict:
    """The naive and the idempotent sink, each worker killed after a commit.

    The kill lands where the lesson lives: the score is committed, the ack is
    not sent, and the job comes back when its lease runs out. Each such kill is
    a second delivery of a job whose effect already happened, so the naive sink
    must show duplicate rows (one for each commit whose ack never reached Redis,
    less one per dead-lettered job: the check below fails the build otherwise)
    and the idempotent one none. A kill that lands after the ack reached Redis
    brings nothing back; the chaos judge tells the two apart.
    """
    out = {}
    for idem in (False, True):
        cfg = ChaosConfig(docs=docs, workers=2, iters=20_000, kill_every=0,
                          idem=idem, lease_s=0.5, seed=1,
                          crash_points=("after-commit",), crash_p=CRASH_P)
        rep = chaos_run(cfg, redis_url=url)
        s = rep.stats
        out["idem" if idem else "naive"] = {
            "verdict": rep.verdict, "kills": s["crash_kills"], "lost": s["lost"],
            "duplicates": s["rows"] - s["distinct"], "dlq": s["dlq"],
            "in_window": s["unacked"]["died"]}
    check_chaos(out)
    return out


def check_chaos(out: dict) -> None:
    """The evidence shows the lesson, or the page is not built."""
    naive, idem = out["naive"], out["idem"]
    assert naive["kills"] >= 3 and idem["kills"] >= 3, (
        f"too few kills after a commit to show anything: {out}")
    assert naive["duplicates"] >= max(1, naive["in_window"] - naive["dlq"]), (
        "the naive sink should write a duplicate for each commit killed before "
        f"its ack reached Redis, less one per dead job: {naive}")
    assert idem["duplicates"] == 0 and idem["lost"] == naive["lost"] == 0, out


def policies() -> dict:
    """Emails in replay cases 5 and 6 under each stale-claim policy."""
    with tempfile.TemporaryDirectory(prefix="eo-review-") as tmp:
        target = default_target(os.path.join(tmp, "jobs.sqlite"))
        return {p: (a, b) for p, a, b in replay_matrix.policy_table(target, tmp)}


def dual_write(url: str, docs: int = 30, kills: int = 3) -> dict:
    """Saves killed between the two writes, for each save mode."""
    with tempfile.TemporaryDirectory(prefix="eo-review-") as tmp:
        bench = outbox_runs.Bench(default_target(os.path.join(tmp, "app.sqlite")), url)
        try:
            runs = [outbox_runs.dual_write(bench, m, docs=docs, kills=kills)
                    for m in outbox.SAVE_MODES]
        finally:
            bench.close()
    return {r.mode: r for r in runs}


def failover() -> dict:
    """The cluster chapter's lagging-replica failover, without and with WAIT 1.

    Its own private cluster: a failover kills a primary.
    """
    plain, waited = cluster_runs.failover_table(cluster_runs.SCENARIOS[1:])
    return {"cut_s": plain.cut_s, "wait_ms": waited.wait_ms,
            **{f"{k}_{a}": getattr(f, a) for k, f in (("plain", plain),
                                                      ("wait", waited))
               for a in ("acknowledged", "lost")}}


def everything() -> dict:
    """All of the above on one private Redis."""
    with ExitStack() as stack:
        url = stack.enter_context(redis_url())
        return {"delivery": delivery(), "drain": drain(), "chaos": chaos(url),
                "policies": policies(), "dual_write": dual_write(url),
                "failover": failover()}
