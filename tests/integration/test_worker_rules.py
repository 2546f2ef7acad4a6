"""Issue 19: the rules the worker runtime now writes once.

- "did my write already commit?" (pgworker.worker.outcome.already_written), for the
  completer and the settler: the same fencing token *and* the state and code this write
  puts the row in. The settler once took any state but 'running' (not reaped) as its own
  write, so a job that had succeeded counted as the settler's failure.
- when a failure ends a connection (pgworker.worker.service.drop_connection), for the
  services and the claimers: the claim path once dropped its connection on any error.
"""

from __future__ import annotations

import psycopg
import pytest

from pgworker.worker.claimer.connection import ClaimerConnection
from pgworker.worker.outcome import FAIL, RELEASE, Write
from pgworker.worker.service import drop_connection
from pgworker.worker.settler import WORKER_DIED, Settlement, settle

pytestmark = pytest.mark.integration


class Recorder:
    """A metrics sink that keeps what the settler counted."""

    def __init__(self) -> None:
        self.outcomes: list[str] = []
        self.fenced_count = 0

    def finished(self, queue, task, outcome, run_seconds, code):  # noqa: ARG002 - the metrics' signature
        self.outcomes.append(outcome)

    def fenced(self, queue, operation):  # noqa: ARG002
        self.fenced_count += 1


def _settle(app, conn, write):
    metrics, counted = Recorder(), []
    settle(app.store, conn, [Settlement(write, "default", "t", lambda: None)], metrics,
           lambda outcome, n: counted.append(outcome))
    return counted, metrics


def test_the_settler_counts_a_refused_write_as_its_own_only_when_the_row_shows_it(app, conn):
    app.task(name="t")(lambda payload: None)
    app.enqueue("t", 1)
    [done] = app.claim()
    app.complete(done)  # succeeded under this token: not the failure the settler writes
    counted, metrics = _settle(app, conn, Write(done.lease, FAIL, None, WORKER_DIED, "died", 0.0))
    assert counted == ["lost"] and metrics.fenced_count == 1  # the old rule said "retried"
    assert app.get_job(done.id)["state"] == "succeeded"

    app.enqueue("t", 2)
    [died] = app.claim()
    fail = Write(died.lease, FAIL, None, WORKER_DIED, "died", 0.0)
    assert _settle(app, conn, fail)[0] == ["retried"]
    # the same settlement again (its reply was lost): the row shows it, so it counts once more as itself
    assert _settle(app, conn, fail)[0] == ["retried"]

    app.enqueue("t", 3)
    [waiting] = app.claim()
    release = Write(waiting.lease, RELEASE)
    assert _settle(app, conn, release)[0] == ["released"]
    assert _settle(app, conn, release)[0] == ["released"]


def test_a_statement_refused_on_a_live_connection_keeps_the_claimers_connection(app):
    db = ClaimerConnection(app.settings, 0, should_stop=lambda: True)  # stopping: no backoff sleep
    try:
        assert db.ensure(block=False)
        kept = db.conn
        with pytest.raises(psycopg.errors.QueryCanceled) as timeout:
            kept.execute("SET statement_timeout = '10ms'")
            kept.execute("SELECT pg_sleep(1)")
        db.failed(timeout.value, "claim")
        assert db.conn is kept and not kept.closed  # the old claim path dropped it on any error
        assert kept.execute("SELECT 1").fetchone() == (1,)
    finally:
        db.close()


def test_a_read_only_session_and_a_gone_connection_are_dropped(app, pg_dsn):
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SET default_transaction_read_only = on")
        with pytest.raises(psycopg.errors.ReadOnlySqlTransaction) as read_only:
            conn.execute(f"CREATE TABLE {app.settings.schema}.never (x int)")
        assert drop_connection(read_only.value, conn)  # only a new session may reach a primary
        with pytest.raises(psycopg.errors.UndefinedTable) as statement:
            conn.execute("SELECT * FROM no_such_table_here")
        assert not drop_connection(statement.value, conn)
    assert drop_connection(psycopg.OperationalError("server closed the connection"), conn)  # closed now
