"""A small DevTools-protocol client for headless Chromium, shared by the browser tests.

Chromium is the one on PATH, driven over one page's websocket (websocket-client),
so nothing is downloaded. Every http(s) request goes to a dead proxy: a page
that reaches for the network fails instead of waiting. `loopback=True` lets
requests to 127.0.0.1 through (a local JupyterLab); otherwise only local files
load.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

import websocket

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
         "--no-first-run", "--no-default-browser-check",
         "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--disable-extensions", "--disable-dev-shm-usage",
         "--disable-domain-reliability", "--metrics-recording-only",
         "--proxy-server=127.0.0.1:9", "--window-size=1200,900",
         "--remote-debugging-port=0"]
NO_LOOPBACK = "--proxy-bypass-list=<-loopback>"


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """A headless Chromium with a fresh profile, driven over one page's websocket."""

    def __init__(self, binary: str, timeout: float = 30.0, loopback: bool = False):
        self.binary, self.timeout = binary, timeout
        self.flags = FLAGS if loopback else [*FLAGS, NO_LOOPBACK]
        self.profile = Path(tempfile.mkdtemp(prefix="eo-chromium-"))
        self.proc: subprocess.Popen | None = None
        self.ws = None
        self.events: list[dict] = []
        self._id = 0

    def __enter__(self) -> Chromium:
        self.proc = subprocess.Popen(
            [self.binary, *self.flags, f"--user-data-dir={self.profile}",
             "about:blank"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL, start_new_session=True)
        try:
            self._connect()
        except BaseException:
            self.__exit__()
            raise
        return self

    def _connect(self) -> None:
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

    def click(self, selector: str, timeout: float = 10.0) -> None:
        """A real mouse click in the middle of the element.

        Only once the element is what the browser would hit at that point: a
        busy page (JupyterLab laying out a notebook) can still move it after
        scrollIntoView, and a click at the old place lands on something else.
        """
        sel = json.dumps(selector)
        deadline = time.monotonic() + timeout
        while True:
            box = self.js(f"""(() => {{ const e = document.querySelector({sel});
                if (!e) return null; e.scrollIntoView({{block: "center"}});
                const r = e.getBoundingClientRect();
                const x = r.x + r.width / 2, y = r.y + r.height / 2;
                const hit = document.elementFromPoint(x, y);
                return [x, y, !!hit && (hit === e || e.contains(hit))]; }})()""")
            if box is None:
                raise LookupError(f"nothing on the page matches {selector}")
            if box[2]:
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{selector} stayed covered or moving for "
                                     f"{timeout:g} s; not clicked")
            time.sleep(0.1)
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1],
                      button="left", clickCount=1)

    def click_into(self, selector: str, timeout: float = 10.0) -> None:
        """Click until the element has the keyboard focus.

        A busy page can still scroll between the hit test and the press (after
        a cell is deleted JupyterLab scrolls its notebook late), and the keys
        typed next would go to whatever the click hit instead.
        """
        focused = (f"document.activeElement === "
                   f"document.querySelector({json.dumps(selector)})")
        deadline = time.monotonic() + timeout
        while True:
            self.click(selector, timeout)
            settle = time.monotonic() + 0.5
            while time.monotonic() < settle:
                if self.js(focused):
                    return
                time.sleep(0.05)
            if time.monotonic() > deadline:
                raise AssertionError(f"{selector} did not take the focus when "
                                     f"clicked for {timeout:g} s")

    def type(self, text: str) -> None:
        """Real key presses into whatever has the focus, one character at a time.

        Letters, digits and spaces carry their key codes, so a page's keyboard
        shortcuts see them as a keyboard would send them.
        """
        for ch in text:
            if ch.isascii() and ch.isalpha():
                code, vk = f"Key{ch.upper()}", ord(ch.upper())
            elif ch.isascii() and ch.isdigit():
                code, vk = f"Digit{ch}", ord(ch)
            elif ch == " ":
                code, vk = "Space", 32
            else:
                code, vk = "", 0
            key = {"key": ch, "code": code, "windowsVirtualKeyCode": vk}
            self.send("Input.dispatchKeyEvent", type="keyDown", text=ch, **key)
            self.send("Input.dispatchKeyEvent", type="keyUp", **key)

    def poll(self, expression: str, timeout: float, what: str,
             every: float = 0.05):
        deadline = time.monotonic() + timeout
        while True:
            value = self.js(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(every)

    def screenshot(self, path: Path) -> Path:
        """The page as it looks now, as a PNG (for a failure message)."""
        data = self.send("Page.captureScreenshot", format="png")["data"]
        path.write_bytes(base64.b64decode(data))
        return path
