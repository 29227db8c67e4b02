"""The web app over real HTTP: uvicorn on loopback, a real worker, httpx."""

import os
import socket
import subprocess
import sys
import time

import httpx
import pytest

from handson import setup_db, work

ITERS = 2000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Proc:
    """A child process in its own group, killed (and reaped) on close."""

    def __init__(self, args, env):
        self.p = subprocess.Popen([sys.executable, *args], env={**os.environ, **env},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  start_new_session=True)

    def close(self):
        if self.p.poll() is None:
            self.p.kill()
        self.p.wait(timeout=10)
        return self.p.stderr.read().decode(errors="replace")


def _start_app(env) -> tuple[Proc, str]:
    port = _free_port()
    proc = Proc(["-m", "uvicorn", "handson.app:app", "--host", "127.0.0.1",
                 "--port", str(port), "--log-level", "warning"], env)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                return proc, base
        except httpx.TransportError:
            pass
        if proc.p.poll() is not None or time.monotonic() > deadline:
            raise AssertionError(f"the app did not start: {proc.close()}")
        time.sleep(0.1)


def _poll(client, job_id, until, timeout_s=60):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        body = client.get(f"/jobs/{job_id}").json()
        if body["status"] in until:
            return body
        time.sleep(0.1)
    raise AssertionError(f"{job_id} still {body} after {timeout_s} s")


@pytest.fixture
def env(r, redis_url, tmp_path):
    db = setup_db.setup(tmp_path / "results.db")
    return {"REDIS_URL": redis_url, "RESULTS_DB": str(db), "ITERS": str(ITERS),
            "IDEM": "1"}


@pytest.fixture
def app_and_worker(env, tmp_path):
    app, base = _start_app(env)
    worker = Proc(["-m", "handson.worker", "--queue", "handson.q", "--db",
                   env["RESULTS_DB"], "--lease", "2"], env)
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            yield client, env["RESULTS_DB"]
    finally:
        worker.close()
        app.close()


def test_post_poll_repost_and_poison(app_and_worker, r):
    client, results_db = app_and_worker
    text = "a document about queues"
    res = client.post("/docs", json={"doc_id": 41, "text": text})
    assert res.status_code == 202
    assert res.json() == {"job_id": "doc-41"}

    body = _poll(client, "doc-41", {"done", "dead"})
    assert body == {"job_id": "doc-41", "status": "done",
                    "score": work.score(text, iters=ITERS)}

    again = client.post("/docs", json={"doc_id": 41, "text": text})
    assert (again.status_code, again.json()) == (202, {"job_id": "doc-41"})
    time.sleep(0.5)   # had the repost made a job, the worker would have run it
    db = setup_db.connect(results_db)
    assert db.execute("SELECT count(*), (SELECT n FROM stats) FROM scores "
                      "WHERE job_id = 'doc-41'").fetchone() == (1, 1)

    poison = client.post("/docs", json={"doc_id": 7, "text": "doc 7 POISON"})
    assert poison.status_code == 202
    dead = _poll(client, "doc-7", {"done", "dead"})
    assert dead["status"] == "dead"
    assert "cannot tokenize" in dead["reason"]
    assert dead["attempts"] == 3


def test_unknown_job_is_404_and_bad_doc_is_422(env):
    app, base = _start_app(env)
    try:
        assert httpx.get(f"{base}/jobs/doc-999").status_code == 404
        res = httpx.post(f"{base}/docs", json={"doc_id": "x", "text": 1})
        assert res.status_code == 422
    finally:
        app.close()


def test_bound_answers_503_with_retry_after(env):
    app, base = _start_app({**env, "QUEUE_MAX": "3", "RETRY_AFTER_S": "7"})
    try:
        with httpx.Client(base_url=base, timeout=10) as client:
            codes = [client.post("/docs", json={"doc_id": i, "text": f"doc {i}"})
                     for i in range(5)]
            assert [c.status_code for c in codes] == [202, 202, 202, 503, 503]
            assert codes[3].headers["Retry-After"] == "7"
            assert "full" in codes[3].json()["detail"]
            # the same document again is the same job, full queue or not
            same = client.post("/docs", json={"doc_id": 0, "text": "doc 0"})
            assert (same.status_code, same.json()) == (202, {"job_id": "doc-0"})
            assert client.get("/health").json()["pending"] == 3
    finally:
        app.close()
