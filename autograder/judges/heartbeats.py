"""Assignment 3, heartbeats: `extend` and the worker's renewal thread.

The notebook's `%%writefile heartbeat.py` cell writes a whole queue module: the
reference queue (`handson.q`) re-exported, plus the learner's

    extend(r, job_id, attempt, lease_s) -> bool
    run_with_heartbeat(r, queue, job_id, attempt, lease_s, work) -> bool

It is graded by the lab's contract checks on extend (a zombie's extend is
refused, a late heartbeat never resurrects a reaped lease, a heartbeat keeps a
lease for ten leases) and by `autograder.judges.heartbeat_trial`: real worker
processes running 3 s jobs on 0.6 s leases, and one frozen with SIGSTOP.
"""

from __future__ import annotations

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from urllib.parse import parse_qsl, urlencode, urlsplit

from autograder.isolation import sandbox
from autograder.judges import queue_runs
from autograder.judges.checks import (
    Check,
    Evaluation,
    ModuleFile,
    not_run,
    outcome,
)
from autograder.judges.heartbeat_trial import (
    LEASE_S,
    LONG_LEASE_S,
    WORK_S,
    cadence_problem,
    own_load,
)

NAME = "heartbeats"
MODULE_FILE = "heartbeat.py"
# The notebook builds on the reference queue on purpose.
IMPORTS = ("handson/__init__.py", "handson/q.py", "handson/redis_server.py")
CONTRACT_CHECKS = [
    Check("zombie_extend_refused", 2,
          "an extend from an expired attempt is refused and moves nothing"),
    Check("extend_does_not_resurrect", 2,
          "a late heartbeat never brings back a reaped lease"),
    Check("heartbeat_keeps_lease", 1,
          "heartbeats at lease/3 keep a lease for 10 leases"),
    Check("deadline_from_server_clock", 1,
          "extend's deadline follows the Redis server's clock, not the worker's"),
]
TRIAL_CHECKS = [
    Check("stops_when_lease_lost", 2,
          "when extend says no, the work is told to stop and the job is abandoned"),
    Check("long_jobs_run_once", 3,
          f"{WORK_S:g} s jobs on a {LONG_LEASE_S:g} s lease: beats at most half a "
          "lease apart, never reaped, never run twice"),
    Check("frozen_worker_refused", 3,
          "a worker frozen past its lease stops on waking; its ack is refused; "
          "one effect"),
    Check("final_lease_check", 1,
          "the lease is checked once more after the work returns"),
]
CHECKS = CONTRACT_CHECKS + TRIAL_CHECKS
TRIAL_TIMEOUT_S = 240
PROBE_S = 30            # for the module's import, before any check


