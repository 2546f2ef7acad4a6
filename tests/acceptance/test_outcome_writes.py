"""Outcome writes that must not stop a claimer: values PostgreSQL would refuse, a row the
database refuses for now or for good, and a claimer that dies with outcomes decided but
not yet written. Real `pgworker run` processes; the database refuses through a trigger
the test installs on the jobs table, as a constraint or a broken value would."""

from __future__ import annotations

import os
import time
import signal

import pytest
import requests
from psycopg import sql

from obs import free_port, total, try_scrape
from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance
FAST = ["--lease", "3", "--poll-interval", "0.3", "--reap-interval", "0.5"]


def state(conn, schema, job_id):
    return q(conn, schema, "SELECT state::text, attempts, last_error_code, run_at > now() + interval '1 day' "
                           "FROM {s}.jobs WHERE id = %s", job_id)[0]


def refuse_success(conn, schema, job_id, errcode):
    """Make the database refuse the success of one job (SQLSTATE ``errcode``), and nothing else."""
    s = sql.Identifier(schema)
    conn.execute(sql.SQL(
        "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'the test refuses this row' USING ERRCODE = {code}; END $$").format(
        s=s, code=sql.Literal(errcode)))
    conn.execute(sql.SQL("CREATE TRIGGER refuse BEFORE UPDATE ON {s}.jobs FOR EACH ROW "
                         "WHEN (OLD.id = {id} AND NEW.state = 'succeeded') EXECUTE FUNCTION {s}.refuse()").format(
        s=s, id=sql.Literal(job_id)))


def allow(conn, schema):
    conn.execute(sql.SQL("DROP TRIGGER refuse ON {s}.jobs").format(s=sql.Identifier(schema)))


def test_out_of_range_retry_and_snooze_values_are_bounded_and_the_claimer_goes_on(env, pg_dsn, conn):
    """Retry(after=inf / 1e20 / nan), Snooze(1e20) and a classifier's NUL-bearing code and
    infinite delay, in one batch with ordinary jobs: every outcome is written (bounded),
    the ordinary jobs succeed, and the claimer claims again afterwards."""
    schema = env.settings.schema
    bad = [env.enqueue("bad_retry", "inf"), env.enqueue("bad_retry", "1e20"), env.enqueue("bad_retry", "nan"),
           env.enqueue("bad_snooze", "1e20"), env.enqueue("nul_code"), env.enqueue("bad_snooze", "nan")]
    good = env.enqueue_many([("record", i) for i in range(5)])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "10", *FAST) as w:
        wait_until(lambda: all(state(conn, schema, j)[0] == "succeeded" for j in good), 30,
                   message=lambda: f"the ordinary jobs of the batch to succeed; log:\n{w.logs()[-3000:]}")
        wait_until(lambda: all(state(conn, schema, j)[0] == "pending" for j in bad), 30,
                   message=lambda: f"the bounded outcomes: {[state(conn, schema, j) for j in bad]}")
        later = env.enqueue("record", "after")
        wait_until(lambda: state(conn, schema, later)[0] == "succeeded", 30,
                   message="a job enqueued afterwards: the claimer still claims")
        assert w.stop() == 0
        logs = w.logs()
    inf_retry, big_retry, nan_retry, big_snooze, nul, nan_snooze = (state(conn, schema, j) for j in bad)
    # a NaN snooze waits the task's backoff (0.5-1 s here): it once ran again at once,
    # thousands of times in the seconds this test takes
    [(runs, span)] = q(conn, schema, "SELECT count(*), extract(epoch FROM max(at) - min(at))::float8 "
                                     "FROM {s}.ledger WHERE job_id = %s", bad[-1])
    assert nan_snooze[0] == "pending" and 1 <= runs <= 2 + 2 * span, (nan_snooze, runs, span)
    assert inf_retry[3] and big_retry[3] and big_snooze[3]  # clamped to 100 years, not refused
    assert not nan_retry[3]  # not a number: the task's backoff instead
    assert nul[2] == "tests.apps.acceptance_app.CodeWithNulError" or "CodeWithNulError" in nul[2]
    assert nul[3]  # its infinite delay bounded too
    assert "statement failed" not in logs and "is not a number of seconds" in logs


