"""What the workers' event logs say, while the run goes and once it is over.

Every worker (and extra reaper) appends one JSON line per event to a file of
its own, stamped with CLOCK_MONOTONIC. The supervisor reads them as they grow
(`_Tally`: claims for a schedule keyed to progress, the quota, who holds which
job); the judge reads them whole (`_read_events`). Both sides read the same
lines, so they live here, below both.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections import Counter, defaultdict
from pathlib import Path

_DONE_EVENTS = tuple(f'"ev": "{e}"'.encode() for e in (
    "ack", "ack_refused", "fail", "abandoned", "idle", "start"))
_JOB_DONE = ("ack", "ack_refused", "fail", "abandoned")
_BETWEEN_JOBS = (*_JOB_DONE, "start", "idle", "reap")    # next: reap or claim


class _Tally:
    """What the workers' logs say so far: claims, crash-point kills, reaps.

    Read incrementally (only whole lines), so the supervisor can key the fault
    schedule to claims and count the quota every tick.
    """

    def __init__(self, directory: Path):
        self.dir, self.offsets = directory, {}
        self.claims, self.reaped, self.crash = 0, 0, Counter()
        self.reaped_by: Counter = Counter()          # pid -> leases it reaped
        self.holding: dict[int, tuple[str, int] | None] = {}  # pid -> (job, attempt)
        self.claims_of: dict[str, list[tuple[int, int]]] = defaultdict(list)
        # (pid, job, attempt) -> t it answered: per attempt, as a worker may
        # take its own job back after its lease ran out
        self.ended: dict[tuple[int, str, int], int] = {}
        self.acked: set[str] = set()                 # jobs with an accepted ack
        # job -> t of its latest claim, of its latest ack/fail/abandon
        self.last_claim: dict[str, int] = {}
        self.last_end: dict[str, int] = {}
        self.reaper_paused: list[dict] = []          # a reaper's pause events
        self.paused_seen = 0                         # ... the engine has taken
        self.no_gap = 0                              # armed reaps with no gap
        self.after_pause: list[dict] = []            # a paused reap's result
        self.retired: set[int] = set()               # reaped: their logs end
        self.finished: set[str] = set()              # ... and were read to it

    def retire(self, pid: int) -> None:
        """The process is reaped: once its log is read to the end, skip it (a
        run leaves dozens, and the supervisor reads every 20 ms)."""
        self.retired.add(pid)

    def started(self, pid: int) -> None:
        """A new process may get a reaped one's pid (ids wrap around), and
        then writes on in the same log: read it again."""
        self.retired.discard(pid)
        self.finished.discard(f"{pid}.jsonl")

    def update(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(self.dir):
                if entry.name in self.finished:
                    continue
                off = self.offsets.get(entry.name, 0)
                pid = int(entry.name.split(".")[0])
                if pid in self.retired:        # what it wrote is all there is
                    self.finished.add(entry.name)
                if entry.stat().st_size <= off:
                    continue
                with open(entry.path, "rb") as f:
                    f.seek(off)
                    chunk = f.read()
                end = chunk.rfind(b"\n") + 1
                self.offsets[entry.name] = off + end
                for line in chunk[:end].splitlines():
                    if b'"ev": "claim"' in line:
                        self.claims += 1
                        with contextlib.suppress(ValueError, KeyError):
                            e = json.loads(line)
                            job, attempt = str(e["job"]), int(e["attempt"])
                            self.holding[pid] = (job, attempt)
                            self.claims_of[job].append((attempt, pid))
                            self.last_claim[job] = e["t"]
                    elif any(e in line for e in _DONE_EVENTS):
                        self.holding[pid] = None
                        with contextlib.suppress(ValueError, KeyError):
                            e = json.loads(line)
                            if e["ev"] in _JOB_DONE:
                                self.ended[pid, str(e["job"]),
                                           int(e.get("attempt", 0))] = e["t"]
                                self.last_end[str(e["job"])] = e["t"]
                            if e["ev"] == "ack":
                                self.acked.add(str(e["job"]))
                    elif b'"ev": "crash_point"' in line or b'"ev": "reap"' in line:
                        with contextlib.suppress(ValueError):
                            self._count(json.loads(line))
                    elif b'"ev": "reaper_paused"' in line:
                        with contextlib.suppress(ValueError):
                            self.reaper_paused.append(json.loads(line))
                    elif b'"ev": "reap_no_gap"' in line:
                        self.no_gap += 1
                    elif b'"ev": "reap_after_pause"' in line:
                        with contextlib.suppress(ValueError):
                            self.after_pause.append(json.loads(line))

    def job_of(self, pid: int) -> str | None:
        """The job the worker holds, as far as its log says."""
        held = self.holding.get(pid)
        return held[0] if held else None

    def _count(self, e: dict) -> None:
        if e["ev"] == "crash_point":
            self.crash[e.get("point", "?")] += 1
        else:
            n = int(e.get("requeued", 0)) + int(e.get("dead", 0))
            self.reaped += n
            self.reaped_by[e.get("pid")] += n


def _read_events(directory: Path) -> list[dict]:
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                events.append(json.loads(line))
    events.sort(key=lambda e: e["t"])
    return events