def _trial_outcomes(data: dict) -> list:
    by = {c.name: c for c in TRIAL_CHECKS}
    out = []

    s = data.get("stops", {"crashed": "the trial did not report"})
    c = by["stops_when_lease_lost"]
    if "crashed" in s:
        out.append(outcome(c, False, "the trial could not run: " + s["crashed"]))
    elif s["error"]:
        out.append(outcome(c, False, f"run_with_heartbeat raised {s['error']}"))
    elif s["held"] is not False or s["stopped_after"] is None:
        out.append(outcome(
            c, False, "extend answered False on the 3rd heartbeat, but the work was "
            "not told to stop or the function did not return False. When extend "
            "returns False, set the `stop` event the work watches, and return False "
            "so the caller abandons the job (no commit, no ack).",
            "stop set, returns False after ~3 heartbeats",
            f"returned {s['held']!r} after {s['elapsed']:.2f} s; stop "
            f"{'set' if s['stopped_after'] is not None else 'never set'}"))
    elif s["elapsed"] > 6 * LEASE_S:
        out.append(outcome(c, False, "it stopped, but too late: heartbeat every "
                           "lease_s / 3 and stop at the first refused extend.",
                           f"about {LEASE_S:g} s", f"{s['elapsed']:.2f} s"))
    elif s["threads_left"] > 0:
        out.append(outcome(c, False, "a heartbeat thread was still running after "
                           "run_with_heartbeat returned: end it (an Event it waits "
                           "on) and join it before returning.", "0 threads left",
                           f"{s['threads_left']} left"))
    else:
        out.append(outcome(c, True))

    lj = data.get("long_jobs", {"crashed": "the trial did not report"})
    c = by["long_jobs_run_once"]
    beats = _cadence_outcome(c, data.get("cadence", {"crashed": "no report"}))
    if beats is not None:
        out.append(beats)
    elif "crashed" in lj:
        out.append(outcome(c, False, "the trial could not run: " + lj["crashed"]))
    elif "excused" in lj:
        out.append(outcome(c, True, got=f"not judged: in the last run {lj['excused']} "
                           f"({lj.get('rerun', '')})"))
    else:
        twice = sorted({j for j, a in lj["claims"] if a > 1})
        effects = {j: len(v) for j, v in lj["effects"].items()}
        bad_acks = [j for j, ok in lj["acks"] if not ok]
        ok = (not twice and lj["requeued"] == 0 and not bad_acks
              and effects == {f"long-{i}": 1 for i in range(lj["jobs"])})
        if ok:
            out.append(outcome(c, True))
        else:
            witnesses = [f"{j}: claimed with attempts "
                         f"{[a for jj, a in lj['claims'] if jj == j]}" for j in twice]
            out.append(outcome(
                c, False, "with a heartbeat every lease_s / 3 a lease of "
                f"{LONG_LEASE_S:g} s must survive {WORK_S:g} s of work: "
                + ("; ".join(lj["errors"][:2]) + "; " if lj["errors"] else "")
                + "check that extend pushes the deadline to the server's now + "
                "lease_s and that the heartbeat thread starts before the work.",
                f"{lj['jobs']} jobs claimed once each, reaped 0, one effect each, "
                "every ack True",
                f"claimed twice: {twice or 'none'}, reaped {lj['requeued']}, "
                f"effects {effects}, refused acks {bad_acks or 'none'}",
                witnesses + [x for x in [own_load(lj)] if x]))

    fz = data.get("frozen", {"crashed": "the trial did not report"})
    c = by["frozen_worker_refused"]
    if "crashed" in fz:
        out.append(outcome(c, False, "the trial could not run: " + fz["crashed"]))
    else:
        first = {e["ev"]: e for e in fz["first"]}
        n_effects = len(fz["effects"].get("frozen-job", []))
        stale_ack = first.get("ack", {}).get("ok")
        held = first.get("result", {}).get("held")
        def history(events):
            t0 = fz["frozen_at"]
            return " -> ".join(
                f"{e['ev']}(attempt {e['attempt']}"
                + (f", held={e['held']}" if "held" in e else "")
                + (f", ok={e['ok']}" if "ok" in e else "") + f") @{e['t'] - t0:+.2f}s"
                for e in events if "attempt" in e)

        witness = (f"frozen worker (SIGSTOP @+0.00s, SIGCONT "
                   f"@{fz['resumed_at'] - fz['frozen_at']:+.2f}s): "
                   f"{history(fz['first'])}\nsecond worker: {history(fz['second'])}")
        if n_effects == 1 and held is False and stale_ack is False:
            out.append(outcome(c, True))
        else:
            out.append(outcome(
                c, False, "the worker frozen past its lease must find out on waking "
                "that the lease is gone (extend returns False) and give up: "
                "run_with_heartbeat returns False, the work stops, no commit. "
                "Check the lease once more after the work returns, before the "
                "caller commits.",
                "frozen worker: held=False, ack refused; the job's effect once",
                f"held={held}, ack ok={stale_ack}, effects={n_effects}",
                [witness] + ([fz["rerun"]] if fz.get("rerun") else [])
                + fz.get("errors", [])[:1]))

    fc = data.get("final_check", {"crashed": "the trial did not report"})
    c = by["final_lease_check"]
    if "crashed" in fc:
        out.append(outcome(c, False, "the trial could not run: " + fc["crashed"]))
    elif fc["error"]:
        out.append(outcome(c, False, f"run_with_heartbeat raised {fc['error']}"))
    elif fc["held"] is not False:
        out.append(outcome(
            c, False, "the lease was lost just as the work finished (as for a "
            "worker frozen after its last heartbeat), and run_with_heartbeat "
            "still said the job was yours. After `work` returns, call "
            "queue.extend once more and return False if it says no: return True "
            "only if the work finished and the lease is still yours.",
            "returns False (the last extend, after the work, said no)",
            f"returned {fc['held']!r} (run {fc.get('run', 1)} of "
            f"{fc.get('runs', 1)}); extend called {fc['extends_during']} "
            f"time(s) while the work ran and {fc['extends_after']} after"))
    else:
        out.append(outcome(c, True))
    return out


