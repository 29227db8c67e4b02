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
import signal
import sys
import time
from dataclasses import asdict

from handson.infra import remote_module
from handson.infra.stops import Stops
from handson.queues.checkbase import (
    _SPEC,
    CHECKS,
    LEASE,
    NOT_JUDGED,
    PAST,
    CheckResult,
    _check,
    _claim_all,
    _client,
    _empty,
    _expire_and_reap,
    _Failed,
    _kill_group,
    _need,
)
from handson.queues.contract import ContractError, load_queue
from handson.redis_server import cli_redis, connect, die_with_parent, redis_url

BIG_QUEUE_MAX = "10000000"


# --- helpers that use only the contract ---------------------------------------

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


# The checks of each further role live in modules of their own: clocks (whose
# clock sets a deadline), crowds (many callers at once, claimers killed),
# failures (poison, a killed attempt, the bound), the heartbeat check (judged
# by the server's clock and the kernel's count of waiting) and the checks that
# stop a call between its round trips. Importing them registers their checks,
# in this order, after the ones above.
# isort: off
from handson.queues import clocks, crowds, failures  # noqa: E402,F401
from handson.queues import lease_keeping, interleave  # noqa: E402,F401
# isort: on

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
