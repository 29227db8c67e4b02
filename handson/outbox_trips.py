"""The outbox's three functions killed between each two of their round trips.

Each of save_document, relay_once and summarize is killed after each of its
round trips, SQL statements and Redis replies (`handson.round_trips`), where
the learner named a point or not. Then the system carries on as after a crash,
and each function is judged by its own invariant, the rest of the system being
the course's:

- save_document killed: the course's relay and consumer run; every saved
  document has its job and every job its document.
- relay_once killed: the learner's relay runs again until it publishes
  nothing; every document is delivered (twice is fine: at least once).
- summarize killed: the job is delivered again (the killed consumer never
  acked it); the document's effect is applied exactly once.
"""

from __future__ import annotations

from types import SimpleNamespace

from handson import outbox
from handson.effects.sqldb import Database
from handson.round_trips import (
    RIVAL_WAIT_S,
    Scene,
    Stores,
    Unrunnable,
    database,
    each_stop,
    hosts,
    run_scenes,
)

DOCS = 2                # documents waiting for the killed relay


FIX = {                 # what to change, in the learner's words
    "save_document": "put both inserts in ONE transaction (`with "
    "db.transaction():`), so a handler killed after any statement leaves the "
    "document and its outbox row together, or neither",
    "relay_once": "publish a row first and record it as sent (or delete it) "
    "only after its publish returned, row by row: a relay killed after any "
    "statement or Redis reply must leave every unpublished row unsent, so the "
    "next relay_once publishes it",
    "summarize": "write the key (summarized) and the effect (summaries) in ONE "
    "transaction, the effect only when the key is new: a consumer killed after "
    "any statement must leave both or neither, so the redelivery applies it",
}


def _one_document(db: Database) -> None:
    db.run("INSERT INTO documents (id, body) VALUES (0, 'document 0')")


def _summarized_once(db: Database) -> str:
    n = db.query("SELECT count(*) FROM summaries WHERE doc_id = 0")[0][0]
    return "" if n == 1 else f"document 0 was summarized {n} times"


def _scenes(bench, learner, kit) -> list[Scene]:
    ldb, lr, lqueue, lpause = kit
    r, q = bench.r, bench.queue

    def saved_vs_jobs(db: Database) -> str:
        outbox.relay_until_empty(db, r, q)
        jobs = set(outbox.consume_all(db, r, q))
        saved = outbox.documents(db)
        if saved - jobs:
            return f"document {sorted(saved - jobs)[0]} is saved but no job came"
        if jobs - saved:
            return f"a job came for document {sorted(jobs - saved)[0]}, never saved"
        return ""

    def saved(db: Database) -> None:
        for doc_id in range(DOCS):
            outbox.save(db, r, q, doc_id, f"document {doc_id}", "outbox")

    def relay_again(db: Database) -> str:
        outbox._until_zero(lambda: learner.relay_once(ldb, lr, lqueue, lpause)
                           or 0, max_batches=50)
        lost = sorted(set(range(DOCS)) - set(outbox.consume_all(db, r, q)))
        return f"document {lost[0]} was never delivered" if lost else ""

    def delivered_again(db: Database) -> str:
        learner.summarize(ldb, 0)
        return _summarized_once(db)

    return [
        Scene("save_document", lambda db: None,
              lambda: learner.save_document(ldb, 0, "document 0", lpause),
              saved_vs_jobs, "the relay published every outbox row and a "
              "consumer took every job", FIX["save_document"]),
        Scene("relay_once", saved,
              lambda: learner.relay_once(ldb, lr, lqueue, lpause),
              relay_again, f"relay_once ran again until it returned 0 "
              f"({DOCS} documents were waiting) and a consumer took every job",
              FIX["relay_once"]),
        Scene("summarize", _one_document, lambda: learner.summarize(ldb, 0),
              delivered_again, "the job came again (the killed consumer never "
              "acked it) and summarize(db, 0) ran", FIX["summarize"]),
    ]


def killed_between_trips(bench) -> dict:
    """Each function killed after each of its round trips, judged; plain data."""
    try:
        [learner] = hosts(bench.target, bench.module, "your outbox module")
    except Unrunnable as err:
        return {"error": str(err)}
    a = SimpleNamespace(db=bench.target, redis=bench.redis_url,
                        queue=bench.queue_spec)
    kit = outbox._stand_ins(a, outbox._no_pause)
    try:
        return run_scenes(Stores(bench.fresh, outbox.TABLES, bench.redis_url),
                          learner, _scenes(bench, learner, kit))
    finally:
        learner.close()


FIX_RIVAL = ("check the key and write it in the SAME transaction as the "
             "effect (`with db.transaction():` around the check, the key and "
             "the effect, or INSERT ... ON CONFLICT DO NOTHING RETURNING as the "
             "check): two consumers of one job at once must apply it once")


def interleaved_consumers(bench) -> dict:
    """summarize stopped after each of its round trips while another
    consumer, in a host of its own, summarizes the same document to the end
    (a job delivered to two workers at once); one effect must remain."""
    try:
        learner, other = hosts(bench.target, bench.module, "your outbox module", 2)
    except Unrunnable as err:
        return {"error": str(err)}
    ldb, rdb = database(bench.target), database(bench.target, RIVAL_WAIT_S)
    scene = Scene("summarize", _one_document, lambda: learner.summarize(ldb, 0),
                  lambda db: _summarized_once(db), "meanwhile another consumer "
                  "ran summarize(db, 0) to its end; then the first went on",
                  FIX_RIVAL, rival=lambda: other.summarize(rdb, 0))
    try:
        return run_scenes(Stores(bench.fresh, outbox.TABLES), learner, [scene],
                          each=each_stop)
    finally:
        learner.close()
        other.close()
