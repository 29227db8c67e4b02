"""Assignment pg_claim_finish: the learner's SKIP LOCKED claim and transactional ack.

The notebook's `%%writefile mypgq.py` cell writes a queue module that takes the
course's PostgreSQL queue (`handson.queues.pgq`) and replaces two functions:

    claim(r, lease_s) -> (job_id, payload, attempt) | None
    finish(r, job_id, attempt, doc_id, score) -> bool   # effect + ack, one tx

It is judged by behaviour, on a PostgreSQL of the run's own where the learner's
code logs in as a role that owns one schema and nothing else
(`autograder.isolation.pg_run`):

- staged cases, one trusted harness (`observe`) calling the module in host
  processes confined like every learner process, their clocks an hour ahead
  of the server's (a lease from the worker's clock is an hour off): the
  claim's order and lease; a claim while another transaction holds the oldest
  pending row's lock (the judge's own, as a rival claimer mid-statement
  would); a claim stopped as each of its round trips starts (its host counts
  SQL statements and COMMITs) while a rival host claims, which must not get
  the same job; `finish` from an attempt whose lease expired and whose job was
  claimed again by a rival host (whose claim must get it: nothing of the
  first host's connection may hold a reaped job), from an attempt after its
  own `fail` and after its own successful `finish` (the ack is refused: the
  effect must not stay; the next reap takes a failed job back, leaves a done
  one); `finish`, its lease run out, stopped as each of its round trips starts
  while a rival host reaps, claims and finishes the job (the effect once);
  `finish` whose effect the server refuses (the judge adds a CHECK that fails
  it: the ack must not stay). Each host keeps one connection for all its
  calls, as a long-running worker does, so state a module keeps per
  connection (a session advisory lock, a setting) carries from job to job;
- a chaos run (`handson.chaos --tx-effect`, no dedup key): workers SIGKILLed at
  random, right after their commit and as `finish` starts its last round trip
  (its host counts the SQL statements and COMMITs); nothing lost, no effect
  twice, counted from the score table by the engine's own reader
  (`handson.queues.pgq.ledger`), never by the learner's `effects()`.

The judge never reads as the superuser: its connection is the learner's own
role with `pg_catalog` as its only search path (`pg_run.RunDatabase.judge_url`),
every table is named with the learner's schema, and each read first locks the
tables and checks they are plain ones (`handson.infra.trusted_read`), so no view,
rule or function of the learner's runs with more than the learner's rights.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from pathlib import Path

from autograder.isolation import pg_run, sandbox
from autograder.judges import queue_runs
from autograder.judges.checks import Check, Evaluation, ModuleFile, not_run, outcome
from handson.infra import pg_server, trusted_read
from handson.infra.learner_module import SKEW_ENV

NAME = "pg_claim_finish"
MODULE_FILE = "mypgq.py"
CHECKS = [
    Check("claim_oldest_with_lease", 1,
          "claim hands out the oldest pending job, attempt 1, with a server lease"),
    Check("claim_skips_locked", 3,
          "a row locked by another transaction: claim takes the next one at once; "
          "a rival between its statements never gets the same job"),
    Check("finish_refused_no_effect", 2,
          "a finish whose ack is refused (a zombie, one stopped while a rival "
          "takes its job over, or after its own fail or finish) leaves no "
          "effect"),
    Check("finish_failed_no_ack", 2,
          "a finish whose effect fails leaves the job unacked"),
    Check("chaos_nothing_lost", 2, "kill -9 chaos: every job's effect applied"),
    Check("chaos_effect_once", 2,
          "kill -9 chaos, no dedup key: no effect applied twice"),
]
STAGED = [c.name for c in CHECKS[:4]]
CHAOS = {"chaos_nothing_lost": ("lost",),
         "chaos_effect_once": ("applied_twice", "unexpected")}
NOTEBOOK_TIMEOUT_S = 120
STAGED_TIMEOUT_S = 90
CHAOS_TIMEOUT_S = 150
BLOCKED_S = 3.0                     # a claim still waiting after this is blocked
SKEW_S = 3600.0                     # the learner's hosts run an hour ahead
JUDGE_ENV = "EO_JUDGE_PG_URL"       # the harness's (the learner's role)
ONE_TX = ("run the effect's INSERT and the ack's UPDATE in ONE transaction "
          "(`with c.transaction():`), and raise or roll back when the ack "
          "matches no row")


def chaos_args(seed: int = 1) -> list[str]:
    """Three workers, a SIGKILL every ~0.3 s until the fourth, at least three
    right after a commit, and on 30% of the finishes a host has made before, a
    kill as finish starts its last round trip (between an effect committed
    alone and its ack: no quota, a loaded machine reached too few); the effect
    in the ack's transaction, no dedup key. 30 documents: the quota, not their
    count, sets the chaos's length (short of it, the run enqueues more), so
    more would only lengthen the drain. The workers keep about a core busy
    whatever they are given, so the length is the cost: a kill every ~0.6 s
    with no end took 4.3-5.8 CPU-s a run, this 3.0-3.7, and the same
    invariants broke on 17 corpus modules (a finish killed mid-way 13 to 18
    times a run where it was 20 to 37)."""
    return ["3", "--docs", "30", "--seed", str(seed), "--kill-every", "0.3",
            "--min-kills", "4", "--max-kills", "4", "--iters", "2000",
            "--lease-s", "1.0",
            "--crash-point", "after-commit", "--crash-point", "mid-finish:0.3",
            "--crash-p", "0.1",
            "--min-crash-kills", "3", "--tx-effect", "--quota-cap-s", "90",
            "--drain-timeout-s", "120"]


# --- the harness (trusted; runs the learner's functions in confined hosts) --------

READ = ("pgq_jobs", "pgq_scores", "pgq_applied")


class Judge:
    """The harness's connection (the learner's role): every statement names the
    learner's tables by schema, after checking them in the same transaction."""

    def __init__(self, conn, schema: str):
        self.conn, self.schema = conn, schema

    def execute(self, query: str, params=()):
        return trusted_read.read(self.conn, self.schema, READ, query, params)

    def transaction(self):
        return self.conn.transaction()


