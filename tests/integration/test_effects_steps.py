"""ctx.step() and ctx.effect() against a real PostgreSQL (through pgworker.testing.drain,
the worker's executor): a step runs once across attempts; inside ctx.transaction() its
record commits (or rolls back) with the handler's writes; a stale owner's record is
refused by the fence; bounds and bad results fail the attempt with a clear code;
effects are reconciled or left uncertain; an operator resolves them; a clean replay
forgets the steps."""

from __future__ import annotations

import time

import pytest
from psycopg import sql

import pgworker
from pgworker.testing import drain

pytestmark = pytest.mark.integration
NOW = pgworker.RetryPolicy(base_seconds=0.0, jitter=0.0)


def steps(conn, schema, job_id):
    return conn.execute(sql.SQL("SELECT name, kind, status, result, attempt FROM {}.job_steps WHERE job_id = %s "
                                "ORDER BY created_at, name").format(sql.Identifier(schema)), [job_id]).fetchall()


def job_row(conn, schema, job_id):
    return conn.execute(sql.SQL("SELECT state::text, attempts, last_error_code FROM {}.jobs WHERE id = %s")
                        .format(sql.Identifier(schema)), [job_id]).fetchone()


def test_a_step_runs_once_across_attempts_and_its_result_comes_back_as_json(app, conn):
    calls = []

    @app.task(name="pipeline", max_attempts=3, retry=NOW)
    def pipeline(payload, ctx):
        a = ctx.step("fetch", lambda: calls.append("fetch") or (1, {"rows": 2}))
        assert a == [1, {"rows": 2}]  # through JSON on every attempt, the first included
        if ctx.attempt == 1:
            raise ConnectionError("flaky after the step")
        ctx.step("store", lambda: calls.append("store") or "stored")

    job_id = app.enqueue("pipeline", {})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["retried", "succeeded"]
    assert calls == ["fetch", "store"]
    assert steps(conn, app.settings.schema, job_id) == [
        ("fetch", "step", "done", [1, {"rows": 2}], 1), ("store", "step", "done", "stored", 2)]


def test_a_step_name_used_twice_in_one_attempt_is_refused_and_a_failed_step_may_be_tried_again(app, conn):
    """A trial: ctx.step("same", ...) twice in one attempt returned the first result and
    skipped the second function without a sign (a loop's steps would all be the first).
    The second use is STEP_NAME_REUSED (permanent: the same code does it again); a step
    whose function raised was not recorded, and the handler may try it again by name."""
    calls = []

    @app.task(name="loop", max_attempts=3, retry=NOW)
    def loop(payload, ctx):
        for item in payload["items"]:
            ctx.step("charge", lambda: calls.append(item) or item)

    @app.task(name="flaky_inside", max_attempts=1)
    def flaky_inside(payload, ctx):
        for tries in range(3):
            try:
                return ctx.step("fetch", lambda: 1 / tries)
            except ZeroDivisionError:
                continue

    looped = app.enqueue("loop", {"items": [1, 2]})
    retried = app.enqueue("flaky_inside", None)
    drain(app, skip_backoff=True)
    assert calls == [1]
    assert job_row(conn, app.settings.schema, looped) == ("dead", 1, "STEP_NAME_REUSED")
    message = app.get_job(looped)["errors"][-1]["message"]
    assert "'charge' was already used by a step or effect of this attempt" in message
    assert 'f"charge:{item_id}"' in message, message
    assert job_row(conn, app.settings.schema, retried) == ("succeeded", 1, None)
    assert app.result(retried) == 1.0


