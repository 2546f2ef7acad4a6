"""A claimer whose supervisor cannot keep its leases tells its handlers itself, and never
starts a job whose lease is past: real `pgworker run` pods, the supervisor killed
(SIGKILL) or stopped (SIGSTOP), another pod running the jobs again meanwhile. The
ledger (tests/apps/acceptance_app.py) records each attempt's start, end, and when its
handler was told its lease is lost (``checking`` calls ctx.check() between 50 ms steps).
Both tests failed on the code before lease_watch.py: the orphaned handler ran to its
end, and the stopped pod started the rest of its batch after SIGCONT."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance
LEASE = 6.0
ARGS = ["--lease", str(LEASE), "--reap-interval", "2", "--poll-interval", "0.3"]


def db_now(conn):
    return conn.execute("SELECT clock_timestamp()").fetchone()[0]


def ledger(conn, schema, *events):
    return q(conn, schema, "SELECT job_id, lease_token, event, at FROM {s}.ledger WHERE event = ANY(%s) "
                           "ORDER BY at", list(events))


def running(pid: int) -> bool:
    """Whether the process runs (a zombie nobody reaped has ended)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("task", ["checking", "async_unchecked"])
def test_a_claimer_whose_supervisor_is_killed_tells_its_running_handler(env, pg_dsn, conn, task):
    """Pod 1's supervisor is killed (SIGKILL) while its handler runs: the claimer itself
    marks the lease lost, the handler stops long before its lease would have let pod 2
    run the job, the claimer exits, and the job runs again on pod 2, once. A sync handler
    is told by ctx.check(); an async one that never checks has its task cancelled (the
    async case failed before: it awaited on to its end beside pod 2's attempt)."""
    schema = env.settings.schema
    job_id = env.enqueue(task, {"seconds": 12})
    with Worker(pg_dsn, schema, "--concurrency", "1", *ARGS, name="p1") as p1:
        wait_until(lambda: ledger(conn, schema, "start"), 30, message="pod 1 started the job")
        claimers = p1.claimer_pids()
        assert claimers
        killed_at = db_now(conn)
        p1.signal(signal.SIGKILL)  # the supervisor only: its claimer is orphaned
        with Worker(pg_dsn, schema, "--concurrency", "1", *ARGS, name="p2") as p2:
            told = wait_until(lambda: [r for r in ledger(conn, schema, "noticed_lost") if r[1] == 1], 10,
                              message=lambda: f"pod 1's handler to be told; log:\n{p1.logs()[-3000:]}")
            after = (told[0][3] - killed_at).total_seconds()
            print(f"pod 1's handler told {after:.2f} s after its supervisor was killed (lease {LEASE} s)")
            assert after < LEASE  # before its lease could expire, let alone be reaped
            wait_until(lambda: not any(running(p) for p in claimers), 15,
                       message=lambda: f"pod 1's claimer to exit; log:\n{p1.logs()[-3000:]}")
            assert "the supervisor is gone" in p1.logs()
            wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id)
                       == [("succeeded",)], 60, message=lambda: f"pod 2 to run it; log:\n{p2.logs()[-3000:]}")
            p2.stop()
    starts = [r for r in ledger(conn, schema, "start") if r[0] == job_id]
    ends = [r for r in ledger(conn, schema, "end") if r[0] == job_id]
    assert [r[1] for r in starts] == [1, 2] and [r[1] for r in ends] == [2]
    assert starts[1][3] > told[0][3]  # pod 2's attempt began after pod 1's had stopped
    # pod 1's claimer wrote its decided failure, its lease still valid: no wait for the reaper
    assert [e.get("code") for e in env.get_job(job_id)["errors"]] == ["LEASE_LOST"]


