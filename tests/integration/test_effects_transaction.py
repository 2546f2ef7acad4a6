"""ctx.transaction() against a real PostgreSQL (through pgworker.testing.drain, the
worker's executor): the handler's writes and the job's fenced success commit together;
a refused fence rolls everything back and tells the handler; a raise inside rolls back;
a raise after the commit leaves the job succeeded; a failed COMMIT is read back."""

from __future__ import annotations

import psycopg
import pytest
from psycopg import sql

import pgworker
from pgworker.testing import drain

pytestmark = pytest.mark.integration


@pytest.fixture
def orders(app, conn):
    conn.execute(sql.SQL("CREATE TABLE {}.orders (id bigserial PRIMARY KEY, job_id bigint, note text)")
                 .format(sql.Identifier(app.settings.schema)))
    return lambda: conn.execute(sql.SQL("SELECT job_id, note FROM {}.orders ORDER BY id")
                                .format(sql.Identifier(app.settings.schema))).fetchall()


def insert(conn, schema, job_id, note="ok"):
    conn.execute(sql.SQL("INSERT INTO {}.orders (job_id, note) VALUES (%s, %s)").format(sql.Identifier(schema)),
                 [job_id, note])


def job_row(conn, schema, job_id):
    return conn.execute(sql.SQL("SELECT state::text, attempts, lease_token, last_error_code FROM {}.jobs "
                                "WHERE id = %s").format(sql.Identifier(schema)), [job_id]).fetchone()


def test_writes_and_success_commit_together_and_no_second_outcome_is_written(app, conn, orders):
    schema = app.settings.schema

    @app.task(name="order")
    def order(payload, ctx):
        with ctx.transaction() as c:
            insert(c, schema, ctx.job_id)
            # inside: the success is not visible to others yet
            assert job_row(conn, schema, ctx.job_id)[0] == "running"
        assert ctx.committed

    job_id = app.enqueue("order", {})
    result = drain(app)
    assert result.counts["succeeded"] == 1 and result.counts["lost"] == 0
    assert orders() == [(job_id, "ok")]
    state, attempts, _, code = job_row(conn, schema, job_id)
    assert (state, attempts, code) == ("succeeded", 1, None)


def test_fence_refusal_rolls_back_the_handlers_writes_and_raises_lease_lost(app, conn, orders):
    schema = app.settings.schema
    told = []

    @app.task(name="order", max_attempts=1)
    def order(payload, ctx):
        # another owner takes the job while this attempt runs (its token moves on)
        conn.execute(sql.SQL("UPDATE {}.jobs SET lease_token = lease_token + 1 WHERE id = %s")
                     .format(sql.Identifier(schema)), [ctx.job_id])
        try:
            with ctx.transaction() as c:
                insert(c, schema, ctx.job_id, "stale")
        except pgworker.LeaseLost as exc:
            told.append(exc.operation)
            raise

    job_id = app.enqueue("order", {})
    result = drain(app)
    assert told == ["complete_in_transaction"]
    assert orders() == []  # the stale insert was rolled back with the refused success
    assert result.counts["lost"] == 1
    assert job_row(conn, schema, job_id)[0] == "running"  # still the other owner's


def test_an_exception_inside_the_block_rolls_back_and_fails_the_attempt(app, conn, orders):
    schema = app.settings.schema

    @app.task(name="order", max_attempts=2, retry=pgworker.RetryPolicy(base_seconds=0.0, jitter=0.0))
    def order(payload, ctx):
        with ctx.transaction() as c:
            insert(c, schema, ctx.job_id, f"attempt {ctx.attempt}")
            if ctx.attempt == 1:
                raise ValueError("boom")

    job_id = app.enqueue("order", {})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["retried", "succeeded"]
    assert orders() == [(job_id, "attempt 2")]


def test_raising_after_the_commit_leaves_the_job_succeeded(app, conn, orders, caplog):
    schema = app.settings.schema

    @app.task(name="order", max_attempts=3)
    def order(payload, ctx):
        with ctx.transaction() as c:
            insert(c, schema, ctx.job_id)
        raise RuntimeError("after the commit")

    job_id = app.enqueue("order", {})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["succeeded"]
    assert job_row(conn, schema, job_id)[:2] == ("succeeded", 1)
    assert orders() == [(job_id, "ok")]
    assert "after its transaction committed: after the commit;" in caplog.text  # its message too (a trial)


def test_steps_and_progress_after_the_commit_neither_run_nor_read_as_a_lost_lease(app, conn, orders, caplog):
    """A trial: after the block, ctx.step ran its function, then its record was refused
    as "the lease was lost" (the row had left 'running'), and ctx.progress raised
    LeaseLost. A step now refuses before its function runs, naming the fix; a progress
    report is not written (the job has ended) and raises nothing."""
    schema = app.settings.schema
    ran, seen = [], []

    @app.task(name="order", max_attempts=3)
    def order(payload, ctx):
        with ctx.transaction() as c:
            insert(c, schema, ctx.job_id)
            ctx.progress(0.5, "inside", force=True)
        seen.append(ctx.progress(1.0, "all done", force=True))
        if payload["step"]:
            ctx.step("after", lambda: ran.append("after"))

    quiet = app.enqueue("order", {"step": False})
    stepping = app.enqueue("order", {"step": True})
    result = drain(app, skip_backoff=True)
    assert [a.outcome for a in result.attempts] == ["succeeded", "succeeded"]
    assert seen == [False, False] and ran == []
    assert "the step was not run; do this work inside the transaction block or before it" in caplog.text
    assert "LeaseLost" not in caplog.text and "lease was lost" not in caplog.text, caplog.text
    for job_id in (quiet, stepping):
        job = app.get_job(job_id)
        assert (job["state"], job["progress"], job["progress_message"]) == ("succeeded", 0.5, "inside"), job