def test_a_refused_row_never_blocks_the_others_and_shows_in_readyz_and_a_metric(env, pg_dsn, conn):
    """The database refuses one job's success for now (SQLSTATE P0001): the rest of its
    batch is written, the claimer reports that it cannot write (/readyz, the metric), and
    once the database accepts the row again it is written and the claimer is ready."""
    schema = env.settings.schema
    stuck = env.enqueue("record", "stuck")
    refuse_success(conn, schema, stuck, "P0001")
    others = env.enqueue_many([("record", i) for i in range(5)])
    port = free_port()
    # a 10 s lease: the job must stay leased while its write is refused; with FAST's 3 s, a
    # machine loaded past a lease (two suites at once) let it expire and run again, as it should
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "10", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1", *FAST, "--lease", "10") as w:
        wait_until(lambda: all(state(conn, schema, j)[0] == "succeeded" for j in others), 30,
                   message=lambda: f"the batch's other jobs; log:\n{w.logs()[-3000:]}")
        ready = lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)  # noqa: E731
        not_ready = wait_until(lambda: (r := ready()).status_code == 503 and "cannot write job outcomes" in r.text
                               and r.text, 30, message="/readyz to name the claimer that cannot write")
        assert "claimer 0" in not_ready
        text = try_scrape(port)
        assert total(text, "pgworker_outcome_write_errors_total", cause="statement") >= 1
        assert state(conn, schema, stuck)[0] == "running"  # kept leased meanwhile, not run again
        allow(conn, schema)
        wait_until(lambda: state(conn, schema, stuck)[0] == "succeeded", 30, message="the refused row, once accepted")
        wait_until(lambda: ready().status_code == 200, 30, message="/readyz back to ready")
        assert w.stop() == 0
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", stuck)) == 1  # it ran once


def test_a_row_refused_for_its_values_is_recorded_as_a_failure_instead(env, pg_dsn, conn):
    """The database refuses one job's success for its values (SQLSTATE 22008): that job is
    recorded as a failure OUTCOME_INVALID (retried), and the claimer goes on."""
    schema = env.settings.schema
    bad = env.enqueue("record", "bad")
    refuse_success(conn, schema, bad, "22008")
    others = env.enqueue_many([("record", i) for i in range(3)])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "10", *FAST) as w:
        wait_until(lambda: all(state(conn, schema, j)[0] == "succeeded" for j in others), 30,
                   message=lambda: f"the batch's other jobs; log:\n{w.logs()[-3000:]}")
        wait_until(lambda: q(conn, schema, "SELECT errors @> %s::jsonb FROM {s}.jobs WHERE id = %s",
                             '[{"code": "OUTCOME_INVALID"}]', bad)[0][0], 30, message="the failure OUTCOME_INVALID")
        allow(conn, schema)
        wait_until(lambda: state(conn, schema, bad)[0] == "succeeded", 30, message="its retry")
        assert w.stop() == 0
        assert "could not be stored" in w.logs()


