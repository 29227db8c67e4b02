"""A chapter and an exercise in a real JupyterLab, driven in headless Chromium.

The book's page is tested elsewhere; this is where a learner works. A private
`jupyter lab` (no token, a free loopback port, a temporary root and runtime
directory) serves a copy of "Queues and logs", opened as a notebook through
jupytext, and a copy of the delivery-semantics exercise with every function
solved but one. The test runs both with JupyterLab's own commands, types a
prediction with real key presses and reads it back in the closing table,
presses Spike and Kill -9 in the simulation (tests/check_sim_offline.py's steps),
and reads the check cell's table: PASS for the solved functions, FAIL for the
stub, then a failing schedule of assignment 2 drawn by the check cell's own
display: its SVG in the page, every mark. The browser is the shared DevTools
client (tests/cdp.py); on failure the message names a screenshot and the
server's log.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import check_sim_offline as checker
import psutil
import pytest
from cdp import Chromium

from handson.book import sim

ROOT = Path(__file__).resolve().parent.parent
CHAPTER = Path("book/queues_and_logs.md")
EXERCISE = Path("exercises/delivery_semantics/delivery_semantics.ipynb")
SOLUTION = ROOT / "solutions/delivery_semantics/delivery_semantics.ipynb"
STUB = "lease_impl"                 # the one function left unsolved
WRONG_QUEUE = Path("wrong_queue/myqueue.py")       # in the workspace: its own dir
# The check cell's own display (notebook_summary) of the grader's outcome for a
# queue whose ack is a check-then-act in two round trips: the contract's
# interleaving check, sandboxed on a confined server as in a grade, without the
# chaos run that makes a whole check cell of assignment 2 minutes long.
PICTURE_CELL = """\
from autograder.isolation import server
from autograder.judges import claim_ack_reap, queue_runs
from autograder.judges.checks import notebook_summary
redis = server.start()
try:
    found, _ = queue_runs.contract({path!r}, redis.url, ["interleavings"], 120)
finally:
    redis.stop()
[o] = claim_ack_reap._contract_outcomes(
    found, [c for c in claim_ack_reap.CHECKS if c.name == "interleavings"])
