"""The benchmark: no-op jobs through the reference queue and through real peers.

`python -m handson.bench` (or `make bench`, which installs the peers first from
`requirements-bench.txt`). See `run.py` for what is measured and how.
"""
