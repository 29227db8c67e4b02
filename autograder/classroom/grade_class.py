"""Grade a whole class in parallel, the way the course runs any job queue.

    python -m autograder grade-class submitted/               # this machine
    python -m autograder grade-class submitted/ --scheduler tcp://host:8786

Each submission is a job: its notebook's bytes go to a Dask distributed worker,
which grades it with `python -m autograder grade --json` in a process of its
own, forked from one that imported the grader (the sandbox does the rest).
Delivery is at least once: a grader killed
with `kill -9`, or a worker machine lost, gets its jobs handed to another by
the Dask scheduler. The effect is made idempotent here, in the one process
that writes: the ledger keys every grade by (student, assignment, the
notebook's SHA-256, the grader's version), so a grade that arrives twice is
recorded once, a re-run after a crash grades only what is missing, and a
changed submission (another hash) or a changed grader is graded again. The
ledger feeds nbgrader's gradebook (what `generate_feedback` and the
formgrader read), the `autograded/` notebooks, `grades.csv`, and the export
(`autograder.classroom.export`: Canvas's gradebook import and a per-check CSV), with
the late policy of the course config (`autograder.classroom.term`) applied.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from autograder import assignments
from autograder.classroom import export, item_stats, regrade, term
from autograder.notebooks import notebook
from handson.redis_server import die_with_parent

GRADE_TIMEOUT_S = 600          # one submission, everything included


@dataclass(frozen=True)
class Submission:
    """One notebook in nbgrader's submitted/<student>/<assignment>/ layout."""

    student: str
    assignment: str
    path: Path
    sha: str

    @property
    def key(self) -> str:
        return f"{self.student}/{self.assignment}@{self.sha[:12]}"


def grader_version(assignment: str | None = None) -> str:
    """The version of everything that decides `assignment`'s grades (see regrade)."""
    return regrade.version(assignment)


def discover(root: Path, only: list[str] | None = None) -> tuple[list[Submission],
                                                                  list[str]]:
    """Every <student>/<assignment>/<assignment>.ipynb under root; and what is odd."""
    known = set(assignments.names())
    subs, skipped = [], []
    if not root.is_dir():
        raise notebook.SubmissionError(f"{root} is not a folder of submissions "
                                       "(nbgrader's submitted/<student>/<assignment>/)")
    for student_dir in sorted(p for p in root.iterdir() if p.is_dir()):
        for a_dir in sorted(p for p in student_dir.iterdir() if p.is_dir()):
            name = a_dir.name
            if only and name not in only:
                continue
            if name not in known:
                skipped.append(f"{student_dir.name}/{name}: no such assignment")
                continue
            nb = a_dir / f"{name}.ipynb"
            if not nb.is_file():
                skipped.append(f"{student_dir.name}/{name}: no {name}.ipynb")
                continue
            sha = hashlib.sha256(nb.read_bytes()).hexdigest()
            subs.append(Submission(student_dir.name, name, nb, sha))
    return subs, skipped


# --- the job: runs on a Dask worker, anywhere with a checkout -----------------------

# What the grading processes import, once for each worker of the class: every
# grade is a fork of a server that did (`python -m autograder grade` in a fresh
# interpreter spent about 0.4 s of CPU on these imports, every submission).
GRADER_PRELOAD = ("autograder.cli", *assignments.REGISTRY.values())


