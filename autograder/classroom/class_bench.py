"""`python -m autograder bench --class N`: a mixed class graded as one, and its cost.

The class is `sample_class.compose`'s (claim_ack_reap: a third correct, a third
wrong, a third untouched, broken or hanging, in a shuffled order).
`grade-class` grades it on this machine (`--workers`, default grade-class's),
measured as `bench` measures one grade: every process's CPU, by the kernel's
own accounting. It prints the wall and CPU time; how the progress bar's
estimate of the time left compared with the time that was really left to the
last grade (the gradebook, export and cluster's end come after); and
per kind, the mean points and seconds a grade. With `--alone`, one copy of
each distinct notebook is graded alone too, and every copy in the class must
have its points, check by check (a check that sees a bug only when a kill
lands in its gap may not: the table names such checks). With `--workers`
given more than once, the same class is graded once per count, and a last
table says how it scaled: each run's wall and CPU time against the first's.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

from autograder import bench
from autograder.classroom import grade_class, sample_class
from autograder.notebooks import notebook

BAR = re.compile(r"\] (\d+)/(\d+) graded.*~(\d+) s left")
AT = (0.1, 0.25, 0.5, 0.75)             # where the estimate is read, of the class


def estimates(heard: list[tuple[float, str]], end: float) -> list[dict]:
    """The bar's "~N s left" first read at or past each fraction of AT, beside
    the time that was left to its last grade (`end` if it never said all)."""
    seen = []
    for t, line in heard:
        m = BAR.search(line)
        if m:
            done, total, left = map(int, m.groups())
            seen.append((done / total, t, left))
    end = next((t for frac, t, _ in seen if frac >= 1), end)
    out = []
    for at in AT:
        later = [s for s in seen if s[0] >= at]
        reading = later and {"done": round(later[0][0], 2), "said_s": later[0][2],
                             "was_s": round(end - later[0][1], 1)}
        if reading and reading not in out:      # a small class: one for two
            out.append(reading)
    return out


def scores(course: Path) -> dict[str, tuple[float, float, float, dict]]:
    """student -> (score, max, seconds its grade took, {check: points}), from
    grades.csv."""
    path = course / "grades.csv"
    if not path.exists():
        return {}
    with open(path, newline="") as f:
        return {r["student"]: (float(r["score"]), float(r["max_score"]),
                               float(r["grade_s"] or 0),
                               {k: float(v) for k, v in (
                                   c.split("=") for c in r["checks"].split())})
                for r in csv.DictReader(f)}


def _alone(path: Path) -> dict | None:
    """{check: points} of one notebook graded by itself as grade-class grades
    one (its own Redis, its time limit, its exit codes); None: no grade."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("REDIS_URL", "DATABASE_URL")}
    try:
        done = subprocess.run([sys.executable, "-m", "autograder", "grade",
                               str(path), "--json"], capture_output=True, text=True,
                              timeout=grade_class.GRADE_TIMEOUT_S, env=env,
                              cwd=notebook.REPO)
        if done.returncode not in (0, 1):
            return None
        return {c["name"]: float(c["points"])
                for c in json.loads(done.stdout)["checks"]}
    except (subprocess.TimeoutExpired, ValueError, KeyError, TypeError):
        return None


def differences(alone: dict | None, copies: list) -> dict[str, list]:
    """check -> [its points alone, then in each copy of the class] where they
    are not all one; {"grade": [whether each was graded]} where some were not
    (none graded, as a file that is no notebook, is agreement)."""
    graded = [alone is not None, *(c is not None for c in copies)]
    if not all(graded):
        return {"grade": graded} if any(graded) else {}
    return {name: [points, *(c[3].get(name) for c in copies)]
            for name, points in alone.items()
            if any(c[3].get(name) != points for c in copies)}


def run(n: int, workers: int | None = None, alone: bool = False,
        say=lambda line: None) -> dict:
    with tempfile.TemporaryDirectory(prefix="eo-class-bench-") as tmp:
        course = Path(tmp) / "course"
        students = sample_class.compose(course / "submitted", n)
        say(f"a class of {n} {sample_class.ASSIGNMENT} submissions: "
            + ", ".join(f"{sum(k == kind for _, k in students.values())} {kind}"
                        for kind in sample_class.KINDS))
        heard: list[tuple[float, str]] = []

        def hear(line: str) -> None:
            heard.append((time.monotonic(), line))
            say(line)
        cmd = [sys.executable, "-m", "autograder", "grade-class",
               str(course / "submitted"), "--course", str(course),
               *(["--workers", str(workers)] if workers else [])]
        said = Path(tmp) / "grade-class.out"
        cost = bench.measure(cmd, cwd=notebook.REPO, echo=hear, stdout=said)
        end = time.monotonic()
        got = scores(course)
        failed = [{"student": student, "variant": students[student][0],
                   "kind": students[student][1], "why": why}
                  for student, why in not_graded(said.read_text())
                  if student in students]
        kinds: dict[str, list] = defaultdict(list)
        for student, (_, kind) in students.items():
            kinds[kind].append(got.get(student))
        per_kind = {kind: {"n": len(v), "graded": sum(x is not None for x in v),
                           "mean_points": _mean([x[0] for x in v if x]),
                           "max_points": max((x[1] for x in v if x), default=0),
                           "mean_grade_s": _mean([x[2] for x in v if x])}
                    for kind, v in kinds.items()}
        differ = []
        if alone:
            names = sorted({name for name, _ in students.values()})
            for i, name in enumerate(names, 1):
                copies = [s for s, (v, _) in students.items() if v == name]
                say(f"alone {i}/{len(names)}: {name} ({len(copies)} in the class)")
                path = (course / "submitted" / copies[0] / sample_class.ASSIGNMENT
                        / f"{sample_class.ASSIGNMENT}.ipynb")
                apart = differences(_alone(path), [got.get(s) for s in copies])
                if apart:
                    differ.append({"variant": name, "checks": apart})
    return {"n": n, "workers": workers, "cost": cost,
            "estimates": estimates(heard, end), "kinds": per_kind,
            "failed": failed, "alone_checked": alone, "differ": differ}


