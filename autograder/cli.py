"""`python -m autograder`: grade a submission, or check your own work quickly.

    python -m autograder grade PATH [--json] [--html OUT.html] [--assignment NAME]
                                                # the full grade (what counts)
    python -m autograder check PATH_OR_NAME [--only CHECK ...]
                                                # the quick version while working
    python -m autograder list                   # the assignments and their checks
    python -m autograder grade-class submitted/ # a whole class, in parallel
                                                # (--dry-run: what would regrade)
    python -m autograder corpus [FOLDER]        # our wrong and correct queues:
                                                # the catch rate
    python -m autograder bench [--assignment NAME] [--repeat N] [--json]
    python -m autograder bench --against CHECKOUT [--assignment NAME] [--repeat N]
                                                # what grading each reference
                                                # costs, beside nbgrader's
    python -m autograder bench --class N [--workers W] [--alone]
                                                # a mixed class of N, graded

Exit code: 0 full marks, 1 points lost, 2 could not grade (bad path or name).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from autograder import assignments
from autograder.grade import grade
from autograder.notebooks import notebook


def _find(target: str) -> Path:
    """A notebook path, a folder, or an assignment name (your copy, else ours)."""
    p = Path(target)
    if p.exists():
        return p
    if target in assignments.names():
        for candidate in (Path(f"{target}.ipynb"), Path(target) / f"{target}.ipynb",
                          notebook.RELEASE_DIR / target / f"{target}.ipynb"):
            if candidate.exists():
                return candidate
    raise notebook.SubmissionError(
        f"{target} is neither a notebook, a folder nor an assignment with a "
        f"notebook here; assignments: {', '.join(assignments.names())}")


def _grade_class(args) -> int:
    from autograder.classroom import grade_class, term

    if args.workers is not None and args.workers < 1:
        print("cannot grade: --workers must be at least 1", file=sys.stderr)
        return 2
    try:
        run = grade_class.grade_class(
            Path(args.submitted), course=Path(args.course) if args.course else None,
            only=args.only, workers=args.workers, scheduler=args.scheduler,
            quick=args.quick, dry_run=args.dry_run,
            progress=lambda m: print(m, file=sys.stderr, flush=True))
    except (notebook.SubmissionError, term.TermError, OSError) as err:
        print(f"cannot grade: {err}", file=sys.stderr)
        return 2
    if args.dry_run:
        print("\n".join(run.would) or "nothing to grade: every submission is "
              "graded by the current grader")
        return 0
    print(grade_class.report(run))
    return 0 if not run.failed else 1


def _one_line(text: str) -> str:
    """What a learner's code said, as one line with no control characters (an
    exception's text could otherwise print a PASS line of its own)."""
    return " ".join("".join(c if c.isprintable() else " " for c in text).split())


