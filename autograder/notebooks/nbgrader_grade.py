"""nbgrader's autograde step, graded outside the learner's kernel.

nbgrader normally runs every cell, grade cells included, in one kernel, so a
learner's cell can replace the `check` a grade cell calls. Configured in
`nbgrader_config.py` in place of nbgrader's `Execute`, this preprocessor never
starts a kernel in nbgrader's process: it hands the (sanitised) notebook to
`autograder.grade.grade`, which runs the learner's cells in the sandbox and
judges from outside, then writes each grade cell's outcome as that cell's
output: a `[PASS]` line, or an error with what to fix. nbgrader's
`SaveAutoGrades` reads those outputs, so its points are the grader's points.
The learner's cells get the outputs of their sandboxed run; the check cell
gets the whole report. The notebook returned is the one graded, restored from
the source (`notebook.restore`): a test cell the learner deleted is put back
with its outcome, so both routes give the same points.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import nbformat
from nbgrader.preprocessors import NbGraderPreprocessor

from autograder import assignments
from autograder.grade import grade
from autograder.judges.checks import GradeResult
from autograder.notebooks import notebook
from autograder.notebooks.feedback import efficiency, figures

MARK = "graded outside the notebook's kernel by `python -m autograder grade`"


def _stdout(text: str):
    return nbformat.v4.new_output("stream", name="stdout", text=text + "\n")


def _error(text: str):
    return nbformat.v4.new_output("error", ename="AssertionError", evalue=text,
                                  traceback=[text])


def _pictures(outcomes) -> list:
    """The failing runs drawn (an HTML output), so nbgrader's feedback has them."""
    html = figures(outcomes)
    if not html:
        return []
    return [nbformat.v4.new_output("display_data", data={"text/html": html})]


def write_outcomes(nb, result: GradeResult | None, reason: str = "",
                   executed=None) -> None:
    """Each grade cell's output from `result` (or `reason` when it could not run)."""
    by_name = {o.name: o for o in result.outcomes} if result else {}
    ran_cells = executed.cells if executed is not None else []
    learner = iter([c for c in ran_cells if c.cell_type == "code"])
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        kind = notebook.role(cell)
        if kind == "test":
            gid = cell.metadata.nbgrader.get("grade_id")
            o = by_name.get(gid)
            if result is None:
                cell.outputs = [_error(f"{gid}: not graded: {reason}")]
            elif o is None:
                cell.outputs = [_error(f"{gid}: the grader has no check of this "
                                       f"name for {result.assignment}")]
            elif o.ok:
                cell.outputs = [_stdout(f"[PASS] {o.name}  {o.points}/"
                                        f"{o.max_points}  {o.title}\n({MARK})")]
            else:
                cell.outputs = [_error(o.explain() + f"\n({MARK})")]
                cell.outputs += _pictures([o])
        elif kind == "check":
            text = result.text() if result else f"not graded: {reason}"
            cell.outputs = [_stdout(text)]
            cell.outputs += _pictures(result.outcomes if result else [])
            cost = efficiency(result.efficiency, result.score == result.max_score
                              ) if result else ""
            if cost:
                cell.outputs.append(nbformat.v4.new_output(
                    "display_data", data={"text/html": cost}))
        else:
            ran = next(learner, None)
            cell.outputs = list(ran.get("outputs", [])) if ran is not None else []
        cell.execution_count = None


class GradeOutsideKernel(NbGraderPreprocessor):
    """Replaces nbgrader's Execute: the grader's verdicts become the outputs."""

    def preprocess(self, nb, resources):
        info = resources.get("nbgrader", {})
        # nbgrader's assignment (else the notebook's name) is the one expected.
        named = [n for n in (info.get("assignment"), info.get("notebook"))
                 if n in assignments.names()]
        assignment = named[0] if named else None
        with tempfile.TemporaryDirectory(prefix="eo-nbgrader-") as tmp:
            path = Path(tmp) / f"{info.get('notebook') or assignment}.ipynb"
            nbformat.write(nb, str(path))
            executed_path = Path(tmp) / "executed.ipynb"
            result, reason, executed = None, "", None
            try:
                result = grade(path, assignment=assignment,
                               executed_copy=executed_path,
                               progress=lambda m: self.log.info("autograder: %s", m))
            except (notebook.SubmissionError, KeyError) as err:
                reason = str(err)
            if executed_path.exists():
                executed = nbformat.read(str(executed_path), as_version=4)
        if result is not None:     # the cells as graded: deleted ones put back
            nb = notebook.for_grading(nb, result.assignment).nb
        write_outcomes(nb, result, reason, executed)
        if result is not None:
            self.log.info("autograder: %s scored %d/%d", result.submission,
                          result.score, result.max_score)
            for p in result.problems:
                self.log.warning("autograder: %s", p)
            for n in result.notes:
                self.log.info("autograder: %s", n)
        return nb, resources