AGE_ORDER = ("j1", "j3", "j2")  # queued in this order: ids do not sort by age


def _claim_oldest(q, judge, rival) -> dict:
    for i, job in enumerate(AGE_ORDER, 1):
        q.enqueue(None, {"doc_id": i}, job)
    claims = [q.claim(None, 30.0) for _ in range(4)]
    lease = judge.execute("SELECT extract(epoch FROM lease_until - "
                          "clock_timestamp()) FROM {pgq_jobs} WHERE id = 'j1'"
                          ).fetchone()[0]
    return {"claims": [list(c) if c else None for c in claims],
            "lease_left_s": None if lease is None else float(lease)}


def _skip_locked(q, judge, rival) -> dict:
    q.enqueue(None, {"doc_id": 1}, "j1")
    q.enqueue(None, {"doc_id": 2}, "j2")
    got: dict = {}

    def claim() -> None:
        try:
            got["claim"] = q.claim(None, 30.0)
        except Exception as err:            # noqa: BLE001 - reported
            got["error"] = f"{type(err).__name__}: {err}"

    with judge.transaction():
        judge.execute("SELECT 1 FROM {pgq_jobs} WHERE id = 'j1' FOR UPDATE")
        t = threading.Thread(target=claim, daemon=True)
        start = time.monotonic()
        t.start()
        t.join(BLOCKED_S)
        waited = time.monotonic() - start
        blocked = t.is_alive()
    t.join(60)
    if "error" in got:
        return {"error": got["error"]}
    c = got.get("claim")
    return {"blocked": blocked, "waited_s": round(waited, 2),
            "got": c[0] if c else None, "interleaved": _interleaved(q, rival)}


MAX_STEPS = 12          # a claim stopped after each of its first 12 round trips


