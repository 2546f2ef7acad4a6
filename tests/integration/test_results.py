"""Job results (issue 21): stored by the fenced success, bounded, read back, waited for,
and deleted with their job."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import psycopg
import pytest
from psycopg import sql

from pgworker import (App, JobDidNotSucceed, LeaseLost, Permanent, ResultLost, ResultNotReady, ResultTimeout,
                      RetryPolicy)
from pgworker.errors import JobNotFound
from pgworker.jobs import RESULT_LOST
from pgworker.results import RESULT_INVALID, RESULT_TOO_LARGE, ResultRefused, encode_result
from pgworker.testing import drain
from pgworker.worker import settler
from pgworker.worker.shm import layout as s
from pgworker.worker.shm.slots import SlotTable
from pgworker.worker.claimer.executor import Executor
from pgworker.worker.outcome import write_outcomes

pytestmark = pytest.mark.integration
NO_BACKOFF = RetryPolicy(base_seconds=0, max_seconds=0, jitter=0)


def result_rows(conn, schema):
    return conn.execute(sql.SQL("SELECT job_id, result FROM {}.job_results ORDER BY job_id")
                        .format(sql.Identifier(schema))).fetchall()


def expire(conn, schema, job_id):
    conn.execute(sql.SQL("UPDATE {}.jobs SET lease_expires_at = now() - interval '1 second' WHERE id = %s")
                 .format(sql.Identifier(schema)), [job_id])


def test_a_result_is_stored_with_the_success_and_read_back(app, conn):
    a, b = app.enqueue("t"), app.enqueue("t")
    with pytest.raises(ResultNotReady, match=f"`pgworker jobs show {a} --schema {app.settings.schema}`"):
        app.result(a)  # the hint reaches this schema as printed
    ja, jb = app.claim(limit=2)
    with pytest.raises(ResultNotReady):
        app.result(ja.id)  # running
    app.complete(ja, result={"rows": [1, 2, 3], "name": "é\u2603", "ok": True})
    app.complete(jb)  # returned nothing: no row
    assert app.result(a) == {"rows": [1, 2, 3], "name": "é\u2603", "ok": True}
    assert app.result(b) is None
    assert [r[0] for r in result_rows(conn, app.settings.schema)] == [a]
    with pytest.raises(JobNotFound):
        app.result(10**12)
    # `pgworker jobs show` prints the job's row: the result is part of it
    assert app.get_job(a)["result"] == {"rows": [1, 2, 3], "name": "é\u2603", "ok": True}
    assert "result" not in app.get_job(b)


def test_a_stale_workers_result_is_never_stored(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t")
    [old] = app.claim()
    expire(conn, schema, old.id)
    assert app.reap(retry=NO_BACKOFF).requeued == (job_id,)
    [new] = app.claim()
    with pytest.raises(LeaseLost):
        app.complete(old, result="from the stale worker")
    assert result_rows(conn, schema) == []
    app.complete(new, result="from the owner")
    assert app.result(job_id) == "from the owner"
    with pytest.raises(LeaseLost):  # and a late write after the success changes nothing
        app.complete(old, result="late")
    assert result_rows(conn, schema) == [(job_id, "from the owner")]


def test_a_batched_success_stores_only_the_accepted_rows_results(app, conn):
    schema = app.settings.schema
    ids = app.enqueue_many([("t", i) for i in range(3)])
    jobs = app.claim(limit=3)
    stale = jobs[1].lease._replace(token=jobs[1].lease_token + 7)
    report = app.store.complete(conn, [jobs[0].lease, stale, jobs[2].lease], None, ['{"n":0}', '{"n":1}', None])
    assert set(report.accepted) == {ids[0], ids[2]} and report.refused == (ids[1],)
    assert result_rows(conn, schema) == [(ids[0], {"n": 0})]


@pytest.mark.parametrize("value, code", [
    ({1, 2}, RESULT_INVALID), (float("nan"), RESULT_INVALID), (object(), RESULT_INVALID),
    ({"s": "a\x00b"}, RESULT_INVALID), ({"x": "\ud800"}, RESULT_INVALID), ("x" * 100, RESULT_TOO_LARGE),
    ("é" * 30, RESULT_TOO_LARGE),
])
def test_a_result_that_cannot_be_stored_is_refused_with_its_code(value, code):
    with pytest.raises(ResultRefused) as info:
        encode_result(value, 50)
    assert info.value.code == code and str(info.value)
    if code == RESULT_TOO_LARGE:
        assert "result_max_bytes (50)" in str(info.value) and "PGWORKER_RESULT_MAX_BYTES" in str(info.value)


def test_encoding_keeps_what_jsonb_can_hold(app, conn):
    # a literal backslash-u0000 (escaped in JSON) is text jsonb stores; only a real NUL is refused
    job_id = app.enqueue("t")
    [job] = app.claim()
    app.complete(job, result={"literal": "\\u0000", "n": 1.5, "big": 10**30})
    assert app.result(job_id) == {"literal": "\\u0000", "n": 1.5, "big": 10**30}
    assert encode_result(None, 2) is None
    with pytest.raises(ValueError):  # App.complete refuses before writing anything
        app.complete(job, result={1, 2})


def test_handlers_results_through_the_executor_and_their_refusals(app, conn, monkeypatch):
    app.configure(_with(app.settings, result_max_bytes=1000))

    @app.task(name="ok")
    def ok(payload):
        return {"double": payload * 2}

    @app.task(name="unserialisable", max_attempts=3)
    def unserialisable(payload):
        return {"when": time}  # a module object

    @app.task(name="huge", max_attempts=3)
    def huge(payload):
        return "x" * 5000

    @app.task(name="async_ok")
    async def async_ok(payload):
        return [payload]

    good, bad, big, aok = (app.enqueue("ok", 21), app.enqueue("unserialisable"), app.enqueue("huge"),
                           app.enqueue("async_ok", "a"))
    drain(app)
    assert app.result(good) == {"double": 42}
    assert app.result(aok) == ["a"]
    for job_id, code in ((bad, RESULT_INVALID), (big, RESULT_TOO_LARGE)):
        with pytest.raises(JobDidNotSucceed) as info:
            app.result(job_id)
        assert (info.value.state, info.value.code) == ("dead", code)  # permanent: the work may be done
        assert f"`pgworker jobs show {job_id} --schema {app.settings.schema}` has its history" in str(info.value)
        job = app.get_job(job_id)
        assert job["attempts"] == 1 and code in job["errors"][-1]["code"] and "result" not in job


def _with(settings, **changes):
    import dataclasses

    return dataclasses.replace(settings, **changes)


def test_results_follow_their_jobs_retention(app, conn):
    schema = app.settings.schema
    job_id = app.enqueue("t")
    [job] = app.claim()
    app.complete(job, result=[1])
    assert result_rows(conn, schema) == [(job_id, [1])]
    assert app.prune(0) == 1
    assert result_rows(conn, schema) == []
    with pytest.raises(JobNotFound):
        app.result(job_id)


def test_wait_result_is_woken_by_the_completion_not_by_the_poll(app):
    job_id = app.enqueue("t")
    [job] = app.claim()

    def finish():
        time.sleep(0.5)
        app.complete(job, result={"done": True})

    threading.Thread(target=finish).start()
    t0 = time.monotonic()
    assert app.wait_result(job_id, timeout=20, poll_seconds=15) == {"done": True}
    assert time.monotonic() - t0 < 5  # the poll alone would take 15 s


def test_wait_result_times_out_and_sees_failures_by_its_poll(app):
    job_id = app.enqueue("t", max_attempts=1)
    t0 = time.monotonic()
    with pytest.raises(ResultTimeout):
        app.wait_result(job_id, timeout=0.3, poll_seconds=0.1)
    assert time.monotonic() - t0 < 3
    with pytest.raises(TimeoutError):  # ResultTimeout is a TimeoutError
        app.wait_result(job_id, timeout=0)
    [job] = app.claim()
    threading.Timer(0.3, lambda: app.fail(job, Permanent("no"))).start()
    with pytest.raises(JobDidNotSucceed) as info:
        app.wait_result(job_id, timeout=20, poll_seconds=0.1)
    assert info.value.state == "dead"


@pytest.mark.parametrize("bad", [True, 14.0, "14", None, [14]])
def test_a_job_id_that_is_not_an_int_is_a_type_error_not_a_schema_problem(app, bad):
    """A trial: app.result(True) raised SchemaNotMigrated ("operator does not exist: bigint
    = boolean ... run pgworker migrate"), result(14.0) read job 14, result(None) "no job
    None". Every call taking a job id refuses another type before any query, naming it."""
    app.enqueue("t")
    calls = [lambda: app.result(bad), lambda: app.wait_result(bad, timeout=1), lambda: app.get_job(bad),
             lambda: app.cancel(bad), lambda: app.retry(bad), lambda: app.replay([bad]),
             lambda: app.cancel_graph(bad), lambda: asyncio.run(app.aresult(bad)),
             lambda: asyncio.run(app.await_result(bad, timeout=1)), lambda: asyncio.run(app.aget_job(bad)),
             lambda: asyncio.run(app.acancel(bad)), lambda: asyncio.run(app.areplay([bad]))]
    for call in calls:
        with pytest.raises(TypeError) as info:
            call()
        assert f"is an int (what enqueue returned), got {type(bad).__name__} {bad!r}" in str(info.value)
    if isinstance(bad, str):
        assert "pass int('14') for an id read as text" in str(info.value)
    with pytest.raises(TypeError, match=r"job ids are a list of ints, e.g. \[14\]"):
        app.replay(14)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="ids are 1 to 2"):
        app.result(2**63)


