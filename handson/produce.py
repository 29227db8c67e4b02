"""Enqueue N documents; every 1000th (doc i with i % 1000 == 7) is poison.

    python -m handson.produce N [--queue handson.q]     # needs REDIS_URL

Job ids are natural keys (`doc-<i>`), so producing twice makes no new jobs.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import ModuleType

JOB_IDS = r"doc-\d+"    # what a job id of produce() looks like, in any reply


def doc_text(i: int, poison_every: int = 1000) -> str:
    poison = poison_every > 0 and i % poison_every == 7
    return f"doc {i}" + (" POISON" if poison else "")


def produce(r, queue: ModuleType, n: int, poison_every: int = 1000,
            start: int = 0) -> list[str]:
    """Enqueue docs start..start+n-1 through the contract; returns their job ids."""
    ids = []
    for i in range(start, start + n):
        job_id = f"doc-{i}"
        queue.enqueue(r, {"doc_id": i, "text": doc_text(i, poison_every)},
                      job_id=job_id)
        ids.append(job_id)
    return ids


def redis_from_env():
    """The client for REDIS_URL, or exit with what to do."""
    from handson import redis_server

    url = os.environ.get("REDIS_URL")
    if not url:
        sys.exit("REDIS_URL is not set. Start a server in another terminal with "
                 "`python -m handson.redis_server` and export the URL it prints.")
    try:
        return redis_server.connect(url, decode_responses=True)
    except redis_server.RedisUnavailable as err:
        sys.exit(str(err))


def main(argv: list[str] | None = None) -> int:
    from handson.queues.contract import ContractError, load_queue

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", type=int)
    ap.add_argument("--queue", default="handson.q", help="module name or path")
    ap.add_argument("--poison-every", type=int, default=1000)
    args = ap.parse_args(argv)
    try:
        queue = load_queue(args.queue)
    except ContractError as err:
        sys.exit(str(err))
    r = redis_from_env()
    if hasattr(queue, "reset"):
        queue.reset(r)
    produce(r, queue, args.n, args.poison_every)
    print("enqueued", args.n)
    return 0


if __name__ == "__main__":
    sys.exit(main())
