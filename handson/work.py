"""A fake ranker: CPU-bound, deterministic, about 20 ms per document at ITERS=20000.

`score` is the seed's stand-in for the cross-encoder. A document containing
"POISON" cannot be tokenized, so it raises every time: the job a dead-letter
queue exists for.

    python -m handson.work          # how long one document takes here
"""

import hashlib
import os
import time

ITERS = int(os.environ.get("ITERS", "20000"))
# A job that also waits (on an API, a disk) lasts at least this long whatever
# the CPU's speed: what a lesson about leases needs from its jobs.
MIN_S = float(os.environ.get("WORK_MIN_S", "0") or 0)


def score(doc: str, iters: int | None = None) -> float:
    if "POISON" in doc:
        raise ValueError(f"cannot tokenize {doc!r}")
    t0 = time.monotonic()
    h = doc.encode()
    for _ in range(ITERS if iters is None else iters):
        h = hashlib.sha256(h).digest()
    if (left := MIN_S - (time.monotonic() - t0)) > 0:
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
