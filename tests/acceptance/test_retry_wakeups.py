"""A retry or a snooze falls due with no notification (NOTIFY fires on enqueue): the
claimer that wrote it wakes for it itself (pgworker/worker/claimer/due_later.py),
instead of waiting for the supervisor's fallback poll; and a drain run stays up for the
retries it wrote that fall due within one poll interval, never for snoozes or later
retries. Checked against real `pgworker run` processes; no timing is asserted beyond
"before the fallback poll would have come" (a poll interval of minutes)."""

from __future__ import annotations

import json
import os
import signal

import pytest

from pg import wait_until
from worker import HERE, Worker, knowing, q

pytestmark = pytest.mark.acceptance

RETRY_APP = os.path.join(HERE, "apps", "retry_app.py") + ":app"


@pytest.fixture
def rapp(app, pg_dsn):
    return knowing(app, pg_dsn, RETRY_APP)


def _state(conn, schema, job_id):
    return q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id)[0]


def test_a_retry_runs_when_due_not_at_the_next_fallback_poll(rapp, pg_dsn, conn):
    schema = rapp.settings.schema
    # a fallback poll every 10 minutes: before the fix the retry waited for it
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "600s", app=RETRY_APP) as w:
        wait_until(lambda: w.claimer_pids(), 60, message="the claimer started")
        job = rapp.enqueue("flaky")  # its NOTIFY wakes the claimer for attempt 1
        wait_until(lambda: _state(conn, schema, job) == ("succeeded", 2), 60,
                   message=lambda: f"the retry ran; job: {_state(conn, schema, job)}; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0


def test_a_drain_run_waits_for_its_own_retry_due_within_the_poll_interval_only(rapp, pg_dsn, conn):
    schema = rapp.settings.schema
    soon, later, snoozing = rapp.enqueue("flaky"), rapp.enqueue("retry_later"), rapp.enqueue("snooze_forever")
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2", "--poll-interval", "5s", app=RETRY_APP) as w:
        assert w.wait(120) == 0, w.logs()[-3000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert _state(conn, schema, soon) == ("succeeded", 2)  # retried 0.3 s later, in the same run
    assert _state(conn, schema, later) == ("pending", 1)  # a minute away: the next run's
    assert _state(conn, schema, snoozing)[0] == "pending"  # snoozes never hold a drain run open
    assert summary["succeeded"] == 1 and summary["retried"] == 2 and summary["left"] == 0, summary
    assert summary["snoozed"] == 1, summary  # once: the run did not stay up for the snooze
    assert summary["next_due_seconds"] is not None and summary["next_due_seconds"] <= 60, summary


def test_a_drain_run_waits_for_a_retry_the_supervisor_wrote_for_a_stopped_claimer(rapp, pg_dsn, conn):
    """A sync handler past its timeout: the supervisor stops its claimer and writes the
    TIMEOUT retry (due 0.3 s later), which no claimer wrote, so none held the run for it:
    the drain exited 0 with 'nothing due is left' and the retry due in 0.7 s (a new user's
    trial). A claimer killed mid-job (WORKER_DIED) is settled the same way."""
    schema = rapp.settings.schema
    job = rapp.enqueue("hangs_first")
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--poll-interval", "5s", app=RETRY_APP) as w:
        assert w.wait(120) == 0, w.logs()[-3000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert _state(conn, schema, job) == ("succeeded", 2), w.logs()[-3000:]
    assert summary["succeeded"] == 1 and summary["retried"] == 1 and summary["left"] == 0, summary


def test_a_drain_run_waits_for_the_retry_of_a_job_whose_claimer_was_killed(rapp, pg_dsn, conn):
    schema = rapp.settings.schema
    job = rapp.enqueue("slow_first")
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--poll-interval", "5s", app=RETRY_APP) as w:
        wait_until(lambda: _state(conn, schema, job) == ("running", 1), 60, message="attempt 1 runs")
        [pid] = w.claimer_pids()
        os.kill(pid, signal.SIGKILL)
        assert w.wait(120) == 0, w.logs()[-3000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert _state(conn, schema, job) == ("succeeded", 2), w.logs()[-3000:]
    assert summary["succeeded"] == 1 and summary["retried"] == 1 and summary["left"] == 0, summary
