"""The claimer's session runs its prepared statements on their generic plans
(pgworker.db.use_generic_plans): the claim is not planned again at each call after the
table grows, and every statement the claimer sends stays on its indexes when planned
without its values (a table of finished history, one big queue beside a small one)."""

from __future__ import annotations

import dataclasses
import json
import re
from datetime import datetime, timezone

import psycopg
import pytest
from psycopg import sql

from pgworker.jobs import FailRequest
from pgworker.store.lifecycle import NO_FLOORS
from pgworker.worker.claimer.connection import ClaimerConnection
from pgworker.worker.outcome import COMPLETE, Write, already_written, write_outcomes

pytestmark = pytest.mark.integration

CLAIM = {"owner": "x", "lease_seconds": 60.0}


def _claimer_conn(app, **changes) -> psycopg.Connection:
    """A connection opened as a claimer opens its own (its session settings)."""
    settings = dataclasses.replace(app.settings, **changes) if changes else app.settings
    return ClaimerConnection(settings, 0, lambda: False)._open()


def _plans(conn: psycopg.Connection, name: str) -> tuple[int, int]:
    row = conn.execute("SELECT generic_plans, custom_plans FROM pg_prepared_statements WHERE statement LIKE %s",
                       [f"/* pgworker:{name} */%"]).fetchone()
    assert row is not None, f"{name} is not prepared"
    return row[0], row[1]


def test_the_claimers_session_prefers_generic_plans_unless_statements_are_not_prepared(app):
    with _claimer_conn(app) as conn:
        assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "force_generic_plan"
    with _claimer_conn(app, prepared_statements=False) as conn:  # planned at every call anyway
        assert conn.execute("SHOW plan_cache_mode").fetchone()[0] == "auto"


def test_the_claimers_session_reads_timestamps_in_utc(app, conn):
    """psycopg converts a timestamptz to the session's zone: a zone name ('Etc/UTC', the
    default here) costs a ZoneInfo conversion per value, 'UTC' is its fast path (issue
    23). The claimer's session is UTC; the claim's datetimes are the same instants."""
    job = app.enqueue("t", None)
    [(created,)] = conn.execute(sql.SQL("SELECT created_at FROM {}.jobs WHERE id = %s").format(
        sql.Identifier(app.settings.schema)), [job]).fetchall()
    with _claimer_conn(app) as claimer:
        assert claimer.info.parameter_status("TimeZone") == "UTC"
        [claimed] = app.store.claim(claimer, queue="default", limit=1, **CLAIM)
    assert claimed.created_at == created and claimed.created_at.tzinfo is timezone.utc
    assert claimed.lease_expires_at.tzinfo is timezone.utc and claimed.lease_expires_at > datetime.now(timezone.utc)


def test_the_claim_is_not_planned_again_after_the_table_grows(app, conn):
    """Left to choose, PostgreSQL made a custom plan for each of the first five claims,
    then, once an ANALYZE of the grown table invalidated the generic plan, compared its new
    cost with those first custom plans' average and planned every claim anew until that
    average caught up (about 1.3 ms each; 1,261 of 1,433 claims of a drain). Now: never."""
    ident = sql.Identifier(app.settings.schema)
    app.enqueue_many([("t", i) for i in range(2000)])
    conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(ident))
    with _claimer_conn(app) as claimer:
        for _ in range(10):
            assert app.store.claim(claimer, queue="default", limit=10, **CLAIM)
        # the table grows (history, a backlog scheduled later), and is analysed again
        conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
                             "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, 20000)")
                     .format(ident))
        conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, run_at) "
                             "SELECT 'default', 't', '{{}}', now() + interval '1 hour' FROM generate_series(1, 20000)")
                     .format(ident))
        conn.execute(sql.SQL("ANALYZE {}.jobs").format(ident))
        for _ in range(10):
            assert app.store.claim(claimer, queue="default", limit=10, **CLAIM)
        generic, custom = _plans(claimer, "job_claim")
    assert custom == 0 and generic >= 15, (generic, custom)


def _seq_scans(claimer: psycopg.Connection, schema: str) -> int:
    """Sequential scans of the jobs table by the claimer's open transaction (its own
    counts: no other session's, and no wait for a flush of the statistics)."""
    row = claimer.execute("SELECT seq_scan FROM pg_stat_xact_user_tables WHERE relid = %s::regclass",
                          [f'"{schema}".jobs']).fetchone()
    return 0 if row is None else int(row[0])


def test_every_statement_of_the_claimer_stays_on_its_indexes_on_a_generic_plan(app, conn):
    schema = app.settings.schema
    ident = sql.Identifier(schema)
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
                         "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, 100000)")
                 .format(ident))
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload) "
                         "SELECT 'big', 't', '{{}}' FROM generate_series(1, 20000)").format(ident))
    keyed = [app.enqueue("t", i, ordering_key=f"k{i % 3}") for i in range(6)]  # claimed first: heads
    app.enqueue_many([("t", i) for i in range(60)])
    app.configure_queue("limited", concurrency_limit=5)
    app.enqueue_many([{"task": "t", "payload": i, "queue": "limited"} for i in range(5)])
    conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(ident))
    with _claimer_conn(app) as claimer:
        claimer.prepare_threshold = 0  # prepared (so planned generic) from the first call on
        # in one transaction, whose statistics are the claimer's own; each statement twice:
        # the first call of a prepared statement makes its plan, the second reuses it
        with claimer.transaction():
            claimed = _every_claimer_statement(app.store, claimer) + _every_claimer_statement(app.store, claimer)
            assert _seq_scans(claimer, schema) == 0
            claimer.execute(sql.SQL("SELECT count(*) FROM {}.jobs WHERE task = 'nothing'").format(ident))
            assert _seq_scans(claimer, schema) == 1  # the count sees a scan when there is one
        assert set(claimed) & set(keyed)  # the keyed transitions ran too
        assert _plans(claimer, "job_claim")[1] == 0


