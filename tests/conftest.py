"""Fixtures: a real PostgreSQL (see tests/pg.py), an isolated schema per test, and
helpers to run real `pgworker run` processes."""

from __future__ import annotations

import itertools
import os
import sys

import psycopg
import pytest

sys.path.insert(0, os.path.dirname(__file__))

from pg import find_postgres, make_settings  # noqa: E402

from pgworker import App  # noqa: E402
from pgworker.migrate import drop_schema  # noqa: E402

_found: tuple[str, str] | None = None
_counter = itertools.count()


def _postgres() -> tuple[str, str]:
    global _found
    if _found is None:
        _found = find_postgres()
    return _found


def pytest_report_header(config):
    try:
        dsn, how = _postgres()
        with psycopg.connect(dsn) as conn:
            version = conn.execute("SHOW server_version").fetchone()[0]
        return f"postgresql: {version} ({how})"
    except Exception as exc:  # reported again, as a failure, by the first test that needs it
        return f"postgresql: not found ({exc})"


@pytest.fixture(autouse=True)
def _worker_logs_in_tmp_path(tmp_path, monkeypatch):
    """`pgworker run` subprocesses of a test (tests/worker.py) log under its tmp_path."""
    import worker

    monkeypatch.setattr(worker, "LOG_DIR", str(tmp_path))


@pytest.fixture(scope="session")
def pg_dsn() -> str:
    return _postgres()[0]


@pytest.fixture
def schema(pg_dsn):
    """A fresh, unmigrated schema name, dropped after the test."""
    name = f"t_{os.getpid()}_{next(_counter)}"
    yield name
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        drop_schema(conn, name)




@pytest.fixture
def app(pg_dsn, schema):
    """A migrated App on its own schema."""
    a = App(settings=make_settings(pg_dsn, schema))
    a.migrate()
    yield a
    a.close()


@pytest.fixture
def conn(pg_dsn):
    c = psycopg.connect(pg_dsn, autocommit=True)
    yield c
    c.close()


@pytest.fixture
def env(app, pg_dsn):
    """The test's App knowing the acceptance app's tasks (so enqueue uses their
    defaults), with a ledger table in its schema."""
    from worker import knowing

    return knowing(app, pg_dsn)