def test_a_step_rolled_back_with_its_block_or_savepoint_may_run_again_under_its_name(app, conn):
    """A break-it trial of STEP_NAME_REUSED: a handler that retries its ctx.transaction()
    block after an error, or rolls back a savepoint around a step, calls the step again;
    its record went with the rollback, so it is not a reuse (the job went dead). Twice in
    one block, with the record still there, is."""
    calls = []

    @app.task(name="retry_block", max_attempts=1)
    def retry_block(payload, ctx):
        try:
            with ctx.transaction():
                ctx.step("a", lambda: calls.append("first") or 1)
                raise ConnectionError("the block fails after the step")
        except ConnectionError:
            pass
        with ctx.transaction():
            return ctx.step("a", lambda: calls.append("second") or 2)

    @app.task(name="savepoint", max_attempts=1)
    def savepoint(payload, ctx):
        with ctx.transaction() as c:
            try:
                with c.transaction():
                    ctx.step("b", lambda: calls.append("in savepoint") or 1)
                    raise ValueError("undo the savepoint")
            except ValueError:
                pass
            return ctx.step("b", lambda: calls.append("after") or 2)

    @app.task(name="twice_in_block", max_attempts=1)
    def twice_in_block(payload, ctx):
        with ctx.transaction():
            ctx.step("c", lambda: 1)
            ctx.step("c", lambda: 2)

    jobs = [app.enqueue(t, None) for t in ("retry_block", "savepoint", "twice_in_block")]
    drain(app, skip_backoff=True)
    schema = app.settings.schema
    assert [job_row(conn, schema, j) for j in jobs] == [
        ("succeeded", 1, None), ("succeeded", 1, None), ("dead", 1, "STEP_NAME_REUSED")]
    assert calls == ["first", "second", "in savepoint", "after"]


def test_a_step_inside_the_transaction_commits_or_rolls_back_with_the_handlers_writes(app, conn):
    schema = app.settings.schema
    conn.execute(sql.SQL("CREATE TABLE {}.orders (job_id bigint, attempt int)").format(sql.Identifier(schema)))

    @app.task(name="order", max_attempts=3, retry=NOW)
    def order(payload, ctx):
        with ctx.transaction() as c:
            def write():
                c.execute(sql.SQL("INSERT INTO {}.orders VALUES (%s, %s)").format(sql.Identifier(schema)),
                          [ctx.job_id, ctx.attempt])
                return {"attempt": ctx.attempt}
            got = ctx.step("insert", write)
            if ctx.attempt == 1:
                raise ValueError("rolled back: the insert and the step's record with it")
            assert got == {"attempt": ctx.attempt}

    job_id = app.enqueue("order", {})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["retried", "succeeded"]
    assert conn.execute(sql.SQL("SELECT * FROM {}.orders").format(sql.Identifier(schema))).fetchall() == \
        [(job_id, 2)]
    assert steps(conn, schema, job_id) == [("insert", "step", "done", {"attempt": 2}, 2)]


def test_a_stale_owners_step_record_is_refused_by_the_fence(app, conn):
    schema = app.settings.schema
    told = []

    @app.task(name="stale", max_attempts=1)
    def stale(payload, ctx):
        conn.execute(sql.SQL("UPDATE {}.jobs SET lease_token = lease_token + 1 WHERE id = %s")
                     .format(sql.Identifier(schema)), [ctx.job_id])
        try:
            ctx.step("s", lambda: 1)
        except pgworker.LeaseLost as exc:
            told.append(exc.operation)
            raise

    job_id = app.enqueue("stale", {})
    drain(app)
    assert told == ["step"]
    assert steps(conn, schema, job_id) == []


@pytest.mark.parametrize("value, code", [
    (object(), "STEP_RESULT_INVALID"), (float("nan"), "STEP_RESULT_INVALID"), ("x" * 100, "STEP_RESULT_TOO_LARGE"),
    ("\x00", "STEP_RESULT_INVALID"), ("\udc80", "STEP_RESULT_INVALID")])
def test_a_result_that_is_not_json_or_too_large_fails_the_attempt_with_a_clear_code(pg_dsn, schema, value, code):
    from pg import make_settings
    app = pgworker.App(settings=make_settings(pg_dsn, schema, step_result_max_bytes=64))
    app.migrate()
    try:
        @app.task(name="bad")
        def bad(payload, ctx):
            ctx.step("s", lambda: value)

        job_id = app.enqueue("bad", {})
        drain(app)
        with app.connection() as c:
            assert job_row(c, schema, job_id) == ("dead", 1, code)
            assert steps(c, schema, job_id) == []
    finally:
        app.close()


