"""The lease contract with real `pgworker run` processes: a stalled connection cannot hide a
lost lease from its handler, a job waiting behind a slow one keeps its lease, a late
success is kept, a cancellation outlasts the attempt, one async job cannot reach
another's outcome, and a pod that cannot start says why."""

from __future__ import annotations

import json
import signal
import time

import psycopg
import pytest
import requests

from obs import free_port, total, try_scrape
from pg import wait_until
from proxy import TcpProxy
from worker import Worker, q

pytestmark = pytest.mark.acceptance
LEASE = 2.0
FAST = ["--lease", str(LEASE), "--reap-interval", "0.5", "--poll-interval", "0.3"]


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def job_row(conn, schema, job_id):
    return q(conn, schema, "SELECT state::text, attempts, last_error_code FROM {s}.jobs WHERE id = %s", job_id)[0]


def test_a_stalled_connection_cannot_hide_a_lost_lease_from_the_handler(env, pg_dsn, conn):
    """Pod W1 reaches PostgreSQL through a path that stops forwarding while its handler
    runs; pod W2, connected directly, reaps the job once its lease expires and runs it
    again. W1's handler is told within a lease of its last renewal (the lease clock never
    waits on the database), and W1 logs and counts the loss."""
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": 6, "cooperative": True})
    port = free_port()
    with TcpProxy("127.0.0.1", int(pg_dsn.rsplit(":", 1)[1].split("/")[0])) as proxy:
        with Worker(proxy.dsn_for(pg_dsn), schema, "--concurrency", "1", *FAST, "--metrics-port", str(port),
                    "--metrics-host", "127.0.0.1", "--no-stats", env={"LEDGER_DSN": pg_dsn}, name="w1") as w1:
            wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30,
                       message="W1 started the job")
            proxy.pause()
            paused_at = db_now(conn)
            with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, name="w2") as w2:
                noticed = wait_until(lambda: q(conn, schema, "SELECT at FROM {s}.ledger WHERE event = 'noticed_lost' "
                                                             "AND lease_token = 1"), 30,
                                     message=lambda: f"W1's handler to be told; W1 log:\n{w1.logs()[-3000:]}")
                window = (noticed[0][0] - paused_at).total_seconds()
                print(f"told {window:.2f} s after the path stalled (lease {LEASE} s)")
                assert window <= LEASE + 1.0  # its last renewal was sent before the stall
                text = wait_until(lambda: (t := try_scrape(port)) and total(
                    t, "pgworker_lease_renewals_total", result="lost") >= 1 and t, 30,
                    message="W1 to count the lost lease")
                assert "presumed" in w1.logs() and f"lease lost on job {job_id}" in w1.logs()
                wait_until(lambda: job_row(conn, schema, job_id)[0] == "succeeded", 60, message="W2 ran it again")
                w2.stop()
            proxy.resume()
            assert total(text, "pgworker_lease_renewals_total", result="lost") >= 1
            # W1's late outcome reaches the database and is refused: the window it opened is measured
            text = wait_until(lambda: (t := try_scrape(port)) and total(
                t, "pgworker_lease_overrun_seconds_count", queue="default") >= 1 and t, 30,
                message=lambda: f"W1's refused write to be measured; log:\n{w1.logs()[-2000:]}")
            overrun = total(text, "pgworker_lease_overrun_seconds_sum", queue="default")
            print(f"W1's attempt ran {overrun:.2f} s past its lease's expiry")
            assert overrun > 0 and "past its lease's expiry" in w1.logs()
            w1.stop()