def _run_grade(args: list[str], env: dict) -> tuple[int | None, str, str]:
    """`python -m autograder ARGS` in the repository, forked from this process's
    server of graders where it can be: (its exit code, None past
    GRADE_TIMEOUT_S; its stdout; its stderr)."""
    from handson.infra import remote_module, warm_start

    # A server started with this environment: what the grader's modules read
    # of it when imported is what a fresh interpreter's would read.
    label = "graders-" + hashlib.sha256(json.dumps(sorted(env.items()))
                                        .encode()).hexdigest()[:12]
    server = warm_start.ours(label, popen=remote_module.Spawner.popen, env=env,
                             preload=GRADER_PRELOAD)
    with tempfile.TemporaryDirectory(prefix="eo-grade-") as tmp:
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        with open(out_path, "wb") as out:
            proc = server.start("autograder", args, env, str(err_path),
                                {1: out.fileno()}, cwd=str(notebook.REPO))
        if proc is None:                    # its server is gone: a fresh one
            try:
                # A grader killed with its worker takes its grade with it.
                res = subprocess.run(
                    [sys.executable, "-m", "autograder", *args], capture_output=True,
                    text=True, env=env, timeout=GRADE_TIMEOUT_S, cwd=notebook.REPO,
                    preexec_fn=functools.partial(die_with_parent, os.getpid()))
            except subprocess.TimeoutExpired:
                return None, "", ""
            return res.returncode, res.stdout, res.stderr
        try:
            code = proc.wait(GRADE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)     # its session's group
            proc.kill()
            proc.wait()
            return None, "", ""
        return (code, out_path.read_text(errors="replace"),
                err_path.read_text(errors="replace") if err_path.exists() else "")


def grade_job(assignment: str, nb_bytes: bytes, quick: bool) -> dict:
    """Grade one notebook's bytes in a child process; plain data back."""
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="eo-class-") as tmp:
        path = Path(tmp) / f"{assignment}.ipynb"
        path.write_bytes(nb_bytes)
        args = ["grade", str(path), "--json"] + (["--quick"] if quick else [])
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        code, stdout, stderr = _run_grade(args, env)
    if code is None:
        return {"error": f"the grade did not finish in {GRADE_TIMEOUT_S} s"}
    where = os.uname().nodename
    if code in (0, 1) and stdout.strip():
        try:
            data = json.loads(stdout)
        except ValueError:
            data = None
        if isinstance(data, dict) and "checks" in data:
            data["grader_host"] = f"{where}:{os.getpid()}"
            data["grade_s"] = round(time.monotonic() - start, 2)
            return data
    why = (stderr.strip().splitlines() or ["no output"])[-1]
    return {"error": f"could not be graded (exit {code}): {why}"[:500]}


# --- the record: one writer, idempotent ----------------------------------------------

class Ledger:
    """Grades keyed by (student, assignment, sha, grader): insert once, read many."""

    def __init__(self, path: Path):
        self.path = path
        self.con = sqlite3.connect(path, timeout=30)
        self.con.execute("pragma journal_mode=wal")
        self.con.execute(
            "create table if not exists grades (student text, assignment text, "
            "sha text, grader text, score int, max_score int, grade_s real, "
            "result text, recorded_at real, "
            "primary key (student, assignment, sha, grader))")
        self.con.execute("create table if not exists graders (grader text primary "
                         "key, files text)")
        self.con.commit()

    def note_grader(self, grader: str, files: dict[str, str]) -> None:
        """The files behind a grader version, to say later what changed."""
        with self.con:
            self.con.execute("insert into graders values (?, ?) on conflict do "
                             "nothing", (grader, json.dumps(files)))

    def files(self, grader: str) -> dict[str, str] | None:
        row = self.con.execute("select files from graders where grader=?",
                               (grader,)).fetchone()
        return json.loads(row[0]) if row else None

    def previous(self, sub: Submission, grader: str) -> tuple[str, dict] | None:
        """The latest grade of this very notebook by another grader version."""
        row = self.con.execute(
            "select grader, result from grades where student=? and assignment=? "
            "and sha=? and grader!=? order by recorded_at desc limit 1",
            (sub.student, sub.assignment, sub.sha, grader)).fetchone()
        return (row[0], json.loads(row[1])) if row else None

    def has(self, sub: Submission, grader: str) -> bool:
        return self.con.execute(
            "select 1 from grades where student=? and assignment=? and sha=? and "
            "grader=?", (sub.student, sub.assignment, sub.sha, grader)
        ).fetchone() is not None

    def record(self, sub: Submission, grader: str, result: dict) -> bool:
        """True if this grade is new; a second delivery changes nothing."""
        with self.con:
            cur = self.con.execute(
                "insert into grades values (?,?,?,?,?,?,?,?,?) on conflict do nothing",
                (sub.student, sub.assignment, sub.sha, grader, result["score"],
                 result["max_score"], result.get("grade_s"), json.dumps(result),
                 time.time()))
        return cur.rowcount == 1

    def result(self, sub: Submission, grader: str) -> dict | None:
        row = self.con.execute(
            "select result from grades where student=? and assignment=? and sha=? "
            "and grader=?", (sub.student, sub.assignment, sub.sha, grader)).fetchone()
        return json.loads(row[0]) if row else None

    def count(self) -> int:
        return self.con.execute("select count(*) from grades").fetchone()[0]