def _every_claimer_statement(store, claimer: psycopg.Connection) -> list[int]:
    """A claimer's statements once each: the claims (plain and locked), every outcome
    kind, a take-over, the settling read; returns the ids claimed."""
    jobs = store.claim(claimer, queue="default", limit=12, **CLAIM)
    assert len(jobs) == 12
    limited = store.claim_batch(claimer, queue="limited", limit=2, limited=True, **CLAIM).jobs
    assert len(limited) == 2
    a, b, c, d, e, f = jobs[:6]
    store.complete(claimer, [a.lease, limited[0].lease], [a.ordering_key, None])
    store.fail(claimer, [FailRequest(b.lease, "E", "m", 5.0), FailRequest(c.lease, "E", "m", 0, True)],
               [b.ordering_key, c.ordering_key])
    store.snooze(claimer, [d.lease], [30.0], [d.ordering_key])
    store.release(claimer, [e.lease, limited[1].lease], [e.ordering_key, None])
    store.finish_cancelled(claimer, [f.lease], [f.ordering_key])
    assert store.take_over(claimer, jobs[6].lease, owner="y") is not None
    write_outcomes(store, claimer, [Write(j.lease, COMPLETE, j.ordering_key) for j in jobs[6:]])
    assert already_written(store, claimer, [Write(j.lease, COMPLETE) for j in jobs[6:]])
    store.db_now(claimer)
    return [j.id for j in jobs]


def _generic_claim_plan(conn: psycopg.Connection, app, queue: str, floors: dict | None = None) -> dict:
    """EXPLAIN (ANALYZE, BUFFERS) of the claim on its generic plan, as the claimer's session
    runs it (PREPARE, then EXECUTE under force_generic_plan), rolled back."""
    names: list[str] = []

    def number(name: str) -> str:
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"
    text = app.store.queries["job_claim"]
    body = re.sub(r"%\((\w+)\)s", lambda m: number(m[1]), text).replace("%%", "%")
    params = {"queue": queue, "limit": 10, "owner": "x", "lease_seconds": 60.0, "aging_seconds": None,
              "locked": False, **(floors or NO_FLOORS)}
    with conn.transaction(force_rollback=True):
        conn.execute("SET LOCAL plan_cache_mode = force_generic_plan")
        conn.execute(sql.SQL("PREPARE generic_claim AS {}").format(sql.SQL(body)))  # type: ignore[arg-type]
        args = sql.SQL(", ").join(sql.Literal(params[n]) for n in names)
        [[plan]] = conn.execute(sql.SQL("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) EXECUTE generic_claim ({})")
                                .format(args)).fetchall()
    conn.execute("DEALLOCATE ALL")
    return plan[0]  # type: ignore[no-any-return]


def test_the_generic_claim_plan_reads_a_small_queue_beside_a_big_one_and_history(app, conn):
    """The generic plan cannot see which queue it claims from: on a table of 100,000
    finished jobs and 20,000 pending in another queue, a claim of 10 from a queue of 50
    still descends jobs_claim_idx and finds the rows by primary key (about 100 pages, not
    a scan of either)."""
    ident = sql.Identifier(app.settings.schema)
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload, state, finished_at) "
                         "SELECT 'default', 't', '{{}}', 'succeeded', now() FROM generate_series(1, 100000)")
                 .format(ident))
    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload) "
                         "SELECT 'big', 't', '{{}}' FROM generate_series(1, 20000)").format(ident))
    app.enqueue_many([("t", i) for i in range(50)])
    conn.execute(sql.SQL("VACUUM ANALYZE {}.jobs").format(ident))
    old = datetime(2000, 1, 1, tzinfo=timezone.utc)
    with_floors = {"floor_priorities": [0], "floor_at": [old], "floor_id": [0], "floor_default": old,
                   "floor_aged": old}
    for queue, floors in (("default", None), ("big", None), ("default", with_floors), ("big", with_floors)):
        plan = _generic_claim_plan(conn, app, queue, floors)
        text = json.dumps(plan)
        assert "Seq Scan" not in text and "Bitmap" not in text, text
        assert '"Index Name": "jobs_claim_idx"' in text and '"Index Name": "jobs_pkey"' in text
        assert plan["Plan"]["Actual Rows"] == 10
        assert _blocks(plan["Plan"]) - _blocks(_function_scan(plan["Plan"], "claim_horizon")) < 300, text


def _blocks(node: dict | None) -> int:
    return 0 if node is None else node["Shared Hit Blocks"] + node["Shared Read Blocks"]


def _function_scan(node: dict, name: str) -> dict | None:
    """The plan's Function Scan of ``name``: claim_horizon's blocks are the catalog's (its
    PL/pgSQL body compiled, relation caches refilled after another session's DDL: 154 in a
    run beside a second test suite on the same server), not the jobs table's."""
    if node.get("Function Name") == name:
        return node
    for child in node.get("Plans", ()):
        found = _function_scan(child, name)
        if found is not None:
            return found
    return None
