"""How a database failure is classed and logged (pgworker.db.failure_kind): a statement
the live server refused (a lock timeout, a statement timeout) is a statement failure, not
"PostgreSQL is unreachable" (followed by "database back after 0.3 s"); a terminated
backend is unreachable. Real errors from a real server."""

from __future__ import annotations

import logging
import os

import psycopg
import pytest
from psycopg import sql

from pgworker import db

pytestmark = pytest.mark.integration


def _error(call):
    with pytest.raises(psycopg.Error) as info:
        call()
    return info.value


def test_a_lock_timeout_is_a_statement_failure_and_a_terminated_backend_is_unreachable(pg_dsn, conn, caplog):
    table = sql.Identifier(f"fk_probe_{os.getpid()}")  # one of this test's own: another session locks it
    conn.execute(sql.SQL("CREATE UNLOGGED TABLE IF NOT EXISTS {} (id int)").format(table))
    try:
        with psycopg.connect(pg_dsn) as holder, psycopg.connect(pg_dsn, autocommit=True) as waiter:
            holder.execute(sql.SQL("LOCK TABLE {} IN ACCESS EXCLUSIVE MODE").format(table))  # held: its transaction is open
            waiter.execute("SET lock_timeout = '50ms'")
            lock = _error(lambda: waiter.execute(sql.SQL("SELECT * FROM {}").format(table)))
            assert lock.sqlstate == "55P03" and isinstance(lock, psycopg.OperationalError)
            assert db.failure_kind(lock) == "statement" and not db.connection_lost(lock, waiter)
            assert db.describe_failure(lock).startswith("statement failed (lock timeout: canceling statement")
            waiter.execute("SET lock_timeout = 0; SET statement_timeout = '50ms'")
            slow = _error(lambda: waiter.execute("SELECT pg_sleep(5)"))
            assert slow.sqlstate == "57014" and db.failure_kind(slow) == "statement"
            assert "statement timeout or cancel" in db.describe_failure(slow)

            log = logging.getLogger("test.failure_kinds")
            outage = db.OutageLog(log, "claimer 0", pg_dsn)
            with caplog.at_level(logging.WARNING, logger="test.failure_kinds"):
                outage.failed(lock, "claim")
                outage.ok()
            text = caplog.text
            assert "claimer 0 (claim): statement failed (lock timeout: " in text, text
            assert "statements succeed again after" in text, text
            assert "unreachable" not in text and "database back" not in text, text

        victim = psycopg.connect(pg_dsn, autocommit=True)
        try:
            conn.execute("SELECT pg_terminate_backend(%s)", [victim.info.backend_pid])
            gone = _error(lambda: victim.execute("SELECT 1"))
            assert db.failure_kind(gone) == "unreachable" and db.connection_lost(gone, victim)
            assert db.describe_failure(gone).startswith("PostgreSQL is unreachable (")
        finally:
            victim.close()
    finally:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}").format(table))


@pytest.mark.parametrize("state, kind", [
    ("08006", "unreachable"), ("08001", "unreachable"), ("57P01", "unreachable"), ("57P02", "unreachable"),
    ("57P03", "unreachable"), ("55P03", "statement"), ("57014", "statement"), ("40P01", "statement"),
    ("40001", "statement"), ("25006", "read-only"), ("26000", "prepared-statements"),
])
def test_every_sqlstate_named_is_classed(state, kind):
    exc = psycopg.errors.lookup(state)("x")
    assert db.failure_kind(exc) == kind


def test_an_app_call_that_times_out_on_a_lock_is_busy_not_unavailable(app, pg_dsn):
    """App calls turn database failures into pgworker's errors (database_errors): a lock
    timeout (55P03) became DatabaseUnavailable, "database error: ...", as if the server
    were unreachable. It is DatabaseBusy, whose message says who holds the lock and what to
    raise; a server that cannot be reached is still DatabaseUnavailable."""
    from pgworker import DatabaseUnavailable, PgworkerError

    job = app.enqueue("t", {})
    schema = sql.Identifier(app.settings.schema)
    with psycopg.connect(pg_dsn) as holder:
        holder.execute(sql.SQL("SELECT 1 FROM {}.jobs WHERE id = %s FOR UPDATE").format(schema), [job])
        with pytest.raises(PgworkerError) as info:
            with app.connection() as c:
                c.execute("SET lock_timeout = '50ms'")
                try:
                    app.cancel(job, conn=c)
                finally:
                    c.execute("RESET lock_timeout")
    assert not isinstance(info.value, DatabaseUnavailable), info.value
    assert type(info.value).__name__ == "DatabaseBusy" and info.value.sqlstate == "55P03"
    text = str(info.value)
    assert "lock timeout" in text and "another session holds a lock" in text and "lock_timeout" in text, text
    assert "idle in transaction" in text and "nothing was written" in text, text
