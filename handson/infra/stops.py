"""Whether a process tree was stopped by a signal, seen from outside it.

A check that excuses a lost lease as the machine's doing must not excuse a
module that stopped its own process (SIGSTOP to its group): from inside, the
two look alike, since every thread is held. The process that started the
check is outside that group; it looks at the kernel's state of each process
in the tree ('T' stopped, 't' stopped by a tracer) every few milliseconds.
"""

from __future__ import annotations

import threading

from handson.infra.schedstat import descendants


class Stops:
    """Watches `pid` and its descendants until the `with` block ends."""

    def __init__(self, pid: int, tick: float = 0.01, rescan: int = 20):
        self.pid, self.tick, self.rescan = pid, tick, rescan
        self.seen: list[int] = []          # pids seen stopped, in order
        self._halt = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Stops:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._halt.set()
        self._thread.join(5)

    def _tree(self) -> list[int]:
        return [self.pid, *descendants(self.pid)]

    def _run(self) -> None:
        pids, n = self._tree(), 0
        while not self._halt.wait(self.tick):
            n += 1
            if n % self.rescan == 0:
                pids = self._tree()
            for pid in pids:
                if _state(pid) in ("T", "t") and pid not in self.seen:
                    self.seen.append(pid)


def _state(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
