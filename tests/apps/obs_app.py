"""Tasks for the observability tests, with known outcomes. Each run is recorded in the
test schema's ledger table (tests/worker.py: create_ledger) with the claimer's pid.

Environment: PGWORKER_DSN and PGWORKER_SCHEMA (set by the test).
"""

from __future__ import annotations

import os
import time

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()
FAST = pgworker.RetryPolicy(base_seconds=0.05, factor=2, max_seconds=0.2, jitter=0.0)
# Retries due at once: a drain run (which stops when nothing is due) still runs them.
NOW = pgworker.RetryPolicy(base_seconds=0.0, jitter=0.0)


class FlakyError(Exception):
    pgworker_code = "FLAKY"


class DoomedError(Exception):
    pgworker_code = "DOOMED"


def _conn() -> psycopg.Connection:
    return psycopg.connect(os.environ["PGWORKER_DSN"], autocommit=True)


def ledger(ctx, event: str) -> None:
    with _conn() as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (idempotency_key, job_id, attempt, lease_token, event, pid) "
                          "VALUES (%s, %s, %s, %s, %s, %s)").format(sql.Identifier(os.environ["PGWORKER_SCHEMA"])),
                  [ctx.idempotency_key, ctx.job_id, ctx.attempt, ctx.lease_token, event, os.getpid()])


@app.task(name="ok", max_attempts=3, retry=FAST)
def ok(payload, ctx):
    ledger(ctx, "run")


@app.task(name="flaky", max_attempts=3, retry=NOW)
def flaky(payload, ctx):
    """Fails its first attempt, succeeds on the second."""
    ledger(ctx, "run")
    if ctx.attempt == 1:
        raise FlakyError("first attempt fails")


@app.task(name="doomed", max_attempts=2, retry=NOW)
def doomed(payload, ctx):
    """Fails every attempt: one retry, then dead."""
    ledger(ctx, "run")
    raise DoomedError("always")


@app.task(name="hold", max_attempts=1)
def hold(payload, ctx):
    """Runs for payload seconds (reporting progress), then succeeds."""
    ledger(ctx, "start")
    end = time.monotonic() + payload
    while time.monotonic() < end:
        ctx.heartbeat()
        time.sleep(0.05)
    ledger(ctx, "end")


@app.task(name="fail_as", max_attempts=1)
def fail_as(payload, ctx):
    """Dies at once with the error class named by the payload (its pgworker_code)."""
    ledger(ctx, "run")
    raise type("NamedError", (Exception,), {"pgworker_code": payload})("failed on purpose")


@app.task(name="wait_for_file", max_attempts=1)
def wait_for_file(payload, ctx):
    """Runs until the file named by the payload exists (at most a minute), then succeeds:
    a test decides when it ends."""
    ledger(ctx, "start")
    deadline = time.monotonic() + 60
    while not os.path.exists(payload) and time.monotonic() < deadline:
        time.sleep(0.05)
    ledger(ctx, "end")


@app.task(name="outlive_lease", max_attempts=3, retry=FAST)
def outlive_lease(payload, ctx):
    """First attempt: keep running until another worker has taken the job over (its lease
    expired, nobody renewed it, a reaper requeued it and a claim moved its token on), then
    return, so that its completion comes too late and the fence refuses it. (An outcome
    that arrives after the lease expired but before the job was taken over is accepted:
    the token alone proves ownership, see pgworker/worker/lease.py.) Later attempts
    succeed at once."""
    ledger(ctx, "start")
    if ctx.attempt == 1:
        query = sql.SQL("SELECT 1 FROM {}.jobs WHERE id = %s AND lease_token = %s").format(
            sql.Identifier(os.environ["PGWORKER_SCHEMA"]))
        deadline = time.monotonic() + 120
        with _conn() as c:
            while time.monotonic() < deadline:
                if c.execute(query, [ctx.job_id, ctx.lease_token]).fetchone() is None:
                    break
                time.sleep(0.1)
    ledger(ctx, "end")
