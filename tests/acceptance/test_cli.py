"""The `pgworker` command line, run as a user would (subprocesses, JSON output)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.acceptance


def cli(dsn, schema, *args, check=True, env=None):
    e = dict(os.environ, PGWORKER_DSN=dsn, PGWORKER_SCHEMA=schema, **(env or {}))
    e.pop("PGWORKER_APP", None)
    proc = subprocess.run([sys.executable, "-m", "pgworker.cli", *args], env=e, capture_output=True,
                          text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"pgworker {' '.join(args)} exited {proc.returncode}: {proc.stderr}")
    return proc


def js(proc):
    return json.loads(proc.stdout)


def test_operator_workflow(pg_dsn, schema):
    assert "applied 0001_initial" in cli(pg_dsn, schema, "migrate").stdout
    assert "up to date" in cli(pg_dsn, schema, "migrate").stdout
    job = js(cli(pg_dsn, schema, "enqueue", "reports.build", "--payload", '{"month": "2026-11"}',
                 "--queue", "reports", "--priority", "5", "--json"))["id"]
    delayed = int(cli(pg_dsn, schema, "enqueue", "reports.build", "--delay", "1h").stdout)
    status = js(cli(pg_dsn, schema, "status", "--json"))
    # the job delayed by an hour is scheduled, not due work
    assert {(r["queue"], r["state"], r["jobs"]) for r in status} == {("reports", "due", 1), ("default", "scheduled", 1)}
    listed = js(cli(pg_dsn, schema, "jobs", "list", "--queue", "reports", "--json"))
    assert [r["id"] for r in listed] == [job] and listed[0]["priority"] == 5
    shown = js(cli(pg_dsn, schema, "jobs", "show", str(job), "--json"))
    assert shown["payload"] == {"month": "2026-11"} and shown["state"] == "pending"
    assert "job %d: cancelled" % delayed in cli(pg_dsn, schema, "cancel", str(delayed)).stdout
    again = cli(pg_dsn, schema, "cancel", str(delayed), check=False)
    assert again.returncode == 1
    # it said "unknown or already finished": which, and what there is to do
    assert again.stderr == f"error: job {delayed} has already finished (cancelled): there is nothing to cancel\n"
    unknown = cli(pg_dsn, schema, "cancel", "987654", check=False)
    assert unknown.returncode == 1
    assert unknown.stderr == f"error: there is no job 987654 in schema {schema!r} (--schema, PGWORKER_SCHEMA)\n"
    table = cli(pg_dsn, schema, "status").stdout
    assert "QUEUE" in table and "reports" in table and "due" in table
    assert "finished jobs, all queues" in table and "cancelled" in table  # the job cancelled above
    assert js(cli(pg_dsn, schema, "prune", "--older-than", "0s", "--json")) == {"deleted": 1}
    # a batch of 0 once looped for good; negative limits reached PostgreSQL
    for args in (("prune", "--older-than", "7d", "--batch", "0"), ("jobs", "list", "--limit", "-1"),
                 ("dead", "replay", "--all", "--queue", "default", "--limit", "-5")):
        refused = cli(pg_dsn, schema, *args, check=False)
        assert refused.returncode == 2 and "must be at least 1" in refused.stderr, (args, refused.stderr)


def test_dead_jobs_list_and_replay(pg_dsn, schema, app):
    from pgworker import Permanent

    pg_schema = app.settings.schema
    ids = app.enqueue_many([("t", i) for i in range(3)], )
    for job in app.claim(limit=3):
        app.fail(job, Permanent("broken"))
    dead = js(cli(pg_dsn, pg_schema, "dead", "list", "--json"))
    assert sorted(r["id"] for r in dead) == sorted(ids) and dead[0]["last_error_code"] == "PERMANENT"
    # bare `pgworker dead` is `dead list` (its help says so; it once died on a missing --queue)
    assert js(cli(pg_dsn, pg_schema, "dead", "--json")) == dead
    assert js(cli(pg_dsn, pg_schema, "dead", "--queue", "default", "--limit", "2", "--json")) == dead[:2]
    out = cli(pg_dsn, pg_schema, "dead", "replay", str(ids[0]))
    assert "replayed 1 job" in out.stdout
    assert js(cli(pg_dsn, pg_schema, "dead", "replay", "--queue", "default", "--all", "--json")) == \
        {"replayed": sorted(ids[1:]), "not_dead": [], "requeued": [], "held": [], "limit_reached": False}
    missing = cli(pg_dsn, pg_schema, "dead", "replay", str(ids[0]), check=False)
    assert missing.returncode == 1 and "not dead" in missing.stderr
    events = js(cli(pg_dsn, pg_schema, "jobs", "show", str(ids[0]), "--json"))["events"]
    assert events[-1]["kind"] == "replayed" and events[-1]["actor"]
    # a mistyped queue replayed 0 jobs with rc 0 and no word: now a note (rc stays 0)
    nosuch = cli(pg_dsn, pg_schema, "dead", "replay", "--queue", "nosuch", "--all")
    assert "replayed 0 jobs" in nosuch.stdout and "note: queue 'nosuch' has no pending, running or dead jobs" \
        in nosuch.stderr and f"pgworker status --schema {pg_schema}" in nosuch.stderr
    known = cli(pg_dsn, pg_schema, "dead", "replay", "--queue", "default", "--all")  # a queue, nothing dead
    assert "replayed 0 jobs" in known.stdout and "note:" not in known.stderr
    # ids beside --all: --all was silently ignored; a usage error naming both forms
    both = cli(pg_dsn, pg_schema, "dead", "replay", "--all", "--queue", "ops", "5", check=False)
    assert both.returncode == 2 and "not both" in both.stderr and "`pgworker dead replay 5`" in both.stderr \
        and "`pgworker dead replay --queue ops --all`" in both.stderr, both.stderr


def test_replaying_a_dead_job_whose_dedupe_key_is_held_says_by_which_job_and_what_to_do(pg_dsn, app):
    """Before: "not dead (or unknown)" for a job that was dead, its key held by another."""
    from pgworker import Permanent

    schema = app.settings.schema
    dead = app.enqueue("t", dedupe_key="welcome:42")
    [job] = app.claim()
    app.fail(job, Permanent("broken"))
    # the key is free again: a new job takes it, and keeps it an hour after it succeeds
    holder = app.enqueue("t", dedupe_key="welcome:42", dedupe_window=3600)
    other = app.enqueue("t")  # not dead: said apart
    out = cli(pg_dsn, schema, "dead", "replay", str(dead), str(other), "999999", check=False)
    assert out.returncode == 1 and out.stdout == "replayed 0 jobs\n"
    flag = f" --schema {schema}"
    assert out.stderr.splitlines() == [
        f"job {dead} stayed dead: its dedupe key 'welcome:42' is held by job {holder} (pending), which does that "
        f"key's work; discard job {dead} with `pgworker cancel {dead}{flag}`, or, to run job {dead} instead, "
        f"cancel job {holder} (`pgworker cancel {holder}{flag}`) and replay again",
        f"left as they were: {other}: pending, not dead; 999999: unknown (no job 999999 in schema {schema!r})"]
    assert js(cli(pg_dsn, schema, "dead", "replay", str(dead), "--json", check=False)) == \
        {"replayed": [], "not_dead": [], "requeued": [], "held": [{"id": dead, "held_by": holder}],
         "limit_reached": False}
    assert app.get_job(dead)["state"] == "dead"
    # the holder succeeds and keeps its key for its window: the note says so
    [job] = app.claim()
    app.complete(job)
    out = cli(pg_dsn, schema, "dead", "replay", "--queue", "default", "--all", check=False)
    assert out.returncode == 0 and out.stdout == "replayed 0 jobs\n"  # --all replays what it can
    [note] = out.stderr.splitlines()
    assert note.startswith(f"job {dead} stayed dead: its dedupe key 'welcome:42' is held by job {holder}, which "
                           "succeeded and keeps the key until ") and note.endswith(
        f" (its dedupe window): the work was done; discard job {dead} with `pgworker cancel {dead}{flag}`, "
        "or replay it after then")
    # following the advice: discarded
    assert f"job {dead}: discarded (it was dead" in cli(pg_dsn, schema, "cancel", str(dead)).stdout


@pytest.mark.parametrize("args, fragment", [
    (("enqueue", "t", "--payload", "{nope"), "--payload is not valid JSON"),
    (("enqueue", "t", "--queue", ""), "queue name is empty"),
    (("jobs", "show", "999999"), "no job 999999"),
    (("run",), "needs your App"),
    (("run", "--app", "no.such.module:app"), "cannot import"),
    (("prune", "--older-than", "soon"), "is not a duration"),
    (("--schema", "x", "status"), "--schema goes after the command's name: `pgworker COMMAND --schema ...`"),
    (("--listen-dsn", "postgresql://u:S3cretPW@db/x", "run"), "--listen-dsn goes after the command's name"),
    # a bare number is seconds everywhere else; here it deleted what a user meant to keep for days
    (("prune", "--older-than", "7"), "'7' has no unit: write it, e.g. 7d for days or 7s for seconds"),
])
def test_bad_input_is_a_clear_error(app, pg_dsn, args, fragment):
    proc = cli(pg_dsn, app.settings.schema, *args, check=False)
    assert proc.returncode in (1, 2)
    assert fragment in proc.stderr
    assert "Traceback" not in proc.stderr and "S3cretPW" not in proc.stderr


def test_a_password_in_the_dsn_is_never_printed(schema):
    dsn = "postgresql://pgworker_user:hunter2@127.0.0.1:1/db"
    for args in (("status",), ("migrate",), ("enqueue", "t"), ("run", "--app", "x:y")):
        proc = cli(dsn, schema, *args, check=False)
        assert proc.returncode != 0
        assert "hunter2" not in proc.stdout + proc.stderr
        assert "Traceback" not in proc.stderr
    bad = cli("postgresql://u:hunter2@h:notaport/db", schema, "status", check=False)
    assert "hunter2" not in bad.stdout + bad.stderr and "Traceback" not in bad.stderr


def test_an_unmigrated_schema_says_what_to_run(pg_dsn, schema):
    for args in (("enqueue", "t"), ("status",), ("jobs", "list"), ("dead", "replay", "1")):
        proc = cli(pg_dsn, schema, *args, check=False)
        assert proc.returncode == 1 and "pgworker migrate" in proc.stderr and "Traceback" not in proc.stderr


def test_version_and_help():
    out = subprocess.run([sys.executable, "-m", "pgworker.cli", "--help"], capture_output=True, text=True)
    for command in ("migrate", "run", "enqueue", "jobs", "dead", "cancel", "prune", "status", "demo"):
        assert command in out.stdout


def test_output_cut_short_by_the_reader_exits_quietly(pg_dsn, schema):
    """`pgworker jobs show 1 | head -1`: the reader closes the pipe early; the command
    exits 141 like a shell tool, with no traceback."""
    cli(pg_dsn, schema, "migrate")
    cli(pg_dsn, schema, "enqueue", "big", "--payload", json.dumps({"text": "x" * 100_000}))
    e = dict(os.environ, PGWORKER_DSN=pg_dsn, PGWORKER_SCHEMA=schema)
    proc = subprocess.Popen([sys.executable, "-m", "pgworker.cli", "jobs", "show", "1"], env=e,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout.read(10)  # more than a pipe's buffer follows
    proc.stdout.close()
    assert proc.wait(60) == 141
    assert b"Traceback" not in proc.stderr.read()


def test_an_abbreviated_flag_is_refused_not_guessed(pg_dsn, schema):
    """`--prio` used to mean --priority and `--queue` on `run` failed as ambiguous: a typo
    must never silently pick another flag, and adding a flag must not change old lines."""
    cli(pg_dsn, schema, "migrate")
    typo = cli(pg_dsn, schema, "enqueue", "t", "--prio", "5", check=False)
    assert typo.returncode == 2 and "unrecognized arguments: --prio 5" in typo.stderr
    assert js(cli(pg_dsn, schema, "jobs", "list", "--json")) == []  # nothing was enqueued
    run = cli(pg_dsn, schema, "run", "--app", "x:app", "--queue", "emails", check=False)
    assert run.returncode == 2 and "unrecognized arguments: --queue emails" in run.stderr
    assert "ambiguous" not in run.stderr
