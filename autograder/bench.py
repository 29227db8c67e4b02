"""`python -m autograder bench`: what grading each assignment's reference costs.

Each reference notebook (the source, solutions in) is graded twice, once by
`python -m autograder grade` and once by `nbgrader autograde` in a throwaway
course (the ecosystem's plain way to grade the same notebook). Every figure is
the kernel's own accounting, never an estimate:

- wall: the command's start to the end of its last process;
- CPU: every process the command started. As root the command runs in a PID
  namespace of its own (`unshare`) under a small init that reaps every
  process, orphans included, so the init's `RUSAGE_CHILDREN` is all of them;
  elsewhere it is the bench's own `RUSAGE_CHILDREN` (reaped descendants only);
- tasks: processes and threads created in that namespace (its last PID);
- the split: `learner` is the CPU of the run's confined cgroups, `servers` that
  of the Redis and PostgreSQL cgroups (each launcher adds its cgroup's whole
  life to a log, `cgroup.COST_LOG`), `judge` what is left: the grader's own
  process tree.

What a grading costs in seconds depends on the machine: the same code's
claim_ack_reap grade measured 10 CPU-s on one quiet 2-core machine and 6 on
another. `--against CHECKOUT` grades another checkout of the course (its own
reference, with its own `.venv`) in turn with this one, round by round, and
prints the ratio: the measure of a change that holds from one machine, or one
hour, to the next.
"""

from __future__ import annotations

import collections
import contextlib
import json
import os
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from autograder import assignments
from autograder.isolation.cgroup import COST_LOG
from autograder.notebooks import notebook

REPO = Path(__file__).resolve().parent.parent
STUDENT = "bench"
LEFTOVER_S = 10.0     # how long the init waits for what outlives the command
GRADE_LIMIT_S = 1800  # a grade that runs longer is stopped and counted failed


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _init(out: str, cwd: str, cmd: list[str]) -> int:
    """PID 1 of the bench's namespace: run `cmd` in `cwd`, reap every process
    (killing what outlives it by LEFTOVER_S), then write what they all cost to
    `out`. (It starts in this checkout, so that it is this checkout's init
    whatever `cwd` holds.)"""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
        os.chdir(cwd)
        os.execvp(cmd[0], cmd)
    rc, deadline = None, None
    while True:
        try:
            got, status = os.waitpid(-1, os.WNOHANG if deadline else 0)
        except ChildProcessError:
            break
        if got == pid:
            rc = os.waitstatus_to_exitcode(status)
            deadline = time.monotonic() + LEFTOVER_S
        elif got == 0:
            if time.monotonic() > deadline:
                os.kill(-1, signal.SIGKILL)     # in a PID namespace: all but us
            time.sleep(0.05)
    wall = time.monotonic() - t0
    probe = os.fork()                           # the next PID: one past the last
    if probe == 0:
        os._exit(0)
    os.waitpid(probe, 0)
    Path(out).write_text(json.dumps({"returncode": rc, "wall_s": wall,
                                     "cpu_s": _cpu_children(),
                                     "tasks": probe - 2}))
    return 0


def _namespaced() -> bool:
    return os.geteuid() == 0 and shutil.which("unshare") is not None


def measure(cmd: list[str], cwd: Path | None = None, echo=None,
            stdout: Path | None = None, bin_dir: Path | None = None,
            limit_s: float | None = None) -> dict:
    """Run `cmd` to its end; what it cost, by role where the roles are counted.
    `echo` hears each line of its stderr as it comes; its stdout goes to the
    file `stdout`, if given. `bin_dir` goes first on its PATH (default: this
    interpreter's folder, the venv's commands). Past `limit_s` the command is
    killed (in a namespace, every process of it: the init dies with the
    `unshare` that started it) and the run is a failed one."""
    with tempfile.TemporaryDirectory(prefix="eo-bench-") as tmp:
        log, out = Path(tmp) / "cost.jsonl", Path(tmp) / "init.json"
        env = dict(os.environ, **{COST_LOG: str(log)})
        first = bin_dir or Path(sys.executable).parent
        env["PATH"] = f"{first}{os.pathsep}{env.get('PATH', '')}"
        env.pop("REDIS_URL", None)
        env.pop("DATABASE_URL", None)
        cpu0, t0 = _cpu_children(), time.monotonic()
        if _namespaced():
            run = ["unshare", "--pid", "--kill-child", "--mount-proc", sys.executable,
                   "-m", "autograder.bench", str(out), str(cwd or Path.cwd()), "--",
                   *cmd]
        else:
            run = cmd
        said: collections.deque = collections.deque(maxlen=50)
        with (open(stdout, "w") if stdout else open(os.devnull, "w")) as sink, \
                subprocess.Popen(run, cwd=REPO if run is not cmd else cwd, env=env,
                                 stdout=sink, stderr=subprocess.PIPE,
                                 text=True) as proc:
            timer = threading.Timer(limit_s, _stop, (proc, said, limit_s)) \
                if limit_s else None
            if timer:
                timer.start()
            try:
                for line in proc.stderr:
                    said.append(line)
                    if echo:
                        echo(line.rstrip("\n"))
            finally:
                if timer:
                    timer.cancel()
        got = {"returncode": proc.returncode, "wall_s": time.monotonic() - t0,
               "cpu_s": _cpu_children() - cpu0, "tasks": None}
        if run is not cmd and out.exists():
            got = json.loads(out.read_text())
        elif run is not cmd:        # the init itself failed: its words say why
            got["returncode"] = got["returncode"] or 1
        roles = {"learner": 0.0, "server": 0.0}
        if log.exists():
            for line in log.read_text().splitlines():
                entry = json.loads(line)
                roles[entry["role"]] = roles.get(entry["role"], 0.0) + entry["cpu_s"]
    return {"ok": got["returncode"] == 0, "wall_s": round(got["wall_s"], 2),
            "cpu_s": round(got["cpu_s"], 2), "tasks": got["tasks"],
            "judge_s": round(got["cpu_s"] - roles["learner"] - roles["server"], 2),
            "learner_s": round(roles["learner"], 2),
            "servers_s": round(roles["server"], 2),
            "error": "" if proc.returncode == 0 else "".join(said)[-800:]}


