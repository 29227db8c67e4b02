"""The autograder and the nbgrader pipeline, end to end.

Solutions score full marks and untouched exercises score zero, through
`python -m autograder grade` (the release itself: test_release.py);
`nbgrader autograde` gives the same points per check; the sandbox kills what
a submission leaves behind.
Each notebook is graded once (module-scoped fixtures) and asserted on several
times. The wrong submissions are in test_autograder_corpus.py.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import nbformat
import psutil
import pytest

from autograder import assignments
from autograder.grade import grade
from autograder.isolation import sandbox
from autograder.notebooks import notebook


def load_path(name: str, path: Path):
    """Import a module from a file (the corpus is data, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The module fixtures grade every solution and exercise: minutes, not seconds.
pytestmark = pytest.mark.timeout(1800)

ROOT = notebook.REPO
corpus = load_path("bugs", ROOT / "tests" / "corpus" / "submissions" / "bugs.py")
OURS = ["delivery_semantics", "claim_ack_reap", "heartbeats", "idempotent_claims",
        "outbox_relay"]
WITH_SOURCE = [n for n in assignments.names() if notebook.source_notebook(n)]
VENV_BIN = str(Path(sys.executable).parent)
ENV = dict(os.environ, PATH=VENV_BIN + os.pathsep + os.environ.get("PATH", ""))
ENV.pop("REDIS_URL", None)


def _cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "autograder", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout, env=ENV)