@pytest.mark.parametrize("stopped", ["supervisor", "pod"])
def test_a_claimer_never_starts_a_batched_job_whose_lease_expired(env, pg_dsn, conn, stopped):
    """Pod 1 claims a batch of four 3 s jobs, then its supervisor (or the whole pod) is
    stopped for 16 s, past the 6 s lease; pod 2 reaps and runs them. Pod 1 starts none of
    them after its leases expired (by the database clock: its last renewal was sent
    before the stop), its running handler is told, and every job succeeds once."""
    schema = env.settings.schema
    jobs = [env.enqueue("checking", {"seconds": 3}) for _ in range(4)]
    with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "4", *ARGS, name="p1") as p1:
        [first] = wait_until(lambda: ledger(conn, schema, "start"), 30, message="pod 1 started its batch")
        held = q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'running' AND lease_token = 1")
        assert held == [(4,)], "pod 1 holds the whole batch"
        stopped_at = db_now(conn)
        (p1.signal if stopped == "supervisor" else p1.signal_group)(signal.SIGSTOP)
        try:
            with Worker(pg_dsn, schema, "--concurrency", "1", "--batch-size", "1", *ARGS, name="p2") as p2:
                time.sleep(16)
                (p1.signal if stopped == "supervisor" else p1.signal_group)(signal.SIGCONT)
                wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND state = "
                                                   "'succeeded'", jobs) == [(4,)], 60,
                           message=lambda: f"pod 2 to run them; pod 1 log:\n{p1.logs()[-3000:]}")
                time.sleep(1.0)  # pod 1's refused writes, and any late start, land
                p2.stop()
        finally:
            os.killpg(p1.pid, signal.SIGCONT)
        assert p1.stop() == 0
    # Every lease of pod 1 (token 1) expired within a lease of the stop: no start after that.
    late = [(job, (at - stopped_at).total_seconds()) for job, token, _, at in ledger(conn, schema, "start")
            if token == 1 and (at - stopped_at).total_seconds() > LEASE]
    assert not late, f"pod 1 started jobs past their lease (job, seconds after the stop): {late}"
    for job in jobs:
        rows = [r for r in ledger(conn, schema, "start", "end", "noticed_lost") if r[0] == job]
        tokens = [token for _, token, event, _at in rows if event == "start"]
        assert tokens == sorted(tokens), f"job {job}: an older lease's attempt started after a newer one: {rows}"
        if stopped == "pod":
            continue  # a stopped process cannot be told: its attempt resumes at SIGCONT, to be told then
        # pod 1's claimer ran on: each attempt was told (or ended) before the next began
        open_tokens: set[int] = set()
        for _, token, event, _at in rows:
            if event == "start":
                assert not open_tokens, f"job {job}: attempt {token} started while {open_tokens} ran: {rows}"
                open_tokens.add(token)
            else:
                open_tokens.discard(token)
    # each job's work ran to its end once, but for the attempt frozen mid-run with the whole pod: its
    # handler resumes past its own deadline and ends before anything can tell it (its write is refused)
    frozen = {(first[0], 1)} if stopped == "pod" else set()
    ends = q(conn, schema, "SELECT job_id, lease_token FROM {s}.ledger WHERE event = 'end'")
    assert sorted(job for job, token in ends if (job, token) not in frozen) == sorted(jobs)
    assert "lease lost on job" in p1.logs()


@pytest.mark.parametrize("task", ["async_unchecked", "async_converts"])
def test_a_claimer_claims_nothing_while_its_supervisor_is_stopped(env, pg_dsn, conn, task):
    """Pod 1's supervisor is stopped (SIGSTOP) past the lease while its only job runs, and
    no other pod runs: the claimer tells its handler (LEASE_LOST, an attempt spent, the
    job retried) but claims nothing more until the supervisor ticks again; after SIGCONT
    the job runs again and succeeds. Before, the claimer claimed the job again at once,
    under leases nobody renewed, each attempt presumed lost in turn: dead after 3/3. A
    handler that turns its cancellation into a permanent error of its own is LEASE_LOST
    too (it was dead, Interrupted)."""
    schema = env.settings.schema
    job_id = env.enqueue(task, {"seconds": 8})
    with Worker(pg_dsn, schema, "--concurrency", "1", *ARGS, name="p1") as p1:
        wait_until(lambda: ledger(conn, schema, "start"), 30, message="pod 1 started the job")
        p1.signal(signal.SIGSTOP)  # the supervisor only: its claimer runs on
        try:
            wait_until(lambda: ledger(conn, schema, "noticed_lost"), 15,
                       message=lambda: f"the handler to be told; log:\n{p1.logs()[-3000:]}")
            time.sleep(LEASE + 2)  # a lease more: the old code had claimed attempt 2 and lost it again
            during = [r[1] for r in ledger(conn, schema, "start")]
            [(state, attempts)] = q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id)
        finally:
            p1.signal(signal.SIGCONT)
        assert during == [1], f"attempts started while the supervisor was stopped: {during}"
        assert (state, attempts) == ("pending", 1), (state, attempts)
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id)
                   == [("succeeded",)], 60, message=lambda: f"the job to run again; log:\n{p1.logs()[-3000:]}")
        logs = p1.logs()
        assert p1.stop() == 0
    assert "claims nothing until its supervisor ticks again" in logs and "claims again" in logs
    errors = env.get_job(job_id)["errors"]
    assert [e.get("code") for e in errors] == ["LEASE_LOST"], errors
