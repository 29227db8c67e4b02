"""Checks that stop a queue call between its Redis round trips.

A call that makes one round trip (one script, one MULTI/EXEC) is one step on
the server: nothing can happen in the middle of it. A call that makes several
can be overtaken between any two of them, by another worker or a reaper, or
die there with its process. These checks try every such point: the call runs
in a host process of its own (`handson.infra.remote_module`), which stops it
right after its k-th Redis reply, for k = 1, 2, ... until the call makes no
k-th reply. Then either a rival runs to completion from another client and
the call goes on (`pause`), or the host is killed there (`kill`) and the rest
of the system carries on without it. Each schedule is judged by the contract's
invariants alone (one owner, nothing lost, every attempt counted, a zombie
refused), so every correct queue passes, however many round trips it makes.

Deterministic: no schedule depends on timing but lease expiry, and a lease
here is either far too short (expired before anyone looks) or 30 s.

A failing schedule comes back as a timeline to draw (`schedule`, drawn by
`handson.faults.timeline`): the stopped call's replies, the stop or the kill,
the other client's calls and the rest of the call, in the order they ran,
from this harness's own records.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from dataclasses import dataclass, field

from handson.infra import remote_module
from handson.queues.checkbase import (
    _SPEC,
    _check,
    _claim_all,
    _client,
    _Failed,
    _need,
)

SHORT = 0.1         # the shortest lease of the contract, run out ...
EXPIRE = 0.16       # ... after this much sleep (the server's clock decides)
LONG = 30.0         # a lease nobody may take in a check
MAX_REPLIES = 24    # a call is stopped after each of its first 24 replies

ATOMIC_HINT = ("do the check and the write in ONE round trip: one Lua script "
               "(EVAL), or a WATCH/MULTI/EXEC transaction that retries when "
               "EXEC is refused; a rival can run between any two round trips")


@dataclass
class Run:
    """One schedule: what the stopped call and its rival returned."""

    k: int
    replies: int = 0                 # the stopped call's replies (when it ended)
    result: object = None
    rival: dict = field(default_factory=dict)
    stopped: bool = False            # did the call reach reply k?

    def where(self, fn: str) -> str:
        of = f" of its {self.replies}" if self.replies > self.k else ""
        return f"{fn} stopped after Redis reply {self.k}{of}"


def _host():
    """The learner's module in a host of its own: the one we stop."""
    prefix = remote_module.prefix_from_env()
    return remote_module.load(_SPEC[0], prefix or [], "the stopped call")


def _each_reply(host, fn: str, setup, call, rival, judge, mode: str) -> int:
    """Every schedule of one call: stop after reply k, k = 1, 2, ...

    `setup(ctx)` builds the state (the database flushed first), `call(ctx)`
    makes the stopped call, `rival(ctx)` runs in the gap (pause) or after
    the kill (kill) and `judge(ctx, run)` raises _Failed on a broken rule.
    Returns how many schedules ran. A kill is tried only where it leaves the
    server in a state no earlier kill left (`_kill_points`).
    """
    points = (_kill_points(host, fn, setup, call) if mode == "kill"
              else range(1, MAX_REPLIES + 1))
    for k in points:
        ctx: dict = {}
        setup(ctx)
        before = _state(ctx["b"]) if k == 1 and mode == "pause" else None
        run = Run(k)

        def meanwhile(n, ctx=ctx, run=run):
            run.stopped = True
            run.rival = rival(ctx)

        if mode == "pause":
            host.arm_pause(k, meanwhile)
        else:
            host.arm_crash(k)
        try:
            run.result = call(ctx)
            run.replies = host.replies(fn)
        except remote_module.LearnerProcessDied:
            if mode != "kill":
                raise
            run.stopped = True
            run.rival = rival(ctx)
        if not run.stopped:
            _need(mode == "pause", f"{fn} was to be killed after Redis reply {k} "
                  "(a plain run reads more), yet it returned: the module's round "
                  "trips cannot be checked", "leave redis-py and the grader's "
                  "process alone")
            _never_stopped(fn, before is not None and before != _state(ctx["b"]))
            return k - 1
        try:
            judge(ctx, run)
        except _Failed as err:
            err.timeline = schedule(fn, mode, run, err)
            raise
        if mode == "pause" and run.replies <= k:
            return k
    return len(points)