def test_steps_past_the_limit_are_refused(pg_dsn, schema):
    from pg import make_settings
    app = pgworker.App(settings=make_settings(pg_dsn, schema, step_max_per_job=2000))
    app.migrate()
    seen = []
    try:
        @app.task(name="many")
        def many(payload, ctx):
            for i in range(2500):
                try:
                    ctx.step(f"s{i}", lambda: i)
                except pgworker.StepError as exc:
                    seen.append((i, exc.code))
                    raise

        job_id = app.enqueue("many", {})
        drain(app)
        with app.connection() as c:
            assert job_row(c, schema, job_id) == ("dead", 1, "STEP_LIMIT")
            assert c.execute(sql.SQL("SELECT count(*) FROM {}.job_steps").format(sql.Identifier(schema))) \
                .fetchone() == (2000,)
        assert seen == [(2000, "STEP_LIMIT")]
    finally:
        app.close()


def test_an_effect_started_without_done_is_reconciled_or_left_uncertain(app, conn):
    schema = app.settings.schema
    calls, asked = [], []
    destination = {}  # what the destination saw, by idempotency key

    def charge(key):
        calls.append(key)
        destination[key] = "ch_1"
        if len(calls) == 1:
            raise ConnectionError("the reply was lost")  # the charge happened; its 'done' never recorded
        return {"charge": destination[key]}

    def reconcile(key):
        asked.append(key)
        return {"charge": destination[key]} if key in destination else pgworker.NOT_DONE

    @app.task(name="pay", max_attempts=3, retry=NOW)
    def pay(payload, ctx):
        return ctx.effect("charge", charge, reconcile=reconcile if payload["reconcile"] else None)

    job_id = app.enqueue("pay", {"reconcile": True})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["retried", "succeeded"]
    assert len(calls) == 1 and asked == calls  # the second attempt asked; it did not call again
    assert steps(conn, schema, job_id) == [("charge", "effect", "done", {"charge": "ch_1"}, 1)]

    calls.clear(), asked.clear(), destination.clear()
    uncertain = app.enqueue("pay", {"reconcile": False})
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, uncertain) == ("dead", 2, "EFFECT_UNCERTAIN")
    assert len(calls) == 1
    assert steps(conn, schema, uncertain) == [("charge", "effect", "started", None, 1)]


def test_an_effect_the_destination_never_saw_is_called_again_with_the_same_key(app, conn):
    calls = []

    def send(key):
        calls.append(key)
        if len(calls) == 1:
            raise ConnectionError("never reached the destination")
        return "sent"

    @app.task(name="send", max_attempts=3, retry=NOW)
    def send_task(payload, ctx):
        ctx.effect("send", send, reconcile=lambda key: pgworker.NOT_DONE)

    job_id = app.enqueue("send", {})
    drain(app, skip_backoff=True)
    assert len(calls) == 2 and calls[0] == calls[1] and calls[0].endswith(":send")
    assert job_row(conn, app.settings.schema, job_id)[0] == "succeeded"


def test_an_effect_inside_a_transaction_is_refused(app):
    errors = []

    @app.task(name="wrong", max_attempts=1)
    def wrong(payload, ctx):
        with ctx.transaction():
            try:
                ctx.effect("e", lambda key: 1)
            except pgworker.StepError as exc:
                errors.append(str(exc))

    @app.task(name="wrong_uncaught", max_attempts=5)
    def wrong_uncaught(payload, ctx):
        with ctx.transaction():
            ctx.effect("e", lambda key: 1)

    app.enqueue("wrong", {})
    uncaught = app.enqueue("wrong_uncaught", {})
    result = drain(app, skip_backoff=True)
    assert "outside the block" in errors[0]
    # the same code fails the same way every time: dead at once, not retried 5 times (a trial)
    job = app.get_job(uncaught)
    assert job["state"] == "dead" and job["attempts"] == 1 and job["last_error_code"] == "EFFECT_IN_TRANSACTION"
    assert result.retried == 0


