"""A new operator's frictions with the command line, in-process against a real PostgreSQL:
a cancel reason over the limit is refused (the API keeps cutting it), `jobs retry` on a
dead job names `dead replay`, `jobs list` filters by task and says when it stopped at
--limit, and a succeeded job's last error code reads as an earlier attempt's."""

from __future__ import annotations

import json

import pytest

import pgworker
from pgworker.cli import main
from pgworker.names import CANCEL_REASON_MAX_CHARS
from pgworker.testing import drain

pytestmark = pytest.mark.integration
NOW = pgworker.RetryPolicy(base_seconds=0.0, jitter=0.0)


def flags(app, pg_dsn):
    return ["--dsn", pg_dsn, "--schema", app.settings.schema]


def test_a_cancel_reason_over_the_limit_is_refused_by_the_cli_and_the_app(app, pg_dsn, capsys):
    job = app.enqueue("t", None)
    graph = app.enqueue("t", None)
    long = "x" * (CANCEL_REASON_MAX_CHARS + 100)
    for args in (["cancel", str(job)], ["graphs", "cancel", str(graph)]):
        with pytest.raises(SystemExit) as exited:  # argparse's usage error: it once exited 0, the reason cut
            main([*args, "--reason", long, *flags(app, pg_dsn)])
        assert exited.value.code == 2
        err = capsys.readouterr().err
        assert "the reason is 600 characters long, the limit is 500" in err and long not in err, err
    assert app.get_job(job)["state"] == "pending" and app.get_job(graph)["state"] == "pending"
    # exactly the limit is taken, as given
    assert main(["cancel", str(job), "--reason", "y" * CANCEL_REASON_MAX_CHARS, *flags(app, pg_dsn)]) == 0
    assert app.get_job(job)["events"][-1]["detail"]["reason"] == "y" * CANCEL_REASON_MAX_CHARS
    # the App refuses it too (it cut it to 499 and '…'), and nothing changes; a graph's
    # cancel refuses it before any of its jobs
    other = app.enqueue("t", None)
    for call in (lambda: app.cancel(other, reason=long), lambda: app.cancel_graph(other, reason=long),
                 lambda: app.cancel(other, reason=42)):
        with pytest.raises(pgworker.ConfigError, match="nothing was changed") as info:
            call()
        assert long not in str(info.value)
    assert app.get_job(other)["state"] == "pending" and not app.get_job(other)["events"]


def test_retrying_a_dead_job_names_dead_replay(app, pg_dsn, capsys):
    job = app.enqueue("t", None)
    for claimed in app.claim(limit=1):
        app.fail(claimed, pgworker.Permanent("broken"))
    assert main(["jobs", "retry", str(job), *flags(app, pg_dsn)]) == 1
    err = capsys.readouterr().err
    assert f"job {job} is dead, not pending" in err
    assert f"`pgworker dead replay {job} --schema {app.settings.schema}`" in err, err
    pending = app.enqueue("t", None)  # not dead: no replay offered
    assert main(["jobs", "retry", str(pending), *flags(app, pg_dsn)]) == 1
    assert "dead replay" not in capsys.readouterr().err


