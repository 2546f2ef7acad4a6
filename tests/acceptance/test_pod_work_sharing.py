"""A pod's claimers share its work, and a wake-up costs one claim per pod.

Structural, never timed: run intervals come from the ledger the handlers write (database
clock), claim counts from the pod's own /metrics over HTTP."""

from __future__ import annotations

import pytest

import time

from obs import free_port, scrape, total, try_scrape
from pg import wait_until
from worker import Worker, q

pytestmark = pytest.mark.acceptance


def intervals(conn, schema, ids):
    rows = q(conn, schema, "SELECT job_id, min(at) FILTER (WHERE event = 'start'), max(at) FILTER (WHERE event = 'end') "
                           "FROM {s}.ledger WHERE job_id = ANY(%s) GROUP BY job_id", list(ids))
    return {r[0]: (r[1], r[2]) for r in rows}


def all_overlap(spans) -> bool:
    """Every run interval overlaps every other: the latest start is before the earliest end."""
    return max(s for s, _ in spans) < min(e for _, e in spans)


def finished(conn, schema, ids):
    return q(conn, schema, "SELECT count(*) FROM {s}.jobs WHERE id = ANY(%s) AND state = 'succeeded'",
             list(ids))[0][0] == len(ids)


def running_owners(conn, schema, ids):
    """The lease owners of the jobs once every one of them has started (ledger), else None."""
    started = q(conn, schema, "SELECT count(DISTINCT job_id) FROM {s}.ledger WHERE job_id = ANY(%s) "
                              "AND event = 'start'", list(ids))[0][0]
    if started < len(ids):
        return None
    return [r[0] for r in q(conn, schema, "SELECT lease_owner FROM {s}.jobs WHERE id = ANY(%s) AND state = 'running'",
                            list(ids))]


