"""Wrong submissions, one per common bug, as edits of the solution notebooks.

Each entry: the assignment, the edits (answer cell id -> list of edits; an edit
is (old, new), or ("def", NAME, SOURCE) to replace a whole function, or
("cell", SOURCE) to replace the whole cell), and what the grade must show:
`loses` maps a check to a phrase its message must contain (the check that names
the bug; never a chaos check that sees the bug only by luck), `keeps` lists
checks that must still pass (the bug costs nothing else), `problem` is a
phrase that must appear in the report's problems, `note` one in its notes.
`loses_if_built` maps a chaos check that sees the bug through a fault the run
builds when it can (not a quota) to (the phrase of its failure, the phrase of
its pass saying the fault was not built).
Edits that no longer apply fail the test, so the corpus cannot rot silently.
"""

from pathlib import Path

HERE = Path(__file__).resolve().parent
# The process the leftover submission starts: a length of sleep nothing else
# on the machine uses, so a test can tell it from anyone else's.
SLEEPER = "600.0137"
ALT_STREAMS = (HERE.parent / "queues" / "alt_streams.py").read_text()

SUBMISSIONS = {
    # --- assignment 1 -----------------------------------------------------------
    "a1_effect_then_key": dict(
        assignment="delivery_semantics",
        edits={"dedup_impl": [(
            "            if crashes and attempt == 1:\n"
            "                continue                       # crashed before the "
            "commit\n"
            "            keys.add(key)                      # one commit: key and "
            "effect\n"
            "            sink.apply(job_id)\n",
            "            sink.apply(job_id)                 # the effect ...\n"
            "            if crashes and attempt == 1:\n"
            "                continue                       # ... the crash ...\n"
            "            keys.add(key)                      # ... the key, too late\n"
        )]},
        loses={"dedup_in_tx": "two writes"},
        keeps=["dedup_key_stable", "dedup_outside_tx", "ack_before_work"]),
    # An endless loop, sys.exit(), a process left running and an edited test
    # cell, graded in one run: three misbehaviours cost their checks; the
    # edited test cell (a forged verdict) is restored from the source, so its
    # check earns what the learner's code earns, with a note.
    "a1_loop_exit_leftover_tamper": dict(
        assignment="delivery_semantics",
        edits={
            "window_impl": [("    ### BEGIN SOLUTION\n",
                             "    ### BEGIN SOLUTION\n    while True:\n"
                             "        pass\n")],
            "lease_impl": [("    ### BEGIN SOLUTION\n",
                            "    ### BEGIN SOLUTION\n    import sys\n"
                            "    sys.exit(3)\n")],
            "ack_after_work_impl": [("    ### END SOLUTION",
                                     "    ### END SOLUTION\n\n\nimport subprocess\n"
                                     "_sleeper = subprocess.Popen(['sleep', "
                                     f"'{SLEEPER}'], start_new_session=True)\n")],
            "ack_before_work": [("check('ack_before_work')", "print('trust me')")],
        },
        loses={"window_escapes": "did not return within",
               "lease_doubles": "sys.exit"},
        keeps=["ack_before_work", "ack_after_work", "dedup_key_stable",
               "dedup_outside_tx", "dedup_in_tx"],
        problem="left 1 process",
        note="test cell 'ack_before_work' restored from the current release"),
    # --- assignment 2 -----------------------------------------------------------
    "a2_ack_no_fence": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [(
            "    if tonumber(redis.call('HGET', KEYS[2] .. ARGV[1], 'attempts')) ~= "
            "tonumber(ARGV[2])\n    then return 0 end\n"
            "    redis.call('ZREM', KEYS[1], ARGV[1])\n",
            "    redis.call('ZREM', KEYS[1], ARGV[1])\n")]},
        loses={"zombie_ack_refused": "attempt"},
        # lost whenever the chaos run built a zombie (5 or 6 a run on an idle
        # machine, none in one run beside a loaded suite); else its pass says so
        loses_if_built={"chaos_no_stale_ack": ("stale_ack_accepted",
                                               "built no zombie")},
        keeps=["claim_atomic_concurrent", "reap_atomic_concurrent",
               "zombie_fail_refused", "killed_attempt_counts"]),
    "a2_claim_two_trips": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [("def", "claim", '''
def claim(r, lease_s):
    """Look at the oldest job, then take it: two round trips."""
    job_id = r.lindex(PENDING, -1)
    if job_id is None:
        return None
    r.lrem(PENDING, -1, job_id)
    job_id = _text(job_id)
    attempt = r.hincrby(JOB + job_id, "attempts", 1)
    sec, usec = r.time()
    r.zadd(LEASES, {job_id: sec * 1000 + usec // 1000 + round(lease_s * 1000)})
    return job_id, json.loads(r.hget(JOB + job_id, "payload")), int(attempt)
''')]},
        # two claimers that read the same id both take it; a worker killed
        # between the LREM and the lease takes the job with it. The checks
        # that stop a claim between its replies see both every time; the chaos
        # run sees them only when a kill or a rival lands in that gap (luck).
        loses={"claim_atomic_concurrent": "ONE script",
               "interleavings": "ONE round trip",
               "killed_between_replies": "killed after Redis reply"},
        keeps=["zombie_ack_refused", "reap_atomic_concurrent"]),
    "a2_reap_not_atomic": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [("def", "reap", '''
def reap(r, max_attempts=3):
    """Read the expired leases, then move them one by one."""
    sec, usec = r.time()
    now = sec * 1000 + usec // 1000
    requeued = dead_n = 0
    for job_id, lease in r.zrangebyscore(LEASES, "-inf", now, withscores=True):
        r.zrem(LEASES, job_id)
        job = JOB + _text(job_id)
        if lease != 0:
            r.hset(job, "error", EXPIRED)
        if int(r.hget(job, "attempts")) >= max_attempts:
            r.zadd(DLQ, {job_id: now})
            dead_n += 1
        else:
            r.lpush(PENDING, job_id)
            requeued += 1
    return requeued, dead_n
''')]},
        # Two contract checks stop it on every run. The chaos run needs two
        # reapers inside the same expired lease at once: it failed this queue
        # in most runs (a job handed out twice, or int(None) raised by a job
        # acked between two of reap's round trips), but one run in a loaded
        # suite saw no such race, so it is not asserted here.
        # Its ack deletes the job: the copy a second reaper put back is then
        # claimed as attempt 1 again, and the first attempt's zombie acks it.
        # The chaos run sees that stale ack now and then; interleavings plays
        # it on every run, so the chaos check fails every time.
        loses={"reap_atomic_concurrent": "ONE script",
               "interleavings": "a zombie was taken for the owner",
               "chaos_no_stale_ack": ""},
        keeps=["zombie_ack_refused", "claim_atomic_concurrent"]),
    "a2_syntax_error": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [("def claim(r, lease_s):", "def claim(r, lease_s)")]},
        loses={"enqueue_idempotent": "syntax error",
               "chaos_nothing_lost": "syntax error"},
        keeps=[]),
    "a2_sys_exit_on_import": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [("import uuid\n", "import uuid\nimport sys\n\n"
                            "sys.exit('no queue today')\n")]},
        loses={"enqueue_idempotent": "sys.exit", "bound_refuses": "sys.exit"},
        keeps=[]),
    # --- assignment 3 -----------------------------------------------------------
    # --- idempotent_claims ------------------------------------------------------
    "claims_effect_in_two_transactions": dict(
        assignment="idempotent_claims",
        edits={"myclaims": [(
            "    with db.transaction():\n"
            "        op_id = claim(db, POINTS_JOB, key, now)\n"
            "        if op_id is not None:\n"
            "            pause(\"after-claim\")\n"
            "            db.run(\"INSERT INTO points_ledger (order_key, points) "
            "VALUES (?, ?)\",\n"
            "                   (key, 10))\n"
            "            pause(\"after-effect\")\n"
            "            complete(db, op_id, now)\n"
            "    if op_id is not None:\n"
            "        return \"applied\"\n"
            "    return \"skip:\" + read(db, POINTS_JOB, key)[1]\n",
            "    op_id = claim(db, POINTS_JOB, key, now)        # commits alone\n"
            "    if op_id is None:\n"
            "        op_id, status, claimed_at = read(db, POINTS_JOB, key)\n"
            "        if status == \"completed\" or now - claimed_at < lease_s:\n"
            "            return \"skip\"\n"
            "    pause(\"after-claim\")\n"
            "    db.run(\"INSERT INTO points_ledger (order_key, points) "
            "VALUES (?, ?)\", (key, 10))\n"
            "    pause(\"after-effect\")\n"
            "    complete(db, op_id, now)\n"
            "    return \"applied\"\n")]},
        loses={"same_transaction_effect": "ONE transaction"},
        keeps=["first_delivery", "repeat_after_success", "two_workers_at_once",
               "different_order", "dies_before_email", "dies_after_email",
               "young_claim_skipped"]),
    # --- outbox_relay -----------------------------------------------------------
    "outbox_delete_before_publish": dict(
        assignment="outbox_relay",
        edits={"myoutbox": [(
            "        queue.enqueue(r, {\"doc_id\": doc_id, \"outbox_id\": outbox_id})\n"
            "        pause(\"between\", outbox_id)\n"
            "        db.run(\"UPDATE outbox SET sent = 1 WHERE id = ?\", "
            "(outbox_id,))\n",
            "        db.run(\"DELETE FROM outbox WHERE id = ?\", (outbox_id,))\n"
            "        pause(\"between\", outbox_id)\n"
            "        queue.enqueue(r, {\"doc_id\": doc_id, \"outbox_id\": outbox_id})"
            "\n")]},
        loses={"relay_nothing_lost": "publish first"},
        keeps=["save_atomic", "relay_kills_effects_once", "effects_once",
               "no_skip_out_of_order"]),
    "a3_no_final_lease_check": dict(
        assignment="heartbeats",
        edits={"heartbeat": [(
            "    return bool(queue.extend(r, job_id, attempt, lease_s))\n",
            "    return True\n")]},
        loses={"final_lease_check": "once more"},
        keeps=["zombie_extend_refused", "extend_does_not_resurrect",
               "heartbeat_keeps_lease", "deadline_from_server_clock",
               "stops_when_lease_lost", "long_jobs_run_once"]),
}

