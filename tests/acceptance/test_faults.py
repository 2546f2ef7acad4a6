"""Single faults with real `pgworker run` processes: the regressions the chaos soak found,
each reproduced on its own."""

from __future__ import annotations

import os
import signal
import time

import pytest

from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance


def test_kill_9_of_an_idle_claimer_does_not_hang_the_dispatcher(env, pg_dsn, conn):
    """A claimer killed while it waits for a wake-up must not leave the wake-up primitive
    broken: multiprocessing.Event.set() waits for every sleeper to acknowledge, so the
    dispatcher's next wake-up used to block forever (found by the chaos soak)."""
    schema = env.settings.schema
    with Worker(pg_dsn, schema, "--concurrency", "2", "--poll-interval", "0.2s") as w:
        wait_until(lambda: len(w.claimer_pids()) == 2, 30, message="two claimers")
        time.sleep(1.5)  # both idle, waiting for a wake-up
        victims = w.claimer_pids()
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        wait_until(lambda: len(w.claimer_pids()) == 2 and not set(w.claimer_pids()) & set(victims), 60,
                   message=lambda: f"replacement claimers; log:\n{w.logs()[-3000:]}")
        ids = env.enqueue_many([("record", i) for i in range(20)])
        wait_until(lambda: q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE state = 'succeeded'")[0][0] == 20,
                   60, message=lambda: f"jobs after the kill to run; log:\n{w.logs()[-3000:]}")
        assert w.stop(timeout=30) == 0
    assert len(ids) == 20


def test_claimers_whose_dispatcher_dies_while_they_start_exit_on_their_own(app, pg_dsn):
    """A dispatcher killed while its claimers were still starting: they were reparented
    before they read their parent's pid, took init for their dispatcher and never left
    (found by the chaos soak). They must notice and exit."""
    from worker import HERE

    slow_app = os.path.join(HERE, "apps", "slow_import_app.py") + ":app"
    with Worker(pg_dsn, app.settings.schema, "--concurrency", "2", app=slow_app,
                env={"SLOW_IMPORT_SECONDS": "3"}) as w:
        claimers = wait_until(lambda: len(w.claimer_pids()) == 2 and w.claimer_pids(), 60,
                              message="claimer processes started")
        w.signal(signal.SIGKILL)  # they are still importing the app
        w.proc.wait()

        def gone():
            alive = []
            for pid in claimers:
                try:
                    with open(f"/proc/{pid}/stat") as f:
                        stat = f.read()
                    if stat[stat.rfind(")") + 2] not in "ZX":
                        alive.append(pid)
                except OSError:
                    pass
            return not alive

        try:
            wait_until(gone, 60, message=lambda: f"orphaned claimers to exit; log:\n{w.logs()[-3000:]}")
        finally:
            for pid in claimers:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