def _ensure_assignment(gb, name: str, db_url: str) -> None:
    """The assignment's notebook and grade cells, from solutions/, if not there."""
    from nbgrader.api import MissingEntry
    from nbgrader.preprocessors import SaveCells

    with contextlib.suppress(MissingEntry):
        a = gb.find_assignment(name)
        if a.notebooks:
            return
    gb.update_or_create_assignment(name)
    source = notebook.read(notebook.source_notebook(name))
    SaveCells().preprocess(source, {"nbgrader": {
        "notebook": name, "assignment": name, "db_url": db_url}})


def write_gradebook(db_url: str, sub: Submission, result: dict,
                    late_penalty: float = 0.0) -> None:
    """nbgrader's rows for this submission: setting a score twice is one write."""
    from nbgrader.api import Gradebook, MissingEntry

    _venv_on_path()
    with warnings.catch_warnings(), Gradebook(db_url) as gb:
        # nbgrader's own add_submission trips SQLAlchemy's autoflush warning.
        warnings.filterwarnings("ignore", module="nbgrader")
        _ensure_assignment(gb, sub.assignment, db_url)
        gb.update_or_create_student(sub.student)
        try:
            gb.find_submission(sub.assignment, sub.student)
        except MissingEntry:
            gb.add_submission(sub.assignment, sub.student)
        for check in result["checks"]:
            with contextlib.suppress(MissingEntry):
                g = gb.find_grade(check["name"], sub.assignment, sub.assignment,
                                  sub.student)
                g.auto_score = float(check["points"])
                g.needs_manual_grade = False
        with contextlib.suppress(MissingEntry):
            gb.find_submission_notebook(sub.assignment, sub.assignment, sub.student
                                        ).late_submission_penalty = (
                late_penalty or None)
        gb.db.commit()


def _venv_on_path() -> None:
    """nbgrader runs `alembic` to create its database: it must be on PATH."""
    bin_dir = os.path.dirname(sys.executable)
    if bin_dir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bin_dir + os.pathsep + os.environ.get("PATH", "")


def write_autograded(course: Path, sub: Submission, result: dict,
                     late: str = "") -> Path:
    """The submission with each grade cell showing its verdict, for feedback."""
    import nbformat

    from autograder.judges.checks import GradeResult, Outcome
    from autograder.notebooks.nbgrader_grade import write_outcomes

    graded = GradeResult(
        assignment=result["assignment"], submission=str(sub.path),
        outcomes=[Outcome(**{k: c[k] for k in OUTCOME_FIELDS if k in c})
                  for c in result["checks"]],
        problems=result.get("problems", []), replay=result.get("replay", ""),
        efficiency=result.get("efficiency", {}),
        elapsed_s=result.get("elapsed_s", 0.0), quick=result.get("quick", False),
        notes=result.get("notes", []) + ([late] if late else []))
    nb = notebook.for_grading(notebook.read(sub.path), sub.assignment).nb
    write_outcomes(nb, graded)
    out = course / "autograded" / sub.student / sub.assignment / sub.path.name
    out.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(out))
    return out


OUTCOME_FIELDS = ("name", "title", "max_points", "ok", "message", "expected", "got",
                  "witnesses", "replay", "timelines")


