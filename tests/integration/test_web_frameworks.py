"""pgworker inside web frameworks, against a real PostgreSQL and a real worker:
a FastAPI service (tests/apps/fastapi_app.py) driven through an HTTP client (Starlette's
TestClient, which runs the lifespan), enqueueing in each request's transaction."""

from __future__ import annotations

import pytest
from psycopg import sql

from pgworker import App
from pg import make_settings
from worker import Worker, create_ledger, q

pytestmark = pytest.mark.integration

fastapi = pytest.importorskip("fastapi", reason="FastAPI is a test dependency (pip install -e '.[test]')")
from fastapi.testclient import TestClient  # noqa: E402

from apps.fastapi_app import create_app  # noqa: E402


def test_fastapi_enqueues_in_the_requests_transaction(app, pg_dsn, conn):
    schema = app.settings.schema
    create_ledger(pg_dsn, schema)
    conn.execute(sql.SQL("CREATE TABLE {}.orders (id serial PRIMARY KEY, item text NOT NULL)").format(
        sql.Identifier(schema)))
    producer = App(settings=make_settings(pg_dsn, schema))  # a pure producer, as a web service is
    api = create_app(pg_dsn, schema, producer)
    with TestClient(api) as client:
        assert producer._apool is not None  # opened by the lifespan's startup
        refused = client.post("/orders", json={"item": "x", "refuse": True})
        assert refused.status_code == 409
        assert q(conn, schema, "SELECT count(*) FROM {s}.orders")[0][0] == 0  # rolled back: no order
        assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 0  # and no job
        made = [client.post("/orders", json={"item": f"item {i}"}).json() for i in range(3)]
        assert client.get(f"/jobs/{made[0]['job']}").json() == {"state": "pending", "attempts": 0}
        assert client.get("/jobs/999999").status_code == 404
        cancelled = client.post("/orders", json={"item": "cancel me"}).json()
        assert client.post(f"/jobs/{cancelled['job']}/cancel").json() == {"state": "cancelled"}
    assert producer._apool is None  # closed by the lifespan's shutdown
    with Worker(pg_dsn, schema, "--drain", "--concurrency", "2") as w:
        assert w.wait(60) == 0, w.logs()[-3000:]
    ran = {r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.ledger WHERE event = 'run'")}
    assert ran == {m["job"] for m in made}
    for m in made:
        assert app.get_job(m["job"])["payload"] == {"order": m["order"]}


def test_a_wrong_dsn_fails_the_services_start_and_leaves_no_pool_open(app, pg_dsn):
    """A new user's trial: the README's lifespan opened the service's own pool, then
    `aopen()` raised for a wrong DSN, the pool stayed open retrying, and the process never
    exited (uvicorn said "Application startup failed" and hung). The lifespan of the README
    and of tests/apps/fastapi_app.py closes what it opened: the start fails at once with
    pgworker's error, and nothing is left running."""
    import psycopg_pool

    from pgworker import DatabaseRefused

    wrong = App(dsn=pg_dsn.rsplit("/", 1)[0] + "/no_such_database_here", schema=app.settings.schema)
    api = create_app(pg_dsn, app.settings.schema, wrong)
    opened: list[psycopg_pool.AsyncConnectionPool] = []
    real_open = psycopg_pool.AsyncConnectionPool.open

    async def tracked_open(self, *args, **kwargs):  # the service's own pool, if it is ever opened
        opened.append(self)
        return await real_open(self, *args, **kwargs)

    psycopg_pool.AsyncConnectionPool.open = tracked_open  # type: ignore[method-assign]
    try:
        with pytest.raises(DatabaseRefused, match="no_such_database_here"):
            with TestClient(api):
                pass
    finally:
        psycopg_pool.AsyncConnectionPool.open = real_open  # type: ignore[method-assign]
    assert wrong._apool is None
    assert all(p.closed for p in opened), "a pool the lifespan opened is still open"