def test_retry_now_of_a_job_that_still_waits_says_what_for(app, pg_dsn, capsys):
    """A break-it trial: `jobs retry` printed "job 2: due now" of a job behind its ordering
    key's delayed head, and of one waiting for its parents, and neither ran. It says what
    the job still waits for (and so does the refusal of one that was due already)."""
    schema = app.settings.schema
    head = app.enqueue("t", None, ordering_key="k", delay=3600)
    behind = app.enqueue("t", None, ordering_key="k", delay=3600)
    parent = app.enqueue("t", None)
    child = app.enqueue("t", None, depends_on=[parent], delay=3600)
    capsys.readouterr()
    assert main(["jobs", "retry", str(behind), *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"job {behind}: due now (it was due ") and \
        "but it still waits behind an earlier job of its ordering key 'k': it runs when that one finishes" in out, out
    assert main(["jobs", "retry", str(child), *flags(app, pg_dsn), "--json"]) == 0
    said = json.loads(capsys.readouterr().out)
    assert said["waits_for"] == f"for 1 parent to succeed (`pgworker jobs show {child} --schema {schema}` lists them)"
    assert main(["jobs", "retry", str(behind), *flags(app, pg_dsn)]) == 1  # due already now
    err = capsys.readouterr().err
    assert f"job {behind} is pending and due already, but it still waits behind an earlier job" in err, err
    assert main(["jobs", "retry", str(head), *flags(app, pg_dsn)]) == 0
    assert "still waits" not in capsys.readouterr().out  # the head itself: due now is all


def test_jobs_list_filters_by_task_and_refuses_a_bad_name(app, pg_dsn, capsys):
    mail = [app.enqueue("send_email", i, queue="emails") for i in range(2)]
    app.enqueue("build_report", None, queue="emails")
    app.enqueue("send_email", 9, queue="other")
    capsys.readouterr()
    assert main(["jobs", "list", "--task", "send_email", "--queue", "emails", "--json", *flags(app, pg_dsn)]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == sorted(mail, reverse=True)
    assert main(["jobs", "--task", "build_report", "--json", *flags(app, pg_dsn)]) == 0  # bare `jobs` too
    assert [r["task"] for r in json.loads(capsys.readouterr().out)] == ["build_report"]
    graph = app.chain([("root", None), ("leaf", None)])
    assert main(["jobs", "list", "--graph", str(graph.graph_id), "--task", "leaf", "--json", *flags(app, pg_dsn)]) == 0
    assert [r["id"] for r in json.loads(capsys.readouterr().out)] == [graph.ids[1]]
    for bad, said in (("", "task name is empty"), ("a\nb", "control or non-printable"),
                      ("x" * 256, "the limit is 255")):
        assert main(["jobs", "list", "--task", bad, *flags(app, pg_dsn)]) == 1
        err = capsys.readouterr().err
        assert said in err and "Traceback" not in err, err
    assert main(["jobs", "list", "--queue", " emails", *flags(app, pg_dsn)]) == 1
    assert "leading or trailing whitespace" in capsys.readouterr().err


def test_jobs_list_says_when_it_stopped_at_the_limit(app, pg_dsn, capsys):
    for i in range(3):
        app.enqueue("t", i)
    capsys.readouterr()
    assert main(["jobs", "list", "--limit", "2", *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr()
    assert len(out.out.splitlines()) == 3  # the header and two jobs
    assert "(showing the first 2, newest first; --limit N for more)" in out.err
    assert main(["jobs", "list", "--limit", "3", *flags(app, pg_dsn)]) == 0  # all there is: no note
    assert capsys.readouterr().err == ""
    assert main(["jobs", "list", "--limit", "2", "--json", *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr()
    assert len(json.loads(out.out)) == 2 and out.err == ""


def test_a_succeeded_jobs_last_error_reads_as_an_earlier_attempts(app, pg_dsn, capsys):
    tries = []

    @app.task(name="flaky", max_attempts=2, retry=NOW)
    def flaky(payload, ctx):
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("first time")

    job = app.enqueue("flaky", None)
    child = app.enqueue("t", None, depends_on=[job], any_task=True)
    drain(app, queues="default", skip_backoff=True)
    assert app.get_job(job)["state"] == "succeeded"
    capsys.readouterr()
    assert main(["jobs", "list", "--state", "succeeded", *flags(app, pg_dsn)]) == 0
    table = capsys.readouterr().out
    assert "(earlier: RuntimeError)" in table and "succeeded  RuntimeError" not in table.replace("   ", "  "), table
    assert main(["jobs", "list", "--state", "succeeded", "--json", *flags(app, pg_dsn)]) == 0  # data: unchanged
    assert json.loads(capsys.readouterr().out)[0]["last_error_code"] == "RuntimeError"
    assert main(["jobs", "show", str(job), *flags(app, pg_dsn)]) == 0
    assert "earlier attempt failed: RuntimeError (the job succeeded)" in capsys.readouterr().out
    assert main(["jobs", "show", str(job), "--json", *flags(app, pg_dsn)]) == 0
    assert json.loads(capsys.readouterr().out)["last_error_code"] == "RuntimeError"
    assert main(["jobs", "show", str(child), *flags(app, pg_dsn)]) == 0
    assert f"{job} (flaky): succeeded (earlier: RuntimeError)" in capsys.readouterr().out


def test_a_replayed_jobs_last_error_reads_as_an_earlier_runs_and_a_dead_ones_as_its_end(app, pg_dsn, capsys):
    """A new user's trial: after `dead replay`, the pending job's last error code read as
    a failure of the job now ("ValueError"), where a succeeded job's reads "(earlier: ...)"."""
    @app.task(name="broken", max_attempts=1)
    def broken(payload, ctx):
        raise ValueError("no")

    dead, replayed = app.enqueue("broken", 1), app.enqueue("broken", 2)
    drain(app, queues="default")
    app.replay([replayed])
    capsys.readouterr()
    assert main(["jobs", "list", *flags(app, pg_dsn)]) == 0
    rows = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()[1:]}
    assert "(earlier: ValueError)" in rows[str(replayed)] and "pending" in rows[str(replayed)], rows
    assert "(earlier" not in rows[str(dead)] and "ValueError" in rows[str(dead)], rows


def test_hints_quote_the_queue_names_in_the_commands_they_print(app, pg_dsn, capsys):
    """A new user's trial: `pgworker status` printed `start a worker with --queues my emails`
    for a queue named with a space, which a shell splits in two. Every command a hint prints
    is pasted into a shell as printed: names are shell-quoted (shlex.quote)."""
    import shlex

    app.enqueue("t", queue="my emails", any_task=True)
    pod = dict(host="h", pid=1, version="0", concurrency=2, drain=False, claimers=[])
    with app.connection() as c:
        app.store.pod_heartbeat(c, pod_id="live", queues=["default"], **pod)
    assert main(["status", *flags(app, pg_dsn)]) == 0
    out = capsys.readouterr().out
    assert "or start a worker with --queues 'my emails' (PGWORKER_QUEUES)" in out, out
    assert main(["dead", "replay", "--queue", "my emails", *flags(app, pg_dsn)]) == 2
    err = capsys.readouterr().err
    assert "--queue 'my emails' alone replays nothing" in err, err
    hint = err.split("`")[-2]
    assert shlex.split(hint) == ["pgworker", "dead", "replay", "--queue", "my emails", "--all"], hint
    assert main(["dead", "replay", "7", "--queue", "my emails", "--all", *flags(app, pg_dsn)]) == 2
    assert "`pgworker dead replay --queue 'my emails' --all` every dead job" in capsys.readouterr().err
