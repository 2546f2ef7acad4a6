"""Enqueue inside SQLAlchemy transactions (pgworker.contrib.sqlalchemy), sync and async,
against a real PostgreSQL: the job rolls back with the ORM's work and commits with it,
and the committed jobs are run by a real worker."""

from __future__ import annotations

import asyncio

import pytest

from pg import sqlalchemy_url

from pgworker.contrib.sqlalchemy import async_psycopg_connection, psycopg_connection
from worker import Worker, create_ledger, q

pytestmark = pytest.mark.integration

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is a test dependency (pip install -e '.[test]')")
from sqlalchemy import Column, Integer, MetaData, String, Table, insert, text  # noqa: E402
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402


url = sqlalchemy_url


def orders_table(schema: str) -> Table:
    return Table("orders", MetaData(schema=schema), Column("id", Integer, primary_key=True),
                 Column("item", String, nullable=False))


def test_sync_session_and_connection(env, pg_dsn, conn):
    schema = env.settings.schema
    engine = sqlalchemy.create_engine(url(pg_dsn))
    orders = orders_table(schema)
    orders.metadata.create_all(engine)
    try:
        with Session(engine) as session:
            with session.begin():
                session.execute(insert(orders).values(item="rolled back"))
                env.enqueue("record", {"item": "rolled back"}, conn=psycopg_connection(session))
                session.rollback()
        assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 0
        with Session(engine) as session, session.begin():
            session.execute(insert(orders).values(item="book"))
            raw = psycopg_connection(session)
            assert raw.execute(text("SELECT 1").text).fetchone() == (1,)
            in_session = env.enqueue("record", {"item": "book"}, conn=raw)
            assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 0  # not before the commit
        with engine.begin() as sa_conn:  # a Connection, not a Session
            sa_conn.execute(insert(orders).values(item="pen"))
            [in_connection] = env.enqueue_many([("record", {"item": "pen"})], conn=psycopg_connection(sa_conn))
    finally:
        engine.dispose()
    assert q(conn, schema, "SELECT count(*) FROM {s}.orders")[0][0] == 2
    run_worker(pg_dsn, schema, conn, {in_session, in_connection})


def test_async_session_and_connection(env, pg_dsn, conn):
    schema = env.settings.schema
    orders = orders_table(schema)

    async def main():
        engine = create_async_engine(url(pg_dsn))
        try:
            async with engine.begin() as aconn:
                await aconn.run_sync(orders.metadata.create_all)
            async with AsyncSession(engine) as session:
                async with session.begin():
                    await session.execute(insert(orders).values(item="rolled back"))
                    await env.aenqueue("record", {"item": "x"}, conn=await async_psycopg_connection(session))
                    await session.rollback()
            assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 0
            async with AsyncSession(engine) as session, session.begin():
                await session.execute(insert(orders).values(item="book"))
                one = await env.aenqueue("record", {"item": "book"}, conn=await async_psycopg_connection(session))
            async with engine.begin() as aconn:
                await aconn.execute(insert(orders).values(item="pen"))
                [two] = await env.aenqueue_many([("record", {"item": "pen"})],
                                                conn=await async_psycopg_connection(aconn))
            with pytest.raises(TypeError, match="async_psycopg_connection"):
                async with engine.connect() as aconn:
                    psycopg_connection(aconn.sync_connection)
            return {one, two}
        finally:
            await engine.dispose()

    ids = asyncio.run(main())
    assert q(conn, schema, "SELECT count(*) FROM {s}.orders")[0][0] == 2
    run_worker(pg_dsn, schema, conn, ids)


def run_worker(pg_dsn, schema, conn, ids):
    create_ledger(pg_dsn, schema)
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "1") as w:
        assert w.wait(60) == 0, w.logs()[-3000:]
    assert {r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.ledger WHERE event = 'run'")} == ids
