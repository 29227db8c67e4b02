"""Grades submissions: checks, chaos runs, reports."""
