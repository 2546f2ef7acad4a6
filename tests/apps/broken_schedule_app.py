"""An app with one healthy schedule ('tick', every minute) beside two that fail at run
time, for the test that one schedule's error never stops the others:

- 'a-no-slot': declared with a valid expression, then given one that matches no date, as
  no declaration can be any more (refused since): it stands for a slot computation that
  fails in the scheduler (a croniter bug, a gap in the zone database);
- 'b-refused': its row is refused by a trigger the test adds (a rule of the database's
  owners), so its registration fails with a statement error.
"""

from __future__ import annotations

import os

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()


@app.task(name="tick", schedule="* * * * *")
def tick(payload, ctx):
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (job_id, attempt, lease_token, event, pid) "
                          "VALUES (%s, %s, %s, 'tick', %s)").format(schema),
                  [ctx.job_id, ctx.attempt, ctx.lease_token, os.getpid()])


app.periodic("tick", "0 0 * * *", name="a-no-slot")
object.__setattr__(app.schedules["a-no-slot"], "cron", "0 0 30 2 *")
app.periodic("tick", "0 0 * * *", name="b-refused")