def test_a_job_waiting_behind_a_slow_one_keeps_its_lease_and_clocks(env, pg_dsn, conn):
    """One claimer, a batch of two: a slow job, then one whose timeout (1 s) and
    progress-tied renewal are shorter than its wait. Its clocks start when its handler
    starts: it is never reaped while it waits, and it runs once, on its first attempt."""
    schema = env.settings.schema
    slow = env.enqueue("sleep", {"seconds": 4})
    waiting = env.enqueue("short_timeout")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "2", *FAST) as w:
        wait_until(lambda: job_row(conn, schema, waiting)[0] != "running" and
                   job_row(conn, schema, slow)[0] == "succeeded", 60,
                   message=lambda: f"both jobs to end; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    assert job_row(conn, schema, waiting) == ("succeeded", 1, None)


def test_a_late_success_is_kept_when_nobody_took_the_job(env, pg_dsn, conn):
    """The supervisor is stopped (no renewals, no reaper) while the handler runs past its
    lease: the success arrives late, the row is still running under its token, and it is
    recorded: the job does not run again."""
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": LEASE * 2})
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST) as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        w.signal(signal.SIGSTOP)  # the supervisor only: the claimer runs on
        try:
            wait_until(lambda: job_row(conn, schema, job_id)[0] != "running", 30,
                       message=lambda: f"the late outcome; log:\n{w.logs()[-3000:]}")
        finally:
            w.signal(signal.SIGCONT)
        time.sleep(1.0)  # let the resumed reaper look at it (nothing to reap)
        assert w.stop() == 0
    assert job_row(conn, schema, job_id) == ("succeeded", 1, None)
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'")) == 1


@pytest.mark.parametrize("ending", ["fail", "snooze"])
def test_a_cancel_that_reached_the_handler_is_kept_whatever_the_handler_does(env, pg_dsn, conn, ending):
    schema = env.settings.schema
    job_id = env.enqueue("after_cancel", ending)
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST) as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        assert env.cancel(job_id) == "running"
        wait_until(lambda: job_row(conn, schema, job_id)[0] == "cancelled", 30,
                   message=lambda: f"the job to end cancelled: {job_row(conn, schema, job_id)}")
        assert w.stop() == 0
    assert job_row(conn, schema, job_id)[2] == "CANCELLED"
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'")) == 1  # never ran again


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt"])
def test_an_async_handler_raising_systemexit_cannot_reach_the_next_job(env, pg_dsn, conn, kind):
    schema = env.settings.schema
    exiting = env.enqueue("async_exit", kind)
    healthy = env.enqueue("async_echo")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "1", *FAST) as w:
        wait_until(lambda: job_row(conn, schema, healthy)[0] != "running"
                   and job_row(conn, schema, healthy)[0] != "pending", 30,
                   message=lambda: f"the healthy job to end; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    assert job_row(conn, schema, exiting)[::2] == ("dead", kind)
    assert job_row(conn, schema, healthy) == ("succeeded", 1, None)


def test_unregistered_task_names_share_one_metric_label(env, pg_dsn, conn):
    schema = env.settings.schema
    for name in ("nope-1", "nope-2", "nope-3"):
        q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, max_attempts) VALUES ('default', %s, 'null', 1) "
                        "RETURNING id", name)
    port = free_port()
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1") as w:
        text = wait_until(lambda: (t := try_scrape(port)) and total(
            t, "pgworker_jobs_finished_total", task="unregistered", outcome="dead") == 3 and t, 30,
            message="three dead jobs counted as unregistered")
        assert w.stop() == 0
    assert "nope-" not in text


def test_a_second_worker_on_the_same_port_says_which_port_and_the_flag(env, pg_dsn):
    port = free_port()
    schema = env.settings.schema
    with Worker(pg_dsn, schema, "--concurrency", "1", "--metrics-port", str(port), name="first") as first:
        wait_until(lambda: try_scrape(port), 30)
        with Worker(pg_dsn, schema, "--concurrency", "1", "--metrics-port", str(port), name="second") as second:
            code = second.wait(60)
            logs = second.logs()
        assert first.stop() == 0
    assert code != 0
    assert f"port {port}" in logs and "--metrics-port" in logs and "Traceback" not in logs


def test_a_database_that_does_not_exist_is_named_in_readyz_and_a_drain_gives_up_at_its_deadline(env, pg_dsn):
    """A long-running worker waits for a database that does not exist yet (/readyz names
    it); a drain run on an unreachable server gives up at its deadline."""
    schema = env.settings.schema
    missing = pg_dsn.rsplit("/", 1)[0] + "/pgworker_no_such_database"
    port = free_port()
    with Worker(missing, schema, "--concurrency", "1", "--metrics-port", str(port), "--metrics-host", "127.0.0.1") as w:
        body = wait_until(lambda: (r := _readyz(port)) is not None and r.status_code == 503
                          and "does not exist" in r.text and r.text, 30,
                          message=lambda: f"/readyz to name the database; log:\n{w.logs()[-2000:]}")
        assert "database unavailable" in body
        assert w.stop() == 0
    nobody = f"postgresql://postgres@127.0.0.1:{free_port()}/test"  # nothing listens there
    with Worker(nobody, schema, "--drain", "--max-duration", "2s", "--concurrency", "1") as d:
        assert d.wait(30) == 1
        assert "unreachable" in d.logs() and "gave up" in d.logs()


