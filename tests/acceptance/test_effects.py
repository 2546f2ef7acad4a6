"""Effects that happen once, with real `pgworker run` processes (tests/apps/effects_app.py):
a handler's writes committed with its fenced completion survive a take-over and kill -9
at each boundary with every same-database write present exactly once."""

from __future__ import annotations

import os
import signal

import psycopg
import pytest
from psycopg import sql

from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EFFECTS_APP = os.path.join(HERE, "apps", "effects_app.py") + ":app"
FAST = ["--lease", "2", "--reap-interval", "0.5", "--poll-interval", "0.3"]


def make_orders(pg_dsn, schema):
    with psycopg.connect(pg_dsn, autocommit=True) as c:
        c.execute(sql.SQL("CREATE TABLE IF NOT EXISTS {}.orders (id bigserial PRIMARY KEY, job_id bigint, "
                          "lease_token bigint, attempt int, pid int)").format(sql.Identifier(schema)))


def enqueue(env, payload, task="order"):
    return env.enqueue(task, payload, max_attempts=5, any_task=True)


@pytest.mark.parametrize("task", ["order", "aorder"])
def test_a_stale_handler_taken_over_commits_nothing_and_is_told(env, pg_dsn, conn, task):
    """SIGSTOP past the lease while another pod claims and finishes: exactly one of the
    two inserts is committed (the second owner's), and the stale handler got LeaseLost
    (sync ctx.transaction(), and an async handler's ctx.atransaction()), or, async, had
    its task cancelled first (the pod's lease watch marked the lease lost at SIGCONT
    before the handler reached its transaction: either comes first)."""
    schema = env.settings.schema
    make_orders(pg_dsn, schema)
    job_id = enqueue(env, {"seconds": 4}, task)
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP, name="a") as a:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'start'"), 30,
                   message=lambda: f"worker A started the job; log:\n{a.logs()[-3000:]}")
        a.signal_group(signal.SIGSTOP)  # the whole pod pauses: no renewals, no completion
        with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP, name="b") as b:
            wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.jobs WHERE state = 'succeeded'"), 30,
                       message=lambda: f"worker B reclaimed and finished the job; log:\n{b.logs()[-3000:]}")
            b.stop()
        a.signal_group(signal.SIGCONT)
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'told_lease_lost'"), 30,
                   message=lambda: f"A's stale handler was told; log:\n{a.logs()[-3000:]}")
        assert a.stop() == 0
    assert q(conn, schema, "SELECT job_id, lease_token FROM {s}.orders") == [(job_id, 2)]
    told = q(conn, schema, "SELECT lease_token, note FROM {s}.ledger WHERE event = 'told_lease_lost'")
    assert told in ([(1, "complete_in_transaction")], [(1, "task_cancelled")] if task == "aorder" else []), told
    assert q(conn, schema, "SELECT state::text, lease_token, attempts FROM {s}.jobs WHERE id = %s", job_id) == \
        [("succeeded", 2, 2)]


@pytest.mark.parametrize("kill, attempts", [("in_block", 2), ("after_commit", 1)])
def test_kill_9_inside_the_transaction_or_after_its_commit_leaves_one_insert(env, pg_dsn, conn, kill, attempts):
    """kill -9 of the claimer after the handler's insert and before the commit: nothing of
    attempt 1 committed, attempt 2 inserts once. After the commit: the job is succeeded
    (attempt 1's insert, once); the settler's WORKER_DIED failure is refused by the fence."""
    schema = env.settings.schema
    make_orders(pg_dsn, schema)
    job_id = enqueue(env, {"kill": kill})
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP) as w:
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id)
                   == [("succeeded",)], 60, message=lambda: f"the job to succeed; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    assert q(conn, schema, "SELECT job_id, attempt FROM {s}.orders") == [(job_id, attempts)]
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id) == \
        [("succeeded", attempts)]


class Destination:
    """A local HTTP service standing for an external system with idempotency keys: POST
    /effects/KEY records the effect once per key (``?drop=1``: fails without recording,
    as a call that never arrived); GET /effects/KEY answers whether it happened."""

    def __init__(self) -> None:
        import http.server
        import json
        import threading

        self.posts: list[str] = []
        self.done: dict[str, dict] = {}
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _reply(self, code, body):
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_POST(self):
                key, _, query = self.path[len("/effects/"):].partition("?")
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.posts.append(key)
                if "drop=1" in query:
                    return self._reply(503, {"error": "dropped"})
                outer.done.setdefault(key, {"receipt": f"r-{len(outer.done) + 1}"})
                self._reply(200, outer.done[key])

            def do_GET(self):
                key = self.path[len("/effects/"):]
                if key in outer.done:
                    return self._reply(200, outer.done[key])
                self._reply(404, {"error": "unknown"})

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def destination():
    d = Destination()
    yield d
    d.close()


