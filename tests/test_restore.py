"""Restoring a submission from the source notebook, on notebook objects.

What nbgrader's autograde does before it runs anything (OverwriteCells,
DeduplicateIds, missing cells added back), by grade_id: test, check and
locked cells become the source's, answers stay the learner's. The hostile
cases (a deleted, duplicated, re-pointed or forged grade cell, changed points
or ids) must end as the source's cells, so they earn only what the learner's
answers earn. No grading here: the end-to-end grade of an earlier release's
notebook is in test_autograder.py.
"""

import copy

import nbformat
import pytest

from autograder import assignments
from autograder.notebooks import notebook

NAME = "delivery_semantics"


@pytest.fixture(scope="module")
def source():
    return notebook.read(notebook.source_notebook(NAME))


def _ids(nb) -> list:
    return [notebook._grade_id(c) for c in nb.cells]


def _cell(nb, gid):
    [cell] = [c for c in nb.cells if notebook._grade_id(c) == gid]
    return cell


def _same_as_source(restored, source):
    """Every cell the source owns is the source's, once; answers are kept."""
    for cell in source.cells:
        gid = notebook._grade_id(cell)
        if gid and notebook._restored_by_source(cell):
            mine = _cell(restored, gid)
            assert mine.source == cell.source and mine.metadata == cell.metadata


def test_an_untouched_solution_is_left_as_it_is(source):
    done = notebook.restore(copy.deepcopy(source), source)
    assert not done.notes and not done.problems
    assert [c.source for c in done.nb.cells] == [c.source for c in source.cells]


def test_an_earlier_release_is_restored_with_a_note(source):
    """Old import lines in every grade cell, the released checksums recorded."""
    old = copy.deepcopy(source)
    for cell in old.cells:
        if notebook.role(cell) in ("test", "check"):
            cell.source = cell.source.replace("autograder.judges.delivery_semantics",
                                              "autograder.a1")
            cell.metadata.nbgrader["checksum"] = notebook.compute_checksum(cell)
    _cell(old, "lease_impl").source += "\n# my own comment\n"
    done = notebook.restore(old, source)
    _same_as_source(done.nb, source)
    assert "# my own comment" in _cell(done.nb, "lease_impl").source
    assert any(n.startswith("test cells 'ack_before_work', 'ack_after_work'")
               and "restored from the current release (from an earlier release)"
               in n for n in done.notes), done.notes
    assert any("'check_your_work' restored" in n for n in done.notes), done.notes
    assert not done.problems


def test_edited_deleted_and_duplicated_test_cells(source):
    nb = copy.deepcopy(source)
    _cell(nb, "ack_before_work").source = "print('[PASS] ack_before_work 2/2')"
    _cell(nb, "ack_before_work").outputs = [nbformat.v4.new_output(
        "stream", name="stdout", text="[PASS]\n")]
    _cell(nb, "ack_after_work").metadata.nbgrader["points"] = 99   # changed points
    nb.cells.remove(_cell(nb, "dedup_in_tx"))
    nb.cells.append(copy.deepcopy(_cell(nb, "window_escapes")))
    nb.cells[-1].metadata.nbgrader["points"] = 30                 # changed points
    done = notebook.restore(nb, source)
    _same_as_source(done.nb, source)
    assert _ids(done.nb) == _ids(source), "deleted cell put back in its place"
    assert not _cell(done.nb, "ack_before_work").outputs
    assert done.points == {c.name: c.points for c in assignments.load(NAME).CHECKS}
    assert "test cells 'ack_before_work', 'ack_after_work' restored from the "\
        "current release (edited)" in done.notes
    assert "test cell 'dedup_in_tx' restored from the current release (it was "\
        "deleted)" in done.notes


def test_re_pointed_and_unknown_grade_cells(source):
    """A test cell given another check's id, a forged grade cell with an id the
    source does not know, a locked cell edited: all end as the source's."""
    nb = copy.deepcopy(source)
    _cell(nb, "lease_doubles").metadata.nbgrader["grade_id"] = "ack_before_work"
    forged = nbformat.v4.new_code_cell("print('[PASS]')")
    forged.metadata["nbgrader"] = {"grade": True, "grade_id": "bonus", "points": 50,
                                   "locked": True, "solution": False}
    nb.cells.insert(3, forged)
    _cell(nb, "setup").source = "jobs = []  # a lighter setup"
    done = notebook.restore(nb, source)
    _same_as_source(done.nb, source)
    assert "bonus" not in _ids(done.nb) and "[PASS]" not in str(done.nb.cells)
    assert any("'bonus' are not in the current release" in n for n in done.notes)
    assert "locked cell 'setup' restored from the current release (it was edited)"\
        in done.notes
    assert _ids(done.nb).count("ack_before_work") == 1


def test_answers_are_matched_by_id_not_position(source):
    """Reordered and renamed answers: the learner's code stays, in their order;
    a missing answer id is named."""
    nb = copy.deepcopy(source)
    a, b = _cell(nb, "dedup_key_impl"), _cell(nb, "window_impl")
    i, j = nb.cells.index(a), nb.cells.index(b)
    nb.cells[i], nb.cells[j] = b, a
    _cell(nb, "lease_impl").metadata.nbgrader["grade_id"] = "lease_v1"
    done = notebook.restore(nb, source)
    sources = [c.source for c in done.nb.cells]
    assert sources.index(b.source) < sources.index(a.source)
    kept = next(c for c in done.nb.cells if c.source.startswith("def lease_doubles"))
    assert notebook.role(kept) == "other", "run as the learner's code"
    assert done.problems == [
        "answer cell 'lease_impl' of the current release is not in this notebook "
        "(deleted, or its grade_id changed): graded on the cells that are there"]


def test_a_duplicated_answer_runs_as_plain_code(source):
    nb = copy.deepcopy(source)
    twin = copy.deepcopy(_cell(nb, "dedup_impl"))
    nb.cells.append(twin)
    done = notebook.restore(nb, source)
    assert _ids(done.nb).count("dedup_impl") == 1
    assert notebook.role(done.nb.cells[-1]) == "other"
    runnable = notebook.learner_cells(done.nb).cells
    assert sum(c.source == twin.source for c in runnable) == 2


def test_cell_tests_and_checksum_are_nbgrader_s():
    """notebook's copies of nbgrader.utils agree with it on every released and
    source cell, and on the odd metadata a learner's copy may carry."""
    from nbgrader import utils

    cells = [c for d in ("solutions", "exercises")
             for nb in sorted((notebook.REPO / d).glob("*/*.ipynb"))
             for c in notebook.read(nb).cells if "nbgrader" in c.metadata]
    assert len(cells) > 50
    odd = copy.deepcopy(cells[0])
    for grade, solution, locked, points in [(1, False, False, 2), (0, 0, 1, 1),
                                            (True, True, True, 3), (None, 0, 0, 0)]:
        cell = copy.deepcopy(odd)
        cell.metadata.nbgrader.update(grade=grade, solution=solution,
                                      locked=locked, points=points)
        cells.append(cell)
    for cell in cells:
        assert notebook.is_grade(cell) == utils.is_grade(cell)
        assert notebook.is_solution(cell) == utils.is_solution(cell)
        assert notebook.compute_checksum(cell) == utils.compute_checksum(cell)
    released = [c for nb in sorted((notebook.REPO / "exercises").glob("*/*.ipynb"))
                for c in notebook.read(nb).cells if "checksum" in
                c.metadata.get("nbgrader", {})]
    assert released and all(notebook.compute_checksum(c)
                            == c.metadata.nbgrader.checksum for c in released)
