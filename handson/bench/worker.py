"""A benchmark worker process: `python -m handson.bench.worker SYSTEM` or `ping N`.

BENCH_REDIS_URL names the server; BENCH_CPUS (e.g. "1"), when set, pins this
process to those CPUs before any thread starts, so every thread inherits it.
`ping N` times N PINGs on one connection and prints the rate: the most round
trips per second one client can make.
"""

import json
import os
import sys
import time

import redis

from handson.bench import tasks
from handson.bench.systems import SYSTEMS


def ping_rate(n: int) -> float:
    r = redis.Redis.from_url(tasks.url())
    r.ping()
    t0 = time.perf_counter()
    for _ in range(n):
        r.ping()
    return n / (time.perf_counter() - t0)


def main(argv: list[str]) -> int:
    if os.environ.get("BENCH_CPUS"):
        os.sched_setaffinity(0, {int(c) for c in os.environ["BENCH_CPUS"].split(",")})
    if argv[:1] == ["ping"]:
        print(json.dumps({"ping_per_s": ping_rate(int(argv[1]))}), flush=True)
        return 0
    if not argv or argv[0] not in SYSTEMS:
        print(f"usage: worker SYSTEM|ping N; systems: {', '.join(SYSTEMS)}",
              file=sys.stderr)
        return 2
    SYSTEMS[argv[0]].work()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
