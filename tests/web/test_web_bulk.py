"""Bulk operations: every job a filter matches, exactly once, across a kill -9 of the
process applying them; cancelled between batches; failed with the reason when the
database refuses for good."""

from __future__ import annotations

import threading
import time

import psycopg
import pytest
from console_server import ConsoleServer
from pg import wait_until
from worker import q

from pgworker import bulk
from pgworker.jobfilter import JobFilter

pytestmark = pytest.mark.acceptance

TOKEN = "ops:operator:bulk-token-0123456789"
AUTH = {"Authorization": "Bearer bulk-token-0123456789"}


def _dead(conn, schema, n, task, code="PERMANENT", queue="default"):
    q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload, state, finished_at, last_error_code, attempts) "
      "SELECT %s, %s, jsonb_build_object('n', i), 'dead', now() - i * interval '1 millisecond', %s, 1 "
      "FROM generate_series(1, %s) AS i RETURNING 0", queue, task, code, n)


def _op(conn, schema, op_id):
    rows = q(conn, schema, "SELECT state, applied, examined, cursor_id, max_id FROM {s}.bulk_operations "
             "WHERE id = %s", op_id)
    return dict(zip(("state", "applied", "examined", "cursor_id", "max_id"), rows[0]))


def test_a_replay_of_100000_dead_jobs_survives_a_kill_9_and_replays_each_exactly_once(app, pg_dsn, conn):
    schema = app.settings.schema
    _dead(conn, schema, 100_000, "dies")
    _dead(conn, schema, 3_000, "other")           # dead, but not matched by the filter
    _dead(conn, schema, 2_000, "dies", code="TIMEOUT")  # matched by task, not by code
    q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload) SELECT 'default', 'dies', '{{}}' "
      "FROM generate_series(1, 1000) RETURNING 0")  # pending: matched by task, not a replay's
    conn.execute(psycopg.sql.SQL("ANALYZE {}.jobs").format(psycopg.sql.Identifier(schema)))
    env = {"PGWORKER_WEB_TOKENS": TOKEN, "PGWORKER_WEB_BULK_IDLE_SECONDS": "0.5"}
    with ConsoleServer(pg_dsn, schema, env=env, app=None) as console:
        r = console.post("/api/bulk", headers=AUTH, json={"kind": "replay", "filter": {
            "state": "dead", "task": "dies", "error_code": "PERMANENT"}})
        assert r.status_code == 201, r.text
        op_id = r.json()["id"]
        wait_until(lambda: _op(conn, schema, op_id)["applied"] >= 20_000, timeout=120,
                   message="the first 20,000 replays")
        console.kill9()  # mid-operation: a batch is in flight
    killed = _op(conn, schema, op_id)
    assert killed["state"] == "running" and 20_000 <= killed["applied"] < 100_000, killed
    # what is recorded is exactly what happened: committed batches only
    linked = q(conn, schema, "SELECT count(*) FROM {s}.bulk_operation_jobs WHERE operation_id = %s", op_id)[0][0]
    replayed = q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE task = 'dies' AND state = 'pending' "
                 "AND last_error_code = 'PERMANENT'")[0][0]
    assert linked == killed["applied"] == replayed

    with ConsoleServer(pg_dsn, schema, env=env, app=None):  # a new console resumes from the cursor
        wait_until(lambda: _op(conn, schema, op_id)["state"] == "done", timeout=240, message="the operation to finish")
    done = _op(conn, schema, op_id)
    assert done["applied"] == 100_000 and done["cursor_id"] >= done["max_id"] - 1000, done
    counts = dict(q(conn, schema, "SELECT task || ':' || coalesce(last_error_code, '-') || ':' || state, count(*) "
                    "FROM {s}.jobs GROUP BY 1"))
    assert counts == {"dies:PERMANENT:pending": 100_000, "other:PERMANENT:dead": 3_000, "dies:TIMEOUT:dead": 2_000,
                      "dies:-:pending": 1_000}
    # exactly once, in the table and in the audit trail
    assert q(conn, schema, "SELECT count(*), count(DISTINCT job_id) FROM {s}.bulk_operation_jobs "
             "WHERE operation_id = %s", op_id) == [(100_000, 100_000)]
    events = q(conn, schema, "SELECT count(*), count(DISTINCT job_id), min(actor), max(actor) FROM {s}.job_events "
               "WHERE kind = 'replayed'")
    assert events == [(100_000, 100_000, f"ops (bulk operation {op_id})", f"ops (bulk operation {op_id})")]
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs j JOIN {s}.bulk_operation_jobs b ON b.job_id = j.id "
             "WHERE b.operation_id = %s AND (j.task <> 'dies' OR j.last_error_code <> 'PERMANENT')", op_id) == [(0,)]


