"""Reading a submission: which assignment, were the tests touched, what to run.

A submission is a copy of a released notebook (`exercises/<name>/<name>.ipynb`)
with the solution cells filled in. The grader runs only the learner's cells
(test cells and the check cell are dropped: the grader judges from outside),
after restoring the test, check and locked cells from the source notebook by
grade_id, the way nbgrader's autograde does: an edited, deleted or outdated
test cell is a note, never a zero.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[2]          # autograder/notebooks/
# The source notebooks; AUTOGRADER_SOURCE_DIR points the grader at another
# copy (a fix being tried before it is committed, or a test's).
SOURCE_DIR = Path(os.environ.get("AUTOGRADER_SOURCE_DIR") or REPO / "solutions")
RELEASE_DIR = REPO / "exercises"
# How long one of the learner's cells may run before it is interrupted (a cell
# may set its own in metadata.autograder.timeout). nbgrader's own default for
# executing a cell (its Execute preprocessor): a scratch loop left in a notebook
# costs a class that long per submission, and a spinning one that much CPU.
CELL_TIMEOUT_S = 30
# How much CPU one of the learner's cells may use before it is interrupted. A
# loop that spins uses a core for as long as it runs, so without this it costs
# CELL_TIMEOUT_S of CPU; the heaviest cell of a reference notebook uses less
# than a second.
CELL_CPU_S = 10


# nbgrader's cell tests and checksum (`nbgrader.utils`), as nbgrader writes
# them: importing nbgrader runs its package, a Jupyter server extension with
# its database models, about 1 s CPU in every process that grades.
# tests/test_restore.py holds them equal to nbgrader's on every source cell.

def is_grade(cell) -> bool:
    return cell.metadata.get("nbgrader", {}).get("grade", False)


def is_solution(cell) -> bool:
    return cell.metadata.get("nbgrader", {}).get("solution", False)


def _is_locked(cell) -> bool:
    if "nbgrader" not in cell.metadata or is_solution(cell):
        return False
    if is_grade(cell):
        return True
    return cell.metadata["nbgrader"].get("locked", False)


def compute_checksum(cell) -> str:
    """The checksum nbgrader records in a cell's metadata when it releases it."""
    m = hashlib.md5()
    for part in (cell.source, cell.cell_type, str(is_grade(cell)),
                 str(is_solution(cell)), str(_is_locked(cell)),
                 cell.metadata.nbgrader["grade_id"]):
        m.update(part.encode("utf-8"))
    if is_grade(cell):
        m.update(str(float(cell.metadata.nbgrader["points"])).encode("utf-8"))
    return m.hexdigest()


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
    """The notebook, every field the grader reads checked (else one line)."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise SubmissionError(f"{path} is not a readable notebook: "
                              f"{str(err).splitlines()[0][:200]}") from None
    problem = (malformed(raw) if isinstance(raw, dict)
               else f"it is {_kind(raw)}, not a notebook object")
    if problem:
        raise SubmissionError(f"{path} is malformed: {problem}")
    try:
        return nbformat.reads(json.dumps(raw), as_version=4)
    except Exception as err:  # noqa: BLE001 - any other unreadable notebook
        first = str(err).strip().splitlines()[0][:200] if str(err).strip() else ""
        raise SubmissionError(f"{path} is not a readable notebook: "
                              f"{first or type(err).__name__}") from None


def _kind(value) -> str:
    return {str: "a string", list: "a list", dict: "an object", bool: "a boolean",
            int: "a number", float: "a number"}.get(type(value), "null")


def _cell_problem(cell, where: str) -> str | None:
    if not isinstance(cell, dict):
        return f"{where} is {_kind(cell)}, not a cell object"
    if cell.get("cell_type") not in ("code", "markdown", "raw"):
        return f"{where} has cell_type {cell.get('cell_type')!r}"
    source = cell.get("source", "")
    if not (isinstance(source, str) or isinstance(source, list)
            and all(isinstance(line, str) for line in source)):
        return f"{where}'s source is {_kind(source)}, not text"
    meta = cell.get("metadata", {})
    if not isinstance(meta, dict):
        return f"{where}'s metadata is {_kind(meta)}, not an object"
    if cell.get("cell_type") == "code" and not isinstance(cell.get("outputs", []),
                                                          list):
        return f"{where}'s outputs are {_kind(cell.get('outputs'))}, not a list"
    nbg = meta.get("nbgrader", {})
    if not isinstance(nbg, dict):
        return f"{where}'s nbgrader metadata is {_kind(nbg)}, not an object"
    for key in ("grade", "solution", "locked", "task"):
        if key in nbg and not isinstance(nbg[key], bool):
            return f"{where}'s nbgrader {key!r} is {_kind(nbg[key])}, not true/false"
    if "grade_id" in nbg and not isinstance(nbg["grade_id"], str):
        return f"{where}'s nbgrader grade_id is {_kind(nbg['grade_id'])}, not text"
    points = nbg.get("points", 0)
    if isinstance(points, bool) or not isinstance(points, int | float) or points < 0:
        return f"{where}'s nbgrader points are {points!r}, not a number of points"
    ours = meta.get("autograder", {})
    if not isinstance(ours, dict):
        return f"{where}'s autograder metadata is {_kind(ours)}, not an object"
    if "role" in ours and not isinstance(ours["role"], str):
        return f"{where}'s autograder role is {_kind(ours['role'])}, not text"
    return None


def malformed(nb) -> str | None:
    """What is wrong with the fields the grader reads, in one phrase, or None."""
    if not isinstance(nb.get("metadata"), dict):
        return f"its metadata is {_kind(nb.get('metadata'))}, not an object"
    ours = nb["metadata"].get("autograder", {})
    if not isinstance(ours, dict):
        return (f"metadata.autograder is {_kind(ours)}; it must be an object like "
                '{"assignment": "claim_ack_reap"}')
    if "assignment" in ours and (not isinstance(ours["assignment"], str)
                                 or not ours["assignment"]):
        return (f"metadata.autograder.assignment is {_kind(ours['assignment'])}; "
                "it must be the assignment's name")
    cells = nb.get("cells")
    if not isinstance(cells, list):
        return (f"it has no list of cells (cells is {_kind(cells)})"
                if "cells" in nb else "it has no cells")
    for index, cell in enumerate(cells):
        gid = ""
        with contextlib.suppress(AttributeError, KeyError, TypeError):
            gid = cell["metadata"]["nbgrader"]["grade_id"]
        where = (f"cell {index + 1}" + (f" ({gid!r})" if isinstance(gid, str) and gid
                                        else ""))
        problem = _cell_problem(cell, where)
        if problem:
            return problem
    return None


def _owner_of_tests(nb) -> str | None:
    """The one assignment whose checks the notebook's test cells are, if any."""
    from autograder import assignments

    ids = {c.metadata.nbgrader.get("grade_id") for c in nb.cells
           if role(c) == "test"}
    owners = [n for n in assignments.names()
              if ids and ids <= set(assignments.points(n))]
    return owners[0] if len(owners) == 1 else None


