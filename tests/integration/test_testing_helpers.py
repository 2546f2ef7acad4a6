"""pgworker.testing against a real PostgreSQL: drain (successes, retries with and without
skip_backoff, permanent failures, snoozes, cancellation, the fence, recursion, the
max_jobs guard), the enqueue assertions and their messages, throwaway schemas and bind."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta, timezone

import psycopg
import pytest
from psycopg import sql

import pgworker
from pgworker.testing import (DrainLimitExceeded, assert_enqueued, bind, drain, enqueued_jobs, refute_enqueued,
                              throwaway_schema)

pytestmark = pytest.mark.integration

SLOW = pgworker.RetryPolicy(base_seconds=600, jitter=0.1)  # a retry that stays scheduled for the test's length


def running(app) -> list:
    return enqueued_jobs(app, state="running")


# -- drain --------------------------------------------------------------------------------


def test_drain_runs_every_due_job_with_the_worker_context(app):
    seen = []

    @app.task(name="record", queue="emails")
    def record(payload, ctx):
        seen.append((payload, ctx.job_id, ctx.attempt, ctx.queue, ctx.lease_lost, ctx.cancel_requested))

    @app.task(name="plain")
    def plain(payload):
        seen.append((payload,))

    ids = [app.enqueue("record", {"n": 1}), app.enqueue("plain", [1, 2]), app.enqueue(record, {"n": 2})]
    later = app.enqueue("plain", "later", delay=3600)
    result = drain(app)
    assert result.counts == {"succeeded": 3, "retried": 0, "dead": 0, "cancelled": 0, "snoozed": 0, "lost": 0}
    assert sorted(a.job_id for a in result.attempts) == ids
    assert ({"n": 1}, ids[0], 1, "emails", False, False) in seen and ([1, 2],) in seen
    assert {j.state for j in result.jobs.values()} == {"succeeded"} and later not in result.jobs
    assert [j.state for j in enqueued_jobs(app, "plain")] == ["succeeded", "pending"]  # not due: not run
    assert not running(app)
    assert drain(app).attempts == []  # nothing due any more


def test_drain_with_skip_backoff_retries_at_once_until_success(app):
    @app.task(name="flaky", max_attempts=5, retry=SLOW)
    def flaky(payload, ctx):
        if ctx.attempt < 3:
            raise ConnectionError(f"upstream down (attempt {ctx.attempt})")

    job_id = app.enqueue("flaky", {})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["retried", "retried", "succeeded"]
    assert result.retried == 2 and result.succeeded == 1
    assert result.error_codes() == {job_id: ["ConnectionError", "ConnectionError"]}
    assert result.attempts[0].delay_seconds > 500  # the policy's backoff was asked for, then skipped
    row = result.jobs[job_id]
    assert (row.state, row.attempts, row.last_error_code) == ("succeeded", 3, "ConnectionError")
    assert [e["message"] for e in row.errors] == ["upstream down (attempt 1)", "upstream down (attempt 2)"]


def test_drain_without_skip_backoff_leaves_the_retry_scheduled(app):
    @app.task(name="flaky", retry=SLOW)
    def flaky(payload):
        raise ConnectionError("upstream down")

    job_id = app.enqueue("flaky", {})
    before = datetime.now(timezone.utc)
    result = drain(app)
    assert [a.outcome for a in result.attempts] == ["retried"]
    row = result.jobs[job_id]
    assert (row.state, row.attempts) == ("pending", 1)
    assert row.run_at > before + timedelta(seconds=500)  # the task's own backoff
    assert drain(app).attempts == []  # not due: the drain stops
    assert drain(app, skip_backoff=True).attempts == []  # skip_backoff only moves what it retries itself


def test_drain_records_permanent_failures_and_spent_attempts_as_dead(app):
    @app.task(name="charge")
    def charge(payload):
        raise pgworker.Permanent("card declined", code="DECLINED")

    @app.task(name="always_fails", max_attempts=2, retry=SLOW)
    def always_fails(payload):
        raise ValueError("nope")

    declined, failing = app.enqueue("charge", {}), app.enqueue("always_fails", {})
    unknown = app.enqueue("not_a_registered_task", {}, any_task=True)
    result = drain(app, skip_backoff=True)
    assert result.counts["dead"] == 3 and result.retried == 1
    assert (result.jobs[declined].state, result.jobs[declined].last_error_code) == ("dead", "DECLINED")
    assert result.jobs[declined].attempts == 1  # permanent: no retry
    assert (result.jobs[failing].state, result.jobs[failing].attempts) == ("dead", 2)
    assert result.jobs[unknown].last_error_code == "UNKNOWN_TASK"  # the executor's rule, not ours


def test_ctrl_c_in_a_drained_handler_stops_the_drain_and_hands_the_job_back(app):
    """A test run must end on Ctrl-C: the drain does not record it as the job's failure and go on."""
    ran = []

    @app.task(name="interrupted")
    def interrupted(payload):
        ran.append(payload["n"])
        raise KeyboardInterrupt

    first, second = app.enqueue("interrupted", {"n": 1}), app.enqueue("interrupted", {"n": 2})
    with pytest.raises(KeyboardInterrupt):
        drain(app)
    assert ran == [1]  # the drain stopped at the first
    with app.connection() as c:
        rows = c.execute(sql.SQL("SELECT id, state::text, attempts, lease_owner IS NULL AND last_error_code IS NULL "
                         "FROM {}.jobs ORDER BY id")
                         .format(sql.Identifier(app.settings.schema))).fetchall()
    # both pending again and no attempt spent: the interrupted job was released, not failed
    assert rows == [(first, "pending", 0, True), (second, "pending", 0, True)]


