"""The job page's steps and effects section (issue 20), through a real `pgworker web`:
names, statuses and keys shown; results redacted like the payload, on the page and in
the API."""

from __future__ import annotations

import pytest
from console_server import ConsoleServer
from psycopg import sql

pytestmark = pytest.mark.integration


def test_the_job_page_shows_steps_and_effects_with_results_redacted(app, pg_dsn, conn):
    schema = app.settings.schema
    job = app.enqueue("pay", {"n": 1}, any_task=True)
    conn.execute(sql.SQL("UPDATE {}.jobs SET state = 'dead', finished_at = now(), last_error_code = "
                         "'EFFECT_UNCERTAIN' WHERE id = %s").format(sql.Identifier(schema)), [job])
    conn.execute(sql.SQL("INSERT INTO {}.job_steps (job_id, name, kind, status, result, idempotency_key, attempt, "
                         "lease_token, finished_at) VALUES (%s, 'quote', 'step', 'done', %s, NULL, 1, 1, now()), "
                         "(%s, 'charge', 'effect', 'started', NULL, 'pgw-key:charge', 1, 1, NULL)")
                 .format(sql.Identifier(schema)),
                 [job, '{"cents": 1250, "api_key": "sk_live_hidden"}', job])
    with ConsoleServer(pg_dsn, schema).wait_ready() as server:
        page = server.get(f"/jobs/{job}")
        api = server.get(f"/api/jobs/{job}")
    assert page.status_code == 200 and api.status_code == 200
    assert "Steps and effects" in page.text and "quote" in page.text and "pgw-key:charge" in page.text
    assert "started, no end recorded" in page.text and "pgworker effects resolve" in page.text
    assert "1250" in page.text
    assert "sk_live_hidden" not in page.text and "sk_live_hidden" not in api.text
    steps = api.json()["job"]["steps"]
    assert sorted(s["name"] for s in steps) == ["charge", "quote"]  # same statement: by name
