"""nbgrader for the course: solutions/ is the source, exercises/ the release.

The instructor's steps, from the repository root (the book's "Doing the
exercises" page and the README give the same ones; a test runs them):

    make exercises          # solutions/ -> exercises/, each assignment recorded
                            # in gradebook.db (nbgrader's database)
    .venv/bin/nbgrader db student add ada
    # collect: submitted/ada/claim_ack_reap/claim_ack_reap.ipynb
    .venv/bin/nbgrader autograde claim_ack_reap
    .venv/bin/nbgrader generate_feedback claim_ack_reap

`make exercises` generates from a clean copy holding only the notebooks, so
nothing a notebook wrote when it ran reaches the release. The grade cells call
`autograder` checks, so `nbgrader autograde` and `python -m autograder grade`
give the same points from the same code.
"""

import os
import sys
import warnings

c = get_config()  # noqa: F821 - injected by nbgrader/traitlets

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "effectively-once"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
# The gradebook (gradebook.db at the root): nbgrader runs `alembic` by name
# when it creates one, so the environment's bin/ must be on PATH even when
# nbgrader was started as .venv/bin/nbgrader (else generate_assignment removes
# the old release and then fails).
_BIN = os.path.dirname(sys.executable)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
# nbgrader's own gradebook code trips SQLAlchemy's autoflush warning ("Object
# of type <SubmittedAssignment> not in session ... will not proceed") on every
# autograde: harmless, and not the instructor's business. Only that one.
warnings.filterwarnings("ignore", message=r"Object of type <\w+> not in session")
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__",
                            "myqueue.py", "heartbeat.py", "*.db", "*.jsonl"]
# Each step of the chaos run and the contract checks has its own limit; this
# one only stops a grade cell that somehow outlives all of them.
c.ExecutePreprocessor.timeout = 300
c.Execute.timeout = 300
# Grade cells are never run in the learner's kernel: in place of nbgrader's
# Execute, autograder.notebooks.nbgrader_grade grades the notebook outside it (the same
# `grade()` as `python -m autograder grade`) and writes each grade cell's
# outcome as its output, which SaveAutoGrades turns into points.
c.Autograde.autograde_preprocessors = [
    "autograder.notebooks.nbgrader_grade.GradeOutsideKernel",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
# The kernel's own log lines ("Kernel is running over TCP without encryption")
# are not the learner's business; its errors still show.
c.Execute.extra_arguments = ["--log-level=ERROR"]
# The term, for `python -m autograder grade-class` (nbgrader ignores this
# section): a due date (UTC) per assignment, and the late policy, a fraction
# of the points off per day or part of a day late, from nbgrader's
# submitted/<student>/<assignment>/timestamp.txt. grade-class applies it in
# grades-canvas.csv and shows it in the autograded notebooks and feedback.
c.Term.due = {}          # e.g. {"claim_ack_reap": "2026-10-12 23:59:00 UTC"}
c.Term.late_penalty_per_day = 0.0     # 0: no late penalty; 0.1: 10 % a day
# grades-canvas.csv already takes the penalty off: with one here, turn Canvas's
# own late policy off for these assignments, or a late student pays twice.
# Canvas's id for each assignment (the number in its address, .../assignments/
# 12345): the export's column is then "claim_ack_reap (12345)", which Canvas's
# import matches to that assignment; without one, the import asks you.
c.Term.canvas_assignment_ids = {}     # e.g. {"claim_ack_reap": 12345}