notebook_summary([o])
print("marks drawn:", sum(len(t["marks"]) for t in o.timelines))"""
STUB_CHECK = "lease_doubles"        # the check that must fail because of it
GUESS = "about 30 s a bit more 00"  # typed into the first box (a, b, d, 0 0:
                                     # JupyterLab shortcuts outside a text box)
KEY = "effectively-once:qlogs:1"    # where the page keeps that guess
SERVER_START_S, KERNEL_START_S, CHAPTER_RUN_S, EXERCISE_RUN_S = 120, 120, 420, 240

# Page-side helpers over JupyterLab's own objects (exposed by
# expose_app_in_browser): open a file as a notebook, run commands on it, and
# read each code cell's prompt, outputs and errors.
LAB_JS = r"""
window.eoLab = {
  panels: {},
  app() { return window.jupyterapp; },
  async open(path) {
    const w = await this.app().commands.execute(
      'docmanager:open', {path: path, factory: 'Notebook'});
    await w.context.ready;
    await w.sessionContext.ready;
    this.panels[w.id] = w;
    return w.id;
  },
  kernel(id) {
    const k = this.panels[id].sessionContext.session?.kernel;
    return k ? k.status : 'none';
  },
  activate(id) {
    this.app().shell.activateById(id);
    return this.app().shell.currentWidget?.id === id;
  },
  front(id) { return this.app().shell.currentWidget?.id === id; },
  command(id, name) {
    if (!this.front(id)) throw new Error(id + ' is not the current notebook');
    this.app().commands.execute(name);
    return true;
  },
  cells(id) { return this.panels[id].content.widgets; },
  find(id, text) {
    return this.cells(id).findIndex(
      c => c.model.sharedModel.getSource().includes(text));
  },
  runCell(id, i) {
    if (!this.front(id)) throw new Error(id + ' is not the current notebook');
    this.panels[id].content.activeCellIndex = i;
    this.app().commands.execute('notebook:run-cell');
    return true;
  },
  commandMode(id) {
    const nb = this.panels[id].content;
    nb.mode = 'command';
    nb.node.focus();
    return true;
  },
  count(id, i) { return this.cells(id)[i].model.executionCount; },
  state(id) {
    const out = {code: 0, queued: 0, done: 0, errors: [], kernel: this.kernel(id)};
    for (const c of this.cells(id)) {
      if (c.model.type !== 'code') continue;
      out.code += 1;
      const prompt = c.node.querySelector('.jp-InputPrompt')?.textContent || '';
      if (prompt.includes('*')) out.queued += 1;
      else if (c.model.executionCount) out.done += 1;
      for (const o of c.model.outputs.toJSON()) {
        if (o.output_type === 'error') out.errors.push(o.ename + ': ' + o.evalue);
      }
    }
    return out;
  },
  text(id, i) {
    return this.cells(id)[i].node.querySelector('.jp-OutputArea')?.innerText || '';
  },
  insert(id, i, source) {
    this.panels[id].content.model.sharedModel.insertCell(
      i, {cell_type: 'code', source: source});
    return this.cells(id)[i].model.sharedModel.getSource() === source;
  },
  drawn(id, i) {
    const out = this.cells(id)[i].node.querySelector('.jp-OutputArea');
    const q = s => out ? out.querySelectorAll(s).length : 0;
    return {timelines: q('svg.eo-timeline'), marks: q('svg.eo-timeline g.mark'),
            ringed: q('svg.eo-timeline [data-bad]'), legend: q('.eo-legend')};
  },
};
true
"""


def exercise_with_solutions(keep_stub: str) -> dict:
    """The student notebook with the solution's code in every answer cell but one."""
    nb = json.loads((ROOT / EXERCISE).read_text())
    solved = {c["metadata"]["nbgrader"]["grade_id"]: c["source"]
              for c in json.loads(SOLUTION.read_text())["cells"]
              if c["metadata"].get("nbgrader", {}).get("solution")}
    assert keep_stub in solved, f"no answer cell {keep_stub!r} in {SOLUTION.name}"
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in solved and grade_id != keep_stub:
            cell["source"] = copy.deepcopy(solved[grade_id])
    return nb


@contextlib.contextmanager
def jupyter_lab(root: Path, scratch: Path):
    """A JupyterLab server for `root`; yields (url, log path); nothing left after."""
    runtime = scratch / "runtime"
    env = dict(os.environ, JUPYTER_RUNTIME_DIR=str(runtime),
               JUPYTER_CONFIG_DIR=str(scratch / "config"),
               JUPYTER_DATA_DIR=str(scratch / "data"),
               JUPYTERLAB_SETTINGS_DIR=str(scratch / "settings"),
               JUPYTERLAB_WORKSPACES_DIR=str(scratch / "workspaces"),
               IPYTHONDIR=str(scratch / "ipython"),
               PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    quiet = scratch / "settings/@jupyterlab/apputils-extension"
    quiet.mkdir(parents=True)
    (quiet / "notification.jupyterlab-settings").write_text(
        json.dumps({"fetchNews": "false", "checkForUpdates": False}))
    log = scratch / "jupyter-lab.log"
    cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--allow-root",
           "--ServerApp.ip=127.0.0.1", "--ServerApp.port=0",
           "--IdentityProvider.token=", "--ServerApp.password=",
           f"--ServerApp.root_dir={root}", "--LabApp.expose_app_in_browser=True",
           "--LabApp.news_url=None",
           "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
    with open(log, "wb") as out:
        server = subprocess.Popen(cmd, cwd=root, env=env, stdin=subprocess.DEVNULL,
                                  stdout=out, stderr=subprocess.STDOUT,
                                  start_new_session=True)
    try:
        info = runtime / f"jpserver-{server.pid}.json"
        deadline = time.monotonic() + SERVER_START_S
        while not info.exists():
            if server.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {server.returncode}:\n"
                                   f"{log.read_text()[-3000:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"jupyter lab did not start in {SERVER_START_S} s;"
                                   f" its log: {log}")
            time.sleep(0.2)
        time.sleep(0.2)        # the file is written once, then read it whole
        yield json.loads(info.read_text())["url"], log
    finally:
        leftovers = stop(server)
    assert not leftovers, f"still running after the server stopped: {leftovers}"


