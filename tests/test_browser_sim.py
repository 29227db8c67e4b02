"""The built "Queues and logs" page in headless Chromium with the network blocked.

`make test` builds the book before pytest runs; this opens the page that build
wrote (or, when it is missing or older than the chapter, builds the chapter alone
into a temporary directory), presses Spike and Kill -9 with real clicks, reads
the counters, and checks that the page's copy of the model gives the same
trace as handson.book.sim. The checks live in tests/check_sim_offline.py (also
runnable by hand); this file only runs them.
"""

import shutil
import subprocess
import sys
import time
from pathlib import Path

import check_sim_offline as checker
import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "_build" / "html" / "book" / "queues_and_logs.html"
SOURCE = ROOT / "book" / "queues_and_logs.md"


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    """The book's built page; if it is missing or stale, the chapter built alone."""
    if PAGE.exists() and PAGE.stat().st_mtime >= SOURCE.stat().st_mtime:
        return PAGE
    src = tmp_path_factory.mktemp("qlogs-src")
    out = tmp_path_factory.mktemp("qlogs-build")
    shutil.copy(SOURCE, src / SOURCE.name)
    print(f"{PAGE.relative_to(ROOT)} is missing or stale: building the chapter "
          "alone (about a minute)")
    res = subprocess.run([str(Path(sys.executable).with_name("jupyter-book")),
                          "build", str(src / SOURCE.name), "--path-output", str(out)],
                         capture_output=True, text=True, timeout=900)
    built = out / "_build" / "_page" / SOURCE.stem / "html" / f"{SOURCE.stem}.html"
    if res.returncode != 0 or not built.exists():
        pytest.fail(f"building {SOURCE.name} alone failed:\n{res.stdout[-3000:]}"
                    f"\n{res.stderr[-3000:]}")
    return built


def test_simulation_works_offline_in_the_built_page(chromium, page):
    report = checker.check(page, chromium)
    assert report["rendered"]
    assert report["spike"]["waiting_after"] >= report["spike"]["waiting_before"] + 50
    assert report["kill_ack_after"]["redelivered"] >= 1
    assert report["kill_ack_after"]["lost"] == 0
    assert report["kill_ack_before"]["lost"] == 1
    assert report["same_trace_as_python"]
    assert report["external_requests"] == []


def test_checker_fails_clearly_on_a_missing_page(chromium, tmp_path):
    with pytest.raises(FileNotFoundError, match="build the book first"):
        checker.check(tmp_path / "nothing.html", chromium)


def test_checker_notices_a_page_that_reaches_for_the_network(chromium, tmp_path):
    # The real widget plus one external script: the check must refuse the page.
    from handson.book import simwidget

    script = (ROOT / "book" / "_static" / "queue-sim.js").read_text()
    calc = simwidget.calculator_html(script, backlog=5_000_000, s_per_job=0.02,
                                     workers=16)
    bad = tmp_path / "bad.html"
    bad.write_text("<html><head><script src='https://example.invalid/x.js'></script>"
                   f"</head><body>{simwidget.html(script)}{calc}</body></html>")
    with pytest.raises(AssertionError, match="tried the network"):
        checker.check(bad, chromium)


def _page_errors(binary: str, page: Path) -> list[str]:
    """Uncaught exceptions and console errors while `page` loads, no network."""
    with checker.Chromium(binary) as b:
        b.send("Runtime.enable")
        b.send("Log.enable")
        b.send("Page.enable")
        b.send("Page.navigate", url=page.resolve().as_uri())
        b.wait_event("Page.loadEventFired")
        time.sleep(0.5)              # late scripts (async, deferred) have run
        b.js("1")                    # and their events have been read
        out = []
        for ev in b.events:
            m, p = ev.get("method"), ev.get("params", {})
            if m == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(d.get("exception", {}).get("description", d.get("text")))
            elif m == "Runtime.consoleAPICalled" and p.get("type") == "error":
                out.append(" ".join(str(a.get("value", a.get("description")))
                                    for a in p.get("args", [])))
            elif (m == "Log.entryAdded" and p["entry"].get("level") == "error"
                  and p["entry"].get("source") == "javascript"):
                out.append(p["entry"].get("text"))
        return out


def test_no_page_of_the_built_book_logs_a_script_error(chromium):
    # Every page once: a script error on any of them (a doubled `const`, a widget
    # that throws) is a defect a reader sees in the console.
    pages = sorted((ROOT / "_build" / "html" / "book").rglob("*.html"))
    if not pages:
        pytest.skip("the book is not built (`make book` writes _build/html)")
    errors = {str(p.relative_to(ROOT)): e for p in pages
              if (e := _page_errors(chromium, p))}
    assert errors == {}, errors
