"""Behavioural checks of ANY queue that meets the contract, on a real Redis.

The one place the queue contract is checked: the tests, the grader and the
learner's own check cell all call `run_checks`. A check learns the queue's
state only through the contract's seven functions (never by reading key
names), so a queue with another key layout, or one on Redis Streams, is judged
on its behaviour alone.

The queue is handed clients made with `decode_responses=True` (replies are
str), like the seed's `q.py` and the chaos run's workers.

Each check runs in its own process (and process group) with a hard timeout:
it loads the queue there, flushes the database, and reports a CheckResult. A
check that raises, hangs or kills its process is a failure with the reason in
`got`, never a crash of the runner.

    python -m handson.queues.checks handson.q
    python -m handson.queues.checks myq.py --only zombie_ack_refused --json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import random
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict

from handson.infra import remote_module
from handson.infra.learner_module import SKEW_ENV
from handson.infra.stops import Stops
from handson.queues.checkbase import (
    _SPEC,
    CHECKS,
    NOT_JUDGED,
    CheckResult,
    _check,
    _claim_all,
    _client,
    _empty,
    _Failed,
    _need,
)
from handson.queues.contract import ContractError, load_queue
from handson.redis_server import cli_redis, connect, die_with_parent, redis_url

LEASE = 0.25        # short leases keep the checks quick ...
PAST = 0.45         # ... and this much sleep is surely past one (server clock)
BIG_QUEUE_MAX = "10000000"


# --- helpers that use only the contract ---------------------------------------

def _expire_and_reap(q, r, max_attempts: int = 3) -> tuple[int, int]:
    time.sleep(PAST)
    return tuple(q.reap(r, max_attempts))


def _zombie_and_owner(q, r, owner_lease: float = 30.0):
    """One job: attempt 1 is a zombie (lease expired, reaped), attempt 2 owns it."""
    q.enqueue(r, {"doc_id": 1}, "job-z")
    first = q.claim(r, LEASE)
    _need(first is not None, "claim returned None after enqueue",
          "claim must pop the pending job")
    requeued, _ = _expire_and_reap(q, r)
    _need(requeued == 1, f"reap after the lease expired returned requeued={requeued}",
          "reap must requeue a job whose lease deadline has passed")
    second = q.claim(r, owner_lease)
    _need(second is not None and second[0] == "job-z",
          f"second claim returned {second!r}",
          "a reaped job must be claimable again")
    _need(second[2] > first[2],
          f"attempts {first[2]} then {second[2]}",
          "claim must give a larger attempt number each time (the fencing token)")
    return first[2], second[2]


def _after_own_fail(q, r, job_id: str) -> int:
    """A job claimed and failed by its own attempt (fail said True): the attempt."""
    _empty(q, r)
    q.enqueue(r, {"doc_id": 5}, job_id)
    job = q.claim(r, LEASE)
    _need(job is not None, "claim returned None after enqueue", "")
    _need(q.fail(r, job_id, job[2], "boom"), f"the owner's fail (attempt {job[2]}) "
          "returned False", "fail must succeed for the current attempt")
    return job[2]


def _retried_after(q, r, job_id: str, attempt: int, call: str) -> None:
    """The next reap after the lease ran out must requeue the failed job (not
    find it done, alive or dead), unless fail put it back itself, and the next
    claim is the next attempt."""
    reaped = _expire_and_reap(q, r)
    # (0, 0): a fail that requeues at once left the reap nothing to take back;
    # the claim below tells that from a job wrongly done.
    _need(reaped in ((1, 0), (0, 0)), f"after attempt {attempt}'s own fail and "
          f"then its {call}, reap returned {reaped} (a failed job is retried: "
          "(1, 0), or (0, 0) if fail already put it back)",
          f"a refused {call} changes nothing: the failed attempt's job goes back "
          "to pending at the next reap, neither done nor with its lease revived")
    again = q.claim(r, 30)
    _need(again is not None and again[0] == job_id and again[2] == attempt + 1,
          f"after attempt {attempt}'s fail and {call}, the next claim returned "
          f"{again!r}", "the failed job comes back once, with the next attempt")


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


# --- the checks ------------------------------------------------------------------

@_check("enqueue_idempotent",
        "the same job_id enqueued twice is one job, whether it is pending, "
        "in flight or done")
def _enqueue_idempotent(q, r, url):
    a = q.enqueue(r, {"doc_id": 1}, "doc-1")
    b = q.enqueue(r, {"doc_id": 1}, "doc-1")
    _need(a == "doc-1" and b == "doc-1", f"enqueue returned {a!r} then {b!r}",
          "enqueue must return the job_id it was given")
    jobs = _claim_all(q, r, 30)
    _need(len(jobs) == 1, f"pending: {len(jobs)} claims got the job after two "
          "enqueues", "before adding, look the id up (e.g. HEXISTS / SET NX) in the "
          "same script as the push")
    q.enqueue(r, {"doc_id": 1}, "doc-1")
    again = q.claim(r, 30)
    _need(again is None, f"in flight: re-enqueue made it claimable again: {again!r}",
          "an id that is in flight is still one job: keep its record until ack")
    _need(q.ack(r, "doc-1", jobs[0][2]), "ack by the owner returned False",
          "ack must succeed for the current attempt")
    q.enqueue(r, {"doc_id": 1}, "doc-1")
    after = q.claim(r, 30)
    _need(after is None, f"done: re-enqueue after ack ran the job again: {after!r}",
          "keep a done marker for acked ids (with a retention period) and refuse "
          "to enqueue them again")
    return "one claim per id in all three states"


@_check("claim_returns_payload_and_attempt",
        "claim on an empty queue returns None; then (job_id, payload, 1) with the "
        "payload unchanged")
def _claim_returns(q, r, url):
    empty = q.claim(r, 30)
    _need(empty is None, f"claim on an empty queue returned {empty!r}",
          "return None when nothing is pending")
    payload = {"doc_id": 7, "text": "héllo wörld", "tags": [1, 2], "n": None}
    q.enqueue(r, payload, "doc-7")
    job = q.claim(r, 30)
    _need(job is not None, "claim returned None after enqueue",
          "claim must pop the pending job")
    _need(len(tuple(job)) == 3, f"claim returned {job!r}",
          "return a tuple (job_id, payload, attempt)")
    job_id, got, attempt = job
    _need(job_id == "doc-7", f"job_id {job_id!r}",
          "return the job_id as a str (decode bytes from Redis)")
    _need(got == payload, f"payload {got!r}",
          "store the payload as JSON and json.loads it on claim")
    _need(attempt == 1 and isinstance(attempt, int), f"attempt {attempt!r}",
          "the first claim is attempt 1, an int")
    return f"{job!r}"


@_check("attempt_grows",
        "each claim of the same job has an attempt one larger: 1, 2, 3")
def _attempt_grows(q, r, url):
    q.enqueue(r, {"doc_id": 2}, "doc-2")
    seen = []
    for _ in range(3):
        job = q.claim(r, LEASE)
        _need(job is not None, f"claim returned None after attempts {seen}",
              "reap must put an expired job back in pending")
        seen.append(job[2])
        _expire_and_reap(q, r, max_attempts=10)
    _need(seen == [1, 2, 3], f"attempts {seen}",
          "increment the attempt counter inside the claim script (HINCRBY), once "
          "per claim, never reset it")
    return f"attempts {seen}"


@_check("zombie_ack_refused",
        "ack with an old attempt returns False, both while the job waits in pending "
        "and after a new attempt claimed it")
def _zombie_ack(q, r, url):
    q.enqueue(r, {"doc_id": 3}, "job-z")
    first = q.claim(r, LEASE)
    _need(first is not None, "claim returned None after enqueue", "")
    requeued, _ = _expire_and_reap(q, r)
    _need(requeued == 1, f"reap returned requeued={requeued}",
          "reap must requeue an expired lease")
    early = q.ack(r, "job-z", first[2])
    _need(not early, f"a zombie (attempt {first[2]}) acked a job that reap had put "
          "back in pending and ack returned True",
          "ack only a job that is in flight under the caller's attempt")
    second = q.claim(r, 30)
    _need(second is not None, "the job vanished: claim returned None after the "
          "zombie's ack", "a refused ack must change nothing")
    late = q.ack(r, "job-z", first[2])
    _need(not late, f"a zombie (attempt {first[2]}) acked after attempt {second[2]} "
          "claimed the job and ack returned True",
          "compare the caller's attempt with the job's current attempt inside the "
          "script (the fencing token)", witnessed=("stale_ack_accepted",))
    _own_ack_after_fail(q, r)
    _own_ack_after_ack(q, r)
    return ("both zombie acks returned False; so did an ack after the attempt's "
            "own fail and after its own ack")


def _own_ack_after_fail(q, r) -> None:
    attempt = _after_own_fail(q, r, "job-fa")
    _need(not q.ack(r, "job-fa", attempt),
          f"attempt {attempt} called fail (True), then ack: ack returned True, "
          "so the failed job counts as done without its retry",
          "a failed attempt holds no lease: ack must refuse it (check that the "
          "lease is live, not only that it exists)")
    _retried_after(q, r, "job-fa", attempt, "ack")


def _own_ack_after_ack(q, r) -> None:
    q.enqueue(r, {"doc_id": 6}, "job-aa")
    job = q.claim(r, 30)
    _need(job is not None and q.ack(r, "job-aa", job[2]),
          f"the owner's ack of {job!r} returned False", "")
    _need(not q.ack(r, "job-aa", job[2]),
          f"attempt {job[2]} acked twice and the second ack returned True",
          "an acked job holds no lease: a second ack must be refused")
    reaped, again = tuple(q.reap(r, 3)), q.claim(r, 30)
    _need(reaped == (0, 0) and again is None,
          f"after attempt {job[2]} acked twice, reap returned {reaped} and claim "
          f"{again!r}", "an acked job is done: never reaped, never claimed again")


@_check("zombie_extend_refused",
        "extend with an old attempt returns False and leaves the owner's lease alone")
def _zombie_extend(q, r, url):
    old, new = _zombie_and_owner(q, r, owner_lease=LEASE)
    res = q.extend(r, "job-z", old, 30)
    _need(not res, f"a zombie (attempt {old}) extended the lease of attempt {new} "
          "and extend returned True",
          "compare the caller's attempt with the job's current one before moving "
          "the deadline")
    requeued, _ = _expire_and_reap(q, r)
    _need(requeued == 1, "the owner's short lease did not expire: the zombie's "
          f"extend moved it (reap requeued {requeued})",
          "a refused extend must not touch the deadline")
    attempt = _after_own_fail(q, r, "job-fe")
    _need(not q.extend(r, "job-fe", attempt, 30),
          f"attempt {attempt} called fail (True), then extend: extend returned "
          "True, reviving the lease its own fail gave up",
          "a failed attempt holds no lease: extend must refuse it (a deadline of "
          "0 or a failed mark is not a lease to push)")
    _retried_after(q, r, "job-fe", attempt, "extend")
    return ("zombie extend returned False; owner's lease unchanged; an extend "
            "after the attempt's own fail refused")


@_check("zombie_fail_refused",
        "fail with an old attempt returns False and does not end the owner's lease "
        "or record an error")
def _zombie_fail(q, r, url):
    old, new = _zombie_and_owner(q, r, owner_lease=30)
    res = q.fail(r, "job-z", old, "zombie says boom")
    _need(not res, f"a zombie (attempt {old}) failed the job held by attempt {new} "
          "and fail returned True",
          "compare the caller's attempt with the job's current one inside the script")
    # No `witnessed`: the graded chaos run calls fail() only for a payload a
    # worker cannot read (a poison document kills its worker first, crash
    # point "on-poison:1"), which only some wrong queues hand out.
    reaped = tuple(q.reap(r, 1))
    _need(reaped == (0, 0), f"after the zombie's fail, reap returned {reaped}",
          "a refused fail must not expire the owner's lease")
    _need(not q.dead(r), f"dead() = {q.dead(r)!r}", "a refused fail changes nothing")
    attempt = _after_own_fail(q, r, "job-ff")
    _need(not q.fail(r, "job-ff", attempt, "boom again"),
          f"attempt {attempt} called fail (True), then fail again: the second "
          "fail returned True", "a failed attempt holds no lease: a second fail "
          "by it must be refused")
    _retried_after(q, r, "job-ff", attempt, "second fail")
    return ("zombie fail returned False; nothing reaped; a second fail by the "
            "same attempt refused")


@_check("owner_ack_after_zombie",
        "after a zombie's ack, extend and fail, the owner's ack returns True and "
        "the job is never delivered again")
def _owner_ack(q, r, url):
    old, new = _zombie_and_owner(q, r, owner_lease=30)
    q.ack(r, "job-z", old)
    q.extend(r, "job-z", old, 30)
    q.fail(r, "job-z", old, "zombie")
    ok = q.ack(r, "job-z", new)
    _need(ok, f"the owner's ack (attempt {new}) returned False after the zombie "
          f"(attempt {old}) tried ack/extend/fail",
          "a zombie's call must not remove or change the owner's entry")
    again = q.claim(r, LEASE)
    _need(again is None, f"the acked job was delivered again: {again!r}",
          "ack must remove the job from pending and in flight")
    reaped = _expire_and_reap(q, r)
    _need(reaped == (0, 0), f"reap after the owner's ack returned {reaped}",
          "ack must remove the lease so reap never sees the job again")
    return "owner ack True; no redelivery"


@_check("extend_does_not_resurrect",
        "extend after reap took the lease returns False, and the job is delivered "
        "exactly once more")
def _no_resurrect(q, r, url):
    q.enqueue(r, {"doc_id": 4}, "job-r")
    first = q.claim(r, LEASE)
    requeued, _ = _expire_and_reap(q, r)
    _need(requeued == 1, f"reap returned requeued={requeued}", "")
    res = q.extend(r, "job-r", first[2], LEASE)
    _need(not res, "a late heartbeat after reap returned True",
          "only move a deadline that still exists (ZADD ... XX) and check the attempt")
    time.sleep(PAST)
    q.reap(r, 10)
    jobs = _claim_all(q, r, 30)
    _need(len(jobs) == 1, f"the job was delivered {len(jobs)} times after the late "
          "extend", "the late extend put the job back in flight; reap then "
          "requeued it a second time. Use ZADD XX so extend never adds a lease")
    return "extend False; one delivery"


@_check("reap_requeues_expired",
        "reap leaves live leases alone, requeues expired ones, and they come back "
        "with the next attempt")
def _reap_requeues(q, r, url):
    for i in range(3):
        q.enqueue(r, {"doc_id": i}, f"doc-{i}")
    lease = 1.0                         # room for a slow machine before the reap
    jobs = _claim_all(q, r, lease)
    _need(len(jobs) == 3, f"claimed {len(jobs)} of 3", "")
    early = tuple(q.reap(r, 3))
    _need(early == (0, 0), f"reap before the deadline returned {early}",
          "compare the deadline with the server's clock (TIME) inside the script")
    time.sleep(lease - LEASE)
    late = _expire_and_reap(q, r)
    _need(late == (3, 0), f"reap after the deadline returned {late}",
          "every lease whose deadline passed goes back to pending: (3, 0)")
    again = _claim_all(q, r, 30)
    ids = sorted(j[0] for j in again)
    _need(ids == ["doc-0", "doc-1", "doc-2"] and all(j[2] == 2 for j in again),
          f"claimed again: {sorted(again)}", "each job once more, attempt 2")
    return "(0, 0) before, (3, 0) after; attempt 2"


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


def _handed_again(q, r, max_attempts: int) -> tuple[str, tuple[str, ...]]:
    """What claims hand out after reapers put one expiry back more than once:
    the same job to several holders at once, and more claims than attempts."""
    try:
        jobs = _claim_all(q, r, 30, limit=2_000)
        copies = Counter(j[0] for j in jobs)
    except Exception:       # a claim that raises or returns junk: show nothing
        return "", ()
    job, most = copies.most_common(1)[0] if copies else ("", 0)
    if most < 2:
        return "", ()
    seen = ("handed_out_twice",) + (("over_delivered",)
                                    if 1 + most > max_attempts else ())
    said = (f"; claims (30 s leases) then handed {str(job)[:80]} out {most} times "
            f"at once, {1 + most} claims in all with max_attempts={max_attempts}")
    return said, seen


@_check("reap_atomic_concurrent",
        "8 reapers at once on 200 expired leases requeue each job once, then bury "
        "each once", timeout=40)
def _reap_concurrent(q, r, url):
    n, k = 200, 8
    for i in range(n):
        q.enqueue(r, {"doc_id": i}, f"doc-{i}")
    clients = _clients(url, k)
    for rnd, (max_attempts, want) in enumerate([(5, "requeued"), (2, "dead")]):
        claimed = _claim_all(q, r, LEASE)
        _need(len(claimed) == n, f"round {rnd + 1}: claimed {len(claimed)} of {n}",
              "")
        time.sleep(PAST)
        results = _threads(k, lambda i, m=max_attempts: tuple(
            q.reap(clients[i], m)), timeout=30)
        requeued = sum(x[0] for x in results)
        dead_n = sum(x[1] for x in results)
        expect = (n, 0) if want == "requeued" else (0, n)
        got = (f"round {rnd + 1} (max_attempts={max_attempts}): {k} concurrent "
               f"reapers reported requeued={requeued}, dead={dead_n} for {n} "
               "expired jobs")
        seen: tuple[str, ...] = ()
        if requeued + dead_n > n:
            hint = ("find and move the expired leases in ONE script, so two "
                    "reapers can never both see the same job")
            more, seen = _handed_again(q, r, max_attempts)
            got += more
        elif requeued + dead_n == n:
            hint = ("after two claims every job has used 2 attempts (an expired "
                    "lease counts as one), so with max_attempts=2 bury them all")
        else:
            hint = "every expired lease must be reaped by one of the reapers"
        _need((requeued, dead_n) == expect, got, hint, witnessed=seen)
    again = _claim_all(q, r, 30)
    _need(not again, f"{len(again)} jobs were still pending after all were buried",
          "a job moved to the DLQ must not also be requeued")
    counts = Counter(d[0] for d in q.dead(r))
    twice = [i for i, c in counts.items() if c > 1]
    _need(len(counts) == n and not twice,
          f"dead() has {len(counts)} distinct ids, {len(twice)} listed twice",
          "bury each job once, atomically")
    attempts = Counter(d[1] for d in q.dead(r))
    _need(set(attempts) == {2}, f"attempts in dead(): {dict(attempts)}",
          "two claims each: attempts must rise by one per claim")
    return f"requeued {n} once, buried {n} once, attempts 2"


def _claim_forever(spec: str, url: str, claimed, parent: int) -> None:
    """In a child process: claim and never ack, until someone kills us. In a
    process group of its own, which its host joins: a kill of the group ends
    the call where it is, in the learner's process too. Out of the check's
    group, it dies with the check instead (a check stopped at its limit)."""
    die_with_parent(parent)
    os.setpgid(0, 0)
    q = load_queue(spec)
    r = _client(url)
    while True:
        if q.claim(r, LEASE) is None:
            time.sleep(0.001)
        else:
            claimed.value += 1


# How long a claimer may go without a claim while jobs are pending (a restart
# included: a fork and a host, about 0.1 s, more on a loaded machine).
STILL_S = 15.0
KILLS_S = 60.0          # for all the kills: about 0.1 s each on a quiet machine


def _kill_group(p) -> None:
    """SIGKILL a child that leads a process group, with all it started there,
    then reap it."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(p.pid, signal.SIGKILL)
    if p.is_alive():            # not yet in its own group
        p.kill()
    p.join(5)


