"""Broken on purpose: the lease count draws 20,000 jobs whatever n says."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change


def lease_doubles(lease_s, n=20_000, seed=31):
    rng, doubles = random.Random(seed), 0
    for _ in range(20_000):           # BUG: n is not used
        work = (rng.expovariate(1 / 2.0) if rng.random() > 0.05
                else rng.expovariate(1 / 40.0))
        if work > lease_s:
            doubles += 1
    return doubles
