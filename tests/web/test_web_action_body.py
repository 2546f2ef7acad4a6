"""The body of the console's actions, over real HTTP against a real `pgworker web`: the
JSON API's job actions read theirs (a cancel's or a discard's reason is kept in the
audit trail, as `pgworker cancel --reason` keeps it; a key an action does not read, a
body that is not a JSON object, is refused with a 400 and nothing changes: a misspelt
"reasn" cancelled the job and dropped the reason), and the job page's cancel and discard
forms take a reason, shown escaped in the page's audit trail. A bulk cancel or discard
takes one too, from the API's body and the confirmation's form: refused over the same
limit with the same words, kept on the operation (its page and API show it, escaped)
and in each changed job's audit entry."""

from __future__ import annotations

import pytest
from console_server import ADMIN_AUTH, ConsoleServer
from pg import wait_until
from worker import q

pytestmark = pytest.mark.integration

AUTH = ADMIN_AUTH



def _dead(app, conn):
    job = app.enqueue("wanted", {"n": 1}, any_task=True)
    q(conn, app.settings.schema, "UPDATE {s}.jobs SET state = 'dead', finished_at = now(), "
      "last_error_code = 'PERMANENT' WHERE id = %s RETURNING id", job)
    return job


def _later(app):
    """A pending job due in an hour: cancel and retry (now) both apply to it."""
    return app.enqueue("wanted", {"n": 1}, any_task=True, delay=3600)


def _state(app, conn, job):
    return q(conn, app.settings.schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job)[0][0]


def _events(app, conn, job):
    return q(conn, app.settings.schema, "SELECT kind, actor, detail FROM {s}.job_events WHERE job_id = %s "
             "ORDER BY id", job)


@pytest.mark.parametrize("verb, make, body, said", [
    ("cancel", _later, {"reasn": "x"}, "did you mean 'reason'?"),
    ("cancel", _later, {"reason": "x", "force": True}, "'force'"),
    ("discard", _dead, {"resaon": "x"}, "did you mean 'reason'?"),
    ("replay", _dead, {"reason": "x"}, "a reason is kept by cancel and discard only"),
    ("retry", _later, {"now": True}, "'now'"),
    ("cancel", _later, {"reason": 42}, "reason must be a string"),
    ("cancel", _later, ["reason", "x"], "must be a JSON object ({...}), not an array"),
    ("cancel", _later, "not json {", "is not JSON"),
])
def test_a_job_action_refuses_a_body_it_does_not_read_and_changes_nothing(console, app, conn, verb, make, body,
                                                                          said):
    job = make(app) if make is _later else make(app, conn)
    before = _state(app, conn, job)
    if isinstance(body, str):
        r = console.post(f"/api/jobs/{job}/{verb}", headers={**AUTH, "Content-Type": "application/json"}, data=body)
    else:
        r = console.post(f"/api/jobs/{job}/{verb}", headers=AUTH, json=body)
    assert r.status_code == 400, r.text
    assert said in r.json()["error"] and "nothing was changed" in r.json()["error"], r.text
    assert _state(app, conn, job) == before
    assert _events(app, conn, job) == []


def test_an_action_on_a_job_that_does_not_exist_is_a_404_as_its_read_is(console, app, conn):
    """A trial: POST /api/jobs/999999/replay answered 200 {"changed": false} (as for a job
    not in a state for it) while GET /api/jobs/999999 said 404. An id past a bigint too
    (the route takes any digits): 404, not a server error."""
    dead = _dead(app, conn)
    for job_id in (dead + 1000, 2**63, 10**30):
        for verb in ("replay", "cancel", "retry", "discard"):
            r = console.post(f"/api/jobs/{job_id}/{verb}", headers=AUTH, json={})
            assert r.status_code == 404 and r.json() == {"error": "no such job"}, (job_id, verb, r.text)
        assert console.get(f"/api/jobs/{job_id}", headers=AUTH).status_code == 404
        assert console.get(f"/jobs/{job_id}", headers=AUTH).status_code == 404
    # a job that exists but is not in a state for it: 200, unchanged, as before
    r = console.post(f"/api/jobs/{dead}/retry", headers=AUTH, json={})
    assert r.status_code == 200 and r.json() == {"id": dead, "action": "retry", "changed": False}, r.text


def test_a_cancel_reason_sent_to_the_api_is_kept_and_shown_on_the_job_page(console, app, conn):
    job = _later(app)
    r = console.post(f"/api/jobs/{job}/cancel", headers=AUTH, json={"reason": "  web <b>replay</b>  "})
    assert r.status_code == 200 and r.json() == {"id": job, "action": "cancel", "changed": True}, r.text
    assert _state(app, conn, job) == "cancelled"
    assert _events(app, conn, job) == [("cancelled", "ops", {"reason": "web <b>replay</b>"})]
    page = console.get(f"/jobs/{job}", headers=AUTH)
    assert 'class="reason">web &lt;b&gt;replay&lt;/b&gt;</span>' in page.text, page.text
    assert "<b>replay</b>" not in page.text
    detail = console.get(f"/api/jobs/{job}", headers=AUTH).json()["job"]["events"][0]["detail"]
    assert detail == {"reason": "web <b>replay</b>"}


