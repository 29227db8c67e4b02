"""A regrade after a source notebook changes: only what the change affects,
and per student what changed and why.

The grader reads a copy of solutions/ (AUTOGRADER_SOURCE_DIR), never the
repository's. A small class is graded for real (two delivery_semantics
notebooks; a claim_ack_reap grade is put into the ledger as recorded), then
a check's points change in the copy: the dry run names the two notebooks of
that assignment only, and the regrade names exactly the student whose points
moved and the check, leaving the other's grade as it was.
"""

import json
import shutil

import pytest
from test_autograder import corpus
from test_export import result_for

from autograder import assignments
from autograder.classroom import grade_class, regrade
from autograder.notebooks import notebook

pytestmark = pytest.mark.timeout(900)

NAME = "delivery_semantics"
SOURCE = f"solutions/{NAME}/{NAME}.ipynb"


def _set_points(path, gid: str, points: int) -> None:
    nb = json.loads(path.read_text())
    for cell in nb["cells"]:
        nbg = cell["metadata"].get("nbgrader", {})
        if nbg.get("grade_id") == gid:
            nbg["points"] = points
    path.write_text(json.dumps(nb, indent=1))


@pytest.fixture(scope="module")
def regraded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("regrade")
    src = tmp / "solutions"
    shutil.copytree(notebook.SOURCE_DIR, src)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("AUTOGRADER_SOURCE_DIR", str(src))
        mp.setattr(notebook, "SOURCE_DIR", src)
        subs = tmp / "course" / "submitted"
        for student, path in (
                ("ada", src / NAME / f"{NAME}.ipynb"),
                ("bob", corpus.build("a1_effect_then_key", tmp / "built", src)),
                ("cy", src / "claim_ack_reap" / "claim_ack_reap.ipynb")):
            a = path.stem
            (subs / student / a).mkdir(parents=True)
            shutil.copy(path, subs / student / a / f"{a}.ipynb")
        course = subs.parent
        [cy] = [s for s in grade_class.discover(subs)[0] if s.student == "cy"]
        grade_class.Ledger(course / "grade-class.db").record(
            cy, grade_class.grader_version("claim_ack_reap"),
            result_for("claim_ack_reap", ()))
        first = grade_class.grade_class(subs, workers=2, quick=True)
        graded = course / "autograded" / "bob" / NAME / f"{NAME}.ipynb"
        stamp = graded.stat().st_mtime_ns
        _set_points(src / NAME / f"{NAME}.ipynb", "dedup_in_tx", 3)
        dry = grade_class.grade_class(subs, dry_run=True)
        again = grade_class.grade_class(subs, workers=2, quick=True)
        return first, dry, again, stamp == graded.stat().st_mtime_ns


def test_first_grades_then_dry_run_names_only_the_changed_assignment(regraded):
    first, dry, _, _ = regraded
    assert not first.failed, first.failed
    assert sorted(k.split("@")[0] for k in first.recorded_now) == [
        f"ada/{NAME}", f"bob/{NAME}"]
    assert [k.split("@")[0] for k in first.already] == ["cy/claim_ack_reap"]
    assert sorted(line.split("@")[0] for line in dry.would) == [
        f"ada/{NAME}", f"bob/{NAME}"]
    assert all(f"would regrade, because {SOURCE}" in line for line in dry.would)
    assert not dry.recorded_now and not dry.finals, "a dry run grades nothing"


def test_regrade_names_exactly_the_students_and_checks_affected(regraded):
    _, _, again, bob_untouched = regraded
    assert not again.failed, again.failed
    [(key, text)] = again.regraded.items()
    assert key.startswith(f"ada/{NAME}@")
    lines = text.splitlines()
    assert lines[0].endswith("14/14 -> 15/15"), lines
    assert lines[1:] == ["    dedup_in_tx: 2 -> 3, worth 3 points now (was 2)",
                         f"    because {SOURCE} changed"]
    assert [k.split("@")[0] for k in again.unchanged] == [f"bob/{NAME}"]
    assert bob_untouched, "an unchanged grade's feedback is not rewritten"
    assert "cy/claim_ack_reap" in " ".join(again.already)
    assert "1 changed, 1 unchanged" in grade_class.report(again)
    ada = next(g for g in again.finals if g.student == "ada")
    assert ada.result["score"] == 15 and ada.result["max_score"] == 15


def test_an_assignments_version_leaves_out_only_the_other_judges():
    """A fix to one judge regrades that assignment only: its version holds
    its own judge and the shared code, not the other assignments' judges."""
    every = regrade.manifest()
    judges = {n: assignments.REGISTRY[n].replace(".", "/") + ".py"
              for n in assignments.names()}
    assert set(judges.values()) <= set(every), "each judge is a file of the grader"
    mine = regrade.manifest(NAME)
    assert judges[NAME] in mine and "autograder/judges/checks.py" in mine
    assert not {f for n, f in judges.items() if n != NAME} & set(mine)
    assert set(every) - set(mine) == {f for n, f in judges.items() if n != NAME} | {
        f"solutions/{n}/{n}.ipynb" for n in judges if n != NAME}