def identify(nb, path: Path, expected: str | None = None) -> tuple[str, str]:
    """(assignment to grade as, a line to report or ""); refuses a wrong one.

    With `expected` (nbgrader's assignment, or `--assignment`), a notebook whose
    metadata or test cells belong to another assignment is refused. Without
    it, a file name that disagrees with the metadata is reported.
    """
    from autograder import assignments

    claimed = nb.metadata.get("autograder", {}).get("assignment")
    by_tests = _owner_of_tests(nb)
    if expected is not None:
        if expected not in assignments.names():
            raise SubmissionError(f"unknown assignment {expected!r}; known: "
                                  f"{', '.join(assignments.names())}")
        for other, how in ((claimed, "its metadata"), (by_tests, "its test cells")):
            if other and other != expected:
                raise SubmissionError(
                    f"{path.name} is a notebook of {other} ({how} say so), not of "
                    f"{expected}: refused")
        return expected, ""
    name = claimed or path.stem
    if name not in assignments.names():
        raise SubmissionError(
            f"{path.name}: no assignment named {name!r} (from "
            f"{'its metadata' if claimed else 'its file name'}); known: "
            f"{', '.join(assignments.names())}")
    if by_tests and by_tests != name:
        raise SubmissionError(f"{path.name} says it is {name} but its test cells "
                              f"are those of {by_tests}: refused")
    if claimed and claimed != path.stem:
        return name, (f"graded as {claimed} (named in the notebook's metadata), "
                      f"although the file is {path.name}; give --assignment NAME "
                      "to insist on one")
    return name, ""


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


def _restored_by_source(cell) -> bool:
    """Cells the source owns: grade cells that are not answers, locked, check."""
    nbg = cell.metadata.get("nbgrader", {})
    return role(cell) in ("test", "check") or (bool(nbg.get("locked"))
                                               and not nbg.get("solution"))


def _cell_kind(cell) -> str:
    return "test cell" if role(cell) == "test" else "locked cell"


def _why_differs(mine) -> str:
    """'from an earlier release' if the cell matches the checksum it was
    released with (only wording: a forged checksum changes nothing else)."""
    recorded = mine.metadata.get("nbgrader", {}).get("checksum")
    return ("from an earlier release" if recorded
            and recorded == compute_checksum(mine) else "edited")


@dataclass
class Restored:
    """The notebook as graded, and what restoring it changed."""

    nb: object
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    points: dict[str, float] = field(default_factory=dict)   # the source's


