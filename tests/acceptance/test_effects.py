"""Effects that happen once, with real `pgworker run` processes (tests/apps/effects_app.py):
a handler's writes committed with its fenced completion survive a take-over and kill -9
at each boundary with every same-database write present exactly once."""

from __future__ import annotations

import os
import signal

import psycopg
import pytest
from psycopg import sql

from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EFFECTS_APP = os.path.join(HERE, "apps", "effects_app.py") + ":app"
FAST = ["--lease", "2", "--reap-interval", "0.5", "--poll-interval", "0.3"]


def make_orders(pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.orders (id bigserial PRIMARY KEY, job_id bigint, "
                          "lease_token bigint, attempt int, pid int)").format(sql.Identifier(schema)))


def enqueue(env, payload):
    return env.enqueue("order", payload, max_attempts=5, any_task=True)


def test_a_stale_handler_taken_over_commits_nothing_and_is_told(env, pg_dsn, conn):
    """SIGSTOP past the lease while another pod claims and finishes: exactly one of the
    two inserts is committed (the second owner's), and the stale handler got LeaseLost."""
    schema = env.settings.schema
    make_orders(pg_dsn, schema)
    job_id = enqueue(env, {"seconds": 4})
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP, name="a") as a:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30,
                   message=lambda: f"worker A started the job; log:\n{a.logs()[-3000:]}")
        a.signal_group(signal.SIGSTOP)  # the whole pod pauses: no renewals, no completion
        with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP, name="b") as b:
            wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.jobs WHERE state = 'succeeded'"), 30,
                       message=lambda: f"worker B reclaimed and finished the job; log:\n{b.logs()[-3000:]}")
            b.stop()
        a.signal_group(signal.SIGCONT)
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'told_lease_lost'"), 30,
                   message=lambda: f"A's stale handler was told; log:\n{a.logs()[-3000:]}")
        assert a.stop() == 0
    assert q(conn, schema, "SELECT job_id, lease_token FROM {s}.orders") == [(job_id, 2)]
    assert q(conn, schema, "SELECT lease_token, note FROM {s}.ledger WHERE event = 'told_lease_lost'") == \
        [(1, "complete_in_transaction")]
    assert q(conn, schema, "SELECT state::text, lease_token, attempts FROM {s}.jobs WHERE id = %s", job_id) == \
        [("succeeded", 2, 2)]


@pytest.mark.parametrize("kill, attempts", [("in_block", 2), ("after_commit", 1)])
def test_kill_9_inside_the_transaction_or_after_its_commit_leaves_one_insert(env, pg_dsn, conn, kill, attempts):
    """kill -9 of the claimer after the handler's insert and before the commit: nothing of
    attempt 1 committed, attempt 2 inserts once. After the commit: the job is succeeded
    (attempt 1's insert, once); the settler's WORKER_DIED failure is refused by the fence."""
    schema = env.settings.schema
    make_orders(pg_dsn, schema)
    job_id = enqueue(env, {"kill": kill})
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP) as w:
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id)
                   == [("succeeded",)], 60, message=lambda: f"the job to succeed; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    assert q(conn, schema, "SELECT job_id, attempt FROM {s}.orders") == [(job_id, attempts)]
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id) == \
        [("succeeded", attempts)]
