"""Attacks on the grader, run for real through both routes.

A cell that replaces the grade cells' `check` in the kernel, a module that is
the course's reference queue, a notebook of another assignment, a malformed
notebook: each earns nothing (or is refused with one line and exit 2) through
`python -m autograder grade` and through `nbgrader autograde`, and nothing a
submission started outlives either.
"""

import json
import os

import nbformat
import psutil
import pytest
from test_autograder import ROOT, _cli, _course, _gradebook, _nbgrader
from test_redis_door import attacker

from autograder import assignments, cli
from autograder.grade import grade
from autograder.judges import own_work
from autograder.notebooks import notebook

MARKER = f"eo-trust-detached-{os.getpid()}"
PATCH = {
    "claim_ack_reap": "import autograder.judges.claim_ack_reap as m",
    "heartbeats": "import autograder.judges.heartbeats as m",
}
DETACH = ("import subprocess\n"
          f"subprocess.Popen(['setsid', 'bash', '-c', 'exec -a {MARKER} sleep 300'])")


def _answer_index(nb) -> int:
    return max(i for i, c in enumerate(nb.cells) if notebook.role(c) == "answer")


def _with_cell(folder: str, name: str, code: str, dest) -> str:
    """The released (or source) notebook with one more learner cell."""
    nb = nbformat.read(str(ROOT / folder / name / f"{name}.ipynb"), 4)
    nb.cells.insert(_answer_index(nb) + 1, nbformat.v4.new_code_cell(code))
    path = dest / f"{name}-{folder}" / f"{name}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    return path


def _patched(name: str, tmp, folder="exercises"):
    # Detach first: in the sandbox the grader's modules cannot even be imported.
    code = (DETACH + "\n" + PATCH[name]
            + "\nm.check = lambda *a, **k: print('[PASS]')\n")
    return _with_cell(folder, name, code, tmp)


def _left_running() -> list[str]:
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if MARKER in " ".join(p.info["cmdline"] or ()):
            found.append(str(p.pid))
    return found


def test_patched_check_earns_nothing_through_both_routes(tmp_path):
    """The stubs plus `m.check = print('[PASS]')`: 0 points either way; and
    through nbgrader, a queue that attacks through its Redis (test_redis_door
    grades it with `grade`)."""
    subs = {name: _patched(name, tmp_path) for name in PATCH}
    victim = tmp_path / "classmate.ipynb"
    victim.write_bytes(b"her work")
    mallory = attacker(tmp_path / "mallory", victim)
    for name, path in subs.items():
        res = _cli("grade", str(path), "--json", "--assignment", name)
        data = json.loads(res.stdout)
        assert data["score"] == 0, [c["name"] for c in data["checks"] if c["ok"]]
        assert res.returncode == 1
        assert any("left 1 process" in p for p in data["problems"]), data["problems"]
    assert not _left_running()
    course = _course(tmp_path, {"eve": subs,
                                "mallory": {"claim_ack_reap": mallory}})
    for name in PATCH:
        res = _nbgrader("autograde", name, "--log-level=WARN", cwd=course)
        assert res.returncode == 0, res.stderr[-3000:]
        points = _gradebook(course, name, "eve")
        assert set(points) == set(assignments.points(name))
        assert sum(points.values()) == 0, points
    assert sum(_gradebook(course, "claim_ack_reap", "mallory").values()) == 0
    assert victim.read_bytes() == b"her work"
    assert not _left_running(), "a detached process outlived nbgrader autograde"
    graded = course / "autograded" / "eve" / "claim_ack_reap" / "claim_ack_reap.ipynb"
    text = graded.read_text()
    assert "graded outside the notebook's kernel" in text
    assert "NotImplementedError" in text


