"""Tasks for benchmarks/effects.py: the same insert with its completion batched by the
completer, or committed with it in ctx.transaction(); and a handler recording K steps."""

from __future__ import annotations

import os

from psycopg import sql

import pgworker

app = pgworker.App()
INSERT = sql.SQL("INSERT INTO {}.bench_orders (job_id) VALUES (%s)").format(
    sql.Identifier(os.environ["PGWORKER_SCHEMA"]))


@app.task(name="insert_batched")
def insert_batched(payload, ctx):
    """The insert on the handler connection (autocommit), the success by the completer."""
    ctx._effects.connections.get().execute(INSERT, [ctx.job_id])


@app.task(name="insert_in_transaction")
def insert_in_transaction(payload, ctx):
    """The insert and the success in one transaction (ctx.transaction())."""
    with ctx.transaction() as conn:
        conn.execute(INSERT, [ctx.job_id])


@app.task(name="steps")
def steps(payload, ctx):
    for i in range(payload["steps"]):
        ctx.step(f"s{i}", lambda: i)