def test_wait_result_without_a_deadline_and_a_timeout_that_is_not_a_number(app):
    """A trial: timeout=None (wait without a deadline, as other queues spell it) and
    timeout='5' both failed with "'>=' not supported between instances"."""
    job_id = app.enqueue("t")
    [job] = app.claim()
    threading.Timer(0.3, lambda: app.complete(job, result="done")).start()
    assert app.wait_result(job_id, timeout=None, poll_seconds=0.1) == "done"
    assert asyncio.run(app.await_result(job_id, timeout=None)) == "done"
    for bad in ("5", True):
        with pytest.raises(TypeError, match=r"timeout is a number of seconds \(or None: no deadline\), got"):
            app.wait_result(job_id, timeout=bad)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="poll_seconds is a number of seconds, got str"):
        app.wait_result(job_id, timeout=1, poll_seconds="1")  # type: ignore[arg-type]


def test_a_child_held_by_a_dead_parent_says_so_to_whoever_waits_for_its_result(app):
    """A trial: the result of a child whose parent went dead read "job 11 is pending", and
    wait_result on it waited out its timeout without a word why. Both name the parent,
    how it ended and the command that frees the child."""
    parent = app.enqueue("t", max_attempts=1)
    child = app.enqueue("t", depends_on=[parent])
    with pytest.raises(ResultNotReady, match=f"job {child} is pending, waiting for 1 parent: it has no result yet"):
        app.result(child)
    [job] = app.claim()
    app.fail(job, Permanent("no stock"))
    said = (f"job {child} is pending, waiting for 1 parent; its parent job {parent} ended dead (PERMANENT) and "
            f"holds it until that parent is replayed (`pgworker dead replay {parent} --schema {app.settings.schema}`)"
            " or this job is cancelled")
    with pytest.raises(ResultNotReady) as info:
        app.result(child)
    assert said in str(info.value), str(info.value)
    with pytest.raises(ResultTimeout) as timed:
        app.wait_result(child, timeout=0.2, poll_seconds=0.05)
    assert f"job {child} had not finished after 0.2 s: it is pending, waiting for 1 parent; its parent job " \
        f"{parent} ended dead" in str(timed.value), str(timed.value)
    with pytest.raises(ResultTimeout, match=f"its parent job {parent} ended dead"):
        asyncio.run(app.await_result(child, timeout=0.2, poll_seconds=0.05))