@pytest.mark.parametrize("warm_up", [0, 600], ids=["cold", "after-600-fast-jobs"])
def test_n_claimers_run_n_slow_jobs_at_once(env, pg_dsn, conn, warm_up):
    """Three claimers, three slow jobs enqueued together: one claimer's claim takes all
    three (batches are sized from run times, and fast jobs make them large), yet none
    waits behind another while a claimer is idle: their run intervals all overlap."""
    schema = env.settings.schema
    n = 3
    with Worker(pg_dsn, schema, "--concurrency", str(n), "--poll-interval", "60") as w:
        if warm_up:
            fast = env.enqueue_many([("noop", i) for i in range(warm_up)])
            wait_until(lambda: finished(conn, schema, fast), 60, message="the warm-up")
        slow = env.enqueue_many([("sleep", {"seconds": 2}) for _ in range(n)])
        # While they run, each lease names the claimer running it: a job taken over from
        # a peer's batch is recorded under its taker (a WORKER_DIED entry names the
        # claimer that really held it).
        owners = wait_until(lambda: running_owners(conn, schema, slow), 30,
                            message=lambda: f"the slow jobs to start; log:\n{w.logs()[-3000:]}")
        wait_until(lambda: finished(conn, schema, slow), 60,
                   message=lambda: f"the slow jobs; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    spans = intervals(conn, schema, slow)
    assert len(spans) == n
    assert all_overlap(spans.values()), spans
    assert len({r[0] for r in q(conn, schema, "SELECT pid FROM {s}.ledger WHERE job_id = ANY(%s)", slow)}) == n
    assert len(set(owners)) == n, owners


def _claims(text: str) -> float:
    return sum(total(text, "pgworker_claims_total", result=r) for r in ("claimed", "empty", "error"))


def settled(port: int) -> str:
    """A scrape once the pod is idle: every claimer done with its first rounds (the claim
    count no longer moves between two scrapes)."""
    last: list[float] = []

    def still() -> str | None:
        text = try_scrape(port)
        if text is None:
            return None
        last.append(_claims(text))
        time.sleep(0.5)
        return text if len(last) > 1 and last[-1] == last[-2] and last[-1] > 0 else None

    return wait_until(still, 60, message="the pod to settle")


def test_an_idle_pod_asks_once_per_poll_whatever_its_claimers(env, pg_dsn, conn):
    """Four idle claimers: each poll starts one claim round (one claim per queue), not one
    per claimer."""
    schema = env.settings.schema
    queues = len(env.queues())
    port = free_port()
    with Worker(pg_dsn, schema, "--concurrency", "4", "--poll-interval", "0.4", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1") as w:
        polled = lambda t: total(t, "pgworker_dispatcher_wakeups_total", reason="poll")  # noqa: E731
        wait_until(lambda: len(w.claimer_pids()) == 4, 60, message="four claimers")
        started = wait_until(lambda: try_scrape(port), 30)
        # past every claimer's first round (it claims once before it ever sleeps)
        first = wait_until(lambda: (t := scrape(port)) and polled(t) >= polled(started) + 10 and t, 60)
        last = wait_until(lambda: (t := scrape(port)) and polled(t) >= polled(first) + 20 and t, 60)
        assert w.stop() == 0
    polls = polled(last) - polled(first)
    claims = _claims(last) - _claims(first)
    print(f"{polls:.0f} polls, {claims:.0f} claims, {queues} queues, 4 claimers")
    # Four claimers would make it 4 * queues * polls. Allowed above one round per poll: a
    # claimer still in its round when the next poll announces sees the generation moved on
    # its way to sleep and claims again (the lost-wake-up guard, see worker/shm/wakeups.py),
    # which a loaded machine makes happen now and then.
    assert claims <= queues * (1.25 * polls + 2), (claims, polls)


def test_an_enqueue_wakes_one_claimer_of_the_pod(env, pg_dsn, conn):
    """Each single enqueue starts one claim (and the round after the job), not one per claimer."""
    schema = env.settings.schema
    queues = len(env.queues())
    port = free_port()
    with Worker(pg_dsn, schema, "--concurrency", "4", "--poll-interval", "600", "--metrics-port", str(port),
                "--metrics-host", "127.0.0.1") as w:
        before = settled(port)
        for i in range(5):
            job = env.enqueue("noop", i)
            wait_until(lambda: finished(conn, schema, [job]), 30)
        wait_until(lambda: total(scrape(port), "pgworker_jobs_finished_total", outcome="succeeded") >= 5, 30)
        after = scrape(port)
        assert w.stop() == 0
    claims = _claims(after) - _claims(before)
    print(f"{claims:.0f} claims for 5 enqueues ({queues} queues, 4 claimers)")
    # the claim that takes the job, then one round that finds the queues empty
    assert claims <= 5 * (1 + queues + 1), claims


def test_a_job_cancelled_while_it_waits_in_a_peers_batch_is_not_run_by_its_taker(env, pg_dsn, conn):
    """Issue 18, item 16 (a). A job waits in claimer A's batch behind a long one; an
    operator cancels it, and a renewal brings the request to its slot. Claimer B then goes
    idle and takes the job over: it must not run it (the owner would not have, see
    SlotTable.start). The take-over once started the job with its flags cleared."""
    schema = env.settings.schema
    busy = env.enqueue("sleep", {"seconds": 5})
    with Worker(pg_dsn, schema, "--concurrency", "2", "--batch-size", "2", "--lease", "3",
                "--poll-interval", "0.3", "--reap-interval", "0.5") as w:
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", busy), 30,
                   message=lambda: f"the first claimer's job to start; log:\n{w.logs()[-3000:]}")
        # one commit: the idle claimer's claim takes both, in this order (two enqueues let
        # it claim the first alone)
        long, waiting = env.enqueue_many([("sleep", {"seconds": 8}), ("record", "cancelled")])
        wait_until(lambda: q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", long), 30,
                   message=lambda: f"the batch of two to start; log:\n{w.logs()[-3000:]}")
        assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", waiting)[0][0] == "running"
        assert env.cancel(waiting) == "running"  # claimed, waiting unstarted behind `long`
        [(asked,)] = q(conn, schema, "SELECT cancel_requested_at FROM {s}.jobs WHERE id = %s", waiting)
        wait_until(lambda: q(conn, schema, "SELECT heartbeat_at > %s FROM {s}.jobs WHERE id = %s", asked,
                             waiting)[0][0], 30, message="a renewal to bring the cancellation to the slot")
        wait_until(lambda: q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", waiting)[0][0]
                   != "running", 30, message=lambda: f"the waiting job to end; log:\n{w.logs()[-3000:]}")
        assert w.stop() == 0
    assert q(conn, schema, "SELECT state::text FROM {s}.jobs WHERE id = %s", waiting)[0][0] == "cancelled"
    assert not q(conn, schema, "SELECT 1 FROM {s}.ledger WHERE job_id = %s", waiting), "the cancelled job ran"
