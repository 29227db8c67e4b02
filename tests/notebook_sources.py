"""The module a source notebook's `%%writefile` solution cell writes, as text.

Tests grade that text (and copies of it with one deliberate mistake), so the
solution lives in one place: the notebook.
"""

from pathlib import Path

import nbformat

SOLUTIONS = Path(__file__).resolve().parent.parent / "solutions"


def solution_module(assignment: str, grade_id: str) -> str:
    nb = nbformat.read(str(SOLUTIONS / assignment / f"{assignment}.ipynb"),
                       as_version=4)
    cell = next(c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id)
    lines = cell.source.splitlines()
    assert lines[0].startswith("%%writefile"), lines[0]
    return "\n".join(line for line in lines[1:]
                     if line.strip() not in ("### BEGIN SOLUTION",
                                             "### END SOLUTION")) + "\n"


def mistake(source: str, old: str, new: str) -> str:
    """The solution with one change; fails loudly if the solution moved on."""
    assert source.count(old) == 1, f"the solution no longer contains:\n{old}"
    return source.replace(old, new)
