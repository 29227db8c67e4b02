"""Grading a class: parallel, a grader killed mid-run, nothing recorded twice.

A class of generated submissions (solutions, every untouched exercise,
wrong submissions of every assignment, hostile notebooks) is graded by two Dask
workers while one is killed with SIGKILL; then re-run; then one submission
changes. The gradebook has one record each, and equals grading alone one
notebook of each kind.
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest

from autograder.classroom import grade_class
from autograder.notebooks import notebook

# Grading the whole corpus once (the module fixture) takes minutes.
pytestmark = pytest.mark.timeout(1800)

ROOT = notebook.REPO
sys.path.insert(0, str(ROOT / "tests"))
from test_autograder import ENV, corpus  # noqa: E402
from test_redis_door import assert_refused, attacker  # noqa: E402

# The class holds notebooks of the corpus (tests/corpus/submissions/bugs.py): a
# queue bug a chaos run names, two that break the notebook (a crash in a
# worker), and those only the class grades (`IN_CLASS`: one of each other
# assignment, a heartbeat trial timed under parallel graders, and a queue
# written differently), each held to its entry.
FROM_CORPUS = {"a2_ack_no_fence", "a2_syntax_error", "a2_sys_exit_on_import",
               *corpus.IN_CLASS}
# Graded alone again to compare with the class: one of each kind (solution,
# untouched exercise, wrong, correct written differently, hostile) and every
# assignment between them; the class's other notebooks are graded alone by
# other tests (the solutions by test_autograder, the corpus's by its test).
ALONE = {"solution-delivery-semantics", "solution-outbox-relay",
         "stub-claim-ack-reap", "a3-no-final-lease-check",
         "claims-effect-in-two-transactions", "a2-alt-streams", "hostile-redis"}

HOSTILE = {
    # Ends its own kernel and every process it can reach in its group.
    "hostile_kill_group": "import os, signal\nos.killpg(0, signal.SIGKILL)\n",
    # Exits the interpreter from a cell.
    "hostile_exit": "import os\nos._exit(0)\n",
    # Fills its work dir until something stops it.
    "hostile_fill": ("with open('big.bin', 'wb') as f:\n"
                     "    for _ in range(64):\n"
                     "        f.write(b'x' * (1 << 20))\n"),
}


# A classmate's notebook, which the attacker points the server's dump at.
VICTIM = Path("solution-claim-ack-reap", "claim_ack_reap", "claim_ack_reap.ipynb")


def _hostile(name: str, code: str, dest: Path) -> Path:
    nb = nbformat.read(str(notebook.RELEASE_DIR / "delivery_semantics" /
                           "delivery_semantics.ipynb"), 4)
    nb.cells.insert(1, nbformat.v4.new_code_cell(code))
    path = dest / name / "delivery_semantics.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    return path


def make_class(root: Path) -> dict[str, Path]:
    """student -> notebook, laid out as nbgrader's submitted/<student>/<a>/."""
    made: dict[str, Path] = {}
    scratch = root.parent / "scratch"
    for name in sorted(FROM_CORPUS):
        made[name] = corpus.build(name, scratch, notebook.SOURCE_DIR)
    for a in ("delivery_semantics", "claim_ack_reap", "heartbeats",
              "idempotent_claims", "outbox_relay"):
        made[f"stub_{a}"] = notebook.RELEASE_DIR / a / f"{a}.ipynb"
    # Three solutions: heartbeats and idempotent_claims are in the class as
    # the corpus's wrong versions (a full grade each, as long as a solution's).
    for a in ("delivery_semantics", "claim_ack_reap", "outbox_relay"):
        made[f"solution_{a}"] = notebook.source_notebook(a)
    for name, code in HOSTILE.items():
        made[name] = _hostile(name, code, scratch)
    made["hostile_redis"] = attacker(scratch / "hostile_redis", root / VICTIM)
    out = {}
    for student, path in made.items():
        a, _ = notebook.identify(notebook.read(path), path)
        dest = root / student.replace("_", "-") / a / f"{a}.ipynb"
        dest.parent.mkdir(parents=True)
        shutil.copy(path, dest)
        out[student.replace("_", "-")] = dest
    return out


def _cli(*args, timeout=1500):
    return subprocess.Popen([sys.executable, "-m", "autograder", *args], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=ENV)


def _dask_workers(pid: int) -> list[psutil.Process]:
    """The Dask worker processes under our grade-class run."""
    out = []
    try:
        procs = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return out
    for p in procs:
        try:
            cmd = " ".join(p.cmdline())
        except psutil.Error:
            continue
        if "multiprocessing" in cmd and "autograder" not in cmd:
            out.append(p)
    return out