# Correct, and written differently from the solution: must score full marks.
CORRECT = {
    # publishes with an idempotent job id (a fresh Redis per run is what lets
    # the row ids of fresh tables be published again), in batches of 7
    "outbox_idempotent_ids": dict(
        assignment="outbox_relay",
        edits={"myoutbox": [
            ("def relay_once(db, r, queue, pause, batch=100):",
             "def relay_once(db, r, queue, pause, batch=7):"),
            ("outbox_id})\n        pause(",
             "outbox_id},\n                      job_id=f\"outbox-{outbox_id}\")\n"
             "        pause(")]}),
    # a dedup key that names the operation, and ack_after_work that counts
    # deliveries before applying them
    "a1_other_key_and_loops": dict(
        assignment="delivery_semantics",
        edits={"dedup_key_impl": [(
            "    return job_id                 # stable across attempts; the attempt "
            "is not", "    return f\"apply:{job_id}\"")],
               "ack_after_work_impl": [("cell", """def ack_after_work(jobs):
    \"\"\"At-least-once, counted first: two deliveries for a job that crashed.\"\"\"
    sink = Sink()
    for job_id, crashes in jobs:
        for _ in range(2 if crashes else 1):
            sink.apply(job_id)
    return sink
""")]}),
    # reap in batches of 50 per script call (each batch atomic), and every
    # key renamed
    "a2_batched_reap_other_keys": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [
            ('P = "{mq}:"', 'P = "{learner-q}:"'),
            ('LEASES = P + "leases"', 'LEASES = P + "in_flight"'),
            ('JOB = P + "job:"', 'JOB = P + "jobs/"'),
            ("    local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, "
             "'WITHSCORES')\n",
             "    local expired = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, "
             "'WITHSCORES',\n      'LIMIT', 0, 50)\n"),
            ("    requeued, dead_n = r.eval(script, 4, LEASES, JOB, PENDING, DLQ, "
             "int(max_attempts),\n                              EXPIRED)\n"
             "    return int(requeued), int(dead_n)\n",
             "    requeued = dead_n = 0\n"
             "    while True:                    # batches of 50, each one script\n"
             "        a, b = r.eval(script, 4, LEASES, JOB, PENDING, DLQ,\n"
             "                      int(max_attempts), EXPIRED)\n"
             "        requeued, dead_n = requeued + int(a), dead_n + int(b)\n"
             "        if int(a) + int(b) < 50:\n"
             "            return requeued, dead_n\n")]}),
    # the heartbeat on a schedule of its own (deadlines by the monotonic
    # clock), extend checking the attempt first
    # POLICY "miss": a stale claim is closed without sending
    "a2_alt_streams": dict(
        assignment="claim_ack_reap",
        edits={"myqueue": [("cell", "%%writefile myqueue.py\n" + ALT_STREAMS)]}),
}