def _say(kind: str, ids: list[str], how: str) -> str:
    names = ", ".join(repr(i) for i in ids)
    return (f"{kind}{'s' if len(ids) > 1 else ''} {names} restored from the current "
            f"release ({how})")


def restore(nb, source) -> Restored:
    """What nbgrader's OverwriteCells (with add_missing_cells) does, by grade_id.

    The learner's cells stay in their order. A cell whose grade_id is one the
    source owns (test, check, locked) becomes the source's cell, whatever the
    learner's copy says; later copies of an id are dropped (answers: kept as
    plain code, like nbgrader's DeduplicateIds); a source-owned cell missing
    from the notebook is put back after the cell that precedes it in the
    source. A grade or locked cell the source does not know is left out; an
    answer cell it does not know stays as the learner's code.
    """
    owned = {_grade_id(c): c for c in source.cells
             if _grade_id(c) and _restored_by_source(c)}
    answers = [_grade_id(c) for c in source.cells
               if _grade_id(c) and is_solution(c)]
    out = nbformat.v4.new_notebook(metadata=copy.deepcopy(nb.metadata))
    seen: set[str] = set()
    changed: dict[tuple[str, str], list[str]] = {}
    dropped: list[str] = []
    for cell in nb.cells:
        gid = _grade_id(cell)
        mine = copy.deepcopy(cell)
        if gid in owned:
            if gid in seen:
                continue
            theirs = owned[gid]
            if (compute_checksum(mine) != compute_checksum(theirs)
                    or mine.cell_type != theirs.cell_type):
                changed.setdefault((_cell_kind(theirs), _why_differs(mine)),
                                   []).append(gid)
            mine = copy.deepcopy(theirs)
        elif gid in answers and gid not in seen:
            mine.metadata["nbgrader"] = copy.deepcopy(_source_cell(source, gid)
                                                      .metadata["nbgrader"])
        elif "nbgrader" in mine.metadata:
            if not is_solution(mine) and (is_grade(mine) or mine.metadata[
                    "nbgrader"].get("locked")):
                if gid:
                    dropped.append(gid)
                continue
            del mine.metadata["nbgrader"]       # a duplicate or unknown answer
            mine.metadata.get("autograder", {}).pop("role", None)
        if _grade_id(mine):
            seen.add(gid)
        out.cells.append(mine)
    deleted = _put_back(out, source, owned, seen)
    notes = [_say(kind, ids, f"it was {how}" if len(ids) == 1 else how)
             for (kind, how), ids in changed.items()]
    if dropped:
        notes.append(f"grade or locked cell(s) {', '.join(map(repr, dropped))} "
                     "are not in the current release: left out")
    for kind in ("test cell", "locked cell"):
        ids = [g for g in deleted if _cell_kind(owned[g]) == kind]
        if ids:
            notes.append(_say(kind, ids, "it was deleted" if len(ids) == 1
                              else "they were deleted"))
    missing = [a for a in answers if a not in seen]
    return Restored(out, notes, [
        f"answer cell{'s' if len(missing) > 1 else ''} "
        f"{', '.join(map(repr, missing))} of the current release "
        f"{'are' if len(missing) > 1 else 'is'} not in this notebook (deleted, or "
        "its grade_id changed): graded on the cells that are there"] if missing
                    else [], {gid: c.metadata.nbgrader.get("points", 0)
                              for gid, c in owned.items() if role(c) == "test"})


def for_grading(nb, name: str) -> Restored:
    """The notebook to grade: `restore`d from the assignment's source notebook."""
    source = source_notebook(name)
    if source is None:
        return Restored(nb, [], ["the source notebook is not available, so test "
                                 "cells were not restored from it"])
    return restore(nb, read(source))


def _source_cell(source, gid: str):
    return next(c for c in source.cells if _grade_id(c) == gid)


def _put_back(out, source, owned: dict, seen: set[str]) -> list[str]:
    """Insert the source-owned cells `out` lacks; return their ids."""
    deleted, previous = [], None
    for cell in source.cells:
        gid = _grade_id(cell)
        if gid in owned and gid not in seen:
            at = 0
            if previous is not None:
                at = 1 + next(i for i, c in enumerate(out.cells)
                              if _grade_id(c) == previous)
            out.cells.insert(at, copy.deepcopy(cell))
            deleted.append(gid)
            seen.add(gid)
        if gid in seen:
            previous = gid
    return deleted


def learner_cells(nb):
    """The notebook without its test cells and check cell: what the learner wrote."""
    out = nbformat.v4.new_notebook(metadata=nb.metadata)
    out.cells = [c for c in nb.cells if role(c) not in ("test", "check")]
    for c in out.cells:
        if c.cell_type == "code":
            c.outputs, c.execution_count = [], None
    return out