def _grading(worker: psutil.Process) -> bool:
    """A grade runs under it: a fork of its server of graders, named so."""
    try:
        return any(c.name() == "autograder" for c in worker.children(recursive=True))
    except psutil.Error:
        return False


def _gradebook(course: Path) -> dict[tuple[str, str], dict[str, float]]:
    from nbgrader.api import Gradebook

    out = {}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for a in gb.assignments:
            for sub in a.submissions:
                out[sub.student.id, a.name] = {
                    g.name: g.score for nb in sub.notebooks for g in nb.grades}
    return out


@pytest.fixture(scope="module")
def graded_class(tmp_path_factory):
    """Grade the class once with a kill, then once more; keep what each did."""
    course = tmp_path_factory.mktemp("course")
    subs = make_class(course / "submitted")
    assert len(subs) >= 20 and ALONE <= set(subs), sorted(ALONE - set(subs))
    proc = _cli("grade-class", str(course / "submitted"), "--workers", "2",
                "--quick")
    killed = []

    def killer():
        ledger = course / "grade-class.db"
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            if ledger.exists() and _rows(ledger) >= 3:
                workers = [w for w in _dask_workers(proc.pid) if _grading(w)]
                if workers:
                    workers[0].send_signal(signal.SIGKILL)
                    killed.append(workers[0].pid)
                    return
            time.sleep(0.3)

    t = threading.Thread(target=killer)
    t.start()
    out, err = proc.communicate(timeout=1500)
    t.join()
    first = (proc.returncode, out, err)
    again = _cli("grade-class", str(course / "submitted"), "--workers", "2",
                 "--quick")
    out2, err2 = again.communicate(timeout=600)
    return course, subs, killed, first, (again.returncode, out2, err2)


def _rows(path: Path) -> int:
    import sqlite3

    con = sqlite3.connect(path, timeout=5)
    try:
        return con.execute("select count(*) from grades").fetchone()[0]
    except sqlite3.Error:
        return 0
    finally:
        con.close()


def test_class_is_graded_once_despite_a_killed_grader(graded_class):
    course, subs, killed, first, again = graded_class
    rc, out, err = first
    assert killed, "a grader was killed mid-run"
    assert "graded" in err and "left" in err, "the progress bar was shown"
    assert _rows(course / "grade-class.db") == len(subs), out + err[-3000:]
    assert " 0 could not be graded" in out, out
    rc2, out2, err2 = again
    assert rc2 == 0, out2 + err2[-2000:]
    assert f"0 now, {len(subs)} recorded before" in out2, out2
    book = _gradebook(course)
    assert len(book) == len(subs), "one gradebook submission per notebook"


def test_gradebook_equals_grading_one_by_one(graded_class):
    """Each notebook graded alone with `autograder grade` gives the same points."""
    course, subs, *_ = graded_class
    book = _gradebook(course)

    def alone(item):
        student, path = item
        res = subprocess.run([sys.executable, "-m", "autograder", "grade", str(path),
                              "--json", "--quick"], cwd=ROOT, capture_output=True,
                             text=True, env=ENV, timeout=600)
        checks = json.loads(res.stdout)["checks"]
        return student, path.parent.name, {c["name"]: (float(c["points"]), c)
                                           for c in checks}

    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(alone, [(s, subs[s]) for s in sorted(ALONE)]))
    # Only the checks that differ, with what grading alone said of them.
    mismatched = [f"{s} {a} {name}: class {book[s, a].get(name)}, alone {points}: "
                  f"{got.get('message', '')} | got: {got.get('got', '')}"
                  for s, a, checks in results
                  for name, (points, got) in checks.items()
                  if book[s, a].get(name) != points]
    mismatched += [f"{s} {a}: class checks {sorted(book[s, a])}, alone {sorted(checks)}"
                   for s, a, checks in results if set(book[s, a]) != set(checks)]
    assert not mismatched, "\n".join(mismatched)


def test_the_corpus_notebooks_show_what_their_entries_say(graded_class):
    """The corpus's notebooks graded only here lose the check that names their
    bug and keep the rest; its correct one earns every point."""
    results = _results(graded_class[0])
    missed = [m for name in sorted(corpus.IN_CLASS)
              for m in corpus.missed(name, results[name.replace("_", "-")])]
    assert not missed, "\n".join(missed)


def test_an_attack_through_redis_changes_no_classmate(graded_class):
    course, subs, *_ = graded_class
    victim = course / "submitted" / VICTIM
    assert victim == subs["solution-claim-ack-reap"]
    source = notebook.source_notebook("claim_ack_reap")
    assert victim.read_bytes() == source.read_bytes(), "her notebook is intact"
    book = _gradebook(course)
    assert sum(book["hostile-redis", "claim_ack_reap"].values()) == 0
    full = book["solution-claim-ack-reap", "claim_ack_reap"]
    assert all(v > 0 for v in full.values()), full
    told = [r for r in _results(course).values()
            if any("Redis command" in p for p in r["problems"])]
    assert len(told) == 1 and told[0]["score"] == 0
    assert_refused(told[0]["problems"])


