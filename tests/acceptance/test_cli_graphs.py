"""`pgworker graphs cancel|replay GRAPH_ID` (issue 21), run as a user would, against a graph
whose parent really died in a real worker."""

from __future__ import annotations

import pytest

from pg import wait_until
from pgworker import JobSpec
from test_cli import cli, js
from worker import Worker, q

pytestmark = pytest.mark.acceptance


def states(conn, schema, ids):
    return dict(q(conn, schema, "SELECT id, state::text FROM {s}.jobs WHERE id = ANY(%s)", list(ids)))


def test_replay_then_cancel_a_graph_from_the_command_line(env, pg_dsn, conn):
    """A parent that dies (a task no worker knows: dead at once, UNKNOWN_TASK) with a child
    under the cancel policy and one under hold: `graphs replay` puts the dead parent back
    and the cancelled child waits again; `graphs cancel` then cancels all that is
    unfinished. Counts in text and in JSON."""
    schema = env.settings.schema
    ids = env.enqueue_many([JobSpec("no.such.task", None, ref="p"),
                            JobSpec("returns", {"c": 1}, depends_on=["p"], on_parent_failure="cancel"),
                            JobSpec("returns", {"c": 2}, depends_on=["p"])], any_task=True)
    parent, cancelled_child, held_child = ids
    with Worker(pg_dsn, schema, "--concurrency", "1"):
        wait_until(lambda: states(conn, schema, [parent])[parent] == "dead", 60, message="the parent to die")
    assert states(conn, schema, ids) == {parent: "dead", cancelled_child: "cancelled", held_child: "pending"}

    out = cli(pg_dsn, schema, "graphs", "replay", str(parent)).stdout
    assert out.startswith(f"graph {parent}: replayed 1 dead job, 1 job cancelled by a dead parent wait again\n")
    assert "now: 3 pending" in out
    assert states(conn, schema, ids) == {parent: "pending", cancelled_child: "pending", held_child: "pending"}
    again = js(cli(pg_dsn, schema, "graphs", "replay", str(parent), "--json"))
    assert again == {"graph_id": parent, "jobs": 3, "replayed": [], "requeued": [], "held_by": {}, "states": {"pending": 3}}

    done = js(cli(pg_dsn, schema, "graphs", "cancel", str(parent), "--json"))
    assert done == {"graph_id": parent, "jobs": 3, "cancelled": 1, "requested": 0, "states": {"cancelled": 3}}
    # the children went with their parent, by the dependency rule
    assert states(conn, schema, ids) == dict.fromkeys(ids, "cancelled")
    text = cli(pg_dsn, schema, "graphs", "cancel", str(parent)).stdout
    assert text.startswith(f"graph {parent}: 3 jobs; cancelled 0,")


@pytest.mark.parametrize("args, code, fragment", [
    (("graphs", "cancel", "987654"), 1, "there is no graph 987654 in schema"),
    (("graphs", "replay", "987654"), 1, "there is no graph 987654 in schema"),
    (("graphs", "cancel", "abc"), 2, "id 'abc' is not valid: write ids as plain digits 0-9"),
    (("graphs", "cancel", "1_0"), 2, "id '1_0' is not valid"),  # int() reads it as 10
    (("graphs", "replay", "0"), 2, "id 0 is out of range: ids are 1 to 2**63-1"),
    (("graphs", "replay", str(2**63)), 2, "is out of range"),
    (("graphs",), 2, "required: cancel|replay"),
])
def test_a_missing_or_malformed_graph_id_is_a_clear_error(app, pg_dsn, args, code, fragment):
    proc = cli(pg_dsn, app.settings.schema, *args, check=False)
    assert proc.returncode == code, proc.stderr
    assert fragment in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stdout == ""


def test_a_job_that_is_no_graph_s_is_no_graph(app, pg_dsn):
    """A job enqueued without dependencies has no graph: its id names none."""
    job = app.enqueue("t", None, any_task=True)
    proc = cli(pg_dsn, app.settings.schema, "graphs", "cancel", str(job), check=False)
    assert proc.returncode == 1 and f"there is no graph {job}" in proc.stderr
    assert app.get_job(job)["state"] == "pending"
    # `jobs list --graph` of it says so too (a trial: "(none)" alone, exit 0)
    listed = cli(pg_dsn, app.settings.schema, "jobs", "list", "--graph", str(job), check=False)
    assert listed.returncode == 0 and listed.stdout.strip() == "(none)", listed
    assert f"note: there is no graph {job} in schema" in listed.stderr, listed.stderr


