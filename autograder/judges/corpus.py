"""`python -m autograder corpus`: grade our wrong and correct modules; the catch rate.

The corpus is a folder of modules per assignment (the tests' `tests/corpus/queues`
for claim_ack_reap and one folder per other assignment, named in FILE_KINDS; a
folder named otherwise holds queues). One
whose docstring starts "Broken on purpose:" is a mutant, a plausible edit of a
correct module, and must lose at least one check; any other is a correct
alternative and must pass them all. The reference queue (`handson.q`) is graded
as one more alternative.

A queue is graded by the queue-contract checks the assignments grade
(claim_ack_reap's, and heartbeats' on extend), run cheapest first: a mutant
stops at its first failure. Only a mutant that every check passes gets a chaos
run, the one `chaos_runs.json` gives it (the run that shows its bug), if it has
one. A module of another folder is graded as its assignment grades the
learner's module (the judge's `evaluate_file`, in the sandbox, on a copy named
as the notebook names it).

Each module but a folder's correct one holds only what it changes: it puts its
own folder first on sys.path and star-imports the correct one (`mini_correct`
among the queues, `correct` in the other folders), so a module of another
folder is graded with a copy of its folder's `correct.py` beside it.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import json
import queue
import shutil
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from autograder.judges import claim_ack_reap, heartbeats
from autograder.judges.results import Evaluation
from autograder.notebooks import notebook

ROOT = notebook.REPO / "tests" / "corpus"
CORPUS = ROOT / "queues"
QUEUES_ASSIGNMENT = "claim_ack_reap"
# Each other folder and the assignment whose judge grades its modules.
FILE_KINDS = {"outbox": "outbox_relay", "claims": "idempotent_claims",
              "pg": "pg_claim_finish", "heartbeats": "heartbeats",
              "delivery": "delivery_semantics"}
MUTANT = "Broken on purpose:"
SLOW_RUNS = ("chaos", "trial")    # a judge's keyword that leaves its slow run out
STAGED = "contract"     # and the one that leaves the staged checks out
BASE = "correct.py"     # what the other modules of an outbox or claims folder import
REFERENCE = "handson.q"
# Cheap and most telling first; the slow concurrent ones last.
FIRST = ("enqueue_idempotent", "claim_returns_payload_and_attempt",
         "lease_time_scales", "interleavings", "killed_between_replies",
         "zombie_ack_refused", "zombie_extend_refused", "zombie_fail_refused")
LAST = ("reap_atomic_concurrent", "claim_atomic_concurrent")
EXTEND_CHECKS = ("zombie_extend_refused", "extend_does_not_resurrect",
                 "heartbeat_keeps_lease")


def checks() -> list[str]:
    """The checks a queue is graded by, in the order they run."""
    names = [c.name for c in claim_ack_reap.CONTRACT_CHECKS]
    names += [c.name for c in heartbeats.CONTRACT_CHECKS if c.name in EXTEND_CHECKS]
    middle = [n for n in names if n not in FIRST and n not in LAST]
    return [n for n in FIRST if n in names] + middle + [n for n in LAST if n in names]


@dataclass
class Graded:
    """One queue of the corpus and what its grading showed."""

    name: str
    spec: str
    mutant: bool
    kind: str = "queues"
    failed: list = field(default_factory=list)     # CheckResult dicts
    passed: list[str] = field(default_factory=list)
    chaos: str = ""                                 # the chaos verdict, if run
    seconds: float = 0.0

    @property
    def assignment(self) -> str:
        return FILE_KINDS.get(self.kind, QUEUES_ASSIGNMENT)

    @property
    def ok(self) -> bool:
        """A mutant caught, or an alternative with full marks."""
        if self.mutant:
            return bool(self.failed) or self.chaos == "invalid"
        return not self.failed

    def line(self) -> str:
        kind = "mutant" if self.mutant else "correct"
        if self.mutant and self.failed:
            first, also = self.failed[0], [f["name"] for f in self.failed[1:]]
            # Another assignment's check says the step and the rival in its
            # message, not in what it got.
            said = ("" if self.kind == "queues" or first["hint"] in first["got"]
                    else f" -- {first['hint']}")
            verdict = (f"CAUGHT by {first['name']}: {first['got']}{said}"
                       + (f" (also lost: {', '.join(also)})" if also else ""))
        elif self.mutant:
            verdict = (f"CAUGHT by the chaos run ({self.chaos})" if self.ok else
                       "ESCAPED: every check passed"
                       + (f", chaos run {self.chaos}" if self.chaos else ""))
        elif self.ok:
            verdict = f"FULL: {len(self.passed)} checks passed"
        else:
            verdict = "LOST " + "; ".join(f"{f['name']}: {f['got']}"
                                          for f in self.failed)
        return f"{kind:<8}{self.name:<34} {verdict}  ({self.seconds:.0f} s)"


def kind_of(folder: Path) -> str:
    return folder.name if folder.name in FILE_KINDS else "queues"


def queues(folder: Path) -> list[tuple[str, str, bool]]:
    """(name, spec, is_mutant) for each module in the folder, then the reference
    queue (for a folder of queues); another kind's names carry the kind."""
    out = []
    kind = kind_of(folder)
    for path in sorted(folder.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        name = path.stem if kind == "queues" else f"{kind}/{path.stem}"
        out.append((name, str(path), doc.startswith(MUTANT)))
    return out + ([(REFERENCE, REFERENCE, False)] if kind == "queues" else [])


def folders(folder: Path | None) -> list[Path]:
    """The folders to grade: the one given, or the corpus's, one per kind."""
    if folder is not None:
        return [folder]
    return [CORPUS] + [ROOT / k for k in FILE_KINDS if (ROOT / k / BASE).is_file()]


def grade_file(name: str, spec: str, mutant: bool, url: str, kind: str) -> Graded:
    """A module of another assignment, graded like a learner's, on a copy of it
    in a folder of its own (the run's work dir), beside a copy of the correct
    module it imports."""
    evaluate = importlib.import_module(f"autograder.judges.{FILE_KINDS[kind]}")
    start = time.monotonic()
    g = Graded(name, spec, mutant, kind)
    with tempfile.TemporaryDirectory(prefix="eo-corpus-") as work:
        copy = Path(work) / evaluate.MODULE_FILE
        shutil.copyfile(spec, copy)
        shutil.copyfile(Path(spec).with_name(BASE), Path(work) / BASE)
        ev = _evaluate(evaluate.evaluate_file, str(copy), url, mutant)
    races = getattr(evaluate, "RACES", ())
    for o in sorted(ev.outcomes, key=lambda o: o.name in races):
        if o.ok:
            g.passed.append(o.name)
        else:
            g.failed.append({"name": o.name, "got": o.got or o.message,
                             "hint": o.message})
    g.seconds = time.monotonic() - start
    return g


def _evaluate(evaluate_file, path: str, url: str, mutant: bool):
    """A mutant first without its judge's slow run (pg's chaos run, the
    heartbeat trial), where the judge can leave it out: a staged check that
    catches it is enough. A mutant every staged check passes gets the slow run
    alone, where the judge can leave the staged checks out (the heartbeat
    trial), else a grading in full; so does a correct module."""
    params = inspect.signature(evaluate_file).parameters
    slow = [p for p in SLOW_RUNS if p in params]
    if mutant and slow:
        ev = evaluate_file(path, url, quick=False, **{slow[0]: False})
        if not all(o.ok for o in ev.outcomes):
            return ev
        if STAGED in params:
            rest = evaluate_file(path, url, quick=False, **{STAGED: False})
            return Evaluation(ev.outcomes + rest.outcomes, ev.problems + rest.problems)
    return evaluate_file(path, url, quick=False)


def grade_one(name: str, spec: str, mutant: bool, url: str, folder: Path) -> Graded:
    from handson.queues.checks import run_checks

    if kind_of(folder) != "queues":
        return grade_file(name, spec, mutant, url, kind_of(folder))
    start = time.monotonic()
    g = Graded(name, spec, mutant)
    for check in checks():
        res = run_checks(spec, url, [check])[0]
        if res.ok:
            g.passed.append(check)
            continue
        g.failed.append({"name": check, "got": res.got, "hint": res.hint})
        if mutant:
            break
    if mutant and not g.failed:
        g.chaos = _chaos(name, spec, url, folder)
    g.seconds = time.monotonic() - start
    return g


def _chaos(name: str, spec: str, url: str, folder: Path) -> str:
    """The verdict of the chaos run that shows this mutant's bug, or ""."""
    runs_file = folder / "chaos_runs.json"
    runs = json.loads(runs_file.read_text()) if runs_file.exists() else {}
    if name not in runs:
        return ""
    from handson.faults.engine import ChaosConfig, run

    cfg = ChaosConfig(queue=spec, seed=1, **runs[name]["config"])
    return run(cfg, redis_url=url).verdict


def _db(url: str, index: int) -> str:
    return f"{url}{'&' if '?' in url else '?'}db={index}"


def grade_corpus(url: str, folder: Path | None = None, workers: int = 3,
                 progress=None) -> list[Graded]:
    """Every module of the folder (or of the corpus) graded, `workers` at a time,
    each worker on a database of its own; the correct ones (they run every
    check) first."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    items = [(*item, f) for f in folders(folder) for item in queues(f)]
    for item in sorted(items, key=lambda x: x[2]):
        todo.put(item)
    graded: list[Graded] = []
    one_at_a_time = threading.Lock()    # two prints at once can share a line

    def worker(db: int) -> None:
        while True:
            try:
                name, spec, mutant, where = todo.get_nowait()
            except queue.Empty:
                return
            g = grade_one(name, spec, mutant, _db(url, db), where)
            graded.append(g)
            if progress:
                with one_at_a_time:
                    progress(g.line())

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(worker, 1 + i) for i in range(workers)]:
            f.result()
    return sorted(graded, key=lambda g: (not g.mutant, g.name))


def _rate(graded: list[Graded]) -> str:
    mutants = [g for g in graded if g.mutant]
    correct = [g for g in graded if not g.mutant]
    caught = sum(g.ok for g in mutants)
    full = sum(g.ok for g in correct)
    rate = 100 * caught / len(mutants) if mutants else 100.0
    return (f"{caught}/{len(mutants)} mutants caught ({rate:.0f}%); "
            f"{full}/{len(correct)} correct modules with full marks")


def summary(graded: list[Graded]) -> str:
    """The catch rate of each assignment graded, then of them all."""
    names = sorted({g.assignment for g in graded})
    lines = [f"{name + ':':<20} {_rate([g for g in graded if g.assignment == name])}"
             for name in names] if len(names) > 1 else []
    return "\n".join(lines + [f"catch rate: {_rate(graded)}"])


def main(folder: str | None, workers: int) -> int:
    from handson.redis_server import redis_url

    path = Path(folder) if folder else None
    if path is not None and not path.is_dir():
        print(f"cannot grade: {path} is not a folder of corpus modules",
              file=sys.stderr)
        return 2
    if path is not None and kind_of(path) != "queues" and not (path / BASE).is_file():
        print(f"cannot grade: {path} has no {BASE}, the module its others import",
              file=sys.stderr)
        return 2
    with redis_url() as url:
        graded = grade_corpus(url, path, workers,
                              progress=lambda line: print(line, flush=True))
    print(summary(graded))
    return 0 if all(g.ok for g in graded) else 1