def _nbgrader(*args, cwd, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([os.path.join(VENV_BIN, "nbgrader"), *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout, env=ENV)


# --- the pipeline's shape -------------------------------------------------------

@pytest.mark.parametrize("name", WITH_SOURCE)
def test_grade_cells_are_the_checks(name):
    """Every check has one locked grade cell with its points; nothing else does."""
    mod = assignments.load(name)
    nb = notebook.read(notebook.source_notebook(name))
    assert nb.metadata["autograder"]["assignment"] == name
    tests = [c for c in nb.cells if notebook.role(c) == "test"]
    got = {c.metadata.nbgrader.grade_id: c.metadata.nbgrader.points for c in tests}
    assert got == {c.name: c.points for c in mod.CHECKS}
    for c in tests:
        assert c.metadata.nbgrader.locked
        assert f"check({c.metadata.nbgrader.grade_id!r})" in c.source
    assert [notebook.role(c) for c in nb.cells].count("check") == 1


# --- solutions and exercises through `python -m autograder grade` -----------------

def _grade_all(folder: str) -> dict:
    """`python -m autograder grade --json` on each of ours, three at a time."""
    def one(name):
        start = time.monotonic()
        res = _cli("grade", str(ROOT / folder / name), "--json", timeout=600)
        assert res.stdout, res.stderr[-2000:]
        return name, (res, json.loads(res.stdout), time.monotonic() - start)

    with ThreadPoolExecutor(max_workers=3) as pool:
        return dict(pool.map(one, OURS))


@pytest.fixture(scope="module")
def solution_grades():
    return _grade_all("solutions")


@pytest.fixture(scope="module")
def exercise_grades():
    return _grade_all("exercises")


@pytest.mark.parametrize("name", OURS)
def test_solution_scores_full_marks(solution_grades, name):
    res, data, _ = solution_grades[name]
    failed = [c for c in data["checks"] if not c["ok"]]
    assert not failed, json.dumps(failed, indent=1)[:3000]
    assert data["score"] == data["max_score"] == sum(
        c.points for c in assignments.load(name).CHECKS)
    assert res.returncode == 0
    assert not data["problems"], data["problems"]


def test_solution_report_has_invariants(solution_grades):
    _, data, _ = solution_grades["claim_ack_reap"]
    assert data["invariants"], "the chaos run's invariants are in the report"
    assert all(v is True for v in data["invariants"].values()), data["invariants"]
    assert all(k.endswith("_ok") for k in data["invariants"]), "true means it held"
    for c in data["checks"]:
        assert c["points"] == c["max_points"]
    # What it cost, beside the reference in the same run: the solution, like
    # the reference, makes every call one round trip.
    cost = data["efficiency"]
    assert cost["yours"]["per_job"]["round_trips"] == \
        cost["reference"]["per_job"]["round_trips"], cost


@pytest.mark.parametrize("name", OURS)
def test_untouched_exercise_scores_zero_quickly(exercise_grades, name):
    res, data, elapsed = exercise_grades[name]
    assert data["score"] == 0, [c["name"] for c in data["checks"] if c["ok"]]
    assert res.returncode == 1
    assert elapsed < 150, f"grading the empty {name} took {elapsed:.0f} s"
    for c in data["checks"]:
        assert c["message"], f"{c['name']} failed without saying why"
    text = " ".join(c["message"] + c["got"] for c in data["checks"])
    assert "NotImplementedError" in text


# --- a correct notebook saved from an earlier release --------------------------------

def earlier_release(name: str, dest: Path) -> Path:
    """Today's solution as saved from an earlier release: the grade cells import
    the judge from where it was before `autograder/judges/` (a module that no
    longer exists), and one test cell's text differs."""
    nb = notebook.read(notebook.source_notebook(name))
    for cell in nb.cells:
        if notebook.role(cell) in ("test", "check"):
            assert f"autograder.judges.{name}" in cell.source
            cell.source = cell.source.replace(f"autograder.judges.{name}",
                                              f"autograder.{name}")
    first = next(c for c in nb.cells if notebook.role(c) == "test")
    first.source = "# the check, as it was last week\n" + first.source
    path = dest / "earlier" / f"{name}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    return path


@pytest.fixture(scope="module")
def earlier_grade(tmp_path_factory):
    path = earlier_release("delivery_semantics", tmp_path_factory.mktemp("old"))
    return path, grade(path)


def test_earlier_release_scores_full_marks_with_a_note(earlier_grade):
    path, result = earlier_grade
    assert result.score == result.max_score, [o.explain() for o in result.outcomes
                                              if not o.ok]
    assert not result.problems, result.problems
    assert any(n.startswith("test cells 'ack_before_work', 'ack_after_work'")
               and "restored from the current release" in n
               for n in result.notes), result.notes
    assert "note: test cells 'ack_before_work'" in result.text()
    assert json.loads(result.to_json())["notes"] == result.notes


def test_text_report_names_failures_and_replays(tmp_path):
    """The human report: points per check, what to fix, expected vs got."""
    res = _cli("check", str(ROOT / "exercises" / "delivery_semantics"))
    assert res.returncode == 1
    assert "[FAIL] ack_before_work" in res.stdout
    assert "score 0/" in res.stdout and "What to fix:" in res.stdout
    assert "quick check" in res.stdout


def test_cli_refuses_what_it_cannot_grade(tmp_path):
    res = _cli("grade", str(tmp_path / "nope.ipynb"), timeout=60)
    assert res.returncode == 2 and "is neither a notebook" in res.stderr
    (tmp_path / "x.ipynb").write_text("not json")
    res = _cli("grade", str(tmp_path / "x.ipynb"), timeout=60)
    assert res.returncode == 2 and "not a readable notebook" in res.stderr


# --- nbgrader gives the same points ------------------------------------------------

def _course(tmp: Path, submissions: dict[str, dict[str, Path]]) -> Path:
    """A throwaway course: our config and sources, then submitted/<student>/."""
    course = tmp / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(ROOT / "nbgrader_config.py", course)
    names = {a for subs in submissions.values() for a in subs}
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name)
        res = _nbgrader("generate_assignment", name, "--log-level=WARN", cwd=course)
        assert res.returncode == 0, res.stderr[-2000:]
    for student, subs in submissions.items():
        res = _nbgrader("db", "student", "add", student, "--log-level=WARN",
                        cwd=course)
        assert res.returncode == 0, res.stderr[-2000:]
        for name, path in subs.items():
            dest = course / "submitted" / student / name
            dest.mkdir(parents=True)
            shutil.copy(path, dest / f"{name}.ipynb")
    return course


def _gradebook(course: Path, name: str, student: str) -> dict[str, float]:
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        sub = gb.find_submission(name, student)
        return {g.name: g.score for nb in sub.notebooks for g in nb.grades}


def test_nbgrader_autograde_gives_the_same_points(tmp_path, solution_grades,
                                                 earlier_grade):
    """A full-marks, a partly wrong and an earlier release's submission, through
    both graders."""
    wrong = corpus.build("a1_effect_then_key", tmp_path, notebook.SOURCE_DIR)
    subs = {"ada": {"delivery_semantics": notebook.source_notebook(
                "delivery_semantics"),
                    "claim_ack_reap": notebook.source_notebook("claim_ack_reap")},
            "bob": {"delivery_semantics": wrong},
            "cy": {"delivery_semantics": earlier_grade[0]}}
    course = _course(tmp_path, subs)
    for name in ("delivery_semantics", "claim_ack_reap"):
        res = _nbgrader("autograde", name, "--log-level=WARN", cwd=course)
        assert res.returncode == 0, res.stderr[-3000:]
    ours = {("ada", name): {c["name"]: c["points"] for c in
                            solution_grades[name][1]["checks"]}
            for name in subs["ada"]}
    ours["bob", "delivery_semantics"] = grade(wrong).points()
    ours["cy", "delivery_semantics"] = earlier_grade[1].points()
    for (student, name), points in ours.items():
        theirs = _gradebook(course, name, student)
        assert theirs == {k: float(v) for k, v in points.items()}, (student, name)
    assert _gradebook(course, "delivery_semantics", "bob")["dedup_in_tx"] == 0
    res = _nbgrader("generate_feedback", "delivery_semantics", "--log-level=WARN",
                    cwd=course)
    assert res.returncode == 0, res.stderr[-2000:]
    feedback = list((course / "feedback" / "bob").rglob("*.html"))
    assert feedback and "dedup_in_tx" in feedback[0].read_text()
    graded = nbformat.read(str(course / "autograded" / "ada" / "claim_ack_reap"
                               / "claim_ack_reap.ipynb"), as_version=4)
    [check] = [c for c in graded.cells if notebook.role(c) == "check"]
    assert any("eo-cost-bars" in o.get("data", {}).get("text/html", "")
               for o in check.outputs), "the check cell shows what the queue cost"


def test_nbgrader_validate_invert_agrees_exercises_fail(tmp_path):
    """`nbgrader validate --invert`: no test passes on an untouched exercise."""
    for name in OURS:
        shutil.copytree(ROOT / "exercises" / name, tmp_path / name)
    res = _nbgrader("validate", "--invert", *[f"{n}/{n}.ipynb" for n in OURS],
                    cwd=tmp_path, timeout=400)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.count("Success! The notebook does not pass any tests.") == len(
        OURS), res.stdout[-3000:]


# --- the sandbox ---------------------------------------------------------------------

def test_sandbox_limits_time_memory_and_kills_what_is_left():
    marker = f"eo-sandbox-test-{os.getpid()}"
    fin = sandbox.run(["bash", "-c", f"(setsid sleep 300 {marker} &); exec -a "
                       f"{marker} sleep 301 & echo started"], timeout=20)
    assert fin.ok and "started" in fin.stdout
    assert fin.leftovers, "orphans that escaped the session are found"
    time.sleep(0.2)
    alive = [p for p in psutil.process_iter(["cmdline"])
             if marker in " ".join(p.info["cmdline"] or [])]
    assert not alive, "every process the command left behind was killed"
    start = time.monotonic()
    fin = sandbox.run([sys.executable, "-c", "while True: pass"], timeout=1.5)
    assert fin.timed_out and time.monotonic() - start < 20
    fin = sandbox.run([sys.executable, "-c", "x = bytearray(3 * 1024 ** 3)"],
                      timeout=30, mem_mb=1024)
    assert fin.returncode != 0 and "MemoryError" in fin.stderr


def test_unknown_chaos_verdict_is_never_a_pass():
    """A chaos run that did not drain fails every chaos check, with the reason."""
    from autograder.judges import claim_ack_reap as a2

    unknown = {"verdict": "unknown", "reason": "not drained after 40 s", "seed": 1,
               "replay": "python -m handson.chaos 4 --queue scratch/run1/myqueue.py",
               "invariants": {name: {"ok": True, "count": 0, "witnesses": []}
                              for names in a2.INVARIANTS.values() for name in names}}
    outcomes, invariants, replay = a2._chaos_outcomes([unknown], "myqueue.py",
                                                      "scratch/run1/myqueue.py")
    assert [o.ok for o in outcomes] == [False] * len(a2.CHAOS_CHECKS)
    assert all("unknown" in o.message and "not drained" in o.message
               for o in outcomes)
    assert set(invariants.values()) == {None}
    assert replay == "python -m handson.chaos 4 --queue myqueue.py"


def test_replay_command_points_at_a_module_the_learner_has(tmp_path, monkeypatch):
    """The judged module's directory is gone after grading: keep a copy to replay."""
    from autograder.grade import replayable
    from autograder.judges import claim_ack_reap

    judged, here = tmp_path / "judged", tmp_path / "course"
    judged.mkdir()
    (here / "a2").mkdir(parents=True)
    (judged / "myqueue.py").write_text("# the judged queue\n")
    nb = here / "a2" / "claim_ack_reap.ipynb"
    monkeypatch.chdir(here)
    cmd = "python -m handson.chaos 4 --queue myqueue.py --seed 1"
    out = replayable(cmd, claim_ack_reap, judged, nb)
    assert out == "python -m handson.chaos 4 --queue a2/replay-myqueue.py --seed 1"
    assert (here / "a2" / "replay-myqueue.py").read_text() == "# the judged queue\n"
    (here / "a2" / "myqueue.py").write_text("# the judged queue\n")   # the same
    assert "--queue a2/myqueue.py " in replayable(cmd, claim_ack_reap, judged, nb)
    (here / "a2" / "myqueue.py").write_text("# edited since\n")       # never clobbered
    assert "--queue a2/replay-myqueue.py " in replayable(cmd, claim_ack_reap, judged,
                                                          nb)
    assert (here / "a2" / "myqueue.py").read_text() == "# edited since\n"


def test_a_killed_runner_is_named_as_the_cause_not_a_warning():
    """The runner killed by a signal before it reported: say so, and leave out
    the kernel's log lines that were its last output."""
    from autograder.grade import _execution_problems

    fin = sandbox.Finished(["runner"], -9, "", "[IPKernelApp] WARNING | Kernel is "
                           "running over TCP without encryption.\n", False, 3.0)
    [problem] = _execution_problems({}, fin, 120)
    assert "killed by signal SIGKILL" in problem and "TCP" not in problem


def test_a_missed_pause_point_is_said_in_learner_words():
    from autograder.judges.checks import missed_pause

    raw = ("expected 'paused after-claim' from worker 12 (replay_matrix --job m.py "
           "...), got '{\"outcome\": \"sent\", \"pid\": 9}'; stderr: ")
    text = missed_pause(raw)
    assert 'never called pause("after-claim")' in text and "returned 'sent'" in text
    assert "worker 12" not in text and "expected 'paused" not in text
    assert missed_pause("database is locked") == "database is locked"


def test_a_looping_cell_is_interrupted_at_the_grader_s_cell_limit(tmp_path,
                                                                   monkeypatch):
    """The grader's limit reaches the runner (30 s in a grade; 2 s here), the
    cells after the loop still run, and the problem names the limit."""
    import types

    import nbformat

    from autograder import grade
    from autograder.notebooks import notebook

    monkeypatch.setattr(notebook, "CELL_TIMEOUT_S", 2)
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import time\nwhile True:\n"
                                          "    time.sleep(0.1)"),
                nbformat.v4.new_code_cell("open('after.txt', 'w').write('ran')")]
    module = types.SimpleNamespace(__name__="none", NOTEBOOK_TIMEOUT_S=60)
    start = time.monotonic()
    problems, _ = grade.run_learner_cells(nb, module, tmp_path, quick=True)
    assert time.monotonic() - start < 30
    assert any("cell 1 ran past its time limit (2 s" in p for p in problems), problems
    assert (tmp_path / "after.txt").read_text() == "ran"


