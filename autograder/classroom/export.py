"""Grades out of the ledger, for an LMS gradebook and for the instructor.

`grades-canvas.csv` is Canvas's gradebook import format: the columns
`Student, ID, SIS User ID, SIS Login ID, Section`, then one column per
assignment, a "Points Possible" row first, then one row per student. Canvas
matches a row by ID (nbgrader's `lms_user_id`, when the gradebook has one) or
by SIS Login ID (the nbgrader student id), and a column by the "name (id)" in
its header: with the course config's `c.Term.canvas_assignment_ids` the header
is `claim_ack_reap (12345)` and the scores go to that assignment; without an
id it is the bare name, and Canvas's import page asks the instructor which
assignment the column is (or creates a new one). `warnings()` says which.

A score is after the late penalty (`autograder.classroom.term`); an assignment
a student did not submit is left blank, so the import changes nothing there.
Because the penalty is already in the score, Canvas's own late policy on the
same assignments would take points off a second time: `warnings()` says so
whenever the course config has a late penalty.

`grades-checks.csv`, beside it, has one row per student, assignment and
check: the points, and why a check failed.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from autograder import assignments
from autograder.classroom import term

CANVAS_HEADER = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
POINTS_POSSIBLE = "    Points Possible"


@dataclass(frozen=True)
class Final:
    """One submission's grade as it counts: the ledger's, less the late penalty."""

    sub: object                # grade_class.Submission
    result: dict
    late: term.Late

    @property
    def student(self) -> str:
        return self.sub.student

    @property
    def assignment(self) -> str:
        return self.sub.assignment

    @property
    def score(self) -> float:
        return round(self.result["score"] - self.late.penalty, 2)


def finals(subs, ledger, graders: dict[str, str], rules: term.Term) -> list[Final]:
    """The graded submissions (by the current grader versions, per assignment),
    with their late penalties."""
    out = []
    for s in subs:
        result = ledger.result(s, graders[s.assignment])
        if result is None:
            continue
        late = term.late(rules, s.assignment, term.submitted_at(s.path.parent),
                         result["score"], result["max_score"])
        out.append(Final(s, result, late))
    return out


def _people(course: Path) -> dict[str, tuple[str, str]]:
    """student id -> (name, LMS id) from nbgrader's gradebook, if there is one."""
    db = course / "gradebook.db"
    if not db.is_file():
        return {}
    from nbgrader.api import Gradebook

    with Gradebook(f"sqlite:///{db}") as gb:
        return {s.id: (" ".join(p for p in (s.first_name, s.last_name) if p),
                       s.lms_user_id or "") for s in gb.students}


def _points(x: float) -> str:
    return f"{x:g}"


def _names(grades: list[Final]) -> list[str]:
    """The assignments with a grade, in the registry's order."""
    return [a for a in assignments.names() if any(g.assignment == a
                                                  for g in grades)]


def column(name: str, rules: term.Term | None = None) -> str:
    """An assignment's column header: "name (Canvas id)" when the id is known."""
    cid = rules.canvas_ids.get(name) if rules else None
    return f"{name} ({cid})" if cid else name


def write_canvas(path: Path, grades: list[Final], course: Path,
                 rules: term.Term | None = None) -> None:
    names = _names(grades)
    people = _people(course)
    by = {(g.student, g.assignment): g for g in grades}
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(CANVAS_HEADER + [column(a, rules) for a in names])
        w.writerow([POINTS_POSSIBLE, "", "", "", ""] + [
            _points(max(g.result["max_score"] for g in grades if g.assignment == a))
            for a in names])
        for student in sorted({g.student for g in grades}):
            name, lms_id = people.get(student, ("", ""))
            w.writerow([name or student, lms_id, "", student, ""] + [
                _points(by[student, a].score) if (student, a) in by else ""
                for a in names])


DETAIL_HEADER = ["student", "assignment", "check", "points", "max_points", "ok",
                 "why", "late_penalty", "score_counted", "max_score"]


def write_detail(path: Path, grades: list[Final]) -> None:
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(DETAIL_HEADER)
        for g in sorted(grades, key=lambda g: (g.student, g.assignment)):
            for c in g.result["checks"]:
                w.writerow([g.student, g.assignment, c["name"], c["points"],
                            c["max_points"], int(c["ok"]),
                            c.get("message", "").splitlines()[0][:300]
                            if c.get("message") else "",
                            _points(g.late.penalty), _points(g.score),
                            g.result["max_score"]])


def warnings(grades: list[Final], rules: term.Term) -> list[str]:
    """What the instructor must know before importing grades-canvas.csv."""
    out = []
    unmapped = [a for a in _names(grades) if a not in rules.canvas_ids]
    if unmapped:
        out.append(
            "grades-canvas.csv: no Canvas assignment id for "
            + ", ".join(unmapped) + ". Canvas matches a column by \"name (id)\", "
            "so its import will ask you which assignment each of these columns "
            "is (or create a new one). To skip that, put each id (the number "
            "in the assignment's Canvas address) in nbgrader_config.py: "
            "c.Term.canvas_assignment_ids = {\"" + unmapped[0] + "\": 12345}.")
    if rules.late_penalty_per_day > 0:
        out.append(
            "grades-canvas.csv: the scores already include the late penalty "
            f"({rules.late_penalty_per_day:.0%} a day). Turn off Canvas's own "
            "late policy (Gradebook settings, Late Policies) for these "
            "assignments, or set c.Term.late_penalty_per_day = 0 and let Canvas "
            "apply it: with both, a late student loses points twice.")
    return out


def export(course: Path, grades: list[Final], rules: term.Term | None = None
           ) -> tuple[Path, Path]:
    """Write both CSVs into the course folder; return their paths."""
    canvas, detail = course / "grades-canvas.csv", course / "grades-checks.csv"
    write_canvas(canvas, grades, course, rules)
    write_detail(detail, grades)
    return canvas, detail