CHECK_OF = {"pause": "interleavings", "kill": "killed_between_replies"}
RIVAL = "another client"


def _rival_steps(rival: dict) -> list[str]:
    """What the other client's calls returned, in the order they ran."""
    steps = []
    for key, value in rival.items():
        if key == "claim":
            steps.append("claim returned None" if value is None
                         else f"claim gave {value[0]} as attempt {value[2]}")
        elif key == "left":
            steps.append(f"claims then got {[(j[0], j[2]) for j in value]}")
        elif key == "dead":
            steps.append(f"dead() listed {[d[0] for d in value]}")
        else:
            steps.append(f"{key} returned {value!r}")
    return steps


def schedule(fn: str, mode: str, run: Run, err: _Failed) -> dict:
    """A failing schedule as a timeline (`handson.faults.timeline`): one lane
    for the stopped call, one for the other client, the steps in order; the
    step that broke the rule ringed (the kill; else the rest of the call, or
    the other client's call when `err.blame` says so)."""
    held = "stopped" if mode == "pause" else "killed"
    lane = f"{fn} ({held})"
    marks: list[dict] = []

    def add(where, kind, text, bad=False, seconds=0.0):
        marks.append({"t": len(marks), "lane": where, "kind": kind,
                      "attempt": None, "text": text, "bad": bad,
                      **({"seconds": seconds} if seconds else {})})

    for i in range(1, run.k + 1):
        add(lane, "reply", f"{fn} read Redis reply {i}")
    rivals = _rival_steps(run.rival)
    if mode == "pause":
        add(lane, "stop", f"{fn} held after reply {run.k} while another client "
            "ran", seconds=len(rivals) + 0.5)
    else:
        add(lane, "kill", f"{fn}'s process killed (SIGKILL) after reply "
            f"{run.k}", bad=True)
    for i, text in enumerate(rivals):
        add(RIVAL, "rival", text, bad=err.blame == "rival" and i == len(rivals) - 1)
    if mode == "pause":
        for i in range(run.k + 1, run.replies + 1):
            add(lane, "reply", f"{fn} read Redis reply {i}")
        add(lane, "returned", f"{fn} returned {run.result!r}",
            bad=err.blame != "rival")
    where = (run.where(fn) if mode == "pause"
             else f"{fn} killed after Redis reply {run.k}")
    return {"job": f"{fn}-{held}-after-reply-{run.k}", "invariant": CHECK_OF[mode],
            "title": f"{CHECK_OF[mode]}: {where}",
            "lanes": [lane, RIVAL], "lease_s": 0, "leases": [], "ending": "",
            "sentence": err.got, "ordinal": True,
            "axis": "steps, in the order the grader ran them",
            "marks": marks, "notes": [f"step {m['t']}: {m['text']}" for m in marks
                                      if m["kind"] != "reply"]}


def _kill_points(host, fn: str, setup, call) -> list[int]:
    """The replies after which a kill leaves a state of its own.

    One plain run of the call, looking at the whole database after each reply
    (from another client, while the call waits): a kill after reply k leaves
    the server as it was then. Where nothing changed since reply k - 1 (a
    read), the kill is the same as one reply earlier; after the last reply it
    is a kill after the call, which other checks try.
    """
    ctx: dict = {}
    setup(ctx)
    states = [_state(ctx["b"])]
    host.arm_pause("every", lambda n: states.append(_state(ctx["b"])))
    call(ctx)
    _never_stopped(fn, len(states) == 1 and states[0] != _state(ctx["b"]))
    n = min(len(states) - 1, MAX_REPLIES + 1)
    return [k for k in range(1, n) if states[k] != states[k - 1]]


def _never_stopped(fn: str, changed: bool) -> None:
    """A call that changed the database read at least one Redis reply, so its
    host must have stopped there; one that did not hid its round trips."""
    _need(not changed, f"{fn} changed the database, yet its process never "
          "stopped after a Redis reply as the grader asked: the module's "
          "round trips cannot be checked",
          "leave redis-py and the grader's process alone")


