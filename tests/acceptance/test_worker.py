"""The definition of reliable (the seeds' crash list), with real `pgworker run` processes."""

from __future__ import annotations

import json
import re
import os
import signal
import time

import pytest
from psycopg import sql

from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance


def states(conn, schema):
    return dict(q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))


def ddl(conn, schema, statement):
    conn.execute(sql.SQL(statement).format(s=sql.Identifier(schema)))


def all_finished(conn, schema, n):
    s = states(conn, schema)
    return s.get("succeeded", 0) + s.get("dead", 0) + s.get("cancelled", 0) == n and s


def test_pool_drains_and_every_lease_is_unique(env, pg_dsn, conn):
    schema = env.settings.schema
    n = 600
    env.enqueue_many([("record", i) for i in range(n)])
    with Worker(pg_dsn, schema, "--concurrency", "4") as w:
        wait_until(lambda: all_finished(conn, schema, n), 60, message="all jobs finished")
        assert w.stop() == 0
    assert states(conn, schema) == {"succeeded": n}
    runs = q(conn, schema, "SELECT job_id, lease_token, pid FROM {s}.ledger")
    assert len(runs) == n and len({(j, t) for j, t, _ in runs}) == n
    assert len({pid for _, _, pid in runs}) > 1  # several claimers took part


def test_kill_9_of_a_claimer_mid_job_recovers_the_job_once(env, pg_dsn, conn):
    schema = env.settings.schema
    slow = env.enqueue("sleep", {"seconds": 30})
    waiting = env.enqueue_many([("record", i) for i in range(3)])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "4") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", slow), 30,
                   message="the slow job started")
        [claimer] = w.claimer_pids()
        os.kill(claimer, signal.SIGKILL)  # the other three sit claimed in its batch
        wait_until(lambda: all(r[0] == "succeeded" for r in
                               q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = ANY(%s)", waiting)),
                   30, message=lambda: f"the batch's other jobs to run: {q(conn, schema, 'SELECT id, state::text, attempts, run_at, lease_owner FROM {s}.jobs')} {w.logs()}")
        row = q(conn, schema, "SELECT state::text, attempts, last_error_code FROM {s}.jobs WHERE id = %s", slow)[0]
        # the dispatcher knew the token: the running job failed with WORKER_DIED at once (attempt spent)
        assert row[2] == "WORKER_DIED" and row[0] in ("pending", "running")
        assert w.claimer_pids() and w.claimer_pids() != [claimer]
        w.kill()
    # the waiting jobs were released without spending an attempt
    assert {r[0] for r in q(conn, schema, "SELECT attempts FROM {s}.jobs WHERE id = ANY(%s)", waiting)} == {1}
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = ANY(%s)", waiting)) == 3


def test_crash_after_the_side_effect_reruns_with_the_same_idempotency_key(env, pg_dsn, conn):
    schema = env.settings.schema
    job_id = env.enqueue("crash_after_effect")
    with Worker(pg_dsn, schema, "--concurrency", "1"):
        wait_until(lambda: all_finished(conn, schema, 1), 30, message="job finished")
    keys = q(conn, schema, "SELECT DISTINCT idempotency_key FROM {s}.ledger WHERE job_id = %s", job_id)
    assert len(keys) == 1  # every attempt saw the same key
    assert q(conn, schema, "SELECT times FROM {s}.effects") == [(2,)]  # the effect ran twice...
    assert q(conn, schema, "SELECT count(*) FROM {s}.effects") == [(1,)]  # ...and was recorded once
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id) == [("succeeded", 2)]


def test_sigstop_past_the_lease_then_sigcont_is_fenced_out(env, pg_dsn, conn):
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": 4})
    fast = ["--lease", "2", "--reap-interval", "0.5", "--poll-interval", "0.3"]
    with Worker(pg_dsn, schema, "--concurrency", "1", *fast, name="a") as a:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30,
                   message="worker A started the job")
        a.signal_group(signal.SIGSTOP)  # the whole pod pauses: no renewals, no completion
        with Worker(pg_dsn, schema, "--concurrency", "1", *fast, name="b") as b:
            wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.jobs WHERE state = 'succeeded'"), 30,
                       message="worker B reclaimed and finished the job")
            b.stop()
        a.signal_group(signal.SIGCONT)
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'end' GROUP BY job_id "
                                          "HAVING count(*) = 2"), 30, message="worker A finished its stale run")
        time.sleep(0.5)  # let A attempt its (refused) completion
        assert a.stop() == 0
        assert "fenced out" in a.logs() or "lease lost" in a.logs()
    rows = q(conn, schema, "SELECT state::text, lease_token, attempts FROM {s}.jobs WHERE id = %s", job_id)
    assert rows == [("succeeded", 2, 2)]  # succeeded once, by the second lease


