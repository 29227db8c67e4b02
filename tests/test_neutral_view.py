"""What learner code can read of a grading run is what it reads of its own run.

A module that looks at its folder, its process or its environment must find
no word of the grader's there, and the same shape as when the learner runs it:
in the notebook's kernel (graded: the sandboxed kernel of `grade`) and in a
host the judge calls it through (graded: a fork of the run's warm server).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from autograder import grade
from autograder.isolation import sandbox, server
from handson.infra import remote_module
from handson.redis_server import EmbeddedRedis

GRADER_WORDS = ("grade", "judge", "eo-grade", "learner_host", "warm_start")

VIEW = '''
import json, os, re, sys
from urllib.parse import urlsplit


def view():
    cmd = open("/proc/self/cmdline", "rb").read()
    url = os.environ.get("REDIS_URL", "")
    return {"cwd": os.path.basename(os.getcwd()),
            "comm": open("/proc/self/comm").read().strip(),
            "argv": list(sys.argv),
            "cmdline": cmd.rstrip(b"\\0").decode().split("\\0"),
            "cmdline_nuls": len(cmd) - len(cmd.rstrip(b"\\0")),
            "env": sorted(os.environ),
            "redis": re.sub(r"eo-redis-[^/]+", "eo-redis-*",
                            urlsplit(url).path),
            "redis_user": urlsplit(url).username or ""}
'''


def _words(seen: dict) -> list[str]:
    """Grader words in what the module read (env values but REDIS_URL aside:
    the checkout's own path is the learner's too)."""
    text = json.dumps({k: v for k, v in seen.items() if k != "env"}).lower()
    return [w for w in GRADER_WORDS if w in text]


def _same_shape(graded: dict, own: dict) -> None:
    assert graded["cwd"] == own["cwd"]
    assert graded["comm"] == own["comm"]
    assert [os.path.basename(a) for a in graded["argv"][:2]] == \
        [os.path.basename(a) for a in own["argv"][:2]]
    assert [os.path.basename(a) for a in graded["cmdline"][:3]] == \
        [os.path.basename(a) for a in own["cmdline"][:3]]
    assert len(graded["cmdline"]) == len(own["cmdline"])


@pytest.fixture(scope="module")
def redis_urls():
    """(the grader's run's Redis, judge's URL; a learner's own server's URL)"""
    graded, own = server.start(), EmbeddedRedis().start()
    try:
        yield graded.url, own.url
    finally:
        graded.stop()
        own.stop()


def test_a_hosted_module_sees_what_python_module_shows(redis_urls):
    """The judge's host: cwd named as the learner's folder, `python MODULE` as
    its argv and command line, six environment keys and the learner's Redis
    user; the same module run as `python queue.py` in a learner's copy."""
    redis_url, own_url = redis_urls
    with grade.run_dir("claim_ack_reap") as workdir, \
            tempfile.TemporaryDirectory() as home:
        path = workdir / "queue.py"
        path.write_text(VIEW)
        prefix = sandbox.learner_prefix(workdir, redis_url,
                                        (str(path), remote_module.HOST))
        env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
        old = dict(os.environ)
        os.environ.clear()
        os.environ.update(env)
        try:
            module = remote_module.load(str(path), prefix)
            try:
                graded = module.view()
            finally:
                module.close()
        finally:
            os.environ.clear()
            os.environ.update(old)
            sandbox.cleanup(workdir)
        own_dir = Path(home) / "course-work" / "claim_ack_reap"
        own_dir.mkdir(parents=True)
        (own_dir / "queue.py").write_text(VIEW + "\nprint(json.dumps(view()))\n")
        out = subprocess.run(
            [sys.executable, "queue.py"], cwd=own_dir, check=True, text=True,
            capture_output=True,
            env={**os.environ, "REDIS_URL": own_url}).stdout
        own = json.loads(out)
    assert _words(graded) == []
    _same_shape(graded, own)
    assert graded["argv"] == [str(path)]
    assert set(graded["env"]) <= {"HOME", "LANG", "PATH", "PYTHONPATH",
                                  "REDIS_URL", "TMPDIR", "QUEUE_MAX"}
    assert graded["redis"] == own["redis"]
    assert re.fullmatch(r"/\S+/eo-redis-\*/redis\.sock", graded["redis"])
    # a learner's own server has no users (documented in the README)
    assert graded["redis_user"] == "learner"
    if _cap_sys_resource():     # the kernel pointed at an argv of its own
        assert graded["cmdline_nuls"] == own["cmdline_nuls"] == 1


def _cap_sys_resource() -> bool:
    """Whether we (and so the hosts our warm server forks) may move argv."""
    status = Path("/proc/self/status").read_text()
    eff = int(re.search(r"CapEff:\s*(\w+)", status).group(1), 16)
    return bool(eff >> 24 & 1)


def _notebook() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(VIEW + "\nprint(json.dumps(view()))")]
    return nb


def _printed(nb) -> dict:
    for out in nb.cells[0].outputs:
        if out.get("name") == "stdout":
            return json.loads(out["text"].strip().splitlines()[-1])
    raise AssertionError(f"the cell printed nothing: {nb.cells[0].outputs}")


def test_the_graded_kernel_sees_what_a_learners_kernel_sees(tmp_path):
    """The sandboxed kernel of a grade and nbclient's kernel in a learner's
    copy of the folder: the same folder name, process name and argv; the
    grader's kernel has no environment key the learner's lacks."""
    executed = tmp_path / "executed.ipynb"
    module = type("Assignment", (), {"NOTEBOOK_TIMEOUT_S": 120,
                                     "__name__": "neutral"})
    with grade.run_dir("claim_ack_reap") as workdir:
        problems, _ = grade.run_learner_cells(_notebook(), module, workdir,
                                              True, executed)
    assert problems == []
    graded = _printed(nbformat.read(executed, as_version=4))
    own_dir = tmp_path / "course-work" / "claim_ack_reap"
    own_dir.mkdir(parents=True)
    nb = _notebook()
    env = {**os.environ, "LANG": os.environ.get("LANG", "C.UTF-8"),
           "TMPDIR": tempfile.gettempdir()}
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        NotebookClient(nb, kernel_name="python3", timeout=120,
                       resources={"metadata": {"path": str(own_dir)}}).execute()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    own = _printed(nb)
    assert _words(graded) == []
    _same_shape(graded, own)
    assert graded["argv"][1] == own["argv"][1] == "-f"
    assert set(graded["env"]) - set(own["env"]) == set()
