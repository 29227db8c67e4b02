"""heartbeat_keeps_lease: a job beating at lease/3 keeps its lease, on any machine.

A correct extend run at time s pushes the deadline to at least s + lease: the
server ran it after s, by a clock that ticks with ours. So a reap that took
the lease and answered before s + lease, or an extend refused that early, is
the queue's fault whatever the load; that is judged at once. A lease lost
later means no extend began for a whole lease: the queue's fault when its
extends are slow on their own (the median call of all trials, less what the
kernel counts as waiting for a CPU), otherwise a trial the machine may have
held, run again. If the last of them is held too, the check is not judged;
the runner, outside the check's process group, fails it instead when it saw
a process of the check stopped by a signal (a module that stops itself).
"""

from __future__ import annotations

import statistics
import threading
import time
from dataclasses import dataclass, field

from handson.infra.schedstat import Waits
from handson.queues.checkbase import (
    NOT_JUDGED,
    _check,
    _client,
    _empty,
    _Failed,
    _need,
)

LEASE_S = 0.5
SPAN_S = 10 * LEASE_S
TRIALS = 4
MARGIN_S = 0.01         # the server's deadline is kept to the millisecond
LATE = 0.8              # an extend ending this much of a lease after the last
SLOW = 0.4              # an extend's median own time past this much of a lease
ENOUGH_CALLS = 5        # ... judged over at least this many calls, or the last trial


@dataclass
class Trial:
    """What one trial saw, in this process's monotonic seconds."""

    calls: list = field(default_factory=list)    # (start, end, ok); claim first
    reaps: list = field(default_factory=list)    # (sent, end) of a reap that took it
    errors: list = field(default_factory=list)
    acked: bool | None = None                    # the owner's ack, when it kept it

    def last_ok_before(self, t: float) -> float:
        """The start of the latest successful call that had ended by `t`."""
        return max(s for s, e, ok in self.calls if ok and e < t)

    def loss(self) -> tuple[str, float, float] | None:
        """(what, when it answered, latest successful start before) of the
        first sign the lease was gone, or None."""
        signs = [("a reap took the job", e, self.last_ok_before(s))
                 for s, e in self.reaps]
        signs += [("extend returned False", e, self.last_ok_before(s))
                  for s, e, ok in self.calls if not ok]
        return min(signs, key=lambda x: x[1], default=None)

    def late(self) -> bool:
        ok = [(s, e) for s, e, good in self.calls if good]
        return any(e - s0 > LATE * LEASE_S
                   for (s0, _), (_, e) in zip(ok, ok[1:], strict=False))


def _run(q, r, url: str, job_id: str, last: bool, waits: Waits) -> Trial:
    """Beat one job for SPAN_S while reapers run; stop early at a loss, or, when
    the trial is not the last, at a late beat (it would be set aside anyway)."""
    _empty(q, r)        # an earlier trial's job, reaped here, is not this one's
    q.enqueue(r, {"doc_id": 10}, job_id)
    trial = Trial()
    start = time.monotonic()
    job = q.claim(r, LEASE_S)
    trial.calls.append((start, time.monotonic(), job is not None))
    _need(job is not None, "claim returned None with a job pending", "")
    stop = threading.Event()
    hb = _client(url)

    def beat():
        while not stop.wait(LEASE_S / 3):
            s = time.monotonic()
            try:
                ok = bool(q.extend(hb, job_id, job[2], LEASE_S))
            except Exception as err:  # reported below, as the check's failure
                trial.errors.append(f"{type(err).__name__}: {err}")
                break
            trial.calls.append((s, time.monotonic(), ok))
            if not ok or (not last and trial.late()):
                break
        stop.set()

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    end = time.monotonic() + SPAN_S
    try:
        while not stop.is_set() and (sent := time.monotonic()) < end:
            if any(q.reap(r, 3)):
                trial.reaps.append((sent, time.monotonic()))
                break
            stop.wait(0.03)
    finally:
        stop.set()
        thread.join(5)
    if trial.loss() is None and not trial.errors:
        trial.acked = bool(q.ack(r, job_id, job[2]))
    return trial


def _judge(trial: Trial, last: bool, waits: Waits, own: list) -> str | None:
    """The result, or None when the trial is set aside; raises when it fails."""
    _need(not trial.errors, f"extend raised {trial.errors[0]}" if trial.errors
          else "", "extend must return True while the caller holds the lease")
    loss = trial.loss()
    if loss is not None:
        what, at, since = loss
        _need(at >= since + LEASE_S - MARGIN_S,
              f"{what} {at - since:.2f} s after a claim or extend began, while "
              f"the {LEASE_S} s lease it set had {since + LEASE_S - at:.2f} s "
              "to run",
              "extend must push the deadline to now + lease_s by the server "
              "clock, in milliseconds")
    # A machine holds a call now and then; a slow extend is slow every time.
    # Judged once the trials hold enough calls, and always on the last.
    own += [e - s - waits.between(s, e) for s, e, _ in trial.calls[1:]]
    median = statistics.median(own) if own else 0.0
    _need(median <= SLOW * LEASE_S or (len(own) < ENOUGH_CALLS and not last),
          f"extend took {median:.2f} s of its own (the median of {len(own)} "
          f"calls), past {SLOW} of the {LEASE_S} s lease",
          "extend must answer at once: one round trip that pushes the "
          "deadline, no sleeping or waiting in it")
    if loss is None:
        if trial.late() and not last:
            return None
        _need(trial.acked, "the owner's ack returned False", "")
        return f"never reaped in {SPAN_S / LEASE_S:.0f} leases"
    if not last:
        return None
    what, at, since = loss
    return (f"{NOT_JUDGED}: {what} after no extend began for {at - since:.2f} s, "
            f"in each of {TRIALS} trials: the machine held the beats past the "
            "lease (it is too busy)")


@_check("heartbeat_keeps_lease",
        "a job heartbeating at lease/3 for 10 leases is never reaped while reapers "
        "run, every extend returns True, and the owner's ack succeeds", timeout=60)
def _heartbeat(q, r, url):
    own: list = []                  # each extend's own seconds, over the trials
    with Waits() as waits:
        for n in range(1, TRIALS + 1):
            trial = _run(q, r, url, f"long-{n}", n == TRIALS, waits)
            try:
                got = _judge(trial, n == TRIALS, waits, own)
            except _Failed as err:
                if n > 1:
                    err.got += _aside(n - 1)
                raise
            if got is not None:
                return got + _aside(n - 1)
    raise AssertionError("the last trial is always judged")


def _aside(n: int) -> str:
    return (f" ({n} trial(s) before it set aside: in each, no extend began for "
            f"{LATE:g} of a lease)" if n else "")
