"""`python -m autograder corpus`, run once on the whole corpus: every wrong
module of every assignment loses a check, every correct one (and the reference
queue) scores full marks, and each assignment's catch rate is printed.

Each wrong module must be caught by the check that names its bug, so a weaker
check cannot hide behind another that happens to fail.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.judges import corpus

pytestmark = pytest.mark.timeout(1500)

CAUGHT_BY = {
    "ack_check_then_act": "interleavings",
    "fail_check_then_act": "interleavings",
    "extend_check_then_act": "interleavings",
    "enqueue_client_exists": "interleavings",
    "claim_watch_gives_up": "interleavings",
    "reap_not_atomic": "interleavings",
    "reap_two_trips": "killed_between_replies",
    "enqueue_two_trips": "killed_between_replies",
    "extend_no_fence": "zombie_extend_refused",
    "extend_worker_clock": "deadline_from_server_clock",
    "extend_whole_seconds": "heartbeat_keeps_lease",
    "fail_no_fence": "zombie_fail_refused",
    "ack_after_own_fail": "zombie_ack_refused",
    "attempt_counts_failures": "zombie_ack_refused",
    "extend_after_own_fail": "zombie_extend_refused",
    "fail_requeues_extend_zadd": "zombie_extend_refused",
    "dead_without_reason": "poison_to_dlq_with_reason",
    "attempts_second_trip": "killed_between_replies",
    "claim_two_trips": "killed_between_replies",
    "lease_whole_seconds": "lease_time_scales",
    "reap_grace_wrong_sign": "lease_time_scales",
    "reap_own_clock": "deadline_from_server_clock",
    "outbox/consumer_checks_then_writes": "consumers_interleaved",
    "outbox/consumer_connection_cache": "consumers_reused",
    "outbox/consumer_temp_table_key": "consumers_reused",
    "outbox/high_water_mark": "no_skip_out_of_order",
    "outbox/mark_before_publish": "relay_nothing_lost",
    "outbox/relay_marks_all_unsent": "writers_race_relay",
    "outbox/relay_marks_id_range": "writers_race_relay",
    "outbox/relay_tx_marks_all_unsent": "writers_race_relay",
    "outbox/relay_marks_then_publishes": "killed_between_round_trips",
    "outbox/relay_remembers_last_id": "no_skip_out_of_order",
    "outbox/save_no_transaction": "killed_between_round_trips",
    "outbox/save_two_steps": "save_atomic",
    "outbox/summarize_two_statements": "killed_between_round_trips",
    "claims/confirmation_claim_by_last_rowid": "one_worker_many_deliveries",
    "claims/confirmation_lookup_then_claim": "confirmation_interleaved",
    "claims/effect_in_two_transactions": "same_transaction_effect",
    "claims/points_begin_without_rollback": "one_worker_many_deliveries",
    "claims/points_lookup_then_claim": "points_interleaved",
    "claims/points_pauses_at_the_end": "killed_between_round_trips",
    "heartbeats/extend_after_own_fail": "zombie_extend_refused",
    "heartbeats/extend_revives_reaped": "zombie_extend_refused",
    "heartbeats/extend_no_fence": "zombie_extend_refused",
    "heartbeats/extend_worker_clock": "deadline_from_server_clock",
    "heartbeats/interval_equals_lease": "long_jobs_run_once",
    "heartbeats/beats_in_bursts": "long_jobs_run_once",
    "heartbeats/thread_never_joined": "long_jobs_run_once",
    "heartbeats/thread_started_after_work": "stops_when_lease_lost",
    "heartbeats/never_stops_work": "stops_when_lease_lost",
    "heartbeats/no_final_check": "final_lease_check",
    "pg/ack_then_effect": "finish_failed_no_ack",
    "pg/claim_keeps_advisory_lock": "finish_refused_no_effect",
    "pg/claim_two_transactions": "claim_skips_locked",
    "pg/claim_waits_for_locks": "claim_skips_locked",
    "pg/effect_then_ack_two_tx": "finish_refused_no_effect",
    "pg/fence_in_process_memory": "finish_refused_no_effect",
    "pg/finish_checks_then_acts": "finish_refused_no_effect",
    "pg/finish_forgets_failed": "finish_refused_no_effect",
    "pg/finish_only_a_lease": "finish_refused_no_effect",
    "pg/finish_twice_accepted": "finish_refused_no_effect",
    "pg/lease_from_worker_clock": "claim_oldest_with_lease",
    "pg/lease_from_worker_datetime": "claim_oldest_with_lease",
    "pg/claim_orders_by_id": "claim_oldest_with_lease",
    "pg/finish_fence_worker_clock": "finish_refused_no_effect",
    "delivery/ack_before_acks_after": "ack_before_work",
    "delivery/after_work_sink_shared": "ack_after_work",
    "delivery/key_includes_attempt": "dedup_key_stable",
    "delivery/key_cached_per_worker": "dedup_key_stable",
    "delivery/key_hash_of_string": "dedup_key_stable",
    "delivery/key_counter_per_worker": "dedup_key_stable",
    "delivery/in_tx_key_after_effect": "dedup_in_tx",
    "delivery/in_tx_trusts_crash_flag": "dedup_in_tx",
    "delivery/in_tx_keys_kept_between_calls": "dedup_in_tx",
    "delivery/outside_tx_keys_per_delivery": "dedup_outside_tx",
    "delivery/window_off_by_one": "window_escapes",
    "delivery/window_ignores_max_delay": "window_escapes",
    "delivery/window_state_at_module_level": "window_escapes",
    "delivery/window_fixed_seed": "window_escapes",
    "delivery/lease_counts_slow_only": "lease_doubles",
    "delivery/lease_fixed_seed": "lease_doubles",
    "delivery/lease_rng_at_module_level": "lease_doubles",
    "delivery/lease_ignores_n": "lease_doubles",
}
# What the catching check says: the step and what ran beside it.
RIVAL_STEP = "while a rival host's"
SAYS = {
    "outbox/relay_marks_id_range": "meanwhile writers ran",
    "outbox/relay_tx_marks_all_unsent": "unsent rows",
    "outbox/consumer_connection_cache": "its connection had taken document",
    "claims/confirmation_lookup_then_claim": "meanwhile the same delivery ran",
    "claims/confirmation_claim_by_last_rowid": "kept one connection across deliveries",
    "heartbeats/extend_after_own_fail": "called fail (True), then extend",
    "heartbeats/interval_equals_lease": "gaps from the call to each extend",
    "heartbeats/thread_never_joined": "the heartbeat outlived its job",
    "pg/ack_then_effect": "the job done",
    "pg/claim_keeps_advisory_lock": "a rival host's claim, on its own connection",
    "pg/claim_two_transactions": RIVAL_STEP,
    "pg/claim_waits_for_locks": "held j1's row lock",
    "pg/effect_then_ack_two_tx": RIVAL_STEP,
    "pg/fence_in_process_memory": "zombie",
    "pg/finish_checks_then_acts": RIVAL_STEP,
    "pg/finish_forgets_failed": "own fail",
    "pg/finish_only_a_lease": "zombie",
    "pg/finish_twice_accepted": "own successful finish",
    "pg/lease_from_worker_clock": "an hour ahead",
    "pg/lease_from_worker_datetime": "an hour ahead",
    "pg/claim_orders_by_id": "ORDER BY queued_at, id",
    "pg/finish_fence_worker_clock": "but so was the owner",
    "delivery/after_work_sink_shared": "second call: job",
    "delivery/in_tx_keys_kept_between_calls": "second call: job",
    "delivery/in_tx_trusts_crash_flag": "delivery 1 ran, then delivery 2 ran",
    "delivery/outside_tx_keys_per_delivery": "delivery 1 ran, then delivery 2 ran",
    "delivery/key_cached_per_worker": "(fresh worker) !=",
    "delivery/key_hash_of_string": "(fresh worker) !=",
    "delivery/key_counter_per_worker": "(fresh worker) !=",
    "delivery/window_fixed_seed": "differs from the page's",
    "delivery/lease_ignores_n": "differs from the page's",
    "delivery/lease_rng_at_module_level": "on the call again",
    "delivery/window_state_at_module_level": "on the call again",
}
ASSIGNMENTS = (corpus.QUEUES_ASSIGNMENT, *corpus.FILE_KINDS.values())
ALSO_LOST = re.compile(r"\(also lost: ([^)]*)\)")


def failed_checks(row):
    """The check that reports first, and those its line says also failed: a
    race may catch a mutant first on a loaded machine, before the check that
    catches it on every schedule."""
    also = ALSO_LOST.search(row[5])
    return [row[4], *(also[1].split(", ") if also else [])]


LINE = re.compile(r"^(mutant|correct)\s+(\S+)\s+"
                  r"(CAUGHT by (\S+?): (.*)|ESCAPED|FULL|LOST)")


def test_the_corpus_command_catches_every_mutant_and_passes_the_rest(redis_url):
    env = {**os.environ, "REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus"],
                         capture_output=True, text=True, env=env, timeout=1450)
    rows = {m[2]: m for m in map(LINE.match, out.stdout.splitlines()) if m}
    found = [item for f in corpus.folders(None) for item in corpus.queues(f)]
    assert set(rows) == {name for name, _, _ in found}, out.stdout + out.stderr
    mutants = {n for n, m in rows.items() if m[1] == "mutant"}
    for name, m in rows.items():
        want = "CAUGHT" if name in mutants else "FULL"
        assert m[3].startswith(want), out.stdout
    for name, check in CAUGHT_BY.items():
        assert check in failed_checks(rows[name]), out.stdout
    for name, phrase in SAYS.items():
        assert phrase in rows[name][5], rows[name][0]
    for assignment in ASSIGNMENTS:
        mine = [n for n in rows if _assignment(n) == assignment]
        bad = len([n for n in mine if n in mutants])
        assert (f"{assignment + ':':<20} {bad}/{bad} mutants caught (100%); "
                f"{len(mine) - bad}/{len(mine) - bad} correct modules") in out.stdout
    assert f"catch rate: {len(mutants)}/{len(mutants)} mutants caught" in out.stdout
    assert out.returncode == 0, out.stdout + out.stderr


def _assignment(name: str) -> str:
    kind = name.split("/")[0] if "/" in name else "queues"
    return corpus.FILE_KINDS.get(kind, corpus.QUEUES_ASSIGNMENT)


def test_the_corpus_spans_the_assignments():
    """Without a folder the command grades a folder per assignment, each with
    at least 8 wrong modules and 3 correct alternatives."""
    found = [item for f in corpus.folders(None) for item in corpus.queues(f)]
    assert {_assignment(name) for name, _, _ in found} == set(ASSIGNMENTS)
    for assignment in ASSIGNMENTS:
        mine = [m for name, _, m in found if _assignment(name) == assignment]
        assert mine.count(True) >= 8 and mine.count(False) >= 3, (assignment, mine)


def _top_level(path) -> dict[str, str]:
    """A module's functions and assignments by name, each as its syntax tree."""
    out = {}
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef):
            out[node.name] = ast.dump(node)
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            out[node.targets[0].id] = ast.dump(node)
    return out


@pytest.mark.parametrize("kind", corpus.FILE_KINDS)
def test_each_module_holds_only_what_it_changes(kind):
    """An outbox or claims module star-imports its folder's correct one and
    defines nothing the correct one defines alike."""
    folder = corpus.ROOT / kind
    base = _top_level(folder / corpus.BASE)
    others = [p for p in sorted(folder.glob("*.py")) if p.name != corpus.BASE]
    assert others
    for path in others:
        imports = [n.module for n in ast.walk(ast.parse(path.read_text()))
                   if isinstance(n, ast.ImportFrom) and n.names[0].name == "*"]
        assert imports == [Path(corpus.BASE).stem], path
        mine = _top_level(path)
        assert mine and not [n for n, tree in mine.items()
                             if base.get(n) == tree], path


def test_a_folder_without_its_correct_module_is_refused(tmp_path):
    folder = tmp_path / "claims"
    folder.mkdir()
    (folder / "wrong.py").write_text('"""Broken on purpose: no base."""\n')
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus",
                          str(folder)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "has no correct.py" in out.stderr, out.stderr


def test_a_folder_that_is_not_one_is_refused(tmp_path):
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus",
                          str(tmp_path / "nowhere")], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and "is not a folder" in out.stderr