def test_wait_result_async(app):
    job_id = app.enqueue("t")
    [job] = app.claim()
    threading.Timer(0.3, lambda: app.complete(job, result=7)).start()
    assert asyncio.run(app.wait_result_async(job_id, timeout=20, poll_seconds=15)) == 7


def test_a_gone_claimers_decided_success_is_settled_with_its_result(app, conn):
    """The claimer decided the success and died before writing it: the settler writes it
    from the slot table, with the result when it fitted in the slot, as lost otherwise."""
    app.configure(_with(app.settings, result_max_bytes=100_000))

    @app.task(name="small")
    def small(payload):
        return {"n": payload}

    @app.task(name="large")
    def large(payload):
        return "y" * 2000  # more than the slot's message holds

    small_id, large_id = app.enqueue("small", 1), app.enqueue("large")
    jobs = sorted(app.claim(limit=2), key=lambda j: j.id)
    table = SlotTable(4)
    executor = Executor(app, table, worker_id="w", error_message_max_chars=200)
    for job in jobs:
        [slot] = table.put_many([s.SlotEntry(job.id, job.lease_token, 0, job.attempt, 0.0, s.RENEW_ALIVE)],
                                claimed_at=time.monotonic())
        table.start(slot, job.id)
        executor.run(job, slot, traced=False)  # decided, recorded in the slot; never written
    items = settler.settlements(table.held(), [], app=app, queue_name=lambda v: "default", kill_reasons={},
                                clear=lambda v: None)
    results = {i.write.lease.job_id: i.write.result for i in items}
    assert results == {small_id: '{"n":1}', large_id: RESULT_LOST}
    reports = write_outcomes(app.store, conn, [i.write for i in items], keys_known=False)
    assert sorted(next(iter(reports.values())).accepted) == [small_id, large_id]
    assert app.result(small_id) == {"n": 1}
    with pytest.raises(ResultLost):
        app.result(large_id)
    assert app.get_job(large_id)["state"] == "succeeded"