def test_drain_snoozes_without_spending_attempts(app):
    @app.task(name="wait_for_it")
    def wait_for_it(payload, ctx):
        if not payload.get("ready"):
            app_conn_update(app, ctx.job_id)
            raise pgworker.Snooze(3600)

    def app_conn_update(app, job_id):  # the next run sees the payload ready
        with app.connection() as c:
            c.execute(sql.SQL("UPDATE {}.jobs SET payload = %s::jsonb WHERE id = %s")
                      .format(sql.Identifier(app.settings.schema)), ['{"ready": true}', job_id])

    scheduled = app.enqueue("wait_for_it", {})
    result = drain(app)
    assert [a.outcome for a in result.attempts] == ["snoozed"]
    assert result.jobs[scheduled].state == "pending" and result.jobs[scheduled].attempts == 0
    assert result.jobs[scheduled].run_at > datetime.now(timezone.utc) + timedelta(seconds=3000)

    again = app.enqueue("wait_for_it", {})
    result = drain(app, skip_backoff=True)
    assert [(a.job_id, a.outcome) for a in result.attempts] == [(again, "snoozed"), (again, "succeeded")]
    assert (result.jobs[again].state, result.jobs[again].attempts) == ("succeeded", 1)


def test_drain_cancellation_and_the_fence_are_the_real_statements(app, pg_dsn):
    schema = sql.Identifier(app.settings.schema)

    requested = []

    @app.task(name="cancel_myself")
    def cancel_myself(payload, ctx):
        requested.append(app.cancel(ctx.job_id))  # a request, as an operator makes it
        requested.append(ctx.cancel_requested)     # renewals bring it to ctx; none runs in a drain
        raise RuntimeError("failing after the request")

    @app.task(name="stolen")
    def stolen(payload, ctx):
        with psycopg.connect(pg_dsn, autocommit=True) as c:  # as if another claim took the job
            c.execute(sql.SQL("UPDATE {}.jobs SET lease_token = lease_token + 1 WHERE id = %s")
                      .format(schema), [ctx.job_id])

    cancelled, lost = app.enqueue("cancel_myself", {}), app.enqueue("stolen", {})
    result = drain(app)
    outcomes = {a.job_id: a.outcome for a in result.attempts}
    assert outcomes == {cancelled: "cancelled", lost: "lost"} and requested == ["running", False]
    assert result.jobs[cancelled].state == "cancelled"
    assert result.jobs[lost].state == "running"  # the fence refused the success: not ours to write