def test_an_operator_resolves_an_uncertain_effect_and_a_clean_replay_forgets_steps(app, conn):
    schema = app.settings.schema
    calls = []

    def charge(key):
        calls.append(key)
        if len([c for c in calls if c != "quote"]) == 1:
            raise ConnectionError("the reply was lost")
        return "ch_2"

    @app.task(name="pay", max_attempts=2, retry=NOW)
    def pay(payload, ctx):
        ctx.step("quote", lambda: calls.append("quote") or 10)
        return ctx.effect("charge", charge)

    job_id = app.enqueue("pay", {})
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, job_id) == ("dead", 2, "EFFECT_UNCERTAIN")
    shown = app.get_job(job_id)["steps"]
    assert [(s["name"], s["kind"], s["status"]) for s in shown] == [("quote", "step", "done"),
                                                                      ("charge", "effect", "started")]
    assert shown[1]["idempotency_key"].endswith(":charge")
    with pytest.raises(pgworker.ConfigError, match="no effect 'quote' left started"):
        app.resolve_effect(job_id, "quote", result=1)
    for unclear in ({}, {"result": 1, "retry": True}):  # neither or both: refused, nothing changed
        with pytest.raises(pgworker.ConfigError, match="exactly one of them"):
            app.resolve_effect(job_id, "charge", **unclear)
    assert app.get_job(job_id)["steps"][1]["status"] == "started"
    # the destination says it happened: recorded done, the replayed job does not call again
    assert app.resolve_effect(job_id, "charge", result={"charge": "ch_1"}, actor="ops") == "dead"
    assert list(app.replay([job_id])) == [job_id]
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, job_id)[0] == "succeeded" and calls.count("quote") == 1 and len(calls) == 2, calls
    assert [(s["status"], s["result"], s["resolved_by"]) for s in app.get_job(job_id)["steps"]][1] == \
        ("done", {"charge": "ch_1"}, "ops")

    # --retry: forgotten, the next attempt calls again with the same key
    other = app.enqueue("pay", {})
    calls[:] = ["quote", "pad"]  # the charge of this job succeeds at once...
    with app.connection() as c:  # ...after an earlier attempt left it started (as a crash would)
        c.execute(sql.SQL("INSERT INTO {}.job_steps (job_id, name, kind, status, idempotency_key, attempt, "
                          "lease_token) VALUES (%s, 'charge', 'effect', 'started', 'k', 1, 0)")
                  .format(sql.Identifier(schema)), [other])
        c.execute(sql.SQL("UPDATE {}.jobs SET state = 'dead', finished_at = now() WHERE id = %s")
                  .format(sql.Identifier(schema)), [other])
    app.resolve_effect(other, "charge", retry=True)
    app.replay([other])
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, other)[0] == "succeeded"

    # a clean replay: the steps are forgotten in the replay's transaction
    with app.connection() as c:
        c.execute(sql.SQL("UPDATE {}.jobs SET state = 'dead', finished_at = now() WHERE id = %s")
                  .format(sql.Identifier(schema)), [job_id])
    recorded = sorted(row[0] for row in steps(conn, schema, job_id))
    assert list(app.replay([job_id], clean=True, actor="ops@example")) == [job_id]
    assert steps(conn, schema, job_id) == []
    # audited (a trial: a clean replay left no trace of what it forgot)
    events = app.get_job(job_id)["events"]
    assert [e["kind"] for e in events[-2:]] == ["replayed", "steps_forgotten"], events
    assert events[-1]["actor"] == "ops@example"
    assert events[-1]["detail"] == {"count": len(recorded), "names": recorded}, events[-1]