def test_wrong_assignment_is_refused(tmp_path):
    """The heartbeats solution saved as claim_ack_reap.ipynb."""
    path = tmp_path / "claim_ack_reap.ipynb"
    path.write_bytes(notebook.source_notebook("heartbeats").read_bytes())
    res = _cli("grade", str(path), "--assignment", "claim_ack_reap", timeout=60)
    assert res.returncode == 2, res.stdout[-2000:]
    assert res.stderr.strip().count("\n") == 0, res.stderr
    assert "is a notebook of heartbeats" in res.stderr
    nb = notebook.read(path)
    name, why = notebook.identify(nb, path)
    assert name == "heartbeats" and "graded as heartbeats" in why
    nb.metadata.pop("autograder")
    with pytest.raises(notebook.SubmissionError, match="test cells are those of"):
        notebook.identify(nb, path)


def _field(nb, how):
    cells = nb["cells"]
    test = next(c for c in cells if c["metadata"].get("nbgrader", {}).get("grade")
                and not c["metadata"]["nbgrader"].get("solution"))
    answer = next(c for c in cells
                  if c["metadata"].get("nbgrader", {}).get("solution"))
    if how == "autograder_string":
        nb["metadata"]["autograder"] = "claim_ack_reap"
    elif how == "assignment_list":
        nb["metadata"]["autograder"]["assignment"] = ["claim_ack_reap"]
    elif how == "nbgrader_string":
        test["metadata"]["nbgrader"] = "grade me"
    elif how == "points_lots":
        test["metadata"]["nbgrader"]["points"] = "lots"
    elif how == "source_int":
        answer["source"] = 42
    elif how == "no_cells":
        del nb["cells"]
    elif how == "cells_object":
        nb["cells"] = {"a": 1}
    elif how == "unknown_assignment":
        nb["metadata"]["autograder"]["assignment"] = "claim_ack_reap_v2"
    return nb


MALFORMED = {
    "autograder_string": "metadata.autograder is a string",
    "assignment_list": "metadata.autograder.assignment is a list",
    "nbgrader_string": "nbgrader metadata is a string",
    "points_lots": "points are 'lots'",
    "source_int": "source is a number",
    "no_cells": "it has no cells",
    "cells_object": "cells is an object",
    "unknown_assignment": "no assignment named 'claim_ack_reap_v2'",
    "not_json": "is not a readable notebook",
}


def _write(path, how):
    if how == "not_json":
        path.write_text("{ not json")
    else:
        raw = json.loads(notebook.source_notebook("claim_ack_reap").read_text())
        path.write_text(json.dumps(_field(raw, how)))


@pytest.mark.parametrize("how", sorted(MALFORMED))
def test_malformed_notebook_gets_one_line_and_exit_2(tmp_path, how, capsys):
    """The CLI's main, in this process (one real run below)."""
    path = tmp_path / "claim_ack_reap.ipynb"
    _write(path, how)
    assert cli.main(["grade", str(path)]) == 2
    out, err = capsys.readouterr()
    lines = err.strip().splitlines()
    assert len(lines) == 1 and not out, (out, err)
    assert lines[0].startswith("cannot grade:") and MALFORMED[how] in lines[0], lines