def _state(r) -> list:
    """Every key of the database with its type and contents (TTLs left out)."""
    out = []
    for key in sorted(r.scan_iter(count=1000)):
        kind = r.type(key)
        value: object = None
        if kind == "string":
            value = r.get(key)
        elif kind == "hash":
            value = sorted(r.hgetall(key).items())
        elif kind == "list":
            value = r.lrange(key, 0, -1)
        elif kind == "set":
            value = sorted(r.smembers(key))
        elif kind == "zset":
            value = r.zrange(key, 0, -1, withscores=True)
        elif kind == "stream":
            value = (r.xrange(key), [sorted(g.items()) for g in r.xinfo_groups(key)])
        out.append((key, kind, value))
    return out


class Scene:
    """The clients of one check: `a` for the stopped call, `b` for rivals."""

    def __init__(self, q, url: str):
        self.q, self.host = q, _host()
        self.a, self.b = _client(url), _client(url)

    def fresh(self, ctx: dict) -> None:
        self.b.flushdb()
        if getattr(self.q, "STATE_OUTSIDE_REDIS", False) is True:
            self.q.reset(self.b)
        ctx.update(a=self.a, b=self.b)

    def expired_jobs(self, ctx: dict, ids: list[str]) -> list:
        """Jobs claimed by the stopped call's client, leases already run out."""
        self.fresh(ctx)
        for i in ids:
            self.host.enqueue(self.a, {"doc": i}, i)
        jobs = [self.host.claim(self.a, SHORT) for _ in ids]
        _need(all(j is not None for j in jobs), f"claims after enqueue: {jobs}",
              "claim must pop a pending job")
        time.sleep(EXPIRE)
        ctx["jobs"] = [tuple(j) for j in jobs]
        return ctx["jobs"]

    def reap_and_claim(self, ctx: dict) -> dict:
        reaped = tuple(self.q.reap(self.b, 10))
        got = self.q.claim(self.b, LONG)
        return {"reap": reaped, "claim": None if got is None else tuple(got)}

    def close(self) -> None:
        self.host.close()


def _rivals_text(rival: dict) -> str:
    parts = []
    if "reap" in rival:
        parts.append(f"reap returned {rival['reap']}")
    if "claim" in rival:
        c = rival["claim"]
        parts.append("claim returned None" if c is None
                     else f"claim gave attempt {c[2]}")
    return ", ".join(parts)


# --- pause: a rival runs between two round trips -----------------------------

def _fenced(s: Scene, fn: str, args) -> int:
    """ack / extend / fail of an expired lease vs reap and a new claim."""
    def setup(ctx):
        s.expired_jobs(ctx, ["job-x"])

    def call(ctx):
        (job_id, _, attempt), = ctx["jobs"]
        return getattr(s.host, fn)(s.a, job_id, attempt, *args)

    def judge(ctx, run):
        (job_id, _, old), = ctx["jobs"]
        new = run.rival["claim"]
        said = f"{fn}(attempt {old}) returned {run.result!r}"
        scene = (f"{run.where(fn)}; meanwhile reap and claim ran from another "
                 f"client ({_rivals_text(run.rival)})")
        if new is None:
            _need(fn != "fail", f"{scene}: the failed job was neither requeued "
                  "nor handed on", "a failed attempt's job goes back to pending "
                  "at the next reap", blame="rival")
            _need(run.result is True or run.result == 1,
                  f"{scene}; then {said}: the job is neither done nor pending",
                  ATOMIC_HINT)
            return
        _need(new[2] > old, f"{scene}: the new claim has attempt {new[2]}, "
              f"not above {old}", "count the attempt in the claim's one step",
              blame="rival")
        if fn != "fail":
            # No `witnessed`: the chaos judge counts an ack stale only when
            # the newer claim returned before the ack was sent, never one
            # overtaken mid-call as here.
            _need(not run.result, f"{scene}; then {said} although attempt "
                  f"{new[2]} holds the job: a zombie was accepted", ATOMIC_HINT)
        live = tuple(s.q.reap(s.b, 10))
        _need(live == (0, 0), f"{scene}; then {said}, and a reap took attempt "
              f"{new[2]}'s 30 s lease (reap returned {live}): {fn}'s later round "
              f"trip changed attempt {new[2]}'s lease", ATOMIC_HINT)
        owner = s.q.ack(s.b, job_id, new[2])
        _need(owner, f"{scene}; then {said}, and attempt {new[2]}'s ack returned "
              f"{owner!r}: {fn}'s later round trip removed attempt {new[2]}'s "
              "lease", ATOMIC_HINT)

    return _each_reply(s.host, fn, setup, call, s.reap_and_claim, judge, "pause")


