"""The c01 script against the page it comes from.

The golden files in tests/golden/c01 are the page's published outputs, copied
once; the page's seeds are fixed, so the script must reproduce them exactly.
"""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from handson import c01_job_scheduler as c01

ROOT = Path(__file__).resolve().parents[1]
HANDSON = ROOT / "handson"
GOLDEN = ROOT / "tests" / "golden" / "c01"
CHAPTER = ROOT / "book" / "c01_delivery_semantics.md"
HEADER = re.compile(r"^=== (.*)$")


def golden(name):
    return (GOLDEN / name).read_text()


def script(*args, timeout=60):
    """Run the script the way the page says: from inside handson/."""
    return subprocess.run(
        [sys.executable, "c01_job_scheduler.py", *args], cwd=HANDSON,
        capture_output=True, text=True, timeout=timeout)


def sections(out):
    """[(header title, body)] with each body as the page would print it."""
    found, title, body = [], None, []
    for line in out.splitlines():
        m = HEADER.match(line)
        if m:
            if title is not None:
                found.append((title, body))
            title, body = m.group(1), []
        elif title is not None and not line.startswith("    teaches: "):
            body.append(line)
    if title is not None:
        found.append((title, body))
    return [(t, "\n".join(b).strip("\n") + "\n") for t, b in found]


def block_titles(upto):
    return [f"Block {n}: {c01.BLOCKS[n].title}" for n in range(1, upto + 1)]


def test_full_run_is_the_page_six_blocks_then_the_assembly():
    run = script()
    assert run.returncode == 0, run.stderr
    got = sections(run.stdout)
    assert [t for t, _ in got] == block_titles(6) + ["The assembly"]
    for n in range(1, 7):
        assert got[n - 1][1] == golden(f"block{n}.txt"), f"block {n}"
    assert got[6][1] == golden("assembly.txt")


def test_block_3_prints_block_3_and_its_prerequisites_only():
    run = script("--block", "3")
    assert run.returncode == 0, run.stderr
    got = sections(run.stdout)
    assert [t for t, _ in got] == block_titles(3)
    for n in range(1, 4):
        assert got[n - 1][1] == golden(f"block{n}.txt"), f"block {n}"
    assert "Four designs" not in run.stdout


def test_quiet_prints_only_the_assembly():
    run = script("--quiet")
    assert run.returncode == 0, run.stderr
    assert "===" not in run.stdout
    assert run.stdout.strip("\n") + "\n" == golden("assembly.txt")


def test_verify_prints_the_page_and_passes():
    run = script("--verify")
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout == golden("verify.txt")
    assert run.stdout.rstrip().endswith("9/9 claims verified")


@pytest.mark.parametrize("patch, broken", [
    # a heartbeat slower than the lease: the B6 renewal claim must fail
    (("RENEW_EVERY", 2.0),
     "B6  a heartbeat removes the dependency on job duration entirely"),
    # no crashes at all: nothing can escape a bounded window, so B4 must fail
    (("CRASH", 0.0), "B4  a window below the max redelivery delay leaks duplicates"),
])
def test_verify_fails_when_one_claim_is_broken(monkeypatch, capsys, patch, broken):
    monkeypatch.setattr(c01, *patch)
    assert c01.main(["--verify"]) == 1
    lines = capsys.readouterr().out.splitlines()
    failed = [line for line in lines if line.startswith("  [FAIL] ")]
    assert len(failed) == 1 and failed[0].startswith(f"  [FAIL] {broken}")
    assert lines[-1] == "  8/9 claims verified"


def test_verify_exit_status_is_non_zero_when_a_claim_breaks():
    code = ("import sys, c01_job_scheduler as m; m.RENEW_EVERY = 2.0; "
            "sys.exit(m.main(['--verify']))")
    run = subprocess.run([sys.executable, "-c", code], cwd=HANDSON,
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    assert "[FAIL] B6  a heartbeat removes" in run.stdout


def test_a_block_that_does_not_exist_gets_a_clear_message():
    run = script("--block", "7")
    assert run.returncode == 2
    assert "--block must be one of 1, 2, 3, 4, 5, 6, not 7" in run.stderr


@pytest.mark.parametrize("n", range(1, 7))
def test_try_it_yourself_prints_what_the_page_shows(tmp_path, n):
    """Each snippet runs as a reader runs it, with handson/ on sys.path."""
    code = golden(f"tryit_b{n}.code.txt")
    path = tmp_path / f"tryit_b{n}.py"
    path.write_text(code)
    run = subprocess.run([sys.executable, str(path)], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(HANDSON)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == golden(f"tryit_b{n}.out.txt")


@pytest.mark.parametrize("n", range(1, 7))
def test_the_chapter_runs_the_same_try_it_snippets(n):
    assert golden(f"tryit_b{n}.code.txt").strip() in CHAPTER.read_text()


def test_parts_exports_what_the_page_says():
    assert sorted(c01.parts()) == ["DedupSink", "Sink", "stream"]
    assert sum(crashed for _, crashed in c01.stream()) == 398
