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


def test_dead_replay_names_each_ids_state_and_no_target_is_a_usage_error(app, pg_dsn, capsys):
    done = app.enqueue("t", None)
    for claimed in app.claim(limit=1):
        app.complete(claimed)
    waiting = app.enqueue("t", None)
    assert main(["dead", "replay", str(done), str(waiting), "999999", *flags(app, pg_dsn)]) == 1
    err = capsys.readouterr().err
    assert err == (f"left as they were: {done}: succeeded, not dead; {waiting}: pending, not dead; "
                   f"999999: unknown (no job 999999 in schema {app.settings.schema!r})\n"), err
    for half, said in (([], "nothing to replay"), (["--queue", "default"], "--queue default alone replays nothing"),
                       (["--all"], "--all needs --queue QUEUE")):
        assert main(["dead", "replay", *half, *flags(app, pg_dsn)]) == 2  # usage, as ids beside --all
        err = capsys.readouterr().err
        assert err.startswith(f"error: {said}: give job ids") and "--all` for every dead job" in err, err
    assert app.get_job(done)["state"] == "succeeded" and app.get_job(waiting)["state"] == "pending"


def test_a_queues_replay_that_reaches_its_limit_says_more_may_remain(app, pg_dsn, capsys):
    """`dead replay --queue Q --all` takes at most --limit jobs (one transaction): it said
    "replayed 10,000 jobs" and nothing of the dead jobs it left behind. The command it
    names keeps the schema (a break-it trial: pasted, it replayed the default schema's);
    a limit past the bound is a usage error, not a statement the server refuses."""
    from pgworker import Permanent

    ids = app.enqueue_many([("t", i) for i in range(5)])
    for job in app.claim(limit=5):
        app.fail(job, Permanent("x"))
    args = ["dead", "replay", "--queue", "default", "--all", "--limit", "2", *flags(app, pg_dsn)]
    for expected in (ids[:2], ids[2:4]):
        assert main(args) == 0
        said = capsys.readouterr()
        assert said.out == f"replayed 2 jobs: {', '.join(map(str, expected))}\n", said.out
        assert ("note: a replay takes at most --limit 2 dead jobs of a queue (one transaction), and queue "
                "'default' holds more: run `pgworker dead replay --queue default --all --limit 2 --schema "
                f"{app.settings.schema}` again") in said.err, said.err
    assert main([*args, "--json"]) == 0
    last = capsys.readouterr()
    assert json.loads(last.out)["replayed"] == ids[4:] and json.loads(last.out)["limit_reached"] is False
    assert "note:" not in last.err, last.err
    assert [app.get_job(i)["state"] for i in ids] == ["pending"] * 5
    for job in app.claim(limit=5):
        app.fail(job, Permanent("x"))
    assert app.replay(queue="default", limit=4).limit_reached  # the API says it too
    assert not app.replay(queue="default", limit=4).limit_reached  # the fifth: none more
    assert not app.replay(ids[:1]).limit_reached  # by ids, no bound applies
    with pytest.raises(SystemExit) as usage:
        main(["dead", "replay", "--queue", "default", "--all", "--limit", "99999999999999999999", *flags(app, pg_dsn)])
    assert usage.value.code == 2 and "must be at most 1,000,000" in capsys.readouterr().err


def test_a_jobs_list_filter_that_matches_nothing_names_the_close_name(app, pg_dsn, capsys):
    app.enqueue("add", None, queue="emails")
    assert main(["queue", "pause", "reports", *flags(app, pg_dsn)]) == 0  # a settings row, no job
    capsys.readouterr()
    assert main(["jobs", "list", "--task", "ad", *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr()
    assert "(none)" in out.out and out.err == "note: no job matched --task 'ad'; did you mean --task 'add'?\n", out
    assert main(["jobs", "list", "--queue", "emials", "--json", *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr()
    assert json.loads(out.out) == [] and "did you mean --queue 'emails'?" in out.err, out
    assert main(["jobs", "list", "--queue", "reprts", *flags(app, pg_dsn)]) == 0
    assert "did you mean --queue 'reports'?" in capsys.readouterr().err
    # a real name the other filters excluded, or nothing close: no guess
    for args in (["--task", "add", "--state", "dead"], ["--task", "zzzzzz"], ["--queue", "reports"]):
        assert main(["jobs", "list", *args, *flags(app, pg_dsn)]) == 0
        assert "did you mean" not in capsys.readouterr().err, args


def test_a_table_prints_stored_control_characters_as_escapes(app, pg_dsn, conn, capsys):
    """A task or queue name written by another producer (raw SQL here) with an escape
    sequence, a line break or a bidi override printed raw in `jobs list` (`jobs show`
    escaped it): it could retitle the terminal, colour it or forge a line."""
    from psycopg import sql

    conn.execute(sql.SQL("INSERT INTO {}.jobs (queue, task, payload) VALUES (%s, %s, '{{}}')").format(
        sql.Identifier(app.settings.schema)), ["q\x1b[31mRED", "task\x1b]0;pwned\x07\nFAKE LINE\u202eevil"])
    assert main(["jobs", "list", *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out and "\x07" not in out
    assert "task\\x1b]0;pwned\\x07\\nFAKE LINE\\u202eevil" in out and "q\\x1b[31mRED" in out
    assert len(out.splitlines()) == 2  # the header and the one row