def test_a_cancelled_operation_stops_between_batches(app, pg_dsn, conn):
    schema = app.settings.schema
    _dead(conn, schema, 1_000, "dies")
    op = bulk.create(app, "replay", JobFilter(task="dies"), actor="alice", batch_size=100)
    with psycopg.connect(pg_dsn, autocommit=True) as applier:
        assert bulk.apply_batch(app.store, applier)["applied"] == 100
        # a batch in flight holds the operation's row: the cancel waits for it, then wins
        applier.execute("BEGIN")
        claimed = app.store.bulk_operation_claim(applier)
        assert claimed["id"] == op["id"]
        cancelled: dict = {}
        t = threading.Thread(target=lambda: cancelled.update(bulk.cancel(app, op["id"], actor="bob") or {}))
        t.start()
        time.sleep(0.5)
        assert t.is_alive(), "the cancel did not wait for the batch in flight"
        app.store.bulk_operation_advance(applier, operation_id=op["id"], cursor=claimed["cursor_id"] + 100,
                                         examined=100, applied_ids=[], finished=False)
        applier.execute("COMMIT")
        t.join(10)
        assert cancelled["state"] == "cancelled" and cancelled["cancelled_by"] == "bob"
        assert bulk.apply_batch(app.store, applier) is None  # nothing running: no further batch
    after = _op(conn, schema, op["id"])
    assert after["state"] == "cancelled" and after["applied"] == 100
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'pending'") == [(100,)]
    assert q(conn, schema, "SELECT count(*) FROM {s}.job_events WHERE kind = 'replayed'") == [(100,)]


