"""`python -m autograder corpus`, run once on the queues: every wrong queue in
tests/corpus/queues loses a check, every correct one (and the reference queue)
scores full marks.

Each wrong queue must be caught by the check that names its bug, so a weaker
check cannot hide behind another that happens to fail. The outbox and claims
modules (graded by their assignments' sandboxed runs, a minute or two each) are
listed here, and graded by the command without a folder, not by the suite.
"""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from autograder.judges import corpus

pytestmark = pytest.mark.timeout(600)

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
    "extend_after_own_fail": "zombie_extend_refused",
    "dead_without_reason": "poison_to_dlq_with_reason",
    "attempts_second_trip": "killed_between_replies",
    "claim_two_trips": "killed_between_replies",
    "lease_whole_seconds": "lease_time_scales",
    "reap_grace_wrong_sign": "lease_time_scales",
    "reap_own_clock": "deadline_from_server_clock",
}
LINE = re.compile(r"^(mutant|correct)\s+(\S+)\s+(CAUGHT by (\S+?):|ESCAPED|FULL|LOST)")


def test_the_corpus_command_catches_every_mutant_and_passes_the_rest(redis_url):
    env = {**os.environ, "REDIS_URL": redis_url}
    out = subprocess.run([sys.executable, "-m", "autograder", "corpus",
                          str(corpus.CORPUS)],
                         capture_output=True, text=True, env=env, timeout=590)
    rows = {m[2]: m for m in map(LINE.match, out.stdout.splitlines()) if m}
    names = {name for name, _, _ in corpus.queues(corpus.CORPUS)}
    assert set(rows) == names, out.stdout + out.stderr
    mutants = {n for n, m in rows.items() if m[1] == "mutant"}
    assert len(mutants) >= 23 and len(rows) - len(mutants) >= 5
    for name, m in rows.items():
        want = "CAUGHT" if name in mutants else "FULL"
        assert m[3].startswith(want), out.stdout
    for name, check in CAUGHT_BY.items():
        assert rows[name][4] == check, out.stdout
    assert f"catch rate: {len(mutants)}/{len(mutants)} mutants caught" in out.stdout
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_corpus_spans_the_assignments():
    """Without a folder the command grades the queues, the outbox modules and
    the claims modules: at least 30 mutants, correct alternatives of each."""
    found = [item for f in corpus.folders(None) for item in corpus.queues(f)]
    kinds = {name.split("/")[0] if "/" in name else "queues"
             for name, _, _ in found}
    assert {"queues", "outbox", "claims"} <= kinds
    assert sum(m for _, _, m in found) >= 30
    for kind in ("outbox", "claims"):
        mine = [m for name, _, m in found if name.startswith(kind + "/")]
        assert mine.count(True) >= 4 and mine.count(False) >= 2, (kind, mine)


def test_the_heartbeats_corpus_has_its_kinds():
    """At least 8 wrong heartbeat modules and 3 correct alternatives."""
    mine = [m for _, _, m in corpus.queues(corpus.ROOT / "heartbeats")]
    assert mine.count(True) >= 8 and mine.count(False) >= 4, mine


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
