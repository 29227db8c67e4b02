"""A grading run's PostgreSQL, attacked for real by its learner role.

Each attack is what learner code could try with the URL it is given: log in as
the superuser without its password, read the judge's schema, run a program or
read a file through the server, change the server's settings, load an
extension or an untrusted language, make roles, databases or schemas. Each
must be refused by the server; what a queue needs (a table in its own schema,
a SKIP LOCKED claim) must still work. Then the same from inside the sandbox,
where the learner's process sees only its role's URL and the socket.
"""

import json
import sys
import textwrap
from urllib.parse import urlsplit

import psycopg
import pytest

from autograder.isolation import pg_run, sandbox
from handson.infra import pg_server

pytestmark = pytest.mark.skipif(pg_server.find_binaries() is None,
                                reason="no PostgreSQL binaries (initdb, postgres)")


@pytest.fixture(scope="module")
def run_db():
    with pg_run.run_database() as db:
        with psycopg.connect(db.admin_url, autocommit=True) as c:
            c.execute("CREATE TABLE judge.secret (v text)")
            c.execute("INSERT INTO judge.secret VALUES ('the answer key')")
            c.execute("CREATE TABLE public.other (v text)")
        yield db


def _without_password(url: str, user: str) -> str:
    parts = urlsplit(url)
    return parts._replace(netloc=f"{user}@").geturl()


ATTACKS = {
    "read the judge's schema": "SELECT v FROM judge.secret",
    "write in public": "CREATE TABLE public.mine (v int)",
    "read public": "SELECT * FROM public.other",
    "run a program": "COPY (SELECT 1) TO PROGRAM 'touch /tmp/eo-pwned'",
    "read a program's output": "COPY pg_namespace FROM PROGRAM 'id'",
    "read a server file": "COPY pg_namespace FROM '/etc/passwd'",
    "write a server file": "COPY (SELECT 1) TO '/tmp/eo-pwned'",
    "pg_read_file": "SELECT pg_read_file('/etc/passwd')",
    "lo_import a server file": "SELECT lo_import('/etc/passwd')",
    "ALTER SYSTEM": "ALTER SYSTEM SET wal_level = minimal",
    "SET a superuser setting": "SET temp_file_limit = -1",
    "CREATE EXTENSION (untrusted)": "CREATE EXTENSION file_fdw",
    "CREATE EXTENSION (trusted)": "CREATE EXTENSION hstore",
    "untrusted language": "CREATE FUNCTION f() RETURNS int LANGUAGE c "
                          "AS 'libc.so.6', 'getpid'",
    "CREATE ROLE": "CREATE ROLE other LOGIN SUPERUSER",
    "CREATE DATABASE": "CREATE DATABASE other",
    "CREATE SCHEMA": "CREATE SCHEMA other",
    "become superuser": "ALTER ROLE CURRENT_USER SUPERUSER",
    "SET ROLE postgres": "SET ROLE postgres",
    "grant itself a predefined role": "GRANT pg_read_server_files TO CURRENT_USER",
    "temporary table": "CREATE TEMP TABLE t (v int)",
}


@pytest.mark.parametrize("attack", list(ATTACKS))
def test_the_learner_role_is_refused(run_db, attack):
    with psycopg.connect(run_db.learner_url, autocommit=True) as c:
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            c.execute(ATTACKS[attack])


def test_superuser_login_needs_the_password(run_db):
    for user in ("postgres", run_db.role):
        with pytest.raises(psycopg.OperationalError, match="password"):
            psycopg.connect(_without_password(run_db.learner_url, user),
                            connect_timeout=5)
    learner_password = urlsplit(run_db.learner_url).password
    wrong = urlsplit(run_db.admin_url)._replace(
        netloc=f"postgres:{learner_password}@").geturl()
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(wrong, connect_timeout=5)