def test_one_transaction_per_attempt(app, conn, orders):
    schema = app.settings.schema
    errors = []

    @app.task(name="order")
    def order(payload, ctx):
        with ctx.transaction() as c:
            insert(c, schema, ctx.job_id)
            try:
                with ctx.transaction():
                    pass
            except RuntimeError as exc:
                errors.append(str(exc))
        try:
            with ctx.transaction():
                pass
        except RuntimeError as exc:
            errors.append(str(exc))

    app.enqueue("order", {})
    result = drain(app)
    assert result.counts["succeeded"] == 1, result.attempts
    assert "do not nest" in errors[0] and "already committed" in errors[1]
    assert len(orders()) == 1


def test_a_commit_whose_reply_is_lost_is_read_back_from_the_row(app, conn, orders, monkeypatch):
    """The COMMIT raises (as when the connection drops after the server committed): the
    row, read back, says whether it committed, in both directions."""
    schema = app.settings.schema
    from pgworker.effects import transaction as tx_module

    real_exit = psycopg.Transaction.__exit__
    mode = {}

    def exit_then_fail(self, exc_type, exc, tb):
        handler = self.connection.info.parameter_status("application_name").startswith("pgworker:handler")
        if exc_type is not None or "mode" not in mode or not handler:
            return real_exit(self, exc_type, exc, tb)
        if mode.pop("mode") == "committed":
            real_exit(self, None, None, None)  # the server committed; the reply is "lost"
        else:
            real_exit(self, RuntimeError, RuntimeError("x"), None)  # it rolled back
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Transaction, "__exit__", exit_then_fail)
    seen = []

    @app.task(name="order", max_attempts=2, retry=pgworker.RetryPolicy(base_seconds=0.0, jitter=0.0))
    def order(payload, ctx):
        mode["mode"] = payload["mode"] if ctx.attempt == 1 else "none"
        if mode["mode"] == "none":
            mode.pop("mode")
        try:
            with ctx.transaction() as c:
                insert(c, schema, ctx.job_id, f"{payload['mode']} {ctx.attempt}")
        except psycopg.OperationalError:
            seen.append(("raised", ctx.attempt))
            raise
        seen.append(("ok", ctx.attempt))

    committed = app.enqueue("order", {"mode": "committed"})
    result = drain(app, skip_backoff=True)
    assert seen == [("ok", 1)] and [a.outcome for a in result.attempts] == ["succeeded"]
    assert orders() == [(committed, "committed 1")]
    seen.clear()
    rolled_back = app.enqueue("order", {"mode": "rolled_back"})
    result = drain(app, skip_backoff=True)
    assert seen == [("raised", 1), ("ok", 2)]
    assert [a.outcome for a in result.attempts] == ["retried", "succeeded"]
    assert orders() == [(committed, "committed 1"), (rolled_back, "rolled_back 2")]
    assert tx_module.OPERATION == "complete_in_transaction"


def test_completion_in_a_transaction_promotes_the_next_job_of_its_ordering_key(app, conn, orders):
    schema = app.settings.schema

    @app.task(name="order")
    def order(payload, ctx):
        with ctx.transaction() as c:
            insert(c, schema, ctx.job_id, str(payload["n"]))

    ids = [app.enqueue("order", {"n": n}, ordering_key="customer-1") for n in range(3)]
    result = drain(app)
    assert result.counts["succeeded"] == 3
    assert orders() == [(ids[0], "0"), (ids[1], "1"), (ids[2], "2")]


def test_a_context_built_by_hand_has_no_transaction():
    from pgworker.context import JobContext
    ctx = JobContext(None)  # type: ignore[arg-type]
    with pytest.raises(RuntimeError, match="given by a worker"):
        ctx.transaction()


def test_an_async_handlers_transaction_commits_with_its_success_or_rolls_back(app, conn, orders):
    """ctx.atransaction(): the same success statement (through the async bridge), with an
    ordering key (its lock and promotion join the transaction), and the fence."""
    schema = app.settings.schema
    told = []

    @app.task(name="aorder", max_attempts=1)
    async def aorder(payload, ctx):
        if payload.get("steal"):
            conn.execute(sql.SQL("UPDATE {}.jobs SET lease_token = lease_token + 1 WHERE id = %s")
                         .format(sql.Identifier(schema)), [ctx.job_id])
        try:
            async with ctx.atransaction() as c:
                assert isinstance(c, psycopg.AsyncConnection)
                await c.execute(sql.SQL("INSERT INTO {}.orders (job_id, note) VALUES (%s, %s)")
                                .format(sql.Identifier(schema)), [ctx.job_id, payload["note"]])
                if payload.get("step"):
                    ctx.step("s", lambda: 1)
        except (pgworker.LeaseLost, RuntimeError) as exc:
            told.append(type(exc).__name__)
            raise

    ids = [app.enqueue("aorder", {"note": str(n)}, ordering_key="k") for n in range(2)]
    stolen = app.enqueue("aorder", {"note": "stolen", "steal": True})
    stepped = app.enqueue("aorder", {"note": "step", "step": True})
    result = drain(app)
    assert orders() == [(ids[0], "0"), (ids[1], "1")]
    assert told == ["LeaseLost", "RuntimeError"]
    assert [job_row(conn, schema, i)[0] for i in (*ids, stolen, stepped)] == ["succeeded", "succeeded", "running",
                                                                             "dead"]
    assert result.counts["succeeded"] == 2