def test_cooperative_handler_stops_within_one_lease_when_heartbeats_are_lost(env, pg_dsn, conn):
    """Heartbeats lost during active work: the dispatcher is frozen (no renewals reach the
    database) while a second worker waits for the job. The stale handler is told its
    lease is lost by its own claimer (claimer/lease_watch.py), within a lease of the
    freeze and while the dispatcher is still frozen, and stops: the second worker's
    attempt, if any, starts after it. (The handler was once told only at SIGCONT, the
    dispatcher's lease clock frozen too, after the second worker had reclaimed the job.)"""
    schema = env.settings.schema
    lease = 2.0
    env.enqueue("sleep", {"seconds": 20, "cooperative": True})
    args = ["--lease", str(lease), "--reap-interval", "0.5", "--poll-interval", "0.3"]
    with Worker(pg_dsn, schema, "--concurrency", "1", *args, name="a") as a:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        with Worker(pg_dsn, schema, "--concurrency", "1", *args, name="b") as b:
            # freeze A's renewer by stopping the dispatcher only; its claimer keeps running
            frozen_at = conn.execute("SELECT clock_timestamp()").fetchone()[0]
            a.signal(signal.SIGSTOP)
            try:
                wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'noticed_lost'"), 30,
                           message=lambda: f"A's handler noticed the lost lease; log:\n{a.logs()[-3000:]}")
                time.sleep(lease)  # B's reaper and claim, had the job been left to them
            finally:
                a.signal(signal.SIGCONT)
            b.kill()
        a.kill()
    (a_start,), (a_stop,) = (
        q(conn, schema, "SELECT at FROM {s}.ledger WHERE event = 'start' AND lease_token = 1"),
        q(conn, schema, "SELECT at FROM {s}.ledger WHERE event = 'noticed_lost'"))
    told = (a_stop[0] - frozen_at).total_seconds()
    print(f"A's handler told {told:.2f} s after the freeze (lease {lease}s)")
    assert told <= lease + 1.0  # within one lease (+ the watch's tick and scheduling slack)
    b_start = q(conn, schema, "SELECT at FROM {s}.ledger WHERE event = 'start' AND lease_token = 2")
    if b_start:
        overlap = (a_stop[0] - b_start[0][0]).total_seconds()
        print(f"duplicate-execution window: {overlap:.2f}s (lease {lease}s)")
        assert overlap <= 0, "B's attempt started before A's handler was told"
    assert a_start[0] < a_stop[0]


def test_retries_exhausted_leave_a_visible_dead_job(env, pg_dsn, conn):
    schema = env.settings.schema
    job_id = env.enqueue("always_fails")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.2") as w:
        wait_until(lambda: all_finished(conn, schema, 1), 30)
        logs = w.logs()
    record = env.get_job(job_id)
    assert record["state"] == "dead" and record["attempts"] == 3
    assert [e["message"] for e in record["errors"]] == [f"failure number {i}" for i in (1, 2, 3)]
    # each failed attempt's log line is followed by where the handler raised (a new user
    # found only "RuntimeError: ..." with no file or line, in the log and the database)
    failed = logs.split(f"job {job_id} (always_fails) attempt 3/3 failed: ")[1]
    assert failed.startswith("RuntimeError: failure number 3\n  Traceback (most recent call last):\n"), failed[:600]
    assert re.search(r'^    File ".*acceptance_app\.py", line \d+, in always_fails\n'
                     r'^      raise RuntimeError\(f"failure number \{ctx\.attempt\}"\)$', failed, re.M), failed[:600]


@pytest.mark.parametrize("kind", ["SystemExit", "KeyboardInterrupt", "GeneratorExit", "MemoryError"])
def test_base_exceptions_from_handlers_never_leave_a_job_running(env, pg_dsn, conn, kind):
    schema = env.settings.schema
    job_id = env.enqueue("raises", kind)
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.2") as w:
        wait_until(lambda: all_finished(conn, schema, 1), 30)
        assert w.stop() == 0
    record = env.get_job(job_id)
    assert record["state"] == "dead" and record["last_error_code"] == kind and record["attempts"] == 2


def test_sigterm_during_a_long_job_fails_it_shutdown_with_the_attempt_counted_and_exits_0(env, pg_dsn, conn):
    """Still running when the grace ends: failed SHUTDOWN, due again at once, the attempt
    counted. It was once released with the attempt given back, so a job longer than the
    grace (or a drain run's deadline) ran again and again, never dead, leaving no trace."""
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": 60})
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "1") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        assert w.stop(timeout=30) == 0
    assert q(conn, schema, "SELECT state::text, attempts, lease_owner, last_error_code, run_at <= now(), "
                           "errors->-1->>'code' FROM {s}.jobs WHERE id = %s", job_id) == \
        [("pending", 1, None, "SHUTDOWN", True, "SHUTDOWN")]


