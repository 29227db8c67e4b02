"""Checks that time is the server's: leases of every length end when they
should, and no worker's or reaper's clock decides when a lease ends.

Importing this module registers its checks (after the basic ones in
`handson.queues.checks`, before the crowds').
"""

from __future__ import annotations

import multiprocessing
import os
import time

from handson.infra.learner_module import SKEW_ENV
from handson.queues.checkbase import (
    _SPEC,
    LEASE,
    PAST,
    _check,
    _client,
    _expire_and_reap,
    _Failed,
    _need,
)
from handson.queues.contract import load_queue

SCALES = (0.1, 0.2, 30.0)   # lease lengths the contract must honour (seconds)
TOLERANCE = 0.05            # a lease ends within this long of its deadline
GRANULARITY_HINT = ("keep the deadline in milliseconds of the server's clock "
                    "(now_ms + round(lease_s * 1000)), never whole seconds, and "
                    "take a lease only once now >= its deadline, with no grace "
                    "subtracted")


def _reap_right_after_claim(q, r, lease: float) -> tuple:
    """(reap's answer, when the claim returned) for a reap surely inside the
    lease (it ended before the lease's deadline, even rounded to the ms);
    retried while the machine is too slow for that."""
    for _ in range(20):
        r.flushdb()
        q.enqueue(r, {"lease": lease}, f"lease-{lease:g}")
        start = time.monotonic()
        _need(q.claim(r, lease) is not None, "claim returned None after enqueue",
              "claim must pop the pending job")
        claimed = time.monotonic()
        got = tuple(q.reap(r, 3))
        if time.monotonic() - start < lease - 0.01:
            return got, claimed
    raise _Failed(f"could not reap within {lease - 0.01:g} s of a claim in 20 "
                  "tries (the machine is too loaded to judge)", "run the check again")


@_check("lease_time_scales",
        f"leases of {', '.join(f'{x:g}' for x in SCALES)} s are each left alone by "
        f"a reap right after the claim; the short ones are reaped "
        f"{TOLERANCE * 1000:g} ms after they end")
def _time_scales(q, r, url):
    for lease in SCALES:
        got, claimed = _reap_right_after_claim(q, r, lease)
        _need(got == (0, 0), f"a reap right after a claim with a {lease:g} s "
              f"lease took it back (reap returned {got})", GRANULARITY_HINT)
        if lease >= 1:
            continue
        time.sleep(max(0.0, claimed + lease + TOLERANCE - time.monotonic()))
        got = tuple(q.reap(r, 3))
        _need(got == (1, 0), f"a reap {TOLERANCE * 1000:g} ms after a {lease:g} s "
              f"lease ended left it alone (reap returned {got})", GRANULARITY_HINT)
    return "each lease honoured, the short ones ended on time"


def _skewed_call(spec: str, url: str, skew: float, call: tuple, conn) -> None:
    """In a child process whose wall clock is `skew` s off: one claim, extend
    or reap."""
    os.environ[SKEW_ENV] = repr(skew)
    q = load_queue(spec)
    r = _client(url)
    if call[0] == "claim":
        job = q.claim(r, call[1])
        conn.send(None if job is None else list(job))
    elif call[0] == "reap":
        conn.send(list(q.reap(r, *call[1:])))
    else:
        conn.send(bool(q.extend(r, *call[1:])))


def _with_clock(url: str, skew: float, *call):
    """Run `call` in a child whose clock is `skew` s off; its answer."""
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_skewed_call, args=(_SPEC[0], url, skew, call, child))
    p.start()
    child.close()
    answer = parent.recv() if parent.poll(30) else "no answer"
    p.kill()
    p.join(5)
    parent.close()
    return answer


SERVER_CLOCK_HINT = ("compute every deadline inside the script from the Redis "
                     "server's clock (redis.call('TIME')), never from time.time() "
                     "in the worker: each machine's clock is off by its own amount, "
                     "and only the server's is the same for every worker and reaper")


@_check("deadline_from_server_clock",
        "workers whose clocks are an hour behind or ahead: a 30 s lease they claim "
        "or extend is not reaped at once, and a 0.25 s one is reaped once it has "
        "expired; a reaper an hour ahead leaves a 30 s lease alone, one an hour "
        "behind takes an expired lease", timeout=150)
def _server_clock(q, r, url):
    # Six workers, each starting the learner's module afresh (under the grader,
    # a confined host): beside three gradings at once that took over 60 s.
    hour = 3600.0
    for skew, what in ((-hour, "behind"), (hour, "ahead")):
        q.enqueue(r, {"doc_id": 11}, f"clock-{what}")
        lease = 30.0 if skew < 0 else LEASE
        job = _with_clock(url, skew, "claim", lease)
        _need(isinstance(job, list), f"a worker whose clock is 1 h {what} claimed "
              f"nothing ({job!r})", "claim must pop the pending job")
        for step in ("claim", "extend"):
            if step == "extend":
                if skew > 0:                 # a long lease from an honest clock
                    q.ack(r, job[0], job[2])
                    q.enqueue(r, {"doc_id": 12}, f"clock-{what}-2")
                    job = list(q.claim(r, 30.0))
                held = _with_clock(url, skew, "extend", job[0], job[2], lease)
                if held is False:            # a queue that never renews (the
                    continue                 # given extend of assignment 2)
                _need(held is True, f"extend by the owner returned {held!r}", "")
            if skew < 0:
                got = tuple(q.reap(r, 3))
                _need(got == (0, 0), f"a worker whose clock is 1 h behind called "
                      f"{step} with a 30 s lease, and reap right after took the "
                      f"lease away (reap returned {got})", SERVER_CLOCK_HINT)
            else:
                got = _expire_and_reap(q, r)
                _need(got == (1, 0), f"a worker whose clock is 1 h ahead called "
                      f"{step} with a {LEASE:g} s lease; {PAST:g} s later reap "
                      f"returned {got}: the lease would last an hour",
                      SERVER_CLOCK_HINT)
                if step == "claim":
                    job = list(q.claim(r, LEASE))
        if skew < 0:
            q.ack(r, job[0], job[2])
    _reaper_clocks(q, r, url)
    return "deadlines follow the server's clock, whatever a worker's or reaper's says"


def _reaper_clocks(q, r, url) -> None:
    """The reaper is a role too: its clock must not decide what expired."""
    hour = 3600.0
    r.flushdb()
    q.enqueue(r, {"doc_id": 13}, "clock-reaper")
    job = q.claim(r, 30.0)
    got = _with_clock(url, hour, "reap", 3)
    _need(got == [0, 0], "a reaper whose clock is 1 h ahead took a 30 s lease "
          f"claimed just before (reap returned {got})", SERVER_CLOCK_HINT)
    q.ack(r, job[0], job[2])
    q.enqueue(r, {"doc_id": 14}, "clock-reaper-2")
    q.claim(r, LEASE)
    time.sleep(PAST)
    got = _with_clock(url, -hour, "reap", 3)
    _need(got == [1, 0], f"a reaper whose clock is 1 h behind left a {LEASE:g} s "
          f"lease that expired {PAST - LEASE:g} s ago (reap returned {got})",
          SERVER_CLOCK_HINT)
