"""The console's gate over real HTTP against a real `pgworker web`: authentication,
roles, read-only mode, CSRF, same-site checks, response headers, rate-limited logins,
no action by GET, and the refusal to listen beyond loopback without credentials."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
from console_server import ConsoleServer, free_port
from worker import q

pytestmark = pytest.mark.integration

USERS = ("alice:operator:alice-secret-password\n"
         "vera:viewer:vera-secret-password\n"
         "adam:admin:adam-secret-password")
TOKENS = "script:operator:script-token-0123456789"
ALICE = ("alice", "alice-secret-password")
VERA = ("vera", "vera-secret-password")


def _dead_job(app, conn, task="dies"):
    job = app.enqueue(task, {"n": 1}, any_task=True)
    q(conn, app.settings.schema, "UPDATE {s}.jobs SET state = 'dead', finished_at = now(), "
      "last_error_code = 'PERMANENT' WHERE id = %s RETURNING id", job)
    return job


def _csrf(page: str) -> str:
    m = re.search(r'name="csrf_token" value="([^"]+)"', page)
    assert m, "the page has no CSRF token"
    return m.group(1)


def _state(app, conn, job):
    return q(conn, app.settings.schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job)[0][0]


@pytest.fixture
def console(app, pg_dsn):
    with ConsoleServer(pg_dsn, app.settings.schema, env={"PGWORKER_WEB_USERS": USERS,
                                                         "PGWORKER_WEB_TOKENS": TOKENS}) as server:
        yield server


def test_unauthenticated_requests_are_refused_everywhere(console, app, conn):
    job = _dead_job(app, conn)
    for path in ("/", "/jobs", f"/jobs/{job}", "/dead", "/schedules", "/workers", "/bulk", "/api/overview",
                 f"/api/jobs/{job}", "/events/overview"):
        r = console.get(path)
        assert r.status_code == 401, (path, r.status_code)
        assert "Basic" in r.headers["WWW-Authenticate"]
        assert "dies" not in r.text and '"n"' not in r.text  # nothing of the job leaks
    assert console.post(f"/jobs/{job}/replay").status_code == 401
    assert console.get("/", auth=("alice", "wrong-password-here")).status_code == 401
    assert console.get("/", headers={"Authorization": "Bearer not-the-token"}).status_code == 401
    assert _state(app, conn, job) == "dead"


def test_an_operator_replays_with_a_csrf_token_and_is_the_recorded_actor(console, app, conn):
    job = _dead_job(app, conn)
    page = console.get(f"/jobs/{job}", auth=ALICE)
    assert page.status_code == 200 and 'id="action-replay"' in page.text
    r = console.post(f"/jobs/{job}/replay", auth=ALICE, data={"csrf_token": _csrf(page.text)})
    assert r.status_code == 303, r.text
    assert _state(app, conn, job) == "pending"
    events = q(conn, app.settings.schema, "SELECT kind, actor FROM {s}.job_events WHERE job_id = %s", job)
    assert events == [("replayed", "alice")]
    assert "alice" in console.get(f"/jobs/{job}", auth=ALICE).text  # the audit trail on the page


def test_a_post_without_its_csrf_token_is_refused(console, app, conn):
    job = _dead_job(app, conn)
    page = console.get(f"/jobs/{job}", auth=ALICE).text
    token = _csrf(page)
    tampered = token[:-1] + ("0" if token[-1] != "0" else "1")  # always differs (a hex digest may hold no "a")
    for data in ({}, {"csrf_token": "1.forged"}, {"csrf_token": tampered}):
        r = console.post(f"/jobs/{job}/replay", auth=ALICE, data=data)
        assert r.status_code == 403 and "CSRF" in r.text, data
    # a token issued to another user is not alice's
    other = _csrf(console.get(f"/jobs/{job}", auth=("adam", "adam-secret-password")).text)
    assert console.post(f"/jobs/{job}/replay", auth=ALICE, data={"csrf_token": other}).status_code == 403
    # a cross-site form carrying a valid token is refused too
    r = console.post(f"/jobs/{job}/replay", auth=ALICE, data={"csrf_token": token},
                     headers={"Origin": "https://evil.example", "Sec-Fetch-Site": "cross-site"})
    assert r.status_code == 403
    assert _state(app, conn, job) == "dead"


def test_a_bearer_token_needs_no_csrf_token_and_no_action_is_reachable_by_get(console, app, conn):
    job = _dead_job(app, conn)
    auth = {"Authorization": "Bearer script-token-0123456789"}
    for verb in ("replay", "cancel", "discard", "retry"):
        assert console.get(f"/jobs/{job}/{verb}", headers=auth).status_code == 405
        assert console.get(f"/api/jobs/{job}/{verb}", headers=auth).status_code == 405
    assert console.get("/queues/default/pause", headers=auth).status_code == 405
    assert _state(app, conn, job) == "dead"
    r = console.post(f"/api/jobs/{job}/replay", headers=auth)
    assert r.status_code == 200 and r.json() == {"id": job, "action": "replay", "changed": True}
    assert _state(app, conn, job) == "pending"
    assert q(conn, app.settings.schema, "SELECT actor FROM {s}.job_events WHERE job_id = %s", job) == [("script",)]


def test_roles_decide_each_action(console, app, conn):
    job = _dead_job(app, conn)
    page = console.get(f"/jobs/{job}", auth=VERA)
    assert page.status_code == 200 and "action-replay" not in page.text and "csrf_token" not in page.text
    token = console.get("/api/csrf", auth=VERA).json()["token"]
    assert console.post(f"/jobs/{job}/replay", auth=VERA, data={"csrf_token": token}).status_code == 403
    assert console.post("/queues/default/pause", auth=VERA, data={"csrf_token": token}).status_code == 403
    # an operator pauses, an admin sets limits, an operator may not
    alice = console.get("/api/csrf", auth=ALICE).json()["token"]
    assert console.post("/queues/default/pause", auth=ALICE, data={"csrf_token": alice}).status_code == 303
    assert q(conn, app.settings.schema, "SELECT paused_by FROM {s}.queues WHERE name = 'default'") == [("alice",)]
    assert console.post("/queues/default/limits", auth=ALICE,
                        data={"csrf_token": alice, "concurrency": "3"}).status_code == 403
    adam = console.get("/api/csrf", auth=("adam", "adam-secret-password")).json()["token"]
    r = console.post("/queues/default/limits", auth=("adam", "adam-secret-password"),
                     data={"csrf_token": adam, "concurrency": "3", "rate": "", "aging": ""})
    assert r.status_code == 303, r.text
    assert q(conn, app.settings.schema, "SELECT concurrency_limit FROM {s}.queues WHERE name = 'default'") == [(3,)]
    assert _state(app, conn, job) == "dead"


def test_every_response_carries_the_security_headers(console, app, conn):
    job = _dead_job(app, conn)
    for path in ("/", f"/jobs/{job}", "/api/overview", "/nope"):
        r = console.get(path, auth=ALICE)
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "frame-ancestors 'none'" in csp, path
        assert r.headers["X-Content-Type-Options"] == "nosniff"
        assert r.headers["Referrer-Policy"] == "same-origin"
        assert r.headers["Cache-Control"] == "no-store"
    page = console.get("/", auth=ALICE).text
    assert not re.search(r"<script(?![^>]*\bsrc=)", page), "an inline script"
    assert not re.search(r"<[^>]+\son[a-z]+\s*=", page), "an inline event handler"


def test_failed_logins_are_rate_limited_per_client(console):
    for _ in range(5):
        assert console.get("/", auth=("alice", "not-the-password")).status_code == 401
    r = console.get("/", auth=ALICE)  # even the right password waits now
    assert r.status_code == 429 and int(r.headers["Retry-After"]) >= 1
    assert "alice-secret-password" not in r.text


def test_read_only_mode_hides_and_refuses_every_action(app, pg_dsn, conn):
    job = _dead_job(app, conn)
    pending = app.enqueue("quick", None, any_task=True, delay=3600)
    with ConsoleServer(pg_dsn, app.settings.schema, "--read-only",
                       env={"PGWORKER_WEB_TOKENS": "ops:admin:admin-token-0123456789"}) as console:
        auth = {"Authorization": "Bearer admin-token-0123456789"}
        for path in ("/", f"/jobs/{job}", f"/jobs/{pending}", "/dead", "/dead?task=dies&error_code=PERMANENT",
                     "/jobs?state=dead"):
            page = console.get(path, headers=auth)
            assert page.status_code == 200 and 'id="read-only"' in page.text, path
            # apart from the user's name, not "read-onlyops (admin)" (a new user's trial)
            assert re.search(r'>read-only</span>\s+<span id="principal">ops <', page.text), path
            assert "<form method=\"post\"" not in page.text, path
            assert "/bulk/new" not in page.text, path
        refused = [console.post(f"/jobs/{job}/replay", headers=auth), console.post(f"/jobs/{job}/discard", headers=auth),
                   console.post(f"/jobs/{pending}/retry", headers=auth), console.post(f"/jobs/{pending}/cancel", headers=auth),
                   console.post("/queues/default/pause", headers=auth),
                   console.post("/queues/default/limits", headers=auth, data={"concurrency": "2"}),
                   console.post("/bulk", headers=auth, data={"kind": "replay", "state": "dead"}),
                   console.post("/api/bulk", headers=auth, json={"kind": "replay", "filter": {}}),
                   console.post(f"/api/jobs/{job}/replay", headers=auth)]
        assert [r.status_code for r in refused] == [403] * len(refused)
        assert all("read-only" in r.text for r in refused)
        assert console.get("/bulk/new?kind=replay&state=dead", headers=auth).status_code == 403
    assert _state(app, conn, job) == "dead" and _state(app, conn, pending) == "pending"
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.job_events") == [(0,)]
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.queues") == [(0,)]
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]


def test_beyond_loopback_without_credentials_is_refused_with_the_fix(app, pg_dsn):
    env = {"PGWORKER_DSN": pg_dsn, "PGWORKER_SCHEMA": app.settings.schema, "PGWORKER_WEB_USERS": "",
           "PGWORKER_WEB_TOKENS": ""}
    import os

    r = subprocess.run([sys.executable, "-m", "pgworker.cli", "web", "--host", "0.0.0.0", "--port", str(free_port())],
                       env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 1
    assert "refusing to serve the console on '0.0.0.0' without authentication" in r.stderr
    assert "PGWORKER_WEB_USERS" in r.stderr and "127.0.0.1" in r.stderr


def test_no_secret_reaches_a_page(app, pg_dsn, conn):
    """The DSN's password, a redacted payload field and the credentials stay out of pages."""
    job = app.enqueue("quick", {"user": "u1", "password": "hunter2-payload-secret",
                                "nested": {"api_key": "sk-live-payload-secret"}}, any_task=True)
    with ConsoleServer(pg_dsn, app.settings.schema, env={"PGWORKER_WEB_USERS": USERS}) as console:
        texts = [console.get(p, auth=ALICE).text for p in (f"/jobs/{job}", f"/api/jobs/{job}", "/", "/jobs")]
        logs = console.logs()
    for text in texts + [logs]:
        assert "hunter2-payload-secret" not in text and "sk-live-payload-secret" not in text
        assert "alice-secret-password" not in text
    assert "[redacted]" in texts[0] and "u1" in texts[0] and '"password":"[redacted]"' in texts[1]
