"""An app with periodic jobs (kept apart from acceptance_app so that the workers of other
tests never enqueue scheduled jobs into their schemas)."""

from __future__ import annotations

import os

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()


@app.task(name="tick", schedule="* * * * *", schedule_tz="Europe/Paris")
def tick(payload, ctx):
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (job_id, attempt, lease_token, event, pid) "
                          "VALUES (%s, %s, %s, 'tick', %s)").format(schema),
                  [ctx.job_id, ctx.attempt, ctx.lease_token, os.getpid()])


app.periodic("tick", "0 3 * * *", name="nightly", tz="America/New_York", missed="skip",
             payload={"kind": "nightly"})
