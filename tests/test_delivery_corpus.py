"""`python -m autograder corpus tests/corpus/delivery`: every wrong version of the
delivery-semantics functions loses the check that names its bug, every correct
alternative scores full marks, graded through the judge's `evaluate_file` (the
notebook's own sandboxed harness)."""

import os
import re
import subprocess
import sys

import pytest

from autograder.judges import corpus

pytestmark = pytest.mark.timeout(600)

FOLDER = corpus.ROOT / "delivery"
CAUGHT_BY = {
    "ack_before_acks_after": "ack_before_work",
    "after_work_sink_shared": "ack_after_work",
    "key_includes_attempt": "dedup_key_stable",
    "key_cached_per_worker": "dedup_key_stable",
    "in_tx_key_after_effect": "dedup_in_tx",
    "in_tx_trusts_crash_flag": "dedup_in_tx",
    "in_tx_keys_kept_between_calls": "dedup_in_tx",
    "outside_tx_keys_per_delivery": "dedup_outside_tx",
    "window_off_by_one": "window_escapes",
    "window_ignores_max_delay": "window_escapes",
    "window_state_at_module_level": "window_escapes",
    "lease_counts_slow_only": "lease_doubles",
    "lease_fixed_seed": "lease_doubles",
    "lease_rng_at_module_level": "lease_doubles",
}
# What the catching check's verdict says: the step and what it ran beside.
SAYS = {
    "after_work_sink_shared": "second call: job",
    "in_tx_keys_kept_between_calls": "second call: job",
    "in_tx_trusts_crash_flag": "delivery 1 ran, then delivery 2 ran",
    "outside_tx_keys_per_delivery": "delivery 1 ran, then delivery 2 ran",
    "key_cached_per_worker": "(fresh worker) !=",
    "lease_rng_at_module_level": "on the call again",
    "window_state_at_module_level": "on the call again",
}
LINE = re.compile(r"^(mutant|correct)\s+delivery/(\S+)\s+"
                  r"(CAUGHT by (\S+?): (.*)|ESCAPED|FULL|LOST)")


def test_the_delivery_corpus_is_graded_right(redis_url):
    env = {**os.environ, "REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus",
                          str(FOLDER)], capture_output=True, text=True, env=env,
                         timeout=590)
    rows = {m[2]: m for m in map(LINE.match, out.stdout.splitlines()) if m}
    assert set(rows) == {p.stem for p in FOLDER.glob("*.py")}, out.stdout
    mutants = {n for n, m in rows.items() if m[1] == "mutant"}
    assert mutants == set(CAUGHT_BY) and len(rows) - len(mutants) >= 4
    for name, m in rows.items():
        assert m[3].startswith("CAUGHT" if name in mutants else "FULL"), out.stdout
    for name, check in CAUGHT_BY.items():
        assert rows[name][4] == check, out.stdout
    for name, text in SAYS.items():
        assert text in rows[name][5], out.stdout
    assert out.returncode == 0, out.stdout + out.stderr
