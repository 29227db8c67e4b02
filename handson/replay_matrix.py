"""The replay matrix, run: seven ways a message can arrive, each one made to happen.

Every delivery is a real worker process (`handson.confirmation_job`) against a
real database and a mail provider with its own store. Cases 5 and 6 stop the
worker at a named point and kill it with SIGKILL; case 3 releases two workers
through one pipe at the same instant. Time is injected: "after the lease" is a
`--now` eleven minutes later, not eleven minutes of waiting.

Each case starts from empty tables and an empty mailbox, and the table is
rendered from what the run observed: the provider's count, the rows left in
`handled_operations`, and what each worker said it did.

    python -m handson.replay_matrix                 # the matrix, policy "hold"
    python -m handson.replay_matrix --policies      # cases 5 and 6 per policy
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
from dataclasses import dataclass, field

from handson import claims_trips, confirmation_job
from handson.confirmation_job import JOB_TYPE, LEASE_S, POLICIES
from handson.effects import claims
from handson.effects.mailer import open_mailer
from handson.effects.sqldb import Database, default_target
from handson.infra.worker_process import Worker, WorkerError, open_gate, run_or_kill

KEY, OTHER_KEY = "ORD-1001", "ORD-1002"
T0 = 1_000_000.0                  # the injected clock's first reading
INSIDE_LEASE = T0 + 60.0          # a redelivery one minute later
AFTER_LEASE = T0 + LEASE_S + 60   # a redelivery eleven minutes later
RACE_WORK_S = 0.3                 # the racing workers' job takes this long

LABELS = {
    1: "first delivery",
    2: "same message again after success",
    3: "same message to two workers at once",
    4: "different order ORD-1002, similar data",
    5: "worker dies after the claim, before the email",
    6: "worker dies after the email, before completed",
    7: "redelivery of case 5 or 6 inside the lease",
}
PROVIDER_FOR = {"hold": "plain", "duplicate": "plain", "miss": "plain",
                "lookup": "reference"}


@dataclass
class Case:
    """What one case did and left behind."""

    number: int
    outcomes: list[str] = field(default_factory=list)
    emails: int = 0
    emails_before_redelivery: int | None = None
    records: list[claims.Record] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    last_now: float = T0
    ledger: int = 0                     # the points job: rows in its ledger
    points_records: list[claims.Record] = field(default_factory=list)


class Lab:
    """A database target, a provider and a scratch folder for mailboxes."""

    def __init__(self, target: str, workdir: str, policy: str = "hold",
                 provider: str | None = None, timeout_s: float = 30.0,
                 job: str | None = None):
        if policy not in POLICIES:
            raise ValueError(f"unknown policy {policy!r}; choose from "
                             f"{', '.join(POLICIES)}")
        self.target, self.workdir, self.policy = target, workdir, policy
        self.provider = provider or PROVIDER_FOR[policy]
        self.timeout_s = timeout_s
        self.job = job          # a learner's module file; None: the reference

    def fresh(self) -> None:
        """Empty tables and a new, empty mailbox for the next case."""
        with Database(self.target) as db:
            confirmation_job.setup(db, fresh=True)
        fd, self.mailbox = tempfile.mkstemp(prefix="mailbox-", suffix=".sqlite",
                                            dir=self.workdir)
        os.close(fd)

    def _args(self, key: str, now: float, task: str = "confirmation") -> list[str]:
        args = ["--db", self.target, "--mailbox", self.mailbox, "--provider",
                self.provider, "--key", key, "--now", repr(now), "--policy",
                self.policy, "--lease", repr(LEASE_S), "--task", task,
                "--limit-s", repr(self.timeout_s)]
        return args + (["--job", self.job] if self.job else [])

    def deliver(self, key: str, now: float, kill_at: str | None = None,
                task: str = "confirmation") -> str:
        """One delivery in its own process; killed with SIGKILL at `kill_at`."""
        args = self._args(key, now, task)
        if kill_at:
            args += ["--pause-at", kill_at]
        result = run_or_kill("handson.confirmation_job", args, kill_at,
                             self.timeout_s)
        if result is None:
            return f"killed@{kill_at}"
        if "error" in result:
            raise WorkerError(result["error"])
        return result["outcome"]

    def deliver_together(self, key: str, now: float, n: int = 2) -> list[str]:
        """n deliveries of the same message, released through one pipe at once."""
        read_fd, write_fd = os.pipe()
        workers = []
        try:
            for _ in range(n):
                args = self._args(key, now) + ["--gate-fd", str(read_fd),
                                               "--work-s", repr(RACE_WORK_S)]
                workers.append(Worker("handson.confirmation_job", args,
                                      pass_fds=(read_fd,)))
            for w in workers:
                w.expect("ready", self.timeout_s)
            open_gate(write_fd, n)
            results = [w.result(self.timeout_s) for w in workers]
            errors = [r["error"] for r in results if "error" in r]
            if errors:
                raise WorkerError(errors[0])
            return sorted(r["outcome"] for r in results)
        finally:
            os.close(read_fd)
            os.close(write_fd)
            for w in workers:
                w.close()

    def observe(self, case: Case) -> Case:
        mailer = open_mailer(self.provider, self.mailbox)
        case.emails = mailer.count()
        mailer.close()
        with Database(self.target) as db:
            case.records = claims.records(db, JOB_TYPE)
            case.held = claims.held(db, JOB_TYPE)
            case.ledger = confirmation_job.ledger(db, KEY)
            case.points_records = claims.records(db, confirmation_job.POINTS_JOB)
        return case

    def emails(self) -> int:
        mailer = open_mailer(self.provider, self.mailbox)
        try:
            return mailer.count()
        finally:
            mailer.close()

    # --- the seven cases --------------------------------------------------------

    def case(self, number: int, crash: str = "after-email") -> Case:
        """Run case `number` from empty state. `crash` picks case 7's variant."""
        self.fresh()
        c = Case(number)
        run = c.outcomes
        if number == 1:
            run.append(self.deliver(KEY, T0))
        elif number == 2:
            run.append(self.deliver(KEY, T0))
            run.append(self.deliver(KEY, INSIDE_LEASE))
            c.last_now = INSIDE_LEASE
        elif number == 3:
            run.extend(self.deliver_together(KEY, T0))
        elif number == 4:
            run.append(self.deliver(KEY, T0))
            run.append(self.deliver(OTHER_KEY, T0 + 1))
        elif number in (5, 6):
            run.append(self.deliver(KEY, T0, kill_at=CRASH_POINT[number]))
            run.append(self.deliver(KEY, AFTER_LEASE))
            c.last_now = AFTER_LEASE
        elif number == 7:
            run.append(self.deliver(KEY, T0, kill_at=crash))
            c.emails_before_redelivery = self.emails()
            run.append(self.deliver(KEY, INSIDE_LEASE))
            c.last_now = INSIDE_LEASE
        else:
            raise ValueError(f"the matrix has cases 1 to 7, not {number}")
        return self.observe(c)

    def points_case(self, crash: str) -> Case:
        """The same-database job killed at `crash`, then redelivered inside the
        lease and again after it: one ledger row, one completed record."""
        self.fresh()
        c = Case(8)
        c.outcomes.append(self.deliver(KEY, T0, kill_at=crash, task="points"))
        c.outcomes.append(self.deliver(KEY, INSIDE_LEASE, task="points"))
        c.outcomes.append(self.deliver(KEY, AFTER_LEASE, task="points"))
        c.last_now = AFTER_LEASE
        return self.observe(c)


