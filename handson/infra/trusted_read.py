"""Reading a learner's tables without running the learner's code.

A table a learner owns may be a view over a function of theirs, carry a rule
that rewrites a SELECT, hide rows behind row security, or have columns of a
type whose casts and operators are theirs. A reader that trusts it runs that
code with its own rights, and reads what the learner chose to show. So the
judge reads as the learner's own role, resolves names in `pg_catalog` alone,
names each table with its schema, and first locks the tables and checks in the
catalog that each is a plain one (`verify`); in one transaction, so nothing is
swapped between the check and the read.
"""

from __future__ import annotations

from psycopg import sql

CATALOG_ONLY = "-c search_path=pg_catalog"      # a connection's `options`

_CHECK = """
SELECT c.relkind, c.relhasrules, c.relrowsecurity,
       (SELECT count(*) FROM pg_catalog.pg_trigger g
         WHERE g.tgrelid = c.oid AND NOT g.tgisinternal),
       (SELECT count(*) FROM pg_catalog.pg_attribute a
          JOIN pg_catalog.pg_type t ON t.oid = a.atttypid
         WHERE a.attrelid = c.oid AND a.attnum > 0
           AND t.typnamespace <> 'pg_catalog'::pg_catalog.regnamespace)
  FROM pg_catalog.pg_class c
  JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
 WHERE n.nspname = %s AND c.relname = %s"""
_KINDS = {"v": "a view", "m": "a materialized view", "p": "partitioned",
          "f": "a foreign table"}


def verify(conn, schema: str, tables) -> str:
    """'' when each table is a plain one, else what is not, in a learner's words.

    Plain: not a view, partitioned or foreign; no rule, no row security, no
    trigger but the server's own (a foreign key's), no column of a type the
    learner made. Reads the catalog only.
    """
    for table in tables:
        row = conn.execute(_CHECK, (schema, table)).fetchone()
        if row is None:
            return f"there is no table {table}"
        kind, rules, rls, triggers, own_types = row
        if kind == "r" and not (rules or rls or triggers or own_types):
            continue
        why = _KINDS.get(kind) or ("it has a rule" if rules else
                                   "it has row security" if rls else
                                   "it has a trigger" if triggers else
                                   "a column has a type of your own")
        return _refusal(table, why)
    return ""


def _refusal(table: str, why: str) -> str:
    return (f"{table} is not the plain table the course's schema makes ({why}); "
            "the grader reads only plain tables")


class Untrusted(RuntimeError):
    """A table the reader was asked to read is not a plain one."""


def read(conn, schema: str, tables, query: str, params=()):
    """Run `query` ({name} placeholders: each table, schema-qualified) after
    locking `tables` and verifying them, in one transaction; its cursor."""
    names = {t: sql.Identifier(schema, t) for t in tables}
    with conn.transaction():
        conn.execute(sql.SQL("LOCK TABLE {} IN ACCESS SHARE MODE").format(
            sql.SQL(", ").join(names.values())))
        wrong = verify(conn, schema, tables)
        if wrong:
            raise Untrusted(wrong)
        return conn.execute(sql.SQL(query).format(**names), params)


def schema_of(conn) -> str:
    """The schema a connection's unqualified names land in (its role's)."""
    return conn.execute("SELECT pg_catalog.current_schema()").fetchone()[0]


def verify_sqlite(conn, tables) -> str:
    """The same for a SQLite file in the learner's work dir: each name a plain
    table, with no trigger on it (SQLite has no rules, rights or types)."""
    for table in tables:
        kinds = [k for k, in conn.execute(
            "SELECT type FROM sqlite_schema WHERE name = ? AND type IN "
            "('table', 'view')", (table,))]
        if kinds != ["table"]:
            return _refusal(table, "a view" if kinds else "missing")
        if conn.execute("SELECT 1 FROM sqlite_schema WHERE type = 'trigger' "
                        "AND tbl_name = ?", (table,)).fetchone():
            return _refusal(table, "it has a trigger")
    return ""
