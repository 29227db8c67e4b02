"""A submission as a notebook: reading and restoring it, running its cells,
nbgrader's autograde step, the feedback page.

Imported by the learner's kernel too (`run_notebook`): keep this file import-free."""
