"""The export of a term: Canvas's gradebook import, the per-check detail, the
late policy from the course config, and the late penalty in the feedback.

A small class is written as files (nbgrader's submitted/<student>/<assignment>/
with timestamp.txt), its grades put into the ledger as a grading run would
record them, and `grade_class` run over it: everything is recorded already,
so nothing is graded and the run only writes its outputs.
"""

import csv
import shutil
from datetime import datetime

import pytest

from autograder import assignments, cli
from autograder.classroom import export, grade_class, term
from autograder.notebooks import notebook

DUE = "2026-10-12 23:59:00 UTC"
CANVAS_ID = 4242          # Canvas's id for claim_ack_reap; none for the other
CLASS = {   # student -> assignment -> (checks failed, submitted at, UTC)
    "ada": {"claim_ack_reap": ((), "2026-10-12 20:00:00 UTC"),
            "delivery_semantics": (("dedup_in_tx",), "2026-10-01 09:00:00 UTC")},
    "bob": {"claim_ack_reap": (("zombie_ack_refused", "chaos_no_stale_ack"),
                               "2026-10-14 08:00:00 UTC")},       # 2 days late
    "cy": {"delivery_semantics": ((), None)},                      # no timestamp
}


def result_for(name: str, failed) -> dict:
    """A ledger result as `autograder grade --json` gives it."""
    checks = [{"name": c.name, "title": c.title, "max_points": c.points,
               "ok": c.name not in failed, "points": 0 if c.name in failed
               else c.points, "message": "broke" if c.name in failed else ""}
              for c in assignments.load(name).CHECKS]
    return {"assignment": name, "score": sum(c["points"] for c in checks),
            "max_score": sum(c["max_points"] for c in checks), "checks": checks,
            "problems": [], "notes": []}


def write_class(course):
    (course / "nbgrader_config.py").write_text(
        "c = get_config()\n"
        f"c.Term.due = {{'claim_ack_reap': {DUE!r}}}\n"
        "c.Term.late_penalty_per_day = 0.1\n"
        f"c.Term.canvas_assignment_ids = {{'claim_ack_reap': {CANVAS_ID}}}\n")
    for student, subs in CLASS.items():
        for name, (_, when) in subs.items():
            folder = course / "submitted" / student / name
            folder.mkdir(parents=True)
            shutil.copy(notebook.source_notebook(name), folder / f"{name}.ipynb")
            if when:
                (folder / "timestamp.txt").write_text(when)


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    course = tmp_path_factory.mktemp("term")
    write_class(course)
    subs, _ = grade_class.discover(course / "submitted")
    ledger = grade_class.Ledger(course / "grade-class.db")
    for s in subs:
        ledger.record(s, grade_class.grader_version(s.assignment),
                      result_for(s.assignment, CLASS[s.student][s.assignment][0]))
    run = grade_class.grade_class(course / "submitted", course=course)
    return course, run


def _rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


def test_canvas_import_has_its_header_and_one_row_per_student(exported):
    course, run = exported
    rows = _rows(course / "grades-canvas.csv")
    names = ["delivery_semantics", "claim_ack_reap"]      # the registry's order
    # Canvas matches a column by "name (id)": with the id, no matching by hand.
    assert rows[0] == export.CANVAS_HEADER + [
        "delivery_semantics", f"claim_ack_reap ({CANVAS_ID})"]
    assert rows[1][0].strip() == "Points Possible"
    assert rows[1][5:] == [str(sum(assignments.points(n).values())) for n in names]
    assert [r[3] for r in rows[2:]] == sorted(CLASS), "SIS Login ID per student"
    assert len(run.already) == 4 and not run.recorded_now, "nothing graded again"


