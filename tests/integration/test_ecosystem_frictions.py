"""A new user's trial of the Python ecosystem side (SQLAlchemy, asyncio, Django's
neighbours), against a real PostgreSQL: each mistake it made gets a TypeError or
ConfigError naming the fix, where psycopg once failed later with "'coroutine' object has
no attribute 'cursor'" or a message named the wrong call."""

from __future__ import annotations

import asyncio

import psycopg
import pytest

from pg import sqlalchemy_url

import pgworker
from pgworker.contrib.sqlalchemy import async_psycopg_connection, psycopg_connection

pytestmark = pytest.mark.integration

sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is a test dependency (pip install -e '.[test]')")
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine  # noqa: E402
from sqlalchemy.orm import Session  # noqa: E402


url = sqlalchemy_url


def test_sqlalchemy_objects_passed_where_they_do_not_fit_name_the_fix(app, pg_dsn):
    engine = sqlalchemy.create_engine(url(pg_dsn))
    async_engine = create_async_engine(url(pg_dsn))
    try:
        with pytest.raises(TypeError, match=r"an Engine holds no transaction to join.*engine.begin\(\)"):
            psycopg_connection(engine)
        with pytest.raises(TypeError, match=r"asyncio SQLAlchemy object: use `await async_psycopg_connection"):
            psycopg_connection(AsyncSession(async_engine))
        with engine.connect() as sa_conn:
            with pytest.raises(TypeError, match=r"conn is a SQLAlchemy Connection: .*conn=psycopg_connection"):
                app.enqueue("t", None, conn=sa_conn, any_task=True)
        with Session(engine) as session:
            with pytest.raises(TypeError, match=r"synchronous SQLAlchemy object: use `psycopg_connection"):
                asyncio.run(async_psycopg_connection(session))
        with pytest.raises(TypeError, match=r"pass a SQLAlchemy Session or Connection .*not a builtins.str"):
            psycopg_connection("postgresql://")
    finally:
        engine.dispose()
        asyncio.run(async_engine.dispose())
    assert app.list_jobs() == []


def test_async_mistakes_name_the_right_call(app, pg_dsn):
    job = app.enqueue("t", None, any_task=True)

    async def main() -> None:
        aconn = await psycopg.AsyncConnection.connect(pg_dsn, autocommit=True)
        try:
            with pytest.raises(TypeError, match=r"app.result -> await app.aresult"):
                app.result(job, conn=aconn)  # type: ignore[arg-type]
            forgotten = psycopg.AsyncConnection.connect(pg_dsn)  # no await
            with pytest.raises(TypeError, match=r"conn is a coroutine: a call to await was not awaited"):
                await app.aenqueue("t", None, conn=forgotten, any_task=True)  # type: ignore[arg-type]
            with pytest.raises(pgworker.ResultNotReady, match=r"await App.await_result waits for it"):
                await app.aresult(job)
        finally:
            await aconn.close()
            await app.aclose()

    asyncio.run(main())
    with pytest.raises(pgworker.ResultNotReady, match=r"\(App.wait_result waits for it"):
        app.result(job)


def test_a_sqlalchemy_url_as_dsn_and_a_three_item_tuple_name_the_fix(app, pg_dsn):
    with pytest.raises(pgworker.ConfigError, match=r"SQLAlchemy's URL form; .*drop '\+psycopg'"):
        pgworker.App(url(pg_dsn))
    with pytest.raises(pgworker.InvalidJob, match=r"got a tuple of 3 items; give options as JobSpec"):
        app.enqueue_many([("t", None, {"delay": 5})])


