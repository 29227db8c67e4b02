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
  life to a log, `confine.COST_LOG`), `judge` what is left: the grader's own
  process tree.
"""

from __future__ import annotations

import collections
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from autograder import assignments
from autograder.isolation.confine import COST_LOG
from autograder.notebooks import notebook

REPO = Path(__file__).resolve().parent.parent
STUDENT = "bench"
LEFTOVER_S = 10.0     # how long the init waits for what outlives the command


def _cpu_children() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _init(out: str, cmd: list[str]) -> int:
    """PID 1 of the bench's namespace: run `cmd`, reap every process (killing
    what outlives it by LEFTOVER_S), then write what they all cost to `out`."""
    t0 = time.monotonic()
    pid = os.fork()
    if pid == 0:
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
            stdout: Path | None = None) -> dict:
    """Run `cmd` to its end; what it cost, by role where the roles are counted.
    `echo` hears each line of its stderr as it comes; its stdout goes to the
    file `stdout`, if given."""
    with tempfile.TemporaryDirectory(prefix="eo-bench-") as tmp:
        log, out = Path(tmp) / "cost.jsonl", Path(tmp) / "init.json"
        env = dict(os.environ, **{COST_LOG: str(log)})
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
        env.pop("REDIS_URL", None)
        env.pop("DATABASE_URL", None)
        cpu0, t0 = _cpu_children(), time.monotonic()
        if _namespaced():
            run = ["unshare", "--pid", "--fork", "--mount-proc", sys.executable,
                   "-m", "autograder.bench", str(out), "--", *cmd]
        else:
            run = cmd
        said: collections.deque = collections.deque(maxlen=50)
        with (open(stdout, "w") if stdout else open(os.devnull, "w")) as sink, \
                subprocess.Popen(run, cwd=cwd, env=env, stdout=sink,
                                 stderr=subprocess.PIPE, text=True) as proc:
            for line in proc.stderr:
                said.append(line)
                if echo:
                    echo(line.rstrip("\n"))
        got = {"returncode": proc.returncode, "wall_s": time.monotonic() - t0,
               "cpu_s": _cpu_children() - cpu0, "tasks": None}
        if run is not cmd:
            got = json.loads(out.read_text())
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
                    cwd=REPO)
    with tempfile.TemporaryDirectory(prefix="eo-bench-course-") as tmp:
        course = _course(Path(tmp), name, nb)
        nbg = measure(_nbgrader("autograde", name, "--student", STUDENT),
                      cwd=course)
    return {"assignment": name, "grade": grade, "nbgrader": nbg}


def _median(runs: list[dict]) -> dict:
    """The run of median CPU (a whole run, so its parts add up)."""
    return sorted(runs, key=lambda r: r["cpu_s"])[len(runs) // 2]


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


def main(args) -> int:
    names = args.assignment or assignments.names()
    unknown = [n for n in names if n not in assignments.names()]
    if unknown or args.repeat < 1:
        print(f"cannot bench: unknown assignment {unknown}" if unknown else
              "cannot bench: --repeat must be at least 1", file=sys.stderr)
        return 2
    rows = run_bench(names, args.repeat,
                     lambda m: print(m, file=sys.stderr, flush=True))
    print(json.dumps(rows, indent=1) if args.json else table(rows))
    return 0 if all(r[g]["ok"] for r in rows for g in ("grade", "nbgrader")) else 1


if __name__ == "__main__":          # the init inside the namespace: OUT -- CMD
    sys.exit(_init(sys.argv[1], sys.argv[3:]))