def _enqueue_twice(s: Scene) -> int:
    def setup(ctx):
        s.fresh(ctx)
        s.host.dead(s.a)                # the connection is made before the call

    def call(ctx):
        return s.host.enqueue(s.a, {"doc": "dup"}, "dup")

    def rival(ctx):
        return {"enqueue": s.q.enqueue(s.b, {"doc": "dup"}, "dup")}

    def judge(ctx, run):
        jobs = _claim_all(s.q, s.b, LONG)
        _need(len(jobs) == 1, f"{run.where('enqueue')}; meanwhile another client "
              f"enqueued the same id; then {len(jobs)} claims got job 'dup'",
              "look the id up and push in ONE round trip (a script, or SET NX "
              "on a marker in the same transaction as the push); a check in "
              "the client (EXISTS, then push) lets two producers both push")

    return _each_reply(s.host, "enqueue", setup, call, rival, judge, "pause")


PROBE_S = 10.0      # a claim that spins on a copy it cannot read shows nothing


def _late_ack_after_double(s: Scene, k: int, setup, call, rival) -> str:
    """The schedule that put jobs back twice, once more, then what the chaos
    run's workers do with the copies: one claims a copy and acks it, others
    claim the rest, then the first attempt's holder (a zombie) acks late. What
    happened if that ack was accepted after a newer attempt's claim (the chaos
    judge's stale ack), else "": a queue that forgets an acked job and counts a
    copy's attempts afresh takes the zombie for the owner. Bounded in time, and
    nothing it meets is raised: it can only add a witness."""
    said = [""]

    def probe() -> None:
        ctx: dict = {}
        try:
            setup(ctx)
            s.host.arm_pause(k, lambda n: rival(ctx))
            call(ctx)
            first = s.q.claim(s.b, LONG)
            if first is None or not s.q.ack(s.b, first[0], first[2]):
                return
            job, new = first[0], first[2]
            old = {j[0]: j[2] for j in ctx["jobs"]}.get(job)
            try:
                _claim_all(s.q, s.b, LONG, limit=100)
            except Exception:       # a copy of a job that is gone may not parse
                pass
            if (isinstance(old, int) and isinstance(new, int) and new > old
                    and bool(s.q.ack(s.b, job, old))):
                said[0] = (f"; the same schedule again, then {job} claimed as "
                           f"attempt {new} and acked, the other copies claimed, "
                           f"and attempt {old}'s late ack of {job} returned True: "
                           "a zombie was taken for the owner")
        except Exception:           # a call that raises here shows nothing
            return

    worker = threading.Thread(target=probe, daemon=True, name="late-ack-probe")
    worker.start()
    worker.join(PROBE_S)
    return "" if worker.is_alive() else said[0]


def _reap_twice(s: Scene) -> int:
    ids = ["job-1", "job-2"]

    def setup(ctx):
        s.expired_jobs(ctx, ids)

    def call(ctx):
        return tuple(s.host.reap(s.a, 10))

    def rival(ctx):
        return {"reap": tuple(s.q.reap(s.b, 10))}

    def judge(ctx, run):
        mine, theirs = tuple(run.result), run.rival["reap"]
        scene = (f"{run.where('reap')}; meanwhile another reaper ran; they "
                 f"returned {mine} and {theirs} for {len(ids)} expired leases")
        total = (mine[0] + theirs[0], mine[1] + theirs[1])
        jobs = _claim_all(s.q, s.b, LONG)
        counts = Counter(j[0] for j in jobs)
        seen: tuple[str, ...] = ()
        late = ""
        if max(counts.values(), default=0) > 1:
            seen = ("handed_out_twice",)
            late = _late_ack_after_double(s, run.k, setup, call, rival)
            seen += ("stale_ack_accepted",) if late else ()
        _need(total == (len(ids), 0) and sorted(counts) == ids
              and set(counts.values()) == {1},
              f"{scene}, and claims then got {dict(sorted(counts.items()))}{late}",
              "find and move the expired leases in ONE round trip (a script), "
              "so two reapers can never both move one job",
              witnessed=seen)

    return _each_reply(s.host, "reap", setup, call, rival, judge, "pause")