def test_graphs_cancel_and_cancel_keep_the_operators_reason(env, pg_dsn, conn):
    """`graphs cancel --reason` (and plain `cancel --reason`) keep the operator's words in
    each cancelled job's audit event, control characters replaced; neither command had a
    --reason. One over 500 characters is refused (exit 2, nothing cancelled): it was cut
    with '…' without a word (the API still cuts it, documented)."""
    schema = env.settings.schema
    ids = env.enqueue_many([JobSpec("returns", {}, ref="p"), JobSpec("returns", {}, depends_on=["p"])])
    parent, child = ids
    lone = env.enqueue("returns", {})
    for command in (("graphs", "cancel", str(parent)), ("cancel", str(lone))):
        refused = cli(pg_dsn, schema, *command, "--reason", "x" * 501, check=False)
        assert refused.returncode == 2 and "the limit is 500" in refused.stderr, refused.stderr
    assert states(conn, schema, [parent, child, lone]) == dict.fromkeys((parent, child, lone), "pending")
    cli(pg_dsn, schema, "graphs", "cancel", str(parent), "--reason", "bad <b>input</b>\x01 " + "x" * 400)
    cli(pg_dsn, schema, "cancel", str(lone), "--reason", "  superseded by 42  ")
    events = q(conn, schema, "SELECT job_id, kind, detail->>'reason' FROM {s}.job_events ORDER BY id")
    [(job, kind, reason)] = [e for e in events if e[0] == parent]
    assert kind == "cancelled" and reason == "bad <b>input</b>\ufffd " + "x" * 400
    assert (lone, "cancelled", "superseded by 42") in events
    # the child, cancelled by the dependency rule when its parent was (roots go first),
    # carries the parent's code, not an event with the reason (docs/graphs.md says so)
    assert [e for e in events if e[0] == child] == []
    assert q(conn, schema, "SELECT last_error_code FROM {s}.jobs WHERE id = %s", child) == [("PARENT_CANCELLED",)]
    assert states(conn, schema, [parent, child, lone]) == dict.fromkeys((parent, child, lone), "cancelled")


def test_enqueue_depends_on_from_the_command_line(app, pg_dsn, conn):
    """A trial: `pgworker enqueue` had no way to give parents (`--depends-on 2` was
    refused with "did you mean --dedupe-window?"). Repeated --depends-on: the job waits
    for each, joins their graph, and --on-parent-failure takes the policy."""
    schema = app.settings.schema
    a, b = app.enqueue("t", None, any_task=True), app.enqueue("t", None, any_task=True)
    child = int(cli(pg_dsn, schema, "enqueue", "t", "--any-task", "--depends-on", str(a), "--depends-on", str(b),
                    "--on-parent-failure", "cancel").stdout)
    job = app.get_job(child)
    assert (job["state"], job["waiting_parents"], job["on_parent_failure"]) == ("pending", 2, "cancel"), job
    assert sorted(p["id"] for p in job["parents"]) == [a, b]
    bad = cli(pg_dsn, schema, "enqueue", "t", "--any-task", "--depends-on", "abc", check=False)
    assert bad.returncode == 2 and "id 'abc' is not valid" in bad.stderr, bad.stderr
    missing = cli(pg_dsn, schema, "enqueue", "t", "--any-task", "--depends-on", "987654321", check=False)
    assert missing.returncode != 0 and "987654321" in missing.stderr and "Traceback" not in missing.stderr, missing
    alone = cli(pg_dsn, schema, "enqueue", "t", "--any-task", "--on-parent-failure", "cancel", check=False)
    assert alone.returncode != 0 and "depends_on" in alone.stderr and "Traceback" not in alone.stderr, alone
    assert q(conn, schema, "SELECT count(*) FROM {s}.jobs")[0][0] == 3  # the refused ones wrote nothing
