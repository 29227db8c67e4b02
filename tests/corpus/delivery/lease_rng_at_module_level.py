"""Broken on purpose: one random.Random for every call, made at import."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from correct import *  # the delivery solution; below, the one change

_RNG = random.Random(31)


def lease_doubles(lease_s, n=20_000, seed=31):
    doubles = 0
    for _ in range(n):                # BUG: each call goes on from the last
        work = (_RNG.expovariate(1 / 2.0) if _RNG.random() > 0.05
                else _RNG.expovariate(1 / 40.0))
        if work > lease_s:
            doubles += 1
    return doubles
