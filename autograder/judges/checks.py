"""Checks, their outcomes, and the two ways a learner meets them.

An assignment module (`autograder.judges.claim_ack_reap`, ...) declares `CHECKS`
(name, points, title), an `observe(...)` that runs the learner's code and
returns plain data, and a `judge(observations, quick)` that turns the data into
one `Outcome` per check. Judging is pure and trusted; observing is where
untrusted code runs, and the grader only ever does it in a sandboxed process.

The notebook's grade cells call `check(NAME)` (each assignment module wraps
`notebook_check` below): it observes once per kernel, judges, and raises
AssertionError with the learner-actionable message, so nbgrader's points and
`python -m autograder grade`'s points come from the same `judge`.

The types (`Check`, `Outcome`, `GradeResult`, ...) live in `results.py`, below
the feedback page that draws them; they are importable from here too.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from autograder.judges.results import (  # noqa: F401  (importers use them here)
    Check,
    Evaluation,
    GradeResult,
    Outcome,
    cost_line,
    not_run,
    outcome,
)


def round_trips(check: Check, data: dict | None, err: str, expected: str,
                done: str = "kills between round trips") -> Outcome:
    """The kills (or stops) after each round trip of the learner's functions
    (`handson.round_trips`): the first schedule that broke a rule, and what to
    change; `data` None: the run's error `err`."""
    if data is None:
        return outcome(check, False, err)
    bad = data.get("failed")
    kills = sum(data["kills"].values())
    fine = (f"{kills} {done}, nothing lost, no effect twice" if kills else
            "no round trip left a gap: where the call could be stopped, it "
            "held its transaction, so nothing was half done")
    return outcome(check, bad is None, bad and bad["fix"], expected,
                   bad["schedule"] if bad else fine)


_MISSED_PAUSE = re.compile(
    r"expected 'paused ([\w-]+)( \d+)?' from worker \d+ \(.*?\), got (.*?); "
    r"stderr: (.*)", re.S)


def missed_pause(error: str, where: str = "") -> str:
    """A worker that never reached its named pause point, said in learner words.

    The lab's workers announce `paused POINT` when the learner's code calls
    pause(POINT); the grader kills them there. A worker that ran past the
    point says something else, and the raw protocol text would mean nothing
    to the learner. Any other error comes back unchanged.
    """
    m = _MISSED_PAUSE.search(error)
    if m is None:
        return error
    point, n, got, stderr = m.groups()
    call = f'pause("{point}"' + (", n" if n else "") + ")"
    finished = f"it printed {got[:200]}"
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        data = json.loads(got.strip("'\""))
        if "outcome" in data:
            finished = f"your function returned {data['outcome']!r}"
    text = (f"your code never called {call}{where}: the grader crashes the worker "
            "at that exact point, so the case cannot run without it. The worker "
            f"went on to the end instead ({finished})")
    stderr = stderr.strip()
    if stderr and stderr != "(still running)":
        text += f"; its error output: {stderr[-300:]}"
    return text


# --- the notebook side -------------------------------------------------------

_CACHE: dict = {}


def cached(key, compute):
    """Observe once per kernel per submission state: every grade cell reuses it."""
    if key not in _CACHE:
        _CACHE.clear()
        _CACHE[key] = compute()
    return _CACHE[key]


def cached_only(key):
    """The full result for this key if a grade cell already computed it."""
    return _CACHE.get(key)


def notebook_check(outcomes: list[Outcome], name: str) -> None:
    """A grade cell: print the pass, or raise with what to fix."""
    by_name = {o.name: o for o in outcomes}
    if name not in by_name:
        raise KeyError(f"no check named {name!r}; known: {', '.join(by_name)}")
    o = by_name[name]
    if not o.ok:
        raise AssertionError("\n" + o.explain())
    print(f"[PASS] {o.name}  {o.points}/{o.max_points}  {o.title}")


def notebook_summary(outcomes: list[Outcome], reused: bool = False) -> bool:
    """The learner's check cell: a table, then the first failure in full.

    `reused`: the outcomes are the full run a grade cell already made.
    """
    for o in outcomes:
        print(f"  [{'PASS' if o.ok else 'FAIL'}] {o.name:<34} "
              f"{o.points:>2}/{o.max_points:<2} {o.title}")
    total = sum(o.points for o in outcomes)
    run = ("on the full run the grade cells above already made (reused, not run "
           "again)" if reused else
           "on the quick run (the grader runs more seeds)")
    print(f"  {total}/{sum(o.max_points for o in outcomes)} points {run}")
    failed = [o for o in outcomes if not o.ok]
    if failed:
        print("\nFirst failure:\n" + failed[0].explain())
        _show_pictures(failed)
    return not failed