def test_handed_back_jobs_free_their_share_of_a_per_pod_queue_limit(env, pg_dsn, conn):
    """With --queue-concurrency, the share of the jobs handed back left the stuck claimer's
    count too: its peer, free again, claims them. (The stuck claimer kept counting them,
    and its peer found no room for as long as the long job ran.)"""
    from pgworker.worker.supervisor import WAITING_HAND_BACK_SECONDS

    schema = env.settings.schema
    busy = env.enqueue("other_queue", {"seconds": WAITING_HAND_BACK_SECONDS + 4})
    with Worker(pg_dsn, schema, "--concurrency", "2", "--queues", "limited,other", "--queue-concurrency",
                "limited=3", "--batch-size", "3", "--poll-interval", "0.5") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", busy), 30)
        long, *short = env.enqueue_many([("limited", {"seconds": 120}), ("limited", {}), ("limited", {})])
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", long), 30)
        wait_until(lambda: {r[0] for r in q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = ANY(%s)",
                                             short)} == {"succeeded"}, WAITING_HAND_BACK_SECONDS + 30,
                   message=lambda: w.logs()[-3000:])
        assert "handing back 2 job(s)" in w.logs()
        w.kill()


def test_a_handler_sees_the_worker_stopping_and_hands_its_job_back(env, pg_dsn, conn):
    """ctx.stopping turns True at SIGTERM: a long handler can save its work and snooze the
    job back (no attempt spent) instead of failing SHUTDOWN at the end of the grace."""
    schema = env.settings.schema
    job_id = env.enqueue("stoppable")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "30") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", job_id), 30)
        w.signal(signal.SIGTERM)
        assert w.wait(15) == 0  # well inside the grace
    assert q(conn, schema, "SELECT event FROM {s}.ledger WHERE job_id = %s ORDER BY at", job_id) == \
        [("start",), ("noticed_stop",)]
    assert q(conn, schema, "SELECT state::text, attempts, last_error_code FROM {s}.jobs WHERE id = %s", job_id) == \
        [("pending", 0, None)]


def test_sigterm_hands_back_the_jobs_waiting_behind_a_running_one_at_once(env, pg_dsn, conn):
    schema = env.settings.schema
    slow = env.enqueue("sleep", {"seconds": 60})
    waiting = env.enqueue_many([("record", i) for i in range(3)])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "4", "--shutdown-grace", "30") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", slow), 30)
        w.signal(signal.SIGTERM)
        # released within moments, while the slow job still has its grace to finish
        wait_until(lambda: {r[0] for r in q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = ANY(%s)",
                                             waiting)} == {"pending"}, 10,
                   message=lambda: w.logs()[-2000:])
        assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", slow) == [("running",)]
        assert {r[0] for r in q(conn, schema, "SELECT attempts FROM {s}.jobs WHERE id = ANY(%s)", waiting)} == {0}
        w.kill()


def test_a_timeout_still_holds_while_the_pod_stops(env, pg_dsn, conn):
    """A job past its timeout during the shutdown grace fails TIMEOUT, as it would before
    (it once ran on through the grace, and its attempt was given back)."""
    schema = env.settings.schema
    job_id = env.enqueue("sync_slow")  # timeout 1 s, max_attempts 1
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "20") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", job_id), 30)
        w.signal(signal.SIGTERM)
        assert w.wait(15) == 0  # the claimer stopped at the timeout, not at the end of the grace
        logs = w.logs()
    assert q(conn, schema, "SELECT state::text, attempts, last_error_code FROM {s}.jobs WHERE id = %s", job_id) == \
        [("dead", 1, "TIMEOUT")]
    # a job the supervisor's own write made dead is said at ERROR too, with the commands
    assert f"job {job_id} (task 'sync_slow') is dead: TIMEOUT" in logs and f"dead replay {job_id} --schema" in logs


def test_a_claimer_stopped_for_a_timeout_is_replaced_at_once_not_backed_off(env, pg_dsn, conn):
    """A break-it trial: the supervisor's own kill of a claimer whose sync handler ran past
    its limit counted as a crash soon after a start, so each one doubled a backoff (0.5 s,
    1, 2, 4, ... 30 s) and a drain run idled with jobs due. A timeout is that attempt's
    outcome: the replacement starts at once, and the log says why, not "exited"."""
    schema = env.settings.schema
    slow = [env.enqueue("sync_slow", priority=1) for _ in range(3)]  # timeout 1 s each, run first
    quick = env.enqueue_many([("record", i) for i in range(5)])
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--batch-size", "1") as w:
        assert w.wait(120) == 0, w.logs()[-3000:]
        logs = w.logs()
    assert "restarting in" not in logs, logs[-3000:]
    for job_id in slow:
        assert f"was stopped for job {job_id}'s time limit; replaced at once" in logs, logs[-3000:]
    states = q(conn, schema, "SELECT id, state::text, last_error_code FROM {s}.jobs ORDER BY id")
    assert states == [(j, "dead", "TIMEOUT") for j in slow] + [(j, "succeeded", None) for j in quick], states


