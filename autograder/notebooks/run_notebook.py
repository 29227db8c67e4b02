"""Execute a notebook cell by cell with nbclient; record what went wrong where.

Runs INSIDE the sandbox (`autograder.isolation.sandbox`), never in the grader's process:

    python -m autograder.notebooks.run_notebook IN.ipynb OUT.ipynb SUMMARY.json \\
        --cell-timeout SECONDS [--cell-cpu SECONDS]

Errors do not stop the run (a learner's broken cell must not hide the cells
after it). A cell that runs past its limit (`metadata.autograder.timeout`, else
--cell-timeout: the grader gives notebook.CELL_TIMEOUT_S) is interrupted and
recorded as a `CellTimeout` error, and the run goes on; a kernel that dies ends the run.
A cell whose kernel (and what it started) has run --cell-cpu CPU-seconds is
interrupted as well: a loop that spins would otherwise take a core for the
whole of its time limit, and a class pays that once per such notebook; one
that ignores the interrupt has its kernel killed, which ends the run. A cell
that waits (a sleep, a blocking read) uses no CPU and meets only its time limit.
The summary names the cells, and says what CPU each used.

A notebook whose code cells only write files (`%%writefile`, all but one
assignment's) is run without a kernel (`writefile_cells`), unless --kernel.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time

from autograder.notebooks import writefile_cells
from handson.infra import schedstat

TICK_S = 0.2        # how often a cell's CPU is read
GRACE_S = 2.0       # CPU past the limit after which an interrupt is not obeyed


class _CpuLimit:
    """Interrupts the cell under way once the kernel's process tree has run
    `limit` CPU-seconds since it began (SIGINT to the kernel's group, as the
    time limit's interrupt; again each tick while the cell goes on); a cell
    that runs GRACE_S more, ignoring it, has its kernel killed (SIGKILL to the
    group)."""

    def __init__(self, pid: int, pgid: int | None, limit: float | None):
        self.pid, self.limit = pid, limit
        # never our own group: the signal is for the kernel's alone
        self.pgid = pgid if pgid and pgid != os.getpgrp() else None
        self.lock = threading.Lock()
        self.base: float | None = None      # the tree's CPU when the cell began
        self.hit = self.killed = False
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._watch, daemon=True)

    def _signal(self, sig: int) -> None:
        try:
            if self.pgid:
                os.killpg(self.pgid, sig)
            else:
                os.kill(self.pid, sig)
        except OSError:
            pass

    def _cpu(self) -> float:
        return schedstat.run_time_s([self.pid, *schedstat.descendants(self.pid)])

    def begin(self) -> None:
        with self.lock:
            self.base, self.hit = self._cpu(), False

    def end(self) -> tuple[float, bool]:
        """The CPU the cell used, and whether it was interrupted for it."""
        with self.lock:
            used = max(0.0, self._cpu() - (self.base or 0.0))
            self.base = None
            return used, self.hit

    def _watch(self) -> None:
        while not self.done.wait(TICK_S):
            with self.lock:
                if not self.limit or self.base is None:
                    continue
                used = self._cpu() - self.base
                if used >= self.limit + GRACE_S and not self.killed:
                    self.killed = True
                    self._signal(signal.SIGKILL)
                elif used >= self.limit:
                    self.hit = True
                    self._signal(signal.SIGINT)


def _cell_id(cell, index: int) -> str:
    nbg = cell.get("metadata", {}).get("nbgrader", {})
    return nbg.get("grade_id") or f"cell {index + 1}"


def execute(src: str, dst: str, summary_path: str, cell_timeout: float,
            cell_cpu: float | None = None, kernel: bool = False) -> dict:
    summary: dict = {"errors": [], "timed_out": [], "cpu_limited": [],
                     "cpu_s": {}, "kernel_died": None, "cpu_killed": None,
                     "executed": 0,
                     "cell_cpu_s": cell_cpu}
    if not kernel and writefile_cells.execute(src, dst, summary_path, _cell_id,
                                              summary):
        return summary
    # Imported here: a notebook of `%%writefile` cells needs none of it (0.2 s).
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellTimeoutError, DeadKernelError
    from traitlets.config import Config

    nb = nbformat.read(src, as_version=4)
    cwd = os.path.dirname(os.path.abspath(src))
    def timeout_of(cell) -> float:
        return cell.get("metadata", {}).get("autograder", {}).get("timeout",
                                                                  cell_timeout)

    # IPC transport: the kernel's channels are Unix sockets in the work dir, since
    # the sandbox has no network (and nothing else can reach them).
    config = Config()
    config.KernelManager.transport = "ipc"
    config.KernelManager.ip = os.path.join(cwd, "kernel")
    client = NotebookClient(
        nb, config=config, timeout_func=timeout_of, allow_errors=True,
        kernel_name="python3",
        resources={"metadata": {"path": cwd}}, interrupt_on_timeout=True,
        error_on_timeout={"ename": "CellTimeout",
                          "evalue": "the cell ran past its time limit and was "
                                    "interrupted (an endless loop?)",
                          "traceback": []},
        # no arguments of ours: the kernel's command line is a learner's own
        # (the grade leaves its log lines out of what it shows, `grade._NOISE`)
        shutdown_kernel="immediate")
    watch = None
    try:
        with client.setup_kernel():
            provisioner = client.km.provisioner
            if schedstat.thread_ns(provisioner.pid) is None:
                summary["cell_cpu_s"] = None        # this kernel keeps no count
            watch = _CpuLimit(provisioner.pid, getattr(provisioner, "pgid", None),
                              summary["cell_cpu_s"])
            watch.thread.start()
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                started = time.monotonic()
                watch.begin()
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    summary["timed_out"].append(_cell_id(cell, index))
                    break
                except DeadKernelError:
                    summary["kernel_died"] = _cell_id(cell, index)
                    if watch.killed:
                        summary["cpu_killed"] = _cell_id(cell, index)
                    break
                finally:
                    used, hit = watch.end()
                    summary["cpu_s"][_cell_id(cell, index)] = round(used, 2)
                summary["executed"] += 1
                if hit:
                    summary["cpu_limited"].append(_cell_id(cell, index))
                # The interrupt at the limit can reach the kernel before
                # nbclient records its own error: the cell then raised
                # KeyboardInterrupt, which the learner did not press.
                late = time.monotonic() - started >= timeout_of(cell)
                for out in cell.get("outputs", []):
                    if out.get("ename") == "CellTimeout" or (
                            late and out.get("ename") == "KeyboardInterrupt"):
                        summary["timed_out"].append(_cell_id(cell, index))
                    elif hit and out.get("ename") == "KeyboardInterrupt":
                        continue            # the CPU limit's interrupt
                    elif out.get("output_type") == "error":
                        summary["errors"].append({
                            "cell": _cell_id(cell, index), "index": index,
                            "ename": out.get("ename", ""),
                            "evalue": str(out.get("evalue", ""))[:500]})
    except DeadKernelError as err:
        summary["kernel_died"] = summary["kernel_died"] or f"kernel: {err}"
    except RuntimeError as err:           # kernel failed to start
        summary["kernel_died"] = summary["kernel_died"] or f"kernel: {err}"
    finally:
        if watch is not None:
            watch.done.set()
    nbformat.write(nb, dst)
    with open(summary_path, "w") as fh:
        json.dump(summary, fh)
    return summary


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("summary")
    p.add_argument("--cell-timeout", type=float, required=True)
    p.add_argument("--cell-cpu", type=float, default=None,
                   help="CPU-seconds a cell may use (default: no such limit)")
    p.add_argument("--kernel", action="store_true",
                   help="run every notebook in a kernel, one of %%%%writefile "
                   "cells too")
    args = p.parse_args(argv)
    execute(args.src, args.dst, args.summary, args.cell_timeout, args.cell_cpu,
            args.kernel)
    return 0


if __name__ == "__main__":
    sys.exit(main())