CRASH_POINT = {5: "after-claim", 6: "after-email"}

# The specification's numbers for cases 5 and 6 (emails after the redelivery
# that comes past the lease), and the status each policy leaves behind.
POLICY_EMAILS = {"hold": (0, 1), "duplicate": (1, 2), "miss": (0, 1),
                 "lookup": (1, 1)}
POLICY_STATUS = {"hold": "claimed", "duplicate": "completed", "miss": "completed",
                 "lookup": "completed"}


def observe_all(lab: Lab) -> dict:
    """Every case as plain data (for a grader): what it left, or the error."""
    runs = {str(n): (lambda n=n: lab.case(n)) for n in range(1, 7)}
    runs.update({f"7:{p}": (lambda p=p: lab.case(7, crash=p))
                 for p in CRASH_POINT.values()})
    runs.update({f"points:{p}": (lambda p=p: lab.points_case(p))
                 for p in ("after-claim", "after-effect")})
    out = {}
    for name, run in runs.items():
        try:
            c = run()
        except (WorkerError, OSError) as err:
            out[name] = {"error": str(err)}
            continue
        out[name] = {
            "outcomes": c.outcomes, "emails": c.emails,
            "emails_before_redelivery": c.emails_before_redelivery,
            "records": [[r.operation_key, r.status, r.claimed_at] for r in c.records],
            "held": c.held, "ledger": c.ledger,
            "points_records": [[r.operation_key, r.status]
                               for r in c.points_records],
            "emails_cell": emails_cell(c), "record_cell": record_cell(c)}
    if lab.job:             # a host of ours, killed after each statement
        out["round_trips"] = claims_trips.killed_between_trips(
            lab.target, lab.job, KEY, (T0, INSIDE_LEASE, AFTER_LEASE))
        out.update(claims_trips.with_rivals(lab.target, lab.job, KEY, T0,
                                            lab.workdir, lab.provider))
    return out


# --- rendering: observations in the seed's words --------------------------------

def record_cell(case: Case) -> str:
    recs = case.records
    if not recs:
        return "none"
    if len(recs) == 2 and all(r.status == "completed" for r in recs):
        return "two, both completed"
    if len(recs) > 1:
        return ", ".join(r.status for r in recs)
    (rec,) = recs
    if rec.status == "claimed" and case.last_now - rec.claimed_at < LEASE_S:
        return "claimed (young)"
    return rec.status