def _interleaved(q, rival) -> dict:
    """claim stopped as each of its round trips (SQL statement, COMMIT) but the
    first starts, while a rival host claims: two jobs pending, the two claims
    must get different jobs. The first schedule that hands one out twice."""
    def fresh(k: int) -> None:
        """Two new jobs: a reset per schedule would cost the server more than
        the schedule; jobs left pending by earlier ones only add to the race."""
        q.enqueue(None, {"doc_id": 1}, f"s{k}a")
        q.enqueue(None, {"doc_id": 2}, f"s{k}b")

    fresh(0)
    seen: list[int] = []
    q.arm_pause("steps", seen.append)
    q.claim(None, 30.0)
    steps, trail = len(seen) + 1, q.trail("claim")
    for k in range(1, min(steps, MAX_STEPS + 1)):
        fresh(k)
        other: dict = {}

        def meanwhile(done: int, k=k, other=other) -> None:
            if done != k or other:
                return
            t = threading.Thread(target=lambda: other.update(
                claim=rival.claim(None, 30.0)), daemon=True)
            other["thread"] = t
            t.start()
            t.join(BLOCKED_S)           # a rival behind this claim's lock waits
        q.arm_pause("steps", meanwhile)
        mine = q.claim(None, 30.0)
        if "thread" in other:
            other["thread"].join(60)
        theirs = other.get("claim")
        if mine and theirs and mine[0] == theirs[0]:
            return {"steps": steps, "k": k, "job": mine[0],
                    "before": trail[k - 1] if k - 1 < len(trail) else "?",
                    "next": trail[k] if k < len(trail) else "?",
                    "attempts": [mine[2], theirs[2]]}
    return {"steps": steps, "k": None}


def _scores(judge, job: str) -> int:
    return judge.execute("SELECT count(*) FROM {pgq_scores} WHERE job_id = %s",
                         (job,)).fetchone()[0]


def _state(judge, job: str) -> str:
    return judge.execute("SELECT state FROM {pgq_jobs} WHERE id = %s",
                         (job,)).fetchone()[0]


def _zombie(q, judge, rival) -> dict:
    q.enqueue(None, {"doc_id": 1}, "j1")
    old = q.claim(None, 0.3)
    time.sleep(0.6)
    q.reap(None)
    new = rival.claim(None, 30.0)       # another worker: what a process remembers
    if old and not new:                 # the lease still runs, or something of
        try:                            # the host's connection holds the job
            state = _state(judge, "j1")
        except Exception:               # noqa: BLE001 - the learner's table
            state = None
        return {"kept": list(old), "state": state}
    if not old or not new:              # of its own claims fences nothing
        return {"error": f"claims returned {old!r} then {new!r} for one job"}
    zombie = q.finish(None, "j1", old[2], 1, 0.5)
    after = _scores(judge, "j1")
    owner = rival.finish(None, "j1", new[2], 1, 0.5)
    return {"zombie": zombie, "scores_after_zombie": after, "owner": owner,
            "scores": _scores(judge, "j1"), "state": _state(judge, "j1"),
            "after_fail": _after_own_fail(q, judge),
            "after_success": _after_own_success(q, judge),
            "interleaved": _finish_interleaved(q, judge, rival)}


def _after_own_fail(q, judge) -> dict:
    """The same attempt's finish after its own fail: refused, no effect; the
    next reap takes the job back and the next claim is a new attempt."""
    q.enqueue(None, {"doc_id": 2}, "j2")
    job = q.claim(None, 30.0)
    if not job or job[0] != "j2":
        return {"error": f"claim returned {job!r} with only j2 pending"}
    failed = q.fail(None, "j2", job[2], "the work failed")
    again = q.finish(None, "j2", job[2], 2, 0.5)
    scores = _scores(judge, "j2")
    q.reap(None)
    state = _state(judge, "j2")
    nxt = q.claim(None, 30.0)
    return {"attempt": job[2], "fail": failed, "finish": again, "scores": scores,
            "state_after_reap": state, "next": list(nxt) if nxt else None}


def _after_own_success(q, judge) -> dict:
    """The same attempt's finish after its own finish: refused, no second
    effect; the next reap leaves the job done, the next claim finds nothing."""
    q.enqueue(None, {"doc_id": 3}, "j3")
    job = q.claim(None, 30.0)
    if not job or job[0] != "j3":
        return {"error": f"claim returned {job!r} with only j3 pending"}
    first = q.finish(None, "j3", job[2], 3, 0.5)
    again = q.finish(None, "j3", job[2], 3, 0.5)
    scores = _effects(judge, "j3")
    q.reap(None)
    nxt = q.claim(None, 30.0)
    return {"first": first, "again": again, "effects": scores,
            "state_after_reap": _state(judge, "j3"),
            "next": list(nxt) if nxt else None}


def _effects(judge, job: str) -> int:
    """The job's effects, the most any record shows (as `pgq.ledger` counts):
    a score deleted afterwards still happened."""
    return judge.execute(
        "SELECT greatest((SELECT count(*) FROM {pgq_scores} WHERE job_id = %s),"
        " (SELECT count(*) FROM {pgq_applied} WHERE job_id = %s))",
        (job, job)).fetchone()[0]