def test_the_producer_and_viewer_roles_read_results_and_the_worker_stores_them(app, pg_dsn, conn):
    """The least-privilege roles of `pgworker sql grants`: a worker completes with a
    result, a producer reads it."""
    from pgworker.grants import grant_statements

    schema = app.settings.schema
    suffix = schema[-12:]
    roles = {k: f"r21_{k}_{suffix}" for k in ("producer", "worker", "viewer")}
    try:
        for r in roles.values():
            conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(r)))
        for statement in grant_statements(schema, **roles):
            conn.execute(statement)
        job_id = app.enqueue("t")
        dsn = {k: psycopg.conninfo.make_conninfo(pg_dsn, user=r) for k, r in roles.items()}
        as_worker = App(settings=_with(app.settings, dsn=dsn["worker"]))
        as_producer = App(settings=_with(app.settings, dsn=dsn["producer"]))
        try:
            [job] = as_worker.claim()
            as_worker.complete(job, result={"by": "worker"})
            assert as_producer.result(job_id) == {"by": "worker"}
            with psycopg.connect(dsn["viewer"]) as viewer:
                assert result_rows(viewer, schema) == [(job_id, {"by": "worker"})]
        finally:
            as_worker.close()
            as_producer.close()
    finally:
        for r in roles.values():
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(r)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(r)))


def test_progress_is_durable_fenced_rate_limited_and_shown(app, conn):
    from pgworker import JobContext, LeaseLost
    from pgworker.worker.shm import layout as s

    schema = app.settings.schema
    job_id = app.enqueue("t")
    [job] = app.claim()
    table = SlotTable(2)
    [slot] = table.put_many([s.SlotEntry(job.id, job.lease_token, 0, job.attempt, 0.0, s.RENEW_PROGRESS)],
                            claimed_at=time.monotonic())
    table.start(slot, job.id)
    ctx = JobContext(job, table, slot, app=app)
    before = table.held()[0].progress_at
    assert ctx.progress(0.25, "a quarter\x00of the rows") is True
    assert table.held()[0].progress_at > before  # evidence of progress for the lease
    assert ctx.progress(0.5) is False  # within the interval: shared memory only
    row = app.get_job(job_id)
    assert (row["progress"], row["progress_message"]) == (0.25, "a quarter\ufffdof the rows")
    assert ctx.progress(0.5, "half", force=True) is True
    assert app.get_job(job_id)["progress"] == 0.5
    for bad in (1.5, -0.1, float("nan"), "half", True):
        with pytest.raises(ValueError):
            ctx.progress(bad)
    assert len(app.get_job(job_id)["progress_message"]) == 4
    ctx.progress(0.6, "x" * 1000, force=True)
    assert len(app.get_job(job_id)["progress_message"]) == 200
    # one line, as documented (a trial: line breaks, tabs and a right-to-left override kept)
    ctx.progress(0.6, " rows\n  3/4\tdone \u202egnp.exe\u2066 ", force=True)
    assert app.get_job(job_id)["progress_message"] == "rows 3/4 done \ufffdgnp.exe\ufffd"
    # fenced: once the lease moved to another attempt, the old context's write is refused
    expire(conn, schema, job.id)
    app.reap(retry=NO_BACKOFF)
    [again] = app.claim()
    with pytest.raises(LeaseLost):
        ctx.progress(0.9, "stale", force=True)
    assert app.get_job(job_id)["progress"] == pytest.approx(0.6)
    assert "progress" not in app.get_job(app.enqueue("t"))  # never reported: not shown


