"""Broken on purpose: enqueue asks EXISTS, then pushes in another round trip."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from mini_correct import *  # the correct queue; below, the one bug


def enqueue(r, payload, job_id=None):
    job_id = job_id or uuid.uuid4().hex
    # BUG: two producers of one id both see "absent", then both push
    if r.exists(JOB + job_id):
        return job_id
    bound = int(os.environ.get("QUEUE_MAX", 100_000))
    if r.llen(PENDING) >= bound:
        raise QueueFull(f"{bound} jobs pending")
    p = r.pipeline()
    p.hset(JOB + job_id, mapping={"payload": json.dumps(payload), "attempts": 0,
                                  "state": "pending"})
    p.lpush(PENDING, job_id)
    p.execute()
    return job_id
