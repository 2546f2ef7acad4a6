"""A statement PostgreSQL refuses to the App's role (SQLSTATE 42501) raises pgworker's
PermissionDenied: the fix in its message, so a log line of str(exc) keeps it (a new user's
trial: the fix was a note added to psycopg's exception, which only a traceback shows),
and still psycopg's InsufficientPrivilege for code that catches that. The command line
and the console say their own fix, once."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import pickle

import psycopg
import pytest
from psycopg import sql

import pgworker
from pgworker import App
from pgworker.cli import main

pytestmark = pytest.mark.integration


@pytest.fixture
def producer(app, pg_dsn, conn):
    """The App's schema seen by the producer role of `pgworker sql grants`."""
    from pgworker.grants import grant_statements

    schema = app.settings.schema
    role = f"pd_producer_{schema[-12:]}"
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        for statement in grant_statements(schema, producer=role):
            conn.execute(statement)
        dsn = psycopg.conninfo.make_conninfo(pg_dsn, user=role)
        as_producer = App(settings=dataclasses.replace(app.settings, dsn=dsn))
        yield as_producer, dsn
        as_producer.close()
    finally:
        conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
        conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_refused_statement_names_the_fix_in_its_message(app, producer, caplog):
    as_producer, _ = producer
    job = as_producer.enqueue("t", None, any_task=True)
    with pytest.raises(pgworker.PermissionDenied) as refused:
        as_producer.cancel(job)
    exc = refused.value
    text = str(exc)
    assert text.startswith("PostgreSQL refused the statement (permission denied for ") and \
        "sql grants --producer" in text and "schema's owner" in text, text
    # a log line of the message alone keeps the fix
    logging.getLogger("app").error("cancel failed: %s", exc)
    assert "sql grants --producer" in caplog.text
    # what code that catches psycopg's error reads, as before
    assert isinstance(exc, psycopg.errors.InsufficientPrivilege) and isinstance(exc, pgworker.PgworkerError)
    assert exc.sqlstate == "42501" and exc.diag.message_primary.startswith("permission denied for ")
    assert isinstance(exc.__cause__, psycopg.errors.InsufficientPrivilege) and exc.refused is exc.__cause__
    assert not getattr(exc.__cause__, "__notes__", None)  # said once, in the message
    back = pickle.loads(pickle.dumps(exc))  # it crosses a process boundary intact
    assert type(back) is pgworker.PermissionDenied and str(back) == text
    assert app.get_job(job)["state"] == "pending"  # nothing changed


def test_the_async_calls_raise_it_too(producer):
    as_producer, _ = producer

    async def go():
        job = await as_producer.aenqueue("t", None, any_task=True)
        try:
            with pytest.raises(pgworker.PermissionDenied, match="sql grants --producer"):
                await as_producer.acancel(job)
        finally:
            await as_producer.aclose()

    asyncio.run(go())


def test_the_command_line_says_its_own_fix_once(app, producer, capsys):
    as_producer, dsn = producer
    job = as_producer.enqueue("t", None, any_task=True)
    assert main(["cancel", str(job), "--dsn", dsn, "--schema", app.settings.schema]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: PostgreSQL refused the statement (InsufficientPrivilege): permission denied for "), err
    assert err.count("this role may not do that") == 1 and "Operator commands" in err and "Traceback" not in err


def test_the_console_answers_403_naming_its_roles(producer):
    """The console's page for it, as for psycopg's error before: 403, the console's fix."""
    from starlette.testclient import TestClient

    from pgworker.web import anonymous, create_app

    as_producer, _ = producer
    job = as_producer.enqueue("t", None, any_task=True)
    with TestClient(create_app(as_producer, authenticate=anonymous("admin"))) as client:
        r = client.get(f"/api/jobs/{job}")
    assert r.status_code == 403, r.text
    said = r.json()["error"]
    assert said.startswith("PostgreSQL refused the statement (InsufficientPrivilege): permission denied for "), said
    assert "this console's database role may not do that" in said and "sql grants --producer" not in said