def _claim_twice(s: Scene) -> int:
    ids = ["job-1", "job-2"]

    def setup(ctx):
        s.fresh(ctx)
        for i in ids:
            s.host.enqueue(s.a, {"doc": i}, i)

    def call(ctx):
        return s.host.claim(s.a, LONG)

    def rival(ctx):
        got = s.q.claim(s.b, LONG)
        return {"claim": None if got is None else tuple(got)}

    def judge(ctx, run):
        mine, theirs = run.result, run.rival["claim"]
        scene = (f"{run.where('claim')}; meanwhile another client's claim got "
                 f"{theirs!r} (2 jobs were pending)")
        _need(mine is not None, f"{scene}; then claim returned None with a job "
              "still pending", "claim returns None only when nothing is pending: "
              "when an optimistic transaction (WATCH/MULTI) is refused, try "
              "again instead of giving up")
        mine = tuple(mine)
        _need(theirs is not None, f"{scene}; then claim returned {mine!r}: the "
              "other client got nothing with 2 jobs pending",
              "claim returns None only when nothing is pending: a claim that "
              "waits for another (a lock) must not give up while jobs wait",
              blame="rival")
        _need(mine[0] != theirs[0],
              f"{scene}; then claim returned {mine!r}: one job, two owners",
              ATOMIC_HINT, witnessed=("handed_out_twice",))
        _need(mine[2] == 1 and theirs[2] == 1, f"{scene}; then claim returned "
              f"{mine!r}", "each job's first claim is attempt 1")
        for job in (mine, theirs):
            _need(s.q.ack(s.b, job[0], job[2]), f"{scene}; then claim returned "
                  f"{mine!r} and the ack of {job[0]} (attempt {job[2]}) returned "
                  "False: its lease was lost", ATOMIC_HINT)

    return _each_reply(s.host, "claim", setup, call, rival, judge, "pause")


@_check("interleavings",
        "each of ack, extend, fail, enqueue, reap and claim, stopped after each "
        "of its Redis replies while a rival runs from another client (reap and "
        "claim; the same enqueue; another reap; another claim), ends as if it "
        "ran wholly before or after the rival", timeout=60)
def _interleavings(q, r, url):
    s = Scene(q, url)
    try:
        n = (_fenced(s, "ack", ()) + _fenced(s, "extend", (LONG,))
             + _fenced(s, "fail", ("boom",)) + _enqueue_twice(s)
             + _reap_twice(s) + _claim_twice(s))
    finally:
        s.close()
    return f"{n} schedules, each as if the calls ran one after the other"


# --- kill: the call's process dies between two round trips --------------------

def _claim_killed(s: Scene) -> int:
    """Every attempt counted: a claim that took the job used an attempt."""
    def setup(ctx):
        s.fresh(ctx)
        s.host.enqueue(s.a, {"doc": "k"}, "job-k")
        first = s.host.claim(s.a, SHORT)
        time.sleep(EXPIRE)
        _need(tuple(s.host.reap(s.a, 10)) == (1, 0), "reap did not requeue an "
              "expired lease", "reap must requeue a lease whose deadline passed")
        ctx["old"] = first[2]

    def call(ctx):
        return s.host.claim(s.a, SHORT)

    def rival(ctx):
        time.sleep(EXPIRE)
        reaped = tuple(s.q.reap(s.b, ctx["old"] + 1))
        return {"reap": reaped, "left": _claim_all(s.q, s.b, LONG),
                "dead": [tuple(d) for d in s.q.dead(s.b)]}

    def judge(ctx, run):
        old, rv = ctx["old"], run.rival
        scene = (f"claim was killed after Redis reply {run.k} (attempt {old} "
                 f"had been reaped before); with max_attempts={old + 1} reap "
                 f"then returned {rv['reap']}")
        if rv["reap"] == (0, 0):
            _need(len(rv["left"]) == 1 and rv["left"][0][2] > old,
                  f"{scene} and claims got {rv['left']}: the job was lost, or "
                  "cannot be claimed",
                  "pop, count the attempt and record the lease in ONE round "
                  "trip: a worker killed between them takes the job with it")
            # No `witnessed`: an unclaimable job (a lock the dead claim held)
            # comes back later; claim_atomic_concurrent drains and names loss.
            return
        _need(rv["reap"] == (0, 1), f"{scene}: the killed claim held the job "
              f"but its attempt ({old + 1}) was not counted",
              "count the attempt in the same round trip that pops the job and "
              "records its lease, so a worker that dies holding it has used one")

    return _each_reply(s.host, "claim", setup, call, rival, judge, "kill")