def test_jobs_waiting_behind_a_long_one_are_handed_back_for_another_pod(env, pg_dsn, conn):
    """A pod whose one claimer runs a long job holds the rest of its batch for at most
    WAITING_HAND_BACK_SECONDS: then they are released (no attempt spent) and an idle pod
    runs them. They once waited for the long job to end (up to its max runtime)."""
    from pgworker.worker.supervisor import WAITING_HAND_BACK_SECONDS

    schema = env.settings.schema
    slow = env.enqueue("sleep", {"seconds": 120})
    waiting = env.enqueue_many([("record", i) for i in range(3)])
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "4") as a:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", slow), 30)
        with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.5") as b:
            wait_until(lambda: {r[0] for r in q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = ANY(%s)",
                                                 waiting)} == {"succeeded"}, WAITING_HAND_BACK_SECONDS + 30,
                       message=lambda: a.logs()[-2000:] + b.logs()[-2000:])
            assert "handing back 3 job(s) that waited unstarted" in a.logs()
            b.kill()
        assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", slow) == [("running",)]
        a.kill()
    # each ran once, on the other pod, with one attempt spent: the hand-back gave its attempt back
    runs = q(conn, schema, "SELECT job_id, count(*), min(pid) FROM {s}.ledger WHERE job_id = ANY(%s) GROUP BY job_id",
             waiting)
    assert len(runs) == 3 and all(n == 1 for _, n, _ in runs)
    assert {r[0] for r in q(conn, schema, "SELECT attempts FROM {s}.jobs WHERE id = ANY(%s)", waiting)} == {1}


def test_sigterm_lets_a_short_job_finish_within_the_grace(env, pg_dsn, conn):
    schema = env.settings.schema
    env.enqueue("sleep", {"seconds": 1})
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "20") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        assert w.stop(timeout=30) == 0
    assert states(conn, schema) == {"succeeded": 1}


def test_second_signal_exits_at_once_and_the_reaper_recovers(env, pg_dsn, conn):
    schema = env.settings.schema
    job_id = env.enqueue("sleep", {"seconds": 60})
    with Worker(pg_dsn, schema, "--concurrency", "1", "--shutdown-grace", "60", "--lease", "2") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        w.signal(signal.SIGTERM)
        time.sleep(0.3)
        w.signal(signal.SIGTERM)
        assert w.wait(10) == 128 + signal.SIGTERM
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id) == [("running",)]
    time.sleep(2.2)
    assert env.reap().total == 1


def test_drain_exits_0_on_an_empty_queue_and_reports(env, pg_dsn):
    with Worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "2") as w:
        assert w.wait(60) == 0
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert summary["event"] == "drain_summary" and summary["processed"] == 0 and summary["left"] == 0
    assert summary["next_due_seconds"] is None  # nothing waits for later either


def test_drain_processes_due_work_and_leaves_later_work(env, pg_dsn, conn):
    schema = env.settings.schema
    env.enqueue_many([("record", i) for i in range(50)])
    later = env.enqueue("record", delay=3600)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2") as w:
        assert w.wait(60) == 0
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        logs = w.logs()
    assert summary["succeeded"] == 50 and summary["result"] == "succeeded"
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", later) == [("pending",)]
    # "left": 0 is not "all done": the summary says when the next job falls due, and the log in words
    assert summary["left"] == 0 and 3500 < summary["next_due_seconds"] <= 3600, summary
    assert re.search(r"drain: nothing due is left; the next job .* is due in 3[56]\d\d\.\d s, for the next run", logs), \
        logs[-2000:]


def test_a_drain_run_names_due_jobs_it_left_because_another_transaction_locked_them(env, pg_dsn, conn):
    """A claim skips a row another transaction holds locked (an operator's open
    SELECT ... FOR UPDATE, say): the run drains everything else, exits 0 and counts the
    job as left, and its log says why and where to look; the next run takes it."""
    import psycopg

    schema = env.settings.schema
    env.enqueue_many([("record", i) for i in range(5)])
    held = env.enqueue("record", {"held": True})
    with psycopg.connect(pg_dsn) as operator:
        operator.execute(sql.SQL("SELECT id FROM {}.jobs WHERE id = %s FOR UPDATE").format(sql.Identifier(schema)),
                         (held,))
        with Worker(pg_dsn, schema, "--drain", "--concurrency", "2") as w:
            assert w.wait(60) == 0
            summary = json.loads(w.stdout().strip().splitlines()[-1])
            logs = w.logs()
        assert summary["succeeded"] == 5 and summary["left"] == 1 and summary["result"] == "succeeded", summary
        assert "1 due job(s) left at exit; 1 held locked by another transaction" in logs, logs[-2000:]
        assert "pg_locks" in logs
        operator.rollback()
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", held) == [("pending",)]
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2") as w:
        assert w.wait(60) == 0
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        assert "left at exit" not in w.logs()
    assert summary["succeeded"] == 1 and summary["left"] == 0, summary


