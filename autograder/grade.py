"""Grade one submission: run the learner's cells in a sandbox, then judge.

    result = grade("submitted/ada/claim_ack_reap/claim_ack_reap.ipynb")
    print(result.text())

Every run gets its own temporary directory and its own embedded Redis; the
learner's notebook runs in a sandboxed kernel (`autograder.isolation.sandbox`), and
everything it started is killed when it ends. Test cells are never run here:
the assignment's `evaluate` judges from outside. Test, check and locked
cells are restored from the source notebook first (a note, never a zero), so
a notebook from an earlier release is graded on the learner's answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import shutil
import signal
import stat
import sys
import tempfile
import time
from pathlib import Path

import nbformat

from autograder import assignments
from autograder.isolation import sandbox, server
from autograder.judges import live
from autograder.judges.checks import GradeResult, Outcome
from autograder.notebooks import notebook

_NOISE = ("Kernel is running over TCP", "susceptible to eavesdropping",
          "SAWarning", "MovedIn20Warning", "warnings.warn(")


def _learner_lines(text: str) -> str:
    """Output with the lines that are not the learner's business left out."""
    return "\n".join(line for line in text.splitlines()
                     if not any(n in line for n in _NOISE)).strip()


def replayable(replay: str, module, workdir: Path, nb_path: Path,
               problems: list[str] | None = None) -> str:
    """The replay command, pointed at a copy of the judged module the learner has.

    The judged file lives in a directory that is gone when grading ends, so it
    is kept next to the notebook (`replay-<file>`, never over the learner's own
    file) unless the learner's own file there is the same; the path printed is
    relative to where the command was run. The notebook's folder is the
    learner's: a link placed there is never followed (said in `problems`).
    """
    name = getattr(module, "MODULE_FILE", None)
    judged = workdir / name if name else None
    if (judged is None or not judged.is_file() or judged.is_symlink()
            or f"--queue {name}" not in replay):
        return replay
    own = nb_path.parent / name
    keep = own if (own.is_file() and not own.is_symlink()
                   and own.read_bytes() == judged.read_bytes()) else (
        nb_path.parent / f"replay-{name}")
    if keep != own:
        why = write_no_link(keep, judged.read_bytes())
        if why:
            if problems is not None:
                problems.append(why)
            return replay
    shown = os.path.relpath(keep)
    return replay.replace(f"--queue {name}", f"--queue {shlex.quote(shown)}")


def write_no_link(path: Path, data: bytes) -> str:
    """Write `data` to `path` unless it is a link (or a file linked elsewhere);
    '' when written, else why not, in one line."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW
                     | os.O_NONBLOCK, 0o644)     # a FIFO: no wait
    except OSError as err:
        what = "is a link" if os.path.islink(path) else f"cannot be written ({err})"
        return f"{path.name} was not written: it {what}; the grader never follows one"
    with os.fdopen(fd, "wb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_nlink > 1:
            return (f"{path.name} was not written: it is not a plain file of its "
                    "own (a hard link?); the grader never writes through one")
        f.truncate()
        f.write(data)
    return ""


@contextlib.contextmanager
def run_dir(name: str):
    """A grading run's work dir, named as a learner's own copy is
    (`<tmp>/<random>/<assignment>`): nothing the learner's code reads of its
    folder says it is graded. Removed with what is in it, and with the run's
    cgroups: a judge's harness kills hosts whose launchers cannot remove them."""
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp) / name
        workdir.mkdir()
        try:
            yield workdir
        finally:
            sandbox.cleanup(workdir)


def _execution_problems(summary: dict, finished: sandbox.Finished,
                        timeout: float) -> list[str]:
    problems = []
    for err in summary.get("errors", []):
        problems.append(f"{err['cell']} raised {err['ename']}: {err['evalue']}"[:400])
    for cell in summary.get("timed_out", []):
        problems.append(f"{cell} ran past its time limit ({notebook.CELL_TIMEOUT_S}"
                        " s unless the cell sets its own) and was interrupted (an "
                        "endless loop?); the cells after it still ran")
    for cell in summary.get("cpu_limited", []):
        problems.append(f"{cell} used {notebook.CELL_CPU_S} s of CPU and was "
                        "interrupted (a loop that spins?); the cells after it "
                        "still ran")
    if summary.get("cpu_killed"):
        problems.append(f"{summary['cpu_killed']} went on using CPU after it was "
                        f"interrupted at {notebook.CELL_CPU_S} s of CPU, so its "
                        "kernel was killed; the cells after it did not run")
    elif summary.get("kernel_died"):
        problems.append(f"the kernel died in {summary['kernel_died']} (os._exit, a "
                        "crash, or the memory limit); the cells after it did not run")
    problems += finished.problems()
    if finished.timed_out:
        problems.append(f"the notebook did not finish within {timeout:.0f} s and was "
                        "killed")
    elif finished.problems():
        pass        # the sandbox named what happened (above)
    elif not summary and finished.returncode is not None and finished.returncode < 0:
        sig = -finished.returncode
        name = signal.Signals(sig).name if sig in signal.valid_signals() else sig
        problems.append(f"the notebook runner was killed by signal {name} before "
                        "it could report (the memory limit, or something killed "
                        "it from outside); its last words: "
                        + (_learner_lines(finished.tail(1200))[-300:] or "none"))
    elif not summary and finished.returncode != 0:
        problems.append("the notebook could not be executed: "
                        + (_learner_lines(finished.tail(1200))[-400:] or
                           f"the runner ended with exit code {finished.returncode}"
                           " and said nothing"))
    if finished.leftovers:
        shown = "; ".join(finished.leftovers[:3])
        problems.append(f"the notebook left {len(finished.leftovers)} process(es) "
                        f"running after it ended (all killed): {shown}")
    return problems