def test_cancel_and_discard_take_only_the_states_they_change(app, conn, pg_dsn):
    schema = app.settings.schema
    _dead(conn, schema, 30, "t")
    pending = app.enqueue_many([("t", {"i": i}) for i in range(20)], any_task=True)
    with pytest.raises(ValueError, match="changes dead jobs"):
        bulk.create(app, "discard", JobFilter(state="pending"), actor="a")
    cancel = bulk.create(app, "cancel", JobFilter(task="t"), actor="a", batch_size=7)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        while bulk.apply_batch(app.store, c) is not None:
            pass
    assert _op(conn, schema, cancel["id"])["applied"] == 20
    assert q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1 ORDER BY 1") == [
        ("cancelled", 20), ("dead", 30)]
    assert sorted(r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.job_events WHERE kind = 'cancelled'")) == pending
    discard = bulk.create(app, "discard", JobFilter(), actor="a")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        while bulk.apply_batch(app.store, c) is not None:
            pass
    assert _op(conn, schema, discard["id"])["applied"] == 30
    assert q(conn, schema, "SELECT state::text, count(*) FROM {s}.jobs GROUP BY 1") == [("cancelled", 50)]


def test_a_batch_the_database_refuses_for_good_fails_the_operation_with_the_reason(app, conn, pg_dsn):
    schema = app.settings.schema
    _dead(conn, schema, 10, "t")
    op = bulk.create(app, "replay", JobFilter(), actor="a")
    # a trigger that refuses replays stands for a privilege or constraint the console's role meets
    ident = psycopg.sql.Identifier(schema)
    conn.execute(psycopg.sql.SQL("CREATE FUNCTION {}.no_replay() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
                                 "RAISE EXCEPTION 'replays are frozen today'; END $$").format(ident))
    conn.execute(psycopg.sql.SQL("CREATE TRIGGER no_replay BEFORE INSERT ON {}.job_events FOR EACH ROW "
                                 "EXECUTE FUNCTION {}.no_replay()").format(ident, ident))
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        row = bulk.apply_batch(app.store, c)
    assert row["state"] == "failed" and "replays are frozen today" in row["error"], row
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'dead'") == [(10,)]
    assert q(conn, schema, "SELECT count(*) FROM {s}.bulk_operation_jobs") == [(0,)]
    assert op["id"] == row["id"]


def test_a_bulk_replay_brings_back_the_children_the_dead_jobs_death_cancelled(app, conn, pg_dsn):
    from pgworker import Permanent

    schema = app.settings.schema
    parents = [app.enqueue("dies", i, max_attempts=1, any_task=True) for i in range(3)]
    children = [app.enqueue("t", depends_on=[p], on_parent_failure="cancel", any_task=True) for p in parents]
    for job in app.claim(limit=3):
        app.fail(job, Permanent("broken"))
    assert {r[0] for r in q(conn, schema, "SELECT last_error_code FROM {s}.jobs WHERE id = ANY(%s)",
                            children)} == {"PARENT_DEAD"}
    op = bulk.create(app, "replay", JobFilter(task="dies"), actor="alice", batch_size=2)
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        while bulk.apply_batch(app.store, c) is not None:
            pass
    assert _op(conn, schema, op["id"])["applied"] == 3
    assert q(conn, schema, "SELECT state::text, blocked, count(*) FROM {s}.jobs WHERE id = ANY(%s) GROUP BY 1, 2",
             children) == [("pending", True, 3)]
    assert q(conn, schema, "SELECT DISTINCT actor FROM {s}.job_events WHERE job_id = ANY(%s)", children) == \
        [(bulk.audit_actor(op),)]


def _audit(conn, schema, kind):
    """{job id: detail} of the audit entries of ``kind``."""
    return dict(q(conn, schema, "SELECT job_id, detail FROM {s}.job_events WHERE kind = %s", kind))


def test_a_bulk_cancel_and_discard_keep_their_reason_on_the_operation_and_each_changed_job(app, conn, pg_dsn):
    schema = app.settings.schema
    _dead(conn, schema, 12, "t")
    _dead(conn, schema, 3, "other")  # not matched: no entry, no reason
    pending = app.enqueue_many([("t", {"i": i}) for i in range(20)], any_task=True)
    [running] = app.claim(limit=1)  # asked to stop by its worker: 'cancel_requested', with the reason
    why = "  <b>duplicate</b> of deploy 12  "
    cancel = bulk.create(app, "cancel", JobFilter(task="t"), actor="alice", batch_size=7, reason=why)
    assert cancel["reason"] == "<b>duplicate</b> of deploy 12"  # stripped, as a single job's
    discard = bulk.create(app, "discard", JobFilter(task="t"), actor="bob", reason="x" * 500)  # the limit: taken
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        while bulk.apply_batch(app.store, c) is not None:
            pass
    ops = dict(q(conn, schema, "SELECT id, reason FROM {s}.bulk_operations"))
    assert ops == {cancel["id"]: "<b>duplicate</b> of deploy 12", discard["id"]: "x" * 500}
    assert _op(conn, schema, cancel["id"])["applied"] == 20 and _op(conn, schema, discard["id"])["applied"] == 12
    cancelled = _audit(conn, schema, "cancelled")
    on_cancel = {j: d for j, d in cancelled.items() if j in pending}
    assert on_cancel == {j: {"reason": "<b>duplicate</b> of deploy 12"} for j in pending if j != running.id}
    assert _audit(conn, schema, "cancel_requested") == {running.id: {"reason": "<b>duplicate</b> of deploy 12"}}
    discarded = {j: d for j, d in cancelled.items() if j not in pending}
    linked = [r[0] for r in q(conn, schema, "SELECT job_id FROM {s}.bulk_operation_jobs WHERE operation_id = %s",
                              discard["id"])]
    assert len(discarded) == 12 and sorted(discarded) == sorted(linked)
    assert set(map(str, discarded.values())) == {str({"reason": "x" * 500})}
    # the actor is still the operation's, as before
    assert {r[0] for r in q(conn, schema, "SELECT DISTINCT actor FROM {s}.job_events")} == {
        bulk.audit_actor(cancel), bulk.audit_actor(discard)}
    # no reason: none recorded, none in the audit entries (as a single job's cancel without one)
    _dead(conn, schema, 2, "plain")
    plain = bulk.create(app, "discard", JobFilter(task="plain"), actor="a", reason="   ")
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        while bulk.apply_batch(app.store, c) is not None:
            pass
    assert plain["reason"] is None
    assert q(conn, schema, "SELECT count(*), count(detail) FROM {s}.job_events e JOIN {s}.bulk_operation_jobs b "
             "ON b.job_id = e.job_id WHERE b.operation_id = %s", plain["id"]) == [(2, 0)]


@pytest.mark.parametrize("kind, reason, said", [
    ("cancel", "x" * 501, "the reason is 501 characters long, the limit is 500: shorten it"),
    ("discard", " " + "y" * 600 + " ", "the reason is 600 characters long, the limit is 500"),
    ("cancel", 42, "reason must be a string"),
    ("replay", "the fix is deployed", "a bulk replay keeps no reason"),
])
def test_a_bulk_reason_too_long_or_not_kept_is_refused_and_nothing_is_recorded(app, conn, kind, reason, said):
    _dead(conn, app.settings.schema, 3, "t")
    with pytest.raises(ValueError) as refused:
        bulk.create(app, kind, JobFilter(task="t"), actor="a", reason=reason)
    assert said in str(refused.value) and "nothing was changed" in str(refused.value), refused.value
    assert "y" * 50 not in str(refused.value)  # not echoed
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.bulk_operations") == [(0,)]
    # the column's own check: a writer that skips bulk.create is held to the same bound
    with pytest.raises(psycopg.errors.CheckViolation):
        with app.connection() as c:
            app.store.bulk_operation_create(c, kind="cancel", job_filter={}, actor="a", expected=None,
                                            batch_size=10, reason="z" * 501)
