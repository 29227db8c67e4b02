"""The judge reads only plain tables: a view, a rule, a trigger or a type of the
learner's in place of a course table is refused, in SQLite and in PostgreSQL,
before any of it runs (`handson.infra.trusted_read`)."""

import psycopg
import pytest

from handson.effects.sqldb import Database
from handson.infra import pg_server, trusted_read

SQLITE = {
    "a view": ["CREATE TABLE real_outbox (id INTEGER PRIMARY KEY)",
               "CREATE VIEW outbox AS SELECT * FROM real_outbox"],
    "it has a trigger": ["CREATE TABLE outbox (id INTEGER PRIMARY KEY)",
                         "CREATE TABLE other (id INTEGER)",
                         "CREATE TRIGGER hide AFTER INSERT ON outbox BEGIN "
                         "DELETE FROM other; END"],
}


@pytest.mark.parametrize("what", sorted(SQLITE))
def test_a_sqlite_table_that_is_not_plain_is_refused(tmp_path, what):
    with Database(str(tmp_path / "run.db")) as db:
        for statement in SQLITE[what]:
            db.run(statement)
        said = db.plain_tables(["outbox"])
    assert f"outbox is not the plain table the course's schema makes ({what})" \
        in said, said


def test_a_plain_sqlite_table_passes(tmp_path):
    with Database(str(tmp_path / "run.db")) as db:
        db.run("CREATE TABLE outbox (id INTEGER PRIMARY KEY)")
        assert db.plain_tables(["outbox"]) == ""


PG = {
    "a view": ["CREATE TABLE t_real (v int)", "CREATE VIEW t AS SELECT * FROM t_real"],
    "it has a rule": ["CREATE TABLE t (v int)", "CREATE TABLE t2 (v int)",
                      "CREATE RULE r AS ON INSERT TO t DO INSTEAD "
                      "INSERT INTO t2 VALUES (NEW.v)"],
    "it has row security": ["CREATE TABLE t (v int)",
                            "ALTER TABLE t ENABLE ROW LEVEL SECURITY"],
    "it has a trigger": [
        "CREATE TABLE t (v int)",
        "CREATE FUNCTION f() RETURNS trigger LANGUAGE plpgsql AS "
        "$$ BEGIN RETURN NEW; END $$",
        "CREATE TRIGGER g BEFORE INSERT ON t FOR EACH ROW EXECUTE FUNCTION f()"],
    "a column has a type of your own": ["CREATE DOMAIN mine AS int",
                                        "CREATE TABLE t (v mine)"],
}


@pytest.fixture(scope="module")
def pg():
    if pg_server.find_binaries() is None:
        pytest.skip("no PostgreSQL binaries")
    with pg_server.throwaway_postgres() as url:
        yield url


@pytest.mark.parametrize("what", sorted(PG))
def test_a_postgres_table_that_is_not_plain_is_refused_unread(pg, what):
    schema = "s_" + str(abs(hash(what)))
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute(f"CREATE SCHEMA {schema}")
        c.execute(f"SET search_path = {schema}")
        for statement in PG[what]:
            c.execute(statement)
        c.execute("SET search_path = pg_catalog")
        with pytest.raises(trusted_read.Untrusted) as err:
            trusted_read.read(c, schema, ["t"], "SELECT * FROM {t}")
    assert f"({what})" in str(err.value), err.value


def test_a_plain_postgres_table_is_read(pg):
    with psycopg.connect(pg, autocommit=True) as c:
        c.execute("CREATE SCHEMA plain")
        c.execute("CREATE TABLE plain.t (v int)")
        c.execute("INSERT INTO plain.t VALUES (7)")
        c.execute("SET search_path = pg_catalog")
        assert trusted_read.read(c, "plain", ["t"], "SELECT v FROM {t}"
                                 ).fetchall() == [(7,)]
