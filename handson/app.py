"""The web app from the lab: saving a document enqueues its scoring, and returns.

    REDIS_URL=... RESULTS_DB=results.db python -m handson.app [--port 8000]

`POST /docs` answers 202 with the job id at once; the slow work runs in a
worker (`python -m handson.worker`). The id is the natural key `doc-<doc_id>`,
so saving the same document twice is one job. `GET /jobs/{id}` reads the
result where the worker put it (the results database) or, failing that, asks
the queue: dead (with the reason) or pending. When the queue is at its bound
(`QUEUE_MAX`) the app says so with 503 and Retry-After instead of letting the
backlog grow: backpressure at the door.

Configuration, all from the environment: REDIS_URL (required), RESULTS_DB
(default results.db), QUEUE (a module meeting the contract, default
handson.q), RETRY_AFTER_S (default 5).
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import sys
from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, HTTPException, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from handson import redis_server
from handson.queues.contract import load_queue


class Doc(BaseModel):
    doc_id: int = Field(ge=0)
    text: str


class Settings:
    """What the app needs, read once from the environment at start-up."""

    def __init__(self, env: dict | None = None):
        env = os.environ if env is None else env
        self.redis_url = env.get("REDIS_URL")
        if not self.redis_url:
            raise RuntimeError(
                "REDIS_URL is not set. Start a server with `python -m "
                "handson.redis_server` and export the URL it prints.")
        self.results_db = Path(env.get("RESULTS_DB", "results.db"))
        if not self.results_db.exists():
            raise RuntimeError(
                f"no results database at {self.results_db}: create it with "
                f"`python -m handson.setup_db {self.results_db}` (or set RESULTS_DB)")
        self.queue = load_queue(env.get("QUEUE", "handson.q"))
        self.retry_after_s = int(env.get("RETRY_AFTER_S", "5"))


def job_id_for(doc_id: int) -> str:
    """The natural key: the same document is always the same job."""
    return f"doc-{doc_id}"


def _score(db_path: Path, job_id: str) -> float | None:
    db = sqlite3.connect(f"file:{db_path}?mode=ro", uri=True, timeout=5)
    try:
        row = db.execute("SELECT score FROM scores WHERE job_id = ?",
                         (job_id,)).fetchone()
    finally:
        db.close()
    return None if row is None else row[0]


@asynccontextmanager
async def lifespan(app: FastAPI):
    settings = Settings()
    app.state.settings = settings
    app.state.r = redis_server.connect(settings.redis_url, decode_responses=True)
    yield
    app.state.r.close()


app = FastAPI(title="Effectively Once: the lab's web app", lifespan=lifespan)


@app.post("/docs", status_code=202)
def save(doc: Doc, request: Request):
    s, r = request.app.state.settings, request.app.state.r
    job_id = job_id_for(doc.doc_id)
    full = getattr(s.queue, "QueueFull", None)
    try:
        s.queue.enqueue(r, {"doc_id": doc.doc_id, "text": doc.text}, job_id=job_id)
    except Exception as err:
        if full is None or not isinstance(err, full):
            raise
        return JSONResponse(status_code=503, content={"detail": str(err)},
                            headers={"Retry-After": str(s.retry_after_s)})
    return {"job_id": job_id}


@app.get("/jobs/{job_id}")
def status(job_id: str, request: Request):
    s, r = request.app.state.settings, request.app.state.r
    score = _score(s.results_db, job_id)
    if score is not None:
        return {"job_id": job_id, "status": "done", "score": score}
    for dead_id, attempts, reason in s.queue.dead(r):
        if dead_id == job_id:
            return {"job_id": job_id, "status": "dead", "attempts": attempts,
                    "reason": reason}
    where = s.queue.status(r, job_id) if hasattr(s.queue, "status") else "pending"
    if where is None:
        raise HTTPException(status_code=404, detail=f"no job {job_id}")
    if where == "done":
        # Acked since the score was read: a worker commits the score before its
        # ack, so it is there now, unless it went to another results database.
        return {"job_id": job_id, "status": "done",
                "score": _score(s.results_db, job_id)}
    return {"job_id": job_id, "status": "pending", "stage": where}


@app.get("/health")
def health(request: Request):
    """The queue's depths and lag, when the queue offers them."""
    s, r = request.app.state.settings, request.app.state.r
    return s.queue.stats(r) if hasattr(s.queue, "stats") else {}


def main(argv: list[str] | None = None) -> int:
    import uvicorn

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    try:
        Settings()
    except Exception as err:  # a missing URL, database or queue: say which
        sys.exit(str(err))
    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")
    return 0


if __name__ == "__main__":
    sys.exit(main())
