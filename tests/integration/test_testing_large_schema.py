"""pgworker.testing's assertions in a schema of more jobs than they read (10,000): the
filters apply in SQL, the newest candidates are read first, and a read cut at its bound
is never answered silently. Also the plans of the helpers' reads on such a table."""

from __future__ import annotations

import json

import pytest
from psycopg import sql

from pgworker.testing import TooManyJobs, assert_enqueued, enqueued_jobs, refute_enqueued

pytestmark = pytest.mark.integration

OLDER = 10_020  # more than the helpers' default bound (10,000)


def fill(conn, app, n: int, task: str, payload: str = "jsonb_build_object('n', g)") -> None:
    """``n`` pending jobs of ``task`` in one INSERT ... SELECT (``payload``: SQL over g)."""
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload) SELECT 'default', %s, " + payload
                         + " FROM generate_series(1, %s) AS g").format(sql.Identifier(app.settings.schema)),
                 (task, n))


def test_a_new_job_is_found_beside_more_than_10000_older_jobs_of_another_task(app, conn):
    """The new user's case: the helpers read only the oldest 10,000 jobs, so
    assert_enqueued said "found none" and refute_enqueued passed."""
    fill(conn, app, OLDER, "other")
    job_id = app.enqueue("flaky", {"succeed_on": 3})
    with pytest.raises(AssertionError) as caught:  # it passed
        refute_enqueued(app, "flaky", payload_contains={"succeed_on": 3})
    assert str(caught.value) == (
        "expected no pending job of task 'flaky' with a payload containing {'succeed_on': 3}, found 1:\n"
        f"  job {job_id}: pending, queue 'default', task 'flaky', payload {{'succeed_on': 3}}")
    found = assert_enqueued(app, "flaky", payload_contains={"succeed_on": 3})
    assert [j.id for j in found] == [job_id]
    assert_enqueued(app, "flaky", {"succeed_on": 3}, queue="default", count=1)
    refute_enqueued(app, "flaky", payload_contains={"succeed_on": 4})  # no candidate at all: a true pass
    assert [j.id for j in enqueued_jobs(app, "flaky")] == [job_id]


def test_a_failure_beside_many_older_jobs_still_lists_the_tasks_jobs(app, conn):
    fill(conn, app, OLDER, "other")
    job_id = app.enqueue("flaky", {"succeed_on": 3})
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(app, "flaky", payload_contains={"succeed_on": 4})
    lines = str(caught.value).splitlines()
    assert lines == [
        "expected a pending job of task 'flaky' with a payload containing {'succeed_on': 4}, found none.",
        "Jobs of task 'flaky' (1, any state or queue):",
        f"  job {job_id}: pending, queue 'default', task 'flaky', payload {{'succeed_on': 3}}",
        "      payload['succeed_on']: expected 4, got 3",
        "Other jobs among the newest 10,000 (older ones not counted): 'other' (pending 9999).",
    ], lines


def test_refute_enqueued_does_not_pass_on_a_read_cut_at_its_bound(app, conn):
    """The one match is older than 10,020 candidates that pass the SQL filter (jsonb @>
    takes [1] to be in [1, 2]) but not the helpers' match (lists compare exactly): the
    newest 10,000 hold no match, and the answer is not "none"."""
    match_id = app.enqueue("tag", {"tags": [1]})
    fill(conn, app, OLDER, "tag", payload="jsonb_build_object('tags', jsonb_build_array(1, g))")
    with pytest.raises(TooManyJobs) as caught:
        refute_enqueued(app, "tag", payload_contains={"tags": [1]})
    message = str(caught.value)
    assert message.startswith("cannot refute a pending job of task 'tag' with a payload containing {'tags': [1]}: "
                              "none of the jobs read matched, but only the newest 10,000 candidate jobs"), message
    assert "narrow it with task=, queue=, state=, payload= or payload_contains=" in message
    assert "larger limit=" in message
    with pytest.raises(AssertionError, match=f"found 1:\n  job {match_id}: "):
        refute_enqueued(app, "tag", payload_contains={"tags": [1]}, limit=20_000)  # read whole: the match

    with pytest.raises(AssertionError) as caught:  # and assert_enqueued says that its read was cut
        assert_enqueued(app, "tag", payload_contains={"tags": [1]})
    head = str(caught.value).splitlines()[0]
    assert head.startswith("expected a pending job of task 'tag' with a payload containing {'tags': [1]}, found "
                           "none. The read was cut: only the newest 10,000 candidate jobs (those of task 'tag' in "
                           "state pending with the payload filter, as SQL applies it) were read"), head
    assert "Jobs of task 'tag' (more than 10,000, any state or queue, the newest 20 shown):" in str(caught.value)
    assert [j.id for j in assert_enqueued(app, "tag", payload_contains={"tags": [1]}, limit=20_000)] == [match_id]