def test_drain_runs_work_that_becomes_due_while_another_job_runs(env, pg_dsn, conn):
    """A drain run has no LISTEN; its idle claimer is still woken by the fallback poll, so
    a job that becomes due while a long one runs starts at once, not after the long one
    (a new user saw a retry wait 20 s behind a long job with a claimer idle)."""
    schema = env.settings.schema
    long = env.enqueue("sleep", {"seconds": 6})
    soon = env.enqueue("record", delay=1.0)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2", "--poll-interval", "0.3") as w:
        assert w.wait(60) == 0
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert summary["succeeded"] == 2 and summary["left"] == 0
    [(started, long_finished)] = q(conn, schema, "SELECT (SELECT started_at FROM {s}.jobs WHERE id = %s), "
                                                 "(SELECT finished_at FROM {s}.jobs WHERE id = %s)", soon, long)
    assert started < long_finished, (started, long_finished)


def test_drain_ends_when_a_claim_round_outlasts_the_poll_interval(env, pg_dsn, conn):
    """A drain run's poll wakes idle claimers only while the pod holds a job: with 1,000
    queues a round takes longer than a 0.05 s poll interval, and a poll that kept waking
    the claimers whose rounds find nothing kept the run from ever counting as drained (a
    break-it trial's finding: still running at 60 s)."""
    queues = ",".join(["default"] + [f"q{i}" for i in range(1000)])
    env.enqueue("sleep", {"seconds": 2})
    with Worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "2", "--queues", queues,
                "--poll-interval", "0.05") as w:
        assert w.wait(60) == 0, w.logs()[-2000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert summary["succeeded"] == 1 and summary["left"] == 0 and summary["result"] == "succeeded"


def test_drain_deadline_with_due_work_left_exits_75(env, pg_dsn, conn):
    schema = env.settings.schema
    env.enqueue_many([("sleep", {"seconds": 30})] + [("record", i) for i in range(5)])
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--batch-size", "1",
                "--max-duration", "2", "--shutdown-grace", "1") as w:
        assert w.wait(60) == 75
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        logs = w.logs()
    assert summary["result"] == "deadline" and summary["left"] >= 1, logs[-3000:]
    assert "due job(s) left at exit (the run reached --max-duration; none held locked)" in logs, logs[-3000:]
    assert not q(conn, schema, "SELECT 1 FROM {s}.jobs WHERE state = 'running'")  # settled, not stranded
    # the job longer than the run spent its attempt (SHUTDOWN): runs after runs end it dead,
    # visible, instead of releasing it forever
    assert q(conn, schema, "SELECT attempts, last_error_code FROM {s}.jobs WHERE task = 'sleep'") == [(1, "SHUTDOWN")]


HOURLY = 1 / 3600  # one token an hour: a claimer that waits for the next token waits an hour