def _stop(proc: subprocess.Popen, said: collections.deque, limit_s: float) -> None:
    said.append(f"bench: the command did not finish within {limit_s:g} s and was "
                "killed\n")
    with contextlib.suppress(ProcessLookupError):
        proc.kill()


def _nbgrader(*args: str) -> list[str]:
    return [str(Path(sys.executable).parent / "nbgrader"), *args, "--log-level=WARN"]


def _course(tmp: Path, name: str, nb: Path) -> Path:
    """A throwaway nbgrader course with `nb` submitted by one student."""
    course = tmp / "course"
    (course / "solutions").mkdir(parents=True)
    shutil.copy(REPO / "nbgrader_config.py", course)
    shutil.copytree(nb.parent, course / "solutions" / name)
    for args in (("generate_assignment", name), ("db", "student", "add", STUDENT)):
        subprocess.run(_nbgrader(*args), cwd=course, check=True,
                       capture_output=True)
    dest = course / "submitted" / STUDENT / name
    dest.mkdir(parents=True)
    shutil.copy(nb, dest / f"{name}.ipynb")
    return course


def bench(name: str) -> dict:
    """One assignment's reference, graded by us and by nbgrader."""
    nb = notebook.source_notebook(name)
    grade = measure([sys.executable, "-m", "autograder", "grade", str(nb), "--json"],
                    cwd=REPO, limit_s=GRADE_LIMIT_S)
    with tempfile.TemporaryDirectory(prefix="eo-bench-course-") as tmp:
        course = _course(Path(tmp), name, nb)
        nbg = measure(_nbgrader("autograde", name, "--student", STUDENT),
                      cwd=course, limit_s=GRADE_LIMIT_S)
    return {"assignment": name, "grade": grade, "nbgrader": nbg}