def trial_url(url: str) -> str:
    """The trial's database, never the contract checks' one: database 1 beside
    a grade on database 0; eight further on beside a corpus worker's (each
    corpus worker grades on a database of its own, 1 to 3)."""
    parts = urlsplit(url)
    query = dict(parse_qsl(parts.query))
    base = url.split("?", 1)[0]
    if parts.scheme != "unix":            # redis://host:port/DB
        query.setdefault("db", parts.path.strip("/") or "0")
        base = f"{parts.scheme}://{parts.netloc}"
    db = int(query.get("db", 0))
    query["db"] = str(db + 8 if db else 1)
    return f"{base}?{urlencode(query)}"


def _cadence_outcome(c: Check, cd: dict):
    """The learner's own beats judged (None when they keep the cadence)."""
    if "crashed" in cd:
        return outcome(c, False, "the cadence trial could not run: " + cd["crashed"])
    if cd["error"]:
        return outcome(c, False, f"run_with_heartbeat raised {cd['error']}")
    problem = cadence_problem(cd)
    if not problem:
        return None
    lease = cd["lease"]
    seen = ", ".join(f"{g:.2f}" + (f" ({own:.2f} less CPU waits)" if own < g - 0.005
                                   else "") for g, own in cd["gaps"])
    return outcome(
        c, False, f"your run_with_heartbeat's own beats on a {lease:g} s lease: "
        f"{problem}. Beat every lease_s / 3: then two beats can be lost (or come "
        "late) before the lease runs out, and a reaper never takes a live job.",
        f"extend called at most {lease / 2:.2f} s apart ({lease / 3:.2f} s: "
        "lease_s / 3), from the start of the work to its end",
        f"{problem}; gaps from the call to each extend (s): {seen or 'none'}; then "
        f"{cd['tail'][0]:.2f} to the work's end, {cd['after_return']} after the "
        "return "
        f"({cd['beats']} extend call(s) in {cd['work']:g} s; run {cd['run']} of "
        f"{cd['runs']}, the time a thread waited for a CPU is not counted)")


def evaluate_file(path: str, redis_url: str, quick: bool,
                  shown_path: str = MODULE_FILE, trial: bool = True,
                  contract: bool = True) -> Evaluation:
    """`trial=False`: the contract checks alone, without the worker trial;
    `contract=False`: the trial alone (the corpus's second step, after the
    contract checks passed)."""
    if not Path(path).exists():
        return Evaluation(not_run(CHECKS, f"no {shown_path} was written: run the "
                                          f"`%%writefile {shown_path}` cell"))
    names = [c.name for c in CONTRACT_CHECKS] if contract else []
    unloadable = threading.Event()      # the contract harness's probe failed
    with ThreadPoolExecutor(max_workers=1) as pool:   # the trial uses database 1
        running = trial and pool.submit(
            sandbox.run, [sys.executable, "-m", "autograder.judges.heartbeat_trial",
                          path, trial_url(redis_url), "--json"],
            timeout=TRIAL_TIMEOUT_S,
            env=queue_runs.learner_env(path, redis_url, IMPORTS), stop=unloadable)
        try:    # the harness probes the module first: no sandbox of its own
            results, left, _ = (queue_runs.contract_then_cost(
                path, redis_url, names, timeout=300, imports=IMPORTS,
                probe_s=PROBE_S) if names else ({}, [], {}))
        except queue_runs.NotLoadable as err:
            unloadable.set()
            msg = str(err).replace(path, shown_path)
            return Evaluation(not_run(CHECKS, msg), [msg])
        fin = running and running.result()
    outcomes = []
    for c in (c for c in CONTRACT_CHECKS if c.name in names):
        res = results.get(c.name)
        if res is None:
            outcomes.append(outcome(c, False, "this check did not report (stopped)"))
        else:
            outcomes.append(outcome(c, res["ok"], res.get("hint") or c.title,
                                    res.get("expected", ""), res.get("got", "")))
    if not fin:
        return Evaluation(outcomes, [f"left behind (killed): {x}" for x in left[:3]])
    try:
        data = json.loads(fin.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        why = (f"did not finish in {TRIAL_TIMEOUT_S} s" if fin.timed_out
               else f"ended without a report: {fin.tail(300)}")
        data = {k: {"crashed": f"the heartbeat trial {why}"}
                for k in ("stops", "final_check", "long_jobs", "frozen")}
    problems = [f"left behind (killed): {x}" for x in (left + fin.leftovers)[:3]]
    return Evaluation(outcomes + _trial_outcomes(data), problems)


# --- the grader side and the notebook side --------------------------------

NOTEBOOK_TIMEOUT_S = 120
CELLS = ModuleFile("heartbeats", MODULE_FILE, evaluate_file)
evaluate, check, check_all = CELLS.evaluate, CELLS.check, CELLS.check_all