def test_report_names_what_the_class_got_wrong(graded_class):
    course, subs, _, first, _ = graded_class
    out = first[1]
    assert "claim_ack_reap:" in out and "most missed:" in out
    assert "grade time:" in out
    rows = (course / "grades.csv").read_text().splitlines()
    assert len(rows) == len(subs) + 1
    feedback = list((course / "autograded").rglob("*.ipynb"))
    assert len(feedback) == len(subs)


def test_a_changed_submission_is_graded_again(graded_class, tmp_path):
    course, subs, *_ = graded_class
    path = subs["solution-delivery-semantics"]
    nb = nbformat.read(str(path), 4)
    nb.cells.append(nbformat.v4.new_markdown_cell("my notes"))
    nbformat.write(nb, str(path))
    proc = _cli("grade-class", str(course / "submitted"), "--workers", "1",
                "--quick", "--assignment", "delivery_semantics")
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, out + err[-2000:]
    assert out.startswith("graded 1 now,"), out
    assert _gradebook(course)["solution-delivery-semantics",
                              "delivery_semantics"]["ack_before_work"] > 0


def test_bad_input_is_one_line(tmp_path):
    res = subprocess.run([sys.executable, "-m", "autograder", "grade-class",
                          str(tmp_path / "nope")], cwd=ROOT, capture_output=True,
                         text=True, env=ENV, timeout=60)
    assert res.returncode == 2
    assert res.stderr.strip().count("\n") == 0 and "not a folder" in res.stderr
    res = subprocess.run([sys.executable, "-m", "autograder", "grade-class",
                          str(tmp_path), "--workers", "0"], cwd=ROOT,
                         capture_output=True, text=True, env=ENV, timeout=60)
    assert res.returncode == 2 and "--workers" in res.stderr


def test_workers_on_other_machines_need_only_the_address(tmp_path):
    """A scheduler and two workers started apart, as on two machines."""
    sched_file = tmp_path / "scheduler.json"
    bin_ = Path(sys.executable).parent
    env = dict(ENV, PYTHONUNBUFFERED="1")
    procs = [subprocess.Popen([str(bin_ / "dask"), "scheduler", "--host",
                               "127.0.0.1", "--port", "0", "--no-dashboard",
                               "--scheduler-file", str(sched_file)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
    try:
        deadline = time.monotonic() + 60
        while not sched_file.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        address = json.loads(sched_file.read_text())["address"]
        for _ in range(2):
            procs.append(subprocess.Popen(
                [str(bin_ / "dask"), "worker", address, "--nthreads", "1",
                 "--no-dashboard"], env=env, cwd=tmp_path,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        subs = tmp_path / "course" / "submitted"
        # Untouched exercises: what is graded does not matter here, only where
        # (the class's solutions are graded by the fixture, and alone).
        for student, a in (("ada", "delivery_semantics"), ("bob", "outbox_relay")):
            dest = subs / student / a
            dest.mkdir(parents=True)
            shutil.copy(notebook.RELEASE_DIR / a / f"{a}.ipynb", dest / f"{a}.ipynb")
        res = subprocess.run([sys.executable, "-m", "autograder", "grade-class",
                              str(subs), "--scheduler", address, "--quick"],
                             cwd=ROOT, capture_output=True, text=True, env=ENV,
                             timeout=600)
        assert res.returncode == 0, res.stdout + res.stderr[-2000:]
        assert "graded 2 now" in res.stdout
        hosts = {r["grader_host"] for r in _results(subs.parent).values()}
        assert len(hosts) >= 1
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def _results(course: Path) -> dict[str, dict]:
    """student -> the report the class recorded (one assignment each here)."""
    import sqlite3

    con = sqlite3.connect(course / "grade-class.db")
    try:
        return {student: json.loads(result) for student, result in
                con.execute("select student, result from grades")}
    finally:
        con.close()


def test_grader_version_changes_with_the_grader(monkeypatch, tmp_path):
    v1 = grade_class.grader_version()
    assert v1 == grade_class.grader_version()
    fake = tmp_path / "repo"
    for d in ("autograder", "handson", "solutions/x"):
        (fake / d).mkdir(parents=True)
    (fake / "autograder" / "a.py").write_text("x = 1\n")
    monkeypatch.setattr(notebook, "REPO", fake)
    monkeypatch.setattr(notebook, "SOURCE_DIR", fake / "solutions")
    before = grade_class.grader_version()
    (fake / "autograder" / "a.py").write_text("x = 2\n")
    assert grade_class.grader_version() != before
    assert os.path.exists(fake / "autograder" / "a.py")