def test_the_learner_password_is_cheap_to_check_and_still_asked_for(run_db):
    """Its SCRAM verifier has few rounds (a login costs a grade CPU each time);
    the password is random, so rounds protect nothing, and it is still asked."""
    with psycopg.connect(run_db.admin_url, autocommit=True) as c:
        if c.info.server_version < 160000:
            pytest.skip("scram_iterations is PostgreSQL 16's")
        verifier = c.execute("SELECT rolpassword FROM pg_authid WHERE rolname = %s",
                             (run_db.role,)).fetchone()[0]
    assert verifier.startswith(f"SCRAM-SHA-256${pg_run.SCRAM_ITERATIONS}:")
    wrong = urlsplit(run_db.learner_url)._replace(
        netloc=f"{run_db.role}:not-it@{urlsplit(run_db.learner_url).hostname or ''}"
    ).geturl()
    with pytest.raises(psycopg.OperationalError, match="password"):
        psycopg.connect(wrong, connect_timeout=5)


@pytest.mark.parametrize("other", ["postgres", "template1"])
def test_the_learner_role_reaches_no_other_database(run_db, other):
    url = urlsplit(run_db.learner_url)._replace(path=f"/{other}").geturl()
    with pytest.raises(psycopg.OperationalError, match="permission denied"):
        psycopg.connect(url, connect_timeout=5)


def test_the_learner_role_owns_its_schema_and_can_run_a_queue(run_db):
    with psycopg.connect(run_db.learner_url, autocommit=True) as c:
        user, path, sup = c.execute(
            "SELECT current_user, current_schemas(false)::text, "
            "rolsuper FROM pg_roles WHERE rolname = current_user").fetchone()
        assert (user, path, sup) == (run_db.role, f"{{{run_db.role}}}", False)
        c.execute("CREATE TABLE jobs (id int PRIMARY KEY, state text)")
        c.execute("INSERT INTO jobs VALUES (1, 'pending'), (2, 'pending')")
        with c.transaction():
            first = c.execute("SELECT id FROM jobs ORDER BY id LIMIT 1 "
                              "FOR UPDATE SKIP LOCKED").fetchone()
        assert first == (1,)
        granted = c.execute("SELECT count(*) FROM pg_auth_members m JOIN pg_roles "
                            "r ON r.oid = m.member WHERE r.rolname = current_user"
                            ).fetchone()[0]
        assert granted == 0
    with psycopg.connect(run_db.admin_url) as c:     # the judge reads it
        assert c.execute(f'SELECT count(*) FROM "{run_db.role}".jobs'
                         ).fetchone()[0] == 2


PROBE = """
import json, os, psycopg
out = {"env": sorted(k for k in os.environ if "URL" in k)}
url = os.environ["DATABASE_URL"]
with psycopg.connect(url, connect_timeout=5) as c:
    out["user"] = c.execute("SELECT current_user").fetchone()[0]
try:
    psycopg.connect(url.replace(url.split("@")[0], "postgresql://postgres"),
                    connect_timeout=5)
    out["superuser"] = "logged in"
except psycopg.OperationalError as err:
    out["superuser"] = str(err)
out["sees"] = sorted(os.listdir(os.path.dirname(
    url.split("host=")[1].rstrip("/"))))
print(json.dumps(out))
"""


@pytest.mark.skipif(sandbox.isolation().isolation != "full",
                    reason="no full sandbox on this machine")
def test_a_confined_learner_gets_only_its_role_and_the_socket(run_db, tmp_path):
    work = tmp_path / "work"
    work.mkdir()
    fin = sandbox.run([sys.executable, "-c", textwrap.dedent(PROBE)], timeout=60,
                      cwd=work, confined=True, pg_url=run_db.learner_url)
    assert fin.returncode == 0, fin.tail(1000)
    out = json.loads(fin.stdout.strip().splitlines()[-1])
    assert out["user"] == run_db.role
    assert "password" in out["superuser"], out["superuser"]
    assert out["env"] == ["DATABASE_URL", "PGQ_URL"]
    assert out["sees"] == ["sock"], "the cluster's data is in the learner's view"
