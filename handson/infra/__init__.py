"""Machinery: PostgreSQL, learner-module loading and hosting, worker processes."""
