"""Assignment idempotent_claims: the learner's claim table and stale-claim policy.

The notebook's `%%writefile myclaims.py` cell writes a module with

    POLICY = "hold" | "duplicate" | "miss" | "lookup"     # chosen in advance
    send_confirmation(db, mailer, key, now, lease_s, pause) -> str
    award_points(db, key, now, lease_s, pause) -> str

It is graded by behaviour: `python -m handson.replay_matrix --job myclaims.py
--json` runs the replay matrix's seven cases with real worker processes on the
learner's code, kills them with SIGKILL at the named points, and reports what
the mail provider counted and what the tables hold. Then award_points is
killed after each of its SQL statements, named point or not
(`handson.claims_trips`), and delivered again; both jobs are stopped after
each of their statements while the same delivery runs to its end in another
worker; and one worker makes many deliveries on one connection, as a
long-running worker would (again after its own success, another order, again
after an attempt whose work raised), so state kept per connection shows.

The matrix and its workers are a trusted harness (`queue_runs.learner_env`):
they never import the learner's module. Each worker calls it in a host
process of its own, confined to the run's work dir (`handson.infra.remote_module`);
the host opens the effects database there itself, while the mail provider's
store lives in the harness's own folder, out of the host's sight, and every
`mailer.send`, `mailer.lookup` and `pause(point)` is performed by the worker
when the host calls back. So the counts and the pause announcements come
from processes that run no learner code. The host may read what the
learner's kernel may read (`sandbox.kernel_read_paths`): the notebook gives
`send_email` from `handson.confirmation_job`, and the database stand-in is the
course's `handson.effects.sqldb`.

The grader reads the module's POLICY in a separate confined probe; it never
imports the learner's code itself. The numbers a policy must produce in cases
5 and 6 are the lab's (`handson.replay_matrix.POLICY_EMAILS`), which the test
suite pins to the specification.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
from pathlib import Path

from autograder.isolation import sandbox
from autograder.judges import queue_runs
from autograder.judges.checks import (
    Check,
    Evaluation,
    ModuleFile,
    Outcome,
    missed_pause,
    not_run,
    outcome,
    round_trips,
)
from handson.replay_matrix import POLICY_EMAILS, POLICY_STATUS

NAME = "idempotent_claims"
MODULE_FILE = "myclaims.py"
CHECKS = [
    Check("first_delivery", 1, "case 1: the first delivery sends once, completed"),
    Check("repeat_after_success", 1, "case 2: the same message after success skips"),
    Check("two_workers_at_once", 2, "case 3: two processes at once, one email"),
    Check("different_order", 1, "case 4: ORD-1002 is its own key: two emails"),
    Check("dies_before_email", 2,
          "case 5: killed after the claim; after the lease, your policy's count"),
    Check("dies_after_email", 2,
          "case 6: killed after the email; after the lease, your policy's count"),
    Check("young_claim_skipped", 2,
          "case 7: a redelivery inside the lease sends nothing and takes nothing"),
    Check("same_transaction_effect", 2,
          "a database effect: claim, row and status in one transaction"),
    Check("killed_between_round_trips", 2,
          "the points job killed after every SQL statement, then redelivered: "
          "one ledger row, completed"),
    Check("points_interleaved", 1,
          "the points job stopped after each SQL statement while the same "
          "delivery runs in another worker: one ledger row"),
    Check("confirmation_interleaved", 1,
          "send_confirmation stopped after each SQL statement while the same "
          "delivery runs in another worker: one email"),
    Check("one_worker_many_deliveries", 2,
          "one worker, one connection, many deliveries (again after success, "
          "another order, again after a failed attempt): each effect once"),
]
# Checks that catch a bug when a schedule happens to expose it: the corpus
# names a check that catches the same bug on every schedule first.
RACES = ("two_workers_at_once",)
NOTEBOOK_TIMEOUT_S = 120
# A replay run takes about 15 s alone (each delivery a worker process that starts
# the learner's confined host); beside a loaded suite a correct one ran past 150.
RUN_TIMEOUT_S = 300
KEY = "ORD-1001"

PROBE = """
import json, sys
from handson.infra.learner_module import ModuleProblem, load
try:
    m = load(sys.argv[1], ("POLICY", "send_confirmation", "award_points"))
    print(json.dumps({"ok": True, "policy": str(m.POLICY)}))
