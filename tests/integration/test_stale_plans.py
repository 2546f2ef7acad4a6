"""A migration that changes what a prepared statement returns (0015 made `task` and six
other columns domains) leaves every session that prepared it refusing it at every later
execution: "cached plan must not change result type" (SQLSTATE 0A000), and psycopg keeps
re-using the statement. The break-it trial of 0015: a worker started before the migration
failed every claim until it was restarted, and a console started before it answered 503
on /jobs. pgworker replaces such a connection (pgworker.db.failure_kind 'stale-plan'):
the claimers' and services' (drop_connection), and the App's pooled ones (sync and
async), whose call fails once with DatabaseBusy naming the retry.
"""

from __future__ import annotations

import asyncio

import psycopg
import pytest
from psycopg import sql

from pgworker import DatabaseBusy, db
from pgworker.worker.claimer.connection import ClaimerConnection
from pgworker.worker.service import drop_connection

pytestmark = pytest.mark.integration


def _change_task_type(pg_dsn: str, schema: str) -> None:
    """What a migration like 0015 does to a column a statement returns: a new type."""
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(sql.SQL("ALTER TABLE {} ALTER COLUMN task TYPE varchar(200)").format(
            sql.Identifier(schema, "jobs")))


def test_a_session_whose_prepared_statement_went_stale_is_dropped(app, pg_dsn):
    app.task(name="t")(lambda payload: None)
    job = app.enqueue("t", 1)
    query = sql.SQL("SELECT id, task FROM {} WHERE id = %s").format(sql.Identifier(app.settings.schema, "jobs"))
    db_ = ClaimerConnection(app.settings, 0, should_stop=lambda: True)  # stopping: no backoff sleep
    try:
        assert db_.ensure(block=False)
        conn = db_.conn
        for _ in range(3):
            conn.execute(query, [job], prepare=True)
        _change_task_type(pg_dsn, app.settings.schema)
        with pytest.raises(psycopg.errors.FeatureNotSupported) as stale:
            conn.execute(query, [job], prepare=True)
        with pytest.raises(psycopg.errors.FeatureNotSupported):  # and at every call after, on this session
            conn.execute(query, [job], prepare=True)
        assert db.failure_kind(stale.value) == "stale-plan"
        assert "retry" in db.describe_failure(stale.value)
        assert drop_connection(stale.value, conn)
        db_.failed(stale.value, "claim")
        assert db_.conn is None and conn.closed
        assert db_.ensure(block=False)  # a new session prepares the statement anew
        assert db_.conn.execute(query, [job], prepare=True).fetchone() == (job, "t")
    finally:
        db_.close()


def test_the_apps_pooled_connection_is_replaced_after_one_failed_call(app, pg_dsn):
    app.task(name="t")(lambda payload: None)
    job = app.enqueue("t", 1)
    for _ in range(8):  # past psycopg's prepare_threshold: get_job's statements are prepared
        assert app.get_job(job)["task"] == "t"
    _change_task_type(pg_dsn, app.settings.schema)
    with pytest.raises(DatabaseBusy, match="retry the call") as busy:
        app.get_job(job)
    assert busy.value.sqlstate == "0A000"
    # the pool replaced the session: every later call works (before, each one failed)
    for _ in range(3):
        assert app.get_job(job)["task"] == "t"


def test_the_async_pools_connection_is_replaced_too(app, pg_dsn):
    app.task(name="t")(lambda payload: None)
    job = app.enqueue("t", 1)

    async def scenario() -> None:
        await app.aopen()
        try:
            for _ in range(8):
                assert (await app.aget_job(job))["task"] == "t"
            _change_task_type(pg_dsn, app.settings.schema)
            with pytest.raises(DatabaseBusy, match="retry the call"):
                await app.aget_job(job)
            for _ in range(3):
                assert (await app.aget_job(job))["task"] == "t"
        finally:
            await app.aclose()

    asyncio.run(scenario())
