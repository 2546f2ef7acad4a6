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
    if payload.get("linger"):  # past a renewal interval after the commit
        time.sleep(payload["linger"])
        ledger(ctx, "lingered", str(ctx.lease_lost))


def _kill_here():
    os.kill(os.getpid(), signal.SIGKILL)


def _post(key, drop):
    """The external effect: POST to the test's destination (EFFECT_URL) with the key."""
    import json
    import urllib.request

    req = urllib.request.Request(f"{os.environ['EFFECT_URL']}/effects/{key}?drop={int(drop)}", method="POST",
                                 data=b"{}")
    with urllib.request.urlopen(req, timeout=5) as resp:
        return json.loads(resp.read())


def _reconcile(key):
    """Ask the destination whether the effect with this key happened."""
    import json
    import urllib.error
    import urllib.request

    try:
        with urllib.request.urlopen(f"{os.environ['EFFECT_URL']}/effects/{key}", timeout=5) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return pgworker.NOT_DONE
        raise


@app.task(name="flow", max_attempts=5, retry=FAST)
def flow(payload, ctx):
    """A step, an external effect (with reconciliation), then an order inserted by a step
    in the job's transaction (``tx``) or by a step on its own; ``kill`` names the boundary
    at which attempt 1 SIGKILLs its claimer; ``drop``: the destination drops attempt 1's call."""
    kill = payload.get("kill") if ctx.attempt == 1 else None
    ledger(ctx, "start")

    def first():
        ledger(ctx, "first_ran")
        if kill == "before_step_record":
            _kill_here()
        return "first"

    ctx.step("first", first)

    def call(key):
        ledger(ctx, "effect_called", key)
        out = _post(key, drop=bool(payload.get("drop")) and ctx.attempt == 1)
        if kill == "after_effect_before_done":
            _kill_here()
        return out

    ctx.effect("notify", call, reconcile=_reconcile)
    if payload.get("tx", True):
        with ctx.transaction() as conn:
            ctx.step("insert", lambda: insert_order(conn, ctx) or {"inserted": ctx.attempt})
            if kill == "in_transaction_after_step":
                _kill_here()
    else:
        with psycopg.connect(os.environ["PGWORKER_DSN"], autocommit=True) as own:
            ctx.step("insert", lambda: insert_order(own, ctx) or {"inserted": ctx.attempt})
        if kill == "after_last_step":
            _kill_here()
    ledger(ctx, "end")


@app.task(name="aorder", max_attempts=5, retry=FAST)
async def aorder(payload, ctx):
    """``order`` for an async handler: ctx.atransaction() on an async connection."""
    import asyncio

    ledger(ctx, "start")
    end = time.monotonic() + payload.get("seconds", 0)
    try:
        while time.monotonic() < end:
            ctx.heartbeat()
            await asyncio.sleep(0.05)
        async with ctx.atransaction() as conn:
            await conn.execute(sql.SQL("INSERT INTO {}.orders (job_id, lease_token, attempt, pid) "
                                       "VALUES (%s, %s, %s, %s)").format(SCHEMA),
                               [ctx.job_id, ctx.lease_token, ctx.attempt, os.getpid()])
    except pgworker.LeaseLost as exc:
        ledger(ctx, "told_lease_lost", exc.operation)
        raise
    except asyncio.CancelledError:  # the worker cancels the task of a lease it marked lost
        ledger(ctx, "told_lease_lost" if ctx.lease_lost else "task_cancelled", "task_cancelled")
        raise
    ledger(ctx, "committed")