# --- the run ---------------------------------------------------------------------

@dataclass
class ClassRun:
    """What a grade-class run did: for the report, the CSV and the tests."""

    graded: dict[str, dict] = field(default_factory=dict)     # key -> result
    recorded_now: list[str] = field(default_factory=list)
    already: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)      # key -> why
    skipped: list[str] = field(default_factory=list)
    deliveries: Counter = field(default_factory=Counter)      # key -> results seen
    finals: list = field(default_factory=list)                # export.Final
    regraded: dict[str, str] = field(default_factory=dict)    # key -> the diff
    unchanged: list[str] = field(default_factory=list)        # regraded, same
    would: list[str] = field(default_factory=list)            # --dry-run
    written: list = field(default_factory=list)               # files for the course
    warnings: list = field(default_factory=list)              # about the export
    elapsed_s: float = 0.0
    workers: int = 0


def default_workers() -> int:
    """One grade per core, and no more than memory allows (about 1.5 GB each)."""
    import psutil

    by_mem = int(psutil.virtual_memory().available / 1.5e9)
    return max(1, min(os.cpu_count() or 1, by_mem))


def _client(workers: int, scheduler: str | None):
    import dask
    from distributed import Client, LocalCluster

    # A grade killed with its worker is handed to another this many times.
    dask.config.set({"distributed.scheduler.allowed-failures": 3,
                     "distributed.worker.daemon": False,
                     "distributed.logging.distributed": "error"})
    if scheduler:
        return Client(scheduler, timeout=30), None, None
    # The workers' scratch space goes with the cluster (`_close`), not left in
    # the temporary directory.
    scratch = tempfile.mkdtemp(prefix="dask-")
    dask.config.set({"temporary-directory": scratch})
    cluster = LocalCluster(n_workers=workers, threads_per_worker=1, processes=True,
                           dashboard_address=None, silence_logs=40,
                           local_directory=scratch)
    return Client(cluster), cluster, scratch


def _close(client, cluster, scratch: str | None) -> None:
    client.close()
    if cluster is not None:
        cluster.close()
    if scratch:
        shutil.rmtree(scratch, ignore_errors=True)


def _bar(done: int, total: int, running: int, failed: int, start: float) -> str:
    width = 24
    filled = int(width * done / total) if total else width
    elapsed = time.monotonic() - start
    left = (f"~{elapsed / done * (total - done):.0f} s left" if done else
            "time left: after the first grade")
    return (f"[{'#' * filled}{'.' * (width - filled)}] {done}/{total} graded, "
            f"{running} running, {failed} failed, {left}")


def grade_class(root: Path, *, course: Path | None = None, only=None,
                workers: int | None = None, scheduler: str | None = None,
                quick: bool = False, progress=None,
                dry_run: bool = False) -> ClassRun:
    """Grade what is not yet recorded by its grader version; record each grade
    exactly once; say per student what a regrade changed."""
    course = course or root.parent
    say = progress or (lambda line: None)
    start = time.monotonic()
    subs, skipped = discover(root, only)
    rules = term.load(course)          # a bad course config stops us before grading
    files = {a: regrade.manifest(a) for a in sorted({s.assignment for s in subs})}
    graders = {a: regrade.version(a) for a in files}
    run = ClassRun(skipped=skipped, workers=workers or default_workers())
    if dry_run:
        run.would = _would(subs, course / "grade-class.db", graders, files)
        return run
    ledger = Ledger(course / "grade-class.db")
    for a, grader in graders.items():
        ledger.note_grader(grader, files[a])
    db_url = f"sqlite:///{course / 'gradebook.db'}"
    todo = []
    for s in subs:
        if ledger.has(s, graders[s.assignment]):
            run.already.append(s.key)
            run.graded[s.key] = ledger.result(s, graders[s.assignment])
        else:
            todo.append(s)
    say(f"{len(subs)} submissions: {len(run.already)} already graded by this "
        f"grader version, {len(todo)} to grade on "
        + (f"the cluster at {scheduler}" if scheduler else
           f"{run.workers} local graders"))
    if todo:
        _grade_todo(todo, run, ledger, graders, quick, scheduler, say, start)
    run.finals = export.finals(subs, ledger, graders, rules)
    for g in run.finals:                      # the gradebook mirrors the ledger
        if _changed(run, ledger, g.sub, graders, course):
            write_gradebook(db_url, g.sub, g.result, g.late.penalty)
            write_autograded(course, g.sub, g.result, g.late.text)
    write_csv(course / "grades.csv", subs, ledger, graders)
    run.written = [course / "grades.csv",
                   *export.export(course, run.finals, rules),
                   course / "item-stats.md"]
    run.warnings = export.warnings(run.finals, rules)
    item_stats.write(run.written[-1], [g.result for g in run.finals])
    run.elapsed_s = time.monotonic() - start
    return run