def test_drain_runs_async_handlers(app):
    @app.task(name="async_job")
    async def async_job(payload):
        await asyncio.sleep(0.01)
        if payload == "fail":
            raise RuntimeError("async failure")

    ok, bad = app.enqueue("async_job", "ok"), app.enqueue("async_job", "fail", max_attempts=1)
    result = drain(app)
    assert {a.job_id: a.outcome for a in result.attempts} == {ok: "succeeded", bad: "dead"}


def test_drain_inside_a_running_event_loop_names_the_fix(app):
    @app.task(name="async_job")
    async def async_job(payload):
        pass

    app.enqueue("async_job", {})

    async def an_async_test():
        with pytest.raises(RuntimeError, match=r"'async_job'.*asyncio.to_thread\(drain, app\)"):
            drain(app)
        return await asyncio.to_thread(drain, app)

    assert asyncio.run(an_async_test()).succeeded == 1


def test_drain_follows_jobs_enqueued_by_handlers(app):
    @app.task(name="parent")
    def parent(payload):
        for i in range(2):
            app.enqueue("child", {"parent": payload["id"], "i": i})

    @app.task(name="child")
    def child(payload):
        if payload["i"] == 1:
            grandchild.enqueue({"from": payload["parent"]})

    @app.task(name="grandchild", queue="other")
    def grandchild(payload):
        pass

    app.enqueue("parent", {"id": 7})
    result = drain(app)
    assert [a.task for a in result.attempts] == ["parent", "child", "child", "grandchild"]
    assert result.succeeded == 4 and result.not_run == []
    assert_enqueued(app, "grandchild", {"from": 7}, queue="other", state="succeeded")


def test_drain_without_recursion_leaves_new_jobs_pending(app):
    @app.task(name="parent")
    def parent(payload):
        app.enqueue("child", {"i": 1}, priority=10, max_attempts=1)  # would be claimed first
        app.enqueue("child", {"i": 2}, max_attempts=1)

    @app.task(name="child")
    def child(payload):
        raise AssertionError("a child must not run without recursion")

    before = app.enqueue("parent", {})
    result = drain(app, with_recursion=False)
    assert [a.job_id for a in result.attempts] == [before] and result.succeeded == 1
    children = assert_enqueued(app, "child", payload_contains={}, count=2)
    assert sorted(result.not_run) == [j.id for j in children]
    assert all(j.attempts == 0 for j in children)  # handed back without spending an attempt
    assert not running(app)
    assert drain(app, max_jobs=2).dead == 2  # a later drain runs them (and they fail)


def test_max_jobs_stops_a_job_that_enqueues_itself_forever(app):
    @app.task(name="forever")
    def forever(payload):
        app.enqueue("forever", {"n": payload["n"] + 1})

    app.enqueue("forever", {"n": 0})
    with pytest.raises(DrainLimitExceeded) as caught:
        drain(app, max_jobs=5)
    message = str(caught.value)
    assert "max_jobs=5" in message and "'forever' 5x" in message and "enqueues a job every time" in message
    assert caught.value.result.succeeded == 5 and isinstance(caught.value, AssertionError)
    assert {j.state for j in caught.value.result.jobs.values()} == {"succeeded"}
    assert not running(app)  # the job claimed past the limit was handed back
    assert_enqueued(app, "forever", {"n": 5}, state="pending")


def test_max_jobs_is_not_an_error_when_the_queue_empties(app):
    @app.task(name="once")
    def once(payload):
        pass

    for i in range(3):
        app.enqueue("once", i)
    assert drain(app, max_jobs=3).succeeded == 3


def test_drain_takes_only_the_queues_asked_for_and_respects_pauses(app):
    @app.task(name="a", queue="alpha")
    def a(payload):
        pass

    @app.task(name="b", queue="beta")
    def b(payload):
        pass

    app.enqueue("a", 1)
    app.enqueue("b", 2)
    assert [x.task for x in drain(app, "beta").attempts] == ["b"]
    app.pause_queue("alpha")
    assert drain(app).attempts == []  # the claim's own policy
    app.resume_queue("alpha")
    assert [x.task for x in drain(app, ["alpha", "beta"]).attempts] == ["a"]


