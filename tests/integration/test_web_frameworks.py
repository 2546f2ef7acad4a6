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
