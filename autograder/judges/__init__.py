"""One judge per assignment, and what only the judges use: checks and their
outcomes, the sandboxed runs on a learner's module, the own-work rule, the corpus."""
