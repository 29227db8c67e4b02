"""The replay matrix: seven deliveries that happen, and four stale-claim policies.

Each case runs real worker processes (killed with SIGKILL where the seed says a
worker dies) against SQLite and PostgreSQL, and its row must read exactly as
the seed's row does (tests/golden/replay/matrix.txt is the seed's table).
"""

import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from db_targets import db_target, postgres_url  # noqa: F401 - fixtures

from autograder.judges import idempotent_claims as claims_grader
from handson import confirmation_job, replay_matrix
from handson.confirmation_job import LEASE_S, PolicyUnavailable, send_confirmation
from handson.effects import claims
from handson.effects.mailer import PlainMailer, ReferenceMailer
from handson.effects.sqldb import Database

GOLDEN = Path(__file__).parent / "golden" / "replay"
SEED_TABLE = (GOLDEN / "matrix.txt").read_text().splitlines()


def seed_cells(number: int) -> list[str]:
    """The seed's row for case `number`, split into its four columns."""
    line = SEED_TABLE[number]
    label, emails, record, expected = re.split(r"\s{2,}", line)[1:]
    return [emails, record, expected]


def seed_policies() -> dict[str, tuple[int, int]]:
    lines = (GOLDEN / "policies.txt").read_text().splitlines()[1:]
    return {p: (int(a), int(b)) for p, a, b in (line.split() for line in lines)}


@pytest.fixture
def lab(db_target, tmp_path):  # noqa: F811 - the imported fixture
    return replay_matrix.Lab(db_target, str(tmp_path))


@pytest.mark.parametrize("number", range(1, 7))
def test_case_row_is_the_seeds(lab, number):
    case = lab.case(number)
    got = [replay_matrix.emails_cell(case), replay_matrix.record_cell(case),
           replay_matrix.expected_cell(case)]
    assert got == seed_cells(number), f"outcomes: {case.outcomes}"


@pytest.mark.parametrize("crash", ["after-claim", "after-email"])
def test_case_7_redelivery_inside_the_lease_skips(lab, crash):
    case = lab.case(7, crash=crash)
    assert case.outcomes == [f"killed@{crash}", "skip:in-progress"]
    got = [replay_matrix.emails_cell(case), replay_matrix.record_cell(case),
           replay_matrix.expected_cell(case)]
    assert got == seed_cells(7)


def test_killed_worker_left_evidence_in_the_provider(lab):
    """Case 6's worker died after sending: the provider has the email, the
    database only a claim, and SIGKILL (not an exit) is what ended it."""
    lab.fresh()
    assert lab.deliver("ORD-1001", replay_matrix.T0, kill_at="after-email") \
        == "killed@after-email"
    assert lab.emails() == 1
    with Database(lab.target) as db:
        rec = claims.record(db, confirmation_job.JOB_TYPE, "ORD-1001")
    assert rec.status == "claimed"


@pytest.mark.parametrize("policy", list(confirmation_job.POLICIES))
def test_policy_emails_in_cases_5_and_6_match_the_seed(db_target, tmp_path,  # noqa: F811
                                                       policy):
    lab = replay_matrix.Lab(db_target, str(tmp_path), policy)
    five, six = lab.case(5), lab.case(6)
    assert (five.emails, six.emails) == seed_policies()[policy]
    after = {"hold": "claimed", "duplicate": "completed", "miss": "completed",
             "lookup": "completed"}[policy]
    assert [r.status for r in five.records + six.records] == [after, after]
    assert bool(five.held and six.held) == (policy == "hold")


def test_two_workers_on_one_stale_claim_resend_once(db_target, tmp_path):  # noqa: F811
    """Accepting a duplicate means one extra email, not one per redelivery."""
    lab = replay_matrix.Lab(db_target, str(tmp_path), "duplicate")
    lab.fresh()
    lab.deliver("ORD-1001", replay_matrix.T0, kill_at="after-email")
    outcomes = lab.deliver_together("ORD-1001", replay_matrix.AFTER_LEASE)
    assert outcomes[0] == "resent" and outcomes[1].startswith("skip:"), outcomes
    assert lab.emails() == 2


def test_lookup_is_refused_for_the_provider_without_one(tmp_path):
    mailer = PlainMailer(str(tmp_path / "mail.sqlite"))
    with Database(str(tmp_path / "db.sqlite")) as db:
        claims.setup(db)
        with pytest.raises(PolicyUnavailable, match="cannot be asked"):
            send_confirmation(db, mailer, "ORD-1001", 0.0, policy="lookup")
    assert mailer.count() == 0


def test_the_lease_is_judged_by_the_injected_clock(tmp_path):
    mailer = ReferenceMailer(str(tmp_path / "mail.sqlite"))
    with Database(str(tmp_path / "db.sqlite")) as db:
        claims.setup(db)
        assert claims.claim(db, "send_confirmation", "ORD-1001", 100.0) is not None
        rec = claims.record(db, "send_confirmation", "ORD-1001")
        assert claims.judge(rec, 100.0 + LEASE_S - 1, LEASE_S) == "in-progress"
        assert claims.judge(rec, 100.0 + LEASE_S, LEASE_S) == "stale"
        assert send_confirmation(db, mailer, "ORD-1001", 100.0 + LEASE_S - 1,
                                 "lookup") == "skip:in-progress"
        assert send_confirmation(db, mailer, "ORD-1001", 100.0 + LEASE_S,
                                 "lookup") == "sent-after-lookup"
    assert mailer.count() == 1


def test_printed_table_is_the_seeds():
    """The command a learner runs prints the seed's table, character for character."""
    done = subprocess.run([sys.executable, "-m", "handson.replay_matrix",
                          ], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == SEED_TABLE


# --- the graded assignment: idempotent_claims ----------------------------------
# Its solution, stub and wrong submissions are graded by tests/test_autograder.py
# and tests/test_autograder_corpus.py; here: the grader accepts every policy.

WRAPPER = '''
from handson import confirmation_job as lab

POLICY = {policy!r}


def send_confirmation(db, mailer, key, now, lease_s, pause):
    return lab.send_confirmation(db, mailer, key, now, POLICY, lease_s, pause)


def award_points(db, key, now, lease_s, pause):
    return lab.award_points(db, key, now, lease_s, pause)
'''


@pytest.fixture(scope="module")
def graded_policies(tmp_path_factory):
    """Each policy graded once, two at a time: a run mostly waits on its leases."""
    def one(policy):
        path = tmp_path_factory.mktemp(policy) / "myclaims.py"
        path.write_text(WRAPPER.format(policy=policy))
        return policy, claims_grader.evaluate_file(str(path))

    with ThreadPoolExecutor(max_workers=2) as pool:
        return dict(pool.map(one, confirmation_job.POLICIES))


@pytest.mark.parametrize("policy", list(confirmation_job.POLICIES))
def test_the_labs_job_scores_full_marks_under_each_policy(graded_policies, policy):
    ev = graded_policies[policy]
    assert [o.name for o in ev.outcomes if not o.ok] == [], ev.problems


def test_policy_numbers_are_the_seeds():
    assert replay_matrix.POLICY_EMAILS == seed_policies()