def _heard(only: list[str] | None):
    """`check` prints each verdict as it comes, a failure with what it got."""
    start = time.monotonic()

    def heard(name: str, ok: bool, why: str) -> None:
        if only and name not in only:
            return
        line = f"... {time.monotonic() - start:5.1f} s  {'PASS' if ok else 'FAIL'}  "
        line += name if ok else f"{name}: {_one_line(why)[:200]}"
        print(line, file=sys.stderr, flush=True)
    return heard


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m autograder", description=__doc__
                                .splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    g = sub.add_parser("grade", help="grade a notebook or an assignment folder")
    g.add_argument("path")
    g.add_argument("--json", action="store_true", help="print the result as JSON")
    g.add_argument("--html", metavar="OUT.html",
                   help="also write the grade as a self-contained page, with the "
                        "failing chaos runs drawn")
    g.add_argument("--quick", action="store_true",
                   help="fewer cases where an assignment has them (what `check` "
                        "does)")
    c = sub.add_parser("check", help="the quick version: fewer cases")
    c.add_argument("target", help="a notebook, its folder, or an assignment name")
    c.add_argument("--json", action="store_true")
    for sp in (g, c):
        sp.add_argument("--assignment", metavar="NAME",
                        help="the assignment this must be: refuse any other")
        sp.add_argument("--only", nargs="+", metavar="CHECK",
                        help="report only these checks (see `list` for names)")
    sub.add_parser("list", help="the assignments and their checks")
    k = sub.add_parser("grade-class", help="grade every submission of a class in "
                       "parallel (nbgrader's submitted/<student>/<assignment>/)")
    k.add_argument("submitted", help="the submitted/ folder")
    k.add_argument("--assignment", action="append", dest="only",
                   help="only this assignment (repeatable)")
    k.add_argument("--workers", type=int, help="parallel graders on this machine "
                   "(default: from the cores and memory)")
    k.add_argument("--scheduler", help="a Dask scheduler's address, e.g. "
                   "tcp://host:8786, whose workers grade (on other machines)")
    k.add_argument("--course", help="where gradebook.db, grade-class.db, "
                   "autograded/ and grades.csv go (default: submitted/'s parent)")
    k.add_argument("--quick", action="store_true", help="fewer cases (as `check`)")
    k.add_argument("--dry-run", action="store_true", help="only say what would be "
                   "graded or regraded (after a grader or source change), and why")
    q = sub.add_parser("corpus", help="grade the corpus of wrong and correct "
                       "modules and print each assignment's catch rate")
    q.add_argument("folder", nargs="?", help="one folder of modules "
                   "(default: the tests' corpus, every assignment)")
    q.add_argument("--workers", type=int, default=3,
                   help="queues graded at once (default 3)")
    b = sub.add_parser("bench", help="what grading each assignment's reference "
                       "costs (wall, CPU, tasks; judge, learner, servers), beside "
                       "nbgrader autograde of the same notebook")
    b.add_argument("--assignment", action="append", metavar="NAME",
                   help="only this assignment (repeatable; default: all)")
    b.add_argument("--repeat", type=int, default=1,
                   help="runs per assignment; the run of median CPU is shown")
    b.add_argument("--json", action="store_true")
    b.add_argument("--against", metavar="CHECKOUT",
                   help="grade another checkout of the course (with its own .venv) "
                   "in turn with this one, and print the ratio of their CPU")
    b.add_argument("--class", type=int, dest="cls", metavar="N",
                   help="instead: grade a class of N claim_ack_reap submissions "
                   "mixed as a real one is (grade-class), and say what it cost")
    b.add_argument("--workers", type=int, action="append",
                   help="with --class: parallel graders; given more than once, "
                   "the class is graded with each, and how it scales is shown")
    b.add_argument("--alone", action="store_true", help="with --class: grade each "
                   "distinct notebook alone too, and compare the points")
    args = p.parse_args(argv)

    if args.cmd == "corpus":
        from autograder.judges import corpus

        return corpus.main(args.folder, max(1, args.workers))
    if args.cmd == "bench" and args.cls is not None and args.against is not None:
        p.error("bench: --against compares references, --class grades a class: "
                "one or the other")
    if args.cmd == "bench" and args.cls is not None:
        from autograder.classroom import class_bench

        return class_bench.main(args)
    if args.cmd == "bench":
        from autograder import bench

        return bench.main(args)
    if args.cmd == "list":
        for name in assignments.names():
            mod = assignments.load(name)
            total = sum(ch.points for ch in mod.CHECKS)
            print(f"{name} ({total} points)")
            for ch in mod.CHECKS:
                print(f"  {ch.name:<34}{ch.points:>3}  {ch.title}")
        return 0
    if args.cmd == "grade-class":
        return _grade_class(args)
    quick = args.cmd == "check" or args.quick
    target = args.path if args.cmd == "grade" else args.target
    progress = None if args.json else (lambda m: print(f"... {m}", file=sys.stderr))
    heard = None if args.json or args.cmd != "check" else _heard(args.only)
    try:
        result = grade(_find(target), quick=quick, progress=progress,
                       assignment=args.assignment, only=args.only, on_check=heard)
    except (notebook.SubmissionError, KeyError) as err:
        print(f"cannot grade: {str(err).strip(chr(39))}", file=sys.stderr)
        return 2
    print(result.to_json() if args.json else result.text())
    if getattr(args, "html", None):
        from autograder.notebooks.feedback import page

        Path(args.html).write_text(page(result))
        if not args.json:
            print(f"  feedback page: {args.html}")
    return 0 if result.score == result.max_score else 1
