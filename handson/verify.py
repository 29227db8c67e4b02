"""The seed's one-line check of the results database.

    python -m handson.verify [results.db]
"""

import sqlite3
import sys


def summary(db: str | sqlite3.Connection) -> dict:
    """Row counts: idempotent rows, naive rows, naive distinct jobs, the counter."""
    conn = sqlite3.connect(db, timeout=30) if isinstance(db, str) else db
    try:
        one = lambda sql: conn.execute(sql).fetchone()[0]
        return {"rows": one("select count(*) from scores"),
                "naive_rows": one("select count(*) from scores_naive"),
                "naive_distinct": one("select count(distinct job_id) "
                                      "from scores_naive"),
                "counter": one("select n from stats")}
    finally:
        if conn is not db:
            conn.close()


def line(s: dict) -> str:
    return (f"idempotent rows: {s['rows']} | naive rows: {s['naive_rows']} "
            f"| naive distinct: {s['naive_distinct']} | counter: {s['counter']}")


if __name__ == "__main__":
    print(line(summary(sys.argv[1] if len(sys.argv) > 1 else "results.db")))
