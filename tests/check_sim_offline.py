"""Open the built "Queues and logs" page in headless Chromium, offline, and play.

    python tests/check_sim_offline.py [PAGE.html]

The network is blocked (every http(s) request goes to a dead proxy) and any
request that is not a local file is reported. The check presses Spike and
Kill -9 with real mouse clicks, reads the counters, turns on ack-before-work
and kills again, replays seeded scenarios through the page's copy of the model
and compares them tick by tick with handson.book.sim, and reads the calculator.
Chromium is driven over the DevTools protocol (tests/cdp.py); no browser is
downloaded. Exit status 0 means every check held.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from cdp import Chromium, find_chromium

from handson.book import sim

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAGE = ROOT / "_build" / "html" / "book" / "queues_and_logs.html"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
SCENARIOS = [
    {"seed": 11, "arrivals": 6.5, "workers": 4, "ticks": 1200,
     "events": [[50, "spike", 60], [80, "kill"], [81, "kill"], [200, "workers", 2],
                [260, "ack_before_work", True], [300, "kill"], [400, "workers", 7],
                [450, "arrivals", 11], [500, "ack_before_work", False],
                [520, "kill"], [521, "kill"], [600, "workers", 3],
                [601, "workers", 5]]},
    {"seed": 2026, "arrivals": 6, "workers": 3, "ticks": 900,
     "events": [[10, "spike", 60], [30, "kill"], [31, "kill"], [32, "kill"]]},
]


def counters(b: Chromium) -> dict:
    return b.js("""Object.fromEntries([...document.querySelectorAll(
        '[data-qsim-counter]')].map(e => [e.dataset.qsimCounter,
        parseFloat(e.textContent)]))""")


def drain_text(seconds: float) -> str:
    """What the page's calculator should show for a drain time."""
    return f"{seconds:,.0f} s ({seconds / 3600:.2f} h)"


def _set_paused(b: Chromium, paused: bool) -> None:
    """Click Pause (or Resume) until the page says it took.

    A click aimed at a button JupyterLab moved just after it was found lands
    elsewhere; a missed toggle left the simulation paused at the kill, and the
    redelivery the test waited for never came.
    """
    label = "Resume" if paused else "Pause"
    shows = f"document.querySelector('[data-qsim=pause]').textContent === '{label}'"
    for _ in range(3):
        if b.js(shows):
            return
        b.click("[data-qsim=pause]")
        time.sleep(0.1)
    assert b.js(shows), f"the simulation's button never showed {label}"


def play(b: Chromium) -> dict:
    """Spike, Kill -9 with ack after work, then with ack before work, by real clicks.

    The page must hold one rendered simulation; raises AssertionError when a
    counter does not move as the chapter says it does.
    """
    report: dict = {}
    b.js("""(() => { const s = document.querySelector('[data-qsim=speed]');
        s.value = '4'; s.dispatchEvent(new Event('change')); })()""")
    b.poll("parseFloat(document.querySelector('[data-qsim-counter=done]')"
           ".textContent) > 0", 20, "the pool to finish its first jobs")
    # Paused while the spike lands: a page the machine stalls for a few seconds
    # catches up at 4x when it runs again, and drained the spike before a read.
    _set_paused(b, True)
    before = counters(b)
    b.click("[data-qsim=spike]")
    b.poll("parseFloat(document.querySelector('[data-qsim-counter=waiting]')"
           f".textContent) >= {before['waiting'] + 50}", 5, "the spike to queue")
    after_spike = counters(b)
    _set_paused(b, False)
    assert after_spike["waiting"] >= before["waiting"] + 50, (before, after_spike)
    report["spike"] = {"waiting_before": before["waiting"],
                       "waiting_after": after_spike["waiting"]}

    b.click("[data-qsim=kill]")
    note = b.js("document.querySelector('[data-qsim=note]').textContent")
    assert note.startswith("Killed worker"), note
    b.poll("parseFloat(document.querySelector('[data-qsim-counter=redelivered]')"
           ".textContent) >= 1", 15, "the killed job to be redelivered")
    after_kill = counters(b)
    assert after_kill["lost"] == 0, after_kill
    report["kill_ack_after"] = {"redelivered": after_kill["redelivered"],
                                "lost": after_kill["lost"]}

    b.click("[data-qsim=ack]")
    assert b.js("document.querySelector('[data-qsim=ack]').checked") is True
    time.sleep(1.5)   # 6 simulated seconds: every job in hand is now acked
    lost0 = counters(b)["lost"]
    b.click("[data-qsim=kill]")
    after_lost = counters(b)
    assert after_lost["lost"] == lost0 + 1, (lost0, after_lost)
    report["kill_ack_before"] = {"lost": after_lost["lost"]}
    return report