EXPIRE_S = 0.02         # the stopped finish's lease, run out before it starts


def _finish_interleaved(q, judge, rival) -> dict:
    """finish, its lease run out, stopped as each of its round trips but the
    first starts, while a rival host reaps, claims and finishes the job: the
    job's effect must happen once. The first schedule where it does not."""
    def expired(k: int) -> list | None:
        """A new job (no reset: see `_interleaved`), claimed, its lease out."""
        q.enqueue(None, {"doc_id": 1}, f"f{k}")
        job = q.claim(None, EXPIRE_S)
        time.sleep(EXPIRE_S * 2)
        return job if job and job[0] == f"f{k}" else None

    q.reset(None)
    job = expired(0)
    if not job:
        return {"error": "claim did not return f0, the one job pending"}
    seen: list[int] = []
    q.arm_pause("steps", seen.append)
    q.finish(None, job[0], job[2], 1, 0.5)
    steps, trail = len(seen) + 1, q.trail("finish")
    for k in range(1, min(steps, MAX_STEPS + 1)):
        job = expired(k)
        if not job:
            return {"error": f"claim did not return f{k}, the one job pending"}
        rival_did: dict = {}
        q.arm_pause("steps", lambda done, k=k, did=rival_did:
                    _rival_takes_over(done, k, did, rival, f"f{k}"))
        mine = q.finish(None, job[0], job[2], 1, 0.5)
        if "thread" in rival_did:
            rival_did.pop("thread").join(60)
        effects = _effects(judge, job[0])
        if effects != 1:
            return {"steps": steps, "k": k, "effects": effects, "mine": mine,
                    "rival": rival_did, "attempt": job[2], "job": job[0],
                    "before": trail[k - 1] if k - 1 < len(trail) else "?",
                    "next": trail[k] if k < len(trail) else "?"}
    return {"steps": steps, "k": None}


def _rival_takes_over(done: int, k: int, did: dict, rival, job: str) -> None:
    """At step k: a rival host's reap, then claims and finishes until it gets
    the job (an older one a refusing finish left in flight comes first), as
    another worker would; waited for up to BLOCKED_S (it may be blocked
    behind the stopped finish's locks, which is right)."""
    if done != k or did:
        return

    def run() -> None:
        did["reap"] = list(rival.reap(None))
        for _ in range(MAX_STEPS + 1):      # f0 .. f{k} at most
            got = rival.claim(None, 30.0)
            did["claim"] = list(got) if got else None
            if not got:
                return
            did["finish"] = rival.finish(None, got[0], got[2], 1, 0.5)
            if got[0] == job:
                return
    t = threading.Thread(target=run, daemon=True)
    did["thread"] = t
    t.start()
    t.join(BLOCKED_S)


def _effect_fails(q, judge, rival) -> dict:
    q.enqueue(None, {"doc_id": 1}, "j1")
    job = q.claim(None, 30.0)
    if not job:
        return {"error": "claim returned None with one job pending"}
    judge.execute("ALTER TABLE {pgq_scores} ADD CONSTRAINT judge_refuses "
                  "CHECK (job_id <> 'j1')")
    try:
        returned = repr(q.finish(None, "j1", job[2], 1, 0.5))
    except Exception as err:                # noqa: BLE001 - what we want
        returned = f"raised {type(err).__name__}"
    state = _state(judge, "j1")
    judge.execute("ALTER TABLE {pgq_scores} DROP CONSTRAINT judge_refuses")
    return {"returned": returned, "state": state}


CASES = {"claim_oldest_with_lease": _claim_oldest,
         "claim_skips_locked": _skip_locked,
         "finish_refused_no_effect": _zombie,
         "finish_failed_no_ack": _effect_fails}


def harness(path: str, schema: str) -> None:
    """Each staged case from fresh tables; one JSON line per case."""
    import psycopg

    from handson.queues.contract import load_queue

    os.environ[SKEW_ENV] = repr(SKEW_S)     # the hosts' clocks, not the server's
    q, rival = load_queue(path), load_queue(path)
    with psycopg.connect(os.environ[JUDGE_ENV], autocommit=True) as conn:
        judge = Judge(conn, schema)
        for name, case in CASES.items():
            try:
                q.reset(None)
                data = case(q, judge, rival)
            except Exception as err:            # noqa: BLE001 - reported
                data = {"error": f"{type(err).__name__}: {err}"[:600]}
            print(json.dumps({name: data}), flush=True)


