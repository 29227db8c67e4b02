"""The release is generated, and only generated; the instructor's steps run.

`exercises/` holds exactly what `make exercises` makes from the notebooks in
`solutions/`: no file a notebook wrote when it ran, no solution marker. The
instructor's steps are written once in three places (the book, the README,
nbgrader_config.py); they must agree, and they are run here as written, in a
throwaway copy of the course, with and without the environment's bin/ on PATH.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest

from autograder.notebooks import notebook

ROOT = notebook.REPO
VENV = Path(sys.executable).parent.parent
NAMES = sorted(p.name for p in (ROOT / "solutions").iterdir() if p.is_dir())
MARKERS = ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS",
           "END HIDDEN TESTS")


def _release_files(release: Path) -> list[str]:
    return sorted(str(p.relative_to(release)) for p in release.rglob("*")
                  if p.is_file())


def test_release_holds_only_generated_notebooks_without_answers():
    assert _release_files(ROOT / "exercises") == [f"{n}/{n}.ipynb" for n in NAMES]
    for name in NAMES:
        text = (ROOT / "exercises" / name / f"{name}.ipynb").read_text()
        found = [m for m in MARKERS if m in text]
        assert not found, f"exercises/{name} holds {found}: run `make exercises`"


def _written_files(name: str) -> dict[str, str]:
    """What running the solution notebook writes: its %%writefile targets."""
    nb = nbformat.read(str(ROOT / "solutions" / name / f"{name}.ipynb"), 4)
    out = {}
    for cell in nb.cells:
        m = re.match(r"%%writefile (\S+)\n", cell.source)
        if cell.cell_type == "code" and m:
            out[m.group(1)] = cell.source[m.end():]
    return out


def _course(tmp: Path, names: list[str]) -> Path:
    """A copy of the course with `names` in solutions/ and the same .venv."""
    course = tmp / "course"
    course.mkdir()
    for f in ("Makefile", "nbgrader_config.py", "requirements.txt",
              "pyproject.toml"):
        shutil.copy2(ROOT / f, course / f)     # mtimes kept: make sees no change
    (course / ".venv").symlink_to(VENV)
    for name in names:
        shutil.copytree(ROOT / "solutions" / name, course / "solutions" / name,
                        ignore=shutil.ignore_patterns("*.py", "*.db", "*.sqlite*"))
    return course


def _env(with_venv: bool) -> dict:
    path = [p for p in os.environ["PATH"].split(os.pathsep)
            if Path(p).resolve() != (VENV / "bin").resolve()]
    if with_venv:
        path.insert(0, str(VENV / "bin"))
    env = {k: v for k, v in os.environ.items() if k not in ("REDIS_URL",
                                                           "VIRTUAL_ENV")}
    return dict(env, PATH=os.pathsep.join(path))


def test_make_exercises_after_running_the_notebooks_leaks_nothing(tmp_path):
    """Run every solution's %%writefile cells (as `nbgrader validate` does),
    leave a database behind, then `make exercises`: the release is exactly
    the committed exercises/ (no drift), notebooks only; git ignores the files."""
    course = _course(tmp_path, NAMES)
    planted = []
    for name in NAMES:
        for fname, body in {**_written_files(name), "jobs.db": ""}.items():
            (course / "solutions" / name / fname).write_text(body)
            planted.append(f"solutions/{name}/{fname}")
    assert any(p.endswith("myoutbox.py") for p in planted)
    release = tmp_path / "release"
    res = subprocess.run(["make", "-s", "exercises", f"RELEASE={release}",
                          f"GRADEBOOK={tmp_path / 'gradebook.db'}"], cwd=course,
                         capture_output=True, text=True, timeout=600,
                         env=_env(False))
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    assert _release_files(release) == [f"{n}/{n}.ipynb" for n in NAMES]
    for name in NAMES:
        rel = f"{name}/{name}.ipynb"
        assert (release / rel).read_bytes() == (ROOT / "exercises" / rel
                                                ).read_bytes(), (
            f"exercises/{rel} drifted from solutions/; run `make exercises`")
    ignored = subprocess.run(["git", "check-ignore", "--no-index", *planted,
                              *(p.replace("solutions/", "exercises/", 1)
                                for p in planted)],
                             cwd=ROOT, capture_output=True, text=True)
    assert len(ignored.stdout.split()) == 2 * len(planted), ignored.stdout


# --- the instructor's steps -------------------------------------------------------

def _block(text: str, after: str) -> str:
    start = text.index(after)
    m = re.search(r"```bash\n(.*?)```", text[start:], re.S)
    return m.group(1)


def _steps(block: str) -> tuple[list[str], str]:
    """The commands (comments dropped) and the path the collect comment names."""
    commands, collect = [], ""
    for line in block.splitlines():
        line = line.strip()
        m = re.match(r"# collect: (\S+)", line)
        if m:
            collect = m.group(1)
            commands.append("<collect>")
        elif line and not line.startswith("#"):
            commands.append(line.split("  #")[0].strip())
    return commands, collect


def _documented_steps() -> dict[str, tuple[list[str], str]]:
    config = (ROOT / "nbgrader_config.py").read_text()
    doc = config.split('"""')[1]
    doc_block = "\n".join(line[4:] for line in doc.splitlines()
                          if line.startswith("    "))
    return {
        "book": _steps(_block((ROOT / "book" / "exercises.md").read_text(),
                              "## For instructors")),
        "README": _steps(_block((ROOT / "README.md").read_text(),
                                "Instructors, from the root")),
        "nbgrader_config.py": _steps(doc_block),
    }


def test_the_instructor_steps_are_the_same_everywhere():
    steps = _documented_steps()
    assert steps["book"][0], "no steps found in the book"
    assert steps["book"][0][0] == "make exercises"
    for where, got in steps.items():
        assert got == steps["book"], f"{where} differs from the book: {got}"


@pytest.mark.parametrize("with_venv", [False, True], ids=["bare-PATH", "venv-PATH"])
def test_the_instructor_steps_run_as_written(tmp_path, with_venv):
    """generate, collect, autograde, feedback: in a copy of the course holding
    the one assignment the steps name, the submission an untouched exercise."""
    commands, collect = _documented_steps()["book"]
    student, name = Path(collect).parts[1:3]
    course = _course(tmp_path, [name])
    env = _env(with_venv)
    for command in commands:
        if command == "<collect>":
            dest = course / collect
            dest.parent.mkdir(parents=True)
            shutil.copy(course / "exercises" / name / f"{name}.ipynb", dest)
            continue
        res = subprocess.run(["bash", "-c", command], cwd=course, env=env,
                             capture_output=True, text=True, timeout=300)
        assert res.returncode == 0, (command, res.stdout[-1500:],
                                     res.stderr[-2500:])
        assert "Traceback" not in res.stderr, (command, res.stderr[-2500:])
        noise = [w for w in ("SAWarning", "over TCP") if w in res.stderr]
        assert not noise, (command, noise, res.stderr[-2500:])
    assert (course / "exercises" / name / f"{name}.ipynb").exists()
    assert list((course / "autograded" / student / name).glob("*.ipynb"))
    feedback = list((course / "feedback" / student / name).glob("*.html"))
    assert feedback, "generate_feedback made no report"
    text = feedback[0].read_text()
    assert "enqueue_idempotent" in text and "Score" in text