def _fail_killed(s: Scene) -> int:
    def setup(ctx):
        s.expired_jobs(ctx, ["job-f"])

    def call(ctx):
        (job_id, _, attempt), = ctx["jobs"]
        return s.host.fail(s.a, job_id, attempt, "boom")

    def rival(ctx):
        reaped = tuple(s.q.reap(s.b, 10))
        return {"reap": reaped, "left": _claim_all(s.q, s.b, LONG)}

    def judge(ctx, run):
        (_, _, old), = ctx["jobs"]
        rv = run.rival
        _need(len(rv["left"]) == 1 and rv["left"][0][2] > old,
              f"fail(attempt {old}) was killed after Redis reply {run.k}; reap "
              f"then returned {rv['reap']} and claims got {rv['left']}",
              "record the error and end the lease in ONE round trip, so the job "
              "is always either held or back in line, its next attempt larger")

    return _each_reply(s.host, "fail", setup, call, rival, judge, "kill")


def _reap_killed(s: Scene) -> int:
    ids = ["job-1", "job-2"]

    def setup(ctx):
        s.expired_jobs(ctx, ids)

    def call(ctx):
        return tuple(s.host.reap(s.a, 10))

    def rival(ctx):
        return {"reap": tuple(s.q.reap(s.b, 10)),
                "left": _claim_all(s.q, s.b, LONG)}

    def judge(ctx, run):
        left = sorted(run.rival["left"])
        lost = sorted(set(ids) - {j[0] for j in left})
        _need([j[0] for j in left] == ids and all(j[2] == 2 for j in left),
              f"reap was killed after Redis reply {run.k} with {len(ids)} expired "
              f"leases; another reap then returned {run.rival['reap']} and claims "
              f"got {[(j[0], j[2]) for j in left]}"
              + (f": {', '.join(lost)} lost" if lost else ""),
              "take the lease and requeue (or bury) the job in ONE round trip: a "
              "reaper killed between them loses the job",
              witnessed=("lost",) if lost else ())

    return _each_reply(s.host, "reap", setup, call, rival, judge, "kill")


def _enqueue_killed(s: Scene) -> int:
    """A producer killed mid-enqueue retries with the same id: one job, queued."""
    def setup(ctx):
        s.fresh(ctx)
        s.host.dead(s.a)                # the connection is made before the call

    def call(ctx):
        return s.host.enqueue(s.a, {"doc": "retry"}, "job-e")

    def rival(ctx):
        s.q.enqueue(s.b, {"doc": "retry"}, "job-e")
        return {"left": _claim_all(s.q, s.b, LONG)}

    def judge(ctx, run):
        left = run.rival["left"]
        _need([(j[0], j[2]) for j in left] == [("job-e", 1)],
              f"enqueue was killed after Redis reply {run.k}; the producer's "
              f"retry with the same id returned, and claims then got "
              f"{[(j[0], j[2]) for j in left]}",
              "record the id and queue the job in ONE round trip (a script): a "
              "producer killed between them leaves an id that its retry takes "
              "for done, and the job is never queued")

    return _each_reply(s.host, "enqueue", setup, call, rival, judge, "kill")


@_check("killed_between_replies",
        "enqueue, claim, fail and reap, killed (SIGKILL) after each of their "
        "Redis replies: no job lost (a producer's retry queues it once), attempt "
        "numbers keep growing, and a killed claim that took the job has used an "
        "attempt", timeout=90)
def _killed_between(q, r, url):
    s = Scene(q, url)
    try:
        n = (_enqueue_killed(s) + _claim_killed(s) + _fail_killed(s)
             + _reap_killed(s))
    finally:
        s.close()
    if not n:
        return ("enqueue, claim, fail and reap each make one round trip: no gap "
                "to die in")
    return f"{n} kills between replies: nothing lost, every attempt counted"
