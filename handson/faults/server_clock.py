"""The Redis server's clock as the judge sees it, against the workers' own.

Workers log events on the machine's monotonic clock; a queue's leases run on
the server's wall clock (TIME, XPENDING idle times). When that wall clock is
stepped forward (a virtual machine resumed, a time daemon correcting it),
every lease expires early by the step, and a correct queue hands jobs out
again "before the lease could expire" by the monotonic clock. The engine reads
TIME every few ticks; the judge allows, between two events, for whatever the
server's clock gained in between.
"""

from __future__ import annotations

import bisect
import time

REPORT_MS = 10            # a gain the report mentions
NOISY_NS = 5_000_000      # a reading whose round trip took longer says little


class ServerClock:
    def __init__(self):
        self.at: list[int] = []       # monotonic ns, mid-round-trip
        self.lo: list[int] = []       # server ns - monotonic ns, at its lowest
        self.hi: list[int] = []       # ... and at its highest

    def sample(self, r) -> None:
        """One TIME reading; a Redis error is no reading, never a failed run."""
        m0 = time.monotonic_ns()
        try:
            sec, usec = r.time()
        except Exception:
            return
        self.record(m0, time.monotonic_ns(), int(sec) * 10**9 + int(usec) * 1000)

    def record(self, m0: int, m1: int, server: int) -> None:
        """The server said `server` (ns) between monotonic m0 and m1."""
        if m1 - m0 <= NOISY_NS:
            self.at.append((m0 + m1) // 2)
            self.lo.append(server - m1)
            self.hi.append(server - m0)

    def gained_ns(self, t1: int | None = None, t2: int | None = None) -> int:
        """How far the server's clock ran ahead of the monotonic one between
        t1 and t2 (the whole run without them), at most: a step forward, or
        drift; 0 when it did not."""
        i = 0 if t1 is None else max(0, bisect.bisect_right(self.at, t1) - 1)
        j = len(self.at) if t2 is None else bisect.bisect_left(self.at, t2) + 1
        gained, low = 0, None
        for k in range(i, min(j, len(self.at))):
            if low is not None:
                gained = max(gained, self.hi[k] - low)
            low = self.lo[k] if low is None else min(low, self.lo[k])
        return gained
