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
directory is the only part of the cluster their file system view holds.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from urllib.parse import quote, unquote, urlsplit, urlunsplit

import psycopg
from psycopg import sql

from handson.infra import pg_server

JUDGE_SCHEMA = "judge"
CONNECTIONS = 64                 # the learner's logins at once
TEMP_FILE_LIMIT = "256MB"        # what one of its sorts may spill to disk


@dataclass
class RunDatabase:
    admin_url: str               # the judge's: the superuser, this run's database
    learner_url: str             # the learner's role, same database
    role: str                    # the learner's role, also its schema's name


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
        c.execute(sql.SQL(
            "CREATE ROLE {} LOGIN PASSWORD {} NOSUPERUSER NOCREATEDB NOCREATEROLE "
            "NOREPLICATION NOBYPASSRLS NOINHERIT CONNECTION LIMIT {}").format(
                ident, sql.Literal(password), sql.Literal(CONNECTIONS)))
        c.execute(sql.SQL("ALTER ROLE {} SET temp_file_limit = {}").format(
            ident, sql.Literal(TEMP_FILE_LIMIT)))
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
    """A throwaway cluster (never DATABASE_URL: the judge must own the server)
    with one run's database; all deleted afterwards."""
    with pg_server.throwaway_postgres() as cluster:
        yield create(cluster)
