"""A fake ranker: CPU-bound, deterministic, about 20 ms per document at ITERS=20000.

`score` is the seed's stand-in for the cross-encoder. A document containing
"POISON" cannot be tokenized, so it raises every time: the job a dead-letter
queue exists for.

    python -m handson.work          # how long one document takes here
"""

import hashlib
import os
import time


def score(doc: str, iters: int | None = None) -> float:
    """ITERS rounds of SHA-256 (the environment's, read at each call: a worker
    forked from a server that imported this has an environment of its own); a
    job also lasts at least WORK_MIN_S seconds, as one that waits on an API or
    a disk does whatever the CPU's speed: what a lesson about leases needs."""
    if "POISON" in doc:
        raise ValueError(f"cannot tokenize {doc!r}")
    t0 = time.monotonic()
    if iters is None:
        iters = int(os.environ.get("ITERS", "20000"))
    h = doc.encode()
    for _ in range(iters):
        h = hashlib.sha256(h).digest()
    min_s = float(os.environ.get("WORK_MIN_S", "0") or 0)
    if (left := min_s - (time.monotonic() - t0)) > 0:
        time.sleep(left)
    return h[0] / 255


def bench() -> float:
    """Milliseconds for one document, printed and returned."""
    t = time.perf_counter()
    score("hello")
    ms = (time.perf_counter() - t) * 1000
    print(f"{ms:.1f} ms")
    return ms


if __name__ == "__main__":
    bench()
