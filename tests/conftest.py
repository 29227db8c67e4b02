"""Shared fixtures: one real Redis server for the session, emptied per test.

With REDIS_URL set the tests use that server and FLUSHALL it: point it at a
scratch instance.
"""

import contextlib
import os
import resource
import subprocess
import sys
from collections import Counter

import psutil
import pytest
from cdp import find_chromium

from handson import redis_server


@pytest.fixture(scope="session")
def redis_url():
    with redis_server.redis_url() as url:
        yield url


@pytest.fixture
def r(redis_url):
    client = redis_server.connect(redis_url)
    client.flushall()
    yield client
    client.close()


_CPU_AT = pytest.StashKey[float]()
_CPU_BY_FILE: Counter = Counter()


def _cpu_s() -> float:
    """This process's CPU, that of the children it has waited for, and that of
    each child still alive with the children it waited for: a warm server that
    lives as long as this process (the sandbox's supervisors are its forks) is
    never waited for, and its CPU was missed."""
    own, kids = (resource.getrusage(who) for who in
                 (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    live = 0.0
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):
            t = child.cpu_times()
            live += t.user + t.system + t.children_user + t.children_system
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime + live


# The one file that takes minutes of one worker's time (the corpus run, 6 to 7
# minutes): under `make test` it starts first, and the rest follow in xdist's
# own order (most tests first; the Makefile turns xdist's reorder off, as it
# would put this file last). Started late, the suite ended on it alone.
FIRST = ("test_corpus_command.py",)


def pytest_collection_modifyitems(items):
    per_file = Counter(item.path.name for item in items)

    def rank(item) -> tuple[int, int]:
        name = item.path.name
        return (0, 0) if name in FIRST else (1, -per_file[name])
    items.sort(key=rank)        # stable: each file's own order stays


def pytest_runtest_setup(item):
    item.stash[_CPU_AT] = _cpu_s()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Under CI every skip is a failure: CI installs what the tests need
    (.ci/services), so a skip there hides a test that never ran.
    A test's CPU (its processes' too) rides on its teardown report."""
    if call.when == "teardown" and _CPU_AT in item.stash:
        item.user_properties.append(("cpu_s", _cpu_s() - item.stash[_CPU_AT]))
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("CI") and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"skipped under CI: {report.longrepr}"


@pytest.fixture(scope="session")
def chromium():
    """The browser the page tests drive, or a skip that says how to get one."""
    binary = find_chromium()
    if binary is None:
        pytest.skip("chromium is not installed (CI installs it with .ci/services; "
                    "Debian: apt-get install chromium)")
    return binary


@pytest.fixture
def cpu_hog():
    """One busy process per core, for the length of the test (outside any
    grading run's cgroup: the machine's load, not the learner's)."""
    hogs = [subprocess.Popen([sys.executable, "-c", "while True:\n    pass\n"])
            for _ in range(os.cpu_count() or 1)]
    yield hogs
    for p in hogs:
        p.kill()
        p.wait()


def pytest_runtest_logreport(report):
    for key, value in report.user_properties:
        if key == "cpu_s":
            _CPU_BY_FILE[report.nodeid.split("::")[0]] += value


def pytest_terminal_summary(terminalreporter):
    """Where the suite's CPU goes, by file: on two cores, not the wall time of
    one test but the CPU of all of them sets how long the suite takes."""
    if not _CPU_BY_FILE:
        return
    total = sum(_CPU_BY_FILE.values())
    terminalreporter.write_sep("=", f"CPU by test file ({total:.0f} s in all)")
    for path, cpu in _CPU_BY_FILE.most_common(12):
        terminalreporter.write_line(f"{cpu:8.1f} s  {path}")