def test_the_late_penalty_is_applied_and_shown(exported):
    course, _ = exported
    by = {r[3]: r for r in _rows(course / "grades-canvas.csv")[2:]}
    full = sum(assignments.points("claim_ack_reap").values())
    bob = result_for("claim_ack_reap", CLASS["bob"]["claim_ack_reap"][0])["score"]
    assert float(by["ada"][6]) == full, "on time: no penalty"
    assert float(by["bob"][6]) == pytest.approx(bob - 2 * 0.1 * full)
    assert by["cy"][6] == "" and by["bob"][5] == "", "not submitted: left blank"
    ds = result_for("delivery_semantics", ("dedup_in_tx",))["score"]
    assert float(by["ada"][5]) == ds, "no due date: no penalty"
    graded = (course / "autograded" / "bob" / "claim_ack_reap" /
              "claim_ack_reap.ipynb")
    assert "submitted 2 day(s) late" in graded.read_text()
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        nb = gb.find_submission_notebook("claim_ack_reap", "claim_ack_reap", "bob")
        assert nb.late_submission_penalty == pytest.approx(2 * 0.1 * full)


def test_detail_has_one_row_per_check(exported):
    course, _ = exported
    rows = _rows(course / "grades-checks.csv")
    assert rows[0] == export.DETAIL_HEADER
    expected = sum(len(assignments.load(a).CHECKS) for subs in CLASS.values()
                   for a in subs)
    assert len(rows) == 1 + expected
    failed = {(r[0], r[2]) for r in rows[1:] if r[5] == "0"}
    assert failed == {(s, c) for s, subs in CLASS.items() for fails, _ in
                      subs.values() for c in fails}


def test_late_rules_and_bad_config(tmp_path, capsys):
    rules = term.Term({"a": datetime(2026, 1, 1)}, 0.25)
    assert term.late(rules, "a", datetime(2026, 1, 1), 10, 10).penalty == 0
    assert term.late(rules, "a", datetime(2026, 1, 1, 0, 1), 10, 10).days == 1
    assert term.late(rules, "a", datetime(2026, 1, 9), 3, 10).penalty == 3, \
        "never more than the score"
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.Term.due = {'a': 'next friday-ish'}\n")
    (tmp_path / "submitted").mkdir()
    assert cli.main(["grade-class", str(tmp_path / "submitted")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "is not a date and time" in err, err


def test_grade_class_prints_and_writes_item_statistics(exported):
    course, run = exported
    text = grade_class.report(run)
    assert "item statistics:" in text and "claim_ack_reap: pass rates" in text
    assert "zombie_ack_refused 50%" in text, text
    assert "## claim_ack_reap: 2 submission(s)" in (course / "item-stats.md"
                                                    ).read_text()
    assert str(course / "grades-canvas.csv") in text


def test_the_run_warns_of_unmapped_columns_and_a_double_late_penalty(exported):
    _, run = exported
    text = grade_class.report(run)
    unmapped = [w for w in run.warnings if "no Canvas assignment id" in w]
    assert len(unmapped) == 1 and "delivery_semantics" in unmapped[0], run.warnings
    assert "claim_ack_reap" not in unmapped[0].split(".")[0], "it has an id"
    twice = [w for w in run.warnings if "already include the late penalty" in w]
    assert len(twice) == 1 and "late policy" in twice[0], run.warnings
    for w in run.warnings:
        assert f"warning: {w}" in text


def test_no_warning_when_every_column_has_an_id_and_no_penalty():
    rules = term.Term({}, 0.0, {"claim_ack_reap": 7})
    sub = type("Sub", (), {"assignment": "claim_ack_reap", "student": "ada"})()
    final = export.Final(sub, result_for("claim_ack_reap", ()), term.Late())
    assert export.warnings([final], rules) == []
    assert export.column("claim_ack_reap", rules) == "claim_ack_reap (7)"
    assert export.column("heartbeats", rules) == "heartbeats"


def test_a_canvas_id_that_is_not_a_number_is_refused(tmp_path):
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.Term.canvas_assignment_ids = {'a': 'Quiz 1'}\n")
    with pytest.raises(term.TermError, match="canvas_assignment_ids"):
        term.load(tmp_path)
    (tmp_path / "nbgrader_config.py").write_text(
        "c = get_config()\nc.Term.canvas_assignment_ids = {'a': '12'}\n")
    assert term.load(tmp_path).canvas_ids == {"a": 12}
