"""Open the built "Queues and logs" page in headless Chromium, offline, and play.

    python tests/check_sim_offline.py [PAGE.html]

The network is blocked (every http(s) request goes to a dead proxy) and any
request that is not a local file is reported. The check presses Spike and
Kill -9 with real mouse clicks, reads the counters, turns on ack-before-work
and kills again, replays seeded scenarios through the page's copy of the model
and compares them tick by tick with handson.sim, and reads the calculator.
Chromium is driven over the DevTools protocol (websocket-client); no browser is
downloaded. Exit status 0 means every check held.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

from handson import sim

ROOT = Path(__file__).resolve().parent.parent
DEFAULT_PAGE = ROOT / "_build" / "html" / "book" / "queues_and_logs.html"
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage",
         "--disable-domain-reliability", "--metrics-recording-only",
         "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",
         "--window-size=1200,900", "--remote-debugging-port=0"]

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


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """A headless Chromium with a fresh profile, driven over one page's websocket."""

    def __init__(self, binary: str, timeout: float = 30.0):
        self.binary, self.timeout = binary, timeout
        self.profile = Path(tempfile.mkdtemp(prefix="eo-chromium-"))
        self.proc: subprocess.Popen | None = None
        self.ws = None
        self.events: list[dict] = []
        self._id = 0

    def __enter__(self) -> Chromium:
        self.proc = subprocess.Popen(
            [self.binary, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = self.profile / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and port_file.read_text().strip()):
            if self.proc.poll() is not None:
                raise RuntimeError(f"chromium exited with {self.proc.returncode}")
            if time.monotonic() > deadline:
                raise TimeoutError("chromium did not open its DevTools port")
            time.sleep(0.05)
        port = int(port_file.read_text().split()[0])
        no_proxy = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        while True:
            targets = json.load(no_proxy.open(f"http://127.0.0.1:{port}/json/list",
                                              timeout=10))
            pages = [t for t in targets if t.get("type") == "page"]
            if pages:
                break
            if time.monotonic() > deadline:
                raise TimeoutError("chromium opened no page")
            time.sleep(0.05)
        self.ws = websocket.create_connection(pages[0]["webSocketDebuggerUrl"],
                                              timeout=self.timeout,
                                              suppress_origin=True)
        return self

    def __exit__(self, *exc) -> None:
        if self.ws is not None:
            self.ws.close()
        if self.proc and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        shutil.rmtree(self.profile, ignore_errors=True)

    def send(self, method: str, **params) -> dict:
        self._id += 1
        self.ws.send(json.dumps({"id": self._id, "method": method, "params": params}))
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == self._id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)
        raise TimeoutError(f"no answer to {method}")

    def wait_event(self, method: str) -> dict:
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            for ev in self.events:
                if ev.get("method") == method:
                    return ev
            self.events.append(json.loads(self.ws.recv()))
        raise TimeoutError(f"no {method} event")

    def js(self, expression: str):
        res = self.send("Runtime.evaluate", expression=expression, returnByValue=True,
                        awaitPromise=True)
        if "exceptionDetails" in res:
            raise RuntimeError(f"page script failed: {res['exceptionDetails']}")
        return res["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click in the middle of the element."""
        sel = json.dumps(selector)
        box = self.js(f"""(() => {{ const e = document.querySelector({sel});
            if (!e) return null; e.scrollIntoView({{block: "center"}});
            const r = e.getBoundingClientRect();
            return [r.x + r.width / 2, r.y + r.height / 2]; }})()""")
        if box is None:
            raise LookupError(f"nothing on the page matches {selector}")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def poll(self, expression: str, timeout: float, what: str):
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(0.05)


def counters(b: Chromium) -> dict:
    return b.js("""Object.fromEntries([...document.querySelectorAll(
        '[data-qsim-counter]')].map(e => [e.dataset.qsimCounter,
        parseFloat(e.textContent)]))""")


def drain_text(seconds: float) -> str:
    """What the page's calculator should show for a drain time."""
    return f"{seconds:,.0f} s ({seconds / 3600:.2f} h)"


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
        b.js("""(() => { const s = document.querySelector('[data-qsim=speed]');
            s.value = '4'; s.dispatchEvent(new Event('change')); })()""")
        b.poll("parseFloat(document.querySelector('[data-qsim-counter=done]')"
               ".textContent) > 0", 20, "the pool to finish its first jobs")
        before = counters(b)
        b.click("[data-qsim=spike]")
        after_spike = counters(b)
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

        for sc in SCENARIOS:
            js = b.js(f"JSON.stringify(EOQueueSim.runScenario({json.dumps(sc)}))")
            py = sim.run_scenario(sc)
            assert json.loads(js) == py, f"browser and handson.sim differ on seed " \
                f"{sc['seed']}"
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