def test_a_discard_reason_is_kept_and_a_long_one_refused_as_the_cli_refuses_it(console, app, conn):
    job = _dead(app, conn)
    r = console.post(f"/api/jobs/{job}/discard", headers=AUTH, json={"reason": "x" * 501})
    assert r.status_code == 400 and "501 characters long, the limit is 500" in r.text, r.text
    assert _events(app, conn, job) == []  # nothing changed
    r = console.post(f"/api/jobs/{job}/discard", headers=AUTH, json={"reason": "x" * 500})
    assert r.status_code == 200 and r.json()["changed"] is True, r.text
    [(kind, _, detail)] = _events(app, conn, job)
    assert kind == "cancelled" and detail == {"reason": "x" * 500}


@pytest.mark.parametrize("body", [None, "", "{}", '{"reason": null}', '{"reason": "   "}'])
def test_no_body_an_empty_object_or_no_reason_cancels_without_a_reason(console, app, conn, body):
    job = _later(app)
    kw = {} if body is None else {"data": body, "headers": {**AUTH, "Content-Type": "application/json"}}
    r = console.post(f"/api/jobs/{job}/cancel", **({"headers": AUTH} | kw))
    assert r.status_code == 200 and r.json()["changed"] is True, r.text
    assert _events(app, conn, job) == [("cancelled", "ops", None)]


def test_queue_and_bulk_actions_without_keys_refuse_one(console, app, conn):
    r = console.post("/api/queues/emails/pause", headers=AUTH, json={"reason": "maintenance"})
    assert r.status_code == 400 and "pause reads no key" in r.json()["error"], r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.queues WHERE name = 'emails'") == [(0,)]
    assert console.post("/api/queues/emails/pause", headers=AUTH, json={}).status_code == 200
    r = console.post("/api/queues/emails/resume", headers=AUTH, json={"force": True})
    assert r.status_code == 400, r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.queues WHERE name = 'emails' "
             "AND paused_at IS NOT NULL") == [(1,)]
    assert console.post("/api/queues/emails/resume", headers=AUTH).status_code == 200
    r = console.post("/api/bulk/1/cancel", headers=AUTH, json={"reason": "x"})
    assert r.status_code == 400, r.text
    r = console.post("/api/queues/emails/limits", headers=AUTH, json={})  # sets nothing: refused as before
    assert r.status_code == 400 and "at least one of concurrency" in r.json()["error"], r.text


def test_a_bulk_filter_key_given_empty_is_refused_not_read_as_every_job(console, app, conn):
    """A break-it trial: {"kind": "replay", "filter": {"state": "dead", "graph": "   "}}
    was read as {"state": "dead"} and replayed every dead job of the schema."""
    dead = _dead(app, conn)
    for graph in ("   ", "", None):
        r = console.post("/api/bulk", headers=AUTH, json={"kind": "replay", "filter": {"state": "dead", "graph": graph}})
        assert r.status_code == 400, r.text
        assert "filter key 'graph' is empty (null or blank)" in r.json()["error"] and \
            "nothing was started" in r.json()["error"], r.text
    assert _state(app, conn, dead) == "dead"
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]


def test_the_reported_request_with_a_csrf_token_is_refused_then_the_right_one_kept(app, pg_dsn, conn):
    """The report: the loopback console's local operator, X-CSRF-Token, {"reasn": "x"}."""
    job = _later(app)
    with ConsoleServer(pg_dsn, app.settings.schema) as console:  # loopback, no credentials
        token = console.get("/api/csrf").json()["token"]
        headers = {"X-CSRF-Token": token}
        r = console.post(f"/api/jobs/{job}/cancel", headers=headers, json={"reasn": "x"})
        assert r.status_code == 400 and "did you mean 'reason'?" in r.json()["error"], r.text
        assert _state(app, conn, job) == "pending" and _events(app, conn, job) == []
        assert console.post(f"/api/jobs/{job}/cancel", json={"reason": "web replay"}).status_code == 403
        assert _state(app, conn, job) == "pending"  # the CSRF rule is as it was
        r = console.post(f"/api/jobs/{job}/cancel", headers=headers, json={"reason": "web replay"})
        assert r.status_code == 200 and r.json()["changed"] is True, r.text
        assert [e[2] for e in _events(app, conn, job)] == [{"reason": "web replay"}]
        # a form (its token in a csrf_token field) is no JSON body: refused, not a 500
        other = _later(app)
        r = console.post(f"/api/jobs/{other}/cancel", data={"csrf_token": token, "reason": "x"})
        assert r.status_code == 400 and "the API reads a JSON object" in r.json()["error"], r.text
        assert _state(app, conn, other) == "pending"


