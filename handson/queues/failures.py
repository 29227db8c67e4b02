"""Checks of what a queue does with jobs that go wrong: a poison job and a
failing one reach the dead-letter list with their reason, a worker killed
after its claim uses up the attempt, and a full queue refuses more.

Importing this module registers its checks (after the crowds').
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time

from handson.queues.checkbase import (
    _SPEC,
    LEASE,
    PAST,
    _check,
    _claim_all,
    _client,
    _expire_and_reap,
    _Failed,
    _need,
)
from handson.queues.contract import load_queue


@_check("poison_to_dlq_with_reason",
        "a job whose lease keeps expiring lands in dead() after max_attempts with a "
        "non-empty reason; a job that fails keeps its error")
def _poison(q, r, url):
    q.enqueue(r, {"text": "doc POISON"}, "poison")
    q.enqueue(r, {"text": "bad"}, "bad")
    for attempt in range(1, 4):
        jobs = {j[0]: j for j in _claim_all(q, r, LEASE)}
        _need(set(jobs) == {"poison", "bad"},
              f"attempt {attempt}: claimed {sorted(jobs)}",
              "below max_attempts an expired or failed job goes back to pending")
        q.fail(r, "bad", jobs["bad"][2], f"ValueError: boom {attempt}")
        q.reap(r, 3)           # the failed one may move now, the other not yet
        time.sleep(PAST)
        q.reap(r, 3)
    left = q.claim(r, 30)
    # Only the expired job's comeback is one the chaos run surely reaches: its
    # workers call fail() only for a payload they cannot read ("on-poison:1"
    # kills them first on a poison document).
    _need(left is None, f"after 3 attempts the job came back: {left!r}",
          "at attempts >= max_attempts reap must move the job to the DLQ, also "
          "when its lease just expired (no fail: the worker died)",
          witnessed=("over_delivered",) if left is not None
          and tuple(left)[0] == "poison" else ())
    dead = {d[0]: tuple(d) for d in q.dead(r)}
    _need("poison" in dead, f"dead() = {sorted(dead.values())}",
          "count an attempt whose lease expired (worker died) as used, or a poison "
          "job that kills its worker loops forever")
    _need(dead["poison"][1] == 3 and dead["poison"][2],
          f"poison in dead(): {dead['poison']!r}",
          "record attempts and a reason such as 'lease expired (worker died or was "
          "too slow)'")
    _need("bad" in dead and dead["bad"][1] == 3 and "boom 3" in dead["bad"][2],
          f"failed job in dead(): {dead.get('bad')!r}",
          "keep the last error that fail() recorded")
    return f"{dead['poison']!r}, {dead['bad']!r}"


def _claim_and_die(spec: str, url: str) -> None:
    """In a child process: claim one job, then SIGKILL ourselves mid-work."""
    q = load_queue(spec)
    q.claim(_client(url), LEASE)
    os.kill(os.getpid(), signal.SIGKILL)


@_check("killed_attempt_counts",
        "a worker killed with SIGKILL after claim uses up its attempt: next attempt "
        "2, and with max_attempts=2 a second kill buries the job", timeout=120)
def _killed_counts(q, r, url):
    # Each worker starts the learner's module afresh (under the grader, a
    # confined host): beside a class being graded that took over 10 s.
    q.enqueue(r, {"doc_id": 9}, "victim")
    ctx = multiprocessing.get_context("fork")
    for kill in (1, 2):
        p = ctx.Process(target=_claim_and_die, args=(_SPEC[0], url))
        p.start()
        p.join(50)
        if p.exitcode is None:
            p.kill()
            p.join(5)
            raise _Failed("the worker neither claimed nor died within 50 s",
                          "claim must return at once when a job is pending")
        _need(p.exitcode == -signal.SIGKILL, f"worker exit code {p.exitcode}", "")
        reaped = _expire_and_reap(q, r, max_attempts=2)
        want = (1, 0) if kill == 1 else (0, 1)
        _need(reaped == want, f"after kill {kill} reap returned {reaped}",
              "the claim itself must count the attempt: a killed worker never "
              "calls fail")
    dead = q.dead(r)
    _need(len(dead) == 1 and dead[0][0] == "victim" and dead[0][1] == 2
          and dead[0][2], f"dead() = {dead!r}",
          "bury it with attempts 2 and a reason")
    return f"dead() = {dead!r}"


@_check("bound_refuses",
        "with QUEUE_MAX=5, the 6th pending job raises QueueFull; after one claim "
        "there is room again", env={"QUEUE_MAX": "5"})
def _bound(q, r, url):
    for i in range(5):
        q.enqueue(r, {"doc_id": i}, f"doc-{i}")
    try:
        q.enqueue(r, {"doc_id": 5}, "doc-5")
    except Exception as err:  # the type is checked by name: any module's QueueFull
        _need(type(err).__name__ == "QueueFull",
              f"enqueue raised {type(err).__name__}: {err}",
              "raise an exception class named QueueFull")
    else:
        raise _Failed("the 6th enqueue was accepted with QUEUE_MAX=5",
                      "read the bound from QUEUE_MAX and compare LLEN of pending in "
                      "the enqueue script; raise QueueFull past it")
    _need(q.claim(r, 30) is not None, "claim returned None", "")
    q.enqueue(r, {"doc_id": 5}, "doc-5")
    return "QueueFull at 6; room after a claim"
