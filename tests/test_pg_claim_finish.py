"""Assignment pg_claim_finish, graded for real: the solution notebook's module at
full marks (staged cases and the kill -9 chaos run, sandboxed, on the run's
PostgreSQL as the learner's role), and each wrong version losing the check that
names its bug while keeping the others (staged cases only: they are what
names it)."""

import json
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest

from autograder.isolation import pg_run, server
from autograder.judges import pg_claim_finish
from autograder.notebooks import notebook
from handson.infra import pg_server

pytestmark = pytest.mark.skipif(pg_server.find_binaries() is None,
                                reason="no PostgreSQL binaries (initdb, postgres)")
SOLUTION = notebook.REPO / "solutions" / "pg_claim_finish" / "pg_claim_finish.ipynb"
STAGED = pg_claim_finish.STAGED

CLAIM = ("ORDER BY queued_at, id LIMIT 1 FOR UPDATE SKIP LOCKED)")
ACK_IN_TX = """    c = conn()
    with c.transaction():
        acked = c.execute(
            "UPDATE pgq_jobs SET state = 'done', lease_until = NULL WHERE id = %s"
            " AND attempt = %s AND state = 'inflight' AND NOT failed",
            (job_id, attempt)).rowcount == 1
        if not acked:
            raise psycopg.Rollback
        apply_effect(c, job_id, attempt, doc_id, score)
        return True
    return False
"""
WRONG = {
    # the effect commits, then the course's ack, refused for a zombie
    "effect_then_ack": (
        [(ACK_IN_TX, "    c = conn()\n    with c.transaction():\n"
                     "        apply_effect(c, job_id, attempt, doc_id, score)\n"
                     "    return ack(r, job_id, attempt)\n")],
        "finish_refused_no_effect"),
}


# The effect, then the ack in a transaction of its own, with an `effects()` that
# tells the chaos engine every job was applied once: graded with the chaos run.
LYING = """

def effects(r=None):
    from handson.queues.pgq import conn
    jobs = [row[0] for row in conn().execute("SELECT id FROM pgq_jobs")]
    applied = [(j, 1, 0, i) for i, j in enumerate(jobs)]
    n = len(jobs)
    return applied, {"rows": n, "naive_rows": n, "naive_distinct": n, "counter": n}
"""


# The corpus's wrong and correct modules are graded by `python -m autograder
# corpus` (tests/test_corpus_command.py), each caught by the check that says
# which step and which rival showed its bug.
CORPUS_DIR = notebook.REPO / "tests" / "corpus" / "pg"


def module_of(path) -> str:
    """The source of the notebook's `%%writefile mypgq.py` cell."""
    nb = json.loads(path.read_text())
    cell = next(c for c in nb["cells"]
                if c["metadata"].get("nbgrader", {}).get("grade_id") == "mypgq")
    return "".join(cell["source"]).split("\n", 1)[1] + "\n"   # no %%writefile


def solution_module() -> str:
    return "\n".join(line for line in module_of(SOLUTION).splitlines()
                     if "### BEGIN SOLUTION" not in line
                     and "### END SOLUTION" not in line) + "\n"


def stub_module() -> str:
    """The released exercise's module, as `make exercises` wrote it."""
    return module_of(notebook.RELEASE_DIR / "pg_claim_finish" /
                     "pg_claim_finish.ipynb")


# A module that looks for the judge's way in: which role it runs as, which URLs
# its environment holds, and whether the superuser logs in without a password.
HOSTILE = '''
import os

import psycopg

from handson.queues.pgq import (  # noqa: F401
    ack, conn, dead, enqueue, extend, fail, reap, reset)


def claim(r, lease_s):
    user = conn().execute("SELECT current_user").fetchone()[0]
    urls = ",".join(sorted(k for k in os.environ if "URL" in k))
    sock = os.environ["DATABASE_URL"].split("host=")[1]
    try:
        psycopg.connect(f"postgresql://postgres@/postgres?host={sock}",
                        connect_timeout=5).close()
        su = "superuser logged in"
    except psycopg.OperationalError as err:
        su = "refused" if "password" in str(err) else str(err)[:200]
    return (f"{user}|{urls}|{su}|{sorted(os.environ.values())}", {}, 1)


def finish(r, job_id, attempt, doc_id, score):
    return False
'''


