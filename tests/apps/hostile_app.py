"""Tasks for the hostile-input tests: names made of SQL metacharacters, quotes, Unicode
and maximum lengths, and handlers that raise exceptions whose text or arguments are
huge, binary, unprintable, or carry the DSN's password."""

from __future__ import annotations

import os

import psycopg
from psycopg import sql

import pgworker

app = pgworker.App()
FAST = pgworker.RetryPolicy(base_seconds=0.05, factor=2, max_seconds=0.2, jitter=0.0)

WEIRD_QUEUE = "q'\"; DROP TABLE jobs; -- 🚀 \\ $1 %s %(x)s {s}"
WEIRD_TASK = "tâche'); DELETE FROM jobs; --\"🙂 \\x00"
LONG_QUEUE = "Q" * 128
LONG_TASK = "t" * 254 + "é"


def ledger(ctx, event):
    with psycopg.connect(os.environ.get("LEDGER_DSN") or os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (idempotency_key, job_id, attempt, lease_token, event, pid) "
                          "VALUES (%s, %s, %s, %s, %s, %s)").format(sql.Identifier(os.environ["PGWORKER_SCHEMA"])),
                  [ctx.idempotency_key, ctx.job_id, ctx.attempt, ctx.lease_token, event, os.getpid()])


@app.task(name=WEIRD_TASK, queue=WEIRD_QUEUE)
def weird(payload, ctx):
    ledger(ctx, "weird")


@app.task(name=LONG_TASK, queue=LONG_QUEUE)
def long_names(payload, ctx):
    ledger(ctx, "long")


@app.task(name="noop")
def noop(payload):
    return None


@app.task(name="record", max_attempts=3, retry=FAST)
def record(payload, ctx):
    ledger(ctx, "run")


class UnprintableError(Exception):
    def __str__(self):
        raise RuntimeError("__str__ itself fails")


class CodedError(Exception):
    pgworker_code = "BAD\nCODE" * 20  # not a usable code: the class name is stored instead


RAISERS = {
    "huge": lambda: RuntimeError("x" * 10_000_000),
    "binary": lambda: ValueError(b"\x00\xff\xfe binary", bytes(range(256))),
    "unprintable": lambda: RuntimeError("line one\nFORGED ERROR pgworker.claimer: a fake log line\r\n"
                                        "\x1b[31mred\x1b[0m nul\x00 bell\x07 lone surrogate \ud800"),
    "bad_str": lambda: UnprintableError(),
    "huge_args": lambda: KeyError({"k": "v" * 1_000_000, "n": list(range(100_000))}),
    "coded": lambda: CodedError("coded"),
    "secret": lambda: RuntimeError(f"could not reach {os.environ['PGWORKER_DSN']} "
                                   f"(password={os.environ.get('SECRET_PASSWORD', '')})"),
}


@app.task(name="raise", max_attempts=1)
def raise_(payload, ctx):
    raise RAISERS[payload]()