# --- observing (in the sandbox) -------------------------------------------------

def observe(path: str, redis_url: str, db: pg_run.RunDatabase,
            chaos: bool = True) -> dict:
    """The staged cases and the chaos run on the learner's module, as data."""
    env = queue_runs.learner_env(path, redis_url, queue_runs.kernel_imports(),
                                 db.learner_url)
    env[JUDGE_ENV] = db.judge_url
    workdir = Path(path).parent
    try:
        fin = sandbox.run([sys.executable, "-m", __name__, path, db.role],
                          timeout=STAGED_TIMEOUT_S, env=env)
    finally:
        sandbox.cleanup(workdir)
    obs: dict = {}
    for line in fin.stdout.splitlines():
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                obs.update(data)
    if len(obs) < len(CASES):
        why = (f"did not finish within {STAGED_TIMEOUT_S} s" if fin.timed_out else
               f"ended with exit code {fin.returncode}: {fin.tail(400)}")
        obs["error"] = f"the staged cases' run {why}"
    raised = [f"{n}: {obs.get(n, {}).get('error', 'no report')}" for n in CASES
              if "error" in obs.get(n, {"error": None})]
    if chaos and raised:              # workers would only exit, for minutes
        obs["chaos_skipped"] = ("skipped: claim and finish must run through the "
                                f"staged cases first ({raised[0][:300]})")
    elif chaos:
        env.pop(JUDGE_ENV)
        env["IDEM"] = "0"                   # no dedup key: only the transaction
        env["PGQ_URL"] = db.learner_url     # the engine's own reader: its ledger
        try:
            obs["chaos"] = queue_runs.chaos(path, redis_url, chaos_args(),
                                            CHAOS_TIMEOUT_S, env=env)
        finally:
            sandbox.cleanup(workdir)
    return obs


# --- judging (pure) -------------------------------------------------------------

def _case(obs: dict, name: str) -> tuple[dict | None, str]:
    data = obs.get(name)
    if data is None:
        return None, obs.get("error", f"{name} did not report")
    if "error" in data:
        return None, f"the staged case raised {data['error']}"
    return data, ""


def _staged(obs: dict, by: dict) -> list:
    out = []
    d, err = _case(obs, "claim_oldest_with_lease")
    c = by["claim_oldest_with_lease"]
    if d is None:
        out.append(outcome(c, False, err))
    else:
        got = [x[0] if x else None for x in d["claims"]]
        ok = (got == [*AGE_ORDER, None]
              and all(x[2] == 1 and x[1] == {"doc_id": i + 1}
                      for i, x in enumerate(d["claims"][:3]))
              and d["lease_left_s"] is not None and 20 < d["lease_left_s"] <= 30)
        out.append(outcome(
            c, ok, "claim the oldest pending row (ORDER BY queued_at, id), bump "
            "its attempt, set lease_until = clock_timestamp() + the lease, and "
            "return (id, payload, attempt); None when nothing is pending. The "
            "grader runs your claim on a host whose clock is an hour ahead of "
            "the server's: a lease from the worker's clock (time.time(), "
            "datetime.now()) is an "
            "hour off",
            f"{', '.join(AGE_ORDER)} (queued in that order) at attempt 1, "
            "then None; j1's lease about 30 s",
            f"{d['claims']}; j1's lease {d['lease_left_s']} s"))
    d, err = _case(obs, "claim_skips_locked")
    c = by["claim_skips_locked"]
    twice = (d or {}).get("interleaved", {})
    if d is None:
        out.append(outcome(c, False, err))
    elif twice.get("k"):
        out.append(outcome(
            c, False, f"claim stopped after round trip {twice['k']} of "
            f"{twice['steps']} ({twice['before']}), before {twice['next']}, "
            "while a rival host's claim ran (another worker, its own "
            f"connection): both claims returned {twice['job']} (attempts "
            f"{twice['attempts']}): pick "
            "and claim the row in ONE statement (UPDATE ... WHERE id = (SELECT "
            "... FOR UPDATE SKIP LOCKED) RETURNING ...), so no rival gets "
            "between them",
            "two claims, two different jobs", f"{twice['job']} twice"))
    else:
        out.append(outcome(
            c, not d["blocked"] and d["got"] == "j2",
            "a claim run while another transaction held j1's row lock (the "
            "judge's, as a rival claimer stopped mid-claim would): select the "
            "row to claim with FOR UPDATE SKIP LOCKED: a claimer must never "
            "wait behind (or give up because of) a row another transaction "
            "holds",
            "j2 at once (j1 locked by another transaction)",
            (f"still waiting after {BLOCKED_S:g} s, then {d['got']!r}")
            if d["blocked"] else f"{d['got']!r} after {d['waited_s']} s"))
    d, err = _case(obs, "finish_refused_no_effect")
    c = by["finish_refused_no_effect"]
    out.append(outcome(c, False, err) if d is None else _refused(c, d))
    d, err = _case(obs, "finish_failed_no_ack")
    c = by["finish_failed_no_ack"]
    if d is None:
        out.append(outcome(c, False, err))
    else:
        out.append(outcome(
            c, d["state"] == "inflight",
            ONE_TX + ": when the effect fails, the ack must roll back with it, or "
            "the job is done with no effect (lost)",
            "the job still in flight (its lease will bring it back)",
            f"finish {d['returned']}, the job {d['state']}"))
    return out