def test_drain_refuses_bad_arguments_and_an_unmigrated_schema(app, pg_dsn):
    with pytest.raises(ValueError, match="max_jobs must be an integer >= 1"):
        drain(app, max_jobs=0)
    with pytest.raises(ValueError, match="queues is empty"):
        drain(app, [])
    with pytest.raises(pgworker.InvalidName):
        drain(app, "bad queue name\n")
    with pgworker.App(pg_dsn, schema="pgworker_never_migrated") as bare:
        with pytest.raises(pgworker.SchemaNotMigrated, match="pgworker migrate"):
            drain(bare)


# -- assertions ---------------------------------------------------------------------------


def test_assert_enqueued_matches_exact_and_contained_payloads(app):
    @app.task(name="send_email", queue="emails")
    def send_email(payload):
        pass

    first = app.enqueue(send_email, {"to": "a@example.com", "tags": ("x", "y"), "meta": {"lang": "fr", "n": 1}})
    app.enqueue("send_email", {"to": "b@example.com", "urgent": True})
    found = assert_enqueued(app, send_email, {"to": "a@example.com", "tags": ["x", "y"],
                                              "meta": {"lang": "fr", "n": 1.0}})
    assert [j.id for j in found] == [first]
    assert_enqueued(app, "send_email", payload_contains={"meta": {"lang": "fr"}}, queue="emails", count=1)
    assert_enqueued(app, "send_email", payload_contains={}, count=2)
    assert_enqueued(app, None, state=["pending", "running"], count=2)
    refute_enqueued(app, "send_email", {"to": "b@example.com", "urgent": 1})  # True is not 1
    refute_enqueued(app, "send_email", payload_contains={"to": "a@example.com"}, queue="default")
    refute_enqueued(app, "send_email", state="succeeded")


def test_assert_enqueued_failure_shows_what_was_enqueued(app):
    app.enqueue("send_email", {"to": "b@example.com", "extra": 1}, queue="emails")
    app.enqueue("send_email", {"to": "a@example.com"}, queue="default")
    app.enqueue("report", {}, max_attempts=1)
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(app, "send_email", {"to": "a@example.com"}, queue="emails")
    message = str(caught.value)
    assert message.splitlines()[0] == ("expected a pending job of task 'send_email' in queue 'emails' "
                                       "with payload == {'to': 'a@example.com'}, found none.")
    assert "Jobs of task 'send_email' (2, any state or queue):" in message
    assert "payload['to']: expected 'a@example.com', got 'b@example.com'" in message
    assert "payload['extra'] is not expected (got 1)" in message
    assert "queue is 'default', not 'emails'" in message
    assert "Other jobs: 'report' (pending 1)." in message

    with pytest.raises(AssertionError, match=r"expected exactly 3 job\(s\) matching .* found 2"):
        assert_enqueued(app, "send_email", count=3)
    with pytest.raises(AssertionError, match="No job of task 'send_mail'.*registered are none"):
        assert_enqueued(app, "send_mail")


def test_assert_enqueued_of_a_misspelt_task_names_the_registered_one_even_with_no_job_at_all(app):
    """With no job in the schema it said only "No job at all is in schema ..."."""
    app.task(name="send_email")(lambda payload: None)
    with pytest.raises(AssertionError) as caught:
        assert_enqueued(app, "send_emial")
    assert f"No job at all is in schema {app.settings.schema!r} (and no task of that name is registered" \
        in str(caught.value) and "did you mean 'send_email'?" in str(caught.value), caught.value
    app.enqueue("send_email", {})
    with pytest.raises(AssertionError, match="did you mean 'send_email'"):
        assert_enqueued(app, "send_emial")


def test_refute_enqueued_lists_the_jobs_that_match(app):
    job_id = app.enqueue("cleanup", {"bucket": "tmp", "days": 3})
    with pytest.raises(AssertionError) as caught:
        refute_enqueued(app, "cleanup", payload_contains={"bucket": "tmp"})
    assert str(caught.value) == (  # the payload as stored: jsonb orders keys shortest first
        "expected no pending job of task 'cleanup' with a payload containing {'bucket': 'tmp'}, found 1:\n"
        f"  job {job_id}: pending, queue 'default', task 'cleanup', payload {{'days': 3, 'bucket': 'tmp'}}")