def _would(subs, ledger_path: Path, graders, files) -> list[str]:
    """--dry-run: what a run would grade or regrade, and why; nothing written."""
    ledger = Ledger(ledger_path) if ledger_path.exists() else None
    out = []
    for s in subs:
        grader = graders[s.assignment]
        if ledger is not None and ledger.has(s, grader):
            continue
        before = ledger.previous(s, grader) if ledger is not None else None
        if before is None:
            out.append(f"{s.key}: would grade (not graded before)")
            continue
        changed = regrade.changed_files(ledger.files(before[0]), files[s.assignment])
        out.append(f"{s.key}: would regrade, because "
                   + (", ".join(changed) if changed else "the grader changed"))
    return out


def _changed(run: ClassRun, ledger: Ledger, sub: Submission, graders,
             course: Path) -> bool:
    """Whether this grade is to be written out: new, or a regrade that changed
    it (an unchanged regrade leaves gradebook and feedback as they were)."""
    if sub.key not in run.recorded_now:
        return not (course / "autograded" / sub.student / sub.assignment /
                    sub.path.name).exists()
    grader = graders[sub.assignment]
    before = ledger.previous(sub, grader)
    if before is None:
        return True
    new = ledger.result(sub, grader)
    if not regrade.diff(before[1], new):
        run.unchanged.append(sub.key)
        return False
    files = regrade.changed_files(ledger.files(before[0]), ledger.files(grader) or {})
    run.regraded[sub.key] = regrade.describe(sub.key, before[1], new, files)
    return True


# A local cluster left with no worker this long is started afresh (at most
# RESTARTS times) with what is still pending: grades are recorded once, so a
# grade handed out twice costs time, never a second record.
NO_WORKER_S, RESTARTS = 20.0, 3


def _grade_todo(todo, run: ClassRun, ledger: Ledger, graders, quick: bool,
                scheduler: str | None, say, start: float, restarts: int = 0
                ) -> None:
    """Hand every submission in `todo` to the Dask workers; record each grade."""
    from distributed import wait

    client, cluster, scratch = _client(run.workers, scheduler)
    left = None
    try:
        futures = {client.submit(grade_job, s.assignment, s.path.read_bytes(),
                                 quick, key=f"grade-{s.key}", pure=False): s
                   for s in todo}
        pending = set(futures)
        last, shown, alone_since = 0.0, None, None
        while pending:
            try:
                done, pending = wait(pending, timeout=1.0,
                                     return_when="FIRST_COMPLETED")
            except TimeoutError:
                done = set()
            for fut in done:
                sub = futures[fut]
                _settle(fut, sub, run, ledger, graders[sub.assignment])
            now = time.monotonic()
            if cluster is not None and restarts < RESTARTS:
                if client.scheduler_info()["workers"]:
                    alone_since = None
                elif alone_since is None:
                    alone_since = now
                elif now - alone_since > NO_WORKER_S:
                    left = [futures[f] for f in pending]
                    say(f"every grader of the local cluster is gone; starting "
                        f"it again for the {len(left)} left")
                    break
            processing = sum(len(v) for v in client.processing().values())
            state = (len(run.graded) - len(run.already), processing,
                     len(run.failed))
            if state != shown or now - last >= 15:
                last, shown = now, state
                say(_bar(state[0] + state[2], len(todo), processing,
                         state[2], start))
    finally:
        _close(client, cluster, scratch)
    if left:
        _grade_todo(left, run, ledger, graders, quick, scheduler, say, start,
                    restarts + 1)