def _claims_survive_kills(q, r, url, n: int = 400, workers: int = 1,
                          kills: int = 24) -> None:
    """SIGKILL claimers while they claim: no job may vanish between two steps.

    Each kill waits until its victim is seen claiming, so it lands inside the
    claim loop (not on a worker still starting up, nor on an empty queue) even
    when a loaded machine makes restarts slow. One claimer: a kill needs no
    rival, and while a victim restarted, four claimers emptied 3,000 jobs
    before the 24th kill; one takes a few jobs a kill.
    """
    enqueued = [0]

    def add(count: int) -> None:
        for i in range(enqueued[0], enqueued[0] + count):
            q.enqueue(r, {"doc_id": i}, f"k-{i}")
        enqueued[0] += count

    def top_up(landed: int) -> None:
        """Keep jobs pending: a claimer the kills do not reach (its killer
        starved of CPU) can claim all of them, and then claims nothing. Each
        kill may have taken one job its counter never showed (popped, then
        killed before the count), so each counts as one claim more."""
        while enqueued[0] - claimed() - landed < n // 2:
            add(n // 4)

    ctx = multiprocessing.get_context("fork")
    rng = random.Random(0)
    procs, counters, before = [], [], [0]    # before: claims of the killed

    def claimed() -> int:
        return before[0] + sum(c.value for c in counters if c is not None)

    def start(i: int) -> None:
        if counters[i] is not None:
            before[0] += counters[i].value
        counters[i] = ctx.RawValue("q", 0)
        procs[i] = ctx.Process(target=_claim_forever,
                               args=(_SPEC[0], url, counters[i], os.getpid()))
        procs[i].start()

    try:
        add(n)
        for i in range(workers):
            procs.append(None)
            counters.append(None)
            start(i)
        landed, still, deadline = 0, False, time.monotonic() + KILLS_S
        while landed < kills and time.monotonic() < deadline:
            i = rng.randrange(workers)
            seen_at = counters[i].value
            wait_until = time.monotonic() + STILL_S
            while counters[i].value == seen_at and time.monotonic() < wait_until:
                top_up(landed)
                time.sleep(0.0005)
            if counters[i].value == seen_at:
                still = True
                break                    # it claims nothing: judged below
            time.sleep(rng.uniform(0, 0.002))
            _kill_group(procs[i])
            landed += 1
            start(i)
    finally:
        for p in procs:
            if p is not None:
                _kill_group(p)
    seen: set = set()
    for _ in range(20):                  # drain: everything claimed by the dead
        time.sleep(PAST)                 # expires, is reaped and claimed here
        while tuple(q.reap(r, 1000)) != (0, 0):
            pass
        batch = _claim_all(q, r, 60)
        seen.update(j[0] for j in batch)
        if not batch:
            break
    n = enqueued[0]
    lost = sorted(set(f"k-{i}" for i in range(n)) - seen)
    _need(not lost, f"after {landed} SIGKILLs of claiming workers, {len(lost)} of {n} "
          f"jobs were gone (neither pending nor in flight), e.g. {lost[:3]}",
          "a worker killed between the pop and recording the lease loses the job: "
          "pop, count the attempt and record the lease in ONE script",
          witnessed=("lost",))
    # Fewer kills would prove less than the message above says.
    why = (f"a claimer (restarted, {n - claimed()} or more jobs pending) claimed "
           f"nothing for {STILL_S:g} s" if still else
           f"in {KILLS_S:g} s, each waiting for its restarted claimer's next claim")
    _need(landed == kills, f"{landed} of {kills} SIGKILLs landed: {why}",
          "claim returns at once while jobs are pending, a new worker's first "
          "claim too")


@_check("claim_atomic_concurrent",
        "8 claimers at once on 300 jobs: each job claimed exactly once, attempt 1, "
        "every claimed job in flight, None only once nothing is pending; and "
        "claimers killed mid-claim lose no job",
        timeout=150)
def _claim_concurrent(q, r, url):
    # A claim that blocks is caught by the threads' own 30 s limit; the check's
    # limit only has to outlast a correct queue on a loaded machine, where a
    # grade's chaos run and other lanes share the cores (60 s was not enough).
    n, k = 300, 8
    for i in range(n):
        q.enqueue(r, {"doc_id": i}, f"doc-{i}")
    clients = _clients(url, k)
    claimed, empty_at, lock = [0], [], threading.Lock()

    def claim_until_none(i: int) -> list:
        out = []
        while (job := q.claim(clients[i], LEASE)) is not None:
            out.append(tuple(job))
            with lock:
                claimed[0] += 1
        with lock:
            empty_at.append(claimed[0])
        return out

    results = _threads(k, claim_until_none, timeout=30)
    # When a claim said None, the other k - 1 claimers had popped at most one
    # job each beyond those counted: fewer than n in all means one was pending.
    early = min(empty_at, default=n)
    _need(early + k - 1 >= n, f"a claim returned None when {early} of {n} jobs had "
          f"been claimed (at least {n - early - k + 1} were still pending)",
          "claim returns None only when nothing is pending: when an optimistic "
          "transaction (WATCH/MULTI) is refused, try again instead of giving up")
    jobs = [j for part in results for j in part]
    counts = Counter(j[0] for j in jobs)
    twice = sorted(i for i, c in counts.items() if c > 1)
    gone, lost = "", ()
    if twice:                   # the claim's gaps may lose jobs as well: say so
        r.flushdb()
        try:
            _claims_survive_kills(q, r, url)
        except _Failed as err:
            if err.witnessed:
                gone, lost = f"; and {err.got}", tuple(err.witnessed)
    _need(not twice, f"{len(twice)} jobs claimed twice, e.g. {twice[:3]}{gone}",
          "pop and record the lease in ONE script so two claimers cannot take the "
          "same job", witnessed=("handed_out_twice", *lost))
    _need(len(counts) == n, f"{len(counts)} of {n} jobs claimed", "")
    _need(all(j[2] == 1 for j in jobs) and all(j[1] == {"doc_id": int(j[0][4:])}
                                               for j in jobs),
          "wrong attempt or payload in some claims", "")
    reaped = _expire_and_reap(q, r, 3)
    _need(reaped == (n, 0), f"after the leases expired reap returned {reaped}",
          "every claimed job must be in flight (with a deadline) when claim returns")
    r.flushdb()
    _claims_survive_kills(q, r, url)
    return f"{n} distinct claims, all in flight; no job lost to kills"


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


# The heartbeat check (judged by the server's clock and the kernel's count of
# waiting) and the checks that stop a call between its round trips live in
# modules of their own; importing them registers them, after the ones above.
import handson.queues.lease_keeping  # noqa: E402,F401
from handson.queues import interleave  # noqa: E402,F401

# --- the runner --------------------------------------------------------------------

def _child(conn, name: str, spec: str, url: str, parent: int) -> None:
    os.setpgid(0, 0)
    die_with_parent(parent)
    check = CHECKS[name]
    os.environ["QUEUE_MAX"] = BIG_QUEUE_MAX
    os.environ.update(check.env)
    _SPEC[0] = spec
    try:
        q = load_queue(spec)
        r = _client(url)
        _empty(q, r)
        got = check.fn(q, r, url)
        result = CheckResult(name, True, check.expected, str(got), "")
    except _Failed as err:
        result = CheckResult(name, False, check.expected, err.got, err.hint,
                             err.timeline, err.witnessed)
    except ContractError as err:
        result = CheckResult(name, False, check.expected, str(err),
                             "fix the module so it imports and has all seven "
                             "functions")
    except Exception as err:
        result = CheckResult(name, False, check.expected,
                             f"raised {type(err).__name__}: {err}",
                             "a contract function raised; run this check alone "
                             "with --only to see it")
    conn.send(asdict(result))
    conn.close()


def _run_one(name: str, spec: str, url: str, timeout: float | None = None
             ) -> CheckResult:
    check = CHECKS[name]
    timeout = timeout or check.timeout
    ctx = multiprocessing.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(child, name, spec, url, os.getpid()))
    p.start()
    child.close()
    result = None
    try:
        with Stops(p.pid) as stops:
            if parent.poll(timeout):
                with contextlib.suppress(EOFError):
                    result = CheckResult(**parent.recv())
    finally:
        _kill_group(p)                  # the check and anything it started
        parent.close()
    if result is not None and result.ok and result.got.startswith(NOT_JUDGED) \
            and stops.seen:
        return CheckResult(name, False, check.expected,
                           f"{result.got}; but the check's processes were stopped "
                           "by a signal meanwhile (SIGSTOP), and a process that "
                           "stops itself is no busy machine",
                           "nothing in the module may stop or pause its process")
    if result is not None:
        return result
    if p.exitcode not in (None, -signal.SIGKILL):
        got = f"the check's process exited with code {p.exitcode} and no result"
        hint = "the queue module exited or crashed the interpreter (sys.exit?)"
    else:
        got = f"no answer after {timeout:g} s; the check was stopped"
        hint = "a contract call blocked or looped (e.g. BLPOP, a busy wait)"
    return CheckResult(name, False, check.expected, got, hint)