def stop(server: subprocess.Popen) -> list[psutil.Process]:
    """SIGTERM the server (it shuts its kernels down); kill what outlives it."""
    started: list[psutil.Process] = []
    with contextlib.suppress(psutil.Error):
        started = psutil.Process(server.pid).children(recursive=True)
    if server.poll() is None:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait(timeout=10)
    _gone, alive = psutil.wait_procs(started, timeout=30)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()
    return alive


@pytest.fixture
def workspace(tmp_path):
    """A temporary root: the chapter and the exercise, copied."""
    root = tmp_path / "root"
    (root / CHAPTER.parent).mkdir(parents=True)
    shutil.copy(ROOT / CHAPTER, root / CHAPTER)
    (root / EXERCISE.parent).mkdir(parents=True)
    (root / EXERCISE).write_text(json.dumps(exercise_with_solutions(STUB), indent=1))
    (root / WRONG_QUEUE.parent).mkdir()
    corpus = ROOT / "tests/corpus/queues"
    shutil.copy(corpus / "ack_check_then_act.py", root / WRONG_QUEUE)
    shutil.copy(corpus / "mini_correct.py", root / WRONG_QUEUE.parent)   # its base
    return root


def wait_run(b: Chromium, pid: str, timeout: float, what: str,
             until_error: bool = False) -> dict:
    """Poll a notebook until every code cell ran, or (if expected) an error
    stopped the run; an unexpected error fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        st = b.js(f"eoLab.state({json.dumps(pid)})")
        if st["errors"] and not until_error:
            raise AssertionError(f"{what}: a cell raised {st['errors'][0]}")
        if st["queued"] == 0 and st["kernel"] == "idle":
            if st["done"] == st["code"] or (until_error and st["errors"]):
                return st
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not finished after {timeout} s ({st})")
        time.sleep(0.5)


def to_front(b: Chromium, pid: str) -> None:
    """Make a notebook the current one, which JupyterLab's commands act on."""
    b.js(f"eoLab.activate({json.dumps(pid)})")
    b.poll(f"eoLab.front({json.dumps(pid)})", 30, f"{pid} to come to the front",
           every=0.2)


def command(b: Chromium, pid: str, name: str) -> None:
    to_front(b, pid)
    b.js(f"eoLab.command({json.dumps(pid)}, {json.dumps(name)})")


def run_cell(b: Chromium, pid: str, index: int) -> None:
    to_front(b, pid)
    b.js(f"eoLab.runCell({json.dumps(pid)}, {index})")


def open_notebook(b: Chromium, path: Path) -> str:
    pid = b.js(f"eoLab.open({json.dumps(str(path))})")
    b.poll(f"eoLab.kernel({json.dumps(pid)}) === 'idle'", KERNEL_START_S,
           f"the kernel of {path} to start", every=0.5)
    return pid


def page_errors(b: Chromium) -> tuple[list[str], list[str]]:
    """Uncaught exceptions, and console errors, that the page reported so far."""
    thrown, logged = [], []
    for ev in b.events:
        params = ev.get("params", {})
        if ev.get("method") == "Runtime.exceptionThrown":
            d = params["exceptionDetails"]
            thrown.append(d.get("exception", {}).get("description", d.get("text")))
        elif ev.get("method") == "Runtime.consoleAPICalled" and \
                params.get("type") == "error":
            logged.append(" ".join(str(a.get("value", a.get("description")))
                                   for a in params.get("args", [])))
    return thrown, logged


