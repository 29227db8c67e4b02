"""Checks of a queue under a crowd: many reapers or claimers at once, and
claimers killed with SIGKILL while they claim; no job twice, none lost.

Importing this module registers its checks (after the clocks', before the
failures').
"""

from __future__ import annotations

import multiprocessing
import os
import random
import threading
import time
from collections import Counter

from handson.infra import remote_module
from handson.queues.checkbase import (
    _SPEC,
    LEASE,
    PAST,
    _check,
    _claim_all,
    _client,
    _clients,
    _expire_and_reap,
    _Failed,
    _kill_group,
    _need,
    _threads,
)
from handson.queues.contract import load_queue
from handson.redis_server import die_with_parent


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


class _ForkedClaimer:
    """A claimer where the learner's module is imported (no grader): a child
    process, killed with its group and forked anew."""

    def __init__(self, url: str):
        self.url, self.before, self.proc, self.counter = url, 0, None, None
        self.ctx = multiprocessing.get_context("fork")
        self.restart()

    def claims(self) -> int:
        return self.before + self.counter.value

    def restart(self) -> None:
        if self.proc is not None:
            _kill_group(self.proc)
            self.before += self.counter.value
        self.counter = self.ctx.RawValue("q", 0)
        self.proc = self.ctx.Process(target=_claim_forever, args=(
            _SPEC[0], self.url, self.counter, os.getpid()))
        self.proc.start()

    def stop(self) -> None:
        _kill_group(self.proc)


class _HostedClaimer:
    """A claimer under the grader, where the learner's module already runs in a
    host of its own: the kill ends that host wherever its claim is, and the
    claiming thread here goes on with a new host, as a restarted worker would
    (no fork of the check per kill: about 0.3 CPU-s less a grade). A host that dies
    when no kill was made is not restarted: like a worker that crashed."""

    def __init__(self, url: str):
        self.module = remote_module.load(_SPEC[0], remote_module.prefix_from_env(),
                                         "a claimer")
        self.client, self.count, self.kills, self.restarts = _client(url), 0, 0, 0
        self.done = False
        self.thread = threading.Thread(target=self._claim, daemon=True)
        self.thread.start()

    def _claim(self) -> None:
        try:
            while not self.done:
                try:
                    job = self.module.claim(self.client, LEASE)
                except remote_module.LearnerProcessDied:
                    if self.done or self.restarts >= self.kills:
                        return          # not our kill: a worker that crashed
                    self.restarts += 1  # the next call starts the next host
                    continue
                except Exception:       # it stops, as a worker whose claim raised
                    return
                if job is None:
                    time.sleep(0.001)
                else:
                    self.count += 1
        finally:
            self.module.close()         # the host it started last

    def claims(self) -> int:
        return self.count

    def restart(self) -> None:
        self.kills += 1                 # first: the kill may land in the next call
        self.module.kill()

    def stop(self) -> None:
        self.done = True
        self.module.kill()              # a claim under way ends; the thread ends
        self.thread.join(5)
        self.module.close()


# How long a claimer may go without a claim while jobs are pending (a restart
# included: a host, or a fork without the grader, about 0.05 s, more on a
# loaded machine).
STILL_S = 15.0
KILLS_S = 60.0          # for all the kills: about 0.1 s each on a quiet machine


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

    rng = random.Random(0)
    kind = (_HostedClaimer if isinstance(q, remote_module.RemoteModule)
            else _ForkedClaimer)
    claimers: list = []

    def claimed() -> int:
        return sum(c.claims() for c in claimers)

    try:
        add(n)
        for _ in range(workers):
            claimers.append(kind(url))
        landed, still, deadline = 0, False, time.monotonic() + KILLS_S
        while landed < kills and time.monotonic() < deadline:
            victim = claimers[rng.randrange(workers)]
            seen_at = victim.claims()
            wait_until = time.monotonic() + STILL_S
            while victim.claims() == seen_at and time.monotonic() < wait_until:
                top_up(landed)
                time.sleep(0.0005)
            if victim.claims() == seen_at:
                still = True
                break                    # it claims nothing: judged below
            time.sleep(rng.uniform(0, 0.002))
            victim.restart()
            landed += 1
    finally:
        for c in claimers:
            c.stop()
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