def _refused(c, d: dict):
    """finish_refused_no_effect: the first of its schedules that went wrong."""
    if "kept" in d and d.get("state") == "inflight":
        return outcome(
            c, False, "host A's claim of j1 (attempt "
            f"{d['kept'][2]}) asked for a 0.3 s lease; 0.6 s later the reap "
            "left j1 in flight, so a rival host's claim got nothing: the lease "
            "your claim wrote runs past what it was asked for. Write "
            "lease_until from the database's clock, now() plus the seconds "
            "asked (make_interval(secs => ...)), never from the worker's clock "
            "or in another unit",
            "j1 pending after the reap, and the rival's claim gets it at "
            "attempt 2", "j1 still in flight after the reap (state = "
            "'inflight'); the rival host's claim returned None")
    if "kept" in d:
        return outcome(
            c, False, "host A's claim of j1 (attempt "
            f"{d['kept'][2]}) ran out and the reap made j1 pending again; then "
            "a rival host's claim, on its own connection, got nothing: your "
            "claim left something on host A's connection (a session advisory "
            "lock, a setting) that still holds the job. A worker keeps its "
            "connection for many jobs: take only row locks, which end with "
            "the claim's transaction (FOR UPDATE SKIP LOCKED)",
            "the rival's claim gets j1 at attempt 2",
            "the rival host's claim returned None with j1 pending")
    plain = _zombie_then_owner(c, d)
    if plain is not None:
        return plain
    twice = d.get("interleaved", {})
    if twice.get("k"):
        did = twice["rival"]
        return outcome(
            c, False, f"finish of {twice['job']} (attempt {twice['attempt']}, "
            "its lease "
            f"run out) stopped after round trip {twice['k']} of "
            f"{twice['steps']} ({twice['before']}), before {twice['next']}, "
            "while a rival host's reap, claim and finish ran (reap "
            f"{did.get('reap')}, claim {did.get('claim')}, finish "
            f"{did.get('finish')}); then the stopped finish returned "
            f"{twice['mine']!r}: " + ONE_TX + ", the ack's UPDATE first "
            "(fenced on the attempt: it locks the row, so no reap or rival "
            "gets between the fence and the effect)",
            "the effect once", f"{twice['effects']} effect(s) of {twice['job']}")
    failed = d.get("after_fail", {})
    if not (failed.get("finish") is False and failed.get("scores") == 0
            and failed.get("state_after_reap") == "pending"
            and (failed.get("next") or [None, None, 0])[2]
            == failed.get("attempt", -1) + 1):
        return outcome(
            c, False, "finish after the same attempt's own fail must be "
            "refused with no effect: fence on the attempt, still in flight "
            "AND not failed (the course's `_MINE`), in the one transaction; "
            "then the next reap takes the job back for a new attempt",
            "finish False, 0 scores; after reap pending; next claim attempt "
            f"{failed.get('attempt', '?')}+1",
            failed.get("error") or
            f"fail {failed.get('fail')!r}, then finish {failed.get('finish')!r}"
            f" with {failed.get('scores')} score(s); after reap "
            f"{failed.get('state_after_reap')}; next claim {failed.get('next')}")
    done = d.get("after_success", {})
    return outcome(
        c, (done.get("first") is True and done.get("again") is False
            and done.get("effects") == 1
            and done.get("state_after_reap") == "done"
            and done.get("next") is None),
        "finish called again by the same attempt after its own successful "
        "finish must be refused with no second effect: fence on the job "
        "still in flight (state = 'inflight'), not only on the attempt; the "
        "next reap must leave the done job alone",
        "first finish True, the second False; 1 effect; done after reap; "
        "no next claim",
        done.get("error") or
        f"finish {done.get('first')!r}, then again {done.get('again')!r} with "
        f"{done.get('effects')} effect(s); after reap "
        f"{done.get('state_after_reap')}; next claim {done.get('next')}")


