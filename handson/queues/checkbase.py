"""What every contract check shares: its result, its failure, the registry.

`handson.queues.checks` holds the checks and runs them; a module of further
checks (`interleave`) registers its own here too, so one registry serves both.
"""

from __future__ import annotations

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
