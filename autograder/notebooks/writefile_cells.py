"""Learner cells that only write files, run without a kernel.

Five of the six assignments ask for one `%%writefile` cell. Starting a kernel
and a client to drive it cost a grade 0.6 CPU-s to write that one file, about
a tenth of the grade. Where every code cell is a `%%writefile` that IPython's
own input transformer turns into exactly `run_cell_magic("writefile", LINE,
BODY)`, with LINE a plain file name (and `-a` at most), the runner writes BODY
here as the magic does and prints what it prints. Any other code cell (a
learner's scratch code, a `{name}` IPython would expand, an empty body) and the
notebook runs in a kernel as before. Either way it runs inside the sandbox.
"""

from __future__ import annotations

import ast
import json
import os
import re
import time

# A magic line IPython's variable expansion leaves as it is (no `$`, `{}`),
# and a file name its argument parser and `expanduser` pass on unchanged (no
# quotes, `~`, path or other whitespace).
LINE = re.compile(r"[A-Za-z0-9_.\- \t]*")
NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,99}")
SOCKET = re.compile(r"kernel-\d+")      # where a kernel's channels would be
CALL = "get_ipython().run_cell_magic(%r, %r, %r)\n"
SKIP_TAG = "skip-execution"     # nbclient leaves a cell so tagged unrun


def _source(cell: dict) -> str:
    src = cell.get("source", "")
    return "".join(src) if isinstance(src, list) else str(src)


def _magic(source: str) -> tuple[str, str, str] | None:
    """(magic, line, body) as IPython would call the cell magic; None unless
    the transformed cell is that one call and nothing else."""
    # Imported here: only a notebook of `%%writefile` cells comes this far.
    from IPython.core.inputtransformer2 import TransformerManager

    try:
        code = TransformerManager().transform_cell(source)
        [stmt] = ast.parse(code).body
        args = stmt.value.args
        words = tuple(ast.literal_eval(a) for a in args)
    except Exception:           # whatever IPython would make of it, a kernel will
        return None
    if len(words) != 3 or not all(isinstance(w, str) for w in words):
        return None
    return words if code == CALL % words else None


def plan(cells: list[dict]) -> list[tuple[int, str, bool, str]] | None:
    """(cell index, file name, append, body) for each code cell, in order;
    None if one of them needs a kernel."""
    steps = []
    for index, cell in enumerate(cells):
        if cell.get("cell_type") != "code":
            continue
        source = _source(cell)
        if (not source.startswith("%%writefile")
                or SKIP_TAG in (cell.get("metadata", {}).get("tags") or [])):
            return None
        magic = _magic(source)
        if (magic is None or magic[0] != "writefile" or magic[2] == ""
                or not LINE.fullmatch(magic[1])):
            return None         # an empty body is IPython's UsageError
        args = _arguments(magic[1])
        if (args is None or not NAME.fullmatch(args.filename)
                or SOCKET.fullmatch(args.filename)):
            return None
        steps.append((index, args.filename, bool(args.append), magic[2]))
    return steps


def _arguments(line: str):
    """The magic's own reading of its line; None where it would refuse it."""
    from IPython.core import magic_arguments
    from IPython.core.error import UsageError
    from IPython.core.magics.osm import OSMagics

    try:
        return magic_arguments.parse_argstring(OSMagics.writefile, line)
    except UsageError:
        return None


def _stdout(text: str) -> dict:
    return {"name": "stdout", "output_type": "stream", "text": text}


def write(name: str, append: bool, body: str) -> list[dict]:
    """The magic's work, in the current directory, and the outputs it would
    have shown (an error's message names the file as given, as there)."""
    if os.path.exists(name):
        said = f"{'Appending to' if append else 'Overwriting'} {name}\n"
    else:
        said = f"Writing {name}\n"
    outputs = [_stdout(said)]
    try:
        with open(name, "a" if append else "w", encoding="utf-8") as fh:
            fh.write(body)
    except (OSError, ValueError) as err:     # ValueError: a lone surrogate
        ename, evalue = type(err).__name__, str(err)
        outputs.append({"output_type": "error", "ename": ename, "evalue": evalue,
                        "traceback": [f"{ename}: {evalue}"]})
    return outputs


def execute(src: str, dst: str, summary_path: str, cell_id,
            summary: dict) -> bool:
    """Run the notebook at `src` without a kernel, as `run_notebook.execute`
    would with one: the executed copy at `dst`, `summary` (the runner's, still
    empty) filled in and written to `summary_path`. False, having written
    nothing, if it needs a kernel."""
    with open(src, encoding="utf-8") as fh:
        nb = json.load(fh)
    steps = plan(nb.get("cells", []))
    if steps is None:
        return False
    dst, summary_path = os.path.abspath(dst), os.path.abspath(summary_path)
    os.chdir(os.path.dirname(os.path.abspath(src)))   # the kernel's directory
    summary["kernel"] = False
    for count, (index, name, append, body) in enumerate(steps, 1):
        cell = nb["cells"][index]
        began = time.process_time()
        cell["outputs"] = write(name, append, body)
        cell["execution_count"] = count
        summary["cpu_s"][cell_id(cell, index)] = round(time.process_time() - began, 2)
        summary["executed"] += 1
        for out in cell["outputs"][1:]:
            summary["errors"].append({"cell": cell_id(cell, index), "index": index,
                                      "ename": out["ename"],
                                      "evalue": out["evalue"][:500]})
    with open(dst, "w", encoding="utf-8") as fh:
        json.dump(nb, fh, indent=1, sort_keys=True, ensure_ascii=False)
        fh.write("\n")
    with open(summary_path, "w") as fh:
        json.dump(summary, fh)
    return True