def _replace_function(source: str, name: str, new: str) -> str:
    start = source.index(f"\ndef {name}(") + 1
    nxt = source.find("\ndef ", start)
    end = len(source) if nxt == -1 else nxt + 1
    return source[:start] + new.strip("\n") + "\n\n" + source[end:]


def build(name: str, dest: Path, source_dir: Path) -> Path:
    """Write the submission `name` as a notebook under dest; return its path."""
    import nbformat

    spec = SUBMISSIONS.get(name) or CORRECT[name]
    assignment = spec["assignment"]
    nb = nbformat.read(str(source_dir / assignment / f"{assignment}.ipynb"), 4)
    cells = {c.metadata["nbgrader"]["grade_id"]: c for c in nb.cells
             if "nbgrader" in c.metadata}
    for gid, edits in spec["edits"].items():
        cell = cells[gid]
        for edit in edits:
            if edit[0] == "def":
                cell.source = _replace_function(cell.source, edit[1], edit[2])
            elif edit[0] == "cell":
                cell.source = edit[1]
            else:
                old, new = edit
                assert cell.source.count(old) == 1, f"{name}: edit no longer applies"
                cell.source = cell.source.replace(old, new)
    path = dest / name / f"{assignment}.ipynb"
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, str(path))
    return path


# Graded (quick) by the class test, which holds them to what they must show here:
# the notebook corpus test grades the others, so none is graded twice in full.
IN_CLASS = {"a1_effect_then_key", "claims_effect_in_two_transactions",
            "outbox_delete_before_publish", "a3_no_final_lease_check",
            "a2_alt_streams"}


