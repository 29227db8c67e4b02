"""The heartbeats solution as the notebook writes it: the reference queue with
extend and run_with_heartbeat; the other modules here change one thing."""
import threading

from handson.q import (  # the reference queue's keys, see handson/q.py  # noqa: F401
    INFLIGHT,
    JOBS,
    ack,
    claim,
    dead,
    enqueue,
    fail,
    reap,
)


def extend(r, job_id, attempt, lease_s):
    """Push the lease's deadline to now + lease_s. False: the lease is not yours."""
    script = """
    redis.replicate_commands()
    local t = redis.call('TIME')
    local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
    local lease = redis.call('ZSCORE', KEYS[1], ARGV[1])
    if not lease or tonumber(lease) == 0 then return 0 end
    if tonumber(redis.call('HGET', KEYS[2], 'a:' .. ARGV[1])) ~= tonumber(ARGV[2]) then
      return 0
    end
    redis.call('ZADD', KEYS[1], 'XX', now + tonumber(ARGV[3]), ARGV[1])
    return 1
    """
    ms = max(1, round(lease_s * 1000))
    return bool(r.eval(script, 2, INFLIGHT, JOBS, job_id, int(attempt), ms))


def run_with_heartbeat(r, queue, job_id, attempt, lease_s, work):
    """Run work(stop) while a thread renews the lease every lease_s / 3.

    True: the work finished and the lease is still ours (commit, then ack).
    False: the lease was lost; `stop` was set so the work could give up (abandon:
    no commit, no ack).
    """
    stop = threading.Event()        # the lease is gone: the work should give up
    finished = threading.Event()    # the work returned: the heartbeat should end
    lost = []

    def beat():
        while not finished.wait(lease_s / 3):
            if not queue.extend(r, job_id, attempt, lease_s):
                lost.append(True)
                stop.set()
                return

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        work(stop)
    finally:
        finished.set()
        thread.join()
    if lost:
        return False
    # The last heartbeat may be up to lease_s / 3 old: ask once more before the
    # caller commits, so a worker that was frozen does not finish and hope.
    return bool(queue.extend(r, job_id, attempt, lease_s))