def test_a_spinning_cell_is_stopped_at_its_cpu_limit_and_a_sleeping_one_is_not(
        tmp_path, monkeypatch):
    """A loop that spins uses a core for all of its time limit (30 s of CPU a
    notebook in a class); it is interrupted once it has used the grader's CPU
    limit (1 s here), well before the time limit (20 s), in a thread of the
    kernel's or a child process of it. A cell that sleeps as long uses no CPU
    and is not stopped for it; the cells after each still run. A spinner that
    ignores the interrupt has its kernel killed (a review's went on for the
    whole time limit, reported as interrupted): the cells after it do not run,
    and the grade says so."""
    import types

    import nbformat

    from autograder import grade
    from autograder.notebooks import notebook

    monkeypatch.setattr(notebook, "CELL_TIMEOUT_S", 20)
    monkeypatch.setattr(notebook, "CELL_CPU_S", 1)
    nb = nbformat.v4.new_notebook()
    nb.cells = [
        nbformat.v4.new_code_cell("while True:\n    pass"),
        nbformat.v4.new_code_cell(
            "import subprocess, sys\n"
            "subprocess.run([sys.executable, '-c', 'while True: pass'])"),
        nbformat.v4.new_code_cell("import time\ntime.sleep(3)"),
        nbformat.v4.new_code_cell("open('after.txt', 'w').write('ran')"),
        nbformat.v4.new_code_cell(
            "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
            "while True:\n    pass"),
        nbformat.v4.new_code_cell("open('never.txt', 'w').write('ran')")]
    module = types.SimpleNamespace(__name__="none", NOTEBOOK_TIMEOUT_S=120)
    start = time.monotonic()
    problems, _ = grade.run_learner_cells(nb, module, tmp_path, quick=True)
    assert time.monotonic() - start < 20, problems
    for cell in ("cell 1", "cell 2"):
        assert any(f"{cell} used 1 s of CPU and was interrupted" in p
                   for p in problems), problems
    assert not any("cell 3" in p for p in problems), problems
    assert (tmp_path / "after.txt").read_text() == "ran"
    assert any("cell 5 went on using CPU after it was interrupted at 1 s of CPU, "
               "so its kernel was killed" in p for p in problems), problems
    assert not any("cell 5 used" in p or "kernel died" in p for p in problems)
    assert not (tmp_path / "never.txt").exists()


def test_verdicts_said_at_once_are_heard_one_at_a_time():
    """Lanes and the chaos run say verdicts from threads of their own; a
    listener that prints must not get two at once (two prints shared a line)."""
    import threading

    from autograder.judges import live
    inside, most = [0], [0]

    def listener(name, ok, why):
        inside[0] += 1
        most[0] = max(most[0], inside[0])
        time.sleep(0.02)
        inside[0] -= 1

    with live.listening(listener):
        threads = [threading.Thread(target=live.say, args=(f"c{i}", True))
                   for i in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert most[0] == 1