def emails_cell(case: Case) -> str:
    if case.emails_before_redelivery is not None \
            and case.emails == case.emails_before_redelivery:
        return "same"
    return str(case.emails)


def expected_cell(case: Case) -> str:
    """What the workers reported, in the seed's phrasing where it has one."""
    killed = [o for o in case.outcomes if o.startswith("killed@")]
    live = [o for o in case.outcomes if not o.startswith("killed@")]
    skips = [o for o in live if o.startswith("skip:")]
    if not killed:
        if live == ["sent"]:
            return "sent once"
        if live == ["sent", "sent"] and len(case.records) == 2:
            return "both processed"
        if case.number == 3 and sorted(live) == ["sent", *skips] and len(skips) == 1:
            return "one claims, one skips"
        if live == ["sent", "skip:completed"]:
            return "skipped"
    elif live == ["held"] and case.held:
        return "held for a person after the lease"
    elif live == ["skip:in-progress"]:
        return "skipped; no second worker takes over"
    return " then ".join(case.outcomes)


def merge(cells: list[str]) -> str:
    return cells[0] if len(set(cells)) == 1 else " / ".join(cells)


HEADER = f"{'attempt':<49}emails  {'record afterwards':<21}expected"


def row(number: int, emails: str, record: str, expected: str) -> str:
    label = f"{number}  {LABELS[number]}"
    return f"{label:<49}{emails:>5}   {record:<21}{expected}"


def matrix_rows(lab: Lab) -> list[tuple[int, str, str, str]]:
    """(case, emails, record, expected) for all seven, case 7 in both variants."""
    rows = []
    for n in range(1, 7):
        c = lab.case(n)
        rows.append((n, emails_cell(c), record_cell(c), expected_cell(c)))
    variants = [lab.case(7, crash=point) for point in CRASH_POINT.values()]
    rows.append((7, merge([emails_cell(c) for c in variants]),
                 merge([record_cell(c) for c in variants]),
                 merge([expected_cell(c) for c in variants])))
    return rows


def render(rows) -> str:
    return "\n".join([HEADER, *(row(*r) for r in rows)])


def policy_emails(lab: Lab) -> tuple[int, int]:
    """Emails sent in cases 5 and 6 under the lab's policy, after the lease."""
    return lab.case(5).emails, lab.case(6).emails


def policy_table(target: str, workdir: str) -> list[tuple[str, int, int]]:
    return [(p, *policy_emails(Lab(target, workdir, p))) for p in POLICIES]


# What the chapter says each policy sends in case 5 (died before the email)
# and case 6 (died after it): hold keeps what happened, a duplicate resends, a
# miss never resends, and the lookup asks the provider.
POLICY_CLAIMS = {"hold": (0, 1), "duplicate": (1, 2), "miss": (0, 1),
                 "lookup": (1, 1)}


def check_policies(table: list[tuple[str, int, int]]) -> None:
    """The chapter's claims: each policy's emails in cases 5 and 6, and looking
    up by reference the only policy that sends one email in both."""
    emails = {p: (a, b) for p, a, b in table}
    if emails.get("lookup") != (1, 1):
        raise AssertionError(f"lookup must send exactly one email in cases 5 and "
                             f"6: {emails}")
    wrong = {p: (got, POLICY_CLAIMS[p]) for p, got in emails.items()
             if got != POLICY_CLAIMS.get(p, got)}
    if wrong:
        raise AssertionError(f"policies that sent other than the chapter says "
                             f"(got, said): {wrong}")


def render_policies(table) -> str:
    lines = [f"{'policy':<12}{'case 5':<8}case 6"]
    lines += [f"{p:<12}{a:<8}{b}" for p, a, b in table]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--policies", action="store_true",
                   help="emails in cases 5 and 6 under each stale-claim policy")
    p.add_argument("--db", help="SQLite file or PostgreSQL URL "
                   "(default: DATABASE_URL, else a temporary SQLite file)")
    p.add_argument("--job", help="a learner's job module (.py) to run instead")
    p.add_argument("--policy", default="hold", choices=tuple(POLICIES),
                   help="the stale-claim policy (a learner's module: its POLICY)")
    p.add_argument("--json", action="store_true",
                   help="every case as JSON, for the grader")
    a = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="eo-replay-") as tmp:
        target = a.db or default_target(os.path.join(tmp, "jobs.sqlite"))
        if a.json:
            lab = Lab(target, tmp, a.policy, job=a.job and os.path.abspath(a.job))
            print(json.dumps(observe_all(lab)))
        elif a.policies:
            print(render_policies(policy_table(target, tmp)))
        else:
            print(render(matrix_rows(Lab(target, tmp))))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
