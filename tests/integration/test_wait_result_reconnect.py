"""App.wait_result and App.await_result outlive their connection: a backend terminated
during the wait (what a PostgreSQL restart does to it) is replaced, LISTEN is sent again
and the job read again, and the wait returns the result instead of psycopg's
"consuming input failed: server closed the connection unexpectedly". A server that
stays away until the timeout is pgworker's DatabaseUnavailable, password-free."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from pg import wait_until
from pgcluster import free_port
from pgworker import App, DatabaseUnavailable

pytestmark = pytest.mark.integration

WAITERS = ("SELECT pid FROM pg_stat_activity WHERE application_name = 'pgworker-wait-result' "
           "AND (position(%s in query) > 0 OR position(%s in query) > 0)")


def _waiters(conn, schema):
    # this test's waiter only: other tests may wait too (its statements name the schema)
    return {r[0] for r in conn.execute(WAITERS, (f'"{schema}".', f'.{schema}"')).fetchall()}


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_wait_whose_backend_is_terminated_reconnects_and_returns_the_result(app, conn, mode):
    schema = app.settings.schema
    job_id = app.enqueue("t")
    [job] = app.claim()
    outcome: dict = {}

    def wait():
        try:
            if mode == "sync":
                outcome["value"] = app.wait_result(job_id, timeout=30, poll_seconds=0.2)
            else:
                outcome["value"] = asyncio.run(app.await_result(job_id, timeout=30, poll_seconds=0.2))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            outcome["error"] = exc

    waiter = threading.Thread(target=wait)
    waiter.start()
    first = wait_until(lambda: _waiters(conn, schema), 10, message="the waiting connection")
    conn.execute("SELECT pg_terminate_backend(pid) FROM unnest(%s::int[]) AS pid", (list(first),))
    second = wait_until(lambda: _waiters(conn, schema) - first, 10,
                        message=lambda: f"a new waiting connection; {outcome}")
    assert second and "error" not in outcome, outcome
    time.sleep(0.3)  # the new connection LISTENs: the completion below wakes it
    app.complete(job, result={"done": mode})
    waiter.join(20)
    assert not waiter.is_alive()
    assert outcome == {"value": {"done": mode}}, outcome


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_a_server_that_stays_away_until_the_timeout_is_database_unavailable(app, mode):
    away = f"postgresql://app:hunter2@127.0.0.1:{free_port()}/postgres"
    other = App(settings=app.settings.replace(listen_dsn=away))
    job_id = app.enqueue("t")
    t0 = time.monotonic()
    with pytest.raises(DatabaseUnavailable) as info:
        if mode == "sync":
            other.wait_result(job_id, timeout=1.0, poll_seconds=0.2)
        else:
            asyncio.run(other.await_result(job_id, timeout=1.0, poll_seconds=0.2))
    assert 1.0 <= time.monotonic() - t0 < 10
    text = str(info.value)
    assert f"waiting for job {job_id}'s result" in text and "could not be reached before the timeout" in text, text
    assert "127.0.0.1" in text and "hunter2" not in text and "PGWORKER_LISTEN_DSN" in text, text
    other.close()