def test_a_claimer_that_dies_with_a_decided_success_gets_it_written_as_decided(env, pg_dsn, conn):
    """The handler succeeded, the write is refused for now, the claimer is killed: the
    supervisor writes the decided success (not WORKER_DIED) once the database accepts it."""
    schema = env.settings.schema
    job = env.enqueue("record", "decided")
    refuse_success(conn, schema, job, "P0001")
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST) as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", job), 30,
                   message="the handler ran")
        wait_until(lambda: "refuses this row" in w.logs(), 30, message="the write to be refused")
        [claimer] = w.claimer_pids()
        os.kill(claimer, signal.SIGKILL)
        wait_until(lambda: w.claimer_pids() and w.claimer_pids() != [claimer], 30, message="a new claimer")
        allow(conn, schema)
        wait_until(lambda: state(conn, schema, job)[0] != "running", 30,
                   message=lambda: f"the supervisor to settle the job; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    assert state(conn, schema, job)[:3] == ("succeeded", 1, None)
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", job)) == 1  # never run again


def refuse_outcomes_as_read_only(conn, schema):
    """The database refuses every outcome write (a running job leaving 'running') with
    SQLSTATE 25006, as a primary turned read-only by a failover does; claims and renewals
    still go through, so the claimer's slot table fills with decided outcomes. Only this
    test's schema is affected (the server is shared)."""
    s = sql.Identifier(schema)
    conn.execute(sql.SQL(
        "CREATE FUNCTION {s}.refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
        "RAISE EXCEPTION 'cannot execute UPDATE in a read-only transaction' USING ERRCODE = '25006'; END $$")
        .format(s=s))
    conn.execute(sql.SQL("CREATE TRIGGER refuse BEFORE UPDATE ON {s}.jobs FOR EACH ROW "
                         "WHEN (OLD.state = 'running' AND NEW.state <> 'running') EXECUTE FUNCTION {s}.refuse()")
                 .format(s=s))


def test_a_claimer_whose_outcomes_cannot_be_written_backs_off_logs_once_and_is_not_ready(env, pg_dsn, conn):
    """Issue 18, item 5. The claimer's slot table is full of decided outcomes and the
    server refuses every write (read-only): the claimer retries with backoff (it once made
    ~700 failed flushes a second), says so once per outage and once when it ends, and
    /readyz names it meanwhile. Then every outcome is written, each job having run once."""
    schema = env.settings.schema
    refuse_outcomes_as_read_only(conn, schema)
    jobs = env.enqueue_many([("record", i) for i in range(4)])
    port = free_port()
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "4", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1", *FAST, "--lease", "30", env={"PGWORKER_MAX_BATCH_SIZE": "4"}) as w:
        wait_until(lambda: len(q(conn, schema, "SELECT 1 FROM {s}.ledger")) == 4, 30,
                   message=lambda: f"the four jobs to run; log:\n{w.logs()[-3000:]}")
        ready = lambda: requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)  # noqa: E731
        not_ready = wait_until(lambda: (r := ready()).status_code == 503 and "cannot write job outcomes" in r.text
                               and r.text, 30, message=lambda: f"/readyz to name the claimer; log:\n{w.logs()[-3000:]}")
        assert "claimer 0" in not_ready and "read-only" in not_ready
        failed = total(try_scrape(port), "pgworker_outcome_write_errors_total")
        outage_lines = [line for line in w.logs().splitlines() if " WARNING " in line or " ERROR " in line]
        # ten seconds and more of refused writes: a backoff makes a handful of attempts
        # (0.5 s doubling, jittered), not one per loop iteration
        assert 1 <= failed <= 30, f"{failed} failed outcome writes; log:\n{w.logs()[-3000:]}"
        assert len(outage_lines) == 1 and "read-only" in outage_lines[0], outage_lines[:10]
        allow(conn, schema)
        wait_until(lambda: all(state(conn, schema, j)[0] == "succeeded" for j in jobs), 60,
                   message=lambda: f"the outcomes, once writable; log:\n{w.logs()[-3000:]}")
        wait_until(lambda: ready().status_code == 200, 30, message="/readyz back to ready")
        assert w.stop() == 0
        logs = w.logs()
    assert len([line for line in logs.splitlines() if "back after" in line]) == 1, logs[-3000:]
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger")) == 4  # each ran once


