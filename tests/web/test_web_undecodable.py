"""A JSON value Python cannot decode, written into the table by hand (an integer of
5,000 digits, arrays 3,000 deep: both valid jsonb), made every read of its job fail: the
console's page and API (500), `pgworker jobs show` (a traceback), App.get_job. Each now
shows the value as a marker saying what it is; App.result refuses it by name."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest
from console_server import ConsoleServer
from worker import q

from pgworker.errors import PayloadError

# (braces doubled: q() formats the statement with psycopg.sql)
HUGE_INT = "('{{\"n\": ' || repeat('9', 5000) || '}}')::jsonb"
DEEP = "(repeat('[', 3000) || repeat(']', 3000))::jsonb"


def _job(conn, schema: str, payload_sql: str, *, errors_sql: str = "'[]'::jsonb") -> int:
    [(job_id,)] = q(conn, schema, f"INSERT INTO {{s}}.jobs (queue, task, payload, errors) VALUES "
                                  f"('default', 'noop', {payload_sql}, {errors_sql}) RETURNING id")
    return job_id


def test_undecodable_values_are_shown_everywhere_a_job_is_read(app, pg_dsn, conn):
    schema = app.settings.schema
    huge = _job(conn, schema, HUGE_INT)
    deep = _job(conn, schema, DEEP, errors_sql=f"jsonb_build_array({HUGE_INT})")
    assert "more than 4,300 digits" in repr(app.get_job(huge)["payload"])
    assert "nested too deeply" in repr(app.get_job(deep)["payload"])
    assert "more than 4,300 digits" in repr(app.get_job(deep)["errors"])  # the whole history

    async def both():
        try:
            return [(await app.aget_job(i))["payload"] for i in (huge, deep)]
        finally:
            await app.aclose()
    assert all("undecodable JSON" in repr(p) for p in asyncio.run(both()))

    for args in (["jobs", "show", str(huge)], ["jobs", "show", str(deep), "--json"]):
        out = subprocess.run([sys.executable, "-m", "pgworker.cli", *args, "--dsn", pg_dsn, "--schema", schema],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "undecodable JSON" in out.stdout and "Traceback" not in out.stderr, out.stderr

    with ConsoleServer(pg_dsn, schema) as console:
        for path in (f"/jobs/{huge}", f"/jobs/{deep}", f"/api/jobs/{huge}", f"/api/jobs/{deep}", "/jobs"):
            r = console.get(path)
            assert r.status_code == 200, (path, r.text[-2000:])
        assert "undecodable JSON of" in console.get(f"/api/jobs/{deep}").json()["job"]["payload"]
        assert "nested too deeply" in console.get(f"/jobs/{deep}").text
        assert "Traceback" not in console.logs()


def test_a_hand_written_result_python_cannot_decode_is_refused_by_name(app, conn):
    schema = app.settings.schema
    job = _job(conn, schema, "'{{}}'::jsonb")
    q(conn, schema, "UPDATE {s}.jobs SET state = 'succeeded', finished_at = now() WHERE id = %s RETURNING id", job)
    q(conn, schema, f"INSERT INTO {{s}}.job_results (job_id, result) VALUES (%s, {HUGE_INT}) RETURNING job_id", job)
    with pytest.raises(PayloadError, match=f"job {job}'s stored result cannot be decoded: an integer of more"):
        app.result(job)


def test_a_payload_over_pythons_int_limit_is_refused_at_enqueue_by_name(app):
    with pytest.raises(PayloadError, match="more than 4,300 digits.*send it as a string"):
        app.enqueue("noop", {"n": 10 ** 4400})


DEEP_BUT_DECODABLE = "(repeat('[', 970) || '1' || repeat(']', 970))::jsonb"


def test_the_console_shows_deep_values_undecodable_histories_and_lock_waits_without_a_500(app, pg_dsn, conn):
    """From a break-it trial: a payload nested 970 deep decodes on the worker but not on
    the console's deeper stack (/api/jobs/N was a 500); an undecodable error history read
    'None.'; a nested request body was a 500; a lock wait past lock_timeout was a 500."""
    schema = app.settings.schema
    deep = _job(conn, schema, DEEP_BUT_DECODABLE)
    history = _job(conn, schema, "'1'::jsonb", errors_sql=f"jsonb_build_array({HUGE_INT})")
    auth = {"Authorization": "Bearer admin-token-0123456789"}
    with ConsoleServer(pg_dsn, schema, env={"PGWORKER_WEB_TOKENS": "ops:admin:admin-token-0123456789",
                                            "PGWORKER_LOCK_TIMEOUT_SECONDS": "0.5"}) as console:
        r = console.get(f"/api/jobs/{deep}", headers=auth)
        assert r.status_code == 200 and "nested deeper than 100 levels: not shown" in r.text, r.text[-500:]
        assert console.get(f"/jobs/{deep}", headers=auth).status_code == 200
        page = console.get(f"/jobs/{history}", headers=auth).text
        attempts = page[page.index('id="attempts"'):]
        assert "undecodable JSON of" in attempts[:attempts.index("</section>")] and "None." not in attempts[:300]
        r = console.post("/api/bulk", headers={**auth, "Content-Type": "application/json"},
                         data="[" * 100_000 + "]" * 100_000)
        assert r.status_code == 400 and "nested too deeply" in r.json()["error"], r.text
        import psycopg
        from psycopg import sql

        with psycopg.connect(pg_dsn) as holder:
            holder.execute(sql.SQL("LOCK TABLE {}.jobs IN ACCESS EXCLUSIVE MODE").format(sql.Identifier(schema)))
            for path in ("/jobs", "/api/jobs"):
                r = console.get(path, headers=auth)
                assert r.status_code == 503 and "lock" in r.text, (path, r.status_code, r.text[-300:])
        assert "Traceback" not in console.logs()


def test_a_bulk_operation_whose_filter_cannot_be_read_fails_and_holds_up_none(app, pg_dsn, conn):
    """A filter written by hand that Python cannot decode made /bulk a 500 and the
    applier retry it for ever, holding up every operation recorded after it."""
    schema = app.settings.schema
    dead = _job(conn, schema, "'1'::jsonb")
    q(conn, schema, "UPDATE {s}.jobs SET state = 'dead', finished_at = now() WHERE id = %s RETURNING id", dead)
    [(bad,)] = q(conn, schema, f"INSERT INTO {{s}}.bulk_operations (kind, filter, actor, max_id) VALUES "
                               f"('replay', {DEEP}, 'hand', %s) RETURNING id", dead)
    [(good,)] = q(conn, schema, "INSERT INTO {s}.bulk_operations (kind, filter, actor, max_id) VALUES "
                                "('replay', '{{\"state\": \"dead\"}}', 'hand', %s) RETURNING id", dead)
    with ConsoleServer(pg_dsn, schema) as console:
        for path in ("/bulk", f"/bulk/{bad}", f"/api/bulk/{bad}", "/api/bulk"):
            r = console.get(path)
            assert r.status_code == 200, (path, r.text[-800:])
        from pg import wait_until

        def states():
            return dict(q(conn, schema, "SELECT id, state FROM {s}.bulk_operations"))
        wait_until(lambda: states() == {bad: "failed", good: "done"}, 30, message=lambda: (states(), console.logs()))
        assert app.get_job(dead)["state"] == "pending"  # the operation after it ran
        [(error,)] = q(conn, schema, "SELECT error FROM {s}.bulk_operations WHERE id = %s", bad)
        assert "its recorded filter cannot be read: <undecodable JSON" in error
        assert "unreadable (" in console.get(f"/bulk/{bad}").text
        assert "Traceback" not in console.logs()
