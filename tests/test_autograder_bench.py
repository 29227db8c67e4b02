"""`python -m autograder bench`: a grading's cost from the kernel's accounting,
split into the judge, the learner's code and the servers."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_bench_of_the_cheapest_assignment_adds_up():
    res = subprocess.run([sys.executable, "-m", "autograder", "bench",
                          "--assignment", "delivery_semantics", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    [row] = json.loads(res.stdout)
    assert row["assignment"] == "delivery_semantics" and row["runs"] == 1
    # cgroups (the learner's and the servers' CPU) and the PID namespace
    # (every task counted) need root; without it only the total is counted
    counted = os.geteuid() == 0
    for grader in ("grade", "nbgrader"):
        m = row[grader]
        assert m["ok"] and m["wall_s"] > 0 and m["cpu_s"] > 0, (grader, m)
        parts = [m["judge_s"], m["learner_s"], m["servers_s"]]
        assert all(p > 0 for p in (parts if counted else parts[:1])), (grader, m)
        slack = 0.05 * m["cpu_s"] + 0.3     # launchers' exits past the reading
        assert sum(parts[1:]) <= m["cpu_s"] + slack, (grader, m)
        assert max(parts) <= m["cpu_s"] + slack, (grader, m)
        if counted:
            assert m["tasks"] > 2, (grader, m)


def test_a_forked_hosts_launcher_adds_its_cpu_to_the_learners_share():
    """The run's server of hosts starts with only what a launcher reads: the
    cost log is one of those things, or every host's CPU would count as the
    judge's."""
    from autograder.isolation import confine
    from autograder.isolation.cgroup import COST_LOG
    from handson.infra import remote_module

    prefix = ["python", "-m", confine.__name__, "--workdir", "/w", "--"]
    env = {COST_LOG: "/x/cost.jsonl", "PATH": "/bin", "SECRET": "s"}
    assert remote_module._launcher_env(prefix, env) == {
        COST_LOG: "/x/cost.jsonl", "PATH": "/bin"}


def test_a_measured_command_s_output_is_kept_where_asked(tmp_path):
    from autograder import bench

    heard = []
    code = "import sys; print('the report'); print('progress', file=sys.stderr)"
    cost = bench.measure([sys.executable, "-c", code], echo=heard.append,
                         stdout=tmp_path / "out.txt")
    assert cost["ok"] and heard == ["progress"]
    assert (tmp_path / "out.txt").read_text() == "the report\n"


def test_a_measured_command_runs_where_asked_under_this_checkout_s_init(tmp_path):
    """The other checkout of `--against` may hold an older autograder (or none):
    the namespace's init is still this one's, and the command runs in its cwd."""
    from autograder import bench

    fake = tmp_path / "autograder"
    fake.mkdir()
    (fake / "__init__.py").write_text("")
    (fake / "bench.py").write_text("raise SystemExit(3)\n")
    code = "import os; print(os.getcwd())"
    cost = bench.measure([sys.executable, "-c", code], cwd=tmp_path,
                         stdout=tmp_path / "out.txt")
    assert cost["ok"], cost
    assert (tmp_path / "out.txt").read_text().strip() == str(tmp_path)


def test_bench_against_a_checkout_grades_both_in_turn():
    """Against itself: the same points on both sides, a ratio near one."""
    res = subprocess.run([sys.executable, "-m", "autograder", "bench", "--against",
                          str(ROOT), "--assignment", "delivery_semantics", "--json"],
                         cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert res.returncode == 0, res.stderr[-3000:]
    [row] = json.loads(res.stdout)
    assert row["this"]["ok"] and row["that"]["ok"], row
    assert row["this"]["points"] == row["that"]["points"], row
    got, full = row["this"]["points"].split("/")
    assert got == full, row
    [ratio] = row["ratios"]
    assert 1 / 3 < ratio < 3, row       # the same code, a noisy machine


def test_bench_against_a_folder_that_is_no_checkout_says_so(tmp_path):
    res = subprocess.run([sys.executable, "-m", "autograder", "bench", "--against",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and res.stdout == ""
    assert "not a checkout of the course" in res.stderr
    (tmp_path / "autograder").mkdir()
    res = subprocess.run([sys.executable, "-m", "autograder", "bench", "--against",
                          str(tmp_path)], cwd=ROOT, capture_output=True, text=True,
                         timeout=60)
    assert res.returncode == 2 and "has no .venv" in res.stderr
    for wrong in (["--against", ""], ["--against", str(ROOT), "--class", "3"]):
        res = subprocess.run([sys.executable, "-m", "autograder", "bench", *wrong],
                             cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and "--against" in res.stderr, (wrong, res.stderr)


def test_a_grade_that_failed_on_one_side_is_said_and_no_ratio_is_made(tmp_path):
    """A checkout whose interpreter fails at once: its CPU is about nothing, so
    no ratio, and the row says a grade failed (exit 1), with no traceback."""
    name = "delivery_semantics"
    (tmp_path / "autograder").mkdir()
    nb = tmp_path / "solutions" / name / f"{name}.ipynb"
    nb.parent.mkdir(parents=True)
    nb.write_text("{}")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nexit 1\n")
    python.chmod(0o755)
    res = subprocess.run([sys.executable, "-m", "autograder", "bench", "--against",
                          str(tmp_path), "--assignment", name], cwd=ROOT,
                         capture_output=True, text=True, timeout=1200)
    assert res.returncode == 1 and "Traceback" not in res.stderr, res.stderr[-2000:]
    [row] = [ln for ln in res.stdout.splitlines() if ln.startswith(name)]
    assert row.endswith("(a grade failed)") and row.split()[3] == "-", row


def test_a_measured_command_past_its_limit_is_killed_with_what_it_started():
    """A grade that hangs cannot hang the bench: past its limit it is killed,
    and in the bench's PID namespace (as root) so is every process it started,
    which would otherwise hold its stderr open."""
    from autograder import bench

    code = ("import subprocess, time; subprocess.Popen(['sleep', '120']); "
            "print('started', flush=True); time.sleep(120)")
    cmd = [sys.executable, "-c", code]
    if os.geteuid() != 0:       # no namespace: only the command itself is killed
        cmd = [sys.executable, "-c", "import time; time.sleep(120)"]
    t0 = time.monotonic()
    cost = bench.measure(cmd, limit_s=2)
    assert time.monotonic() - t0 < 60
    assert not cost["ok"] and "did not finish within 2 s" in cost["error"], cost
