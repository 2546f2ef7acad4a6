"""An example user module, as an application would write it: the type checker must pass
it clean under --strict (tests/unit/test_typing.py and .ci/run run mypy on it)."""

from __future__ import annotations

import dataclasses

import psycopg

import pgworker

app = pgworker.App()


@dataclasses.dataclass
class Invoice:
    customer: str
    amount_cents: int


@app.task(name="bill", queue="billing", max_attempts=3)
def bill(inv: Invoice, ctx: pgworker.JobContext) -> None:
    ctx.logger.info("billing %s for %d cents", inv.customer, inv.amount_cents)
    if ctx.is_last_attempt:
        raise pgworker.Permanent("giving up")


@app.task(name="keyed")
def keyed(payload: None, ctx: pgworker.JobContext) -> str:
    # typed attributes (they were Any): a str and ints returned as such under --strict
    key: str = ctx.idempotency_key
    return f"{key}:{ctx.job_id + ctx.attempt + ctx.max_attempts + ctx.lease_token}:{ctx.queue}:{ctx.task}"


def job_number(ctx: pgworker.JobContext) -> int:
    return ctx.job_id  # "Returning Any" under --strict while the attribute was untyped


def job_key(ctx: pgworker.JobContext) -> str:
    return ctx.idempotency_key


def drained_dead(app_under_test: pgworker.App) -> int:
    from pgworker.testing import drain

    return drain(app_under_test).dead + drain(app_under_test).succeeded


@app.task
async def ping(payload: None) -> None:
    pass


@app.task(name="optional_note")
def optional_note(note: str | None, ctx: pgworker.JobContext | None = None) -> None:
    pass


def parse_note(raw: object) -> str:
    return str(raw)


@app.task(name="parsed", payload_type=parse_note)
def parsed(note: str) -> None:
    pass


def enqueue_typed() -> int:
    parsed.enqueue({"raw": "JSON for the decoder"})  # payload_type=: what it decodes, a Task[Any]
    # Task[P] from the handler's payload parameter: enqueue takes a P (and no payload
    # where the handler takes None or an optional one)
    typed: pgworker.Task[Invoice] = bill
    notes: pgworker.Task[str | None] = optional_note
    return typed.enqueue(Invoice("acme", 1250), delay=5) + ping.enqueue() + notes.enqueue() + notes.enqueue("hi")


async def aenqueue_typed() -> int:
    return await bill.aenqueue(Invoice("acme", 1)) + await ping.aenqueue(queue="pings")


def enqueue_sync(conn: psycopg.Connection) -> int:
    job_id: int = app.enqueue("bill", Invoice("acme", 1250), conn=conn, dedupe_key="acme:1")
    ids: list[int] = app.enqueue_many([pgworker.JobSpec("bill", Invoice("b", 1))], conn=conn)
    return job_id + len(ids)


async def enqueue_async(conn: psycopg.AsyncConnection) -> int | None:
    try:
        job_id = await app.aenqueue("bill", Invoice("acme", 1250), conn=conn, on_conflict="raise")
    except pgworker.AlreadyEnqueued as exc:
        job_id = exc.job_id
    await app.aenqueue_many([("bill", Invoice("c", 2))])
    state: str | None = await app.acancel(job_id)
    job = await app.aget_job(job_id)
    replayed: pgworker.ReplayResult = await app.areplay([job_id])
    await app.aclose()
    return None if job is None or state is None else len(replayed)
