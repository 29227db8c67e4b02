"""Where untrusted code runs: the sandbox's supervisor, the confine launcher
(namespaces, cgroups, Landlock), and the run's confined Redis and PostgreSQL.

Imports nothing else of the grader: everything above stands on it."""