def run_learner_cells(nb, module, workdir: Path, quick: bool,
                      executed_copy: Path | None = None) -> tuple[list[str], str]:
    """Execute the learner's cells (plus the observe cell) in the sandbox.

    Returns the problems seen and which protections were in force.
    """
    runnable = notebook.learner_cells(nb)
    make_cell = getattr(module, "observe_cell", None)
    if make_cell:
        code, limit = make_cell(quick)
        cell = nbformat.v4.new_code_cell(code)
        cell.metadata["autograder"] = {"timeout": limit}
        runnable.cells.append(cell)
    src = workdir / "submission.ipynb"
    nbformat.write(runnable, str(src))
    summary_path = workdir / "execution.json"
    timeout = module.NOTEBOOK_TIMEOUT_S
    finished = sandbox.run(
        [sys.executable, "-m", "autograder.notebooks.run_notebook", str(src),
         str(workdir / "executed.ipynb"), str(summary_path), "--cell-timeout",
         str(notebook.CELL_TIMEOUT_S), "--cell-cpu", str(notebook.CELL_CPU_S)],
        timeout=timeout, cwd=workdir, confined=True,
        read_paths=sandbox.kernel_read_paths(module.__name__ if make_cell else None))
    try:
        summary = json.loads(summary_path.read_text())
    except (OSError, ValueError):
        summary = {}
    executed = workdir / "executed.ipynb"
    # The work dir was the learner's: a link there is not followed.
    if executed_copy is not None and executed.is_file() and not executed.is_symlink():
        shutil.copyfile(executed, executed_copy)
    return _execution_problems(summary, finished, timeout), finished.isolation


def grade(path: str | Path, quick: bool = False, progress=None,
          assignment: str | None = None,
          executed_copy: Path | None = None,
          only: list[str] | None = None,
          on_check: live.Listener | None = None) -> GradeResult:
    """Grade a notebook (or an assignment folder holding one).

    `assignment` is the one expected (nbgrader knows it; so does an instructor
    with `--assignment`): a notebook of another assignment is refused.
    `executed_copy` receives the learner's cells as they ran in the sandbox.
    `only` keeps just those checks in the result (unknown names are refused).
    `on_check(name, ok, why)` hears a check's verdict as soon as its judge
    knows it, where the judge streams them (the queue assignments).
    """
    start = time.monotonic()
    say = progress or (lambda msg: None)
    nb_path = notebook.resolve(path)
    nb = notebook.read(nb_path)
    name, why = notebook.identify(nb, nb_path, assignment)
    module = assignments.load(name)
    known = [c.name for c in module.CHECKS]
    unknown = [n for n in only or () if n not in known]
    if unknown:
        raise notebook.SubmissionError(
            f"{name} has no check {', '.join(unknown)}; its checks: "
            f"{', '.join(known)}")
    problems: list[str] = [why] if why else []
    ready = notebook.for_grading(nb, name)
    nb = ready.nb
    problems += ready.problems
    with run_dir(name) as workdir:
        say(f"running the learner's cells of {nb_path.name}")
        found, isolation = run_learner_cells(nb, module, workdir, quick,
                                             executed_copy)
        problems += found
        redis = server.start()
        try:
            say("judging")
            with live.listening(on_check):
                ev = module.evaluate(workdir, redis.url, quick)
            ev.problems += redis.refusals()
        finally:
            redis.stop()
        if ev.replay:
            ev.replay = replayable(ev.replay, module, workdir, nb_path, problems)
    outcomes: list[Outcome] = []
    for o in ev.outcomes:
        # The source notebook's points count, as in nbgrader's gradebook.
        o.max_points = ready.points.get(o.name, o.max_points)
        if not only or o.name in only:
            outcomes.append(o)
    return GradeResult(assignment=name, submission=str(nb_path), outcomes=outcomes,
                       problems=problems + ev.problems, invariants=ev.invariants,
                       replay=ev.replay, elapsed_s=time.monotonic() - start,
                       quick=quick, isolation=isolation,
                       server_isolation=redis.isolation,
                       servers={"Redis": redis.isolation, **ev.servers},
                       notes=ready.notes,
                       efficiency=ev.efficiency)