def test_aopen_checks_the_schema_as_a_lifespan_start_expects(app, pg_dsn, conn):
    """The README's FastAPI lifespan opens the App with aopen(): a schema never migrated
    passed it, and the first request failed (a trial)."""
    from psycopg import sql

    unmigrated = pgworker.App(pg_dsn, schema=f"{app.settings.schema}_none")
    behind = pgworker.App(pg_dsn, schema=app.settings.schema)

    from pgworker import connections

    connections._SCHEMAS_SEEN.clear()  # the names another test looked up are kept a minute

    async def main() -> None:
        try:
            with pytest.raises(pgworker.SchemaNotMigrated, match=r"pgworker migrate") as missing:
                await unmigrated.aopen()
            # the database's pgworker schemas named, as App.check_schema and the CLI do (a
            # trial read only 'relation "..._none.migrations" does not exist')
            assert "pgworker schemas in this database: " in str(missing.value), missing.value
            assert f"did you mean {app.settings.schema!r}?" in str(missing.value), missing.value
            await behind.aopen()  # migrated: opens
            await behind.aopen()  # idempotent
        finally:
            await unmigrated.aclose()
            await behind.aclose()

    asyncio.run(main())
    conn.execute(sql.SQL("UPDATE {}.migrations SET version = version + 100 WHERE version = "
                         "(SELECT max(version) FROM {}.migrations)").format(
        sql.Identifier(app.settings.schema), sql.Identifier(app.settings.schema)))

    async def too_new() -> None:
        try:
            with pytest.raises(pgworker.SchemaTooNew, match=r"upgrade pgworker"):
                await behind.aopen()
        finally:
            await behind.aclose()

    asyncio.run(too_new())


def test_a_blocking_wait_inside_an_event_loop_warns_naming_await_result(app):
    """App.wait_result called from a coroutine froze the loop in silence (a trial)."""
    job = app.enqueue("t", None, any_task=True)

    async def main() -> None:
        with pytest.warns(RuntimeWarning, match=r"blocks this thread's running event loop.*await app.await_result"):
            with pytest.raises(pgworker.ResultTimeout):
                app.wait_result(job, timeout=0.05)

    asyncio.run(main())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # outside a loop: no warning
        with pytest.raises(pgworker.ResultTimeout):
            app.wait_result(job, timeout=0.05)


def test_other_things_given_as_conn_name_the_fix(app, pg_dsn):
    """A break-it trial: a pool, a DSN, a cursor and a task still failed inside psycopg."""
    from psycopg_pool import ConnectionPool

    pool = ConnectionPool(pg_dsn, open=False)
    with psycopg.connect(pg_dsn) as raw:
        for given, said in ((pool, r"ConnectionPool: pass one of its connections.*with pool.connection\(\) as conn"),
                            (pg_dsn, r"conn is a string: pass a psycopg connection \(a DSN goes to App\(dsn\)"),
                            (raw.cursor(), r"conn is a psycopg cursor: pass its connection, conn=cur.connection"),
                            (object(), r"conn must be a psycopg connection .* got a builtins.object")):
            with pytest.raises(TypeError, match=said):
                app.enqueue("t", None, conn=given, any_task=True)  # type: ignore[arg-type]

    async def main() -> None:
        task = asyncio.ensure_future(asyncio.sleep(0))
        with pytest.raises(TypeError, match=r"conn is an asyncio Task: await it"):
            await app.aenqueue("t", None, conn=task, any_task=True)  # type: ignore[arg-type]
        await task
        await app.aclose()

    asyncio.run(main())
    assert app.list_jobs() == []


def test_async_scoped_session_and_async_engine_get_the_async_recipe(app, pg_dsn):
    from sqlalchemy.ext.asyncio import async_scoped_session, async_sessionmaker

    async def main() -> None:
        engine = create_async_engine(url(pg_dsn))
        scoped = async_scoped_session(async_sessionmaker(engine), scopefunc=asyncio.current_task)
        try:
            async with scoped.begin():
                conn = await async_psycopg_connection(scoped)
                job = await app.aenqueue("t", None, conn=conn, any_task=True)
            assert (await app.aget_job(job))["state"] == "pending"
            with pytest.raises(TypeError, match=r"an AsyncEngine holds no transaction .*async with engine.begin"):
                await async_psycopg_connection(engine)
        finally:
            await scoped.remove()
            await engine.dispose()
            await app.aclose()

    asyncio.run(main())