def session(b: Chromium, url: str, report: dict, root: Path) -> None:
    """Everything a learner does, in order; each step waits on what it needs."""
    b.send("Runtime.enable")
    b.send("Page.enable")
    # A headless window never has the focus, and JupyterLab's commands act on
    # the notebook that last had it.
    b.send("Emulation.setFocusEmulationEnabled", enabled=True)
    b.send("Page.navigate", url=url + "lab")
    b.poll("!!(window.jupyterapp && window.jupyterapp.shell)", SERVER_START_S,
           "JupyterLab to load", every=0.5)
    b.js("window.jupyterapp.restored.then(() => true)")
    b.js(LAB_JS)

    t0 = time.monotonic()
    chapter = open_notebook(b, CHAPTER)
    command(b, chapter, "notebook:run-all-cells")
    exercise = open_notebook(b, EXERCISE)
    command(b, exercise, "notebook:run-all-cells")

    # The exercise: Run All stops at the stub's graded cell; the check cell,
    # run on its own, shows the table.
    ex = json.dumps(exercise)
    st = wait_run(b, exercise, EXERCISE_RUN_S, "the exercise", until_error=True)
    assert len(st["errors"]) == 1 and "NotImplementedError" in st["errors"][0], st
    check_cell = b.js(f"eoLab.find({ex}, 'check_all()')")
    assert check_cell > 0, "no check cell calling check_all() in the exercise"
    run_cell(b, exercise, check_cell)
    b.poll(f"eoLab.text({ex}, {check_cell}).includes('points on the ')",
           EXERCISE_RUN_S, "the check cell's table", every=0.5)
    table = b.js(f"eoLab.text({ex}, {check_cell})")
    rows = dict((name, verdict) for verdict, name in
                re.findall(r"\[(PASS|FAIL)\]\s+(\w+)", table))
    report["check_table"] = rows
    assert rows.get(STUB_CHECK) == "FAIL", table
    assert len(rows) >= 5 and all(v == "PASS" for k, v in rows.items()
                                  if k != STUB_CHECK), table
    assert "First failure" in table, table
    report["exercise_s"] = round(time.monotonic() - t0, 1)

    # A failing run drawn under the check cell: the picture reaches the page as
    # SVG (not escaped, not stripped), every mark of it, the broken step ringed.
    cell = check_cell + 1
    source = PICTURE_CELL.format(path=str(root / WRONG_QUEUE))
    assert b.js(f"eoLab.insert({ex}, {cell}, {json.dumps(source)})")
    run_cell(b, exercise, cell)
    b.poll(f"eoLab.text({ex}, {cell}).includes('marks drawn:') || "
           f"eoLab.state({ex}).errors.length > 1", EXERCISE_RUN_S,
           "the picture cell to finish", every=0.5)
    said = b.js(f"eoLab.text({ex}, {cell})")
    marks = re.search(r"marks drawn: (\d+)", said)
    assert marks and "[FAIL] interleavings" in said, said
    drawn = b.js(f"eoLab.drawn({ex}, {cell})")
    report["picture"] = drawn
    assert drawn == {"timelines": 1, "marks": int(marks.group(1)), "ringed": 1,
                     "legend": 1}, (drawn, said)
    report["picture_s"] = round(time.monotonic() - t0 - report["exercise_s"], 1)

    # The chapter: every cell ran without an error.
    ch = json.dumps(chapter)
    st = wait_run(b, chapter, CHAPTER_RUN_S, "the chapter")
    report["chapter_cells"] = st["code"]
    report["chapter_s"] = round(time.monotonic() - t0, 1)
    to_front(b, chapter)
    scope = f'[id="{chapter}"]'

    # A prediction typed with real keys is kept, the notebook's own shortcuts
    # (a, b, 0 0, ...) stay out of the way, the box refills when its cell runs
    # again, and the closing table shows the guess.
    box = json.dumps(f'{scope} textarea[data-eo-key="{KEY}"]')
    boxes = b.js(f"document.querySelectorAll('{scope} textarea[data-eo-key]').length")
    assert boxes >= 3, f"the chapter shows {boxes} prediction boxes"
    cells = b.js(f"eoLab.cells({ch}).length")
    b.js(f"eoLab.commandMode({ch})")
    b.type("b")        # control: outside a text box these keys are shortcuts
    b.poll(f"eoLab.cells({ch}).length === {cells + 1}", 10,
           "B in command mode to add a cell (the key events reach JupyterLab)")
    b.type("dd")
    b.poll(f"eoLab.cells({ch}).length === {cells}", 10, "D D to delete it again")
    b.click_into(json.loads(box))
    b.type(GUESS)
    shown = b.js(f"document.querySelector({box}).value")
    assert shown == GUESS, f"the box shows {shown!r} after typing {GUESS!r}"
    kept = b.js(f"localStorage.getItem({json.dumps(KEY)})")
    assert kept == GUESS, f"the page kept {kept!r}, not the typed {GUESS!r}"
    assert b.js(f"eoLab.cells({ch}).length") == cells, "typing added or cut cells"
    assert not b.js("!!document.querySelector('.jp-Dialog')"), \
        "typing opened a dialog (a notebook shortcut fired)"
    asked = b.js(f"eoLab.find({ch}, 'bookkit.predictions(')")
    before = b.js(f"eoLab.count({ch}, {asked})")
    run_cell(b, chapter, asked)
    b.poll(f"eoLab.count({ch}, {asked}) !== {before} && "
           f"document.querySelector({box})?.value === {json.dumps(GUESS)}",
           60, "the box to show the guess again after its cell ran again",
           every=0.5)
    compare = b.js(f"eoLab.find({ch}, 'bookkit.compare(')")
    before = b.js(f"eoLab.count({ch}, {compare})")
    run_cell(b, chapter, compare)
    guess_sel = json.dumps(f'{scope} [data-eo-guess="{KEY}"]')
    b.poll(f"eoLab.count({ch}, {compare}) !== {before} && "
           f"document.querySelector({guess_sel})?.textContent === {json.dumps(GUESS)}",
           60, "the typed guess in the table of predictions", every=0.5)
    report["prediction"] = GUESS

    # The simulation and the calculator run in the cell's output.
    b.poll(f"!!document.querySelector('{scope} .eo-qsim canvas[data-qsim=pool]')",
           30, "the simulation to render")
    report.update(checker.play(b))
    shown = b.js(f"document.querySelector('{scope} [data-calc=drain]').textContent")
    expected = checker.drain_text(sim.predicted_drain_s(
        5_000_000, sim.pool_capacity(16, 0.020), 0))
    assert shown == expected, (shown, expected)
    assert b.js("EOQueueSim.errors") == [], b.js("EOQueueSim.errors")
    # A script in an output that throws is a widget bug; JupyterLab's own
    # console errors are reported, not judged.
    thrown, report["console_errors"] = page_errors(b)
    assert not thrown, f"a script on the page threw: {thrown}"


def test_chapter_and_exercise_in_jupyterlab(chromium, workspace, tmp_path):
    report: dict = {}
    start = time.monotonic()
    with jupyter_lab(workspace, tmp_path) as (url, log):
        with Chromium(chromium, timeout=120, loopback=True) as b:
            try:
                session(b, url, report, workspace)
            except Exception as err:
                shot = b.screenshot(tmp_path / "jupyterlab-failure.png")
                raise AssertionError(f"{err}\nscreenshot: {shot}\nserver log: {log}"
                                     f"\nso far: {report}") from err
    report["total_s"] = round(time.monotonic() - start, 1)
    print(json.dumps(report, indent=2))
