"""Results (issue 21) through real `pgworker run` processes: what handlers return is
stored by the claimers' batched success and read back by a waiting producer."""

from __future__ import annotations

import time

import pytest

from worker import ACCEPTANCE_APP, Worker, create_ledger, q

pytestmark = pytest.mark.acceptance


@pytest.fixture
def env(app, pg_dsn):
    from pgworker.loader import load_app

    create_ledger(pg_dsn, app.settings.schema)
    app.tasks.update(load_app(ACCEPTANCE_APP).tasks)
    return app


def test_a_workers_results_reach_a_waiting_producer(env, pg_dsn, conn):
    schema = env.settings.schema
    ids = env.enqueue_many([("returns", {"i": i}) for i in range(50)])
    nothing = env.enqueue("record", 1)
    with Worker(pg_dsn, schema, "--concurrency", "2"):
        t0 = time.monotonic()
        got = [env.wait_result(job_id, timeout=60) for job_id in ids]
        assert env.wait_result(nothing, timeout=60) is None
        elapsed = time.monotonic() - t0
    assert got == [{"echo": {"i": i}, "attempt": 1} for i in range(50)]
    assert elapsed < 30
    assert q(conn, schema, "SELECT count(*) FROM {s}.job_results")[0][0] == 50