def test_malformed_notebook_through_the_real_cli(tmp_path):
    path = tmp_path / "claim_ack_reap.ipynb"
    _write(path, "points_lots")
    res = _cli("grade", str(path), timeout=120)
    assert res.returncode == 2, (res.stdout[-1000:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr
    cells = json.loads(notebook.source_notebook("claim_ack_reap").read_text())
    number = 1 + next(i for i, c in enumerate(cells["cells"])   # said from 1
                      if c["metadata"].get("nbgrader", {}).get("grade_id")
                      == "enqueue_idempotent")
    assert res.stderr.strip().splitlines() == [
        f"cannot grade: {path} is malformed: cell {number} ('enqueue_idempotent')"
        "'s nbgrader points are 'lots', not a number of points"]


def test_check_only_names_a_check(tmp_path):
    res = _cli("check", "claim_ack_reap", "--only", "no_such_check", timeout=60)
    assert res.returncode == 2 and "has no check no_such_check" in res.stderr
    res = _cli("check", str(ROOT / "exercises" / "claim_ack_reap"), "--only",
               "enqueue_idempotent", "--json", timeout=120)
    data = json.loads(res.stdout)
    assert [c["name"] for c in data["checks"]] == ["enqueue_idempotent"]
    assert data["max_score"] == 1 and res.returncode == 1


# --- own work: the course's reference earns nothing ---------------------------------

HB_IMPORTS = ("from handson.q import INFLIGHT, JOBS, ack, claim, dead, enqueue, "
              "fail, reap\n")
REUSE = {
    "claim_ack_reap": ("myqueue",
                       "%%writefile myqueue.py\nfrom handson.q import *\n",
                       "imports * from handson.q"),
    "heartbeats": ("heartbeat", "%%writefile heartbeat.py\n" + HB_IMPORTS
                   + "from handson.q import extend\n\n\n"
                   "def run_with_heartbeat(r, queue, job_id, attempt, lease_s, "
                   "work):\n    work(None)\n    return True\n",
                   "imports extend from handson.q"),
    "idempotent_claims": ("myclaims", "%%writefile myclaims.py\n"
                          "import handson.confirmation_job as cj\n"
                          "POLICY = 'hold'\n\n\ndef send_confirmation(*a):\n"
                          "    return cj.send_confirmation(*a)\n",
                          "imports the course's module handson.confirmation_job"),
}


def _answer(name: str, gid: str, source: str, dest) -> str:
    nb = nbformat.read(str(notebook.source_notebook(name)), 4)
    cell = next(c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == gid)
    cell.source = source
    path = dest / name / f"{name}.ipynb"
    path.parent.mkdir(parents=True)
    nbformat.write(nb, str(path))
    return path


@pytest.mark.parametrize("name", sorted(REUSE))
def test_reference_reused_earns_nothing(tmp_path, name):
    gid, source, says = REUSE[name]
    result = grade(_answer(name, gid, source, tmp_path), assignment=name)
    assert result.score == 0, [o.name for o in result.outcomes if o.ok]
    for o in result.outcomes:
        assert says in o.message and "\n" not in o.message, o.message


def test_own_work_reads_the_file_not_the_module(tmp_path):
    """No false alarm on our solutions; each dynamic evasion named."""
    for name, policy in own_work.POLICIES.items():
        nb = nbformat.read(str(notebook.source_notebook(name)), 4)
        cell = next(c for c in nb.cells if notebook.role(c) == "answer"
                    and c.source.startswith("%%writefile"))
        path = tmp_path / f"{name}.py"
        path.write_text(cell.source.split("\n", 1)[1])
        review = own_work.review(str(path), policy, path.name)
        assert not review.everything and not review.functions, (name, review)
    cases = {
        "import importlib\nq = importlib.import_module('handson.q')\n": "importlib",
        "q = __import__('hand' + 'son.q')\n": "__import__",
        "exec(open('x').read())\n": "exec",
        "src = open('../solutions/claim_ack_reap/claim_ack_reap.ipynb')\n":
            "names a file or folder of the course",
        "import sys\nsys.modules['x'] = None\n": "sys.modules",
        "from autograder.judges.claim_ack_reap import CHECKS\n": "from autograder",
        "from handson.queues.checks import *\n": "* from handson.queues.checks",
        "from handson.infra import remote_module\n": "from handson.infra",
        "import handson.faults.engine as e\n": "module handson.faults.engine",
    }
    policy = own_work.POLICIES["claim_ack_reap"]
    for source, says in cases.items():
        path = tmp_path / "evasion.py"
        path.write_text('"""Like handson/q.py, but mine."""\n' + source)
        review = own_work.review(str(path), policy, path.name)
        assert review.everything and says in review.everything[0], (source, review)
    path.write_text("from handson.q import ack, claim\n\n\ndef extend(*a):\n"
                    "    pass\n\n\nextend = claim\n")
    review = own_work.review(str(path), own_work.POLICIES["heartbeats"], "hb.py")
    assert not review.everything and "extend is not defined with def" in (
        review.refusal(own_work.POLICIES["heartbeats"], "zombie_extend_refused"))