def test_the_cli_resolves_an_uncertain_effect_with_retry_and_replays_it(app, conn, pg_dsn, capsys):
    """`pgworker effects resolve ID NAME --retry --replay` on a real EFFECT_UNCERTAIN job:
    forgotten and replayed, the next attempt calls again and the job succeeds. (The CLI
    passed result=None beside retry=True, refused every time.) Bad --result says so in
    the CLI's terms."""
    from pgworker.cli import main

    schema = app.settings.schema
    calls = []

    def charge(key):
        calls.append(key)
        if len(calls) == 1:  # the reply is lost: started, no end; attempt 2 finds it uncertain
            raise ConnectionError("the reply was lost")
        return "ch_3"

    @app.task(name="pay", max_attempts=2, retry=NOW)
    def pay(payload, ctx):
        return ctx.effect("charge", charge)

    job_id = app.enqueue("pay", {})
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, job_id) == ("dead", 2, "EFFECT_UNCERTAIN")
    flags = ["--dsn", pg_dsn, "--schema", schema]
    capsys.readouterr()
    assert main(["effects", "resolve", str(job_id), "charge", "--result", "NaN", *flags]) != 0
    err = capsys.readouterr().err
    assert "--result is not valid JSON" in err and "result=" not in err
    # a plain replay before resolving says where it leads (a trial: "replayed 1 job", dead again)
    assert main(["dead", "replay", str(job_id), *flags]) == 0
    err = capsys.readouterr().err
    assert (f"note: job {job_id}'s effect 'charge' was started by an earlier attempt that never recorded its end: "
            "unless the handler gives a reconcile function, the job goes dead EFFECT_UNCERTAIN again") in err, err
    assert f"`pgworker effects resolve {job_id} charge --result JSON --schema {schema}`" in err, err
    drain(app, skip_backoff=True)  # and so it does: dead again, still uncertain
    assert job_row(conn, schema, job_id) == ("dead", 1, "EFFECT_UNCERTAIN")
    assert main(["effects", "resolve", str(job_id), "charge", "--retry", "--replay", *flags]) == 0
    out = capsys.readouterr()
    assert "marked to be called again" in out.out and "replayed" in out.out, out
    assert job_row(conn, schema, job_id)[0] == "pending"
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, job_id)[0] == "succeeded" and len(calls) == 2 and len(set(calls)) == 1
    assert main(["effects", "resolve", str(job_id), "charge", "--retry", *flags]) != 0
    assert f"pgworker jobs show {job_id} --schema {schema}" in capsys.readouterr().err


def test_a_handler_connection_terminated_between_two_jobs_is_replaced_before_the_next_jobs_records(app, conn):
    """The claimer's handler connection, killed while idle between two jobs (as a server
    restart does: pg_terminate_backend sends the same AdminShutdown): the next job's
    step and effect records succeed on attempt 1. (They failed with AdminShutdown, and
    the job spent an attempt.)"""
    schema = app.settings.schema
    terminated = []

    @app.task(name="record", max_attempts=3, retry=NOW)
    def record(payload, ctx):
        ctx.step("s", lambda: ctx.job_id)
        ctx.effect("e", lambda key: key)
        if terminated:
            return
        with ctx.transaction() as c:  # the handler connection itself: its backend's pid
            pid = c.execute("SELECT pg_backend_pid()").fetchone()[0]
        with __import__("psycopg").connect(app.settings.dsn, autocommit=True) as killer:
            name = killer.execute("SELECT application_name FROM pg_stat_activity WHERE pid = %s", [pid]).fetchone()
            assert name is not None and name[0].startswith("pgworker:handler:"), name
            assert killer.execute("SELECT pg_terminate_backend(%s)", [pid]).fetchone() == (True,)
        terminated.append(pid)
        time.sleep(1.2)  # idle past POOL_CHECK_IDLE_SECONDS: the next get() checks the connection

    first = app.enqueue("record", {})
    second = app.enqueue("record", {})
    drain(app, skip_backoff=True)
    assert terminated
    for job_id in (first, second):
        assert job_row(conn, schema, job_id) == ("succeeded", 1, None)
        assert [(name, status, attempt) for name, _, status, _, attempt in steps(conn, schema, job_id)] == \
            [("s", "done", 1), ("e", "done", 1)]


def test_steps_go_with_their_job_when_it_is_pruned(app, conn):
    @app.task(name="one")
    def one(payload, ctx):
        ctx.step("s", lambda: 1)

    app.enqueue("one", {})
    drain(app)
    assert app.prune(0) == 1
    assert conn.execute(sql.SQL("SELECT count(*) FROM {}.job_steps").format(sql.Identifier(app.settings.schema))) \
        .fetchone() == (0,)


