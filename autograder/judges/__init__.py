"""One judge per assignment, and what judging needs: checks and their outcomes
(the result every report reads), the sandboxed runs on a learner's module, the
own-work rule, the catch rate on the corpus."""