def not_graded(summary: str) -> list[tuple[str, str]]:
    """(student, why) for each submission grade-class's summary says it could
    not grade (its key is student/assignment)."""
    if "could not be graded:" not in summary:
        return []
    rows = summary.split("could not be graded:", 1)[1].splitlines()
    out = []
    for row in rows:
        key, sep, why = row.strip().partition(": ")
        if sep and "/" in key:
            out.append((key.split("/")[0], why))
    return out


def _mean(xs: list[float]) -> float:
    return round(sum(xs) / len(xs), 1) if xs else 0.0


def table(res: dict) -> str:
    c = res["cost"]
    out = [f"grade-class of {res['n']}: wall {c['wall_s']:.0f} s, "
           f"CPU {c['cpu_s']:.0f} s (judge {c['judge_s']:.0f}, learner "
           f"{c['learner_s']:.0f}, servers {c['servers_s']:.0f}), "
           f"{c['tasks'] or '-'} tasks",
           f"{'kind':<10} {'n':>4} {'graded':>7} {'points':>9} {'s a grade':>10}"]
    for kind in sample_class.KINDS:
        k = res["kinds"].get(kind)
        if k:
            out.append(f"{kind:<10} {k['n']:>4} {k['graded']:>7} "
                       f"{k['mean_points']:>5}/{k['max_points']:<3g} "
                       f"{k['mean_grade_s']:>10}")
    for e in res["estimates"]:
        out.append(f"at {e['done']:.0%} graded the bar said ~{e['said_s']} s left; "
                   f"{e['was_s']} s were")
    for f in res.get("failed", []):
        if f["kind"] != "broken":      # a broken notebook has no grade to give
            out.append(f"not graded: {f['student']} ({f['variant']}, {f['kind']}): "
                       f"{f['why']}")
    if res["alone_checked"] and not res["differ"]:
        out.append("graded alone, every distinct notebook had its class points")
    for d in res["differ"]:
        out.append(f"{d['variant']}: points alone, then in the class: " + "; ".join(
            f"{check} {' '.join(map(str, pts))}" for check, pts in d["checks"].items()))
    return "\n".join(out)


def scaling(runs: list[dict]) -> list[dict]:
    """Per run, what its workers bought against the first run's: the wall time
    it took over the first's (speedup) and the CPU it used over the first's."""
    first = runs[0]["cost"]
    return [{"workers": r["workers"], "wall_s": round(r["cost"]["wall_s"]),
             "cpu_s": round(r["cost"]["cpu_s"]),
             "graded": sum(k["graded"] for k in r["kinds"].values()),
             "speedup": round(first["wall_s"] / r["cost"]["wall_s"], 2),
             "cpu_ratio": round(r["cost"]["cpu_s"] / first["cpu_s"], 2)}
            for r in runs]


def scaling_table(rows: list[dict]) -> str:
    out = [f"{'workers':>7} {'wall s':>7} {'CPU s':>7} {'graded':>7} "
           f"{'speedup':>8} {'CPU ratio':>10}"]
    out += [f"{r['workers'] or 'default':>7} {r['wall_s']:>7} {r['cpu_s']:>7} "
            f"{r['graded']:>7} {r['speedup']:>8} {r['cpu_ratio']:>10}" for r in rows]
    return "\n".join(out)


def main(args) -> int:
    counts = args.workers or [None]
    if args.cls < 3 or any(w is not None and w < 1 for w in counts):
        print("cannot bench: --class needs at least 3 submissions and --workers "
              "at least 1", file=sys.stderr)
        return 2
    say = lambda m: print(m, file=sys.stderr, flush=True)      # noqa: E731
    runs = []
    for i, workers in enumerate(counts):
        if len(counts) > 1:
            say(f"the class with {workers} worker(s): run {i + 1} of {len(counts)}")
        # one class (compose is seeded), each distinct notebook alone once
        runs.append(run(args.cls, workers, args.alone and i == 0, say))
    if args.json:
        print(json.dumps(runs[0] if len(runs) == 1 else
                         {"runs": runs, "scaling": scaling(runs)}, indent=1))
    else:
        print("\n\n".join(table(r) for r in runs))
        if len(runs) > 1:
            print("\n" + scaling_table(scaling(runs)))
    return 0 if not any(r["differ"] for r in runs) else 1
