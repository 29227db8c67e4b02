"""The kernel's count of each thread's time on a CPU and waiting for one.

`/proc/<pid>/task/<tid>/schedstat` holds nanoseconds run, nanoseconds runnable
but left waiting in a run queue, and slices run. A thread stopped, asleep or
blocked on a lock is in neither count, so the waiting is the machine's doing,
never the process's: a process cannot make the kernel say it was held.
"""

from __future__ import annotations

import os
import threading
import time
from bisect import bisect_left, bisect_right


def thread_ns(pid: int) -> tuple[int, int] | None:
    """(run, waiting) nanoseconds over the threads of `pid` now; None if the
    process is gone or the kernel keeps no such count."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    run = wait = 0
    seen = False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                fields = f.read().split()
        except OSError:
            continue                    # a thread that just exited
        run, wait, seen = run + int(fields[0]), wait + int(fields[1]), True
    return (run, wait) if seen else None


def descendants(pid: int) -> list[int]:
    """The processes under `pid`, from the kernel's lists of each thread's
    children (a few file reads, where walking all of /proc reads hundreds)."""
    out, todo = [], [pid]
    while todo:
        top = todo.pop()
        try:
            tids = os.listdir(f"/proc/{top}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{top}/task/{tid}/children") as f:
                    kids = [int(x) for x in f.read().split()]
            except OSError:
                continue
            out += kids
            todo += kids
    return out


def run_time_s(pids: list[int]) -> float:
    """CPU seconds the processes' threads have run so far, to the nanosecond
    (the tick-rounded utime would blur a short window)."""
    return sum((thread_ns(p) or (0, 0))[0] for p in pids) / 1e9


class Waits:
    """This process's and its descendants' time waiting for a CPU, sampled.

    A thread ticks every `tick` seconds and records the summed waiting; the
    descendants (hosts running a learner's module) are looked up again every
    `rescan` ticks. `between(a, b)` is the waiting in [a, b] as the samples
    around it saw it: more than the truth when the sampler was held too (it
    came by seldom), never less.
    """

    def __init__(self, tick: float = 0.02, rescan: int = 10):
        self.tick, self.rescan = tick, rescan
        self.times: list[float] = []
        self.waited: list[float] = []
        self.pids = [os.getpid()]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Waits:
        self._sample([os.getpid()])
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample(self._pids())

    def _pids(self) -> list[int]:
        return [os.getpid(), *descendants(os.getpid())]

    def _sample(self, pids: list[int]) -> None:
        total = sum((thread_ns(p) or (0, 0))[1] for p in pids) / 1e9
        # A process that exits takes its count along: the sum never goes back.
        self.waited.append(max(total, self.waited[-1] if self.waited else 0.0))
        self.times.append(time.monotonic())

    def sample(self, at: float) -> None:
        """Read the threads now, as of `at` (a moment the caller just noted):
        for a caller that knows when it matters, instead of polling."""
        self._sample(self._pids())
        self.times[-1] = at

    def _run(self) -> None:
        n = 0
        self.pids = self._pids()
        while not self._stop.wait(self.tick):
            n += 1
            if n % self.rescan == 0:
                self.pids = self._pids()
            self._sample(self.pids)

    def between(self, a: float, b: float) -> float:
        if not self.times or self.times[-1] < b:
            self._sample(self.pids)     # a starved sampler may not have come by
        times, waited = list(self.times), list(self.waited)
        n = min(len(times), len(waited))
        times, waited = times[:n], waited[:n]
        if not n or b <= a:
            return 0.0
        i = max(0, bisect_right(times, a) - 1)
        j = min(len(times) - 1, bisect_left(times, b))
        return min(b - a, max(0.0, waited[j] - waited[i]))


def thread_times(pid: int) -> dict[int, tuple[int, int]]:
    """(run, waiting) nanoseconds of each thread of `pid` so far, by tid."""
    out = {}
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                run, wait = f.read().split()[:2]
            out[int(tid)] = (int(run), int(wait))
        except (OSError, ValueError):
            continue                    # a thread that just exited
    return out


class ThreadWaits(Waits):
    """Like Waits, but `between(a, b)` is the most any ONE mostly idle thread
    waited: the excuse for one such thread held (a heartbeat's).

    Summed over threads, the waiting grows with every thread's wake-ups on a
    busy machine; and a thread busy on a CPU waits on a busy machine whatever
    it is for (a spinning thread would excuse a beat that was never due). A
    thread that ran more than `busy` of the window is left out.
    """

    def __init__(self, tick: float = 0.05, rescan: int = 10, busy: float = 0.1):
        super().__init__(tick, rescan)
        self.busy = busy
        self.snaps: list[dict] = []

    def __enter__(self) -> ThreadWaits:
        # The hosts' threads from the start: a first sample of this process
        # alone would excuse their waiting from before the trial in its first gap.
        self._sample(self._pids())
        self._thread.start()
        return self

    def _sample(self, pids: list[int]) -> None:
        snap = {}
        for pid in pids:
            snap.update({(pid, tid): ns for tid, ns in thread_times(pid).items()})
        self.snaps.append(snap)
        self.times.append(time.monotonic())

    def between(self, a: float, b: float) -> float:
        if not self.times or self.times[-1] < b:
            self._sample(self.pids)
        n = min(len(self.times), len(self.snaps))
        times, snaps = self.times[:n], self.snaps[:n]
        if not n or b <= a:
            return 0.0
        i = max(0, bisect_right(times, a) - 1)
        j = min(n - 1, bisect_left(times, b))
        span_ns = (times[j] - times[i]) * 1e9
        most = 0
        for key, (run, wait) in snaps[j].items():
            run0, wait0 = snaps[i].get(key, (0, 0))
            if run - run0 <= self.busy * span_ns:
                most = max(most, wait - wait0)
        return min(b - a, most / 1e9)
