"""nbgrader for the course: solutions/ is the source, exercises/ the release.

    nbgrader generate_assignment claim_ack_reap --force --no-db   # -> exercises/
    nbgrader autograde claim_ack_reap      # submitted/<student>/claim_ack_reap/

The grade cells call `autograder` checks, so `nbgrader autograde` and
`python -m autograder grade` give the same points from the same code.
"""

import os

c = get_config()  # noqa: F821 - injected by nbgrader/traitlets

c.CourseDirectory.root = os.path.dirname(os.path.abspath(__file__))
c.CourseDirectory.course_id = "effectively-once"
c.CourseDirectory.source_directory = "solutions"
c.CourseDirectory.release_directory = "exercises"
c.CourseDirectory.ignore = [".ipynb_checkpoints", "*.pyc", "__pycache__",
                            "myqueue.py", "heartbeat.py", "*.db", "*.jsonl"]
# Each step of the chaos run and the contract checks has its own limit; this
# one only stops a grade cell that somehow outlives all of them.
c.ExecutePreprocessor.timeout = 300
c.Execute.timeout = 300
# Grade cells are never run in the learner's kernel: in place of nbgrader's
# Execute, autograder.nbgrader_grade grades the notebook outside it (the same
# `grade()` as `python -m autograder grade`) and writes each grade cell's
# outcome as its output, which SaveAutoGrades turns into points.
c.Autograde.autograde_preprocessors = [
    "autograder.nbgrader_grade.GradeOutsideKernel",
    "nbgrader.preprocessors.IgnorePattern",
    "nbconvert.preprocessors.ClearMetadataPreprocessor",
    "nbgrader.preprocessors.LimitOutput",
    "nbgrader.preprocessors.SaveAutoGrades",
    "nbgrader.preprocessors.AssignLatePenalties",
    "nbgrader.preprocessors.CheckCellMetadata",
]
