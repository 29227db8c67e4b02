"""What every contract check shares: its result, its failure, the registry,
the short lease the checks use and the helpers of more than one group.

`handson.queues.checks` holds the basic checks and runs them all; each module
of further checks (`clocks`, `crowds`, `failures`, `lease_keeping`,
`interleave`) registers its own here too, so one registry serves them all.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from handson.redis_server import connect


@dataclass
class CheckResult:
    """One behaviour: did it hold, what should have happened, what did."""

    name: str
    ok: bool
    expected: str
    got: str
    hint: str = ""
    timeline: dict | None = None      # a failing schedule, drawn by the grader
    # The chaos run's invariants (`handson.faults.judge`) this failure showed
    # broken outright: the grader then fails their chaos checks too, since a
    # chaos run that missed the same hole only had luck.
    witnessed: list[str] = field(default_factory=list)

    def line(self) -> str:
        mark = "PASS" if self.ok else "FAIL"
        text = f"{mark} {self.name}"
        if not self.ok:
            text += (f"\n  expected: {self.expected}\n  got:      {self.got}"
                     + (f"\n  hint:     {self.hint}" if self.hint else ""))
        return text


class _Failed(Exception):
    def __init__(self, got: str, hint: str, blame: str = "",
                 witnessed: tuple[str, ...] = ()):
        super().__init__(got)
        self.got, self.hint, self.blame = got, hint, blame
        self.witnessed = list(witnessed)
        self.timeline: dict | None = None     # the failing schedule, to draw


def _need(condition: bool, got: str, hint: str, blame: str = "",
          witnessed: tuple[str, ...] = ()) -> None:
    """`blame`: which step of a drawn schedule broke the rule ("rival": the
    other client's; by default the stopped call's). `witnessed`: the chaos
    invariants that `got` shows broken (see CheckResult)."""
    if not condition:
        raise _Failed(got, hint, blame, witnessed)


@dataclass
class _Check:
    fn: Callable
    expected: str
    timeout: float
    env: dict


CHECKS: dict[str, _Check] = {}


# A light check takes about 3 s alone; graded beside a chaos run and other
# checks on two cores it has taken over 15 s, and a correct queue must not lose
# it to load.
LIGHT_CHECK_S = 30.0


def _check(name: str, expected: str, timeout: float = LIGHT_CHECK_S,
           env: dict | None = None):
    def register(fn):
        CHECKS[name] = _Check(fn, expected, timeout, env or {})
        return fn
    return register


_SPEC = [""]   # the queue spec, for helpers that start their own processes

# How a passed result that excuses the machine begins: the runner turns it into
# a failure when it saw the check's processes stopped by a signal.
NOT_JUDGED = "not judged"



def _claim_all(q, r, lease_s: float, limit: int = 10_000) -> list:
    out = []
    while len(out) < limit:
        job = q.claim(r, lease_s)
        if job is None:
            break
        out.append(tuple(job))
    return out


def _client(url: str):
    """A client like the seed's and the chaos workers': replies decoded to str."""
    return connect(url, decode_responses=True)


def _empty(q, r) -> None:
    """The queue as a check starts it: no job, no lease, no marker."""
    r.flushdb()
    if getattr(q, "STATE_OUTSIDE_REDIS", False) is True:   # e.g. in PostgreSQL
        q.reset(r)


LEASE = 0.25        # short leases keep the checks quick ...
PAST = 0.45         # ... and this much sleep is surely past one (server clock)


def _expire_and_reap(q, r, max_attempts: int = 3) -> tuple[int, int]:
    time.sleep(PAST)
    return tuple(q.reap(r, max_attempts))


def _threads(n: int, target: Callable[[int], object], timeout: float) -> list:
    """Run target(i) in n threads released together; their results in order."""
    results: list = [None] * n
    errors: list = []
    gate = threading.Barrier(n)

    def body(i):
        try:
            gate.wait(timeout)
            results[i] = target(i)
        except Exception as err:  # reported below
            errors.append(f"{type(err).__name__}: {err}")

    threads = [threading.Thread(target=body, args=(i,), daemon=True) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout)
    _need(not errors, f"a thread raised {errors[0]}" if errors else "",
          "the queue functions must be safe to call from many clients at once")
    _need(not any(t.is_alive() for t in threads), "a thread did not finish in time",
          "a queue call blocked; every call should return promptly")
    return results


def _clients(url: str, n: int) -> list:
    return [_client(url) for _ in range(n)]


def _kill_group(p) -> None:
    """SIGKILL a child that leads a process group, with all it started there,
    then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    if p.is_alive():            # not yet in its own group
        p.kill()
    p.join(5)