def check(page: Path, binary: str) -> dict:
    """Every check on the page; raises AssertionError on the first that fails."""
    if not page.is_file():
        raise FileNotFoundError(f"no built page at {page}: build the book first "
                                "(`make book`)")
    report: dict = {"page": str(page)}
    with Chromium(binary) as b:
        b.send("Network.enable")
        b.send("Runtime.enable")
        b.send("Page.enable")
        b.send("Page.navigate", url=page.resolve().as_uri())
        b.wait_event("Page.loadEventFired")
        b.poll("!!document.querySelector('.eo-qsim canvas[data-qsim=pool]')", 15,
               "the simulation to render")
        report["rendered"] = True
        report.update(play(b))

        for sc in SCENARIOS:
            js = b.js(f"JSON.stringify(EOQueueSim.runScenario({json.dumps(sc)}))")
            py = sim.run_scenario(sc)
            assert json.loads(js) == py, \
                f"browser and handson.book.sim differ on seed {sc['seed']}"
        report["same_trace_as_python"] = [sc["seed"] for sc in SCENARIOS]

        shown = b.js("document.querySelector('[data-calc=drain]').textContent")
        expected = drain_text(sim.predicted_drain_s(
            5_000_000, sim.pool_capacity(16, 0.020), 0))
        assert shown == expected, (shown, expected)
        b.js("""(() => { const i = document.querySelector('[data-calc=arrivals]');
            i.value = '700'; i.dispatchEvent(new Event('input')); })()""")
        shown2 = b.js("document.querySelector('[data-calc=drain]').textContent")
        expected2 = drain_text(sim.predicted_drain_s(
            5_000_000, sim.pool_capacity(16, 0.020), 700))
        assert shown2 == expected2, (shown2, expected2)
        report["calculator"] = [shown, shown2]

        requests = [ev["params"]["request"]["url"] for ev in b.events
                    if ev.get("method") == "Network.requestWillBeSent"]
        external = [u for u in requests if not u.startswith(LOCAL_SCHEMES)]
        assert not external, f"the page tried the network: {external}"
        ours = b.js("EOQueueSim.errors")
        assert ours == [], f"the widget's script raised: {ours}"
        others = [ev["params"]["exceptionDetails"].get("exception", {}).get(
            "description", ev["params"]["exceptionDetails"].get("text"))
            for ev in b.events if ev.get("method") == "Runtime.exceptionThrown"]
        report["requests"] = len(requests)
        report["external_requests"] = external
        report["other_script_errors_on_page"] = others
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("page", nargs="?", type=Path, default=DEFAULT_PAGE)
    args = ap.parse_args(argv)
    binary = find_chromium()
    if binary is None:
        print("chromium is not installed (Debian: apt-get install chromium)")
        return 2
    try:
        report = check(args.page, binary)
    except (AssertionError, FileNotFoundError, TimeoutError) as err:
        print(f"FAILED: {err}")
        return 1
    print(json.dumps(report, indent=2))
    print("OK: the simulation works offline")
    return 0


if __name__ == "__main__":
    sys.exit(main())