def _graded(url: str, cluster: str, folder, bug: str | None) -> tuple:
    """The solution (bug None) or the stub with the chaos run, or a wrong or
    hostile version (staged cases only), on a database and role of its own."""
    source = {"stub": stub_module(), "hostile": HOSTILE}.get(bug) or \
        solution_module()
    wrong = "effect_then_ack" if bug == "two_transactions_lying" else bug
    for old, new in WRONG[wrong][0] if wrong in WRONG else ():
        assert old in source, f"the solution changed: {old!r} is not in it"
        source = source.replace(old, new)
    if bug == "two_transactions_lying":
        source += LYING
    db = pg_run.create(cluster)
    obs = pg_claim_finish.observe(_write(folder / (bug or "solution"), source),
                                  url, db,
                                  chaos=bug in (None, "stub", "two_transactions_lying"))
    return pg_claim_finish.judge(obs), obs, db


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Every version graded side by side on one Redis and one cluster: most of
    a run is waiting (on a lease, a blocked claim, a killed worker's lease)."""
    folder = tmp_path_factory.mktemp("pg_claim_finish")
    redis = server.start()
    try:
        with pg_server.throwaway_postgres() as cluster, \
                ThreadPoolExecutor(8) as pool:
            runs = {bug: pool.submit(_graded, redis.url, cluster, folder, bug)
                    for bug in (None, "two_transactions_lying", "stub", "hostile",
                                *WRONG)}
            yield {bug: f.result() for bug, f in runs.items()}
    finally:
        redis.stop()


def _write(folder, source: str) -> str:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "mypgq.py"
    path.write_text(source)
    return str(path)


def test_the_solution_earns_every_point_under_kill_9(graded):
    out, obs, _ = graded[None]
    assert [o.name for o in out] == [c.name for c in pg_claim_finish.CHECKS]
    failed = [f"{o.name}: {o.message} (got {o.got})" for o in out if not o.ok]
    assert not failed, failed
    stats = obs["chaos"]["stats"]
    assert stats["kills"] >= 4 and stats["lost"] == 0
    assert stats["faults"]["crash_kills"]["after-commit"] >= 3
    assert stats["faults"]["crash_kills"].get("mid-finish", 0) >= 1
    assert stats["rows"] == stats["distinct"] == stats["counter"]


def test_a_finish_in_two_transactions_loses_the_chaos_point_whatever_it_says(graded):
    """Killed between its effect's COMMIT and its ack, the job runs again: its
    effect twice, counted from the score table, not from its own effects()."""
    out, obs, _ = graded["two_transactions_lying"]
    verdict = {o.name: o for o in out}
    assert not verdict["chaos_effect_once"].ok, verdict["chaos_effect_once"].message
    assert "applied_twice" in verdict["chaos_effect_once"].message
    assert obs["chaos"]["stats"]["faults"]["crash_kills"].get("mid-finish", 0) >= 1


@pytest.mark.parametrize("bug", list(WRONG))
def test_a_wrong_version_loses_the_check_that_names_its_bug(graded, bug):
    out, _, _ = graded[bug]
    loses, *also = WRONG[bug][1:]
    verdict = {o.name: o.ok for o in out}
    assert verdict == {name: name not in (loses, *also) for name in STAGED}, \
        [(o.name, o.message, o.got) for o in out]
    lost = next(o for o in out if o.name == loses)
    assert "ONE transaction" in lost.message, lost.message


def test_the_corpus_correct_module_is_the_solution_s():
    """tests/corpus/pg/correct.py is what the solution notebook writes."""
    import ast

    def functions(source: str) -> dict:
        return {n.name: ast.dump(n) for n in ast.parse(source).body
                if isinstance(n, ast.FunctionDef)}

    assert functions((CORPUS_DIR / "correct.py").read_text()) == \
        functions(solution_module())
    assert {"claim", "finish"} <= functions(solution_module()).keys()


def test_the_stub_scores_zero_without_a_chaos_run(graded):
    out, obs, _ = graded["stub"]
    assert not any(o.ok for o in out)
    assert "chaos" not in obs and "NotImplementedError" in obs["chaos_skipped"]
    assert all("NotImplementedError" in o.message for o in out)


def test_learner_code_runs_as_its_role_and_never_sees_the_judge_s_url(graded):
    """The hostile module's claim reports what it found from inside its host."""
    _, obs, db = graded["hostile"]
    found = obs["claim_oldest_with_lease"]["claims"][0][0]
    user, urls, superuser, values = found.split("|", 3)
    assert user == db.role
    assert urls == "DATABASE_URL,PGQ_URL,REDIS_URL"
    assert superuser == "refused"
    admin_password = urlsplit(db.admin_url).password
    assert admin_password not in values and db.learner_url in values


def test_the_course_s_own_claim_and_finish_earn_nothing(tmp_path):
    """Importing them instead of writing them: refused before anything runs."""
    from autograder.judges import own_work

    head = solution_module().split("\ndef claim")[0]
    path = _write(tmp_path / "bad",
                  head + "from handson.queues.pgq import claim, finish\n")
    review = own_work.review(path, own_work.POLICIES["pg_claim_finish"], "mypgq.py")
    assert review.everything and "claim, finish" in review.everything[0]
    assert set(review.functions) == {"claim", "finish"}
    assert not own_work.review(_write(tmp_path / "ok", solution_module()),
                               own_work.POLICIES["pg_claim_finish"],
                               "mypgq.py").everything


def test_without_postgresql_every_check_says_why_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(pg_server, "find_binaries", lambda: None)
    ev = pg_claim_finish.evaluate_file(_write(tmp_path, solution_module()),
                                       "unix:///nowhere")
    assert not any(o.ok for o in ev.outcomes)
    assert ev.problems == [ev.outcomes[0].message]
    assert "no PostgreSQL to grade on" in ev.problems[0]
    assert "\n" not in ev.problems[0]


@pytest.mark.parametrize("name, says", [
    ("lease_from_worker_clock", "the reap left j1 in flight"),
    ("claim_keeps_advisory_lock", "a session advisory lock")])
def test_a_rival_that_gets_nothing_is_told_whether_the_lease_still_ran(name, says):
    """After its 0.3 s lease and a reap, j1 is claimed by a rival host: a lease
    written from the worker's clock (an hour ahead) still runs, and the hint
    says so; it blamed the connection's session state, as it still does when
    j1 is pending and only the connection holds it (a review's finding)."""
    redis = server.start()
    try:
        ev = pg_claim_finish.evaluate_file(str(CORPUS_DIR / f"{name}.py"), redis.url,
                                           chaos=False)
    finally:
        redis.stop()
    refused = next(o for o in ev.outcomes if o.name == "finish_refused_no_effect")
    assert not refused.ok and says in refused.message, refused.message
