"""Reading a submission: which assignment, were the tests touched, what to run.

A submission is a copy of a released notebook (`exercises/<name>/<name>.ipynb`)
with the solution cells filled in. The grader runs only the learner's cells
(test cells and the check cell are dropped: the grader judges from outside),
and compares every test cell with the source notebook the way nbgrader does,
by `nbgrader.utils.compute_checksum`.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
from nbgrader.utils import compute_checksum, is_grade, is_solution

REPO = Path(__file__).resolve().parent.parent
SOURCE_DIR = REPO / "solutions"
RELEASE_DIR = REPO / "exercises"


class SubmissionError(Exception):
    """The path is not a notebook the grader knows how to grade."""


def resolve(path: str | Path) -> Path:
    """A notebook path, or the single notebook of an assignment folder."""
    p = Path(path)
    if p.is_dir():
        nbs = sorted(x for x in p.glob("*.ipynb")
                     if ".ipynb_checkpoints" not in x.parts)
        if len(nbs) != 1:
            raise SubmissionError(f"{p} holds {len(nbs)} notebooks; give the one "
                                  "to grade")
        return nbs[0]
    if not p.is_file():
        raise SubmissionError(f"no notebook at {p}")
    if p.suffix != ".ipynb":
        raise SubmissionError(f"{p} is not a notebook (.ipynb)")
    return p


def read(path: Path):
    try:
        return nbformat.read(str(path), as_version=4)
    except Exception as err:  # noqa: BLE001 - any unreadable file
        raise SubmissionError(f"{path} is not a readable notebook: {err}") from None


def assignment_of(nb, path: Path) -> str:
    """From the notebook's metadata, else its file name."""
    meta = nb.metadata.get("autograder", {}).get("assignment")
    return meta or path.stem


def source_notebook(name: str) -> Path | None:
    p = SOURCE_DIR / name / f"{name}.ipynb"
    return p if p.exists() else None


def role(cell) -> str:
    """'test' (a grade cell that is not an answer), 'check', 'answer' or 'other'."""
    if cell.metadata.get("autograder", {}).get("role") == "check":
        return "check"
    if "nbgrader" in cell.metadata:
        if is_grade(cell) and not is_solution(cell):
            return "test"
        if is_solution(cell):
            return "answer"
    return "other"


def _grade_id(cell) -> str | None:
    return cell.metadata.get("nbgrader", {}).get("grade_id")


def integrity(nb, source) -> dict[str, str]:
    """Test cells that were edited or deleted: grade_id -> what happened."""
    mine = {_grade_id(c): c for c in nb.cells if role(c) == "test"}
    problems = {}
    for cell in source.cells:
        if role(cell) != "test":
            continue
        gid = _grade_id(cell)
        if gid not in mine:
            problems[gid] = f"the test cell {gid!r} was deleted"
        elif compute_checksum(mine[gid]) != compute_checksum(cell):
            problems[gid] = (f"the test cell {gid!r} was edited (its checksum differs "
                             "from the source); test cells are read-only: restore "
                             "it from the released notebook")
    return problems


def learner_cells(nb):
    """The notebook without its test cells and check cell: what the learner wrote."""
    out = nbformat.v4.new_notebook(metadata=nb.metadata)
    out.cells = [c for c in nb.cells if role(c) not in ("test", "check")]
    for c in out.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    return out
