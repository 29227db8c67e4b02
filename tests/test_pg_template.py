"""Clusters copied from one initdb run: each still has a superuser password of
its own, a broken copy costs a start and is remade, and none needs the cache.

`handson.infra.pg_server.template` keeps initdb's output in the user's cache;
each cluster copies it and replaces the template's superuser password before
anything else may log in. Each test keeps its templates in a folder of its own.
"""

import os
from pathlib import Path

import psycopg
import pytest

from autograder.isolation import pg_run
from handson.infra import pg_server

pytestmark = pytest.mark.skipif(pg_server.find_binaries() is None,
                                reason="no PostgreSQL binaries (initdb, postgres)")


@pytest.fixture
def templates(tmp_path, monkeypatch) -> Path:
    folder = tmp_path / "templates"
    monkeypatch.setenv(pg_server.TEMPLATES_ENV, str(folder))
    return folder


def _made(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.startswith("pg-"))


def _logs_in(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=5).close()
    except psycopg.OperationalError:
        return False
    return True


def test_each_copy_has_its_own_superuser_password(templates):
    first = pg_server.Server().start()
    second = pg_server.Server().start()
    try:
        [made] = _made(templates)
        assert oct(made.stat().st_mode & 0o777) == "0o700"
        _, template_password = pg_server.template(first.initdb, first.postgres)
        for server in (first, second):
            assert _logs_in(server.url)
            assert not _logs_in(server._url(template_password))
        assert first.password != second.password
        assert not _logs_in(second._url(first.password))
    finally:
        first.stop()
        second.stop()
    assert _made(templates) == [made]               # made once, kept


def test_a_graded_run_s_cluster_is_a_copy_with_the_same_protections(templates):
    with pg_run.run_database() as db:
        with psycopg.connect(db.admin_url) as c:
            collations = {r[0] for r in c.execute("SELECT datcollate FROM "
                                                  "pg_database")}
        assert collations == {os.environ.get("LANG") or "C.UTF-8"}
    assert db.report.isolation.startswith("full"), db.report.isolation
    assert len(_made(templates)) == 1


def test_a_copy_that_will_not_start_is_remade(templates):
    first = pg_server.Server().start()
    first.stop()
    [made] = _made(templates)
    (made / "data" / "global" / "pg_control").write_bytes(b"broken")
    second = pg_server.Server().start()             # initdb, this once
    try:
        assert _logs_in(second.url)
    finally:
        second.stop()
    assert _made(templates) == []                   # the broken one is gone
    third = pg_server.Server().start()
    try:
        assert _logs_in(third.url) and len(_made(templates)) == 1
    finally:
        third.stop()


def test_without_a_cache_each_cluster_runs_initdb(monkeypatch, tmp_path):
    monkeypatch.setenv(pg_server.TEMPLATES_ENV, "")
    server = pg_server.Server().start()
    try:
        assert _logs_in(server.url)
    finally:
        server.stop()
    blocker = tmp_path / "a-file"                   # a cache that cannot be made
    blocker.write_text("")
    monkeypatch.setenv(pg_server.TEMPLATES_ENV, str(blocker / "cache"))
    assert pg_server.template(server.initdb, server.postgres) is None
    server = pg_server.Server().start()
    try:
        assert _logs_in(server.url)
    finally:
        server.stop()