def _show_pictures(failed: list[Outcome]) -> None:
    """In a notebook, the failing runs drawn under the check cell."""
    if not any(o.timelines for o in failed):
        return
    try:
        from IPython import get_ipython
        from IPython.display import HTML, display
    except ImportError:
        return
    if get_ipython() is None:
        return
    from autograder.notebooks.feedback import figures

    sys.stdout.flush()
    display(HTML(figures(failed)))


def linked_outside(path: str, shown_path: str) -> str:
    """Why a module file that is a link out of its folder is not judged ('' if
    it is not one): its host may write in the module's folder, never the
    link target's."""
    here = os.path.dirname(os.path.abspath(path))
    if os.path.islink(path) and os.path.dirname(os.path.realpath(path)) != here:
        return (f"{shown_path} is a link to a file outside its folder: the grader "
                "judges only a module file that is really there")
    return ""


@dataclass
class ModuleFile:
    """An assignment judged from the one module file its notebook writes.

    `judge_file(path, redis_url, quick, shown_path=...)` does the judging; the
    rest is the same for every such assignment: the grader's `evaluate`, the
    grade cells' `check` (one full run per kernel and file content) and the
    check cell's `check_all` (that run if a grade cell made it, else a quick one),
    each with a private Redis when the assignment needs one.
    """

    tag: str
    filename: str
    judge_file: Callable[..., Evaluation]
    needs_redis: bool = True

    def _judge(self, path: str, redis_url, quick: bool, shown_path: str
               ) -> Evaluation:
        """judge_file, after `own_work` has said which checks the file may earn."""
        from autograder import assignments
        from autograder.judges import own_work

        outside = linked_outside(path, shown_path)
        if outside:
            return Evaluation(not_run(assignments.load(self.tag).CHECKS, outside),
                              [outside])
        policy = own_work.POLICIES.get(self.tag)
        if policy is None:
            return self.judge_file(path, redis_url, quick, shown_path=shown_path)
        review = own_work.review(path, policy, shown_path)
        checks = assignments.load(self.tag).CHECKS
        if review.everything:         # nothing of it is judged, nothing of it runs
            return Evaluation(not_run(checks, review.everything[0]),
                              review.everything[:3])
        ev = self.judge_file(path, redis_url, quick, shown_path=shown_path)
        refused = {c.name: review.refusal(policy, c.name) for c in checks}
        for o in ev.outcomes:
            if refused.get(o.name):
                o.ok, o.message, o.expected, o.got = False, refused[o.name], "", ""
                o.witnesses, o.replay, o.timelines = [], "", []
        ev.problems += sorted(set(review.functions.values()))
        return ev

    def evaluate(self, workdir, redis_url: str, quick: bool) -> Evaluation:
        return self._judge(str(Path(workdir) / self.filename), redis_url, quick,
                           self.filename)

    def _run_here(self, path: str, quick: bool) -> Evaluation:
        real = str(Path(path).resolve())
        if not self.needs_redis:
            return self._judge(real, None, quick, path)
        from autograder.isolation import server

        redis = server.start()
        try:
            ev = self._judge(real, redis.url, quick, path)
            ev.problems += redis.refusals()
            return ev
        finally:
            redis.stop()

    def _key(self, path: str) -> tuple:
        with contextlib.suppress(OSError):
            return (self.tag, hashlib.sha256(Path(path).read_bytes()).hexdigest())
        return (self.tag, None)

    def check(self, name: str, path: str | None = None) -> None:
        """A grade cell: pass, or raise with what to fix."""
        path = path or self.filename
        ev = cached(self._key(path), lambda: self._run_here(path, False))
        for p in ev.problems:
            print("!", p)
        notebook_check(ev.outcomes, name)

    def check_all(self, path: str | None = None) -> bool:
        """The learner's check cell: every check, the first failure in full."""
        path = path or self.filename
        start = time.monotonic()
        ev = cached_only(self._key(path))
        reused = ev is not None
        ev = ev or self._run_here(path, True)
        for p in ev.problems:
            print("!", p)
        ok = notebook_summary(ev.outcomes, reused)
        if ev.efficiency.get("yours"):
            print("\n" + cost_line(ev.efficiency).strip())
        if ev.replay:
            print(f"\nReplay the chaos run: {ev.replay}")
        if not reused:
            print(f"  (quick run: {time.monotonic() - start:.1f} s)")
        sys.stdout.flush()
        return ok