def test_an_exact_count_past_the_bound_is_not_guessed(app, conn):
    fill(conn, app, OLDER, "other")
    with pytest.raises(AssertionError, match=r"expected exactly 10020 job\(s\) matching \[pending job of task "
                                             r"'other'\], found at least 10000\. The read was cut"):
        assert_enqueued(app, "other", count=OLDER)
    assert len(assert_enqueued(app, "other", count=OLDER, limit=OLDER)) == OLDER
    assert len(assert_enqueued(app, "other")) == 10_000  # at least one: the newest 10,000 matches
    with pytest.raises(TooManyJobs, match=r"more than 10,000 jobs of task 'other' are in schema .* returns all "
                                          r"or none: narrow it with task=, queue= or state= \(they filter in SQL\), or pass a larger limit="):
        enqueued_jobs(app, "other")
    rows = enqueued_jobs(app, "other", state="pending", limit=OLDER)
    assert len(rows) == OLDER and rows[0].id < rows[-1].id  # oldest first
    with pytest.raises(ValueError, match="limit must be an integer >= 1"):
        refute_enqueued(app, "other", limit=0)


def _plan(conn, app, name: str, params: dict) -> dict:
    """The plan of statement ``name`` as EXPLAIN (ANALYZE, BUFFERS) runs it: its top node."""
    [[plan]] = conn.execute("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + app.store.queries[name], params).fetchall()
    return plan[0]["Plan"]


def _pages(conn, app) -> int:
    return conn.execute("SELECT relpages FROM pg_class WHERE oid = %s::regclass",
                        (f"{app.settings.schema}.jobs",)).fetchone()[0]


def test_the_candidate_read_walks_the_primary_key_and_stops_at_its_limit(app, conn):
    """100,000 pending jobs of one task and one of another: the read of the many walks
    jobs_pkey backward and stops at 10,001 rows (a state compared as text hid the
    statistics: a full scan and a sort of all 100,000 rows); the read of the one costs a
    single pass over the table, no index holding the task; the "Other jobs" count walks
    the key too."""
    fill(conn, app, 100_000, "other")
    app.enqueue("flaky", {"succeed_on": 3})
    conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(sql.Identifier(app.settings.schema)))
    pages = _pages(conn, app)
    base = {"ids": None, "queue": None, "payload": None, "contains": None, "limit": 10_001}
    many = _plan(conn, app, "testing_jobs", {**base, "task": "other", "states": ["pending"]})
    text = json.dumps(many)
    assert '"Index Name": "jobs_pkey"' in text and '"Scan Direction": "Backward"' in text, text
    assert "Sort" not in text and "Seq Scan" not in text, text
    assert many["Actual Rows"] == 10_001
    assert many["Shared Hit Blocks"] + many["Shared Read Blocks"] < pages / 3, (many, pages)
    one = _plan(conn, app, "testing_jobs", {**base, "task": "flaky", "states": ["pending"],
                                             "contains": json.dumps({"succeed_on": 3})})
    assert one["Actual Rows"] == 1
    assert one["Shared Hit Blocks"] + one["Shared Read Blocks"] <= pages + 50, (one, pages)
    counts = json.dumps(_plan(conn, app, "testing_job_counts", {"limit": 10_000}))
    assert '"Index Name": "jobs_pkey"' in counts and "Seq Scan" not in counts, counts


def test_the_sql_filters_keep_the_helpers_json_rules(app):
    """The payload filters now run in SQL first (jsonb = and @>): a JSON null payload is
    a payload, numbers compare by value, a boolean is not a number, and a list in
    payload_contains still compares exactly."""
    null_id = app.enqueue("t", None)
    app.enqueue("t", {"n": 1, "flag": True, "tags": [1, 2]})
    assert [j.id for j in assert_enqueued(app, "t", None)] == [null_id]
    assert_enqueued(app, "t", {"n": 1.0, "flag": True, "tags": [1, 2]}, count=1)
    assert_enqueued(app, "t", payload_contains={"n": 1.0}, count=1)
    refute_enqueued(app, "t", payload_contains={"flag": 1})
    refute_enqueued(app, "t", payload_contains={"tags": [1]})  # jsonb @> says yes; the helpers' rule, no
    assert_enqueued(app, "t", payload_contains={}, count=1)  # {} is in every object, not in null