def test_drain_exits_when_a_rate_limited_queue_has_nothing_due(env, pg_dsn, conn):
    """Its only job took the bucket's last token: the queue owes nothing, so the run ends
    (it waited for the next token, an hour here: a scale-to-zero run stayed up for it)."""
    schema = env.settings.schema
    env.configure_queue("limited", rate_limit=HOURLY, burst=1)
    env.enqueue("limited", {})
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2", "--queues", "limited") as w:
        assert w.wait(60) == 0, w.logs()[-2000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert (summary["result"], summary["succeeded"], summary["left"], summary["next_due_seconds"]) == \
        ("succeeded", 1, 0, None)
    # and a run that starts with the bucket already empty and nothing due ends too
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", "--queues", "limited") as w:
        assert w.wait(60) == 0, w.logs()[-2000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert (summary["result"], summary["processed"], summary["left"]) == ("succeeded", 0, 0)


def test_a_queue_no_task_uses_is_named_at_start(env, pg_dsn):
    """`--queues i0` for 'io' left a new user's worker idle and its drain run reported
    success: a queue of --queues that none of the app's tasks uses is named, with the
    closest task queue (a warning: jobs enqueued there with queue=... are legitimate)."""
    with Worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "1", "--queues", "limitd,default") as w:
        assert w.wait(60) == 0, w.logs()[-2000:]
        logs = w.logs()
    assert "queue 'limitd' (--queues, PGWORKER_QUEUES) is no queue of the app's tasks or schedules" in logs, logs[-2000:]
    assert "did you mean 'limited'?" in logs and "queue 'default' (--queues" not in logs


def test_drain_due_jobs_waiting_for_tokens_are_work_left(env, pg_dsn, conn):
    """Due jobs that a rate limit holds back are due work the run did not do: it waits
    for their tokens and, at its deadline, reports them as left and exits 75 (run again);
    next_due_seconds is about jobs not due yet, and none is."""
    schema = env.settings.schema
    env.configure_queue("limited", rate_limit=HOURLY, burst=1)
    env.enqueue_many([("limited", {}) for _ in range(3)])
    # 8 s, not less: the one token's job must run before the deadline even on a loaded
    # machine (3 s once ended with none run: the claimers were still starting)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2", "--queues", "limited",
                "--max-duration", "8") as w:
        assert w.wait(60) == 75, w.logs()[-2000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert (summary["result"], summary["succeeded"], summary["left"], summary["next_due_seconds"]) == \
        ("deadline", 1, 2, None)


def test_drain_reaps_expired_leases_first(env, pg_dsn, conn):
    schema = env.settings.schema
    env.enqueue("record")
    [job] = env.claim()
    q(conn, schema, "UPDATE {s}.jobs SET lease_expires_at = now() - interval '1s' RETURNING id")
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1") as w:
        assert w.wait(60) == 0
    assert q(conn, schema, "SELECT state::text, lease_token FROM {s}.jobs") == [("succeeded", 2)]


def test_drain_does_not_report_drained_when_its_claims_fail(env, pg_dsn, conn):
    """A claim that fails is not an empty queue: a drain run whose claims are refused for
    a while (here by a trigger, as a failover or a lock timeout would) keeps trying with
    backoff and finishes the work, rather than reporting success with every job left."""
    schema = env.settings.schema
    n = 20
    env.enqueue_many([("record", i) for i in range(n)])
    ddl(conn, schema, """CREATE FUNCTION {s}.refuse_claims() RETURNS trigger LANGUAGE plpgsql AS
                         $$ BEGIN RAISE EXCEPTION 'claims refused by the test'; END $$""")
    ddl(conn, schema, "CREATE TRIGGER refuse_claims BEFORE UPDATE ON {s}.jobs FOR EACH ROW "
                      "WHEN (NEW.state = 'running') EXECUTE FUNCTION {s}.refuse_claims()")
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2") as w:
        wait_until(lambda: "claims refused by the test" in w.logs() or w.proc.poll() is not None, 30,
                   message="a refused claim")
        time.sleep(1.0)
        assert w.proc.poll() is None, f"the drain run ended while its claims failed: {w.stdout()}"
        ddl(conn, schema, "DROP TRIGGER refuse_claims ON {s}.jobs")
        assert w.wait(120) == 0, w.logs()
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert states(conn, schema) == {"succeeded": n}
    assert summary["result"] == "succeeded" and summary["succeeded"] == n and summary["left"] == 0


def test_a_job_longer_than_the_batch_budget_does_not_stop_the_claimer(env, pg_dsn, conn):
    """Automatic batches aim at about a second of work: after a job that alone ran longer
    than that, the claimer must still claim (one at a time), not stop claiming. Found by
    a reviewer: a batch size of 0 made the claimer spin without claiming, for good."""
    schema = env.settings.schema
    slow = env.enqueue("sleep", {"seconds": 1.3})  # claimed alone: its run sets the average
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1") as w:
        wait_until(lambda: states(conn, schema) == {"running": 1}, 30, message="the slow job started")
        quick = env.enqueue_many([("record", i) for i in range(20)])
        assert w.wait(30) == 0, w.logs()
        summary = json.loads(w.stdout().strip().splitlines()[-1])
    assert states(conn, schema) == {"succeeded": 1 + len(quick)}, slow
    assert summary["succeeded"] == 1 + len(quick) and summary["left"] == 0


def test_unknown_task_and_undecodable_payload_end_dead_with_a_code(env, pg_dsn, conn):
    schema = env.settings.schema
    unknown = env.enqueue("no.such.task", any_task=True)  # a name this app does not register
    bad = env.enqueue("needs_point", {"x": 1})  # no "y"
    good = env.enqueue("needs_point", {"x": 1, "y": 2})
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.2") as w:
        wait_until(lambda: all_finished(conn, schema, 3), 30)
        # every death is logged once, with what to do, whatever its cause
        wait_until(lambda: f"job {bad} (task 'needs_point') is dead after attempt 1/" in w.logs(), 10,
                   message=lambda: w.logs()[-3000:])
        assert f"job {unknown} (task 'no.such.task') is dead after attempt 1/" in w.logs()
        # followed as printed, the hint reaches this schema, not the default one
        assert f"replay with `pgworker dead replay {unknown} --schema {schema}`" in w.logs()
        # this app registers many tasks: its line lists whole names, then says how many more,
        # and gives each command once (the message was cut at 200 characters, a backtick lost)
        [line] = [line for line in w.logs().splitlines() if f"job {unknown} (task" in line]
        assert re.search(r"\(registered: [a-z_]+(, [a-z_]+)* and \d+ more\); deploy a worker that has it, "
                         r"then replay the job; see `pgworker jobs show", line), line
        assert line.count("pgworker dead replay") == 1 and line.count("`") % 2 == 0, line
    assert env.get_job(unknown)["last_error_code"] == "UNKNOWN_TASK"
    assert env.get_job(unknown)["attempts"] == 1
    assert (env.get_job(bad)["state"], env.get_job(bad)["last_error_code"], env.get_job(bad)["attempts"]) == \
        ("dead", "PAYLOAD_INVALID", 1)
    assert env.get_job(good)["state"] == "succeeded"


SMALL_APP = """
import pgworker

app = pgworker.App()


@app.task(name="beta")
def beta(payload):
    return None


@app.task(name="alpha")
def alpha(payload):
    return None
"""


def test_the_dead_job_line_of_an_unknown_task(env, pg_dsn, conn, tmp_path):
    """The exact ERROR line a worker writes for a job of a task it has no handler for:
    one hint per command, every backtick closed. It once read "...then `pgworker dead
    replay 1`; see `pgworker jobs show 1`, replay with `pgworker dead replay 1`", or, with
    many tasks registered, was cut at 200 characters in the middle of a name and a command."""
    schema = env.settings.schema
    (tmp_path / "small_app.py").write_text(SMALL_APP)
    job = env.enqueue("no.such.task", any_task=True)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", app=f"{tmp_path / 'small_app.py'}:app") as w:
        assert w.wait(60) == 0, w.logs()
        logs = w.logs()
    [line] = [line.split(" pgworker.claimer: ", 1)[1] for line in logs.splitlines() if " is dead after " in line]
    flag = f" --schema {schema}"
    assert line == (f"job {job} (task 'no.such.task') is dead after attempt 1/5: UNKNOWN_TASK: no handler for task "
                    "'no.such.task' in this worker (registered: alpha, beta); deploy a worker that has it, then "
                    f"replay the job; see `pgworker jobs show {job}{flag}`, replay with "
                    f"`pgworker dead replay {job}{flag}`")
    assert " ERROR " in [x for x in logs.splitlines() if " is dead after " in x][0]
    assert env.get_job(job)["errors"][-1]["message"] == (
        "no handler for task 'no.such.task' in this worker (registered: alpha, beta); deploy a worker that has "
        "it, then replay the job")


CLAIMERS_FAIL_APP = """
import multiprocessing

import pgworker

if multiprocessing.current_process().name != "MainProcess":  # imports in the supervisor only
    raise RuntimeError("this image lacks a driver the tasks need")

app = pgworker.App()


@app.task(name="alpha")
def alpha(payload):
    return None
"""


def test_a_lock_on_the_schema_at_start_is_named_and_neither_hangs_nor_deafens(env, pg_dsn, conn):
    """A migration's lock on the migrations table held a drain run's start-up check for
    as long as it lasted, with no word and deaf to SIGTERM (a break-it trial). The check
    now waits at most lock_timeout a try, says why, gives up at the run's deadline, and
    a signal stops a worker waiting so."""
    import psycopg
    from psycopg import sql

    schema = env.settings.schema
    job = env.enqueue("record", 1)
    bounds = {"PGWORKER_LOCK_TIMEOUT_SECONDS": "0.5"}
    with psycopg.connect(pg_dsn) as holder:
        holder.execute(sql.SQL("LOCK TABLE {}.migrations IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
        with Worker(pg_dsn, schema, "--drain", "--max-duration", "4", "--concurrency", "1", env=bounds) as w:
            assert w.wait(60) == 1, w.logs()[-3000:]
            logs = w.logs()
            summary = json.loads(w.stdout().strip().splitlines()[-1])
        assert "checking the schema gave up waiting (statement failed (lock timeout" in logs, logs[-3000:]
        assert "another session holds a lock on the schema's tables" in logs and summary["result"] == "failed"
        assert logs.count("checking the schema gave up waiting") == 1  # said once, not per try
        with Worker(pg_dsn, schema, "--concurrency", "1", env=bounds) as w:
            wait_until(lambda: "checking the schema gave up waiting" in w.logs(), 30, message=lambda: w.logs()[-3000:])
            started = time.monotonic()
            assert w.stop(30) == 0, w.logs()[-3000:]
            assert time.monotonic() - started < 10  # the lock is still held: the signal was heard
        holder.rollback()
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job) == [("pending",)]


def test_a_drain_run_whose_claimers_fail_at_start_up_exits_1_at_once(env, pg_dsn, conn, tmp_path):
    """A claimer whose set-up fails (the app raises on import in the claimer only) was
    restarted every 30 s until the CronJob's deadline: a drain run now stops at once,
    exits 1 and reports "failed", and its job waits for the next run untouched."""
    schema = env.settings.schema
    (tmp_path / "claimers_fail.py").write_text(CLAIMERS_FAIL_APP)
    job = env.enqueue("alpha", any_task=True)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", app=f"{tmp_path / 'claimers_fail.py'}:app") as w:
        assert w.wait(60) == 1, w.logs()[-3000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        logs = w.logs()
    assert "this image lacks a driver" in logs and "a drain run does not restart it" in logs, logs[-3000:]
    assert "restarting in" not in logs
    assert logs.count("RuntimeError: this image lacks a driver") == 1, logs[-3000:]  # no replacement started
    assert summary["result"] == "failed" and summary["processed"] == 0 and summary["left"] == 1, summary
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job) == [("pending", 0)]


def test_a_drain_run_whose_claimers_exit_0_at_start_up_fails_too(env, pg_dsn, conn, tmp_path):
    """sys.exit() while the app module imports in a claimer: code 0 read as a recycle,
    and the claimers were replaced in a tight, silent loop (88 in 5 s: a trial)."""
    schema = env.settings.schema
    (tmp_path / "claimers_exit.py").write_text(CLAIMERS_FAIL_APP.replace(
        'raise RuntimeError("this image lacks a driver the tasks need")', "raise SystemExit(0)"))
    job = env.enqueue("alpha", any_task=True)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1", app=f"{tmp_path / 'claimers_exit.py'}:app") as w:
        assert w.wait(60) == 1, w.logs()[-3000:]
        summary = json.loads(w.stdout().strip().splitlines()[-1])
        logs = w.logs()
    assert "exited with code 0 before its first claim" in logs and "a drain run does not restart it" in logs, logs
    assert summary["result"] == "failed" and summary["left"] == 1, summary
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job) == [("pending", 0)]


def test_async_handlers_and_their_timeout(env, pg_dsn, conn):
    schema = env.settings.schema
    ok = env.enqueue("async_echo")
    slow = env.enqueue("async_slow")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.2"):
        wait_until(lambda: all_finished(conn, schema, 2), 30)
    assert env.get_job(ok)["state"] == "succeeded"
    assert (env.get_job(slow)["state"], env.get_job(slow)["last_error_code"]) == ("dead", "TIMEOUT")


def test_sync_timeout_stops_the_claimer_and_the_pool_goes_on(env, pg_dsn, conn):
    schema = env.settings.schema
    slow = env.enqueue("sync_slow")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.2") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30)
        wait_until(lambda: all_finished(conn, schema, 1), 30, message="the timed-out job settled")
        after = env.enqueue("record")
        wait_until(lambda: all_finished(conn, schema, 2), 30, message="the restarted claimer works")
        assert w.stop() == 0
    assert (env.get_job(slow)["state"], env.get_job(slow)["last_error_code"]) == ("dead", "TIMEOUT")
    assert env.get_job(after)["state"] == "succeeded"


def test_a_handler_holding_the_gil_past_its_lease_keeps_the_lease(env, pg_dsn, conn):
    """Renewal runs in the dispatcher, so a C call that never releases the GIL cannot
    starve it: the job runs for 3 leases and still completes on its first attempt."""
    schema = env.settings.schema
    job_id = env.enqueue("gil_hog", 6)
    with Worker(pg_dsn, schema, "--concurrency", "1", "--lease", "2", "--reap-interval", "0.5") as w:
        wait_until(lambda: all_finished(conn, schema, 1), 60)
        assert w.stop() == 0
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id) == [("succeeded", 1)]