except ModuleProblem as err:
    print(json.dumps({"ok": False, "error": str(err)}))
except BaseException as err:
    print(json.dumps({"ok": False, "error": f"importing {sys.argv[1]} raised "
                                            f"{type(err).__name__}: {err}"}))
"""


# --- observing (in the sandbox) -------------------------------------------------

def _last_json(text: str) -> dict | None:
    for line in reversed(text.strip().splitlines()):
        with contextlib.suppress(ValueError):
            data = json.loads(line)
            if isinstance(data, dict):
                return data
    return None


def probe(path: str, reads: tuple[str, ...] = ()) -> dict:
    """The module's POLICY, read in a confined process of its own (all the
    learner's code can change there is what it says its own POLICY is).
    `reads`: the course files it may read (`sandbox.kernel_read_paths()`)."""
    reads = reads or sandbox.kernel_read_paths()
    fin = sandbox.run([sys.executable, "-c", PROBE, path], timeout=30,
                      cwd=str(Path(path).parent), confined=True,
                      read_paths=(str(Path(path).resolve()), *reads))
    return _last_json(fin.stdout) or {
        "ok": False, "error": f"loading {path} did not finish: {fin.tail(300)}"}


def observe(path: str, policy: str, timeout: float = RUN_TIMEOUT_S,
            reads: tuple[str, ...] = ()) -> dict:
    """Every case of the matrix on the learner's module, as the lab reports it.

    The database sits in the learner's work dir (its host writes it); the
    mailboxes in the harness's own temporary folder, which no host can see.
    """
    workdir = Path(path).parent
    env = queue_runs.learner_env(path, None,
                                 queue_runs.kernel_imports(reads))
    with tempfile.TemporaryDirectory(prefix="eo-claims-") as tmp, \
            tempfile.TemporaryDirectory(prefix="eo-claims-db-", dir=workdir) as db:
        try:
            fin = sandbox.run([sys.executable, "-m", "handson.replay_matrix",
                               "--job", path, "--policy", policy, "--json",
                               "--db", str(Path(db) / "jobs.sqlite")],
                              timeout=timeout, cwd=tmp, env=env)
        finally:
            sandbox.cleanup(workdir)
    data = _last_json(fin.stdout)
    if data is None:
        why = (f"did not finish within {timeout:g} s" if fin.timed_out else
               f"ended with exit code {fin.returncode}: {fin.tail(400)}")
        return {"error": f"the replay run {why}"}
    return data


# --- judging (pure) -------------------------------------------------------------

def _case(obs: dict, name: str) -> tuple[dict | None, str]:
    data = obs.get(name)
    if data is None:
        return None, obs.get("error", f"case {name} did not report")
    if "error" in data:
        err = missed_pause(data["error"])
        if err != data["error"]:
            return None, f"case {name}: {err}"
        return None, f"case {name}: a worker failed: {err[-600:]}"
    return data, ""


def _statuses(data: dict) -> list[str]:
    return [status for _, status, _ in data["records"]]


def judge(obs: dict, policy: str) -> list[Outcome]:
    by = {c.name: c for c in CHECKS}
    out = []

    def simple(check: str, case: str, emails: int, record: str, what: str):
        data, err = _case(obs, case)
        if data is None:
            return outcome(by[check], False, err)
        got = f"{data['emails']} email(s), record {data['record_cell']}"
        want = f"{emails} email(s), record {record}"
        return outcome(by[check], data["emails"] == emails
                       and data["record_cell"] == record, what, want, got)

    out.append(simple("first_delivery", "1", 1, "completed",
                      "one delivery should claim, send once and mark completed"))
    out.append(simple("repeat_after_success", "2", 1, "completed",
                      "a completed record must stop the second delivery"))
    out.append(simple("two_workers_at_once", "3", 1, "completed",
                      "two processes released together: the unique key lets one "
                      "claim; the other must read a young claim and stop"))
    out.append(simple("different_order", "4", 2, "two, both completed",
                      "ORD-1002 is a different operation key and must be sent"))
    for check, case, i in (("dies_before_email", "5", 0),
                           ("dies_after_email", "6", 1)):
        data, err = _case(obs, case)
        if data is None:
            out.append(outcome(by[check], False, err))
            continue
        want_emails = POLICY_EMAILS[policy][i]
        want_status = POLICY_STATUS[policy]
        held = data["held"] == [KEY]
        ok = (data["emails"] == want_emails and _statuses(data) == [want_status]
              and held == (policy == "hold"))
        out.append(outcome(
            by[check], ok,
            f"with POLICY = {policy!r} the stale claim (redelivered past the "
            "lease) must end as the policy says"
            + (" and be parked in held_operations" if policy == "hold" else ""),
            f"{want_emails} email(s), status {want_status}, held: "
            f"{policy == 'hold'}",
            f"{data['emails']} email(s), status {_statuses(data)}, held: {held}"))
    cases = [_case(obs, f"7:{p}") for p in ("after-claim", "after-email")]
    errors = [err for data, err in cases if data is None]
    if errors:
        out.append(outcome(by["young_claim_skipped"], False, errors[0]))
    else:
        got = [f"{d['emails_cell']} / {d['record_cell']} / held {d['held']}"
               for d, _ in cases]
        ok = all(d["emails_cell"] == "same" and d["record_cell"] == "claimed (young)"
                 and not d["held"] for d, _ in cases)
        out.append(outcome(
            by["young_claim_skipped"], ok,
            "a claim younger than the lease may belong to a live worker: the "
            "redelivery must stop, not send, not hold, not take the claim over",
            "same emails / claimed (young) / held [] (after either crash)",
            " | ".join(got)))
    cases = [_case(obs, f"points:{p}") for p in ("after-claim", "after-effect")]
    errors = [err for data, err in cases if data is None]
    if errors:
        out.append(outcome(by["same_transaction_effect"], False, errors[0]))
    else:
        got = [f"{d['ledger']} ledger row(s), record {d['points_records']}"
               for d, _ in cases]
        ok = all(d["ledger"] == 1 and d["points_records"] == [[KEY, "completed"]]
                 for d, _ in cases)
        out.append(outcome(
            by["same_transaction_effect"], ok,
            "killed after the claim or after the ledger row, then redelivered "
            "inside and after the lease: put the claim, the row and the status "
            "change in ONE transaction (`with db.transaction():`) so a crash "
            "leaves nothing and the redelivery applies it once",
            "1 ledger row, record completed (after either crash)",
            " | ".join(got)))
    for name, check, want, done in (
            ("round_trips", "killed_between_round_trips",
             "1 ledger row, record completed (after any kill)",
             "kills between round trips"),
            ("interleaved", "points_interleaved",
             "1 ledger row, record completed (two deliveries at once)",
             "stops while another worker ran"),
            ("confirmation_interleaved", "confirmation_interleaved",
             "1 email, record completed (two deliveries at once)",
             "stops while another worker ran"),
            ("one_worker", "one_worker_many_deliveries",
             "each email and each ledger row once, after every delivery",
             "deliveries on one connection")):
        data = obs.get(name) or {"error": obs.get(
            "error", f"the {done} did not report")}
        err = data.get("error", "")
        out.append(round_trips(by[check], None if err else data, err, want, done))
    return out


def evaluate_file(path: str, redis_url: str | None = None, quick: bool = False,
                  shown_path: str = MODULE_FILE) -> Evaluation:
    """One replay run of each case; needs no Redis (the matrix has its own)."""
    if not Path(path).exists():
        return Evaluation(not_run(CHECKS, f"no {shown_path} was written: run the "
                                          f"`%%writefile {shown_path}` cell"))
    reads = sandbox.kernel_read_paths()
    found = probe(path, reads)
    if not found.get("ok"):
        why = found.get("error", "").replace(path, shown_path)
        if "NotImplementedError" in why:
            why += ("(a `raise NotImplementedError()` runs at import: write down "
                    "POLICY in its place)")
        return Evaluation(not_run(CHECKS, why), [why])
    policy = found["policy"]
    if policy not in POLICY_EMAILS:
        why = (f"POLICY is {policy!r}; write down one of "
               f"{', '.join(POLICY_EMAILS)}")
        return Evaluation(not_run(CHECKS, why), [why])
    obs = observe(os.path.abspath(path), policy, reads=reads)
    problems = [obs["error"]] if "error" in obs else []
    return Evaluation(judge(obs, policy), problems)


# --- the grader side and the notebook side --------------------------------

CELLS = ModuleFile(NAME, MODULE_FILE, evaluate_file, needs_redis=False)
evaluate, check, check_all = CELLS.evaluate, CELLS.check, CELLS.check_all