def _median(runs: list[dict]) -> dict:
    """The run of median CPU (a whole run, so its parts add up); not ok unless
    every run was (a failed run is often the cheapest, never the median)."""
    median = sorted(runs, key=lambda r: r["cpu_s"])[len(runs) // 2]
    return {**median, "ok": all(r["ok"] for r in runs)}


def run_bench(names: list[str], repeat: int = 1, progress=None) -> list[dict]:
    rows = []
    for name in names:
        runs = []
        for i in range(repeat):
            if progress:
                progress(f"{name}: run {i + 1} of {repeat}")
            runs.append(bench(name))
        rows.append({"assignment": name, "runs": repeat,
                     "grade": _median([r["grade"] for r in runs]),
                     "nbgrader": _median([r["nbgrader"] for r in runs])})
    return rows


def table(rows: list[dict]) -> str:
    """One line per assignment and grader; CPU in seconds."""
    head = (f"{'assignment':<20} {'grader':<9} {'wall':>6} {'CPU':>6} {'tasks':>6} "
            f"{'judge':>6} {'learner':>7} {'servers':>7}")
    out = [head, "-" * len(head)]
    for row in rows:
        for grader in ("grade", "nbgrader"):
            m = row[grader]
            tasks = "-" if m["tasks"] is None else m["tasks"]
            out.append(f"{row['assignment']:<20} {grader:<9} {m['wall_s']:>6.1f} "
                       f"{m['cpu_s']:>6.1f} {tasks:>6} {m['judge_s']:>6.1f} "
                       f"{m['learner_s']:>7.1f} {m['servers_s']:>7.1f}"
                       + ("" if m["ok"] else "  (failed)"))
    return "\n".join(out)


def _points(out: Path) -> str:
    try:
        got = json.loads(out.read_text())
        return f"{got['score']:g}/{got['max_score']:g}"
    except (OSError, ValueError, KeyError, TypeError):
        return "-"


def _graded(python: Path, checkout: Path, name: str, tmp: Path) -> dict:
    """One grade of `checkout`'s reference by its own interpreter."""
    nb = checkout / "solutions" / name / f"{name}.ipynb"
    out = tmp / f"{checkout.name}-{name}.json"
    m = measure([str(python), "-m", "autograder", "grade", str(nb), "--json"],
                cwd=checkout, stdout=out, bin_dir=python.parent,
                limit_s=GRADE_LIMIT_S)
    return {**m, "points": _points(out)}


def other_python(checkout: Path) -> Path | str:
    """The other checkout's interpreter, or why it cannot be benched."""
    python = checkout / ".venv" / "bin" / "python"
    if not (checkout / "autograder").is_dir():
        return f"{checkout} is not a checkout of the course (no autograder/ in it)"
    if not python.exists():
        return (f"{checkout} has no .venv: run `make book` (or `make test`) there "
                "once, so it grades with its own packages")
    return python


def run_against(names: list[str], other: Path, repeat: int = 1,
                progress=None) -> list[dict]:
    """Each assignment graded by this checkout and by `other`, in turn, `repeat`
    rounds; who goes first alternates, so a machine slowing down over a round
    weighs on both alike."""
    python = other_python(other)
    assert isinstance(python, Path), python
    sides = {"this": (Path(sys.executable), REPO), "that": (python, other)}
    rows = []
    with tempfile.TemporaryDirectory(prefix="eo-bench-against-") as tmp:
        for name in names:
            if not (other / "solutions" / name / f"{name}.ipynb").exists():
                rows.append({"assignment": name, "missing": True})
                continue
            runs: dict = {"this": [], "that": []}
            for i in range(repeat):
                if progress:
                    progress(f"{name}: round {i + 1} of {repeat}")
                for side in (("this", "that") if i % 2 == 0 else ("that", "this")):
                    runs[side].append(_graded(*sides[side], name, Path(tmp)))
            pairs = zip(runs["this"], runs["that"], strict=True)
            rows.append({"assignment": name, "runs": repeat,
                         "this": _median(runs["this"]), "that": _median(runs["that"]),
                         "ratios": [round(a["cpu_s"] / b["cpu_s"], 3)
                                    for a, b in pairs     # rounds both graded
                                    if a["ok"] and b["ok"] and b["cpu_s"] > 0]})
    return rows


def against_table(rows: list[dict], other: Path) -> str:
    """CPU of this checkout's grade against the other's, round by round."""
    head = (f"{'assignment':<20} {'this CPU':>8} {'that CPU':>8} {'ratio':>6} "
            f"{'rounds':>11} {'this pts':>8} {'that pts':>8}")
    out = [f"this: {REPO}", f"that: {other}", head, "-" * len(head)]
    for row in rows:
        if row.get("missing"):
            out.append(f"{row['assignment']:<20} (not in that checkout)")
            continue
        a, b, rs = row["this"], row["that"], sorted(row["ratios"])
        spread = f"{rs[0]:.2f}-{rs[-1]:.2f}" if len(rs) > 1 else ""
        ratio = f"{statistics.median(rs):.2f}" if rs else "-"
        failed = "" if a["ok"] and b["ok"] else "  (a grade failed)"
        out.append(f"{row['assignment']:<20} {a['cpu_s']:>8.1f} {b['cpu_s']:>8.1f} "
                   f"{ratio:>6} {spread:>11} {a['points']:>8} "
                   f"{b['points']:>8}{failed}")
    return "\n".join(out)


def main(args) -> int:
    names = args.assignment or assignments.names()
    unknown = [n for n in names if n not in assignments.names()]
    if unknown or args.repeat < 1:
        print(f"cannot bench: unknown assignment {unknown}" if unknown else
              "cannot bench: --repeat must be at least 1", file=sys.stderr)
        return 2
    say = lambda m: print(m, file=sys.stderr, flush=True)      # noqa: E731
    if args.against is not None:
        if not args.against.strip():
            print("cannot bench: --against needs a checkout's folder", file=sys.stderr)
            return 2
        other = Path(args.against).resolve()
        python = other_python(other)
        if not isinstance(python, Path):
            print(f"cannot bench: {python}", file=sys.stderr)
            return 2
        rows = run_against(names, other, args.repeat, say)
        print(json.dumps(rows, indent=1) if args.json else against_table(rows, other))
        return 0 if all(r["this"]["ok"] and r["that"]["ok"] for r in rows
                        if not r.get("missing")) else 1
    rows = run_bench(names, args.repeat, say)
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0 if all(r[g]["ok"] for r in rows for g in ("grade", "nbgrader")) else 1


if __name__ == "__main__":      # the init inside the namespace: OUT CWD -- CMD
    sys.exit(_init(sys.argv[1], sys.argv[2], sys.argv[4:]))
