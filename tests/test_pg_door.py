"""The PostgreSQL door, attacked for real through `grade-class`.

A class of four pg_claim_finish notebooks is graded by `python -m autograder
grade-class` with a temporary directory of its own: the solution, and three
attacks a learner could write into the `%%writefile mypgq.py` cell:

- a view over a function of its own in place of the queue table, which tries
  `ALTER ROLE ... SUPERUSER` and `COPY ... TO PROGRAM` (read the solutions,
  leave a process running) whenever it is read: the hole a judge reading the
  learner's table as the superuser left open;
- a claim that fills the cluster's disk past its budget;
- a claim whose statement holds more memory than the cluster's cap.

Each earns nothing it did not write and gets one line naming what it used, no
program of its own runs on the server's side, nothing is left running or in
the temporary directory, and the classmate keeps full marks with the server's
protections reported.
"""

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import nbformat
import psutil
import pytest
from test_autograder import ENV
from test_pg_claim_finish import solution_module

from autograder.isolation import confine
from autograder.notebooks import notebook
from handson.infra import pg_server

pytestmark = [pytest.mark.skipif(pg_server.find_binaries() is None,
                                 reason="no PostgreSQL binaries"),
              pytest.mark.timeout(900)]

MARKER = f"eo-pg-door-{os.getpid()}"


def _view_attack(loot: Path) -> str:
    """The solution's queue, behind an updatable view whose condition is a
    function that tries to become the superuser and run a program."""
    program = (f"cat {notebook.SOURCE_DIR}/*/*.ipynb > {loot}; "
               f"setsid sh -c 'exec -a {MARKER} sleep 300' &")
    hidden = program.encode().hex()       # no course path in the source
    return solution_module() + f'''

_reset = reset


def reset(r=None):
    conn().execute("DROP VIEW IF EXISTS pgq_jobs; DROP TABLE IF EXISTS "
                   "pgq_jobs_real; DROP FUNCTION IF EXISTS pwn()")
    _reset(r)
    program = bytes.fromhex("{hidden}").decode().replace("'", "''")
    c = conn()
    c.execute("ALTER TABLE pgq_jobs RENAME TO pgq_jobs_real")
    c.execute("""CREATE FUNCTION pwn() RETURNS boolean LANGUAGE plpgsql AS $f$
    BEGIN
      BEGIN
        EXECUTE format('ALTER ROLE %I SUPERUSER', session_user);
      EXCEPTION WHEN others THEN NULL;
      END;
      BEGIN
        COPY (SELECT 1) TO PROGRAM '\"\"\" + program + \"\"\"';
      EXCEPTION WHEN others THEN NULL;
      END;
      RETURN true;
    END $f$""")
    c.execute("CREATE VIEW pgq_jobs AS SELECT * FROM pgq_jobs_real WHERE pwn()")
'''


FILL = '''

_claim = claim


def claim(r, lease_s):
    c = conn()
    c.execute("CREATE TABLE IF NOT EXISTS big (v text)")
    for _ in range(40):     # 40 x 25 MB of rows, each batch a short statement
        c.execute("INSERT INTO big SELECT repeat(md5(g::text), 32) "
                  "FROM generate_series(1, 25000) g")
    return _claim(r, lease_s)
'''

HOG = '''

_claim = claim


def claim(r, lease_s):
    conn().execute("""DO $h$ DECLARE a text; b text; c text;
        BEGIN a := repeat('x', 400000000); b := a || 'y'; c := b || 'z';
        PERFORM length(a) + length(b) + length(c); END $h$""")
    return _claim(r, lease_s)
'''


def _notebook(module: str, dest: Path) -> Path:
    nb = nbformat.read(str(notebook.source_notebook("pg_claim_finish")), 4)
    cell = next(c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == "mypgq")
    cell.source = "%%writefile mypgq.py\n" + module
    dest.parent.mkdir(parents=True)
    nbformat.write(nb, str(dest))
    return dest


def _server_processes(tmp: Path) -> list[str]:
    """Processes of a run's server still alive: its own uid, or our temp dir."""
    found = []
    for p in psutil.process_iter(["pid", "uids", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or ())
        uid = p.info["uids"].real if p.info["uids"] else 0
        if MARKER in cmd or str(tmp) in cmd or (
                uid >= confine.IDENTITY_BASE and str(tmp) in cmd):
            found.append(f"{p.info['pid']}: {cmd[:120]}")
    return found


@pytest.fixture(scope="module")
def pg_class(tmp_path_factory):
    course = tmp_path_factory.mktemp("pgcourse")
    tmp = tmp_path_factory.mktemp("pgtmp")
    loot = tmp_path_factory.mktemp("loot") / "solutions.txt"
    loot.parent.chmod(0o777)        # a program run as any user could write here
    subs = course / "submitted"
    modules = {"classmate": solution_module(), "viewer": _view_attack(loot),
               "filler": solution_module() + FILL, "hog": solution_module() + HOG}
    for student, module in modules.items():
        _notebook(module, subs / student / "pg_claim_finish" /
                  "pg_claim_finish.ipynb")
    env = dict(ENV, TMPDIR=str(tmp))
    done = subprocess.run([sys.executable, "-m", "autograder", "grade-class",
                           str(subs), "--workers", "2"], cwd=notebook.REPO,
                          capture_output=True, text=True, timeout=800, env=env)
    con = sqlite3.connect(course / "grade-class.db")
    try:
        results = {student: json.loads(result) for student, result in
                   con.execute("select student, result from grades")}
    finally:
        con.close()
    return results, done, tmp, loot


def test_the_classmate_keeps_full_marks_and_sees_the_server_s_protections(pg_class):
    results, done, *_ = pg_class
    assert set(results) == {"classmate", "viewer", "filler", "hog"}, \
        done.stdout[-2000:] + done.stderr[-2000:]
    mate = results["classmate"]
    assert mate["score"] == mate["max_score"], mate["checks"]
    held = mate["servers"]["PostgreSQL"]
    assert held.startswith("full") and "of its own" in held, held


def test_a_view_over_its_own_function_earns_nothing_and_runs_nothing(pg_class):
    results, _, tmp, loot = pg_class
    viewer = results["viewer"]
    assert viewer["score"] == 0, [c["name"] for c in viewer["checks"] if c["ok"]]
    assert any("pgq_jobs is not the plain table" in c["message"]
               and "a view" in c["message"] for c in viewer["checks"])
    assert not loot.exists(), "a program of the learner's ran on the server's side"
    assert not _server_processes(tmp)


def test_passing_the_disk_budget_is_one_line_and_the_grade_completes(pg_class):
    results, _, tmp, _ = pg_class
    filler = results["filler"]
    told = [p for p in filler["problems"] if "disk budget" in p]
    assert len(told) == 1 and "MB" in told[0] and "\n" not in told[0], \
        filler["problems"]
    assert len(filler["checks"]) == 6 and filler["score"] < filler["max_score"]


def test_passing_the_memory_cap_is_one_line(pg_class):
    results, *_ = pg_class
    hog = results["hog"]
    told = [p for p in hog["problems"] if "memory cap" in p]
    assert len(told) == 1 and "peak" in told[0], hog["problems"]
    assert hog["score"] < hog["max_score"]


def test_nothing_is_left_running_or_in_the_temporary_directory(pg_class):
    _, done, tmp, _ = pg_class
    assert not _server_processes(tmp)
    mount_point = tmp / f"eo-view-{os.geteuid()}"   # every launcher's, kept empty
    left = sorted(p.name for p in tmp.iterdir() if p != mount_point)
    assert not left, left
    assert not mount_point.exists() or not any(mount_point.iterdir())
