"""Broken on purpose: only the slow jobs are counted as outliving the lease."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def lease_doubles(lease_s, n=20_000, seed=31):
    rng, doubles = random.Random(seed), 0
    for _ in range(n):
        if rng.random() > 0.05:
            rng.expovariate(1 / 2.0)  # BUG: "fast jobs never outlive a lease"
            continue
        if rng.expovariate(1 / 40.0) > lease_s:
            doubles += 1
    return doubles