def test_a_split_write_that_outlasts_the_lease_keeps_the_batchs_leases(env, pg_dsn, conn):
    """Issue 18, item 16 (d). Three rows of a batch are locked by another session, so the
    batch's write waits lock_timeout, is split, and each locked row waits lock_timeout
    again: the whole write lasts longer than a lease. The batch's other jobs, waiting in
    the split for their turn, must keep their leases meanwhile (slots being written were
    not renewed: they expired, were reaped, and ran a second time)."""
    import psycopg

    schema = env.settings.schema
    gate = env.enqueue("sleep", {"seconds": 2})
    locked = [env.enqueue("record", f"locked {i}") for i in range(3)]
    free = [env.enqueue("record", f"free {i}") for i in range(2)]
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "6", *FAST,
                env={"PGWORKER_LOCK_TIMEOUT_SECONDS": "1.5",  # the six outcomes in one flush, at the batch's end
                     "PGWORKER_COMPLETION_FLUSH_SECONDS": "20"}) as w, psycopg.connect(pg_dsn) as operator:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", gate), 30,
                   message=lambda: f"the batch to start; log:\n{w.logs()[-3000:]}")
        assert all(state(conn, schema, j)[0] == "running" for j in locked + free)  # one batch of six
        q(operator, schema, "SELECT 1 FROM {s}.jobs WHERE id = ANY(%s) FOR UPDATE", locked)
        wait_until(lambda: all(state(conn, schema, j)[0] != "running" for j in free), 60,
                   message=lambda: f"the free rows' outcomes; log:\n{w.logs()[-3000:]}")
        operator.rollback()
        wait_until(lambda: all(state(conn, schema, j)[0] == "succeeded" for j in locked), 60,
                   message=lambda: f"the locked rows' outcomes once unlocked; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
        logs = w.logs()
    assert "writing the batch's 6 outcomes one at a time" in logs  # the split did happen
    for j in free:
        assert state(conn, schema, j)[:3] == ("succeeded", 1, None), (j, logs[-3000:])
        assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", j)) == 1, logs[-3000:]


def test_an_outcome_waiting_on_another_sessions_lock_keeps_its_lease(env, pg_dsn, conn):
    """A parent's success must lock its child (the dependency trigger), and another session
    holds the child's row locked for longer than a lease and than lock_timeout (2 s here).
    The success statement once waited lock_timeout holding the parent's row, which the
    renewer skips, was split and waited again: the 3 s lease expired meanwhile, and in the
    pause before the next try the reaper took the parent back and it ran a second time. Each outcome statement is now bounded below the renewal
    interval and tried again while the lease is renewed in between: the parent runs once,
    keeps its lease, and succeeds once the child is unlocked."""
    import psycopg

    from pgworker import JobSpec

    schema = env.settings.schema
    parent, child = env.enqueue_many([JobSpec("sturdy", {"seconds": 1.5}, ref="p"),
                                      JobSpec("sink", None, depends_on=["p"])])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "1", *FAST,
                env={"PGWORKER_LOCK_TIMEOUT_SECONDS": "2"}) as w, psycopg.connect(pg_dsn) as operator:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", parent), 30,
                   message=lambda: f"the parent to start; log:\n{w.logs()[-3000:]}")
        q(operator, schema, "SELECT 1 FROM {s}.jobs WHERE id = %s FOR UPDATE", child)
        # the lock outlasts four leases and three rounds of lock_timeout waits
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline:
            assert state(conn, schema, parent)[:2] == ("running", 1), (state(conn, schema, parent), w.logs()[-3000:])
            time.sleep(0.2)
        operator.rollback()
        wait_until(lambda: state(conn, schema, child)[0] == "succeeded", 30,
                   message=lambda: f"the child once unlocked; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
        logs = w.logs()
    assert state(conn, schema, parent)[:3] == ("succeeded", 1, None), logs[-3000:]
    starts = q(conn, schema, "SELECT count(*) FROM {s}.ledger WHERE job_id = %s AND event = 'start'", parent)
    assert starts == [(1,)], logs[-3000:]
    assert "fenced out" not in logs and "lease lost" not in logs, logs[-3000:]


def test_a_queue_whose_claims_keep_failing_is_named_though_another_queue_claims(env, pg_dsn, conn):
    """A break-it trial: a lock held on queue a's settings row made every claim of a fail
    (lock timeout) for half a minute, and /readyz stayed ready: each claim of queue b that
    went through cleared the claimer's run of failures. Failures are kept per queue now."""
    import psycopg

    schema = env.settings.schema
    env.configure_queue("a", concurrency_limit=5)  # its claims lock its settings row first
    port = free_port()

    class NotUp:
        status_code, text = 0, ""

    def ready():
        try:
            return requests.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
        except requests.ConnectionError:  # not serving yet
            return NotUp()

    with Worker(pg_dsn, schema, "--concurrency", "1", "--queues", "a,b", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1", *FAST, env={"PGWORKER_LOCK_TIMEOUT_SECONDS": "0.5"}) as w:
        wait_until(lambda: ready().status_code == 200, 30, message=lambda: w.logs()[-3000:])
        with psycopg.connect(pg_dsn) as holder:
            holder.execute(sql.SQL("SELECT 1 FROM {}.queues WHERE name = 'a' FOR UPDATE").format(
                sql.Identifier(schema)))
            a_job = env.enqueue("record", "a", queue="a")
            b_jobs = env.enqueue_many([{"task": "record", "payload": i, "queue": "b"} for i in range(3)])
            said = wait_until(lambda: "cannot claim jobs" in (r := ready()).text and r.text, 60,
                              message=lambda: w.logs()[-3000:])
            assert "queue 'a'" in said and "lock timeout" in said, said
            assert state(conn, schema, a_job)[0] == "pending"
        wait_until(lambda: state(conn, schema, a_job)[0] == "succeeded", 30, message=lambda: w.logs()[-3000:])
        wait_until(lambda: ready().status_code == 200, 30, message=lambda: ready().text)
        assert all(state(conn, schema, j)[0] == "succeeded" for j in b_jobs)
        assert w.stop() == 0
