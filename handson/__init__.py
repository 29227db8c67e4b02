"""The runnable lab: what a learner runs from a terminal."""
