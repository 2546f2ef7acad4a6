"""A new user's trial of the command line, in-process against a real PostgreSQL: a
deduplicated enqueue says so, a malformed DSN says what is wrong, `dead replay` names each
id's state, and a typo'd subcommand or filter gets the name meant."""

from __future__ import annotations

import json

import pytest

from pgworker.cli import main

pytestmark = pytest.mark.integration


def flags(app, pg_dsn):
    return ["--dsn", pg_dsn, "--schema", app.settings.schema]


def test_a_deduplicated_enqueue_says_nothing_new_was_enqueued(app, pg_dsn, capsys):
    args = ["enqueue", "add", "--dedupe-key", "k2", "--delay", "1h", "--queue", "q", "--max-attempts", "3",
            *flags(app, pg_dsn)]
    assert main(args) == 0
    first = capsys.readouterr()
    job = int(first.out)
    assert "dedupe" not in first.err, first.err
    assert main(args) == 0  # a duplicate is not an error: the key did its job
    again = capsys.readouterr()
    assert int(again.out) == job  # stdout stays the id, for scripts
    assert (f"note: job {job} already holds dedupe key 'k2': nothing new was enqueued" in again.err), again.err
    assert main([*args, "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"id": job, "deduplicated": True}
    assert main(["enqueue", "add", "--dedupe-key", "k3", "--json", *flags(app, pg_dsn)]) == 0
    new = json.loads(capsys.readouterr().out)
    assert new["deduplicated"] is False and new["id"] != job
    assert [j["id"] for j in app.list_jobs()] == sorted([job, new["id"]], reverse=True)
