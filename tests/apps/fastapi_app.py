"""A FastAPI service that enqueues in its request's transaction: the README's example,
driven by tests/integration/test_web_frameworks.py through an HTTP client.

The App's async pool opens in the lifespan's startup (a wrong DSN fails the start, not
the first request) and closes at shutdown; each request takes a connection of the
service's own pool, and its order row and its job commit or roll back together."""

from __future__ import annotations

import contextlib
from typing import Any, AsyncIterator

import psycopg_pool
from fastapi import FastAPI, HTTPException
from psycopg import sql
from pydantic import BaseModel

import pgworker


class OrderIn(BaseModel):
    item: str
    refuse: bool = False  # the request fails after its enqueue: nothing may remain


def create_app(dsn: str, schema: str, jobs: pgworker.App) -> FastAPI:
    db = psycopg_pool.AsyncConnectionPool(dsn, min_size=1, max_size=4, open=False)
    orders = sql.Identifier(schema, "orders")

    @contextlib.asynccontextmanager
    async def lifespan(api: FastAPI) -> AsyncIterator[None]:
        # Each pool opened is closed whatever fails after it: a pool left open keeps its
        # connection attempts running, and the process never exits (a new user's trial: a
        # wrong DSN hung the service instead of failing its start)
        await jobs.aopen()  # fails the start if unreachable or unmigrated
        try:
            await db.open(wait=True)
            try:
                yield
            finally:
                await db.close()
        finally:
            await jobs.aclose()

    api = FastAPI(lifespan=lifespan)

    @api.post("/orders")
    async def create_order(order: OrderIn) -> dict[str, Any]:
        async with db.connection() as conn, conn.transaction():
            cur = await conn.execute(sql.SQL("INSERT INTO {} (item) VALUES (%s) RETURNING id").format(orders),
                                     [order.item])
            row = await cur.fetchone()
            assert row is not None
            job_id = await jobs.aenqueue("record", {"order": row[0]}, conn=conn, any_task=True)
            if order.refuse:
                raise HTTPException(409, "refused after the enqueue: the order and its job roll back")
        return {"order": row[0], "job": job_id}

    @api.get("/jobs/{job_id}")
    async def job_status(job_id: int) -> dict[str, Any]:
        job = await jobs.aget_job(job_id)  # the App's own async pool
        if job is None:
            raise HTTPException(404, "no such job")
        return {"state": job["state"], "attempts": job["attempts"]}

    @api.post("/jobs/{job_id}/cancel")
    async def cancel(job_id: int) -> dict[str, Any]:
        return {"state": await jobs.acancel(job_id, actor="api")}

    return api
