"""What a bulk operation, and the job list, do with a filter a break-it trial got wrong:
no filter at all (it cancelled every job, unasked), a value of the wrong type (stored as
Python's printed form), an age or a payload PostgreSQL cannot read (a 500, a 503); and
the confirmation's count, which must count the jobs the operation changes, no others."""

from __future__ import annotations

import json

import pytest
from console_server import ADMIN_AUTH
from worker import q

pytestmark = pytest.mark.integration

AUTH = ADMIN_AUTH
JSON = {**AUTH, "Content-Type": "application/json"}



def _ops(app, conn):
    return q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations")[0][0]


def _states(app, conn):
    return dict(q(conn, app.settings.schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1"))


def _jobs(app, conn, n, state):
    q(conn, app.settings.schema, "INSERT INTO {s}.jobs (queue, task, payload, state, finished_at) "
      "SELECT 'default', 't', '{{}}', %s, CASE WHEN %s <> 'pending' THEN now() END "
      "FROM generate_series(1, %s) RETURNING 0", state, state, n)


@pytest.mark.parametrize("body", [{"kind": "cancel", "filter": None}, {"kind": "cancel"}, {"kind": "replay"},
                                  {"kind": "discard", "filter": None}])
def test_a_bulk_operation_without_a_filter_is_refused_and_filter_empty_is_every_job(console, app, conn, body):
    """A break-it trial: {"kind": "cancel"} (or "filter": null) cancelled every job, with
    no confirmation; {} is still every job, asked for on purpose."""
    app.enqueue("t", {}, any_task=True)
    _jobs(app, conn, 2, "dead")
    r = console.post("/api/bulk", headers=AUTH, json=body)
    assert r.status_code == 400, r.text
    said = r.json()["error"]
    assert f"a bulk {body['kind']} needs a filter" in said and '"filter": {}' in said, said
    assert "nothing was started" in said
    assert _ops(app, conn) == 0 and _states(app, conn) == {"pending": 1, "dead": 2}
    r = console.post("/api/bulk", headers=AUTH, json={**body, "filter": {}})
    assert r.status_code == 201, r.text


def test_the_bulk_form_without_a_filter_is_refused_unless_confirmed_as_every_job(console, app, conn):
    """The HTML path had the same hole: POST /bulk kind=cancel and nothing else. Its
    confirmation of every job (/bulk/new?kind=cancel) sends every=1; a misspelt field is
    refused as the API refuses it."""
    app.enqueue("t", {}, any_task=True)
    r = console.post("/bulk", headers=AUTH, data={"kind": "cancel", "expected": "1"})
    assert r.status_code == 400 and "a bulk cancel needs a filter" in r.text and "every=1" in r.text, r.text
    r = console.post("/bulk", headers=AUTH, data={"kind": "cancel", "tsk": "t"})
    assert r.status_code == 400 and "did you mean" in r.text and "task" in r.text, r.text
    assert console.get("/bulk/new?kind=cancel&tsk=t", headers=AUTH).status_code == 400
    assert _ops(app, conn) == 0 and _states(app, conn) == {"pending": 1}
    page = console.get("/bulk/new?kind=cancel", headers=AUTH)
    assert page.status_code == 200 and '<input type="hidden" name="every" value="1">' in page.text, page.text
    assert 'name="every"' not in console.get("/bulk/new?kind=cancel&task=t", headers=AUTH).text
    r = console.post("/bulk", headers=AUTH, data={"kind": "cancel", "every": "1"}, allow_redirects=False)
    assert r.status_code == 303, r.text


def test_the_bulk_confirmation_counts_only_the_jobs_the_operation_changes(console, app, conn):
    """A trial: "cancel, queue default" said 616 job(s) match, counting 600 succeeded and
    6 dead jobs, when 10 could be cancelled; the hidden `expected` carried the same."""
    _jobs(app, conn, 30, "succeeded")
    _jobs(app, conn, 3, "dead")
    app.enqueue_many([("t", {"i": i}) for i in range(5)], any_task=True)
    app.claim(limit=1)  # one running: a cancel takes it too
    for params, jobs in (({"kind": "cancel", "queue": "default"}, 5), ({"kind": "cancel"}, 5),
                         ({"kind": "cancel", "queue": "default", "state": "pending"}, 4),
                         ({"kind": "replay", "queue": "default", "task": "t"}, 3),
                         ({"kind": "discard", "queue": "default"}, 3)):
        page = console.get("/bulk/new", params=params, headers=AUTH)
        assert page.status_code == 200, page.text
        assert f"<strong>{jobs}</strong>" in page.text and f'name="expected" value="{jobs}"' in page.text, \
            (params, page.text[:3000])


@pytest.mark.parametrize("age", ["99999999999h", "9" * 400 + "d", "0001-01-01T00:00+01:00"])
def test_a_creation_time_out_of_range_is_a_400_naming_the_range(console, age):
    """99999999999h overflowed Python's datetime: a 500 (OverflowError)."""
    for path in ("/jobs", "/api/jobs"):
        r = console.get(path, params={"created_after": age}, headers=AUTH)
        assert r.status_code == 400 and "is out of range: a time is in years 1 to 9999" in r.text, (path, r.text)
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": {"created_before": age}})
    assert r.status_code == 400 and "out of range" in r.json()["error"], r.text


INFINITE = "NaN, an infinite number or one beyond a double"


@pytest.mark.parametrize("payload, said, in_bulk", [
    ('{"a":NaN}', "NaN is not JSON", INFINITE), ('{"a":-Infinity}', "Infinity is not JSON", INFINITE),
    ('{"a":1e999}', INFINITE, INFINITE), ("a.b.c=\x00", "a NUL character", None),
    ('{"a\\u0000":1}', "a NUL character", "a NUL character"), ('{"a":"\\udc00"}', "a lone surrogate", "lone"),
])
def test_a_payload_filter_postgresql_cannot_hold_is_a_400_not_a_503(console, app, conn, payload, said, in_bulk):
    """PostgreSQL refused it, and the console reported a client's mistake as the server
    unavailable (503)."""
    for path in ("/jobs", "/api/jobs"):
        r = console.get(path, params={"payload": payload}, headers=AUTH)
        assert r.status_code == 400 and said in r.text, (path, r.status_code, r.text[:2000])
    if in_bulk:  # the object itself, as a bulk filter's payload
        body = '{"kind": "cancel", "filter": {"payload": %s}}' % payload
        r = console.post("/api/bulk", headers=JSON, data=body)
        assert r.status_code == 400 and in_bulk in r.json()["error"], r.text
    assert _ops(app, conn) == 0


def test_a_payload_filter_is_measured_as_sent_and_an_empty_one_is_refused(console, app, conn):
    """A review: the limit counted the escaped JSON of what was typed (1,005 characters of
    "name=界..." read as 6,011; 900 dotted keys as their nested object), and `{}` matched
    every job with an object payload, past the bulk form's no-filter guard."""
    for typed in ("name=" + "界" * 1000, "a." * 900 + "a=1"):
        r = console.get("/api/jobs", params={"payload": typed}, headers=AUTH)
        assert r.status_code == 200, r.text[:500]
    r = console.get("/api/jobs", params={"payload": "name=" + "x" * 4100}, headers=AUTH)
    assert r.status_code == 400 and "the limit is 4,096" in r.text
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": {"payload": {"k": "界" * 1500}}})
    assert r.status_code == 201, r.text  # 1,508 characters sent, 9,008 escaped
    for sent in ({"payload": {}}, {"payload": "{}"}, {"payload": " { } "}):
        r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": sent})
        assert r.status_code == 400 and "matches every job whose payload is an object" in r.json()["error"], r.text
    r = console.get("/jobs", params={"payload": "{}"}, headers=AUTH)
    assert r.status_code == 400 and "matches every job whose payload is an object" in r.text
    assert _ops(app, conn) == 1


@pytest.mark.parametrize("key, value, takes", [
    ("queue", ["a", "b"], "a string"), ("queue", False, "a string"), ("task", 7, "a string"),
    ("created_after", {"h": 2}, "a string"), ("graph", 5.0, "a graph id, an integer"),
    ("dedupe_key", True, "a string"),
])
def test_a_bulk_filter_value_of_the_wrong_type_is_refused_not_stored_as_python_text(console, app, conn, key,
                                                                                   value, takes):
    """{"queue": ["a", "b"]} was stored as the queue "['a', 'b']", {"queue": false} as "False"."""
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": {key: value}})
    assert r.status_code == 400, r.text
    assert f"filter key {key!r} takes {takes}" in r.json()["error"] and json.dumps(value) in r.json()["error"], r.text
    assert _ops(app, conn) == 0
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": {"queue": "a", "graph": 5}})
    assert r.status_code == 201 and r.json()["filter"] == {"queue": "a", "graph": 5}, r.text


def test_the_confirmation_goes_back_where_it_came_from_and_a_wrong_state_names_the_right_ones(console, app, conn):
    """A new user's trial: "not now" of a cancel begun on the Jobs page went to the dead
    jobs; a cancel filtered on state dead was told to "choose pending" (running is too)."""
    r = console.get("/bulk/new", params={"kind": "cancel", "queue": "default"}, headers=AUTH)
    assert r.status_code == 200 and '/jobs?queue=default">not now</a>' in r.text, r.text[-1500:]
    r = console.get("/bulk/new", params={"kind": "replay", "queue": "default"}, headers=AUTH)
    assert r.status_code == 200 and '/dead">not now</a>' in r.text
    r = console.post("/api/bulk", headers=AUTH, json={"kind": "cancel", "filter": {"state": "dead"}})
    assert r.status_code == 400 and "choose pending or running" in r.json()["error"], r.text
