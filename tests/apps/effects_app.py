"""Tasks for the effects acceptance tests (ctx.transaction()): each inserts into an
``orders`` table of the test's schema inside its transaction and records what it saw in
the ledger (tests/worker.py), on a connection of its own so that a rollback keeps it.

Environment: PGWORKER_DSN, PGWORKER_SCHEMA (set by the test), LEDGER_DSN.
"""

from __future__ import annotations

import os
import signal
import time

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()
FAST = pgworker.RetryPolicy(base_seconds=0.05, factor=2, max_seconds=0.2, jitter=0.0)
SCHEMA = sql.Identifier(os.environ["PGWORKER_SCHEMA"])

ORDERS_DDL = "CREATE TABLE IF NOT EXISTS {schema}.orders (id bigserial PRIMARY KEY, job_id bigint, " \
             "lease_token bigint, attempt int, pid int)"


def ledger(ctx, event, note=None):
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (idempotency_key, job_id, attempt, lease_token, event, pid, note) "
                          "VALUES (%s, %s, %s, %s, %s, %s, %s)").format(SCHEMA),
                  [ctx.idempotency_key, ctx.job_id, ctx.attempt, ctx.lease_token, event, os.getpid(), note])


def insert_order(conn, ctx):
    conn.execute(sql.SQL("INSERT INTO {}.orders (job_id, lease_token, attempt, pid) VALUES (%s, %s, %s, %s)")
                 .format(SCHEMA), [ctx.job_id, ctx.lease_token, ctx.attempt, os.getpid()])


@app.task(name="order", max_attempts=5, retry=FAST)
def order(payload, ctx):
    """Sleep ``seconds`` (heartbeating), then insert an order in the job's transaction;
    ``kill``: on attempt 1, SIGKILL this claimer 'in_block' (after the insert, before the
    commit) or 'after_commit' (after the block, before the handler returns)."""
    ledger(ctx, "start")
    end = time.monotonic() + payload.get("seconds", 0)
    while time.monotonic() < end:
        ctx.heartbeat()
        time.sleep(0.05)
    kill = payload.get("kill") if ctx.attempt == 1 else None
    try:
        with ctx.transaction() as conn:
            insert_order(conn, ctx)
            if kill == "in_block":
                os.kill(os.getpid(), signal.SIGKILL)
    except pgworker.LeaseLost as exc:
        ledger(ctx, "told_lease_lost", exc.operation)
        raise
    ledger(ctx, "committed")
    if kill == "after_commit":
        os.kill(os.getpid(), signal.SIGKILL)
