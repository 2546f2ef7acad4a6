"""What the JSON API does with a request a script got wrong: a misspelt key of a bulk
operation's body or filter, or of a queue's limits, is refused with the closest key
(dropped, it widened a replay to every dead job, or set nothing), and nothing changes."""

from __future__ import annotations

import pytest
from console_server import ADMIN_AUTH, ConsoleServer
from worker import q

pytestmark = pytest.mark.integration

AUTH = ADMIN_AUTH



def _dead(app, conn, task):
    job = app.enqueue(task, {"n": 1}, any_task=True)
    q(conn, app.settings.schema, "UPDATE {s}.jobs SET state = 'dead', finished_at = now(), "
      "last_error_code = 'PERMANENT' WHERE id = %s RETURNING id", job)
    return job


@pytest.mark.parametrize("body, named, fix", [
    ({"kind": "replay", "filter": {"state": "dead", "tsk": "wanted"}}, "'tsk'", "did you mean 'task'?"),
    ({"kind": "replay", "fitler": {"task": "wanted"}}, "'fitler'", "did you mean 'filter'?"),
    ({"kind": "discard", "filter": {"task": "wanted", "error": "PERMANENT"}}, "'error'", "did you mean 'error_code'?"),
])
def test_a_misspelt_bulk_key_is_refused_and_nothing_is_replayed(console, app, conn, body, named, fix):
    wanted, other = _dead(app, conn, "wanted"), _dead(app, conn, "other")
    r = console.post("/api/bulk", headers=AUTH, json=body)
    assert r.status_code == 400, r.text
    assert named in r.json()["error"] and fix in r.json()["error"], r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]
    states = q(conn, app.settings.schema, "SELECT state::text FROM {s}.jobs WHERE id IN (%s, %s)", wanted, other)
    assert states == [("dead",), ("dead",)]


def test_a_null_filter_value_is_refused_not_read_as_the_text_none_or_as_any(console, app, conn):
    """It once matched the queue named 'None'; then any queue, which widens a bulk
    operation a script meant to narrow (a break-it trial): refused, nothing started."""
    _dead(app, conn, "wanted")
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "replay", "filter": {"task": "wanted", "queue": None}})
    assert r.status_code == 400 and "filter key 'queue' is empty" in r.json()["error"], r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "replay", "filter": {"task": "wanted"}})
    assert r.status_code == 201 and r.json()["filter"] == {"task": "wanted", "state": "dead"}, r.text


def test_a_misspelt_limit_is_refused_instead_of_setting_nothing(console, app, conn):
    r = console.post("/api/queues/emails/limits", headers=AUTH, json={"concurency": 5})
    assert r.status_code == 400 and "did you mean 'concurrency'?" in r.json()["error"], r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.queues WHERE name = 'emails'") == [(0,)]
    r = console.post("/api/queues/emails/limits", headers=AUTH, json={"concurrency": 5})
    assert r.status_code == 200, r.text


def test_a_script_without_a_csrf_token_is_told_where_to_get_one(app, pg_dsn, conn):
    """The local operator's script was told to "reload the page"."""
    job = _dead(app, conn, "wanted")
    with ConsoleServer(pg_dsn, app.settings.schema) as console:  # loopback, no credentials
        r = console.post(f"/api/jobs/{job}/replay")
        assert r.status_code == 403 and "GET /api/csrf" in r.json()["error"] and "X-CSRF-Token" in r.json()["error"]
        token = console.get("/api/csrf").json()["token"]
        r = console.post(f"/api/jobs/{job}/replay", headers={"X-CSRF-Token": token})
        assert r.status_code == 200 and r.json()["changed"] is True, r.text
        page = console.post(f"/jobs/{job}/replay")
        assert page.status_code == 403 and "reload the page" in page.text


def test_a_misspelt_list_filter_is_refused_instead_of_listing_every_job(console, app, conn):
    _dead(app, conn, "wanted")
    r = console.get("/api/jobs?tsk=wanted", headers=AUTH)
    assert r.status_code == 400 and "did you mean 'task'?" in r.json()["error"], r.text
    assert "nothing was changed" not in r.json()["error"]  # a read: it changes nothing anyway
    r = console.get("/api/jobs?task=wanted&sort=newest&cursor=", headers=AUTH)
    assert r.status_code == 200 and [j["task"] for j in r.json()["jobs"]] == ["wanted"], r.text


def test_the_html_job_list_refuses_unknown_query_keys(console, app, conn):
    """A misspelt key listed every job as if it matched: the HTML list refuses it as the
    API does; the keys of its own form still work (graph among them: test_web_graph_filter.py)."""
    _dead(app, conn, "wanted")
    r = console.get("/jobs?tsk=wanted", headers=AUTH)
    assert r.status_code == 400 and ("did you mean &#39;task&#39;?" in r.text or "did you mean 'task'?" in r.text), \
        r.text
    r = console.get("/jobs?task=wanted&sort=newest&cursor=&id=&graph=", headers=AUTH)
    assert r.status_code == 200 and "wanted" in r.text


@pytest.mark.parametrize("typed", ["\u0661\u0663", "\uff11\uff13", "1_3", "0", str(2**63)])
def test_the_jump_to_a_job_takes_plain_ascii_digits(console, typed):
    """str.isdigit() passed Arabic-Indic and fullwidth digits, and int() read them: typing
    "١٣" opened job 13; an out-of-range id reached the database."""
    r = console.get("/jobs", params={"id": typed}, headers=AUTH, allow_redirects=False)
    assert r.status_code == 400, (r.status_code, r.text[:300])
    assert "write ids as plain digits 0-9" in r.text or "ids are 1 to 2**63-1" in r.text, r.text[:2000]
    r = console.get("/jobs", params={"id": "#13"}, headers=AUTH, allow_redirects=False)
    assert r.status_code in (302, 303) and r.headers["location"].endswith("/jobs/13"), r.status_code


def test_a_cancel_reason_is_shown_escaped_on_the_job_page(console, app, conn):
    """An operator's cancel reason is kept in the audit trail and shown as text, never HTML."""
    job = app.enqueue("wanted", {})
    assert app.cancel(job, reason="<script>window.__pwned = 1</script>") == "cancelled"
    r = console.get(f"/jobs/{job}", headers=AUTH)
    assert r.status_code == 200 and "window.__pwned" in r.text, r.text
    assert "<script>window.__pwned" not in r.text