def run_flow(env, pg_dsn, conn, destination, payload):
    schema = env.settings.schema
    make_orders(pg_dsn, schema)
    job_id = env.enqueue("flow", payload, max_attempts=5, any_task=True)
    with Worker(pg_dsn, schema, "--concurrency", "1", *FAST, app=EFFECTS_APP,
                env={"EFFECT_URL": destination.url}) as w:
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", job_id)
                   == [("succeeded",)], 60, message=lambda: f"the job to succeed; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    events = [e for (e,) in q(conn, schema, "SELECT event FROM {s}.ledger WHERE job_id = %s ORDER BY id", job_id)]
    steps = q(conn, schema, "SELECT name, kind, status, attempt FROM {s}.job_steps WHERE job_id = %s "
                            "ORDER BY created_at, name", job_id)
    orders = q(conn, schema, "SELECT attempt FROM {s}.orders WHERE job_id = %s", job_id)
    attempts = q(conn, schema, "SELECT attempts FROM {s}.jobs WHERE id = %s", job_id)[0][0]
    return job_id, events, steps, orders, attempts


@pytest.mark.parametrize("kill, tx", [("before_step_record", True), ("in_transaction_after_step", True),
                                      ("after_effect_before_done", True), ("after_last_step", False)])
def test_kill_9_at_each_boundary_does_what_the_docs_say(env, pg_dsn, conn, destination, kill, tx):
    """docs/effects.md, "Crash timelines": what attempt 2 does after attempt 1's claimer
    was killed at each boundary; no same-database write exists twice and the external
    effect happened once."""
    job_id, events, steps, orders, attempts = run_flow(env, pg_dsn, conn, destination, {"kill": kill, "tx": tx})
    assert attempts == 2
    assert len(orders) == 1  # the same-database write: exactly once
    assert len(destination.done) == 1  # the external effect: once
    if kill == "before_step_record":  # the step's function ran, its record did not commit: it runs again
        assert events.count("first_ran") == 2 and steps[0] == ("first", "step", "done", 2)
        assert destination.posts == [destination.posts[0]]
    elif kill == "in_transaction_after_step":  # nothing of the transaction committed: attempt 2 inserts
        assert events.count("first_ran") == 1 and events.count("effect_called") == 1
        assert orders == [(2,)] and ("insert", "step", "done", 2) in steps
    elif kill == "after_effect_before_done":  # started, never done: reconciled, not called again
        assert events.count("effect_called") == 1 and len(destination.posts) == 1
        assert ("notify", "effect", "done", 1) in steps and orders == [(2,)]
    else:  # after the last step, before completion: every step skipped, nothing run again
        assert events.count("first_ran") == 1 and events.count("effect_called") == 1
        assert orders == [(1,)] and events.count("end") == 1


def test_reconciliation_says_not_done_and_the_call_is_made_again_with_the_same_key(env, pg_dsn, conn, destination):
    job_id, events, steps, orders, attempts = run_flow(env, pg_dsn, conn, destination, {"drop": True})
    assert attempts == 2 and len(destination.posts) == 2
    assert destination.posts[0] == destination.posts[1] == f"{destination.posts[0]}"
    assert destination.posts[0].endswith(":notify") and list(destination.done) == [destination.posts[0]]
    assert ("notify", "effect", "done", 1) in steps  # the record of attempt 1, finished by attempt 2
    assert orders == [(2,)]


def test_a_stale_workers_effect_record_is_refused_by_the_fence(env, pg_dsn, conn):
    """The record statements themselves: a token that moved on writes nothing."""
    from pgworker.jobs import Lease

    schema = env.settings.schema
    job_id = env.enqueue("noop", {})
    [job] = env.claim(limit=1)
    stale = Lease(job.id, job.lease_token - 1)
    with env.connection() as c:
        assert env.store.step_record(c, stale, "e", kind="effect", status="started", result_json=None, key="k",
                                     max_steps=10) == (False, 0, False)
        assert env.store.step_record(c, job.lease, "e", kind="effect", status="started", result_json=None, key="k",
                                     max_steps=10) == (True, 0, True)
        assert env.store.effect_done(c, stale, "e", "1") is False
    assert q(conn, schema, "SELECT status FROM {s}.job_steps WHERE job_id = %s", job_id) == [("started",)]


def test_a_handler_lingering_after_its_commit_is_not_renewed_or_fenced(env, pg_dsn, conn):
    """After ctx.transaction() committed, the row has left 'running': the renewer must not
    try to renew it (it would be refused, counted as a fenced renewal and logged as a lost
    lease), even when the handler takes several renewal intervals to return."""
    schema = env.settings.schema
    make_orders(pg_dsn, schema)
    job_id = env.enqueue("order", {"linger": 3.5}, max_attempts=5, any_task=True)
    with Worker(pg_dsn, schema, "--concurrency", "1", "--lease", "3", "--poll-interval", "0.3",
                app=EFFECTS_APP) as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE event = 'lingered'"), 30,
                   message=lambda: f"the handler to return; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
        logs = w.logs()
    assert "lease lost" not in logs and "fenced out" not in logs, logs[-3000:]
    assert q(conn, schema, "SELECT state::text, attempts FROM {s}.jobs WHERE id = %s", job_id) == [("succeeded", 1)]