def test_a_drain_run_on_a_database_that_does_not_exist_fails_at_once_naming_the_fix(env, pg_dsn):
    """A refusal no retry can change (no such database) ends a drain run at once, exit 1 and
    a failed summary, naming createdb and the DSN: it waited out its deadline before (60 s
    without --max-duration), a CronJob's whole run."""
    missing = pg_dsn.rsplit("/", 1)[0] + "/pgworker_no_such_database"
    started = time.monotonic()
    with Worker(missing, env.settings.schema, "--drain", "--concurrency", "1") as d:
        assert d.wait(40) == 1
        logs, summary = d.logs(), json.loads(d.stdout())
    assert time.monotonic() - started < 30, "it gave up at once, not at the 60 s deadline"
    assert 'database "pgworker_no_such_database" does not exist' in logs and "createdb" in logs
    assert "PGWORKER_DSN" in logs and "does not retry" in logs and summary["result"] == "failed"
    assert "Traceback" not in logs


def _readyz(port: int):
    try:
        return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    except requests.RequestException:
        return None


def test_one_locked_row_does_not_cost_the_pod_its_other_leases(env, pg_dsn, conn):
    """Issue 18, item 1. Two jobs run in one pod; another session (an operator's open
    transaction) holds one's row locked for several leases. The renewer must not wait on
    that row: the other job keeps its lease and runs once. The locked one is handled by
    the lease contract (presumed lost, its handler told), and the log names the lock."""
    schema = env.settings.schema
    a = env.enqueue("sleep", {"seconds": 14, "cooperative": True})
    b = env.enqueue("sleep", {"seconds": 14})
    with Worker(pg_dsn, schema, "--concurrency", "3", "--batch-size", "1", *FAST) as w:
        wait_until(lambda: len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'")) == 2, 30,
                   message=lambda: f"both jobs to start; log:\n{w.logs()[-3000:]}")
        # Lock the row of the claimer renewed first (the lower claimer index): the old
        # single UPDATE then waited on it before it reached the other row.
        owners = dict(q(conn, schema, "SELECT id, lease_owner FROM {s}.jobs WHERE id IN (%s, %s)", a, b))
        locked, other = sorted((a, b), key=lambda j: owners[j].rsplit(":c", 1)[1])
        with psycopg.connect(pg_dsn) as operator:
            q(operator, schema, "SELECT 1 FROM {s}.jobs WHERE id = %s FOR UPDATE", locked)
            wait_until(lambda: f"lease lost on job {locked}" in w.logs(), 30,
                       message=lambda: f"the locked job's lease to be presumed lost; log:\n{w.logs()[-3000:]}")
            # held locked for another whole lease while the other lease goes on being renewed
            until = db_now(conn).timestamp() + LEASE
            wait_until(lambda: q(conn, schema, "SELECT extract(epoch FROM heartbeat_at) FROM {s}.jobs WHERE id = %s",
                                 other)[0][0] > until, 30,
                       message=lambda: f"the other job's lease to be renewed meanwhile; log:\n{w.logs()[-3000:]}")
            operator.rollback()
        wait_until(lambda: job_row(conn, schema, other)[0] == "succeeded", 60,
                   message=lambda: f"the other job to succeed; log:\n{w.logs()[-3000:]}")
        wait_until(lambda: job_row(conn, schema, locked)[0] == "succeeded", 60,
                   message=lambda: f"the locked job to end; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    logs = w.logs()
    starts = dict(q(conn, schema, "SELECT job_id, count(*) FROM {s}.ledger WHERE event = 'start' GROUP BY job_id"))
    assert starts[other] == 1, f"the untouched job ran {starts[other]} times; log:\n{logs[-4000:]}"
    assert job_row(conn, schema, other) == ("succeeded", 1, None)
    assert f"lease lost on job {other}" not in logs
    assert f"lease of job {locked} " in logs and "locked by another session" in logs
    assert "stalled network path" not in logs