def test_assertions_refuse_bad_arguments(app):
    with pytest.raises(ValueError, match="state must be one of pending, running, succeeded, dead, cancelled"):
        assert_enqueued(app, "t", state="queued")
    with pytest.raises(ValueError, match="not both"):
        assert_enqueued(app, "t", {"a": 1}, payload_contains={"a": 1})
    with pytest.raises(TypeError, match="payload_contains must be a dict"):
        refute_enqueued(app, "t", payload_contains=["a"])
    with pytest.raises(TypeError, match="JSON-serialisable"):
        assert_enqueued(app, "t", {1, 2})
    with pytest.raises(ValueError, match="count must be an integer >= 0"):
        assert_enqueued(app, "t", count=-1)


# -- throwaway schemas and bind ----------------------------------------------------------


def test_bind_points_a_module_level_app_and_its_tasks_at_the_test_schema(pg_dsn):
    user_app = pgworker.App(pg_dsn, schema="pgworker_users_real_schema")  # never created

    @user_app.task(name="welcome")
    def welcome(payload):
        user_app.enqueue("followup", {"after": payload["user"]})  # the module-level reference

    @user_app.task(name="followup")
    def followup(payload):
        pass

    with throwaway_schema(pg_dsn) as schema:
        with bind(user_app, schema) as bound:
            assert bound is user_app and user_app.settings.schema == schema
            welcome.enqueue({"user": 1})  # Task.enqueue goes through the App it was registered on
            assert drain(user_app).succeeded == 2
            assert_enqueued(user_app, "followup", {"after": 1}, state="succeeded")
        assert user_app.settings.schema == "pgworker_users_real_schema" and user_app.core._pool is None
    with psycopg.connect(pg_dsn) as c:
        assert c.execute("SELECT count(*) FROM pg_namespace WHERE nspname = %s", [schema]).fetchone()[0] == 0


def test_bind_refuses_what_it_cannot_bind(pg_dsn, monkeypatch):
    with pytest.raises(TypeError, match="takes a pgworker.App"):
        with bind(object(), "s"):
            pass
    with pytest.raises(pgworker.InvalidName):
        with bind(pgworker.App(pg_dsn), "pg_nope"):
            pass
    monkeypatch.delenv("PGWORKER_TEST_DSN", raising=False)
    monkeypatch.delenv("PGWORKER_DSN", raising=False)
    with pytest.raises(pgworker.ConfigError, match="PGWORKER_TEST_DSN"):
        with bind(pgworker.App(), "s"):
            pass


@dataclasses.dataclass
class Invoice:  # at module level: the handler's string annotation (PEP 563) resolves to it
    customer: str
    cents: int


def test_assert_enqueued_compares_a_typed_payload_as_it_is_stored(app):
    seen = []

    @app.task(name="bill")
    def bill(inv: Invoice) -> None:
        seen.append(inv)

    app.enqueue("bill", Invoice("acme", 5))
    assert_enqueued(app, "bill", payload=Invoice("acme", 5))
    assert_enqueued(app, "bill", payload={"customer": "acme", "cents": 5})
    drain(app)
    assert seen == [Invoice("acme", 5)]  # the handler got the dataclass back


def test_a_failing_assert_enqueued_shows_the_callers_line_not_the_helpers_source(tmp_path, pg_dsn):
    """pytest hides the helper's own frames (``__tracebackhide__``): the traceback of a
    user's failing test ended in pgworker's source (new-user trial)."""
    import subprocess
    import sys

    (tmp_path / "test_user.py").write_text(
        "from pgworker.testing import assert_enqueued\n\n"
        "def test_welcome(pgworker_app):\n"
        "    assert_enqueued(pgworker_app, 'send_welcome', {'user': 1})\n")
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env={**__import__("os").environ, "PGWORKER_TEST_DSN": pg_dsn})
    assert run.returncode == 1, run.stdout + run.stderr
    assert "assert_enqueued(pgworker_app, 'send_welcome'" in run.stdout  # the caller's line
    assert "pgworker/testing/enqueued.py:" not in run.stdout, run.stdout
    assert "no job of task 'send_welcome'" in run.stdout or "send_welcome" in run.stdout