def _zombie_then_owner(c, d: dict):
    """The plain case first: a finish that refuses every attempt, or accepts
    a zombie's, is told so, not what a stopped schedule made of it."""
    zombie_ok = d["zombie"] is False and d["scores_after_zombie"] == 0
    owner_ok = d["owner"] is True and d["scores"] == 1 and d["state"] == "done"
    if zombie_ok and owner_ok:
        return None
    got = (f"zombie's finish {d['zombie']!r} with {d['scores_after_zombie']} "
           f"score(s); the owner's {d['owner']!r}, {d['scores']} score(s), "
           f"job {d['state']}")
    want = "zombie's finish False with 0 scores; the owner's True, 1 score"
    if not zombie_ok:
        return outcome(c, False, ONE_TX + ": the expired attempt's ack is "
                       "refused, so its effect must roll back with it", want, got)
    return outcome(
        c, False, "the zombie was refused, but so was the owner (a rival "
        "host's claim of j1, its lease running): fence on what the server "
        "holds (the attempt, state = 'inflight', NOT failed); a lease compared "
        "with the worker's clock refuses every finish", want, got)


def _chaos(rep: dict | None, by: dict) -> list:
    out = []
    for name, invariants in CHAOS.items():
        c = by[name]
        if rep is None:
            out.append(outcome(c, False, "the chaos run did not run"))
            continue
        broken = [i for i in invariants
                  if rep.get("invariants", {}).get(i, {}).get("ok") is False]
        unjudged = (rep.get("verdict") == "unknown"
                    or rep.get("stats", {}).get("quota_short"))
        if broken:
            data = rep["invariants"][broken[0]]
            out.append(outcome(
                c, False, f"invariant {broken[0]} broken (chaos seed "
                f"{rep.get('seed')}): " + ONE_TX, "0 jobs",
                f"{data.get('count', '?')} jobs",
                list(data.get("witnesses", []))[:3], rep.get("replay", "")))
        elif unjudged or not all(rep.get("invariants", {}).get(i, {}).get("ok")
                                 for i in invariants):
            out.append(outcome(c, False, "the chaos run's verdict is unknown, so it "
                               "could not judge this (never a pass): "
                               f"{rep.get('reason') or 'its quota was not met'}"))
        else:
            out.append(outcome(c, True, c.title))
    return out


def judge(obs: dict) -> list:
    by = {c.name: c for c in CHECKS}
    if "chaos_skipped" in obs:
        chaos = [outcome(by[n], False, obs["chaos_skipped"]) for n in CHAOS]
    else:
        chaos = [] if "chaos" not in obs else _chaos(obs["chaos"], by)
    return _staged(obs, by) + chaos


def evaluate_file(path: str, redis_url: str, quick: bool = False,
                  shown_path: str = MODULE_FILE, chaos: bool = True) -> Evaluation:
    if not Path(path).exists():
        return Evaluation(not_run(CHECKS, f"no {shown_path} was written: run the "
                                          f"`%%writefile {shown_path}` cell"))
    try:
        with pg_run.run_database() as db:
            obs = observe(os.path.abspath(path), redis_url, db, chaos)
    except pg_server.PostgresUnavailable as err:
        why = f"no PostgreSQL to grade on: {err}"
        return Evaluation(not_run(CHECKS, why), [why])
    problems = [obs["error"]] if "error" in obs else []
    problems += db.report.problems()
    return Evaluation(judge(obs), problems,
                      servers={"PostgreSQL": db.report.isolation})


# --- the grader side and the notebook side --------------------------------

CELLS = ModuleFile(NAME, MODULE_FILE, evaluate_file)
evaluate, check, check_all = CELLS.evaluate, CELLS.check, CELLS.check_all

if __name__ == "__main__":
    harness(sys.argv[1], sys.argv[2])
