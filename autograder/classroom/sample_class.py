"""A class of one assignment mixed as a real one is, to grade at scale.

`compose(submitted, n)` writes n submissions of claim_ack_reap in nbgrader's
submitted/<student>/<assignment>/ layout: a third correct (the solution, and
the corpus's correct notebooks written differently), a third wrong (the
corpus's wrong notebooks, and every wrong queue of the module corpus put in
the notebook's module cell, as a learner would have written it there), and a
third untouched (the release), broken (a syntax error, an exit on import, a
file cut short) or hanging (a scratch cell that spins, one that sleeps). The
students come in a shuffled order, as a real class's kinds do.

`python -m autograder bench --class N` grades such a class and says what it
cost (`autograder.classroom.class_bench`). A wrong queue that imports another
of the corpus's modules besides its base cannot be one module cell: it is left
out.
"""

from __future__ import annotations

import ast
import importlib.util
import random
from collections.abc import Callable
from pathlib import Path

import nbformat

from autograder.judges import corpus
from autograder.notebooks import notebook

ASSIGNMENT = "claim_ack_reap"
MODULE_CELL = "myqueue"                     # the answer cell that writes myqueue.py
QUEUES = corpus.CORPUS
BASE = "mini_correct"                       # what each wrong queue star-imports
BROKEN = ("a2_syntax_error", "a2_sys_exit_on_import")
HANGS = {"spins": "while True:\n    pass\n",
         "sleeps": "import time\nwhile True:\n    time.sleep(1)\n"}
KINDS = ("correct", "wrong", "untouched", "broken", "hanging")


def _bugs():
    """The corpus of wrong and correct notebooks (tests/corpus/submissions)."""
    path = corpus.ROOT / "submissions" / "bugs.py"
    spec = importlib.util.spec_from_file_location("eo_sample_bugs", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _source() -> nbformat.NotebookNode:
    return nbformat.read(str(notebook.source_notebook(ASSIGNMENT)), 4)


def inlined(mutant: Path) -> str:
    """A wrong queue of the module corpus as one module: the base it imports,
    then what it changes (its sys.path line and star import left out)."""
    base = (QUEUES / f"{BASE}.py").read_text()
    own = [line for line in mutant.read_text().splitlines()
           if not line.startswith(("sys.path.insert(", f"from {BASE} import"))]
    return base.rstrip("\n") + "\n\n\n" + "\n".join(own) + "\n"


def mutants() -> list[Path]:
    """The module corpus's wrong queues (as the corpus command finds them)."""
    return [Path(spec) for _, spec, mutant in corpus.queues(QUEUES) if mutant]


def imports_a_sibling(mutant: Path) -> bool:
    """It imports a corpus module other than its base (one more file)."""
    names = set()
    for node in ast.walk(ast.parse(mutant.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return any((QUEUES / f"{n}.py").exists() for n in names - {BASE})


def _with_module(source: str) -> nbformat.NotebookNode:
    nb = _source()
    cell = next(c for c in nb.cells
                if c.metadata.get("nbgrader", {}).get("grade_id") == MODULE_CELL)
    cell.source = "%%writefile myqueue.py\n" + source
    return nb


def _with_cell(code: str) -> nbformat.NotebookNode:
    nb = _source()
    nb.cells.append(nbformat.v4.new_code_cell(code))       # a scratch cell
    return nb


def variants(scratch: Path) -> dict[str, tuple[str, Callable[[], bytes]]]:
    """Each distinct submission: name -> (kind, its notebook's bytes)."""
    bugs = _bugs()
    built = {}

    def corpus_nb(name: str) -> Callable[[], bytes]:
        def make() -> bytes:
            if name not in built:
                built[name] = bugs.build(name, scratch, notebook.SOURCE_DIR)
            return built[name].read_bytes()
        return make

    def nb_bytes(make: Callable[[], nbformat.NotebookNode]) -> Callable[[], bytes]:
        return lambda: nbformat.writes(make()).encode()

    out: dict[str, tuple[str, Callable[[], bytes]]] = {
        "solution": ("correct", notebook.source_notebook(ASSIGNMENT).read_bytes)}
    for name, spec in {**bugs.CORRECT, **bugs.SUBMISSIONS}.items():
        if spec["assignment"] == ASSIGNMENT:
            kind = ("correct" if name in bugs.CORRECT else
                    "broken" if name in BROKEN else "wrong")
            out[name] = (kind, corpus_nb(name))
    for path in mutants():
        if not imports_a_sibling(path):
            out[f"queue_{path.stem}"] = ("wrong", nb_bytes(
                lambda p=path: _with_module(inlined(p))))
    release = notebook.RELEASE_DIR / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
    out["untouched"] = ("untouched", release.read_bytes)
    source = notebook.source_notebook(ASSIGNMENT)
    out["cut_short"] = ("broken", lambda: source.read_bytes()[
        :len(source.read_bytes()) // 2])
    for name, code in HANGS.items():
        out[name] = ("hanging", nb_bytes(lambda c=code: _with_cell(c)))
    return out


def plan(n: int, names: dict[str, str], seed: int = 0) -> list[str]:
    """n variant names: a third correct, a third wrong, the rest untouched,
    broken and hanging in thirds; each kind's variants in turn (in an order of
    the seed's, so a small class holds others than the first); shuffled."""
    rng = random.Random(seed)
    by_kind = {k: sorted(v for v, kind in names.items() if kind == k)
               for k in KINDS}
    for variants_of_kind in by_kind.values():
        rng.shuffle(variants_of_kind)
    third = n // 3
    rest = n - 2 * third
    counts = {"correct": third, "wrong": third, "untouched": rest - 2 * (rest // 3),
              "broken": rest // 3, "hanging": rest // 3}
    picks = [by_kind[k][i % len(by_kind[k])]
             for k in KINDS for i in range(counts[k])]
    rng.shuffle(picks)
    return picks


def compose(submitted: Path, n: int, seed: int = 0) -> dict[str, tuple[str, str]]:
    """Write the class; student -> (the variant they handed in, its kind)."""
    scratch = submitted.parent / "sample-class-scratch"
    made = variants(scratch)
    picks = plan(n, {name: kind for name, (kind, _) in made.items()}, seed)
    cache: dict[str, bytes] = {}
    students = {}
    for i, name in enumerate(picks, 1):
        student = f"s{i:03d}"
        dest = submitted / student / ASSIGNMENT / f"{ASSIGNMENT}.ipynb"
        dest.parent.mkdir(parents=True, exist_ok=True)
        if name not in cache:
            cache[name] = made[name][1]()
        dest.write_bytes(cache[name])
        students[student] = (name, made[name][0])
    return students

