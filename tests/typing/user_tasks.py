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