def test_the_job_pages_cancel_and_discard_forms_take_a_reason(console, app, conn):
    later, dead = _later(app), _dead(app, conn)
    page = console.get(f"/jobs/{later}", headers=AUTH).text
    assert 'name="reason" id="reason-cancel" maxlength="500"' in page, page
    r = console.post(f"/jobs/{later}/cancel", headers=AUTH, data={"reason": "<i>dup</i> of 4"})
    assert r.status_code == 303 and r.headers["location"].endswith("done=cancel"), r.text
    assert _events(app, conn, later) == [("cancelled", "ops", {"reason": "<i>dup</i> of 4"})]
    assert "&lt;i&gt;dup&lt;/i&gt; of 4" in console.get(f"/jobs/{later}", headers=AUTH).text
    assert 'id="reason-discard"' in console.get(f"/jobs/{dead}", headers=AUTH).text
    # a form posted past its field's maxlength is refused, as the API refuses it (App.cancel cut it)
    r = console.post(f"/jobs/{dead}/discard", headers=AUTH, data={"reason": "z" * 501})
    assert r.status_code == 400 and "the limit is 500" in r.text and _events(app, conn, dead) == []
    r = console.post(f"/jobs/{dead}/discard", headers=AUTH, data={"reason": ""})
    assert r.status_code == 303 and _events(app, conn, dead) == [("cancelled", "ops", None)]


def _bulk_done(app, conn, op_id):
    wait_until(lambda: q(conn, app.settings.schema, "SELECT state FROM {s}.bulk_operations WHERE id = %s",
                         op_id) == [("done",)], timeout=30, message=f"bulk operation {op_id} to finish")


def test_a_bulk_cancels_reason_sent_to_the_api_is_kept_and_a_long_one_refused(console, app, conn):
    jobs = [_later(app) for _ in range(3)]
    body = {"kind": "cancel", "filter": {"task": "wanted"}}
    for bad, said in ((dict(body, reason="x" * 501), "the reason is 501 characters long, the limit is 500"),
                      (dict(body, reason=["x"]), "reason must be a string"),
                      (dict(body, reasn="x"), "did you mean 'reason'?"),
                      ({"kind": "replay", "filter": {}, "reason": "x"}, "a bulk replay keeps no reason")):
        r = console.post("/api/bulk", headers=AUTH, json=bad)
        assert r.status_code == 400 and said in r.json()["error"], r.text
        assert "nothing was changed" in r.json()["error"], r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]
    r = console.post("/api/bulk", headers=AUTH, json=dict(body, reason="  <b>dup</b> of deploy 12 "))
    assert r.status_code == 201 and r.json()["reason"] == "<b>dup</b> of deploy 12", r.text
    op_id = r.json()["id"]
    _bulk_done(app, conn, op_id)
    for job in jobs:
        assert _events(app, conn, job) == [("cancelled", f"ops (bulk operation {op_id})",
                                            {"reason": "<b>dup</b> of deploy 12"})]
    assert console.get(f"/api/bulk/{op_id}", headers=AUTH).json()["op"]["reason"] == "<b>dup</b> of deploy 12"
    assert console.get("/api/bulk", headers=AUTH).json()["operations"][0]["reason"] == "<b>dup</b> of deploy 12"
    page = console.get(f"/bulk/{op_id}", headers=AUTH).text
    assert 'id="op-reason">&lt;b&gt;dup&lt;/b&gt; of deploy 12</span>' in page, page
    assert "<b>dup</b>" not in page


def test_the_bulk_confirmation_form_takes_a_reason_for_a_discard_and_refuses_a_long_one(console, app, conn):
    dead = [_dead(app, conn) for _ in range(2)]
    page = console.get("/bulk/new?kind=discard&state=dead&task=wanted", headers=AUTH).text
    assert 'name="reason" id="bulk-reason" maxlength="500"' in page, page
    assert 'id="bulk-reason"' not in console.get("/bulk/new?kind=replay&state=dead&task=wanted", headers=AUTH).text
    form = {"kind": "discard", "state": "dead", "task": "wanted", "expected": "2"}
    r = console.post("/bulk", headers=AUTH, data=dict(form, reason="y" * 501))
    assert r.status_code == 400 and "the reason is 501 characters long, the limit is 500" in r.text, r.text
    assert "y" * 501 not in r.text
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]
    r = console.post("/bulk", headers=AUTH, data=dict(form, reason="<i>poison</i> batch"))
    assert r.status_code == 303, r.text
    op_id = int(r.headers["location"].rsplit("/", 1)[1])
    _bulk_done(app, conn, op_id)
    for job in dead:
        assert _events(app, conn, job) == [("cancelled", f"ops (bulk operation {op_id})",
                                            {"reason": "<i>poison</i> batch"})]
    page = console.get(f"/bulk/{op_id}", headers=AUTH).text
    assert "&lt;i&gt;poison&lt;/i&gt; batch" in page and "<i>poison</i>" not in page, page
