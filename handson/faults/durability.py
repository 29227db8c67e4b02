"""Kill the Redis server itself mid-stream and count acknowledged enqueues lost.

An enqueue is acknowledged when `enqueue` returned. We enqueue one job at a
time as fast as we can, SIGKILL the server from another thread, restart it
from its append-only file and look for every acknowledged id, for each
durability setting: no AOF at all ("off"), and appendfsync no / everysec /
always. A process kill is not a power cut: data that Redis wrote to the file
is in the OS page cache and survives, so fsync matters only when the machine
itself goes down; the "off" row is what a kill costs with no AOF.

    python -m handson.faults.durability            # one row per setting
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import redis

from handson import q
from handson.redis_server import FSYNC_CHOICES, EmbeddedRedis, connect

SETTINGS = ("off",) + FSYNC_CHOICES


def acknowledged_lost(setting: str, seconds: float = 0.5) -> dict:
    """One run: enqueue for `seconds`, kill -9 the server, restart, count losses."""
    if setting not in SETTINGS:
        raise ValueError(f"setting must be one of {SETTINGS}, not {setting!r}")
    server = EmbeddedRedis(appendfsync=None if setting == "off" else setting).start()
    try:
        r = connect(server.url, socket_timeout=10)
        acked: list[str] = []
        killer = threading.Timer(seconds, server.kill)
        killer.start()
        deadline = time.monotonic() + seconds + 10
        i = 0
        try:
            while time.monotonic() < deadline:
                acked.append(q.enqueue(r, {"i": i}, f"job-{i}"))
                i += 1
        except (redis.ConnectionError, redis.TimeoutError):
            pass                                   # the kill landed
        finally:
            killer.cancel()
            killer.join(10)
        r.close()
        server.restart()
        r = connect(server.url)
        present = set()
        while batch := q.claim_batch(r, 60, 1000):
            present.update(job_id for job_id, _, _ in batch)
        r.close()
        lost = [j for j in acked if j not in present]
        return {"setting": setting, "acknowledged": len(acked),
                "recovered": len(present), "lost": len(lost),
                "unacknowledged_but_kept": len(present - set(acked))}
    finally:
        server.stop()


def table(settings=SETTINGS, seconds: float = 0.5) -> list[dict]:
    """One acknowledged_lost row per setting."""
    return [acknowledged_lost(s, seconds) for s in settings]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=0.5,
                    help="how long to enqueue before the kill")
    args = ap.parse_args(argv)
    print(f"{'setting':>9} {'acknowledged':>12} {'recovered':>9} {'lost':>6}")
    for setting in SETTINGS:
        row = acknowledged_lost(setting, args.seconds)
        print(f"{row['setting']:>9} {row['acknowledged']:>12} {row['recovered']:>9} "
              f"{row['lost']:>6}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