def run_checks(queue_spec: str, redis_url: str, only: list[str] | None = None,
               timeout: float | None = None) -> list[CheckResult]:
    """Run the named checks (all by default) against the queue module.

    `timeout` replaces each check's own time limit (seconds) when given.
    """
    names = list(only) if only else list(CHECKS)
    unknown = [n for n in names if n not in CHECKS]
    if unknown:
        raise ValueError(f"unknown check(s) {unknown}; known: {', '.join(CHECKS)}")
    connect(redis_url).close()          # a clear RedisUnavailable up front
    remote_module.share_hosts()         # each check's process forks from here
    return [_run_one(name, queue_spec, redis_url, timeout) for name in names]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("queue", help="module name (handson.q) or path (myq.py)")
    ap.add_argument("--json", action="store_true", help="print JSON results")
    ap.add_argument("--only", nargs="+", metavar="NAME", choices=list(CHECKS),
                    help="run only these checks")
    args = ap.parse_args(argv)
    with cli_redis(), redis_url() as url:
        results = []
        for name in args.only or list(CHECKS):
            res = run_checks(args.queue, url, [name])[0]
            results.append(res)
            if not args.json:
                print(res.line(), flush=True)
    if args.json:
        print(json.dumps([asdict(x) for x in results], indent=2))
    else:
        passed = sum(x.ok for x in results)
        print(f"{passed}/{len(results)} checks passed")
    return 0 if all(x.ok for x in results) else 1


if __name__ == "__main__":
    sys.exit(main())
