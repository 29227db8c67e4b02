"""Assignment 2, claim_ack_reap: the learner's queue module, judged by behaviour.

The notebook's `%%writefile myqueue.py` cell writes a real module. It is graded
by the lab's contract checks (`handson.queues.checks`, one point value per
check name) and by chaos runs of real worker processes with SIGKILL on that
module (`handson.chaos`): nothing lost, nothing applied twice with the
idempotent worker, every dead job with a reason, no stale ack accepted. The
grader never reads a key: another key layout, or Redis Streams, is fine.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from autograder.judges import queue_runs
from autograder.judges.checks import (
    Check,
    Evaluation,
    ModuleFile,
    not_run,
    outcome,
)
from handson.faults.engine import INVARIANTS as MEANS

NAME = "claim_ack_reap"
MODULE_FILE = "myqueue.py"
CONTRACT_CHECKS = [
    Check("enqueue_idempotent", 1, "the same job id enqueued twice is one job"),
    Check("claim_returns_payload_and_attempt", 1,
          "claim gives (job_id, payload, attempt), None when empty"),
    Check("attempt_grows", 1, "each claim of a job has a larger attempt number"),
    Check("zombie_ack_refused", 2, "an ack from an expired attempt is refused"),
    Check("zombie_fail_refused", 1, "a fail from an expired attempt is refused"),
    Check("owner_ack_after_zombie", 1, "the current owner's ack still succeeds"),
    Check("reap_requeues_expired", 1, "reap puts expired leases back to pending"),
    Check("deadline_from_server_clock", 1,
          "lease deadlines follow the Redis server's clock, not the worker's"),
    Check("reap_atomic_concurrent", 2,
          "concurrent reapers requeue each expired job once"),
    Check("claim_atomic_concurrent", 2,
          "concurrent claimers never get the same job"),
    Check("poison_to_dlq_with_reason", 2,
          "a job that keeps failing lands in the DLQ with its error"),
    Check("killed_attempt_counts", 2,
          "a worker killed mid-job has used an attempt"),
    Check("bound_refuses", 1, "enqueue past the bound is refused"),
    Check("lease_time_scales", 1,
          "leases from 0.1 s to 30 s are honoured to the millisecond"),
    Check("interleavings", 2, "a call stopped between its round trips while a "
          "rival runs still keeps the contract"),
    Check("killed_between_replies", 2, "a call killed between its round trips "
          "loses no job and counts every attempt"),
]
CHAOS_CHECKS = [
    Check("chaos_nothing_lost", 2, "kill -9 chaos: every job applied or dead"),
    Check("chaos_applied_once", 2, "kill -9 chaos: no job applied twice (idempotent) "
          "or handed to a second worker while the first still held its lease"),
    Check("chaos_dead_have_reasons", 1, "kill -9 chaos: a job that kills its worker "
          "every time ends in the DLQ after max_attempts, with a reason"),
    Check("chaos_no_stale_ack", 1,
          "kill -9 chaos: no ack from an old attempt accepted"),
]
CHECKS = CONTRACT_CHECKS + CHAOS_CHECKS
INVARIANTS = {"chaos_nothing_lost": ("lost",),
              "chaos_applied_once": ("applied_twice", "unexpected",
                                     "handed_out_twice"),
              "chaos_dead_have_reasons": ("dead_without_reason", "over_delivered"),
              "chaos_no_stale_ack": ("stale_ack_accepted", "attempt_reused")}
# claim and enqueue first: if they hang or fail, nothing else can be judged.
GATE = ("enqueue_idempotent", "claim_returns_payload_and_attempt")


def chaos_args(seed: int, quick: bool) -> list[str]:
    """Real workers on the learner's module; heartbeats are assignment 3.

    The run lasts until its quota is in (KILLS kills and no more, PAUSES
    pauses past the lease, keyed to claims so the seed replays the schedule,
    CRASH_KILLS
    kills inside any contract call, after one of its Redis replies, and
    CRASH_KILLS more inside claim()), in batches
    of 25 documents with a poison one in every 200;
    `quick` changes nothing here (one run holds the quota). Short of the
    quota within the cap, the verdict is unknown.
    Some faults are built, not drawn: each pause lasts until the paused
    worker's job is claimed again (then the new holder waits while the zombie
    acks), every poison document kills the worker that holds it (SIGKILL at
    the crash point `on-poison`) until it has died max_attempts times, and
    two extra reapers race the workers' reap calls, and every ~20 claims the
    first of them is stopped inside its next reap, between the Redis reply
    that read a job and its next request, until that job has been claimed
    again (its new holder waits while the reap goes on): a reap that reads and
    acts in separate round trips then hands out a job that has an owner, for
    certain rather than by chance. (The engine can also kill the reapers and
    set their clocks off, `--fault-reapers`; the graded run does not: the
    contract checks kill a reap between its replies and skew its clock.)
    """
    return ["4", "--docs", "25", "--seed", str(seed), "--kill-every", "0",
            "--kill-every-claims", str(KILL_EVERY), "--max-kills", str(KILLS),
            "--pause-every-claims", str(PAUSE_EVERY), "--min-kills", str(KILLS),
            "--min-pauses", str(PAUSES), "--quota-cap-s", "120",
            "--crash-point", "mid-call", "--crash-point", "mid-claim",
            "--crash-point", "on-poison:1",
            "--crash-p", "0.01",
            "--min-crash-kills", str(CRASH_KILLS),
            "--lease-s", str(LEASE_S), "--iters", str(ITERS),
            "--drain-timeout-s", "150",
            "--no-heartbeat", "--zombie-pauses", "--min-zombies", str(ZOMBIES),
            "--poison-every", "200", "--reapers", "2",
            "--reaper-pause-every-claims", "20",
            "--min-reaper-pauses", str(REAPER_PAUSES)]


KILLS, PAUSES = 20, 5      # faults every graded chaos run must inject
# How the quota is laid out: a kill every ~5 claims until the 20th, a pause
# every ~15, leases of half a second. The chaos's workers keep about a core
# busy whatever they are given, so its length is its cost: a kill every ~10
# claims with no end and one-second leases (two pauses at a time, each a lease
# and more) took 4.9 to 5.5 CPU-s a run; this 3.3 to 3.5, with the same quota.
KILL_EVERY, PAUSE_EVERY, LEASE_S = 5, 15, 0.5
# Kills inside a call, at random, after a random one of its Redis replies: at
# least CRASH_KILLS inside any call and as many inside claim() (every poison
# document kills its worker as well). A reap that never buries an expired job
# was caught in 1 of 3 sandboxed runs without the poison kills, in 3 of 3 with
# them; a claim in two round trips in 2 of 3 with two kills inside any call,
# in 10 of 10 with one more inside claim().
CRASH_KILLS = 1
# Zombies (paused workers that ack after their job's next claim) are built
# when the run can, but not a quota: behind the sandbox a re-claim can take
# longer than the engine waits, and a correct queue must never be "unknown".
ZOMBIES = 0
# Reaper pauses: at least one armed reap of the first extra reaper, stopped
# mid-reap or, for a reap in one script, taking a lease back with no gap to stop
# in (runs make 5 to 10; more as a quota could leave a correct queue whose
# reaper rarely wins a lease short of it, unknown).
REAPER_PAUSES = 1
# Work per job: long enough to be caught holding it. Computed, not waited: a
# reap in two round trips (read, then ZREM-guarded moves) was caught in 9 of
# 9 runs on 12,000 hash rounds, in 15 of 18 on a 12 ms sleep (a job that ends
# on time is acked before the engine can hold it for the paused reaper).
ITERS = 12000
# One run holds the whole quota: the quota, not the number of runs, sets how
# hard the queue is tested, and a second run doubled the CPU of a grade.
SEEDS, QUICK_SEEDS = (1,), (1,)
# The contract checks run in lanes side by side, each on a database of its own;
# the longest has a lane to itself.
ALONE, LANES = ("claim_atomic_concurrent",), 3
CHAOS_TIMEOUT_S = 180
PROBE_S = 30            # for the module's import, before any check


def _db(url: str, index: int) -> str:
    """The same server, another database number."""
    return f"{url}{'&' if '?' in url else '?'}db={index}"


def _blocked(res: dict | None) -> bool:
    """A gate check that hung, crashed or hit a stub: nothing else can run."""
    if res is None:
        return True
    got = res.get("got", "")
    return (not res["ok"]) and any(s in got for s in (
        "NotImplementedError", "no answer after", "exited with code",
        "does not meet the queue contract", "syntax error", "importing "))


def _contract_outcomes(results: dict, checks: list[Check]) -> list:
    out = []
    for c in checks:
        res = results.get(c.name)
        if res is None:
            out.append(outcome(c, False, "this check did not report (its run was "
                                         "stopped); see the problems above"))
        else:
            out.append(outcome(c, res["ok"], res.get("hint") or c.title,
                               res.get("expected", ""), res.get("got", "")))
            if not res["ok"] and res.get("timeline"):    # its failing schedule
                out[-1].timelines = [res["timeline"]]
    return out


def _unjudged(rep: dict) -> str:
    """Why a run can pass no check ('' if it can): unknown, or short of its quota.

    A run short of its fault quota can still break an invariant (that is real
    evidence, reported as such), but an unbroken one proves nothing.
    """
    if rep.get("verdict") == "unknown":
        return rep.get("reason") or "it did not drain in time"
    if rep.get("stats", {}).get("quota_short"):
        return rep.get("reason") or "its fault quota was not met"
    return ""


def _zombies_built(reports: list[dict]) -> str:
    """What a passed stale-ack check rests on: zombies are built when the run
    can, not a quota (see ZOMBIES), so a run may have tried no late ack."""
    made = sum(rep.get("stats", {}).get("faults", {}).get("zombies", 0)
               for rep in reports)
    if made:
        return (f"{made} zombie(s) answered after their job's next claim; "
                "none was accepted")
    return ("the run built no zombie (no paused worker's job was claimed again "
            "while it waited), so no late ack was tried: zombie_ack_refused "
            "alone judged the fence")


def _chaos_outcomes(reports: list[dict], shown_path: str, real_path: str) -> tuple:
    out, invariants, replay = [], {}, ""
    for c in CHAOS_CHECKS:
        ok, message, witnesses, expected, got = True, "", [], "", ""
        pictures: list[dict] = []
        for rep in reports:
            rep_replay = rep.get("replay", "").replace(real_path, shown_path)
            broken = [i for i in INVARIANTS[c.name]
                      if rep.get("invariants", {}).get(i, {}).get("ok") is False]
            if _unjudged(rep) and not broken:
                ok = False
                message = ("the chaos run's verdict is unknown, so it could not "
                           "judge this (never a pass): " + _unjudged(rep))
                replay = replay or rep_replay
                break
            for inv in broken + [i for i in INVARIANTS[c.name] if i not in broken]:
                data = rep.get("invariants", {}).get(inv, {})
                if data.get("ok") is not True:
                    ok = False
                    message = (f"invariant {inv} ({MEANS.get(inv, inv)}) broken in "
                               f"{data.get('count', '?')} job(s) (chaos seed "
                               f"{rep.get('seed')}); the "
                               "witnesses are those jobs' histories")
                    witnesses = list(data.get("witnesses", []))[:3]
                    pictures = list(data.get("timelines", []))[:3]
                    expected, got = "0 jobs", f"{data.get('count', '?')} jobs"
                    replay = replay or rep_replay
                    break
            if not ok:
                break
        if ok and c.name == "chaos_no_stale_ack":
            got = _zombies_built(reports)
        out.append(outcome(c, ok, message, expected, got, witnesses, replay))
        out[-1].timelines = pictures
    for rep in reports:                 # False beats unknown (None) beats True
        unknown = bool(_unjudged(rep))
        for name, data in rep.get("invariants", {}).items():
            got = data.get("ok")
            vals = (invariants.get(name, True),
                    None if unknown and got is not False else got)
            invariants[name] = (False if False in vals else
                                None if None in vals else True)
    return out, invariants, replay


def _missed_known_holes(chaos_out: list, results: dict) -> None:
    """Fail a passed chaos check whose invariant a contract check broke outright.

    A chaos run is a search for a counterexample, with its faults drawn at
    random: a queue with a hole may come through one run and not the next, and
    a grade that depends on that luck differs between two gradings of one
    notebook. Where a contract check's own schedule already showed the
    invariant broken (its `witnessed`), the chaos check fails the same way
    every time.
    """
    for o in chaos_out:
        if not o.ok:
            continue
        for name, res in results.items():
            seen = [i for i in res.get("witnessed", ()) if i in INVARIANTS[o.name]]
            if res.get("ok") is False and seen:
                o.ok = False
                o.message = (f"{name} (above) broke invariant {seen[0]} "
                             f"({MEANS.get(seen[0], seen[0])}) outright; this "
                             "chaos run's faults happened to miss that hole, "
                             "and a run that misses a known hole proves nothing")
                o.expected, o.got = "no hole the contract checks showed", name
                o.witnesses, o.timelines = [], []
                break


def _gate_first(path: str, redis_url: str, groups: list[list[str]],
                seeds: tuple[int, ...], quick: bool) -> tuple:
    """Enqueue and claim first, so their verdict is told first; then (grade
    only) the cost while nothing else uses the server (its counters are
    server-wide); then every lane and the chaos run at once, each on a database
    of its own (most of each is waiting on leases). One harness does the gate,
    the cost and the lanes: a harness of its own for the gate cost a sandbox,
    an interpreter and a server of hosts more (0.4 s of CPU).

    `quick` (check) measures no cost, and stops the chaos run at the first
    failed check: the learner has that to fix first, and a wrong queue's run
    often cannot drain (it ran its 150 s out while the checks took 20 s)."""
    gate: dict = {}
    stop = threading.Event() if quick else None
    blocked = threading.Event()         # the gate hung or crashed: stop the lanes
    lanes = [(_db(redis_url, len(seeds) + 1 + i), names)
             for i, names in enumerate(groups)]
    with ThreadPoolExecutor(max_workers=len(seeds)) as pool:
        runs: list = []

        def heard(res: dict) -> None:
            if res["name"] in GATE:
                gate[res["name"]] = res
                if _blocked(res) and "no answer after" in res.get("got", ""):
                    blocked.set()       # a hung gate: not another 30 s for the next
            if stop is not None and not res["ok"]:
                stop.set()

        def gate_done() -> None:
            if any(_blocked(gate.get(n)) for n in GATE):
                blocked.set()
            elif stop is None or not stop.is_set():
                runs.extend(pool.submit(queue_runs.chaos, path, _db(redis_url, i + 1),
                                        chaos_args(seed, quick), CHAOS_TIMEOUT_S,
                                        stop=stop)
                            for i, seed in enumerate(seeds))

        results, left, cost = queue_runs.contract_then_cost(
            path, redis_url, [], timeout=330, lanes=lanes, gate=list(GATE),
            cost_url=None if quick else _db(redis_url, 15), probe_s=PROBE_S,
            on_result=heard, on_gate=gate_done, stop=blocked)
        reports = [f.result() for f in runs]
    gate = {n: results[n] for n in GATE if n in results}
    if any(_blocked(gate.get(n)) for n in GATE):
        return gate, {}, left, cost, []
    rest = {n: r for n, r in results.items() if n not in GATE}
    if stop is not None and stop.is_set():     # the same verdict however fast
        reports = [queue_runs.stopped()]       # the run was
    elif not runs:          # the harness ended inside its gate's cost: no run
        reports = [{"verdict": "unknown", "invariants": {}, "replay": "",
                    "stats": {}, "reason": "the chaos run never started: the "
                    "checks' harness ended before its gate was done"}]
    return gate, rest, left, cost, reports


def evaluate_file(path: str, redis_url: str, quick: bool,
                  shown_path: str = MODULE_FILE) -> Evaluation:
    """Probe and gate, contract checks, chaos runs: each sandboxed, each with a
    limit."""
    if not Path(path).exists():
        return Evaluation(not_run(CHECKS, f"no {shown_path} was written: run the "
                                          f"`%%writefile {shown_path}` cell (or "
                                          "restore it) so the grader has a module"))
    problems: list[str] = []
    seeds = QUICK_SEEDS if quick else SEEDS
    rest_names = [c.name for c in CONTRACT_CHECKS
                  if c.name not in GATE and c.name not in ALONE]
    groups = [list(ALONE)] + [rest_names[i::LANES] for i in range(LANES)]
    try:
        gate, rest, left, cost, reports = _gate_first(path, redis_url, groups,
                                                       seeds, quick)
    except queue_runs.NotLoadable as err:
        why = str(err).replace(path, shown_path)
        return Evaluation(not_run(CHECKS, why), [why])
    gate_ok = not any(_blocked(gate.get(n)) for n in GATE)
    if not gate_ok:
        why = "; ".join(f"{n}: {gate[n]['got']}" for n in GATE
                        if _blocked(gate.get(n)) and n in gate) or "no report"
        problems.append("enqueue/claim hang, crash or are not written yet, so the "
                        f"other checks and the chaos run were skipped ({why})")
    for leftover in left[:3]:
        problems.append(f"a check left a process behind (killed): {leftover}")
    outcomes = _contract_outcomes({**gate, **rest}, CONTRACT_CHECKS)
    if not gate_ok:
        skipped = ("skipped: enqueue and claim must return first (see the first "
                   "checks)")
        for o in outcomes:
            if o.name not in GATE and o.name not in rest:
                o.message = skipped
        return Evaluation(outcomes + not_run(CHAOS_CHECKS, skipped), problems)
    chaos_out, invariants, replay = _chaos_outcomes(reports, shown_path, path)
    _missed_known_holes(chaos_out, {**gate, **rest})
    if "error" in cost:       # a problem only where no check explains it
        if all(o.ok for o in outcomes + chaos_out):
            problems.append(cost["error"].replace(path, shown_path))
        cost = {}
    return Evaluation(outcomes + chaos_out, problems, invariants, replay, cost)


# --- the grader side and the notebook side --------------------------------

NOTEBOOK_TIMEOUT_S = 120
CELLS = ModuleFile("claim_ack_reap", MODULE_FILE, evaluate_file)
evaluate, check, check_all = CELLS.evaluate, CELLS.check, CELLS.check_all
