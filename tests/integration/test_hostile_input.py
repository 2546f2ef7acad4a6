"""Hostile and broken input through the public API and the CLI: names made of SQL
metacharacters, quotes and Unicode at and over their limits, odd schema names, payloads
at and over the size limit, JSON nested deeper than Python or PostgreSQL accept. Each
gets a clear error naming the fix, or works; nothing is lost and nothing else breaks."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import psycopg
import pytest

from pgworker import App, JobSpec, Permanent, Settings
from pgworker.errors import InvalidJob, InvalidName, PayloadError
from pgworker.store import notify_channel

from pg import make_settings
from worker import q

pytestmark = pytest.mark.integration

QUEUES = ["q'; DROP TABLE jobs; --", 'q"quoted"', "q\\back\\slash", "очередь-🚀", "$1 %s %(x)s {s} :x",
          "Q" * 128, "é" * 128]
TASKS = ["t'); DELETE FROM jobs; --", 't"', "задача 🙂", "%(payload)s", "t" * 255, "🙂" * 255]


def test_names_made_of_metacharacters_unicode_and_maximum_lengths_round_trip(app, conn):
    schema = app.settings.schema
    ids = {}
    for queue in QUEUES:
        for task in TASKS[:2] + [TASKS[-1]]:
            ids[app.enqueue(task, {"q": queue}, queue=queue)] = (queue, task)
    for queue in QUEUES:
        jobs = app.claim(queue, limit=10)
        assert {(j.queue, j.task) for j in jobs} == {v for v in ids.values() if v[0] == queue}
        for j in jobs:
            app.complete(j)
    rows = q(conn, schema, "SELECT id, queue, task, state::text FROM {s}.jobs")
    assert {r[0]: (r[1], r[2]) for r in rows} == ids and {r[3] for r in rows} == {"succeeded"}
    assert q(conn, "public", "SELECT to_regclass('public.jobs')") == [(None,)]  # nothing was "dropped"/created


@pytest.mark.parametrize("bad,kind", [
    ("Q" * 129, "queue"), ("", "queue"), (" padded", "queue"), ("tab\there", "queue"), ("nul\x00", "queue"),
    ("esc\x1b[31m", "queue"), ("t" * 256, "task"), ("line\nbreak", "task"), ("bidi\u202e", "task"), (42, "task"),
])
def test_names_over_the_limits_or_with_control_characters_are_refused(app, conn, bad, kind):
    with pytest.raises(InvalidName) as err:
        if kind == "queue":
            app.enqueue("noop", queue=bad)
        else:
            app.enqueue(bad)
    assert "printable" in str(err.value) or "long" in str(err.value) or "string" in str(err.value)
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.jobs") == [(0,)]


@pytest.mark.parametrize("schema_name", [
    'sch"ema', "s'; DROP SCHEMA public CASCADE; --", "схема 🚀", "x" * 63, "é" * 31 + "x", "Mixed.Case $1",
    # what the rendering path could misread besides '%': str.format-style braces (the
    # statements are rendered with psycopg.sql.SQL.format), a dollar quote (a function body
    # of the migrations is $$-quoted), backslashes, comment starts, other placeholder styles
    "{schema}{}{0}", "a$$b$fn$", "back\\slash", "c/*d*/--e", "q?:x;",
])
def test_odd_schema_names_work_end_to_end(pg_dsn, conn, schema_name):
    a = App(settings=make_settings(pg_dsn, schema_name))
    try:
        a.migrate()
        assert len(notify_channel(schema_name).encode()) <= 63
        job_id = a.enqueue("noop", {"a": 1})
        a.enqueue_many([("noop", i) for i in range(3)])
        [job] = a.claim("default", limit=1)
        assert job.id == job_id
        a.complete(job)
        assert a.get_job(job_id)["state"] == "succeeded"
        assert q(conn, "public", "SELECT count(*) FROM pg_namespace WHERE nspname = 'public'") == [(1,)]
    finally:
        a.close()
        from pgworker.migrate import drop_schema

        drop_schema(conn, schema_name)


@pytest.mark.parametrize("schema_name", ["a%b", "%", "100%", "a%%b", "a%sb", "a%(x)sb"])
def test_a_percent_sign_in_the_schema_name_is_refused_with_the_fix(pg_dsn, conn, schema_name):
    """psycopg reads '%' in a statement as a parameter placeholder (%s, %b, %t, %(name)s,
    %%), and the quoted schema name is part of every statement: 'a%b' breaks them all,
    'a%%b' would create one schema and then name another. Refused before anything runs."""
    fix = r"contains '%'.*placeholder.*PGWORKER_SCHEMA \(or --schema\)"
    with pytest.raises(InvalidName, match=fix):
        Settings(dsn=pg_dsn, schema=schema_name)
    with pytest.raises(InvalidName, match=fix):
        App(pg_dsn, schema=schema_name)
    with pytest.raises(InvalidName, match=fix):
        App(settings=make_settings(pg_dsn, "ok")).configure(make_settings(pg_dsn, schema_name))
    for args, env in ((["--schema", schema_name], {}), ([], {"PGWORKER_SCHEMA": schema_name})):
        out = subprocess.run([sys.executable, "-m", "pgworker.cli", "migrate", "--dsn", pg_dsn, *args],
                             env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
        assert out.returncode == 1, (out.returncode, out.stderr)  # the CLI's exit code for a ConfigError
        assert "Traceback" not in out.stderr and re.search(fix, out.stderr), out.stderr
    # nothing was created: neither the name given nor the one psycopg would have read
    assert q(conn, "public", "SELECT nspname FROM pg_namespace WHERE nspname LIKE '%%\\%%%%'") == []


@pytest.mark.parametrize("schema_name", ["x" * 64, "é" * 32, "pg_jobs", "", "nul\x00"])
def test_schema_names_postgresql_would_truncate_or_reserve_are_refused(pg_dsn, schema_name):
    with pytest.raises(InvalidName):
        App(settings=make_settings(pg_dsn, "ok")).configure(make_settings(pg_dsn, schema_name))


def test_payloads_at_and_over_the_size_limit(pg_dsn, schema, conn):
    limit = 2000
    a = App(settings=make_settings(pg_dsn, schema, max_payload_bytes=limit))
    a.migrate()
    try:
        at_limit = "é" * ((limit - 2) // 2)  # JSON '"ééé…"': exactly the limit in UTF-8 bytes
        assert len(('"' + at_limit + '"').encode()) == limit
        ok = a.enqueue("noop", at_limit)
        with pytest.raises(PayloadError, match=f"over the limit of {limit}.*PGWORKER_MAX_PAYLOAD_BYTES"):
            a.enqueue("noop", at_limit + "x")
        with pytest.raises(PayloadError, match="over the limit"):
            a.enqueue_many([("noop", 1), ("noop", "x" * limit)])  # one bad job refuses the batch
        assert q(conn, schema, "SELECT id FROM {s}.jobs") == [(ok,)]
        assert q(conn, schema, "SELECT octet_length(payload #>> '{{}}') FROM {s}.jobs") == [(limit - 2,)]
    finally:
        a.close()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_json_nested_deeper_than_python_allows_is_refused_with_a_clear_error(app, conn):
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(PayloadError, match="nested too deeply"):
        app.enqueue("noop", deep)
    # the CLI parses --payload with Python's json module: same refusal, no traceback
    out = subprocess.run([sys.executable, "-m", "pgworker.cli", "enqueue", "noop", "--payload", nested(5000),
                          "--dsn", app.settings.dsn, "--schema", app.settings.schema],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "Traceback" not in out.stderr, out.stderr[-2000:]
    assert "nested too deeply" in out.stderr, out.stderr
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.jobs") == [(0,)]


def test_a_payload_deeper_than_a_worker_decodes_is_refused_at_enqueue(app, conn):
    """~985 levels (a script's stack) encoded in the producer and ended dead PAYLOAD_INVALID on the worker,
    whose decoder runs a few dozen frames deeper (a trial): refused at enqueue, naming the
    limit; the limit itself runs."""
    from pgworker.jobspec import MAX_PAYLOAD_DEPTH
    from pgworker.testing import drain

    seen = []

    @app.task(name="deep")
    def deep_task(payload, ctx):
        depth = 0
        while isinstance(payload, list) and payload:
            payload, depth = payload[0], depth + 1
        seen.append(depth)

    def chain(levels: int) -> list:
        value: list = [{"text": "[{[{ brackets in a string do not count }]}]"}]
        for _ in range(levels - 2):
            value = [value]
        return value

    for levels in (MAX_PAYLOAD_DEPTH + 1, 800):
        with pytest.raises(PayloadError, match="nests more than 500 levels deep, the limit that a worker can decode"):
            app.enqueue("deep", chain(levels))
    out = subprocess.run([sys.executable, "-m", "pgworker.cli", "enqueue", "deep", "--payload", nested(700),
                          "--dsn", app.settings.dsn, "--schema", app.settings.schema],
                         capture_output=True, text=True)
    assert out.returncode != 0 and "nests more than 500 levels" in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.jobs") == [(0,)]
    app.enqueue("deep", chain(MAX_PAYLOAD_DEPTH))
    assert drain(app).succeeded == 1 and seen == [MAX_PAYLOAD_DEPTH - 1]


def test_json_nested_deeper_than_postgresql_allows_is_refused_by_the_server(app, conn):
    """What a raw SQL producer gets: PostgreSQL's own limit (stack depth), nothing stored."""
    with pytest.raises(psycopg.errors.StatementTooComplex):
        q(conn, app.settings.schema, "INSERT INTO {s}.jobs (queue, task, payload) VALUES ('default', 'noop', %s)",
          nested(200_000))
    assert q(conn, app.settings.schema, "SELECT count(*) FROM {s}.jobs") == [(0,)]
    app.enqueue("noop", 1)  # the queue is unaffected


def test_a_raw_row_python_cannot_decode_does_not_lose_app_claims_batch(app, conn):
    """App.claim (the public API, on the App's pooled connections) read the claim's rows
    with psycopg's plain JSON loader: one payload nested deeper than Python decodes raised
    RecursionError after the claim had committed, and every job of the batch was left
    leased to nobody (reaped later, its attempt spent, without running)."""
    from pgworker.jobs import UndecodablePayload

    schema = app.settings.schema
    good = app.enqueue("noop", {"fine": True})
    [(bad,)] = q(conn, schema, "INSERT INTO {s}.jobs (queue, task, payload) VALUES ('default', 'noop', %s) "
                               "RETURNING id", nested(5000))
    jobs = {j.id: j for j in app.claim(limit=10)}
    assert set(jobs) == {good, bad}
    assert jobs[good].payload == {"fine": True} and isinstance(jobs[bad].payload, UndecodablePayload)
    app.complete(jobs[good])
    app.fail(jobs[bad], Permanent("undecodable"))
    assert dict(q(conn, schema, "SELECT id, state::text FROM {s}.jobs")) == {good: "succeeded", bad: "dead"}


@pytest.mark.parametrize("lease", [60.0, 131_072.0, 2 * 86400.0, 365 * 86400.0])
def test_every_accepted_lease_gives_worker_connections_that_open(pg_dsn, lease):
    """The keepalives derived from a lease of days passed Linux's 32767 s bound, and every
    worker connection failed ("setsockopt(TCP_KEEPIDLE) failed"): no job ever ran."""
    from pgworker.worker.service import worker_connect

    settings = Settings(dsn=pg_dsn, lease_seconds=lease)
    with worker_connect(settings)("pgworker:test") as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# -- timestamps no claim could handle -------------------------------------------------------

OUT_OF_RANGE = ["-infinity", "infinity", "0001-12-31 23:00:00+00 BC", "1969-12-31 23:59:59+00",
                "9999-01-01 00:00:01+00", "10000-01-01 00:00:00+00"]


@pytest.mark.parametrize("value", OUT_OF_RANGE)
def test_the_table_refuses_a_timestamp_no_claim_could_handle(app, conn, value):
    """Written by SQL (a migration, a restore, a hand-made fix): '-infinity' in run_at made
    every claim of its queue fail ("cannot subtract infinite timestamps"), a year outside
    1..9999 could not be read back by psycopg (the claim committed and its batch was lost).
    The claim reads run_at, created_at and lease_expires_at back and computes with a
    queue's tokens_at: each is refused out of range, and the queue's claims go on."""
    schema = app.settings.schema
    good = app.enqueue("t", queue="poisoned")
    statements = [
        "INSERT INTO {s}.jobs (queue, task, payload, run_at) VALUES ('poisoned', 't', '1', %s)",
        "INSERT INTO {s}.jobs (queue, task, payload, created_at) VALUES ('poisoned', 't', '1', %s)",
        "INSERT INTO {s}.jobs (queue, task, payload, state, attempts, lease_token, lease_expires_at) "
        "VALUES ('poisoned', 't', '1', 'running', 1, 1, %s)",
        "UPDATE {s}.jobs SET run_at = %s",
        "INSERT INTO {s}.queues (name, rate_per_second, rate_burst, tokens, tokens_at) "
        "VALUES ('poisoned', 1, 1, 1, %s)",
    ]
    for statement in statements:
        with pytest.raises(psycopg.errors.CheckViolation, match="_range"):
            q(conn, schema, statement + " RETURNING 1", value)
    assert [j.id for j in app.claim("poisoned", limit=10)] == [good]


@pytest.mark.parametrize("run_at", [
    datetime(1, 1, 1, tzinfo=timezone(timedelta(hours=1))),  # before year 1 in UTC
    datetime(1969, 12, 31, 23, 59, tzinfo=timezone.utc),
    datetime(9999, 12, 31, tzinfo=timezone.utc),
    "now + 101 years",
])
def test_enqueue_refuses_a_run_at_out_of_range_and_names_the_fix(app, conn, run_at):
    if run_at == "now + 101 years":
        run_at = datetime.now(timezone.utc) + timedelta(days=101 * 365)
    existing = app.enqueue("t", "keep me")
    for enqueue in (lambda: app.enqueue("t", run_at=run_at),
                    lambda: app.enqueue("t", run_at=run_at, ordering_key="k", dedupe_key="d"),
                    lambda: app.enqueue_many([JobSpec("t", 1), JobSpec("t", 2, run_at=run_at)])):
        with pytest.raises(InvalidJob, match=r"out of range: a job can be scheduled from 1970-01-01 UTC to "
                                             r"100 years from now; pass a run_at in that range .* or delay=seconds"):
            enqueue()
    assert q(conn, app.settings.schema, "SELECT id FROM {s}.jobs") == [(existing,)]


def test_a_run_at_at_the_bounds_is_accepted(app, conn):
    early = app.enqueue("t", run_at=datetime(1970, 1, 1, tzinfo=timezone(timedelta(hours=-5))))  # 05:00 UTC
    late = app.enqueue("t", run_at=datetime.now(timezone.utc) + timedelta(days=99 * 365))
    assert [j.id for j in app.claim(limit=5)] == [early]  # a past run_at is due now
    assert q(conn, app.settings.schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", late) == [("pending",)]
