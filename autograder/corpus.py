"""`python -m autograder corpus`: grade our wrong and correct queues; the catch rate.

The corpus is a folder of queue modules (the tests' `tests/corpus/queues` by
default). One whose docstring starts "Broken on purpose:" is a mutant, a
plausible edit of a correct queue, and must lose at least one check; any other
is a correct alternative and must pass them all. The reference queue
(`handson.q`) is graded as one more alternative.

The checks are the queue-contract checks the assignments grade (claim_ack_reap's,
and heartbeats' on extend), run cheapest first: a mutant stops at its first
failure. Only a mutant that every check passes gets a chaos run, the one
`chaos_runs.json` gives it (the run that shows its bug), if it has one.
"""

from __future__ import annotations

import ast
import json
import queue
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from autograder import claim_ack_reap, heartbeats, notebook

CORPUS = notebook.REPO / "tests" / "corpus" / "queues"
MUTANT = "Broken on purpose:"
REFERENCE = "handson.q"
# Cheap and most telling first; the slow concurrent ones last.
FIRST = ("enqueue_idempotent", "claim_returns_payload_and_attempt",
         "lease_time_scales", "interleavings", "killed_between_replies",
         "zombie_ack_refused", "zombie_extend_refused", "zombie_fail_refused")
LAST = ("reap_atomic_concurrent", "claim_atomic_concurrent")
EXTEND_CHECKS = ("zombie_extend_refused", "extend_does_not_resurrect")


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
    failed: list = field(default_factory=list)     # CheckResult dicts
    passed: list[str] = field(default_factory=list)
    chaos: str = ""                                 # the chaos verdict, if run
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """A mutant caught, or an alternative with full marks."""
        if self.mutant:
            return bool(self.failed) or self.chaos == "invalid"
        return not self.failed

    def line(self) -> str:
        kind = "mutant" if self.mutant else "correct"
        if self.mutant and self.failed:
            first = self.failed[0]
            verdict = f"CAUGHT by {first['name']}: {first['got']}"
        elif self.mutant:
            verdict = (f"CAUGHT by the chaos run ({self.chaos})" if self.ok else
                       "ESCAPED: every check passed"
                       + (f", chaos run {self.chaos}" if self.chaos else ""))
        elif self.ok:
            verdict = f"FULL: {len(self.passed)} checks passed"
        else:
            verdict = "LOST " + "; ".join(f"{f['name']}: {f['got']}"
                                          for f in self.failed)
        return f"{kind:<8}{self.name:<26}{verdict}  ({self.seconds:.0f} s)"


def queues(folder: Path) -> list[tuple[str, str, bool]]:
    """(name, spec, is_mutant) for each module in the folder, then the reference."""
    out = []
    for path in sorted(folder.glob("*.py")):
        doc = ast.get_docstring(ast.parse(path.read_text())) or ""
        out.append((path.stem, str(path), doc.startswith(MUTANT)))
    return out + [(REFERENCE, REFERENCE, False)]


def grade_one(name: str, spec: str, mutant: bool, url: str, folder: Path) -> Graded:
    from handson.queues.checks import run_checks

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


def grade_corpus(url: str, folder: Path = CORPUS, workers: int = 3,
                 progress=None) -> list[Graded]:
    """Every queue of the folder graded, `workers` at a time, each worker on a
    database of its own; the correct ones (they run every check) first."""
    todo: queue.SimpleQueue = queue.SimpleQueue()
    for item in sorted(queues(folder), key=lambda x: x[2]):
        todo.put(item)
    graded: list[Graded] = []

    def worker(db: int) -> None:
        while True:
            try:
                name, spec, mutant = todo.get_nowait()
            except queue.Empty:
                return
            g = grade_one(name, spec, mutant, _db(url, db), folder)
            graded.append(g)
            if progress:
                progress(g.line())

    with ThreadPoolExecutor(max_workers=workers) as pool:
        for f in [pool.submit(worker, 1 + i) for i in range(workers)]:
            f.result()
    return sorted(graded, key=lambda g: (not g.mutant, g.name))


def summary(graded: list[Graded]) -> str:
    mutants = [g for g in graded if g.mutant]
    correct = [g for g in graded if not g.mutant]
    caught = sum(g.ok for g in mutants)
    full = sum(g.ok for g in correct)
    rate = 100 * caught / len(mutants) if mutants else 100.0
    return (f"catch rate: {caught}/{len(mutants)} mutants caught ({rate:.0f}%); "
            f"{full}/{len(correct)} correct queues with full marks")


def main(folder: str | None, workers: int) -> int:
    from handson.redis_server import redis_url

    path = Path(folder) if folder else CORPUS
    if not path.is_dir():
        print(f"cannot grade: {path} is not a folder of queue modules",
              file=sys.stderr)
        return 2
    with redis_url() as url:
        graded = grade_corpus(url, path, workers,
                              progress=lambda line: print(line, flush=True))
    print(summary(graded))
    return 0 if all(g.ok for g in graded) else 1