def missed(name: str, result: dict) -> list[str]:
    """What the grade (a report's JSON: checks, problems, notes) fails to show
    of the submission's entry; none for a correct one that earned every point."""
    spec = SUBMISSIONS.get(name)
    by = {c["name"]: c for c in result["checks"]}
    if spec is None:
        return [f"{name} lost {c['name']}: {c['message']} | {c['got']}"
                for c in result["checks"] if not c["ok"]]
    out = []
    for check, phrase in spec["loses"].items():
        c = by[check]
        text = f"{c['message']} {c['got']}"
        if c["ok"] or phrase.lower() not in text.lower():
            out.append(f"{name}: {check} should fail saying {phrase!r}: {text!r}")
    for check, (phrase, unbuilt) in spec.get("loses_if_built", {}).items():
        c = by[check]
        if (unbuilt not in c["got"] if c["ok"]
                else phrase not in f"{c['message']} {c['got']}"):
            out.append(f"{name}: {check} {'passed' if c['ok'] else 'failed'}: "
                       f"{c['message']} | {c['got']}")
    out += [f"{name} also broke {check}: {by[check]['message']} | {by[check]['got']}"
            for check in spec["keeps"] if not by[check]["ok"]]
    for key, where in (("problem", "problems"), ("note", "notes")):
        if key in spec and not any(spec[key] in x for x in result[where]):
            out.append(f"{name}: no {key} says {spec[key]!r}: {result[where]}")
    return out