def test_a_step_inside_a_stalled_transaction_neither_stops_renewal_nor_keeps_the_reaper_out(app, pg_dsn, conn):
    """A step recorded inside ctx.transaction() keeps the job's row locked (FOR KEY SHARE,
    the lock of its foreign key) until the block commits. The renewer and the reaper lock
    the row FOR NO KEY UPDATE SKIP LOCKED, which that lock does not block: while the
    worker's block runs, its lease is renewed; once it stalls past the lease (SIGSTOP, a
    paused VM), the reaper takes the job back, and the block's fenced success then
    refuses and rolls back the step's record. (With FOR SHARE, and the reaper's FOR
    UPDATE, the renewal and the reap both skipped the row: a stalled worker kept its job
    running past its lease for as long as it stalled.)"""
    import psycopg

    schema = app.settings.schema
    job_id = app.enqueue("t")
    [job] = app.claim(lease_seconds=1.5)
    with psycopg.connect(pg_dsn) as handler:  # the handler's transaction, left open
        owned, _, recorded = app.store.step_record(handler, job.lease, "s", kind="step", status="done",
                                                   result_json="1", key=None, max_steps=10)
        assert owned and recorded
        with psycopg.connect(pg_dsn, autocommit=True) as renewer:
            report = app.store.renew_skip_locked(renewer, [job.lease], lease_seconds=1.5)
        assert report.accepted == (job_id,) and not report.skipped, report
        time.sleep(1.8)  # the worker stalls past its lease
        with psycopg.connect(pg_dsn, autocommit=True) as reaper:
            reaped = app.store.reap(reaper, limit=10)
        assert reaped.requeued == (job_id,), reaped
        assert app.store.complete(handler, [job.lease]).refused == (job_id,)
        handler.rollback()
    assert steps(conn, schema, job_id) == []
    assert job_row(conn, schema, job_id)[0] == "pending"


def test_resolving_a_mistyped_effect_names_the_jobs_uncertain_effects_and_the_hint_gives_one_command(
        app, conn, pg_dsn, capsys):
    """`effects resolve 7 gatway --retry` said only "no effect 'gatway' left started":
    the job's uncertain effects are named, with the closest name. The EFFECT_UNCERTAIN
    error (the dead job's message, its log line) gives the one-command `--retry --replay`
    form, with --schema for a schema other than the default."""
    from pgworker.cli import main

    schema = app.settings.schema

    def gateway(key):
        raise ConnectionError("the reply was lost")

    @app.task(name="pay", max_attempts=2, retry=NOW)
    def pay(payload, ctx):
        ctx.step("quote", lambda: 10)
        return ctx.effect("gateway", gateway)

    job_id = app.enqueue("pay", {})
    drain(app, skip_backoff=True)
    assert job_row(conn, schema, job_id) == ("dead", 2, "EFFECT_UNCERTAIN")
    message = app.get_job(job_id)["errors"][-1]["message"]
    assert f"`pgworker effects resolve {job_id} gateway --retry --replay --schema {schema}`" in message, message
    assert f"`pgworker effects resolve {job_id} gateway --result JSON --replay --schema {schema}`" in message
    flags = ["--dsn", pg_dsn, "--schema", schema]
    capsys.readouterr()
    assert main(["effects", "resolve", str(job_id), "gatway", "--retry", *flags]) == 1
    err = capsys.readouterr().err
    assert f"job {job_id} has no effect 'gatway' left started (uncertain); did you mean 'gateway'?" in err, err
    assert "its effects left uncertain: 'gateway'" in err and f"pgworker jobs show {job_id} --schema {schema}" in err
    with pytest.raises(pgworker.ConfigError, match="'quote' is a step \\(ctx.step\\), not an effect"):
        app.resolve_effect(job_id, "quote", retry=True)
    with pytest.raises(pgworker.ConfigError, match="there is no job 987654321"):
        app.resolve_effect(987654321, "gateway", retry=True)
    assert main(["effects", "resolve", str(job_id), "gateway", "--result", '{"ok": true}', *flags]) == 0
    with pytest.raises(pgworker.ConfigError, match="'gateway' is recorded done already; it has no effect left "
                                                   "uncertain \\(its effects: 'gateway'\\)"):
        app.resolve_effect(job_id, "gateway", retry=True)
