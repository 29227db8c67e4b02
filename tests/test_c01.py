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


@pytest.mark.parametrize("n", range(2, 7))
def test_the_chapter_runs_the_same_try_it_snippets(n):
    assert golden(f"tryit_b{n}.code.txt").strip() in CHAPTER.read_text()


def test_parts_exports_what_the_page_says():
    assert sorted(c01.parts()) == ["DedupSink", "Sink", "stream"]
    assert sum(crashed for _, crashed in c01.stream()) == 398


# --- the chapter: every measured column can fail --------------------------------

CELL = re.compile(r"```\{code-cell\} ipython3\n(.*?)```", re.S)


def cells():
    """[(tags, code)] for every code cell of the chapter, in order."""
    found = []
    for body in CELL.findall(CHAPTER.read_text()):
        m = re.match(r"(?::tags: \[(.*?)\]\n\n|---\n(.*?)---\n)?(.*)", body, re.S)
        head = m.group(1) or m.group(2) or ""
        found.append((head, m.group(3)))
    return found


def cell_with(text):
    (code,) = [code for _, code in cells() if text in code]
    return code


def run_in_process(code, capsys):
    """Run a chapter snippet against handson.c01_job_scheduler (monkeypatchable)."""
    exec(code.replace("from c01_job_scheduler import",
                      "from handson.c01_job_scheduler import"), {})
    return capsys.readouterr().out


B1_SNIPPET = "dispatch(jobs, ack_first=True)"


def test_block_1_measured_snippet_prints_the_published_output(tmp_path):
    path = tmp_path / "b1.py"
    path.write_text(cell_with(B1_SNIPPET))
    run = subprocess.run([sys.executable, str(path)], cwd=tmp_path,
                         env={**os.environ, "PYTHONPATH": str(HANDSON)},
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout == golden("tryit_b1.out.txt")


def test_block_1_errors_column_moves_when_the_queue_keeps_the_job(
        monkeypatch, capsys):
    """Ack after the work instead: the queue now sees each crash, and says so."""
    real = c01.dispatch
    monkeypatch.setattr(c01, "dispatch", lambda jobs, ack_first: real(jobs, False))
    out = run_in_process(cell_with(B1_SNIPPET), capsys)
    assert out != golden("tryit_b1.out.txt")
    errors = [int(m) for m in re.findall(r"and (\d+) errors raised", out)]
    published = [int(m) for m in re.findall(r"(\d+) lost",
                                             golden("tryit_b1.out.txt"))]
    assert errors == published          # one error per job the first run lost


def test_verify_b1_fails_when_the_queue_records_nothing_either_way(
        monkeypatch, capsys):
    monkeypatch.setattr(c01.Broker, "worker_died", lambda self: None)
    assert c01.main(["--verify"]) == 1
    failed = [x for x in capsys.readouterr().out.splitlines()
              if x.startswith("  [FAIL] ")]
    assert len(failed) == 1 and "B1  ack-before-work" in failed[0]


def test_the_lease_model_renews_only_when_heartbeats_arrive():
    faults = __import__("random").Random(0)
    assert not c01.lapses(10, 5, 5 / 3, faults)                 # on time
    assert c01.lapses(10, 5, 5 / 3, faults, lost=1.0)           # all lost
    assert not c01.lapses(10, 5, 5 / 3, faults, late=2.5)       # late, in time
    assert c01.lapses(10, 5, 5 / 3, faults, pause=10, pause_rate=1.0)
    assert c01.lapses(6, 5, 10, faults)                         # beat after lapse
    assert not c01.lapses(4, 5, 10, faults)                     # done before it


def lose_every_heartbeat(monkeypatch):
    real = c01.lapses
    monkeypatch.setattr(c01, "lapses", lambda *a, **kw: real(*a, **{**kw,
                                                                    "lost": 1.0}))


def test_block_6_renewal_column_is_measured(monkeypatch, capsys):
    """Lose every heartbeat: the 'with renewal' column becomes the bare one."""
    lose_every_heartbeat(monkeypatch)
    c01.b6({}, True)
    out = capsys.readouterr().out
    assert out.strip("\n") + "\n" != golden("block6.txt")
    rows = [x.split() for x in out.splitlines() if re.match(r"\s+\d+s\s", x)]
    assert [r[1] for r in rows] == [r[2] for r in rows] == [
        "2448", "715", "499", "233", "0"]


@pytest.mark.parametrize("patch", ["lose", "no_pause"])
def test_verify_b6_heartbeat_claim_fails_when_renewal_misbehaves(
        monkeypatch, capsys, patch):
    if patch == "lose":
        lose_every_heartbeat(monkeypatch)
    else:      # a worker that keeps renewing while paused: the claim must see it
        real = c01.lapses
        monkeypatch.setattr(c01, "lapses",
                            lambda *a, **kw: real(*a, **{**kw, "pause_rate": 0.0}))
    assert c01.main(["--verify"]) == 1
    failed = [x for x in capsys.readouterr().out.splitlines()
              if x.startswith("  [FAIL] ")]
    assert len(failed) == 1 and "B6  a heartbeat removes" in failed[0]


B4_NOTE = "said_pct = re.search"


def b4_note(out):
    """Run the chapter's block 4 note cell on `out`; return what it glued."""
    glued = {}
    ns = {"out": out, "re": re, "c01": c01, "ANSWERS": {},
          "glue": lambda k, v, display: glued.__setitem__(k, v)}
    exec(cell_with(B4_NOTE), ns)
    return glued


def test_block_4_note_holds_on_the_published_table():
    glued = b4_note(golden("block4.txt").splitlines())
    assert (glued["c01_b4_said_pct"], glued["c01_b4_half_rate"],
            glued["c01_b4_quarter"]) == ("1.5", "0.97%", "500")
    assert glued["c01_b4_min_zero"] == "1,998" and glued["c01_b4_esc_below"] > 0


def test_block_4_note_fails_when_the_table_stops_showing_the_slip():
    text = golden("block4.txt").replace("195    0.97%", "300    1.50%")
    with pytest.raises(AssertionError):
        b4_note(text.splitlines())


def test_block_4_note_fails_when_nothing_crashes(monkeypatch, capsys):
    monkeypatch.setattr(c01, "CRASH", 0.0)
    c01.b4({}, True)
    with pytest.raises(AssertionError):
        b4_note(capsys.readouterr().out.splitlines())


HELPERS = ("bookkit.", "printed(", "c01.b", "c01.assembly", "subprocess.run")


def test_the_chapter_shows_no_helper_calls_as_code():
    for head, code in cells():
        if any(h in code for h in HELPERS):
            assert re.search(r"remove-input|remove-cell", head), code[:80]


def test_the_chapter_speaks_to_a_reader_and_credits_correctly():
    text = CHAPTER.read_text()
    for word in ("the seed", "original page", "What changed", "later in the course"):
        assert word not in text
    assert "Kreps, J. *Exactly-once" not in text
    assert "Narkhede, N. *Exactly-once Semantics" in text


def test_the_chapter_ends_with_a_review_and_the_assignment():
    text = CHAPTER.read_text()
    review = text[text.index("## What was measured"):]
    assert "{glue:text}" in review.split("## Explain it back")[0]
    assert review.count(":::{dropdown} Answer") >= 5
    turn = review[review.index("## Your turn"):]
    assert "{ref}`exercises`" in turn and "delivery_semantics" in turn
