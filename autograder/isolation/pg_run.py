"""A grading run's PostgreSQL: the judge's superuser, and a learner who owns one schema.

Anything the learner's code can talk to is as untrusted as that code. The
throwaway cluster (`handson.infra.pg_server`) asks every login for a password;
the superuser's stays with the judge. Each run gets a database of its own and a
learner role in it that logs in with its own password and may do what a queue
needs and nothing else:

- not a superuser, cannot create roles or databases, cannot replicate or skip
  row security, holds none of the predefined roles (`pg_read_server_files`,
  `pg_execute_server_program`, ...), so `COPY ... TO/FROM PROGRAM`, files read
  or written by the server, `lo_import`, `ALTER SYSTEM` and untrusted languages
  are refused;
- not the database's owner and without CREATE or TEMP on it: no schema and no
  extension of its own (even a trusted one), no temporary tables; and no
  login to any other database of the cluster;
- owns exactly one schema (its search path) and has no USAGE on any other one:
  the judge's tables live in a schema it cannot reach, and `public` is closed.

Learner processes get only `learner_url` (the sandbox's `pg_url`); its socket
directory is the only part of the cluster their file system view holds. The
role's statements end after STATEMENT_TIMEOUT, a transaction left idle after
IDLE_TIMEOUT, and a sort spills at most TEMP_FILE_LIMIT.

The cluster itself runs under the confine launcher (`server.prefix`) like the
run's Redis: a uid of its own, a cgroup capping its memory and processes, a
disk budget for its directory, no network but its socket, Landlock, no
capabilities. `RunDatabase.report` says which protections held and what
budget it passed.

The judge never runs what the learner defined with its own rights: it reads
and stages through `judge_url`, the learner's own role with `pg_catalog` as
its only search path, names every learner object with its schema, and checks
first (`handson.infra.trusted_read`) that each is a plain table with no rule, no
row security, no trigger and no column of a type the learner made.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from autograder.isolation import server
from handson.infra import pg_server, trusted_read

JUDGE_SCHEMA = "judge"
CONNECTIONS = 64                 # the learner's logins at once
TEMP_FILE_LIMIT = "128MB"        # what one of its sorts may spill to disk
STATEMENT_TIMEOUT = "30s"        # no claim or finish needs more
IDLE_TIMEOUT = "60s"             # a transaction left open holds its locks
MEM_MB = 768                     # the cluster's cgroup: shared buffers, backends
PIDS = 192                       # the postmaster, its helpers, 100 backends
DISK_MB = 512                    # its data directory, WAL included
# Rounds of the learner password's SCRAM verifier. The default (4096) slows a
# guess at a weak password whose verifier leaked; this one is 24 random bytes,
# and each of its logins (a few hundred a grade) cost 4.5 ms of CPU at 4096,
# client and server together.
SCRAM_ITERATIONS = 16


@dataclass
class RunDatabase:
    admin_url: str               # the superuser, this run's database: setup only
    learner_url: str             # the learner's role, same database
    role: str                    # the learner's role, also its schema's name
    report: server.Report | None = None   # the cluster's, once it stopped

    @property
    def judge_url(self) -> str:
        """The learner's role, resolving names in `pg_catalog` alone: what the
        judge reads and stages through."""
        return with_options(self.learner_url, trusted_read.CATALOG_ONLY)


def with_options(url: str, options: str) -> str:
    parts = urlsplit(url)
    query = "&".join(q for q in parts.query.split("&") if q)
    return urlunsplit(parts._replace(
        query=f"{query}&options={quote(options)}" if query else
        f"options={quote(options)}"))


def _with(url: str, user: str, password: str, dbname: str) -> str:
    parts = urlsplit(url)
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(
        netloc=f"{quote(user)}:{quote(password)}@{host}", path=f"/{dbname}"))


_SETUP_LOCK = 0x656F5047          # any constant the cluster's users agree on


def create(cluster_url: str) -> RunDatabase:
    """A fresh database on the cluster, its judge schema and its learner role."""
    name = f"learner_{secrets.token_hex(6)}"
    password = secrets.token_urlsafe(24)
    ident = sql.Identifier(name)
    with psycopg.connect(cluster_url, autocommit=True) as c:
        # Runs made side by side revoke on the same shared databases: one at a
        # time ("tuple concurrently updated" otherwise); the lock ends with c.
        c.execute("SELECT pg_advisory_lock(%s)", (_SETUP_LOCK,))
        c.execute(sql.SQL("CREATE DATABASE {}").format(ident))
        if c.info.server_version >= 160000:
            c.execute(sql.SQL("SET scram_iterations = {}").format(
                sql.Literal(SCRAM_ITERATIONS)))
        c.execute(sql.SQL(
            "CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE "
            "NOREPLICATION NOBYPASSRLS NOINHERIT CONNECTION LIMIT {}").format(
                ident, sql.Literal(password), sql.Literal(CONNECTIONS)))
        for name_, value in (("temp_file_limit", TEMP_FILE_LIMIT),
                             ("statement_timeout", STATEMENT_TIMEOUT),
                             ("idle_in_transaction_session_timeout", IDLE_TIMEOUT)):
            c.execute(sql.SQL("ALTER ROLE {} SET {} = {}").format(
                ident, sql.Identifier(name_), sql.Literal(value)))
        for db in (name, "postgres", "template1"):   # its own database only
            c.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(
                sql.Identifier(db)))
        c.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(ident, ident))
    admin = _with(cluster_url, "postgres", _password(cluster_url), name)
    with psycopg.connect(admin, autocommit=True) as c:
        c.execute("REVOKE ALL ON SCHEMA public FROM PUBLIC")
        c.execute(sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(ident, ident))
        c.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(JUDGE_SCHEMA)))
        c.execute(sql.SQL("ALTER ROLE {} SET search_path = {}").format(ident, ident))
    return RunDatabase(admin, _with(cluster_url, name, password, name), name)


def _password(url: str) -> str:
    userinfo = urlsplit(url).netloc.rpartition("@")[0]
    return unquote(userinfo.partition(":")[2])


@contextlib.contextmanager
def run_database() -> Iterator[RunDatabase]:
    """One run's database on a cluster of its own under the confine launcher
    (never DATABASE_URL: the judge must own the server); all deleted
    afterwards, and `.report` set to what the launcher said of the cluster."""
    status: dict = {}

    def launcher(home: str) -> list[str]:
        status["path"] = Path(home).with_suffix(".status.json")
        return server.prefix(home, status["path"], MEM_MB, PIDS, DISK_MB,
                             identity="postgres")
    pg = pg_server.Server(launcher=launcher).start()
    db = None
    try:
        db = create(pg.url)
        yield db
    finally:
        pg.stop()
        report = server.Report("PostgreSQL", status["path"], MEM_MB, DISK_MB)
        if db is not None:
            db.report = report
