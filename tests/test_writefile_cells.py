"""Notebooks of `%%writefile` cells run without a kernel, as a kernel runs them.

The runner (`autograder.notebooks.run_notebook`) writes such cells itself; a
notebook run both ways must leave the same files, byte for byte, and show the
same outputs, or the grade would judge another module than the learner's
kernel wrote.
"""

import json
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder import assignments
from autograder.notebooks import notebook, writefile_cells

# Each is a way IPython's input transformer changes a cell before the magic
# sees it (whitespace-only lines emptied, prompts stripped, CRLF, no final
# newline), or a way the magic itself behaves (append, overwrite, a failure).
CELLS = [
    "%%writefile a.py\nx = 1\n    \n\tdef f():\n\t    return 'héllo wörld'\n",
    "%%writefile -a a.py\n# appended\n",
    "%%writefile b.txt\nno final newline",
    "%%writefile  c.py  \r\nwindows = 1\r\n",
    "%%writefile d.py\n>>> x = 1\n... y\nz\n",
    "%%writefile e.py\n  an indented body\n  stays indented\n",
    "%%writefile --append f.py\nnew\n",
    "%%writefile a.py\nrewritten\n",
    "%%writefile g.py -a\nafter the name\n",
    "%%writefile --app g.py\nabbreviated\n",
    "%%writefile adir\nthis is a folder\n",
]


def _run(folder: Path, cells: list[str], *flags: str) -> tuple[dict, dict]:
    folder.mkdir()
    (folder / "adir").mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("the learner's words")]
    nb.cells += [nbformat.v4.new_code_cell(c) for c in cells]
    nbformat.write(nb, str(folder / "in.ipynb"))
    subprocess.run([sys.executable, "-m", "autograder.notebooks.run_notebook",
                    "in.ipynb", "out.ipynb", "summary.json", "--cell-timeout", "60",
                    *flags], cwd=folder, check=True, timeout=120)
    summary = json.loads((folder / "summary.json").read_text())
    files = {p.name: p.read_bytes() for p in folder.iterdir()
             if p.is_file() and p.suffix != ".ipynb" and p.name != "summary.json"}
    ran = nbformat.read(str(folder / "out.ipynb"), as_version=4)
    nbformat.validate(ran)
    outputs = [(c.execution_count, [_seen(o) for o in c.outputs])
               for c in ran.cells if c.cell_type == "code"]
    return summary, {"files": files, "outputs": outputs}


def _seen(output) -> tuple:
    """What a reader sees of an output (a kernel's traceback has more lines)."""
    if output.output_type == "error":
        return ("error", output.ename, output.evalue)
    return (output.output_type, output.get("name"), output.get("text"))


def test_writefile_cells_leave_what_a_kernel_leaves(tmp_path):
    kernel_summary, by_kernel = _run(tmp_path / "kernel", CELLS, "--kernel")
    summary, written = _run(tmp_path / "written", CELLS)
    assert "kernel" not in kernel_summary and summary["kernel"] is False
    assert written == by_kernel
    assert set(written["files"]) == {"a.py", "b.txt", "c.py", "d.py", "e.py", "f.py",
                                     "g.py"}
    assert written["files"]["d.py"] == b"x = 1\ny\nz\n"       # IPython's doing
    assert [(e["cell"], e["ename"]) for e in summary["errors"]] == [
        (e["cell"], e["ename"]) for e in kernel_summary["errors"]] == [
        ("cell 12", "IsADirectoryError")]
    assert summary["executed"] == kernel_summary["executed"] == len(CELLS)


@pytest.mark.parametrize("cell", [
    "print('scratch work')",
    "%%writefile {name}.py\nx = 1\n",          # IPython expands the name
    "%%writefile ~/x.py\nx = 1\n",
    "%%writefile ../x.py\nx = 1\n",
    "%%writefile 'quoted.py'\nx = 1\n",
    "%%writefile x.py\n",                     # an empty body: a UsageError
    "%%writefile x.py y.py\nx = 1\n",
    "%%writefile?\n",
    "%%writefilex x.py\nx = 1\n",
    "  %%writefile x.py\nx = 1\n",
    "%%writefile x.py\u00a0-a\nx = 1\n",       # one name to IPython, not two words
    "%%writefile -a\u3000x.py\nx = 1\n",
    "%%writefile x.py --bogus\nx = 1\n",
    "%%writefile kernel-1\nx = 1\n",          # a kernel's socket is there
    {"source": "%%writefile x.py\nx = 1\n", "metadata": {"tags": ["skip-execution"]}},
])
def test_any_other_code_cell_needs_a_kernel(cell):
    cell = {"source": cell} if isinstance(cell, str) else cell
    cells = [{"cell_type": "code", "source": "%%writefile ok.py\nx = 1\n"},
             {"cell_type": "code", **cell}]
    assert writefile_cells.plan(cells[:1]) == [(0, "ok.py", False, "x = 1\n")]
    assert writefile_cells.plan(cells) is None


def test_a_notebook_with_scratch_code_still_runs_in_a_kernel(tmp_path):
    summary, ran = _run(tmp_path / "mixed", ["%%writefile m.py\nx = 1\n",
                                             "print(open('m.py').read() * 2)"])
    assert "kernel" not in summary and summary["executed"] == 2
    assert ran["outputs"][1] == (2, [("stream", "stdout", "x = 1\nx = 1\n\n")])


def test_the_released_assignments_but_one_need_no_kernel():
    """What the cheap path is for: each queue assignment's learner cells."""
    cheap = set()
    for name in assignments.names():
        nb = notebook.for_grading(notebook.read(notebook.source_notebook(name)),
                                  name).nb
        cells = notebook.learner_cells(nb).cells
        if writefile_cells.plan(cells) and not getattr(
                assignments.load(name), "observe_cell", None):
            cheap.add(name)
    assert cheap == set(assignments.names()) - {"delivery_semantics"}
