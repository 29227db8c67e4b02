"""Broken on purpose: enqueue writes the job, then queues it in a second trip."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    bound = int(os.environ.get("QUEUE_MAX", 100_000))
    if r.llen(PENDING) >= bound:
        raise QueueFull(f"{bound} jobs pending")
    # each step is atomic, and two producers never both push; BUG: a producer
    # killed between the two steps leaves a job that is never queued, and its
    # retry with the same id finds the job and pushes nothing
    if not r.hsetnx(JOB + job_id, "payload", json.dumps(payload)):
        return job_id
    r.hset(JOB + job_id, mapping={"attempts": 0, "state": "pending"})
    r.lpush(PENDING, job_id)
    return job_id
