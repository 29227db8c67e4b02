"""What each hot-path script of the reference queue costs the server.

    python -m handson.bench.scripts [--calls N]

Each script runs N times alone on a private redis-server. INFO commandstats
counts the Redis commands it calls inside, SLOWLOG (with a threshold of 0)
records each call's time inside the server, and an empty script with the same
keys, and a PING, give what any script call and any command cost before any
work: the rest is the work of the script's own commands. The times are the
medians of N calls on whatever machine this is; the counts do not depend on it.

The client's side is measured too, in this process's CPU time per call: a job
through the queue's functions, a PING through redis-py, and a PING written and
read on a bare connection, which is what the round trip itself costs the client
without redis-py's per-call machinery (pool, retries, reply callbacks).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import redis

from handson import q
from handson.bench.systems import LEASE_S, SYSTEMS
from handson.redis_server import EmbeddedRedis

_EMPTY = q._Script("return 1")


def _phase(r: redis.Redis, n: int, call) -> dict:
    """Run call() n times; the commands it made inside scripts and µs per call."""
    r.config_resetstat()
    r.slowlog_reset()
    for _ in range(n):
        call()
    stats = r.info("commandstats")
    log = r.slowlog_get(n + 10)
    outside = {"cmdstat_evalsha", "cmdstat_ping", "cmdstat_slowlog",
               "cmdstat_config", "cmdstat_info"}
    inside = {k.removeprefix("cmdstat_").upper(): v for k, v in stats.items()
              if k not in outside}
    times = [e["duration"] for e in log
             if e["command"].split()[0].upper() in (b"EVALSHA", b"PING")]
    return {"commands": sum(v["calls"] for v in inside.values()) / n,
            "server_us": statistics.median(times),
            "inside_us": {name: v["usec"] / n for name, v in inside.items()}}


def measure(n: int = 2000) -> dict[str, dict]:
    """Per script (and the empty script, and PING): commands inside, µs a call."""
    server = EmbeddedRedis().start()
    try:
        r = redis.Redis.from_url(server.url)
        k = q.keys("q")
        SYSTEMS["reference"].fill(r, 2 * n + 2)
        for script in (q._claim, q._ack, q._ack_and_claim, q._enqueue, _EMPTY):
            r.script_load(script.source)      # no SCRIPT LOAD inside a phase
        r.config_set("slowlog-log-slower-than", 0)
        r.config_set("slowlog-max-len", n + 10)
        out, held = {}, []
        out["claim"] = _phase(r, n, lambda: held.append(q.claim(r, LEASE_S)))
        jobs = iter(held)
        out["ack"] = _phase(r, n, lambda: q.ack(r, *next(jobs)[::2]))
        job = [q.claim(r, LEASE_S)]

        def fused():
            job[0] = q.ack_and_claim(r, job[0][0], job[0][2], LEASE_S)[1]
        out["ack_and_claim"] = _phase(r, n - 1, fused)
        ids = iter(range(n))
        out["enqueue"] = _phase(r, n, lambda: q.enqueue(r, {}, f"e{next(ids)}"))
        out["empty script"] = _phase(
            r, n, lambda: _EMPTY(r, (k.inflight, k.jobs, k.done)))
        out["PING"] = _phase(r, n, r.ping)
        return out
    finally:
        server.stop()


def _cpu_us(n: int, call) -> float:
    t0 = time.process_time()
    for _ in range(n):
        call()
    return (time.process_time() - t0) * 1e6 / n


def client(n: int = 2000) -> dict[str, float]:
    """This process's CPU µs per job (or per PING), the fastest of three tries."""
    server = EmbeddedRedis().start()
    try:
        r = redis.Redis.from_url(server.url)
        SYSTEMS["reference"].fill(r, 7 * n + 2)
        job = [q.claim(r, LEASE_S)]

        def plain():
            j = q.claim(r, LEASE_S)
            q.ack(r, j[0], j[2])

        def fused():
            job[0] = q.ack_and_claim(r, job[0][0], job[0][2], LEASE_S)[1]

        conn = r.connection_pool.get_connection()

        def bare():
            conn.send_command("PING")
            conn.read_response()
        calls = {"job, claim + ack": plain, "job, ack_and_claim": fused,
                 "PING, redis-py": r.ping, "PING, bare connection": bare}
        out = {name: min(_cpu_us(n, c) for _ in range(3)) for name, c in calls.items()}
        r.connection_pool.release(conn)
        return out
    finally:
        server.stop()


def table(costs: dict[str, dict]) -> str:
    lines = [f"{'script':<14} {'commands':>8} {'µs a call':>9}  µs in its commands"]
    for name, c in costs.items():
        inside = sorted(c["inside_us"].items(), key=lambda kv: -kv[1])
        lines.append(f"{name:<14} {c['commands']:>8.1f} {c['server_us']:>9.1f}  "
                     + " ".join(f"{k} {v:.1f}" for k, v in inside))
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=2000, help="calls per script")
    args = ap.parse_args(argv)
    if args.calls < 10:
        ap.error("--calls must be at least 10")
    print(table(measure(args.calls)))
    print(f"\n{'client':<22} CPU µs a call (this process)")
    for name, us in client(args.calls).items():
        print(f"{name:<22} {us:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