def _settle(fut, sub: Submission, run: ClassRun, ledger: Ledger,
            grader: str) -> None:
    try:
        result = fut.result()
    except Exception as err:  # noqa: BLE001 - KilledWorker, lost connection, ...
        kind = type(err).__name__
        why = ("its grader was killed 3 times (KilledWorker)" if kind == "KilledWorker"
               else f"{kind}: {err}")
        run.failed[sub.key] = why[:300]
        return
    if "error" in result:
        run.failed[sub.key] = result["error"]
        return
    run.deliveries[sub.key] += 1
    if ledger.record(sub, grader, result):
        run.recorded_now.append(sub.key)
    run.graded[sub.key] = ledger.result(sub, grader)


def write_csv(path: Path, subs: list[Submission], ledger: Ledger,
              graders: dict[str, str]) -> None:
    """One row per submission: score, max, and points per check."""
    rows = []
    for s in subs:
        r = ledger.result(s, graders[s.assignment])
        if r is None:
            continue
        rows.append({"student": s.student, "assignment": s.assignment,
                     "sha256": s.sha[:16], "score": r["score"],
                     "max_score": r["max_score"], "grade_s": r.get("grade_s", ""),
                     "checks": " ".join(f"{c['name']}={c['points']}"
                                        for c in r["checks"])})
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["student", "assignment", "sha256", "score",
                                          "max_score", "grade_s", "checks"])
        w.writeheader()
        w.writerows(rows)


def report(run: ClassRun) -> str:
    """Per assignment: scores, the checks the class got wrong, times; then failures."""
    by_a: dict[str, list[dict]] = defaultdict(list)
    for r in run.graded.values():
        if r:
            by_a[r["assignment"]].append(r)
    lines = [f"graded {len(run.recorded_now)} now, {len(run.already)} recorded "
             f"before, {len(run.failed)} could not be graded, in "
             f"{run.elapsed_s:.0f} s"]
    for name in sorted(by_a):
        rs = by_a[name]
        top = rs[0]["max_score"]
        dist = Counter(r["score"] for r in rs)
        lines += ["", f"{name}: {len(rs)} submissions, max {top}",
                  "  scores:      " + ", ".join(
                      f"{s}/{top}: {n}" for s, n in sorted(dist.items(),
                                                           reverse=True))]
        misses = Counter(c["name"] for r in rs for c in r["checks"] if not c["ok"])
        if misses:
            lines.append("  most missed: " + ", ".join(
                f"{n} ({k} of {len(rs)})" for n, k in misses.most_common(5)))
        times = [r["grade_s"] for r in rs if r.get("grade_s")]
        if times:
            lines.append(f"  grade time:  median {statistics.median(times):.1f} s, "
                         f"max {max(times):.1f} s per submission")
    if run.regraded or run.unchanged:
        lines += ["", f"regraded after a grader change: {len(run.regraded)} "
                  f"changed, {len(run.unchanged)} unchanged (left as they were)"]
        lines += ["  " + d for _, d in sorted(run.regraded.items())]
    if run.finals:
        lines += ["", "item statistics:", item_stats.text(item_stats.collect(
            [g.result for g in run.finals]))]
    if run.written:
        lines += ["", "wrote " + ", ".join(str(p) for p in run.written)]
    lines += [f"warning: {w}" for w in run.warnings]
    if run.failed or run.skipped:
        lines += ["", "could not be graded:"]
        lines += [f"  {k}: {why}" for k, why in sorted(run.failed.items())]
        lines += [f"  {s}" for s in run.skipped]
    return "\n".join(lines)
