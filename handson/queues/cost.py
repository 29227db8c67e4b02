"""What a queue costs the server per job: round trips, commands, CPU.

A job's life is one enqueue, one claim and one ack; each is called JOBS times
on an empty database and the server is asked before and after (INFO, on the
caller's own connection: a queue's Redis user may not run it, nor reset the
counters). Round trips are the reads the server made from its clients
(`total_reads_processed`): a script, a pipeline or a MULTI/EXEC block sent at
once is one, each WATCH or plain command another. Commands count those run
inside scripts and transactions too. Both are exact and the same on every
run, once nothing else uses the server: a connection that opens or closes
meanwhile (a process of an earlier step going away) adds a read, so a run
that saw one is measured again. The server's CPU time (user + system) is
not exact on a busy machine, so it is only ever shown, never judged.

The reference queue (`handson.q`) is measured the same way on the same
server, so a learner sees the two side by side:

    python -m handson.queues.cost myq.py
"""

from __future__ import annotations

import argparse
import json
import sys

from handson.queues.contract import ContractError, load_queue
from handson.redis_server import cli_redis, connect, redis_url

JOBS = 50
LIMIT_S = 30        # the grader's limit for both queues' runs (a few s each)
LEASE_S = 30.0
PER_JOB = ("enqueue", "claim", "ack")
REFERENCE = "handson.q"


def _counters(judge) -> tuple[int, int, float]:
    """(reads, commands, CPU µs) the server has done so far, in one INFO."""
    info = judge.info("all")
    commands = sum(v["calls"] for k, v in info.items()
                   if k.startswith("cmdstat_") and k != "cmdstat_info")
    cpu = float(info["used_cpu_user"]) + float(info["used_cpu_sys"])
    return int(info["total_reads_processed"]), commands, cpu * 1e6


def _clients(judge) -> tuple:
    """Who is connected, and how many connections were ever made."""
    ids = frozenset(c["id"] for c in judge.client_list())
    return ids, judge.info("stats")["total_connections_received"]


def _overhead(judge, samples: int = 5) -> list:
    """What asking costs. Another client's command, even on a connection
    that neither opens nor closes meanwhile, can only add to a sample, and
    it would be taken off every phase's count: the least sample is the cost."""
    deltas = []
    for _ in range(samples):
        a = _counters(judge)
        deltas.append([b - x for x, b in zip(a, _counters(judge), strict=True)])
    least = [min(d[i] for d in deltas) for i in range(2)]
    return [*least, 0.0]              # CPU: too small to tell from the noise


def _phase(judge, calls, overhead, alone: list[bool], clients: tuple) -> dict:
    """Counter deltas over `calls()`, less what asking costs (`overhead`);
    `alone` becomes [False] if a connection opened or closed since `clients`
    was taken, before the warm-up (a queue's connections made there cost
    one try more): another client's connection that opened just
    before a phase could send its first commands inside it and close after it
    (a loaded CI run measured 3.25 round trips a job for 3)."""
    before = _counters(judge)
    n = calls()
    after = _counters(judge)
    if _clients(judge) != clients:
        alone[0] = False
    d = [max(b - a - o, 0) for a, b, o in zip(before, after, overhead, strict=True)]
    return {"calls": n, "round_trips": d[0] / n, "commands": d[1] / n,
            "cpu_us": round(d[2] / n, 1)}


def measure(q, r, judge, jobs: int = JOBS, tries: int = 3) -> dict:
    """Per call of each of enqueue, claim, ack (and reap, with nothing to reap),
    and their sum per job; `r` the queue's client, `judge` one that may INFO.
    Measured again (up to `tries` times) while others' connections come or go."""
    for _ in range(tries):
        out, alone = _measure(q, r, judge, jobs)
        if alone:
            break
    return out


def _measure(q, r, judge, jobs: int) -> tuple[dict, bool]:
    r.flushdb()                       # (its connection made, if it was not)
    clients = _clients(judge)
    for i in range(3):                # connections made, scripts loaded
        q.enqueue(r, {"warm": i}, f"warm-{i}")
    for _ in range(3):
        job = q.claim(r, LEASE_S)
        if job is not None:
            q.ack(r, job[0], job[2])
    q.reap(r, 3)
    overhead = _overhead(judge)
    alone = [_clients(judge) == clients]
    ids = [f"cost-{i}" for i in range(jobs)]
    claimed: list = []

    def enqueue():
        for i in ids:
            q.enqueue(r, {"doc": i}, i)
        return jobs

    def claim():
        claimed.extend(q.claim(r, LEASE_S) for _ in ids)
        return jobs

    def ack():
        for job in claimed:
            if job is not None:
                q.ack(r, job[0], job[2])
        return jobs

    def reap():
        for _ in range(10):
            q.reap(r, 3)
        return 10

    out = {name: _phase(judge, fn, overhead, alone, clients) for name, fn in
           (("enqueue", enqueue), ("claim", claim), ("ack", ack), ("reap", reap))}
    out["per_job"] = {k: round(sum(out[f][k] for f in PER_JOB), 2)
                      for k in ("round_trips", "commands", "cpu_us")}
    return out, alone[0]


def compare(spec: str, url: str, jobs: int = JOBS) -> dict:
    """The queue at `spec` and the reference, measured one after the other."""
    judge = connect(url)
    out = {"jobs": jobs}
    for name, which in (("reference", REFERENCE), ("yours", spec)):
        q = load_queue(which)
        r = connect(url, decode_responses=True)
        try:
            out[name] = measure(q, r, judge, jobs)
        finally:
            r.flushdb()
            r.close()
            if hasattr(q, "close"):
                q.close()
    return out


def advice(cost: dict) -> str:
    """One sentence: where the queue's round trips exceed the reference's."""
    yours, ref = cost["yours"], cost["reference"]
    over = [(yours[f]["round_trips"] - ref[f]["round_trips"], f)
            for f in (*PER_JOB, "reap")]
    worst, fn = max(over)
    if worst <= 0:
        return ("as few round trips as the reference: each call is one step on "
                "the server")
    return (f"{fn} makes {yours[fn]['round_trips']:g} round trips per call where "
            f"the reference makes {ref[fn]['round_trips']:g}: one Lua script can "
            "do its reads and writes in one round trip")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("queue", help="module name (handson.q) or path (myq.py)")
    ap.add_argument("--jobs", type=int, default=JOBS)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.jobs < 1:
        ap.error("--jobs must be at least 1")
    with cli_redis(), redis_url() as url:
        try:
            cost = compare(args.queue, url, args.jobs)
        except ContractError as err:
            print(f"cannot measure: {err}", file=sys.stderr)
            return 2
    if args.json:
        print(json.dumps(cost))
        return 0
    print(f"{'per job':<10}{'round trips':>14}{'commands':>10}{'server CPU µs':>15}")
    for who in ("yours", "reference"):
        c = cost[who]["per_job"]
        print(f"{who:<10}{c['round_trips']:>14g}{c['commands']:>10g}"
              f"{c['cpu_us']:>15g}")
    print(advice(cost))
    return 0


if __name__ == "__main__":
    sys.exit(main())
