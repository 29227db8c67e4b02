"""Put the browser simulation into a notebook output, script inlined.

The script text is written into the cell's HTML output itself, so the built
static page needs no kernel, no network and no file next to it, and JupyterLab
runs it as it runs any trusted HTML output. The caller names the script file
(the book keeps it in its `_static/`), so the lab does not reach into the book.
"""

from __future__ import annotations

import json
import uuid
from pathlib import Path

from IPython.display import HTML, display


def _mounted(script: str, mount: str, opts: dict) -> str:
    """An empty container, the script, and one call that fills the container."""
    if "</script" in script.lower():
        raise ValueError("the simulation script may not contain '</script'")
    root = f"eo-qsim-{uuid.uuid4().hex[:12]}"   # unique across notebooks
    return (f'<div id="{root}" class="eo-qsim-root">'
            "<noscript>This needs JavaScript.</noscript></div>\n"
            f"<script>\n{script}\n</script>\n"
            f"<script>window.EOQueueSim.{mount}(document.getElementById('{root}'), "
            f"{json.dumps(opts)});</script>")


def html(script: str, seed: int = 1, arrivals: float = 6.0, workers: int = 4) -> str:
    """The simulation: sliders, buttons, the pool and the lag graph."""
    return _mounted(script, "mount", {"seed": seed, "arrivals": arrivals,
                                      "workers": workers})


def calculator_html(script: str, backlog: float, s_per_job: float, workers: int,
                    arrivals: float = 0.0) -> str:
    """The "how long will it take" form: capacity and B / (capacity - arrivals)."""
    return _mounted(script, "mountCalculator", {
        "backlog": backlog, "s_per_job": s_per_job, "workers": workers,
        "arrivals": arrivals})


def _read(script_path: str | Path) -> str:
    path = Path(script_path)
    if not path.is_file():
        raise FileNotFoundError(f"no simulation script at {path.resolve()}")
    return path.read_text(encoding="utf-8")


def show(script_path: str | Path, **options) -> None:
    """Display the simulation whose script lives at `script_path`."""
    display(HTML(html(_read(script_path), **options)))


def show_calculator(script_path: str | Path, **options) -> None:
    """Display the calculator (same script file as the simulation)."""
    display(HTML(calculator_html(_read(script_path), **options)))
