"""Handlers with typed payloads (tests/acceptance/test_typed_payloads.py): a dataclass, a
TypedDict and a pydantic model, annotated as the handler's payload parameter (string
annotations here, as `from __future__ import annotations` makes them). Each records in
the ledger the type it received and a field, so the test sees what reached the handler."""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass, field
from typing import NotRequired, TypedDict

import psycopg
import pydantic
from psycopg import sql

import pgworker

app = pgworker.App()


def note(ctx: pgworker.JobContext, text: str) -> None:
    schema = sql.Identifier(os.environ["PGWORKER_SCHEMA"])
    with psycopg.connect(os.environ["PGWORKER_DSN"], autocommit=True) as c:
        c.execute(sql.SQL("INSERT INTO {}.ledger (idempotency_key, job_id, attempt, lease_token, event, pid, note) "
                          "VALUES (%s, %s, %s, %s, 'run', %s, %s)").format(schema),
                  [ctx.idempotency_key, ctx.job_id, ctx.attempt, ctx.lease_token, os.getpid(), text])


@dataclass
class Line:
    sku: str
    quantity: int


@dataclass
class Invoice:
    customer: str
    lines: list[Line]
    due: datetime.date | None = None
    tags: list[str] = field(default_factory=list)


class Reminder(TypedDict):
    invoice: int
    channel: NotRequired[str]


class Refund(pydantic.BaseModel):
    invoice: int
    amount: float


@app.task(name="bill", max_attempts=5)
def bill(inv: Invoice, ctx: pgworker.JobContext) -> None:
    total = sum(line.quantity for line in inv.lines)  # attributes: a dict would fail here
    note(ctx, f"{type(inv).__name__} {inv.customer} {total} {type(inv.lines[0]).__name__} {inv.due!r}")


@app.task(name="remind", max_attempts=5)
def remind(reminder: Reminder, ctx: pgworker.JobContext) -> None:
    note(ctx, f"{type(reminder).__name__} {reminder['invoice']} {reminder.get('channel', '-')}")


@app.task(name="refund", max_attempts=5)
async def refund(r: Refund, ctx: pgworker.JobContext) -> None:
    note(ctx, f"{type(r).__name__} {r.invoice} {r.amount}")
