"""A benchmark worker process: `python -m handson.bench.worker SYSTEM` or `ping`.

BENCH_REDIS_URL names the server; BENCH_CPUS (e.g. "1"), when set, pins this
process to those CPUs before any thread starts, so every thread inherits it.
`ping` sends PINGs on one connection until it is killed: the most round trips
one client can make. The runner counts them on the server, so this loop does
nothing but the round trips.
"""

import os
import sys

import redis

from handson.bench import tasks
from handson.bench.systems import SYSTEMS
from handson.redis_server import die_with_parent


def ping_forever() -> None:
    r = redis.Redis.from_url(tasks.url())
    while True:
        r.ping()


def main(argv: list[str]) -> int:
    if os.environ.get("BENCH_PARENT"):  # paused workers must not outlive the runner
        die_with_parent(int(os.environ["BENCH_PARENT"]))
    if os.environ.get("BENCH_CPUS"):
        os.sched_setaffinity(0, {int(c) for c in os.environ["BENCH_CPUS"].split(",")})
    if argv == ["ping"]:
        ping_forever()
    if not argv or argv[0] not in SYSTEMS:
        print(f"usage: worker SYSTEM|ping; systems: {', '.join(SYSTEMS)}",
              file=sys.stderr)
        return 2
    SYSTEMS[argv[0]].work()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