def test_snooze_runs_again_later_without_spending_an_attempt(env, pg_dsn, conn):
    schema = env.settings.schema
    job_id = env.enqueue("snoozer")
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "0.2"):
        wait_until(lambda: all_finished(conn, schema, 1), 30)
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id) == [("succeeded", 1)]
    assert len(q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", job_id)) == 2


def test_listener_killed_polling_still_drains_and_listen_comes_back(env, pg_dsn, conn):
    schema = env.settings.schema
    with Worker(pg_dsn, schema, "--concurrency", "1", "--poll-interval", "1") as w:
        channel = env.store.channel  # other workers (other tests) listen on other channels

        def listener():
            return q(conn, schema, "SELECT pid FROM pg_stat_activity WHERE application_name = "
                                   "'pgworker:listener' AND query ILIKE 'LISTEN%%' AND position(%s in query) > 0",
                     channel)
        first = wait_until(listener, 30, message="the dispatcher is listening")
        for (pid,) in first:
            conn.execute("SELECT pg_terminate_backend(%s)", [pid])
        env.enqueue("record")  # the wake-up for this job is lost: the poll finds it
        wait_until(lambda: all_finished(conn, schema, 1), 30, message="polling drained the job")
        again = wait_until(lambda: [r for r in listener() if r not in first], 30, message="LISTEN re-established")
        assert again
        assert w.stop() == 0
    assert "LISTEN connection lost" in w.logs()


def test_one_job_locked_for_long_does_not_hold_back_the_others(env, pg_dsn, conn):
    import psycopg

    schema = env.settings.schema
    ids = env.enqueue_many([("record", i) for i in range(20)])
    with psycopg.connect(pg_dsn) as holder:
        q(holder, schema, "SELECT id FROM {s}.jobs WHERE id = %s FOR UPDATE", ids[0])
        with Worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.2"):
            wait_until(lambda: states(conn, schema).get("succeeded") == 19, 30)
        holder.rollback()
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", ids[0]) == [("pending",)]


def test_a_workers_log_goes_to_the_tests_tmp_path(env, pg_dsn, tmp_path):
    """The suite used to leave dozens of pgworker-worker-*.log files in /tmp."""
    with Worker(pg_dsn, env.settings.schema, "--drain", "--concurrency", "1") as w:
        assert w.wait(60) == 0
    assert os.path.dirname(w.log_path) == str(tmp_path)
    assert "drain mode" in w.logs()
