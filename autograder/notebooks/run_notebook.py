"""Execute a notebook cell by cell with nbclient; record what went wrong where.

Runs INSIDE the sandbox (`autograder.isolation.sandbox`), never in the grader's process:

    python -m autograder.notebooks.run_notebook IN.ipynb OUT.ipynb SUMMARY.json \\
        --cell-timeout SECONDS

Errors do not stop the run (a learner's broken cell must not hide the cells
after it). A cell that runs past its limit (`metadata.autograder.timeout`, else
--cell-timeout: the grader gives notebook.CELL_TIMEOUT_S) is interrupted and
recorded as a `CellTimeout` error, and the run goes on; a kernel that dies ends the run.
The summary names the cells.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from traitlets.config import Config


def _cell_id(cell, index: int) -> str:
    nbg = cell.get("metadata", {}).get("nbgrader", {})
    return nbg.get("grade_id") or f"cell {index + 1}"


def execute(src: str, dst: str, summary_path: str, cell_timeout: float) -> dict:
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
    summary: dict = {"errors": [], "timed_out": [], "kernel_died": None,
                     "executed": 0}
    try:
        with client.setup_kernel():
            for index, cell in enumerate(nb.cells):
                if cell.cell_type != "code":
                    continue
                started = time.monotonic()
                try:
                    client.execute_cell(cell, index)
                except CellTimeoutError:
                    summary["timed_out"].append(_cell_id(cell, index))
                    break
                except DeadKernelError:
                    summary["kernel_died"] = _cell_id(cell, index)
                    break
                summary["executed"] += 1
                # The interrupt at the limit can reach the kernel before
                # nbclient records its own error: the cell then raised
                # KeyboardInterrupt, which the learner did not press.
                late = time.monotonic() - started >= timeout_of(cell)
                for out in cell.get("outputs", []):
                    if out.get("ename") == "CellTimeout" or (
                            late and out.get("ename") == "KeyboardInterrupt"):
                        summary["timed_out"].append(_cell_id(cell, index))
                    elif out.get("output_type") == "error":
                        summary["errors"].append({
                            "cell": _cell_id(cell, index), "index": index,
                            "ename": out.get("ename", ""),
                            "evalue": str(out.get("evalue", ""))[:500]})
    except DeadKernelError as err:
        summary["kernel_died"] = summary["kernel_died"] or f"kernel: {err}"
    except RuntimeError as err:           # kernel failed to start
        summary["kernel_died"] = summary["kernel_died"] or f"kernel: {err}"
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
    args = p.parse_args(argv)
    execute(args.src, args.dst, args.summary, args.cell_timeout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
