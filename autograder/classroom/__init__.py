"""Grading a class: in parallel with a ledger, regrades, the term's late policy,
which checks a class misses, and the export to a gradebook."""