def test_jobs_show_prints_progress_as_a_percentage_exact_enough_to_match_its_message(app, conn, pg_dsn, capsys):
    """0.975 beside "step 39/40" was shown "1.0" (the one-decimal float format): now
    "97.5 %", never 100 % before the end; --json keeps the fraction."""
    from pgworker.cli import main

    schema = app.settings.schema
    job_id = app.enqueue("t")
    flags = ["--dsn", pg_dsn, "--schema", schema]
    for fraction, shown in ((0.975, "97.5 %"), (0.9999, "99.9 %"), (0.25, "25 %")):
        conn.execute(sql.SQL("UPDATE {}.jobs SET progress = %s, progress_message = 'step 39/40', progress_at = now() "
                             "WHERE id = %s")
                     .format(sql.Identifier(schema)), [fraction, job_id])
        capsys.readouterr()
        assert main(["jobs", "show", str(job_id), *flags]) == 0
        [line] = [x for x in capsys.readouterr().out.splitlines() if x.strip().startswith("progress ")]
        assert line.split(None, 1)[1] == shown, line
    assert main(["jobs", "show", str(job_id), "--json", *flags]) == 0
    assert json.loads(capsys.readouterr().out)["progress"] == 0.25


def test_a_progress_write_brings_a_cancel_request_to_the_handler(app, conn):
    """The renewal carries a cancel every lease/3 (20 s at the default lease); a handler
    that reports progress sees it at its next durable progress write."""
    from pgworker import JobCancelled, JobContext
    from pgworker.worker.shm import layout as s

    job_id = app.enqueue("t")
    [job] = app.claim()
    table = SlotTable(2)
    [slot] = table.put_many([s.SlotEntry(job.id, job.lease_token, 0, job.attempt, 0.0, s.RENEW_PROGRESS)],
                            claimed_at=time.monotonic())
    table.start(slot, job.id)
    ctx = JobContext(job, table, slot, app=app)
    assert ctx.progress(0.1, "first") is True
    assert not ctx.cancel_requested
    assert app.cancel(job_id) == "running"
    assert ctx.progress(0.2) is False  # throttled: no write, nothing read
    assert not ctx.cancel_requested
    assert ctx.progress(0.3, "third", force=True) is True
    assert ctx.cancel_requested
    with pytest.raises(JobCancelled):
        ctx.check()


def test_the_last_throttled_progress_is_written_when_the_handler_ends(app, conn):
    calls = []

    @app.task(name="steps")
    def steps(payload, ctx):
        for k in range(1, 7):
            calls.append(ctx.progress(k / 6, f"step {k}/6"))
        if payload:
            raise Permanent("broke after its last step")

    app.task(name="t")(lambda payload: None)
    ok, failed, quiet = app.enqueue("steps", None), app.enqueue("steps", True), app.enqueue("t")
    drain(app)
    assert calls.count(True) == 2  # the throttle wrote the first call of each job only
    for job_id, state in ((ok, "succeeded"), (failed, "dead")):
        job = app.get_job(job_id)
        assert (job["state"], job["progress"], job["progress_message"]) == (state, 1.0, "step 6/6")
    assert "progress" not in app.get_job(quiet)  # no report, no write
